"""Fields shared by /v1/chat/completions and /v1/completions: model, sampling knobs, streaming options."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.http.errors import ApiError, invalid
from omni_gateway.gateway.http.fields import get_bool, get_float, get_int, get_stop, get_str, require_object
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.omni.protocol import Capabilities, SamplingOptions


@dataclass(frozen=True, slots=True)
class StreamOptions:
    stream: bool
    include_usage: bool


def check_model(body: dict[str, Any], caps: Capabilities, adapters: Collection[str] = ()) -> str:
    """The requested model: the served one or a LoRA adapter over it (``adapters``), else OpenAI's 404."""
    model: str | None = get_str(body, "model", required=True)
    if model is None or (model != caps.model and model not in adapters):
        served = ", ".join(f"'{name}'" for name in (caps.model, *sorted(adapters)))
        raise ApiError(
            404,
            f"The model {shown(model)} does not exist; this server serves {served}.",
            param="model",
            code="model_not_found",
        )
    return model


def parse_stream(body: dict[str, Any]) -> StreamOptions:
    stream = get_bool(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return StreamOptions(stream, False)
    if not stream:
        raise invalid("'stream_options' is only allowed when 'stream' is true.", "stream_options")
    options = require_object(options, "stream_options")
    return StreamOptions(True, get_bool(options, "include_usage", param="stream_options.include_usage"))


def parse_sampling(body: dict[str, Any], limits: HttpLimits, *, logprobs: int | None) -> SamplingOptions:
    """The knobs both APIs share; ``logprobs`` is the top-logprob count the caller already parsed."""
    max_tokens = get_int(body, "max_tokens", lo=1)
    max_completion = get_int(body, "max_completion_tokens", lo=1)
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise invalid("'max_tokens' and 'max_completion_tokens' disagree; send one of them.", "max_tokens")
    if body.get("logit_bias"):
        raise invalid("'logit_bias' is not supported by this server.", "logit_bias", "unsupported_parameter")
    return SamplingOptions(
        max_tokens=max_completion if max_completion is not None else max_tokens,
        temperature=get_float(body, "temperature", lo=0.0, hi=2.0),
        top_p=get_float(body, "top_p", lo=0.0, hi=1.0),
        presence_penalty=get_float(body, "presence_penalty", lo=-2.0, hi=2.0),
        frequency_penalty=get_float(body, "frequency_penalty", lo=-2.0, hi=2.0),
        seed=get_int(body, "seed", lo=-(2**63), hi=2**64 - 1),
        stop=get_stop(body, max_items=limits.max_stop_sequences, max_len=limits.max_stop_chars),
        logprobs=logprobs,
        n=get_int(body, "n", 1, lo=1, hi=limits.max_n),
    )


def check_context(prompt_tokens: int, max_tokens: int | None, caps: Capabilities) -> None:
    """Refuse a prompt (plus requested completion) that cannot fit the model's context window."""
    limit = caps.max_context_tokens
    if limit <= 0:
        return
    wanted = prompt_tokens + (max_tokens or 1)
    if wanted > limit:
        detail = (
            f"{prompt_tokens} in the prompt, {max_tokens} in the completion"
            if max_tokens
            else f"{prompt_tokens} in the prompt"
        )
        raise invalid(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{wanted} tokens ({detail}). Please reduce the prompt or the completion length.",
            "messages",
            "context_length_exceeded",
        )
