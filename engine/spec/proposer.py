"""The contract between the engine and a speculative proposer. No torch here.

A step with speculation goes:

1. The engine picks ``k`` for the step (``engine.spec.policy``). For each running sequence that decodes this
   step (its every token but the last has its K/V in the target's cache), it builds a ``ProposalRequest``:
   ``token_ids`` is prompt + accepted output so far (the last token is the one the target scores next) and
   ``num_tokens`` is how many drafts it wants (1..k; fewer near ``max_tokens`` or the context end).
2. ``Proposer.propose(requests)`` returns one ``Proposal`` per request, in order, each with 0..num_tokens
   draft ids. A proposal of 0 tokens is fine (that sequence decodes one token as without speculation).
3. The target scores ``[last token, d1, ..., dn]`` of every sequence in one step and keeps the longest
   accepted prefix of the drafts plus one token of its own (rejection sampling, ``engine.spec.verify``), so
   each step keeps 1..n+1 tokens and the output distribution is the target's exactly.

Rollback is implicit: the next ``ProposalRequest`` of a sequence carries its accepted token ids, and a
proposer that keeps per-sequence state (a draft model's KV cache) must treat every position past the longest
common prefix of what it saw and the new ``token_ids`` as rejected and drop it. ``release(seq_ids)`` is called
once a sequence finishes or is aborted or preempted; a proposer frees everything it holds for them.
``seq_id``s are unique for the life of the process.

Draft probabilities: ``Proposal.probs`` may be None (a point mass on each draft token: n-gram lookup, a
greedy draft), or a float32 ``[len(token_ids), vocab]`` array-like of the draft distribution q each token was
drawn from (the verifier then accepts with min(1, p/q) and resamples from max(0, p - q) on rejection).

Hidden states of the target (EAGLE-3 and the like): a proposer names the target layers it reads in
``aux_hidden_layers`` (0-based decoder layer indices; empty: none). The runner then captures the outputs of
those layers at every position the target computes and hands the proposer, in
``ProposalRequest.aux_hidden``, the rows of every accepted position since the previous request of that
sequence (prefill chunks included; where those are many, a sequence long unproposed or a long prompt, only
the most recent of them: ``first_position`` then lies past what the proposer saw, and it re-syncs from
there): an ``AuxHidden`` whose ``rows`` is ``[num_positions, len(layers),
hidden]`` on the target's device in the target's dtype, positions ``first_position ..
first_position + num_positions - 1``, in the order of ``aux_hidden_layers``. Rows of rejected drafts are
never handed out. A proposer with an empty ``aux_hidden_layers`` always gets ``aux_hidden=None``.
The engine refuses (at start, ``engine.spec.build``) a proposer with ``aux_hidden_layers`` over a target runner
without ``capture_aux_hidden(layers)``, the runner's side of this contract (``engine.runner.aux_hidden``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class AuxHidden:
    """Target hidden states of chosen layers at consecutive accepted positions (see the module docstring)."""

    first_position: int
    rows: Any  # torch.Tensor [num_positions, len(aux_hidden_layers), hidden]

    @property
    def num_positions(self) -> int:
        return int(self.rows.shape[0])


@dataclass(frozen=True, slots=True)
class ProposalRequest:
    """One sequence's ask for drafts: ``token_ids`` (prompt + accepted output; the last token's K/V is not yet
    in the target cache), at most ``num_tokens`` (>= 1) drafts wanted, and the target's hidden states of the
    positions accepted since the previous request (only for proposers with ``aux_hidden_layers``)."""

    seq_id: int
    token_ids: Sequence[int]
    num_tokens: int
    aux_hidden: AuxHidden | None = None


@dataclass(frozen=True, slots=True)
class Proposal:
    """Up to ``num_tokens`` draft ids for the request at the same index; ``probs``: the draft distribution
    per draft token (float32 ``[len(token_ids), vocab]``), or None for a point mass on each."""

    token_ids: tuple[int, ...]
    probs: Any = None

    def __post_init__(self) -> None:
        if self.probs is not None and int(self.probs.shape[0]) != len(self.token_ids):
            raise ValueError(
                f"a proposal's probs need one row per draft token: {len(self.token_ids)} tokens, "
                f"{int(self.probs.shape[0])} rows"
            )


NO_PROPOSAL = Proposal(())


@runtime_checkable
class Proposer(Protocol):
    """Guesses the next tokens of each sequence. ``name`` is the method (``"ngram"``, ``"draft_model"``,
    ``"eagle3"``); ``aux_hidden_layers`` the target layers whose hidden states it reads (empty: none)."""

    name: str
    aux_hidden_layers: tuple[int, ...]

    def propose(self, requests: Sequence[ProposalRequest]) -> list[Proposal]:
        """One proposal per request, in order; each holds at most ``request.num_tokens`` tokens."""
        ...

    def release(self, seq_ids: Sequence[int]) -> None:
        """Forget these sequences (finished, aborted or preempted); unknown ids are ignored."""
        ...


def check_proposals(requests: Sequence[ProposalRequest], proposals: Sequence[Proposal]) -> None:
    """Raise ValueError where a proposer broke the contract (count, or more tokens than asked)."""
    if len(proposals) != len(requests):
        raise ValueError(f"proposer returned {len(proposals)} proposals for {len(requests)} requests")
    for req, prop in zip(requests, proposals):
        if len(prop.token_ids) > req.num_tokens:
            raise ValueError(
                f"proposer returned {len(prop.token_ids)} tokens for sequence {req.seq_id}; at most "
                f"{req.num_tokens} were asked"
            )
