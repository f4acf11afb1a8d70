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


# Three adapters of one tiny Llama: different ranks, targets and scalings.
ADAPTERS: dict[str, dict[str, Any]] = {
    "all": {"rank": 8},
    "attn": {"rank": 4, "targets": ("q_proj", "v_proj", "o_proj")},
    "mlp": {"rank": 16, "targets": ("gate_proj", "down_proj"), "use_rslora": True},
}
PROMPTS = [[3 + (i * 11) % 300 for i in range(20)], [7, 19, 23, 5, 88, 120, 41], [250, 3, 17]]
NEW_TOKENS = 10


def tiny_lora_set(
    root: Path, kind: str = "llama", names: tuple[str, ...] = tuple(ADAPTERS)
) -> dict[Any, list[list[int]]]:
    """Save a tiny checkpoint of ``kind`` (tests/harness/checkpoints.py) under ``root / "base"`` and the adapters
    ``names`` of ``ADAPTERS`` beside it; returns HF's greedy continuation of each of ``PROMPTS`` by adapter name
    (None: the base model)."""
    from tests.harness.checkpoints import save_tiny_checkpoint
    from tests.harness.runner_driver import hf_greedy

    base = save_tiny_checkpoint(kind, root / "base")
    expected: dict[Any, list[list[int]]] = {None: [hf_greedy(base, p, NEW_TOKENS) for p in PROMPTS]}
    for i, (name, spec) in enumerate((n, ADAPTERS[n]) for n in names):
        merged = save_adapter(base, root / name, seed=10 + i, **spec)
        expected[name] = [hf_greedy(merged, p, NEW_TOKENS) for p in PROMPTS]
    return expected
