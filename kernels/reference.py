"""Pure-torch reference of every kernel in the kernel API: the spec the Triton kernels are tested
against, and the attention path the engine uses on the CPU.

Layouts: ``k_cache``/``v_cache`` are ``[num_blocks, block_size, num_kv_heads, head_dim]``;
slot = block_id * block_size + offset; block tables are int32 ``[B, max_blocks_per_seq]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "write_kv_cache",
    "paged_prefill_attention",
    "paged_decode_attention",
    "rms_norm",
    "fused_add_rms_norm",
    "apply_rotary",
    "rotary_write_kv",
    "silu_and_mul",
    "greedy_argmax",
    "DecodePlan",
    "plan_decode",
    "decode_with_plan",
]


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter token ``t``'s K/V to ``slot_mapping[t]``; slot -1 marks padding and is skipped.

    An float8_e4m3fn cache stores the values saturated at +-448 (scale 1; e4m3 has no infinity)."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    k, v = _to_cache(k, k_cache.dtype), _to_cache(v, v_cache.dtype)
    if k_cache.dtype == FP8_KV_DTYPE:  # index_copy_ has no float8 kernel on the CPU: copy the bytes
        k_flat, v_flat, k, v = (
            k_flat.view(torch.uint8),
            v_flat.view(torch.uint8),
            k.view(torch.uint8),
            v.view(torch.uint8),
        )
    valid = slot_mapping >= 0
    if bool(valid.all()):
        k_flat.index_copy_(0, slot_mapping, k)
        v_flat.index_copy_(0, slot_mapping, v)
        return
    slots = slot_mapping[valid]
    k_flat.index_copy_(0, slots, k[valid])
    v_flat.index_copy_(0, slots, v[valid])


FP8_KV_DTYPE = torch.float8_e4m3fn


def _to_cache(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == FP8_KV_DTYPE:
        return x.float().clamp(-448.0, 448.0).to(dtype)
    return x.to(dtype)


def _gather_context(cache: torch.Tensor, block_table_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` cached positions of one sequence as ``[length, Hkv, D]``."""
    block_size = cache.shape[1]
    num_blocks = (length + block_size - 1) // block_size
    # index_select copies whole blocks; advanced indexing is several times slower on the CPU.
    blocks = block_table_row[:num_blocks].long()
    return cache.index_select(0, blocks).flatten(0, 1)[:length]


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Varlen causal attention of each sequence's new queries over its whole cached context.

    Sequence ``b``'s queries are the last ``q_len_b`` positions of its context of ``seq_lens[b]``
    tokens, whose K/V (the new ones included) are already in the cache.
    """
    out = torch.empty_like(q)
    starts = cu_seqlens_q.tolist()
    lengths = seq_lens.tolist()
    for b, ctx_len in enumerate(lengths):
        q_start, q_end = starts[b], starts[b + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        k = _gather_context(k_cache, block_tables[b], ctx_len)
        v = _gather_context(v_cache, block_tables[b], ctx_len)
        qb = q[q_start:q_end].transpose(0, 1).unsqueeze(0)  # [1, Hq, q_len, D]
        kb = k.transpose(0, 1).unsqueeze(0).to(q.dtype)
        vb = v.transpose(0, 1).unsqueeze(0).to(q.dtype)
        if q_len == ctx_len:
            o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale, enable_gqa=True)
        else:
            # Query i sits at absolute position ctx_len - q_len + i (bottom-right aligned causal mask).
            q_pos = torch.arange(ctx_len - q_len, ctx_len, device=q.device).unsqueeze(1)
            k_pos = torch.arange(ctx_len, device=q.device).unsqueeze(0)
            mask = k_pos <= q_pos
            o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=True)
        out[q_start:q_end] = o[0].transpose(0, 1)
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per sequence over all of its ``seq_lens[b]`` cached positions (``counters``: the Triton
    kernel's split-merge counters, which this path has no use for).

    Sequences are padded to the longest context and batched into one attention call; padded
    positions are masked out.
    """
    if q.shape[0] == 0:
        return torch.empty_like(q)
    return decode_with_plan(q, k_cache, v_cache, plan_decode(seq_lens, block_tables, k_cache.shape[1]), scale)


@dataclass(frozen=True, slots=True)
class DecodePlan:
    """What every layer's decode attention of one step shares: which cache blocks to gather and
    which padded positions to mask. A caller running many layers builds it once per step."""

    blocks: torch.Tensor  # int64 [B * blocks_per_seq]
    mask: torch.Tensor  # bool [B, 1, 1, blocks_per_seq * block_size]


def plan_decode(seq_lens: torch.Tensor, block_tables: torch.Tensor, block_size: int) -> DecodePlan:
    batch = seq_lens.shape[0]
    num_blocks = (int(seq_lens.max()) + block_size - 1) // block_size
    positions = torch.arange(num_blocks * block_size, device=seq_lens.device)
    mask = (positions.unsqueeze(0) < seq_lens.unsqueeze(1)).view(batch, 1, 1, -1)
    return DecodePlan(blocks=block_tables[:, :num_blocks].reshape(-1).long(), mask=mask)


def decode_with_plan(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodePlan, scale: float
) -> torch.Tensor:
    batch, padded = plan.mask.shape[0], plan.mask.shape[-1]
    num_heads, (num_kv_heads, head_dim) = q.shape[1], k_cache.shape[2:]
    # index_select copies whole blocks; [B * blocks, block_size, Hkv, D] -> [B, Hkv, S, D]
    k = k_cache.index_select(0, plan.blocks).view(batch, padded, num_kv_heads, head_dim).transpose(1, 2)
    v = v_cache.index_select(0, plan.blocks).view(batch, padded, num_kv_heads, head_dim).transpose(1, 2)
    # The query heads sharing a KV head become that head's queries ([B, Hkv, Hq/Hkv, D]): one
    # attention over each KV head instead of a broadcast of K/V to every query head (2x faster on the CPU).
    grouped = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    o = F.scaled_dot_product_attention(grouped, k.to(q.dtype), v.to(q.dtype), attn_mask=plan.mask, scale=scale)
    return o.reshape(batch, num_heads, head_dim)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, computed in fp32 and cast back to ``x.dtype``."""
    # One fused op; in fp32 it is bitwise equal to x * rsqrt(mean(x^2) + eps) * weight.
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``new_residual = x + residual``; returns ``(rms_norm(new_residual), new_residual)``."""
    new_residual = x + residual
    return rms_norm(new_residual, weight, eps), new_residual


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX / HF-Llama rotary embedding (rotate the two halves of each head).

    ``cos_sin_cache[p] = cat(cos[p, :D/2], sin[p, :D/2])``. q and k are rotated as one tensor
    (half the elementwise calls); the results are views into it.
    """
    half = cos_sin_cache.shape[1] // 2
    cos_sin = cos_sin_cache[positions].to(q.dtype).unsqueeze(1)
    cos, sin = cos_sin[..., :half], cos_sin[..., half:]
    qk = torch.cat((q, k), dim=1)
    x1, x2 = qk[..., :half], qk[..., half:]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated[:, : q.shape[1]], rotated[:, q.shape[1] :]


def rotary_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """``apply_rotary`` then ``write_kv_cache`` of the rotated k and v; returns the rotated q
    (contiguous). The rotated k is written only to the cache; slot -1 rotates q and caches nothing."""
    q_rot, k_rot = apply_rotary(q, k, positions, cos_sin_cache)
    write_kv_cache(k_rot, v, k_cache, v_cache, slot_mapping)
    return q_rot.contiguous()


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` for ``x`` of shape ``[T, 2I]``."""
    inter = x.shape[-1] // 2
    return F.silu(x[..., :inter]) * x[..., inter:]


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """int64 ``[rows]``: the column of each ``[rows, vocab]`` row's largest value, the lowest on ties."""
    return logits.argmax(dim=-1)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)``: x ``[M, K]``, weight ``[N, K]``, bias ``[N]``; ``[M, N]`` in x's dtype."""
    return F.linear(x, weight, bias)


def row_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """A linear with the batch-1 decode fusions (kernels/row_fusion.py), in float32 where the kernels
    accumulate: ``rms_norm(x) @ weight.T (+ bias)`` with the normalized input unrounded, then
    ``+ residual`` or ``silu(gate) * up`` over the output's halves, each rounded to x's dtype."""
    act = x.dtype
    xf = x.float()
    if norm_weight is not None:
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
    out = F.linear(xf, weight.float(), None if bias is None else bias.float()).to(act)
    if residual is not None:
        out = (out.float() + residual.float()).to(act)
    if gated:
        gate, up = out.float().chunk(2, dim=-1)
        out = (F.silu(gate) * up).to(act)
    return out.to(out_dtype or act)
