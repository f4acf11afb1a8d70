"""The pure-torch kernels against naive dense formulas on random data."""

from __future__ import annotations

import math

import pytest
import torch
from omni_gateway.kernels import reference as ref

BLOCK = 16


def _naive_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Dense attention of the last len(q) positions of a context k/v (all [L, H, D]), GQA by repeat."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    q_len, ctx = q.shape[0], k.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale
    q_pos = torch.arange(ctx - q_len, ctx).unsqueeze(1)
    allowed = torch.arange(ctx).unsqueeze(0) <= q_pos
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double()).to(q.dtype)


def _scattered_tables(ctx_lens: list[int], num_blocks: int, gen: torch.Generator) -> torch.Tensor:
    """Block tables with distinct, shuffled block ids per sequence (so contiguity is never assumed)."""
    need = [math.ceil(n / BLOCK) for n in ctx_lens]
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(ctx_lens), max(need) + 1, dtype=torch.int32)
    pos = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[pos : pos + n].to(torch.int32)
        pos += n
    return tables


def _fill_cache(
    ctx_lens: list[int], tables: torch.Tensor, hkv: int, d: int, num_blocks: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    k_cache = torch.randn(num_blocks, BLOCK, hkv, d, generator=gen)
    v_cache = torch.randn(num_blocks, BLOCK, hkv, d, generator=gen)
    ks, vs = [], []
    for b, n in enumerate(ctx_lens):
        k = torch.randn(n, hkv, d, generator=gen)
        v = torch.randn(n, hkv, d, generator=gen)
        slots = torch.tensor([int(tables[b, i // BLOCK]) * BLOCK + i % BLOCK for i in range(n)], dtype=torch.int64)
        ref.write_kv_cache(k, v, k_cache, v_cache, slots)
        ks.append(k)
        vs.append(v)
    return k_cache, v_cache, ks, vs


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (9, 3)])
def test_prefill_matches_dense_causal_with_cached_prefix(hq: int, hkv: int) -> None:
    gen = torch.Generator().manual_seed(hq * 10 + hkv)
    d, num_blocks = 32, 40
    ctx_lens = [1, 37, 16, 50]
    q_lens = [1, 37, 5, 17]  # full prefill, full prefill, cached prefix of 11, prefix of 33 over blocks
    tables = _scattered_tables(ctx_lens, num_blocks, gen)
    k_cache, v_cache, ks, vs = _fill_cache(ctx_lens, tables, hkv, d, num_blocks, gen)
    q = torch.randn(sum(q_lens), hq, d, generator=gen)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    scale = d**-0.5
    out = ref.paged_prefill_attention(q, k_cache, v_cache, cu, torch.tensor(ctx_lens, dtype=torch.int32), tables, scale)
    for b in range(len(ctx_lens)):
        want = _naive_causal(q[cu[b] : cu[b + 1]], ks[b], vs[b], scale)
        torch.testing.assert_close(out[cu[b] : cu[b + 1]], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2)])
def test_decode_matches_dense_over_padded_batch(hq: int, hkv: int) -> None:
    gen = torch.Generator().manual_seed(7 + hq)
    d, num_blocks = 16, 30
    ctx_lens = [1, 16, 17, 70]
    tables = _scattered_tables(ctx_lens, num_blocks, gen)
    k_cache, v_cache, ks, vs = _fill_cache(ctx_lens, tables, hkv, d, num_blocks, gen)
    q = torch.randn(len(ctx_lens), hq, d, generator=gen)
    out = ref.paged_decode_attention(q, k_cache, v_cache, torch.tensor(ctx_lens, dtype=torch.int32), tables, 0.3)
    for b in range(len(ctx_lens)):
        torch.testing.assert_close(out[b : b + 1], _naive_causal(q[b : b + 1], ks[b], vs[b], 0.3), atol=1e-5, rtol=1e-5)


def test_write_kv_cache_skips_padding_slots() -> None:
    k_cache = torch.zeros(2, BLOCK, 1, 2)
    v_cache = torch.zeros(2, BLOCK, 1, 2)
    k = torch.arange(6.0).view(3, 1, 2) + 1
    ref.write_kv_cache(k, -k, k_cache, v_cache, torch.tensor([17, -1, 3]))
    assert torch.equal(k_cache[1, 1, 0], k[0, 0]) and torch.equal(v_cache[1, 1, 0], -k[0, 0])
    assert torch.equal(k_cache[0, 3, 0], k[2, 0])
    assert int((k_cache != 0).any(-1).sum()) == 2  # the padded token wrote nowhere


def test_rms_norm_and_fused_add() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 24, generator=gen, dtype=torch.float64).to(torch.bfloat16)
    res = torch.randn(5, 24, generator=gen).to(torch.bfloat16)
    w = torch.randn(24, generator=gen)
    eps = 1e-6
    xd = x.double()
    want = (xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w.double()).to(torch.bfloat16)
    got = ref.rms_norm(x, w, eps)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
    normed, new_res = ref.fused_add_rms_norm(x, res, w, eps)
    assert torch.equal(new_res, x + res)
    torch.testing.assert_close(normed, ref.rms_norm(x + res, w, eps))


def test_apply_rotary_matches_hf_rotate_half() -> None:
    gen = torch.Generator().manual_seed(2)
    d, max_pos = 8, 64
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).double() / d))
    freqs = torch.outer(torch.arange(max_pos).double(), inv_freq)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).float()
    q = torch.randn(6, 4, d, generator=gen)
    k = torch.randn(6, 2, d, generator=gen)
    positions = torch.tensor([0, 1, 5, 9, 33, 63])

    def hf_style(x: torch.Tensor) -> torch.Tensor:
        emb = torch.cat((freqs, freqs), dim=-1)[positions].unsqueeze(1)
        rotated = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
        return (x.double() * emb.cos() + rotated.double() * emb.sin()).float()

    q_out, k_out = ref.apply_rotary(q, k, positions, cache)
    torch.testing.assert_close(q_out, hf_style(q), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, hf_style(k), atol=1e-5, rtol=1e-5)
    assert torch.equal(q_out[0], q[0])  # position 0 is the identity rotation


def test_silu_and_mul() -> None:
    x = torch.randn(3, 10)
    gate, up = x[:, :5], x[:, 5:]
    torch.testing.assert_close(ref.silu_and_mul(x), gate / (1 + torch.exp(-gate)) * up)
