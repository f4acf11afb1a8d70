"""Fixtures shared across packages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads: on a busy 2-core machine per-op thread wake-ups and
    spinning OpenMP workers make them many times slower (and starve an event loop relaying their output).
    Modules of tiny-model tests use it with ``pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def embedded_backend() -> Iterator[Any]:
    """The full model stack on the embedded defaults (SmolLM2, Whisper tiny.en, Piper, silero), loaded once
    for every end-to-end test: greedy, short answers, so what the answer says can be checked."""
    import onnxruntime
    from omni_gateway.engine.config import EngineConfig
    from omni_gateway.omni import load_backend
    from omni_gateway.omni.config import OmniConfig

    # Piper samples noise inside its ONNX graph from a generator each session seeds when it is built:
    # seeded here, every synthesis of the run is reproducible, so the spoken answer that the content
    # checks transcribe cannot come out misheard by chance (Whisper tiny once heard "France is
    # Paris" as "Francis Pears").
    onnxruntime.set_seed(0)
    config = OmniConfig(
        engine=EngineConfig(model="default", max_model_len=2048),
        temperature=0.0,
        max_tokens=48,
        system_prompt="You are a helpful assistant. Answer in one short sentence.",
    )
    pipeline = load_backend(config)
    yield pipeline
    pipeline.shutdown()


@pytest.fixture(scope="session")
def qwen3_omni_speech(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The tiny Qwen3-Omni checkpoint tuned for speech (tests/harness/tiny_qwen3_omni.py, ``speech=True``), saved
    once for the talker and code2wav tests: its folder and transformers' model, which tests only read."""
    from tests.harness.tiny_qwen3_omni import save_tiny_qwen3_omni

    directory = tmp_path_factory.mktemp("qwen3-omni-speech")
    return directory, save_tiny_qwen3_omni(directory, speech=True)


@pytest.fixture(scope="session")
def qwen3_omni_thinker(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The tiny Qwen3-Omni checkpoint without talker and code2wav (``enable_audio_output=False``), saved once for
    the thinker-side tests (towers, vision, video): its folder and transformers' model, which tests only read."""
    from tests.harness.tiny_qwen3_omni import save_tiny_qwen3_omni

    directory = tmp_path_factory.mktemp("qwen3-omni-thinker")
    return directory, save_tiny_qwen3_omni(directory, enable_audio_output=False)
