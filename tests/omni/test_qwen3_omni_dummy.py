"""``load_format="dummy"`` runs a speaking Qwen3-Omni from its config, tokenizer and preprocessor config alone: the
talker, code predictor, code2wav and audio tower get random weights of a real checkpoint's names and shapes, made
on the device, and the served pipeline answers a spoken turn end to end."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omni_gateway.encoders.audio_tower import load_audio_encoder
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.protocol import (
    AudioChunk,
    AudioOutputOptions,
    AudioPart,
    Done,
    Error,
    Message,
    OmniRequest,
    SamplingOptions,
    TextPart,
)
from omni_gateway.omni.qwen3_dummy import audio_fill, speech_checkpoint_shapes
from omni_gateway.omni.qwen3_speech import Qwen3SpokenModel
from omni_gateway.omni.qwen3_talker import Qwen3Talker
from safetensors import safe_open

from tests.harness.real_engine import checkpoint_config
from tests.harness.tiny_qwen3_omni import save_tiny_qwen3_omni
from tests.omni.test_pipeline_audio import RATE, clip_pcm16

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """A real tiny speaking checkpoint and a directory of its config, tokenizer and preprocessor config only."""
    real = tmp_path_factory.mktemp("qwen3omni-real")
    hf = save_tiny_qwen3_omni(real, speech=True)
    bare = tmp_path_factory.mktemp("qwen3omni-bare")
    for file in real.iterdir():
        if file.suffix != ".safetensors" and file.name != "model.safetensors.index.json":
            shutil.copy(file, bare / file.name)
    return real, bare, hf.config


def stored_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for file in directory.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            shapes |= {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}  # noqa: SIM118 (not a dict)
    return shapes


def test_the_listing_is_the_checkpoints_speech_side(dirs: tuple[Path, Path, Any]) -> None:
    real, _, config = dirs
    stored = {
        n: s for n, s in stored_shapes(real).items() if n.startswith(("talker.", "code2wav.", "thinker.audio_tower."))
    }
    assert speech_checkpoint_shapes(config) == stored


def test_dummy_talker_and_predictor_match_a_real_load(dirs: tuple[Path, Path, Any]) -> None:
    real, bare, _ = dirs
    loaded = Qwen3Talker.load(real)
    dummy = Qwen3Talker.load(bare, load_format="dummy", seed=3)
    assert dummy.loaded.weights == {} and dummy.loaded.source is not None
    want = {n: tuple(t.shape) for n, t in loaded.loaded.weights.items()}
    assert dummy.loaded.source.shapes == want
    for name in want:  # made in the engine's dtype, finite
        made = dummy.loaded.source.read(name)
        assert made.dtype == torch.float32 and torch.isfinite(made).all()
    for attr in ("embeddings", "heads"):
        got, expected = getattr(dummy.predictor, attr), getattr(loaded.predictor, attr)
        assert [t.shape for t in got] == [t.shape for t in expected]
    assert dummy.predictor.talker_embedding.shape == loaded.predictor.talker_embedding.shape
    assert len(dummy.predictor.layers) == len(loaded.predictor.layers)
    for attr in ("text_projection", "hidden_projection"):
        got, expected = getattr(dummy.inputs, attr), getattr(loaded.inputs, attr)
        assert [t.shape for t in (*got.fc1, *got.fc2)] == [t.shape for t in (*expected.fc1, *expected.fc2)]
    # The predictor's copy of the codec embedding is the decoder's own table.
    assert torch.equal(dummy.predictor.talker_embedding, dummy.loaded.source.read("model.embed_tokens.weight"))
    assert not torch.equal(
        dummy.predictor.heads[0], Qwen3Talker.load(bare, load_format="dummy", seed=4).predictor.heads[0]
    )


def test_dummy_audio_tower_matches_a_real_load(dirs: tuple[Path, Path, Any]) -> None:
    real, bare, _ = dirs
    loaded = load_audio_encoder(real)
    dummy = load_audio_encoder(bare, fill=audio_fill(0, "cpu", torch.float32))
    want = {n: (t.shape, t.dtype) for n, t in loaded.tower.state_dict().items()}
    assert {n: (t.shape, t.dtype) for n, t in dummy.tower.state_dict().items()} == want
    assert dummy.marker_embeds().shape == loaded.marker_embeds().shape
    features = dummy.encode(clip_pcm16_floats(), RATE)
    assert features.embeds.shape == loaded.encode(clip_pcm16_floats(), RATE).embeds.shape
    assert torch.isfinite(features.embeds).all()
    with pytest.raises(ModelLoadError):
        Qwen3Talker.load(bare)  # without dummy weights, the missing checkpoint is an error


def clip_pcm16_floats() -> np.ndarray:
    return np.frombuffer(clip_pcm16(), dtype=np.int16).astype(np.float32) / 32768.0


@pytest.fixture(scope="module")
def dummy_pipe(dirs: tuple[Path, Path, Any]) -> Iterator[OmniPipeline]:
    _, bare, _ = dirs
    config = checkpoint_config(bare, max_tokens=6, engine_args={"load_format": "dummy"})
    pipe = OmniPipeline.load(config)
    yield pipe
    pipe.shutdown()


def test_a_dummy_pipeline_speaks_a_heard_turn(dummy_pipe: OmniPipeline) -> None:
    pipe = dummy_pipe
    assert isinstance(pipe.speech, Qwen3SpokenModel) and pipe.audio is not None
    req = OmniRequest(
        "dummy-turn",
        (Message("user", (AudioPart(clip_pcm16(), RATE), TextPart("what is said"))),),
        modalities=("text", "audio"),
        audio=AudioOutputOptions(voice="ethan", sample_rate=RATE),
        sampling=SamplingOptions(max_tokens=6, temperature=0.0),
    )

    async def go() -> list[Any]:
        return [c async for c in pipe.generate(req)]

    chunks = asyncio.run(go())
    assert not [c for c in chunks if isinstance(c, Error)], chunks
    assert [type(c) for c in chunks if isinstance(c, Done)] == [Done]
    pcm = np.frombuffer(b"".join(c.pcm16 for c in chunks if isinstance(c, AudioChunk)), dtype=np.int16)
    assert len(pcm) > 0
