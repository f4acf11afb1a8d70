"""Fixtures shared across packages."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def embedded_backend() -> Iterator[Any]:
    """The full model stack on the embedded defaults (SmolLM2, Whisper tiny.en, Piper, silero), loaded once
    for every end-to-end test: greedy, short answers, so what the answer says can be checked."""
    from engine.config import EngineConfig
    from omni import load_backend
    from omni.config import OmniConfig

    config = OmniConfig(engine=EngineConfig(model="default", max_model_len=2048), temperature=0.0, max_tokens=48,
                        system_prompt="You are a helpful assistant. Answer in one short sentence.")
    pipeline = load_backend(config)
    yield pipeline
    pipeline.shutdown()
