"""A served Qwen2.5-Omni checkpoint that hears and speaks: a realtime audio turn goes to the model as audio
and comes back as the talker's audio, with neither Whisper nor Piper loaded.

The tiny random checkpoint (thinker with its audio tower, talker, token2wav, speaker map) is built here from
the transformers config and loaded by ``OmniPipeline.load`` as ``omni serve --model DIR`` loads it: the
speech model is found in the same directory ("auto"), no TTS voice is loaded for it, and the engine stays
in the server's process."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omni_gateway.encoders.audio import float_to_pcm16, resample
from omni_gateway.engine.frontend.async_engine import AsyncEngine
from omni_gateway.omni.heads.token2wav.stream import Token2WavStream
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.protocol import (
    AudioChunk,
    AudioOutputOptions,
    AudioPart,
    Error,
    Message,
    OmniRequest,
    SamplingOptions,
    TextDelta,
    TextPart,
)

from tests.harness.audio_checkpoints import save_tiny_qwen2_5_omni, tone
from tests.harness.live_server import audio_turn, serve
from tests.harness.real_engine import checkpoint_config

pytestmark = pytest.mark.slow
RATE = 24000  # the realtime API's pcm16 rate


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("speaking-omni")
    save_tiny_qwen2_5_omni(directory, speaks=True)
    return directory


def _load(directory: Path, *, prefix_caching: bool = True, warm_up: bool = True) -> OmniPipeline:
    config = checkpoint_config(
        directory,
        max_tokens=6,
        engine_args={"enable_prefix_caching": prefix_caching},
        tts="default",  # a speaking model loads none
        warm_up=warm_up,
    )
    pipe = OmniPipeline.load(config)
    assert pipe.speech is not None
    # A random talker may never say its stop code: a short utterance keeps the test fast.
    pipe.speech.config = dataclasses.replace(pipe.speech.config, max_codes=30, temperature=0.0)
    return pipe


@pytest.fixture(scope="module")
def pipeline(checkpoint: Path) -> Iterator[OmniPipeline]:
    pipe = _load(checkpoint)  # warmed up: one short spoken turn ran before serving
    yield pipe
    pipe.shutdown()


@pytest.fixture(scope="module")
def uncached(checkpoint: Path) -> Iterator[OmniPipeline]:
    """The same checkpoint with the thinker's prefix cache off: every spoken turn computed from scratch."""
    pipe = _load(checkpoint, prefix_caching=False, warm_up=False)
    yield pipe
    pipe.shutdown()


def test_checkpoint_that_speaks_loads_no_asr_and_no_tts(pipeline: OmniPipeline) -> None:
    assert pipeline.asr is None and pipeline.tts is None
    assert pipeline.speech is not None and pipeline.speech._text_rows  # the warm-up asked for the voice's rows
    assert pipeline.audio is not None and pipeline.capabilities.hears_audio
    assert isinstance(pipeline.engine, AsyncEngine)  # in this process: hidden states stay where they are


def test_realtime_audio_turn_is_answered_in_the_models_own_voice(pipeline: OmniPipeline) -> None:
    pcm = float_to_pcm16(resample(tone(3, 0.6), 16000, RATE))

    session = {
        "type": "realtime",
        "output_modalities": ["audio"],
        "audio": {"input": {"turn_detection": None}, "output": {"voice": "Ethan"}},
    }

    with serve(pipeline) as port:
        events = asyncio.run(asyncio.wait_for(audio_turn(port, session, pcm), 120))
    assert not [e for e in events if e["type"] == "error"], events
    done = events[-1]["response"]
    assert (done["status_details"] or {}).get("error") is None, done
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert len(audio) > 0 and len(audio) % 2 == 0
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert transcript  # the thinker's words, alongside its voice
    assert not any("transcription" in e["type"] for e in events)  # no ASR asked for, none ran
    assert done["usage"]["input_token_details"]["audio_tokens"] > 0  # the model heard the audio itself
    # Every KV block of the thinker and the talker is back once the turn is done.
    talker = pipeline.speech.talker
    assert talker.engine.scheduler.kv.usage().num_used_blocks == 0
    assert pipeline.engine.engine.scheduler.kv.usage().num_used_blocks == 0


class Codes:
    """The talker codes every token2wav stream is pushed, utterance by utterance."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pushed: list[int] = []
        push = Token2WavStream.push

        def keep(stream: Token2WavStream, codes: list[int], **kwargs: Any) -> list[Any]:
            self.pushed += codes
            return push(stream, codes, **kwargs)

        monkeypatch.setattr(Token2WavStream, "push", keep)

    def take(self) -> list[int]:
        codes, self.pushed = self.pushed, []
        return codes


def _run(pipe: OmniPipeline, request: OmniRequest) -> list[Any]:
    async def collect() -> list[Any]:
        return [c async for c in pipe.generate(request)]

    chunks = asyncio.run(collect())
    assert not [c for c in chunks if isinstance(c, Error)], chunks
    return chunks


def _pcm(chunks: list[Any]) -> bytes:
    return b"".join(c.pcm16 for c in chunks if isinstance(c, AudioChunk))


def test_a_prefill_of_a_spoken_turn_keeps_the_rows_its_reply_reads(
    pipeline: OmniPipeline, uncached: OmniPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``prefill_only`` request of a reply in speech (a realtime turn prefilled while the user still speaks,
    its audio so far read in part) keeps the thinker rows the talker reads: the spoken reply to the whole turn
    reuses the prefilled blocks and speaks the codes and audio it speaks without a prefix cache. A text
    prefill's blocks keep no rows, so a spoken reply cannot reuse them."""
    kv = pipeline.engine.engine.scheduler.kv
    block = kv.block_size
    codes = Codes(monkeypatch)
    samples = tone(5, 3.6)
    samples[:8000] *= 2  # loudest at its start: every reading of the turn has the whole turn's log-mel floor
    turn = float_to_pcm16(resample(samples, 16000, RATE))
    so_far = turn[: int(2.1 * RATE) * 2]

    def spoken(system: str, rid: str, pcm: bytes, *, partial: bool = False) -> OmniRequest:
        messages = (
            Message("system", (TextPart(system),)),
            Message("user", (AudioPart(pcm, RATE, partial=partial),)),
        )
        return OmniRequest(
            rid,
            messages,
            modalities=("text", "audio"),
            audio=AudioOutputOptions(voice="Ethan"),
            sampling=SamplingOptions(max_tokens=6, temperature=0.0, seed=1),
        )

    def prefilled_then_spoken(prefill: OmniRequest, reply: OmniRequest) -> tuple[int, list[Any]]:
        pre = _run(pipeline, prefill)
        assert not [c for c in pre if isinstance(c, AudioChunk)] and not codes.take()  # the talker never ran
        assert len([c for c in pre if isinstance(c, TextDelta)]) <= 1
        before = kv.prefix_hit_tokens
        chunks = _run(pipeline, reply)
        return kv.prefix_hit_tokens - before, chunks

    reply = spoken("prefilled while spoken", "spoken", turn)
    prefill = dataclasses.replace(spoken("prefilled while spoken", "pre", so_far, partial=True), prefill_only=True)
    hits, warm = prefilled_then_spoken(prefill, reply)
    warm_codes = codes.take()
    (span,) = asyncio.run(pipeline._prompt(prefill)).embed_spans
    assert hits >= (span.offset + span.length) // block * block > 0  # the audio so far, but its last block
    cold = _run(uncached, dataclasses.replace(reply, request_id="spoken-cold"))
    assert len(warm_codes) >= 8 and warm_codes == codes.take()
    assert _pcm(warm) and _pcm(warm) == _pcm(cold)

    other = spoken("read while spoken", "spoken-after-text", turn)
    text = dataclasses.replace(
        spoken("read while spoken", "pre-text", so_far, partial=True), modalities=("text",), prefill_only=True
    )
    hits, _ = prefilled_then_spoken(text, other)
    assert hits == 0
