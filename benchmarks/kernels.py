"""Correctness and speed of the Triton kernels on a CUDA GPU.

Checks every kernel against ``kernels.reference`` (float64), measures the device copy bandwidth
(one large device-to-device copy, bytes read plus written), then times paged decode attention
with CUDA-graph replays over batch x context, reporting achieved bandwidth (K/V, q and out bytes)
as a share of the copy bandwidth; then prefill attention, the elementwise kernels and the greedy
argmax against torch.argmax.

    python -m benchmarks.kernels                     # full run: benchmarks/results/kernels.jsonl and kernels.md
    python -m benchmarks.kernels --sweep             # also time every decode config in SWEEP
    python -m benchmarks.kernels --heads 32:8 --batches 1,2,4,8 --contexts 1024,2048,4096 \
        --sweep-min-split 64,128,256 --sweep-fused-max 8,16,32,64 --skip floor,prefill,elementwise

The last varies only the split granularity and the in-kernel merge limit around the device
default; --grid FIELD=LIST sweeps any DecodeConfig field the same way, and every new kernel
specialization's registers, spills and shared memory are printed. Add --plan to print the
decode cases and distinct launches such a run would time (no GPU needed).

Every decode config is checked against the float64 reference on a ragged batch, and again on the
first sequences of each timed case (its split count picks its own kernel specialization) before it
is timed.

Raw records go to ``--out`` (JSON lines, default ``benchmarks/results/kernels.jsonl``); the printed
tables are appended beside it, to the same name with ``.md``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
import traceback
from dataclasses import asdict, fields, replace

import torch
import triton
import triton.testing
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.activation import silu_and_mul
from omni_gateway.kernels.argmax import greedy_argmax
from omni_gateway.kernels.attention_config import (
    DecodeConfig,
    PrefillConfig,
    default_decode_config,
    gpu_decode_config,
    num_decode_splits,
)
from omni_gateway.kernels.norm import fused_add_rms_norm, rms_norm
from omni_gateway.kernels.paged_decode import _decode_split_kernel, paged_decode_attention
from omni_gateway.kernels.paged_prefill import paged_prefill_attention
from omni_gateway.kernels.rotary import apply_rotary

from benchmarks.common import ResultLog, add_out_argument, time_graph

PAGE = 16
L2_ROTATION_BYTES = 512 << 20  # rotate inputs until one graph replay touches this much (L2 is 60 MB)
# The first H200 sweep (block_n 32/64/128, warps 4/8, stages 2/3, target 264/528/1056) settled on
# 64/4/3/264; this grid refines split granularity for the small, latency-bound cases.
SWEEP = [
    DecodeConfig(block_n=bn, num_warps=w, num_stages=s, target_programs=t, min_split_tokens=m, fused_reduce=f)
    for bn, w, s, t, m, f in itertools.product((64, 128), (4,), (3, 4), (264, 396, 528), (64, 128, 256), (False, True))
]


def decode_sweep(base: DecodeConfig, grid: dict[str, list[object]]) -> list[DecodeConfig]:
    """``base`` with every combination of the values ``grid`` gives its DecodeConfig fields."""
    names = list(grid)
    return [replace(base, **dict(zip(names, values))) for values in itertools.product(*grid.values())]


def launch_key(cfg: DecodeConfig, batch: int, hkv: int, ctx: int) -> tuple[object, ...]:
    """What a decode launch of this case actually runs: configs with equal keys time the same kernels,
    for example fused_max_splits 16 and 32 when the case has 8 splits."""
    splits, per_split = num_decode_splits(batch, hkv, ctx, cfg)
    return cfg.block_n, cfg.num_warps, cfg.num_stages, splits, per_split, cfg.merges_in_kernel(splits)


def config_label(cfg: DecodeConfig, splits: int) -> str:
    merge = "fused" if cfg.merges_in_kernel(splits) else ("merge kernel" if splits > 1 else "no merge")
    return (
        f"n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} t{cfg.target_programs} m{cfg.min_split_tokens}"
        f" f{cfg.fused_max_splits if cfg.fused_reduce else 0} ({splits} splits, {merge})"
    )


def parse_ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None


def parse_heads(text: str) -> list[tuple[int, int]]:
    pairs = [pair.split(":") for pair in text.split(",") if pair.strip()]
    if any(len(p) != 2 or not all(x.strip().isdigit() for x in p) for p in pairs):
        raise argparse.ArgumentTypeError(f"expected Hq:Hkv pairs such as 32:8,64:8, got {text!r}")
    return [(int(hq), int(hkv)) for hq, hkv in pairs]


_GRID_FIELDS = {f.name: f.type for f in fields(DecodeConfig)}


def parse_grid(text: str) -> tuple[str, list[object]]:
    """``FIELD=V1,V2`` of a DecodeConfig field: integers, or 0/1 for a flag."""
    name, _, values = text.partition("=")
    kind = _GRID_FIELDS.get(name.strip())
    if kind is None or not values:
        raise argparse.ArgumentTypeError(
            f"expected FIELD=V1,V2 with FIELD among {', '.join(_GRID_FIELDS)}, got {text!r}"
        )
    ints = parse_ints(values)
    if kind in ("bool", bool):
        if any(v not in (0, 1) for v in ints):
            raise argparse.ArgumentTypeError(f"{name}: expected 0 or 1 for a flag, got {values!r}")
        return name.strip(), [bool(v) for v in ints]
    return name.strip(), ints


def compiled_resources(kernel: object) -> dict[object, dict[str, object]]:
    """Registers, spills and shared memory of every specialization ``kernel`` has compiled, keyed by
    the compiled object's id. Triton keeps its per-device kernel cache in a tuple whose layout
    changes between versions, so every dict in it whose values carry compile metadata is read."""
    out: dict[object, dict[str, object]] = {}
    for entry in getattr(kernel, "device_caches", {}).values():
        for part in entry if isinstance(entry, tuple) else (entry,):
            if not isinstance(part, dict):
                continue
            for compiled in part.values():
                meta = getattr(compiled, "metadata", None)
                if meta is None:
                    continue
                out[id(compiled)] = dict(
                    n_regs=getattr(compiled, "n_regs", None),
                    n_spills=getattr(compiled, "n_spills", None),
                    shared=getattr(meta, "shared", None),
                    num_warps=getattr(meta, "num_warps", None),
                    num_stages=getattr(meta, "num_stages", None),
                )
    return out


class Report:
    """Raw records to the run's JSON-lines file, and each table printed and appended to its ``.md`` twin."""

    def __init__(self, log: ResultLog) -> None:
        self.log = log
        self.md = open(log.path.with_suffix(".md"), "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def record(self, kind: str, **fields: object) -> None:
        self.log.write(kind, **fields)

    def table(self, title: str, header: list[str], rows: list[list[object]]) -> None:
        lines = [f"\n### {title}\n", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        text = "\n".join(lines) + "\n"
        self.md.write(text)
        self.md.flush()
        print(text, flush=True)

    def close(self) -> None:
        self.md.close()
        self.log.close()


def rel_err(out: torch.Tensor, expected: torch.Tensor) -> float:
    if torch.isnan(out).any():
        return float("nan")
    return float((out.double() - expected.double()).norm() / expected.double().norm())


def copy_bandwidth(report: Report) -> float:
    n = 2 << 30  # 2 GiB per buffer
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median") / 1e3
    assert torch.equal(dst[:4096], src[:4096])
    bw = 2 * n / t
    report.record("copy", bytes=2 * n, seconds=t, bandwidth=bw)
    report.table(
        "Device copy", ["buffer", "time (ms)", "GB/s (read+write)"], [["2 GiB", f"{t * 1e3:.3f}", f"{bw / 1e9:.0f}"]]
    )
    return bw


def _random_tables(batch: int, blocks_per_seq: int, num_blocks: int, n_sets: int) -> list[torch.Tensor]:
    perm = torch.randperm(num_blocks, device="cuda").to(torch.int32)
    per_set = batch * blocks_per_seq
    return [perm[i * per_set : (i + 1) * per_set].view(batch, blocks_per_seq).contiguous() for i in range(n_sets)]


# --kv-cache-dtype: the decode cases' cache element type (vLLM's names). An fp8 cache holds values at
# scale 1, as the engine's does once its per-tensor scales are folded into the softmax scale.
KV_DTYPES = {"bfloat16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def _random_cache(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, device="cuda", dtype=torch.bfloat16).to(dtype)


def check_decode_configs(
    configs: list[DecodeConfig], report: Report, kv_dtype: torch.dtype = torch.bfloat16
) -> list[DecodeConfig]:
    """Keep the configs that compile and match the reference on a ragged GQA batch."""
    torch.manual_seed(0)
    lens = [1, 15, 17, 300, 1000, 2100]
    hq, hkv, d = 32, 4, 128
    blocks = max(math.ceil(n / PAGE) for n in lens) + 1
    num_blocks = len(lens) * blocks
    k_cache = _random_cache((num_blocks, PAGE, hkv, d), kv_dtype)
    v_cache = _random_cache((num_blocks, PAGE, hkv, d), kv_dtype)
    tables = _random_tables(len(lens), blocks, num_blocks, 1)[0]
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(len(lens), hq, d, device="cuda", dtype=torch.bfloat16)
    expected = ref.paged_decode_attention(q.double(), k_cache.double(), v_cache.double(), seq_lens, tables, d**-0.5)
    good = []
    for cfg in configs:
        try:
            out = paged_decode_attention(q, k_cache, v_cache, seq_lens, tables, d**-0.5, config=cfg)
            torch.cuda.synchronize()
            err = rel_err(out, expected)
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is skipped and logged
            report.record("decode_config_failed", config=asdict(cfg), error=repr(exc)[:300])
            continue
        report.record("decode_config_check", config=asdict(cfg), rel_err=err)
        if err < 1e-2:
            good.append(cfg)
        else:
            print(f"config {cfg} rel_err {err}", flush=True)
    return good


# Sequences of a timed case that its check compares: the float64 reference of a whole large case
# would take tens of GB, and on the H200 holding that much memory left the timed replays about 12%
# slower (64/8 heads, batch 64, 4k context: 281 us after a whole-batch check, 246 us without).
_CHECK_SEQS = 4


def _case_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    table: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """float64 reference of the first ``_CHECK_SEQS`` sequences of a timed decode case, over only the
    blocks their table rows use."""
    q, seq_lens, table = q[:_CHECK_SEQS], seq_lens[:_CHECK_SEQS], table[:_CHECK_SEQS]
    used = table.flatten().long()
    compact = torch.arange(used.numel(), dtype=torch.int32, device=table.device).view_as(table)
    return ref.paged_decode_attention(
        q.double(), k_cache[used].double(), v_cache[used].double(), seq_lens, compact, scale
    )


def _decode_case(
    copy_bw: float,
    hq: int,
    hkv: int,
    batch: int,
    ctx: int,
    sweep: list[DecodeConfig],
    report: Report,
    kv_dtype: torch.dtype = torch.bfloat16,
) -> list[object]:
    """Time one decode case with its default config and every sweep config; the table row. Its tensors are
    freed on return."""
    d = 128
    dtype = torch.bfloat16
    blocks_per_seq = ctx // PAGE
    kv_bytes = batch * ctx * hkv * d * 2 * kv_dtype.itemsize
    io_bytes = kv_bytes + 2 * batch * hq * d * 2 + batch * blocks_per_seq * 4
    n_sets = max(1, min(64, math.ceil(L2_ROTATION_BYTES / kv_bytes)))
    num_blocks = n_sets * batch * blocks_per_seq
    k_cache = _random_cache((num_blocks, PAGE, hkv, d), kv_dtype)
    v_cache = _random_cache((num_blocks, PAGE, hkv, d), kv_dtype)
    tables = _random_tables(batch, blocks_per_seq, num_blocks, n_sets)
    qs = [torch.randn(batch, hq, d, device="cuda", dtype=dtype) for _ in range(n_sets)]
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    est = io_bytes / (0.8 * copy_bw) + 4e-6
    default = default_decode_config(qs[0], hkv, ctx, kv_dtype.itemsize)
    expected = _case_reference(qs[0], k_cache, v_cache, seq_lens, tables[0], d**-0.5)
    torch.cuda.empty_cache()  # the reference's temporaries
    results: dict[DecodeConfig, float] = {}
    timed: dict[tuple[object, ...], float] = {}  # launch_key -> seconds, so equal launches run once
    for cfg in [default] + [c for c in sweep if c != default]:
        splits, per_split = num_decode_splits(batch, hkv, ctx, cfg)
        key = launch_key(cfg, batch, hkv, ctx)
        fn = lambda i, cfg=cfg: paged_decode_attention(
            qs[i], k_cache, v_cache, seq_lens, tables[i], d**-0.5, config=cfg
        )
        if key not in timed:
            known = compiled_resources(_decode_split_kernel)
            try:
                err = rel_err(fn(0)[:_CHECK_SEQS], expected)
                if not err < 1e-2:  # NaN fails too
                    report.record(
                        "decode_case_check_failed",
                        kv_dtype=str(kv_dtype),
                        hq=hq,
                        hkv=hkv,
                        batch=batch,
                        ctx=ctx,
                        config=asdict(cfg),
                        splits=splits,
                        rel_err=err,
                    )
                    print(f"config {cfg} on batch {batch} ctx {ctx}: rel_err {err}", flush=True)
                    continue
                timed[key] = time_graph(fn, n_sets, est)
                for res in (v for k, v in compiled_resources(_decode_split_kernel).items() if k not in known):
                    report.record("decode_kernel_resources", config=asdict(cfg), splits=splits, **res)
                    print(f"  compiled {config_label(cfg, splits)}: {res}", flush=True)
            except Exception as exc:  # noqa: BLE001 - resource limits differ per config; log and go on
                report.record("decode_time_failed", config=asdict(cfg), error=repr(exc)[:300])
                continue
        t = results[cfg] = timed[key]
        report.record(
            "decode",
            kv_dtype=str(kv_dtype),
            hq=hq,
            hkv=hkv,
            batch=batch,
            ctx=ctx,
            config=asdict(cfg),
            splits=splits,
            tokens_per_split=per_split,
            fused=cfg.merges_in_kernel(splits),
            seconds=t,
            bandwidth=io_bytes / t,
            frac_copy=io_bytes / t / copy_bw,
        )
    if not results:
        raise RuntimeError(f"decode {hq}/{hkv} batch {batch} ctx {ctx}: no config passed its check and timed")
    best_cfg = min(results, key=results.get)
    t_best = results[best_cfg]
    t_def = results.get(default)
    return [
        f"{hq}/{hkv}",
        batch,
        ctx,
        f"{io_bytes / 1e6:.1f}",
        *(
            (f"{t_def * 1e6:.1f}", f"{io_bytes / t_def / 1e9:.0f}", f"{100 * io_bytes / t_def / copy_bw:.0f}%")
            if t_def is not None
            else ("failed", "-", "-")
        ),
        f"{t_best * 1e6:.1f}",
        f"{100 * io_bytes / t_best / copy_bw:.0f}%",
        config_label(best_cfg, num_decode_splits(batch, hkv, ctx, best_cfg)[0]),
    ]


def bench_decode(
    copy_bw: float,
    heads: list[tuple[int, int]],
    batches: list[int],
    contexts: list[int],
    sweep: list[DecodeConfig],
    report: Report,
    kv_dtype: torch.dtype = torch.bfloat16,
) -> None:
    rows = []
    for (hq, hkv), batch, ctx in itertools.product(heads, batches, contexts):
        if ctx % PAGE:
            raise ValueError(f"--contexts: expected multiples of the block size {PAGE}, got {ctx}")
        rows.append(_decode_case(copy_bw, hq, hkv, batch, ctx, sweep, report, kv_dtype))
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    report.table(
        f"Paged decode attention, {kv_dtype} cache, bf16 queries, head_dim 128, block 16, CUDA-graph replay "
        f"(copy BW {copy_bw / 1e9:.0f} GB/s)",
        [
            "Hq/Hkv",
            "batch",
            "context",
            "MB moved",
            "default us",
            "default GB/s",
            "default % copy",
            "best us",
            "best % copy",
            "best config",
        ],
        rows,
    )


def decode_latency_floor(report: Report) -> None:
    """Per-call time of decode launches that move almost no data: the fixed cost under each row."""
    hq, hkv, d = 32, 4, 128
    rows = []
    for ctx, cfg, label in (
        (16, DecodeConfig(), "1 kernel (single split)"),
        (128, DecodeConfig(block_n=64, target_programs=1000, min_split_tokens=64), "split + reduce (2 splits)"),
        (
            128,
            DecodeConfig(block_n=64, target_programs=1000, min_split_tokens=64, fused_reduce=True),
            "split, fused reduce (2 splits)",
        ),
    ):
        num_blocks = 64 * (ctx // PAGE)
        k_cache = torch.randn(num_blocks, PAGE, hkv, d, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        tables = _random_tables(1, ctx // PAGE, num_blocks, 64)
        q = torch.randn(1, hq, d, device="cuda", dtype=torch.bfloat16)
        seq_lens = torch.full((1,), ctx, dtype=torch.int32, device="cuda")
        t = time_graph(
            lambda i: paged_decode_attention(q, k_cache, v_cache, seq_lens, tables[i], d**-0.5, config=cfg), 64, 5e-6
        )
        report.record("decode_floor", ctx=ctx, label=label, seconds=t)
        rows.append([label, ctx, f"{t * 1e6:.2f}"])
    report.table("Decode latency floor (batch 1, Hq/Hkv 32/4, CUDA-graph replay)", ["launch", "context", "us"], rows)


def _prefill_case(batch: int, q_len: int, ctx: int, configs: list[PrefillConfig], report: Report) -> list[object]:
    """Time one prefill case with every config and the default; the table row. Its tensors are freed on
    return."""
    hq, hkv, d = 32, 4, 128
    dtype = torch.bfloat16
    blocks_per_seq = ctx // PAGE
    num_blocks = batch * blocks_per_seq
    k_cache = torch.randn(num_blocks, PAGE, hkv, d, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    tables = _random_tables(batch, blocks_per_seq, num_blocks, 1)[0]
    q = torch.randn(batch * q_len, hq, d, device="cuda", dtype=dtype)
    cu = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * q_len
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    visible = batch * sum(ctx - q_len + i + 1 for i in range(q_len))
    flops = 4 * d * hq * visible
    expected = None
    if batch * q_len * ctx <= 4096 * 4096:
        expected = ref.paged_prefill_attention(
            q.float(), k_cache.float(), v_cache.float(), cu, seq_lens, tables, d**-0.5
        )
    best = None
    for cfg in configs:
        try:
            fn = lambda cfg=cfg: paged_prefill_attention(q, k_cache, v_cache, cu, seq_lens, tables, d**-0.5, config=cfg)
            out = fn()
            err = rel_err(out, expected) if expected is not None else float("nan")
            t = triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") / 1e3
        except Exception as exc:  # noqa: BLE001
            report.record("prefill_failed", config=asdict(cfg), error=repr(exc)[:300])
            continue
        report.record(
            "prefill",
            batch=batch,
            q_len=q_len,
            ctx=ctx,
            config=asdict(cfg),
            seconds=t,
            tflops=flops / t / 1e12,
            rel_err=err,
        )
        if best is None or t < best[0]:
            best = (t, cfg, err)
    t_def = (
        triton.testing.do_bench(
            lambda: paged_prefill_attention(q, k_cache, v_cache, cu, seq_lens, tables, d**-0.5),
            warmup=10,
            rep=50,
            return_mode="median",
        )
        / 1e3
    )
    sdpa = ""
    if q_len == ctx:
        qd = q.view(batch, q_len, hq, d).transpose(1, 2)
        # Full-head K/V so torch can pick its flash kernel: an upper reference for prefill speed.
        kd = torch.randn(batch, hq, ctx, d, device="cuda", dtype=dtype)
        t_sdpa = (
            triton.testing.do_bench(
                lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, kd, is_causal=True),
                warmup=10,
                rep=50,
                return_mode="median",
            )
            / 1e3
        )
        sdpa = f"{flops / t_sdpa / 1e12:.0f}"
    if best is None:
        raise RuntimeError(f"prefill batch {batch} q_len {q_len} ctx {ctx}: no config compiled and ran")
    t, cfg, err = best
    return [
        batch,
        q_len,
        ctx,
        f"{flops / t_def / 1e12:.0f}",
        f"{flops / t / 1e12:.0f}",
        f"m{cfg.block_m} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}",
        f"{err:.1e}",
        sdpa,
    ]


def bench_prefill(report: Report) -> None:
    configs = [
        PrefillConfig(block_m=m, block_n=n, num_warps=w, num_stages=s)
        for m, n, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3))
    ]
    rows = []
    for batch, q_len, ctx in ((1, 4096, 4096), (4, 1024, 4096), (16, 256, 2048)):
        rows.append(_prefill_case(batch, q_len, ctx, configs, report))
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    report.table(
        "Paged prefill attention, bf16, Hq/Hkv 32/4, head_dim 128 (TFLOP/s, causal FLOPs)",
        [
            "batch",
            "new tokens/seq",
            "context",
            "default",
            "best",
            "best config",
            "best rel err",
            "torch SDPA (contiguous KV)",
        ],
        rows,
    )


def bench_elementwise(copy_bw: float, report: Report) -> None:
    dtype = torch.bfloat16
    t_tok, hidden, inter, hq, hkv, d = 8192, 4096, 14336, 32, 8, 128
    x = torch.randn(t_tok, hidden, device="cuda", dtype=dtype)
    res = torch.randn_like(x)
    w = torch.randn(hidden, device="cuda", dtype=dtype)
    gate_up = torch.randn(t_tok, 2 * inter, device="cuda", dtype=dtype)
    q = torch.randn(t_tok, hq, d, device="cuda", dtype=dtype)
    k = torch.randn(t_tok, hkv, d, device="cuda", dtype=dtype)
    pos = torch.randint(0, 8192, (t_tok,), device="cuda")
    inv = 1.0 / (10000 ** (torch.arange(0, d // 2, device="cuda", dtype=torch.float32) / (d // 2)))
    ang = torch.arange(8192, device="cuda", dtype=torch.float32)[:, None] * inv[None]
    cos_sin = torch.cat([ang.cos(), ang.sin()], 1)
    e = x.element_size()
    cases = [
        (
            "rms_norm",
            lambda m: m.rms_norm(x, w, 1e-6),
            2 * x.numel() * e,
            lambda: rel_err(rms_norm(x, w, 1e-6), ref.rms_norm(x.double(), w.double(), 1e-6)),
        ),
        (
            "fused_add_rms_norm",
            lambda m: m.fused_add_rms_norm(x, res, w, 1e-6),
            4 * x.numel() * e,
            lambda: rel_err(
                fused_add_rms_norm(x, res, w, 1e-6)[0],
                ref.fused_add_rms_norm(x.double(), res.double(), w.double(), 1e-6)[0],
            ),
        ),
        (
            "silu_and_mul",
            lambda m: m.silu_and_mul(gate_up),
            1.5 * gate_up.numel() * e,
            lambda: rel_err(silu_and_mul(gate_up), ref.silu_and_mul(gate_up.double())),
        ),
        (
            "apply_rotary",
            lambda m: m.apply_rotary(q, k, pos, cos_sin),
            2 * (q.numel() + k.numel()) * e,
            lambda: rel_err(
                apply_rotary(q, k, pos, cos_sin)[0], ref.apply_rotary(q.double(), k.double(), pos, cos_sin.double())[0]
            ),
        ),
    ]
    impls = {
        "rms_norm": rms_norm,
        "fused_add_rms_norm": fused_add_rms_norm,
        "silu_and_mul": silu_and_mul,
        "apply_rotary": apply_rotary,
    }
    ns = argparse.Namespace(**impls)
    rows = []
    for name, call, nbytes, check in cases:
        err = check() if check else float("nan")
        t = triton.testing.do_bench(lambda: call(ns), warmup=25, rep=100, return_mode="median") / 1e3
        t_ref = triton.testing.do_bench(lambda: call(ref), warmup=25, rep=100, return_mode="median") / 1e3
        report.record("elementwise", name=name, seconds=t, ref_seconds=t_ref, bytes=nbytes, rel_err=err)
        rows.append(
            [
                name,
                f"{t * 1e6:.1f}",
                f"{nbytes / t / 1e9:.0f}",
                f"{100 * nbytes / t / copy_bw:.0f}%",
                f"{t_ref * 1e6:.1f}",
                f"{err:.1e}",
            ]
        )
    report.table(
        f"Elementwise kernels, bf16, {t_tok} tokens (hidden {hidden}, intermediate {inter}, Hq/Hkv {hq}/{hkv})",
        ["kernel", "us", "GB/s", "% copy", "torch reference us", "rel err"],
        rows,
    )


def bench_argmax(report: Report) -> None:
    """greedy_argmax against torch.argmax on float32 logits, both replayed from a CUDA graph as
    the decode step runs them (the logits just written, so largely in L2)."""
    rows_out = []
    for vocab in (128256, 151936):
        for rows in (1, 8, 64):
            sets = [torch.randn(rows, vocab, device="cuda") for _ in range(4)]
            got = torch.stack([greedy_argmax(x) for x in sets])
            want = torch.stack([x.argmax(dim=-1) for x in sets])
            if not torch.equal(got, want):
                raise AssertionError(f"greedy_argmax differs from torch.argmax at rows={rows}, vocab={vocab}")
            t = time_graph(lambda i: greedy_argmax(sets[i]), len(sets), 5e-6)
            t_ref = time_graph(lambda i: sets[i].argmax(dim=-1), len(sets), 3e-5)
            report.record("argmax", rows=rows, vocab=vocab, seconds=t, ref_seconds=t_ref)
            rows_out.append([rows, vocab, f"{t * 1e6:.1f}", f"{t_ref * 1e6:.1f}", f"{t_ref / t:.1f}x"])
    report.table(
        "Greedy argmax over float32 logits (graph replay)",
        ["rows", "vocab", "greedy_argmax us", "torch.argmax us", "speed-up"],
        rows_out,
    )


def sweep_configs(args: argparse.Namespace, base: DecodeConfig) -> list[DecodeConfig]:
    """The decode configs to time beside each case's default: the product of the --grid and --sweep-*
    lists around ``base`` when any is given, else the SWEEP grid with --sweep, else none."""
    grid = dict(args.grid)
    if args.sweep_min_split:
        grid["min_split_tokens"] = args.sweep_min_split
    if args.sweep_fused_max:
        grid["fused_max_splits"] = args.sweep_fused_max
    if grid:
        return decode_sweep(base, grid)
    return list(SWEEP) if args.sweep else []


def print_plan(args: argparse.Namespace) -> None:
    """The decode cases and launches a run with these arguments would time, without touching a GPU.

    Rough cost per distinct launch: a reference check plus a graph of up to ~450 launches replayed
    11 times (~0.2 s); per new kernel specialization a Triton compile (~2 s, cached on disk after)."""
    base = gpu_decode_config(args.sms)
    configs = [base] + [c for c in sweep_configs(args, base) if c != base]
    print(f"base config (a GPU with {args.sms} SMs): {base}")
    print(f"{len(configs)} decode configs: " + "; ".join(config_label(c, 0).split(" (")[0] for c in configs))
    launches, kernels = 0, set()
    for (hq, hkv), batch, ctx in itertools.product(args.heads, args.batches, args.contexts):
        keys: dict[tuple[object, ...], DecodeConfig] = {}
        for c in configs:  # the first config of each launch is the one timed
            keys.setdefault(launch_key(c, batch, hkv, ctx), c)
        launches += len(keys)
        for block_n, warps, stages, splits, _, fused in keys:
            kernels.add((hq, hkv, block_n, warps, stages, splits == 1, fused, max(2, 1 << (splits - 1).bit_length())))
        print(
            f"  {hq}/{hkv} batch {batch} ctx {ctx}: {len(keys)} distinct launches: "
            + ", ".join(config_label(c, k[3]) for k, c in keys.items())
        )
    cases = len(args.heads) * len(args.batches) * len(args.contexts)
    print(
        f"{cases} cases x {len(configs)} configs = {cases * len(configs)} results from {launches} timed launches "
        f"and about {len(kernels)} kernel specializations: roughly {0.2 * launches + 2 * len(kernels):.0f} s "
        "of decode timing, after the copy-bandwidth and ragged-batch checks (~10 s)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true", help="time every decode config in SWEEP as well")
    parser.add_argument(
        "--sweep-min-split",
        type=parse_ints,
        default=[],
        metavar="LIST",
        help="sweep DecodeConfig.min_split_tokens over these values around the base config "
        "(implies --sweep, replaces the SWEEP grid)",
    )
    parser.add_argument(
        "--sweep-fused-max",
        type=parse_ints,
        default=[],
        metavar="LIST",
        help="sweep DecodeConfig.fused_max_splits over these values around the base config "
        "(implies --sweep, replaces the SWEEP grid)",
    )
    parser.add_argument(
        "--grid",
        type=parse_grid,
        action="append",
        default=[],
        metavar="FIELD=LIST",
        help="sweep a DecodeConfig field over these values around the base config (the device's 64-token, "
        "3-programs-per-SM config; each case's own default is timed too); repeat for "
        "a product, e.g. --grid num_stages=3,4 --grid target_programs=64,132 (replaces the SWEEP grid)",
    )
    parser.add_argument("--heads", type=parse_heads, default="32:4,64:8", help="Hq:Hkv pairs for decode")
    parser.add_argument("--batches", type=parse_ints, default="1,16,64,256")
    parser.add_argument("--contexts", type=parse_ints, default="1024,4096,16384")
    parser.add_argument(
        "--kv-cache-dtype", choices=list(KV_DTYPES), default="bfloat16", help="the decode cases' cache elements"
    )
    parser.add_argument(
        "--skip", default="", help="comma list of sections to skip: decode,floor,prefill,elementwise,argmax"
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the decode cases and distinct launches this run would time, then exit (no GPU)",
    )
    parser.add_argument("--sms", type=int, default=132, help="SM count the --plan assumes (132: H200)")
    add_out_argument(parser, "kernels")
    args = parser.parse_args()
    if args.plan:
        print_plan(args)
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    report = Report(ResultLog(args.out, "kernels", sms=props.multi_processor_count, triton=triton.__version__))
    report.md.write(
        f"\n## Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {props.name} "
        f"({props.multi_processor_count} SMs), torch {torch.__version__}, triton {triton.__version__}\n\n"
        f"Command: `python -m benchmarks.kernels {' '.join(sys.argv[1:])}`\n"
    )
    copy_bw = copy_bandwidth(report)
    skip = set(args.skip.split(","))
    base = gpu_decode_config(props.multi_processor_count)
    kv_dtype = KV_DTYPES[args.kv_cache_dtype]
    sections = [
        (
            "decode",
            lambda: bench_decode(
                copy_bw,
                args.heads,
                args.batches,
                args.contexts,
                check_decode_configs(sweep_configs(args, base), report, kv_dtype),
                report,
                kv_dtype,
            ),
        ),
        ("floor", lambda: decode_latency_floor(report)),
        ("prefill", lambda: bench_prefill(report)),
        ("elementwise", lambda: bench_elementwise(copy_bw, report)),
        ("argmax", lambda: bench_argmax(report)),
    ]
    failed = 0
    for name, run in sections:
        if name in skip:
            continue
        try:
            run()
        except Exception:  # noqa: BLE001 - one broken section must not cost the others' numbers
            failed += 1
            traceback.print_exc()
            report.record("section_failed", section=name, error=traceback.format_exc()[-2000:])
    report.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
