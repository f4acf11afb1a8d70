"""RSS of a live ``omni serve`` under a mixed hostile/normal cycle, repeated: a leak, or the allocator?

It starts ``omni serve`` on a free loopback port and repeats one cycle until ``--cycles`` or
``--duration`` runs out: an HTTP chat, an HTTP stream dropped after its first chunk, bad media and bad
bodies over HTTP, a realtime text turn with hostile events in between (bad JSON, unknown types, a
256-KiB invalid value, bad base64, an undecodable image), every ``--audio-every`` cycles a spoken turn
(ASR in, TTS out), a realtime response abandoned by closing the socket, and a frame over the size limit.
After each cycle it records the server's RSS. Drift is the slope of a least-squares line over the
cycles after ``--warmup``, per 1,000 cycles. At the end it asks the server to ``malloc_trim(0)``: RSS
that goes away then was free memory glibc kept, not a leak. ``--tracemalloc`` also reports the Python
allocations that grew between the end of the warm-up and the end of the run.

    python -m benchmarks.soak_rss --model default --duration 540
    python -m benchmarks.soak_rss --model default --duration 540 --malloc-arena-max 2
    python -m benchmarks.soak_rss --model default --cycles 200 --tracemalloc

Raw results, appended to ``benchmarks/results/soak_rss.jsonl`` (``--out``): the run's ``summary`` record, and
a ``cycle`` record per cycle in its gzipped sibling.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from benchmarks.lib.common import ResultLog, add_out_argument

ROOT = Path(__file__).resolve().parents[1]
MAX_FRAME_BYTES = 16 * 1024 * 1024  # omni serve's default --max-frame-mib

# The server process: omni serve, plus signal handlers the soak uses to look inside it.
SERVER = r"""
import ctypes, json, os, signal, sys, tracemalloc
trace_out = os.environ.get("SOAK_TRACE_OUT")
if trace_out:
    tracemalloc.start(8)
libc = ctypes.CDLL("libc.so.6")
first = []

def trim(*_):
    libc.malloc_trim(0)

def snapshot(*_):
    if not tracemalloc.is_tracing():
        return
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    if not first:
        first.append(snap)
        return
    grown = snap.compare_to(first[0], "traceback")[:12]
    with open(trace_out, "w") as out:
        json.dump({"traced_mib": round(tracemalloc.get_traced_memory()[0] / 2**20, 1),
                   "grown": [{"kib": round(s.size_diff / 1024, 1), "count": s.count_diff,
                              "where": [f"{f.filename}:{f.lineno}" for f in s.traceback][-4:]} for s in grown]}, out)

signal.signal(signal.SIGUSR1, trim)
signal.signal(signal.SIGUSR2, snapshot)
from omni_gateway.gateway.cli import main
sys.exit(main(sys.argv[1:]))
"""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, port: int, trace_out: Path | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if args.malloc_arena_max is not None:
        env["MALLOC_ARENA_MAX"] = str(args.malloc_arena_max)
    if trace_out is not None:
        env["SOAK_TRACE_OUT"] = str(trace_out)
    cmd = [
        sys.executable,
        "-c",
        SERVER,
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        args.model,
        "--log-level",
        "critical",
        *args.server_arg,
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not listen within 600 s")


# ---- one cycle -----------------------------------------------------------------------------------


def tone_b64(seconds: float, rate: int = 24000) -> str:
    t = np.arange(int(seconds * rate)) / rate
    return base64.b64encode((8000 * np.sin(2 * np.pi * 220 * t)).astype("<i2").tobytes()).decode()


BAD_PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(200)).decode()
BAD_WAV = base64.b64encode(b"RIFF\x10\x00\x00\x00WAVEfmt " + bytes(64)).decode()
TONE = tone_b64(1.0)


async def http_steps(client: httpx.AsyncClient, cycle: int, outcome: dict[str, Any]) -> None:
    chat = {"model": "default", "max_tokens": 8, "messages": [{"role": "user", "content": f"Say hello ({cycle})."}]}
    outcome["http_chat"] = (await client.post("/v1/chat/completions", json=chat)).status_code
    async with client.stream("POST", "/v1/chat/completions", json={**chat, "stream": True, "max_tokens": 64}) as r:
        outcome["http_stream_dropped"] = r.status_code
        async for _ in r.aiter_bytes():
            break  # the client walks away mid-stream
    bad_image = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": BAD_PNG}}]
    outcome["http_bad_image"] = (
        await client.post("/v1/chat/completions", json={**chat, "messages": [{"role": "user", "content": bad_image}]})
    ).status_code
    bad_audio = [{"type": "input_audio", "input_audio": {"data": BAD_WAV, "format": "wav"}}]
    outcome["http_bad_audio"] = (
        await client.post("/v1/chat/completions", json={**chat, "messages": [{"role": "user", "content": bad_audio}]})
    ).status_code
    outcome["http_bad_json"] = (
        await client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    ).status_code
    outcome["http_surrogate"] = (
        await client.post(
            "/v1/chat/completions",
            content=json.dumps({**chat, "messages": [{"role": "user", "content": "\ud800"}]}).encode(),
            headers={"content-type": "application/json"},
        )
    ).status_code


async def until(ws: ClientConnection, kinds: str | tuple[str, ...], counts: Counter[str]) -> dict[str, Any]:
    """Events up to the first of type ``kinds``; error events are counted by code on the way."""
    while True:
        event = json.loads(await ws.recv())
        if event["type"] == "error":
            counts[f"error:{event['error'].get('code')}"] += 1
        if event["type"] in ((kinds,) if isinstance(kinds, str) else kinds):
            return event


async def realtime_turn(url: str, cycle: int, audio: bool, outcome: dict[str, Any]) -> None:
    counts: Counter[str] = Counter()
    async with connect(url, max_size=None) as ws:
        await until(ws, "session.created", counts)
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
                }
            )
        )
        await until(ws, "session.updated", counts)
        for hostile in (
            "{not json",
            json.dumps({"type": "no.such.event"}),
            json.dumps(
                {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["x" * 262144]}}
            ),
            json.dumps({"type": "input_audio_buffer.append", "audio": "%%%not base64"}),
        ):
            await ws.send(hostile)
            await until(ws, ("error", "session.updated"), counts)
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "a picture"},
                            {"type": "input_image", "image_url": BAD_PNG},
                        ],
                    },
                }
            )
        )
        image_item = (await until(ws, "conversation.item.done", counts))["item"]["id"]
        await ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
        await until(ws, "response.done", counts)  # fails on a model without vision, else the image is refused
        await ws.send(json.dumps({"type": "conversation.item.delete", "item_id": image_item}))
        await until(ws, "conversation.item.deleted", counts)
        await ws.send(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": f"Count to {cycle % 9}."}],
                    },
                }
            )
        )
        await ws.send(
            json.dumps({"type": "response.create", "response": {"output_modalities": ["text"], "max_output_tokens": 8}})
        )
        done = await until(ws, "response.done", counts)
        outcome["rt_text"] = done["response"]["status"]
        if audio:
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": TONE}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            await ws.send(
                json.dumps(
                    {"type": "response.create", "response": {"output_modalities": ["audio"], "max_output_tokens": 12}}
                )
            )
            done = await until(ws, "response.done", counts)
            outcome["rt_audio"] = done["response"]["status"]
    outcome["rt_errors"] = dict(counts)


async def realtime_abandoned(url: str, outcome: dict[str, Any]) -> None:
    async with connect(url) as ws:
        await until(ws, "session.created", Counter())
        await ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "response": {
                        "output_modalities": ["text"],
                        "instructions": "Tell a long story.",
                        "max_output_tokens": 64,
                    },
                }
            )
        )
        await until(ws, "response.created", Counter())
    outcome["rt_abandoned"] = "closed"


async def realtime_oversize(url: str, outcome: dict[str, Any]) -> None:
    try:
        async with connect(url, max_size=None) as ws:
            await until(ws, "session.created", Counter())
            await ws.send("x" * (MAX_FRAME_BYTES + 1))
            async with asyncio.timeout(30):
                while True:
                    await ws.recv()  # events already on their way (conversation.created), then the close
    except ConnectionClosed as closed:
        outcome["rt_oversize"] = closed.rcvd.code if closed.rcvd else "no close frame"
    except TimeoutError:
        outcome["rt_oversize"] = "not closed"


async def cycle_once(client: httpx.AsyncClient, url: str, cycle: int, audio: bool) -> dict[str, Any]:
    outcome: dict[str, Any] = {}
    steps = [
        http_steps(client, cycle, outcome),
        realtime_turn(url, cycle, audio, outcome),
        realtime_abandoned(url, outcome),
        realtime_oversize(url, outcome),
    ]
    for step in steps:
        try:
            await asyncio.wait_for(step, 120)
        except Exception as exc:  # recorded, and the soak goes on: a failure is a finding, not the end
            outcome.setdefault("exceptions", []).append(f"{type(exc).__name__}: {str(exc)[:200]}")
    return outcome


def unexpected(outcome: dict[str, Any]) -> list[str]:
    """What a healthy server never does: 5xx, a dropped step, a realtime turn that failed for no client fault."""
    found = [f"{k}={v}" for k, v in outcome.items() if k.startswith("http_") and v >= 500]
    found += outcome.get("exceptions", [])
    found += [f"{k}={outcome.get(k)}" for k in ("rt_text", "rt_audio") if k in outcome and outcome[k] == "failed"]
    if outcome.get("rt_oversize") not in (1009, None):
        found.append(f"rt_oversize={outcome.get('rt_oversize')}")
    found += [k for k in outcome.get("rt_errors", {}) if k in ("error:server_error", "error:internal_error")]
    return found


# ---- the run -------------------------------------------------------------------------------------


def drift_per_1000(rows: list[dict[str, Any]], warmup: int) -> float | None:
    points = [(r["cycle"], r["rss_mib"]) for r in rows if r["cycle"] >= warmup]
    if len(points) < 3:
        return None
    x, y = np.array(points, dtype=float).T
    return float(np.polyfit(x, y, 1)[0] * 1000)


async def soak(args: argparse.Namespace, port: int, pid: int, log: ResultLog) -> dict[str, Any]:
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    rows: list[dict[str, Any]] = []
    idle = rss_mib(pid)
    t0 = time.monotonic()
    print(f"{'cycle':>6} {'time s':>7} {'RSS MiB':>8} {'drift/1k':>9}  unexpected", flush=True)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
        cycle = 0
        while cycle < args.cycles and time.monotonic() - t0 < args.duration:
            outcome = await cycle_once(client, url, cycle, audio=args.audio_every > 0 and cycle % args.audio_every == 0)
            row = {
                "cycle": cycle,
                "t_s": round(time.monotonic() - t0, 2),
                "rss_mib": round(rss_mib(pid), 1),
                "unexpected": unexpected(outcome),
                "outcome": outcome,
            }
            rows.append(row)
            log.write("cycle", **row)
            if cycle + 1 == args.warmup and args.tracemalloc:
                os.kill(pid, signal.SIGUSR2)
            if cycle % args.print_every == 0:
                drift = drift_per_1000(rows, args.warmup)
                print(
                    f"{cycle:6} {row['t_s']:7.0f} {row['rss_mib']:8.0f} "
                    f"{'' if drift is None else f'{drift:+9.1f}':>9}  {row['unexpected'][:3]}",
                    flush=True,
                )
            cycle += 1
    await asyncio.sleep(2)
    end = rss_mib(pid)
    os.kill(pid, signal.SIGUSR1)  # malloc_trim(0) in the server
    await asyncio.sleep(2)
    trimmed = rss_mib(pid)
    trace = None
    if args.tracemalloc:
        os.kill(pid, signal.SIGUSR2)
        await asyncio.sleep(5)
        trace_file = Path(os.environ["SOAK_TRACE_FILE"])
        trace = json.loads(trace_file.read_text()) if trace_file.exists() else None
    after_warmup = [r["rss_mib"] for r in rows if r["cycle"] >= args.warmup]
    return {
        "model": args.model,
        "malloc_arena_max": args.malloc_arena_max,
        "cycles": len(rows),
        "duration_s": round(time.monotonic() - t0, 1),
        "warmup_cycles": args.warmup,
        "idle_rss_mib": round(idle),
        "rss_after_warmup_mib": round(after_warmup[0]) if after_warmup else None,
        "rss_end_mib": round(end),
        "rss_peak_mib": round(max(r["rss_mib"] for r in rows)) if rows else None,
        "rss_after_malloc_trim_mib": round(trimmed),
        "drift_mib_per_1000_cycles": None if (d := drift_per_1000(rows, args.warmup)) is None else round(d, 1),
        "cycles_with_unexpected": sum(1 for r in rows if r["unexpected"]),
        "unexpected_kinds": dict(Counter(u.split(":")[0] for r in rows for u in r["unexpected"])),
        "tracemalloc": trace,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help="omni serve --model (default: the embedded SmolLM2)")
    parser.add_argument("--cycles", type=int, default=100_000, help="stop after this many cycles")
    parser.add_argument("--duration", type=float, default=540.0, help="stop after this many seconds of cycles")
    parser.add_argument("--warmup", type=int, default=20, help="cycles left out of the drift fit")
    parser.add_argument("--audio-every", type=int, default=4, help="a spoken turn every N cycles (0: never)")
    parser.add_argument("--malloc-arena-max", type=int, default=None, help="MALLOC_ARENA_MAX for the server")
    parser.add_argument("--tracemalloc", action="store_true", help="trace Python allocations in the server (slower)")
    parser.add_argument("--server-arg", action="append", default=[], help="extra omni serve argument (repeatable)")
    parser.add_argument("--print-every", type=int, default=10)
    add_out_argument(parser, "soak_rss")
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        trace_file = Path(tmp) / "trace.json" if args.tracemalloc else None
        if trace_file is not None:
            os.environ["SOAK_TRACE_FILE"] = str(trace_file)
        print(f"starting omni serve --model {args.model} on port {port} ...", flush=True)
        proc = start_server(args, port, trace_file)
        try:
            time.sleep(2)  # let the just-started server settle before its idle RSS is read
            with ResultLog(args.out, "soak_rss") as log:
                summary = asyncio.run(soak(args, port, proc.pid, log))
                log.write("summary", **summary)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(json.dumps(summary, indent=2))
    return 0 if summary["cycles_with_unexpected"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
