"""openai-agents' RealtimeAgent with a function tool against the live server over a real engine (tiny
random Llama, CPU): tool_choice "required" makes every response a call whose arguments validate, and
the tool's output starts the next response, which calls again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.harness.live_server import serve
from tests.harness.real_engine import tiny_pipeline

pytestmark = pytest.mark.slow
TIMEOUT = 120


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    pipe = tiny_pipeline(Path(tmp_path_factory.mktemp("tiny-llama")), max_tokens=120)
    with serve(pipe) as port:
        yield port
    pipe.shutdown()


def test_function_tool_loop_with_realtime_agent(port: int) -> None:
    from agents import function_tool
    from agents.realtime import RealtimeAgent, RealtimeRunner

    zones: list[str] = []

    @function_tool
    def get_time(zone: Literal["UTC", "CET"]) -> str:
        """The current time in a time zone."""
        zones.append(zone)
        return "12:00"

    async def session_run() -> list[str]:
        agent = RealtimeAgent(name="clock", instructions="Answer with the time.", tools=[get_time])
        settings: Any = {
            "model_name": "tiny-llama",
            "output_modalities": ["text"],
            "tool_choice": "required",
            "turn_detection": None,  # this server runs without VAD
        }
        runner = RealtimeRunner(agent, config={"model_settings": settings})
        session = await runner.run(model_config={"url": f"ws://127.0.0.1:{port}/v1/realtime", "api_key": "unused"})
        seen: list[str] = []
        async with session:
            await session.send_message("What time is it in UTC?")
            async for event in session:
                seen.append(event.type)
                assert event.type != "error", event
                if seen.count("tool_end") >= 2:
                    break
        return seen

    seen = asyncio.run(asyncio.wait_for(session_run(), TIMEOUT))
    assert len(zones) >= 2 and set(zones) <= {"UTC", "CET"}
    # The second call came from the response that the first call's output started.
    first_end = seen.index("tool_end")
    assert "agent_start" in seen[first_end:]
