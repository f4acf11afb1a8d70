"""Audio of a WebRTC call: the reply's PCM paced out as the call's outgoing track, and the caller's track as
the session's PCM.

aiortc encodes what ``SpokenTrack.recv`` returns to Opus and sends it as soon as it returns, so ``recv``
keeps real-time pace (20 ms frames at 48 kHz, silence when nothing is queued) and what it returned is what
was sent: the played-out position of each assistant item, which a barge-in truncates the item to. While the
track is idle (sending silence) the first audio of a reply goes out as soon as it is pushed rather than at the
next 20 ms tick, and the clock restarts from there.

The session speaks 24 kHz pcm16, Opus 48 kHz: a halfband FIR resamples by two on both sides, one filter per
item out (flushed when the item's audio is done) and one in. Its delay is fixed at half a millisecond and it
holds nothing back; soxr's streaming resamplers, even at LQ, returned nothing for a stream's first 20 ms frame
and then lagged by 1 to 20 ms, all of it added to the time to first audio.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from omni_gateway.gateway.realtime import audio as audio_fmt

RTC_RATE = 48000  # Opus's clock: aiortc's decoder hands out, and its encoder takes, 48 kHz
FRAME_SAMPLES = RTC_RATE // 50  # 20 ms, one Opus packet
# The halfband filter: flat (0.1 dB) to 10 kHz, -6 dB at 12 kHz, -45 dB from 14 kHz: past the speech a 24 kHz
# session carries, and what folds back in lands above the 8 kHz the speech models hear. 47 taps: 0.48 ms delay.
_TAPS = 47
_HALFBAND = np.sinc((np.arange(_TAPS) - (_TAPS - 1) / 2) / 2) * np.kaiser(_TAPS, 7.0)
_HALFBAND /= _HALFBAND.sum()
_TIME_BASE = fractions.Fraction(1, RTC_RATE)

# (kind, response_id) for output_audio_buffer.started / .stopped, told by the track as it plays
PlayoutListener = Callable[[str, str], None]


class _Halfband:
    """Streaming resampling by two through the halfband filter: ``down`` 48 -> 24 kHz, ``up`` 24 -> 48 kHz.
    Whatever a chunk's length, its output is returned at once; only the filter's 23 samples of history carry."""

    def __init__(self) -> None:
        self._history = np.zeros(_TAPS - 1)
        self._phase = 0  # input samples seen, modulo 2: which of them the next decimated sample starts at

    def down(self, samples: np.ndarray) -> np.ndarray:
        filtered = self._filter(samples.astype(np.float64))
        out = filtered[self._phase :: 2]
        self._phase = (self._phase + samples.size) % 2
        return _to_int16(out)

    def up(self, samples: np.ndarray) -> np.ndarray:
        stuffed = np.zeros(2 * samples.size)
        stuffed[::2] = samples
        return _to_int16(2 * self._filter(stuffed))

    def flush_up(self) -> np.ndarray:
        """What the filter still holds of the input (its delay), followed by silence."""
        return self.up(np.zeros((_TAPS + 1) // 4))

    def _filter(self, samples: np.ndarray) -> np.ndarray:
        joined = np.concatenate([self._history, samples])
        self._history = joined[samples.size :]
        filtered: np.ndarray = np.convolve(joined, _HALFBAND, "valid")
        return filtered


def _to_int16(samples: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.clip(np.rint(samples), -32768, 32767).astype(np.int16)
    return out


@dataclass(slots=True)
class _Item:
    """One assistant item's audio on its way out."""

    response_id: str
    resampler: _Halfband
    sent: int = 0  # samples at 48 kHz returned by recv: played out
    done: bool = False  # its audio is complete (the resampler is flushed)


@dataclass(slots=True)
class _Queue:
    chunks: deque[tuple[str, np.ndarray]] = field(default_factory=deque)  # (item_id, 48 kHz samples)
    offset: int = 0  # samples of the first chunk already returned
    samples: int = 0  # samples queued, offset excluded


class SpokenTrack(MediaStreamTrack):
    """The call's outgoing audio: what the session's audio deltas carried, at real-time pace."""

    kind = "audio"

    def __init__(self, playout: PlayoutListener) -> None:
        super().__init__()
        self._items: dict[str, _Item] = {}
        self._queue = _Queue()
        self._playing: str | None = None  # the response whose audio is being sent
        self._playout = playout
        self._start: float | None = None
        self._pts = 0
        self._wake: asyncio.Future[bool] | None = None  # what an idle recv waits on until the next tick

    # ---- what the session's audio does --------------------------------------------------------------
    def push(self, response_id: str, item_id: str, pcm24: bytes) -> None:
        item = self._items.get(item_id)
        if item is None:
            self._forget_played()
            item = self._items[item_id] = _Item(response_id, _Halfband())
        elif item.done:  # cut short by a clear: the rest of it is never played
            return
        samples = np.frombuffer(pcm24[: len(pcm24) - len(pcm24) % 2], dtype="<i2")
        self._enqueue(item_id, item.resampler.up(samples))

    def finish(self, item_id: str) -> None:
        """The item's audio is complete: what its resampler still holds goes out too."""
        item = self._items.get(item_id)
        if item is not None and not item.done:
            item.done = True
            self._enqueue(item_id, item.resampler.flush_up())

    def played_ms(self, item_id: str) -> int:
        """How much of the item was sent, in whole milliseconds."""
        item = self._items.get(item_id)
        return 0 if item is None else item.sent * 1000 // RTC_RATE

    def clear(self) -> tuple[str, str] | None:
        """Drop the queued audio; the (response_id, item_id) it cut short, None when nothing was queued."""
        if not self._queue.chunks:
            return None
        item_id = self._queue.chunks[0][0]
        self._queue = _Queue()
        self._playing = None
        for item in self._items.values():
            item.done = True  # nothing more of an interrupted item is played
        return self._items[item_id].response_id, item_id

    def knows(self, item_id: str) -> bool:
        return item_id in self._items

    @property
    def pending_s(self) -> float:
        return self._queue.samples / RTC_RATE

    def _forget_played(self) -> None:
        """Items whose audio is complete and sent out: a call of many replies keeps only those playing."""
        queued = {item_id for item_id, _ in self._queue.chunks}
        for item_id in [i for i, item in self._items.items() if item.done and i not in queued]:
            del self._items[item_id]

    def _enqueue(self, item_id: str, samples: np.ndarray) -> None:
        if samples.size:
            self._queue.chunks.append((item_id, samples.astype(np.int16, copy=False)))
            self._queue.samples += samples.size
            if self._wake is not None and not self._wake.done():
                self._wake.set_result(True)

    # ---- what aiortc's sender reads -----------------------------------------------------------------
    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:
            self._pts += FRAME_SAMPLES
            wait = self._start + self._pts / RTC_RATE - now
            if wait > 0 and self._queue.samples:
                await asyncio.sleep(wait)
            elif wait > 0 and await self._audio_within(wait):  # idle: audio goes out as it comes, not at the tick
                self._start = time.monotonic() - self._pts / RTC_RATE
            elif wait < -0.2:  # the loop was held up: do not burst the backlog out, resume from now
                self._start = now - self._pts / RTC_RATE
        frame = av.AudioFrame.from_ndarray(self._take().reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RTC_RATE
        frame.pts = self._pts
        frame.time_base = _TIME_BASE
        return frame

    async def _audio_within(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for audio to be queued; True when it was."""
        loop = asyncio.get_running_loop()
        wake = self._wake = loop.create_future()

        def tick() -> None:
            if not wake.done():
                wake.set_result(False)

        timer = loop.call_later(timeout, tick)
        try:
            return bool(await wake)
        finally:
            timer.cancel()
            self._wake = None

    def _take(self) -> np.ndarray:
        out = np.zeros(FRAME_SAMPLES, np.int16)
        filled = 0
        queue = self._queue
        while filled < FRAME_SAMPLES and queue.chunks:
            item_id, chunk = queue.chunks[0]
            n = min(FRAME_SAMPLES - filled, chunk.size - queue.offset)
            out[filled : filled + n] = chunk[queue.offset : queue.offset + n]
            filled += n
            queue.offset += n
            queue.samples -= n
            item = self._items[item_id]
            item.sent += n
            if self._playing != item.response_id:
                if self._playing is not None:
                    self._playout("stopped", self._playing)
                self._playing = item.response_id
                self._playout("started", item.response_id)
            if queue.offset == chunk.size:
                queue.chunks.popleft()
                queue.offset = 0
        if not queue.chunks and self._playing is not None:
            playing = self._playing
            if all(item.done for item in self._items.values() if item.response_id == playing):
                self._playing = None
                self._playout("stopped", playing)
        return out


class HeardAudio:
    """The caller's decoded frames (Opus: 48 kHz, mono or stereo) as the session's 24 kHz mono pcm16; a decoder
    that hands out another rate is resampled by soxr (at LQ, which holds audio back: Opus's 48 kHz never is)."""

    def __init__(self) -> None:
        self._rate = 0
        self._resample: Callable[[np.ndarray], np.ndarray] = _Halfband().down

    def convert(self, frame: av.AudioFrame) -> bytes:
        if frame.format.name != "s16":
            raise ValueError(f"expected decoded audio as packed s16, got {frame.format.name}")
        if frame.sample_rate != self._rate:
            self._rate = frame.sample_rate
            self._resample = _resampler(self._rate)
        channels = len(frame.layout.channels)
        samples = frame.to_ndarray().reshape(-1, channels)  # s16 is packed: channels interleaved
        mono = samples[:, 0] if channels == 1 else samples.mean(axis=1).astype(np.int16)
        pcm: bytes = self._resample(mono).astype("<i2").tobytes()
        return pcm


def _resampler(rate: int) -> Callable[[np.ndarray], np.ndarray]:
    if rate == RTC_RATE:
        return _Halfband().down
    if rate == audio_fmt.SAMPLE_RATE:
        return lambda samples: samples
    import soxr

    stream = soxr.ResampleStream(rate, audio_fmt.SAMPLE_RATE, 1, "int16", quality="LQ")
    return lambda samples: np.asarray(stream.resample_chunk(samples))
