"""int4 checkpoint weights (engine/quant/int4.py) in both layouts of kernels/quant_reference.py: a weight in
row tiles has the row layout's shape, group size and values, stacks with either layout, runs through the
CPU's twin, and is checked when built; moved to CUDA, a weight of whole 64-row tiles is tiled."""

from __future__ import annotations

import pytest
import torch
from omni_gateway.engine.quant.int4 import Int4Weight
from omni_gateway.kernels import quant_reference as qref


def _rows(n: int, k: int = 256, group: int = 64, seed: int = 0) -> Int4Weight:
    gen = torch.Generator().manual_seed(seed)
    return Int4Weight(*qref.quantize_int4(torch.randn(n, k, generator=gen), group))


def _tiled(w: Int4Weight, rows: int) -> Int4Weight:
    return Int4Weight(qref.tile_int4(w.packed, w.group_size, rows), w.scales, w.zeros)


def test_tiles_keep_shape_group_and_values() -> None:
    rows = _rows(128)
    tiled = _tiled(rows, 64)
    assert tiled.packed.shape == (2, 4, 64, 32)
    assert tiled.shape == rows.shape == (128, 256) and tiled.group_size == rows.group_size == 64
    assert (tiled.row_tile, rows.row_tile) == (64, 1)
    assert torch.equal(tiled.dequantize(torch.float32), rows.dequantize(torch.float32))
    # the same bytes in the tiled shape but in row order are other weights
    scrambled = Int4Weight(rows.packed.reshape(2, 4, 64, 32), rows.scales, rows.zeros)
    assert scrambled.shape == rows.shape
    assert not torch.equal(scrambled.dequantize(torch.float32), rows.dequantize(torch.float32))
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(128, generator=torch.Generator().manual_seed(2))
    assert torch.equal(tiled.kernel()(x, tiled, bias), rows.kernel()(x, rows, bias))  # the CPU runs the twin


def test_cat_stacks_either_layout() -> None:
    a, b = _rows(128, seed=1), _rows(64, seed=2)
    expected = torch.cat([a.dequantize(torch.float32), b.dequantize(torch.float32)])
    same = Int4Weight.cat([_tiled(a, 64), _tiled(b, 64)])
    assert same.row_tile == 64 and same.shape == (192, 256)
    assert torch.equal(same.packed, qref.tile_int4(torch.cat([a.packed, b.packed]), 64))
    mixed = Int4Weight.cat([_tiled(a, 64), b])
    assert mixed.row_tile == 1 and torch.equal(mixed.packed, torch.cat([a.packed, b.packed]))
    for parts in ([a, b], [_tiled(a, 32), _tiled(b, 64)]):
        assert torch.equal(Int4Weight.cat(parts).dequantize(torch.float32), expected)
    for w in (same, mixed):
        assert torch.equal(w.dequantize(torch.float32), expected)


def test_bad_layouts_say_what_they_expected() -> None:
    w = _rows(128)
    with pytest.raises(ValueError, match=r"\[N, K / 2\] \(rows\) or .* got shape \(128, 8, 16\)"):
        Int4Weight(w.packed.view(128, 8, 16), w.scales, w.zeros)
    with pytest.raises(ValueError, match="hold groups of 32 weights, expected 64"):
        Int4Weight(qref.tile_int4(w.packed, 32), w.scales, w.zeros)
    with pytest.raises(ValueError, match=r"do not divide weights of 128 x 256"):
        Int4Weight(qref.tile_int4(w.packed, 64), w.scales[:64], w.zeros[:64])


def test_the_cpu_keeps_the_layout() -> None:
    w = _rows(128)
    assert w.to(torch.device("cpu"), torch.float32).packed.dim() == 2
    assert _tiled(w, 32).to(torch.device("cpu"), torch.float32).row_tile == 32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tiles_whole_64_row_tiles() -> None:
    cuda = torch.device("cuda")
    for n, tile in ((128, qref.INT4_ROW_TILE), (40, 1)):  # 40 rows fill no tile: they stay rows
        w = _rows(n)
        moved = w.to(cuda, torch.bfloat16)
        assert moved.row_tile == tile and moved.shape == w.shape
        assert torch.equal(moved.dequantize(torch.float32).cpu(), w.dequantize(torch.float32))
    kept = _tiled(_rows(128), 32).to(cuda, torch.bfloat16)
    assert kept.row_tile == 32
