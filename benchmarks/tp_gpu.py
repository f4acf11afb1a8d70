"""Tensor parallel on the GPUs of one machine: batch-1 decode and the nano-vllm workload at TP=1, 2, 4.

    python -m benchmarks.tp_gpu --model llama-3.1-8b --tp 1 --tp 2 --tp 4
    python -m benchmarks.tp_gpu --model llama-3.1-70b --tp 4

Weights are random bf16, made on each rank's GPU slice by slice (``RandomSource``: the engine's
shard reader asks for exactly its slices), so no checkpoint is written or read and a 70B shape
starts in seconds. Needs only the engine's own dependencies (torch, triton, transformers for the
config, tokenizers), none of the gateway's.

For each (model, TP):

1. Batch 1: one request with a ``--b1-prompt``-token prompt; ms per decode token is a
   ``--b1-new``-token generate minus a one-token generate, over the extra tokens (median of
   ``--b1-repeats``), with CUDA graphs and pipelined decode as the server runs them.
2. The all-reduce share of a batch-1 step: rank 0's NCCL all-reduce kernel time per token in a
   torch.profiler trace of a ``--trace-tokens``-token generate (8-token prompt), over the batch-1
   ms/token; the logits' all-gather is reported beside it. Rank 0's NCCL kernels include the wait
   for the slowest rank.
3. Workload (nano-vllm's bench): ``--seqs`` sequences, prompt and output lengths uniform in
   [100, 1024], greedy, EOS ignored; output tokens/s over the whole call, prefill included
   (``--b1-only`` skips it).

Reports are appended to ``benchmarks/results/tp_gpu.jsonl`` (``--out``).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

import torch

from benchmarks.engine_gpu import b1_decode_seconds, make_workload
from benchmarks.lib.common import ResultLog, add_out_argument
from tests.harness.model_shapes import shape_config, word_tokenizer

_STD = 0.02  # weight scale of the random init (Llama's initializer_range)


def model_config(name: str) -> Any:
    if name != "llama-3.1-70b":
        return shape_config(name)
    cfg = shape_config("llama-3.1-8b")  # same family: rope scaling, vocabulary, GQA with 8 KV heads
    cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads = 8192, 28672, 80, 64
    cfg.head_dim = 128
    return cfg


class RandomSource:
    """A ``WeightSource`` of random bf16 tensors of a config's shapes, made on the reading rank's GPU."""

    def __init__(self, cfg: Any) -> None:
        heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
        self._shapes = {"q": (heads * head_dim, h), "k": (kv * head_dim, h), "v": (kv * head_dim, h)}
        self._shapes |= {"o": (h, heads * head_dim), "gate": (i, h), "up": (i, h), "down": (h, i)}
        self._shapes |= {"embed_tokens": (v, h), "lm_head": (v, h), "q_norm": (head_dim,), "k_norm": (head_dim,)}
        self._hidden = h
        from omni_gateway.engine.models.llama_shape import missing_weights

        self._names = set(missing_weights(cfg, {}))

    def names(self) -> set[str]:
        return set(self._names)

    def _shape(self, name: str) -> tuple[int, ...]:
        module, _, kind = name.rpartition(".")
        key = module.rsplit(".", 1)[-1].removesuffix("_proj")
        if key in self._shapes:
            shape = self._shapes[key]
            return shape[:1] if kind == "bias" else shape
        return (self._hidden,)  # the RMS norms

    def read(self, name: str, dim: int | None = None, start: int = 0, end: int | None = None) -> torch.Tensor:
        shape = list(self._shape(name))
        if dim is not None:
            shape[dim] = (shape[dim] if end is None else end) - start
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        if len(shape) == 1:
            return torch.ones(shape, dtype=torch.bfloat16, device=device)
        return torch.randn(shape, dtype=torch.bfloat16, device=device) * _STD


def build_llm(name: str, tp: int, args: argparse.Namespace) -> Any:
    from omni_gateway.engine import LLM
    from omni_gateway.engine.config import EngineConfig
    from omni_gateway.engine.core.llm_engine import LLMEngine
    from omni_gateway.engine.runner.loader import LoadedModel

    cfg = model_config(name)
    source = RandomSource(cfg)
    loaded = LoadedModel(
        hf_config=cfg,
        tokenizer=word_tokenizer(cfg.vocab_size),
        eos_token_ids=frozenset({0}),
        max_model_len=2048,
        vocab_size=cfg.vocab_size,
        chat_template=None,
        name=name,
        architecture="LlamaForCausalLM",
        weights={},  # the runner reads its slices from the source (all of them at TP=1)
        source=source,
    )
    config = EngineConfig(
        model=name,
        device="cuda",
        dtype="bfloat16",
        tensor_parallel_size=tp,
        max_num_seqs=args.seqs,
        max_model_len=2048,
        max_num_batched_tokens=args.batched_tokens,
        gpu_memory_utilization=0.9,
        enforce_eager=args.eager,
    )
    return LLM.from_engine(LLMEngine(config, model=loaded))


def collective_ms_per_token(llm: Any, tokens: int) -> dict[str, float]:
    """Rank 0's NCCL all-reduce and all-gather (logits) kernel ms per decode token, from a profiler
    trace of a ``tokens``-token generate after an 8-token prompt (its prefill's collectives are as
    small as a decode's, so they barely move the per-token figure)."""
    from omni_gateway.engine import SamplingParams
    from torch.profiler import ProfilerActivity, profile

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    prompt = list(range(2, 10))
    llm.generate([prompt], params)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate([prompt], params)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    reduce_us = sum(e.time_range.end - e.time_range.start for e in kernels if "AllReduce" in e.name)
    gather_us = sum(e.time_range.end - e.time_range.start for e in kernels if "AllGather" in e.name)
    return {"allreduce_ms_per_token": reduce_us / tokens / 1e3, "allgather_ms_per_token": gather_us / tokens / 1e3}


def run(name: str, tp: int, args: argparse.Namespace) -> dict[str, Any]:
    from omni_gateway.engine import SamplingParams

    report: dict[str, Any] = {"model": name, "tp": tp}
    t0 = time.perf_counter()
    llm = build_llm(name, tp, args)
    report["engine_start_s"] = time.perf_counter() - t0
    print(f"[{name} TP={tp}] engine up in {report['engine_start_s']:.1f} s", flush=True)
    try:
        work = make_workload(args.seqs, 100, 1024, args.seed)
        llm.generate(work.prompts[:8], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))  # warm-up
        prompt = work.prompts[0][: args.b1_prompt]
        prompt = (prompt * (args.b1_prompt // len(prompt) + 1))[: args.b1_prompt]
        runs = [b1_decode_seconds(llm, prompt, args.b1_new) for _ in range(args.b1_repeats)]
        report["b1_ms_per_token"] = statistics.median(runs) * 1e3
        report["b1_ms_per_token_runs"] = [r * 1e3 for r in runs]
        print(f"[{name} TP={tp}] batch 1: {report['b1_ms_per_token']:.3f} ms/token", flush=True)
        if tp > 1:
            report |= collective_ms_per_token(llm, args.trace_tokens)
            report["allreduce_share"] = report["allreduce_ms_per_token"] / report["b1_ms_per_token"]
            print(
                f"[{name} TP={tp}] per token: all-reduce {report['allreduce_ms_per_token']:.3f} ms "
                f"({100 * report['allreduce_share']:.1f}% of a batch-1 step), "
                f"logits all-gather {report['allgather_ms_per_token']:.3f} ms",
                flush=True,
            )
        if not args.b1_only:
            params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in work.output_lens]
            torch.cuda.synchronize()
            start = time.perf_counter()
            outs = llm.generate(work.prompts, params)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            produced = sum(len(o.outputs[0].token_ids) for o in outs)
            report["workload_seconds"], report["workload_tok_s"] = seconds, produced / seconds
            print(f"[{name} TP={tp}] workload: {seconds:.1f} s, {produced / seconds:.0f} tok/s", flush=True)
    finally:
        llm.engine.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", choices=["llama-3.1-8b", "llama-3.1-70b"])
    parser.add_argument("--tp", action="append", type=int, help="tensor-parallel sizes (default 1, 2, 4)")
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batched-tokens", type=int, default=16384, help="the engine's per-step token budget")
    parser.add_argument("--b1-prompt", type=int, default=1024)
    parser.add_argument("--b1-new", type=int, default=256)
    parser.add_argument("--b1-repeats", type=int, default=3)
    parser.add_argument("--trace-tokens", type=int, default=64, help="decode tokens traced for the all-reduce share")
    parser.add_argument("--b1-only", action="store_true", help="skip the workload")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs")
    add_out_argument(parser, "tp_gpu")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.tp_gpu needs CUDA GPUs")
    gpus = torch.cuda.device_count()
    sizes = [n for n in (args.tp or [1, 2, 4]) if n <= gpus]
    skipped = sorted(set(args.tp or [1, 2, 4]) - set(sizes))
    if skipped:
        print(f"skipping TP={skipped}: {gpus} GPUs", flush=True)
    print(f"{gpus} x {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    reports = []
    with ResultLog(args.out, "tp_gpu", gpus=gpus) as log:
        for name in args.model or ["llama-3.1-8b"]:
            for tp in sizes:
                reports.append(run(name, tp, args))
                log.write("tp", **reports[-1])
    base = {r["model"]: r["b1_ms_per_token"] for r in reports if r["tp"] == 1}
    for r in reports:
        speedup = f", {base[r['model']] / r['b1_ms_per_token']:.2f}x TP=1" if r["model"] in base else ""
        work = f", workload {r['workload_tok_s']:.0f} tok/s" if "workload_tok_s" in r else ""
        print(f"{r['model']} TP={r['tp']}: batch 1 {r['b1_ms_per_token']:.3f} ms/token{speedup}{work}")


if __name__ == "__main__":
    main()
