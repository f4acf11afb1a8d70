"""Malformed PEFT adapters are refused with a message that says what is wrong, and the registry is unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine.lora.adapter import LoraAdapterError, LoraTargets, load_adapter
from omni_gateway.engine.lora.registry import LoraNotFound, LoraRegistry
from safetensors.torch import save_file

TARGETS = LoraTargets(num_layers=2, hidden=8, q_size=8, kv_size=4, intermediate=12)
PREFIX = "base_model.model.model.layers"


def _write(folder: Path, config: dict[str, Any] | str | None, tensors: dict[str, torch.Tensor] | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "adapter_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def _config(**extra: Any) -> dict[str, Any]:
    return {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "down_proj"], **extra}


def _tensors(rank: int = 4) -> dict[str, torch.Tensor]:
    return {
        f"{PREFIX}.0.self_attn.q_proj.lora_A.weight": torch.ones(rank, 8),
        f"{PREFIX}.0.self_attn.q_proj.lora_B.weight": torch.ones(8, rank),
        f"{PREFIX}.1.mlp.down_proj.lora_A.weight": torch.ones(rank, 12),
        f"{PREFIX}.1.mlp.down_proj.lora_B.weight": torch.ones(8, rank),
    }


def test_valid_adapter_folds_its_scaling_into_b(tmp_path: Path) -> None:
    adapter = load_adapter("ok", str(_write(tmp_path, _config(), _tensors())), TARGETS, max_rank=16)
    assert adapter.rank == 4 and set(adapter.weights) == {(0, "q_proj"), (1, "down_proj")}
    a, b = adapter.weights[(1, "down_proj")]
    assert a.shape == (4, 12) and torch.all(b == 2.0)  # lora_alpha / r
    rs = load_adapter("rs", str(_write(tmp_path / "rs", _config(use_rslora=True), _tensors())), TARGETS, 16)
    assert torch.all(rs.weights[(0, "q_proj")][1] == 4.0)  # lora_alpha / sqrt(r)


def _embedding_tensors() -> dict[str, torch.Tensor]:
    return {**_tensors(), "base_model.model.model.embed_tokens.lora_embedding_A": torch.ones(4, 10)}


def _tower_tensors() -> dict[str, torch.Tensor]:
    key = "base_model.model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj"
    return {**_tensors(), f"{key}.lora_A.weight": torch.ones(4, 8), f"{key}.lora_B.weight": torch.ones(8, 4)}


def _wrong_shape() -> dict[str, torch.Tensor]:
    return {**_tensors(), f"{PREFIX}.1.mlp.down_proj.lora_A.weight": torch.ones(4, 8)}


def _half_pair() -> dict[str, torch.Tensor]:
    tensors = _tensors()
    del tensors[f"{PREFIX}.0.self_attn.q_proj.lora_B.weight"]
    return tensors


@pytest.mark.parametrize(
    ("config", "tensors", "message"),
    [
        ("{not json", _tensors(), "not valid JSON"),
        (None, _tensors(), "adapter_config.json is missing"),
        (_config(), None, "adapter_model.safetensors is missing"),
        (_config(r=32), _tensors(32), "rank 32, above --max-lora-rank 16"),
        (_config(r="four"), _tensors(), "'r' must be a positive integer"),
        (_config(peft_type="IA3"), _tensors(), "only 'LORA'"),
        (_config(use_dora=True), _tensors(), "DoRA"),
        (_config(bias="all"), _tensors(), "trains biases"),
        (_config(modules_to_save=["lm_head"]), _tensors(), "embeddings and LM head stay the base model's"),
        (_config(target_modules=["q_proj", "embed_tokens"]), _tensors(), "trains embed_tokens"),
        (_config(), _embedding_tensors(), "trains the embeddings or the LM head"),
        (_config(), _tower_tensors(), "trains a vision or audio tower"),
        (_config(), _wrong_shape(), r"expected lora_A \[4, 12\] and lora_B \[8, 4\]"),
        (_config(), _half_pair(), "lora_A without its lora_B"),
        (_config(), {f"{PREFIX}.5.self_attn.q_proj.lora_A.weight": torch.ones(4, 8)}, "layer 5; the model has 2"),
    ],
)
def test_malformed_adapter_is_refused_and_nothing_changes(
    tmp_path: Path, config: Any, tensors: Any, message: str
) -> None:
    registry = LoraRegistry(TARGETS, max_rank=16, base_name="base")
    registry.load("good", str(_write(tmp_path / "good", _config(), _tensors())))
    with pytest.raises(LoraAdapterError, match=message):
        registry.load("bad", str(_write(tmp_path / "bad", config, tensors)))
    assert registry.names() == {"good": str(tmp_path / "good")}
    with pytest.raises(LoraNotFound):
        registry.get("bad")


def test_registry_refuses_a_taken_name_and_the_base_name(tmp_path: Path) -> None:
    registry = LoraRegistry(TARGETS, max_rank=16, base_name="base")
    folder = str(_write(tmp_path, _config(), _tensors()))
    first = registry.load("a", folder)
    with pytest.raises(LoraAdapterError, match="already loaded"):
        registry.load("a", folder)
    with pytest.raises(LoraAdapterError, match="base model's name"):
        registry.load("base", folder)
    assert registry.get("a") is first
    registry.unload("a")
    assert registry.load("a", folder).uid != first.uid  # a reload never shares the old one's cached KV
