"""The results page: docs/benchmarks.md is what the generator writes from benchmarks/results/, short, and the
results files stay small; the newest run per benchmark and machine wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.analysis import results_page
from benchmarks.analysis.results_page import Col, PageError, Table, load_runs, render_page, table_rows
from benchmarks.lib.common import RESULTS_DIR

MAX_RESULTS_FILE = 1 << 20


def test_page_on_disk_is_what_the_generator_writes() -> None:
    assert results_page.main(["--check"]) == 0, (
        "docs/benchmarks.md is stale: python -m benchmarks.analysis.results_page"
    )


def test_page_is_at_most_250_lines() -> None:
    assert len(results_page.PAGE.read_text(encoding="utf-8").splitlines()) <= results_page.MAX_LINES == 250


def test_no_results_file_over_1_mib() -> None:
    sizes = {p.name: p.stat().st_size for p in RESULTS_DIR.iterdir() if p.is_file()}
    assert sizes and not {name: size for name, size in sizes.items() if size > MAX_RESULTS_FILE}


def _run(date: str, run_id: str, gpu: str | None, value: float) -> list[dict[str, object]]:
    header = {"benchmark": "demo", "run_id": run_id, "kind": "run", "date": f"{date} UTC", "command": "python -m x"}
    header.update({"gpu": gpu, "cpus": 16} if gpu else {"cpus": 2})
    return [header, {"benchmark": "demo", "run_id": run_id, "kind": "case", "ms": value}]


DEMO = Table("Demo", "demo", (Col("ms", "case:ms", "ms"),))


def _write(folder: Path, name: str, records: list[dict[str, object]]) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_newest_run_per_benchmark_and_machine_wins(tmp_path: Path) -> None:
    # Written out of date order: the file's order must not decide.
    records = _run("2026-12-05 10:00", "b", None, 2.0) + _run("2026-12-04 10:00", "a", None, 1.0)
    records += _run("2026-12-03 09:00", "c", "NVIDIA H100 80GB HBM3", 3.0)
    _write(tmp_path, "demo.jsonl", records)
    history = [
        {"benchmark": "demo", "date": "2026-12-06", "machine": "one NVIDIA H100", "command": "c", "metrics": {"ms": 4}},
        {
            "benchmark": "demo",
            "date": "2026-12-01",
            "machine": "the 2-core machine",
            "command": "c",
            "metrics": {"ms": 0},
        },
    ]
    _write(tmp_path, "history.jsonl", history)

    rows = table_rows(DEMO, load_runs(tmp_path))

    assert [(row.machine, row.run.date, row.cells) for row in rows] == [
        ("CPU", "2026-12-05 10:00", (2.0,)),  # the newer real run, over the older one and the older history record
        ("H100", "2026-12-06", (4,)),  # a history record newer than the real run supersedes it
    ]


def test_a_benchmark_no_table_shows_fails_the_page(tmp_path: Path) -> None:
    _write(tmp_path, "demo.jsonl", _run("2026-12-05 10:00", "a", None, 1.0))
    _write(tmp_path, "history.jsonl", [])
    with pytest.raises(PageError, match="no table shows \\['demo'\\]"):
        render_page(load_runs(tmp_path))


def test_a_newest_run_the_table_cannot_read_fails(tmp_path: Path) -> None:
    records = _run("2026-12-04 10:00", "a", None, 1.0)
    records += [{**_run("2026-12-05 10:00", "b", None, 0)[0]}, {"benchmark": "demo", "run_id": "b", "kind": "other"}]
    _write(tmp_path, "demo.jsonl", records)
    with pytest.raises(PageError, match="has none of the table's columns"):
        table_rows(DEMO, load_runs(tmp_path))
