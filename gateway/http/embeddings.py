"""POST /v1/embeddings: each input pooled into one vector by the served LLM (``OmniBackend.embed``).

``dimensions`` is accepted only where it equals the model's vector size: the models served here are not
trained to be truncated (Matryoshka), so a shorter vector would not mean what the caller expects.
"""

from __future__ import annotations

import base64
import struct
import uuid
from dataclasses import dataclass
from typing import Any

from omni_gateway.gateway.http.endpoint import read_json
from omni_gateway.gateway.http.errors import from_backend, invalid
from omni_gateway.gateway.http.fields import get_int, get_str, require_object
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.sampling import check_model
from omni_gateway.gateway.http.streaming import unless_disconnected
from omni_gateway.gateway.metrics import count_tokens
from omni_gateway.omni.protocol import Capabilities, EmbeddingRequest, Error, OmniBackend
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

API = "embeddings"
ENCODINGS = ("float", "base64")


@dataclass(frozen=True, slots=True)
class EmbeddingCall:
    request: EmbeddingRequest
    model: str
    encoding: str
    dimensions: int | None


def parse_embeddings(raw: object, caps: Capabilities, limits: HttpLimits) -> EmbeddingCall:
    body: dict[str, Any] = require_object(raw, "body")
    model = check_model(body, caps)
    inputs = _inputs(body.get("input"), limits.max_embedding_inputs)
    return EmbeddingCall(
        request=EmbeddingRequest(request_id=f"embd-{uuid.uuid4().hex}", inputs=inputs),
        model=model,
        encoding=get_str(body, "encoding_format", "float", choices=ENCODINGS),
        dimensions=get_int(body, "dimensions", lo=1),
    )


def _inputs(value: object, max_items: int) -> tuple[str | tuple[int, ...], ...]:
    """A string, a list of strings, a list of token ids, or a list of token-id lists."""
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(_is_token(t) for t in value):
        value = [value]  # one prompt given as token ids
    if not isinstance(value, list) or not value:
        raise invalid("'input' must be a string, an array of strings, or token ids (an array or arrays).", "input")
    if len(value) > max_items:
        raise invalid(f"'input' has {len(value)} items; at most {max_items} are accepted.", "input")
    out: list[str | tuple[int, ...]] = []
    for i, item in enumerate(value):
        if isinstance(item, str) and item:
            out.append(item)
        elif isinstance(item, list) and item and all(_is_token(t) for t in item):
            out.append(tuple(item))
        else:
            raise invalid(f"'input[{i}]' must be a non-empty string or a non-empty array of token ids.", f"input[{i}]")
    return tuple(out)


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def embeddings_body(call: EmbeddingCall, vectors: tuple[tuple[float, ...], ...], prompt_tokens: int) -> dict[str, Any]:
    size = len(vectors[0])
    if call.dimensions is not None and call.dimensions != size:
        raise invalid(
            f"model '{call.model}' makes {size}-dimensional embeddings and cannot shorten them; "
            f"'dimensions' must be {size} or left out, got {call.dimensions}.",
            "dimensions",
            "unsupported_value",
        )
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v, call.encoding)} for i, v in enumerate(vectors)]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return {"object": "list", "data": data, "model": call.model, "usage": usage}


def _encoded(vector: tuple[float, ...], encoding: str) -> list[float] | str:
    if encoding == "float":
        return list(vector)
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()  # float32, little-endian


async def embeddings(request: Request, backend: OmniBackend, limits: HttpLimits) -> Response:
    body = await read_json(request, limits.max_body_bytes)
    call = parse_embeddings(body, backend.capabilities, limits)
    result = await unless_disconnected(request, lambda: backend.embed(call.request))
    if isinstance(result, Error):
        raise from_backend(result)
    count_tokens(API, result.prompt_tokens, 0)
    return JSONResponse(embeddings_body(call, result.vectors, result.prompt_tokens))
