"""API-key checks shared by the HTTP routes and the realtime WebSocket handshake, and the ephemeral client
secrets a browser uses instead of the API key for realtime connections."""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard


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


# ---- ephemeral client secrets -----------------------------------------------------------------------
CLIENT_SECRET_PREFIX = "ek_"
DEFAULT_TTL_S = 600  # OpenAI's default for expires_after
MIN_TTL_S, MAX_TTL_S = 10, 7200  # the range OpenAI accepts
# Minted keys held at once: each lives at most MAX_TTL_S, and is forgotten one lifetime after it expired.
MAX_LIVE_SECRETS = 10_000


@dataclass(frozen=True, slots=True)
class ClientSecret:
    value: str
    expires_at: int  # unix seconds
    session: dict[str, Any] | None  # the session configuration applied when a connection uses the key


def is_client_secret(token: str | None) -> TypeGuard[str]:
    return token is not None and token.startswith(CLIENT_SECRET_PREFIX)


class ClientSecrets:
    """The ephemeral keys minted by ``POST /v1/realtime/client_secrets``: each opens realtime connections
    (WebSocket or WebRTC) until it expires, and nothing else. Expired keys are kept until they would be
    dropped anyway, so that one presented late is told it expired rather than that it never existed."""

    def __init__(self, now: Callable[[], float] = time.time, max_live: int = MAX_LIVE_SECRETS) -> None:
        self._now = now
        self._max_live = max_live
        self._secrets: dict[str, ClientSecret] = {}

    def __len__(self) -> int:
        return len(self._secrets)

    def mint(self, ttl_s: int, session: dict[str, Any] | None) -> ClientSecret:
        if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
            raise ValueError(f"expires_after.seconds must be in {MIN_TTL_S}..{MAX_TTL_S}, got {ttl_s}")
        now = self._now()
        # An expired key is kept for one more lifetime, then forgotten (later it reads as unknown).
        for value in [v for v, s in self._secrets.items() if s.expires_at + MAX_TTL_S <= now]:
            del self._secrets[value]
        if len(self._secrets) >= self._max_live:
            raise OverflowError(f"{self._max_live} client secrets are held; try again once some expire")
        secret = ClientSecret(CLIENT_SECRET_PREFIX + secrets.token_urlsafe(24), int(now) + ttl_s, session)
        self._secrets[secret.value] = secret
        return secret

    def check(self, value: str) -> tuple[ClientSecret | None, str | None]:
        """The live secret ``value`` names, or None and why it is refused."""
        secret = self._secrets.get(value)
        if secret is None:
            return None, "Incorrect or unknown client secret; mint one with POST /v1/realtime/client_secrets."
        if self._now() >= secret.expires_at:
            return None, (
                f"The client secret expired at {secret.expires_at} (unix time); mint a new one with "
                "POST /v1/realtime/client_secrets."
            )
        return secret, None
