"""Weight-only FP8/int4 and the FP8 KV cache on the GPU, every variant against bf16 in one run.

    python -m benchmarks.quant_gpu                 # kernels, 8B batch-1, workload, accuracy
    python -m benchmarks.quant_gpu --quick         # correctness only (kernels + a 2-layer engine pass)
    python -m benchmarks.quant_gpu --variants bf16,fp8-channel --skip-workload

1. Kernels: every 8B (Llama-3.1-8B) linear shape at 1 to 320 rows, checked against
   the torch twins (kernels/quant_reference.py) and timed in CUDA graphs (weights rotated over
   sets bigger than L2): bf16 (kernels/gemv.py at one row, cuBLAS above), FP8 per channel, FP8 per
   128x128 block, int4 group 128, each with the shipped launch configs. The launch-config sweep
   that produced them is benchmarks/quant_sweep.py.
2. Engine, 8B shape with random weights (checkpoints written to ``--tmp``, no download): bf16, FP8
   per channel (``--quantization fp8`` on the bf16 checkpoint; ``fp8-channel-head`` adds
   ``--quantize-lm-head``), FP8 per block (an ``fp8``
   checkpoint with ``weight_scale_inv``), int4 (an AWQ checkpoint), bf16 weights with the FP8 KV
   cache (``fp8-kv``), and FP8 per channel with the FP8 KV cache (``fp8-channel-kv``, vLLM's
   ``--quantization fp8 --kv-cache-dtype fp8``). Per variant: batch-1 decode ms/token (as
   benchmarks/engine_gpu.py measures it), the nano-vllm workload's output tok/s (``--seqs``
   sequences, lengths uniform in [100, 1024]), and
   accuracy against bf16: greedy agreement over ``--check-tokens`` tokens of ``--check-prompts``
   prompts and the largest logprob difference of the tokens both chose while their histories agree.
   Random weights make near-uniform logits, so greedy paths part sooner than on a trained model.

The whole run writes about 30 GB of checkpoints and loads five 8B engines; where one command may run
only 10 minutes, split it (each engine run repeats bf16, the baseline of its ratios):

    python -m benchmarks.quant_gpu --skip-engine
    python -m benchmarks.quant_gpu --skip-kernels --variants bf16,fp8-channel,fp8-block
    python -m benchmarks.quant_gpu --skip-kernels --variants bf16,int4,fp8-kv

Needs torch, triton, transformers, safetensors and tokenizers; nothing of the HTTP/realtime stack.
Every record is appended as a JSON line to ``benchmarks/results/quant_gpu.jsonl`` (``--out``; under
``$OUT`` when that is set).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omni_gateway.kernels import quant_reference as qref

from benchmarks.engine_gpu import b1_decode_seconds, free_cuda, make_workload, trace_decode
from benchmarks.lib.common import RESULTS_DIR, ResultLog, rel_err, time_graph
from tests.harness.model_shapes import shape_config, word_tokenizer

VARIANTS = ("bf16", "fp8-channel", "fp8-channel-head", "fp8-block", "int4", "int4-head", "fp8-kv", "fp8-channel-kv")

SHAPES_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
ROWS = (1, 2, 4, 8, 16, 64, 128, 256, 320)
_LINEARS = [f"self_attn.{n}_proj" for n in "qkvo"] + [f"mlp.{n}_proj" for n in ("gate", "up", "down")]
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


# ---- kernels ---------------------------------------------------------------------------------------


def _quant_sets(n: int, k: int, sets: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(sets):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        fp8c, sc = qref.quantize_fp8_per_channel(w)
        fp8b, sb = qref.quantize_fp8_per_block(w)
        packed, scales, zeros = qref.quantize_int4(w)
        int4 = (qref.tile_int4(packed, 128), scales, zeros)  # as Int4Weight lays it out on CUDA
        out.append(dict(w=w, fp8c=(fp8c, sc), fp8b=(fp8b, sb), int4=int4))
    return out


def _kernel_fns() -> dict[str, Callable[[torch.Tensor, dict[str, Any]], torch.Tensor]]:
    from omni_gateway.kernels import gemv, quant_linear

    return {
        "bf16": lambda x, s: gemv.linear(x, s["w"]),
        "fp8-channel": lambda x, s: quant_linear.fp8_linear(x, *s["fp8c"]),
        "fp8-block": lambda x, s: quant_linear.fp8_linear(x, *s["fp8b"]),
        "int4": lambda x, s: quant_linear.int4_linear(x, *s["int4"]),
    }


def _twins() -> dict[str, Callable[[torch.Tensor, dict[str, Any]], torch.Tensor]]:
    def fp8_channel(x: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
        if x.shape[0] > 16:  # W8A8 through torch._scaled_mm
            return qref.fp8_linear_dynamic(x, *s["fp8c"]).double()
        return x.double() @ qref.dequantize_fp8(*s["fp8c"], torch.float64).T

    return {
        "bf16": lambda x, s: x.double() @ s["w"].double().T,
        "fp8-channel": fp8_channel,
        "fp8-block": lambda x, s: x.double() @ qref.dequantize_fp8(*s["fp8b"], torch.float64).T,
        "int4": lambda x, s: x.double() @ qref.dequantize_int4(*s["int4"], torch.float64).T,
    }


def kernel_bench(log: ResultLog, quick: bool) -> bool:
    """Check (and unless ``quick`` time) every kernel on every 8B shape; returns whether all passed."""
    ok = True
    twins = _twins()
    sets_needed = 1 if quick else None
    for shape, (n, k) in SHAPES_8B.items():
        # Enough sets that one pass over them exceeds the H200's 60 MB L2 in the smallest format (int4).
        sets = sets_needed or max(2, -(-240_000_000 // (n * k // 2)))
        data = _quant_sets(n, k, sets)
        fns = _kernel_fns()
        base: dict[int, float] = {}
        for rows in ROWS:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            line = []
            for name, fn in fns.items():
                err = rel_err(fn(x, data[0]), twins[name](x, data[0]))
                passed = err < 1e-2
                ok &= passed
                record: dict[str, Any] = dict(shape=shape, n=n, k=k, rows=rows, variant=name, rel_err=err, ok=passed)
                if not quick:
                    sec = time_graph(lambda i, fn=fn: fn(x, data[i]), len(data), 20e-6)
                    record["us"] = sec * 1e6
                    if name == "bf16":
                        base[rows] = sec
                    record["speedup_vs_bf16"] = base[rows] / sec
                    line.append(f"{name} {sec * 1e6:.1f} us ({base[rows] / sec:.2f}x)")
                else:
                    line.append(f"{name} err {err:.1e}{'' if passed else ' FAIL'}")
                log.write("kernel", **record)
            print(f"[kernel] {shape} {n}x{k} rows={rows}: " + ", ".join(line), flush=True)
        data.clear()
        free_cuda()
    return ok


# ---- checkpoints -----------------------------------------------------------------------------------


def _pack_words(q: torch.Tensor) -> torch.Tensor:
    """uint8 ``[R, 8 C]`` -> int32 ``[R, C]``: column 8c + i into nibble i of word c."""
    q = q.to(torch.int64).view(q.shape[0], -1, 8)
    words = sum(q[:, :, i] << (4 * i) for i in range(8))
    return (words - ((words >> 31) << 32)).to(torch.int32)


def _awq_tensors(name: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    packed, scales, zeros = qref.quantize_int4(w.half())
    order = torch.tensor(_AWQ_ORDER, device=w.device)
    q = qref.unpack_int4(packed).t()
    z = zeros.t()
    return {
        name + ".qweight": _pack_words(q.reshape(q.shape[0], -1, 8)[:, :, order].flatten(1)),
        name + ".qzeros": _pack_words(z.reshape(z.shape[0], -1, 8)[:, :, order].flatten(1)),
        name + ".scales": scales.t().contiguous(),
    }


def write_checkpoints(cfg: Any, root: Path, variants: set[str], seed: int) -> dict[str, str]:
    """Random bf16 weights (HF's init), saved as bf16 plus the pre-quantized layouts ``variants`` need,
    one layer at a time on the GPU; returns variant -> directory."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    dirs = {"bf16": root / "bf16", "fp8-block": root / "fp8-block", "int4": root / "awq", "int4-head": root / "awq"}
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    state = {k: v.detach() for k, v in model.state_dict().items()}
    del model
    base = cfg.to_dict()
    quant_configs = {
        "fp8-block": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
        },
        "int4": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
    }
    needed = variants | ({"int4"} if "int4-head" in variants else set())  # the AWQ checkpoint serves both
    wanted = ["bf16"] + [v for v in ("fp8-block", "int4") if v in needed]
    for variant in wanted:
        t0 = time.perf_counter()
        out: dict[str, torch.Tensor] = {}
        for key, tensor in state.items():
            name = key.removesuffix(".weight")
            if variant == "bf16" or not any(name.endswith(s) for s in _LINEARS):
                out[key] = tensor.to("cpu", torch.float16 if variant == "int4" else torch.bfloat16)
            elif variant == "fp8-block":
                q, scale = qref.quantize_fp8_per_block(tensor)
                out[key], out[name + ".weight_scale_inv"] = q.cpu(), scale.cpu()
            else:
                out.update({k: v.cpu() for k, v in _awq_tensors(name, tensor).items()})
        directory = dirs[variant]
        directory.mkdir(parents=True)
        config = dict(base, **({"quantization_config": quant_configs[variant]} if variant in quant_configs else {}))
        (directory / "config.json").write_text(json.dumps(config))
        save_file(out, str(directory / "model.safetensors"))
        word_tokenizer(cfg.vocab_size).save_pretrained(directory)
        del out
        print(f"[checkpoint] {variant} written in {time.perf_counter() - t0:.1f} s", flush=True)
    del state
    free_cuda()
    return {v: str(dirs.get(v, dirs["bf16"])) for v in variants}


# ---- engine ----------------------------------------------------------------------------------------


def _engine_args(variant: str) -> dict[str, Any]:
    return {
        "fp8-channel": {"quantization": "fp8"},
        "fp8-channel-head": {"quantization": "fp8", "quantize_lm_head": True},
        "int4-head": {"quantize_lm_head": True},
        "fp8-kv": {"kv_cache_dtype": "fp8"},
        "fp8-channel-kv": {"quantization": "fp8", "kv_cache_dtype": "fp8"},
    }.get(variant, {})


def accuracy(llm: Any, prompts: list[list[int]], tokens: int) -> list[tuple[list[int], list[float]]]:
    from omni_gateway.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, logprobs=0)
    # One prompt at a time: the batch-1 decode path, whose kernels differ from the batched one's.
    outs = [llm.generate([prompt], params)[0] for prompt in prompts]
    return [(list(o.outputs[0].token_ids), [lp.logprob for lp in o.outputs[0].logprobs or []]) for o in outs]


def compare(got: list[tuple[list[int], list[float]]], ref: list[tuple[list[int], list[float]]]) -> dict[str, Any]:
    prefixes, errors, same = [], [], 0
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, ref):
        prefix = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), len(tokens))
        prefixes.append(prefix)
        # Up to and including the first difference, both saw the same history.
        errors += [abs(a - b) for a, b in zip(logprobs[: prefix + 1], ref_logprobs[: prefix + 1])]
        same += sum(a == b for a, b in zip(tokens, ref_tokens))
    total = sum(len(t) for t, _ in ref)
    return dict(
        greedy_prefix=prefixes,
        greedy_match_fraction=same / total if total else 1.0,
        max_logprob_error=max(errors, default=0.0),
    )


def run_variant(
    variant: str, model_dir: str, args: argparse.Namespace, check: list[list[int]], work: Any
) -> dict[str, Any]:
    from omni_gateway.engine import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        model_dir,
        device=args.device,
        dtype="bfloat16",
        max_num_seqs=args.seqs,
        max_model_len=2048,
        max_num_batched_tokens=args.batched_tokens,
        gpu_memory_utilization=0.9,
        **_engine_args(variant),
    )
    report: dict[str, Any] = dict(variant=variant, load_s=time.perf_counter() - t0)
    report["accuracy_runs"] = accuracy(llm, check, args.check_tokens)
    if not args.quick:
        b1_prompt = [random.Random(args.seed + 1).randint(2, 10000) for _ in range(args.b1_prompt)]
        llm.generate([b1_prompt], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
        runs = [b1_decode_seconds(llm, b1_prompt, args.b1_new) for _ in range(args.b1_repeats)]
        report["b1_ms_per_token"] = statistics.median(runs) * 1e3
        report["b1_ms_runs"] = [r * 1e3 for r in runs]
        if args.trace_b1:
            print(f"[engine] {variant}:", flush=True)
            trace_decode(llm, b1_prompt, args.trace_b1, top=40)
        if not args.skip_workload and variant in args.workload_variants:
            llm.generate(work.prompts[:8], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
            params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in work.output_lens]
            torch.cuda.synchronize()
            start = time.perf_counter()
            outs = llm.generate(work.prompts, params)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            produced = sum(len(o.outputs[0].token_ids) for o in outs)
            report["workload_s"], report["workload_tok_s"] = seconds, produced / seconds
    del llm
    free_cuda()
    return report


def engine_bench(log: ResultLog, args: argparse.Namespace) -> bool:
    cfg = shape_config("llama-3.1-8b")
    if args.quick:
        cfg.num_hidden_layers = 2
    variants = ["bf16", *[v for v in args.variants if v != "bf16"]]  # bf16 first: the baseline of the ratios
    work = make_workload(args.seqs, 100, 1024, args.seed)
    rng = random.Random(args.seed + 2)
    check = [[rng.randint(2, 10000) for _ in range(rng.randint(16, 200))] for _ in range(args.check_prompts)]
    ok = True
    if args.tmp:
        Path(args.tmp).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        dirs = write_checkpoints(cfg, Path(tmp), set(variants), args.seed)
        reports: dict[str, dict[str, Any]] = {}
        for variant in variants:
            report = run_variant(variant, dirs[variant], args, check, work)
            runs = report.pop("accuracy_runs")
            if variant == "bf16":
                reference = runs
            report.update(compare(runs, reference))
            base = reports.get("bf16", report)
            for key, better in (("b1_ms_per_token", "lower"), ("workload_tok_s", "higher")):
                if key in report and key in base:
                    report[key + "_vs_bf16"] = base[key] / report[key] if better == "lower" else report[key] / base[key]
            finite = all(all(abs(lp) < 1e9 for lp in lps) for _, lps in runs)
            ok &= finite and all(len(t) == args.check_tokens for t, _ in runs)
            reports[variant] = report
            log.write("engine", shape=f"llama-3.1-8b x{cfg.num_hidden_layers} layers", **report)
            print(f"[engine] {variant}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in report.items()), flush=True)
    _summary(reports)
    return ok


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _summary(reports: dict[str, dict[str, Any]]) -> None:
    fp8, int4 = 1.7, 2.5
    targets = {"fp8-channel": fp8, "fp8-channel-head": fp8, "fp8-channel-kv": fp8, "fp8-block": fp8}
    targets |= {"int4": int4, "int4-head": int4}
    print("\nvariant        b1 ms/tok  vs bf16  workload tok/s  vs bf16  greedy match  max logprob err")
    for name, r in reports.items():
        target = f" (target {targets[name]}x)" if name in targets else ""
        print(
            f"{name:<14} {r.get('b1_ms_per_token', float('nan')):9.3f}  {r.get('b1_ms_per_token_vs_bf16', 1.0):6.2f}x"
            f"  {r.get('workload_tok_s', float('nan')):14.0f}  {r.get('workload_tok_s_vs_bf16', float('nan')):6.2f}x"
            f"  {r['greedy_match_fraction']:12.3f}  {r['max_logprob_error']:15.4f}{target}"
        )
    print("targets: FP8 batch-1 >= 1.7x, int4 >= 2.5x, FP8 workload >= 1.3x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="correctness only: kernels and a 2-layer engine")
    parser.add_argument(
        "--variants",
        type=lambda s: s.split(","),
        default=list(VARIANTS),
        help="comma-separated, of " + ",".join(VARIANTS),
    )
    parser.add_argument(
        "--workload-variants",
        type=lambda s: s.split(","),
        default=list(VARIANTS),
        help="variants that run the workload",
    )
    parser.add_argument(
        "--trace-b1",
        type=int,
        default=0,
        metavar="TOKENS",
        help="per variant, trace this many batch-1 tokens with torch.profiler: where a step's time goes by kernel",
    )
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-workload", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batched-tokens", type=int, default=16384)
    parser.add_argument("--b1-prompt", type=int, default=1024)
    parser.add_argument("--b1-new", type=int, default=256)
    parser.add_argument("--b1-repeats", type=int, default=3)
    parser.add_argument("--check-prompts", type=int, default=4)
    parser.add_argument("--check-tokens", type=int, default=64)
    parser.add_argument("--tmp", default=None, help="where the random checkpoints are written (default: $TMPDIR)")
    default_out = (
        Path(os.environ["OUT"]) / "quant_gpu.jsonl" if os.environ.get("OUT") else RESULTS_DIR / "quant_gpu.jsonl"
    )
    parser.add_argument("--out", type=Path, default=default_out, metavar="FILE")
    args = parser.parse_args()
    unknown = [v for v in args.variants + args.workload_variants if v not in VARIANTS]
    if unknown:
        parser.error(
            f"--variants/--workload-variants: unknown {', '.join(unknown)}; expected names among {', '.join(VARIANTS)}"
        )
    if args.quick:
        args.check_tokens = min(args.check_tokens, 16)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.quant_gpu needs a CUDA GPU (the kernels' CPU checks are tests/kernels)")
    ok = True
    with ResultLog(args.out, "quant_gpu", quick=args.quick, variants=args.variants) as log:
        if not args.skip_kernels:
            ok &= kernel_bench(log, args.quick)
        if not args.skip_engine:
            ok &= engine_bench(log, args)
        log.write("verdict", ok=ok)
    print("all checks passed" if ok else "SOME CHECKS FAILED", flush=True)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
