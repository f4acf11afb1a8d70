"""An EAGLE-3 head proposes greedy drafts from the target's own hidden states ("eagle3").

The target keeps the residual stream entering three of its layers (vLLM's ids: the checkpoint's
``eagle_aux_hidden_state_layer_ids``, else ``(2, L // 2, L - 3)`` for a target of ``L`` layers), which is the
output of the layer before each; the proposer names those in ``aux_hidden_layers`` and receives the rows of
each accepted position (``engine.spec.proposer``). Per sequence the head keeps a K/V cache of its one layer:
an entry per position ``p`` of the target's rows, read with the token at ``p + 1``. A request first drops the
entries whose token no longer agrees or that the new rows recompute, and every draft entry of the previous
request, then runs the new rows in one forward (rows that start past its entries, the older ones dropped
while the sequence went unproposed, start its cache over from them); the last one gives the first draft, and
each further draft feeds back the head's output before its final norm at the next position. The head runs
batched over the step's sequences: one forward over every sequence's new rows, then one per draft round over
those still drafting (``Eagle3Head.forward_batch``). Drafts are argmaxes: point masses for the verifier, exact
for any sampling settings.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.models.eagle3 import Eagle3Cache, Eagle3Config, Eagle3Head, read_eagle3_weights
from omni_gateway.engine.spec.config import SpeculativeConfig
from omni_gateway.engine.spec.proposer import NO_PROPOSAL, AuxHidden, Proposal, ProposalRequest


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """vLLM's default for a target of ``num_layers`` decoder layers."""
    return (2, num_layers // 2, num_layers - 3)


def aux_layers_of(ids: Seq[int], num_layers: int) -> tuple[int, ...]:
    """The decoder layers whose outputs are the residual streams entering layers ``ids`` (vLLM's ids)."""
    if len(ids) != 3 or not all(1 <= i < num_layers for i in ids):
        raise ModelLoadError(
            f"EAGLE-3 reads the inputs of 3 target layers among 1..{num_layers - 1}, got {list(ids)} "
            f"(a target of {num_layers} layers)"
        )
    return tuple(i - 1 for i in ids)


@dataclass(slots=True)
class _State:
    cache: Eagle3Cache
    tokens: list[int] = field(default_factory=list)  # the token read at each entry computed from target rows
    last: tuple[torch.Tensor, torch.Tensor] | None = None  # (logits, pre-norm output) of the last such entry
    # Target rows set aside for this request's batched forward, the tokens read with them, their first position.
    rows: torch.Tensor | None = None
    read: list[int] = field(default_factory=list)
    start: int = 0

    @property
    def real(self) -> int:
        return len(self.tokens)

    def keep(self, count: int) -> None:
        if count < self.real:
            del self.tokens[count:]
            self.last = None
        self.cache.truncate(count)


class Eagle3Proposer:
    name = "eagle3"

    def __init__(self, head: Eagle3Head, aux_hidden_layers: tuple[int, ...], target_vocab: int) -> None:
        self.head = head
        self.aux_hidden_layers = aux_hidden_layers
        self.target_vocab = target_vocab
        self._states: dict[int, _State] = {}

    @classmethod
    def build(cls, spec: SpeculativeConfig, target: Any) -> Eagle3Proposer:
        """``target``: the engine's ModelRunner (the head shares its device, dtype and, where the checkpoint
        has none, its token embedding)."""
        assert spec.model is not None
        directory = Path(spec.model)
        if not directory.is_dir():
            raise ModelLoadError(f"EAGLE-3 checkpoint {spec.model!r}: expected a local directory")
        config = Eagle3Config.read(directory)
        shape = target.model.shape
        if config.target_hidden_size != shape.hidden_size:
            raise ModelLoadError(
                f"EAGLE-3 checkpoint {directory} reads target hidden states of {config.target_hidden_size} "
                f"features; the target's are {shape.hidden_size}"
            )
        ids = config.aux_layer_ids or default_aux_layer_ids(shape.num_layers)
        head = Eagle3Head(
            config,
            read_eagle3_weights(directory),
            device=target.device,
            dtype=target.dtype,
            max_positions=target.max_model_len + 16,  # drafts run a few positions past the context
            shared_embedding=target.model.embed_tokens,
        )
        return cls(head, aux_layers_of(ids, shape.num_layers), int(shape.vocab_size))

    @torch.inference_mode()
    def propose(self, requests: Seq[ProposalRequest]) -> list[Proposal]:
        """Every request's new target rows in one head forward, then one forward per draft round over the
        sequences still drafting."""
        states = [self._sync(req) for req in requests]
        pending = [(state, req) for state, req in zip(states, requests) if state.rows is not None]
        if pending:
            rows = torch.cat([state.rows for state, _ in pending])
            ids = torch.tensor([t for state, _ in pending for t in state.read], device=self.head.device)
            counts = [len(state.read) for state, _ in pending]
            logits, pre = self.head.forward_batch(
                ids,
                self.head.combine(rows),
                [state.start for state, _ in pending],
                counts,
                [state.cache for state, _ in pending],
            )
            ends = torch.tensor(counts).cumsum(0).sub(1).tolist()
            for (state, _), end in zip(pending, ends):
                state.tokens.extend(state.read)
                state.last = (logits[end], pre[end])
                state.rows, state.read = None, []
        drafts: list[list[int]] = [[] for _ in requests]
        # The target computed every position but the last: the head's entries must reach it.
        live = [
            i
            for i, (state, req) in enumerate(zip(states, requests))
            if state.last is not None and state.cache.base + state.real == len(req.token_ids) - 1
        ]
        logits = torch.stack([states[i].last[0] for i in live]) if live else None  # type: ignore[index]
        hidden = torch.stack([states[i].last[1] for i in live]) if live else None  # type: ignore[index]
        position = [len(requests[i].token_ids) - 1 for i in live]
        while live:
            assert logits is not None and hidden is not None
            guesses = self.head.target_ids(logits.argmax(-1)).tolist()
            going = []
            for j, (i, draft) in enumerate(zip(live, guesses)):
                if draft >= self.target_vocab:
                    continue  # a token the target cannot score ends the proposal
                drafts[i].append(draft)
                if len(drafts[i]) < requests[i].num_tokens:
                    going.append(j)
            if not going:
                break
            ids = torch.tensor([guesses[j] for j in going], device=self.head.device)
            logits, hidden = self.head.forward_batch(
                ids,
                hidden[going],
                [position[j] for j in going],
                [1] * len(going),
                [states[live[j]].cache for j in going],
            )
            live, position = [live[j] for j in going], [position[j] + 1 for j in going]
        return [Proposal(tuple(d)) if d else NO_PROPOSAL for d in drafts]

    def _sync(self, req: ProposalRequest) -> _State:
        """The state of ``req``'s sequence with every entry that no longer agrees dropped, and the target
        rows its entries do not hold yet set aside (``rows``, ``read``, ``start``) for the batched forward."""
        state = self._states.get(req.seq_id)
        if state is None:
            state = self._states[req.seq_id] = _State(self.head.new_cache())
        tokens, cache = req.token_ids, state.cache
        agree = 0
        while (
            agree < state.real
            and cache.base + agree + 1 < len(tokens)
            and state.tokens[agree] == tokens[cache.base + agree + 1]
        ):
            agree += 1
        state.keep(agree)
        if req.aux_hidden is not None:
            self._catch_up(state, tokens, req.aux_hidden)
        return state

    def _catch_up(self, state: _State, tokens: Seq[int], aux: AuxHidden) -> None:
        """Set aside the target rows of ``aux`` that the head's entries do not hold yet."""
        cache, first = state.cache, aux.first_position
        if first < cache.base or first > cache.base + state.real:
            cache.reset(first)  # rows from before what it holds, or past a gap: start over from them
            state.tokens.clear()
            state.last = None
        state.keep(first - cache.base)
        start = cache.base + state.real
        rows = aux.rows[start - first :]
        if rows.shape[0] == 0:
            return
        read = [int(t) for t in tokens[start + 1 : start + 1 + rows.shape[0]]]
        if len(read) != rows.shape[0]:
            raise ValueError(
                f"target rows up to position {start + rows.shape[0] - 1} handed for a sequence of {len(tokens)} tokens"
            )
        state.rows, state.read, state.start = rows, read, start

    def release(self, seq_ids: Seq[int]) -> None:
        for seq_id in seq_ids:
            self._states.pop(seq_id, None)
