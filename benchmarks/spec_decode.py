"""Speculative decoding against decoding one token per step, measured in the same command.

    python -m benchmarks.spec_decode --workload replay --device cuda --preset llama-8b --out FILE
    python -m benchmarks.spec_decode --workload ngram --device cpu          # the embedded SmolLM2, a few minutes
    python -m benchmarks.spec_decode --workload replay --device cpu --preset tiny   # a smoke run

``replay`` (random weights of the preset's shape, written to ``--tmp``; no download): a first run without
speculation records the target's greedy continuation of each prompt. The proposer then replays it, each draft
the correct token with probability ``p`` and a wrong one otherwise, so the accepted length is controlled:
batch-1 output tokens per second for each ``--accept`` p, then batch ``--big-batch`` (where the policy should
turn speculation off, so it must not be slower), each printed as a ratio against the engine without
speculation. ``ngram``: the embedded SmolLM2-135M with a prompt that asks it to repeat a text, batch 1, tokens
per second and acceptance with n-gram lookup against no speculation. Records go to
``benchmarks/results/spec_decode.jsonl`` (``--out``).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.lib.common import ResultLog, add_out_argument, ratio

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"shape": "tiny-llama", "prompt_len": 32, "new": 48},
    "llama-8b": {"shape": "llama-3.1-8b", "prompt_len": 256, "new": 256},
}
TEXT = (
    "The harbour was quiet before dawn. Fishing boats rocked against the pier, their ropes creaking, while the "
    "lighthouse swept its beam across the grey water. An old man walked along the quay with a bucket of bait, "
    "nodding to the gulls as if they were neighbours. By the time the sun rose over the hills, the first boats "
    "had already left, and the market was filling with voices."
)


class ReplayProposer:
    """Proposes the target's own greedy continuation (recorded by a run without speculation), each draft kept
    correct with probability ``p``: a wrong draft is the correct token plus one (mod vocab)."""

    name = "replay"
    aux_hidden_layers: tuple[int, ...] = ()

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], p: float, vocab: int, seed: int) -> None:
        self.continuations = continuations
        self.p = p
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.prompt_len = {len(k) for k in continuations}

    def propose(self, requests: Sequence[Any]) -> list[Any]:
        from omni_gateway.engine.spec.proposer import Proposal

        out = []
        for req in requests:
            tokens = list(req.token_ids)
            drafts: tuple[int, ...] = ()
            for n in self.prompt_len:
                right = self.continuations.get(tuple(tokens[:n]))
                if right is not None:
                    pos = len(tokens) - n
                    guess = right[pos : pos + req.num_tokens]
                    drafts = tuple(t if self.rng.random() < self.p else (t + 1) % self.vocab for t in guess)
                    break
            out.append(Proposal(drafts))
        return out

    def release(self, seq_ids: Sequence[int]) -> None:
        pass


def greedy(max_tokens: int) -> Any:
    from omni_gateway.engine import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def timed_generate(llm: Any, prompts: list[Any], max_tokens: int) -> tuple[float, list[list[int]]]:
    llm.generate(prompts[:1], greedy(4))  # warm
    start = time.perf_counter()
    outs = llm.generate(prompts, greedy(max_tokens))
    elapsed = time.perf_counter() - start
    return elapsed, [list(o.outputs[0].token_ids) for o in outs]


def agreement(outs: list[list[int]], reference: list[list[int]]) -> dict[str, int]:
    """How many outputs equal the run without speculation token for token, and the earliest token where one
    does not. A 16-bit model's verify step (several tokens per sequence) and decode step (one) round differently,
    so a near tie of the two best logits can go either way; an early difference in most outputs is a bug."""
    firsts = [next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref))) for out, ref in
              zip(outs, reference) if out != ref]  # fmt: skip
    return {"same_outputs": len(outs) - len(firsts), "first_difference": min(firsts, default=-1)}


def spec_numbers(llm: Any) -> dict[str, float]:
    stats = llm.engine.stats()
    steps = max(stats["spec_verify_steps"], 1)
    return {
        "draft_tokens": stats["spec_draft_tokens"],
        "accepted_tokens": stats["spec_accepted_tokens"],
        "acceptance": stats["spec_accepted_tokens"] / max(stats["spec_draft_tokens"], 1),
        "accepted_per_step": stats["spec_accepted_tokens"] / steps,
    }


def replay(args: argparse.Namespace, log: ResultLog) -> None:
    from omni_gateway.engine import LLM

    from benchmarks.lora import write_checkpoint
    from tests.harness.model_shapes import shape_config

    preset = PRESETS[args.preset]
    cfg = shape_config(preset["shape"])
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.tmp:
        Path(args.tmp).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(dir=args.tmp)) / "target"
    write_checkpoint(cfg, folder, device, dtype, seed=0)
    rng = random.Random(1)
    new = args.new_tokens or preset["new"]

    def prompts(n: int) -> list[list[int]]:
        return [[rng.randint(2, cfg.vocab_size - 1) for _ in range(preset["prompt_len"])] for _ in range(n)]

    common = dict(device=args.device, max_model_len=preset["prompt_len"] + new + 64, max_num_seqs=args.big_batch)
    for batch in (1, args.big_batch):
        work = prompts(batch)
        base = LLM(str(folder), **common)
        t_base, reference = timed_generate(base, work, new)
        del base
        base_rate = batch * new / t_base
        print(f"batch {batch}: no speculation {base_rate:9.1f} tok/s", flush=True)
        log.write("baseline", batch=batch, tokens_per_s=base_rate)
        continuations = {tuple(p): out for p, out in zip(work, reference)}
        for p in args.accept if batch == 1 else [1.0]:
            spec = {"method": "ngram", "num_speculative_tokens": args.k}
            llm = LLM(str(folder), speculative_config=spec, **common)
            llm.engine.speculator.proposer = ReplayProposer(continuations, p, cfg.vocab_size, seed=2)
            t, outs = timed_generate(llm, work, new)
            rate = batch * new / t
            nums = {**spec_numbers(llm), **agreement(outs, reference)}
            print(
                f"batch {batch}: k={args.k} p={p:.2f}  {rate:9.1f} tok/s  {ratio(rate, base_rate)}  "
                f"accepted/step {nums['accepted_per_step']:.2f}  same output {nums['same_outputs']}/{batch}"
                + ("" if nums["same_outputs"] == batch else f" (first difference at token {nums['first_difference']})"),
                flush=True,
            )
            log.write("replay", batch=batch, k=args.k, p=p, tokens_per_s=rate, baseline_tokens_per_s=base_rate, **nums)
            del llm


def ngram(args: argparse.Namespace, log: ResultLog) -> None:
    from omni_gateway.engine import LLM

    new = args.new_tokens or 96
    spec = {
        "method": "ngram",
        "num_speculative_tokens": args.k,
        "prompt_lookup_min": args.ngram_min,
        "prompt_lookup_max": args.ngram_max,
    }
    results = {}
    for name, config in (("baseline", None), ("ngram", spec)):
        llm = LLM("default", device=args.device, kv_cache_bytes=256 << 20, speculative_config=config)
        prompt = llm.engine.render_chat([{"role": "user", "content": f"Repeat the following text exactly: {TEXT}"}])
        t, outs = timed_generate(llm, [prompt], new)
        results[name] = (new / t, outs)
        nums = spec_numbers(llm) if config else {}
        print(f"{name:8s} {new / t:8.1f} tok/s  {nums}", flush=True)
        log.write(name, tokens_per_s=new / t, new_tokens=new, **nums)
    rate, base = results["ngram"][0], results["baseline"][0]
    same = results["ngram"][1] == results["baseline"][1]
    print(f"n-gram against no speculation: {ratio(rate, base)}; same greedy tokens: {same}")
    log.write("ngram_ratio", ratio=rate / base, same_tokens=same)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("replay", "ngram"), default="replay")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", choices=tuple(PRESETS), default="tiny", help="replay: the model's shape")
    parser.add_argument("--k", type=int, default=4, help="drafts per step (num_speculative_tokens)")
    parser.add_argument(
        "--accept", type=float, nargs="+", default=[0.0, 0.5, 0.8, 0.9, 1.0], help="replay: P(a draft is right)"
    )
    parser.add_argument("--big-batch", type=int, default=64, help="replay: the large batch (default %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=None, help="output tokens per request (default: preset's)")
    parser.add_argument("--ngram-min", type=int, default=2)
    parser.add_argument("--ngram-max", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--tmp", default=None, help="where the random checkpoint is written")
    add_out_argument(parser, "spec_decode")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with ResultLog(args.out, "spec_decode", workload=args.workload, device=args.device, preset=args.preset) as log:
        (replay if args.workload == "replay" else ngram)(args, log)


if __name__ == "__main__":
    main()
