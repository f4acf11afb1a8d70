"""The benchmarks' shared result writing and statistics, which need no GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.lib.common import ResultLog, percentile, summary


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
