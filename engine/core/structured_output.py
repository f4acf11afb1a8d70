"""Grammar-constrained decoding with xgrammar: compile a request's constraint, keep one matcher per
sequence, mask the constrained rows of a step's logits and advance the matchers with the kept tokens.

Compilation happens in the caller's thread (``AsyncEngine.generate`` compiles before the request
reaches the loop; ``LLMEngine.add_request`` then finds it in the cache), so a slow schema never
stalls the decode loop. Matchers live on their ``Sequence`` and are touched only by the engine loop:
the sampler reads them to build the mask, ``LLMEngine._absorb`` advances them with the tokens it
keeps. Where decode is pipelined (``engine.core.pipelining``), a constrained step's forward is launched
ahead and its masks are filled once the host has absorbed the token in flight, while the device runs
that forward; the mask is applied to the logits on the device, between the graph's replay and the
draw.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

import torch
import xgrammar as xgr
from omni_gateway.engine.core.sequence import Sequence
from omni_gateway.engine.errors import InvalidConstraint
from omni_gateway.engine.sampling_params import StructuredOutputs
from omni_gateway.kernels.host_copies import to_device

# A run of whitespace between JSON tokens is capped: a small model sampling at temperature 1 otherwise
# tends to spend its whole token budget on blank lines inside an unfinished object.
MAX_JSON_WHITESPACE = 16
_CACHE_SIZE = 256
# xgrammar writes the characters of a length-bounded JSON string as [^"\\\r\n], which lets the other
# control characters (a raw tab) through although JSON allows them only escaped: the class is narrowed.
_LOOSE_STRING_CHAR = r"[^\"\\\r\n]"
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\\r\n]"


class GrammarCache:
    """Compiles constraints for one model's tokenizer; compiled grammars are cached by content.

    Thread-safe. The tokenizer's vocabulary is read once, on the first constrained request, with the
    model's vocabulary size (which may exceed the tokenizer's: the extra ids are never allowed)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Collection[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._stop_token_ids = sorted(stop_token_ids)
        self._compiler: xgr.GrammarCompiler | None = None
        self._compiled: OrderedDict[StructuredOutputs, xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: StructuredOutputs) -> xgr.CompiledGrammar:
        """The compiled grammar of ``spec``; InvalidConstraint when xgrammar rejects it."""
        with self._lock:
            hit = self._compiled.get(spec)
            if hit is not None:
                self._compiled.move_to_end(spec)
                return hit
            compiler = self._compiler_locked()
        compiled = _compile(compiler, spec)  # outside the lock: xgrammar compiles in parallel
        with self._lock:
            self._compiled[spec] = compiled
            while len(self._compiled) > _CACHE_SIZE:
                self._compiled.popitem(last=False)
        return compiled

    def clear(self) -> None:
        """Forget the compiled grammars (the vocabulary's index stays)."""
        with self._lock:
            self._compiled.clear()

    def matcher(self, spec: StructuredOutputs) -> xgr.GrammarMatcher:
        return xgr.GrammarMatcher(self.compile(spec))

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
            self._compiler = xgr.GrammarCompiler(info, cache_enabled=False)  # ours caches by spec
        return self._compiler


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
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidConstraint(f"invalid {kind} constraint: {detail}") from exc


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


@functools.cache
def _batch_filler() -> xgr.BatchGrammarMatcher:
    # xgrammar's default is half of the host's hardware threads, which in a container limited to a few
    # cores oversubscribes them many times over; the engine loop needs one of this process's cores.
    return xgr.BatchGrammarMatcher(max_threads=max(1, min(8, len(os.sched_getaffinity(0)) - 1)))
