"""Triton batched LoRA (shrink, expand) against its torch twin, every row with its own adapter slot."""

from __future__ import annotations

import pytest
import torch
from omni_gateway.kernels import lora_reference as twin


def _case(device, dtype, *, rows=37, k=80, n=72, slots=3, rank=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(dtype).to(device)
    a = (torch.randn(slots, rank, k, generator=gen) / k**0.5).to(dtype).to(device)
    b = torch.randn(slots, n, rank, generator=gen).to(dtype).to(device)
    # Rows without an adapter (-1) between rows of every slot, and a slot no row uses.
    row_slots = torch.randint(-1, slots - 1, (rows,), generator=gen).to(torch.int32).to(device)
    return x, a, b, row_slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shrink_matches_twin(device, dtype, rel_err, tolerance):
    from omni_gateway.kernels.lora import lora_shrink

    x, a, _, slots = _case(device, dtype)
    out = lora_shrink(x, a, slots)
    ref = twin.lora_shrink(x, a, slots)
    assert out.shape == (x.shape[0], a.shape[1]) and out.dtype == torch.float32
    assert rel_err(out, ref) < tolerance[dtype]
    assert torch.all(out[slots < 0] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("rows", "k", "splits"),
    [(37, 600, 3), (1, 1000, 4), (1, 200, 1), (3, 4096, 16)],
    ids=["ragged-last-split", "batch-1", "k-under-one-split", "decode-4096"],
)
def test_split_k_shrink_matches_twin(device, dtype, rel_err, tolerance, rows, k, splits):
    """The K ranges' partial sums add up to the whole product, whatever the rows' mix of slots and -1."""
    from omni_gateway.kernels.lora import lora_shrink, shrink_span

    assert -(-k // shrink_span(rows, k)) == splits
    x, a, _, _ = _case(device, dtype, rows=rows, k=k, rank=64, seed=7)
    a[:, 48:] = float("nan")  # padding ranks: a read of them would show
    slots = (1 - torch.arange(rows) % 3).to(torch.int32).to(device)  # slots 1, 0 and -1; slot 2 unused
    out = lora_shrink(x, a, slots, used=48)
    ref = twin.lora_shrink(x, a, slots, used=48)
    assert rel_err(out, ref) < tolerance[dtype]
    assert not out[slots < 0].any() and not out[:, 48:].any()


def test_shrink_span_splits_decode_and_keeps_prefill_whole():
    from omni_gateway.kernels.lora import shrink_span

    # Llama-3.1-8B: K 4096 (qkv, o, gate_up) and 14336 (down); batch 1, 64 rows, a long prefill.
    assert [shrink_span(rows, 4096) for rows in (1, 64, 4096)] == [256, 256, 4096]
    assert [shrink_span(rows, 14336) for rows in (1, 64, 4096)] == [256, 448, 14336]
    for rows, k in [(1, 896), (1, 2048), (40, 14336), (300, 4096), (1, 80)]:
        span = shrink_span(rows, k)
        assert span % 64 == 0 and (span >= 256 or span >= k)  # whole multiples of BLOCK_K, none too narrow


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expand_adds_into_own_rows_only(device, dtype, rel_err, tolerance):
    from omni_gateway.kernels.lora import lora_expand

    x, a, b, slots = _case(device, dtype, seed=1)
    h = twin.lora_shrink(x, a, slots)
    base = torch.randn(x.shape[0], b.shape[1], generator=torch.Generator().manual_seed(2)).to(dtype).to(device)
    out, ref = base.clone(), base.clone()
    lora_expand(h, b, slots, out)
    twin.lora_expand(h, b, slots, ref)
    assert rel_err(out - base, ref - base) < tolerance[dtype] * 4
    assert torch.equal(out[slots < 0], base[slots < 0])


def test_expand_into_a_column_slice(device):
    """The base output may be a view of a wider tensor (its row stride is the wider one)."""
    from omni_gateway.kernels.lora import lora_expand

    x, a, b, slots = _case(device, torch.float32, n=48, seed=3)
    h = twin.lora_shrink(x, a, slots)
    wide = torch.zeros(x.shape[0], 100, device=device)
    lora_expand(h, b, slots, wide[:, 20:68])
    ref = torch.zeros(x.shape[0], 48, device=device)
    twin.lora_expand(h, b, slots, ref)
    torch.testing.assert_close(wide[:, 20:68], ref, rtol=1e-5, atol=1e-5)
    assert not wide[:, :20].any() and not wide[:, 68:].any()


def test_all_rows_without_adapter_leave_output_alone(device):
    from omni_gateway.kernels.lora import lora_expand, lora_shrink

    x, a, b, _ = _case(device, torch.float32, seed=4)
    none = torch.full((x.shape[0],), -1, dtype=torch.int32, device=device)
    h = lora_shrink(x, a, none)
    assert not h.any()
    y = torch.ones(x.shape[0], b.shape[1], device=device)
    lora_expand(h, b, none, y)
    assert torch.all(y == 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merged_projection_slices_read_their_own_ranks(device, dtype, rel_err, tolerance):
    """q/k/v merged: three output slices (32, 16 and 16 columns), each from its own 16 ranks of the shrink's
    64 (the last 16 padding, never read)."""
    from omni_gateway.kernels.lora import lora_expand, lora_shrink

    x, a, b, slots = _case(device, dtype, n=64, rank=64, seed=5)
    a[:, 48:] = float("nan")  # padding ranks: a read of them would show
    h = lora_shrink(x, a, slots, used=48)
    ref_h = twin.lora_shrink(x, a, slots, used=48)
    assert rel_err(h, ref_h) < tolerance[dtype] and not h[:, 48:].any()
    b = b[:, :, :16].contiguous()
    base = torch.randn(x.shape[0], 64, generator=torch.Generator().manual_seed(6)).to(dtype).to(device)
    out, ref = base.clone(), base.clone()
    lora_expand(h, b, slots, out, starts=(0, 32, 48))
    twin.lora_expand(ref_h, b, slots, ref, starts=(0, 32, 48))
    assert rel_err(out - base, ref - base) < tolerance[dtype] * 4
    # Each slice is its own product: columns of k (32..48) come from ranks 16..32 only.
    keep = slots >= 0
    torch.testing.assert_close(
        (ref - base)[keep, 32:48].float(), torch.einsum("tr,tnr->tn", ref_h[keep, 16:32].to(dtype).float(),
        b[slots[keep].long(), 32:48].float()), rtol=tolerance[dtype] * 10, atol=tolerance[dtype] * 10,
    )  # fmt: skip


def test_refuses_unpadded_rank_and_wrong_slot_count(device):
    from omni_gateway.kernels.lora import lora_shrink

    x, a, _, slots = _case(device, torch.float32, rank=16)
    with pytest.raises(ValueError, match="power of two >= 16"):
        lora_shrink(x, a[:, :12].contiguous(), slots)
    with pytest.raises(ValueError, match="one slot per row"):
        lora_shrink(x, a, slots[:-1].contiguous())


def test_refuses_slices_a_tile_would_straddle(device):
    from omni_gateway.kernels.lora import lora_expand

    h = torch.zeros(4, 32, device=device)
    b = torch.zeros(2, 40, 16, device=device)
    slots = torch.zeros(4, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="multiples of 16"):
        lora_expand(h, b, slots, torch.zeros(4, 40, device=device), starts=(0, 24))
