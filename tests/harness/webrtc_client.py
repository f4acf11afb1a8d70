"""A WebRTC caller built on aiortc, as a browser would place a call: an Opus microphone track that plays given
PCM at real-time pace (silence after it), the ``oai-events`` data channel, and the server's audio track
recorded frame by frame."""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from typing import Any

import av
import httpx
import numpy as np
import soxr
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

RATE = 48000
FRAME = RATE // 50


def host_candidates_available() -> bool:
    """aioice gathers no loopback candidates: without another address two local peers cannot connect."""
    from aioice.ice import get_host_addresses

    return bool(get_host_addresses(use_ipv4=True, use_ipv6=False))


class Microphone(MediaStreamTrack):  # type: ignore[misc]
    """Plays what ``say`` queued (24 kHz pcm16), 20 ms a frame at real-time pace, and silence in between."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queued = np.zeros(0, np.int16)
        self._start: float | None = None
        self._pts = 0

    def say(self, pcm24: bytes) -> None:
        samples = soxr.resample(np.frombuffer(pcm24, "<i2"), 24000, RATE).astype(np.int16)
        self._queued = np.concatenate([self._queued, samples])

    @property
    def speaking(self) -> bool:
        return self._queued.size > 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += FRAME
            await asyncio.sleep(max(0.0, self._start + self._pts / RATE - time.monotonic()))
        out = np.zeros(FRAME, np.int16)
        take = min(FRAME, self._queued.size)
        out[:take], self._queued = self._queued[:take], self._queued[take:]
        frame = av.AudioFrame.from_ndarray(out.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self._pts, fractions.Fraction(1, RATE)
        return frame


class Caller:
    """One call: ``place`` it against a server, then read ``events`` and ``heard`` (peak of each frame)."""

    def __init__(self, audio: bool = True) -> None:
        """``audio`` False: a data channel alone, no audio track either way."""
        self.peer = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.microphone = Microphone()
        if audio:
            self.peer.addTrack(self.microphone)
        self.channel = self.peer.createDataChannel("oai-events")
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.log: list[dict[str, Any]] = []  # every event received, in order
        self.heard: list[int] = []  # the peak amplitude of each 20 ms frame of the server's track
        self.heard_at: list[float] = []  # when each loud frame arrived
        self.call_id: str | None = None
        self._opened = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.channel.on("open", self._opened.set)
        self.channel.on("message", self._message)
        self.peer.on("track", self._track)

    def _message(self, text: str) -> None:
        event = json.loads(text)
        self.log.append(event)
        self.events.put_nowait(event)

    def _track(self, track: Any) -> None:
        async def record() -> None:
            while True:
                try:
                    frame = await track.recv()
                except MediaStreamError:
                    return
                peak = int(np.abs(frame.to_ndarray().astype(np.int32)).max())
                self.heard.append(peak)
                if peak > 1000:
                    self.heard_at.append(time.monotonic())

        self._tasks.append(asyncio.create_task(record()))

    async def offer(self) -> str:
        await self.peer.setLocalDescription(await self.peer.createOffer())
        sdp: str = self.peer.localDescription.sdp
        return sdp

    async def place(
        self, base_url: str, key: str | None = None, session: dict[str, Any] | None = None
    ) -> httpx.Response:
        """POST the offer (multipart when ``session`` is given); on 201 apply the answer and await the channel."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        sdp = await self.offer()
        async with httpx.AsyncClient(base_url=base_url, timeout=20) as http:
            if session is None:
                headers["Content-Type"] = "application/sdp"
                response = await http.post("/v1/realtime/calls", content=sdp, headers=headers)
            else:
                form = {"sdp": (None, sdp), "session": (None, json.dumps(session))}
                response = await http.post("/v1/realtime/calls", files=form, headers=headers)
        if response.status_code == 201:
            self.call_id = response.headers["location"].rsplit("/", 1)[1]
            await self.peer.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
            await asyncio.wait_for(self._opened.wait(), 20)
        return response

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    async def until(self, kind: str, timeout: float = 20) -> list[dict[str, Any]]:
        """Every event up to and including the first of type ``kind``."""
        seen: list[dict[str, Any]] = []
        while not seen or seen[-1]["type"] != kind:
            seen.append(await asyncio.wait_for(self.events.get(), timeout))
        return seen

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.peer.close()
