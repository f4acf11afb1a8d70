"""Which failures are the client's: only ``InvalidInput`` answers 400; any other exception is a logged 500."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from omni_gateway.gateway.app import create_app
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.protocol import Error, Message, OmniRequest, OutputChunk, SamplingOptions, TextPart
from starlette.testclient import TestClient

from tests.omni.test_pipeline import CharTokenizer, FakeEngine


class BrokenTokenizer(CharTokenizer):
    """A tokenizer with a bug: the ValueError it raises says nothing about the request. It breaks after
    ``works`` calls, so the gateway's size check passes and the failure comes from inside generation."""

    def __init__(self, works: int = 0) -> None:
        self.works = works

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.works > 0:
            self.works -= 1
            return super().encode(text, add_special_tokens)
        raise ValueError("internal tokenizer table is corrupt at slot 17")


def _pipeline(engine: FakeEngine) -> OmniPipeline:
    return OmniPipeline(OmniConfig(), engine=engine, model_name="fake-llm", max_context_tokens=4096)


def _request(**sampling: Any) -> OmniRequest:
    return OmniRequest(
        request_id="r", messages=(Message("user", (TextPart("hi"),)),), sampling=SamplingOptions(**sampling)
    )


async def _collect(pipeline: OmniPipeline, request: OmniRequest) -> list[OutputChunk]:
    return [chunk async for chunk in pipeline.generate(request)]


def test_a_tokenizer_bug_propagates_instead_of_becoming_a_client_error() -> None:
    engine = FakeEngine(["x"])
    engine.tokenizer = BrokenTokenizer()
    with pytest.raises(ValueError, match="tokenizer table"):
        asyncio.run(_collect(_pipeline(engine), _request()))


def test_a_refused_sampling_value_is_a_client_error() -> None:
    engine = FakeEngine(["x"])
    chunks = asyncio.run(_collect(_pipeline(engine), _request(temperature=-1.0)))
    assert len(chunks) == 1 and isinstance(chunks[0], Error)
    assert (chunks[0].code, chunks[0].status) == ("invalid_request", 400)
    assert "temperature" in chunks[0].message
    assert engine.prompts == []  # refused before anything reached the engine


def _chat(pipeline: OmniPipeline, body: dict[str, Any]) -> Any:
    with TestClient(create_app(pipeline, GatewayConfig()), base_url="http://localhost") as client:
        return client.post("/v1/chat/completions", json={"model": "fake-llm", **body})


def test_http_answers_a_tokenizer_bug_with_500_logged_and_no_internal_text(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeEngine(["x"])
    engine.tokenizer = BrokenTokenizer(works=1)
    with caplog.at_level(logging.ERROR):
        response = _chat(_pipeline(engine), {"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error"
    assert "tokenizer" not in error["message"]
    logged = [r for r in caplog.records if r.exc_info and "tokenizer table" in str(r.exc_info[1])]
    assert len(logged) == 1  # with its traceback, once


def test_http_answers_an_invalid_request_with_400(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeEngine(["x"])
    with caplog.at_level(logging.ERROR):
        response = _chat(_pipeline(engine), {"messages": [{"role": "user", "content": "hi"}], "temperature": -1})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert not [r for r in caplog.records if r.exc_info]
