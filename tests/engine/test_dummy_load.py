"""``load_format="dummy"``: a directory with config.json and a tokenizer only runs with seeded random weights of the
shapes a real checkpoint of the config holds (dense, mixture of experts, a multimodal checkpoint's language model,
FP8 at load, tensor-parallel slices), and the directories it cannot run still fail with a clear error."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.models.moe_config import canonical_expert_names
from omni_gateway.engine.models.weight_shapes import checkpoint_shapes
from omni_gateway.engine.parallel.layout import ShardLayout
from omni_gateway.engine.parallel.weights import SafetensorsSource, ShardView, shard_weights
from omni_gateway.engine.quant.fp8 import Fp8Weight
from omni_gateway.engine.runner.dummy_weights import RandomSource
from omni_gateway.engine.runner.loader import load_model
from omni_gateway.engine.runner.model_runner import ModelRunner

from tests.harness.checkpoints import (
    MOE_KINDS,
    TEXT_KINDS,
    byte_level_tokenizer,
    save_tiny_checkpoint,
    save_tiny_llava,
    tiny_config,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PROMPTS = [[5, 6, 7, 8, 9], [40, 41, 42]]


def _config_only(kind: str, directory: Path) -> Path:
    tiny_config(kind).save_pretrained(directory)
    byte_level_tokenizer().save_pretrained(directory)
    return directory


def _generate(directory: Path, **overrides: Any) -> list[list[int]]:
    llm = LLM(str(directory), load_format="dummy", device="cpu", num_kv_blocks=32, **overrides)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs]


def _runner(directory: Path, **overrides: Any) -> ModelRunner:
    config = EngineConfig(model=str(directory), device="cpu", num_kv_blocks=16, **overrides)
    return ModelRunner(config, load_model(config))


def _stored_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    source = SafetensorsSource(sorted(directory.glob("*.safetensors")))
    return canonical_expert_names({name: tuple(source.read(name).shape) for name in source.names()})


def _model_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """Every tensor the built model runs on, by attribute path (a linear's weight under its own name)."""

    def shape(value: Any) -> tuple[int, ...] | None:
        value = getattr(value, "weight", value)
        return tuple(value.shape) if isinstance(value, torch.Tensor) else None

    found = {"embed": shape(model.embed), "lm_head": shape(model.lm_head), "final_norm": shape(model.final_norm)}
    for i, layer in enumerate(model.layers):
        for field in dataclasses.fields(layer):
            value = getattr(layer, field.name)
            parts = [(f"{i}.{field.name}", value)]
            if field.name == "moe" and value is not None:
                parts = [(f"{i}.moe.{n}", getattr(value, n)) for n in ("router", "w13", "w2")]
            found.update((name, shape(part)) for name, part in parts)
    return {name: s for name, s in found.items() if s is not None}


@pytest.mark.parametrize("kind", TEXT_KINDS + MOE_KINDS)
def test_shapes_are_those_a_saved_checkpoint_holds(tmp_path: Path, kind: str) -> None:
    save_tiny_checkpoint(kind, tmp_path)
    assert checkpoint_shapes(tiny_config(kind)) == _stored_shapes(tmp_path)


@pytest.mark.parametrize("kind", ["llama", "qwen3-moe", "qwen2-moe"])
def test_the_built_model_matches_a_real_load(tmp_path: Path, kind: str) -> None:
    real, dummy = tmp_path / "real", _config_only(kind, tmp_path / "dummy")
    save_tiny_checkpoint(kind, real)
    expected = _model_shapes(_runner(real).model)
    got = _runner(dummy, load_format="dummy").model
    assert _model_shapes(got) == expected
    assert torch.equal(got.layers[0].input_norm, torch.ones(64)), "norm weights are ones"
    std = float(got.embed.std())
    assert 0.015 < std < 0.025, f"matrices are normal with std 0.02, got {std}"


@pytest.mark.parametrize("kind", ["llama", "qwen3-moe"])
def test_generation_is_deterministic_per_seed(tmp_path: Path, kind: str) -> None:
    directory = _config_only(kind, tmp_path)
    assert not list(directory.glob("*.safetensors"))
    first = _generate(directory)
    assert [len(t) for t in first] == [12, 12]
    assert _generate(directory) == first, "a second engine makes the same weights"
    assert _generate(directory, seed=1) != first, "another seed, other weights"


def test_fp8_at_load_quantizes_the_dummy_linears(tmp_path: Path) -> None:
    directory = _config_only("qwen3-moe", tmp_path)
    model = _runner(directory, load_format="dummy", quantization="fp8").model
    assert isinstance(model.layers[0].qkv.weight, Fp8Weight)
    assert model.layers[1].moe.w13.dtype == torch.float8_e4m3fn and model.layers[1].moe.w13_scale is not None
    assert len(_generate(directory, quantization="fp8")[0]) == 12


def test_a_multimodal_checkpoint_runs_its_language_model(tmp_path: Path) -> None:
    save_tiny_llava(tmp_path)
    real = _model_shapes(_runner(tmp_path).model)
    for file in tmp_path.glob("*.safetensors"):
        file.unlink()
    assert _model_shapes(_runner(tmp_path, load_format="dummy").model) == real


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_tensor_parallel_ranks_get_the_shapes_of_a_real_shard(tmp_path: Path, expert_parallel: bool) -> None:
    save_tiny_checkpoint("qwen2-moe", tmp_path)
    config = tiny_config("qwen2-moe")
    real = SafetensorsSource(sorted(tmp_path.glob("*.safetensors")), canonical_expert_names)
    whole = RandomSource(checkpoint_shapes(config), seed=3)
    ranks = []
    for rank in range(2):
        layout = ShardLayout.of(config, rank, 2, expert_parallel)
        expected = {name: t.shape for name, t in shard_weights(real, layout).items()}
        view = whole.shard(layout, torch.device("cpu"), torch.float32)
        assert {name: view[name].shape for name in view} == expected
        ranks.append(view)
    # Each rank cuts its slice out of the same whole tensor.
    name = "model.layers.1.self_attn.q_proj.weight"
    assert torch.equal(torch.cat([ranks[0][name], ranks[1][name]]), whole.read(name))
    assert isinstance(ranks[0], ShardView)


def test_a_directory_without_config_fails_clearly(tmp_path: Path) -> None:
    byte_level_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_model(EngineConfig(model=str(tmp_path), load_format="dummy"))


def test_auto_without_weights_still_fails_clearly(tmp_path: Path) -> None:
    directory = _config_only("llama", tmp_path)
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors weights.*load_format 'dummy'"):
        load_model(EngineConfig(model=str(directory)))


def test_dummy_refuses_what_it_cannot_make(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="load_format must be one of auto, dummy, got 'random'"):
        EngineConfig(load_format="random")
    directory = _config_only("llama", tmp_path)
    with pytest.raises(ModelLoadError, match="quantize_lm_head"):
        load_model(EngineConfig(model=str(directory), load_format="dummy", quantization="fp8", quantize_lm_head=True))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="Hugging Face directory"):
        load_model(EngineConfig(model=str(gguf), load_format="dummy"))


def test_a_rank_slice_holds_no_more_than_itself() -> None:
    source = RandomSource({"model.layers.0.self_attn.q_proj.weight": (8, 4)})
    piece = source.read("model.layers.0.self_attn.q_proj.weight", 0, 4, 8)
    assert piece.untyped_storage().nbytes() == piece.numel() * piece.element_size()
    assert torch.equal(piece, source.read("model.layers.0.self_attn.q_proj.weight")[4:])
