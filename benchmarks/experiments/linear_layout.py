"""Would another cuBLAS call form or weight layout speed up the engine's linear layers, on a CUDA GPU?

    python -m benchmarks.experiments.linear_layout

The shapes are Llama-3.1-8B's (q/k/v, o, gate/up, down, LM head) and Qwen2.5-0.5B's. Each row
times, against ``F.linear(x, W)`` on the ``[out, in]`` weight the engine keeps:
``x @ Wt`` on a contiguous ``[in, out]`` copy, ``torch.mv`` (one row only), and both of the first
two with cuBLASLt preferred (up to 4 rows). All are replayed from a CUDA graph of at least 200
calls that rotate over enough weight copies to touch 400 MB, so the 50-60 MB L2 cannot hold them.
The figure is the median of 10 replays per call (``benchmarks.lib.common.time_graph`` with a 10 us
estimate, which captures 200 calls); GB/s counts the weight bytes.

Answer (one H200, 2026-12-03 07:25 UTC, the script's first draft with the same shapes, call forms and
timing): no. At one row the 8B shapes ran within 2% of each other whatever the form (q/k/v 15.5-16.0 us,
o 12.4-12.8, gate/up 54.6-55.5, down 30.9-31.3, LM head 233.5-238.5); the 0.5B shapes took 3.7-7.7 us,
latency rather than bandwidth. At 2048 rows the ``[in, out]`` copy was no faster and lost 23% on the
0.5B down projection (32.6 against 26.6 us), so the weights stay ``[out, in]``. (The one-row case was
later won by a Triton matrix-vector kernel, ``benchmarks.gemv``.)
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.lib.common import time_graph

SHAPES = {  # name: (out features, in features)
    "8b q/k/v": (6144, 4096),
    "8b o": (4096, 4096),
    "8b gate/up": (28672, 4096),
    "8b down": (4096, 14336),
    "8b lm head": (128256, 4096),
    "0.5b q/k/v": (1152, 896),
    "0.5b gate/up": (9728, 896),
    "0.5b down": (896, 4864),
}
ROWS = (1, 4, 2048)
_ROTATION_BYTES = 400e6
_EST_S = 1e-5  # makes time_graph capture 200 calls


def bench_shape(name: str, out_features: int, in_features: int) -> None:
    nbytes = out_features * in_features * 2
    sets = max(2, min(16, math.ceil(_ROTATION_BYTES / nbytes)))
    weights = [torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    transposed = [w.t().contiguous() for w in weights]
    for rows in ROWS:
        xs = [torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        forms: dict[str, Callable[[int], torch.Tensor]] = {
            "F.linear": lambda i: F.linear(xs[i], weights[i]),
            "x @ Wt": lambda i: xs[i] @ transposed[i],
        }
        if rows == 1:
            forms["mv"] = lambda i: torch.mv(weights[i], xs[i][0])
        expected = F.linear(xs[0], weights[0]).float()
        timed: dict[str, float] = {}
        for label, fn in forms.items():
            check(label, fn(0), expected)
            timed[label] = time_graph(fn, sets, _EST_S)
        if rows <= 4:
            torch.backends.cuda.preferred_blas_library("cublaslt")
            try:
                for label in ("F.linear", "x @ Wt"):
                    check(label + " (Lt)", forms[label](0), expected)
                    timed[label + " (Lt)"] = time_graph(forms[label], sets, _EST_S)
            finally:
                torch.backends.cuda.preferred_blas_library("cublas")
        base = timed["F.linear"]
        cells = [
            f"{label} {t * 1e6:.1f} us ({nbytes / t / 1e9:.0f} GB/s, {base / t:.2f}x)" for label, t in timed.items()
        ]
        print(f"{name:13s} rows {rows:5d} {nbytes / 1e6:7.1f} MB: " + "; ".join(cells), flush=True)


def check(label: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    err = float((got.float().reshape(expected.shape) - expected).norm() / expected.norm())
    if not err < 1e-2:
        raise AssertionError(f"{label}: relative error {err:.1e} against F.linear")


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for name, (out_features, in_features) in SHAPES.items():
        bench_shape(name, out_features, in_features)
        torch.cuda.empty_cache()  # the shape's weight copies, freed on return
    return 0


if __name__ == "__main__":
    sys.exit(main())
