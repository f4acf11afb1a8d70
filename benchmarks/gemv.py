"""One-row linear layers: the Triton ``kernels.gemv.linear`` over a sweep of launch configs and with
its default config, against cuBLAS (``F.linear``), on the decode shapes of Llama-3.1-8B and
Qwen2.5-0.5B, in bf16 on one GPU.

Each variant is timed as a CUDA graph of consecutive calls (``benchmarks.lib.common.time_graph``) cycling
through copies of the weight (together well past the L2 cache), so every call streams its weight
from HBM and launch gaps are those of a graph. Prints µs per call, TB/s of weight read, and the best
and the default config's ratio to cuBLAS; appends the raw results to ``benchmarks/results/gemv.jsonl``.

    python -m benchmarks.gemv [--quick] [--shapes 8b.qkv,0.5b.o] [--out FILE]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys

import torch
import torch.nn.functional as F
from omni_gateway.kernels.gemv import GemvConfig, default_gemv_config, linear

from benchmarks.lib.common import ResultLog, add_out_argument, time_graph

SHAPES = {  # name: (out_features, in_features)
    "8b.qkv": (6144, 4096),
    "8b.o": (4096, 4096),
    "8b.gate_up": (28672, 4096),
    "8b.down": (4096, 14336),
    "8b.lm_head": (128256, 4096),
    "0.5b.qkv": (1152, 896),
    "0.5b.o": (896, 896),
    "0.5b.gate_up": (9728, 896),
    "0.5b.down": (896, 4864),
}


def configs(quick: bool) -> list[GemvConfig]:
    tiles = [(4, 256), (4, 512), (4, 1024), (8, 256), (8, 512), (8, 1024), (16, 256), (16, 512)]
    stages = [1, 2, 3, 4]
    if quick:
        tiles, stages = [(4, 1024), (8, 512)], [3]
    return [GemvConfig(block_n=bn, block_k=bk, stages=st) for (bn, bk), st in itertools.product(tiles, stages)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few configs only")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names among: " + ", ".join(SHAPES))
    add_out_argument(parser, "gemv")
    args = parser.parse_args()
    unknown = [name for name in args.shapes.split(",") if name not in SHAPES]
    if unknown:
        parser.error(f"--shapes: unknown {', '.join(unknown)}; expected names among {', '.join(SHAPES)}")
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    log = ResultLog(args.out, "gemv", quick=args.quick)
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        size = n * k * 2
        copies = max(4, math.ceil(400e6 / size))
        weights = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        ref = x.float() @ weights[0].float().T
        est = size / 4e12

        def graph_us(fn):
            return time_graph(fn, copies, est) * 1e6

        base = graph_us(lambda i: F.linear(x, weights[i]))
        rows = []
        default = default_gemv_config(n)
        for cfg in dict.fromkeys([default, *configs(args.quick)]):
            got = linear(x, weights[0], config=cfg).float()
            err = (got - ref).abs().max().item()
            tol = 2e-2 * ref.abs().max().item() + 1e-2
            if not err <= tol:
                print(f"  {name} {cfg}: WRONG, max error {err:.4g} > {tol:.4g}", flush=True)
                continue
            us = graph_us(lambda i, cfg=cfg: linear(x, weights[i], config=cfg))
            rows.append((us, cfg))
        default_us = next(us for us, cfg in rows if cfg == default)
        rows.sort(key=lambda r: r[0])
        best_us, best = rows[0]
        print(
            f"{name} [{n} x {k}], {size / 1e6:.1f} MB, {copies} copies: cuBLAS {base:.2f} us "
            f"({size / base / 1e6:.2f} TB/s); best gemv {best_us:.2f} us ({size / best_us / 1e6:.2f} TB/s) "
            f"= {base / best_us:.3f}x cuBLAS with {best}; the default {default_us:.2f} us = "
            f"{base / default_us:.3f}x cuBLAS",
            flush=True,
        )
        for us, cfg in rows[1:5]:
            print(f"    {us:8.2f} us  {cfg}", flush=True)
        log.write(
            "shape",
            name=name,
            n=n,
            k=k,
            cublas_us=base,
            best_us=best_us,
            best=repr(best),
            default_us=default_us,
            ratio_default_vs_cublas=base / default_us,
            all=[(us, repr(cfg)) for us, cfg in rows],
        )
        weights.clear()
        torch.cuda.empty_cache()
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
