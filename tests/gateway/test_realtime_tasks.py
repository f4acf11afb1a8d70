"""Running a realtime session's tasks against the backend (``tasks.py``), without a socket."""

from __future__ import annotations

import asyncio

from omni_gateway.gateway.realtime.commands import Output
from omni_gateway.gateway.realtime.tasks import run_task
from omni_gateway.omni.protocol import AudioChunk, Done

from tests.harness.fake_backend import FakeBackend, tone
from tests.harness.session_driver import Driver, events, generations


def test_a_burst_of_ready_chunks_lets_other_tasks_run_between_them() -> None:
    # A TTS batch that finishes hands over seconds of audio at once: the scripted stream never suspends.
    backend = FakeBackend(script=[*(AudioChunk(tone(100), 24000) for _ in range(50)), Done("stop")])
    d = Driver(backend=backend)
    d.text_item()
    (work,) = generations(d.send({"type": "response.create"}))

    async def scenario() -> list[tuple[int, str]]:
        turns = 0
        seen: list[tuple[int, str]] = []  # (other task's turns so far, event) for each event reported

        async def other_task() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        async def report(outputs: list[Output]) -> None:
            seen.extend((turns, e["type"]) for e in events(outputs))

        other = asyncio.create_task(other_task())
        await run_task(backend, d.session, work.request.request_id, work, report)
        other.cancel()
        return seen

    seen = asyncio.run(scenario())
    deltas = [turns for turns, kind in seen if kind == "response.output_audio.delta"]
    assert len(deltas) == 50 and seen[-1][1] == "response.done"
    assert all(later > earlier for earlier, later in zip(deltas, deltas[1:], strict=False))
