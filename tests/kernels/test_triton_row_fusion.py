"""The batch-1 decode fusions (kernels/row_fusion.py) of the one-row linears, bf16/float32
(kernels.gemv.row_linear), per-channel FP8 (kernels.quant_linear.fp8_row_linear) and int4
(kernels.quant_linear.int4_row_linear), against the twin kernels.reference.row_linear."""

from __future__ import annotations

import pytest
import torch
from omni_gateway.kernels import quant_reference as qref
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.gemv import GemvConfig, linear, row_linear
from omni_gateway.kernels.quant_linear import fp8_row_linear, int4_linear, int4_row_linear
from omni_gateway.kernels.quant_tuning import QuantLinearConfig

# (norm, residual, gated, float32 output)
FUSIONS = [
    pytest.param(False, False, False, False, id="plain"),
    pytest.param(True, False, False, False, id="norm"),
    pytest.param(False, True, False, False, id="residual"),
    pytest.param(True, False, True, False, id="norm+gated"),
    pytest.param(False, False, True, False, id="gated"),
    pytest.param(True, False, False, True, id="norm+float32-out"),
]


def _operands(n: int, k: int, dtype: torch.dtype, device: torch.device, norm: bool, residual: bool, gated: bool):
    gen = torch.Generator().manual_seed(n * 31 + k)
    x = (torch.randn(1, k, generator=gen) * 3).to(dtype).to(device)
    bias = torch.randn(n, generator=gen).to(dtype).to(device)
    gamma = (1 + torch.rand(k, generator=gen)).to(dtype).to(device) if norm else None
    features = n // 2 if gated else n
    res = torch.randn(1, features, generator=gen).to(dtype).to(device) if residual else None
    return gen, x, bias, gamma, res


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm,residual,gated,f32_out", FUSIONS)
@pytest.mark.parametrize(
    "n,k,config",
    [
        (32, 64, GemvConfig(block_n=8, block_k=16, stages=2)),
        (36, 80, GemvConfig(block_n=8, block_k=32, stages=1)),  # ragged features and reduction
        (24, 48, GemvConfig(block_n=1, block_k=16, stages=1)),  # gated widens a one-feature block to two
    ],
)
def test_row_linear_matches_twin(device, dtype, norm, residual, gated, f32_out, n, k, config, rel_err):
    # A gated bf16 output is rounded three times (gate, up, their product); Triton's interpreter
    # truncates to bf16 where the GPU rounds to nearest, which doubles each step's error.
    bound = {torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]
    gen, x, bias, gamma, res = _operands(n, k, dtype, device, norm, residual, gated)
    w = torch.randn(n, k, generator=gen).to(dtype).to(device)
    out_dtype = torch.float32 if f32_out else None
    for b in (None, bias):
        kwargs = dict(norm_weight=gamma, eps=1e-5, residual=res, gated=gated, out_dtype=out_dtype)
        out = row_linear(x, w, b, config=config, **kwargs)
        expected = ref.row_linear(x, w, b, **kwargs)
        assert out.shape == expected.shape == (1, n // 2 if gated else n)
        assert out.dtype == expected.dtype == (torch.float32 if f32_out else dtype)
        assert rel_err(out, expected) < bound


def test_fusions_equal_the_unfused_layer(device, rel_err):
    """norm -> linear, linear + residual and silu_and_mul(linear) as the unfused kernels run them."""
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(1, 64, generator=gen, device="cpu").to(device)
    gamma = torch.rand(64, generator=gen).to(device) + 0.5
    w_up = torch.randn(96, 64, generator=gen).to(device)
    w_down = torch.randn(64, 48, generator=gen).to(device)
    act = row_linear(h, w_up, norm_weight=gamma, eps=1e-6, gated=True)
    expected_act = ref.silu_and_mul(linear(ref.rms_norm(h, gamma, 1e-6), w_up))
    assert rel_err(act, expected_act) < 1e-5
    out = row_linear(act, w_down, residual=h)
    assert rel_err(out, linear(expected_act, w_down) + h) < 1e-5


@pytest.mark.parametrize("norm,residual,gated,f32_out", FUSIONS)
@pytest.mark.parametrize(
    "n,k,config",
    [
        (64, 256, QuantLinearConfig(block_n=8, block_k=64, stages=2)),
        # ragged; the reduction splits and the last program runs the epilogue
        (40, 200, QuantLinearConfig(block_n=16, block_k=64, stages=1, split_k=4)),
    ],
)
def test_fp8_row_linear_matches_twin(device, norm, residual, gated, f32_out, n, k, config, rel_err):
    dtype = torch.bfloat16
    gen, x, bias, gamma, res = _operands(n, k, dtype, device, norm, residual, gated)
    q, scale = qref.quantize_fp8_per_channel(torch.randn(n, k, generator=gen).to(device))
    out_dtype = torch.float32 if f32_out else None
    kwargs = dict(norm_weight=gamma, eps=1e-5, residual=res, gated=gated, out_dtype=out_dtype)
    out = fp8_row_linear(x, q, scale, bias, config=config, **kwargs)
    expected = ref.row_linear(x, qref.dequantize_fp8(q, scale, torch.float32).to(device), bias, **kwargs)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert rel_err(out, expected) < 3e-2


@pytest.mark.parametrize("norm,residual,gated,f32_out", FUSIONS)
@pytest.mark.parametrize(
    "n,k,group,tile,config",
    [
        (32, 256, 64, 1, QuantLinearConfig(block_n=8, block_k=128, stages=2)),
        # ragged features and reduction, two sub-tiles a step, the reduction split
        (40, 320, 32, 1, QuantLinearConfig(block_n=16, block_k=64, stages=1, split_k=4)),
        # row tiles of 16 rows, two blocks of features each (a gated block spans two tiles)
        (32, 128, 32, 16, QuantLinearConfig(block_n=8, block_k=64, stages=1)),
    ],
)
def test_int4_row_linear_matches_twin(device, norm, residual, gated, f32_out, n, k, group, tile, config, rel_err):
    dtype = torch.bfloat16
    gen, x, bias, gamma, res = _operands(n, k, dtype, device, norm, residual, gated)
    packed, scales, zeros = (t.to(device) for t in qref.quantize_int4(torch.randn(n, k, generator=gen), group))
    weight = qref.dequantize_int4(packed, scales, zeros, torch.float32)  # from the row layout
    if tile > 1:
        packed = qref.tile_int4(packed, group, tile)
    out_dtype = torch.float32 if f32_out else None
    kwargs = dict(norm_weight=gamma, eps=1e-5, residual=res, gated=gated, out_dtype=out_dtype)
    out = int4_row_linear(x, packed, scales, zeros, bias, config=config, **kwargs)
    expected = ref.row_linear(x, weight, bias, **kwargs)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    assert rel_err(out, expected) < 3e-2


@pytest.mark.parametrize("tile", [1, 8], ids=["rows", "tiles"])
@pytest.mark.parametrize("magnitude", [1.0, 2.0**-30, 2.0**30])
@pytest.mark.parametrize("rows", [1, 2], ids=["planes", "tensor-cores"])
def test_int4_products_are_exact(device, rel_err, rows, magnitude, tile):
    """Every nibble value against every zero point, float32 throughout: the de-quantized products are
    exact, so the kernel meets the float64 product to float32 rounding (on the tensor cores of 2+ rows,
    plus the rounding of the ``1 + zero / 16`` offset's share of the sums). The planes scale the
    activations by up to 2^64 and keep their sums in units of 2^-85: tiny and huge rows stay exact too."""
    k = 256
    # each aligned run of 16 features holds every nibble, shifted per run and per row so that reading
    # another row's or another run's words gives other weights
    feature, row = torch.arange(k)[None, :], torch.arange(32)[:, None]
    q = (feature + 7 * (feature // 16) + 3 * row) % 16
    zeros = (torch.arange(32 * (k // 32)).reshape(32, k // 32) * 7 % 16).to(torch.uint8)
    scales = torch.rand(32, k // 32, generator=torch.Generator().manual_seed(1)) + 0.5
    packed = qref.pack_int4(q.to(torch.uint8))
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(2)) * magnitude
    weight = qref.dequantize_int4(packed, scales, zeros, torch.float64)
    if tile > 1:  # tiles of 8 rows: two in each block of 16 features
        packed = qref.tile_int4(packed, 32, tile)
    config = QuantLinearConfig(block_n=16, block_k=128)
    operands = (x.to(device), packed.to(device), scales.to(device), zeros.to(device))
    out = int4_row_linear(*operands, config=config) if rows == 1 else int4_linear(*operands, config=config)
    assert rel_err(out.cpu(), (x.double() @ weight.T).float()) < (1e-6 if rows == 1 else 4e-6)


def test_rejects_bad_fused_operands(device):
    w = torch.zeros(8, 32, device=device)
    x = torch.zeros(1, 32, device=device)
    with pytest.raises(ValueError, match="one row"):
        row_linear(torch.zeros(2, 32, device=device), w)
    with pytest.raises(ValueError, match="norm_weight: expected in_features = 32"):
        row_linear(x, w, norm_weight=torch.ones(16, device=device))
    with pytest.raises(ValueError, match=r"residual: expected shape \(1, 8\)"):
        row_linear(x, w, residual=torch.zeros(1, 4, device=device))
    with pytest.raises(ValueError, match="takes no residual"):
        row_linear(x, w, gated=True, residual=torch.zeros(1, 4, device=device))
    with pytest.raises(ValueError, match="even out_features"):
        row_linear(x, torch.zeros(7, 32, device=device), gated=True)
    with pytest.raises(ValueError, match="out_dtype"):
        row_linear(x, w, out_dtype=torch.int32)
    q, _ = qref.quantize_fp8_per_channel(torch.ones(128, 128, device=device))
    with pytest.raises(ValueError, match="per-channel"):
        fp8_row_linear(torch.zeros(1, 128, device=device), q, torch.ones(1, 1, device=device))
