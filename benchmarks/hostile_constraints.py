"""Hostile output constraints: what compiling them costs, whether they hold up other requests, and what
compiled grammars hold in memory.

    python -m benchmarks.hostile_constraints [--depths 4,8,12,15] [--raw-depths 32,64,100] [--hostile 6]
        [--schemas 40] [--skip-load] [--skip-memory] [--out FILE]

1. Compile time of ``anyOf`` nested N levels (each level an integer or an object holding the next): through
   ``GrammarCache.prepare`` for depths the limits admit, xgrammar's compile alone for deeper ones (what the
   limits keep out; it grows with the square of the depth), and how long the limits take to refuse the
   240 levels (18 KB) that took 11.5 s to compile on a 150k vocabulary.
2. On the default model's engine (CPU), the worst wait (request sent -> first token) of three normal
   constrained requests (a small schema never seen before, and ``json_object``) sent while six hostile
   ones compile, each hostile request given up by its client after 3 s. Three setups, one command: the
   old layout (one compile thread, no limits) against the 240-level schemas; the pool and limits against
   those; the pool against six distinct schemas as large as the limits admit (1,024 enum values of ~120
   characters). The baseline is the same normal requests with nothing else running; printed: each
   worst wait and its ratio to the baseline (target: under 1 s).
3. RSS of a process that compiled ``--schemas`` distinct large enum schemas (each as large as the limits
   admit): with the default cache bound and with no bound (the baseline), each in a fresh process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.common import ResultLog, add_out_argument

HOSTILE_DEPTH = 240
CLIENT_TIMEOUT_S = 3.0
ENUM_VALUES, ENUM_CHARS = 1024, 118  # about 127 KB of schema: just under the 128 KiB limit


def nested_any_of(depth: int, salt: str = "") -> str:
    """``depth`` levels of ``anyOf``, as text (deeper than Python's json module writes); ``salt`` makes it
    distinct (a client that defeats the cache)."""
    head = '{"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": '
    tail = '{"type": "integer", "description": ' + json.dumps(salt) + "}"
    return head * depth + tail + "}}]}" * depth


def large_enum(seed: int) -> str:
    rng = random.Random(seed)
    values = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz ", k=ENUM_CHARS)) for _ in range(ENUM_VALUES)]
    return json.dumps({"enum": values})


def load_tokenizer() -> Any:
    from omni_gateway.engine.runner.loader import default_model_path
    from transformers import AutoTokenizer

    path = Path(default_model_path())
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def grammar_cache(tokenizer: Any, **kwargs: Any) -> Any:
    from omni_gateway.engine.core.structured_output import GrammarCache

    return GrammarCache(tokenizer, len(tokenizer), {tokenizer.eos_token_id}, **kwargs)


# ---- 1. compile time by depth ---------------------------------------------------------------------------


def compile_by_depth(log: ResultLog, depths: list[int], raw_depths: list[int]) -> None:
    from omni_gateway.engine.core.structured_output import _compile
    from omni_gateway.engine.errors import InvalidConstraint
    from omni_gateway.engine.sampling_params import StructuredOutputs

    cache = grammar_cache(load_tokenizer(), cache_bytes=0)
    cache.compile(StructuredOutputs(json_object=True))  # reads the vocabulary once, outside the timings
    print("depth  schema bytes  compile s  path")
    for depth, raw in [(d, False) for d in depths] + [(d, True) for d in raw_depths]:
        spec = StructuredOutputs(json=nested_any_of(depth))
        started = time.perf_counter()
        if raw:
            _compile(cache._compiler_locked(), spec)
        else:
            cache.prepare(spec)
        seconds = time.perf_counter() - started
        path = "xgrammar alone (past the limits)" if raw else "checked and compiled"
        log.write("compile_depth", depth=depth, schema_bytes=len(spec.json or ""), compile_s=seconds, path=path)
        print(f"{depth:5d}  {len(spec.json or ''):12d}  {seconds:9.3f}  {path}")
    spec = StructuredOutputs(json=nested_any_of(HOSTILE_DEPTH))
    started = time.perf_counter()
    try:
        cache.prepare(spec)
        refusal = None
    except InvalidConstraint as exc:
        refusal = str(exc)
    seconds = time.perf_counter() - started
    log.write("refuse_depth", depth=HOSTILE_DEPTH, schema_bytes=len(spec.json or ""), refuse_s=seconds, refusal=refusal)
    print(f"{HOSTILE_DEPTH:5d}  {len(spec.json or ''):12d}  {seconds:9.5f}  refused: {refusal}")


# ---- 2. a normal request's wait beside hostile compiles ---------------------------------------------------


async def first_token_s(engine: Any, spec: Any) -> tuple[float, str]:
    from omni_gateway.engine import SamplingParams
    from omni_gateway.engine.errors import InvalidRequest

    started = time.perf_counter()
    try:
        async for _ in engine.generate("Answer in JSON.", SamplingParams(max_tokens=1, structured_outputs=spec)):
            return time.perf_counter() - started, "answered"
    except InvalidRequest as exc:
        return time.perf_counter() - started, f"refused: {str(exc)[:80]}"
    return time.perf_counter() - started, "no token"


async def hostile(engine: Any, spec: Any) -> None:
    try:
        await asyncio.wait_for(first_token_s(engine, spec), CLIENT_TIMEOUT_S)  # the client gives up
    except TimeoutError:
        pass


def normal_specs(round_: int) -> list[Any]:
    from omni_gateway.engine.sampling_params import StructuredOutputs

    small = {"type": "object", "properties": {"n": {"type": "integer"}}, "description": f"normal {round_}"}
    return [StructuredOutputs(json=small), StructuredOutputs(json_object=True)]


async def normal_waits(engine: Any, hostile_specs: list[Any], round_: int) -> list[tuple[float, str]]:
    load = [asyncio.create_task(hostile(engine, spec)) for spec in hostile_specs]
    started = time.monotonic()
    waits = []
    for i, at in enumerate((0.2, 0.6, 1.0)):  # seconds after the hostile requests were sent
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        for spec in normal_specs(round_ * 10 + i):
            waits.append(await first_token_s(engine, spec))
    await asyncio.gather(*load)
    return waits


def load_setups(log: ResultLog, hostile_count: int) -> None:
    from omni_gateway.engine import EngineConfig
    from omni_gateway.engine.core.compile_pool import CompilePool
    from omni_gateway.engine.core.constraint_limits import ConstraintLimits
    from omni_gateway.engine.frontend.async_engine import AsyncEngine
    from omni_gateway.engine.sampling_params import StructuredOutputs

    engine = AsyncEngine(EngineConfig(model="default", device="cpu", warmup="off"))
    grammars = engine.engine.grammars
    pool, limits = grammars._pool, grammars.limits
    one_thread = CompilePool(grammars.prepare, workers=1, max_abandoned=0)  # the layout before
    try:
        asyncio.run(first_token_s(engine, StructuredOutputs(json_object=True)))  # vocabulary read, cache warm
        baseline = asyncio.run(normal_waits(engine, [], 0))
        base_worst = max(w for w, _ in baseline)
        log.write("normal_wait", setup="alone (baseline)", worst_s=base_worst, outcomes=[o for _, o in baseline])
        print(f"normal constrained request alone: worst wait {base_worst:.3f} s")
        salts = [str(random.random()) for _ in range(hostile_count)]  # distinct: the cache never answers
        deep = [StructuredOutputs(json=nested_any_of(HOSTILE_DEPTH, salt)) for salt in salts]
        large = [StructuredOutputs(json=large_enum(1000 + i)) for i in range(hostile_count)]
        setups = [
            ("one compile thread, no limits; 240-level anyOf", deep, True),
            ("pool and limits; 240-level anyOf", deep, False),
            ("pool and limits; largest admitted enum", large, False),
        ]
        for round_, (name, specs, old) in enumerate(setups, start=1):
            settle(one_thread)  # a compile the last setup's clients gave up on would share the cores
            settle(pool)
            grammars.clear()
            if old:  # the layout before: one thread, first come first served, and nothing refused up front
                grammars._pool = one_thread
                grammars.limits = ConstraintLimits(max_bytes=1 << 30, max_depth=1 << 20, max_enum_values=1 << 20)
            else:
                grammars._pool, grammars.limits = pool, limits
            asyncio.run(first_token_s(engine, StructuredOutputs(json_object=True)))
            started = time.perf_counter()
            waits = asyncio.run(normal_waits(engine, specs, round_))
            worst = max(w for w, _ in waits)
            outcomes = [o for _, o in waits]
            log.write(
                "normal_wait",
                setup=name,
                hostile=len(specs),
                worst_s=worst,
                ratio_to_baseline=worst / base_worst,
                outcomes=outcomes,
                wall_s=time.perf_counter() - started,
            )
            refused = sum(o.startswith("refused") for o in outcomes)
            print(
                f"{name}: worst wait {worst:.3f} s ({worst / base_worst:.1f}x the baseline), "
                f"{refused}/{len(outcomes)} normal requests refused"
            )
    finally:
        grammars._pool, grammars.limits = pool, limits
        engine.shutdown()
        settle(pool)
        settle(one_thread)


def settle(pool: Any, timeout_s: float = 60.0) -> None:
    """Wait for compiles still running (given up by their clients) to end, so none is cut off at exit."""
    deadline = time.monotonic() + timeout_s
    while any(pool.stats().values()) and time.monotonic() < deadline:
        time.sleep(0.1)


# ---- 3. memory after many large distinct schemas ----------------------------------------------------------


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def memory_child(schemas: int, cache_bytes: int) -> dict[str, Any]:
    """Run in a fresh process: RSS before and after compiling ``schemas`` distinct large schemas."""
    from omni_gateway.engine.runner.host_memory import return_free_heap
    from omni_gateway.engine.sampling_params import StructuredOutputs

    cache = grammar_cache(load_tokenizer(), cache_bytes=cache_bytes)
    cache.compile(StructuredOutputs(json_object=True))
    cache.clear()
    return_free_heap()
    before = rss_mib()
    started = time.perf_counter()
    for seed in range(schemas):
        cache.prepare(StructuredOutputs(json=large_enum(seed)))
    seconds = time.perf_counter() - started
    return_free_heap()
    return {
        "rss_before_mib": before,
        "rss_after_mib": rss_mib(),
        "cached_mib": cache.cached_bytes / 2**20,
        "bound_mib": cache_bytes / 2**20,
        "compile_s": seconds,
    }


def memory(log: ResultLog, schemas: int) -> None:
    from omni_gateway.engine.core.structured_output import DEFAULT_CACHE_BYTES

    rows = {}
    for name, bound in (("unbounded (baseline)", 1 << 50), ("default bound", DEFAULT_CACHE_BYTES)):
        command = [sys.executable, "-m", "benchmarks.hostile_constraints", "--memory-child", str(schemas), str(bound)]
        done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        grown = row["rss_after_mib"] - row["rss_before_mib"]
        rows[name] = grown
        log.write("memory", setup=name, schemas=schemas, schema_bytes=len(large_enum(0)), grown_mib=grown, **row)
        shown = "none" if bound >= 1 << 50 else f"{row['bound_mib']:.0f} MiB"
        print(
            f"{schemas} large schemas, bound {shown}: RSS +{grown:.0f} MiB "
            f"({row['rss_before_mib']:.0f} -> {row['rss_after_mib']:.0f}), cache holds {row['cached_mib']:.0f} MiB"
        )
    ratio = rows["default bound"] / rows["unbounded (baseline)"]
    print(f"bounded / unbounded RSS growth: {ratio:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="4,8,12,15")
    parser.add_argument("--raw-depths", default="32,64,100")
    parser.add_argument("--hostile", type=int, default=6)
    parser.add_argument("--schemas", type=int, default=40)
    parser.add_argument("--skip-load", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--memory-child", nargs=2, type=int, metavar=("SCHEMAS", "CACHE_BYTES"), help=argparse.SUPPRESS)
    add_out_argument(parser, "hostile_constraints")
    args = parser.parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(*args.memory_child)))
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with ResultLog(args.out, "hostile_constraints", hostile=args.hostile, schemas=args.schemas) as log:
        compile_by_depth(log, [int(d) for d in args.depths.split(",")], [int(d) for d in args.raw_depths.split(",")])
        if not args.skip_load:
            load_setups(log, args.hostile)
        if not args.skip_memory:
            memory(log, args.schemas)
    return 0


if __name__ == "__main__":
    sys.exit(main())
