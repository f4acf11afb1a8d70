"""Paged attention cases of the kernel benchmark (``python -m benchmarks.kernels``): decode over
batch x context with its config sweep, the decode latency floor, and prefill; each checked against the
float64 reference (kernels/reference.py) before it is timed."""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, replace

import torch
import triton
import triton.testing
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.attention_config import (
    DecodeConfig,
    PrefillConfig,
    default_decode_config,
    num_decode_splits,
)
from omni_gateway.kernels.paged_decode import _decode_split_kernel, paged_decode_attention
from omni_gateway.kernels.paged_prefill import paged_prefill_attention

from benchmarks.lib.common import rel_err, time_graph
from benchmarks.lib.kernel_report import Report

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
    case = dict(kv_dtype=str(kv_dtype), hq=hq, hkv=hkv, batch=batch, ctx=ctx)  # every record of this case
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
                    report.record("decode_case_check_failed", **case, config=asdict(cfg), splits=splits, rel_err=err)
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
            **case,
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
