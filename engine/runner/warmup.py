"""Start-up warm-up: every step shape the configured engine can hit runs once before it serves.

The first step of each new shape pays Triton compiles (seconds on a cold cache), cuBLAS heuristics and
allocator growth; a server that reports healthy before paying them hands that cost to its first users.
The warm-up drives the engine's own path (``add_request`` + ``step``) with dummy prompts, so it runs
exactly the kernels real requests run, then forgets every trace of itself: no KV blocks, no prefix-cache
entries, counters at zero and the sampler re-seeded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from omni_gateway.engine.core.kv_cache_manager import KVCacheManager
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.core.scheduler import Scheduler
from omni_gateway.engine.runner import compile_cache
from omni_gateway.engine.sampling_params import SamplingParams, StructuredOutputs

log = logging.getLogger(__name__)

_SHORT_PROMPT = 8  # tokens of the prompts whose decode steps are being warmed
# Tokens each decoder adds after the shared context: its first step is a prefill over a cached
# prefix (a single token would make it a decode-shaped step).
_TAIL = 16
_GENERATED = 3  # tokens per warm-up request: the prefill step, then decode steps
# Past this context the decode launch choices no longer change (splits top out at 64 tiles of 64).
_LONGEST_DECODE_CONTEXT = 8192
# Bound on one phase's prefill work (in steps of the full budget), for engines without prefix caching.
_PREFILL_TOKENS_PER_PHASE = 16


@dataclass(frozen=True, slots=True)
class Phase:
    """A group of requests run together until all finish; ``late`` joins once the first step ran,
    so its prefill chunks share steps with the decodes of the others."""

    name: str
    prompts: tuple[tuple[int, ...], ...]
    params: tuple[SamplingParams, ...]
    late: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class WarmupReport:
    mode: str
    phases: int
    steps: int
    seconds: float


def _greedy(max_tokens: int = _GENERATED) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def sampler_variants() -> tuple[SamplingParams, ...]:
    """One request per sampler path: greedy, each truncation, penalties, logprobs, min_tokens, seeded, and a
    grammar-constrained one."""
    greedy = _greedy()
    hot = replace(greedy, temperature=0.8)
    return (
        greedy,
        hot,
        replace(hot, top_k=20),
        replace(hot, top_p=0.9),
        replace(hot, min_p=0.05),
        replace(hot, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1),
        replace(greedy, logprobs=2),
        replace(hot, logprobs=0, top_k=20, top_p=0.9, min_p=0.05, seed=1),
        replace(greedy, min_tokens=_GENERATED),
        # Builds the tokenizer's grammar index (once per model) and runs the masked sampler path.
        replace(greedy, structured_outputs=StructuredOutputs(json_object=True)),
    )


def _powers_of_two(lo: int, hi: int) -> list[int]:
    """Powers of two in [lo, hi], plus hi itself: the sizes whose kernels differ are bucketed by them."""
    out, n = [], 1
    while n <= hi:
        if n >= lo:
            out.append(n)
        n *= 2
    if hi >= lo and (not out or out[-1] != hi):
        out.append(hi)
    return out


def _batch_sizes(max_num_seqs: int, graph_buckets: tuple[int, ...]) -> list[int]:
    """Powers of two and three times them (1, 2, 3, 4, 6, 8, 12, ...) up to ``max_num_seqs``: the decode
    launch choice changes where the batch's programs per SM cross a whole number (see
    ``gpu_decode_config``), which powers of two alone step over (17-24 sequences of 8 KV heads on 132
    SMs get two splits each, 16 get more and 32 one). Plus one past the largest graph bucket: eager."""
    sizes = set(_powers_of_two(1, max_num_seqs))  # max_num_seqs included
    sizes |= {3 * b for b in _powers_of_two(1, max_num_seqs // 3) if b & (b - 1) == 0}
    return sorted(sizes | {b + 1 for b in graph_buckets[-1:] if b < max_num_seqs})


def _missed_launches(
    key: Callable[[int, int], Hashable] | None, sizes: list[int], context: int, max_num_seqs: int, block_size: int
) -> list[int]:
    """The smallest batch size of each decode launch key over ``context`` tokens that ``sizes`` misses."""
    if key is None:
        return []
    width = -(-context // block_size) * block_size  # the kernel sees whole blocks of the block table
    seen = {key(b, width) for b in sizes}
    extra = []
    for b in range(1, max_num_seqs + 1):
        k = key(b, width)
        if k not in seen:
            seen.add(k)
            extra.append(b)
    return extra


class _Prompts:
    """Distinct dummy prompts: each salt starts a different token sequence, so nothing hits the
    prefix cache unless a prompt reuses another's salt on purpose."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.salt = 0

    def new(self, length: int) -> tuple[int, ...]:
        self.salt += 1
        return self.of(self.salt, length)

    def of(self, salt: int, length: int) -> tuple[int, ...]:
        v = self.vocab_size
        return tuple((salt * 7919 + i * 104729 + (salt * i) % 97) % v for i in range(length))


def plan(
    mode: str,
    *,
    vocab_size: int,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    block_size: int,
    kv_tokens: int,
    prefix_caching: bool = True,
    graph_buckets: tuple[int, ...] = (),
    launch_key: Callable[[int, int], Hashable] | None = None,
) -> list[Phase]:
    """The phases of a warm-up: a function of the engine's limits only, so it is testable without a model.

    Kernel choices depend on the batch size and the longest context of a step (decode splits and
    tiles; see ``kernels.attention_config.gpu_decode_config``), both bucketed by powers of two, so the
    warm-up walks a grid of those: for each context length one prompt of that length (uncached
    prefill, chunked past the token budget), then for each batch size that many sequences decoding
    over it (their prompts add a few tokens to its cached prefix) while a late prompt prefills in the
    same steps. ``launch_key(batch, context)``, where given, names the decode kernel a step of that shape
    compiles; batch sizes that reach a key the sizes above miss are added for that context."""
    if mode not in ("full", "minimal", "off"):
        raise ValueError(f"warm-up mode must be 'full', 'minimal' or 'off', got {mode!r}")
    if mode == "off":
        return []
    prompts = _Prompts(vocab_size)
    longest = max(2, max_model_len - _GENERATED - 1)  # a prompt plus its generated tokens must fit
    if mode == "minimal":
        return [Phase("prefill 16 + decode", (prompts.new(min(16, longest)),), (_greedy(),))]
    phases: list[Phase] = []
    budget = max_num_batched_tokens
    late = min(16, longest)
    sizes = _batch_sizes(max_num_seqs, graph_buckets)
    for context in _powers_of_two(16, min(longest - _TAIL, _LONGEST_DECODE_CONTEXT, kv_tokens // 2)):
        prefix = prompts.new(context)
        phases.append(Phase(f"prefill {context} tokens", (prefix,), (_greedy(),)))
        cached = prefix if prefix_caching else ()
        for b in sizes + _missed_launches(launch_key, sizes, context + _TAIL + _GENERATED, max_num_seqs, block_size):
            own = context - len(cached) + _TAIL  # tokens a sequence computes itself; the rest is cached
            if len(cached) + b * (own + _GENERATED + 2 * block_size) + late + 2 * block_size > kv_tokens:
                break
            if b * own > _PREFILL_TOKENS_PER_PHASE * budget:
                break
            phases.append(
                Phase(
                    f"{b} decodes over {context} tokens + prefill {late}",
                    tuple(prefix + prompts.new(_TAIL) for _ in range(b)),
                    (_greedy(max_tokens=_GENERATED + 2),) * b,
                    late=(prompts.new(late),),
                )
            )
    # Every sampler path, alone and together in one batch.
    variants = sampler_variants()
    for params in variants:
        phases.append(Phase("sampler", (prompts.new(_SHORT_PROMPT),), (params,)))
    together = min(len(variants), max_num_seqs)
    phases.append(Phase("sampler mix", tuple(prompts.new(_SHORT_PROMPT) for _ in range(together)), variants[:together]))
    return phases


def warm_up_engine(
    engine: LLMEngine, mode: str = "full", *, progress: Callable[[int, int, str], None] | None = None
) -> WarmupReport:
    """Run ``mode``'s phases through ``engine`` (see ``plan``), then leave it as it was built.

    ``progress(done, total, phase)`` is called after each phase; by default it logs every phase."""
    start = time.perf_counter()
    config = engine.config
    requested = mode
    record = _warm_record(engine)
    warmed = record is not None and compile_cache.is_warmed(record[0], record[1])
    mode = resolve_mode(mode, on_cuda=engine.runner.device.type == "cuda", cache_warmed=warmed)
    if requested == "auto" and warmed and record is not None:
        log.info("compile cache %s holds this configuration's kernels: minimal warm-up", record[0])
    kv = engine.scheduler.kv
    graphs = getattr(engine.runner, "graphs", None)
    phases = plan(
        mode,
        vocab_size=engine.vocab_size,
        max_model_len=engine.max_model_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        block_size=kv.block_size,
        kv_tokens=kv.num_blocks * kv.block_size,
        prefix_caching=kv.enable_prefix_caching,
        graph_buckets=tuple(graphs.buckets) if graphs is not None else (),
        launch_key=_decode_launch_key(engine),
    )
    if not phases:
        return WarmupReport(mode, 0, 0, 0.0)
    if engine.has_unfinished():
        raise RuntimeError("warm-up needs an idle engine; requests are already queued")
    report = progress or _log_progress(start)
    ids = _request_ids()
    steps = 0
    try:
        for done, phase in enumerate(phases, 1):
            steps += _run_phase(engine, phase, ids)
            report(done, len(phases), phase.name)
    except BaseException:
        engine.abort_all()  # the error stands; the engine is not served after a failed warm-up
        raise
    _forget(engine)
    if mode == "full" and requested in ("auto", "full") and record is not None:
        compile_cache.mark_warmed(*record)
    seconds = time.perf_counter() - start
    log.info("warm-up (%s): %d phases, %d engine steps in %.1f s", mode, len(phases), steps, seconds)
    return WarmupReport(mode, len(phases), steps, seconds)


def resolve_mode(mode: str, *, on_cuda: bool, cache_warmed: bool) -> str:
    """The warm-up ``mode`` runs as: "auto" is "full" on CUDA over a compile cache not yet warmed for
    this configuration, "minimal" otherwise. Only CUDA compiles kernels; the CPU's torch path still pays
    first-call costs per shape, but its full grid is slow to run there (a 256-sequence decode over 8k
    tokens), so it is asked for by name. A persisted cache that a full warm-up of the same configuration
    filled holds every kernel: on the H200 a minimal warm-up over one gave first requests the TTFT of
    warm ones (docs/benchmarks.md, "Cold start")."""
    if mode != "auto":
        return mode
    return "full" if on_cuda and not cache_warmed else "minimal"


def _warm_record(engine: LLMEngine) -> tuple[str, str, dict[str, Any]] | None:
    """(compile cache directory, configuration key, description) of a CUDA engine whose compile cache
    was named (the one a deployment persists); None otherwise."""
    config = engine.config
    runner: Any = engine.runner
    if config.compile_cache_dir is None or runner.device.type != "cuda":
        return None
    import torch
    import triton

    description = {
        "model": config.model,
        "shape": repr(getattr(getattr(runner, "model", None), "shape", None)),
        "vocab_size": engine.vocab_size,
        "max_model_len": engine.max_model_len,
        "engine": {
            name: getattr(config, name)
            for name in ("dtype", "max_num_seqs", "max_num_batched_tokens", "block_size", "enforce_eager")
        },
        "attention": getattr(getattr(runner, "ops", None), "name", None),
        "kv_blocks": engine.scheduler.kv.num_blocks,
        "prefix_caching": engine.scheduler.kv.enable_prefix_caching,
        "gpu": torch.cuda.get_device_name(runner.device),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    return config.compile_cache_dir, compile_cache.configuration_key(description), description


def _decode_launch_key(engine: LLMEngine) -> Callable[[int, int], Hashable] | None:
    """The Triton decode kernel's launch key for this engine's model and GPU (None off the Triton path)."""
    runner: Any = engine.runner
    if runner.device.type != "cuda" or getattr(getattr(runner, "ops", None), "name", None) != "triton":
        return None
    import torch
    from omni_gateway.kernels.attention_config import decode_launch_key

    sm_count = torch.cuda.get_device_properties(runner.device).multi_processor_count
    shape, element_size = runner.model.shape, runner.kv_dtype.itemsize
    return lambda batch, context: decode_launch_key(
        sm_count, batch, shape.num_kv_heads, context, head_dim=shape.head_dim, element_size=element_size
    )


def _request_ids() -> Iterator[str]:
    n = 0
    while True:
        n += 1
        yield f"warm-up-{n}"


def _run_phase(engine: LLMEngine, phase: Phase, ids: Iterator[str]) -> int:
    for prompt, params in zip(phase.prompts, phase.params):
        engine.add_request(next(ids), list(prompt), params)
    steps = 0
    if phase.late:
        engine.step()  # the others' prefill; from here they decode
        steps += 1
        for prompt in phase.late:
            engine.add_request(next(ids), list(prompt), _greedy())
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return steps


def _forget(engine: LLMEngine) -> None:
    """Drop everything the warm-up left: outputs, prefix-cache entries, counters, sampler state."""
    engine.pop_finished()
    engine.pipelined = engine.pipelined  # drops a step launched ahead for finished requests
    old = engine.scheduler.kv
    if old.num_used_blocks:
        raise RuntimeError(f"warm-up left {old.num_used_blocks} KV blocks in use")
    kv = KVCacheManager(
        old.num_blocks,
        old.block_size,
        enable_prefix_caching=old.enable_prefix_caching,
        max_row_blocks=old.max_row_blocks,
    )
    engine.scheduler = Scheduler(engine.config, kv)
    engine.num_steps_ahead = 0
    runner = engine.runner
    sampler = getattr(runner, "sampler", None)
    if sampler is not None:
        from omni_gateway.engine.runner.sampler import Sampler

        runner.sampler = Sampler(sampler.device, engine.config.seed)  # type: ignore[attr-defined]


def _log_progress(start: float) -> Callable[[int, int, str], None]:
    def report(done: int, total: int, phase: str) -> None:
        log.info("warm-up %d/%d (%.1f s): %s", done, total, time.perf_counter() - start, phase)

    return report
