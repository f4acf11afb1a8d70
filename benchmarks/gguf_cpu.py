"""GGUF on the CPU: our engine against llama.cpp (``llama-cpp-python``) on the same file.

    python -m benchmarks.gguf_cpu [--model FILE] [--repeats 3] [--threads N] [--new-tokens 128]
                                  [--concurrent 16] [--prompt-tokens 500] [--out FILE]

Each side runs in its own process (so each RSS is its own) with the same thread count, greedy
decoding and EOS ignored, and measures:

- single-stream decode tok/s: ``(new_tokens - 1)`` over the time from the first token to the last;
- ``--concurrent`` requests x ``new_tokens``: the engine runs them at once, llama.cpp one after
  another (it serves one sequence per context); output tokens / wall time;
- TTFT on a ``--prompt-tokens`` prompt (a different first token each repeat, so no prefix cache hits);
- RSS after loading (idle) and the peak;
- the 1-minute load average before and after each side (the figures are only as steady as the machine).

Every figure is the median of ``--repeats`` runs. Prints the engine/llama.cpp ratios and appends the
raw results to ``benchmarks/results/gguf_cpu.jsonl``. Without ``llama_cpp`` installed the llama.cpp
side is skipped with a message and only the engine's figures are printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.common import ResultLog, add_out_argument, ratio

PROMPT = "Tell me a long story about a lighthouse keeper and the ships that pass by."
FILLER = "The quick brown fox jumps over the lazy dog while the river runs past the old mill. "


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _long_prompts(tokenize: Any, count: int, length: int, vocab: int) -> list[list[int]]:
    ids = tokenize(FILLER * (length // 8 + 8))[:length]
    # A distinct first token per repeat: neither side may serve the prompt from its prefix cache.
    return [[(ids[0] + 1 + i) % vocab, *ids[1:]] for i in range(count)]


# ---- engine ----------------------------------------------------------------------------------------


def run_engine(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from omni_gateway.engine import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    llm = LLM(model=args.model, device="cpu", max_model_len=max(1024, args.prompt_tokens + args.new_tokens + 16))
    engine = llm.engine
    idle = _rss_mib()
    params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
    tokenizer = engine.tokenizer

    def stream_one(prompt: str | list[int], max_tokens: int) -> tuple[float, float, int]:
        """(time to first token, time from first to last token, tokens) of one request."""
        one = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(f"r{time.monotonic_ns()}", prompt, one)
        start = time.perf_counter()
        first = None
        count = 0
        while engine.has_unfinished():
            for delta in engine.step():
                if delta.token_ids:
                    count += len(delta.token_ids)
                    first = first if first is not None else time.perf_counter()
        engine.pop_finished()
        end = time.perf_counter()
        assert first is not None
        return first - start, end - first, count

    stream_one(PROMPT, 8)  # warm-up
    decode, batched, ttft = [], [], []
    prompts = [f"{PROMPT} Chapter {i}." for i in range(args.concurrent)]
    long_prompts = _long_prompts(lambda s: tokenizer.encode(s), args.repeats, args.prompt_tokens, len(tokenizer))
    for rep in range(args.repeats):
        _, span, count = stream_one(f"{PROMPT} ({rep})", args.new_tokens)
        decode.append((count - 1) / span)
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        batched.append(sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start))
        ttft.append(stream_one(long_prompts[rep], 1)[0])
    return _figures(decode, batched, ttft, idle)


# ---- llama.cpp -------------------------------------------------------------------------------------


def run_llama(args: argparse.Namespace) -> dict[str, Any]:
    from llama_cpp import Llama

    llm = Llama(
        model_path=args.model,
        n_ctx=max(1024, args.prompt_tokens + args.new_tokens + 16),
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    idle = _rss_mib()

    def stream_one(prompt: str | list[int], max_tokens: int) -> tuple[float, float, int]:
        # Llama.generate yields greedy tokens (temp 0) without stopping at EOS, as the engine's ignore_eos.
        tokens = tokenize(prompt) if isinstance(prompt, str) else prompt
        start = time.perf_counter()
        first = None
        count = 0
        for _ in llm.generate(tokens, temp=0.0, reset=True):  # reset: no KV reuse from the last request
            count += 1
            first = first if first is not None else time.perf_counter()
            if count == max_tokens:
                break
        end = time.perf_counter()
        assert first is not None
        return first - start, end - first, count

    def tokenize(text: str) -> list[int]:
        return llm.tokenize(text.encode(), add_bos=False)

    stream_one(PROMPT, 8)
    decode, batched, ttft = [], [], []
    prompts = [f"{PROMPT} Chapter {i}." for i in range(args.concurrent)]
    long_prompts = _long_prompts(tokenize, args.repeats, args.prompt_tokens, llm.n_vocab())
    for rep in range(args.repeats):
        _, span, count = stream_one(f"{PROMPT} ({rep})", args.new_tokens)
        decode.append((count - 1) / span)
        start = time.perf_counter()
        tokens = sum(stream_one(p, args.new_tokens)[2] for p in prompts)  # one sequence at a time
        batched.append(tokens / (time.perf_counter() - start))
        ttft.append(stream_one(long_prompts[rep], 1)[0])
    return _figures(decode, batched, ttft, idle)


def _figures(decode: list[float], batched: list[float], ttft: list[float], idle: float) -> dict[str, Any]:
    return {
        "decode_tok_s": statistics.median(decode),
        "concurrent_tok_s": statistics.median(batched),
        "ttft_s": statistics.median(ttft),
        "idle_rss_mib": round(idle),
        "peak_rss_mib": round(_peak_mib()),
        "samples": {"decode_tok_s": decode, "concurrent_tok_s": batched, "ttft_s": ttft},
    }


# ---- driver ----------------------------------------------------------------------------------------


def _child(side: str, args: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, "-m", "benchmarks.gguf_cpu", "--side", side, *sys.argv[1:]]
    load_start = os.getloadavg()[0]  # other work on the machine: each side's figures carry it
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=args.timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the {side} run failed ({out.returncode}): {out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    result["load_1min"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the packaged default model)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--timeout", type=int, default=3600, help="seconds allowed to each side")
    parser.add_argument("--side", choices=("engine", "llama"), default=None, help=argparse.SUPPRESS)
    add_out_argument(parser, "gguf_cpu")
    args = parser.parse_args()
    if args.model is None:
        from omni_gateway.engine.runner.loader import default_model_path

        args.model = default_model_path()
    if args.side is not None:  # a child: one side, one JSON line
        result = run_engine(args) if args.side == "engine" else run_llama(args)
        print(json.dumps(result), flush=True)
        return 0

    have_llama = importlib.util.find_spec("llama_cpp") is not None
    if not have_llama:
        print("llama-cpp-python is not installed (pip install llama-cpp-python): skipping the llama.cpp side")
    with ResultLog(args.out, "gguf_cpu", model=args.model, threads=args.threads, repeats=args.repeats) as log:
        results = {"engine": _child("engine", args)}
        log.write("engine", **results["engine"])
        if have_llama:
            results["llama.cpp"] = _child("llama", args)
            log.write("llama.cpp", **results["llama.cpp"])
    rows = (
        ("single-stream decode tok/s", "decode_tok_s", True),
        (f"{args.concurrent} x {args.new_tokens} tok/s (llama.cpp one at a time)", "concurrent_tok_s", True),
        (f"TTFT s, {args.prompt_tokens}-token prompt", "ttft_s", False),
        ("idle RSS MiB", "idle_rss_mib", False),
        ("peak RSS MiB", "peak_rss_mib", False),
    )
    loads = ", ".join(f"{side} {r['load_1min'][0]}-{r['load_1min'][1]}" for side, r in results.items())
    print(f"{Path(args.model).name}, {args.threads} threads, median of {args.repeats}; 1-min load average: {loads}")
    print(f"{'':52} {'engine':>10} {'llama.cpp':>10} {'engine/llama.cpp':>17}")
    for label, key, higher_better in rows:
        ours = results["engine"][key]
        theirs = results.get("llama.cpp", {}).get(key)
        shown = f"{theirs:10.2f}" if theirs is not None else f"{'-':>10}"
        rel = ratio(ours, theirs) if theirs is not None else "-"
        note = "" if higher_better else " (lower is better)"
        print(f"{label:52} {ours:10.2f} {shown} {rel:>17}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
