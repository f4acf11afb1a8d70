"""A preferred engine's admitting steps go ahead of another engine loop's steps (engine.runner.step_priority)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from omni_gateway.engine.frontend.async_engine import AsyncEngine
from omni_gateway.engine.runner.input_stream import InputStream
from omni_gateway.engine.runner.step_priority import StepPriority
from omni_gateway.engine.sampling_params import SamplingParams

from tests.harness.engine_fakes import make_engine


def test_wait_turn_holds_while_a_step_admits_and_gives_up_after_its_timeout() -> None:
    priority = StepPriority()
    assert priority.wait_turn(0.0)  # nothing admitting: no wait
    released: list[float] = []
    with priority.admitting():
        waiter = threading.Thread(target=lambda: released.append(time.monotonic() if priority.wait_turn(5.0) else 0.0))
        waiter.start()
        time.sleep(0.1)
        assert not released  # still held
        assert not priority.wait_turn(0.01)  # a short wait gives up
        left = time.monotonic()
    waiter.join(5.0)
    assert released and released[0] >= left


def _traced(engine: AsyncEngine, name: str, log: list[tuple[str, float, float, bool]], delay_s: float) -> None:
    """Record each step's (engine, start, end, has a prefill chunk); prefill steps take ``delay_s`` longer."""
    runner = engine.engine.runner
    execute = runner.execute

    def traced(batch: Any, after: Any = None) -> Any:
        start = time.monotonic()
        prefill = any(n > 1 for n in batch.num_new_tokens)
        if prefill:
            time.sleep(delay_s)
        out = execute(batch, after)
        log.append((name, start, time.monotonic(), prefill))
        return out

    runner.execute = traced


def _busy_steps_during_admission(linked: bool) -> list[float]:
    """Start times of a busy engine's steps that began while another engine ran a step admitting a request
    with an input stream (made 40 ms long); with ``linked`` the admitting engine is preferred."""
    busy, preferred = AsyncEngine(engine=make_engine()), AsyncEngine(engine=make_engine())
    if linked:
        preferred.prefer_over(busy)
        preferred.prefer_over(busy)  # idempotent
    log: list[tuple[str, float, float, bool]] = []
    _traced(busy, "busy", log, 0.0)
    _traced(preferred, "preferred", log, 0.04)

    done = asyncio.Event()

    async def chatter() -> None:
        while not done.is_set():  # request after request: the busy engine always has a step to run
            async for _ in busy.generate([5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True)):
                pass

    async def main() -> None:
        talker = asyncio.create_task(chatter())
        await asyncio.sleep(0.05)  # the busy engine is stepping
        stream = InputStream(start=4)
        stream.close([], "pad")
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        async for _ in preferred.generate([5, 6, 7, 8], params, input_stream=stream):
            pass
        done.set()
        await talker

    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        busy.shutdown()
        preferred.shutdown()
    admit_start, admit_end = next((s, e) for name, s, e, prefill in log if name == "preferred" and prefill)
    return [s for name, s, _, _ in log if name == "busy" and admit_start < s < admit_end]


def test_the_other_engine_holds_its_steps_while_a_preferred_one_admits() -> None:
    assert _busy_steps_during_admission(linked=False)  # unlinked, the busy engine steps meanwhile
    assert not _busy_steps_during_admission(linked=True)
