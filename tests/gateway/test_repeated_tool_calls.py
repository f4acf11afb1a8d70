"""A forced answer that repeats a call (the same function with the same arguments) ends there: served by the
real pipeline over a scripted engine, every API gets the calls before the repeat, never the repeat, a
complete tool-call answer, and the engine request closed as soon as the repeat was read."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from omni_gateway.engine.outputs import StreamDelta
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.pipeline import OmniPipeline

from tests.harness.live_server import serve

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
USER = [{"role": "user", "content": "Weather in Paris and London?"}]


def _call(city: str) -> str:
    return f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>\n'


# Paris, London, then Paris again (the loop a small model falls into) and more that must never be generated.
SCRIPT = _call("Paris") + _call("London") + _call("Paris") + _call("Rome") * 4
# Where the repeat is read whole: the end of its call object.
REPEAT_END = len(_call("Paris") + _call("London")) + _call("Paris").index("}}") + 2
PIECE = 5  # characters per delta


class CharTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


class ScriptedEngine:
    """Streams ``SCRIPT`` in pieces (with ``n`` 2, a second choice of one call, done early); counts what it
    streamed and whether its consumer closed it early."""

    def __init__(self) -> None:
        self.tokenizer = CharTokenizer()
        self.streamed: list[int] = []  # characters streamed, one entry per request
        self.closed_early: list[bool] = []

    async def generate(self, prompt_ids: list[int], params: Any, *, request_id: str, **_: Any) -> AsyncIterator[Any]:
        self.streamed.append(0)
        self.closed_early.append(False)
        pieces = [SCRIPT[i : i + PIECE] for i in range(0, len(SCRIPT), PIECE)]
        try:
            for i, piece in enumerate(pieces):
                self.streamed[-1] += len(piece)
                last = i == len(pieces) - 1
                yield StreamDelta(
                    request_id,
                    piece,
                    (i,),
                    finished=last,
                    finish_reason="length" if last else None,
                    num_prompt_tokens=len(prompt_ids),
                    num_output_tokens=i + 1,
                )
                if i == 2 and params.n > 1:
                    yield StreamDelta(request_id, _call("Rome"), (i,), finished=True, finish_reason="stop", index=1)
                await asyncio.sleep(0)
        except GeneratorExit:  # closed by its consumer: the real engine aborts the request here
            self.closed_early[-1] = True
            raise

    def render_chat(self, messages: list[dict[str, Any]], *, tools: Any = None, **_: Any) -> str:
        return json.dumps({"messages": messages, "tools": tools})

    def abort(self, request_id: str) -> None:
        pass

    def health(self) -> dict[str, Any]:
        return {"alive": True, "error": None, "open_streams": 0}

    def stats(self) -> dict[str, float]:
        return {}

    def shutdown(self) -> None:
        pass


@pytest.fixture
def served() -> Iterator[tuple[str, ScriptedEngine]]:
    engine = ScriptedEngine()
    pipeline = OmniPipeline(OmniConfig(temperature=0.0), engine=engine, model_name="fake-llm", max_context_tokens=4096)  # type: ignore[arg-type]
    with serve(pipeline) as port:
        yield f"http://127.0.0.1:{port}", engine


def _stopped_at_the_repeat(engine: ScriptedEngine) -> None:
    assert engine.closed_early == [True]
    assert REPEAT_END <= engine.streamed[0] < REPEAT_END + PIECE  # nothing generated past the repeat


def test_streaming_chat_ends_at_the_repeat_with_the_calls_before_it(served: tuple[str, ScriptedEngine]) -> None:
    url, engine = served
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=20)
    stream = api.chat.completions.create(
        model="fake-llm",
        messages=USER,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        stream=True,
    )
    arguments: dict[int, list[str]] = {}
    finish = []
    for chunk in stream:
        for choice in chunk.choices:
            assert not choice.delta.content
            for d in choice.delta.tool_calls or []:
                assert d.function is not None
                arguments.setdefault(d.index, []).append(d.function.arguments or "")
            finish += [choice.finish_reason] if choice.finish_reason else []
    assert finish == ["tool_calls"]
    assert [json.loads("".join(pieces)) for pieces in arguments.values()] == [{"city": "Paris"}, {"city": "London"}]
    assert len([p for p in arguments[0] if p]) > 1  # the first call streamed in pieces
    assert [p for p in arguments[1] if p] == ['{"city": "London"}']  # the second, held until whole
    _stopped_at_the_repeat(engine)


def test_chat_responses_and_messages_report_the_calls_before_the_repeat(served: tuple[str, ScriptedEngine]) -> None:
    url, engine = served
    body = {"model": "fake-llm", "messages": USER, "tools": [WEATHER], "tool_choice": "required"}
    choice = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=20).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert [json.loads(c["function"]["arguments"])["city"] for c in choice["message"]["tool_calls"]] == [
        "Paris",
        "London",
    ]

    flat = {"type": "function", **WEATHER["function"]}
    body = {"model": "fake-llm", "input": USER[0]["content"], "tools": [flat], "tool_choice": "required"}
    response = httpx.post(f"{url}/v1/responses", json=body, timeout=20).json()
    assert response["status"] == "completed", response
    calls = [o for o in response["output"] if o["type"] == "function_call"]
    assert [json.loads(c["arguments"])["city"] for c in calls] == ["Paris", "London"]

    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}  # type: ignore[index]
    body = {"model": "fake-llm", "max_tokens": 200, "messages": USER, "tools": [tool], "tool_choice": {"type": "any"}}
    message = httpx.post(f"{url}/v1/messages", json=body, timeout=20).json()
    assert message["stop_reason"] == "tool_use", message
    assert [b["input"]["city"] for b in message["content"] if b["type"] == "tool_use"] == ["Paris", "London"]
    assert engine.closed_early == [True, True, True]


def test_a_realtime_response_completes_with_the_call_before_the_repeat(served: tuple[str, ScriptedEngine]) -> None:
    from websockets.sync.client import connect

    url, engine = served
    tool = {"type": "function", **WEATHER["function"]}
    with connect(url.replace("http", "ws", 1) + "/v1/realtime") as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        session = {"type": "realtime", "output_modalities": ["text"], "tools": [tool], "tool_choice": "required"}
        ws.send(json.dumps({"type": "session.update", "session": session}))
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]}
        ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        ws.send(json.dumps({"type": "response.create"}))
        events: list[dict[str, Any]] = []
        while not events or events[-1]["type"] != "response.done":
            events.append(json.loads(ws.recv(timeout=10)))
            assert events[-1]["type"] != "error", events[-1]
    response = events[-1]["response"]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert response["status"] == "completed", response
    assert [json.loads(e["arguments"])["city"] for e in done] == ["Paris", "London"]
    assert [json.loads(o["arguments"])["city"] for o in response["output"]] == ["Paris", "London"]
    _stopped_at_the_repeat(engine)


class SilentTTS:
    """No sound for any text: a spoken answer whose text is all calls says nothing."""

    voices = ("joe",)

    async def stream(self, texts: AsyncIterator[str], options: Any) -> AsyncIterator[Any]:
        async for _ in texts:
            pass
        return
        yield


def test_a_spoken_answer_ends_at_the_repeat_too() -> None:
    from omni_gateway.omni.protocol import Done, Message, OmniRequest, TextPart, ToolCallDelta

    engine = ScriptedEngine()
    pipeline = OmniPipeline(
        OmniConfig(temperature=0.0), engine=engine, model_name="fake-llm", max_context_tokens=4096, tts=SilentTTS()
    )  # type: ignore[arg-type]
    request = OmniRequest(
        "r1",
        (Message("user", (TextPart("weather?"),)),),
        modalities=("audio",),
        tools=(WEATHER,),
        tool_choice="required",
    )

    async def collect() -> list[Any]:
        return [chunk async for chunk in pipeline.generate(request)]

    chunks = asyncio.run(collect())
    calls = [json.loads(c.arguments)["city"] for c in chunks if isinstance(c, ToolCallDelta)]
    assert calls == ["Paris", "London"]
    assert [c.finish_reason for c in chunks if isinstance(c, Done)] == ["tool_calls"]
    _stopped_at_the_repeat(engine)


def test_each_choice_ends_on_its_own_and_the_request_once_all_have(served: tuple[str, ScriptedEngine]) -> None:
    url, engine = served
    body = {"model": "fake-llm", "messages": USER, "tools": [WEATHER], "tool_choice": "required", "n": 2}
    choices = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=20).json()["choices"]
    cities = [[json.loads(c["function"]["arguments"])["city"] for c in ch["message"]["tool_calls"]] for ch in choices]
    assert cities == [["Paris", "London"], ["Rome"]]
    assert [ch["finish_reason"] for ch in choices] == ["tool_calls", "tool_calls"]
    _stopped_at_the_repeat(engine)
