"""idle_rss and soak_rss append their runs through ResultLog, in the records the results page reads for them."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import idle_rss, soak_rss
from benchmarks.analysis.results_page import load_runs, table_rows
from benchmarks.analysis.results_paths import Table
from benchmarks.analysis.results_tables import TABLES
from benchmarks.lib.common import detail_path, read_results


def _table(benchmark: str) -> Table:
    (table,) = [t for t in TABLES if t.benchmark == benchmark]
    return table


def test_idle_rss_appends_a_run_per_call_and_the_page_shows_the_newest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "idle_rss.jsonl"
    loaded = iter([500, 600])

    def measure(stage: str, env: dict[str, str] | None) -> dict[str, object]:
        mib = next(loaded)
        return {
            "stage": stage,
            "imports_mib": 227,
            "loaded_mib": mib,
            "stage_mib": mib - 227,
            "after_trim_mib": 400,
            "load_s": 1.0,
        }

    monkeypatch.setattr(idle_rss, "measure", measure)
    for _ in range(2):
        monkeypatch.setattr(sys, "argv", ["idle_rss", "--stages", "llm", "--out", str(out)])
        assert idle_rss.main() == 0

    records = read_results(out)
    assert [r["kind"] for r in records] == ["run", "stage", "run", "stage"]
    assert len({r["run_id"] for r in records}) == 2
    rows = table_rows(_table("idle_rss"), load_runs(tmp_path))
    assert [(row.key, row.cells[:2]) for row in rows] == [("llm", (373, 600))]


def test_soak_rss_appends_its_summary_and_gzips_its_cycles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def cycle_once(client: Any, url: str, cycle: int, audio: bool) -> dict[str, Any]:
        return {"http_chat": 200, "http_surrogate": 500 if cycle == 1 else 400}

    async def no_wait(seconds: float) -> None:
        return None

    rss = iter([1000.0, 1010.0, 1020.0, 1030.0, 1040.0, 990.0])
    signals: list[int] = []
    monkeypatch.setattr(soak_rss, "cycle_once", cycle_once)
    monkeypatch.setattr(soak_rss, "rss_mib", lambda pid: next(rss))
    # the server's pid is made up: the signals it would be sent (malloc_trim) are only noted
    monkeypatch.setattr(soak_rss, "os", SimpleNamespace(kill=lambda pid, sig: signals.append(sig)))
    monkeypatch.setattr(soak_rss, "asyncio", SimpleNamespace(sleep=no_wait))
    args = SimpleNamespace(
        cycles=3,
        duration=60.0,
        warmup=1,
        audio_every=0,
        print_every=10,
        tracemalloc=False,
        model="default",
        malloc_arena_max=None,
    )
    out = tmp_path / "soak_rss.jsonl"
    with soak_rss.ResultLog(out, "soak_rss") as log:
        summary = asyncio.run(soak_rss.soak(args, port=1, pid=-1, log=log))
        log.write("summary", **summary)

    assert [r["kind"] for r in read_results(out)] == ["run", "summary", "cycle", "cycle", "cycle"]
    assert detail_path(out).exists() and signals == [soak_rss.signal.SIGUSR1]
    (row,) = table_rows(_table("soak_rss"), load_runs(tmp_path))
    assert row.cells == (3, 1000, 1040, 990, 1)
