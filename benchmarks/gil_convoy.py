"""A torch voice stage's call beside a busy Python thread, at several interpreter switch intervals.

    python -m benchmarks.gil_convoy [--intervals-ms 5 1 0.5 0.2] [--calls 15] [--out FILE]

Every torch operator called from Python lets go of the interpreter lock while it runs and takes it back
after. While another thread is running Python, taking it back waits until that thread gives the lock up,
at the latest after the switch interval (5 ms by default): a call of several hundred small operators (a
VITS model pass, a Whisper decoding step) can wait that long per operator. In the server the event loop,
framing every session's audio, is such a thread. Here a tiny random VITS (``HfVitsSynthesizer`` on the CPU,
one torch thread) renders four short texts, alone and beside one thread that frames realtime audio events
(JSON around 100 ms of base64 audio) nonstop, at each switch interval. Printed per interval: the call's
median alone and beside the busy thread, their ratio, and the busy thread's events per second (what a
shorter interval costs it).
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.common import ResultLog, add_out_argument

TEXTS = ["hello there, friend.", "one two three.", "yes, of course.", "the sky is blue."]


def busy_framing(stop: threading.Event, counter: list[int]) -> None:
    """Frame audio delta events until ``stop``, counting them in ``counter[0]``."""
    audio = base64.b64encode(bytes(4800)).decode()  # 100 ms of 24 kHz pcm16
    while not stop.is_set():
        event = {"type": "response.output_audio.delta", "response_id": "resp_1", "item_id": "item_1", "delta": audio}
        json.loads(json.dumps(event))
        counter[0] += 1


def call_ms(render: Any, calls: int) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        render()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(render: Any, interval_s: float, calls: int) -> dict[str, float]:
    default = sys.getswitchinterval()
    sys.setswitchinterval(interval_s)
    try:
        alone = call_ms(render, calls)
        stop, counter = threading.Event(), [0]
        thread = threading.Thread(target=busy_framing, args=(stop, counter), daemon=True)
        thread.start()
        time.sleep(0.2)
        began, before = time.perf_counter(), counter[0]
        beside = call_ms(render, calls)
        events_per_s = (counter[0] - before) / (time.perf_counter() - began)
        stop.set()
        thread.join()
    finally:
        sys.setswitchinterval(default)
    return {"alone_ms": alone, "beside_ms": beside, "slowdown": beside / alone, "busy_events_per_s": events_per_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--intervals-ms", type=float, nargs="+", default=[5.0, 1.0, 0.5, 0.2])
    parser.add_argument("--calls", type=int, default=15)
    add_out_argument(parser, "gil_convoy")
    args = parser.parse_args()
    if any(ms <= 0 for ms in args.intervals_ms) or args.calls < 1:
        parser.error("switch intervals must be > 0 ms and --calls at least 1")

    import torch
    from omni_gateway.omni.heads.vits.synthesizer import HfVitsSynthesizer

    from tests.harness.shape_checkpoints import build_vits

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        synthesizer = HfVitsSynthesizer(build_vits(Path(root), tiny=True), device="cpu", seed=0)

        def render() -> None:
            synthesizer.start_batch(TEXTS)

        render()
        with ResultLog(args.out, "gil_convoy", calls=args.calls, stage="tiny VITS model pass, 4 texts, CPU") as log:
            for ms in args.intervals_ms:
                row = {"switch_interval_ms": ms, **measure(render, ms / 1000, args.calls)}
                log.write("interval_result", **row)
                print(
                    f"switch interval {ms:g} ms: call alone {row['alone_ms']:.1f} ms, beside a busy thread "
                    f"{row['beside_ms']:.1f} ms ({row['slowdown']:.1f}x); busy thread "
                    f"{row['busy_events_per_s']:.0f} events/s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
