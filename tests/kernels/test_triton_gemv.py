"""Triton one-row linear (kernels.gemv.linear) against kernels.reference.linear in float64."""

from __future__ import annotations

import pytest
import torch
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.gemv import GemvConfig, default_gemv_config, linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "n,k,config",
    [
        (24, 64, GemvConfig(block_n=8, block_k=16, stages=1)),
        (20, 96, GemvConfig(block_n=8, block_k=32, stages=3)),  # ragged feature block
        (13, 50, GemvConfig(block_n=4, block_k=16, stages=2)),  # ragged reduction
        (40, 72, None),  # the default: a reduction shorter than one load
    ],
)
def test_one_row_matches_reference(device, dtype, n, k, config, rel_err, tolerance):
    gen = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=gen).to(dtype).to(device)
    x = torch.randn(1, k, generator=gen).to(dtype).to(device)
    bias = torch.randn(n, generator=gen).to(dtype).to(device)
    for b in (None, bias):
        out = linear(x, w, b, config=config)
        assert out.shape == (1, n) and out.dtype == dtype
        expected = ref.linear(x.double(), w.double(), None if b is None else b.double())
        assert rel_err(out, expected) < tolerance[dtype]


def test_a_row_with_a_stride_and_several_rows(device, rel_err):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(16, 32, generator=gen).to(device)
    wide = torch.randn(3, 64, generator=gen).to(device)
    row = wide[1:2, ::2]  # one row whose elements are not adjacent
    assert rel_err(linear(row, w), ref.linear(row.double(), w.double())) < 1e-5
    rows = wide[:, :32]  # several rows: the cuBLAS path, same contract
    assert rel_err(linear(rows, w), ref.linear(rows.double(), w.double())) < 1e-5


def test_rejects_bad_inputs(device):
    w = torch.zeros(8, 32, device=device)
    with pytest.raises(ValueError, match="in_features"):
        linear(torch.zeros(1, 16, device=device), w)
    with pytest.raises(ValueError, match="out_features"):
        linear(torch.zeros(1, 32, device=device), w, torch.zeros(7, device=device))
    with pytest.raises(ValueError, match="dtype"):
        linear(torch.zeros(1, 32, device=device, dtype=torch.bfloat16), w)
    with pytest.raises(ValueError, match="power of two"):
        GemvConfig(block_n=6)


def test_default_config_keeps_enough_programs_for_narrow_layers():
    assert default_gemv_config(896).block_n == 4
    assert default_gemv_config(4096) == GemvConfig(block_n=8, block_k=512)
