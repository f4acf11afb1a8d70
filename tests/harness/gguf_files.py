"""Tiny Llama GGUF files with every linear in one quantized type, written with the gguf package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

HIDDEN, FFN, HEADS, KV_HEADS, LAYERS, VOCAB = 256, 512, 4, 2, 2, 384


def quantized_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw blocks of ``qtype`` for a ``[rows, cols]`` matrix. gguf's Python package quantizes the
    32-weight types but has no K-quant quantizer, so Q4_K/Q6_K blocks get random codes under
    small random scales (valid blocks all the same); other types it cannot quantize get random bytes."""
    if qtype in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K):
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (rows, cols // block_size, type_size), dtype=np.uint8)
        scales = (rng.random((rows, cols // block_size, 2)) * 2e-3 + 1e-4).astype(np.float16).view(np.uint8)
        if qtype == GGMLQuantizationType.Q4_K:
            raw[..., 0:4] = scales.reshape(rows, -1, 4)  # d and dmin
        else:
            raw[..., 192:208] = rng.integers(-20, 20, (rows, cols // block_size, 16), dtype=np.int8).view(np.uint8)
            raw[..., 208:210] = scales[..., 0:2]
        return raw.reshape(rows, -1)
    try:
        return quantize((rng.standard_normal((rows, cols)) * 0.05).astype(np.float32), qtype)
    except NotImplementedError:  # a type the engine does not read: any bytes of the right size do
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        return rng.integers(0, 256, (rows, cols // block_size * type_size), dtype=np.uint8)


def write_tiny_gguf(
    path: Path,
    linear_type: GGMLQuantizationType,
    *,
    embed_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
    v_type: GGMLQuantizationType | None = None,
    seed: int = 0,
) -> Path:
    """A 2-layer Llama (tied embeddings) whose linears are ``linear_type`` (``v_type`` for attn_v)."""
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_eos_token_id(2)

    def add(name: str, qtype: GGMLQuantizationType, rows: int, cols: int) -> None:
        if qtype == GGMLQuantizationType.F32:
            writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(cols)).astype(np.float32))
        else:
            writer.add_tensor(name, quantized_blocks(qtype, rows, cols, rng), raw_dtype=qtype)

    add("token_embd.weight", embed_type, VOCAB, HIDDEN)
    add("output_norm.weight", GGMLQuantizationType.F32, 1, HIDDEN)
    head_dim = HIDDEN // HEADS
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", GGMLQuantizationType.F32, 1, HIDDEN)
        add(f"blk.{i}.ffn_norm.weight", GGMLQuantizationType.F32, 1, HIDDEN)
        add(f"blk.{i}.attn_q.weight", linear_type, HIDDEN, HIDDEN)
        add(f"blk.{i}.attn_k.weight", linear_type, KV_HEADS * head_dim, HIDDEN)
        add(f"blk.{i}.attn_v.weight", v_type or linear_type, KV_HEADS * head_dim, HIDDEN)
        add(f"blk.{i}.attn_output.weight", linear_type, HIDDEN, HIDDEN)
        add(f"blk.{i}.ffn_gate.weight", linear_type, FFN, HIDDEN)
        add(f"blk.{i}.ffn_up.weight", linear_type, FFN, HIDDEN)
        add(f"blk.{i}.ffn_down.weight", linear_type, HIDDEN, FFN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
