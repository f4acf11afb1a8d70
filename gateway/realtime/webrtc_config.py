"""The WebRTC transport's network settings: the STUN/TURN servers ICE may use (``--ice-server``).

By default a call gathers host candidates only: aiortc falls back to a public STUN server when it is given
no list at all, so an explicit empty list is what keeps the server from reaching outside unless told to.
aiortc uses one STUN and one TURN server (the first of each); aioice binds each candidate's UDP socket to an
ephemeral port the operating system picks, and offers no way to restrict it to a range: a firewall in front
of the server must let the ephemeral range through, or the calls must be relayed by a TURN server.

Importing this module does not import aiortc: the config and the CLI stay light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ICE_SCHEMES = ("stun", "turn", "turns")


@dataclass(frozen=True, slots=True)
class IceServer:
    url: str  # stun:host[:port] or turn[s]:host[:port][?transport=udp|tcp]
    username: str | None = None
    credential: str | None = None


def parse_ice_server(value: str) -> IceServer:
    """``--ice-server`` value: ``stun:host:port``, or ``turn:USER:CREDENTIAL@host:port?transport=udp``."""
    text = value.strip()
    scheme, colon, rest = text.partition(":")
    if not colon or scheme.lower() not in ICE_SCHEMES or not rest:
        raise ValueError(
            f"expected an ICE server URL starting with stun:, turn: or turns: "
            f"(e.g. turn:user:secret@turn.example.com:3478), got {value!r}"
        )
    username = credential = None
    if "@" in rest:
        user_info, _, rest = rest.rpartition("@")
        username, sep, credential = user_info.partition(":")
        if not username or not sep or not credential:
            raise ValueError(f"expected USER:CREDENTIAL before '@' in the ICE server {value!r}")
        if scheme.lower() == "stun":
            raise ValueError(f"a STUN server takes no credentials, got the ICE server {value!r}")
    if not rest.split("?", 1)[0].split(":", 1)[0]:
        raise ValueError(f"the ICE server {value!r} names no host")
    return IceServer(f"{scheme.lower()}:{rest}", username, credential)


def rtc_configuration(servers: tuple[IceServer, ...]) -> Any:
    """aiortc's ``RTCConfiguration`` for ``servers`` (empty: host candidates only)."""
    from aiortc import RTCConfiguration, RTCIceServer

    return RTCConfiguration(
        iceServers=[RTCIceServer(urls=s.url, username=s.username, credential=s.credential) for s in servers]
    )
