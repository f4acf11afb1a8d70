"""The contract between the engine and a speculative proposer. No torch here.

A step with speculation goes:

1. The engine picks ``k`` for the step (``engine.spec.policy``). For each running sequence that decodes this
   step (its every token but the last has its K/V in the target's cache), it builds a ``ProposalRequest``:
   ``token_ids`` is prompt + accepted output so far (the last token is the one the target scores next) and
   ``num_tokens`` is how many drafts it wants (1..k; fewer near ``max_tokens`` or the context end).
   ``token_ids`` is a ``TokenPrefix``: a read-only view of the sequence's own token list fixed at its length
   at the request (no copy per step); it keeps saying the same thing after the sequence grows, so a proposer
   may keep it, though a proposer that keeps tokens for long should copy them (``list(view)``).
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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol, overload, runtime_checkable


class TokenPrefix(Sequence[int]):
    """The first ``len(view)`` tokens of a list that only ever grows (a sequence's prompt + output), read-only.
    Indexing and slicing stop at that length whatever was appended since; ``list(view)`` and numpy copy them
    at C speed."""

    __slots__ = ("_ids", "_len")

    def __init__(self, ids: list[int], length: int | None = None) -> None:
        self._ids = ids
        self._len = len(ids) if length is None else length
        if not 0 <= self._len <= len(ids):
            raise ValueError(f"a prefix of {self._len} tokens of a list of {len(ids)}")

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            return self._ids[start:stop:step]
        i = index + self._len if index < 0 else index
        if not 0 <= i < self._len:
            raise IndexError(f"token index {index} out of a prefix of {self._len}")
        return self._ids[i]

    def __iter__(self) -> Iterator[int]:
        return islice(self._ids, self._len)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        import numpy as np

        return np.array(self._ids[: self._len], dtype=dtype)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenPrefix | list | tuple):
            return len(other) == self._len and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TokenPrefix({self._ids[: self._len]!r})"


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
    """One sequence's ask for drafts: ``token_ids`` (prompt + accepted output, a ``TokenPrefix`` from the
    engine; the last token's K/V is not yet in the target cache), at most ``num_tokens`` (>= 1) drafts wanted,
    and the target's hidden states of the positions accepted since the previous request (only for proposers
    with ``aux_hidden_layers``)."""

    seq_id: int
    token_ids: Sequence[int]
    num_tokens: int
    aux_hidden: AuxHidden | None = None
    # The sequence's SamplingParams, for a proposer that draws its drafts from a distribution of its own
    # (returned in Proposal.probs); None: unknown, propose as for greedy requests.
    params: Any = None
    # How many of token_ids are the prompt: presence and frequency penalties count only the tokens past them.
    num_prompt_tokens: int = 0


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
