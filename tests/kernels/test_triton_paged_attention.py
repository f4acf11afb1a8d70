"""Triton paged attention (decode and prefill) against kernels.reference in float64."""

from __future__ import annotations

import math

import pytest
import torch
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.attention_config import DecodeConfig, PrefillConfig, num_decode_splits
from omni_gateway.kernels.paged_decode import paged_decode_attention, split_counters
from omni_gateway.kernels.paged_prefill import paged_prefill_attention

PAGE = 16
# Small enough for the interpreter, yet every case has several splits and a partial last tile.
SPLIT_FINE = DecodeConfig(block_n=32, num_warps=4, num_stages=2, target_programs=64, min_split_tokens=32)
SPLIT_FUSED = DecodeConfig(
    block_n=32, num_warps=4, num_stages=2, target_programs=64, min_split_tokens=32, fused_reduce=True
)
F32, BF16 = torch.float32, torch.bfloat16


def _paged_cache(
    ctx_lens: list[int],
    hkv: int,
    d: int,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
    spare_blocks: int = 3,
    extra_columns: int = 1,
):
    """Random K/V cache with shuffled, distinct blocks per sequence and a table wider than needed."""
    need = [math.ceil(n / PAGE) for n in ctx_lens]
    num_blocks = sum(need) + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(ctx_lens), max(need) + extra_columns, dtype=torch.int32)
    pos = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[pos : pos + n].to(torch.int32)
        pos += n
    k_cache = torch.randn(num_blocks, PAGE, hkv, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, PAGE, hkv, d, generator=gen).to(dtype)
    return k_cache.to(device), v_cache.to(device), tables.to(device)


def _decode_case(batch_lens, hq, hkv, d, dtype, device, seed, config, poison):
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables = _paged_cache(batch_lens, hkv, d, dtype, device, gen)
    q = torch.randn(len(batch_lens), hq, d, generator=gen).to(dtype).to(device)
    seq_lens = torch.tensor(batch_lens, dtype=torch.int32, device=device)
    scale = d**-0.5
    poison(q)
    out = paged_decode_attention(q, k_cache, v_cache, seq_lens, tables, scale, config=config)
    expected = ref.paged_decode_attention(q.double(), k_cache.double(), v_cache.double(), seq_lens, tables, scale)
    return out, expected


@pytest.mark.parametrize(
    "dtype,config,hq,hkv,d",
    [
        (F32, None, 4, 2, 64),
        (BF16, None, 4, 2, 64),
        (BF16, None, 8, 1, 128),
        (F32, SPLIT_FINE, 4, 2, 64),
        (BF16, SPLIT_FINE, 6, 2, 64),
        (F32, SPLIT_FUSED, 6, 2, 64),
        (BF16, SPLIT_FUSED, 4, 2, 64),
        (F32, SPLIT_FUSED, 8, 1, 128),
    ],
    ids=["f32", "bf16", "bf16-d128", "f32-split", "bf16-split-g3", "f32-fused-g3", "bf16-fused", "f32-fused-d128"],
)
def test_decode_matches_reference(device, dtype, config, hq, hkv, d, poison, rel_err, tolerance):
    out, expected = _decode_case([1, 17, 70], hq, hkv, d, dtype, device, hq * 100 + d, config, poison)
    assert out.dtype == dtype and out.shape == expected.shape
    assert rel_err(out, expected) < tolerance[dtype]


def test_decode_split_count_depends_on_shapes_only():
    config = DecodeConfig(block_n=64, target_programs=512, min_split_tokens=256)
    splits, per_split = num_decode_splits(batch=16, num_kv_heads=4, max_context=4096, config=config)
    assert splits * per_split >= 4096 and per_split % 64 == 0
    assert splits == 8  # 512 programs / 64 (seq, head) pairs
    assert num_decode_splits(256, 8, 4096, config) == (1, 4096)
    # Short contexts are never split finer than min_split_tokens.
    assert num_decode_splits(1, 1, 300, config)[0] == 1


@pytest.mark.parametrize(
    "batch,hkv,ctx,block_n,splits",
    [
        (256, 8, 4096, 64, 1),  # 2048 pairs: many programs per SM, no split
        (64, 4, 4096, 64, 1),  # 256 pairs: between one and two per SM, no split
        (16, 4, 4096, 128, 2),  # 64 pairs: 128-token tiles, split until the 132 SMs are used
        (16, 8, 1024, 128, 1),  # 128 pairs: one per SM already
        (12, 4, 2048, 128, 2),
        (12, 4, 128, 64, 2),  # too short to fill the SMs with 128-token splits: one-tile 64-token splits
        (1, 8, 16384, 64, 43),  # too few pairs: fine splits, whatever the table width
    ],
)
def test_gpu_default_config_fills_one_wave(batch, hkv, ctx, block_n, splits):
    from omni_gateway.kernels.attention_config import gpu_decode_config

    config = gpu_decode_config(132, batch, hkv, ctx)
    got_splits, per_split = num_decode_splits(batch, hkv, ctx, config)
    assert (config.block_n, got_splits) == (block_n, splits)
    assert got_splits * per_split >= ctx
    assert config.merges_in_kernel(got_splits) == (1 < got_splits <= 32)
    if block_n == 128:  # one program per SM: the launch must not spill into a second wave
        assert batch * hkv * got_splits <= 132


@pytest.mark.parametrize(
    "batch,ctx,block_n,splits",
    [
        (256, 2048, 128, 1),  # many pairs: fp8 tiles of 128 tokens, the bytes of bf16's 64
        (64, 2048, 128, 1),  # 512 pairs, still two or more per SM
        (32, 4096, 64, 1),  # 256 pairs, between one and two per SM: as for bf16
        (1, 16384, 64, 43),  # too few pairs: bf16's fine splits
    ],
)
def test_an_fp8_cache_takes_wider_tiles_only_with_many_pairs(batch, ctx, block_n, splits):
    from omni_gateway.kernels.attention_config import gpu_decode_config

    config = gpu_decode_config(132, batch, 8, ctx, element_size=1)
    assert (config.block_n, num_decode_splits(batch, 8, ctx, config)[0]) == (block_n, splits)
    if block_n == 64:
        assert config == gpu_decode_config(132, batch, 8, ctx, element_size=2)


def test_fused_reduce_leaves_counters_zeroed_for_the_next_call(device, rel_err):
    from omni_gateway.kernels import paged_decode

    for seed in (1, 2):  # the second call relies on the first having reset its counters
        out, expected = _decode_case([5, 64, 90], 2, 2, 64, torch.float32, device, seed, SPLIT_FUSED, lambda _: None)
        assert rel_err(out, expected) < 1e-5
        assert int(paged_decode._COUNTERS[out.device].abs().sum()) == 0


def _many_splits(num_warps: int = 4) -> DecodeConfig:
    """One 16-token tile per split and room for 64 programs per (sequence, KV head): splits as fine
    as the table allows, all merged in the split kernel."""
    return DecodeConfig(
        block_n=16, num_warps=num_warps, num_stages=1, target_programs=4096, min_split_tokens=16, fused_max_splits=64
    )


# Each case: a long sequence, a zero-length padding sequence, and short ones whose later splits lie
# past their end. The table is as wide as the longest sequence needs plus one spare column.
@pytest.mark.parametrize(
    "lens,splits,dtype,hq,hkv,d,warps",
    [
        ([240, 0, 37, 1], 16, F32, 4, 2, 64, 4),
        ([490, 0, 70, 16], 32, F32, 6, 2, 64, 4),
        ([500, 3, 0, 129], 33, F32, 2, 2, 32, 4),
        ([490, 0, 70, 16], 32, BF16, 8, 2, 64, 4),
        ([490, 0, 70, 16], 32, F32, 8, 2, 64, 1),  # the group's tile outgrows the budget: chunks of 16
    ],
    ids=["16", "32-g3", "33-mha", "32-bf16-g4", "32-chunked"],
)
def test_fused_merge_of_many_splits_matches_reference(
    device, lens, splits, dtype, hq, hkv, d, warps, poison, rel_err, tolerance
):
    from omni_gateway.kernels import paged_decode

    config = _many_splits(warps)
    width = math.ceil(max(lens) / PAGE) + 1
    assert num_decode_splits(len(lens), hkv, width * PAGE, config)[0] == splits
    assert config.merges_in_kernel(splits)
    out, expected = _decode_case(lens, hq, hkv, d, dtype, device, splits + hq, config, poison)
    assert rel_err(out, expected) < tolerance[dtype]
    zero = lens.index(0)
    assert torch.equal(out[zero], torch.zeros_like(out[zero]))
    assert int(paged_decode._COUNTERS[out.device].abs().sum()) == 0


def test_merge_chunk_fits_register_budget():
    from omni_gateway.kernels.paged_decode import _merge_chunk_splits

    assert _merge_chunk_splits(merge_g=4, block_s=32, block_d=128, num_warps=4) == 32  # Llama-3 8B, 32 splits
    assert _merge_chunk_splits(merge_g=8, block_s=64, block_d=128, num_warps=4) == 16
    assert _merge_chunk_splits(merge_g=4, block_s=32, block_d=64, num_warps=1) == 16
    assert _merge_chunk_splits(merge_g=2, block_s=8, block_d=64, num_warps=4) == 8


def test_fused_max_splits_routes_to_the_merge_kernel_with_equal_results(device):
    lens = [240, 0, 37, 1]
    fused = _many_splits()
    second_kernel = DecodeConfig(
        block_n=16, num_warps=4, num_stages=1, target_programs=4096, min_split_tokens=16, fused_max_splits=15
    )
    assert fused.merges_in_kernel(16) and not second_kernel.merges_in_kernel(16)
    out_fused, expected = _decode_case(lens, 4, 2, 64, F32, device, 9, fused, lambda _: None)
    out_kernel, _ = _decode_case(lens, 4, 2, 64, F32, device, 9, second_kernel, lambda _: None)
    assert torch.allclose(out_fused, out_kernel, rtol=1e-5, atol=1e-6)


def test_decode_config_defaults_keep_the_fused_limit_and_reject_a_bad_one():
    config = DecodeConfig()
    assert config.fused_max_splits == 8 and config.min_split_tokens == 256
    assert config.merges_in_kernel(8) and not config.merges_in_kernel(9) and not config.merges_in_kernel(1)
    assert not DecodeConfig(fused_reduce=False).merges_in_kernel(4)
    with pytest.raises(ValueError, match="fused_max_splits: expected a positive count, got 0"):
        DecodeConfig(fused_max_splits=0)


def test_decode_zero_length_sequence_gives_zeros(device, rel_err):
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache, tables = _paged_cache([20, 20], 2, 64, torch.float32, device, gen)
    q = torch.randn(2, 4, 64, generator=gen).to(device)
    seq_lens = torch.tensor([20, 0], dtype=torch.int32, device=device)
    for config in (None, SPLIT_FINE, SPLIT_FUSED):
        out = paged_decode_attention(q, k_cache, v_cache, seq_lens, tables, 0.125, config=config)
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        expected = ref.paged_decode_attention(q[:1], k_cache, v_cache, seq_lens[:1], tables[:1], 0.125)
        assert rel_err(out[:1], expected) < 1e-5


def test_decode_merges_through_the_callers_own_counters(device, rel_err):
    """Two engines stepping at once on one device each pass counters of their own: the merge counts on
    them (a poisoned counter parts the output), and each launch leaves them zeroed for the next."""
    gen = torch.Generator().manual_seed(5)
    lens = [200, 90, 130]
    k_cache, v_cache, tables = _paged_cache(lens, 2, 64, torch.float32, device, gen)
    q = torch.randn(3, 4, 64, generator=gen).to(device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    splits, _ = num_decode_splits(3, 2, tables.shape[1] * PAGE, SPLIT_FUSED)
    assert SPLIT_FUSED.merges_in_kernel(splits)
    expected = ref.paged_decode_attention(q, k_cache, v_cache, seq_lens, tables, 0.125)
    own = split_counters(q.device, 3 * 2)
    outs = []  # kept: a later output must not land in an earlier one's memory
    for _ in range(2):
        outs.append(
            paged_decode_attention(q, k_cache, v_cache, seq_lens, tables, 0.125, config=SPLIT_FUSED, counters=own)
        )
        assert rel_err(outs[-1], expected) < 1e-5
        assert not own.any()
    # As if another launch were counting the first (sequence, KV head) pair: its splits are never merged.
    own[0] = 1 << 20
    outs.append(paged_decode_attention(q, k_cache, v_cache, seq_lens, tables, 0.125, config=SPLIT_FUSED, counters=own))
    assert own.tolist() == [(1 << 20) + splits, 0, 0, 0, 0, 0]
    assert not torch.allclose(outs[-1][0, :2], expected[0, :2])
    assert rel_err(outs[-1][1:], expected[1:]) < 1e-5
    with pytest.raises(ValueError, match="counters: expected at least 6 for 3 sequences x 2 KV heads, got 5"):
        paged_decode_attention(q, k_cache, v_cache, seq_lens, tables, 0.125, config=SPLIT_FUSED, counters=own[:5])


def _prefill_case(q_lens, ctx_lens, hq, hkv, d, dtype, device, seed, poison, config=None):
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables = _paged_cache(ctx_lens, hkv, d, dtype, device, gen)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32, device=device)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(dtype).to(device)
    seq_lens = torch.tensor(ctx_lens, dtype=torch.int32, device=device)
    scale = d**-0.5
    poison(q)
    out = paged_prefill_attention(q, k_cache, v_cache, cu, seq_lens, tables, scale, config=config)
    expected = ref.paged_prefill_attention(q.double(), k_cache.double(), v_cache.double(), cu, seq_lens, tables, scale)
    return out, expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 64), (6, 2, 64)])
def test_prefill_with_cached_prefix_matches_reference(device, dtype, hq, hkv, d, poison, rel_err, tolerance):
    # No prefix, a long cached prefix, a single new token, an empty sequence, a fresh sequence.
    q_lens = [9, 7, 1, 0, 21]
    ctx_lens = [9, 50, 33, 5, 21]
    out, expected = _prefill_case(q_lens, ctx_lens, hq, hkv, d, dtype, device, hq + d, poison)
    assert out.shape == expected.shape
    assert rel_err(out, expected) < tolerance[dtype]


def test_prefill_small_tiles_match_reference(device, poison, rel_err):
    config = PrefillConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)
    out, expected = _prefill_case([12, 30], [40, 30], 8, 2, 64, torch.float32, device, 7, poison, config=config)
    assert rel_err(out, expected) < 1e-5


def _valid_decode_args(device):
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache, tables = _paged_cache([20], 2, 64, torch.float32, device, gen)
    q = torch.randn(1, 4, 64, generator=gen).to(device)
    seq_lens = torch.tensor([20], dtype=torch.int32, device=device)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, seq_lens=seq_lens, block_tables=tables, scale=0.1)


@pytest.mark.parametrize(
    "field,bad,message",
    [
        ("seq_lens", lambda a: a["seq_lens"].long(), "seq_lens: expected dtype"),
        ("q", lambda a: a["q"].repeat(1, 1, 2)[:, :, ::2], "q: expected a contiguous tensor"),
        ("k_cache", lambda a: a["k_cache"].bfloat16(), "k_cache: expected dtype torch.float32"),
        ("q", lambda a: a["q"][:, :3].contiguous(), "divisible by num_kv_heads"),
        ("block_tables", lambda a: a["block_tables"].long(), "block_tables: expected dtype"),
        ("seq_lens", lambda a: a["seq_lens"].repeat(2), "seq_lens: expected batch size"),
    ],
)
def test_decode_rejects_bad_arguments(device, field, bad, message):
    args = _valid_decode_args(device)
    args[field] = bad(args)
    with pytest.raises(ValueError, match=message):
        paged_decode_attention(**args)


def test_prefill_rejects_mismatched_cu_seqlens(device):
    args = _valid_decode_args(device)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected len"):
        paged_prefill_attention(
            args["q"], args["k_cache"], args["v_cache"], cu, args["seq_lens"], args["block_tables"], 0.1
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_decode_large_gqa(dtype, poison, rel_err, tolerance):
    lens = [1, 15, 16, 17, 300, 1000, 2049, 4000]
    out, expected = _decode_case(lens, 32, 4, 128, dtype, torch.device("cuda"), 11, None, poison)
    assert rel_err(out, expected) < tolerance[dtype]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_prefill_large_gqa(dtype, poison, rel_err, tolerance):
    q_lens = [1, 200, 513, 64]
    ctx_lens = [700, 200, 1500, 1064]
    out, expected = _prefill_case(q_lens, ctx_lens, 32, 4, 128, dtype, torch.device("cuda"), 5, poison)
    assert rel_err(out, expected) < tolerance[dtype]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "config",
    [
        DecodeConfig(target_programs=160, min_split_tokens=64, fused_reduce=True),  # 8 splits
        DecodeConfig(target_programs=1024, min_split_tokens=64, fused_max_splits=64),  # 24 splits, chunked merge
    ],
    ids=["8-splits", "24-splits"],
)
def test_gpu_fused_reduce_is_stable_across_calls(config, poison, rel_err):
    # A missing barrier or fence in the counter hand-off shows up as an error that moves between
    # runs; many splits per (sequence, head) and fresh data per call give it room to appear.
    lens = [3000, 70, 1, 2500, 640]
    assert config.merges_in_kernel(num_decode_splits(len(lens), 4, (math.ceil(3000 / PAGE) + 1) * PAGE, config)[0])
    for seed in range(6):
        out, expected = _decode_case(lens, 32, 4, 128, torch.bfloat16, torch.device("cuda"), 100 + seed, config, poison)
        assert rel_err(out, expected) < 1e-2


def test_prefill_padded_to_a_graph_capacity_leaves_live_rows_unchanged(device, poison):
    # A prefill graph pads a step to its token bucket and its sequence capacity: tokens past the last
    # query offset and sequences with no query and no context. The live rows must come out bit for bit.
    gen = torch.Generator().manual_seed(11)
    q_lens, ctx_lens = [9, 1, 21], [9, 40, 30]
    k_cache, v_cache, tables = _paged_cache(ctx_lens, 2, 64, F32, device, gen)
    total = sum(q_lens)
    cu = [0] + torch.tensor(q_lens).cumsum(0).tolist()
    q = torch.randn(total, 4, 64, generator=gen).to(device)
    poison(q)
    live = paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        torch.tensor(cu, dtype=torch.int32, device=device),
        torch.tensor(ctx_lens, dtype=torch.int32, device=device),
        tables,
        0.125,
    )
    pad_seqs, bucket = 5, 48
    padded_q = torch.cat((q, torch.randn(bucket - total, 4, 64, generator=gen).to(device)))
    padded_tables = torch.cat((tables, torch.zeros(pad_seqs, tables.shape[1], dtype=torch.int32, device=device)))
    out = paged_prefill_attention(
        padded_q,
        k_cache,
        v_cache,
        torch.tensor(cu + [total] * pad_seqs, dtype=torch.int32, device=device),
        torch.tensor(ctx_lens + [0] * pad_seqs, dtype=torch.int32, device=device),
        padded_tables,
        0.125,
    )
    assert out.shape == padded_q.shape
    assert torch.equal(out[:total], live)
