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
import sys
import time
import traceback
from dataclasses import fields

import torch
import triton
import triton.testing
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.activation import silu_and_mul
from omni_gateway.kernels.argmax import greedy_argmax
from omni_gateway.kernels.attention_config import DecodeConfig, gpu_decode_config
from omni_gateway.kernels.norm import fused_add_rms_norm, rms_norm
from omni_gateway.kernels.rotary import apply_rotary

from benchmarks.lib.attention_cases import (
    KV_DTYPES,
    SWEEP,
    bench_decode,
    bench_prefill,
    check_decode_configs,
    config_label,
    decode_latency_floor,
    decode_sweep,
    launch_key,
)
from benchmarks.lib.common import ResultLog, add_out_argument, rel_err, time_graph
from benchmarks.lib.kernel_report import Report, copy_bandwidth


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
