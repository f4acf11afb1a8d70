"""The hidden states a step hands the sequences that ask for them (``return_hidden_states``): final-normed rows,
or at prompt positions the outputs of a chosen decoder layer (``hidden_layer``, a talker's input)."""

from __future__ import annotations

from typing import Any

import torch
from omni_gateway.engine.runner.step_plan import HiddenSpan
from omni_gateway.kernels.host_copies import to_device


def keep_hidden(
    model: Any,
    spans: list[HiddenSpan],
    input_ids: torch.Tensor,
    hidden: torch.Tensor,
    layer_rows: dict[int, torch.Tensor] | None,
    keeps_rows: bool,
) -> None:
    """The final-normed hidden states and input embeddings of the sequences that asked, float32 on
    the device (new tensors: ``hidden`` may be a graph's output, overwritten by its next replay). They
    stay there: a consumer in this process (the talker) uses them where they are, and the engine
    core's messages move them to the host (``engine.frontend.ipc``). One normalization, cast and embedding
    lookup covers every sequence's rows (a decode step's are one per sequence); each sequence gets
    views of those. A sequence with ``hidden_layer`` gets that layer's outputs (``layer_rows``, by 0-based
    layer index, flat token rows) at its prompt's positions instead; only those are kept with the blocks (its
    generated positions' rows are final-normed, another kind, so a block holding one keeps none). ``keeps_rows``:
    rows also go to ``pending_rows``, to be kept with their cached blocks (KVCacheManager)."""
    for seq, _, _, first in spans:
        if seq.prefix_rows:  # admitted over cached blocks that kept their rows: those go out first
            ids = to_device(seq.token_ids[:first], torch.int64, input_ids.device)
            cached = torch.cat(seq.prefix_rows).float()
            seq.hidden_rows.append((0, cached, model.embed_tokens(ids).float()))
            seq.prefix_rows = ()
    lo, hi = spans[0][1], spans[-1][2]
    if all(a[2] == b[1] for a, b in zip(spans, spans[1:])):
        rows, row_ids = hidden[lo:hi], input_ids[lo:hi]
    else:
        index = to_device([i for _, a, b, _ in spans for i in range(a, b)], torch.int64, hidden.device)
        rows, row_ids = hidden.index_select(0, index), input_ids.index_select(0, index)
    normed = model.ops.rms_norm(rows, model.final_norm, model.shape.rms_norm_eps)
    sizes = [b - a for _, a, b, _ in spans]
    pieces = zip(normed.split(sizes), normed.float().split(sizes), model.embed_tokens(row_ids).float().split(sizes))
    # Kept rows are in the model's dtype, which holds them exactly (the norm's output). A prefill span
    # gets a copy of its own, so a cached block does not hold a whole step's rows alive; a decode step's
    # rows are one per sequence, and a copy each would cost a call per sequence for nothing.
    copy = any(n > 1 for n in sizes)
    for (seq, a, _, first), (kept, states, embeds) in zip(spans, pieces):
        layer = seq.params.hidden_layer
        if layer is not None:
            prompt = max(0, min(len(states), seq.num_prompt_tokens - first))
            if prompt:
                assert layer_rows, "the prompt's layer rows were not kept"
                own = layer_rows[layer - 1][a : a + prompt]
                states = torch.cat((own.float(), states[prompt:]))
                if keeps_rows:  # a copy: ``own`` views the whole step's layer outputs
                    seq.pending_rows.append((first, own.clone()))
            seq.hidden_rows.append((first, states, embeds))
            continue
        seq.hidden_rows.append((first, states, embeds))
        if keeps_rows:
            seq.pending_rows.append((first, kept.clone() if copy else kept))
