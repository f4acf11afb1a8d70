"""Launch-config sweep of the quantized linears on the GPU, with every config's output checked against
the torch twins (kernels/quant_reference.py) before it is timed.

    python -m benchmarks.quant_sweep                  # decode sweep + prefill GEMM paths, 8B shapes
    python -m benchmarks.quant_sweep --budget-s 200   # stop sweeping after 200 s (the table still prints)
    python -m benchmarks.quant_sweep --final          # only the shipped dispatch at 1..4096 rows vs bf16

1. Decode (1, 2, 4, 8, 16 rows): FP8 per channel, FP8 per block and int4 (group 128) through a grid
   of ``QuantLinearConfig`` candidates times split-K 1..8, against bf16 (kernels/gemv.py at one row,
   cuBLAS above). Prints the best config per (format, rows, shape) as the literals of
   ``kernels/quant_tuning._TUNED`` and, for int4 at 2-16 rows (one entry per shape serves every bucket),
   ``_TUNED_INT4_DOT``.
2. Prefill (64 to 4096 rows): bf16 cuBLAS, FP8 per channel through ``torch._scaled_mm`` (W8A8) and
   through the weight-only Triton GEMM, FP8 per block and int4 through the Triton GEMM.

Timings are CUDA-graph replays over weight sets larger than L2 (benchmarks/lib/common.time_graph). The
candidates are compiled first in parallel worker processes (Triton's on-disk cache is shared).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.lib.common import RESULTS_DIR, ResultLog, rel_err, time_graph

SHAPES = {  # the largest share of a decode step first, in case the budget runs out
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "lm_head": (128256, 4096),
}
DEVICE = "cuda"
DECODE_ROWS = (1, 2, 4, 8, 16)
PREFILL_ROWS = (64, 256, 1024, 4096)
FORMATS = {"fp8-channel": 0, "fp8-block": 1, "int4": 2}
# How the batch-1 decode calls each shape's one-row kernel (engine/models/llama_rows.py, ``decode_row``): FP8
# per channel and int4 sweep their fused kernels with these operands.
ROW_FUSIONS = {
    "gate_up": dict(norm=True, gated=True),
    "down": dict(residual=True),
    "qkv": dict(norm=True),
    "o": dict(residual=True),
    "lm_head": dict(norm=True, logits=True),
}
ROW_FUSED_FORMATS = (0, 2)
SPLITS_ONE_ROW = (1, 2, 4, 8)
SPLITS_DOT = (1, 2, 4)
# (block_n, block_k, num_warps, stages)
ONE_ROW_FP8 = [
    (4, 1024, 4, 3),
    (8, 512, 4, 3),
    (8, 512, 4, 4),
    (8, 1024, 4, 3),
    (8, 1024, 8, 2),
    (16, 512, 4, 3),
    (16, 512, 8, 3),
    (16, 1024, 8, 3),
    (32, 256, 4, 3),
    (32, 512, 8, 3),
]
ONE_ROW_INT4 = [
    (16, 256, 2, 3),
    (16, 512, 4, 3),
    (16, 1024, 4, 3),
    (32, 256, 2, 3),
    (32, 256, 4, 3),
    (32, 512, 4, 3),
    (32, 512, 8, 3),
    (32, 1024, 4, 2),
    (64, 128, 2, 4),
    (64, 256, 4, 3),
    (64, 256, 8, 4),
    (64, 512, 8, 3),
    (128, 128, 4, 4),
    (128, 256, 4, 3),
    (128, 256, 8, 3),
    # One stage: no cp.async pipeline through shared memory (and none of its block barriers per step); the
    # words load straight into registers and the warps of several programs per SM keep the bytes in flight.
    (64, 256, 4, 1),
    (128, 256, 4, 1),
    (128, 256, 8, 1),
    (128, 512, 8, 1),
    # Two warps for 128 features: each thread's activation loads serve twice the features
    # (python -m benchmarks.analysis.kernel_sass, Triton 3.6: 3.24 instructions a weight at gate_up against 3.79
    # with four).
    (128, 256, 2, 1),
    (128, 512, 2, 1),
]
DOT = [
    (16, 256, 4, 3),
    (16, 512, 4, 3),
    (32, 256, 4, 3),
    (32, 512, 8, 3),
    (64, 256, 8, 3),
    (64, 128, 4, 4),
    (16, 1024, 8, 2),
]
# 2-16 rows of int4: wide one-stage tiles share each activation load among more features, which
# python -m benchmarks.analysis.kernel_sass counts at about 3.3 instructions a weight against 5.5-8 for the above.
DOT_INT4 = [
    (64, 256, 4, 1),
    (128, 128, 4, 1),
    (128, 256, 4, 1),
    (128, 256, 8, 1),
]
GEMMS = [(64, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 128, 8, 3)]


def candidates(fmt: int, rows: int) -> list[Any]:
    from omni_gateway.kernels.quant_tuning import QuantLinearConfig

    grid = (ONE_ROW_INT4 if fmt == 2 else ONE_ROW_FP8) if rows == 1 else DOT + (DOT_INT4 if fmt == 2 else [])
    splits = SPLITS_ONE_ROW if rows == 1 else SPLITS_DOT
    return [
        QuantLinearConfig(block_n=bn, block_k=bk, num_warps=w, stages=st, split_k=sp)
        for bn, bk, w, st in grid
        for sp in splits
    ]


def _weights(n: int, k: int) -> dict[str, Any]:
    from omni_gateway.kernels import quant_reference as qref

    w = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) * 0.02
    return {
        "bf16": w,
        "fp8-channel": qref.quantize_fp8_per_channel(w),
        "fp8-block": qref.quantize_fp8_per_block(w),
        "int4": qref.quantize_int4(w),
    }


def _call(variant: str, x: torch.Tensor, s: dict[str, Any], config: Any = None, gemm: Any = None) -> torch.Tensor:
    from omni_gateway.kernels import gemv, quant_linear

    if variant == "bf16":
        return gemv.linear(x, s["bf16"])
    if variant == "fp8-weight-only":
        return quant_linear.fp8_linear(x, *s["fp8-channel"], config=config, gemm_config=gemm)
    if variant == "int4":
        return quant_linear.int4_linear(x, *s["int4"], config=config, gemm_config=gemm)
    return quant_linear.fp8_linear(x, *s[variant], config=config, gemm_config=gemm)


def _row_operands(shape: str, n: int, k: int) -> dict[str, Any]:
    fusion = ROW_FUSIONS[shape]
    features = n // 2 if fusion.get("gated") else n
    return dict(
        norm_weight=torch.rand(k, device=DEVICE, dtype=torch.bfloat16) + 0.5 if fusion.get("norm") else None,
        eps=1e-5,
        residual=torch.randn(1, features, device=DEVICE, dtype=torch.bfloat16) if fusion.get("residual") else None,
        gated=bool(fusion.get("gated")),
        out_dtype=torch.float32 if fusion.get("logits") else None,
    )


def _row_call(variant: str, x: torch.Tensor, s: dict[str, Any], fusion: dict[str, Any], config: Any = None):
    from omni_gateway.kernels import quant_linear

    if variant == "int4":
        return quant_linear.int4_row_linear(x, *s["int4"], config=config, **fusion)
    return quant_linear.fp8_row_linear(x, *s[variant], config=config, **fusion)


def _row_reference(variant: str, x: torch.Tensor, s: dict[str, Any], fusion: dict[str, Any]) -> torch.Tensor:
    from omni_gateway.kernels import quant_reference as qref
    from omni_gateway.kernels import reference as ref

    if variant == "int4":
        weight = qref.dequantize_int4(*s["int4"], torch.float32)
    else:
        weight = qref.dequantize_fp8(*s[variant], torch.float32)
    return ref.row_linear(x, weight, **fusion).double()


def _reference(variant: str, x: torch.Tensor, s: dict[str, Any], rows: int) -> torch.Tensor:
    from omni_gateway.kernels import quant_reference as qref

    if variant == "bf16":
        return x.double() @ s["bf16"].double().T
    if variant == "int4":
        return x.double() @ qref.dequantize_int4(*s["int4"], torch.float64).T
    if variant == "fp8-channel" and rows > 16:  # W8A8 through torch._scaled_mm
        q, xs = qref.quantize_fp8_per_token(x)
        w, sc = s["fp8-channel"]
        return (q.double() @ w.double().T) * xs.double() * sc.double()[None, :]
    key = "fp8-channel" if variant == "fp8-weight-only" else variant
    return x.double() @ qref.dequantize_fp8(*s[key], torch.float64).T


def _compile_jobs(jobs: list[tuple[int, int, Any]]) -> None:
    """Worker: launch each (format, rows, config) once on a small shape of the same specialization."""
    s = _weights(256, 4096)
    for fmt, rows, config, shape in jobs:
        x = torch.randn(rows, 4096, device=DEVICE, dtype=torch.bfloat16)
        variant = {0: "fp8-channel", 1: "fp8-block", 2: "int4"}[fmt]
        try:
            if shape is None:
                _call(variant, x, s, config)
            else:
                _row_call(variant, x, s, _row_operands(shape, 256, 4096), config)
        except Exception as exc:  # reported again, with its shape, by the timed run
            print(f"[compile] {variant} rows={rows} {shape} {config}: {exc!r}", flush=True)
    torch.cuda.synchronize()


def precompile(workers: int, formats: dict[str, int], rows_list: tuple[int, ...], shapes: list[str]) -> None:
    jobs: list[tuple[int, int, Any, str | None]] = []
    for fmt in formats.values():
        for rows in sorted({min(r, 2) for r in rows_list}):
            fused = rows == 1 and fmt in ROW_FUSED_FORMATS
            # One split > 1 per tile shape is enough: the split count is a runtime argument.
            for c in candidates(fmt, rows):
                if c.split_k <= 2:
                    jobs += [(fmt, rows, c, shape) for shape in (shapes if fused else [None])]
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        pool.map(_compile_jobs, [jobs[i::workers] for i in range(workers)])
    print(f"[compile] {len(jobs)} variants in {time.perf_counter() - t0:.1f} s on {workers} workers", flush=True)


def decode_sweep(
    log: ResultLog, deadline: float, formats: dict[str, int], rows_list: tuple[int, ...], shapes: list[str]
) -> dict[tuple[int, int, int, int], tuple[Any, float, float]]:
    """One row of FP8 per channel and int4 runs the fused kernel the batch-1 decode runs at that shape;
    bf16 stays unfused (its one-row kernel is timed against the model's fusions in benchmarks.quant_gpu)."""
    best: dict[tuple[int, int, int, int], tuple[Any, float, float]] = {}
    for shape in shapes:
        n, k = SHAPES[shape]
        sets = max(1, -(-240_000_000 // (n * k // 2)))
        data = [_weights(n, k) for _ in range(sets)]
        for rows in rows_list:
            if time.perf_counter() > deadline:
                print("[sweep] budget spent; stopping", flush=True)
                return best
            x = torch.randn(rows, k, device=DEVICE, dtype=torch.bfloat16)
            base = time_graph(lambda i: _call("bf16", x, data[i]), sets, 20e-6, replays=5)
            fusion = _row_operands(shape, n, k)
            for variant, fmt in formats.items():
                fused = rows == 1 and fmt in ROW_FUSED_FORMATS

                def call(i: int, c: Any = None, v: str = variant, f: bool = fused) -> torch.Tensor:
                    return _row_call(v, x, data[i], fusion, c) if f else _call(v, x, data[i], c)

                ref = _row_reference(variant, x, data[0], fusion) if fused else _reference(variant, x, data[0], rows)
                # a gated output is rounded three times (gate, up, their product)
                bound = 3e-2 if fused and fusion["gated"] else 1e-2
                timings = []
                for config in candidates(fmt, rows):
                    try:
                        err = rel_err(call(0, config), ref)
                    except Exception as exc:
                        print(f"[sweep] {shape} {variant} rows={rows} {config}: {exc!r}", flush=True)
                        continue
                    ok = err < bound
                    sec = time_graph(lambda i, c=config: call(i, c), sets, 10e-6, replays=5)
                    log.write(
                        "decode",
                        shape=shape,
                        n=n,
                        k=k,
                        rows=rows,
                        variant=variant,
                        fused=fused,
                        config=repr(config),
                        rel_err=err,
                        ok=ok,
                        us=sec * 1e6,
                        bf16_us=base * 1e6,
                    )
                    if ok:
                        timings.append((sec, config))
                    else:
                        print(f"[sweep] WRONG {shape} {variant} rows={rows} {config}: rel err {err:.2e}", flush=True)
                default_err = rel_err(call(0), ref)
                if not default_err < bound:
                    print(f"[sweep] WRONG {shape} {variant} rows={rows} default: {default_err:.2e}", flush=True)
                default = time_graph(call, sets, 10e-6, replays=5)
                if timings:
                    sec, config = min(timings, key=lambda t: t[0])
                    best[(fmt, rows, n, k)] = (config, sec, base)
                    print(
                        f"[sweep] {shape:8s} rows={rows:2d} {variant:12s} bf16 {base * 1e6:7.1f} us  best "
                        f"{sec * 1e6:7.1f} us ({base / sec:.2f}x)  default {default * 1e6:7.1f} us  "
                        f"bn={config.block_n} bk={config.block_k} w={config.num_warps} st={config.stages} "
                        f"split={config.split_k}",
                        flush=True,
                    )
        data.clear()
        torch.cuda.empty_cache()
    return best


def prefill_bench(log: ResultLog, deadline: float) -> bool:
    from omni_gateway.kernels.quant_gemm import GemmConfig

    ok = True
    gemms = [GemmConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=w, stages=st) for bm, bn, bk, w, st in GEMMS]
    for shape, (n, k) in SHAPES.items():
        if shape == "lm_head":
            continue
        s = _weights(n, k)
        for rows in PREFILL_ROWS:
            if time.perf_counter() > deadline:
                print("[prefill] budget spent; stopping", flush=True)
                return ok
            x = torch.randn(rows, k, device=DEVICE, dtype=torch.bfloat16)
            est = 2 * rows * n * k / 600e12
            base = time_graph(lambda i: torch.nn.functional.linear(x, s["bf16"]), 1, est, replays=5)
            line = [f"bf16 {base * 1e6:.0f} us"]
            for variant in ("fp8-channel", "fp8-weight-only", "fp8-block", "int4"):
                ref = _reference(variant, x, s, rows)
                no_scaled_mm = None
                if variant == "fp8-weight-only":
                    from omni_gateway.kernels.quant_tuning import QuantLinearConfig

                    no_scaled_mm = QuantLinearConfig(scaled_mm=False)
                for gemm in gemms if variant != "fp8-channel" else [None]:
                    err = rel_err(_call(variant, x, s, no_scaled_mm, gemm), ref)
                    passed = err < 1e-2
                    ok &= passed
                    sec = time_graph(lambda i, g=gemm: _call(variant, x, s, no_scaled_mm, g), 1, est, replays=5)
                    log.write(
                        "prefill",
                        shape=shape,
                        n=n,
                        k=k,
                        rows=rows,
                        variant=variant,
                        gemm=repr(gemm),
                        rel_err=err,
                        ok=passed,
                        us=sec * 1e6,
                        bf16_us=base * 1e6,
                    )
                    tag = "" if gemm is None else f"[{gemm.block_m}x{gemm.block_n}x{gemm.block_k}]"
                    line.append(f"{variant}{tag} {sec * 1e6:.0f} us {base / sec:.2f}x{'' if passed else ' WRONG'}")
            print(f"[prefill] {shape} rows={rows}: " + ", ".join(line), flush=True)
        s.clear()
        torch.cuda.empty_cache()
    return ok


def final_table(log: ResultLog, deadline: float) -> bool:
    """What ``fp8_linear``/``int4_linear`` run with no config (the tuned table, its fallback and the
    prefill paths) at every 8B shape, checked against the twins and timed against bf16."""
    ok = True
    for shape, (n, k) in SHAPES.items():
        rows_list = (1,) if shape == "lm_head" else (1, 4, 16, 64, 256, 4096)
        sets = max(1, -(-240_000_000 // (n * k // 2)))
        data = [_weights(n, k) for _ in range(sets)]
        for rows in rows_list:
            if time.perf_counter() > deadline:
                print("[final] budget spent; stopping", flush=True)
                return ok
            x = torch.randn(rows, k, device=DEVICE, dtype=torch.bfloat16)
            est = max(10e-6, 2 * rows * n * k / 600e12)
            nsets = sets if rows <= 16 else 1
            base = time_graph(lambda i: _call("bf16", x, data[i]), nsets, est, replays=5)
            line = [f"bf16 {base * 1e6:.1f} us"]
            for variant in FORMATS:
                err = rel_err(_call(variant, x, data[0]), _reference(variant, x, data[0], rows))
                passed = err < 1e-2
                ok &= passed
                sec = time_graph(lambda i, v=variant: _call(v, x, data[i]), nsets, est, replays=5)
                log.write(
                    "final",
                    shape=shape,
                    n=n,
                    k=k,
                    rows=rows,
                    variant=variant,
                    rel_err=err,
                    ok=passed,
                    us=sec * 1e6,
                    bf16_us=base * 1e6,
                )
                line.append(f"{variant} {sec * 1e6:.1f} us {base / sec:.2f}x{'' if passed else ' WRONG'}")
            print(f"[final] {shape:8s} rows={rows:4d}: " + ", ".join(line), flush=True)
        data.clear()
        torch.cuda.empty_cache()
    return ok


def print_tables(best: dict[tuple[int, int, int, int], tuple[Any, float, float]]) -> None:
    """The sweep's winners as the literals of ``quant_tuning._TUNED`` and ``_TUNED_INT4_DOT``."""
    names = {0: "FP8_CHANNEL", 1: "FP8_BLOCKWISE", 2: "INT4_GROUPED"}
    tables: dict[str, list[str]] = {"_TUNED": [], "_TUNED_INT4_DOT": []}
    for (fmt, rows, n, k), (c, sec, base) in sorted(best.items()):
        values = f"({c.block_n}, {c.block_k}, {c.num_warps}, {c.stages}, {c.split_k})"
        note = f"  # {sec * 1e6:.1f} us, {base / sec:.2f}x bf16"
        if fmt == 2 and rows > 1:
            tables["_TUNED_INT4_DOT"].append(f"    ({n}, {k}): {values},{note} (rows={rows})")
        else:
            tables["_TUNED"].append(f"    ({names[fmt]}, {rows}, {n}, {k}): {values},{note}")
    for name, lines in tables.items():
        if lines:
            print("\n" + name + " = {\n" + "\n".join(lines) + "\n}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop the decode sweep after this long")
    parser.add_argument("--prefill-budget-s", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument("--final", action="store_true", help="only time the shipped dispatch (no sweep)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, of " + ",".join(SHAPES))
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated, of " + ",".join(FORMATS))
    parser.add_argument("--rows", default=",".join(map(str, DECODE_ROWS)), help="decode rows to sweep")
    default_out = (
        Path(os.environ["OUT"]) / "quant_sweep.jsonl" if os.environ.get("OUT") else RESULTS_DIR / "quant_sweep.jsonl"
    )
    parser.add_argument("--out", type=Path, default=default_out, metavar="FILE")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.quant_sweep needs a CUDA GPU")
    start = time.perf_counter()
    if args.final:
        with ResultLog(args.out, "quant_sweep", final=True) as log:
            ok = final_table(log, start + args.budget_s)
            log.write("verdict", ok=ok)
        print("all checks passed" if ok else "SOME CHECKS FAILED", flush=True)
        return
    shapes = args.shapes.split(",")
    formats = {name: FORMATS[name] for name in args.formats.split(",")}
    rows_list = tuple(int(r) for r in args.rows.split(","))
    unknown = [s for s in shapes if s not in SHAPES] + [r for r in rows_list if r not in DECODE_ROWS]
    if unknown:
        raise SystemExit(f"unknown shapes or rows {unknown}: shapes {list(SHAPES)}, rows {DECODE_ROWS}")
    precompile(args.workers, formats, rows_list, shapes)
    with ResultLog(args.out, "quant_sweep") as log:
        ok = True
        if not args.skip_prefill:
            ok = prefill_bench(log, time.perf_counter() + args.prefill_budget_s)
        best = decode_sweep(log, start + args.budget_s, formats, rows_list, shapes)
        print_tables(best)
        log.write("verdict", ok=ok)
    print("prefill checks passed" if ok else "SOME PREFILL CHECKS FAILED", flush=True)


if __name__ == "__main__":
    main()
