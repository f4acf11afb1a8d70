"""An eager forward that also captures the outputs of the decoder layers a step's prompts ask for
(``hidden_layer``), beside those a speculative proposer keeps (``LlamaModel.aux_layers``)."""

from __future__ import annotations

from typing import Any

import torch
from omni_gateway.engine.runner.step_inputs import StepInputs
from omni_gateway.engine.runner.step_plan import HiddenSpan


def asked_layers(spans: list[HiddenSpan]) -> tuple[int, ...]:
    """The 0-based decoder layers whose outputs a step's spans ask at prompt positions (``hidden_layer``)."""
    return tuple(
        sorted(
            {
                seq.params.hidden_layer - 1
                for seq, _, _, first in spans
                if seq.params.hidden_layer is not None and first < seq.num_prompt_tokens
            }
        )
    )


def forward_capturing(
    model: Any,
    step: StepInputs,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    asked: tuple[int, ...],
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """``model.forward`` over ``step``, and the outputs of the ``asked`` layers by 0-based layer index (flat token
    rows). The proposer's own layers stay in ``model.aux_hidden`` as they would without the asked ones."""
    # Only a model whose spans bring DeepStack rows (the Qwen3-Omni thinker's) is handed them.
    extra = {} if step.deepstack is None else {"deepstack": step.deepstack}
    own = getattr(model, "aux_layers", ()) if asked else ()
    if asked:  # this forward also keeps the layers some prompt's rows are asked of, after the proposer's
        model.aux_layers = (*own, *asked)
    try:
        hidden = model.forward(
            step.input_ids, step.positions, step.meta, kv_caches, step.embed_rows, step.embeds, **extra
        )
    finally:
        if asked:
            model.aux_layers = own
    if not asked:
        return hidden, {}
    kept = model.aux_hidden
    assert kept is not None, "the model kept no layer outputs for this step"
    layer_rows = {layer: kept[:, len(own) + i] for i, layer in enumerate(asked)}
    model.aux_hidden = kept[:, : len(own)] if own else None
    return hidden, layer_rows
