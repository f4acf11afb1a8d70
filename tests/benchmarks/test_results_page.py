"""The results page: docs/benchmarks.md is what the generator writes from benchmarks/results/, short, and the
results files stay small; the newest run per benchmark and machine wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.analysis import results_page
from benchmarks.analysis.results_page import PageError, load_runs, render_page, render_table, table_rows
from benchmarks.analysis.results_paths import Col, Table
from benchmarks.analysis.results_tables import TABLES
from benchmarks.lib.common import RESULTS_DIR
from benchmarks.lib.voice_client import summarize, turn_row

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


def _table(benchmark: str) -> Table:
    (table,) = [t for t in TABLES if t.benchmark == benchmark and not t.needs]  # its main table
    return table


def _voice_summary(waits: list[float], stopped_after: float) -> dict[str, object]:
    """What voice_client.summarize writes for turns whose first audio came ``waits`` after the end of speech."""
    turns = [
        {
            "question": "What do bees make?",
            "transcript": "what do bees make",
            "answer": "Honey.",
            "speech_s": 1.0,
            "speech_end_sent": 10.0,
            "stopped": 10.0 + stopped_after,
            "first_audio": 10.0 + wait,
            "arrivals": [(10.0 + wait, 0.5), (10.0 + wait + 0.9, 0.5)],  # the second 0.4 s after the buffer ran dry
        }
        for wait in waits
    ]
    return summarize([turn_row(t) for t in turns])


def test_a_new_voice_sessions_run_shows_per_detector_and_supersedes_the_old_format_where_it_measured(
    tmp_path: Path,
) -> None:
    def record(run_id: str, kind: str, **fields: object) -> dict[str, object]:
        return {"benchmark": "voice_sessions", "run_id": run_id, "kind": kind, **fields}

    gpu = {"gpu": "NVIDIA H100 80GB HBM3", "cpus": 16}
    old = [
        record(
            "old",
            "run",
            date="2026-12-05 10:00 UTC",
            command="python -m benchmarks.voice_sessions --sessions 64 128",
            **gpu,
        ),
        record("old", "summary", sessions=64, turns=128, lost=0, p50_s=0.2, p99_s=0.6, turns_stalled=3),
        record("old", "summary", sessions=128, turns=256, lost=1, p50_s=0.9, p99_s=2.0, turns_stalled=100),
    ]
    command = "python -m benchmarks.voice_sessions --sessions 64 --turn-detection server_vad semantic_vad"
    new = [
        record("new", "run", date="2026-12-08 10:00 UTC", command=command, **gpu),
        record("new", "summary", sessions=64, turn_detection="server_vad", **_voice_summary([0.9, 1.0, 1.2], 0.6)),
        record("new", "summary", sessions=64, turn_detection="semantic_vad", **_voice_summary([0.5, 0.6, 0.8], 0.2)),
        record("new", "comparison", sessions=64, latency_p50_s={"server_vad": 1.0, "semantic_vad": 0.6}),
    ]
    _write(tmp_path, "voice_sessions.jsonl", old + new)
    history = {"benchmark": "voice_sessions", "date": "2026-12-04", "machine": "the 2-core machine", "command": "c"}
    _write(tmp_path, "history.jsonl", [{**history, "metrics": {"n4_p50_ms": 300, "n4_lost": 0}}])
    table = _table("voice_sessions")

    rows = {(row.machine, row.key): row for row in table_rows(table, load_runs(tmp_path))}

    cells = {key: dict(zip([c.header for c in table.cols], row.cells, strict=True)) for key, row in rows.items()}
    assert set(rows) == {
        ("CPU", "4,server_vad"),  # history where no new run measured
        ("H100", "64,server_vad"),  # the new run, over the old one's N=64
        ("H100", "64,semantic_vad"),
        ("H100", "128,server_vad"),  # the old run's N=128, which the new one did not measure
    }
    assert cells[("H100", "64,server_vad")]["end of speech → first audio p50 ms"] == pytest.approx(1000)
    assert cells[("H100", "64,server_vad")]["p99 ms"] == pytest.approx(1200)
    assert cells[("H100", "64,server_vad")]["from speech_stopped p99 ms"] is None
    assert cells[("H100", "64,server_vad")]["turn decision mean ms"] == pytest.approx(600)
    assert cells[("H100", "64,server_vad")]["from speech_stopped p50 ms"] == pytest.approx(400)
    assert cells[("H100", "64,server_vad")]["underruns"] == 3 and cells[("H100", "64,server_vad")]["stalled"] is None
    assert cells[("H100", "64,semantic_vad")]["end of speech → first audio p50 ms"] == pytest.approx(600)
    assert cells[("H100", "128,server_vad")]["from speech_stopped p50 ms"] == pytest.approx(900)
    assert cells[("H100", "128,server_vad")]["end of speech → first audio p50 ms"] is None
    assert cells[("CPU", "4,server_vad")]["from speech_stopped p50 ms"] == 300
    lines = render_table(table, table_rows(table, load_runs(tmp_path)))
    assert "| sessions | turn detection | end of speech → first audio p50 ms |" in lines[1]
    assert any(line.startswith("| H100 | – | 64 | semantic_vad | 600 |") for line in lines)
