"""Attention backend choice (pure torch or Triton) and the per-step metadata every layer shares.

A step's tokens are laid out decodes first (one query per sequence), then prefill chunks; the
metadata says where the split is, so each layer runs one batched decode call and one varlen
prefill call over the paged KV cache.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from omni_gateway.kernels import reference


@dataclass(frozen=True, slots=True)
class KernelOps:
    """The kernel API (see kernels/reference.py) bound to one implementation."""

    name: str
    rotary_write_kv: Callable[..., torch.Tensor]
    paged_prefill_attention: Callable[..., torch.Tensor]
    paged_decode_attention: Callable[..., torch.Tensor]
    rms_norm: Callable[..., torch.Tensor]
    fused_add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_and_mul: Callable[..., torch.Tensor]
    greedy_argmax: Callable[..., torch.Tensor]
    linear: Callable[..., torch.Tensor]
    # One row with the batch-1 decode fusions (kernels/row_fusion.py); None where the backend keeps
    # the separate norm, residual-add and activation calls.
    row_linear: Callable[..., torch.Tensor] | None


# Where the Triton twin of each kernel lives.
_TRITON_MODULES = {
    "rotary_write_kv": "omni_gateway.kernels.rotary",
    "paged_prefill_attention": "omni_gateway.kernels.paged_prefill",
    "paged_decode_attention": "omni_gateway.kernels.paged_decode",
    "rms_norm": "omni_gateway.kernels.norm",
    "fused_add_rms_norm": "omni_gateway.kernels.norm",
    "silu_and_mul": "omni_gateway.kernels.activation",
    "greedy_argmax": "omni_gateway.kernels.argmax",
    "linear": "omni_gateway.kernels.gemv",
    "row_linear": "omni_gateway.kernels.gemv",
}


def select_kernels(backend: str, device: torch.device) -> KernelOps:
    """``auto`` picks Triton on CUDA and torch elsewhere; asking for Triton off CUDA is an error."""
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"attention backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend == "auto":
        backend = "triton" if device.type == "cuda" else "torch"
    if backend == "triton":
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"attention backend 'triton' needs a CUDA device (or TRITON_INTERPRET=1), got {device}")
        funcs = {name: getattr(importlib.import_module(module), name) for name, module in _TRITON_MODULES.items()}
    else:
        funcs = {name: getattr(reference, name) for name in _TRITON_MODULES}
        # The torch backend runs each layer op by op, as HF does: its numerics stay HF's step for step,
        # and on the CPU a fused row saves no launches.
        funcs["row_linear"] = None
    return KernelOps(name=backend, **funcs)


@dataclass(slots=True)
class AttentionMetadata:
    """Token layout of one step. Tokens ``[0, num_decode)`` are single-query sequences; the rest are
    prefill chunks described by ``prefill_cu_seqlens_q`` (offsets relative to ``num_decode``)."""

    slot_mapping: torch.Tensor  # int64 [T]
    num_decode: int
    decode_seq_lens: torch.Tensor  # int32 [num_decode]
    decode_block_tables: torch.Tensor  # int32 [num_decode, M]
    prefill_cu_seqlens_q: torch.Tensor  # int32 [P + 1]
    prefill_seq_lens: torch.Tensor  # int32 [P]
    prefill_block_tables: torch.Tensor  # int32 [P, M]
    num_tokens: int
    # torch backend only: the decode gather/mask shared by all layers, built once per step.
    decode_plan: Any = None
    # Triton only: the launching engine's own split-merge counters (kernels.paged_decode.split_counters),
    # so that no launch of another engine on the same device, on another stream, can count on them.
    split_counters: torch.Tensor | None = None


def own_split_counters(ops: KernelOps, device: torch.device) -> torch.Tensor | None:
    """An engine's own split-merge counters for the Triton decode attention (None on the torch path):
    every step's metadata carries them (``AttentionMetadata.split_counters``)."""
    if ops.name != "triton":
        return None
    from omni_gateway.kernels.paged_decode import split_counters

    return split_counters(device)


def plan_step(ops: KernelOps, meta: AttentionMetadata, block_size: int) -> None:
    """Precompute what every layer would otherwise rebuild (the torch path's decode plan)."""
    if ops.name == "torch" and meta.num_decode:
        meta.decode_plan = reference.plan_decode(meta.decode_seq_lens, meta.decode_block_tables, block_size)


def paged_attention(
    ops: KernelOps, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """Attend each query over its sequence's context; this step's K/V are already in the cache
    (``KernelOps.rotary_write_kv`` put them there)."""
    nd = meta.num_decode
    if nd == 0:
        return ops.paged_prefill_attention(
            q, k_cache, v_cache, meta.prefill_cu_seqlens_q, meta.prefill_seq_lens, meta.prefill_block_tables, scale
        )
    decode = _decode(ops, q[:nd] if nd < meta.num_tokens else q, k_cache, v_cache, meta, scale)
    if nd == meta.num_tokens:
        return decode
    prefill = ops.paged_prefill_attention(
        q[nd:], k_cache, v_cache, meta.prefill_cu_seqlens_q, meta.prefill_seq_lens, meta.prefill_block_tables, scale
    )
    return torch.cat((decode, prefill), dim=0)


def _decode(
    ops: KernelOps, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    if meta.decode_plan is not None:
        return reference.decode_with_plan(q, k_cache, v_cache, meta.decode_plan, scale)
    return ops.paged_decode_attention(
        q, k_cache, v_cache, meta.decode_seq_lens, meta.decode_block_tables, scale, counters=meta.split_counters
    )
