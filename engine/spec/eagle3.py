"""An EAGLE-3 head proposes greedy drafts from the target's own hidden states ("eagle3").

The target keeps the residual stream entering three of its layers (vLLM's ids: the checkpoint's
``eagle_aux_hidden_state_layer_ids``, else ``(2, L // 2, L - 3)`` for a target of ``L`` layers), which is the
output of the layer before each; the proposer names those in ``aux_hidden_layers`` and receives the rows of
each accepted position (``engine.spec.proposer``). Per sequence the head keeps a K/V cache of its one layer:
an entry per position ``p`` of the target's rows, read with the token at ``p + 1``. A request first drops the
entries whose token no longer agrees or that the new rows recompute, and every draft entry of the previous
request, then runs the new rows in one forward (rows that start past its entries, the older ones dropped
while the sequence went unproposed, start its cache over from them); the last one gives the first draft, and
each further draft feeds back the head's output before its final norm at the next position. Drafts are
argmaxes: point masses for the verifier, exact for any sampling settings.
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
        return [self._propose(req) for req in requests]

    def _propose(self, req: ProposalRequest) -> Proposal:
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
        # The target computed every position but the last: the head's entries must reach it.
        if state.last is None or cache.base + state.real != len(tokens) - 1:
            return NO_PROPOSAL
        logits, hidden = state.last
        position = len(tokens) - 1
        drafts: list[int] = []
        while True:
            draft = int(self.head.target_ids(logits.argmax(-1)))
            if draft >= self.target_vocab:
                break  # a token the target cannot score ends the proposal
            drafts.append(draft)
            if len(drafts) == req.num_tokens:
                break
            ids = torch.tensor([draft], device=self.head.device)
            out, pre = self.head.forward(ids, hidden.unsqueeze(0), position, cache)
            logits, hidden, position = out[0], pre[0], position + 1
        return Proposal(tuple(drafts)) if drafts else NO_PROPOSAL

    def _catch_up(self, state: _State, tokens: Seq[int], aux: AuxHidden) -> None:
        """Run the head over the target rows of ``aux`` that its entries do not hold yet."""
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
        ids = torch.tensor(read, device=self.head.device)
        logits, pre = self.head.forward(ids, self.head.combine(rows), start, cache)
        state.tokens.extend(read)
        state.last = (logits[-1], pre[-1])

    def release(self, seq_ids: Seq[int]) -> None:
        for seq_id in seq_ids:
            self._states.pop(seq_id, None)
