"""Gateway configuration: one frozen value built by the CLI (or the embedding application).

Limits live where they apply and are nested here once: ``session`` bounds one realtime session (the
sans-I/O session enforces it), ``http`` bounds the OpenAI HTTP API; the fields at the top level are the
server's own (network, admission, the WebSocket transport).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from omni_gateway.gateway.guard import host_name
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.realtime.commands import SessionLimits
from omni_gateway.gateway.realtime.voice_capacity import check_rtf_limit
from omni_gateway.gateway.realtime.webrtc_config import IceServer

# Binding to these serves every interface: the names clients use for the machine cannot be known here.
ALL_INTERFACES = ("0.0.0.0", "::", "")
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # None: no authentication
    # Origins a browser may open /v1/realtime from, besides the server's own host ("*": any). Clients that
    # send no Origin (non-browsers) are always let through: Origin defends against cross-site hijacking only.
    allowed_origins: tuple[str, ...] = ()
    # Host header values accepted besides the bound address and the loopback names ("*": any); they defend a
    # local server against DNS rebinding. Bound to every interface, any Host is accepted unless this names some.
    allowed_hosts: tuple[str, ...] = ()
    max_sessions: int = 256  # concurrent realtime sessions; beyond it new sockets are refused (503 / 1013)
    max_sessions_per_key: int = 128  # realtime sessions one key (or, without auth, one client address) holds
    # Realtime sessions on a server with speech stages (ASR, TTS, VAD), beyond which a new one is refused (503 /
    # 1013) so the admitted keep their latency. None: only max_sessions caps them, because the voice stages'
    # capacity depends on the models and the hardware; benchmarks/voice_sessions.py measures it.
    max_voice_sessions: int | None = None
    # What the voice stages hold, measured instead: while the p90 real-time factor of the latest spoken replies
    # (first to last audio delta over the audio's duration, across sessions) is at or above this, or too many of
    # them ran dry mid-playback, a new voice session is refused (503 / 1013) as past max_voice_sessions. 0: off.
    voice_admission_rtf: float = 0.9
    # One WebSocket message. OpenAI allows 15 MiB of audio per append (20 MiB as base64); 16 MiB matches
    # uvicorn's default and bounds what one frame can make us buffer.
    max_frame_bytes: int = 16 * 1024 * 1024
    # permessage-deflate, for clients that offer it. Off: nearly all a spoken reply sends is base64 audio,
    # which it shrinks by a third, for five times the event loop's work per 100 ms delta (benchmarks/
    # audio_burst.py); a client that offers it gets plain frames, as RFC 7692 allows.
    ws_compression: bool = False
    # A client that stops reading: over either outbox bound (or with an event unsent for half the timeout)
    # its generation stops and producers wait; an event unsent for send_timeout_s closes the socket (1008).
    send_queue_max: int = 512  # server events waiting for a slow client
    send_queue_max_bytes: int = 16 * 1024 * 1024  # bytes of server events waiting for a slow client
    send_timeout_s: float = 30.0  # a client that reads nothing for this long is disconnected (1008)
    # STUN/TURN servers WebRTC calls gather candidates from; none: host candidates only, nothing is contacted.
    ice_servers: tuple[IceServer, ...] = ()
    health_poll_s: float = 0.5  # how often open realtime sessions check that the backend still runs
    # /v1/responses kept in memory for previous_response_id and retrieval; past it the oldest is forgotten.
    max_stored_responses: int = 1000
    session: SessionLimits = field(default_factory=SessionLimits)  # bounds of one realtime session
    http: HttpLimits = field(default_factory=HttpLimits)  # bounds of the OpenAI HTTP API

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        for owner, prefix in ((self, ""), (self.session, "session."), (self.http, "http.")):
            for spec in fields(owner):
                value = getattr(owner, spec.name)
                if (
                    isinstance(value, (int, float))
                    and not isinstance(value, bool)
                    and spec.name not in ("port", "voice_admission_rtf")
                    and value <= 0
                ):
                    raise ValueError(f"{prefix}{spec.name} must be > 0, got {value}")
        check_rtf_limit(self.voice_admission_rtf, "voice_admission_rtf")
        for name in ("allowed_origins", "allowed_hosts"):
            if isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a tuple of strings, got the string {getattr(self, name)!r}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be None (no authentication) or a non-empty string")

    @property
    def serves_all_interfaces(self) -> bool:
        return self.host in ALL_INTERFACES

    def host_allow_list(self) -> tuple[str, ...] | None:
        """Host names (lower case, no port) the server answers to; ``None``: any.

        Any when ``allowed_hosts`` holds "*", or when bound to every interface and ``allowed_hosts`` names
        nothing (the machine's names and addresses cannot be guessed; the CLI warns).
        """
        if "*" in self.allowed_hosts or (self.serves_all_interfaces and not self.allowed_hosts):
            return None
        own = () if self.serves_all_interfaces else (self.host,)
        return tuple(dict.fromkeys(host_name(h) for h in (*LOOPBACK_HOSTS, *own, *self.allowed_hosts)))
