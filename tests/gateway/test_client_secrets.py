"""Ephemeral client secrets: minted with the API key only, open realtime connections only, refused once expired,
and their session configuration applied when a connection opens."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from omni_gateway.gateway.app import create_app
from omni_gateway.gateway.auth import ClientSecrets
from omni_gateway.gateway.config import GatewayConfig
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.harness.fake_backend import FakeBackend
from tests.harness.live_server import recv, serve

KEY = "sk-real"
BOUND = {"type": "realtime", "instructions": "Answer in French.", "output_modalities": ["text"]}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def mint(port: int, key: str | None, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"http://127.0.0.1:{port}/v1/realtime/client_secrets", json=body, headers=headers, timeout=10)


async def session_created(port: int, key: str) -> dict[str, Any]:
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    async with connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        event = await recv(ws)
    return event


def test_the_api_key_mints_a_secret_that_opens_a_websocket_with_its_session_and_nothing_else() -> None:
    config = GatewayConfig(api_key=KEY)
    app = create_app(FakeBackend(), config)  # type: ignore[arg-type]
    clock = Clock()
    app.state.client_secrets._now = clock
    with serve(None, config, app) as port:
        assert mint(port, None, {}).status_code == 401
        minted = mint(port, KEY, {"expires_after": {"anchor": "created_at", "seconds": 60}, "session": BOUND})
        assert minted.status_code == 200, minted.text
        secret = minted.json()
        assert secret["value"].startswith("ek_")
        assert secret["expires_at"] == int(clock.now) + 60
        assert secret["session"]["instructions"] == "Answer in French."

        created = asyncio.run(session_created(port, secret["value"]))
        assert created["type"] == "session.created"
        assert created["session"]["instructions"] == "Answer in French."
        assert created["session"]["output_modalities"] == ["text"]

        # a client secret opens realtime connections, nothing else: not the HTTP API, not another secret
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {secret['value']}"})
        assert models.status_code == 401 and models.json()["error"]["code"] == "invalid_api_key"
        assert mint(port, secret["value"], {}).status_code == 401

        # joining a WebRTC call is the server's: a client secret cannot
        async def join() -> tuple[int | None, str | None]:
            url = f"ws://127.0.0.1:{port}/v1/realtime?call_id=rtc_any"
            async with connect(url, additional_headers={"Authorization": f"Bearer {secret['value']}"}) as ws:
                await ws.wait_closed()
                return ws.close_code, ws.close_reason

        code, reason = asyncio.run(join())
        assert code == 1008 and reason is not None and "API key" in reason

        clock.now += 60  # expired: refused, with OpenAI's error envelope
        with pytest.raises(InvalidStatus) as refused:
            asyncio.run(session_created(port, secret["value"]))
        assert refused.value.response.status_code == 401
        error = json.loads(refused.value.response.body)["error"]
        assert error["type"] == "authentication_error" and "expired" in error["message"]
        calls = httpx.post(
            f"http://127.0.0.1:{port}/v1/realtime/calls",
            content="v=0\r\n",
            headers={"Authorization": f"Bearer {secret['value']}", "Content-Type": "application/sdp"},
        )
        assert calls.status_code == 401 and "expired" in calls.json()["error"]["message"]
        unknown = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer ek_made_up"})
        assert unknown.status_code == 401


def test_minting_refuses_what_openai_refuses() -> None:
    with serve(FakeBackend()) as port:
        too_short = mint(port, None, {"expires_after": {"anchor": "created_at", "seconds": 5}})
        anchor = mint(port, None, {"expires_after": {"anchor": "now", "seconds": 60}})
        session = mint(port, None, {"session": {"type": "realtime", "voice": 3}})
        unknown = mint(port, None, {"ttl": 3})
        default = mint(port, None, {})
    assert too_short.status_code == 400 and too_short.json()["error"]["param"] == "expires_after.seconds"
    assert anchor.status_code == 400 and anchor.json()["error"]["param"] == "expires_after.anchor"
    assert session.status_code == 400 and session.json()["error"]["param"] == "session"
    assert unknown.status_code == 400
    assert default.status_code == 200
    assert default.json()["expires_at"] - time.time() == pytest.approx(600, abs=5)


def test_minting_refuses_a_voice_the_backend_does_not_offer_and_says_which_it_does() -> None:
    with serve(FakeBackend()) as port:
        refused = mint(port, None, {"session": {"type": "realtime", "audio": {"output": {"voice": "alloy"}}}})
        taken = mint(port, None, {"session": {"type": "realtime", "audio": {"output": {"voice": "verse"}}}})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "session" and "session.audio.output.voice" in error["message"]
    assert "one of 'joe', 'verse', got 'alloy'" in error["message"]
    assert taken.status_code == 200 and taken.json()["session"]["audio"]["output"]["voice"] == "verse"


def test_the_store_forgets_long_expired_secrets_and_bounds_the_live_ones() -> None:
    clock = Clock()
    store = ClientSecrets(now=clock, max_live=2)
    first = store.mint(10, None)
    store.mint(10, {"instructions": "x"})
    with pytest.raises(OverflowError):
        store.mint(10, None)
    assert store.check(first.value)[0] == first
    clock.now += 10
    secret, why = store.check(first.value)
    assert secret is None and why is not None and "expired" in why
    clock.now += 7200  # one more lifetime: forgotten on the next mint, which then has room
    store.mint(10, None)
    assert len(store) == 1
    assert "unknown" in (store.check(first.value)[1] or "")


def test_a_client_secret_is_good_for_the_realtime_routes_only() -> None:
    from omni_gateway.gateway.guard import opens_realtime

    assert opens_realtime("websocket", "/v1/realtime")
    assert opens_realtime("http", "/v1/realtime/calls")
    assert opens_realtime("http", "/v1/realtime/calls/rtc_abc/hangup")
    assert not opens_realtime("http", "/v1/realtime/client_secrets")
    assert not opens_realtime("http", "/v1/realtime/calls/rtc_abc/other/hangup")
    assert not opens_realtime("http", "/v1/chat/completions")
    assert not opens_realtime("websocket", "/v1/realtime/calls")
