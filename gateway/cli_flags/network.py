"""``omni serve``'s network flags: where the gateway listens, whom it lets in, and how many sessions it admits."""

from __future__ import annotations

import argparse
import contextlib

from omni_gateway.gateway.cli_flags.flag import Flag, _positive
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.realtime.voice_capacity import check_rtf_limit
from omni_gateway.gateway.realtime.webrtc_config import IceServer, parse_ice_server


def _names(value: str) -> list[str]:
    """One occurrence of a list flag: a name or a comma-separated list of them."""
    return [part.strip() for part in value.split(",") if part.strip()]


def _rtf_limit(value: str) -> float:
    """``--voice-admission-rtf``; argparse shows an ArgumentTypeError's message, a ValueError's it drops."""
    number: object = value
    with contextlib.suppress(ValueError):
        number = float(value)
    try:
        return check_rtf_limit(number)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _ice_server(value: str) -> list[IceServer]:
    """One ``--ice-server`` occurrence (``listing`` flags extend their list with what the type returns)."""
    try:
        return [parse_ice_server(value)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def network_flags() -> tuple[Flag, ...]:
    gw = GatewayConfig
    mib = 2**20
    return (
        Flag(
            "--host",
            gw,
            "host",
            "address to bind; 0.0.0.0 or :: serves every interface (default %(default)s)",
            "network",
        ),
        Flag("--port", gw, "port", "port to bind (default %(default)s)", "network", type=int),
        Flag(
            "--api-key",
            gw,
            "api_key",
            "require this key (Bearer header or openai-insecure-api-key subprotocol); default: no authentication",
            "network",
            to_field=lambda v: v or None,
        ),
        Flag(
            "--allowed-hosts",
            gw,
            "allowed_hosts",
            "Host header names accepted besides the bound address, "
            "localhost, 127.0.0.1 and [::1]; repeatable or comma-separated, '*' accepts any. Bound to 0.0.0.0 "
            "or :: without it, any Host is accepted",
            "network",
            type=_names,
            listing=True,
        ),
        Flag(
            "--allowed-origins",
            gw,
            "allowed_origins",
            "browser origins (e.g. https://app.example) that may "
            "open /v1/realtime besides this server's own; repeatable or comma-separated, '*' allows any "
            "(clients without Origin are always allowed)",
            "network",
            type=_names,
            listing=True,
        ),
        Flag(
            "--ice-server",
            gw,
            "ice_servers",
            "a STUN or TURN server WebRTC calls gather candidates from: stun:HOST:PORT or "
            "turn:USER:CREDENTIAL@HOST:PORT[?transport=udp|tcp]; repeatable (aiortc uses the first STUN and the "
            "first TURN server). Default: none, host candidates only and nothing outside is contacted. The UDP "
            "ports of a call cannot be restricted to a range (aiortc binds ephemeral ports): open the ephemeral "
            "range or relay calls through a TURN server",
            "network",
            type=_ice_server,
            listing=True,
        ),
        Flag(
            "--max-frame-mib",
            gw,
            "max_frame_bytes",
            "largest WebSocket message accepted, in MiB (default %(default)s)",
            "network",
            type=float,
            to_field=lambda v: int(v * mib),
            from_field=lambda v: v / mib,
        ),
        Flag(
            "--ws-compression",
            gw,
            "ws_compression",
            "accept WebSocket permessage-deflate from clients that offer it (audio deltas cost five "
            "times the event-loop time for a third fewer bytes)",
            "network",
            switch=True,
        ),
        Flag(
            "--max-sessions",
            gw,
            "max_sessions",
            "concurrent realtime sessions (default %(default)s)",
            "network",
            type=int,
        ),
        Flag(
            "--max-sessions-per-key",
            gw,
            "max_sessions_per_key",
            "realtime sessions one API key (or client address) may hold (default %(default)s)",
            "network",
            type=int,
        ),
        Flag(
            "--max-voice-sessions",
            gw,
            "max_voice_sessions",
            "concurrent realtime sessions the speech stages serve; past it new ones are refused "
            "(default: no cap beyond --max-sessions)",
            "network",
            type=int,
        ),
        Flag(
            "--voice-admission-rtf",
            gw,
            "voice_admission_rtf",
            "refuse new voice sessions while the p90 real-time factor of the latest spoken replies (first to last "
            "audio delta over the audio's duration, across sessions) is at or above this, or too many of them ran "
            "dry mid-playback; 0 turns it off (default %(default)s)",
            "network",
            type=_rtf_limit,
        ),
        Flag(
            "--max-stored-responses",
            gw,
            "max_stored_responses",
            "/v1/responses answers kept in memory for previous_response_id and GET; past it the oldest is "
            "forgotten (default %(default)s)",
            "network",
            type=_positive,
        ),
    )
