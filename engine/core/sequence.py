"""Mutable per-request state shared by the scheduler, the block pool and the runner (no torch here)."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass
from typing import Any

from omni_gateway.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):  # noqa: UP042 - str() of a member keeps its enum name
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class EmbedSpan:
    """Placeholder positions whose input embeddings come from an encoder instead of the token table.

    ``key`` is the content hash of the media; it enters the KV block hash of every block the span
    touches, so two prompts with the same placeholder tokens but different images never share KV.
    ``embeds`` is a ``[length, hidden]`` tensor (kept as ``Any`` so this module stays torch-free).
    ``positions`` is only for models with multimodal rotary positions (M-RoPE, see engine/runner/mrope.py):
    an int ``[3, length]`` tensor of per-axis position offsets relative to the span's first token.
    ``position_keys`` (one int per position) key each block by the slice it overlaps instead of by the
    whole span: for rows that are a function of a prompt up to each position (a thinker's hidden states
    conditioning a talker), so two prompts that agree up to a block share it although their spans end apart.
    ``deepstack`` (Qwen3-VL's DeepStack) is a ``[layers, length, hidden]`` tensor: row ``i`` of layer ``l`` is added
    to the hidden state of the span's token ``i`` after decoder layer ``l``.
    """

    offset: int
    length: int
    key: str
    embeds: Any
    positions: Any = None
    position_keys: tuple[int, ...] = ()
    deepstack: Any = None


_ids = itertools.count()


class PromptThenOutput:
    """``token_ids`` read as the prompt's ``num_prompt_tokens`` tokens, then the output."""

    __slots__ = ()
    token_ids: list[int]
    num_prompt_tokens: int

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]


class Sequence(PromptThenOutput):
    """One generation stream. ``token_ids`` = prompt + output; the first ``num_computed_tokens`` are in the KV cache."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        priority: int = 0,
        embed_spans: tuple[EmbedSpan, ...] = (),
        eos_token_ids: frozenset[int] = frozenset(),
        max_model_len: int | None = None,
    ) -> None:
        self.seq_id = next(_ids)
        self.request_id = request_id
        self.params = params
        self.priority = priority  # lower runs first: 0 realtime turns, 1 bulk work
        self.arrival_time = time.monotonic()
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.embed_spans = embed_spans
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None  # the stop string or stop token id that ended it
        self.block_table: list[int] = []  # only appended to, until emptied
        self.block_table_version = 0  # counts the times block_table was emptied
        self.num_computed_tokens = 0  # tokens whose K/V are written to the cache
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at the last admission
        self.num_preemptions = 0
        self.output_logprobs: list[Any] = []  # one entry per output token when params.logprobs is set
        # The xgrammar matcher of a constrained request (engine.core.structured_output), at the state after
        # the output tokens so far; None when unconstrained or once the request is retired.
        self.grammar: Any = None
        # Rows that arrive while it runs, one per generated position (engine.runner.input_stream.InputStream).
        self.input_stream: Any = None
        # The LoRA adapter it generates with (engine.lora.adapter.LoraAdapter), None for the base model; held
        # here, so an adapter unloaded meanwhile serves its running sequences to the end.
        self.lora: Any = None
        # (first position, hidden rows, embedding rows) per step, with params.return_hidden_states;
        # the runner appends, the engine hands them out with the next delta.
        self.hidden_rows: list[tuple[int, Any, Any]] = []
        # With params.return_hidden_states: positions whose rows were handed out (a recomputation after a
        # preemption sends none twice); the rows (first position, rows) of computed positions whose block is
        # not cached yet, which the KV cache keeps with the block once it fills; and the cached rows of the
        # prefix this sequence was admitted with, which the runner hands out before its own.
        self.hidden_sent = 0
        self.pending_rows: list[tuple[int, Any]] = []
        self.prefix_rows: tuple[Any, ...] = ()

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def waits_for_input(self, num_new_tokens: int) -> bool:
        """Whether the input rows of its next ``num_new_tokens`` positions have not all arrived."""
        stream = self.input_stream
        return stream is not None and not stream.ready(self.num_computed_tokens + num_new_tokens)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def slot(self, pos: int, block_size: int) -> int:
        """The KV-cache slot of position ``pos``: its block's id times ``block_size`` plus its offset."""
        return self.block_table[pos // block_size] * block_size + pos % block_size

    def extra_keys_for(self, start: int, end: int) -> tuple[str, ...]:
        """Content keys of the spans overlapping token positions [start, end), for the block hash."""
        # A block computed with an adapter holds that adapter's K/V: it keys every block it fills.
        keys = [self.lora.cache_key] if self.lora is not None else []
        for s in self.embed_spans:
            if s.offset < end and start < s.offset + s.length:
                if s.position_keys:
                    lo, hi = max(start, s.offset) - s.offset, min(end, s.offset + s.length) - s.offset
                    keys.append(f"{s.key}:{','.join(map(str, s.position_keys[lo:hi]))}")
                else:
                    keys.append(s.key)
        return tuple(keys)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, status={self.status.value}, tokens={len(self.token_ids)}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )


@dataclass(slots=True)
class ScheduledBatch:
    """One engine step: each sequence computes ``num_new_tokens[i]`` tokens starting at its
    ``num_computed_tokens``. A sequence samples a token when that reaches ``len(seq)``.

    ``drafts`` (speculative decoding, ``engine.spec``): per sequence, draft tokens scored after its last
    token; ``num_new_tokens`` counts them (1 + len(drafts) for a decoding sequence). None: no drafts.
    ``draft_probs``: per sequence, the draft distribution of its drafts (``engine.spec.proposer.Proposal.probs``)
    or None for point masses."""

    seqs: list[Sequence]
    num_new_tokens: list[int]
    preempted: list[Sequence]
    drafts: list[tuple[int, ...]] | None = None
    draft_probs: list[Any] | None = None

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)
