"""The server's host cost of listening: N realtime sessions stream audio at real-time pace, server VAD on.

    python -m benchmarks.voice_ingest [--sessions 8 16 32] [--seconds 20] [--vad batched|inline] [--profile FILE]
        [--label TEXT] [--out FILE]

The server runs in a child process of its own (so its CPU time is its own), serving the test suite's fake
backend with the real silero VAD in place of the fake one; nothing else is heavy: no transcription, and
``create_response`` off, so the sessions only listen. Each session streams spoken questions (Piper) with
a second of silence after each, in 40 ms ``input_audio_buffer.append`` chunks, and the VAD cuts real turns.

Reported per N, over the streaming window after every session connected:

- ``cpu_per_audio_s``: the server process's CPU seconds (user + system, every thread) per second of audio
  received, summed over sessions: 1.0 would mean one core per session;
- ``loop_lag`` p50/p99: how late a 10 ms timer fires on the server's event loop, the delay any event waits;
- ``--vad batched`` (the server's default for server_vad: ``encoders.vad.VadBatcher``) or ``inline`` (one
  ONNX call per window per session on the event loop, as before the batcher), and the mean VAD batch;
- with ``--profile FILE``, the event loop's cProfile over the window (the server's main thread) goes to FILE
  and its top entries by own time are printed.

Results go to ``benchmarks/results/voice_ingest.jsonl`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

from benchmarks.lib.common import ResultLog, add_out_argument, percentile

RATE = 24000
CHUNK = RATE * 2 * 40 // 1000  # 40 ms of pcm16
QUESTIONS = ["What is the capital of France?", "How many legs does a spider have?", "Which animal says moo?"]
LAG_TICK_S = 0.01


# ---- the server child --------------------------------------------------------------------------------
class _RealVad:
    """The server's silero detector behind the protocol's ``VoiceActivityDetector`` (as ``omni.voice_activity``
    builds it for server_vad), judging inline or through ``batcher``."""

    def __init__(self, settings, batcher) -> None:  # type: ignore[no-untyped-def]
        from omni_gateway.encoders.vad import SileroVad

        self._vad = SileroVad(
            threshold=settings.threshold,
            prefix_padding_ms=settings.prefix_padding_ms,
            silence_duration_ms=settings.silence_duration_ms,
            batcher=batcher,
        )

    def listen(self, notify) -> None:  # type: ignore[no-untyped-def]
        self._vad.listen(notify)

    def feed(self, pcm16: bytes) -> list:  # type: ignore[type-arg]
        from omni_gateway.omni.protocol import VadEvent

        return [VadEvent(e.kind, e.audio_ms) for e in self._vad.feed(pcm16)]

    def reset(self) -> None:
        self._vad.reset()


async def _lag_probe(lags: list[float], measuring: threading.Event) -> None:
    while True:
        due = time.perf_counter() + LAG_TICK_S
        await asyncio.sleep(LAG_TICK_S)
        if measuring.is_set():
            lags.append(time.perf_counter() - due)


def serve_child(profile: str | None, vad: str) -> None:
    """Serve on a free port (printed), then obey stdin: ``mark`` starts the window, ``stop`` ends and reports."""
    import cProfile
    import pstats

    import uvicorn
    from omni_gateway.encoders.vad import VadBatcher
    from omni_gateway.gateway.app import create_app
    from omni_gateway.gateway.config import GatewayConfig

    from tests.harness.fake_backend import FakeBackend

    batcher = VadBatcher() if vad == "batched" else None

    class ListeningBackend(FakeBackend):
        def new_vad(self, settings):  # type: ignore[no-untyped-def]
            return _RealVad(settings, batcher)

    backend = ListeningBackend()
    config = GatewayConfig()
    app = create_app(backend, config)  # type: ignore[arg-type]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)  # clients may connect as soon as the port is printed, before uvicorn starts serving
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", ws_max_size=config.max_frame_bytes, lifespan="off")
    )
    lags: list[float] = []
    measuring = threading.Event()
    profiler = cProfile.Profile() if profile else None
    window: dict[str, float] = {}

    def cpu_s() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def control() -> None:
        for line in sys.stdin:
            if line.strip() == "mark":
                window.update(cpu=cpu_s(), wall=time.monotonic())
                measuring.set()
                if profiler is not None:
                    loop.call_soon_threadsafe(profiler.enable)
            elif line.strip() == "stop":
                if profiler is not None:
                    loop.call_soon_threadsafe(profiler.disable)
                window.update(cpu=cpu_s() - window["cpu"], wall=time.monotonic() - window["wall"])
                measuring.clear()
                server.should_exit = True
                return

    async def main() -> None:
        probe = asyncio.create_task(_lag_probe(lags, measuring))
        await server.serve(sockets=[sock])
        probe.cancel()

    loop = asyncio.new_event_loop()
    print(sock.getsockname()[1], flush=True)
    threading.Thread(target=control, daemon=True).start()
    loop.run_until_complete(main())
    if profiler is not None and profile:
        profiler.dump_stats(profile)
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    print(
        json.dumps(
            {
                "cpu_s": window.get("cpu"),
                "wall_s": window.get("wall"),
                "loop_lag_p50_ms": percentile([x * 1000 for x in lags], 0.5) if lags else None,
                "loop_lag_p99_ms": percentile([x * 1000 for x in lags], 0.99) if lags else None,
                "loop_lag_max_ms": max(lags) * 1000 if lags else None,
                "vad_batches": batcher.batches if batcher else None,
                "vad_windows": batcher.windows if batcher else None,
            }
        ),
        flush=True,
    )


# ---- the clients -------------------------------------------------------------------------------------
def spoken_messages(offset: int) -> list[str]:
    """One session's stream, as ready ``input_audio_buffer.append`` messages: the questions, each with 1 s
    of silence after it, rotated by ``offset`` so sessions do not speak in step."""
    from benchmarks.voice_sessions import speak_all

    if not _spoken_cache:
        _spoken_cache.update(speak_all(QUESTIONS))
    spoken = _spoken_cache
    pcm = b"".join(spoken[q] + bytes(CHUNK * 25) for q in QUESTIONS)
    shift = (offset * 7919 * CHUNK) % len(pcm)
    pcm = pcm[shift:] + pcm[:shift]
    return [
        json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[at : at + CHUNK]).decode()})
        for at in range(0, len(pcm) - CHUNK + 1, CHUNK)
    ]


_spoken_cache: dict[str, bytes] = {}


async def stream(url: str, messages: list[str], start: float, seconds: float, ready: asyncio.Barrier) -> int:
    """Stream ``messages`` (cycling) at real time from ``start`` for ``seconds``; returns the chunks sent."""
    import websockets

    async with websockets.connect(url, max_size=2**24) as ws:
        turn = {"type": "server_vad", "silence_duration_ms": 500, "create_response": False}
        update = {"type": "realtime", "audio": {"input": {"turn_detection": turn}}}
        await ws.send(json.dumps({"type": "session.update", "session": update}))

        async def drain() -> None:
            async for _ in ws:
                pass

        reader = asyncio.create_task(drain())
        await ready.wait()
        sent = 0
        while (due := start + sent * 0.04) < start + seconds:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            await ws.send(messages[sent % len(messages)])
            sent += 1
        reader.cancel()
        return sent


async def run_clients(port: int, sessions: int, seconds: float, child: subprocess.Popen[str]) -> int:
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    messages = [spoken_messages(i) for i in range(sessions)]
    ready = asyncio.Barrier(sessions + 1)
    start = time.monotonic() + 1.0
    tasks = [
        asyncio.create_task(stream(url, messages[i], start + i * 0.04 / sessions, seconds, ready))
        for i in range(sessions)
    ]
    # A client that fails to connect never reaches the barrier: wait for the barrier or the first failure.
    waiting = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait([waiting, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if waiting not in done:
        for task in tasks:
            task.cancel()
        for task in done:
            task.result()  # raises the client's error
        raise RuntimeError("a client ended before every session had connected")
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    assert child.stdin is not None
    child.stdin.write("mark\n")
    child.stdin.flush()
    sent = sum(await asyncio.gather(*tasks))
    child.stdin.write("stop\n")
    child.stdin.flush()
    return sent


def measure(sessions: int, seconds: float, profile: str | None, vad: str) -> dict:  # type: ignore[type-arg]
    cmd = [sys.executable, "-m", "benchmarks.voice_ingest", "--serve", "--vad", vad]
    cmd += ["--profile", profile] if profile else []
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    try:
        port = int(child.stdout.readline())
        sent = asyncio.run(run_clients(port, sessions, seconds, child))
        report = json.loads(child.stdout.readline())
    except BaseException:
        child.kill()
        raise
    finally:
        child.wait(timeout=60)
    audio_s = sent * 0.04
    return {
        "sessions": sessions,
        "audio_s": round(audio_s, 1),
        "window_s": round(report["wall_s"], 2),
        "server_cpu_s": round(report["cpu_s"], 2),
        "cpu_per_audio_s": round(report["cpu_s"] / audio_s, 4),
        "server_cores": round(report["cpu_s"] / report["wall_s"], 3),
        "loop_lag_p50_ms": round(report["loop_lag_p50_ms"], 2),
        "loop_lag_p99_ms": round(report["loop_lag_p99_ms"], 2),
        "loop_lag_max_ms": round(report["loop_lag_max_ms"], 2),
        "vad": vad,
        "mean_vad_batch": round(report["vad_windows"] / report["vad_batches"], 2) if report["vad_batches"] else None,
        "load_1min": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--seconds", type=float, default=20.0, help="streaming window per N")
    parser.add_argument("--profile", help="write the server event loop's cProfile to this file (per N: .N added)")
    parser.add_argument("--label", default="", help="a note stored with the results (the variant measured)")
    parser.add_argument(
        "--vad",
        choices=["batched", "inline"],
        default="batched",
        help="batched: the server's VadBatcher (one ONNX call per batch, on its thread); inline: one call per "
        "window per session, on the event loop",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    add_out_argument(parser, "voice_ingest")
    args = parser.parse_args()
    if args.serve:
        serve_child(args.profile, args.vad)
        return
    with ResultLog(args.out, "voice_ingest", seconds=args.seconds, vad=args.vad, label=args.label) as log:
        for n in args.sessions:
            load = os.getloadavg()[0]
            row = measure(n, args.seconds, f"{args.profile}.{n}" if args.profile else None, args.vad)
            row["load_before"] = load
            print(json.dumps(row), flush=True)
            log.write("sessions", **row)


if __name__ == "__main__":
    main()
