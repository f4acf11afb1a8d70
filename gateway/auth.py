"""API-key checks shared by the HTTP routes and the realtime WebSocket handshake."""

from __future__ import annotations

import hmac


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, ``None`` for any other shape."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def key_matches(presented: str | None, api_key: str) -> bool:
    """Constant-time comparison, so response timing says nothing about how much of a guess was right."""
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode(), api_key.encode())
