"""The model shapes of benchmarks/engine_gpu.py: Qwen3-30B-A3B's parameter count, and the bytes a batch-1 decode
step reads (every weight of a dense model, as HF counts them; only the routed experts of a mixture)."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.engine_gpu import DUMMY_SHAPES, weight_bytes
from tests.harness.model_shapes import SHAPES, shape_config


def _hf_bytes(name: str) -> tuple[int, int]:
    """(bytes of every parameter, bytes without an untied input embedding) of HF's model, built on no device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape_config(name), dtype=torch.bfloat16)
    embed = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is embed
    params = list(model.parameters())
    total = sum(p.numel() * p.element_size() for p in params)
    return total, total - (0 if tied else embed.numel() * embed.element_size())


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "llama-3.1-8b"])
def test_a_dense_step_reads_every_weight(name: str) -> None:
    assert weight_bytes(shape_config(name)) == _hf_bytes(name)[1]


def test_qwen3_30b_a3b_has_its_published_size_and_reads_its_active_experts() -> None:
    cfg = shape_config("qwen3-30b-a3b")
    total, without_embed = _hf_bytes("qwen3-30b-a3b")
    assert round(total / 2 / 1e9, 1) == 30.5, "Qwen3-30B-A3B: 30.5B parameters"
    experts = 48 * 128 * 3 * 768 * 2048 * 2
    assert weight_bytes(cfg) == without_embed - experts + experts * 8 // 128
    assert math.isclose(weight_bytes(cfg) / 2 / 1e9, 3.04, abs_tol=0.01)


def test_the_moe_shapes_run_on_dummy_weights() -> None:
    assert set(DUMMY_SHAPES) <= set(SHAPES)
    assert all(shape_config(name).num_experts > 1 for name in DUMMY_SHAPES)
