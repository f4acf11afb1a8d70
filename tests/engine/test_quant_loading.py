"""Quantized checkpoints (FP8 compressed-tensors / fp8 per-block, AWQ, GPTQ) and ``--quantization fp8``
at load: a tiny random Llama is quantized here in each layout, and the engine loaded from it must
match the engine loaded from the de-quantized float32 weights.

On the CPU the quantized linears run the torch twins (de-quantize, then the float matmul), so the two
engines multiply the same float32 numbers: logprobs agree to float32 rounding (1e-4) and greedy tokens
exactly. The Triton kernels themselves are checked against the twins in tests/kernels.
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
from omni_gateway.engine.quant.fp8 import Fp8Weight
from omni_gateway.engine.quant.int4 import Int4Weight
from omni_gateway.kernels import quant_reference as qref
from safetensors.torch import load_file, save_file

from tests.harness.checkpoints import VOCAB, byte_level_tokenizer

pytestmark = pytest.mark.slow

_LINEARS = [f"self_attn.{n}_proj" for n in "qkvo"] + [f"mlp.{n}_proj" for n in ("gate", "up", "down")]
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # output of each nibble of an AWQ word (AutoAWQ's packer)
GROUP = 64
PROMPTS = [[3, 17, 44, 101, 7], [250, 9, 9, 12, 33, 80, 120, 5, 66]]
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
    ),
]
NEW_TOKENS = 8


def _float_model(seed: int = 0) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A 2-layer Llama whose every linear dimension is a multiple of 128 (FP8 blocks stack evenly)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        max_position_embeddings=128,
        initializer_range=0.08,
        eos_token_id=0,
        bos_token_id=1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    return config.to_dict(), {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def _save(directory: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    byte_level_tokenizer().save_pretrained(directory)
    return str(directory)


def _linear_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    return [k[: -len(".weight")] for k in tensors if any(k.endswith(f"{n}.weight") for n in _LINEARS)]


def _pack_words(q: torch.Tensor) -> torch.Tensor:
    """uint8 ``[R, 8 C]`` -> int32 ``[R, C]``: column 8c + i into nibble i of word c."""
    q = q.to(torch.int64).view(q.shape[0], -1, 8)
    words = sum(q[:, :, i] << (4 * i) for i in range(8))
    return (words - ((words >> 31) << 32)).to(torch.int32)  # two's complement into int32


def _fp8_channel(tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, Any]:
    for name in _linear_names(tensors):
        q, scale = qref.quantize_fp8_per_channel(tensors[name + ".weight"])
        tensors[name + ".weight"], tensors[name + ".weight_scale"] = q, scale[:, None]
        tensors[name + ".input_scale"] = torch.ones(1)  # W8A8 checkpoints carry one; weight-only ignores it
        reference[name + ".weight"] = qref.dequantize_fp8(q, scale)
    group = {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}, "targets": ["Linear"]}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": group},
        "ignore": ["lm_head"],
    }


def _fp8_block(tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, Any]:
    for name in _linear_names(tensors):
        q, scale = qref.quantize_fp8_per_block(tensors[name + ".weight"])
        tensors[name + ".weight"], tensors[name + ".weight_scale_inv"] = q, scale
        reference[name + ".weight"] = qref.dequantize_fp8(q, scale)
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def _fp8_tensor(tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, Any]:
    """One scale per weight, as ``fp8`` checkpoints without ``weight_block_size`` carry it."""
    for name in _linear_names(tensors):
        weight = tensors[name + ".weight"]
        scale = weight.abs().max() / torch.finfo(torch.float8_e4m3fn).max
        q = (weight / scale).to(torch.float8_e4m3fn)
        tensors[name + ".weight"], tensors[name + ".weight_scale"] = q, scale.reshape(())
        reference[name + ".weight"] = q.float() * scale
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}


def _compressed(strategy: str) -> Any:
    """compressed-tensors FP8 with ``weight_scale`` per tensor or per 128 x 128 block (llm-compressor's)."""

    def quantize(tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, Any]:
        spec: dict[str, Any] = {"num_bits": 8, "type": "float", "strategy": strategy}
        if strategy == "block":
            _fp8_block(tensors, reference)
            for name in _linear_names(tensors):
                tensors[name + ".weight_scale"] = tensors.pop(name + ".weight_scale_inv")
            spec["block_structure"] = [128, 128]
        else:
            _fp8_tensor(tensors, reference)
        return {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": {"weights": spec, "targets": ["Linear"]}},
            "ignore": ["lm_head"],
        }

    return quantize


def _int4(
    tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], name: str, group: int = GROUP, **kw: Any
) -> torch.Tensor:
    packed, scales, zeros = qref.quantize_int4(tensors.pop(name + ".weight").half(), group, **kw)
    scales = scales.half()
    reference[name + ".weight"] = qref.dequantize_int4(packed, scales, zeros)
    tensors[name + ".scales"] = scales.t().contiguous()
    return packed, zeros


def _awq(tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], group: int = GROUP) -> dict[str, Any]:
    for name in _linear_names(tensors):
        packed, zeros = _int4(tensors, reference, name, group)
        order = torch.tensor(_AWQ_ORDER)
        q = qref.unpack_int4(packed).t()  # [K, N]
        tensors[name + ".qweight"] = _pack_words(q.reshape(q.shape[0], -1, 8)[:, :, order].flatten(1))
        z = zeros.t()  # [K / G, N]
        tensors[name + ".qzeros"] = _pack_words(z.reshape(z.shape[0], -1, 8)[:, :, order].flatten(1))
    return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}


def _gptq(tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, Any]:
    for name in _linear_names(tensors):
        packed, zeros = _int4(tensors, reference, name, symmetric=True)
        q = qref.unpack_int4(packed)  # [N, K]
        tensors[name + ".qweight"] = _pack_words(q).t().contiguous()  # [K / 8, N]
        tensors[name + ".qzeros"] = _pack_words((zeros.t().to(torch.int16) - 1).to(torch.uint8) & 0xF)
        tensors[name + ".g_idx"] = torch.arange(q.shape[1], dtype=torch.int32) // GROUP
    return {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": True}


def _write_pair(tmp: Path, kind: str) -> tuple[str, str]:
    """(quantized checkpoint, float32 checkpoint of its de-quantized weights)."""
    config, tensors = _float_model()
    if kind in ("awq", "awq-128", "gptq"):  # float16 checkpoints: the reference holds the same float16 values
        tensors = {k: v.half().float() for k, v in tensors.items()}
    reference = dict(tensors)
    quant = {
        "fp8-channel": _fp8_channel,
        "fp8-block": _fp8_block,
        "fp8-tensor": _fp8_tensor,
        "ct-block": _compressed("block"),
        "ct-tensor": _compressed("tensor"),
        "awq": _awq,
        "awq-128": lambda tensors, reference: _awq(tensors, reference, 128),
        "gptq": _gptq,
    }[kind]
    quant_config = quant(tensors, reference)
    if kind in ("awq", "awq-128", "gptq"):  # these checkpoints are float16
        tensors = {k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}
    quantized = _save(tmp / kind, {**config, "quantization_config": quant_config}, tensors)
    return quantized, _save(tmp / f"{kind}-dequantized", config, reference)


def _run(model: str, device: str = "cpu", **engine_args: Any) -> list[tuple[list[int], list[float]]]:
    llm = LLM(model=model, device=device, dtype="float32", max_model_len=128, **engine_args)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    outs = llm.generate(PROMPTS, params)
    return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs or []]) for o in outs]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["fp8-channel", "fp8-block", "fp8-tensor", "ct-block", "ct-tensor", "awq", "gptq"])
def test_quantized_checkpoint_matches_its_dequantized_weights(tmp_path: Path, kind: str, device: str) -> None:
    """On CUDA the Triton kernels sum in another order than cuBLAS: float32 rounding, 1e-3 in logprobs."""
    quantized, dequantized = _write_pair(tmp_path, kind)
    got, expected = _run(quantized, device), _run(dequantized, device)
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, expected):
        assert tokens == ref_tokens and len(logprobs) == NEW_TOKENS
        atol = 1e-4 if device == "cpu" else 1e-3
        assert torch.allclose(torch.tensor(logprobs), torch.tensor(ref_logprobs), atol=atol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["fp8-channel", "awq"])
def test_batch_one_decode_runs_the_fused_quantized_rows(tmp_path: Path, kind: str) -> None:
    """A lone sequence decodes through the fused one-row kernels of its format (norms inside the linears,
    residual adds and the gated activation in their epilogues) and follows the de-quantized checkpoint."""
    quantized, dequantized = _write_pair(tmp_path, kind)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    runs = []
    for model in (quantized, dequantized):
        llm = LLM(model=model, device="cuda", dtype="float32", max_model_len=128)
        if model == quantized:
            assert llm.engine.runner.model.row_fusion
        outs = [llm.generate([prompt], params)[0].outputs[0] for prompt in PROMPTS]
        runs.append([(o.token_ids, [lp.logprob for lp in o.logprobs or []]) for o in outs])
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(*runs):
        assert tokens == ref_tokens
        assert torch.allclose(torch.tensor(logprobs), torch.tensor(ref_logprobs), atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("int4_head", [False, True])
def test_row_stream_keeps_the_batch_one_decode(tmp_path: Path, int4_head: bool) -> None:
    """bfloat16 int4 in groups of 128: a lone sequence decodes over the float32 residual stream (the o and down
    projections adding into it, the gate/up projection's sums finished by the down projection, the qkv
    projection rotating q and k and writing the cache, an int4 head reading the stream). Two sequences decoding
    together cannot stream: they take the unfused layers (separate norms, residual adds, activation and rotary
    over bfloat16 rows), and their tokens and logprobs are the lone sequences'."""
    quantized, _ = _write_pair(tmp_path, "awq-128")
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    llm = LLM(model=quantized, device="cuda", dtype="bfloat16", max_model_len=128, quantize_lm_head=int4_head)
    model = llm.engine.runner.model
    assert model.row_fusion and model.row_stream and model.rotary_fold
    assert model.head_stream == int4_head
    alone = [llm.generate([prompt], params)[0].outputs[0] for prompt in PROMPTS]
    together = [o.outputs[0] for o in llm.generate(PROMPTS, params)]
    for streamed, unfused in zip(alone, together):
        assert streamed.token_ids == unfused.token_ids and len(streamed.token_ids) == NEW_TOKENS
        logprobs, ref_logprobs = ([lp.logprob for lp in o.logprobs or []] for o in (streamed, unfused))
        assert torch.allclose(torch.tensor(logprobs), torch.tensor(ref_logprobs), atol=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_fp8_at_load(tmp_path: Path, dtype: torch.dtype) -> None:
    """A float checkpoint, bf16 as most are published or float32, quantized per channel as it loads."""
    config, tensors = _float_model(seed=1)
    tensors = {k: v.to(dtype) for k, v in tensors.items()}
    plain = _save(tmp_path / "float", {**config, "torch_dtype": str(dtype).removeprefix("torch.")}, tensors)
    reference = {k: v.float() for k, v in tensors.items()}
    for name in _linear_names(tensors):
        weight = tensors[name + ".weight"].float()
        reference[name + ".weight"] = qref.dequantize_fp8(*qref.quantize_fp8_per_channel(weight))
    dequantized = _save(tmp_path / "dequantized", config, reference)
    got, expected, unquantized = _run(plain, quantization="fp8"), _run(dequantized), _run(plain)
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, expected):
        assert tokens == ref_tokens
        assert torch.allclose(torch.tensor(logprobs), torch.tensor(ref_logprobs), atol=1e-4)
    assert got != unquantized  # the weights really were rounded to FP8


@pytest.mark.parametrize("tied", [False, True])
def test_quantize_lm_head_at_load(tmp_path: Path, tied: bool) -> None:
    """``quantize_lm_head`` rounds the head (or, tied, a copy of the embedding) to FP8 per channel too: the
    same tokens and logprobs as float32 weights holding those rounded values, and other ones than with
    only the decoder linears in FP8."""
    config, tensors = _float_model(seed=3)
    if tied:
        config["tie_word_embeddings"] = True
        del tensors["lm_head.weight"]
    plain = _save(tmp_path / "float", config, tensors)
    reference = dict(tensors)
    for name in [*_linear_names(tensors), "lm_head"]:
        weight = tensors.get(name + ".weight", tensors["model.embed_tokens.weight"])
        reference[name + ".weight"] = qref.dequantize_fp8(*qref.quantize_fp8_per_channel(weight))
    dequantized = _save(tmp_path / "dequantized", {**config, "tie_word_embeddings": False}, reference)
    got = _run(plain, quantization="fp8", quantize_lm_head=True)
    expected, float_head = _run(dequantized), _run(plain, quantization="fp8")
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, expected):
        assert tokens == ref_tokens
        assert torch.allclose(torch.tensor(logprobs), torch.tensor(ref_logprobs), atol=1e-4)
    assert [lp for _, lp in got] != [lp for _, lp in float_head]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["awq", "gptq"])
def test_quantize_lm_head_with_an_int4_checkpoint(tmp_path: Path, kind: str, device: str) -> None:
    """With an AWQ or GPTQ checkpoint ``quantize_lm_head`` rounds the float head to int4 in the checkpoint's
    groups (nearest, min/max): the same tokens and logprobs as float32 weights holding those values."""
    quantized, dequantized = _write_pair(tmp_path, kind)
    reference = load_file(str(Path(dequantized) / "model.safetensors"))
    head = reference["lm_head.weight"].half()  # the checkpoint's float16 head
    reference["lm_head.weight"] = qref.dequantize_int4(*qref.quantize_int4(head, GROUP))
    config = json.loads((Path(dequantized) / "config.json").read_text())
    expected = _run(_save(tmp_path / "int4-head", config, reference), device)
    llm = LLM(model=quantized, device=device, dtype="float32", max_model_len=128, quantize_lm_head=True)
    assert isinstance(llm.engine.runner.model.lm_head.weight, Int4Weight)
    del llm
    got = _run(quantized, device, quantize_lm_head=True)
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, expected):
        assert tokens == ref_tokens
        assert torch.allclose(torch.tensor(logprobs), torch.tensor(ref_logprobs), atol=1e-4)
    assert [lp for _, lp in got] != [lp for _, lp in _run(quantized, device)]


def test_a_checkpoints_fp8_head_stays_fp8_only_when_asked(tmp_path: Path) -> None:
    quantized, _ = _write_pair(tmp_path, "fp8-block")
    head = Path(quantized) / "model.safetensors"
    tensors = load_file(str(head))
    q, scale = qref.quantize_fp8_per_block(tensors["lm_head.weight"])
    tensors["lm_head.weight"], tensors["lm_head.weight_scale_inv"] = q, scale
    save_file(tensors, str(head))
    for asked, kind in ((False, torch.Tensor), (True, Fp8Weight)):
        llm = LLM(model=quantized, device="cpu", dtype="float32", max_model_len=128, quantize_lm_head=asked)
        assert isinstance(llm.engine.runner.model.lm_head.weight, kind)


def test_quantization_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unsupported quantization 'int3'; supported: fp8, awq, gptq"):
        EngineConfig(quantization="int3")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="int8")
    config, tensors = _float_model()
    plain = _save(tmp_path / "float", config, tensors)
    with pytest.raises(ModelLoadError, match="needs a checkpoint quantized with it"):
        LLM(model=plain, device="cpu", quantization="awq")
    with pytest.raises(ModelLoadError, match="quantize_lm_head needs FP8 or int4 weights.*'float weights'"):
        LLM(model=plain, device="cpu", quantize_lm_head=True)
    bnb = _save(tmp_path / "bnb", {**config, "quantization_config": {"quant_method": "bitsandbytes"}}, tensors)
    with pytest.raises(ModelLoadError, match="unsupported quantization 'bitsandbytes'.*supported: fp8, awq"):
        LLM(model=bnb, device="cpu")
    quantized, _ = _write_pair(tmp_path, "gptq")
    with pytest.raises(ModelLoadError, match="quantized with 'gptq'; --quantization 'awq'"):
        LLM(model=quantized, device="cpu", quantization="awq")
    config_file = Path(quantized) / "config.json"
    spec = json.loads(config_file.read_text())
    spec["quantization_config"]["desc_act"] = True
    config_file.write_text(json.dumps(spec))
    with pytest.raises(ModelLoadError, match="act-order"):
        LLM(model=quantized, device="cpu")
    spec["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemv"}
    config_file.write_text(json.dumps(spec))
    with pytest.raises(ModelLoadError, match="awq version 'gemv' is not supported; supported: 'gemm'"):
        LLM(model=quantized, device="cpu")


def test_fp8_kv_cache_on_the_cpu(tmp_path: Path) -> None:
    """The CPU stores K/V as float8_e4m3fn and the torch attention widens them (emulation: no fp8 math
    there). K/V rounded to 3 mantissa bits move the logprobs by a few hundredths on this model."""
    config, tensors = _float_model(seed=2)
    model = _save(tmp_path / "float", config, tensors)
    llm = LLM(model=model, device="cpu", dtype="float32", max_model_len=128, kv_cache_dtype="fp8")
    assert llm.engine.runner.kv_cache.dtype == torch.float8_e4m3fn
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0)
    fp8 = [
        (o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs or []])
        for o in llm.generate(PROMPTS, params)
    ]
    full = _run(model)
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(fp8, full):
        assert tokens[:4] == ref_tokens[:4]
        assert abs(logprobs[0] - ref_logprobs[0]) < 0.05
    assert fp8 != full  # the cache really rounded K/V
