"""Gateway configuration: one frozen value built by the CLI (or the embedding application)."""
from __future__ import annotations

from dataclasses import dataclass, field

from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.realtime.commands import SessionLimits


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # None: no authentication
    # One WebSocket message. OpenAI allows 15 MiB of audio per append (20 MiB as base64); 16 MiB matches
    # uvicorn's default and bounds what one frame can make us buffer.
    max_frame_bytes: int = 16 * 1024 * 1024
    # A client that stops reading: over either outbox bound (or with an event unsent for half the timeout)
    # its generation stops and producers wait; an event unsent for send_timeout_s closes the socket (1008).
    send_queue_max: int = 512  # server events waiting for a slow client
    send_queue_max_bytes: int = 16 * 1024 * 1024  # bytes of server events waiting for a slow client
    send_timeout_s: float = 30.0  # a client that reads nothing for this long is disconnected (1008)
    max_sessions: int = 256  # concurrent realtime sessions; beyond it new sockets close with 1013
    max_responses_per_session: int = 4  # concurrent responses of one session (out-of-band ones overlap)
    max_sessions_per_key: int = 128  # realtime sessions one key (or, without auth, one client address) holds
    max_requests_per_key: int = 64  # HTTP requests in flight per key; beyond it 429
    max_http_requests: int = 256  # HTTP requests in flight in all; beyond it 503 at once
    # Origins a browser may open /v1/realtime from, besides the server's own host ("*": any). Clients that
    # send no Origin (non-browsers) are always let through: Origin defends against cross-site hijacking only.
    allowed_origins: tuple[str, ...] = ()
    health_poll_s: float = 0.5  # how often open realtime sessions check that the backend still runs
    max_append_bytes: int = 15 * 1024 * 1024
    max_audio_buffer_bytes: int = 64 * 1024 * 1024  # 24 kHz pcm16: about 23 minutes of audio
    max_conversation_items: int = 4096
    max_conversation_audio_bytes: int = 128 * 1024 * 1024  # user and assistant audio kept for retrieve/truncate
    session_seconds: int = 3600  # GA's 60-minute session cap
    asr_timeout_s: float = 30.0  # a response waits at most this long for its turn's transcript
    max_image_bytes: int = 10 * 1024 * 1024  # one decoded input_image
    max_image_frames: int = 2  # image-only user items (webcam frames) sent to the model: the most recent ones
    max_conversation_image_bytes: int = 64 * 1024 * 1024  # input images kept in items; the oldest is dropped first
    http_limits: HttpLimits = field(default_factory=HttpLimits)  # bounds of the OpenAI HTTP API

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        for name in ("max_frame_bytes", "send_queue_max", "max_sessions", "max_responses_per_session",
                     "max_sessions_per_key", "send_queue_max_bytes",
                     "max_requests_per_key", "max_http_requests", "max_append_bytes",
                     "max_audio_buffer_bytes", "max_conversation_items", "max_conversation_audio_bytes",
                     "session_seconds", "max_image_bytes", "max_image_frames", "max_conversation_image_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.health_poll_s <= 0:
            raise ValueError(f"health_poll_s must be > 0, got {self.health_poll_s}")
        if isinstance(self.allowed_origins, str):
            raise TypeError(f"allowed_origins must be a tuple of origins, got the string {self.allowed_origins!r}")
        if self.send_timeout_s <= 0 or self.asr_timeout_s <= 0:
            raise ValueError(f"send_timeout_s and asr_timeout_s must be > 0, got {self.send_timeout_s} "
                             f"and {self.asr_timeout_s}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be None (no authentication) or a non-empty string")

    @property
    def session_limits(self) -> SessionLimits:
        return SessionLimits(max_append_bytes=self.max_append_bytes, max_buffer_bytes=self.max_audio_buffer_bytes,
                             max_items=self.max_conversation_items, session_seconds=self.session_seconds,
                             max_conversation_audio_bytes=self.max_conversation_audio_bytes,
                             max_image_bytes=self.max_image_bytes, max_image_frames=self.max_image_frames,
                             max_conversation_image_bytes=self.max_conversation_image_bytes,
                             max_responses=self.max_responses_per_session, asr_timeout_s=self.asr_timeout_s)
