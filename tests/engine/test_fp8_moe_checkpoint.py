"""FP8 mixture-of-experts checkpoints in Qwen's block format (``quant_method: fp8``, ``weight_block_size``
[128, 128]): each expert's float8 weight with its ``weight_scale_inv`` per 128x128 block, the router in float.

A tiny random Qwen3-MoE is quantized here with the project's block quantizer (its 32 x 64 expert weights
are one partial block each). The engine de-quantizes each expert exactly and re-quantizes the stacked
experts per expert and output channel, as ``--quantization fp8`` does a float checkpoint's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.runner.loader import load_model
from omni_gateway.engine.runner.model_runner import ModelRunner
from omni_gateway.kernels import moe_reference
from omni_gateway.kernels import quant_reference as qref
from safetensors.torch import load_file, save_file

from tests.harness.checkpoints import MOE_KINDS, save_tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PROMPTS = [[3, 17, 44, 101, 7], [250, 9, 9, 12, 33, 80, 120, 5, 66], [40, 41, 42]]
NEW_TOKENS = 8
_EXPERT = ".experts."  # Qwen's mlp.experts.{j}.*_proj, Mixtral's block_sparse_moe.experts.{j}.w1/w2/w3


def _fp8_copy(source: Path, target: Path, corrupt: str | None = None) -> Path:
    """``source``'s checkpoint with every expert projection in block FP8; ``corrupt`` names one projection whose
    scale gets a wrong shape."""
    target.mkdir()
    tensors = load_file(str(source / "model.safetensors"))
    for name in [n for n in tensors if _EXPERT in n and n.endswith(".weight")]:
        q, scale = qref.quantize_fp8_per_block(tensors[name])
        prefix = name.removesuffix(".weight")
        tensors[name], tensors[prefix + ".weight_scale_inv"] = q, scale
        if prefix == corrupt:
            tensors[prefix + ".weight_scale_inv"] = torch.ones(2, 1)
    save_file(tensors, str(target / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head", "self_attn", "mlp.gate"],
    }
    (target / "config.json").write_text(json.dumps(config))
    for file in source.iterdir():
        if file.name not in ("model.safetensors", "config.json"):
            (target / file.name).write_bytes(file.read_bytes())
    return target


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    plain = tmp_path_factory.mktemp("qwen3-moe")
    save_tiny_checkpoint("qwen3-moe", plain)
    return plain, _fp8_copy(plain, tmp_path_factory.mktemp("fp8") / "model")


def _moe(directory: Path) -> Any:
    config = EngineConfig(model=str(directory), device="cpu", num_kv_blocks=16)
    return ModelRunner(config, load_model(config)).model.layers[1].moe


def test_experts_are_the_checkpoints_blocks_requantized_per_channel(pair: tuple[Path, Path]) -> None:
    plain, fp8 = pair
    tensors = load_file(str(fp8 / "model.safetensors"))
    p = "model.layers.1.mlp.experts."

    def expert(j: int, proj: str) -> torch.Tensor:
        name = f"{p}{j}.{proj}_proj.weight"
        return qref.dequantize_fp8(tensors[name], tensors[name.removesuffix("weight") + "weight_scale_inv"])

    w13 = torch.stack([torch.cat([expert(j, "gate"), expert(j, "up")]) for j in range(8)])
    w2 = torch.stack([expert(j, "down") for j in range(8)])
    block = _moe(fp8)
    for got, scale, reference in ((block.w13, block.w13_scale, w13), (block.w2, block.w2_scale, w2)):
        codes, scales = moe_reference.quantize_experts(reference)
        assert got.dtype == torch.float8_e4m3fn and torch.equal(got.float(), codes.float())
        assert scale is not None and torch.equal(scale, scales)
    float_block = _moe(plain)
    assert torch.equal(block.router, float_block.router), "the router stays as the checkpoint has it (float)"
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(0))
    expected = float_block(x)
    # Two e4m3 roundings (3 mantissa bits: up to 6% an element, about 2% RMS each) in two matmuls.
    assert float((block(x) - expected).norm() / expected.norm()) < 0.1


@pytest.mark.parametrize("kind", [k for k in MOE_KINDS if k != "qwen3-moe"])
def test_other_moe_families_read_their_fp8_experts(tmp_path: Path, kind: str) -> None:
    """Mixtral's expert names (renamed to Qwen's with their scales) and Qwen2-MoE's float shared expert."""
    save_tiny_checkpoint(kind, tmp_path / "float")
    float_block, block = _moe(tmp_path / "float"), _moe(_fp8_copy(tmp_path / "float", tmp_path / "fp8"))
    assert block.w13.dtype == torch.float8_e4m3fn and float_block.w13_scale is None
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(0))
    expected = float_block(x)
    assert float((block(x) - expected).norm() / expected.norm()) < 0.1


def test_the_fp8_checkpoint_generates_what_the_float_one_does(pair: tuple[Path, Path]) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    runs = []
    for directory in pair:
        llm = LLM(model=str(directory), device="cpu", dtype="float32", max_model_len=128)
        runs.append([o.outputs[0] for o in llm.generate(PROMPTS, params)])
    same = total = 0
    for plain, fp8 in zip(*runs):
        assert plain.logprobs is not None and fp8.logprobs is not None
        assert fp8.token_ids[0] == plain.token_ids[0]
        # While both follow the same tokens their logprobs differ by the experts' FP8 error only: two e4m3
        # roundings (up to 2^-4 of an element each) move this model's MoE output by a few percent and the chosen
        # tokens' logprobs by a few hundredths of a nat (up to 0.16 measured).
        for a, b, got, expected in zip(plain.token_ids, fp8.token_ids, fp8.logprobs, plain.logprobs):
            assert abs(got.logprob - expected.logprob) < 0.25
            if a != b:
                break
        same += sum(a == b for a, b in zip(plain.token_ids, fp8.token_ids))
        total += NEW_TOKENS
    # A near tie can flip late in a sequence; the FP8 experts keep most tokens.
    assert same >= 0.75 * total


def test_a_malformed_expert_scale_names_the_tensor(pair: tuple[Path, Path], tmp_path: Path) -> None:
    broken = _fp8_copy(pair[0], tmp_path / "broken", corrupt="model.layers.1.mlp.experts.3.up_proj")
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.experts\.3\.up_proj.*\[1, 1\].*\(2, 1\)"):
        load_model(EngineConfig(model=str(broken), device="cpu"))


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_tensor_parallel_refuses_the_fp8_experts(pair: tuple[Path, Path], expert_parallel: bool) -> None:
    """The ranks read slices of the checkpoint, and no slice of a float8 weight and its block scales is taken."""
    config = EngineConfig(
        model=str(pair[1]), device="cpu", tensor_parallel_size=2, enable_expert_parallel=expert_parallel
    )
    with pytest.raises(ModelLoadError, match="tensor parallel runs unquantized weights only.*'fp8'"):
        load_model(config)
