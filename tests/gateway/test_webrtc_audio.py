"""The audio of a WebRTC call without a network: the resampling holds nothing back, and an idle track sends a
reply's first audio as it is pushed rather than at its next 20 ms tick."""

from __future__ import annotations

import asyncio
import time

import av
import numpy as np
from omni_gateway.gateway.realtime.webrtc_audio import FRAME_SAMPLES, RTC_RATE, HeardAudio, SpokenTrack

from tests.harness.fake_backend import tone


def decoded(samples: np.ndarray, rate: int = RTC_RATE) -> av.AudioFrame:
    """A frame as aiortc's Opus decoder hands it out: packed s16 stereo."""
    stereo = np.repeat(samples.astype(np.int16), 2).reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(stereo, format="s16", layout="stereo")
    frame.sample_rate = rate
    return frame


def test_each_decoded_frame_comes_out_at_once_at_24_khz_with_its_level_kept() -> None:
    heard = HeardAudio()
    t = np.arange(10 * FRAME_SAMPLES) / RTC_RATE
    sine = 20000 * np.sin(2 * np.pi * 440 * t)
    out = [np.frombuffer(heard.convert(decoded(sine[i : i + FRAME_SAMPLES])), "<i2") for i in range(0, t.size, 960)]
    assert [chunk.size for chunk in out] == [FRAME_SAMPLES // 2] * 10  # no frame held back, the first included
    steady = np.concatenate(out)[100:]
    assert 19600 <= np.abs(steady).max() <= 20400
    assert heard.convert(decoded(np.full(480, 1000), rate=24000)) == np.full(480, 1000, "<i2").tobytes()


def test_a_reply_is_queued_whole_as_it_is_pushed_and_its_end_is_flushed() -> None:
    track = SpokenTrack(lambda kind, response: None)
    track.push("resp_1", "item_1", tone(100))
    assert track.pending_s == 0.1  # every sample pushed is queued at once, at 48 kHz
    track.finish("item_1")
    assert 0.1 < track.pending_s < 0.102  # the filter's tail: its half-millisecond delay, then silence


def test_an_idle_track_sends_the_first_audio_when_it_is_pushed_not_at_the_next_tick() -> None:
    async def scenario() -> tuple[float, int]:
        track = SpokenTrack(lambda kind, response: None)
        await track.recv()
        await track.recv()  # the clock runs: silence every 20 ms
        asyncio.get_running_loop().call_later(0.002, track.push, "resp_1", "item_1", tone(100))
        started = time.monotonic()
        frame = await track.recv()
        return time.monotonic() - started, int(np.abs(frame.to_ndarray()).max())

    waited, peak = asyncio.run(scenario())
    assert peak > 10000  # the frame carries the reply
    assert waited < 0.015  # pushed 2 ms in: it did not wait for the tick at 20 ms
