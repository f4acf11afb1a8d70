"""LoRA adapters over the HTTP API and the realtime socket (a scripted backend): listed with their parent,
chosen by ``model``, loaded and unloaded at run time behind the API key, unknown names refused as OpenAI's 404."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from omni_gateway.gateway.config import GatewayConfig
from websockets.sync.client import connect

from tests.harness.fake_backend import FakeBackend
from tests.harness.live_server import serve, served

KEY = "sk-lora-test"
HEADERS = {"Authorization": f"Bearer {KEY}"}


def _backend() -> FakeBackend:
    backend = FakeBackend(lora=True)
    backend.adapters["persona"] = "/adapters/persona"
    return backend


def test_models_list_adapters_with_their_parent() -> None:
    with served(_backend()) as (url, client):
        assert [m.id for m in client.models.list()] == ["omni-test", "persona"]
        card = httpx.get(f"{url}/v1/models/persona").json()
        assert card["parent"] == "omni-test" and card["root"] == "/adapters/persona"
        assert httpx.get(f"{url}/v1/models/omni-test").json()["parent"] is None


def test_model_chooses_the_adapter_in_chat_and_completions() -> None:
    backend = _backend()
    with served(backend) as (_, client):
        client.chat.completions.create(model="persona", messages=[{"role": "user", "content": "hi"}])
        client.completions.create(model="persona", prompt="hi")
        client.completions.create(model="omni-test", prompt="hi")
        with pytest.raises(openai.NotFoundError) as refused:
            client.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])
    assert [r.model for r in backend.requests] == ["persona", "persona", "omni-test"]
    error = refused.value.body
    assert error["code"] == "model_not_found" and error["param"] == "model" and "'persona'" in error["message"]


def test_load_and_unload_at_run_time_behind_the_api_key() -> None:
    backend = _backend()
    with served(backend, GatewayConfig(api_key=KEY)) as (url, _):
        body = {"lora_name": "sql", "lora_path": "/adapters/sql"}
        assert httpx.post(f"{url}/v1/load_lora_adapter", json=body).status_code == 401
        assert "sql" not in backend.adapters
        r = httpx.post(f"{url}/v1/load_lora_adapter", json=body, headers=HEADERS)
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'sql' added successfully."
        models = httpx.get(f"{url}/v1/models", headers=HEADERS).json()["data"]
        assert [m["id"] for m in models] == ["omni-test", "persona", "sql"]
        again = httpx.post(f"{url}/v1/load_lora_adapter", json=body, headers=HEADERS)
        assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
        r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "sql"}, headers=HEADERS)
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'sql' removed successfully."
        gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "sql"}, headers=HEADERS)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    assert backend.adapters == {"persona": "/adapters/persona"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"lora_name": "bad", "lora_path": "/adapters/missing"}, "is not a directory"),
        ({"lora_name": "bad"}, "lora_path"),
        ({"lora_path": "/adapters/x"}, "lora_name"),
        ({"lora_name": "omni-test", "lora_path": "/adapters/x"}, "the base model's"),
    ],
)
def test_refused_load_says_why_and_changes_nothing(body: dict[str, str], message: str) -> None:
    backend = _backend()
    with served(backend) as (url, _):
        r = httpx.post(f"{url}/v1/load_lora_adapter", json=body)
        assert r.status_code == 400 and message in r.json()["error"]["message"]
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["omni-test", "persona"]


def test_server_without_lora_refuses_the_endpoints_and_adapter_names() -> None:
    with served(FakeBackend()) as (url, client):
        r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/x"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "lora_not_enabled"
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="persona", prompt="hi")


def _next(ws: object, *kinds: str) -> dict[str, object]:
    """The next event of one of ``kinds``, skipping others."""
    while True:
        event: dict[str, object] = json.loads(ws.recv(timeout=20))  # type: ignore[attr-defined]
        if event["type"] in kinds:
            return event


def _first_response_model(ws: object, backend: FakeBackend) -> str | None:
    """The model of the backend request that one user turn starts."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    ws.send(json.dumps({"type": "conversation.item.create", "item": item}))  # type: ignore[attr-defined]
    ws.send(json.dumps({"type": "response.create"}))  # type: ignore[attr-defined]
    while json.loads(ws.recv(timeout=20))["type"] != "response.done":  # type: ignore[attr-defined]
        pass
    return backend.requests[-1].model


def test_realtime_session_model_and_connection_model_choose_the_adapter() -> None:
    backend = _backend()
    with serve(backend) as port:
        with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=persona") as ws:
            created = json.loads(ws.recv(timeout=20))
            assert created["session"]["model"] == "persona"
            assert _first_response_model(ws, backend) == "persona"
            ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "model": "omni-test"}}))
            assert _next(ws, "session.updated")["session"]["model"] == "omni-test"  # type: ignore[index]
            assert _first_response_model(ws, backend) == "omni-test"
            ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "model": "nope"}}))
            error = _next(ws, "error", "session.updated")
            assert error["type"] == "error" and error["error"]["code"] == "model_not_found"  # type: ignore[index]
        with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=nope") as ws:
            event = json.loads(ws.recv(timeout=20))
            assert event["type"] == "error" and event["error"]["param"] == "model"
            with pytest.raises(Exception, match="1008"):
                ws.recv(timeout=20)


def test_realtime_without_lora_keeps_its_model_whatever_is_named() -> None:
    backend = FakeBackend()
    with serve(backend) as port, connect(f"ws://127.0.0.1:{port}/v1/realtime?model=gpt-4o-realtime") as ws:
        assert json.loads(ws.recv(timeout=20))["session"]["model"] == "omni-test"
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "model": "gpt-4o-realtime"}}))
        assert _next(ws, "session.updated", "error")["session"]["model"] == "omni-test"  # type: ignore[index]
