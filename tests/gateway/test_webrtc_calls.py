"""WebRTC calls end to end on loopback: an aiortc caller against the real app and the fake backend."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from omni_gateway.gateway.app import create_app
from omni_gateway.gateway.config import GatewayConfig
from websockets.asyncio.client import connect

from tests.harness.fake_backend import FakeBackend, silence, tone
from tests.harness.live_server import serve, until
from tests.harness.webrtc_client import Caller, host_candidates_available

pytestmark = pytest.mark.skipif(
    not host_candidates_available(), reason="no network address besides loopback: ICE has no host candidate"
)

VAD = {"type": "server_vad", "silence_duration_ms": 300, "prefix_padding_ms": 0, "threshold": 0.3}
SPOKEN = {"type": "realtime", "audio": {"input": {"turn_detection": VAD}}}


def run(scenario: Any, timeout: float = 30) -> Any:
    return asyncio.run(asyncio.wait_for(scenario, timeout))


def test_a_spoken_question_gets_its_answer_as_events_on_the_channel_and_opus_on_the_track() -> None:
    backend = FakeBackend()

    async def call(port: int) -> Caller:
        caller = Caller()
        response = await caller.place(f"http://127.0.0.1:{port}")
        assert response.status_code == 201, response.text
        assert response.headers["content-type"].startswith("application/sdp")
        assert response.headers["location"] == f"/v1/realtime/calls/{caller.call_id}"
        # the answer asks for 10 ms packets: aiortc's receiver holds four before decoding, 40 ms rather than 80
        audio_section = response.text.split("m=audio", 1)[1].split("m=", 1)[0]
        assert "a=ptime:10\r\n" in audio_section
        assert (await caller.until("session.created"))[-1]["session"]["type"] == "realtime"
        caller.send({"type": "session.update", "session": SPOKEN})
        await caller.until("session.updated")
        caller.microphone.say(tone(400, amplitude=30000) + silence(500))
        await caller.until("output_audio_buffer.stopped")
        await caller.close()
        return caller

    with serve(backend) as port:
        caller = run(call(port))
    kinds = [event["type"] for event in caller.log]
    order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
        "response.output_audio.done",
        "response.done",
        "output_audio_buffer.stopped",
    ]
    assert [k for k in kinds if k in order] == order
    # the track starts playing once the reply's first audio is queued: after the response was created
    assert kinds.index("response.created") < kinds.index("output_audio_buffer.started") < len(kinds) - 1
    assert "response.output_audio.delta" not in kinds  # the audio went out on the track
    # the model heard the question: the fake transcribed the committed turn's audio (24 kHz pcm16)
    assert backend.transcribed and len(backend.transcribed[0]) >= 24 * 2 * 300
    # the answer's 500 ms of tones came back as loud Opus frames, 20 ms each
    assert len(caller.heard_at) >= 20


def test_multipart_offer_with_session_and_hangup_ends_the_call() -> None:
    backend = FakeBackend()

    async def call(port: int) -> tuple[Caller, dict[str, Any], httpx.Response, httpx.Response]:
        caller = Caller()
        session = {"type": "realtime", "instructions": "Be brief.", "output_modalities": ["text"]}
        response = await caller.place(f"http://127.0.0.1:{port}", session=session)
        assert response.status_code == 201, response.text
        created = (await caller.until("session.created"))[-1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            hung = await http.post(f"/v1/realtime/calls/{caller.call_id}/hangup")
            again = await http.post(f"/v1/realtime/calls/{caller.call_id}/hangup")
        await caller.close()
        return caller, created, hung, again

    with serve(backend) as port:
        caller, created, hung, again = run(call(port))
    assert created["session"]["instructions"] == "Be brief."
    assert created["session"]["output_modalities"] == ["text"]
    assert hung.status_code == 200
    assert again.status_code == 404 and again.json()["error"]["code"] == "call_not_found"


def test_a_call_without_an_audio_track_gets_the_audio_in_events_as_a_websocket_would() -> None:
    async def call(port: int) -> list[dict[str, Any]]:
        caller = Caller(audio=False)
        assert (await caller.place(f"http://127.0.0.1:{port}")).status_code == 201
        caller.send({"type": "response.create", "response": {"instructions": "Talk."}})
        seen = await caller.until("response.done")
        await caller.close()
        return seen

    with serve(FakeBackend()) as port:
        seen = run(call(port))
    kinds = [event["type"] for event in seen]
    assert kinds.count("response.output_audio.delta") == 5  # one 100 ms chunk per word of the fake's reply
    assert "output_audio_buffer.started" not in kinds


def test_a_caller_that_closes_its_peer_connection_ends_the_call() -> None:
    config = GatewayConfig()
    app = create_app(FakeBackend(), config)  # type: ignore[arg-type]

    async def call(port: int) -> int:
        caller = Caller()
        assert (await caller.place(f"http://127.0.0.1:{port}")).status_code == 201
        await caller.until("session.created")
        assert len(app.state.calls) == 1
        await caller.close()  # no hang-up
        for _ in range(50):
            if not len(app.state.calls):
                break
            await asyncio.sleep(0.1)
        return len(app.state.calls)

    with serve(None, config, app) as port:
        assert run(call(port)) == 0


def test_offers_that_cannot_be_answered_are_refused_with_the_reason() -> None:
    async def post(port: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            return [
                await http.post("/v1/realtime/calls", content="v=0\r\n", headers={"Content-Type": "application/sdp"}),
                await http.post("/v1/realtime/calls", content="{}", headers={"Content-Type": "application/json"}),
                await http.post("/v1/realtime/calls", files={"session": (None, "{}")}),
            ]

    with serve(FakeBackend()) as port:
        no_media, wrong_type, no_sdp = run(post(port))
    assert (
        no_media.status_code == 400
        and "neither an audio track nor a data channel" in no_media.json()["error"]["message"]
    )
    assert wrong_type.status_code == 415
    assert no_sdp.status_code == 400 and no_sdp.json()["error"]["param"] == "sdp"


def test_an_offer_without_opus_is_refused() -> None:
    from aiortc import RTCRtpSender

    async def call(port: int) -> httpx.Response:
        caller = Caller()
        pcmu = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType == "audio/PCMU"]
        for transceiver in caller.peer.getTransceivers():
            transceiver.setCodecPreferences(pcmu)
        response = await caller.place(f"http://127.0.0.1:{port}")
        await caller.close()
        return response

    with serve(FakeBackend()) as port:
        response = run(call(port))
    assert response.status_code == 400
    assert "Opus" in response.json()["error"]["message"]


def test_an_invalid_session_in_the_offer_is_refused_before_any_call_starts() -> None:
    async def call(port: int) -> httpx.Response:
        caller = Caller()
        response = await caller.place(f"http://127.0.0.1:{port}", session={"type": "realtime", "voice": 3})
        await caller.close()
        return response

    with serve(FakeBackend()) as port:
        response = run(call(port))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "session"


def test_a_websocket_joins_a_live_call_hears_its_events_and_steers_it() -> None:
    backend = FakeBackend(audio_out=False)

    async def call(port: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int | None]:
        caller = Caller()
        assert (await caller.place(f"http://127.0.0.1:{port}")).status_code == 201
        await caller.until("session.created")
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime?call_id={caller.call_id}") as ws:
            await asyncio.sleep(0.1)  # the socket is joined once its handshake is through
            create = {"type": "response.create", "response": {"instructions": "Talk."}}
            await ws.send(json.dumps(create))
            joined = await until(ws, "response.done")
            on_channel = await caller.until("response.done")
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                await http.post(f"/v1/realtime/calls/{caller.call_id}/hangup")
            await ws.wait_closed()
            code = ws.close_code
        await caller.close()
        return joined, on_channel, code

    with serve(backend) as port:
        joined, on_channel, code = run(call(port))
    assert [e["event_id"] for e in joined] == [e["event_id"] for e in on_channel if e["type"] != "session.created"][
        -len(joined) :
    ]
    assert joined[-1]["response"]["output"][0]["content"][0]["text"] == "hello from the fake model"
    assert code == 1000


def test_a_websocket_naming_no_live_call_is_closed() -> None:
    async def join(port: int) -> int | None:
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime?call_id=rtc_nope") as ws:
            await ws.wait_closed()
            return ws.close_code

    with serve(FakeBackend()) as port:
        assert run(join(port)) == 1008


def test_a_client_secret_places_a_call_with_its_session_and_the_offer_session_over_it() -> None:
    config = GatewayConfig(api_key="sk-real")
    bound = {"type": "realtime", "instructions": "Answer in French.", "output_modalities": ["text"]}

    async def call(port: int) -> tuple[httpx.Response, dict[str, Any], int]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            minted = await http.post(
                "/v1/realtime/client_secrets", json={"session": bound}, headers={"Authorization": "Bearer sk-real"}
            )
            secret = minted.json()["value"]
            stranger = Caller()
            refused = await stranger.place(f"http://127.0.0.1:{port}", key="ek_not_minted")
            await stranger.close()
            caller = Caller()
            placed = await caller.place(f"http://127.0.0.1:{port}", key=secret, session={"type": "realtime"})
            assert placed.status_code == 201, placed.text
            created = (await caller.until("session.created"))[-1]
            hangup = await http.post(
                f"/v1/realtime/calls/{caller.call_id}/hangup", headers={"Authorization": f"Bearer {secret}"}
            )
        await caller.close()
        return refused, created, hangup.status_code

    with serve(FakeBackend(), config) as port:
        refused, created, hangup = run(call(port))
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert created["session"]["instructions"] == "Answer in French."
    assert created["session"]["output_modalities"] == ["text"]
    assert hangup == 200


def test_a_call_whose_ice_never_connects_ends_with_an_ice_failed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from omni_gateway.gateway.realtime import webrtc_calls

    monkeypatch.setattr(webrtc_calls, "ICE_CONNECT_TIMEOUT_S", 1.0)

    async def call(port: int) -> tuple[list[dict[str, Any]], int | None]:
        caller = Caller()
        sdp = await caller.offer()  # the caller never takes the answer: no connectivity check succeeds
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            placed = await http.post("/v1/realtime/calls", content=sdp, headers={"Content-Type": "application/sdp"})
        assert placed.status_code == 201
        call_id = placed.headers["location"].rsplit("/", 1)[1]
        events: list[dict[str, Any]] = []
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime?call_id={call_id}") as ws:
            async for text in ws:
                events.append(json.loads(text))
            code = ws.close_code
        await caller.close()
        return events, code

    with serve(FakeBackend()) as port:
        events, code = run(call(port))
    errors = [event["error"] for event in events if event["type"] == "error"]
    assert [error["code"] for error in errors] == ["ice_failed"]
    assert "ICE" in errors[0]["message"] and "--ice-server" in errors[0]["message"]
    assert code == 1000


def test_calls_still_live_when_the_server_stops_end_with_it() -> None:
    from omni_gateway.gateway import metrics

    config = GatewayConfig()
    app = create_app(FakeBackend(), config)  # type: ignore[arg-type]
    before = metrics.SESSIONS_OPEN._value.get()

    async def call(port: int) -> Caller:
        caller = Caller()
        assert (await caller.place(f"http://127.0.0.1:{port}")).status_code == 201
        await caller.until("session.created")
        return caller

    loop = asyncio.new_event_loop()  # the caller stays connected while the server stops
    try:
        with serve(None, config, app) as port:
            caller = loop.run_until_complete(asyncio.wait_for(call(port), 30))
            assert len(app.state.calls) == 1 and metrics.SESSIONS_OPEN._value.get() == before + 1
        assert len(app.state.calls) == 0
        assert metrics.SESSIONS_OPEN._value.get() == before
        loop.run_until_complete(caller.close())
    finally:
        loop.close()
