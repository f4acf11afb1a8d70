"""The results page, ``docs/benchmarks.md``, written from the raw runs in ``benchmarks/results/``.

    python -m benchmarks.analysis.results_page            # rewrite the page
    python -m benchmarks.analysis.results_page --check    # exit 1 when the page on disk is not what it would write

A run is a ``run`` record and the records carrying its ``run_id`` (``benchmarks.lib.common.ResultLog``);
``history.jsonl`` holds older runs transcribed one record per run, which enter as runs of their benchmark at their
recorded date, so a newer real run supersedes them (and one dated as a run the files hold is dropped). Each table
of ``results_tables`` shows, per machine, variant (the values of the command options it names) and row key, the
newest run that measured that row, one number a cell, read with the paths of ``results_paths``. A benchmark of the
results that no table shows and ``NOT_SHOWN`` does not list, a table without runs, or a newest run from which its
table reads nothing is an error: results are never dropped silently.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.analysis.results_paths import Col, Record, Table, read_path
from benchmarks.analysis.results_tables import HEAD, NOT_SHOWN, TABLES
from benchmarks.lib.common import RESULTS_DIR, read_results

PAGE = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
MAX_LINES = 250
MISSING = "–"


class PageError(ValueError):
    """The results hold something the page cannot show, or a table reads nothing from its newest run."""


@dataclass(frozen=True)
class Run:
    benchmark: str
    machine: str
    date: str  # "YYYY-MM-DD HH:MM" (UTC) or "YYYY-MM-DD"
    command: str
    order: int  # position among all runs read: ties of date go to the later one
    history: bool
    records: tuple[Record, ...]


_MACHINE_ORDER = ("CPU", "H100", "H200")


# --------------------------------------------------------------------------- reading the runs


def _date(text: str) -> str:
    match = re.match(r"(\d{4}-\d{2}-\d{2})(?: (\d{2}:\d{2}))?", text or "")
    if not match:
        raise PageError(f"a run's date should start YYYY-MM-DD, got {text!r}")
    return " ".join(g for g in match.groups() if g)


def _machine(header: Record, date: str) -> str:
    gpu = header.get("gpu") or ""
    for name in ("H100", "H200"):
        if name in gpu:
            return name
    if header.get("cpus") == 2:
        return "CPU"
    # Before 2026-12-05 the H200's 16-core host was the only other machine, and runs that had not imported torch
    # when they wrote their run record did not name its GPU.
    if date < "2026-12-05":
        return "H200"
    return f"{header.get('cpus')}-core host"


def _history_machine(text: str) -> str:
    if text.startswith(("CPU", "2-core", "the 2-core")):
        return "CPU"  # what it compiled for may name a GPU
    return next((name for name in ("H100", "H200") if name in text), "CPU")


def _history_benchmark(name: str) -> str:
    """``kernels --kv-cache-dtype fp8`` is a run of ``kernels``; a description stays whole."""
    match = re.fullmatch(r"([\w.]+)(?: --.*)?", name)
    return match.group(1) if match else name


def load_runs(results: Path) -> list[Run]:
    runs: list[Run] = []
    for i, record in enumerate(read_results(results / "history.jsonl")):
        date = _date(record["date"])
        runs.append(
            Run(
                benchmark=_history_benchmark(record["benchmark"]),
                machine=_history_machine(record["machine"]),
                date=date,
                command=record["command"],
                order=i,
                history=True,
                records=({"kind": "history", **record["metrics"]},),
            )
        )
    names = sorted({p.name.removesuffix(".gz") for p in results.glob("*.jsonl*")} - {"history.jsonl"})
    for name in names:
        by_run: dict[str, list[Record]] = {}
        for number, record in enumerate(read_results(results / name), 1):
            if "run_id" not in record or "benchmark" not in record:
                raise PageError(
                    f"{name}: record {number} has no run_id or benchmark; results are written through "
                    f"benchmarks.lib.common.ResultLog, got {json.dumps(record)[:120]}"
                )
            by_run.setdefault(record["run_id"], []).append(record)
        for records in by_run.values():
            header = records[0]
            if header.get("kind") != "run" or "date" not in header:
                raise PageError(f"{name}: run {header['run_id']} does not start with a dated run record")
            date = _date(header["date"])
            runs.append(
                Run(
                    benchmark=header["benchmark"],
                    machine=_machine(header, date),
                    date=date,
                    command=header["command"],
                    order=len(runs),
                    history=False,
                    records=tuple(records),
                )
            )
    # A transcription of a run the files hold (same benchmark, machine and date) is that run, told twice.
    held = {(r.benchmark, r.machine, r.date) for r in runs if not r.history}
    return [r for r in runs if not (r.history and (r.benchmark, r.machine, r.date) in held)]


def _options(command: str) -> dict[str, str]:
    """``--name value...`` pairs of a command (a flag alone reads ``yes``)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for token in command.split():
        if token.startswith("--"):
            current = found.setdefault(token, [])
        elif current is not None:
            current.append(token)
    return {name: " ".join(values) or "yes" for name, values in found.items()}


def _shown_command(command: str) -> str:
    return re.sub(r" --out \S+", "", command).replace("|", "\\|")


# --------------------------------------------------------------------------- the tables' rows


@dataclass(frozen=True)
class Row:
    machine: str
    variant: tuple[str, ...]
    key: str
    run: Run
    cells: tuple[float | None, ...]


def _cell(run: Run, col: Col, key: str) -> float | None:
    if run.history:
        return read_path(run.records, col.hist, key, history=True)
    value = read_path(run.records, col.real, key, history=False)
    return None if value is None else value * col.scale


def table_rows(table: Table, runs: Iterable[Run]) -> list[Row]:
    """Per machine, variant and row key, the row of the newest run that measured it."""
    newest: dict[tuple[str, tuple[str, ...], str], Row] = {}
    empty: dict[tuple[str, tuple[str, ...]], Run] = {}
    for run in sorted(runs, key=lambda r: (r.date, not r.history, r.order)):
        options = _options(run.command)
        if run.benchmark != table.benchmark or not all(o in options for o in table.needs):
            continue
        if any(o in options for o in table.skips):
            continue
        variant = tuple(options.get(o, MISSING) for o in table.variant)
        found = False
        for key in table.rows:
            cells = tuple(_cell(run, c, key) for c in table.cols)
            if any(v is not None for v in cells):
                newest[(run.machine, variant, key)] = Row(run.machine, variant, key, run, cells)
                found = True
        if found:
            empty.pop((run.machine, variant), None)
        else:
            empty[(run.machine, variant)] = run
    if empty:
        run = next(iter(empty.values()))
        raise PageError(
            f"{table.area}: the newest {run.benchmark} run on {run.machine} ({run.date}, {run.command!r}) has none "
            f"of the table's columns; give the table a path that reads it, or skip its options"
        )
    order = {key: i for i, key in enumerate(table.rows)}
    return sorted(
        newest.values(),
        key=lambda r: (_MACHINE_ORDER.index(r.machine) if r.machine in _MACHINE_ORDER else 9, r.variant, order[r.key]),
    )


def _fmt(value: float | None) -> str:
    if value is None:
        return MISSING
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1:
        return str(int(value))
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def render_table(table: Table, rows: Sequence[Row]) -> list[str]:
    keys = table.key.split(",") if table.key else []
    headers = ["machine", *(o.lstrip("-") for o in table.variant), *keys]
    headers += [c.header for c in table.cols] + ["date (UTC)", "command"]
    lines = [f"## {table.area}", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = [row.machine, *row.variant, *(row.key.split(",") if table.key else []), *map(_fmt, row.cells)]
        cells += [row.run.date, f"`{_shown_command(row.run.command)}`"]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _not_shown(benchmark: str) -> str | None:
    for name, reason in NOT_SHOWN.items():
        if benchmark == name or (name.endswith("*") and benchmark.startswith(name[:-1])):
            return reason
    return None


def render_page(runs: Sequence[Run]) -> str:
    tabled = {t.benchmark for t in TABLES}
    unshown = sorted({r.benchmark for r in runs} - tabled)
    missing = [b for b in unshown if _not_shown(b) is None]
    if missing:
        raise PageError(f"no table shows {missing} and NOT_SHOWN does not list them")
    lines = HEAD.splitlines() + [""]
    for table in TABLES:
        rows = table_rows(table, runs)
        if not rows:
            raise PageError(f"{table.area}: no {table.benchmark} run in the results")
        lines += render_table(table, rows)
    lines.append("Not shown: " + "; ".join(f"`{n}` ({r})" for n, r in NOT_SHOWN.items()) + ".")
    if len(lines) > MAX_LINES:
        raise PageError(f"the page would be {len(lines)} lines, more than {MAX_LINES}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page on disk is stale")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="the results folder")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page to write or check")
    args = parser.parse_args(argv)
    try:
        page = render_page(load_runs(args.results))
    except PageError as exc:
        print(f"results page: {exc}", file=sys.stderr)
        return 1
    if args.check:
        if not args.page.exists() or args.page.read_text(encoding="utf-8") != page:
            print(f"{args.page} is stale: run python -m benchmarks.analysis.results_page", file=sys.stderr)
            return 1
        return 0
    args.page.write_text(page, encoding="utf-8")
    print(f"wrote {args.page} ({page.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
