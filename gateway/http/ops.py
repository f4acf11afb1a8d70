"""Model listing, health and Prometheus metrics."""

from __future__ import annotations

from omni_gateway.gateway.http.errors import ApiError
from omni_gateway.gateway.http.lora import model_cards
from omni_gateway.gateway.metrics import exposition
from omni_gateway.gateway.realtime.voice_capacity import VoiceCapacity
from omni_gateway.omni.protocol import OmniBackend
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


async def list_models(request: Request, backend: OmniBackend) -> Response:
    """The served model and the LoRA adapters over it (gateway.http.lora)."""
    return JSONResponse({"object": "list", "data": model_cards(backend)})


async def get_model(request: Request, backend: OmniBackend) -> Response:
    model = request.path_params["model"]
    card = next((c for c in model_cards(backend) if c["id"] == model), None)
    if card is None:
        raise ApiError(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")
    return JSONResponse(card)


async def health(request: Request, backend: OmniBackend) -> Response:
    """200 only while the backend says it can serve: a dead engine thread must not look healthy."""
    state = backend.health()
    return JSONResponse(
        {"status": "ok" if state.ok else "unhealthy", "detail": state.detail}, status_code=200 if state.ok else 503
    )


async def metrics(request: Request, backend: OmniBackend) -> Response:
    # The app's voice admission window (gateway.app puts it in app.state); an app built otherwise has none.
    capacity: VoiceCapacity | None = getattr(request.app.state, "voice_capacity", None)
    rtf_p90 = None if capacity is None else capacity.rtf_p90
    body = exposition(backend.metrics, lambda: backend.health().ok, rtf_p90)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
