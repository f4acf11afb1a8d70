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

import pytest
from omni_gateway.encoders.audio import float_to_pcm16, resample
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.frontend.async_engine import AsyncEngine
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.pipeline import OmniPipeline

from tests.harness.audio_checkpoints import save_tiny_qwen2_5_omni, tone
from tests.harness.live_server import audio_turn, serve

pytestmark = pytest.mark.slow
RATE = 24000  # the realtime API's pcm16 rate


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniPipeline]:
    directory = tmp_path_factory.mktemp("speaking-omni")
    save_tiny_qwen2_5_omni(directory, speaks=True)
    config = OmniConfig(
        engine=EngineConfig(model=str(directory), device="cpu", num_kv_blocks=96),
        asr=None,
        vad=False,  # tts left at its default: a speaking model loads none
        temperature=0.0,
        max_tokens=6,
    )
    pipe = OmniPipeline.load(config)  # warmed up: one short spoken turn ran before serving
    assert pipe.speech is not None
    # A random talker may never say its stop code: a short utterance keeps the test fast.
    pipe.speech.config = dataclasses.replace(pipe.speech.config, max_codes=30, temperature=0.0)
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
