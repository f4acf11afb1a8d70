"""Multi-LoRA serving: throughput of many sequences spread over 1, 4 and 16 adapters, and batch-1 decode with
one adapter, each against the base model alone measured in the same command.

    python -m benchmarks.lora --preset tiny --device cpu                        # a small shape, minutes on a CPU
    python -m benchmarks.lora --preset llama-8b --device cuda --out FILE        # Llama-3.1-8B's shape on a GPU

The checkpoint has random weights (written to ``--tmp``, no download) and every adapter random rank-``--rank``
A and B matrices on all seven projections of every layer (q/k/v/o, gate/up/down), in PEFT's format.

1. Throughput: ``--seqs`` sequences submitted at once (random ``--prompt-len``-token prompts, ``--output-len``
   tokens each, greedy, EOS ignored), sequence i on adapter i mod n. First the base model in an engine without
   LoRA (the baseline), then one engine with LoRA enabled (``--max-loras`` 16, rank 16) serving the same
   workload with no adapter, then over 1, 4 and 16 adapters. Output tokens per second over the whole
   ``generate`` (prefills included), the best of ``--repeats``; every repeat uses fresh prompts, so none
   reuses the prefix cache of another.
2. Batch 1: one request with a ``--b1-prompt``-token prompt; ms per output token is the time of a
   ``--b1-new``-token generate minus a one-token generate over the extra tokens (median of ``--repeats``),
   for the base engine and for the LoRA engine with one adapter.

Each ratio is printed against the base engine; the records go to ``benchmarks/results/lora.jsonl`` (``--out``).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.lib.common import ResultLog, add_out_argument, ratio
from tests.harness.model_shapes import shape_config, word_tokenizer

PROJECTIONS = {  # name -> (module path, input width, output width) as attributes of the HF config
    "q_proj": ("self_attn", "hidden", "q"),
    "k_proj": ("self_attn", "hidden", "kv"),
    "v_proj": ("self_attn", "hidden", "kv"),
    "o_proj": ("self_attn", "q", "hidden"),
    "gate_proj": ("mlp", "hidden", "inter"),
    "up_proj": ("mlp", "hidden", "inter"),
    "down_proj": ("mlp", "inter", "hidden"),
}
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"shape": "tiny-llama", "seqs": 64, "prompt_len": 32, "output_len": 16, "b1_prompt": 32, "b1_new": 32},
    "llama-8b": {"shape": "llama-3.1-8b", "seqs": 64, "prompt_len": 256, "output_len": 256, "b1_prompt": 512,
                 "b1_new": 128},
}  # fmt: skip
ADAPTER_COUNTS = (1, 4, 16)


def write_checkpoint(cfg: Any, folder: Path, device: torch.device, dtype: torch.dtype, seed: int) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    model.save_pretrained(folder)
    word_tokenizer(cfg.vocab_size).save_pretrained(folder)
    del model


def write_adapter(cfg: Any, folder: Path, rank: int, seed: int) -> None:
    """A PEFT LoRA adapter with random A and B on every projection of every layer (bfloat16 on disk)."""
    from safetensors.torch import save_file

    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    widths = {
        "hidden": cfg.hidden_size,
        "q": cfg.num_attention_heads * head_dim,
        "kv": cfg.num_key_value_heads * head_dim,
        "inter": cfg.intermediate_size,
    }
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg.num_hidden_layers):
        for name, (block, fan_in, fan_out) in PROJECTIONS.items():
            key = f"base_model.model.model.layers.{layer}.{block}.{name}"
            a = torch.randn(rank, widths[fan_in], generator=gen) / widths[fan_in] ** 0.5
            tensors[f"{key}.lora_A.weight"] = a.to(torch.bfloat16)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(widths[fan_out], rank, generator=gen) * 0.01).to(
                torch.bfloat16
            )
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(PROJECTIONS)}
    (folder / "adapter_config.json").write_text(json.dumps(config))


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(2, vocab - 1) for _ in range(length)] for _ in range(n)]


def params(max_tokens: int, lora: str | None) -> Any:
    from omni_gateway.engine import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, lora_name=lora)


def throughput(llm: Any, args: argparse.Namespace, vocab: int, loras: list[str | None], seed: int) -> float:
    """Output tokens per second of ``args.seqs`` sequences at once, sequence i on ``loras[i % len]``; the best
    of ``args.repeats``, each over prompts of its own."""
    best = 0.0
    for repeat in range(args.repeats):
        batch = prompts(args.seqs, args.prompt_len, vocab, seed * 1000 + repeat)
        each = [params(args.output_len, loras[i % len(loras)]) for i in range(args.seqs)]
        sync(args.device)
        start = time.perf_counter()
        outputs = llm.generate(batch, each)
        sync(args.device)
        seconds = time.perf_counter() - start
        tokens = sum(len(out.outputs[0].token_ids) for out in outputs)
        best = max(best, tokens / seconds)
    return best


def batch1_ms(llm: Any, args: argparse.Namespace, vocab: int, lora: str | None) -> float:
    """Median ms per decoded token of one request (a long generate less a one-token one)."""
    samples = []
    for repeat in range(args.repeats):
        prompt = prompts(1, args.b1_prompt, vocab, 777 + repeat)[0]
        timed = []
        for new in (1, args.b1_new):
            prompt = [2 + (t + new) % (vocab - 2) for t in prompt]  # no prefix-cache hit between the two
            sync(args.device)
            start = time.perf_counter()
            llm.generate([prompt], params(new, lora))
            sync(args.device)
            timed.append(time.perf_counter() - start)
        samples.append((timed[1] - timed[0]) / (args.b1_new - 1) * 1e3)
    return statistics.median(samples)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def engine(checkpoint: Path, args: argparse.Namespace, dtype: str, adapters: dict[str, Path] | None) -> Any:
    from omni_gateway.engine import LLM

    lora: dict[str, Any] = {}
    if adapters is not None:
        lora = {
            "enable_lora": True,
            "max_loras": max(ADAPTER_COUNTS),
            "max_lora_rank": args.rank,
            "lora_modules": tuple((name, str(path)) for name, path in adapters.items()),
        }
    return LLM(
        str(checkpoint),
        device=args.device,
        dtype=dtype,
        max_model_len=max(args.prompt_len + args.output_len, args.b1_prompt + args.b1_new) + 16,
        max_num_seqs=max(args.seqs, 1),
        enable_prefix_caching=True,
        **lora,
    )


def warm(llm: Any, args: argparse.Namespace, vocab: int, loras: list[str | None]) -> None:
    """Kernels compiled and every adapter on the device before anything is timed."""
    batch = prompts(args.seqs, args.prompt_len, vocab, 99)
    llm.generate(batch, [params(4, loras[i % len(loras)]) for i in range(args.seqs)])
    llm.generate(batch[:1], params(4, loras[0]))


def free(device: str) -> None:
    """Return a dropped engine's memory (its CUDA graphs' pools too) before the next one sizes its KV cache."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def measure_base(checkpoint: Path, args: argparse.Namespace, dtype: str, vocab: int) -> dict[str, float]:
    llm = engine(checkpoint, args, dtype, None)
    warm(llm, args, vocab, [None])
    report = {"base_tok_s": progress("base", throughput(llm, args, vocab, [None], seed=1), "tok/s")}
    report["base_b1_ms"] = progress("base batch 1", batch1_ms(llm, args, vocab, None), "ms/token")
    return report


def measure_lora(
    checkpoint: Path, args: argparse.Namespace, dtype: str, vocab: int, adapters: dict[str, Path]
) -> dict[str, float]:
    llm = engine(checkpoint, args, dtype, adapters)
    names: list[str | None] = list(adapters)
    warm(llm, args, vocab, names)
    report = {
        "lora_engine_no_adapter_tok_s": progress("no adapter", throughput(llm, args, vocab, [None], seed=2), "tok/s")
    }
    for n in ADAPTER_COUNTS:
        tok_s = throughput(llm, args, vocab, names[:n], seed=3 + n)
        report[f"adapters_{n}_tok_s"] = progress(f"{n} adapters", tok_s, "tok/s")
    report["lora_b1_ms"] = progress("batch 1, one adapter", batch1_ms(llm, args, vocab, names[0]), "ms/token")
    report["lora_engine_base_b1_ms"] = progress("batch 1, no adapter", batch1_ms(llm, args, vocab, None), "ms/token")
    return report


def progress(what: str, value: float, unit: str) -> float:
    """Each figure as soon as it is measured, so a run cut short still shows what it got."""
    print(f"  measured {what}: {value:.2f} {unit}", flush=True)
    return value


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    cfg = shape_config(PRESETS[args.preset]["shape"])
    on_cuda = args.device.startswith("cuda")
    dtype = "bfloat16" if on_cuda else "float32"
    t0 = time.perf_counter()
    base = Path(args.checkpoint) if args.checkpoint else tmp / "base"
    if not args.checkpoint:
        write_checkpoint(cfg, base, torch.device(args.device), getattr(torch, dtype), args.seed)
        free(args.device)
    adapters = {f"lora{i}": tmp / f"lora{i}" for i in range(max(ADAPTER_COUNTS))}
    for i, folder in enumerate(adapters.values()):
        write_adapter(cfg, folder, args.rank, args.seed + 1 + i)
    print(f"[{args.preset}] random checkpoint and {len(adapters)} adapters written in {time.perf_counter() - t0:.0f} s")
    vocab = cfg.vocab_size
    report: dict[str, Any] = {"preset": args.preset, "device": args.device, "dtype": dtype, "rank": args.rank}

    report.update(measure_base(base, args, dtype, vocab))
    free(args.device)
    report.update(measure_lora(base, args, dtype, vocab, adapters))
    free(args.device)
    base_tok_s, base_b1 = report["base_tok_s"], report["base_b1_ms"]
    print(f"base model, no LoRA:         {base_tok_s:9.1f} tok/s   batch 1 {base_b1:.2f} ms/token")
    tok_s = report["lora_engine_no_adapter_tok_s"]
    print(f"LoRA engine, no adapter:     {tok_s:9.1f} tok/s   {ratio(tok_s, base_tok_s)} of base")
    for n in ADAPTER_COUNTS:
        tok_s = report[f"adapters_{n}_tok_s"]
        print(f"{args.seqs} seqs over {n:2d} adapters: {tok_s:9.1f} tok/s   {ratio(tok_s, base_tok_s)} of base")
    b1, b1_base = report["lora_b1_ms"], report["lora_engine_base_b1_ms"]
    print(f"batch 1, one adapter:        {b1:9.2f} ms/token {ratio(b1, base_b1)} of base")
    print(f"batch 1, LoRA engine, base:  {b1_base:9.2f} ms/token {ratio(b1_base, base_b1)} of base")
    for n in ADAPTER_COUNTS:
        report[f"ratio_adapters_{n}_vs_base"] = report[f"adapters_{n}_tok_s"] / base_tok_s
    report["ratio_b1_adapter_vs_base"] = b1 / base_b1
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when there is one)")
    parser.add_argument("--rank", type=int, default=16, help="rank of every random adapter (default %(default)s)")
    parser.add_argument("--seqs", type=int, default=None, help="concurrent sequences (default: the preset's)")
    parser.add_argument("--prompt-len", type=int, default=None)
    parser.add_argument("--output-len", type=int, default=None)
    parser.add_argument("--b1-prompt", type=int, default=None)
    parser.add_argument("--b1-new", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per configuration (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--tmp", default=None, help="where the random checkpoint and adapters are written")
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a random checkpoint of the preset's shape already written (spec_decode's --tmp holds one); "
        "default: write one",
    )
    add_out_argument(parser, "lora")
    args = parser.parse_args()
    for key, value in PRESETS[args.preset].items():
        if key != "shape" and getattr(args, key) is None:
            setattr(args, key, value)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.b1_new < 2:
        parser.error("--b1-new must be at least 2 (one token is the baseline it is measured against)")
    if args.tmp:
        Path(args.tmp).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        report = run(args, Path(tmp))
    with ResultLog(args.out, "lora", preset=args.preset) as log:
        log.write("result", **report)


if __name__ == "__main__":
    main()
