"""Does one row of int4 run faster when its words reach the registers through a pipeline, cp.async stages
or Hopper's TMA, instead of straight from global memory as the shipped kernel loads them, or when half of
its programs run half a step behind the others? And how does torch's own int4 kernel (tinygemm,
``aten._weight_int4pack_mm``, groups of 128) compare at one row?

    python -m benchmarks.experiments.int4_row_pipelines [--shapes gate_up,down] [--configs 128,256,4,1,2 ...]
    TRITON_INTERPRET=1 python -m benchmarks.experiments.int4_row_pipelines   # no GPU: checks, no timing

Why it might: the one-row kernel (kernels/quant_gemv.py, ``int4_row_step``) at gate_up runs 3.4
programs of 4 warps per SM, all in one wave, and each loop step loads 128 bytes a thread and then
issues about 970 instructions a warp. Loads and arithmetic take about 2 us each per step per SM at
the H100's bytes and issue rate, and a step took 4.2 us (33.7 us over 8 steps): the programs move in
lockstep, so the memory idles while they compute. A pipeline would keep the next step's words in
flight during this step's arithmetic. The register prefetch tried before did not (ptxas issued it late,
docs/benchmarks.md); here the stages live in shared memory.

Each variant runs the shipped plane arithmetic (``quant_tiles.int4_row_step``) without fusions, each
split writing its own partial sums, which a torch sum adds:

- ``registers``: one stage, the words loaded straight into registers, as shipped;
- ``staggered``: the same, but every other wave of programs (one per SM) runs one sub-tile alone first, so
  their steps lag the others' by half a step, and on each SM half of the programs load while the others
  compute;
- ``cp.async``: the same loads with ``STAGES`` > 1, which Triton pipelines through shared memory;
- ``tma``: the words as TMA tiles of a host tensor descriptor.

Every output is checked against the float64 twin first. Compiled for sm_90 under Triton 3.6 at block_n
128, block_k 256, 4 warps, the loops issue 3.4 (registers and staggered), 3.5 (cp.async, 3 stages) and
4.2 (TMA, 3 stages) instructions a weight.

Answer: no. On one H100 (2026-12-07 01:39 UTC, run 20261207T013939Z-725, ``--shapes gate_up --configs
128,256,4,1,2 128,256,4,3,2 256,256,4,1,4``), gate_up took 33.7 us with the words in registers, 33.5
staggered, 39.5 through three cp.async stages and 37.0-39.9 as TMA tiles; 256 features a program were
slower under every load (38.7-43.7), and tinygemm took 33.3. The same call timed the shipped fused kernel
with these loads swapped in, at every layer shape (docs/benchmarks.md): none was faster. Keeping the
next words in flight did not shorten a step, so the lockstep picture above was wrong.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from omni_gateway.kernels import quant_reference as qref
from omni_gateway.kernels.quant_tiles import int4_row_step, int4_row_total, int4_words

from benchmarks.lib.common import ResultLog, add_out_argument, rel_err, time_graph
from benchmarks.quant_sweep import SHAPES

GROUP = 128
SUB = 128  # input features per TMA tile and plane step: one group
LOADS = ("registers", "staggered", "cp.async", "tma")
# (block_n, block_k, warps, stages, split): the shipped gate_up launch first, then deeper pipelines.
CONFIGS = ((128, 256, 4, 1, 2), (128, 256, 4, 3, 2), (128, 256, 4, 4, 1), (128, 256, 8, 3, 2), (128, 512, 4, 3, 2))
# Relative error against the float64 twin: our kernels sum exact products in float32; tinygemm
# multiplies bf16 de-quantized weights and returns bf16.
TOLERANCE = 1e-5
TINYGEMM_TOLERANCE = 1e-2
_ROTATION_BYTES = 240e6  # weight sets per shape: enough that one replay's reads miss L2


@triton.jit
def _row_kernel(
    w_ptr,
    w_desc,
    x_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    N,
    K,
    k_per_split,
    sms,
    GROUP: tl.constexpr,
    SUB: tl.constexpr,
    TMA: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
    STAGGER: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * (K // 8)
    acc = tl.zeros([BLOCK_N, SUB // 8], tl.float32)
    squares = tl.zeros([1, SUB // 8], tl.float32)
    k_lo = pid_k * k_per_split
    k_end = k_lo + k_per_split
    k_hi = k_end
    if STAGGER:
        # Every other wave of ``sms`` programs in launch order (one program per SM each, where the
        # scheduler deals them out in turn) runs one sub-tile alone first: its steps then lag the others' by
        # a sub-tile, on every SM, so half of the programs load while the others compute.
        lag = (((pid_n + pid_k * tl.num_programs(0)) // sms) % 2) * SUB
        if lag > 0:
            acc, squares = _row_sub(
                w_rows,
                w_desc,
                x_ptr,
                s_ptr,
                z_ptr,
                cols,
                col_ok,
                pid_n,
                k_lo,
                K,
                acc,
                squares,
                GROUP,
                SUB,
                TMA,
                BLOCK_N,
            )
        k_lo += lag
        k_hi -= (BLOCK_K - SUB) * (lag // SUB)
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
        for u in tl.static_range(BLOCK_K // SUB):
            acc, squares = _row_sub(
                w_rows,
                w_desc,
                x_ptr,
                s_ptr,
                z_ptr,
                cols,
                col_ok,
                pid_n,
                k0 + u * SUB,
                K,
                acc,
                squares,
                GROUP,
                SUB,
                TMA,
                BLOCK_N,
            )
    if STAGGER:
        for kb in range(k_hi, k_end, SUB):  # the lagging programs' last sub-tiles
            acc, squares = _row_sub(
                w_rows, w_desc, x_ptr, s_ptr, z_ptr, cols, col_ok, pid_n, kb, K, acc, squares, GROUP, SUB, TMA, BLOCK_N
            )
    tl.store(out_ptr + pid_k * N + cols[None, :], int4_row_total(acc))


@triton.jit
def _row_sub(
    w_rows,
    w_desc,
    x_ptr,
    s_ptr,
    z_ptr,
    cols,
    col_ok,
    pid_n,
    kb,
    K,
    acc,
    squares,
    GROUP: tl.constexpr,
    SUB: tl.constexpr,
    TMA: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One sub-tile of the plane arithmetic at input feature ``kb``, its words loaded plainly or by TMA."""
    if TMA:
        words = w_desc.load([pid_n * BLOCK_N, kb // 8])
    else:
        words = int4_words(w_rows, col_ok, kb, K, True, SUB)
    return int4_row_step(words, x_ptr, s_ptr, z_ptr, x_ptr, cols, col_ok, kb, K, acc, squares, True, GROUP, SUB, False)


def _row_call(load: str, config: tuple[int, ...], x: torch.Tensor, weight: tuple[Any, ...], desc: Any) -> torch.Tensor:
    """One row through ``_row_kernel``: ``weight`` is ``(packed, scales, zeros, ...)``, ``desc`` its TMA
    descriptor for ``config``'s block_n."""
    block_n, block_k, warps, stages, split = config
    packed, scales, zeros = weight[:3]
    n, k = packed.shape[0], packed.shape[1] * 2
    parts = torch.empty(split, n, device=x.device, dtype=torch.float32)
    _row_kernel[(n // block_n, split)](
        packed.view(torch.int32),
        desc,
        x,
        scales,
        zeros,
        parts,
        n,
        k,
        k // split,
        torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 1,
        GROUP=GROUP,
        SUB=SUB,
        TMA=load == "tma",
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        STAGES=1 if load in ("registers", "staggered") else stages,
        STAGGER=load == "staggered",
        num_warps=warps,
    )
    return parts.sum(0, keepdim=True)


def _tinygemm_weight(packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Our int4 weight in tinygemm's form: nibbles repacked (the even feature high), and ``w = (q - 8) * s +
    z'`` with the float zero ``z' = (8 - zero) * s``, scales and zeros as ``[K / G, N, 2]`` bf16."""
    q = qref.unpack_int4(packed).to(torch.int32)
    pairs = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)
    weight = torch.ops.aten._convert_weight_to_int4pack(pairs, 8)
    s = scales.float()
    scale_zero = torch.stack([s, (8 - zeros.float()) * s], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return weight, scale_zero


def weight_sets(n: int, k: int, device: str, tinygemm: bool) -> list[tuple[torch.Tensor, ...]]:
    """Sets of ``(packed, scales, zeros)``, with tinygemm's form of each appended when ``tinygemm``."""
    sets = max(1, round(_ROTATION_BYTES / (n * k / 2))) if device == "cuda" else 1
    out = []
    for _ in range(sets):
        packed, scales, zeros = qref.quantize_int4(torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02)
        out.append((packed, scales, zeros, *(_tinygemm_weight(packed, scales, zeros) if tinygemm else ())))
    return out


def _descriptors(weights: list[tuple[torch.Tensor, ...]], block_n: int) -> list[Any]:
    """Each set's packed words as TMA tiles of ``block_n`` rows by one group."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return [TensorDescriptor.from_tensor(w[0].view(torch.int32), [block_n, SUB // 8]) for w in weights]


def _report(
    log: ResultLog,
    label: tuple[str, tuple[int, ...] | None, str],
    call: Callable[[int], torch.Tensor],
    ref: torch.Tensor,
    sets: int,
    base: float,
) -> float:
    """Checks ``call`` against the float64 twin and, on a GPU, times it; its microseconds (NaN when not
    timed), printed beside ``base``'s."""
    shape, config, variant = label
    err = rel_err(call(0), ref)
    if not err <= (TINYGEMM_TOLERANCE if variant == "tinygemm" else TOLERANCE):  # NaN fails too
        print(f"{shape:8s} {str(config):22s} {variant:10s} WRONG: rel err {err:.1e}, not timed", flush=True)
        log.write("variant", shape=shape, config=config, variant=variant, us=None, rel_err=err)
        return float("nan")
    us = time_graph(call, sets, 10e-6, replays=5) * 1e6 if ref.is_cuda else float("nan")
    ratio = base / us if variant != "registers" else 1.0
    line = f"{shape:8s} {str(config):22s} {variant:10s} {us:7.1f} us ({ratio:.2f}x registers)  rel err {err:.1e}"
    print(line, flush=True)
    log.write("variant", shape=shape, config=config, variant=variant, us=us, rel_err=err)
    return us


def _measure_shape(log: ResultLog, shape: str, n: int, k: int, configs: list[tuple[int, ...]], device: str) -> None:
    """Every load at every config that divides the shape, then (on a GPU) tinygemm, all on one weight set."""
    data = weight_sets(n, k, device, tinygemm=device == "cuda")
    x = torch.randn(1, k, device=device, dtype=torch.bfloat16)
    ref = x.double() @ qref.dequantize_int4(*data[0][:3], dtype=torch.float64).T
    shipped = None  # the first config's (the shipped launch's) registers time: tinygemm's baseline
    for config in configs:
        if n % config[0] or k % (config[1] * config[4]):
            continue
        descs = _descriptors(data, config[0])
        base = float("nan")
        for load in LOADS:
            call = lambda i, ld=load, c=config, d=descs: _row_call(ld, c, x, data[i], d[i])  # noqa: E731
            us = _report(log, (shape, config, load), call, ref, len(data), base)
            base = us if load == "registers" else base
        shipped = base if shipped is None else shipped
    if device == "cuda" and shipped is not None:
        mm = torch.ops.aten._weight_int4pack_mm
        call = lambda i: mm(x, data[i][3], GROUP, data[i][4])  # noqa: E731
        _report(log, (shape, None, "tinygemm"), call, ref, len(data), shipped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, from " + ", ".join(SHAPES))
    parser.add_argument("--configs", nargs="+", default=[",".join(map(str, c)) for c in CONFIGS])
    add_out_argument(parser, "int4_row_pipelines")
    args = parser.parse_args()
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs]
    check_only = not torch.cuda.is_available()
    if check_only:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("int4_row_pipelines: no CUDA GPU; set TRITON_INTERPRET=1 to check the kernels on the CPU")
        shapes, device = {"small": (256, 1024)}, "cpu"
        configs = [(64, 256, 4, s, p) for _, _, _, s, p in configs]
    else:
        shapes = {name: SHAPES[name] for name in args.shapes.split(",")}
        device = "cuda"
        triton.set_allocator(lambda size, _align, _stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    with ResultLog(args.out, "experiments.int4_row_pipelines", check_only=check_only) as log:
        for shape, (n, k) in shapes.items():
            _measure_shape(log, shape, n, k, configs, device)
            if device == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
