"""Grammar-constrained decoding with xgrammar: compile a request's constraint, keep one matcher per
sequence, mask the constrained rows of a step's logits and advance the matchers with the kept tokens.

Compilation stays off the decode loop: ``AsyncEngine.generate`` and the engine core process compile on
``GrammarCache.submit``'s small pool, within a time budget, and hand the result to
``LLMEngine.add_request``. A constraint past ``engine.core.constraint_limits`` is refused before compiling,
one that no output satisfies (or only outputs longer than the request allows) after, and the cache of
compiled grammars is bounded by bytes. Matchers live on their ``Sequence`` and are touched only by the engine loop:
the sampler reads them to build the mask, ``OutputProcessor.absorb`` advances them with the tokens
it keeps. Where decode is pipelined (``engine.core.pipelining``), a constrained step's forward is launched
ahead and its masks are filled once the host has absorbed the token in flight, while the device runs
that forward; the mask is applied to the logits on the device, between the graph's replay and the
draw.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import math
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch
import xgrammar as xgr
from omni_gateway.engine.core.compile_pool import CompilePool
from omni_gateway.engine.core.constraint_limits import ConstraintLimits, check_limits, shortest_json_bytes
from omni_gateway.engine.core.sequence import Sequence
from omni_gateway.engine.errors import InvalidConstraint
from omni_gateway.engine.sampling_params import StructuredOutputs
from omni_gateway.kernels.host_copies import to_device

# A run of whitespace between JSON tokens is capped: a small model sampling at temperature 1 otherwise
# tends to spend its whole token budget on blank lines inside an unfinished object.
MAX_JSON_WHITESPACE = 16
DEFAULT_CACHE_BYTES = 256 << 20
DEFAULT_COMPILE_TIMEOUT_S = 5.0
# Compiles run without the GIL and mostly wait on memory; more threads than cores keep a quick compile
# from queueing behind slow ones (the OS shares the cores among them).
DEFAULT_COMPILE_WORKERS = 8
# What a compiled grammar costs the process, per byte of xgrammar's own measure (memory_size_bytes): RSS grew
# 1.29x that measure over 40 distinct large schemas, bounded or not (benchmarks/hostile_constraints.py).
_RSS_PER_MEASURED_BYTE = 1.3
# Pool threads run at this much lower OS priority: the decode loop's steps go first when cores are few.
COMPILE_NICENESS = 10
_MAX_DETAIL_CHARS = 160
# xgrammar's C++ log prefix: "[14:03:53] /project/cpp/regex_converter.cc:94: "
_LOG_PREFIX = re.compile(r"^\s*(\[[0-9:.]+\]\s*)?(\S+\.(cc|cpp|h|hpp|py):\d+:\s*)?")
_SOURCE_PATH = re.compile(r"\S*/\S+\.(cc|cpp|h|hpp|py)(:\d+)?:?\s*")
# xgrammar writes the characters of a length-bounded JSON string as [^"\\\r\n], which lets the other
# control characters (a raw tab) through although JSON allows them only escaped: the class is narrowed.
_LOOSE_STRING_CHAR = r"[^\"\\\r\n]"
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\\r\n]"


class GrammarCache:
    """Compiles constraints for one model's tokenizer; compiled grammars are cached by content, up to
    ``cache_bytes`` (xgrammar's own measure of each, scaled to what it was measured to cost the process),
    least recently used first out.

    Thread-safe. ``compile`` and ``prepare`` compile in the caller's thread; ``submit`` on a small pool
    (``engine.core.compile_pool``), answering a cached constraint at once. A constraint past ``limits`` is
    refused before compiling; one no output can satisfy is refused after. The tokenizer's vocabulary is
    read once, on the first constrained request, with the model's vocabulary size (which may exceed the
    tokenizer's: the extra ids are never allowed)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Collection[int],
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
        workers: int = DEFAULT_COMPILE_WORKERS,
        limits: ConstraintLimits = ConstraintLimits(),
    ) -> None:
        if cache_bytes < 0 or timeout_s <= 0:
            raise ValueError(f"cache_bytes must be >= 0 and timeout_s > 0, got {cache_bytes} and {timeout_s}")
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.cache_bytes = cache_bytes
        self.timeout_s = timeout_s
        self.limits = limits
        self._stop_token_ids = sorted(stop_token_ids)
        self._compiler: xgr.GrammarCompiler | None = None
        self._longest_token = 1  # bytes of the vocabulary's longest token, read with it
        self._compiled: OrderedDict[StructuredOutputs, Prepared] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()
        self._pool: CompilePool[StructuredOutputs, Prepared] = CompilePool(
            self.prepare, workers=workers, niceness=COMPILE_NICENESS, name="grammar"
        )

    @property
    def cached_bytes(self) -> int:
        """Bytes the compiled grammars cached now are estimated to hold."""
        with self._lock:
            return self._cached_bytes

    def compile(self, spec: StructuredOutputs) -> xgr.CompiledGrammar:
        """The compiled grammar of ``spec``; InvalidConstraint when it is refused."""
        return self.prepare(spec).grammar

    def prepare(self, spec: StructuredOutputs) -> Prepared:
        """``spec`` checked and compiled, in this thread; InvalidConstraint when it is refused."""
        with self._lock:
            hit = self._compiled.get(spec)
            if hit is not None:
                self._compiled.move_to_end(spec)
                return hit
            compiler = self._compiler_locked()
        check_limits(spec, self.limits)
        prepared = _prepare(compiler, spec)  # outside the lock: xgrammar compiles in parallel
        with self._lock:
            if spec not in self._compiled and prepared.bytes <= self.cache_bytes:
                self._compiled[spec] = prepared
                self._cached_bytes += prepared.bytes
                while self._cached_bytes > self.cache_bytes:
                    _, evicted = self._compiled.popitem(last=False)
                    self._cached_bytes -= evicted.bytes
        return prepared

    def submit(self, spec: StructuredOutputs) -> concurrent.futures.Future[Prepared]:
        """``prepare(spec)`` on the compile pool; done at once when cached. Cancel the future to withdraw
        (a compile nobody waits for stops holding a pool thread)."""
        with self._lock:
            hit = self._compiled.get(spec)
            if hit is not None:
                self._compiled.move_to_end(spec)
        if hit is None:
            return self._pool.submit(spec)
        done: concurrent.futures.Future[Prepared] = concurrent.futures.Future()
        done.set_result(hit)
        return done

    def over_budget(self, spec: StructuredOutputs) -> InvalidConstraint:
        """The refusal of a constraint that did not compile within ``timeout_s``."""
        return InvalidConstraint(
            f"the {spec.kind} constraint did not compile within {self.timeout_s:g} s "
            "(the server's --structured-outputs-compile-timeout); simplify it"
        )

    def check_length(self, prepared: Prepared, max_new_tokens: int) -> None:
        """InvalidConstraint when the constraint's shortest answer needs more than ``max_new_tokens``
        tokens (counted as if every token were the vocabulary's longest)."""
        tokens = math.ceil(prepared.shortest_bytes / self._longest_token)
        if tokens > max_new_tokens:
            raise InvalidConstraint(
                f"the {prepared.kind} constraint's shortest answer needs at least {tokens} tokens "
                f"({prepared.shortest_bytes:g} bytes), but the request allows {max_new_tokens} (max_tokens)"
            )

    def clear(self) -> None:
        """Forget the compiled grammars (the vocabulary's index stays)."""
        with self._lock:
            self._compiled.clear()
            self._cached_bytes = 0

    def matcher(self, spec: StructuredOutputs) -> xgr.GrammarMatcher:
        return xgr.GrammarMatcher(self.compile(spec))

    @staticmethod
    def matcher_for(prepared: Prepared) -> xgr.GrammarMatcher:
        return xgr.GrammarMatcher(prepared.grammar)

    @staticmethod
    def accept(seqs: list[Sequence], token_ids: list[int | None]) -> list[Sequence]:
        """Advance each constrained, unfinished sequence's matcher with its sampled token, before the
        token is kept. A token the matcher rejects (only possible when every token was masked) becomes
        None in ``token_ids``, so it is never kept; those sequences are returned, to be ended."""
        rejected: list[Sequence] = []
        for i, (seq, token) in enumerate(zip(seqs, token_ids)):
            if token is None or seq.grammar is None or seq.is_finished:
                continue
            if not seq.grammar.accept_token(token):
                token_ids[i] = None
                rejected.append(seq)
        return rejected

    def _compiler_locked(self) -> xgr.GrammarCompiler:
        if self._compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(
                self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stop_token_ids or None
            )
            self._longest_token = max(1, max((len(t) for t in info.decoded_vocab), default=1))
            # Ours caches by spec. One compile's threads are bounded: several compiles run side by side.
            self._compiler = xgr.GrammarCompiler(info, max_threads=_compile_threads(), cache_enabled=False)
        return self._compiler


@dataclass(frozen=True, slots=True)
class Prepared:
    """A constraint ready for matchers: its compiled grammar, the memory that grammar is estimated to hold
    and a lower bound on the bytes of any answer it allows (0 when unknown)."""

    kind: str
    grammar: xgr.CompiledGrammar
    bytes: int
    shortest_bytes: float


def _prepare(compiler: xgr.GrammarCompiler, spec: StructuredOutputs) -> Prepared:
    shortest = _shortest_bytes(spec)
    if shortest == math.inf:
        raise InvalidConstraint(
            f"the {spec.kind} constraint has no finite answer: every value would contain itself (a required "
            "property, item or allOf refers back to the schema around it with no way out)"
        )
    grammar = _compile(compiler, spec)
    matcher = xgr.GrammarMatcher(grammar)
    first = xgr.allocate_token_bitmask(1, grammar.tokenizer_info.vocab_size)
    matcher.fill_next_token_bitmask(first)
    if not bool(first.any()):
        raise InvalidConstraint(
            f"the {spec.kind} constraint matches no output: no token can start an answer (for instance a rule "
            "that only refers to itself, rules that only refer to each other, or a schema that requires itself)"
        )
    return Prepared(spec.kind, grammar, int(grammar.memory_size_bytes * _RSS_PER_MEASURED_BYTE), shortest)


def _shortest_bytes(spec: StructuredOutputs) -> float:
    if spec.json is not None:
        return shortest_json_bytes(spec.json)
    if spec.json_object:
        return 2
    if spec.choice is not None:
        return min(len(c.encode()) for c in spec.choice)
    return 0  # a regex, grammar or structural tag: not analysed


def _compile(compiler: xgr.GrammarCompiler, spec: StructuredOutputs) -> xgr.CompiledGrammar:
    kind = spec.kind
    whitespace: dict[str, Any] = (
        {"any_whitespace": False} if spec.disable_any_whitespace else {"max_whitespace_cnt": MAX_JSON_WHITESPACE}
    )
    try:
        if spec.json is not None:
            schema = json.loads(spec.json)
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"a JSON schema is an object or a boolean, got {type(schema).__name__}")
            return compiler.compile_grammar(_strict_strings(xgr.Grammar.from_json_schema(spec.json, **whitespace)))
        if spec.json_object:
            return compiler.compile_json_schema('{"type": "object"}', **whitespace)
        if spec.regex is not None:
            return compiler.compile_regex(spec.regex)
        if spec.choice is not None:
            alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice)
            return compiler.compile_grammar(f"root ::= {alternatives}")
        if spec.grammar is not None:
            return compiler.compile_grammar(spec.grammar)
        assert spec.structural_tag is not None
        return compiler.compile_grammar(_strict_strings(xgr.Grammar.from_structural_tag(spec.structural_tag)))
    except Exception as exc:  # xgrammar raises RuntimeError, ValueError or its own errors for bad input
        raise InvalidConstraint(f"invalid {kind} constraint: {library_message(exc)}") from exc


def library_message(exc: BaseException) -> str:
    """The compiler's own words about ``exc``, without its log prefix (time, source file and line) or any
    source path, first line only, cut short."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = _SOURCE_PATH.sub("", _LOG_PREFIX.sub("", lines[0])).strip() if lines else ""
    if not text:
        return f"the compiler refused it ({type(exc).__name__})"
    return text if len(text) <= _MAX_DETAIL_CHARS else text[: _MAX_DETAIL_CHARS - 3].rstrip() + "..."


def _strict_strings(grammar: xgr.Grammar) -> xgr.Grammar:
    """``grammar`` with every JSON string character class excluding the control characters."""
    text = str(grammar)
    if _LOOSE_STRING_CHAR not in text:
        return grammar
    return xgr.Grammar.from_ebnf(text.replace(_LOOSE_STRING_CHAR, _JSON_STRING_CHAR))


# ---- the engine loop side ---------------------------------------------------------------------------


def apply_masks(
    logits: torch.Tensor, seqs: list[Sequence], buffer: HostBitmask, *, in_place: bool = False
) -> torch.Tensor:
    """``logits`` with every token the row's matcher forbids set to -inf, for constrained rows only
    (a copy unless ``in_place``); the input itself when no row is constrained. Other rows keep their
    values bit for bit. The masks are filled on the host, several rows at once on xgrammar's threads,
    into ``buffer`` (the caller's, reused step after step), and applied on the logits' device without
    waiting for it."""
    # A sequence that ended while its step ran ahead keeps a terminated matcher: its row is discarded.
    rows = [i for i, seq in enumerate(seqs) if seq.grammar is not None and not seq.is_finished]
    if not rows:
        return logits
    vocab = logits.shape[1]
    device = logits.device
    bitmask = buffer.claim(len(seqs), vocab, pinned=device.type == "cuda")
    if len(rows) == 1:
        seqs[rows[0]].grammar.fill_next_token_bitmask(bitmask, rows[0])
    else:
        _batch_filler().batch_fill_next_token_bitmask([seqs[i].grammar for i in rows], bitmask, rows)
    masked = logits if in_place else logits.clone()
    if device.type == "cpu":
        xgr.apply_token_bitmask_inplace(masked, bitmask, vocab_size=vocab, indices=rows)
        return masked
    # xgrammar's CUDA kernel (Triton), given device-side row indices: from a host list it would copy them
    # from pageable memory, which waits for the device (the forward these masks are meant to overlap).
    from xgrammar.kernels.apply_token_bitmask_inplace_triton import apply_token_bitmask_inplace_triton

    indices = to_device(rows, torch.int32, device)
    apply_token_bitmask_inplace_triton(masked, buffer.upload(bitmask, device), vocab, indices)
    return masked


class HostBitmask:
    """The host buffer a step's masks are filled into, kept from step to step: allocating and pinning
    one per step costs more than filling it, and torch's parallel fill of a fresh one wakes its thread
    pool, whose spinning threads then take the cores xgrammar fills the masks on. Pinned for a GPU, so
    the upload is asynchronous; a refill waits for the previous upload to be done."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._uploaded: torch.cuda.Event | None = None

    def claim(self, rows: int, vocab: int, *, pinned: bool) -> torch.Tensor:
        """int32 ``[rows, ceil(vocab / 32)]``; its contents are stale (every filled row is overwritten)."""
        if self._uploaded is not None:
            self._uploaded.synchronize()
            self._uploaded = None
        words = -(-vocab // 32)
        buffer = self._buffer
        if buffer is None or buffer.shape[0] < rows or buffer.shape[1] != words or buffer.is_pinned() != pinned:
            self._buffer = buffer = torch.empty(max(rows, 64), words, dtype=torch.int32, pin_memory=pinned)
        return buffer[:rows]

    def upload(self, bitmask: torch.Tensor, device: torch.device) -> torch.Tensor:
        on_device = bitmask.to(device, non_blocking=True)
        uploaded = torch.cuda.Event()  # type: ignore[no-untyped-call]
        uploaded.record()
        self._uploaded = uploaded
        return on_device


def _compile_threads() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) // 2))


@functools.cache
def _batch_filler() -> xgr.BatchGrammarMatcher:
    # xgrammar's default is half of the host's hardware threads, which in a container limited to a few
    # cores oversubscribes them many times over; the engine loop needs one of this process's cores.
    return xgr.BatchGrammarMatcher(max_threads=max(1, min(8, len(os.sched_getaffinity(0)) - 1)))
