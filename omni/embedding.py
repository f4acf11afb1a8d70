"""Embeddings: each input is a pooling request to the LLM's engine (``engine.core.pooling``), all of a call's
inputs in flight together so the engine batches them; no token is generated and no KV outlives them."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from omni_gateway.engine.errors import EngineDead, EngineOverloaded, InvalidRequest
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.collaborators import Engine
from omni_gateway.omni.protocol import EmbeddingRequest, Embeddings, Error
from omni_gateway.omni.streams import refusal

_POOLING = SamplingParams(pooling="model")


async def embed(engine: Engine, request: EmbeddingRequest) -> Embeddings | Error:
    tasks = [
        asyncio.ensure_future(_one(engine, item, f"{request.request_id}-{i}", request.priority))
        for i, item in enumerate(request.inputs)
    ]
    try:
        results = await asyncio.gather(*tasks)
    except (InvalidRequest, EngineOverloaded, EngineDead) as exc:
        return refusal(exc, "input" if isinstance(exc, InvalidRequest) else None)
    finally:
        for task in tasks:  # one refused or the caller left: the others end too (closing aborts them)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return Embeddings(vectors=tuple(v for v, _ in results), prompt_tokens=sum(n for _, n in results))


async def _one(engine: Engine, item: str | tuple[int, ...], request_id: str, priority: int) -> tuple[Any, int]:
    prompt: str | list[int] = item if isinstance(item, str) else list(item)
    stream = engine.generate(prompt, _POOLING, request_id=request_id, priority=priority)
    async with contextlib.aclosing(stream) as deltas:  # type: ignore[type-var]  # an async generator
        async for delta in deltas:
            if delta.error is not None:
                raise EngineDead(delta.error)
            if delta.finished:
                if delta.pooled is None:
                    raise EngineDead(f"pooling request ended ({delta.finish_reason}) without its vector")
                return tuple(delta.pooled.tolist()), delta.num_prompt_tokens
    raise EngineDead("pooling request ended without a final delta")
