"""/v1/chat/completions through the official openai SDK against a live server and the fake backend."""

from __future__ import annotations

import base64
import io
import json
import time
import wave

import httpx
import openai
import pytest
from omni_gateway.omni.protocol import AudioPart, Done, Error, ImagePart, TextDelta

from tests.gateway.test_http_parsing import wav_bytes
from tests.harness.fake_backend import FakeBackend, overloaded, tone, tool_call_script
from tests.harness.live_server import served

USER = [{"role": "user", "content": "hi there"}]


def test_non_streaming_answer_with_n_and_logprobs(fake):
    backend, _, client = fake
    r = client.chat.completions.create(
        model="omni-test",
        messages=USER,
        n=2,
        logprobs=True,
        top_logprobs=1,
        max_tokens=3,
        temperature=0.5,
        seed=7,
        stop=["zzz"],
    )
    assert [c.message.content for c in r.choices] == ["hello from the"] * 2
    assert [c.finish_reason for c in r.choices] == ["length", "length"]
    assert [t.token for t in r.choices[1].logprobs.content] == ["hello", " from", " the"]
    assert len(r.choices[0].logprobs.content[0].top_logprobs) == 1
    assert r.usage.completion_tokens == 6 and r.usage.prompt_tokens == 2
    sent = backend.requests[-1].sampling
    assert (sent.n, sent.max_tokens, sent.temperature, sent.seed, sent.stop, sent.logprobs) == (
        2,
        3,
        0.5,
        7,
        ("zzz",),
        1,
    )


def test_streaming_with_usage_reassembles_the_reply(fake):
    _, _, client = fake
    chunks = list(
        client.chat.completions.create(
            model="omni-test", messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "hello from the fake model"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert len({c.id for c in chunks}) == 1


def test_streaming_without_usage_sends_no_usage_chunk(fake):
    _, _, client = fake
    chunks = list(client.chat.completions.create(model="omni-test", messages=USER, stream=True))
    assert all(c.usage is None and c.choices for c in chunks)


def test_tool_calls_come_back_in_the_message_and_in_stream_deltas(fake):
    backend, _, client = fake
    backend.script = tool_call_script()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    r = client.chat.completions.create(model="omni-test", messages=USER, tools=tools, tool_choice="auto")
    call = r.choices[0].message.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "call_1",
        "get_weather",
        {"city": "Paris"},
    )
    assert r.choices[0].finish_reason == "tool_calls"
    assert backend.requests[-1].tools == tuple(tools)
    chunks = list(client.chat.completions.create(model="omni-test", messages=USER, tools=tools, stream=True))
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.id, d.function.name) for d in deltas] == [(0, "call_1", "get_weather")]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_audio_output_non_streaming_is_a_wav_with_transcript(fake):
    _, _, client = fake
    r = client.chat.completions.create(
        model="omni-test", messages=USER, modalities=["text", "audio"], audio={"voice": "joe", "format": "wav"}
    )
    audio = r.choices[0].message.audio
    assert audio.transcript == "hello from the fake model" and audio.expires_at > time.time()
    with wave.open(io.BytesIO(base64.b64decode(audio.data))) as w:
        assert w.getnframes() == 5 * len(tone(100)) // 2 and w.getframerate() == 24000


def test_audio_output_streams_pcm16_deltas(fake):
    _, _, client = fake
    chunks = list(
        client.chat.completions.create(
            model="omni-test",
            messages=USER,
            modalities=["text", "audio"],
            audio={"voice": "joe", "format": "pcm16"},
            stream=True,
        )
    )
    audio = [c.choices[0].delta.audio for c in chunks if c.choices and c.choices[0].delta.audio]
    pcm = b"".join(base64.b64decode(a.data) for a in audio if a.data)
    transcript = "".join(a.transcript or "" for a in audio)
    assert len(pcm) == 5 * len(tone(100)) and transcript == "hello from the fake model"
    assert audio[-1].expires_at is not None and len({a.id for a in audio}) == 1


def test_data_uri_image_and_wav_audio_reach_the_backend(fake):
    backend, _, client = fake
    png = b"\x89PNG\r\n\x1a\nxyz"
    wav = wav_bytes([1, 2, 3, 4], rate=16000)
    client.chat.completions.create(
        model="omni-test",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "describe"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()},
                    },
                    {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}},
                ],
            }
        ],
    )
    parts = backend.requests[-1].messages[0].parts
    assert isinstance(parts[1], ImagePart) and parts[1].data == png
    assert isinstance(parts[2], AudioPart) and parts[2].sample_rate == 16000 and len(parts[2].pcm16) == 8


def test_http_image_urls_are_refused_with_a_clear_message(fake):
    _, _, client = fake
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="omni-test",
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}],
                }
            ],
        )
    assert info.value.code == "invalid_image_url" and "data URI" in info.value.message


def test_unknown_model_is_a_404(fake):
    _, _, client = fake
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=USER)
    assert info.value.code == "model_not_found"


def test_prompt_beyond_the_context_window_is_refused_before_generation(fake):
    backend, _, client = fake
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="omni-test", messages=[{"role": "user", "content": "w " * 5000}])
    assert info.value.code == "context_length_exceeded" and backend.requests == []


@pytest.mark.parametrize("status, error", [(429, openai.RateLimitError), (503, openai.InternalServerError)])
@pytest.mark.parametrize("stream", [False, True])
def test_overload_before_the_first_token_keeps_its_http_status(fake, status, error, stream):
    backend, _, client = fake
    backend.script = overloaded(status)
    with pytest.raises(error) as info:
        r = client.chat.completions.create(model="omni-test", messages=USER, stream=stream)
        if stream:
            list(r)
    assert info.value.status_code == status and info.value.body["code"] == "overloaded"


def test_an_error_mid_stream_is_raised_by_the_sdk(fake):
    backend, _, client = fake
    backend.script = [TextDelta("partial"), Error("engine_dead", "the engine stopped", 500), Done("error")]
    stream = client.chat.completions.create(model="omni-test", messages=USER, stream=True)
    first = next(stream)
    assert first.choices[0].delta.content == "partial"
    with pytest.raises(openai.APIError, match="The server had an error while processing your request"):
        list(stream)


@pytest.mark.parametrize("status, error", [(503, openai.InternalServerError), (400, openai.BadRequestError)])
def test_an_error_after_some_output_keeps_its_status_without_streaming(fake, status, error):
    backend, _, client = fake
    backend.script = [TextDelta("partial"), Error("overloaded", "preempted and out of memory", status), Done("error")]
    with pytest.raises(error) as info:
        client.chat.completions.create(model="omni-test", messages=USER)
    assert info.value.status_code == status and "out of memory" in info.value.message


def test_body_over_the_limit_is_413():
    from omni_gateway.gateway.config import GatewayConfig
    from omni_gateway.gateway.http.limits import HttpLimits

    backend = FakeBackend()
    with served(backend, GatewayConfig(http=HttpLimits(max_body_bytes=1000))) as (url, client):
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="omni-test", messages=[{"role": "user", "content": "x" * 2000}])
        assert info.value.status_code == 413 and info.value.body["code"] == "request_too_large"
        r = httpx.post(f"{url}/v1/chat/completions", content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_client_leaving_mid_stream_aborts_the_backend_request(fake):
    backend, url, _ = fake
    backend.chunk_delay = 0.2
    body = {"model": "omni-test", "messages": USER, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=10) as r:
        first = next(r.iter_lines())
        assert first.startswith("data: ")
    request_id = backend.requests[-1].request_id
    assert wait_until(lambda: request_id in backend.aborted and request_id in backend.closed)
    assert request_id not in backend.completed


def test_client_leaving_a_non_streaming_request_aborts_it(fake):
    backend, url, _ = fake
    backend.chunk_delay = 0.2
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/chat/completions", json={"model": "omni-test", "messages": USER}, timeout=0.5)
    assert wait_until(lambda: len(backend.aborted) == 1)
    assert backend.aborted == [backend.requests[-1].request_id] and backend.completed == []
