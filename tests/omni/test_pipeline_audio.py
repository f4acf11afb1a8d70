"""A served checkpoint that hears: audio turns reach the model as embeddings, with no ASR in the answer path.

A tiny random Qwen2-Audio checkpoint is loaded by ``OmniPipeline.load`` with no ASR and no VAD; its
answers over the pipeline, the realtime socket and chat completions must equal the engine driven
directly with the audio prompt of ``omni.audio_input``.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from omni_gateway.encoders.audio import float_to_pcm16, resample
from omni_gateway.encoders.vision import VisionEncoder
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.audio_input import build_audio_prompt
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.protocol import (
    AudioChunk,
    AudioPart,
    Error,
    Message,
    OmniRequest,
    SamplingOptions,
    TextDelta,
    TextPart,
    Transcription,
    Usage,
)

from tests.harness.audio_checkpoints import save_tiny_qwen2_audio, tone
from tests.harness.live_server import audio_turn, serve, served
from tests.harness.real_engine import checkpoint_config
from tests.omni.test_pipeline import FakeTTS

pytestmark = pytest.mark.slow
MAX_TOKENS = 6
RATE = 24000  # the realtime API's pcm16 rate


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniPipeline]:
    directory = tmp_path_factory.mktemp("qwen2audio")
    save_tiny_qwen2_audio(directory)
    config = checkpoint_config(directory, max_tokens=MAX_TOKENS)
    pipe = OmniPipeline.load(config)
    yield pipe
    pipe.shutdown()


def clip_pcm16() -> bytes:
    return float_to_pcm16(resample(tone(3, 0.6), 16000, RATE))


def direct(pipeline: OmniPipeline, messages: tuple[Message, ...], vision: VisionEncoder | None = None) -> str:
    """The engine's greedy text for the conversation's audio prompt (images through ``vision``), without the
    pipeline in between."""
    request = OmniRequest("direct", messages)
    built = build_audio_prompt(
        request, pipeline.engine.tokenizer, pipeline.audio, vision, system_prompt=pipeline.config.system_prompt
    )

    async def go() -> str:
        out = ""
        async for delta in pipeline.engine.generate(
            built.token_ids,
            SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
            request_id="direct",
            embed_spans=built.embed_spans,
        ):
            out += delta.text
        return out

    return asyncio.run(go())


def test_audio_checkpoint_hears_without_asr(pipeline: OmniPipeline) -> None:
    assert pipeline.asr is None and pipeline.audio is not None
    assert pipeline.capabilities.hears_audio and "audio" in pipeline.capabilities.input_modalities
    messages = (Message("user", (AudioPart(clip_pcm16(), RATE), TextPart("what is said"))),)
    request = OmniRequest("a1", messages, sampling=SamplingOptions(max_tokens=MAX_TOKENS, temperature=0.0))

    async def run() -> list[Any]:
        return [c async for c in pipeline.generate(request)]

    chunks = asyncio.run(run())
    assert not [c for c in chunks if isinstance(c, Error)], chunks
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == direct(pipeline, messages)
    (usage,) = [c for c in chunks if isinstance(c, Usage)]
    assert usage.input_audio_tokens == 15 and usage.input_image_tokens == 0  # 0.6 s: 60 mel frames -> 15 tokens


def test_corrupt_audio_upload_is_a_clear_refusal(pipeline: OmniPipeline) -> None:
    request = OmniRequest("bad", (Message("user", (AudioPart(b"", 0, encoded=b"RIFF....WAVEfmt garbage"),)),))

    async def run() -> list[Any]:
        return [c async for c in pipeline.generate(request)]

    (error,) = [c for c in asyncio.run(run()) if isinstance(c, Error)]
    assert "audio" in error.message


def test_realtime_audio_turn_is_answered_by_the_model_hearing_it(pipeline: OmniPipeline) -> None:
    pcm = clip_pcm16()

    session = {"type": "realtime", "output_modalities": ["text"], "audio": {"input": {"turn_detection": None}}}

    with serve(pipeline) as port:
        events = asyncio.run(asyncio.wait_for(audio_turn(port, session, pcm), 60))
    done = events[-1]["response"]
    assert done["status"] in ("completed", "incomplete") and (done["status_details"] or {}).get("error") is None, done
    assert not any("transcription" in e["type"] for e in events)  # none asked for, none ran
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    expected = direct(pipeline, (Message("user", (AudioPart(pcm, RATE),)),))
    assert text == expected and text


def wav_content() -> tuple[list[dict[str, Any]], tuple[Message, ...]]:
    """A chat message's content with the clip as an ``input_audio`` WAV part, and the conversation the
    model hears from it."""
    import io
    import wave

    pcm = clip_pcm16()
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(pcm)
    audio = {"data": base64.b64encode(buffer.getvalue()).decode(), "format": "wav"}
    content = [{"type": "input_audio", "input_audio": audio}, {"type": "text", "text": "what is said"}]
    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0
    heard = AudioPart(float_to_pcm16(samples), RATE)
    return content, (Message("user", (heard, TextPart("what is said"))),)


def test_chat_completion_with_input_audio_goes_to_the_model(pipeline: OmniPipeline) -> None:
    content, heard = wav_content()
    with served(pipeline) as (_, client):
        reply = client.chat.completions.create(
            model=pipeline.capabilities.model,
            messages=[{"role": "user", "content": content}],
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
    assert reply.choices[0].message.content == direct(pipeline, heard)


def test_a_model_that_hears_but_does_not_speak_answers_through_the_tts_head(pipeline: OmniPipeline) -> None:
    """Audio in reaches the model; audio out is the TTS head speaking the model's text: over the pipeline and
    over chat completions with ``modalities: ["text", "audio"]``."""
    voiced = OmniPipeline(
        pipeline.config,
        engine=pipeline.engine,
        model_name=pipeline.capabilities.model,
        max_context_tokens=512,
        audio=pipeline.audio,
        tts=FakeTTS(),
    )
    assert voiced.capabilities.hears_audio and "audio" in voiced.capabilities.output_modalities
    content, heard = wav_content()
    want = direct(pipeline, heard)
    request = OmniRequest(
        "spoken", heard, modalities=("text", "audio"), sampling=SamplingOptions(max_tokens=MAX_TOKENS, temperature=0.0)
    )

    async def run() -> list[Any]:
        return [c async for c in voiced.generate(request)]

    audio = [c for c in asyncio.run(run()) if isinstance(c, AudioChunk)]
    assert want and "".join(c.transcript for c in audio) == want and sum(len(c.pcm16) for c in audio) > 0
    with served(voiced) as (_, client):
        reply = client.chat.completions.create(
            model=voiced.capabilities.model,
            messages=[{"role": "user", "content": content}],
            modalities=["text", "audio"],
            audio={"voice": "joe", "format": "wav"},
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
    spoken = reply.choices[0].message.audio
    assert spoken.transcript == want and len(base64.b64decode(spoken.data)) > 44  # a WAV header and samples


class _Recognizer:
    """An ASR stage that reports one fixed transcript (what the session asked for alongside the answer)."""

    def __init__(self) -> None:
        self.calls = 0

    def transcribe(
        self, audio: bytes, *, sample_rate: int = 16000, language: str | None = None, prompt: str | None = None
    ) -> Transcription:
        self.calls += 1
        return Transcription(text="what the user said", language="en", duration_s=len(audio) / 2 / sample_rate)


def test_input_transcription_is_produced_alongside_the_heard_answer(pipeline: OmniPipeline) -> None:
    pcm = clip_pcm16()

    audio_in = {"turn_detection": None, "transcription": {"model": "whisper-1"}}
    session = {"type": "realtime", "output_modalities": ["text"], "audio": {"input": audio_in}}
    completed = "conversation.item.input_audio_transcription.completed"

    recognizer = _Recognizer()
    pipeline.asr = recognizer
    try:
        with serve(pipeline) as port:
            events = asyncio.run(asyncio.wait_for(audio_turn(port, session, pcm, also=completed), 60))
    finally:
        pipeline.asr = None
    transcript = next(e for e in events if e["type"] == completed)
    assert transcript["transcript"] == "what the user said" and recognizer.calls == 1
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    # The answer comes from the audio itself, not from the transcript.
    assert text == direct(pipeline, (Message("user", (AudioPart(pcm, RATE),)),))
