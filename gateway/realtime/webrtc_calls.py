"""The live WebRTC calls: placing one from an SDP offer, hanging it up, and WebSockets joining it.

A call is an aiortc peer connection, a ``CallSocket`` and the ``RealtimeConnection`` that runs the session
over it, exactly as over a WebSocket. ICE is not trickled: aiortc gathers every candidate before the answer
is written, so the answer carries them all (host candidates, and the configured STUN/TURN servers' when
given). A call whose ICE fails, or that does not connect within ``ICE_CONNECT_TIMEOUT_S``, ends with an
``error`` event (``ice_failed``) to whoever can still hear it; an offer that cannot be answered is refused
with a 400 that says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.http.errors import ApiError, invalid
from omni_gateway.gateway.realtime.client_secrets import configure
from omni_gateway.gateway.realtime.commands import VadFactory, new_id
from omni_gateway.gateway.realtime.connection import RealtimeConnection
from omni_gateway.gateway.realtime.endpoint import watch_backend
from omni_gateway.gateway.realtime.voice_capacity import VoiceCapacity
from omni_gateway.gateway.realtime.webrtc_audio import HeardAudio
from omni_gateway.gateway.realtime.webrtc_config import rtc_configuration
from omni_gateway.gateway.realtime.webrtc_socket import CallSocket
from omni_gateway.omni.protocol import OmniBackend
from starlette.websockets import WebSocket, WebSocketDisconnect

log = logging.getLogger(__name__)

EVENTS_CHANNEL = "oai-events"
OPUS = "opus/48000"  # the audio codec calls speak (every browser offers it), as the offer's rtpmap names it
ICE_CONNECT_TIMEOUT_S = 30.0  # a browser behind a NAT nobody can cross gives up in about as long
HANGUP_WAIT_S = 5.0  # how long a hang-up waits for the call to be torn down before it answers
# The packet length the answer asks the caller to send. aiortc's receiver holds four packets of the caller's
# audio before decoding the first (a fixed jitter buffer with no setting): 80 ms of the turn's latency at the
# 20 ms packets browsers send by default, 40 ms at 10 ms, which Chromium sends when the answer names it. The
# price is twice the packets: some 16 kb/s more headers from each caller, and the receive path's per-packet work.
RECEIVE_PTIME_MS = 10


@dataclass(slots=True)
class Call:
    id: str
    peer: Any  # RTCPeerConnection
    socket: CallSocket
    connection: RealtimeConnection
    task: asyncio.Task[None] | None = None
    on_end: Callable[[], None] | None = None  # told once the call is torn down (the guard's count of it)
    helpers: list[asyncio.Task[None]] = field(default_factory=list)  # the caller's audio, the ICE watch


class Calls:
    """Every live call of this server, by id."""

    def __init__(
        self,
        backend: OmniBackend,
        config: GatewayConfig,
        vad_factory: VadFactory | None,
        capacity: VoiceCapacity | None = None,
    ) -> None:
        self.backend = backend
        self.config = config
        self.vad_factory = vad_factory
        self.capacity = capacity
        self._calls: dict[str, Call] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def get(self, call_id: str) -> Call | None:
        return self._calls.get(call_id)

    async def place(
        self, offer: str, session_configs: list[dict[str, Any]], on_end: Callable[[], None] | None = None
    ) -> tuple[str, str]:
        """Answer ``offer`` and start its session configured by ``session_configs``: (call id, SDP answer).
        ``on_end`` is called once the call placed is torn down (not when it could not be placed)."""
        if len(self._calls) >= self.config.max_sessions:
            raise ApiError(
                503,
                f"This server already serves {self.config.max_sessions} realtime sessions; try again later.",
                code="server_overloaded",
            )
        if "m=audio" not in offer and "m=application" not in offer:
            raise invalid("The SDP offer has neither an audio track nor a data channel.", param="sdp")
        if "m=audio" in offer and OPUS not in offer.lower():
            raise invalid("The SDP offer's audio has no Opus codec (rtpmap opus/48000/2).", param="sdp")
        peer = RTCPeerConnection(rtc_configuration(self.config.ice_servers))
        socket = CallSocket(channel_expected="m=application" in offer)
        connection = RealtimeConnection(
            socket,  # type: ignore[arg-type]  # the WebSocket's shape, as RealtimeConnection uses it
            self.backend,
            self.config,
            "ga",
            self.vad_factory,
            capacity=self.capacity,
        )
        socket.session = connection.session
        call = Call(new_id("rtc"), peer, socket, connection, on_end=on_end)
        try:
            refused = configure(connection.session, session_configs)
            if refused is not None:
                raise invalid(refused, param="session", code="invalid_value")
            answer = await self._answer(call, offer)
        except BaseException:
            await peer.close()
            raise
        self._calls[call.id] = call
        call.task = asyncio.create_task(self._run(call))
        return call.id, answer

    async def _answer(self, call: Call, offer: str) -> str:
        peer, socket = call.peer, call.socket

        @peer.on("datachannel")  # type: ignore[untyped-decorator]
        def on_channel(channel: Any) -> None:
            if channel.label == EVENTS_CHANNEL:
                socket.attach_channel(channel)

        @peer.on("track")  # type: ignore[untyped-decorator]
        def on_track(track: Any) -> None:
            if track.kind == "audio":
                call.helpers.append(asyncio.create_task(_hear(track, socket)))

        connected = asyncio.Event()

        @peer.on("connectionstatechange")  # type: ignore[untyped-decorator]
        def on_state() -> None:
            if peer.connectionState == "connected":
                connected.set()
            elif peer.connectionState == "failed":
                socket.fail("ice_failed", _ice_failed(self.config))

        try:
            await peer.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        except (ValueError, KeyError, IndexError) as exc:
            raise invalid(f"The SDP offer could not be read: {str(exc)[:200]}", param="sdp") from None
        audio = next((t for t in peer.getTransceivers() if t.kind == "audio"), None)
        if audio is not None:
            peer.addTrack(socket.track)
        await peer.setLocalDescription(await peer.createAnswer())
        socket.plays_audio = audio is not None and "send" in (audio.currentDirection or "")
        sdp = ask_ptime(peer.localDescription.sdp, RECEIVE_PTIME_MS)
        if "a=candidate:" not in sdp:
            raise ApiError(
                500,
                "No ICE candidate could be gathered: this server has no network address besides loopback and no "
                "reachable --ice-server.",
                code="ice_failed",
            )
        call.helpers.append(asyncio.create_task(_watch_connect(connected, socket, self.config)))
        return sdp

    async def _run(self, call: Call) -> None:
        watcher = asyncio.create_task(watch_backend(self.backend, call.connection, self.config.health_poll_s))
        try:
            await call.connection.run()
        finally:
            for task in (watcher, *call.helpers):
                task.cancel()
            await asyncio.gather(watcher, *call.helpers, return_exceptions=True)
            try:
                await call.socket.close()
                await call.peer.close()
            finally:
                self._calls.pop(call.id, None)
                if call.on_end is not None:
                    call.on_end()

    async def hang_up_all(self) -> None:
        """End every live call (the server is stopping): each is torn down as a hang-up would, so nothing it
        holds (its slot in the session counts, its backend requests) outlives the server."""
        await asyncio.gather(*(self.hang_up(call_id) for call_id in list(self._calls)))

    async def hang_up(self, call_id: str) -> bool:
        """End the call (False: no such call); returns once it is torn down, or after ``HANGUP_WAIT_S``."""
        call = self._calls.get(call_id)
        if call is None:
            return False
        call.socket.hang_up()
        if call.task is not None:
            await asyncio.wait({call.task}, timeout=HANGUP_WAIT_S)
        return True

    async def join(self, websocket: WebSocket, call_id: str) -> None:
        """A server-side WebSocket on the call: it hears the call's server events and may send client events."""
        call = self._calls.get(call_id)
        if call is None:
            await websocket.close(code=1008, reason=f"no live call {call_id[:60]}")
            return
        queue = call.socket.join()

        async def forward() -> None:
            while (text := await queue.get()) is not None:
                await websocket.send_text(text)

        writer = asyncio.create_task(forward())
        try:
            while not writer.done():
                receiving = asyncio.create_task(websocket.receive())
                await asyncio.wait({receiving, writer}, return_when=asyncio.FIRST_COMPLETED)
                if not receiving.done():
                    receiving.cancel()
                    break
                message = receiving.result()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("text") is not None:
                    call.socket.feed_text(message["text"])
        except (WebSocketDisconnect, RuntimeError):
            pass
        finally:
            call.socket.leave(queue)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            with contextlib.suppress(RuntimeError, WebSocketDisconnect, OSError):
                await websocket.close()


def ask_ptime(sdp: str, ms: int) -> str:
    """``sdp`` with ``a=ptime:{ms}`` closing its audio section (aiortc writes none and has no setting for it)."""
    lines = sdp.split("\r\n")
    start = next((i for i, line in enumerate(lines) if line.startswith("m=audio")), None)
    if start is None:
        return sdp
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("m=")), len(lines) - (lines[-1] == ""))
    return "\r\n".join([*lines[:end], f"a=ptime:{ms}", *lines[end:]])


async def _hear(track: Any, socket: CallSocket) -> None:
    """The caller's audio track into the session, frame by frame, until the track ends."""
    heard = HeardAudio()
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        socket.feed_audio(heard.convert(frame))


async def _watch_connect(connected: asyncio.Event, socket: CallSocket, config: GatewayConfig) -> None:
    try:
        await asyncio.wait_for(connected.wait(), ICE_CONNECT_TIMEOUT_S)
    except TimeoutError:
        socket.fail("ice_failed", f"ICE did not connect within {ICE_CONNECT_TIMEOUT_S:g} s. " + _ice_failed(config))


def _ice_failed(config: GatewayConfig) -> str:
    servers = ", ".join(s.url for s in config.ice_servers) or "none: host candidates only"
    return (
        "ICE found no working path between the caller and this server (ICE servers: "
        f"{servers}). A caller behind a NAT needs the server reachable on its host address, or a TURN "
        "server (--ice-server)."
    )
