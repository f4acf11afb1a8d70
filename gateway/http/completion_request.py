"""POST /v1/completions body -> a validated ``CompletionCall``: one raw-prompt OmniRequest per prompt. Pure."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from omni_gateway.gateway.http.chat_request import HTTP_PRIORITY
from omni_gateway.gateway.http.errors import invalid
from omni_gateway.gateway.http.fields import get_bool, get_int, require_object
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.sampling import StreamOptions, check_model, parse_sampling, parse_stream
from omni_gateway.gateway.http.structured import parse_constraint
from omni_gateway.omni.protocol import Capabilities, Message, OmniRequest, TextPart

DEFAULT_MAX_TOKENS = 16  # the legacy completions API's default


@dataclass(frozen=True, slots=True)
class CompletionCall:
    id: str
    model: str
    prompts: tuple[str, ...]
    requests: tuple[OmniRequest, ...]  # one per prompt, each answering ``sampling.n`` choices
    stream: StreamOptions
    logprobs: int | None
    echo: bool


def parse_completion(
    raw: object, caps: Capabilities, limits: HttpLimits, adapters: Collection[str] = ()
) -> CompletionCall:
    body: dict[str, Any] = require_object(raw, "body")
    model = check_model(body, caps, adapters)
    prompts = _prompts(body.get("prompt"), limits)
    logprobs = get_int(body, "logprobs", lo=0, hi=limits.max_top_logprobs)
    echo = get_bool(body, "echo")
    if echo and logprobs is not None:
        raise invalid("'echo' together with 'logprobs' is not supported: prompt logprobs are not computed.", "echo")
    if body.get("suffix"):
        raise invalid(
            "'suffix' (fill-in-the-middle) is not supported by this server.", "suffix", "unsupported_parameter"
        )
    sampling = parse_sampling(body, limits, logprobs=logprobs)
    best_of = get_int(body, "best_of", lo=1, hi=limits.max_n)
    if best_of is not None and best_of != sampling.n:
        raise invalid("'best_of' other than 'n' is not supported by this server.", "best_of", "unsupported_parameter")
    sampling = replace(sampling, constraint=parse_constraint(body, response_format=False))
    if sampling.max_tokens is None:
        sampling = replace(sampling, max_tokens=DEFAULT_MAX_TOKENS)
    call_id = f"cmpl-{uuid.uuid4().hex}"
    requests = tuple(
        OmniRequest(
            request_id=f"{call_id}-{i}",
            messages=(Message("user", (TextPart(p),)),),
            sampling=sampling,
            raw_prompt=p,
            add_generation_prompt=False,
            priority=HTTP_PRIORITY,
            model=model,
        )
        for i, p in enumerate(prompts)
    )
    return CompletionCall(
        id=call_id,
        model=model,
        prompts=prompts,
        requests=requests,
        stream=parse_stream(body),
        logprobs=logprobs,
        echo=echo,
    )


def _prompts(value: object, limits: HttpLimits) -> tuple[str, ...]:
    if value is None:
        raise invalid("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter")
    prompts = [value] if isinstance(value, str) else value
    if not isinstance(prompts, list) or not prompts:
        raise invalid("'prompt' must be a string or a non-empty array of strings.", "prompt")
    if not all(isinstance(p, str) for p in prompts):
        raise invalid("'prompt' must be text: token-id prompts are not supported by this server.", "prompt")
    if len(prompts) > limits.max_prompts:
        raise invalid(
            f"'prompt' has {len(prompts)} entries; at most {limits.max_prompts} are accepted.",
            "prompt",
            "array_above_max_length",
        )
    if any(not p for p in prompts):
        raise invalid("'prompt' must not be empty.", "prompt")
    return tuple(prompts)
