"""The HTTP side of WebRTC calls, as OpenAI documents it.

``POST /v1/realtime/calls`` takes the SDP offer as ``application/sdp``, or as ``multipart/form-data`` with
an ``sdp`` field and an optional ``session`` field (the JSON ``session.update`` takes), and answers 201 with
the SDP answer (``application/sdp``) and ``Location: /v1/realtime/calls/{call_id}``. A client secret's
session configuration applies first, the request's ``session`` over it. ``POST
/v1/realtime/calls/{call_id}/hangup`` ends a call.
"""

from __future__ import annotations

import json
from typing import Any

from omni_gateway.gateway.auth import ClientSecrets, is_client_secret
from omni_gateway.gateway.guard import CALL_HOLD, CALLS_PATH, SessionHold, presented_key
from omni_gateway.gateway.http.endpoint import endpoint, read_body
from omni_gateway.gateway.http.errors import ApiError, invalid
from omni_gateway.gateway.realtime.webrtc_calls import Calls
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

MAX_OFFER_BYTES = 256 * 1024  # an SDP offer is a few kilobytes


async def _offer(request: Request) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer and the ``session`` configuration sent with it."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind == "application/sdp":
        return (await read_body(request, MAX_OFFER_BYTES)).decode("utf-8", "replace"), None
    if kind != "multipart/form-data":
        raise ApiError(
            415,
            f"Expected the SDP offer as application/sdp or multipart/form-data (fields sdp and session), "
            f"got {kind[:80] or 'no content type'!r}.",
            code="unsupported_content_type",
        )
    async with request.form(max_files=0, max_fields=4, max_part_size=MAX_OFFER_BYTES) as form:
        sdp, session = form.get("sdp"), form.get("session")
    if not isinstance(sdp, str) or not sdp.strip():
        raise invalid(
            "The form has no 'sdp' field holding the SDP offer.", param="sdp", code="missing_required_parameter"
        )
    if session is None:
        return sdp, None
    try:
        config = json.loads(session) if isinstance(session, str) else None
    except ValueError:
        config = None
    if not isinstance(config, dict):
        raise invalid("The 'session' field must be a JSON object.", param="session", code="invalid_type")
    return sdp, config


def call_routes(calls: Calls, secrets: ClientSecrets) -> list[Route]:
    async def place(request: Request) -> Response:
        sdp, session = await _offer(request)
        configs: list[dict[str, Any]] = []
        token = presented_key(request.scope)
        if is_client_secret(token):
            secret, _ = secrets.check(token)  # the guard let it through: it is live
            if secret is not None and secret.session is not None:
                configs.append(secret.session)
        if session is not None:
            configs.append(session)
        # the guard counted the call as a realtime session: it stays counted while the call lives
        hold: SessionHold | None = request.scope.get(CALL_HOLD)
        call_id, answer = await calls.place(sdp, configs, on_end=None if hold is None else hold.release)
        if hold is not None:
            hold.kept = True
        location = f"{CALLS_PATH}/{call_id}"
        return Response(answer, status_code=201, media_type="application/sdp", headers={"Location": location})

    async def hang_up(request: Request) -> Response:
        call_id = request.path_params["call_id"]
        if not await calls.hang_up(call_id):
            raise ApiError(404, f"No live call with id {call_id[:60]!r}.", param="call_id", code="call_not_found")
        return Response(status_code=200)

    return [
        Route(CALLS_PATH, endpoint(CALLS_PATH, place), methods=["POST"]),
        Route(f"{CALLS_PATH}/{{call_id}}/hangup", endpoint(f"{CALLS_PATH}/hangup", hang_up), methods=["POST"]),
    ]
