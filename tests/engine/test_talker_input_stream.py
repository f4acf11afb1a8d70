"""Input streams: rows that reach a running request while it generates, and the waiting they cause."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from omni_gateway.engine.frontend import async_engine as async_engine_module
from omni_gateway.engine.frontend.async_engine import AsyncEngine
from omni_gateway.engine.runner.input_stream import InputStream
from omni_gateway.engine.sampling_params import SamplingParams

from tests.harness.engine_fakes import make_engine


def test_rows_then_fill_after_close() -> None:
    stream = InputStream(start=5)
    assert stream.ready(5) and not stream.ready(6)
    stream.append(["a", "b"])
    assert stream.ready(7) and not stream.ready(8)
    assert stream.rows(3, 7) == ["a", "b"]  # positions before the start have no rows
    with pytest.raises(RuntimeError, match="position 7"):
        stream.rows(5, 8)
    stream.close(["c"], "pad")
    assert stream.ready(100)
    assert stream.rows(6, 10) == ["b", "c", "pad", "pad"]
    with pytest.raises(RuntimeError, match="closed"):
        stream.close([], "pad")
    with pytest.raises(ValueError, match=">= 0"):
        InputStream(start=-1)


def test_listeners_hear_every_later_arrival() -> None:
    stream = InputStream(start=0)
    stream.append(["before"])
    heard: list[int] = []
    stream.listen(lambda: heard.append(len(heard)))
    stream.append(["a"])
    stream.append(["b", "c"])
    stream.close([], "pad")
    assert heard == [0, 1, 2]


Steps = list[tuple[float, tuple[str, ...]]]


def _traced_engine(
    monkeypatch: pytest.MonkeyPatch, quiet_s: float, gather_s: float, *, prefill: bool
) -> tuple[AsyncEngine, Steps]:
    """An engine loop gathering with these spells, and the (time.monotonic(), request ids) of each step it
    runs that has a prefill chunk (``prefill``) or that only decodes (not ``prefill``)."""
    monkeypatch.setattr(async_engine_module, "_ROWS_QUIET_S", quiet_s)
    monkeypatch.setattr(async_engine_module, "_GATHER_MAX_S", gather_s)
    engine = AsyncEngine(engine=make_engine())
    runner = engine.engine.runner
    execute = runner.execute
    steps: Steps = []

    def traced(batch: Any, after: Any = None) -> Any:
        if any(n > 1 for n in batch.num_new_tokens) == prefill:
            steps.append((time.monotonic(), tuple(sorted(seq.request_id for seq in batch.seqs))))
        return execute(batch, after)

    runner.execute = traced
    return engine, steps


def _two_talkers(rows: Any, monkeypatch: pytest.MonkeyPatch, *, quiet_s: float, gather_s: float) -> dict[str, int]:
    """Two requests that wait for input rows after their prefill; ``rows(streams, steps)`` (a coroutine)
    feeds them, with ``steps`` growing by (time.monotonic(), request ids) at each decode step. Returns the
    tokens each request got."""
    # No poll would find the rows in time: only an arriving row wakes the loop.
    monkeypatch.setattr(async_engine_module, "_INPUT_POLL_S", 60.0)
    engine, steps = _traced_engine(monkeypatch, quiet_s, gather_s, prefill=False)
    prompt = [5, 6, 7, 8]
    streams = {rid: InputStream(start=len(prompt)) for rid in ("a", "b")}
    got = {rid: 0 for rid in streams}
    first = {rid: asyncio.Event() for rid in streams}

    async def talk(rid: str) -> None:
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        async for delta in engine.generate(prompt, params, request_id=rid, input_stream=streams[rid]):
            got[rid] += len(delta.token_ids)
            first[rid].set()

    async def main() -> None:
        talkers = [asyncio.create_task(talk(rid)) for rid in streams]
        await asyncio.gather(*(event.wait() for event in first.values()))
        assert not steps  # both wait for their first row
        await rows(streams, steps)
        for stream in streams.values():
            stream.close([], "pad")
        await asyncio.gather(*talkers)

    try:
        asyncio.run(asyncio.wait_for(main(), 20))
    finally:
        engine.shutdown()
    return got


def test_one_step_carries_rows_that_arrive_one_stream_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer's rows reach its streams one by one; the loop gathers them into one step rather than
    stepping each request as its row lands. Only the arrivals wake the loop (its poll is a minute)."""
    seen: Steps = []

    async def rows(streams: dict[str, InputStream], steps: Steps) -> None:
        streams["a"].append(["row"])
        await asyncio.sleep(0.05)  # long enough for the loop to see "a" ready and "b" still waiting
        streams["b"].append(["row"])
        while not steps:
            await asyncio.sleep(0.005)
        seen.extend(steps)

    got = _two_talkers(rows, monkeypatch, quiet_s=2.0, gather_s=5.0)
    assert seen[0][1] == ("a", "b")
    assert got == {"a": 3, "b": 3}


def test_a_ready_request_steps_once_no_more_rows_arrive(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: Steps = []

    async def rows(streams: dict[str, InputStream], steps: Steps) -> None:
        sent = time.monotonic()
        streams["a"].append(["row"])
        while not steps:
            await asyncio.sleep(0.005)
        seen.extend((at - sent, ids) for at, ids in steps)

    got = _two_talkers(rows, monkeypatch, quiet_s=0.2, gather_s=10.0)
    waited, ids = seen[0]
    assert ids == ("a",)  # "b" had no row coming
    assert 0.2 <= waited < 5.0  # "a" waited for the quiet spell, not for the cap
    assert got == {"a": 3, "b": 3}


def test_no_wait_once_rows_stopped_arriving(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gathering waits only while rows are arriving: with no row for a quiet spell, a ready request steps at
    once, however long the others' rows take."""
    seen: Steps = []

    async def rows(streams: dict[str, InputStream], steps: Steps) -> None:
        streams["a"].append(["row", "row"])  # "a" can run to its end; "b" gets nothing
        while len(steps) < 2:
            await asyncio.sleep(0.005)
        seen.extend(steps)

    got = _two_talkers(rows, monkeypatch, quiet_s=0.3, gather_s=10.0)
    (first, ids1), (second, ids2) = seen[:2]
    assert ids1 == ids2 == ("a",)
    assert second - first < 0.2  # the second step did not wait out another quiet spell
    assert got == {"a": 3, "b": 3}


def test_a_request_waits_for_its_rows_and_others_run_meanwhile() -> None:
    engine = make_engine()
    prompt = [5, 6, 7, 8]
    stream = InputStream(start=len(prompt))
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request("talker", prompt, params, input_stream=stream)
    engine.add_request("plain", [9, 10, 11], params)
    got: dict[str, int] = {"talker": 0, "plain": 0}

    def step() -> None:
        for delta in engine.step():
            got[delta.request_id] += len(delta.token_ids)

    step()  # prefills: both sample their first token
    assert got == {"talker": 1, "plain": 1}
    for _ in range(3):  # the talker needs the row of its first generated position to go on; "plain" does not
        step()
    assert got == {"talker": 1, "plain": 4}
    assert engine.waits_for_input() and engine.step() == []  # nothing to do, and no error either
    stream.append(["row"])
    step()
    assert got["talker"] == 2
    stream.close([], "pad")
    while engine.has_unfinished():
        step()
    assert got["talker"] == 4
    assert engine.scheduler.kv.usage().num_used_blocks == 0


def test_decoded_text_after_mrope_spans_shifts_like_mrope_positions() -> None:
    """A graph decodes text past M-RoPE media at index + text_shift, which all three axes agree on."""
    import torch
    from omni_gateway.engine.core.sequence import EmbedSpan
    from omni_gateway.engine.runner.mrope import mrope_positions, text_shift

    grid = torch.tensor([[0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 0, 0], [0, 1, 0, 1, 0, 1]])  # t, h, w of 6 patches
    spans = (
        EmbedSpan(offset=0, length=3, key="text", embeds=None),
        EmbedSpan(offset=3, length=6, key="image", embeds=None, positions=grid),
        EmbedSpan(offset=11, length=6, key="image2", embeds=None, positions=grid),
    )
    for index in (17, 18, 40):
        want = mrope_positions(spans, index, index + 1)[:, 0]
        assert want.tolist() == [index + text_shift(spans)] * 3
    assert text_shift(spans) == 2 * (2 - 6)


def _prefills_of_talkers_added_apart(apart_s: float, monkeypatch: pytest.MonkeyPatch, *, quiet_s: float) -> Steps:
    """Two requests with input streams added ``apart_s`` apart; the prefill steps as (time, request ids)."""
    engine, prefills = _traced_engine(monkeypatch, quiet_s, 10.0, prefill=True)
    prompt = [5, 6, 7, 8]

    async def talk(rid: str) -> None:
        stream = InputStream(start=len(prompt))
        stream.close([], "pad")
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        async for _ in engine.generate(prompt, params, request_id=rid, input_stream=stream):
            pass

    async def main() -> None:
        first = asyncio.create_task(talk("a"))
        await asyncio.sleep(apart_s)
        await asyncio.gather(first, talk("b"))

    try:
        asyncio.run(asyncio.wait_for(main(), 20))
    finally:
        engine.shutdown()
    return prefills


def test_one_prefill_admits_talkers_that_arrive_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer starts several sessions' talkers one at a time: the first waits while the others keep
    arriving, and one prefill takes them all instead of the first prefilling alone."""
    prefills = _prefills_of_talkers_added_apart(0.05, monkeypatch, quiet_s=1.0)
    assert [ids for _, ids in prefills] == [("a", "b")]


def test_a_talker_prefills_once_no_other_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    prefills = _prefills_of_talkers_added_apart(0.6, monkeypatch, quiet_s=0.1)
    assert [ids for _, ids in prefills] == [("a",), ("b",)]
