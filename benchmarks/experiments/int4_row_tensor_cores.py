"""Can one row of int4 run on the tensor cores faster than on the CUDA cores? The shipped one-row kernel
(``quant_tiles.int4_row_step``) multiplies on the CUDA cores: 3.8-4.4 instructions a weight. One row padded
to 16 as the *first* operand of ``tl.dot`` (the retired ``row_dot``) put the de-quantized weights in shared
memory as the second operand, and ran 1.6-2.0x slower. Here the weights are the first operand,
``[block_n, 128] @ [128, 16]``, the activations the second (one column repeated), three ways:

- ``joined`` (Triton): dot_tile's tile of ``1 + q / 16`` (nibbles ``j, j + 4`` paired per 32 bits, joined in
  ``int4_dot_features`` order), one ``tl.dot`` a group; Triton 3.6 keeps it in registers for ``wgmma`` but
  passes it through shared memory to get there (sm_90: 2.8 instructions a weight).
- ``planes`` (Triton): eight dots a group, one per nibble plane; Triton moves the words rather than the bf16
  values to the operand's layout, but stores each plane's activations for its dot (4.5-5.8 a weight).
- ``fragments`` (Gluon, ``int4_row_fragments``): each thread's words de-quantize straight into its own
  ``mma.m16n8k16`` fragment, no shared memory (2.2 a weight); ``fragments-prefetch`` loads the next group
  before the current one's arithmetic (2.5 a weight, more registers); ``-tiled`` reads the words as
  ``int4_row_layout.tiled`` stores them, ``TILE_N`` rows by one group contiguous.

The zero point comes off through the activations' sum (Triton variants) or inside the operand (fragments),
the group scale multiplies each group's float32 sums. The baselines run in the same command: bf16
(``x @ w.T``) and the shipped plane loop unfused (the layout experiment's row kernel).

    python -m benchmarks.experiments.int4_row_tensor_cores [--shapes gate_up,down] [--configs fragments,128,4,2 ...]
    TRITON_INTERPRET=1 python -m benchmarks.experiments.int4_row_tensor_cores   # no GPU: checks, no timing

Configs are ``variant,block_n,warps,split``; the interpreter runs the Triton variants only.

Answer (one H100, 2026-12-07, runs 20261207T034116Z-557 and -040737Z-561): the ``tl.dot`` forms took 2-5x
the planes' time. The fragments with the row words: 0.80-1.03x the planes' speed at their first configs,
1.06-1.14x with 32-64 rows and 8 splits. With the tiled words (``fragments-tiled``, 32 rows, 2 warps, 8 splits) a
layer's four linears took 59.3 us against the planes' 73.1 (gate_up 24.9 against 32.8), the LM head 94.5 against
140.7 (run 20261207T042220Z-561). Not run on an H200.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
import triton
import triton.language as tl
from omni_gateway.kernels import quant_reference as qref
from omni_gateway.kernels.quant_tiles import dot_tile, int4_dot_features

from benchmarks.experiments import int4_row_layout as layout
from benchmarks.experiments.int4_row_pipelines import GROUP, SUB, TOLERANCE
from benchmarks.lib.common import ResultLog, add_out_argument, rel_err, time_graph
from benchmarks.quant_sweep import SHAPES

TRITON_VARIANTS = ("joined", "planes")
VARIANTS = (*TRITON_VARIANTS, "fragments", "fragments-prefetch", "fragments-tiled", "fragments-prefetch-tiled")
TILE_N = 64  # rows a tile of the tiled words holds (``int4_row_layout.tiled``)
XN = 16  # columns of the activations' operand: the smallest ``tl.dot`` takes
CONFIGS = (
    *((variant, 128, 4, 2) for variant in TRITON_VARIANTS),
    *(
        (variant, block_n, warps, split)
        for variant in VARIANTS[2:]
        for block_n, warps, split in ((128, 4, 2), (128, 4, 4), (64, 2, 4), (64, 2, 8), (32, 2, 8))
    ),
)


@triton.jit
def _dot(w, x, acc, DOT_FP32: tl.constexpr):
    """``acc + w @ x`` with ``x`` repeated over ``acc``'s columns; in float32 under the interpreter, whose
    bfloat16 ``tl.dot`` returns garbage."""
    xt = tl.broadcast_to(x[:, None], [x.shape[0], acc.shape[1]])
    if DOT_FP32:
        return tl.dot(w.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(w, xt, acc)


@triton.jit
def _dot_kernel(
    w_ptr,
    x_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    N,
    K,
    k_per_split,
    PLANES: tl.constexpr,
    GROUP: tl.constexpr,
    SUB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    XN: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    lanes = tl.arange(0, XN)
    acc = tl.zeros([BLOCK_N, XN], tl.float32)
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * (K // 8)
    j = tl.arange(0, SUB // 8)
    k_lo = pid_k * k_per_split
    for kb in range(k_lo, k_lo + k_per_split, SUB):
        if PLANES:
            g = cols * (K // GROUP) + kb // GROUP
            words = tl.load(w_rows + kb // 8 + j[None, :], eviction_policy="evict_first")
            part = tl.zeros([BLOCK_N, XN], tl.float32)
            x_sum = 0.0
            for p in tl.static_range(8):
                # nibble p on the top four mantissa bits of bf16 1.0: 1 + q / 16, exact
                if p == 0:
                    bits = (words << 3) & 0x78
                else:
                    bits = (words >> (4 * p - 3)) & 0x78
                w = (bits | 0x3F80).to(tl.int16).to(tl.bfloat16, bitcast=True)
                x = tl.load(x_ptr + kb + j * 8 + p)
                x_sum += tl.sum(x.to(tl.float32), 0)
                part = _dot(w, x, part, DOT_FP32)
            offset = 1.0 + tl.load(z_ptr + g).to(tl.float32) * 0.0625
            scale = tl.load(s_ptr + g).to(tl.float32) * 16.0
        else:
            x = tl.load(x_ptr + int4_dot_features(kb, SUB))
            w, scale, offset = dot_tile(w_ptr, s_ptr, z_ptr, cols, col_ok, kb, K, x, True, 2, GROUP, SUB)
            x_sum = tl.sum(x.to(tl.float32), 0)
            part = _dot(w, x, tl.zeros([BLOCK_N, XN], tl.float32), DOT_FP32)
        acc += (part - offset[:, None] * x_sum) * scale[:, None]
    row = tl.sum(tl.where(lanes[None, :] == 0, acc, 0.0), 1)
    tl.store(out_ptr + pid_k * N + cols, row, mask=col_ok)


def _call(config: tuple[Any, ...], x: torch.Tensor, weight: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``weight`` is ``(words, tiled words, scales, zeros)``; the partial sums of every split, added."""
    variant, block_n, warps, split = config
    words, tiled_words, scales, zeros = weight
    if variant.startswith("fragments"):
        from benchmarks.experiments import int4_row_fragments

        tiled = variant.endswith("tiled")
        prefetch = "prefetch" in variant
        w = tiled_words if tiled else words
        parts = int4_row_fragments.launch(x, w, scales, zeros, block_n, warps, split, prefetch, TILE_N if tiled else 0)
        return parts.sum(0, keepdim=True)
    n, k = words.shape[0], words.shape[1] * 8
    parts = torch.empty(split, n, device=x.device, dtype=torch.float32)
    _dot_kernel[(triton.cdiv(n, block_n), split)](
        words,
        x,
        scales,
        zeros,
        parts,
        n,
        k,
        k // split,
        PLANES=variant == "planes",
        GROUP=GROUP,
        SUB=SUB,
        BLOCK_N=block_n,
        XN=XN,
        DOT_FP32=x.device.type == "cpu",
        num_warps=warps,
        num_stages=1,
    )
    return parts.sum(0, keepdim=True)


def parse_config(text: str) -> tuple[Any, ...]:
    """``variant,block_n,warps,split`` as a config tuple."""
    variant, *numbers = text.split(",")
    if variant not in VARIANTS or len(numbers) != 3:
        expected = f"variant,block_n,warps,split with variant in {VARIANTS}"
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return (variant, *(int(v) for v in numbers))


def _measure(log: ResultLog, shape: str, n: int, k: int, configs: list[tuple[Any, ...]], device: str) -> None:
    """bf16 and the shipped plane loop as baselines, then each config, checked against the float64 twin."""
    data = layout._weights(n, k, TILE_N, device)
    x = torch.randn(1, k, device=device, dtype=torch.bfloat16)
    words, _, scales, zeros = data[0]
    dense = qref.dequantize_int4(words.view(torch.uint8), scales, zeros, dtype=torch.float64)
    ref = x.double() @ dense.T

    def timed(fn: Any) -> float:
        if device != "cuda":
            return float("nan")
        return time_graph(fn, len(data), 10e-6, replays=5) * 1e6

    bf16 = [dense.to(torch.bfloat16)] + ([torch.randn_like(dense, dtype=torch.bfloat16)] if device == "cuda" else [])
    del dense
    bf16_us = timed(lambda i: x @ bf16[i % len(bf16)].T)
    bf16.clear()
    shipped = layout.CONFIGS.get(shape, (128, 256, 4, 2))
    cases: list[tuple[str, Any]] = [
        (f"shipped planes {shipped}", lambda i: layout._call(shipped, x, data[i], False, False))
    ]
    cases += [(",".join(map(str, c)), lambda i, c=c: _call(c, x, data[i])) for c in configs]
    print(f"{shape:8s} bf16 {bf16_us:7.1f} us", flush=True)
    log.write("bf16", shape=shape, us=bf16_us)
    for label, fn in cases:
        err = rel_err(fn(0), ref)
        if not err <= TOLERANCE:  # NaN fails too
            print(f"{shape:8s} {label:28s} WRONG: rel err {err:.1e}, not timed", flush=True)
            log.write("variant", shape=shape, config=label, us=None, rel_err=err)
            continue
        us = timed(fn)
        print(f"{shape:8s} {label:28s} {us:7.1f} us  {bf16_us / us:5.2f}x bf16  rel err {err:.1e}", flush=True)
        log.write("variant", shape=shape, config=label, us=us, speedup=bf16_us / us, rel_err=err)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(layout.CONFIGS), help="comma-separated, from " + ", ".join(SHAPES))
    parser.add_argument(
        "--configs", nargs="*", type=parse_config, default=list(CONFIGS), help="variant,block_n,warps,split"
    )
    add_out_argument(parser, "int4_row_tensor_cores")
    args = parser.parse_args()
    check_only = not torch.cuda.is_available()
    if check_only:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("int4_row_tensor_cores: no CUDA GPU; set TRITON_INTERPRET=1 to check it on the CPU")
        cases = [("small", 256, 1024)]
        device = "cpu"
        configs = [(v, 64, 4, 2) for v in TRITON_VARIANTS]
    else:
        cases = [(shape, *SHAPES[shape]) for shape in args.shapes.split(",")]
        device = "cuda"
        configs = args.configs
    with ResultLog(args.out, "experiments.int4_row_tensor_cores", check_only=check_only) as log:
        for shape, n, k in cases:
            _measure(log, shape, n, k, configs, device)
            if device == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
