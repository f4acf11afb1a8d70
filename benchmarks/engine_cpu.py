"""CPU throughput benchmark: our engine against HF transformers ``generate`` on the default model.

    python -m benchmarks.engine_cpu [--requests 16] [--new-tokens 128] [--threads N] [--out FILE]

Runs, in one process and on the same prompts (greedy, EOS ignored): our ``LLM`` with all requests
at once; HF ``generate`` one request at a time; HF ``generate`` batched with left padding; and a
single request through each. Prints tokens/s, the ratios and the KV-cache waste of our run
(allocated slots vs slots holding tokens, at the step of peak use and averaged over steps), and
appends them to ``benchmarks/results/engine_cpu.jsonl``.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.lib.common import ResultLog, add_out_argument

QUESTIONS = [
    "Explain how a refrigerator keeps food cold.",
    "Write a short story about a lighthouse keeper.",
    "What are the main causes of the seasons on Earth?",
    "Give me a recipe for a simple tomato soup.",
    "Describe the water cycle in a few sentences.",
    "Why is the sky blue?",
    "Summarize the plot of a heist movie you would like to see.",
    "List some tips for learning a new language.",
    "How do bees make honey?",
    "What is the difference between weather and climate?",
    "Write a poem about autumn leaves.",
    "Explain what a black hole is to a child.",
    "How does a bicycle stay upright?",
    "Describe a day in the life of a medieval blacksmith.",
    "What should I pack for a weekend hiking trip?",
    "Why do cats purr?",
]


@dataclass
class KVUsage:
    """Allocated vs used KV slots, sampled at every engine step (shared prefix blocks counted once)."""

    block_size: int
    samples: list[tuple[int, int]] = field(default_factory=list)

    def record(self, batch: Any) -> None:
        filled: dict[int, int] = {}
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            ctx = seq.num_computed_tokens + n
            for j, block in enumerate(seq.block_table):
                filled[block] = max(filled.get(block, 0), max(0, min(self.block_size, ctx - j * self.block_size)))
        self.samples.append((len(filled) * self.block_size, sum(filled.values())))

    def waste(self) -> tuple[float, float]:
        """Wasted share of the allocated slots at the step of peak use, and over all steps."""
        peak_alloc, peak_used = max(self.samples)
        total_alloc = sum(a for a, _ in self.samples)
        total_used = sum(u for _, u in self.samples)
        return 1 - peak_used / peak_alloc, 1 - total_used / total_alloc

    def report(self) -> str:
        peak_alloc, peak_used = max(self.samples)
        total_alloc = sum(a for a, _ in self.samples)
        total_used = sum(u for _, u in self.samples)
        return (
            f"KV waste at peak: {100 * (1 - peak_used / peak_alloc):.2f}% ({peak_alloc} slots allocated, "
            f"{peak_used} used); averaged over {len(self.samples)} steps: "
            f"{100 * (1 - total_used / total_alloc):.2f}%"
        )


def prompts_for(tokenizer: Any, count: int) -> list[list[int]]:
    out = []
    for i in range(count):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], add_generation_prompt=True, tokenize=False
        )
        out.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def hf_generate(model: Any, tokenizer: Any, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Batched greedy generate with left padding; returns the new tokens of each row."""
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
    return out[:, width:].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument(
        "--block-size", type=int, default=None, help="KV block size (default: the engine's for the CPU)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    add_out_argument(parser, "engine_cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n, new = args.requests, args.new_tokens

    from omni_gateway.engine import LLM, SamplingParams
    from omni_gateway.engine.runner.loader import default_model_path
    from transformers import AutoModelForCausalLM

    llm = LLM(
        "default",
        device="cpu",
        max_num_seqs=max(n, 1),
        kv_cache_bytes=256 << 20,
        max_num_batched_tokens=2048,
        block_size=args.block_size,
    )
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {n} requests x {new} new tokens, greedy; "
        f"KV block size {llm.engine.config.block_size}"
    )
    tokenizer = llm.engine.tokenizer
    path = Path(default_model_path())
    hf = AutoModelForCausalLM.from_pretrained(os.fspath(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    prompts = prompts_for(tokenizer, n)
    print(f"prompt lengths: {min(map(len, prompts))}..{max(map(len, prompts))} tokens")
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)

    def ours(batch: list[list[int]], tokens: int = new) -> list[list[int]]:
        outs = llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
        return [list(o.outputs[0].token_ids) for o in outs]

    # Warm both sides (thread pools, allocator) before timing.
    ours(prompts[:2], 4)
    hf_generate(hf, tokenizer, prompts[:2], 4)

    usage = KVUsage(llm.engine.config.block_size)
    runner = llm.engine.runner
    execute = runner.execute

    def recording_execute(batch: Any, after: Any = None) -> Any:
        usage.record(batch)
        return execute(batch, after)

    runner.execute = recording_execute
    total = n * new
    t_ours, outs = timed(lambda: llm.generate(prompts, params))
    runner.execute = execute
    ours_tokens = [list(o.outputs[0].token_ids) for o in outs]
    print(f"ours (LLM.generate, {n} concurrent): {total / t_ours:8.1f} tok/s ({t_ours:.2f} s)", flush=True)
    print(usage.report(), flush=True)
    t_batch, batch_tokens = timed(lambda: hf_generate(hf, tokenizer, prompts, new))
    print(f"HF generate, batched (left pad):  {total / t_batch:8.1f} tok/s ({t_batch:.2f} s)", flush=True)
    t_seq, seq_tokens = timed(lambda: [hf_generate(hf, tokenizer, [p], new)[0] for p in prompts])
    print(f"HF generate, sequential:          {total / t_seq:8.1f} tok/s ({t_seq:.2f} s)", flush=True)
    print(f"ratio vs HF sequential: {t_seq / t_ours:.2f}x   vs HF batched: {t_batch / t_ours:.2f}x", flush=True)

    # Single stream: decode rate from the difference between a 1-token and a full run.
    p0 = prompts[0]
    t1_ours, _ = timed(lambda: ours([p0], 1))
    tn_ours, _ = timed(lambda: ours([p0], new))
    t1_hf, _ = timed(lambda: hf_generate(hf, tokenizer, [p0], 1))
    tn_hf, _ = timed(lambda: hf_generate(hf, tokenizer, [p0], new))
    single_ours = (new - 1) / (tn_ours - t1_ours)
    single_hf = (new - 1) / (tn_hf - t1_hf)
    print(
        f"single-stream decode: ours {single_ours:.1f} tok/s, HF {single_hf:.1f} tok/s ({single_ours / single_hf:.2f}x)"
    )
    same_seq = sum(a == b for a, b in zip(ours_tokens, seq_tokens))
    same_batch = sum(a == b for a, b in zip(ours_tokens, batch_tokens))
    print(f"identical outputs: {same_seq}/{n} vs HF sequential, {same_batch}/{n} vs HF batched")
    waste_peak, waste_mean = usage.waste()
    with ResultLog(
        args.out,
        "engine_cpu",
        requests=n,
        new_tokens=new,
        block_size=llm.engine.config.block_size,
        threads=torch.get_num_threads(),
    ) as log:
        log.write(
            "result",
            ours_tok_s=total / t_ours,
            hf_sequential_tok_s=total / t_seq,
            hf_batched_tok_s=total / t_batch,
            ratio_vs_hf_sequential=t_seq / t_ours,
            ratio_vs_hf_batched=t_batch / t_ours,
            single_stream_ours_tok_s=single_ours,
            single_stream_hf_tok_s=single_hf,
            kv_waste_peak=waste_peak,
            kv_waste_mean=waste_mean,
            identical_vs_hf_sequential=same_seq,
            identical_vs_hf_batched=same_batch,
        )


if __name__ == "__main__":
    main()
