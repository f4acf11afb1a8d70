"""PEFT LoRA adapters of the tiny checkpoints (tests/harness/checkpoints.py), and the merged models they equal."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def save_adapter(
    base: Any,
    directory: Path,
    *,
    seed: int,
    rank: int = 8,
    targets: tuple[str, ...] = ALL_PROJECTIONS,
    alpha: int = 16,
    use_rslora: bool = False,
) -> Any:
    """Save a PEFT adapter of HF model ``base`` with random A and B (so it changes the output) into
    ``directory``; returns the merged HF model it must equal (``base`` itself is left untouched)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False, use_rslora=use_rslora
    )
    model = get_peft_model(copy.deepcopy(base), config)
    with torch.no_grad():  # PEFT's random B is small next to the tiny model's wide init: make it count
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(4.0)
    model.save_pretrained(directory)
    return model.merge_and_unload().eval()
