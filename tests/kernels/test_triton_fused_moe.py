"""Triton fused MoE (kernels.fused_moe) against its per-expert torch twin (kernels.moe_reference) in float64,
and the sorted layout both rest on."""

from __future__ import annotations

import pytest
import torch
from omni_gateway.kernels import moe_reference as ref
from omni_gateway.kernels.fused_moe import MoeConfig, fused_moe


def _problem(tokens: int, experts: int, top_k: int, hidden: int, inter: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).to(dtype)
    weights, ids = ref.route(torch.randn(tokens, experts, generator=gen), top_k, renormalize=True)
    return x, w13, w2, weights, ids


def _expected(x, w13, w2, weights, ids, **kw):
    return ref.fused_moe(x.double(), w13.double(), w2.double(), weights.double(), ids, **kw)


def test_route_renormalizes_the_top_k_of_the_softmax():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    weights, ids = ref.route(logits, 2, renormalize=False)
    probs = torch.softmax(logits, -1)
    assert ids.tolist() == [[1, 2]]
    torch.testing.assert_close(weights, probs[:, [1, 2]])
    weights, _ = ref.route(logits, 2, renormalize=True)
    torch.testing.assert_close(weights, probs[:, [1, 2]] / probs[:, [1, 2]].sum())


@pytest.mark.parametrize("block_m", [16, 32])
def test_layout_groups_each_experts_rows_in_padded_blocks(block_m):
    gen = torch.Generator().manual_seed(block_m)
    ids = torch.randint(0, 6, (13, 3), generator=gen)
    ids[0, 0] = -1  # held by another rank: left out
    sorted_ids, expert_ids, num_padded = ref.align_block_size(ids, 6, block_m)
    flat = ids.reshape(-1)
    used = int(num_padded)
    assert used % block_m == 0 and used <= sorted_ids.numel()
    assert (sorted_ids[used:] == flat.numel()).all(), "slots past the used ones are padding"
    placed = sorted_ids[:used]
    real = placed[placed < flat.numel()].long()
    assert sorted(real.tolist()) == [i for i in range(flat.numel()) if flat[i] >= 0], "each kept pair once"
    block_of = torch.arange(used) // block_m
    for slot in range(used):
        if placed[slot] < flat.numel():
            assert flat[placed[slot]] == expert_ids[block_of[slot]], "a block reads one expert's rows"


@pytest.mark.parametrize("pairs,experts,block_m", [(1 * 8, 128, 16), (5 * 2, 6, 16), (37 * 3, 8, 32)])
def test_one_program_layout_is_the_torch_layout(device, pairs, experts, block_m):
    from omni_gateway.kernels.fused_moe import align_pairs

    gen = torch.Generator().manual_seed(pairs)
    ids = torch.randint(-1, experts, (pairs,), generator=gen)  # -1: another rank's expert
    got = align_pairs(ids.to(device), experts, block_m)
    for name, a, b in zip(("sorted_ids", "expert_ids", "num_padded"), got, ref.align_block_size(ids, experts, block_m)):
        assert torch.equal(a.cpu(), b), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "tokens,experts,top_k,config",
    [
        (1, 8, 2, None),  # decode: one token, its experts each a block of one row
        (37, 4, 2, MoeConfig(block_m=16, block_n=16, block_k=16)),  # prefill: ragged rows, N and K
        (70, 6, 3, MoeConfig(block_m=32, block_n=32, block_k=32)),
    ],
)
def test_fused_moe_matches_the_per_expert_loop(device, dtype, tokens, experts, top_k, config, rel_err, tolerance):
    x, w13, w2, weights, ids = _problem(tokens, experts, top_k, 48, 40, dtype, seed=tokens)
    out = fused_moe(x.to(device), w13.to(device), w2.to(device), weights.to(device), ids.to(device), config=config)
    assert out.shape == (tokens, 48) and out.dtype == dtype
    assert rel_err(out.cpu(), _expected(x, w13, w2, weights, ids)) < tolerance[dtype]


def test_expert_map_leaves_other_ranks_experts_out(device, rel_err):
    x, w13, w2, weights, ids = _problem(21, 6, 2, 32, 24, torch.float32, seed=3)
    expected = _expected(x, w13, w2, weights, ids)
    halves = []
    for rank in range(2):  # expert parallel over 2 ranks: 3 experts each
        mapping = torch.full((6,), -1, dtype=torch.int64)
        mapping[rank * 3 : rank * 3 + 3] = torch.arange(3)
        local = slice(rank * 3, rank * 3 + 3)
        args = (x, w13[local].contiguous(), w2[local].contiguous(), weights, ids)
        halves.append(fused_moe(*(a.to(device) for a in args), expert_map=mapping.to(device)).cpu())
        twin = ref.fused_moe(*args, expert_map=mapping)
        assert rel_err(halves[-1], twin.double()) < 1e-5
    assert rel_err(halves[0] + halves[1], expected) < 1e-5


def test_fp8_weights_match_their_dequantized_twin(device, rel_err):
    x, w13, w2, weights, ids = _problem(19, 4, 2, 32, 32, torch.bfloat16, seed=4)
    q13, s13 = ref.quantize_experts(w13)
    q2, s2 = ref.quantize_experts(w2)
    out = fused_moe(
        *(a.to(device) for a in (x, q13, q2, weights, ids)), w13_scale=s13.to(device), w2_scale=s2.to(device)
    )
    expected = ref.fused_moe(x.double(), q13, q2, weights.double(), ids, w13_scale=s13, w2_scale=s2)
    assert rel_err(out.cpu(), expected) < 1e-2
    assert rel_err(expected, _expected(x, w13, w2, weights, ids)) < 0.1, "FP8 stays near the bf16 weights"


def test_rejects_mismatched_shapes(device):
    x, w13, w2, weights, ids = (a.to(device) for a in _problem(3, 4, 2, 16, 16, torch.float32, seed=5))
    with pytest.raises(ValueError, match="w2: expected"):
        fused_moe(x, w13, w2[:, :8], weights, ids)
    with pytest.raises(ValueError, match="topk_weights/topk_ids"):
        fused_moe(x, w13, w2, weights[:2], ids[:2])
    with pytest.raises(ValueError, match="FP8 weights need float32 scales"):
        fused_moe(x, w13.to(ref.FP8_DTYPE), w2.to(ref.FP8_DTYPE), weights, ids)
