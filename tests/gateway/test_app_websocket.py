"""Raw WebSocket behaviour of /v1/realtime: subprotocols, auth, limits, malformed frames, G.711, teardown."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.realtime import g711
from omni_gateway.omni.protocol import TextDelta
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.harness.fake_backend import FakeBackend, tone
from tests.harness.live_server import recv, serve, until

TIMEOUT = 15
KEY = "sk-test-key"


@pytest.fixture(scope="module")
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture(scope="module")
def port(backend: FakeBackend) -> Iterator[int]:
    with serve(backend, GatewayConfig(max_frame_bytes=64 * 1024)) as p:
        yield p


@pytest.fixture(scope="module")
def secured_port() -> Iterator[int]:
    with serve(FakeBackend(), GatewayConfig(api_key=KEY)) as p:
        yield p


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


def url(port: int) -> str:
    return f"ws://127.0.0.1:{port}/v1/realtime?model=omni-test"


@pytest.mark.parametrize(
    "offered, chosen",
    [
        (["realtime", "openai-insecure-api-key.whatever"], "realtime"),
        (None, None),
    ],
)
def test_subprotocol_is_echoed_only_when_offered(port: int, offered: list[str] | None, chosen: str | None) -> None:
    async def go() -> tuple[str | None, dict[str, Any]]:
        async with connect(url(port), subprotocols=offered) as ws:  # type: ignore[arg-type]
            return ws.subprotocol, await recv(ws)

    subprotocol, first = run(go())
    assert subprotocol == chosen and first["type"] == "session.created"


@pytest.mark.parametrize("compression", [False, True])
def test_permessage_deflate_is_accepted_only_when_configured(compression: bool) -> None:
    async def go(port: int) -> tuple[str | None, dict[str, Any]]:
        async with connect(url(port)) as ws:  # offers permessage-deflate, as browsers do
            return ws.response.headers.get("Sec-WebSocket-Extensions"), await recv(ws)

    with serve(FakeBackend(), GatewayConfig(ws_compression=compression)) as p:
        extensions, first = run(go(p))
    assert first["type"] == "session.created"
    assert (extensions is not None and "permessage-deflate" in extensions) is compression


@pytest.mark.parametrize("how", ["subprotocol", "header"])
def test_beta_dialect_is_chosen_by_subprotocol_or_header(port: int, how: str) -> None:
    async def go() -> dict[str, Any]:
        if how == "subprotocol":
            ctx = connect(url(port), subprotocols=["realtime", "openai-beta.realtime-v1"])  # type: ignore[list-item]
        else:
            ctx = connect(url(port), additional_headers={"OpenAI-Beta": "realtime=v1"})
        async with ctx as ws:
            return (await recv(ws))["session"]

    session = run(go())
    assert "modalities" in session and "type" not in session


@pytest.mark.parametrize(
    "headers, protocols",
    [
        ({}, None),
        ({"Authorization": "Bearer wrong"}, None),
        ({}, ["realtime", "openai-insecure-api-key.wrong"]),
    ],
)
def test_bad_or_missing_key_is_refused_with_401(secured_port: int, headers: dict, protocols: list | None) -> None:
    async def go() -> None:
        async with connect(url(secured_port), additional_headers=headers, subprotocols=protocols):
            pass

    with pytest.raises(InvalidStatus) as info:
        run(go())
    assert info.value.response.status_code == 401
    assert b"invalid_api_key" in info.value.response.body


@pytest.mark.parametrize(
    "headers, protocols",
    [
        ({"Authorization": f"Bearer {KEY}"}, None),
        ({}, ["realtime", f"openai-insecure-api-key.{KEY}"]),
    ],
)
def test_right_key_is_accepted(secured_port: int, headers: dict, protocols: list | None) -> None:
    async def go() -> tuple[str | None, str]:
        async with connect(url(secured_port), additional_headers=headers, subprotocols=protocols) as ws:
            return ws.subprotocol, (await recv(ws))["type"]

    subprotocol, first = run(go())
    assert first == "session.created"
    assert subprotocol == (None if protocols is None else "realtime")  # never the key-bearing protocol


def test_oversized_frame_closes_with_1009(port: int) -> None:
    async def go() -> int:
        async with connect(url(port), max_size=None) as ws:
            await recv(ws)
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (80 * 1024)}))
            try:
                while True:
                    await ws.recv()
            except ConnectionClosed as closed:
                assert closed.rcvd is not None
                return closed.rcvd.code
        raise AssertionError("unreachable")

    assert run(go()) == 1009


def test_malformed_frames_get_errors_and_the_session_continues(port: int) -> None:
    async def go() -> list[dict[str, Any]]:
        async with connect(url(port)) as ws:
            await until(ws, "conversation.created")
            await ws.send("{oops")
            await ws.send(b"\x00\x01")
            await ws.send(
                json.dumps(
                    {
                        "type": "conversation.item.create",
                        "event_id": "ok_1",
                        "item": {
                            "type": "message",
                            "role": "user",
                            "content": [{"type": "input_text", "text": "still here"}],
                        },
                    }
                )
            )
            return [await recv(ws) for _ in range(4)]

    first, second, added, done = run(go())
    assert first["type"] == "error" and first["error"]["code"] == "invalid_json"
    assert second["type"] == "error" and second["error"]["code"] == "invalid_event"
    assert added["type"] == "conversation.item.added" and done["type"] == "conversation.item.done"


def test_g711_in_and_out(port: int, backend: FakeBackend) -> None:
    samples_8k = np.frombuffer(tone(300), dtype="<i2")[::3]

    async def go() -> list[dict[str, Any]]:
        async with connect(url(port)) as ws:
            await until(ws, "conversation.created")
            await ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {
                            "type": "realtime",
                            "audio": {
                                "input": {"format": {"type": "audio/pcmu"}, "turn_detection": None},
                                "output": {"format": {"type": "audio/pcma"}},
                            },
                        },
                    }
                )
            )
            await until(ws, "session.updated")
            await ws.send(
                json.dumps(
                    {
                        "type": "input_audio_buffer.append",
                        "audio": base64.b64encode(g711.pcm_to_ulaw(samples_8k)).decode(),
                    }
                )
            )
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            await ws.send(json.dumps(GREETING))
            return await until(ws, "response.done")

    events = run(go())
    deltas = [base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"]
    assert [len(d) for d in deltas] == [800] * 5  # 100 ms of A-law at 8 kHz each
    heard = g711.alaw_to_pcm(deltas[0]).astype(np.float64)
    assert np.corrcoef(heard, np.frombuffer(tone(100), dtype="<i2")[::3].astype(np.float64))[0, 1] > 0.99
    user_audio = backend.requests[-1].messages[-1].parts[0]
    assert len(user_audio.pcm16) == 300 * 48  # type: ignore[union-attr]


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# A response to an empty conversation is refused; instructions give the model something to answer.
GREETING = {"type": "response.create", "response": {"instructions": "Greet the user."}}


def test_cancel_and_disconnect_abort_backend_requests() -> None:
    backend = FakeBackend()
    backend.gate = asyncio.Event()  # never set: every generation hangs before its first chunk

    async def go(port: int) -> tuple[str, dict[str, Any]]:
        async with connect(url(port)) as ws:
            await until(ws, "conversation.created")
            await ws.send(json.dumps(GREETING))
            first = (await until(ws, "response.created"))[-1]["response"]["id"]
            await ws.send(json.dumps({"type": "response.cancel"}))
            done = (await until(ws, "response.done"))[-1]["response"]
            await ws.send(json.dumps(GREETING))
            second = (await until(ws, "response.created"))[-1]["response"]["id"]
            while second not in [r.request_id for r in backend.requests]:  # leave once its stream has started
                await asyncio.sleep(0.01)
            return first + " " + second, done
        raise AssertionError("unreachable")

    with serve(backend) as port:
        ids, done = run(go(port))
        first, second = ids.split()
        assert done["status"] == "cancelled" and done["status_details"]["reason"] == "client_cancelled"
        wait_for(lambda: first in backend.aborted, "the cancelled request to be aborted")
        wait_for(lambda: second in backend.aborted, "the disconnected session's request to be aborted")
        wait_for(lambda: second in backend.closed, "the backend stream to be closed")


class BrokenBackend(FakeBackend):
    """Fails the first generation synchronously and the second mid-stream."""

    def generate(self, request):  # type: ignore[no-untyped-def]
        self.requests.append(request)
        if len(self.requests) == 1:
            raise RuntimeError("engine is down")
        return self._half_then_fail()

    async def _half_then_fail(self):  # type: ignore[no-untyped-def]
        yield TextDelta("half ")
        raise RuntimeError("engine died mid-stream")


def test_backend_failures_fail_the_response_and_the_session_goes_on() -> None:
    async def go(port: int) -> list[dict[str, Any]]:
        async with connect(url(port)) as ws:
            await until(ws, "conversation.created")
            await ws.send(
                json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
            )
            done = []
            for _ in range(2):
                await ws.send(json.dumps(GREETING))
                done.append((await until(ws, "response.done"))[-1]["response"])
            return done

    with serve(BrokenBackend()) as port:
        first, second = run(go(port))
    assert first["status"] == "failed" and second["status"] == "failed"
    assert second["output"][0]["content"][0]["text"] == "half "
    assert "engine" not in json.dumps(first)  # internal exception text stays in the server log


def test_open_sessions_gauge_returns_to_zero(port: int) -> None:
    from omni_gateway.gateway import metrics

    async def go() -> float:
        async with connect(url(port)) as ws:
            await recv(ws)
            return metrics.SESSIONS_OPEN._value.get()

    assert run(go()) >= 1
    wait_for(lambda: metrics.SESSIONS_OPEN._value.get() == 0, "the session gauge to drop")


@pytest.mark.slow  # the shortest idle timeout OpenAI allows is 5 s
def test_idle_timeout_fires_over_the_socket(port: int) -> None:
    async def go() -> list[dict[str, Any]]:
        async with connect(url(port)) as ws:
            await until(ws, "conversation.created")
            await ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {
                            "type": "realtime",
                            "output_modalities": ["text"],
                            "audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}},
                        },
                    }
                )
            )
            await ws.send(json.dumps(GREETING))
            await until(ws, "response.done")
            started = time.monotonic()
            seen = await until(ws, "response.done")  # the silence prompts a second reply by itself
            seen.append({"elapsed": time.monotonic() - started})
            return seen

    *events, timing = run(go())
    assert events[0]["type"] == "input_audio_buffer.timeout_triggered"
    assert "response.created" in [e["type"] for e in events]
    assert 4.9 <= timing["elapsed"] < 15


def test_intent_transcription_over_the_socket(port: int) -> None:
    async def go() -> list[dict[str, Any]]:
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription") as ws:
            created = await recv(ws)
            await ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {
                            "type": "transcription",
                            "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 200}}},
                        },
                    }
                )
            )
            await ws.send(
                json.dumps(
                    {"type": "input_audio_buffer.append", "audio": base64.b64encode(tone(300) + bytes(24000)).decode()}
                )
            )
            return [created, *await until(ws, "conversation.item.input_audio_transcription.completed")]

    created, *events = run(go())
    assert created["session"]["type"] == "transcription"
    assert events[-1]["transcript"] == "what the user said"
    assert not any(e["type"].startswith("response.") for e in events)
