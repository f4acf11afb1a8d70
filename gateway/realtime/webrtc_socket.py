"""A WebRTC call seen as the socket ``RealtimeConnection`` moves frames through.

The connection and its ``RealtimeSession`` are the WebSocket transport's own: this class only moves frames.
Client events come from the ``oai-events`` data channel and from WebSockets that joined the call
(``/v1/realtime?call_id=``); the caller's audio track comes in as ``input_audio_buffer.append`` events in
the session's input format. Server events go out on the data channel and to the joined WebSockets, except
the audio deltas, whose audio is the call's outgoing track instead (as OpenAI's WebRTC transport does).

What only WebRTC has, and OpenAI's WebRTC transport sends: ``output_audio_buffer.started`` / ``.stopped`` as
the track starts and ends playing a response, and ``output_audio_buffer.cleared`` when queued audio is
dropped. A barge-in (``input_audio_buffer.speech_started`` with ``interrupt_response``) or the client's
``output_audio_buffer.clear`` drops what is queued, and the item is truncated to what the track sent: the
call puts the ``conversation.item.truncate`` event a WebSocket client would send into the session itself.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
from typing import Any

from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.commands import new_id
from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.gateway.realtime.webrtc_audio import SpokenTrack
from starlette.websockets import WebSocketState

log = logging.getLogger(__name__)

_TYPE = re.compile(r'"type":"([a-z_.]+)"')
_AUDIO_DELTAS = ("response.output_audio.delta", "response.audio.delta")
_AUDIO_DONES = ("response.output_audio.done", "response.audio.done")
DATA_CHANNEL_HIGH_WATER = 1 << 20  # bytes the data channel may hold unsent before senders wait
JOINED_QUEUE_MAX = 1024  # events a joined WebSocket may fall behind before it is dropped

Message = dict[str, Any]


def event_type(text: str) -> str | None:
    """The ``type`` of a serialized server event (it comes first or right after ``event_id``)."""
    found = _TYPE.search(text, 0, 160)
    return found.group(1) if found else None


class CallSocket:
    """The WebSocket-shaped end of one call: ``receive``, ``send_text``, ``close`` and the two states."""

    def __init__(self, channel_expected: bool) -> None:
        self.application_state = self.client_state = WebSocketState.CONNECTED
        self.session: RealtimeSession | None = None  # set once the connection built it
        self.track = SpokenTrack(self._playout)
        # The call sends the track (the answer has it sending): audio deltas become its audio. Otherwise (an
        # offer without audio, or that only sends) they go out as events, as over a WebSocket.
        self.plays_audio = False
        self._incoming: asyncio.Queue[Message] = asyncio.Queue()
        self._channel: Any = None  # aiortc RTCDataChannel, once the caller opened it
        self._channel_open = asyncio.Event()
        if not channel_expected:  # the offer has no data channel: events only reach joined WebSockets
            self._channel_open.set()
        self._channel_drained = asyncio.Event()
        self._joined: list[asyncio.Queue[str | None]] = []
        self._pushed_ms: dict[str, float] = {}  # audio pushed per item, in ms (what the item holds)
        self._content: dict[str, int] = {}  # the content index of each item's audio

    # ---- what the call feeds in ---------------------------------------------------------------------
    def attach_channel(self, channel: Any) -> None:
        """The caller's ``oai-events`` channel: its messages are client events; events go out on it once open."""
        self._channel = channel
        channel.bufferedAmountLowThreshold = DATA_CHANNEL_HIGH_WATER // 2
        channel.on("message", self._channel_message)
        channel.on("bufferedamountlow", self._channel_drained.set)
        channel.on("close", self.hang_up)  # the caller closed its peer connection without hanging up
        if channel.readyState == "open":
            self._channel_open.set()
        else:
            channel.on("open", self._channel_open.set)

    def _channel_message(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            self._incoming.put_nowait({"type": "websocket.receive", "bytes": message})
        else:
            self.feed_text(message)

    def feed_text(self, text: str) -> None:
        """A client event from the data channel or a joined WebSocket."""
        if '"output_audio_buffer.clear"' in text and _is_clear(text):
            self._clear_playback()
            return
        self._incoming.put_nowait({"type": "websocket.receive", "text": text})

    def feed_audio(self, pcm24: bytes) -> None:
        """The caller's audio, as 24 kHz pcm16: appended to the input buffer in the session's input format."""
        fmt = self.session.settings.input_format if self.session is not None else "pcm16"
        wire = pcm24 if fmt == "pcm16" else audio_fmt.encode(pcm24, fmt)
        event = {"type": "input_audio_buffer.append", "audio": base64.b64encode(wire).decode("ascii")}
        self._incoming.put_nowait({"type": "websocket.receive", "text": json.dumps(event)})

    def hang_up(self) -> None:
        """End the call: the connection's reader sees a disconnect and tears the session down."""
        self._incoming.put_nowait({"type": "websocket.disconnect"})

    def fail(self, code: str, message: str) -> None:
        """End the call with an ``error`` event saying why (to whoever can still hear it)."""
        log.info("ending WebRTC call: %s", message)
        error = {"type": "server_error", "code": code, "message": message, "param": None, "event_id": None}
        self._broadcast(json.dumps({"event_id": new_id("event"), "type": "error", "error": error}))
        self.hang_up()

    # ---- joined WebSockets --------------------------------------------------------------------------
    def join(self) -> asyncio.Queue[str | None]:
        """A queue of every server event from now on (None: the call ended or this listener fell behind)."""
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        if self.application_state == WebSocketState.CONNECTED:
            self._joined.append(queue)
        else:
            queue.put_nowait(None)
        return queue

    def leave(self, queue: asyncio.Queue[str | None]) -> None:
        if queue in self._joined:
            self._joined.remove(queue)

    # ---- what RealtimeConnection calls --------------------------------------------------------------
    async def receive(self) -> Message:
        return await self._incoming.get()

    async def send_text(self, text: str) -> None:
        kind = event_type(text)
        if kind in _AUDIO_DELTAS and self.plays_audio:
            self._play(json.loads(text))
            return
        if kind in _AUDIO_DONES and self.plays_audio:
            self.track.finish(json.loads(text)["item_id"])
        await self._channel_open.wait()
        self._broadcast(text)
        if self._channel is not None and self._channel.bufferedAmount > DATA_CHANNEL_HIGH_WATER:
            self._channel_drained.clear()
            await self._channel_drained.wait()
        if kind == "input_audio_buffer.speech_started" and self._interrupts():
            self._clear_playback()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.application_state == WebSocketState.DISCONNECTED:
            return
        self.application_state = self.client_state = WebSocketState.DISCONNECTED
        for queue in self._joined:
            queue.put_nowait(None)
        self._joined.clear()
        self.track.stop()

    # ---- inside -------------------------------------------------------------------------------------
    def _broadcast(self, text: str) -> None:
        if self._channel is not None and self._channel.readyState == "open":
            self._channel.send(text)
        for queue in list(self._joined):
            if queue.qsize() >= JOINED_QUEUE_MAX:
                log.info("dropping a WebSocket joined to a call: %d events unsent", queue.qsize())
                self.leave(queue)
                queue.put_nowait(None)
            else:
                queue.put_nowait(text)

    def _play(self, event: dict[str, Any]) -> None:
        fmt = self.session.settings.output_format if self.session is not None else "pcm16"
        pcm = audio_fmt.decode(base64.b64decode(event["delta"]), fmt)
        item_id = event["item_id"]
        self.track.push(event["response_id"], item_id, pcm)
        if item_id not in self._pushed_ms:  # a new item: forget those the track forgot
            for gone in [i for i in self._pushed_ms if not self.track.knows(i)]:
                del self._pushed_ms[gone]
                self._content.pop(gone, None)
        self._pushed_ms[item_id] = self._pushed_ms.get(item_id, 0.0) + audio_fmt.duration_ms(pcm)
        self._content[item_id] = event.get("content_index", 0)

    def _interrupts(self) -> bool:
        turn = self.session.settings.turn_detection if self.session is not None else None
        return turn is not None and turn.interrupt_response

    def _clear_playback(self) -> None:
        """Drop the queued audio and truncate the item it belonged to at what the track sent of it."""
        cut = self.track.clear()
        if cut is None:
            return
        response_id, item_id = cut
        self._broadcast(
            json.dumps({"event_id": new_id("event"), "type": "output_audio_buffer.cleared", "response_id": response_id})
        )
        end_ms = min(self.track.played_ms(item_id), int(self._pushed_ms.get(item_id, 0.0)))
        truncate = {
            "type": "conversation.item.truncate",
            "item_id": item_id,
            "content_index": self._content.get(item_id, 0),
            "audio_end_ms": end_ms,
        }
        self._incoming.put_nowait({"type": "websocket.receive", "text": json.dumps(truncate)})

    def _playout(self, kind: str, response_id: str) -> None:
        self._broadcast(
            json.dumps({"event_id": new_id("event"), "type": f"output_audio_buffer.{kind}", "response_id": response_id})
        )


def _is_clear(text: str) -> bool:
    try:
        event = json.loads(text)
    except ValueError:
        return False
    return isinstance(event, dict) and event.get("type") == "output_audio_buffer.clear"
