"""The guard's admission of voice sessions by the measured replies, on the raw ASGI interface."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.guard import Guard
from omni_gateway.gateway.realtime.voice_capacity import VoiceCapacity
from omni_gateway.gateway.realtime.voice_timing import Playback

SLOW = Playback(audio_s=1.0, stream_s=1.2, underruns=0, longest_gap_s=0.0)
FAST = Playback(audio_s=1.0, stream_s=0.2, underruns=0, longest_gap_s=0.0)


def scope(denials: bool = True) -> dict[str, Any]:
    return {
        "type": "websocket",
        "path": "/v1/realtime",
        "headers": [(b"host", b"127.0.0.1:8000")],
        "client": ("127.0.0.1", 5000),
        "extensions": {"websocket.http.response": {}} if denials else {},
    }


def measured(*replies: Playback) -> VoiceCapacity:
    capacity = VoiceCapacity(0.9, clock=lambda: 0.0)
    for playback in replies:
        capacity.playback(playback)
    return capacity


async def second_session(guard_args: dict[str, Any], denials: bool = True) -> tuple[list[dict[str, Any]], bool]:
    """One voice session held open, then another's handshake: what the guard sent it, and whether it got in."""
    release, inside = asyncio.Event(), asyncio.Event()
    entered: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        entered.append(1)
        if len(entered) == 1:
            inside.set()
            await release.wait()

    guard = Guard(app, config=GatewayConfig(), healthy=lambda: True, **guard_args)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(dict(message))

    first = asyncio.create_task(guard(scope(), receive, send))
    await inside.wait()
    await guard(scope(denials), receive, send)
    release.set()
    await first
    return sent, len(entered) == 2


def test_a_voice_session_is_refused_with_503_and_the_measurement_while_replies_fall_behind() -> None:
    sent, admitted = asyncio.run(second_session({"voice": True, "capacity": measured(*[SLOW] * 8)}))
    start, body = sent
    assert not admitted and start["type"] == "websocket.http.response.start" and start["status"] == 503
    assert (b"retry-after", b"1") in start["headers"]
    error = json.loads(body["body"])["error"]
    assert error["code"] == "voice_capacity_reached" and error["type"] == "server_error"
    assert error["message"] == (
        "This server's speech stages are at capacity (spoken replies are falling behind real time: p90 real-time "
        "factor 1.20 over the last 8 replies (limit 0.9)); try again later."
    )


def test_without_denial_responses_the_refusal_is_a_close_1013() -> None:
    sent, admitted = asyncio.run(second_session({"voice": True, "capacity": measured(*[SLOW] * 8)}, denials=False))
    (close,) = sent
    assert not admitted and close["type"] == "websocket.close" and close["code"] == 1013
    assert close["reason"].startswith("This server's speech stages are at capacity (spoken replies are falling")


def test_voice_sessions_are_admitted_while_the_replies_keep_up() -> None:
    assert asyncio.run(second_session({"voice": True, "capacity": measured(*[FAST] * 8)})) == ([], True)
    assert asyncio.run(second_session({"voice": True, "capacity": measured(*[SLOW] * 7)})) == ([], True)


def test_a_server_without_speech_stages_is_not_judged_by_replies() -> None:
    assert asyncio.run(second_session({"voice": False, "capacity": measured(*[SLOW] * 8)})) == ([], True)


def test_with_no_voice_session_open_the_window_refuses_nobody() -> None:
    async def alone() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            sent.append({"type": "admitted"})

        async def receive() -> dict[str, Any]:
            return {"type": "websocket.connect"}

        async def send(message: Any) -> None:
            sent.append(dict(message))

        guard = Guard(app, config=GatewayConfig(), healthy=lambda: True, voice=True, capacity=measured(*[SLOW] * 8))
        await guard(scope(), receive, send)
        return sent

    assert asyncio.run(alone()) == [{"type": "admitted"}]
