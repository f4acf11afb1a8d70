"""Batched token sampling over one step's logits.

Order (vLLM's): min_tokens masking, penalties, grammar masks (constrained rows only, see
``engine.structured_output``), then greedy argmax, or temperature -> top-k ->
top-p -> min-p -> a draw. Repetition penalty looks at prompt + output tokens; presence and
frequency penalties at output tokens only. Logprobs are those of the raw model distribution.

A draw is ``argmax(probs / E)`` with ``E ~ Exp(1)`` (equivalent to sampling from ``probs``). A
request with a seed draws its noise from its own generator, so its tokens do not depend on what
else shares the batch; the others share one generator.

On a GPU the step waits for the device once, when the chosen tokens (and logprobs) come back:
per-row parameters go up with asynchronous copies from pinned memory and every branch is decided
from the host-side parameters, never from a tensor's value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from omni_gateway.engine.outputs import Logprob
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.engine.sequence import Sequence


@dataclass(frozen=True, slots=True)
class SampleResult:
    token_id: int
    logprob: Logprob | None


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0) -> None:
        self.device = device
        self._shared = torch.Generator(device=device)
        self._shared.manual_seed(seed)
        self._seeded: dict[int, torch.Generator] = {}
        self._bitmask: Any = None  # engine.structured_output.HostBitmask, made on the first constrained step

    def release(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            self._seeded.pop(seq_id, None)

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
        if any(p.penalized for p in params):
            logits = apply_penalties(logits, seqs)
        if any(s.grammar is not None for s in seqs):
            from omni_gateway.engine.structured_output import HostBitmask, apply_masks  # xgrammar loads on first use

            self._bitmask = self._bitmask or HostBitmask()
            logits = apply_masks(logits, seqs, self._bitmask, in_place=logits is not raw)  # raw logits stay intact
        # The given argmax is that of the raw logits: stale once a mask (min_tokens, a grammar) or a
        # penalty changed them.
        best = argmax if argmax is not None and logits is raw else logits.argmax(dim=-1)
        if all(p.greedy for p in params):
            return best
        return self._sample(logits, seqs, best)

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

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], best: torch.Tensor) -> torch.Tensor:
        """Draws for the sampled rows; ``best`` (``logits``' argmax) for the greedy ones."""
        params = [s.params for s in seqs]
        device = logits.device
        greedy = to_device([p.greedy for p in params], torch.bool, device)
        temperature = to_device([p.temperature if not p.greedy else 1.0 for p in params], torch.float32, device)
        scaled = logits / temperature.unsqueeze(1)
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            scaled = apply_top_k_top_p(scaled, [p.top_k for p in params], [p.top_p for p in params])
        if any(p.min_p > 0.0 for p in params):
            scaled = apply_min_p(scaled, [p.min_p for p in params])
        probs = torch.softmax(scaled, dim=-1)
        noise = self._exponential_noise(probs.shape, seqs)
        sampled = (probs / noise).argmax(dim=-1)
        return torch.where(greedy, best, sampled)

    def _exponential_noise(self, shape: torch.Size, seqs: list[Sequence]) -> torch.Tensor:
        noise = torch.empty(shape, device=self.device)
        noise.exponential_(generator=self._shared)
        for i, seq in enumerate(seqs):
            seed = seq.params.seed
            if seed is None or seq.params.greedy:
                continue
            gen = self._seeded.get(seq.seq_id)
            if gen is None:
                gen = torch.Generator(device=self.device)
                gen.manual_seed(seed)
                self._seeded[seq.seq_id] = gen
            noise[i].exponential_(generator=gen)
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


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Repetition penalty over prompt+output tokens (divide positive logits, multiply negative ones);
    presence/frequency penalties subtract ``presence * [count > 0] + frequency * count`` over outputs."""
    num_rows, vocab = logits.shape
    device = logits.device
    out_counts = _token_counts([s.output_token_ids for s in seqs], num_rows, vocab, device)
    logits = logits.clone()
    if any(s.params.repetition_penalty != 1.0 for s in seqs):
        rep = to_device([s.params.repetition_penalty for s in seqs], torch.float32, device).unsqueeze(1)
        prompt_seen = _token_counts([s.prompt_token_ids for s in seqs], num_rows, vocab, device) > 0
        seen = prompt_seen | (out_counts > 0)
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalized, logits)
    presence = to_device([s.params.presence_penalty for s in seqs], torch.float32, device).unsqueeze(1)
    frequency = to_device([s.params.frequency_penalty for s in seqs], torch.float32, device).unsqueeze(1)
    return logits - presence * (out_counts > 0) - frequency * out_counts


def _token_counts(token_lists: list[list[int]], num_rows: int, vocab: int, device: torch.device) -> torch.Tensor:
    counts = torch.zeros(num_rows, vocab, device=device)
    longest = max((len(t) for t in token_lists), default=0)
    if longest == 0:
        return counts
    # Pad with an extra column that is dropped afterwards, so ragged lists scatter in one call.
    padded = torch.full((num_rows, longest), vocab, dtype=torch.long)
    for i, tokens in enumerate(token_lists):
        if tokens:
            padded[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    wide = torch.zeros(num_rows, vocab + 1, device=device)
    wide.scatter_add_(1, _upload(padded, device), torch.ones(num_rows, longest, device=device))
    return wide[:, :vocab]


def apply_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Set to -inf every logit outside the row's top-k, then outside the smallest set whose
    probability reaches top-p (the most likely token always stays). k=0 / p=1 disable."""
    vocab = logits.shape[1]
    device = logits.device
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = to_device([t if t > 0 else vocab for t in top_k], torch.int64, device).clamp(max=vocab)
    ranks = torch.arange(vocab, device=device).unsqueeze(0)
    masked = ranks >= k.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(masked, float("-inf"))
    p = to_device(top_p, torch.float32, device).unsqueeze(1)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill((mass_before >= p) & (ranks > 0), float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: list[float]) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the row's most likely token's."""
    probs = logits.softmax(dim=-1)
    threshold = to_device(min_p, torch.float32, logits.device).unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, float("-inf"))


def to_device(values: list[Any] | torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list or tensor on ``device`` without waiting for the device (pinned, asynchronous copy on
    CUDA: a copy from pageable memory first waits for every kernel queued on the stream)."""
    if not isinstance(values, torch.Tensor):
        return _upload(torch.tensor(values, dtype=dtype), device)
    return values.to(dtype) if values.device == device else _upload(values.to(dtype), device)


def _upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def to_host(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Copy results to the host with one wait for the device, however many tensors there are."""
    if not tensors or tensors[0].device.type != "cuda":
        return [t.cpu() for t in tensors]
    copies = [t.to("cpu", non_blocking=True) for t in tensors]
    torch.cuda.current_stream(tensors[0].device).synchronize()
    return copies
