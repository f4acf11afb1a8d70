"""/v1/audio/transcriptions and /v1/audio/speech through the official openai SDK against a live server."""

from __future__ import annotations

import base64
import io
import json
import wave

import httpx
import openai
import pytest
import soundfile
from omni_gateway.omni.protocol import Capabilities

from tests.gateway.test_http_parsing import wav_bytes
from tests.harness.fake_backend import FakeBackend, tone
from tests.harness.live_server import served

WORD = tone(100)  # what the fake voice says for each word


def upload(samples: int = 1600, rate: int = 16000, channels: int = 1) -> tuple[str, bytes, str]:
    return ("clip.wav", wav_bytes([500] * samples * channels, rate=rate, channels=channels), "audio/wav")


def test_transcription_json_decodes_the_wav_for_the_backend(fake):
    backend, _, client = fake
    r = client.audio.transcriptions.create(model="whisper-1", file=upload(channels=2), language="en")
    assert r.text == backend.transcript
    assert len(backend.transcribed[-1]) == 3200 and backend.transcription_options[-1] == (16000, "en")


def test_transcription_text_and_verbose_json(fake):
    backend, _, client = fake
    assert (
        client.audio.transcriptions.create(model="whisper-1", file=upload(), response_format="text")
        == backend.transcript
    )
    verbose = client.audio.transcriptions.create(model="whisper-1", file=upload(8000), response_format="verbose_json")
    assert verbose.duration == pytest.approx(0.5) and verbose.language == "en" and verbose.text == backend.transcript


def test_non_wav_uploads_are_refused_with_the_accepted_format(fake):
    _, _, client = fake
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(model="whisper-1", file=("a.mp3", b"ID3\x04" + bytes(100), "audio/mpeg"))
    assert info.value.code == "unsupported_audio_format" and "WAV" in info.value.message


def test_upload_beyond_the_body_limit_is_413():
    from omni_gateway.gateway.config import GatewayConfig
    from omni_gateway.gateway.http.limits import HttpLimits

    with served(FakeBackend(), GatewayConfig(http=HttpLimits(max_body_bytes=4000))) as (_, client):
        with pytest.raises(openai.APIStatusError) as info:
            client.audio.transcriptions.create(model="whisper-1", file=upload(4000))
        assert info.value.status_code == 413


def test_missing_file_is_400(fake):
    _, url, _ = fake
    r = httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"}, files={"other": ("x", b"1")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"


def test_speech_wav_streams_a_playable_file(fake):
    backend, _, client = fake
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="joe", input="one two three", response_format="wav", speed=1.25
    ) as r:
        data = r.read()
    with wave.open(io.BytesIO(data)) as w:
        assert w.getframerate() == 24000 and w.getnchannels() == 1
        assert w.readframes(100_000) == WORD * 3
    text, options = backend.synthesized[-1]
    assert text == "one two three" and options.voice == "joe" and options.speed == 1.25


def test_speech_pcm_and_flac(fake):
    _, _, client = fake
    pcm = client.audio.speech.create(model="tts-1", voice="joe", input="a b", response_format="pcm").read()
    assert pcm == WORD * 2
    flac = client.audio.speech.create(model="tts-1", voice="joe", input="a b c", response_format="flac").read()
    samples, rate = soundfile.read(io.BytesIO(flac), dtype="int16")
    assert rate == 24000 and samples.tobytes() == WORD * 3


def test_speech_as_server_sent_events(fake):
    _, url, _ = fake
    body = {"model": "tts-1", "voice": "joe", "input": "a b", "response_format": "pcm", "stream_format": "sse"}
    r = httpx.post(f"{url}/v1/audio/speech", json=body)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.delta", "speech.audio.done"]
    assert base64.b64decode(events[0]["audio"]) == WORD


def test_unsupported_speech_format_and_voice_are_400(fake):
    _, _, client = fake
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(model="tts-1", voice="joe", input="x", response_format="mp3")
    assert info.value.param == "response_format"
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(model="tts-1", voice="alloy", input="x", response_format="wav")
    assert "joe" in info.value.message


def test_speech_without_a_voice_model_is_400():
    backend = FakeBackend(
        capabilities=Capabilities(
            model="omni-test", input_modalities=frozenset({"text"}), output_modalities=frozenset({"text"})
        )
    )
    with served(backend) as (_, client):
        with pytest.raises(openai.BadRequestError) as info:
            client.audio.speech.create(model="tts-1", voice="joe", input="x", response_format="wav")
        assert info.value.code == "unsupported_modality"


def test_malformed_multipart_is_400_without_parser_details(fake):
    _, url, _ = fake
    r = httpx.post(
        f"{url}/v1/audio/transcriptions",
        content=b"--xyz\r\nContent-Disposition: form-data\r\n\r\n",
        headers={"Content-Type": "multipart/form-data; boundary=xyz"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_multipart"


def test_speech_bodies_skip_chunks_without_audio() -> None:
    import asyncio

    from omni_gateway.gateway.http.audio import _chunks
    from omni_gateway.omni.protocol import AudioChunk

    async def rest():  # type: ignore[no-untyped-def]
        yield AudioChunk(b"\x01\x00", 24000, " b")
        yield AudioChunk(b"", 24000, " c")  # text a TTS voice could not speak: its transcript only

    async def collect() -> list[AudioChunk]:
        return [c async for c in _chunks(AudioChunk(b"", 24000, "a"), rest())]

    assert [c.transcript for c in asyncio.run(collect())] == [" b"]
