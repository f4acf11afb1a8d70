"""The one-row int4 tensor-core kernel (kernels/int4_fragments.py): its reduction order pairs each weight with
its own activation (the torch twin, on the CPU); compiled for sm_90 without a GPU, every fusion keeps the
weights in registers; on a GPU, ``int4_row_linear`` takes it for tiled bfloat16 rows and meets the twin of
the unfused layer with every fusion, split or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from omni_gateway.kernels import quant_reference as qref
from omni_gateway.kernels import reference as ref


def _case(n: int, k: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, k, generator=gen).to(torch.bfloat16)
    packed, scales, zeros = qref.quantize_int4(torch.randn(n, k, generator=gen), 128)
    return gen, x, packed, scales.to(torch.bfloat16), zeros


def test_order_pairs_each_weight_with_its_activation(rel_err) -> None:
    from omni_gateway.kernels import int4_fragments as fragments

    _, x, packed, scales, zeros = _case(64, 512)
    expected = x.double() @ qref.dequantize_int4(packed, scales, zeros, torch.float64).T
    words = packed.view(torch.int32)
    assert rel_err(fragments.twin(x, words, scales, zeros), expected) < 1e-12
    natural = fragments.X_ORDER  # the activations in the weights' natural order: the sums no longer match
    try:
        fragments.X_ORDER = tuple(range(7))
        assert rel_err(fragments.twin(x, words, scales, zeros), expected) > 0.1
    finally:
        fragments.X_ORDER = natural


def test_layouts_refuse_rows_the_warps_cannot_share() -> None:
    from omni_gateway.kernels import int4_fragments as fragments

    with pytest.raises(ValueError, match="multiple of 16 x warps"):
        fragments.layouts(32, 4)


def test_split_divides_the_groups() -> None:
    from omni_gateway.kernels.int4_fragments import split_for

    assert [split_for(g, 128) for g in (1, 7, 9, 11, 32, 48, 64, 112)] == [1, 7, 3, 1, 8, 12, 16, 16]
    assert split_for(32, 4008) == 1  # the row blocks alone fill the GPU


SASS = """
import collections, json, torch
from benchmarks import kernel_sass as ks
from omni_gateway.kernels import int4_fragments as fr
from omni_gateway.kernels.int4_row_epilogue import RotaryWrite
catcher = ks.LaunchCatcher(fr._fragments_kernel)
fr._fragments_kernel = catcher
n, k = 256, 2048
# (gated, norm, residual, bias, folded): plain; the norm in the loop; the norm folded in, and writing the next
cases = [(False, False, False, False, False), (True, True, False, True, False), (False, True, True, False, False),
         (True, True, False, False, True), (False, False, True, False, True)]
for gated, norm, residual, bias, folded in cases:
    out = torch.zeros(1, n // 2 if gated else n, dtype=torch.bfloat16)
    fr.launch(torch.zeros(1, k, dtype=torch.bfloat16), torch.zeros(n // 64, k // 128, 64, 64, dtype=torch.uint8),
              torch.zeros(n, k // 128, dtype=torch.bfloat16), torch.zeros(n, k // 128, dtype=torch.uint8),
              torch.zeros(n, dtype=torch.bfloat16) if bias else None, out, torch.zeros(64, dtype=torch.int32),
              norm_weight=torch.zeros(k, dtype=torch.bfloat16) if norm else None, eps=1e-5,
              residual=torch.zeros(1, n, dtype=torch.bfloat16) if residual else None, gated=gated,
              squares=torch.zeros(k // 32) if folded and norm else None,
              next_norm=torch.zeros(n, dtype=torch.bfloat16) if folded and residual else None)
# a qkv projection of 4 q and 2 x 2 kv heads that rotates q and k and writes the cache in its epilogue
d, hq, hkv = 128, 4, 2
cache = torch.zeros(8, 16, hkv, d, dtype=torch.bfloat16)
rotary = RotaryWrite(torch.zeros(1, dtype=torch.int64), torch.zeros(64, d), cache, cache.clone(),
                        torch.zeros(1, dtype=torch.int64), hq, hkv)
qkv = (hq + 2 * hkv) * d
fr.launch(torch.zeros(1, k, dtype=torch.bfloat16), torch.zeros(qkv // 64, k // 128, 64, 64, dtype=torch.uint8),
          torch.zeros(qkv, k // 128, dtype=torch.bfloat16), torch.zeros(qkv, k // 128, dtype=torch.uint8), None,
          torch.zeros(1, qkv, dtype=torch.bfloat16), torch.zeros(64, dtype=torch.int32),
          norm_weight=torch.zeros(k, dtype=torch.bfloat16), eps=1e-5, residual=None, gated=False,
          squares=torch.zeros(k // 32), rotary=rotary)
for launch in catcher.launches:
    loop = ks.main_loop(ks.disassemble(ks.compile_sm90(launch)))
    print(json.dumps(collections.Counter(map(ks.opcode, loop))))
"""


def test_kernel_keeps_weights_in_registers() -> None:
    """Compiled for sm_90 with each fusion: per group, one tensor-core product per 16 x 8 x 16 and one packed
    subtraction per pair of weights, and nothing through shared memory (the operand's layout is asserted
    trivial too). A norm folded into the linear before leaves the loop as lean as no norm at all, and so does
    the rotary epilogue of a qkv projection."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", SASS], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    loops = [json.loads(line) for line in run.stdout.strip().splitlines()[-6:]]
    plain, in_loop, _, folded, writing, rotating = (sum(c.values()) for c in loops)
    assert folded == writing == rotating == plain < in_loop
    for opcodes in loops:
        weights = 32 * 128 // 64  # a group of the program's 32 rows over its 64 threads
        assert opcodes["HMMA.16816.F32.BF16"] == weights // 8
        assert weights // 2 <= opcodes["HADD2.BF16_V2"] <= weights // 2 + 2  # + the zero points, per row
        assert not [op for op in opcodes if op.startswith(("LDS", "STS", "SHFL", "BAR"))]


# (norm, residual, gated, float32 output, bias)
FUSIONS = [
    pytest.param(False, False, False, False, False, id="plain"),
    pytest.param(False, False, False, False, True, id="bias"),
    pytest.param(True, False, False, False, False, id="norm"),
    pytest.param(False, True, False, False, False, id="residual"),
    pytest.param(True, False, True, False, False, id="norm+gated"),
    pytest.param(True, False, False, True, True, id="norm+float32-out+bias"),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("norm,residual,gated,f32_out,bias", FUSIONS)
@pytest.mark.parametrize("split", [True, False])
def test_fused_row_matches_twin(norm, residual, gated, f32_out, bias, split, rel_err) -> None:
    _check_fused_row(192, 1024, norm, residual, gated, f32_out, bias, split, rel_err)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("norm,residual", [(True, False), (False, True)])
def test_long_row_splits_sixteen_ways(norm, residual, rel_err) -> None:
    """64 groups split 16 ways: the norm's sums of squares come from every split."""
    from omni_gateway.kernels.int4_fragments import split_for

    assert split_for(64, 4) == 16
    _check_fused_row(128, 8192, norm, residual, False, False, False, True, rel_err)


def _check_fused_row(n, k, norm, residual, gated, f32_out, bias, split, rel_err) -> None:
    from omni_gateway.kernels import int4_fragments as fragments
    from omni_gateway.kernels import quant_gemv
    from omni_gateway.kernels.quant_linear import int4_row_linear

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the fragment kernel needs sm_90")
    gen, x, packed, scales, zeros = _case(n, k, seed=n + k)
    features = n // 2 if gated else n
    dev = torch.device("cuda")
    operands = dict(
        norm_weight=(1 + torch.rand(k, generator=gen)).to(torch.bfloat16).to(dev) if norm else None,
        eps=1e-5,
        residual=torch.randn(1, features, generator=gen).to(torch.bfloat16).to(dev) if residual else None,
        gated=gated,
    )
    b = torch.randn(n, generator=gen).to(torch.bfloat16).to(dev) if bias else None
    tiled = qref.tile_int4(packed, 128).to(dev)
    x, scales, zeros = x.to(dev), scales.to(dev), zeros.to(dev)
    assert fragments.supported(x, tiled, 128) and not fragments.supported(x, packed.to(dev), 128)
    out_dtype = torch.float32 if f32_out else None
    weight = qref.dequantize_int4(packed, scales.cpu(), zeros.cpu(), torch.float32).to(dev)
    expected = ref.row_linear(x, weight, b, out_dtype=out_dtype, **operands)
    if split:
        out = int4_row_linear(x, tiled, scales, zeros, b, out_dtype=out_dtype, **operands)
    else:
        out = torch.empty_like(expected)
        fragments.launch(x, tiled, scales, zeros, b, out, None, **operands)
    assert out.shape == expected.shape == (1, features) and out.dtype == expected.dtype
    assert rel_err(out, expected) < (3e-2 if gated else 1e-2)
    # the planes on the row layout agree too, and the counters are left zeroed for the next launch
    planes = int4_row_linear(x, packed.to(dev), scales, zeros, b, out_dtype=out_dtype, **operands)
    assert rel_err(out, planes) < (3e-2 if gated else 1e-2)
    assert not quant_gemv._locks[x.device][:8].any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("gated", [False, True])
def test_norm_folds_into_the_linear_before(gated, rel_err) -> None:
    """A residual-adding linear given ``next_norm`` hands the next normed linear its scaled input and squares:
    exactly the rounding that linear's own loop does, and the same output as normalizing in its loop. Where
    the writer runs the planes, the row carries no fold and the reader normalizes itself."""
    from omni_gateway.kernels.int4_row_epilogue import NormedRow
    from omni_gateway.kernels.quant_linear import int4_row_linear
    from omni_gateway.kernels.quant_tuning import INT4_GROUPED, tuned_config

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the fragment kernel needs sm_90")
    dev = torch.device("cuda")
    k, n = 512, 256  # the writer: k -> n features, split 4 ways; the reader: n -> 384
    gen, x, packed, scales, zeros = _case(n, k, seed=7)
    _, _, packed2, scales2, zeros2 = _case(384, n, seed=8)
    writer = (qref.tile_int4(packed, 128).to(dev), scales.to(dev), zeros.to(dev))
    reader = (qref.tile_int4(packed2, 128).to(dev), scales2.to(dev), zeros2.to(dev))
    residual = torch.randn(1, n, generator=gen).to(torch.bfloat16).to(dev)
    norm = (1 + torch.rand(n, generator=gen)).to(torch.bfloat16).to(dev)
    x = x.to(dev)

    row = int4_row_linear(x, *writer, residual=residual, next_norm=norm)
    plain = int4_row_linear(x, *writer, residual=residual)
    assert isinstance(row, NormedRow) and row.given_to(norm) and not row.given_to(norm.clone())
    assert torch.equal(row.hidden, plain)
    assert torch.equal(row.scaled, (plain.float() * norm.float()).to(torch.bfloat16))
    assert row.squares.shape == (n // 32,)
    assert rel_err(row.squares.sum(), plain.double().square().sum()) < 1e-5

    folded = int4_row_linear(row, *reader, norm_weight=norm, eps=1e-5, gated=gated)
    in_loop = int4_row_linear(plain, *reader, norm_weight=norm, eps=1e-5, gated=gated)
    assert folded.shape == in_loop.shape == (1, 192 if gated else 384)
    assert rel_err(folded, in_loop) < 1e-2  # one row-scale rounding apart, at most one bf16 ulp
    assert (folded.float() - in_loop.float()).abs().max() <= in_loop.float().abs().max() * 2**-7

    planes = int4_row_linear(x, *writer, residual=residual, next_norm=norm, config=tuned_config(INT4_GROUPED, 1, n, k))
    assert isinstance(planes, NormedRow) and planes.scaled is None and not planes.given_to(norm)
    from_planes = int4_row_linear(planes, *reader, norm_weight=norm, eps=1e-5, gated=gated)
    assert rel_err(from_planes, in_loop) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("slot", [37, -1])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_rotary_epilogue_matches_rotary_write_kv(slot, cache_dtype, rel_err) -> None:
    """A qkv projection given ``rotary`` returns q rotated and puts the token's rotated k and its v in the
    caches' slot, as the unfused projection followed by ``rotary_write_kv`` does; a padding token (slot -1)
    writes nothing. Where the epilogue cannot (the planes run the projection, an fp8 cache), the rotary kernel
    finishes it the same way."""
    from omni_gateway.kernels.int4_row_epilogue import RotaryWrite
    from omni_gateway.kernels.quant_linear import int4_row_linear
    from omni_gateway.kernels.quant_tuning import INT4_GROUPED, tuned_config
    from omni_gateway.kernels.rotary import rotary_write_kv

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the fragment kernel needs sm_90")
    dev = torch.device("cuda")
    d, hq, hkv, k = 128, 4, 2, 512
    n = (hq + 2 * hkv) * d
    gen, x, packed, scales, zeros = _case(n, k, seed=11)
    weight = (qref.tile_int4(packed, 128).to(dev), scales.to(dev), zeros.to(dev))
    x, norm = x.to(dev), (1 + torch.rand(k, generator=gen)).to(torch.bfloat16).to(dev)
    table = torch.randn(64, d, generator=gen).to(dev)
    positions, slots = torch.tensor([29], device=dev), torch.tensor([slot], device=dev)

    def caches():
        return tuple(torch.zeros(4, 16, hkv, d, device=dev).to(cache_dtype) for _ in range(2))

    qkv = int4_row_linear(x, *weight, norm_weight=norm, eps=1e-5)
    q, kk, v = (t.view(1, -1, d) for t in qkv.split((hq * d, hkv * d, hkv * d), dim=-1))
    ref_k, ref_v = caches()
    ref_q = rotary_write_kv(q, kk, v, positions, table, ref_k, ref_v, slots).view(1, -1)
    for config in (None, tuned_config(INT4_GROUPED, 1, n, k)):
        k_cache, v_cache = caches()
        rotary = RotaryWrite(positions, table, k_cache, v_cache, slots, hq, hkv)
        out = int4_row_linear(x, *weight, norm_weight=norm, eps=1e-5, rotary=rotary, config=config)
        assert rel_err(out[:, : hq * d], ref_q) < 1e-2
        assert (out[:, : hq * d] - ref_q).abs().max() <= ref_q.abs().max() * 2**-7
        # the planes sum in another order: a bf16 ulp apart, which an fp8 cache can round a step (2^-3) apart
        tol = 1e-2 if cache_dtype == torch.bfloat16 or config is None else 6e-2
        for got, expected in ((k_cache.float(), ref_k.float()), (v_cache.float(), ref_v.float())):
            assert rel_err(got, expected) < tol if slot >= 0 else not got.any()
    if slot >= 0:
        assert ref_k.float().view(-1, hkv, d)[slot].any() and ref_v.float().view(-1, hkv, d)[slot].any()
