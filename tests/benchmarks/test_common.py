"""The benchmarks' shared result writing and statistics, which need no GPU."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from benchmarks.lib.common import ResultLog, detail_path, percentile, read_results, summary


def test_result_log_appends_one_run_record_then_the_measurements(tmp_path: Path) -> None:
    out = tmp_path / "results" / "demo.jsonl"
    for value in (1, 2):
        with ResultLog(out, "demo", setting="x") as log:
            log.write("case", value=value)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["kind"] for r in records] == ["run", "case", "run", "case"]
    assert records[0]["command"].startswith("python -m benchmarks.demo") and records[0]["setting"] == "x"
    assert records[1]["run_id"] == records[0]["run_id"] and records[1]["value"] == 1
    assert all(r["benchmark"] == "demo" for r in records)


def test_percentile_and_summary() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 0.0) == 1.0 and percentile(values, 0.5) == 3.0 and percentile(values, 1.0) == 5.0
    assert summary(values) == {"median": 3.0, "p90": 5.0, "min": 1.0, "max": 5.0, "n": 5}
    with pytest.raises(ValueError):
        percentile([], 0.5)


def test_detail_kinds_go_to_the_gzipped_sibling_and_read_back_with_the_run(tmp_path: Path) -> None:
    out = tmp_path / "voice_sessions.jsonl"
    for run in (1, 2):
        with ResultLog(out, "voice_sessions") as log:
            for turn in range(3):
                log.write("turn", run=run, turn=turn)
            log.write("summary", run=run)
    plain = [json.loads(line)["kind"] for line in out.read_text().splitlines()]
    assert plain == ["run", "summary", "run", "summary"]
    with gzip.open(detail_path(out), "rt") as f:
        assert [json.loads(line)["turn"] for line in f] == [0, 1, 2, 0, 1, 2]
    records = read_results(out)
    assert [(r["kind"], r.get("run")) for r in records if r["kind"] != "run"] == [
        ("summary", 1),
        ("summary", 2),
        *[("turn", 1)] * 3,
        *[("turn", 2)] * 3,
    ]
    assert len({r["run_id"] for r in records}) == 2
