"""Autoregressive paged-attention engine. ``from omni_gateway.engine import LLM, SamplingParams``.

Heavy modules (torch, the model runner) load on first use, so the pure-logic parts
(scheduler, block pool, sequences) import without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.errors import EngineDead, EngineError, EngineOverloaded, InvalidRequest, ModelLoadError
from omni_gateway.engine.sampling_params import SamplingParams, StructuredOutputs

_LAZY = {
    "LLM": "omni_gateway.engine.frontend.llm",
    "AsyncEngine": "omni_gateway.engine.frontend.async_engine",
    "LLMEngine": "omni_gateway.engine.core.llm_engine",
    "RequestOutput": "omni_gateway.engine.outputs",
    "CompletionOutput": "omni_gateway.engine.outputs",
    "StreamDelta": "omni_gateway.engine.outputs",
    "EmbedSpan": "omni_gateway.engine.core.sequence",
}

__all__ = [
    "EngineConfig",
    "SamplingParams",
    "StructuredOutputs",
    "EngineError",
    "InvalidRequest",
    "EngineOverloaded",
    "ModelLoadError",
    "EngineDead",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'omni_gateway.engine' has no attribute {name!r}")
