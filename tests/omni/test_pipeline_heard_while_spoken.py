"""A turn heard while it is spoken: the prefills of its readings leave its reply token for token what it is
without them, and the reply at the turn's end encodes and prefills only what the readings had not settled.

For a tiny random Qwen2.5-Omni and a tiny random Qwen3-Omni checkpoint, two thinkers are loaded from it: one
answers the whole turn cold, the other after the realtime session's prefills of the same turn, read as it grows
(Qwen2.5-Omni's groups are 1 s of audio here, Qwen3-Omni's attention windows 2 s).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omni_gateway.encoders.audio import float_to_pcm16, resample
from omni_gateway.engine.runner.mrope import mrope_positions
from omni_gateway.omni.audio_input import build_audio_prompt
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.protocol import AudioPart, Error, Message, OmniRequest, SamplingOptions, TextDelta, TextPart

from tests.harness.audio_checkpoints import save_tiny_qwen2_5_omni, tone
from tests.harness.real_engine import checkpoint_config
from tests.harness.tiny_qwen3_omni import save_tiny_qwen3_omni

pytestmark = pytest.mark.slow
RATE = 24000  # the realtime API's pcm16 rate
MAX_TOKENS = 8


@dataclass(frozen=True)
class Model:
    """A checkpoint and how its turn is read while spoken: each reading settles more of the turn."""

    family: str
    turn_s: float
    readings_s: tuple[float, ...]
    partial_s: float  # a reading of the turn's start, settled in part


MODELS = {
    "qwen2_5_omni": Model("qwen2_5_omni", 3.6, (1.2, 2.1, 3.1), 2.1),
    "qwen3_omni": Model("qwen3_omni", 5.6, (2.3, 3.1, 4.4), 4.4),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: pytest.FixtureRequest) -> Model:
    return MODELS[request.param]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, model: Model) -> Path:
    directory = tmp_path_factory.mktemp(model.family)
    if model.family == "qwen3_omni":
        save_tiny_qwen3_omni(directory, enable_audio_output=False)
    else:
        save_tiny_qwen2_5_omni(directory)
    return directory


def _load(directory: Path) -> OmniPipeline:
    config = checkpoint_config(directory, max_tokens=MAX_TOKENS, engine_args={"num_kv_blocks": 64})
    return OmniPipeline.load(config)


@pytest.fixture(scope="module")
def cold(checkpoint: Path) -> Iterator[OmniPipeline]:
    """Answers every turn without a prefill of it (each test's turns differ from the others')."""
    pipeline = _load(checkpoint)
    yield pipeline
    pipeline.shutdown()


@pytest.fixture
def streamed(checkpoint: Path) -> Iterator[OmniPipeline]:
    pipeline = _load(checkpoint)
    yield pipeline
    pipeline.shutdown()


def _turn(model: Model) -> bytes:
    """The turn, loudest in its first half second: the log-mel floor follows a clip's loudest frame, so every
    reading of the turn has the whole turn's floor (a later louder frame would change the settled start's mel
    and so its keys: encoded and prefilled again, never reused stale)."""
    samples = tone(7, model.turn_s)
    samples[:8000] *= 2
    return float_to_pcm16(resample(samples, 16000, RATE))


def _request(request_id: str, pcm: bytes, *, partial: bool = False, max_tokens: int = MAX_TOKENS) -> OmniRequest:
    messages = (
        Message("system", (TextPart("Be brief."),)),
        Message("user", (AudioPart(pcm, RATE, partial=partial),)),
    )
    sampling = SamplingOptions(max_tokens=max_tokens, temperature=0.0)
    return OmniRequest(request_id, messages, modalities=("text",), sampling=sampling)


def _answer(pipeline: OmniPipeline, request: OmniRequest) -> str:
    async def run() -> list[Any]:
        return [c async for c in pipeline.generate(request)]

    chunks = asyncio.run(run())
    assert not [c for c in chunks if isinstance(c, Error)], chunks
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


def test_the_reply_after_streamed_prefills_equals_the_reply_without_them(
    model: Model, cold: OmniPipeline, streamed: OmniPipeline
) -> None:
    assert streamed.capabilities.hears_while_spoken
    turn = _turn(model)
    expected = _answer(cold, _request("cold", turn))
    assert expected

    for i, seconds in enumerate(model.readings_s):  # what the session's Prefill tasks send while the user speaks
        _answer(streamed, _request(f"prefill{i}", turn[: int(seconds * RATE) * 2], partial=True, max_tokens=1))
    assert streamed.audio is not None
    encoded_before = streamed.audio.cache.misses
    hits_before = streamed.engine.stats()["prefix_cache_hit_tokens"]
    assert _answer(streamed, _request("reply", turn)) == expected
    # the whole turn encodes only what no reading settled: its last group, and the whole clip's own entry
    assert streamed.audio.cache.misses - encoded_before <= 2
    last = build_audio_prompt(
        _request("last", turn[: int(model.readings_s[-1] * RATE) * 2], partial=True), cold.engine.tokenizer, cold.audio
    )
    (span,) = last.embed_spans
    block = streamed.engine.config.block_size
    reused = streamed.engine.stats()["prefix_cache_hit_tokens"] - hits_before
    assert reused >= (span.offset + span.length) // block * block  # the last reading's audio, but its last block
    print(f"{model.family}: {reused} of the reply's prompt's positions came from the readings' prefills")


def test_the_prefilled_prompt_is_the_start_of_the_whole_turns_prompt(model: Model, cold: OmniPipeline) -> None:
    """Token ids, embeddings, per-token cache keys and M-RoPE positions of a settled reading are those of
    the whole turn's prompt up to the reading's last audio token: audio positions run like text."""
    turn = _turn(model)
    tokenizer, audio = cold.engine.tokenizer, cold.audio
    whole = build_audio_prompt(_request("whole", turn), tokenizer, audio)
    reading = build_audio_prompt(
        _request("part", turn[: int(model.partial_s * RATE) * 2], partial=True), tokenizer, audio
    )
    (part_span,), (whole_span,) = reading.embed_spans, whole.embed_spans
    end = part_span.offset + part_span.length
    assert part_span.offset == whole_span.offset and 0 < part_span.length < whole_span.length
    assert reading.token_ids[:end] == whole.token_ids[:end]
    assert np.array_equal(part_span.embeds.numpy(), whole_span.embeds[: part_span.length].numpy())
    assert part_span.key == whole_span.key  # keyed per token, not by the clip
    assert part_span.position_keys and part_span.position_keys == whole_span.position_keys[: part_span.length]
    assert (mrope_positions(reading.embed_spans, 0, end) == mrope_positions(whole.embed_spans, 0, end)).all()
