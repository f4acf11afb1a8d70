"""Prompt lookup (vLLM's "ngram" method): find the sequence's last n tokens earlier in its prompt + output and
propose what followed them there. Numpy only."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from omni_gateway.engine.spec.proposer import NO_PROPOSAL, Proposal, ProposalRequest


def lookup(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> tuple[int, ...]:
    """Up to ``k`` tokens following the earliest earlier occurrence of the longest suffix n-gram of ``tokens``
    with ``min_n <= n <= max_n`` (vLLM's prompt lookup); () where none recurs."""
    total = len(tokens)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n :]
        # Windows that start before the suffix itself; a match must leave at least one token after it.
        windows = sliding_window_view(tokens[: total - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return tuple(int(t) for t in tokens[start : start + k])
    return ()


class NgramProposer:
    name = "ngram"
    aux_hidden_layers: tuple[int, ...] = ()

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(
                f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {prompt_lookup_min} and {prompt_lookup_max}"
            )
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, requests: Sequence[ProposalRequest]) -> list[Proposal]:
        out = []
        for req in requests:
            drafts = lookup(np.asarray(req.token_ids, dtype=np.int64), self.min_n, self.max_n, req.num_tokens)
            out.append(Proposal(drafts) if drafts else NO_PROPOSAL)
        return out

    def release(self, seq_ids: Sequence[int]) -> None:
        pass  # keeps nothing per sequence
