"""The checks a request passes before the engine queues it: its prompt, its embedding spans, its input stream,
and the per-sequence parameters of its ``n`` samples. Pure: nothing is queued or allocated here."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence as Seq
from typing import Any

from omni_gateway.engine.core.sequence import EmbedSpan
from omni_gateway.engine.errors import InvalidRequest
from omni_gateway.engine.sampling_params import SamplingParams


def check_prompt(token_ids: list[int], *, max_model_len: int, vocab_size: int, pooling: bool = False) -> None:
    """The prompt is non-empty, leaves room for one generated token (a pooling prompt the same room, though
    nothing is generated) and holds only ids of the vocabulary."""
    if not token_ids:
        raise InvalidRequest("prompt is empty; expected text or at least one token id")
    if pooling and len(token_ids) >= max_model_len:
        raise InvalidRequest(
            f"prompt has {len(token_ids)} tokens; at most {max_model_len - 1} fit (max_model_len={max_model_len})"
        )
    if len(token_ids) + 1 > max_model_len:
        raise InvalidRequest(
            f"prompt has {len(token_ids)} tokens; with one generated token that is "
            f"{len(token_ids) + 1}, more than max_model_len={max_model_len}"
        )
    bad = [t for t in token_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequest(
            f"prompt token ids must be integers in [0, {vocab_size}), got {bad[:5]!r}{' ...' if len(bad) > 5 else ''}"
        )


def check_spans(spans: Seq[EmbedSpan], num_tokens: int) -> None:
    """Every span lies inside the prompt, and its DeepStack rows (if any) are ``(layers, length, hidden)``."""
    for span in spans:
        if span.offset < 0 or span.length < 1 or span.offset + span.length > num_tokens:
            raise InvalidRequest(
                f"embed span [{span.offset}, {span.offset + span.length}) lies outside the "
                f"prompt of {num_tokens} tokens"
            )
        shape = tuple(getattr(span.deepstack, "shape", ()))
        if span.deepstack is not None and (len(shape) != 3 or shape[1] != span.length):
            raise InvalidRequest(
                f"embed span at {span.offset} has DeepStack rows of shape {shape}; "
                f"expected (layers, {span.length}, hidden)"
            )


def check_inputs(
    params: SamplingParams, input_stream: Any, num_tokens: int, tensor_parallel_size: int, num_layers: int | None = None
) -> None:
    """An input stream serves one sample from past the prompt, never a pooling request; hidden states come back
    from one rank only."""
    if input_stream is not None and (params.n != 1 or input_stream.start < num_tokens):
        raise InvalidRequest(
            f"an input stream needs n=1 and must start at or after the prompt's {num_tokens} tokens; "
            f"got n={params.n}, start={input_stream.start}"
        )
    if params.pooling is not None and input_stream is not None:
        raise InvalidRequest("a pooling request reads its prompt only; it takes no input stream")
    if params.return_hidden_states and tensor_parallel_size > 1:
        # Only rank 0 copies hidden states out, and the input embeddings it pairs them with are a
        # vocab-parallel lookup (an all-reduce the other ranks would never join).
        raise InvalidRequest(
            "return_hidden_states needs tensor_parallel_size 1 (a speaking model's thinker runs on one GPU); "
            f"this engine has tensor_parallel_size {tensor_parallel_size}"
        )
    if params.hidden_layer is not None and num_layers is not None and params.hidden_layer > num_layers:
        raise InvalidRequest(f"hidden_layer {params.hidden_layer} asked of a model with {num_layers} decoder layers")


def sample_params(params: SamplingParams) -> list[SamplingParams]:
    """One ``n=1`` parameter set per sample; sample ``i`` of a seeded request draws from ``seed + i``."""
    if params.n == 1:
        return [params]
    return [
        dataclasses.replace(params, n=1, seed=None if params.seed is None else params.seed + i) for i in range(params.n)
    ]
