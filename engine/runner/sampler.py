"""Batched token sampling over one step's logits.

Order (vLLM's): min_tokens masking, penalties, grammar masks (constrained rows only, see
``engine.core.structured_output``), then greedy argmax, or temperature -> top-k ->
top-p -> min-p -> a draw. Repetition penalty looks at prompt + output tokens; presence and
frequency penalties at output tokens only. Logprobs are those of the raw model distribution.

A draw is ``argmax(probs / E)`` with ``E ~ Exp(1)`` (equivalent to sampling from ``probs``). A
request with a seed draws its noise from a hash of its seed and draw number (``engine.runner.seeded_noise``),
so its tokens do not depend on what else shares the batch; the others share one generator.

On a GPU the step waits for the device once, when the chosen tokens (and logprobs) come back:
per-row parameters go up with asynchronous copies from pinned memory and every branch is decided
from the host-side parameters, never from a tensor's value.
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from omni_gateway.engine.core.sequence import PromptThenOutput, Sequence
from omni_gateway.engine.outputs import Logprob
from omni_gateway.engine.runner.seeded_noise import exponential_rows, row_key
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.kernels.host_copies import to_device, to_host


@dataclass(frozen=True, slots=True)
class SampleResult:
    token_id: int
    logprob: Logprob | None


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0) -> None:
        self.device = device
        self._shared = torch.Generator(device=device)
        self._shared.manual_seed(seed)
        self._draws: dict[int, int] = {}  # seeded sequences' draws so far
        self._bitmask: Any = None  # engine.core.structured_output.HostBitmask, made on the first constrained step

    def release(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            self._draws.pop(seq_id, None)

    def __call__(
        self, logits: torch.Tensor, seqs: list[Sequence], argmax: torch.Tensor | None = None
    ) -> list[SampleResult]:
        """``logits`` float32 ``[len(seqs), vocab]``; row i belongs to ``seqs[i]``. ``argmax``, when
        given, is ``logits.argmax(-1)`` computed already (the decode graph does it in a fast kernel);
        it stands in for greedy rows whose logits nothing masks or penalizes."""
        params = [s.params for s in seqs]
        want_logprobs = [p.logprobs is not None for p in params]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_logprobs) else None
        tokens = self.choose(logits, seqs, argmax)
        if raw_logprobs is None:
            return [SampleResult(t, None) for t in to_host(tokens)[0].tolist()]
        return self._with_logprobs(raw_logprobs, tokens, params)

    def choose(self, logits: torch.Tensor, seqs: list[Sequence], argmax: torch.Tensor | None = None) -> torch.Tensor:
        """The int64 token of each row, on the logits' device, without waiting for the device: the
        host-side decisions read only the sequences' parameters and counts."""
        params = [s.params for s in seqs]
        raw = logits
        logits = self._mask_min_tokens(logits, seqs)
        penalized, sampled = any(p.penalized for p in params), not all(p.greedy for p in params)
        rows = RowParams.upload(params, logits.shape[1], logits.device) if penalized or sampled else None
        if penalized:
            assert rows is not None
            logits = penalize(logits, seqs, rows)
        if any(s.grammar is not None for s in seqs):
            from omni_gateway.engine.core.structured_output import (  # xgrammar loads on first use
                HostBitmask,
                apply_masks,
            )

            self._bitmask = self._bitmask or HostBitmask()
            logits = apply_masks(logits, seqs, self._bitmask, in_place=logits is not raw)  # raw logits stay intact
        # The given argmax is that of the raw logits: stale once a mask (min_tokens, a grammar) or a
        # penalty changed them.
        best = argmax if argmax is not None and logits is raw else logits.argmax(dim=-1)
        if rows is None or not sampled:
            return best
        return self._sample(logits, seqs, best, rows)

    # ---- steps ------------------------------------------------------------------------------------

    def _mask_min_tokens(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        rows: list[int] = []
        cols: list[int] = []
        for i, seq in enumerate(seqs):
            p = seq.params
            if seq.num_output_tokens >= p.min_tokens:
                continue
            banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(seq.eos_token_ids))
            for token in banned:
                if 0 <= token < logits.shape[1]:
                    rows.append(i)
                    cols.append(token)
        if not rows:
            return logits
        logits = logits.clone()
        logits[to_device(rows, torch.int64, logits.device), to_device(cols, torch.int64, logits.device)] = float("-inf")
        return logits

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], best: torch.Tensor, rows: RowParams) -> torch.Tensor:
        """Draws for the sampled rows; ``best`` (``logits``' argmax) for the greedy ones."""
        probs = sampling_probs(logits, [s.params for s in seqs], rows)
        noise = self._exponential_noise(probs.shape, seqs)
        sampled = (probs / noise).argmax(dim=-1)
        return torch.where(rows.greedy, best, sampled)

    def _exponential_noise(self, shape: torch.Size, seqs: list[Sequence]) -> torch.Tensor:
        noise = torch.empty(shape, device=self.device)
        noise.exponential_(generator=self._shared)
        seeded = [i for i, seq in enumerate(seqs) if seq.params.seed is not None and not seq.params.greedy]
        if not seeded:
            return noise
        # Each seeded request's k-th draw is a function of its seed and k alone (engine.runner.seeded_noise).
        keys = []
        for i in seeded:
            seq, seed = seqs[i], seqs[i].params.seed
            assert seed is not None
            draw = self._draws.get(seq.seq_id, 0)
            self._draws[seq.seq_id] = draw + 1
            keys.append((i, row_key(seed, draw)))
        rows, row_keys = to_device(keys, torch.int64, self.device).split(1, dim=1)
        noise.index_copy_(0, rows.squeeze(1), exponential_rows(row_keys, shape[1]))
        return noise

    def _with_logprobs(
        self, logprobs: torch.Tensor, tokens: torch.Tensor, params: list[SamplingParams]
    ) -> list[SampleResult]:
        chosen_dev = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
        max_top = max((p.logprobs or 0) for p in params)
        top_vals: list[list[float]] = []
        top_ids: list[list[int]] = []
        if max_top > 0:
            values, indices = logprobs.topk(max_top, dim=-1)
            token_t, chosen_t, values_t, indices_t = to_host(tokens, chosen_dev, values, indices)
            top_vals, top_ids = values_t.tolist(), indices_t.tolist()
        else:
            token_t, chosen_t = to_host(tokens, chosen_dev)
        token_list, chosen = token_t.tolist(), chosen_t.tolist()
        results = []
        for i, p in enumerate(params):
            if p.logprobs is None:
                results.append(SampleResult(token_list[i], None))
                continue
            top = tuple(zip(top_ids[i][: p.logprobs], top_vals[i][: p.logprobs])) if p.logprobs else ()
            results.append(SampleResult(token_list[i], Logprob(token_list[i], chosen[i], top)))
        return results


@dataclass(frozen=True, slots=True)
class RowParams:
    """Each row's sampling parameters as device columns ``[rows, 1]``, uploaded in one copy: a step's
    host work is a few calls, each of which waits its turn for the interpreter lock on a busy server."""

    temperature: torch.Tensor  # 1.0 on greedy rows
    top_k: torch.Tensor  # int64; the vocabulary size where off
    top_p: torch.Tensor
    min_p: torch.Tensor
    repetition: torch.Tensor
    presence: torch.Tensor
    frequency: torch.Tensor
    greedy: torch.Tensor  # bool [rows]

    @classmethod
    def upload(cls, params: list[SamplingParams], vocab: int, device: torch.device) -> RowParams:
        table = to_device(
            [
                (
                    1.0 if p.greedy else p.temperature,
                    _top_k_or_vocab(p.top_k, vocab),  # exact in float32 below 2**24
                    p.top_p,
                    p.min_p,
                    p.repetition_penalty,
                    p.presence_penalty,
                    p.frequency_penalty,
                    float(p.greedy),
                )
                for p in params
            ],
            torch.float32,
            device,
        )
        temperature, top_k, top_p, min_p, repetition, presence, frequency, greedy = table.split(1, dim=1)
        return cls(temperature, top_k.long(), top_p, min_p, repetition, presence, frequency, greedy.squeeze(1) > 0)


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams], rows: RowParams) -> torch.Tensor:
    """The distribution each row samples from: its temperature, then top-k/top-p, then min-p (each applied only
    where some row asks for it), as probabilities. The speculative verifier scores drafts against exactly this, and
    the draft model draws its sampled drafts from it."""
    scaled = logits / rows.temperature
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        scaled = _top_k_top_p(scaled, rows.top_k, rows.top_p)
    if any(p.min_p > 0.0 for p in params):
        scaled = _min_p(scaled, rows.min_p)
    return torch.softmax(scaled, dim=-1)


class Penalized(Protocol):
    """What the penalties read of a row: a ``Sequence``, or a ``TokenHistory`` of one seen with drafts."""

    @property
    def params(self) -> SamplingParams: ...

    @property
    def prompt_token_ids(self) -> list[int]: ...

    @property
    def output_token_ids(self) -> list[int]: ...


class TokenHistory(PromptThenOutput):
    """A row's tokens as the sampler reads them when they are not a sequence's own: ``token_ids`` is the prompt,
    then the output, then whatever a speculative row adds before it is scored (the drafts before the row)."""

    __slots__ = ("params", "token_ids", "num_prompt_tokens")

    def __init__(self, params: SamplingParams, token_ids: list[int], num_prompt_tokens: int) -> None:
        self.params = params
        self.token_ids = token_ids
        self.num_prompt_tokens = num_prompt_tokens


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Repetition penalty over prompt+output tokens (divide positive logits, multiply negative ones);
    presence/frequency penalties subtract ``presence * [count > 0] + frequency * count`` over outputs."""
    return penalize(logits, seqs, RowParams.upload([s.params for s in seqs], logits.shape[1], logits.device))


def penalize(logits: torch.Tensor, seqs: SequenceOf[Penalized], rows: RowParams) -> torch.Tensor:
    """``apply_penalties`` with the rows' parameters already uploaded."""
    params = [s.params for s in seqs]
    vocab, device = logits.shape[1], logits.device
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = _token_matrix([s.prompt_token_ids + s.output_token_ids for s in seqs], vocab, device, count=False)
        penalized = torch.where(logits > 0, logits / rows.repetition, logits * rows.repetition)
        logits = torch.where(seen > 0, penalized, logits)
    if any(p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params):
        counts = _token_matrix([s.output_token_ids for s in seqs], vocab, device, count=True)
        logits = logits - rows.presence * (counts > 0) - rows.frequency * counts
    return logits


def _token_matrix(token_lists: list[list[int]], vocab: int, device: torch.device, *, count: bool) -> torch.Tensor:
    """float32 ``[rows, vocab]``: how often each row's list holds each token (``count``), or 1 where it does."""
    num_rows = len(token_lists)
    longest = max((len(t) for t in token_lists), default=0)
    if longest == 0:
        return torch.zeros(num_rows, vocab, device=device)
    # Padded with an extra column that is dropped afterwards, so ragged lists scatter in one call.
    padded = np.full((num_rows, longest), vocab, dtype=np.int64)
    for i, tokens in enumerate(token_lists):
        padded[i, : len(tokens)] = tokens
    index = to_device(torch.from_numpy(padded), torch.int64, device)
    wide = torch.zeros(num_rows, vocab + 1, device=device)
    if count:
        wide.scatter_add_(1, index, torch.ones(num_rows, longest, device=device))
    else:
        wide.scatter_(1, index, 1.0)
    return wide[:, :vocab]


def apply_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Set to -inf every logit outside the row's top-k, then outside the smallest set whose
    probability reaches top-p (the most likely token always stays). k=0 / p=1 disable."""
    vocab, device = logits.shape[1], logits.device
    k = to_device([_top_k_or_vocab(t, vocab) for t in top_k], torch.int64, device).unsqueeze(1)
    return _top_k_top_p(logits, k, to_device(top_p, torch.float32, device).unsqueeze(1))


def _top_k_or_vocab(top_k: int, vocab: int) -> int:
    """A row's k in ``[1, vocab]``: 0 (off) and anything past the vocabulary keep every token."""
    return min(top_k, vocab) if top_k > 0 else vocab


def _top_k_top_p(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``apply_top_k_top_p`` with each row's k (in ``[1, vocab]``) and p as device columns ``[rows, 1]``."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[1], device=logits.device).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(ranks >= k, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill((mass_before >= p) & (ranks > 0), float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: list[float]) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the row's most likely token's."""
    return _min_p(logits, to_device(min_p, torch.float32, logits.device).unsqueeze(1))


def _min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    return logits.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))
