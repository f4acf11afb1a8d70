"""Backend chunks -> OpenAI response bodies and stream chunks, without a server."""

from __future__ import annotations

import base64
import io
import wave

import pytest
from omni_gateway.gateway.http.chat_request import parse_chat
from omni_gateway.gateway.http.chat_response import ChatAssembler
from omni_gateway.gateway.http.completion_request import parse_completion
from omni_gateway.gateway.http.completion_response import CompletionAssembler
from omni_gateway.gateway.http.errors import ApiError
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.omni.protocol import AudioChunk, Capabilities, Done, Error, TextDelta, ToolCallDelta, Usage

CAPS = Capabilities(
    model="m", input_modalities=frozenset({"text"}), output_modalities=frozenset({"text", "audio"}), voices=("joe",)
)
USER = [{"role": "user", "content": "hi"}]


def assembler(**fields) -> ChatAssembler:
    return ChatAssembler(parse_chat({"model": "m", "messages": USER, **fields}, CAPS, HttpLimits()), 1000, 60)


def test_text_choices_are_assembled_per_index_with_usage():
    a = assembler(n=2)
    for chunk in [
        TextDelta("a", 1),
        TextDelta("x", 0),
        TextDelta("b", 1),
        Done("length", 1),
        TextDelta("y", 0),
        Done("stop", 0),
        Usage(input_tokens=4, output_tokens=4, cached_tokens=2),
    ]:
        a.feed(chunk)
    body = a.body()
    assert [c["message"]["content"] for c in body["choices"]] == ["xy", "ab"]
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    assert body["usage"]["total_tokens"] == 8 and body["usage"]["prompt_tokens_details"]["cached_tokens"] == 2


def test_first_stream_chunk_of_each_choice_carries_the_role_and_finish_comes_last():
    a = assembler(n=2, stream=True)
    first = a.feed(TextDelta("a", 1))[0]["choices"][0]
    second = a.feed(TextDelta("b", 1))[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": "a"} and first["index"] == 1
    assert second["delta"] == {"content": "b"}
    finish = a.feed(Done("stop", 1))
    assert finish[-1]["choices"][0] == {"index": 1, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert a.usage_chunk() is None


def test_usage_chunk_has_no_choices():
    a = assembler(stream=True, stream_options={"include_usage": True})
    a.feed(Usage(input_tokens=3, output_tokens=5))
    chunk = a.usage_chunk()
    assert chunk["choices"] == [] and chunk["usage"]["completion_tokens"] == 5


def test_tool_calls_become_message_tool_calls_and_finish_reason():
    a = assembler(tools=[{"type": "function", "function": {"name": "f"}}])
    streamed = a.feed(ToolCallDelta("call_9", "f", '{"a": 1}'))
    a.feed(ToolCallDelta("call_10", "f", "{}"))
    a.feed(Done("stop"))
    message = a.body()["choices"][0]["message"]
    assert message["content"] is None
    assert [c["id"] for c in message["tool_calls"]] == ["call_9", "call_10"]
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert a.body()["choices"][0]["finish_reason"] == "tool_calls"
    assert streamed[0]["choices"][0]["delta"]["tool_calls"][0]["index"] == 0


def test_audio_output_is_a_wav_with_the_text_as_transcript():
    a = assembler(modalities=["text", "audio"], audio={"voice": "joe", "format": "wav"})
    for chunk in [
        TextDelta("Hi"),
        AudioChunk(b"\x01\x00" * 50, 24000, "Hi"),
        TextDelta(" there"),
        AudioChunk(b"\x02\x00" * 30, 24000, " there"),
        Done("stop"),
    ]:
        a.feed(chunk)
    message = a.body()["choices"][0]["message"]
    assert message["content"] is None and message["audio"]["transcript"] == "Hi there"
    assert message["audio"]["expires_at"] == 1060
    with wave.open(io.BytesIO(base64.b64decode(message["audio"]["data"]))) as w:
        assert (w.getnframes(), w.getframerate(), w.getnchannels()) == (80, 24000, 1)


def test_streamed_audio_deltas_carry_data_transcript_and_expiry():
    a = assembler(modalities=["text", "audio"], audio={"voice": "joe", "format": "pcm16"}, stream=True)
    assert a.feed(TextDelta("Hi")) == []
    first = a.feed(AudioChunk(b"\x05\x00", 24000, "Hi"))[0]["choices"][0]["delta"]
    silent = a.feed(AudioChunk(b"\x06\x00", 24000))[0]["choices"][0]["delta"]
    done = a.feed(Done("stop"))
    assert first["role"] == "assistant" and first["content"] is None
    assert first["audio"]["transcript"] == "Hi" and base64.b64decode(first["audio"]["data"]) == b"\x05\x00"
    assert "transcript" not in silent["audio"]
    assert done[0]["choices"][0]["delta"]["audio"]["expires_at"] == 1060
    assert first["audio"]["id"] == silent["audio"]["id"]


def test_logprobs_are_shaped_as_chat_logprobs_and_cut_to_top_logprobs():
    a = assembler(logprobs=True, top_logprobs=1)
    a.feed(TextDelta("a", logprobs=(("a", -0.1, (("a", -0.1), ("b", -2.0))),)))
    entry = a.body()["choices"][0]["logprobs"]["content"][0]
    assert entry == {
        "token": "a",
        "logprob": -0.1,
        "bytes": [97],
        "top_logprobs": [{"token": "a", "logprob": -0.1, "bytes": [97]}],
    }


@pytest.mark.parametrize(
    "status, kind", [(429, "rate_limit_error"), (503, "server_error"), (400, "invalid_request_error")]
)
def test_error_chunks_raise_the_status_they_carry(status, kind):
    with pytest.raises(ApiError) as info:
        assembler().feed(Error("overloaded", "busy", status))
    assert (info.value.status, info.value.type, info.value.code) == (status, kind, "overloaded")


def test_a_choice_index_beyond_n_is_a_server_error():
    with pytest.raises(ApiError) as info:
        assembler(n=1).feed(TextDelta("x", index=1))
    assert info.value.status == 500


def test_completion_choices_are_numbered_by_prompt_then_index_with_echo_and_offsets():
    call = parse_completion({"model": "m", "prompt": ["p0", "p1"], "n": 2, "echo": True}, CAPS, HttpLimits())
    a = CompletionAssembler(call, 5)
    a.feed(1, TextDelta("x", 1))
    a.feed(0, TextDelta("y", 0))
    a.feed(1, Done("stop", 1))
    a.feed(0, Done("length", 1))
    a.feed(0, Usage(1, 1))
    a.feed(1, Usage(2, 3))
    body = a.body()
    assert [c["text"] for c in body["choices"]] == ["p0y", "p0", "", "p1x"]
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 4


def test_completion_logprobs_track_text_offsets():
    call = parse_completion({"model": "m", "prompt": "p", "logprobs": 1}, CAPS, HttpLimits())
    a = CompletionAssembler(call, 5)
    a.feed(0, TextDelta("ab", logprobs=(("a", -1.0, (("a", -1.0), ("z", -3.0))), ("b", -2.0, (("b", -2.0),)))))
    a.feed(0, TextDelta("c", logprobs=(("c", -0.5, (("c", -0.5),)),)))
    lp = a.body()["choices"][0]["logprobs"]
    assert lp["tokens"] == ["a", "b", "c"] and lp["text_offset"] == [0, 1, 2]
    assert lp["top_logprobs"][0] == {"a": -1.0}
