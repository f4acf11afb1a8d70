"""A full Qwen3-Omni checkpoint served by ``OmniPipeline.load`` in text mode (``speech_model=None``): the thinker
hears audio itself (no ASR) and sees images and video through its vision tower, its talker and code2wav are not
loaded (answers are text, spoken by a TTS voice where one is configured)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from omni_gateway.omni.loading import resolve_speech_model
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.protocol import (
    AudioPart,
    Error,
    ImagePart,
    Message,
    OmniRequest,
    SamplingOptions,
    TextDelta,
    TextPart,
    Usage,
    VideoPart,
)

from tests.harness.checkpoints import picture, png_bytes
from tests.harness.real_engine import checkpoint_config
from tests.harness.tiny_qwen3_omni import save_tiny_qwen3_omni
from tests.omni.test_pipeline_audio import MAX_TOKENS, RATE, clip_pcm16, direct

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniPipeline]:
    directory = tmp_path_factory.mktemp("qwen3omni")
    save_tiny_qwen3_omni(directory)
    config = checkpoint_config(directory, max_tokens=MAX_TOKENS, speech_model=None)
    assert resolve_speech_model(config) is None, "its talker is not served: it answers in text"
    pipe = OmniPipeline.load(config)
    yield pipe
    pipe.shutdown()


def _run(pipeline: OmniPipeline, *parts: Any) -> list[Any]:
    messages = (Message("user", parts),)
    request = OmniRequest("q", messages, sampling=SamplingOptions(max_tokens=MAX_TOKENS, temperature=0.0))

    async def go() -> list[Any]:
        return [c async for c in pipeline.generate(request)]

    return asyncio.run(go())


def test_the_thinker_hears_audio_without_asr(pipeline: OmniPipeline) -> None:
    assert pipeline.asr is None and pipeline.audio is not None and pipeline.speech is None
    assert pipeline.capabilities.hears_audio
    parts = (AudioPart(clip_pcm16(), RATE), TextPart("what is said"))
    chunks = _run(pipeline, *parts)
    assert not [c for c in chunks if isinstance(c, Error)], chunks
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == direct(pipeline, (Message("user", parts),))
    (usage,) = [c for c in chunks if isinstance(c, Usage)]
    assert usage.input_audio_tokens == 8  # 0.6 s: 60 mel frames -> 30 -> 15 -> 8 after the three convolutions


def test_an_image_is_seen_with_the_audio(pipeline: OmniPipeline) -> None:
    assert pipeline.vision is not None and pipeline.capabilities.input_modalities >= {"image", "audio"}
    parts = (TextPart("what is in"), ImagePart(png_bytes(picture(3, (64, 64)))), AudioPart(clip_pcm16(), RATE))
    chunks = _run(pipeline, *parts)
    assert not [c for c in chunks if isinstance(c, Error)], chunks
    text = "".join(c.text for c in chunks if isinstance(c, TextDelta))
    assert text == direct(pipeline, (Message("user", parts),), vision=pipeline.vision)
    (usage,) = [c for c in chunks if isinstance(c, Usage)]
    assert usage.input_audio_tokens == 8


def test_a_video_is_seen(pipeline: OmniPipeline) -> None:
    assert pipeline.capabilities.input_modalities >= {"image", "video", "audio"}
    parts = (TextPart("what happens"), VideoPart(b"", frames=tuple(png_bytes(picture(i, (64, 64))) for i in range(3))))
    chunks = _run(pipeline, *parts)
    assert not [c for c in chunks if isinstance(c, Error)], chunks
    text = "".join(c.text for c in chunks if isinstance(c, TextDelta))
    assert text == direct(pipeline, (Message("user", parts),), vision=pipeline.vision)
