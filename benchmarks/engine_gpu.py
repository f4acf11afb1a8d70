"""End-to-end GPU throughput: the nano-vllm workload on our engine against HF ``generate``, and
batch-1 decode against the HBM roofline.

    python -m benchmarks.engine_gpu --model qwen2.5-0.5b --model llama-3.1-8b [--out FILE]
    python -m benchmarks.engine_gpu --model qwen3-30b-a3b --hf-seqs 32 --tmp /dev/shm

For each dense model shape a checkpoint with random bf16 weights is built on the GPU and saved to a
temp dir (no download), with a word-level tokenizer that covers the whole vocabulary. The mixtures of
experts (``qwen3-30b-a3b``; ``tiny-moe`` to try the path on the CPU with ``--device cpu``) save no
weights: HF's model gets random ones built on the GPU from the config, freed before our engine loads
the temp dir's config and tokenizer with ``load_format="dummy"`` (its own seeded random weights, made
on the GPU), so the two 61 GB copies of Qwen3-30B-A3B never share the GPU; the weights differ, so the
parity check is skipped. Then:

1. Workload (nano-vllm's bench): ``--seqs`` sequences, prompt and output lengths uniform in
   [100, 1024], random prompt token ids, fixed seed, greedy, EOS ignored.
2. HF transformers: one batched ``generate`` over the left-padded prompts. It cannot stop rows
   separately, so it runs to the longest requested output; "useful" tokens/s counts the requested
   outputs only, "raw" counts every generated row token. ``--hf-seqs N`` runs HF on the first N
   sequences only (same length distribution; the MoE's HF generate is too slow, and its KV cache too
   large, for all 256 beside 61 GB of weights): its tokens/s are then those of an N-sequence batch, and
   the report and printout say so (``hf_seqs``).
3. Ours: ``LLM.generate`` with all sequences at once (continuous batching, chunked prefill, the
   Triton kernels, decode CUDA graphs). Output tokens/s over the whole call, prefill included.
4. Batch 1: one request with a ``--b1-prompt``-token prompt; decode time per token is the time of a
   ``--b1-new``-token generate minus a one-token generate, divided by the extra tokens (the median
   of ``--b1-repeats`` such measurements). The roofline is the bytes one decode step must read
   (every weight once, of a sparse layer only the ``top_k`` experts a token routes to, the KV cache
   of the context) over the HBM bandwidth (``--hbm-gbps``, the H200's 4800 GB/s by default); the
   measured device copy bandwidth is printed too.
   ``--compare-unpipelined`` also times the workload and batch 1 with pipelined decode off (see
   engine/core/pipelining.py), in the same process on the same engine.
5. A parity spot check: the first ``--check-tokens`` greedy tokens of a few prompts from HF (batch 1,
   no padding) against ours.

Each model's report is appended to ``benchmarks/results/engine_gpu.jsonl`` (``--out``).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.lib.common import ResultLog, add_out_argument
from tests.harness.model_shapes import SHAPES, fill_fused_experts, shape_config, word_tokenizer

# Shapes our engine runs with ``load_format="dummy"`` (no saved checkpoint): the mixtures of experts.
DUMMY_SHAPES = ("qwen3-30b-a3b", "tiny-moe")


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    def fresh_copy(self, k: int) -> Workload:
        """The same lengths with every prompt token id moved by ``k`` (within 2..10000): a repeated run
        on the same engine finds none of the earlier run's prompts in the prefix cache."""
        return Workload([[2 + (t - 2 + k) % 9999 for t in p] for p in self.prompts], self.output_lens)


def make_workload(seqs: int, lo: int, hi: int, seed: int) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randint(2, 10000) for _ in range(rng.randint(lo, hi))] for _ in range(seqs)]
    return Workload(prompts, [rng.randint(lo, hi) for _ in range(seqs)])


def free_cuda() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync() -> None:
    """Wait for the GPU (nothing to wait for in a ``--device cpu`` run)."""
    if torch.cuda.is_available():
        sync()


def copy_bandwidth_gbps() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    sync()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - start)
    del src, dst
    return 2 * (1 << 30) / sorted(times)[len(times) // 2] / 1e9


def hf_batched(model: Any, work: Workload) -> tuple[float, int]:
    """Seconds of one left-padded batched greedy generate, and the tokens it produced."""
    width = max(map(len, work.prompts))
    new = max(work.output_lens)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in work.prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in work.prompts], device=model.device)
    sync()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
        )
    sync()
    return time.perf_counter() - start, int(out[:, width:].numel())


def hf_greedy_rows(model: Any, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    rows = []
    with torch.inference_mode():
        for p in prompts:
            out = model.generate(
                torch.tensor([p], device=model.device),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=0,
            )
            rows.append(out[0, len(p) :].tolist())
    return rows


def weight_bytes(cfg: Any, element_size: int = 2) -> int:
    """Bytes one batch-1 decode step reads from the weights: every tensor once (the embedding table only as the
    LM head when it is tied; an untied input embedding is one row per token), and of a sparse layer's experts
    only the ``top_k`` the token routes to."""
    import math

    from omni_gateway.engine.models.moe_config import MoeConfig
    from omni_gateway.engine.models.weight_shapes import checkpoint_shapes

    shapes = checkpoint_shapes(cfg)
    moe = MoeConfig.of(cfg)
    share = 1.0 if moe is None else moe.top_k / moe.num_experts
    total = 0.0
    for name, shape in shapes.items():
        if name == "model.embed_tokens.weight" and "lm_head.weight" in shapes:
            continue
        total += math.prod(shape) * (share if ".mlp.experts." in name else 1.0)
    return int(total * element_size)


def run_model(name: str, args: argparse.Namespace, copy_gbps: float) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    cfg = shape_config(name)
    work = make_workload(args.seqs, *args.len_range, args.seed)
    dummy = name in DUMMY_SHAPES
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    report: dict[str, Any] = {
        "model": name,
        "seqs": args.seqs,
        "prompt_tokens": sum(map(len, work.prompts)),
        "output_tokens": sum(work.output_lens),
        "load_format": "dummy" if dummy else "auto",
    }
    if args.tmp:
        Path(args.tmp).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        word_tokenizer(cfg.vocab_size).save_pretrained(tmp)
        report["weight_bytes"] = w_bytes = weight_bytes(cfg, dtype.itemsize)
        check_prompts = work.prompts[: args.check_prompts]
        reference: list[list[int]] | None = None
        if dummy and args.skip_hf:
            cfg.save_pretrained(tmp)  # our engine needs the config only
        else:
            torch.manual_seed(args.seed)
            t0 = time.perf_counter()
            with torch.device(args.device):
                hf = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
            fill_fused_experts(hf)
            hf.generation_config.eos_token_id = None
            if dummy:
                cfg.save_pretrained(tmp)
            else:
                hf.save_pretrained(tmp)
                reference = hf_greedy_rows(hf, check_prompts, args.check_tokens)
            saved = "built random" if dummy else "built and saved random"
            print(f"[{name}] {saved} {dtype} weights in {time.perf_counter() - t0:.1f} s", flush=True)
            if not args.skip_hf:
                run_hf(name, hf, work, args.hf_seqs, report)
            del hf
            free_cuda()

        run_engine(name, args, tmp, work, check_prompts, reference, w_bytes, copy_gbps, report)
    return report


def run_hf(name: str, hf: Any, work: Workload, hf_seqs: int | None, report: dict[str, Any]) -> None:
    """Time HF's batched generate on the workload, or on its first ``hf_seqs`` sequences."""
    n = len(work.prompts) if hf_seqs is None else min(hf_seqs, len(work.prompts))
    part = Workload(work.prompts[:n], work.output_lens[:n])
    hf_batched(hf, Workload(work.prompts[:4], [8] * 4))  # warm-up
    hf_s, hf_raw = hf_batched(hf, part)
    report["hf_seqs"] = n
    report["hf_seconds"] = hf_s
    report["hf_useful_tok_s"] = sum(part.output_lens) / hf_s
    report["hf_raw_tok_s"] = hf_raw / hf_s
    print(
        f"[{name}] HF generate on {n} of {len(work.prompts)} sequences: {hf_s:.1f} s, "
        f"useful {report['hf_useful_tok_s']:.0f} tok/s, raw {report['hf_raw_tok_s']:.0f} tok/s",
        flush=True,
    )


def run_engine(
    name: str,
    args: argparse.Namespace,
    tmp: str,
    work: Workload,
    check_prompts: list[list[int]],
    reference: list[list[int]] | None,
    w_bytes: int,
    copy_gbps: float,
    report: dict[str, Any],
) -> None:
    """Our engine on the saved checkpoint (random weights of its own with ``load_format="dummy"``): the workload
    (unless --b1-only), HF parity (where HF ran the same weights: ``reference``), batch-1 decode."""
    from omni_gateway.engine import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        tmp,
        load_format=report["load_format"],
        seed=args.seed,
        device=args.device,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        max_num_seqs=args.seqs,
        max_model_len=2048,
        max_num_batched_tokens=args.batched_tokens,
        gpu_memory_utilization=0.9,
        enforce_eager=args.eager,
    )
    report["engine_load_s"] = time.perf_counter() - t0
    print(
        f"[{name}] engine loaded in {report['engine_load_s']:.1f} s ({llm.engine.runner.num_kv_blocks} KV blocks)",
        flush=True,
    )
    llm.generate(work.prompts[:8], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))  # warm-up
    if not args.b1_only:
        run_workload(name, llm, work, report)
        if args.compare_unpipelined and llm.engine.pipelined:
            # Off, then on again: the first run also pays one-time costs (kernel compilation for new
            # prefill shapes, allocator growth) that the second of each mode does not.
            # Each run gets prompts of its own, or the prefix cache would serve the repeats' prefills.
            llm.engine.pipelined = False
            run_workload(name, llm, work.fresh_copy(1), report, key="unpipelined_")
            llm.engine.pipelined = True
            run_workload(name, llm, work.fresh_copy(2), report, key="pipelined_again_")

    if reference is not None:
        params = SamplingParams(temperature=0.0, max_tokens=args.check_tokens, ignore_eos=True)
        got = llm.generate(check_prompts, params)
        same = [_common_prefix(list(o.outputs[0].token_ids), ref) for o, ref in zip(got, reference)]
        report["parity_prefix"] = same
        print(
            f"[{name}] greedy tokens identical to HF before the first difference: {same} (of {args.check_tokens})",
            flush=True,
        )
    else:
        print(f"[{name}] no parity check: our dummy weights are not HF's random ones", flush=True)

    b1_prompt = [random.Random(args.seed + 1).randint(2, 10000) for _ in range(args.b1_prompt)]
    llm.generate([b1_prompt], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    ahead_before = llm.engine.num_steps_ahead
    runs = [b1_decode_seconds(llm, b1_prompt, args.b1_new) for _ in range(args.b1_repeats)]
    per_token = statistics.median(runs)
    report["b1_ms_per_token_runs"] = [r * 1e3 for r in runs]
    # Each run generates 1 + (b1_new + 1) tokens twice; a fully pipelined one launches b1_new - 1 steps ahead.
    report["b1_steps_ahead_per_run"] = (llm.engine.num_steps_ahead - ahead_before) / (2 * len(runs))
    print(
        f"[{name}] batch 1, pipelined decode {llm.engine.pipelined}: ms/token over {len(runs)} runs "
        f"{', '.join(f'{r * 1e3:.3f}' for r in runs)}; {report['b1_steps_ahead_per_run']:.1f} steps launched "
        f"ahead per {args.b1_new + 1}-token generate",
        flush=True,
    )
    if args.compare_unpipelined and llm.engine.pipelined:
        llm.engine.pipelined = False
        unpipelined = statistics.median(b1_decode_seconds(llm, b1_prompt, args.b1_new) for _ in range(args.b1_repeats))
        llm.engine.pipelined = True
        report["b1_unpipelined_ms_per_token"] = unpipelined * 1e3
        print(
            f"[{name}] batch 1 without pipelined decode: {unpipelined * 1e3:.3f} ms/token "
            f"(pipelined {per_token * 1e3:.3f}: {unpipelined / per_token:.3f}x)",
            flush=True,
        )
    graph_ms = device_step_ms(llm, b1_prompt)
    if args.profile_b1:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        many = SamplingParams(temperature=0.0, max_tokens=args.b1_new + 1, ignore_eos=True)
        profile.runcall(llm.generate, [b1_prompt], many)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    if args.trace_b1:
        trace_decode(llm, b1_prompt, args.trace_b1)
    if args.probe_b1:
        probe_steps(llm, b1_prompt, args.probe_b1)
    shape = llm.engine.runner.model.shape
    kv_per_token = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * 2
    mean_context = args.b1_prompt + args.b1_new / 2
    step_bytes = w_bytes + kv_per_token * mean_context
    b1 = dict(
        b1_ms_per_token=per_token * 1e3,
        b1_tok_s=1 / per_token,
        b1_step_bytes=step_bytes,
        b1_roofline_ms=step_bytes / (args.hbm_gbps * 1e9) * 1e3,
        b1_fraction_of_roofline=step_bytes / (args.hbm_gbps * 1e9) / per_token,
        b1_fraction_of_copy_bw=step_bytes / (copy_gbps * 1e9) / per_token,
    )
    report.update({k: v for k, v in b1.items()})
    if graph_ms is not None:
        report["b1_graph_replay_ms"] = graph_ms
        print(
            f"[{name}] batch 1: the decode graph alone replays in {graph_ms:.3f} ms "
            f"({100 * step_bytes / (args.hbm_gbps * 1e9) / (graph_ms / 1e3):.1f}% of {args.hbm_gbps:.0f} GB/s); "
            f"the other {per_token * 1e3 - graph_ms:.3f} ms of a step are host work and launch",
            flush=True,
        )
    print(
        f"[{name}] batch 1: {per_token * 1e3:.3f} ms/token ({1 / per_token:.0f} tok/s), "
        f"{step_bytes / 1e9:.3f} GB per step -> {100 * report['b1_fraction_of_roofline']:.1f}% of "
        f"{args.hbm_gbps:.0f} GB/s, {100 * report['b1_fraction_of_copy_bw']:.1f}% of the measured copy "
        f"bandwidth",
        flush=True,
    )
    del llm
    free_cuda()


def b1_decode_seconds(llm: Any, prompt: list[int], new_tokens: int) -> float:
    """Seconds per decode token of one request: a ``new_tokens + 1``-token generate minus a one-token
    generate (its prefill and first token), over ``new_tokens``; the faster of two of each."""
    from omni_gateway.engine import SamplingParams

    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    many = SamplingParams(temperature=0.0, max_tokens=new_tokens + 1, ignore_eos=True)
    timings = []
    for p in (one, many, one, many):
        sync()
        start = time.perf_counter()
        llm.generate([prompt], p)
        sync()
        timings.append(time.perf_counter() - start)
    return (min(timings[1], timings[3]) - min(timings[0], timings[2])) / new_tokens


def device_step_ms(llm: Any, prompt: list[int], steps: int = 100) -> float | None:
    """Median device ms of the batch-1 decode graph over a ``steps``-token generate (CUDA events
    around each replay: the step's device time without the host's share); None without graphs."""
    marks = graph_replay_marks(llm, prompt, steps)
    return None if marks is None else statistics.median(b.elapsed_time(e) for b, e, _ in marks)


def graph_replay_marks(
    llm: Any, prompt: list[int], steps: int
) -> list[tuple[torch.cuda.Event, torch.cuda.Event, float]] | None:
    """CUDA events around every replay of the batch-1 decode graph in a warm ``steps``-token generate,
    with the host seconds spent inside each launch; None when the engine runs without graphs."""
    from omni_gateway.engine import SamplingParams

    graphs = llm.engine.runner.graphs
    if graphs is None:
        return None
    graph = graphs._graphs._graphs[1].graph
    replay = graph.replay
    marks: list[tuple[torch.cuda.Event, torch.cuda.Event, float]] = []

    def timed_replay() -> None:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        t0 = time.perf_counter()
        replay()
        marks.append((begin, end, time.perf_counter() - t0))
        end.record()

    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    graph.replay = timed_replay
    try:
        llm.generate([prompt], params)
        marks.clear()
        llm.generate([prompt], params)
        sync()
    finally:
        del graph.replay
    return marks


def trace_decode(llm: Any, prompt: list[int], steps: int, top: int = 14) -> None:
    """Where a batch-1 decode step's wall time goes: kernels (the ``top`` by time), gaps between them inside
    the step, and the idle time between steps (the host's share), from a torch.profiler trace of ``steps``
    tokens."""
    from omni_gateway.engine import SamplingParams
    from torch.profiler import ProfilerActivity, profile

    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)
    llm.generate([prompt], params)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        sync()
        start = time.perf_counter()
        llm.generate([prompt], params)
        sync()
        wall = time.perf_counter() - start
    kernels = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    if not kernels:
        print("  trace: no device events recorded", flush=True)
        return
    busy = sum(end - begin for begin, end, _ in kernels)  # us
    span = kernels[-1][1] - kernels[0][0]
    gaps = sorted(kernels[i + 1][0] - kernels[i][1] for i in range(len(kernels) - 1))
    if gaps and gaps[0] < 0:
        # Kernels launched as programmatic dependents start while their predecessor drains and wait for
        # it: each one's time below includes that wait, so per-kernel times overlap.
        print("  trace: kernels overlap (dependent launch); their times include waiting for the previous one")
    long_gaps = [g for g in gaps if g > 20]  # between steps: the host prepares the next one
    per_kernel: dict[str, float] = {}
    for begin, end, name in kernels:
        per_kernel[name] = per_kernel.get(name, 0.0) + end - begin
    print(
        f"  trace of {steps} tokens (prefill included): wall {wall * 1e3:.2f} ms, device span {span / 1e3:.2f} ms, "
        f"kernels {busy / 1e3:.2f} ms in {len(kernels)} launches; gaps under 20 us {sum(gaps) - sum(long_gaps):.0f} us "
        f"({len(gaps) - len(long_gaps)}), over 20 us {sum(long_gaps):.0f} us ({len(long_gaps)}: "
        f"median {statistics.median(long_gaps) if long_gaps else 0:.0f} us)",
        flush=True,
    )
    for name, total in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {total / steps:8.1f} us/token  {name[:110]}", flush=True)


def probe_steps(llm: Any, prompt: list[int], steps: int) -> None:
    """Split a batch-1 step into the graph's device time, the device time between two graphs (the
    staged copies and any idling) and the host time spent inside the graph launch, from CUDA events
    recorded around every replay of the batch-1 graph and host clocks around the launch call."""
    marks = graph_replay_marks(llm, prompt, steps)
    if marks is None:
        print("  probe: the engine runs without graphs", flush=True)
        return
    inside = [b.elapsed_time(e) for b, e, _ in marks]
    between = [marks[i][1].elapsed_time(marks[i + 1][0]) for i in range(len(marks) - 1)]
    launch = [host * 1e3 for _, _, host in marks]
    q = statistics.quantiles
    print(
        f"  probe of {len(marks)} batch-1 graph replays: graph {statistics.median(inside):.3f} ms median "
        f"(deciles {q(inside, n=10)[0]:.3f}-{q(inside, n=10)[-1]:.3f}); between graphs "
        f"{statistics.median(between) * 1e3:.1f} us median (deciles {q(between, n=10)[0] * 1e3:.1f}-"
        f"{q(between, n=10)[-1] * 1e3:.1f}, mean {statistics.mean(between) * 1e3:.1f}); host time inside "
        f"graph.replay() {statistics.median(launch) * 1e3:.1f} us median (max {max(launch) * 1e3:.1f})",
        flush=True,
    )


def run_workload(name: str, llm: Any, work: Workload, report: dict[str, Any], key: str = "") -> None:
    """Time the workload; ``key`` prefixes the report entries (a second run with other settings)."""
    from omni_gateway.engine import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in work.output_lens]
    sync()
    start = time.perf_counter()
    outs = llm.generate(work.prompts, params)
    sync()
    ours_s = time.perf_counter() - start
    produced = [len(o.outputs[0].token_ids) for o in outs]
    if produced != work.output_lens:
        raise SystemExit(f"[{name}] engine produced {sum(produced)} tokens, expected {sum(work.output_lens)}")
    report[key + "ours_seconds"] = ours_s
    report[key + "ours_tok_s"] = sum(produced) / ours_s
    print(
        f"[{name}] ours{' ' + key.rstrip('_') if key else ''} (pipelined decode {llm.engine.pipelined}): "
        f"{ours_s:.1f} s, {report[key + 'ours_tok_s']:.0f} tok/s",
        flush=True,
    )
    if "hf_useful_tok_s" in report and not key:
        report["ratio_useful"] = report["ours_tok_s"] / report["hf_useful_tok_s"]
        report["ratio_raw"] = report["ours_tok_s"] / report["hf_raw_tok_s"]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", choices=SHAPES)
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument(
        "--hf-seqs",
        type=int,
        default=None,
        metavar="N",
        help="time HF on the workload's first N sequences only (default: all); its tok/s are an N-sequence batch's",
    )
    parser.add_argument(
        "--len-range",
        type=int,
        nargs=2,
        default=(100, 1024),
        metavar=("LO", "HI"),
        help="prompt and output lengths, uniform in [LO, HI] (default: nano-vllm's 100 1024)",
    )
    parser.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cpu: a float32 smoke run of the code paths (tiny-moe), no bandwidth figures",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batched-tokens", type=int, default=16384, help="our engine's per-step token budget")
    parser.add_argument("--b1-prompt", type=int, default=1024)
    parser.add_argument("--b1-new", type=int, default=256)
    parser.add_argument("--hbm-gbps", type=float, default=4800.0, help="HBM bandwidth of the roofline")
    parser.add_argument("--check-prompts", type=int, default=4)
    parser.add_argument("--check-tokens", type=int, default=32)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--eager", action="store_true", help="our engine without CUDA graphs")
    parser.add_argument("--b1-only", action="store_true", help="skip our run of the 256-sequence workload")
    parser.add_argument("--b1-repeats", type=int, default=3, help="batch-1 measurements; the median is reported")
    parser.add_argument(
        "--compare-unpipelined",
        action="store_true",
        help="also time the workload and batch 1 with pipelined decode off",
    )
    parser.add_argument("--profile-b1", action="store_true", help="print a cProfile of the batch-1 run")
    parser.add_argument(
        "--trace-b1",
        type=int,
        default=0,
        metavar="TOKENS",
        help="trace this many batch-1 tokens with torch.profiler: kernel time, gaps, host idle",
    )
    parser.add_argument(
        "--probe-b1",
        type=int,
        default=0,
        metavar="TOKENS",
        help="time each batch-1 graph replay and the device time between replays with CUDA events",
    )
    parser.add_argument("--tmp", default=None, help="where the random checkpoints are written")
    add_out_argument(parser, "engine_gpu")
    args = parser.parse_args()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("benchmarks.engine_gpu needs a CUDA GPU (or --device cpu for a smoke run)")
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
        copy_gbps = copy_bandwidth_gbps()
        print(f"device copy bandwidth (read + write): {copy_gbps:.0f} GB/s", flush=True)
    else:
        copy_gbps = float("nan")
    reports = []
    with ResultLog(args.out, "engine_gpu", copy_gbps=copy_gbps, hbm_gbps=args.hbm_gbps) as log:
        for name in args.model or ["qwen2.5-0.5b", "llama-3.1-8b"]:
            reports.append(run_model(name, args, copy_gbps))
            log.write("model", **reports[-1])
    for r in reports:
        ours = f"ours {r['ours_tok_s']:.0f} tok/s" if "ours_tok_s" in r else "workload skipped"
        ratio = f"{r['ratio_useful']:.1f}x useful, {r['ratio_raw']:.1f}x raw" if "ratio_useful" in r else "HF skipped"
        if "ratio_useful" in r and r["hf_seqs"] != r["seqs"]:
            ratio += f"; HF on {r['hf_seqs']} of {r['seqs']} sequences"
        print(
            f"{r['model']}: {ours} vs HF ({ratio}); batch-1 {r['b1_tok_s']:.0f} tok/s = "
            f"{100 * r['b1_fraction_of_roofline']:.1f}% of the HBM roofline"
        )


if __name__ == "__main__":
    main()
