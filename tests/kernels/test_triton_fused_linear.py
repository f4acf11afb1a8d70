"""Triton fused_linear against kernels.reference in float64: plain, RMSNorm and SiLU-and-mul
prologues, bias and residual epilogues, ragged shapes, and argument checks."""
from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from kernels.fused_linear import MAX_ROWS, LinearConfig, fused_linear

_SMALL = LinearConfig(block_n=16, block_k=32, num_warps=4, num_stages=1)


def _randn(gen: torch.Generator, *shape: int, dtype: torch.dtype, device: torch.device, scale: float = 1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,n,k", [(1, 48, 96), (3, 40, 80), (16, 16, 32)])
@pytest.mark.parametrize("prologue", ["plain", "norm", "silu_mul"])
def test_matches_reference(device, dtype, rows, n, k, prologue, rel_err, tolerance):
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    x = _randn(gen, rows, 2 * k if prologue == "silu_mul" else k, dtype=dtype, device=device, scale=2.0)
    weight = _randn(gen, n, k, dtype=dtype, device=device, scale=k ** -0.5)
    bias = _randn(gen, n, dtype=dtype, device=device)
    residual = _randn(gen, rows, n, dtype=dtype, device=device, scale=4.0)
    norm_weight = _randn(gen, k, dtype=dtype, device=device) if prologue == "norm" else None
    kwargs = dict(norm_weight=norm_weight, eps=1e-5, silu_mul=prologue == "silu_mul", residual=residual)
    out = fused_linear(x, weight, bias, config=_SMALL, **kwargs)
    expect = ref.fused_linear(x.double(), weight.double(), bias.double(), eps=1e-5,
                              norm_weight=None if norm_weight is None else norm_weight.double(),
                              silu_mul=prologue == "silu_mul", residual=residual.double())
    assert out.shape == (rows, n) and out.dtype == dtype
    assert rel_err(out, expect) < tolerance[dtype]


def test_without_bias_or_residual_is_a_plain_matmul(device, rel_err):
    gen = torch.Generator().manual_seed(3)
    x = _randn(gen, 2, 64, dtype=torch.float32, device=device)
    weight = _randn(gen, 24, 64, dtype=torch.float32, device=device)
    out = fused_linear(x, weight, config=_SMALL)
    assert rel_err(out, x.double() @ weight.double().t()) < 1e-5


def test_rows_of_a_wider_tensor_and_a_strided_residual(device, rel_err):
    # x is a column slice (rows not adjacent), the residual a row-strided view: no copies needed.
    gen = torch.Generator().manual_seed(4)
    wide = _randn(gen, 3, 100, dtype=torch.float32, device=device)
    x = wide[:, 10:74]
    res_wide = _randn(gen, 3, 50, dtype=torch.float32, device=device)
    residual = res_wide[:, :40]
    weight = _randn(gen, 40, 64, dtype=torch.float32, device=device)
    out = fused_linear(x, weight, residual=residual, config=_SMALL)
    assert rel_err(out, x.double() @ weight.double().t() + residual.double()) < 1e-5


def test_norm_uses_the_whole_row(device, rel_err):
    # The norm's sum of squares spans several k-tiles: a large value in the last tile must scale
    # every output, as a one-tile norm would miss it.
    x = torch.ones(1, 96, device=device)
    x[0, -1] = 50.0
    weight = torch.eye(96, device=device)[:32].contiguous()
    norm_weight = torch.ones(96, device=device)
    out = fused_linear(x, weight, norm_weight=norm_weight, eps=1e-6, config=_SMALL)
    expect = ref.rms_norm(x.double(), norm_weight.double(), 1e-6)[:, :32]
    assert rel_err(out, expect) < 1e-5


def test_zero_rows_return_empty(device):
    weight = torch.zeros(16, 32, device=device)
    out = fused_linear(torch.zeros(0, 32, device=device), weight, config=_SMALL)
    assert out.shape == (0, 16)


@pytest.mark.parametrize("case,match", [
    ("too_many_rows", f"at most {MAX_ROWS} rows"),
    ("k_mismatch", "in_features"),
    ("silu_k_mismatch", "2 x in_features"),
    ("both_prologues", "one prologue"),
    ("dtype_mismatch", "expected dtype"),
    ("bias_len", "out_features"),
    ("residual_shape", "residual: expected shape"),
])
def test_rejects_bad_arguments(device, case, match):
    weight = torch.zeros(16, 32, device=device)
    x = torch.zeros(2, 32, device=device)
    kwargs: dict = {}
    if case == "too_many_rows":
        x = torch.zeros(MAX_ROWS + 1, 32, device=device)
    elif case == "k_mismatch":
        x = torch.zeros(2, 31, device=device)
    elif case == "silu_k_mismatch":
        kwargs["silu_mul"] = True
    elif case == "both_prologues":
        kwargs.update(silu_mul=True, norm_weight=torch.ones(32, device=device))
        x = torch.zeros(2, 64, device=device)
    elif case == "dtype_mismatch":
        x = x.to(torch.bfloat16)
    elif case == "bias_len":
        kwargs["bias"] = torch.zeros(15, device=device)
    elif case == "residual_shape":
        kwargs["residual"] = torch.zeros(2, 15, device=device)
    with pytest.raises(ValueError, match=match):
        fused_linear(x, weight, config=_SMALL, **kwargs)
