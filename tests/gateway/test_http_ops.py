"""Health, metrics, model listing and API-key checks of the HTTP API against a live server."""

from __future__ import annotations

import httpx
import openai
import pytest
from omni_gateway.gateway.anthropic_errors import MESSAGES_PATH
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.http import routes

from tests.harness.fake_backend import FakeBackend
from tests.harness.live_server import served

KEY = "sk-test-123"


def test_health_follows_the_backend():
    backend = FakeBackend()
    with served(backend) as (url, _):
        assert httpx.get(f"{url}/health").json() == {"status": "ok", "detail": "ready"}
        backend.healthy = False
        r = httpx.get(f"{url}/health")
        assert r.status_code == 503 and r.json()["detail"] == "engine thread stopped"


def test_models_list_and_retrieve():
    with served(FakeBackend()) as (_, client):
        assert [m.id for m in client.models.list()] == ["omni-test"]
        assert client.models.retrieve("omni-test").id == "omni-test"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("gpt-4o")


def sample(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    values = [float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)]
    return values[0] if values else 0.0


def test_metrics_count_requests_tokens_latency_and_backend_numbers():
    with served(FakeBackend()) as (url, client):
        before = httpx.get(f"{url}/metrics").text
        list(
            client.chat.completions.create(model="omni-test", messages=[{"role": "user", "content": "hi"}], stream=True)
        )
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="omni-test", messages=[], stream=True)
        after = httpx.get(f"{url}/metrics").text
    route = "/v1/chat/completions"
    for status in ("200", "400"):
        assert (
            sample(after, "omni_http_requests_total", route=route, status=status)
            == sample(before, "omni_http_requests_total", route=route, status=status) + 1
        )
    assert (
        sample(after, "omni_completion_tokens_total", api="chat")
        - sample(before, "omni_completion_tokens_total", api="chat")
        == 5
    )
    assert (
        sample(after, "omni_time_to_first_token_seconds_count", api="chat")
        - sample(before, "omni_time_to_first_token_seconds_count", api="chat")
        == 1
    )
    assert (
        sample(after, "omni_inter_token_latency_seconds_count", api="chat")
        - sample(before, "omni_inter_token_latency_seconds_count", api="chat")
        == 4
    )
    assert sample(after, "omni_backend_kv_blocks_free") == 61.0
    assert sample(after, "omni_backend_healthy") == 1.0
    assert "omni_realtime_sessions_open" in after


def http_paths() -> list[tuple[str, str]]:
    return [
        (m, r.path.replace("{model:path}", "omni-test"))
        for r in routes(FakeBackend(), GatewayConfig())
        for m in sorted(r.methods - {"HEAD"})
    ]


def test_every_route_but_health_wants_the_api_key():
    backend = FakeBackend()
    with served(backend, GatewayConfig(api_key=KEY)) as (url, client), httpx.Client(base_url=url) as http:
        for method, path in http_paths():
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": f"Basic {KEY}"},
                {"Authorization": KEY},
                {"Host": "x/?"},
                {"Host": "x/#"},
            ):
                r = http.request(method, path, headers=headers, json={})
                # /v1/messages answers in Anthropic's envelope: an error type, no code
                error = r.json()["error"] if r.status_code >= 400 else {}
                kind = error.get("type") if path == MESSAGES_PATH else error.get("code")
                if "Host" in headers:  # names no host of this server: refused before the key is looked at
                    assert r.status_code == 421
                    assert kind == ("invalid_request_error" if path == MESSAGES_PATH else "host_not_allowed")
                elif path == "/health":
                    assert r.status_code == 200
                else:
                    assert r.status_code == 401, (method, path, headers)
                    assert kind == ("authentication_error" if path == MESSAGES_PATH else "invalid_api_key")
        assert backend.requests == [] and backend.transcribed == [] and backend.synthesized == []
        assert (
            client.chat.completions.create(model="omni-test", messages=[{"role": "user", "content": "hi"}])
            .choices[0]
            .message.content
            == "hello from the fake model"
        )
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0).models.list()


def test_without_a_configured_key_no_header_is_needed():
    with served(FakeBackend()) as (url, _):
        assert httpx.get(f"{url}/v1/models").status_code == 200
