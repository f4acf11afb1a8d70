"""LoRA adapters over the served model (vLLM's API): each one a model of its own name, listed by /v1/models
with the base model as its parent, chosen by ``model`` in every request, and loaded or unloaded at run time
by ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (behind the API key, as every route)."""

from __future__ import annotations

from typing import Any

from omni_gateway.gateway.http.endpoint import read_json
from omni_gateway.gateway.http.errors import ApiError, invalid
from omni_gateway.gateway.http.fields import get_str, require_object
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.omni.protocol import OmniBackend
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

_MAX_NAME = 256
_MAX_PATH = 4096


def served_adapters(backend: OmniBackend) -> dict[str, str]:
    """The adapters served now (name -> folder); empty on a server without LoRA."""
    if not backend.capabilities.serves_lora:
        return {}
    return dict(backend.lora_adapters())


def model_cards(backend: OmniBackend) -> list[dict[str, Any]]:
    """/v1/models entries: the base model, then every adapter with the base as its ``parent``."""
    base = backend.capabilities.model
    cards = [{"id": base, "object": "model", "created": 0, "owned_by": "omni", "root": base, "parent": None}]
    for name, path in served_adapters(backend).items():
        cards.append({"id": name, "object": "model", "created": 0, "owned_by": "omni", "root": path, "parent": base})
    return cards


async def load_lora_adapter(request: Request, backend: OmniBackend, limits: HttpLimits) -> Response:
    name, path = await _names(request, backend, limits, with_path=True)
    if name == backend.capabilities.model:
        raise invalid(f"The lora adapter name '{name}' is the base model's; choose another.", "lora_name")
    if name in served_adapters(backend):
        raise invalid(f"The lora adapter '{name}' has already been loaded.", "lora_name")
    assert path is not None
    await backend.load_lora_adapter(name, path)  # a refused adapter: InvalidInput, a 400 saying why
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: Request, backend: OmniBackend, limits: HttpLimits) -> Response:
    name, _ = await _names(request, backend, limits, with_path=False)
    if name not in served_adapters(backend):
        raise ApiError(404, f"The lora adapter '{name}' cannot be found.", param="lora_name", code="model_not_found")
    await backend.unload_lora_adapter(name)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


async def _names(
    request: Request, backend: OmniBackend, limits: HttpLimits, *, with_path: bool
) -> tuple[str, str | None]:
    if not backend.capabilities.serves_lora:
        raise invalid(
            "LoRA adapters are not enabled on this server (start it with --enable-lora).", code="lora_not_enabled"
        )
    body = require_object(await read_json(request, limits.max_body_bytes), "body")
    name = get_str(body, "lora_name", required=True, max_len=_MAX_NAME)
    path = get_str(body, "lora_path", required=True, max_len=_MAX_PATH) if with_path else None
    if not name.strip():
        raise invalid("'lora_name' must not be empty.", "lora_name")
    return name, path
