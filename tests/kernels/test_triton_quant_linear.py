"""Triton weight-only quantized linears (kernels.quant_linear: the decode kernel with and without
split-K, the de-quantizing GEMM, the per-token FP8 activation pass) against their torch twins
(kernels.quant_reference) in float64, the launch-config table, and the quantizers' round trip."""

from __future__ import annotations

import pytest
import torch
from omni_gateway.kernels import quant_reference as qref
from omni_gateway.kernels import quant_tuning
from omni_gateway.kernels.quant_gemm import GemmConfig, quantize_rows_fp8
from omni_gateway.kernels.quant_linear import QuantLinearConfig, fp8_linear, int4_linear


def _data(n: int, k: int, m: int, dtype: torch.dtype, device: torch.device, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    x = torch.randn(m, k, generator=gen).to(dtype).to(device)
    bias = torch.randn(n, generator=gen).to(dtype).to(device)
    return w, x, bias


def _expected(x: torch.Tensor, dequantized: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ dequantized.double().T
    return out if bias is None else out + bias.double()


def _laid_out(packed: torch.Tensor, group: int, tile: int) -> torch.Tensor:
    """``packed`` in row tiles of ``tile`` rows, or as rows for a tile of 1."""
    return packed if tile == 1 else qref.tile_int4(packed, group, tile)


_SMALL = QuantLinearConfig(block_n=16, block_k=32, stages=1)
# Four programs share each output block; the last to finish adds the partial sums.
_SPLIT = QuantLinearConfig(block_n=16, block_k=32, stages=1, split_k=4)
_SMALL_GEMM = GemmConfig(block_m=16, block_n=32, block_k=32, num_warps=4, stages=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize(
    "n,k,config",
    [
        (32, 256, _SMALL),
        (40, 200, _SMALL),  # ragged features and reduction
        (48, 384, None),  # the defaults
        (32, 256, _SPLIT),
        (40, 200, _SPLIT),  # a ragged last split
    ],
)
@pytest.mark.parametrize("blockwise", [False, True])
def test_fp8_matches_reference(device, dtype, rows, n, k, config, blockwise, rel_err, tolerance):
    w, x, bias = _data(n, k, rows, dtype, device, n * k + rows)
    q, scale = qref.quantize_fp8_per_block(w) if blockwise else qref.quantize_fp8_per_channel(w)
    q, scale = q.to(device), scale.to(device)
    deq = qref.dequantize_fp8(q, scale)
    for b in (None, bias):
        out = fp8_linear(x, q, scale, b, config=config)
        assert out.shape == (rows, n) and out.dtype == dtype
        expected = _expected(x, deq, b)
        assert rel_err(out, expected) < tolerance[dtype]
        assert rel_err(qref.fp8_linear(x, q, scale, b), expected) < tolerance[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 8])
@pytest.mark.parametrize(
    "n,k,group,tile",
    [
        (32, 256, 128, 1),
        (40, 192, 64, 1),
        (64, 512, 128, 1),
        (40, 128, 64, 8),  # row tiles: two in a block of 16 features, the last block ragged
        (64, 128, 32, 64),  # one tile over several blocks of features
    ],
)
def test_int4_matches_reference(device, dtype, rows, n, k, group, tile, rel_err, tolerance):
    w, x, bias = _data(n, k, rows, dtype, device, n + k + rows)
    packed, scales, zeros = (t.to(device) for t in qref.quantize_int4(w.to(dtype), group))
    deq = qref.dequantize_int4(packed, scales, zeros)  # from the row layout
    packed = _laid_out(packed, group, tile)
    for b, config in ((None, _SMALL), (bias, None), (bias, _SPLIT)):
        out = int4_linear(x, packed, scales, zeros, b, config=config)
        assert out.shape == (rows, n) and out.dtype == dtype
        expected = _expected(x, deq, b)
        assert rel_err(out, expected) < tolerance[dtype]
        assert rel_err(qref.int4_linear(x, packed, scales, zeros, b), expected) < tolerance[dtype]


@pytest.mark.parametrize("rows", [17, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_many_rows_run_the_dequantizing_gemm(device, rows, dtype, rel_err, tolerance):
    """Past 16 rows the weight tiles are de-quantized inside a GEMM (ragged rows, features and K)."""
    w, x, bias = _data(72, 192, rows, dtype, device, rows)
    q, scale = (t.to(device) for t in qref.quantize_fp8_per_block(w))
    expected = _expected(x, qref.dequantize_fp8(q, scale), bias)
    assert rel_err(fp8_linear(x, q, scale, bias, gemm_config=_SMALL_GEMM), expected) < tolerance[dtype]
    q, scale = (t.to(device) for t in qref.quantize_fp8_per_channel(w))
    expected = _expected(x, qref.dequantize_fp8(q, scale), bias)
    weight_only = QuantLinearConfig(scaled_mm=False)
    assert (
        rel_err(fp8_linear(x, q, scale, bias, config=weight_only, gemm_config=_SMALL_GEMM), expected) < tolerance[dtype]
    )
    w = w[:, :128]
    x = x[:, :128]
    packed, scales, zeros = (t.to(device) for t in qref.quantize_int4(w.to(dtype), 64))
    expected = _expected(x, qref.dequantize_int4(packed, scales, zeros), bias)
    # row tiles of 24 rows: not a power of two, and straddling the GEMM's blocks of 32 features
    for tile in (1, 24):
        out = int4_linear(x, _laid_out(packed, 64, tile), scales, zeros, bias, gemm_config=_SMALL_GEMM)
        assert rel_err(out, expected) < tolerance[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_rows_dequantize_once_then_matmul(device, dtype, rel_err, tolerance):
    """Past 64 rows, with no GEMM config given, one de-quantize pass feeds F.linear (ragged N and K)."""
    w, x, bias = _data(72, 320, 70, dtype, device, 70)
    for q, scale in (qref.quantize_fp8_per_block(w), qref.quantize_fp8_per_channel(w)):
        q, scale = q.to(device), scale.to(device)
        out = fp8_linear(x, q, scale, bias, config=QuantLinearConfig(scaled_mm=False))
        assert rel_err(out, _expected(x, qref.dequantize_fp8(q, scale), bias)) < tolerance[dtype]
    packed, scales, zeros = (t.to(device) for t in qref.quantize_int4(w.to(dtype), 64))
    expected = _expected(x, qref.dequantize_int4(packed, scales, zeros), bias)
    for tile in (1, 8):  # the scratch weight is row-major whatever the layout
        assert rel_err(int4_linear(x, _laid_out(packed, 64, tile), scales, zeros, bias), expected) < tolerance[dtype]


def test_max_dot_rows_moves_the_switch_to_the_gemm(device, rel_err):
    w, x, _ = _data(32, 128, 5, torch.float32, device, 7)
    q, scale = (t.to(device) for t in qref.quantize_fp8_per_channel(w))
    packed, scales, zeros = (t.to(device) for t in qref.quantize_int4(w))
    few = QuantLinearConfig(max_dot_rows=4)
    assert rel_err(fp8_linear(x, q, scale, config=few), _expected(x, qref.dequantize_fp8(q, scale), None)) < 1e-5
    expected = _expected(x, qref.dequantize_int4(packed, scales, zeros), None)
    assert rel_err(int4_linear(x, packed, scales, zeros, config=few), expected) < 1e-5


def test_per_token_fp8_activations_match_the_twin(device):
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(6, 300, generator=gen) * torch.logspace(-3, 2, 6)[:, None]).to(torch.bfloat16).to(device)
    x[2] = 0  # an all-zero row keeps a finite scale
    q, scale = quantize_rows_fp8(x)
    ref_q, ref_scale = qref.quantize_fp8_per_token(x)
    assert q.dtype == qref.FP8_DTYPE and scale.shape == (6, 1)
    torch.testing.assert_close(scale, ref_scale, rtol=1e-6, atol=0)
    if device.type == "cuda":
        # Triton's interpreter rounds float32 to e4m3 wrongly at binade edges (125.2 -> 64), so the
        # codes are compared where the hardware converts; a tie may round either way.
        assert (q.float() - ref_q.float()).abs().le(ref_q.float().abs() / 8 + 2**-9).all()
        assert (q.float().abs().amax(dim=1)[[0, 1, 3, 4, 5]] == qref.FP8_MAX).all()
    assert (q.float()[2] == 0).all()


def test_fp8_dynamic_twin_is_w8a8():
    """The twin of the FP8 tensor-core path: within e4m3's activation rounding of the weight-only product."""
    gen = torch.Generator().manual_seed(9)
    w, x = torch.randn(64, 256, generator=gen) * 0.05, torch.randn(40, 256, generator=gen).to(torch.bfloat16)
    q, scale = qref.quantize_fp8_per_channel(w)
    bias = torch.randn(64, generator=gen).to(torch.bfloat16)
    out = qref.fp8_linear_dynamic(x, q, scale, bias)
    exact = x.double() @ qref.dequantize_fp8(q, scale, torch.float64).T + bias.double()
    err = float((out.double() - exact).norm() / exact.norm())
    assert out.dtype == torch.bfloat16 and 1e-4 < err < 5e-2


def test_tuned_table_and_fallback():
    assert quant_tuning.rows_bucket(1) == 1 and quant_tuning.rows_bucket(3) == 4 and quant_tuning.rows_bucket(9) == 16
    for (fmt, rows, n, k), values in quant_tuning._TUNED.items():
        config = quant_tuning.tuned_config(fmt, rows, n, k)
        assert (config.block_n, config.block_k, config.num_warps, config.stages, config.split_k) == values
        assert rows == 1 or config.block_n >= 16  # tl.dot's minimum
    for (n, k), values in quant_tuning._TUNED_INT4_DOT.items():
        for rows in (2, 3, 9, 16):  # one entry for every 2-16-row bucket
            config = quant_tuning.tuned_config(quant_tuning.INT4_GROUPED, rows, n, k)
            assert (config.block_n, config.block_k, config.num_warps, config.stages, config.split_k) == values
            assert config.block_n >= 16
        assert quant_tuning.tuned_config(quant_tuning.INT4_GROUPED, 1, n, k) != config
    # An untuned shape with few output blocks splits the reduction to fill the SMs; a wide one does not.
    assert quant_tuning.tuned_config(0, 1, 1000, 8192).split_k > 1
    assert quant_tuning.tuned_config(0, 1, 100_000, 1024).split_k == 1
    assert quant_tuning.tuned_config(2, 8, 999, 512).block_n >= 16


def test_quantizers_round_trip():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(130, 260, generator=gen)
    for q, scale in (qref.quantize_fp8_per_channel(w), qref.quantize_fp8_per_block(w)):
        # e4m3 keeps 3 mantissa bits (a relative rounding error of at most 2^-4), and below 2^-6 it
        # steps by 2^-9 (an absolute error of at most half that, times the scale).
        bound = w.abs() / 16 + qref.fp8_scale_per_element(scale, *w.shape) * 2**-10 + 1e-7
        assert ((qref.dequantize_fp8(q, scale) - w).abs() <= bound).all()
    assert qref.quantize_fp8_per_block(w)[1].shape == (2, 3)
    w = w[:, :256]
    packed, scales, zeros = qref.quantize_int4(w, 128)
    assert packed.shape == (130, 128) and scales.shape == zeros.shape == (130, 2)
    assert torch.equal(qref.pack_int4(qref.unpack_int4(packed)), packed)
    # Round to nearest: at most half a step from the original, the step being the group's scale.
    step = scales.float().repeat_interleave(128, dim=1)
    assert ((qref.dequantize_int4(packed, scales, zeros) - w).abs() <= step / 2 + 1e-6).all()
    sym_packed, sym_scales, sym_zeros = qref.quantize_int4(w, 128, symmetric=True)
    assert (sym_zeros == 8).all()


def test_int4_row_tiles_hold_each_groups_rows_together():
    gen = torch.Generator().manual_seed(4)
    packed = torch.randint(0, 256, (128, 256), dtype=torch.uint8, generator=gen)  # N = 128, K = 512
    tiles = qref.tile_int4(packed, 128)
    assert tiles.shape == (2, 4, qref.INT4_ROW_TILE, 64) and tiles.is_contiguous()
    # [i, g, r, b] is row i * T + r, byte g * G / 2 + b of the row layout
    i, g, r, b = torch.meshgrid(*(torch.arange(d) for d in tiles.shape), indexing="ij")
    assert torch.equal(tiles, packed[i * 64 + r, g * 64 + b])
    # tile (1, 2), rows 64-127 of group 2, is one run of 4 KB
    assert torch.equal(tiles.flatten()[6 * 4096 : 7 * 4096].view(64, 64), packed[64:, 128:192])
    assert torch.equal(qref.untile_int4(tiles), packed) and qref.untile_int4(packed) is packed
    assert torch.equal(qref.untile_int4(qref.tile_int4(packed, 16, 8)), packed)
    scales = torch.rand(128, 4, generator=gen) + 0.5
    zeros = torch.randint(0, 16, (128, 4), dtype=torch.uint8, generator=gen)
    assert torch.equal(qref.dequantize_int4(tiles, scales, zeros), qref.dequantize_int4(packed, scales, zeros))
    with pytest.raises(ValueError, match=r"multiple of 64 rows and .* got \[N, K\] = \[40, 512\]"):
        qref.tile_int4(packed[:40], 128)
    with pytest.raises(ValueError, match=r"multiple of group_size 96, got \[N, K\] = \[128, 512\]"):
        qref.tile_int4(packed, 96)
    with pytest.raises(ValueError, match=r"expected the row layout \[N, K / 2\], got shape \(2, 4, 64, 64\)"):
        qref.tile_int4(tiles, 128)
    with pytest.raises(ValueError, match="row tiles of 64 weights a row .* do not match the scales' group of 128"):
        qref.dequantize_int4(qref.tile_int4(packed, 64), scales, zeros)


def test_rejects_bad_inputs(device):
    q = torch.zeros(32, 128, device=device).to(qref.FP8_DTYPE)
    x = torch.zeros(1, 128, device=device)
    with pytest.raises(ValueError, match="in_features"):
        fp8_linear(torch.zeros(1, 64, device=device), q, torch.ones(32, device=device))
    with pytest.raises(ValueError, match="per-channel"):
        fp8_linear(x, q, torch.ones(31, device=device))
    with pytest.raises(ValueError, match="per-block shape"):
        fp8_linear(x, q, torch.ones(2, 2, device=device))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_linear(x, torch.zeros(32, 128, device=device), torch.ones(32, device=device))
    packed = torch.zeros(32, 64, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match="zeros"):
        int4_linear(x, packed, torch.ones(32, 1, device=device), torch.zeros(32, 2, dtype=torch.uint8, device=device))
    with pytest.raises(ValueError, match="K / group"):
        int4_linear(x, packed, torch.ones(32, 3, device=device), torch.zeros(32, 3, dtype=torch.uint8, device=device))
    with pytest.raises(ValueError, match="group size"):  # 128 / 16 = 8 elements per group
        int4_linear(x, packed, torch.ones(32, 16, device=device), torch.zeros(32, 16, dtype=torch.uint8, device=device))
    scales, zeros = torch.ones(32, 2, device=device), torch.zeros(32, 2, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match=r"packed: expected rows \[N, K / 2\] or row tiles .* got shape \(2, 16, 64\)"):
        int4_linear(x, packed.view(2, 16, 64), scales, zeros)
    tiles = qref.tile_int4(packed, 32, 16)  # [2, 4, 16, 16]: groups of 32, where the scales say 64
    with pytest.raises(ValueError, match=r"row tiles of 32 bytes a row \(the scales' group of 64\), got shape"):
        int4_linear(x, tiles, scales, zeros)
    with pytest.raises(ValueError, match=r"scales: expected \[32, K / group\]"):  # 2 tiles of 16 rows
        int4_linear(x, tiles, torch.ones(64, 4, device=device), torch.zeros(64, 4, dtype=torch.uint8, device=device))
    with pytest.raises(ValueError, match=">= 16"):
        fp8_linear(
            torch.zeros(2, 128, device=device), q, torch.ones(32, device=device), config=QuantLinearConfig(block_n=8)
        )
    with pytest.raises(ValueError, match="power of two"):
        QuantLinearConfig(block_k=48)
    with pytest.raises(ValueError, match="max_dot_rows"):
        QuantLinearConfig(max_dot_rows=17)
