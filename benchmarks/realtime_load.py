"""Soak load on /v1/realtime: many concurrent sessions doing text turns, checked event by event.

Each session loops until the deadline: (optionally append and clear some audio,) add a user message,
``response.create``, and read until ``response.done``. A response counts as lost when its
``response.created`` has no ``response.done``, when deltas arrive for another response or after its done,
or when the concatenated deltas differ from the final text. Reports time to first delta p50/p99 and,
for a server it spawned (or --server-pid), RSS at start and end; the report is printed and appended to
``benchmarks/results/realtime_load.jsonl`` (``--out``). Exits 1 when a response was lost or a socket
closed early.

    python -m benchmarks.realtime_load --spawn-server tiny --sessions 32 --duration 60
    python -m benchmarks.realtime_load --spawn-server default --sessions 32 --duration 120
    python -m benchmarks.realtime_load --url ws://127.0.0.1:8000/v1/realtime --server-pid 1234
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from benchmarks.lib.common import ResultLog, add_out_argument, percentile

ROOT = Path(__file__).resolve().parents[1]
# The tiny server: a random 2-layer Llama with the test tokenizer, built in a temporary directory.
TINY_SERVER = """
import uvicorn
from tests.harness.checkpoints import save_tiny_checkpoint
from omni_gateway.engine.frontend.async_engine import AsyncEngine
from omni_gateway.omni.config import EngineConfig, OmniConfig
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.gateway.app import create_app
save_tiny_checkpoint("llama", {directory!r})
engine_config = EngineConfig(model={directory!r}, device="cpu", dtype="float32", max_model_len=256)
engine = AsyncEngine(engine_config)
pipe = OmniPipeline(OmniConfig(engine=engine_config, asr=None, tts=None, vad=False, vision=False, max_tokens=64),
                    engine=engine, model_name="tiny-llama", max_context_tokens=256)
uvicorn.run(create_app(pipe), host="127.0.0.1", port={port}, log_level="warning")
"""


@dataclass
class SessionStats:
    responses: int = 0
    lost: int = 0
    errors: int = 0
    failed: int = 0
    unexpected_close: int = 0
    ttfd: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def one_session(url: str, index: int, deadline: float, args: argparse.Namespace) -> SessionStats:
    stats = SessionStats()
    silence = base64.b64encode(bytes(4800 * 2)).decode()  # 200 ms of 24 kHz pcm16
    try:
        async with connect(url, max_size=None, open_timeout=60) as ws:
            await ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {
                            "type": "realtime",
                            "output_modalities": ["text"],
                            "audio": {"input": {"turn_detection": None}},
                        },
                    }
                )
            )
            items: list[str] = []
            turn = 0
            while time.monotonic() < deadline:
                turn += 1
                if args.audio:
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": silence}))
                    await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
                await ws.send(
                    json.dumps(
                        {
                            "type": "conversation.item.create",
                            "item": {
                                "type": "message",
                                "role": "user",
                                "content": [
                                    {"type": "input_text", "text": f"Session {index}, turn {turn}: say something."}
                                ],
                            },
                        }
                    )
                )
                sent = time.perf_counter()
                await ws.send(
                    json.dumps({"type": "response.create", "response": {"max_output_tokens": args.max_output_tokens}})
                )
                await read_turn(ws, stats, sent, items)
                if args.turns_per_context and turn % args.turns_per_context == 0:
                    for item_id in items:  # keep the context inside a small model's window
                        await ws.send(json.dumps({"type": "conversation.item.delete", "item_id": item_id}))
                    items.clear()
    except ConnectionClosed as closed:
        stats.unexpected_close += 1
        stats.problems.append(f"session {index}: closed {closed.rcvd.code if closed.rcvd else None}")
    except (TimeoutError, OSError) as exc:
        stats.unexpected_close += 1
        stats.problems.append(f"session {index}: {type(exc).__name__} {exc}")
    return stats


async def read_turn(ws: Any, stats: SessionStats, sent: float, items: list[str]) -> None:
    """Read until this turn's response.done; account for the response's events."""
    response_id: str | None = None
    text: list[str] = []
    first = True
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 300))
        kind = event["type"]
        if kind in ("conversation.item.added", "conversation.item.created"):
            items.append(event["item"]["id"])
        elif kind == "error":
            if event["error"].get("code") != "item_not_found":  # deletes racing nothing: harmless
                stats.errors += 1
                stats.problems.append(f"error {event['error'].get('code')}: {event['error'].get('message')}")
        elif kind == "response.created":
            if response_id is not None:
                stats.lost += 1
                stats.problems.append(f"second response.created before {response_id} was done")
            response_id = event["response"]["id"]
        elif kind == "response.output_text.delta":
            if event["response_id"] != response_id:
                stats.lost += 1
                stats.problems.append(f"delta for {event['response_id']} while {response_id} runs")
            if first:
                stats.ttfd.append(time.perf_counter() - sent)
                first = False
            text.append(event["delta"])
        elif kind == "response.output_text.done":
            if event["text"] != "".join(text):
                stats.lost += 1
                stats.problems.append(f"{response_id}: deltas {''.join(text)!r} != done text {event['text']!r}")
        elif kind == "response.done":
            if event["response"]["id"] != response_id:
                stats.lost += 1
                stats.problems.append(f"response.done for {event['response']['id']}, expected {response_id}")
            stats.responses += 1
            if event["response"]["status"] not in ("completed", "incomplete"):
                stats.failed += 1
                stats.problems.append(
                    f"{response_id}: status {event['response']['status']} {event['response'].get('status_details')}"
                )
            return


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_server(model: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    if model == "tiny":
        code = TINY_SERVER.format(directory=str(workdir / "tiny"), port=port)
        cmd = [sys.executable, "-c", code]
    else:
        cmd = [
            sys.executable,
            "-m",
            "omni_gateway.gateway.cli",
            "serve",
            "--model",
            model,
            "--asr",
            "none",
            "--tts",
            "none",
            "--no-vad",
            "--no-vision",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--max-sessions",
            "1024",
        ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"ws://127.0.0.1:{port}/v1/realtime"
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not listen within 600 s")


async def run(args: argparse.Namespace, url: str, pid: int | None) -> dict[str, Any]:
    # Warm up (first prefill, template compilation) outside the measured window.
    await one_session(url, -1, time.monotonic() + 0.1, args)
    rss_start = rss_mib(pid) if pid else None
    t0 = time.monotonic()
    results = await asyncio.gather(*(one_session(url, i, t0 + args.duration, args) for i in range(args.sessions)))
    elapsed = time.monotonic() - t0
    rss_end = rss_mib(pid) if pid else None
    ttfd = [t for r in results for t in r.ttfd]
    return {
        "sessions": args.sessions,
        "duration_s": round(elapsed, 1),
        "responses": sum(r.responses for r in results),
        "lost_events": sum(r.lost for r in results),
        "error_events": sum(r.errors for r in results),
        "failed_responses": sum(r.failed for r in results),
        "unexpected_closes": sum(r.unexpected_close for r in results),
        "ttfd_p50_ms": round(percentile(ttfd, 0.50) * 1000) if ttfd else None,
        "ttfd_p99_ms": round(percentile(ttfd, 0.99) * 1000) if ttfd else None,
        "rss_start_mib": None if rss_start is None else round(rss_start),
        "rss_end_mib": None if rss_end is None else round(rss_end),
        "problems": [p for r in results for p in r.problems][:10],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="ws://host:port/v1/realtime of a running server")
    where.add_argument(
        "--spawn-server",
        metavar="MODEL",
        help="start a server: 'tiny' (random 2-layer Llama), 'default' (SmolLM2) or a model path",
    )
    parser.add_argument("--server-pid", type=int, help="with --url: the server process, for its RSS")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--max-output-tokens", type=int, default=16)
    parser.add_argument(
        "--turns-per-context",
        type=int,
        default=0,
        help="delete the conversation every N turns (0: never); small models need it",
    )
    parser.add_argument("--audio", action="store_true", help="append and clear 200 ms of audio every turn")
    add_out_argument(parser, "realtime_load")
    args = parser.parse_args()
    if args.server_pid is not None and args.url is None:
        parser.error("--server-pid goes with --url (a spawned server's RSS is read anyway)")
    proc = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.spawn_server:
            print(f"starting a server with model {args.spawn_server} ...", flush=True)
            proc, url = spawn_server(args.spawn_server, Path(tmp))
            pid: int | None = proc.pid
        else:
            url, pid = args.url, args.server_pid
        try:
            report = asyncio.run(run(args, url, pid))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    print(json.dumps(report, indent=2))
    with ResultLog(args.out, "realtime_load", server=args.spawn_server or args.url) as log:
        log.write("load", **report)
    return 0 if report["lost_events"] == 0 and report["unexpected_closes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
