"""Is one row of int4 held back by the memory pattern of its words? Each program of the one-row kernel
(kernels/quant_gemv.py) reads 64 bytes of each of its 128 rows per sub-tile, rows 2 KB apart at the 8B
model's 4096 features. This times a kernel that only loads the words, and one that runs the shipped plane
arithmetic (``quant_tiles.int4_row_step``), on that row layout and on a tiled one where each program's
sub-tile of words is one contiguous block, in the order the program reads them.

    python -m benchmarks.experiments.int4_row_layout [--shapes gate_up,down] [--configs 128,256,4,2 ...]
    TRITON_INTERPRET=1 python -m benchmarks.experiments.int4_row_layout   # no GPU: checks, no timing

Configs are ``block_n,block_k,warps,split``; the defaults are the shipped one-row launches of the four layer
shapes. If the load-only kernel on rows streams well under the copy bandwidth and the tiled one does not,
the layout holds the kernel back, and int4 weights would need a load-time repack that every int4 path reads.

Answer (one H100, 2026-12-07, run 20261207T034130Z-619): tiles stream faster when only loaded (gate_up
35.3 -> 23.8 us; ncu: 49% -> 75% of DRAM bandwidth) but the plane kernel barely moves (32.8 -> 30.7 us at
gate_up, unchanged at down, qkv and o). ncu puts every one-row kernel at gate_up near 20% achieved occupancy
(13.6 warps an SM from 448 programs of four warps): too few warps in flight, not the layout.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
import triton
import triton.language as tl
from omni_gateway.kernels import quant_reference as qref
from omni_gateway.kernels.quant_tiles import int4_row_step, int4_row_total

from benchmarks.experiments.int4_row_pipelines import GROUP, SUB, TOLERANCE, weight_sets
from benchmarks.lib.common import ResultLog, add_out_argument, rel_err, time_graph
from benchmarks.quant_sweep import SHAPES

# (shape, block_n, block_k, warps, split): the shipped one-row launches (kernels/quant_tuning.py).
CONFIGS = {"gate_up": (128, 256, 4, 2), "down": (128, 256, 8, 8), "qkv": (128, 256, 4, 8), "o": (128, 256, 8, 8)}


@triton.jit
def _layout_kernel(
    w_ptr,
    x_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    N,
    K,
    k_per_split,
    TILED: tl.constexpr,
    LOAD_ONLY: tl.constexpr,
    GROUP: tl.constexpr,
    SUB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = tl.arange(0, BLOCK_N)
    j = tl.arange(0, SUB // 8)
    cols = pid_n * BLOCK_N + r
    col_ok = cols < N
    acc = tl.zeros([BLOCK_N, SUB // 8], tl.float32)
    bits = tl.zeros([BLOCK_N, SUB // 8], tl.int32)
    squares = tl.zeros([1, SUB // 8], tl.float32)
    k_lo = pid_k * k_per_split
    for k0 in range(k_lo, k_lo + k_per_split, BLOCK_K):
        for u in tl.static_range(BLOCK_K // SUB):
            kb = k0 + u * SUB
            if TILED:
                tile = (pid_n.to(tl.int64) * (K // SUB) + kb // SUB) * (BLOCK_N * (SUB // 8))
                ptrs = w_ptr + tile + r[:, None] * (SUB // 8) + j[None, :]
            else:
                ptrs = w_ptr + cols.to(tl.int64)[:, None] * (K // 8) + kb // 8 + j[None, :]
            words = tl.load(ptrs, eviction_policy="evict_first")
            if LOAD_ONLY:
                bits ^= words  # keeps every load live
            else:
                acc, squares = int4_row_step(
                    words, x_ptr, s_ptr, z_ptr, x_ptr, cols, col_ok, kb, K, acc, squares, True, GROUP, SUB, False
                )
    if LOAD_ONLY:
        tl.store(out_ptr + pid_k * N + cols[None, :], tl.sum(bits.to(tl.float32), 1)[None, :])
    else:
        tl.store(out_ptr + pid_k * N + cols[None, :], int4_row_total(acc))


def tiled(words: torch.Tensor, block_n: int) -> torch.Tensor:
    """``[N, K / 8]`` int4 words in ``quant_reference.tile_int4``'s row tiles of ``block_n`` rows (SUB is one
    group), flat: each ``[block_n, SUB / 8]`` sub-tile contiguous, the sub-tiles of one block of rows first,
    in the order of their input features."""
    return qref.tile_int4(words.view(torch.uint8), SUB, block_n).view(torch.int32).view(-1)


def _call(
    config: tuple[int, ...], x: torch.Tensor, weight: tuple[torch.Tensor, ...], tile: bool, load_only: bool
) -> torch.Tensor:
    """``weight`` is ``(words, tiled words, scales, zeros)``; the partial sums of every split, added."""
    block_n, block_k, warps, split = config
    words, words_tiled, scales, zeros = weight
    n, k = words.shape[0], words.shape[1] * 8
    parts = torch.empty(split, n, device=x.device, dtype=torch.float32)
    _layout_kernel[(n // block_n, split)](
        words_tiled if tile else words,
        x,
        scales,
        zeros,
        parts,
        n,
        k,
        k // split,
        TILED=tile,
        LOAD_ONLY=load_only,
        GROUP=GROUP,
        SUB=SUB,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
    )
    return parts.sum(0, keepdim=True)


def _weights(n: int, k: int, block_n: int, device: str) -> list[tuple[torch.Tensor, ...]]:
    """The row-pipeline experiment's weight sets as ``(words, tiled words, scales, zeros)``."""
    out = []
    for packed, scales, zeros in weight_sets(n, k, device, tinygemm=False):
        words = packed.view(torch.int32)
        out.append((words, tiled(words, block_n), scales, zeros))
    return out


def _measure(log: ResultLog, shape: str, n: int, k: int, config: tuple[int, ...], device: str) -> None:
    """Load-only and full kernels on both layouts; the full ones checked against the float64 twin first."""
    data = _weights(n, k, config[0], device)
    x = torch.randn(1, k, device=device, dtype=torch.bfloat16)
    words, _, scales, zeros = data[0]
    ref = x.double() @ qref.dequantize_int4(words.view(torch.uint8), scales, zeros, dtype=torch.float64).T
    for tile in (False, True):
        for load_only in (True, False):
            err = float("nan") if load_only else rel_err(_call(config, x, data[0], tile, load_only), ref)
            variant = f"{'tiled' if tile else 'rows'}, {'load only' if load_only else 'planes'}"
            if not load_only and not err <= TOLERANCE:  # NaN fails too
                print(f"{shape:8s} {str(config):18s} {variant:18s} WRONG: rel err {err:.1e}, not timed", flush=True)
                log.write("variant", shape=shape, config=config, variant=variant, us=None, rel_err=err)
                continue
            us = float("nan")
            if device == "cuda":
                us = time_graph(lambda i: _call(config, x, data[i], tile, load_only), len(data), 10e-6, replays=5) * 1e6
            gbps = n * k / 2 / us / 1e3
            print(
                f"{shape:8s} {str(config):18s} {variant:18s} {us:7.1f} us  {gbps:5.0f} GB/s  rel err {err:.1e}",
                flush=True,
            )
            log.write("variant", shape=shape, config=config, variant=variant, us=us, rel_err=err)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(CONFIGS), help="comma-separated, from " + ", ".join(SHAPES))
    parser.add_argument(
        "--configs",
        nargs="*",
        default=[],
        help="block_n,block_k,warps,split for every shape (default: each shape's own)",
    )
    add_out_argument(parser, "int4_row_layout")
    args = parser.parse_args()
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs]
    check_only = not torch.cuda.is_available()
    if check_only:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("int4_row_layout: no CUDA GPU; set TRITON_INTERPRET=1 to check the kernels on the CPU")
        cases: list[tuple[str, int, int, tuple[Any, ...]]] = [("small", 256, 1024, (64, 256, 4, 2))]
        device = "cpu"
    else:
        cases = [
            (shape, *SHAPES[shape], config)
            for shape in args.shapes.split(",")
            for config in (configs or [CONFIGS.get(shape, (128, 256, 4, 2))])
        ]
        device = "cuda"
    with ResultLog(args.out, "experiments.int4_row_layout", check_only=check_only) as log:
        for shape, n, k, config in cases:
            _measure(log, shape, n, k, config, device)
            if device == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
