"""GGUF files read as a Hugging Face config and weights under HF names: llama.cpp's tensor names mapped, its
rotary permutation undone, block-quantized tensors of the types in ``engine/quant/gguf_blocks.py`` kept as
``QuantizedWeight`` codes and the rest de-quantized to float32."""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.models import GGUF_ARCHITECTURES, SUPPORTED_ARCHITECTURES
from omni_gateway.engine.quant.cpu_linear import QuantizedWeight

log = logging.getLogger(__name__)

# llama.cpp tensor names (after ``blk.N.``) -> HF names (after ``model.layers.N.``).
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs",  # llama3-style per-frequency divisors
}


def gguf_weights(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a GGUF file under HF names, all de-quantized to float32, for tensor-parallel ranks
    to slice (cached per process)."""
    stat = os.stat(path)
    return _dequantized_gguf(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1)
def _dequantized_gguf(path: str, mtime_ns: int, size: int) -> dict[str, torch.Tensor]:
    weights = read_gguf(path)[1]
    return {name: w.dequantize() if isinstance(w, QuantizedWeight) else w for name, w in weights.items()}


def read_gguf(path: str) -> tuple[Any, dict[str, torch.Tensor | QuantizedWeight]]:
    """Parse and decode one GGUF file. Not cached: a cache would keep every decoded tensor alive beside the
    merged q/k/v and gate/up copies the engine runs (50 MiB of the embedded model held twice)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as exc:  # the reader raises ValueError/struct.error/IndexError on bad bytes
        raise ModelLoadError(f"corrupt or unreadable GGUF file {path!r}: {exc}") from exc
    fields = {name: field for name, field in reader.fields.items()}
    arch = _gguf_value(fields, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(GGUF_ARCHITECTURES)} "
            f"(as {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    hf_config = _gguf_hf_config(fields, arch, has_output=any(t.name == "output.weight" for t in reader.tensors))

    weights: dict[str, torch.Tensor | QuantizedWeight] = {}
    try:
        for tensor in reader.tensors:
            name = _gguf_to_hf_name(tensor.name)
            if name is None:
                continue
            weight = _gguf_tensor(tensor)
            if arch == "llama" and tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
                heads = hf_config.num_attention_heads if ".attn_q." in tensor.name else hf_config.num_key_value_heads
                weight = _undo_gguf_rotary_permute(weight, heads)
            weights[name] = weight
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"corrupt GGUF tensor data in {path!r}: {exc}") from exc
    _warn_dequantized(path, reader.tensors, weights)
    return hf_config, weights


def _warn_dequantized(path: str, tensors: Any, weights: dict[str, torch.Tensor | QuantizedWeight]) -> None:
    """Matrices of a quantized type that no kernel here runs are de-quantized to float32: say which, and what
    they cost, since the file's size no longer tells the memory the model takes."""
    from omni_gateway.engine.quant.gguf_blocks import DEQUANTIZED, KEPT_QUANTIZED

    floats = ("F32", "F16", "BF16")
    types: dict[str, int] = {}
    for tensor in tensors:
        kind = tensor.tensor_type.name
        name = _gguf_to_hf_name(tensor.name)
        if kind in DEQUANTIZED and kind not in floats and name is not None and len(tensor.shape) == 2:
            weight = weights[name]
            types[kind] = types.get(kind, 0) + (weight.nbytes if isinstance(weight, torch.Tensor) else 0)
    if types:
        log.warning(
            "%s: %s matrices are de-quantized to float32 (%.0f MiB); only %s stay quantized",
            path,
            "/".join(sorted(types)),
            sum(types.values()) / 2**20,
            ", ".join(KEPT_QUANTIZED),
        )


def _gguf_tensor(tensor: Any) -> torch.Tensor | QuantizedWeight:
    """One tensor: its quantized codes where the type is kept quantized, else float32."""
    from gguf.quants import dequantize
    from omni_gateway.engine.quant.gguf_blocks import KEPT_QUANTIZED, check_finite, check_type, decode_quantized

    type_name = tensor.tensor_type.name
    check_type(tensor.name, type_name)
    shape = tuple(reversed(tensor.shape.tolist()))
    if type_name in KEPT_QUANTIZED and len(shape) == 2:
        return decode_quantized(tensor.name, type_name, tensor.data, shape[0], shape[1])
    array = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
    check_finite(tensor.name, type_name, array)
    return torch.from_numpy(array.astype("float32", copy=True))


def _undo_gguf_rotary_permute(weight: torch.Tensor | QuantizedWeight, heads: int) -> torch.Tensor | QuantizedWeight:
    """llama.cpp stores Llama q/k rows interleaved per head for its rotary layout; restore HF's halves."""
    if isinstance(weight, QuantizedWeight):  # codes, scales and biases are all row-major per output row
        bias = None if weight.bias is None else _undo_gguf_rotary_permute(weight.bias, heads)
        codes = _undo_gguf_rotary_permute(weight.codes, heads)
        scale = _undo_gguf_rotary_permute(weight.scale, heads)
        return QuantizedWeight(weight.layout, weight.gguf_type, codes, scale, bias, weight.group)
    rows = weight.shape[0]
    interleaved = weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
    return interleaved.swapaxes(1, 2).reshape(weight.shape).contiguous()


def _gguf_to_hf_name(name: str) -> str | None:
    if name in _GGUF_GLOBAL_NAMES:
        return _GGUF_GLOBAL_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _GGUF_LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def _gguf_value(fields: dict[str, Any], key: str, default: Any = None) -> Any:
    field = fields.get(key)
    if field is None:
        return default
    return field.contents()


def _gguf_hf_config(fields: dict[str, Any], arch: str, *, has_output: bool) -> Any:
    from transformers import AutoConfig

    def get(key: str, default: Any = None) -> Any:
        return _gguf_value(fields, f"{arch}.{key}", default)

    heads = get("attention.head_count")
    hidden = get("embedding_length")
    required = {
        "block_count": get("block_count"),
        "embedding_length": hidden,
        "feed_forward_length": get("feed_forward_length"),
        "attention.head_count": heads,
    }
    absent = [k for k, v in required.items() if v is None]
    if absent:
        raise ModelLoadError(f"GGUF metadata lacks {', '.join(f'{arch}.{k}' for k in absent)}")
    vocab = get("vocab_size") or len(_gguf_value(fields, "tokenizer.ggml.tokens", []))
    kwargs: dict[str, Any] = dict(
        num_hidden_layers=int(required["block_count"]),
        hidden_size=int(hidden),
        intermediate_size=int(required["feed_forward_length"]),
        num_attention_heads=int(heads),
        num_key_value_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", int(hidden) // int(heads))),
        max_position_embeddings=int(get("context_length", 2048)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        vocab_size=int(vocab),
        tie_word_embeddings=not has_output,
    )
    for key, gguf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        value = _gguf_value(fields, f"tokenizer.ggml.{gguf_key}")
        if value is not None:
            kwargs[key] = int(value)
    config = AutoConfig.for_model(GGUF_ARCHITECTURES[arch], **kwargs)
    config.architectures = [
        {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    ]
    return config
