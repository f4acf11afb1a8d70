"""The event loop under a burst of spoken audio: N realtime sessions whose replies land at the same instant.

    python -m benchmarks.audio_burst [--sessions 32] [--seconds 20] [--out FILE]

A TTS batch that finishes hands each of its streams seconds of audio at once. Here every session's reply
is one clause of ``--seconds`` of the embedded Piper voice's speech (synthesized once, then looped), and
all of them land together, through the real ``TtsHead.stream`` and the real realtime gateway (no models
in the timed part). The clients run in a child process; one more session sends a conversation item every
20 ms and times its round trip, as a session waiting on its own events would. Reported, per run: the
longest stall of a 10 ms timer on the server's event loop, the probe's worst round trip, and the loop
thread's CPU time per audio delta. Two runs in one command: WebSocket compression off (the default) and
on (``--ws-compression``, the default before), with the ratio of their loop time per delta, and what share
of its bytes deflate keeps of the reply's audio deltas (their base64, 100 ms a message, one compressor
across messages as permessage-deflate keeps its context).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import threading
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from benchmarks.lib.common import ResultLog, add_out_argument, percentile

PROBE_EVERY_S = 0.02


class LandingSynthesizer:
    """Every clause is the same ``audio``, returned to all callers at once: at ``land_at`` (a monotonic
    time), once ``land`` has set it."""

    voices = ("joe",)

    def __init__(self, audio: np.ndarray, sample_rate: int) -> None:
        self.audio, self.sample_rate = audio, sample_rate
        self.land_at = float("inf")
        self._set = threading.Event()

    def land(self, delay_s: float) -> None:
        self.land_at = time.monotonic() + delay_s
        self._set.set()

    def synthesize(self, text: str, *, speed: float = 1.0, voice: str | None = None, cancel: Any = None) -> Any:
        self._set.wait()
        time.sleep(max(0.0, self.land_at - time.monotonic()))
        return self.audio


def burst_backend(
    audio: np.ndarray, rate: int, sessions: int, lags: list[tuple[float, float, float]]
) -> tuple[Any, LandingSynthesizer]:
    """The test suite's fake backend, its spoken replies rendered by a TtsHead over ``LandingSynthesizer``;
    the first reply starts a timer task on the server's loop that appends (time, lag, loop CPU) to ``lags``."""
    from omni_gateway.omni.heads.tts.head import TtsHead
    from omni_gateway.omni.protocol import Done, OmniRequest, OutputChunk

    from tests.harness.fake_backend import FakeBackend

    synthesizer = LandingSynthesizer(audio, rate)
    head = TtsHead(synthesizer)

    async def timer() -> None:
        while True:
            started = time.monotonic()
            await asyncio.sleep(0.01)
            now = time.monotonic()
            lags.append((now, now - started - 0.01, time.thread_time()))

    class Burst(FakeBackend):
        monitor: asyncio.Task[None] | None = None

        def generate(self, request: OmniRequest) -> AsyncIterator[OutputChunk]:
            self.requests.append(request)
            if self.monitor is None:
                self.monitor = asyncio.get_running_loop().create_task(timer())
            if len(self.requests) == sessions:
                synthesizer.land(0.5)  # all asked: every clause lands together
            return self._spoken(request)

        async def _spoken(self, request: OmniRequest) -> AsyncIterator[OutputChunk]:
            async def text() -> AsyncIterator[str]:
                yield "Answer."  # one word: one clause, the whole of ``audio``

            async for chunk in head.stream(text(), request.audio):
                yield chunk
            yield Done("stop")

    return Burst(), synthesizer


async def _session(url: str, go: asyncio.Event) -> int:
    from websockets.asyncio.client import connect

    async with connect(url, max_size=None) as ws:
        await ws.recv()
        update = {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"]}}
        await ws.send(json.dumps(update))
        while json.loads(await ws.recv())["type"] != "session.updated":
            pass
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Talk to me."}]}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await go.wait()
        await ws.send(json.dumps({"type": "response.create"}))
        deltas = 0
        while (event := json.loads(await ws.recv()))["type"] != "response.done":
            deltas += event["type"] == "response.output_audio.delta"
        return deltas


async def _probe(url: str, stop: asyncio.Event) -> list[float]:
    from websockets.asyncio.client import connect

    trips = []
    async with connect(url, max_size=None) as ws:
        await ws.recv()
        while not stop.is_set():
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "probe"}]}
            started = time.monotonic()
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            while json.loads(await ws.recv())["type"] != "conversation.item.added":
                pass
            trips.append(time.monotonic() - started)
            await asyncio.sleep(PROBE_EVERY_S)
    return trips


async def _clients(url: str, n: int) -> tuple[list[int], list[float]]:
    go, stop = asyncio.Event(), asyncio.Event()
    probe = asyncio.create_task(_probe(url, stop))
    sessions = [asyncio.create_task(_session(url, go)) for _ in range(n)]
    await asyncio.sleep(1.0)  # every session connected and set up
    go.set()
    deltas = await asyncio.gather(*sessions)
    stop.set()
    return list(deltas), await probe


def run_clients(url: str, n: int) -> tuple[list[int], list[float]]:
    return asyncio.run(_clients(url, n))


def one_run(audio: np.ndarray, rate: int, sessions: int, compression: bool) -> dict[str, Any]:
    from omni_gateway.gateway.config import GatewayConfig

    from tests.harness.live_server import serve

    lags: list[tuple[float, float, float]] = []
    backend, synthesizer = burst_backend(audio, rate, sessions, lags)
    with serve(backend, GatewayConfig(ws_compression=compression)) as port:
        context = multiprocessing.get_context("spawn")
        with context.Pool(1) as pool:
            deltas, trips = pool.apply(run_clients, (f"ws://127.0.0.1:{port}/v1/realtime?model=m", sessions))
    burst = [(t, lag, cpu) for t, lag, cpu in lags if t >= synthesizer.land_at]
    stalls = [lag for _, lag, _ in burst]
    loop_cpu_s = burst[-1][2] - burst[0][2]
    return {
        "compression": compression,
        "sessions": sessions,
        "audio_deltas": sum(deltas),
        "max_stall_ms": round(max(stalls) * 1000, 1),
        "p99_stall_ms": round(percentile(stalls, 0.99) * 1000, 1),
        "probe_max_ms": round(max(trips) * 1000, 1),
        "loop_us_per_delta": round(loop_cpu_s / sum(deltas) * 1e6, 1),
    }


def speech(seconds: float) -> tuple[np.ndarray, int]:
    """``seconds`` of the embedded Piper voice, one sentence looped: deflate costs on speech what it costs."""
    from omni_gateway.omni.heads.tts.backends import load_synthesizer

    voice = load_synthesizer("default")
    said = voice.synthesize("The quick brown fox jumps over the lazy dog, and then it runs far away.")
    return np.resize(said, int(seconds * voice.sample_rate)), voice.sample_rate


def deflated_share(audio: np.ndarray, rate: int) -> float:
    """Deflated bytes over plain bytes of ``audio``'s 100 ms deltas as the socket sends them (24 kHz pcm16)."""
    from omni_gateway.encoders.audio import float_to_pcm16_array, resample

    pcm = float_to_pcm16_array(resample(audio, rate, 24000)).tobytes()
    deflate = zlib.compressobj(wbits=-15)  # raw deflate, as RFC 7692 frames it
    plain = packed = 0
    for start in range(0, len(pcm), 4800):
        text = base64.b64encode(pcm[start : start + 4800])
        plain += len(text)
        packed += len(deflate.compress(text) + deflate.flush(zlib.Z_SYNC_FLUSH))
    return packed / plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0, help="audio per reply, landing at once")
    add_out_argument(parser, "audio_burst")
    args = parser.parse_args()
    audio, rate = speech(args.seconds)
    rows = []
    with ResultLog(args.out, "audio_burst", seconds=args.seconds) as log:
        for compression in (False, True):
            row = one_run(audio, rate, args.sessions, compression)
            rows.append(row)
            log.write("run_result", **row)
            print(
                f"compression {'on ' if compression else 'off'}: {row['audio_deltas']} deltas, loop "
                f"{row['loop_us_per_delta']} us a delta, stall max {row['max_stall_ms']} ms "
                f"(p99 {row['p99_stall_ms']}), probe round trip max {row['probe_max_ms']} ms",
                flush=True,
            )
        ratio = rows[1]["loop_us_per_delta"] / rows[0]["loop_us_per_delta"]
        share = deflated_share(audio, rate)
        log.write("ratio", compression_on_over_off=round(ratio, 2), deflated_share=round(share, 3))
        print(f"loop time per delta, compression on / off: {ratio:.2f}x; deflate keeps {share:.0%} of the bytes")


if __name__ == "__main__":
    main()
