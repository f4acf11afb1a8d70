"""What the engine returns to callers (vLLM's RequestOutput shape)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Logprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob) of the most likely alternatives


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | None while running
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    logprobs: list[Logprob] | None = None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """One increment of a streaming request (AsyncEngine.generate yields these)."""

    request_id: str
    text: str  # new text since the last delta (stop strings held back until resolved)
    token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    logprobs: tuple[Logprob, ...] = ()
    error: str | None = None
    index: int = 0  # which of the request's n completions this delta extends
    # With SamplingParams.return_hidden_states: float32 ``[rows, hidden]`` tensors on the engine's device
    # (on the host once they cross the engine core's process boundary) for the positions
    # computed since the last delta, the first at ``hidden_start`` (prompt positions, then each generated
    # token fed back; the last generated token is never fed, so it has none). ``input_embeds`` are the
    # token-table rows of those positions' ids.
    hidden_states: Any = None
    input_embeds: Any = None
    hidden_start: int = 0
    # A pooling request's vector (a float32 ``[hidden]`` tensor), on its one and final delta.
    pooled: Any = None
