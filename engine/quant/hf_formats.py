"""Quantized Hugging Face checkpoints: which scheme a checkpoint (or ``--quantization``) asks for, and
the conversion of its tensors into the weight types the linear layers run on.

Read as vLLM reads them (the ``quantization_config`` of config.json):

- ``compressed-tensors`` with float8 weights (format ``float-quantized``/``naive-quantized``): ``weight``
  float8_e4m3fn and ``weight_scale`` per tensor, per channel ``[N, 1]`` or per 128x128 block.
- ``fp8``: ``weight`` float8_e4m3fn with ``weight_scale_inv`` per 128x128 block (``weight_block_size``)
  or ``weight_scale`` per tensor.

In both FP8 formats the mixture-of-experts projections (``mlp.experts.{j}.*``, ``mlp.shared_expert.*``, a
quantized router) arrive as ``Fp8Weight`` too; engine/models/moe.py turns the experts into its own layout.
- ``awq`` (version ``gemm``, 4 bits, zero points): ``qweight`` int32 ``[K, N / 8]`` (eight outputs a
  word, AWQ's interleaved order), ``qzeros`` int32 ``[K / G, N / 8]``, ``scales`` ``[K / G, N]``.
- ``gptq`` (4 bits, ``desc_act`` false): ``qweight`` int32 ``[K / 8, N]`` (eight inputs a word, in
  order), ``qzeros`` int32 ``[K / G, N / 8]`` holding zero - 1 (zero itself for ``gptq_v2``),
  ``scales`` ``[K / G, N]``, ``g_idx`` ``[K]`` (must be ``k // G``).

Activation scales of W8A8 checkpoints (``input_scale``) are dropped: activations stay in the model dtype,
except that on CUDA prefill-sized batches of FP8 per-channel layers quantize them per token on the fly
(kernels/quant_gemm.py). Embeddings, norms and the LM head stay in the model dtype.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from omni_gateway.engine.config import QUANTIZATION_CHOICES
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.quant.fp8 import Fp8Pending, Fp8Weight
from omni_gateway.engine.quant.int4 import Int4Weight
from omni_gateway.kernels import quant_reference as qref

SUPPORTED_QUANTIZATION: tuple[str, ...] = tuple(q for q in QUANTIZATION_CHOICES if q != "none")

_FP8_METHODS = ("fp8", "compressed-tensors")
_INT4_METHODS = ("awq", "gptq")
_LINEARS = tuple(f"self_attn.{n}_proj" for n in "qkvo") + tuple(f"mlp.{n}_proj" for n in ("gate", "up", "down"))
# The MoE block's linears: each expert's, the shared expert's, the router and the shared expert's gate.
_MOE_LINEAR = re.compile(
    r"model\.layers\.\d+\.mlp\.(experts\.\d+\.(gate|up|down)_proj|shared_expert\.(gate|up|down)_proj|gate"
    r"|shared_expert_gate)\.weight"
)
_AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # nibble holding output 8j + i of an AWQ word


def checkpoint_quant_config(hf_config: Any) -> dict[str, Any] | None:
    """The checkpoint's ``quantization_config`` as a dict, or None for a float checkpoint."""
    raw = getattr(hf_config, "quantization_config", None)
    if raw is None:
        return None
    return dict(raw) if isinstance(raw, dict) else dict(raw.to_dict())


def resolve_quantization(requested: str | None, hf_config: Any) -> str | None:
    """The scheme to load with: the checkpoint's own when ``requested`` is None, else ``requested``,
    which must agree with the checkpoint (only ``fp8`` quantizes a float checkpoint at load)."""
    if requested is not None and requested not in QUANTIZATION_CHOICES:
        raise ModelLoadError(f"unsupported quantization {requested!r}; supported: {', '.join(QUANTIZATION_CHOICES)}")
    ckpt = checkpoint_quant_config(hf_config)
    method = None if ckpt is None else str(ckpt.get("quant_method", "")).lower() or "unnamed"
    if method is not None and method not in SUPPORTED_QUANTIZATION:
        raise ModelLoadError(
            f"unsupported quantization {method!r} in the checkpoint's quantization_config; "
            f"supported: {', '.join(SUPPORTED_QUANTIZATION)}"
        )
    if method is None:
        if requested in (None, "none"):
            return None
        if requested != "fp8":
            raise ModelLoadError(
                f"quantization {requested!r} needs a checkpoint quantized with it (a quantization_config in "
                "config.json); this one holds float weights, and only 'fp8' quantizes at load"
            )
        return "fp8"
    if requested is not None and requested != method:
        raise ModelLoadError(
            f"the checkpoint is quantized with {method!r}; --quantization {requested!r} cannot load it"
        )
    return method


def quantize_weights(
    weights: dict[str, Any],
    method: str | None,
    ckpt: dict[str, Any] | None,
    num_layers: int,
    *,
    quantize_lm_head: bool = False,
) -> dict[str, Any]:
    """``weights`` with every decoder linear's tensors replaced by one weight object under its
    ``<prefix>.weight`` name (the other tensors of that linear removed). ``method`` comes from
    ``resolve_quantization``, ``ckpt`` is the checkpoint's ``quantization_config`` (None: float).
    The LM head stays in float unless ``quantize_lm_head``: then an FP8 head in the checkpoint stays FP8,
    and a float one (or the tied embedding, copied) is quantized like the checkpoint's linears: FP8 per
    channel, or for AWQ and GPTQ int4 in their groups, rounded to nearest (the checkpoints' own linears
    were calibrated; the head gets no calibration data here)."""
    if quantize_lm_head and method not in _FP8_METHODS + _INT4_METHODS:
        raise ModelLoadError(
            "quantize_lm_head needs FP8 or int4 weights (--quantization fp8, or an FP8, AWQ or GPTQ checkpoint); "
            f"this load uses {method or 'float weights'!r}"
        )
    if method is None:
        return weights
    if ckpt is None:  # a float checkpoint quantized here
        for prefix in _prefixes(num_layers):
            name = prefix + ".weight"
            if name in weights:
                weights[name] = Fp8Pending(weights[name])
    else:
        convert = {"fp8": _fp8, "compressed-tensors": _compressed_tensors, "awq": _awq, "gptq": _gptq}[method]
        convert(weights, ckpt, num_layers)
    head = weights.get("lm_head.weight")
    if isinstance(head, torch.Tensor) and head.dtype == qref.FP8_DTYPE:
        _fp8_linear(weights, "lm_head", "weight_scale_inv" if "lm_head.weight_scale_inv" in weights else "weight_scale")
        if not quantize_lm_head:  # the head stays in float: de-quantize it
            weights["lm_head.weight"] = weights["lm_head.weight"].dequantize(torch.bfloat16)
    elif quantize_lm_head:
        source = head if head is not None else weights["model.embed_tokens.weight"]
        if method in _INT4_METHODS:
            assert ckpt is not None  # int4 comes from a quantized checkpoint only
            weights["lm_head.weight"] = Int4Weight(*qref.quantize_int4(source, _int4_settings(ckpt, method)))
        else:
            weights["lm_head.weight"] = Fp8Pending(source)
    return weights


def fp8_at_load_names(num_layers: int) -> frozenset[str]:
    """The weights ``--quantization fp8`` quantizes in a float checkpoint: every decoder linear's."""
    return frozenset(prefix + ".weight" for prefix in _prefixes(num_layers))


def _prefixes(num_layers: int) -> list[str]:
    return [f"model.layers.{i}.{n}" for i in range(num_layers) for n in _LINEARS]


def _fp8_prefixes(weights: dict[str, Any], num_layers: int) -> list[str]:
    """The dense linears and the mixture-of-experts ones the checkpoint holds."""
    moe = sorted(name.removesuffix(".weight") for name in weights if _MOE_LINEAR.fullmatch(name))
    return _prefixes(num_layers) + moe


def _fp8_linear(weights: dict[str, Any], prefix: str, scale_name: str) -> None:
    weight = weights.get(prefix + ".weight")
    if weight is None or weight.dtype != qref.FP8_DTYPE:
        return  # a layer the checkpoint left in float ("ignore" / "modules_to_not_convert")
    scale = weights.pop(f"{prefix}.{scale_name}", None)
    weights.pop(prefix + ".input_scale", None)
    if scale is None:
        raise ModelLoadError(f"FP8 weight {prefix}.weight has no {prefix}.{scale_name}")
    n, k = weight.shape
    scale = scale.float()
    if scale.numel() == 1:
        scale = scale.reshape(1).expand(n).contiguous()  # per tensor: the same scale on every channel
    elif scale.numel() == n and scale.dim() <= 2 and scale.shape[0] == n:
        scale = scale.reshape(n)
    try:
        weights[prefix + ".weight"] = Fp8Weight(weight, scale)
    except ValueError as exc:
        raise ModelLoadError(f"{prefix}: {exc}") from exc


def _fp8(weights: dict[str, Any], ckpt: dict[str, Any], num_layers: int) -> None:
    block = ckpt.get("weight_block_size")
    if block is not None and list(block) != [qref.FP8_BLOCK, qref.FP8_BLOCK]:
        raise ModelLoadError(
            f"fp8 weight_block_size {list(block)} is not supported; supported: "
            f"[{qref.FP8_BLOCK}, {qref.FP8_BLOCK}] or per-tensor scales"
        )
    fmt = ckpt.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ModelLoadError(f"fp8 format {fmt!r} is not supported; supported: 'e4m3'")
    for prefix in _fp8_prefixes(weights, num_layers):
        _fp8_linear(weights, prefix, "weight_scale_inv" if block is not None else "weight_scale")


def _compressed_tensors(weights: dict[str, Any], ckpt: dict[str, Any], num_layers: int) -> None:
    fmt = ckpt.get("format")
    groups = ckpt.get("config_groups") or {}
    for name, group in groups.items():
        spec = dict(group.get("weights") or {})
        if spec.get("type") != "float" or int(spec.get("num_bits", 0)) != 8:
            raise ModelLoadError(
                f"compressed-tensors group {name!r} quantizes weights as {spec.get('num_bits')}-bit "
                f"{spec.get('type')!r}; supported: 8-bit float (FP8) weights"
            )
    if fmt not in ("float-quantized", "naive-quantized"):
        raise ModelLoadError(
            f"compressed-tensors format {fmt!r} is not supported; supported: 'float-quantized', 'naive-quantized'"
        )
    for prefix in _fp8_prefixes(weights, num_layers):
        _fp8_linear(weights, prefix, "weight_scale")


def _unpack_words(words: torch.Tensor) -> torch.Tensor:
    """int32 ``[R, C]`` -> uint8 ``[R, 8 C]``: nibble i of word c becomes column 8c + i."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    return ((words.to(torch.int32).unsqueeze(-1) >> shifts) & 0xF).to(torch.uint8).flatten(1)


def _int4_settings(ckpt: dict[str, Any], method: str) -> int:
    bits = int(ckpt.get("bits", ckpt.get("w_bit", 4)))
    if bits != 4:
        raise ModelLoadError(f"{method} with {bits} bits is not supported; supported: 4 bits")
    group = int(ckpt.get("group_size", ckpt.get("q_group_size", 128)))
    if group < 16 or group & (group - 1):
        raise ModelLoadError(
            f"{method} group_size {group} is not supported; supported: a power of two >= 16 (128 is usual)"
        )
    return group


def _take(weights: dict[str, Any], prefix: str, names: tuple[str, ...], method: str) -> list[torch.Tensor] | None:
    present = [f"{prefix}.{n}" in weights for n in names]
    if not any(present):
        return None
    if not all(present):
        missing = [f"{prefix}.{n}" for n, p in zip(names, present) if not p]
        raise ModelLoadError(f"{method} checkpoint lacks {', '.join(missing)}")
    return [weights.pop(f"{prefix}.{n}") for n in names]


def _int4_weight(prefix: str, q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group: int) -> Int4Weight:
    """From ``q`` uint8 ``[N, K]``, ``zeros`` uint8 ``[K / G, N]`` and ``scales`` ``[K / G, N]``."""
    n, k = q.shape
    if k % group or tuple(scales.shape) != (k // group, n) or tuple(zeros.shape) != (k // group, n):
        raise ModelLoadError(
            f"{prefix}: scales {tuple(scales.shape)} / zeros {tuple(zeros.shape)} do not match a {n} x {k} "
            f"weight in groups of {group}"
        )
    return Int4Weight(qref.pack_int4(q), scales.t().contiguous(), zeros.t().contiguous())


def _awq(weights: dict[str, Any], ckpt: dict[str, Any], num_layers: int) -> None:
    group = _int4_settings(ckpt, "awq")
    version = str(ckpt.get("version", "gemm")).lower()
    if version != "gemm":
        raise ModelLoadError(f"awq version {version!r} is not supported; supported: 'gemm'")
    if ckpt.get("zero_point", True) is False:
        raise ModelLoadError("awq without zero points is not supported; supported: zero_point true")
    order = torch.tensor(_AWQ_REVERSE_ORDER)
    for prefix in _prefixes(num_layers):
        taken = _take(weights, prefix, ("qweight", "qzeros", "scales"), "awq")
        if taken is None:
            continue
        qweight, qzeros, scales = taken

        def outputs(words: torch.Tensor) -> torch.Tensor:  # [R, N / 8] -> [R, N] in output order
            nibbles = _unpack_words(words)
            return nibbles.view(nibbles.shape[0], -1, 8)[:, :, order].flatten(1)

        weights[prefix + ".weight"] = _int4_weight(prefix, outputs(qweight).t(), outputs(qzeros), scales, group)


def _gptq(weights: dict[str, Any], ckpt: dict[str, Any], num_layers: int) -> None:
    group = _int4_settings(ckpt, "gptq")
    if ckpt.get("desc_act", False):
        raise ModelLoadError("gptq with desc_act (act-order) is not supported; supported: desc_act false")
    offset = 0 if ckpt.get("checkpoint_format") == "gptq_v2" else 1
    for prefix in _prefixes(num_layers):
        taken = _take(weights, prefix, ("qweight", "qzeros", "scales"), "gptq")
        if taken is None:
            continue
        qweight, qzeros, scales = taken
        q = _unpack_words(qweight.t().contiguous())  # [N, K]
        g_idx = weights.pop(prefix + ".g_idx", None)
        if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(q.shape[1], dtype=torch.long) // group):
            raise ModelLoadError(f"{prefix}.g_idx is not k // {group} (act-order GPTQ is not supported)")
        zeros = ((_unpack_words(qzeros).to(torch.int32) + offset) & 0xF).to(torch.uint8)
        weights[prefix + ".weight"] = _int4_weight(prefix, q, zeros, scales, group)
