"""Cold start: what the first requests of a fresh engine process pay, against the same stream once warm.

    python -m benchmarks.cold_start --model qwen2.5-0.5b                  # CUDA: random-weight 0.5B shape
    python -m benchmarks.cold_start --model llama-3.1-8b                  # CUDA: random-weight 8B shape
    python -m benchmarks.cold_start --model qwen2.5-0.5b --no-warmup      # what the warm-up buys
    python -m benchmarks.cold_start --model tiny --requests 100           # CPU: tiny random Llama
    python -m benchmarks.cold_start --model default --requests 100        # CPU: the embedded SmolLM2

1. A fresh Python process (a subprocess of this one) builds the engine alone (``LLMEngine`` +
   ``AsyncEngine``, no HTTP server) with an empty compile cache: a new temporary directory passed as
   ``--compile-cache-dir``, unless ``--compile-cache-dir DIR`` names one to reuse (then the run shows
   a restart over a persisted cache). It reports its own start-up: model load, warm-up (``--warmup``,
   the engine's ``warmup`` setting), and the time from process start to ready.
2. Right away it runs a seeded stream of ``--requests`` requests in waves: each wave sends
   1..``--max-concurrency`` requests at once (log-uniform) and waits for them; prompt lengths are
   log-uniform in [``--min-prompt``, ``--max-prompt``], clipped to the context; a ``--cached-fraction``
   of the prompts start with one of ``--shared-prefixes`` shared prefixes (hit in the prefix cache
   after their first use), the rest are unique. Each request generates ``--max-tokens`` tokens
   (greedy, EOS ignored); its TTFT is the time from submitting it to its first token.
3. The same process then replays the stream (same waves and lengths; every token id shifted, so the
   first pass left nothing in the prefix cache for the second pass to hit): the warm pass.
4. Reported: p50/p90/p99 TTFT of the first ``--report-first`` requests of each pass and the
   cold/warm ratios. The target on an H200: cold p99 within 1.5x of warm p99.

Random-weight checkpoints of the model shapes are built from ``tests.harness.model_shapes``,
in a separate process first, so the measured process starts with nothing on the device.
Every request and the summary are appended to ``benchmarks/results/cold_start.jsonl`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.lib.common import ResultLog, add_out_argument, percentile

_START = time.perf_counter()  # the child's own start, before torch is imported
SHAPES = ("qwen2.5-0.5b", "llama-3.1-8b")
_FIRST_ID = 3  # prompt token ids stay clear of the usual special ids at the bottom of a vocabulary


@dataclass(frozen=True, slots=True)
class Request:
    index: int
    wave: int
    concurrency: int
    prefix: int  # which shared prefix the prompt starts with; -1: none
    prefix_len: int
    prompt_len: int


def make_stream(
    n: int, *, seed: int, max_concurrency: int, min_prompt: int, max_prompt: int, shared_prefixes: int, cached: float
) -> tuple[list[Request], list[int]]:
    """The requests (in waves) and the lengths of the shared prefixes; a function of its arguments only."""
    if not 1 <= min_prompt <= max_prompt:
        raise ValueError(f"need 1 <= min_prompt <= max_prompt, got {min_prompt} and {max_prompt}")
    rng = random.Random(seed)

    def log_uniform(lo: int, hi: int) -> int:
        return min(hi, max(lo, round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))

    prefix_lens = [log_uniform(max(1, min_prompt // 2), max(1, max_prompt // 2)) for _ in range(shared_prefixes)]
    out: list[Request] = []
    wave = 0
    while len(out) < n:
        concurrency = log_uniform(1, max_concurrency)
        for _ in range(min(concurrency, n - len(out))):
            length = log_uniform(min_prompt, max_prompt)
            prefix = rng.randrange(shared_prefixes) if shared_prefixes and rng.random() < cached else -1
            prefix_len = min(prefix_lens[prefix], length - 1) if prefix >= 0 else 0
            out.append(Request(len(out), wave, concurrency, prefix, prefix_len, length))
        wave += 1
    return out, prefix_lens


def prompt_ids(req: Request, *, seed: int, shift: int, vocab_size: int) -> list[int]:
    """The prompt's token ids: its shared prefix's (same for every request of that prefix) then its own."""
    span = vocab_size - _FIRST_ID

    def ids(key: int, length: int) -> list[int]:
        rng = random.Random(seed * 1_000_003 + key)
        return [_FIRST_ID + (rng.randrange(span) + shift) % span for _ in range(length)]

    head = ids(-1 - req.prefix, req.prefix_len) if req.prefix >= 0 else []
    return head + ids(req.index, req.prompt_len - len(head))


def ttft_summary(ttfts: list[float]) -> dict[str, float]:
    return {f"p{q}": percentile(ttfts, q / 100) for q in (50, 90, 99)} | {"n": len(ttfts)}


# ---- the measured process ---------------------------------------------------------------------


def _child(spec: dict[str, Any]) -> None:
    """Build the engine, report start-up, run the stream cold then warm; one JSON object a line on stdout."""
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    import torch  # noqa: F401 - imported here so its import time is counted apart from the load
    from omni_gateway.engine.config import EngineConfig
    from omni_gateway.engine.core.llm_engine import LLMEngine
    from omni_gateway.engine.frontend.async_engine import AsyncEngine
    from omni_gateway.engine.runner.warmup import warm_up_engine

    imported = time.perf_counter()
    config = EngineConfig(**spec["engine"])
    llm = LLMEngine(config)
    loaded = time.perf_counter()
    report = warm_up_engine(llm, config.warmup)
    ready = time.perf_counter()
    engine = AsyncEngine(engine=llm)
    _emit(
        event="ready",
        import_s=imported - _START,
        load_s=loaded - imported,
        warmup_s=ready - loaded,
        warmup_mode=report.mode,
        warmup_steps=report.steps,
        startup_s=ready - _START,
        device=str(llm.runner.device),
        max_model_len=llm.max_model_len,
        kv_blocks=llm.runner.num_kv_blocks,
    )
    stream = spec["stream"]
    limit = llm.max_model_len - stream["max_tokens"] - 1
    requests, _ = make_stream(
        stream["requests"],
        seed=stream["seed"],
        max_concurrency=stream["max_concurrency"],
        min_prompt=min(stream["min_prompt"], limit),
        max_prompt=min(stream["max_prompt"], limit),
        shared_prefixes=stream["shared_prefixes"],
        cached=stream["cached_fraction"],
    )
    try:
        for pass_index, name in enumerate(("cold", "warm")):
            asyncio.run(_run_pass(engine, requests, name, pass_index, stream, llm.vocab_size))
    finally:
        engine.shutdown()


async def _run_pass(
    engine: Any, requests: list[Request], name: str, shift: int, stream: dict[str, Any], vocab_size: int
) -> None:
    from omni_gateway.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=stream["max_tokens"], ignore_eos=True)

    async def one(req: Request) -> None:
        ids = prompt_ids(req, seed=stream["seed"], shift=shift * 7919, vocab_size=vocab_size)
        start = time.perf_counter()
        ttft = None
        cached = 0
        async for delta in engine.generate(ids, params, request_id=f"{name}-{req.index}"):
            if ttft is None:
                ttft, cached = time.perf_counter() - start, delta.num_cached_tokens
        _emit(event="request", **{"pass": name}, **asdict(req), ttft_s=ttft, cached_tokens=cached)

    waves: dict[int, list[Request]] = {}
    for req in requests:
        waves.setdefault(req.wave, []).append(req)
    for wave in waves.values():
        await asyncio.gather(*(one(r) for r in wave))


def _emit(**record: Any) -> None:
    print(json.dumps(record), flush=True)


# ---- the driver -------------------------------------------------------------------------------


def _build_checkpoint(name: str, directory: Path, seed: int, device: str) -> None:
    """A random-weight checkpoint of ``name``: a tiny model on the CPU, a model shape in bf16 on the GPU."""
    import torch
    from transformers import AutoModelForCausalLM

    if name == "tiny":
        from tests.harness.checkpoints import save_tiny_checkpoint

        save_tiny_checkpoint("llama", directory, seed=seed)
        return
    from tests.harness.model_shapes import shape_config, word_tokenizer

    cfg = shape_config(name)
    torch.manual_seed(seed)
    with torch.device(device if device != "auto" else "cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    model.save_pretrained(directory)
    word_tokenizer(cfg.vocab_size).save_pretrained(directory)


def _spawn(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "benchmarks.cold_start", *args]
    # stderr (the engine's log: load, warm-up progress) goes straight to ours.
    root = Path(__file__).resolve().parent.parent
    return subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, text=True, timeout=timeout, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help=f"'default', 'tiny', {', '.join(SHAPES)}, or a checkpoint path")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--report-first", type=int, default=500, help="TTFT statistics over this many requests")
    parser.add_argument("--max-concurrency", type=int, default=64)
    parser.add_argument("--min-prompt", type=int, default=16)
    parser.add_argument("--max-prompt", type=int, default=4000, help="clipped to the model's context")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens generated per request")
    parser.add_argument("--shared-prefixes", type=int, default=8)
    parser.add_argument("--cached-fraction", type=float, default=0.5, help="share of prompts with a shared prefix")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", default="auto", choices=("auto", "full", "minimal", "off"))
    parser.add_argument("--no-warmup", action="store_true", help="same as --warmup off")
    parser.add_argument("--compile-cache-dir", default=None, help="reuse this cache (default: a new empty one)")
    parser.add_argument(
        "--max-model-len", type=int, default=None, help="default: 8192 for the shapes, else the model's"
    )
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed for the measured process")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--build-checkpoint", nargs=2, default=None, help=argparse.SUPPRESS)
    add_out_argument(parser, "cold_start")
    args = parser.parse_args()
    if args.child is not None:
        _child(json.loads(args.child))
        return
    if args.build_checkpoint is not None:
        _build_checkpoint(args.build_checkpoint[0], Path(args.build_checkpoint[1]), args.seed, args.device)
        return
    with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp:
        _drive(args, Path(tmp))


def _drive(args: argparse.Namespace, tmp: Path) -> None:
    model = args.model
    if model == "tiny" or model in SHAPES:
        directory = tmp / "checkpoint"
        t0 = time.perf_counter()
        _spawn(["--build-checkpoint", model, str(directory), "--seed", str(args.seed), "--device", args.device], 3600)
        print(f"built random {model} checkpoint in {time.perf_counter() - t0:.1f} s", flush=True)
        model = str(directory)
    cache = args.compile_cache_dir or str(tmp / "compile-cache")
    warmup = "off" if args.no_warmup else args.warmup
    engine: dict[str, Any] = {
        "model": model,
        "device": args.device,
        "dtype": args.dtype,
        "max_model_len": args.max_model_len or (8192 if args.model in SHAPES else None),
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "enforce_eager": args.enforce_eager,
        "compile_cache_dir": cache,
        "warmup": warmup,
    }
    stream = {
        "requests": args.requests,
        "seed": args.seed,
        "max_concurrency": args.max_concurrency,
        "min_prompt": args.min_prompt,
        "max_prompt": args.max_prompt,
        "max_tokens": args.max_tokens,
        "shared_prefixes": args.shared_prefixes,
        "cached_fraction": args.cached_fraction,
    }
    print(f"measured process: warm-up {warmup}, compile cache {cache} ({_describe_cache(cache)})", flush=True)
    done = _spawn(["--child", json.dumps({"engine": engine, "stream": stream})], args.timeout)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    ready = next(r for r in records if r["event"] == "ready")
    rows = [r for r in records if r["event"] == "request"]
    summary = _summarize(rows, args.report_first)
    with ResultLog(args.out, "cold_start", model=args.model, engine=engine, stream=stream) as log:
        log.write("startup", **ready)
        for row in rows:
            log.write("request", **row)
        log.write("summary", **summary)
    _print(args.model, ready, summary)


def _describe_cache(path: str) -> str:
    files = sum(len(f) for _, _, f in os.walk(path)) if os.path.isdir(path) else 0
    return f"{files} files" if files else "empty"


def _summarize(rows: list[dict[str, Any]], first: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("cold", "warm"):
        picked = sorted((r for r in rows if r["pass"] == name), key=lambda r: r["index"])[:first]
        out[name] = ttft_summary([r["ttft_s"] for r in picked])
    out["ratio"] = {q: out["cold"][q] / out["warm"][q] for q in ("p50", "p90", "p99")}
    out["p99_within_1.5x"] = out["ratio"]["p99"] <= 1.5
    return out


def _print(model: str, ready: dict[str, Any], summary: dict[str, Any]) -> None:
    print(
        f"{model} on {ready['device']}: start-up {ready['startup_s']:.1f} s (imports {ready['import_s']:.1f} s, "
        f"load {ready['load_s']:.1f} s, warm-up {ready['warmup_mode']} {ready['warmup_s']:.1f} s "
        f"in {ready['warmup_steps']} steps)"
    )
    print(f"TTFT of the first {summary['cold']['n']} requests {'p50':>12} {'p90':>12} {'p99':>12}")
    for name in ("cold", "warm"):
        s = summary[name]
        print(f"  {name:<32}" + " ".join(f"{1e3 * s[q]:9.1f} ms" for q in ("p50", "p90", "p99")))
    r = summary["ratio"]
    verdict = "within" if summary["p99_within_1.5x"] else "NOT within"
    ratios = " ".join(f"{r[q]:11.2f}x" for q in ("p50", "p90", "p99"))
    print(f"  {'cold / warm':<32}{ratios}  (p99 {verdict} the 1.5x target)")


if __name__ == "__main__":
    main()
