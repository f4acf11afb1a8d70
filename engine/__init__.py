"""Autoregressive paged-attention engine. ``from engine import LLM, SamplingParams``.

Heavy modules (torch, the model runner) load on first use, so the pure-logic parts
(scheduler, block pool, sequences) import without torch.
"""
from __future__ import annotations

import importlib
from typing import Any

from engine.config import EngineConfig
from engine.errors import EngineDead, EngineError, EngineOverloaded, InvalidRequest, ModelLoadError
from engine.sampling_params import SamplingParams

_LAZY = {
    "LLM": "engine.llm",
    "AsyncEngine": "engine.async_engine",
    "LLMEngine": "engine.llm_engine",
    "RequestOutput": "engine.outputs",
    "CompletionOutput": "engine.outputs",
    "StreamDelta": "engine.outputs",
    "EmbedSpan": "engine.sequence",
}

__all__ = ["EngineConfig", "SamplingParams", "EngineError", "InvalidRequest", "EngineOverloaded",
           "ModelLoadError", "EngineDead", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
