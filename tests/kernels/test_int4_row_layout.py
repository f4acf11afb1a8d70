"""The int4 row-layout experiment (benchmarks/experiments/int4_row_layout.py) under the interpreter: the
tiled words hold each program's sub-tiles contiguously, and the plane kernel gives the twin's sums on both
layouts."""

import pytest
import torch
from omni_gateway.kernels import quant_reference as qref

from benchmarks.experiments import int4_row_layout as layout


def test_tiles_are_contiguous_sub_tiles_in_reading_order() -> None:
    words = torch.arange(8 * 64, dtype=torch.int32).view(8, 64)  # 8 rows of 512 features
    flat = layout.tiled(words, 4)
    sub = layout.SUB // 8
    # block 1 of rows (4-7), sub-tile 2 (words 32-47): the 11th tile of 4 x 16 words
    tile = flat[(1 * 4 + 2) * 4 * sub : (1 * 4 + 3) * 4 * sub].view(4, sub)
    assert torch.equal(tile, words[4:8, 2 * sub : 3 * sub])


@pytest.mark.parametrize("tile", [False, True], ids=["rows", "tiled"])
def test_planes_match_twin_on_both_layouts(tile: bool, rel_err) -> None:
    torch.manual_seed(0)
    n, k, config = 128, 1024, (64, 256, 4, 2)
    weights = layout._weights(n, k, config[0], "cpu")
    x = torch.randn(1, k, dtype=torch.bfloat16)
    words, _, scales, zeros = weights[0]
    ref = x.double() @ qref.dequantize_int4(words.view(torch.uint8), scales, zeros, dtype=torch.float64).T
    out = layout._call(config, x, weights[0], tile, load_only=False)
    assert out.shape == (1, n)
    assert rel_err(out, ref) < layout.TOLERANCE
