"""Fused mixture-of-experts in Triton: two grouped GEMM launches over tokens sorted by expert.

The token/expert pairs are grouped by expert and each group padded to whole ``block_m`` rows
(``moe_reference.align_block_size``), so every row block of a launch reads one expert's weights. The first
launch multiplies by the gate and up rows at once and writes ``silu(gate) * up``; the second multiplies by
the down projection, scales each row by its routing weight and writes it at its (token, slot) row; the
slots of a token are then summed. Buffers are sized by the step's token count and rows past the used ones
exit at once, so nothing waits on the host and a CUDA graph can capture a step (same signature as
``moe_reference.fused_moe``). FP8 expert weights are widened in the tile loads and scaled per channel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from omni_gateway.kernels.moe_reference import FP8_DTYPE, align_block_size, local_ids, padded_capacity
from omni_gateway.kernels.validation import FLOAT_DTYPES, check_tensor, interpreting


@dataclass(frozen=True, slots=True)
class MoeConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"MoeConfig.{name} must be a power of two >= 16, got {value}")


def default_config(num_tokens: int, top_k: int, num_experts: int) -> MoeConfig:
    """Tiles by the rows an expert gets on average: few (decode) stream the weights through narrow row
    blocks; many (prefill) take square tiles that reuse each weight tile over more rows."""
    rows_per_expert = num_tokens * top_k / num_experts
    if rows_per_expert <= 16:
        return MoeConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4)
    if rows_per_expert <= 64:
        return MoeConfig(block_m=32, block_n=64, block_k=64, num_warps=4, num_stages=4)
    return MoeConfig(block_m=64, block_n=128, block_k=64, num_warps=8, num_stages=3)


# Steps of up to this many (token, expert) pairs lay them out in one program (``_align_kernel``), not the ~20 torch
# launches of ``align_block_size``, which would cost more than a decode step's GEMMs.
_ALIGN_ONE_PROGRAM = 256


@triton.jit
def _align_kernel(
    ids_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    n,
    capacity,
    num_experts,
    BLOCK_M: tl.constexpr,
    N_P2: tl.constexpr,
    E_P2: tl.constexpr,
    BLOCKS_P2: tl.constexpr,
):
    """``moe_reference.align_block_size`` in one program for a few pairs: counts, padded offsets and each pair's
    rank among its expert's pairs from pairwise comparisons."""
    offs = tl.arange(0, N_P2)
    e = tl.load(ids_ptr + offs, mask=offs < n, other=-1).to(tl.int32)
    valid = e >= 0
    experts = tl.arange(0, E_P2)
    mine = (e[:, None] == experts[None, :]) & valid[:, None]  # [pairs, experts]
    counts = tl.sum(mine.to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    before = (e[:, None] == e[None, :]) & (offs[None, :] < offs[:, None])  # same expert, earlier pair
    rank = tl.sum(before.to(tl.int32), axis=1)
    dest = tl.sum(tl.where(mine, starts[None, :], 0), axis=1) + rank
    for start in range(0, capacity, N_P2):
        tl.store(sorted_ids_ptr + start + offs, n, mask=start + offs < capacity)
    tl.debug_barrier()  # the padding is written before the pairs land on it
    tl.store(sorted_ids_ptr + dest, offs, mask=valid)
    blocks = tl.arange(0, BLOCKS_P2)
    done = (ends[None, :] <= (blocks * BLOCK_M)[:, None]) & (experts[None, :] < num_experts)
    block_expert = tl.minimum(tl.sum(done.to(tl.int32), axis=1), num_experts - 1)
    tl.store(expert_ids_ptr + blocks, block_expert, mask=blocks < capacity // BLOCK_M)
    tl.store(num_padded_ptr, tl.sum(padded, axis=0))


def align_pairs(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``moe_reference.align_block_size``: one launch for up to ``_ALIGN_ONE_PROGRAM`` pairs, torch beyond."""
    n = topk_ids.numel()
    if n > _ALIGN_ONE_PROGRAM:
        return align_block_size(topk_ids, num_experts, block_m)
    capacity = padded_capacity(n, num_experts, block_m)
    device = topk_ids.device
    sorted_ids = torch.empty(capacity, dtype=torch.int32, device=device)
    expert_ids = torch.empty(capacity // block_m, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    _align_kernel[(1,)](
        topk_ids.reshape(-1).contiguous(),
        sorted_ids,
        expert_ids,
        num_padded,
        n,
        capacity,
        num_experts,
        BLOCK_M=block_m,
        N_P2=max(16, triton.next_power_of_2(n)),
        E_P2=max(16, triton.next_power_of_2(num_experts)),
        BLOCKS_P2=max(16, triton.next_power_of_2(capacity // block_m)),
    )
    return sorted_ids, expert_ids, num_padded


@triton.jit
def _grouped_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    b_scale_ptr,
    weights_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    num_valid,
    N,
    K,
    a_row_div,
    stride_am,
    stride_be,
    stride_bn,
    stride_cm,
    stride_se,
    GATED: tl.constexpr,
    ROUTED: tl.constexpr,
    FP8: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One ``[BLOCK_M, BLOCK_N]`` tile of ``c[sorted_ids] = a[sorted_ids // a_row_div] @ b[expert].T``.
    GATED: ``b[expert]`` holds N gate rows then N up rows; the tile is ``silu(gate) * up``.
    ROUTED: each row is scaled by its routing weight."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ids = tl.load(sorted_ids_ptr + offs_m)
    valid = ids < num_valid
    rows = (ids // a_row_div).to(tl.int64)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if DOT_FP32:
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(a, b.to(a.dtype))  # FP8 weights widen to the activations' dtype
        if GATED:
            up = tl.load(b_ptrs + N * stride_bn, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if DOT_FP32:
                acc_up += tl.dot(a.to(tl.float32), up.to(tl.float32), input_precision="ieee")
            else:
                acc_up += tl.dot(a, up.to(a.dtype))
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if FP8:
        acc *= tl.load(b_scale_ptr + expert * stride_se + offs_n, mask=n_ok, other=0.0)[None, :]
        if GATED:
            acc_up *= tl.load(b_scale_ptr + expert * stride_se + N + offs_n, mask=n_ok, other=0.0)[None, :]
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if ROUTED:
        acc *= tl.load(weights_ptr + ids, mask=valid, other=0.0)[:, None]
    c_ptrs = c_ptr + ids[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


def _check(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
) -> None:
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, contiguous=False)
    num_experts, two_inter, hidden = w13.shape
    if two_inter % 2 or hidden != x.shape[1]:
        raise ValueError(f"w13: expected [E, 2I, {x.shape[1]}], got {tuple(w13.shape)}")
    if tuple(w2.shape) != (num_experts, hidden, two_inter // 2):
        raise ValueError(f"w2: expected {[num_experts, hidden, two_inter // 2]}, got {tuple(w2.shape)}")
    fp8 = w13.dtype == FP8_DTYPE
    for name, w, scale in (("w13", w13, w13_scale), ("w2", w2, w2_scale)):
        if not w.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor")
        if (w.dtype == FP8_DTYPE) != fp8 or (not fp8 and w.dtype != x.dtype):
            raise ValueError(f"{name}: expected {x.dtype} weights (or both w13 and w2 in FP8), got {w.dtype}")
        if fp8 and (scale is None or tuple(scale.shape) != tuple(w.shape[:2]) or scale.dtype != torch.float32):
            raise ValueError(f"{name}_scale: FP8 weights need float32 scales {list(w.shape[:2])}, got {scale}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"topk_weights/topk_ids: expected [{x.shape[0]}, top_k] each, got "
            f"{tuple(topk_weights.shape)} and {tuple(topk_ids.shape)}"
        )


def _launch(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    scale: torch.Tensor | None,
    weights: torch.Tensor,
    layout: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    n: int,
    a_row_div: int,
    gated: bool,
    config: MoeConfig,
) -> None:
    sorted_ids, expert_ids, num_padded = layout
    grid = (expert_ids.numel() * triton.cdiv(n, config.block_n),)
    _grouped_gemm_kernel[grid](
        a,
        b,
        c,
        b if scale is None else scale,
        weights,
        sorted_ids,
        expert_ids,
        num_padded,
        weights.numel(),
        n,
        a.shape[1],
        a_row_div,
        a.stride(0),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        0 if scale is None else scale.stride(0),
        GATED=gated,
        ROUTED=not gated,
        FP8=scale is not None,
        # float32 activations multiply in IEEE float32 (not TF32); the interpreter's 16-bit dot is wrong.
        DOT_FP32=a.dtype == torch.float32 or interpreting(),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    expert_map: torch.Tensor | None = None,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    config: MoeConfig | None = None,
) -> torch.Tensor:
    """``[T, H]``: each token's experts' gated MLPs weighted by ``topk_weights`` and summed (see the module
    docstring and ``moe_reference.fused_moe``)."""
    _check(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)
    num_tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    top_k = topk_ids.shape[1]
    if num_tokens == 0:
        return x.new_empty(0, hidden)
    config = config or default_config(num_tokens, top_k, num_experts)
    x = x.contiguous()
    layout = align_pairs(local_ids(topk_ids, expert_map), num_experts, config.block_m)
    weights = topk_weights.reshape(-1).float().contiguous()
    act = x.new_empty(num_tokens * top_k, inter)
    _launch(x, w13, act, w13_scale, weights, layout, n=inter, a_row_div=top_k, gated=True, config=config)
    # Rows of experts held by other ranks are never written: they must read as zero in the sum.
    out = (x.new_empty if expert_map is None else x.new_zeros)(num_tokens * top_k, hidden)
    _launch(act, w2, out, w2_scale, weights, layout, n=hidden, a_row_div=1, gated=False, config=config)
    return out.view(num_tokens, top_k, hidden).sum(dim=1)
