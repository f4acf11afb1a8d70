"""OpenAI-compatible HTTP API, mounted next to the realtime WebSocket route by ``gateway.app``."""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from omni.protocol import OmniBackend


def routes(backend: OmniBackend, config: Any) -> list[BaseRoute]:
    """Every HTTP route of the OpenAI API this server answers, bound to ``backend``."""

    async def list_models(request: Request) -> Response:
        caps = backend.capabilities
        return JSONResponse({"object": "list", "data": [
            {"id": caps.model, "object": "model", "created": 0, "owned_by": "omni"}]})

    return [Route("/v1/models", list_models, methods=["GET"])]
