"""A VITS batch's model pass and first vocoder window, eager against replayed from CUDA graphs.

    python -m benchmarks.vits_graphs [--tts DIR] [--reps 5] [--out FILE]

Eagerly a batch's model pass is a few thousand operator launches, each waiting for the interpreter lock
and for room in the driver's queue; ``HfVitsSynthesizer.prepare`` captures the text stage, the flow and the
vocoder windows as CUDA graphs instead. Both synthesizers run the same batches (random texts of a few
words, 1 to 32 rows), idle and beside a busy neighbour (a Python thread looping and a thread running
half-precision matmuls on the GPU; the switch interval is the serving one, ``STAGE_SWITCH_INTERVAL_S``).
Printed per batch: the model pass (``start_batch``) and the first window (``step``), median over
``--reps`` batches, and eager / graphs. ``--tts``: a VITS checkpoint directory (default: random weights in
the MMS shape, built in a temporary directory). ``--device cpu --tiny`` checks the script without a GPU
(both variants run eagerly there).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.common import ResultLog, add_out_argument
from benchmarks.lib.neighbours import busy_neighbour

BATCHES = ((1, 4), (4, 8), (16, 8), (16, 25), (32, 12))  # (rows, words a row)


def texts(rng: random.Random, rows: int, words: int) -> list[str]:
    return [
        " ".join(f"w{rng.randrange(99999)}" for _ in range(max(1, words + rng.randrange(-1, 2)))) for _ in range(rows)
    ]


def timed_batch(synthesizer: Any, batch: list[str], sync: Any) -> tuple[float, float]:
    """Milliseconds to the spectrogram and to the first window's samples."""
    sync()
    began = time.perf_counter()
    render = synthesizer.start_batch(batch)
    sync()
    spectrogram = time.perf_counter() - began
    render.step()
    return spectrogram * 1000, (time.perf_counter() - began) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tts", type=Path, help="a VITS checkpoint directory (default: random MMS-shaped weights)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny random VITS (a check of the script)")
    add_out_argument(parser, "vits_graphs")
    args = parser.parse_args()
    if args.reps < 1:
        parser.error("--reps must be at least 1")

    import numpy as np
    import torch
    from omni_gateway.omni.heads.vits.synthesizer import HfVitsSynthesizer
    from omni_gateway.omni.loading import STAGE_SWITCH_INTERVAL_S

    from tests.harness.shape_checkpoints import build_vits

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("this benchmark compares CUDA graphs with eager launches: it needs a CUDA GPU")
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sys.setswitchinterval(STAGE_SWITCH_INTERVAL_S)
    with tempfile.TemporaryDirectory() as scratch:
        path = args.tts or build_vits(Path(scratch), tiny=args.tiny)
        variants = {}
        for name, graphs in (("eager", False), ("graphs", True)):
            began = time.perf_counter()
            variants[name] = HfVitsSynthesizer(path, device=args.device, seed=3, cuda_graphs=graphs)
            variants[name].prepare(max_rows=32)
            print(f"{name}: loaded and prepared in {time.perf_counter() - began:.1f} s", flush=True)
        rng = random.Random(0)
        check = texts(rng, 3, 8)
        eager, graphed = (v.synthesize_batch(check) for v in variants.values())
        difference = max(float(np.abs(a - b).max()) for a, b in zip(eager, graphed))
        print(f"same seed, same batch: audio differs by at most {difference:.2e}", flush=True)
        with ResultLog(
            args.out,
            "vits_graphs",
            device=args.device,
            tts=str(args.tts or f"random, {'tiny' if args.tiny else 'MMS'} shape"),
        ) as log:
            log.write("check", max_difference=difference)
            for load in ("idle", "busy neighbour"):
                with busy_neighbour(args.device, "thread" if load != "idle" else "none"):
                    for rows, words in BATCHES:
                        batches = [texts(rng, rows, words) for _ in range(args.reps)]
                        row: dict[str, Any] = {"load": load, "rows": rows, "words": words}
                        for name, synthesizer in variants.items():
                            timed_batch(synthesizer, batches[0], sync)
                            times = [timed_batch(synthesizer, b, sync) for b in batches]
                            row[f"{name}_pass_ms"] = statistics.median(t[0] for t in times)
                            row[f"{name}_first_window_ms"] = statistics.median(t[1] for t in times)
                        log.write("batch_result", **row)
                        print(
                            f"{load}: {rows:2d} rows of ~{words:2d} words: model pass {row['eager_pass_ms']:7.1f} -> "
                            f"{row['graphs_pass_ms']:6.1f} ms ({row['eager_pass_ms'] / row['graphs_pass_ms']:.1f}x), "
                            f"first window {row['eager_first_window_ms']:7.1f} -> "
                            f"{row['graphs_first_window_ms']:6.1f} ms "
                            f"({row['eager_first_window_ms'] / row['graphs_first_window_ms']:.1f}x)",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
