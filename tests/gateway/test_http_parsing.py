"""Request parsing and validation of the HTTP API, without a server: JSON in, OmniRequest or ApiError out."""

from __future__ import annotations

import base64
import io
import json
import struct
import wave

import pytest
from omni_gateway.gateway.http.audio_request import parse_speech, parse_transcription_form
from omni_gateway.gateway.http.chat_request import parse_chat
from omni_gateway.gateway.http.completion_request import DEFAULT_MAX_TOKENS, parse_completion
from omni_gateway.gateway.http.errors import ApiError
from omni_gateway.gateway.http.image_request import parse_image_generation
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.sampling import check_context
from omni_gateway.omni.protocol import AudioPart, Capabilities, ImagePart, TextPart

CAPS = Capabilities(
    model="m",
    input_modalities=frozenset({"text", "audio", "image"}),
    output_modalities=frozenset({"text", "audio"}),
    voices=("joe",),
    max_context_tokens=100,
)
TEXT_ONLY = Capabilities(model="m", input_modalities=frozenset({"text"}), output_modalities=frozenset({"text"}))
LIMITS = HttpLimits()
USER = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return parse_chat({"model": "m", "messages": USER, **fields}, CAPS, LIMITS)


def error_of(fn, *args, **kwargs) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args, **kwargs)
    return info.value


def wav_bytes(samples: list[int], rate: int = 16000, channels: int = 1, width: int = 2) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        if width == 2:
            w.writeframes(struct.pack(f"<{len(samples)}h", *samples))
        elif width == 1:
            w.writeframes(bytes(samples))
        else:
            w.writeframes(b"".join(s.to_bytes(width, "little", signed=True) for s in samples))
    return out.getvalue()


def test_chat_maps_messages_and_sampling_onto_the_omni_request():
    call = parse_chat(
        {
            "model": "m",
            "n": 3,
            "max_completion_tokens": 7,
            "temperature": 0.2,
            "top_p": 0.9,
            "seed": 5,
            "presence_penalty": 1.0,
            "frequency_penalty": -1.0,
            "stop": "END",
            "logprobs": True,
            "top_logprobs": 4,
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ],
        },
        CAPS,
        LIMITS,
    )
    r = call.request
    assert [m.role for m in r.messages] == ["system", "user", "assistant", "tool"]
    assert r.messages[1].parts == (TextPart("a"), TextPart("b"))
    assert r.messages[2].tool_calls[0].name == "f" and r.messages[2].tool_calls[0].arguments == '{"x": 1}'
    assert r.messages[3].tool_call_id == "c1"
    s = r.sampling
    assert (s.n, s.max_tokens, s.temperature, s.top_p, s.seed, s.stop, s.logprobs) == (3, 7, 0.2, 0.9, 5, ("END",), 4)
    assert (s.presence_penalty, s.frequency_penalty) == (1.0, -1.0)
    assert r.modalities == ("text",) and r.priority == 1 and call.logprobs and call.top_logprobs == 4


def test_logprobs_without_top_count_asks_for_the_sampled_token_only():
    assert chat(logprobs=True).request.sampling.logprobs == 0
    assert chat().request.sampling.logprobs is None


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"n": 0}, "n"),
        ({"n": 9}, "n"),
        ({"n": 2.5}, "n"),
        ({"n": True}, "n"),
        ({"temperature": 2.01}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": -1}, "max_completion_tokens"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "max_tokens"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "user", "content": [{"type": "file", "file": {}}]}]}, "messages[0].content[0].type"),
        ({"modalities": ["image"]}, "modalities"),
        ({"audio": {"voice": "joe", "format": "wav"}}, "audio"),
    ],
)
def test_out_of_bounds_or_malformed_fields_are_400_naming_the_field(fields, param):
    err = error_of(chat, **fields)
    assert err.status == 400 and err.type == "invalid_request_error" and err.param == param


def test_unknown_model_is_404_model_not_found():
    err = error_of(parse_chat, {"model": "gpt-4o", "messages": USER}, CAPS, LIMITS)
    assert (err.status, err.code, err.param) == (404, "model_not_found", "model")
    assert "gpt-4o" in err.message


def test_missing_model_is_400():
    err = error_of(parse_chat, {"messages": USER}, CAPS, LIMITS)
    assert (err.status, err.code) == (400, "missing_required_parameter")


def image_message(url: str) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is it"},
                {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
            ],
        }
    ]


def test_data_uri_images_become_image_parts_with_their_bytes():
    png = b"\x89PNG\r\n\x1a\nfake"
    call = chat(messages=image_message("data:image/png;base64," + base64.b64encode(png).decode()))
    part = call.request.messages[0].parts[1]
    assert part == ImagePart(data=png, mime="image/png", detail="low")


@pytest.mark.parametrize(
    "url, code",
    [
        ("https://example.com/cat.png", "invalid_image_url"),
        ("data:image/png,notbase64", "invalid_image_url"),
        ("data:image/svg+xml;base64,PHN2Zz4=", "invalid_image_format"),
        ("data:image/png;base64,@@@@", "invalid_base64"),
    ],
)
def test_bad_image_urls_are_rejected_with_a_reason(url, code):
    err = error_of(chat, messages=image_message(url))
    assert err.status == 400 and err.code == code
    if code == "invalid_image_url" and url.startswith("http"):
        assert "does not fetch" in err.message


def test_oversized_image_is_413_before_decoding():
    limits = HttpLimits(max_media_bytes=100)
    body = {"model": "m", "messages": image_message("data:image/png;base64," + "A" * 400)}
    err = error_of(parse_chat, body, CAPS, limits)
    assert err.status == 413 and err.code == "media_too_large"


def test_media_a_model_cannot_take_is_refused():
    body = {"model": "m", "messages": image_message("data:image/png;base64,AAAA")}
    err = error_of(parse_chat, body, TEXT_ONLY, LIMITS)
    assert err.code == "unsupported_modality" and "image" in err.message


def test_too_many_media_parts_are_refused():
    parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}] * 3
    err = error_of(
        parse_chat,
        {"model": "m", "messages": [{"role": "user", "content": parts}]},
        CAPS,
        HttpLimits(max_media_parts=2),
    )
    assert err.code == "too_many_media_parts"


def audio_message(data: bytes, fmt: str) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}
            ],
        }
    ]


def test_wav_input_audio_is_decoded_to_mono_pcm16():
    stereo = wav_bytes([100, 300, -100, -300], rate=8000, channels=2)
    part = chat(messages=audio_message(stereo, "wav")).request.messages[0].parts[0]
    assert isinstance(part, AudioPart) and part.sample_rate == 8000 and part.encoded is None
    assert struct.unpack("<2h", part.pcm16) == (200, -200)


def test_mp3_input_audio_travels_encoded_for_the_backend_to_decode():
    mp3 = b"ID3\x04fake mp3 frames"
    part = chat(messages=audio_message(mp3, "mp3")).request.messages[0].parts[0]
    assert part == AudioPart(pcm16=b"", sample_rate=0, encoded=mp3)


def test_unsupported_or_broken_input_audio_is_refused():
    assert error_of(chat, messages=audio_message(b"OggS", "ogg")).param == "messages[0].content[0].input_audio.format"
    assert error_of(chat, messages=audio_message(b"RIFF....WAVEjunk", "wav")).code == "invalid_audio"


def test_wav_duration_is_checked_from_the_header():
    long_wav = wav_bytes([0] * 1600, rate=800)  # 2 s
    err = error_of(
        parse_chat, {"model": "m", "messages": audio_message(long_wav, "wav")}, CAPS, HttpLimits(max_audio_seconds=1.0)
    )
    assert err.code == "audio_too_long"


@pytest.mark.parametrize(
    "width, samples, expected",
    [
        (1, [128 + 10, 128 - 10], (10 << 8, -10 << 8)),
        (3, [0x123456, -0x123456], (0x1234, -0x1235)),
        (4, [0x12345678, -0x12345678], (0x1234, -0x1235)),
    ],
)
def test_wav_sample_widths_are_converted_to_16_bit(width, samples, expected):
    from omni_gateway.gateway.http.wav import decode_wav

    pcm, rate = decode_wav(wav_bytes(samples, width=width), max_seconds=10, param="f")
    assert struct.unpack("<2h", pcm) == expected and rate == 16000


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time"}},
]


def test_tools_pass_through_and_tool_choice_selects_among_them():
    assert chat(tools=TOOLS).request.tools == tuple(TOOLS)
    assert chat(tools=TOOLS, tool_choice="none").request.tools == ()
    named = chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert named.request.tools == (TOOLS[1],)
    assert (
        error_of(chat, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "x"}}).param == "tool_choice"
    )
    assert error_of(chat, tools=[{"type": "retrieval"}]).param == "tools[0].type"


def test_audio_output_options():
    call = chat(modalities=["text", "audio"], audio={"voice": "joe", "format": "wav"})
    assert call.request.modalities == ("text", "audio") and call.audio_format == "wav"
    assert call.request.audio.voice == "joe" and call.request.audio.sample_rate == 24000
    assert (
        error_of(chat, modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"}).param == "audio.voice"
    )
    assert error_of(chat, modalities=["text", "audio"], audio={"voice": "joe", "format": "mp3"}).param == "audio.format"
    assert (
        error_of(chat, modalities=["text", "audio"], audio={"voice": "joe", "format": "wav"}, stream=True).param
        == "audio.format"
    )
    assert error_of(chat, modalities=["text", "audio"], audio={"voice": "joe", "format": "pcm16"}, n=2).param == "n"
    err = error_of(
        parse_chat,
        {"model": "m", "messages": USER, "modalities": ["text", "audio"], "audio": {"voice": "joe", "format": "wav"}},
        TEXT_ONLY,
        LIMITS,
    )
    assert err.code == "unsupported_modality"


def test_stream_options():
    call = chat(stream=True, stream_options={"include_usage": True})
    assert call.stream.stream and call.stream.include_usage
    assert not chat(stream=True).stream.include_usage


def test_context_window_is_enforced_with_the_requested_completion():
    check_context(90, 10, CAPS)
    err = error_of(check_context, 90, 11, CAPS)
    assert err.code == "context_length_exceeded" and "100" in err.message and "101" in err.message
    assert error_of(check_context, 100, None, CAPS).code == "context_length_exceeded"


def test_completion_prompts_each_become_a_raw_prompt_request():
    call = parse_completion({"model": "m", "prompt": ["one", "two"], "n": 2, "logprobs": 3}, CAPS, LIMITS)
    assert [r.raw_prompt for r in call.requests] == ["one", "two"]
    assert len({r.request_id for r in call.requests}) == 2
    assert all(r.sampling.n == 2 and r.sampling.logprobs == 3 for r in call.requests)
    assert call.requests[0].sampling.max_tokens == DEFAULT_MAX_TOKENS
    assert not call.requests[0].add_generation_prompt


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["x"] * 17}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": "x", "echo": True, "logprobs": 1}, "echo"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ],
)
def test_bad_completion_requests_are_400(fields, param):
    err = error_of(parse_completion, {"model": "m", **fields}, CAPS, LIMITS)
    assert err.status == 400 and err.param == param


def test_image_generation_needs_an_image_model():
    err = error_of(parse_image_generation, {"prompt": "a cat"}, CAPS, LIMITS)
    assert err.status == 400 and "no image model configured" in err.message


def test_image_generation_options():
    caps = Capabilities(model="m", input_modalities=frozenset({"text"}), output_modalities=frozenset({"image"}))
    call = parse_image_generation(
        {
            "prompt": "a cat",
            "size": "512x256",
            "n": 2,
            "stream": True,
            "partial_images": 2,
            "num_inference_steps": 9,
            "seed": 3,
            "guidance_scale": 4.5,
        },
        caps,
        LIMITS,
    )
    opts = call.request.image
    assert call.request.modalities == ("image",) and opts.size == (512, 256) and opts.n == 2
    assert opts.preview_every == 3 and opts.seed == 3 and call.partial_images == 2 and opts.guidance_scale == 4.5
    assert parse_image_generation({"prompt": "a cat"}, caps, LIMITS).request.image.guidance_scale is None
    for fields, param in [
        ({"size": "100x100"}, "size"),
        ({"size": "big"}, "size"),
        ({"n": 5}, "n"),
        ({"response_format": "url"}, "response_format"),
        ({"partial_images": 1}, "partial_images"),
        ({"output_format": "jpeg"}, "output_format"),
        ({"guidance_scale": -1}, "guidance_scale"),
        ({"guidance_scale": "high"}, "guidance_scale"),
    ]:
        assert error_of(parse_image_generation, {"prompt": "a cat", **fields}, caps, LIMITS).param == param


def test_speech_options():
    call = parse_speech(
        {"model": "tts-1", "input": "hello", "voice": "joe", "speed": 1.5, "response_format": "pcm"}, CAPS, LIMITS
    )
    assert call.text == "hello" and call.options.voice == "joe" and call.options.speed == 1.5
    assert call.response_format == "pcm" and not call.sse
    assert parse_speech({"model": "x", "input": "a", "voice": "joe"}, CAPS, LIMITS).response_format == "wav"
    for fields, param in [
        ({"response_format": "mp3"}, "response_format"),
        ({"speed": 5}, "speed"),
        ({"voice": "alloy"}, "voice"),
        ({"input": "  "}, "input"),
        ({"input": "x" * 4097}, "input"),
    ]:
        body = {"model": "x", "input": "a", "voice": "joe", **fields}
        assert error_of(parse_speech, body, CAPS, LIMITS).param == param


def test_transcription_form_fields():
    call = parse_transcription_form({"model": "whisper-1", "language": "en", "response_format": "text"}, CAPS)
    assert call.language == "en" and call.response_format == "text" and call.prompt is None
    assert error_of(parse_transcription_form, {"model": "w", "response_format": "srt"}, CAPS).param == "response_format"
    assert error_of(parse_transcription_form, {"model": "w"}, TEXT_ONLY).code == "unsupported_modality"


def test_error_body_has_openai_shape():
    err = error_of(chat, n=0)
    assert json.loads(err.response().body) == {
        "error": {"message": err.message, "type": "invalid_request_error", "param": "n", "code": "below_minimum"}
    }
