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


def test_order_pairs_each_weight_with_its_activation(rel_err, monkeypatch) -> None:
    from omni_gateway.kernels import int4_fragments as fragments

    _, x, packed, scales, zeros = _case(64, 512)
    expected = x.double() @ qref.dequantize_int4(packed, scales, zeros, torch.float64).T
    words = packed.view(torch.int32)
    assert rel_err(fragments.twin(x, words, scales, zeros), expected) < 1e-12
    # the activations in the weights' natural order: the sums no longer match
    monkeypatch.setattr(fragments, "X_ORDER", tuple(range(7)))
    assert rel_err(fragments.twin(x, words, scales, zeros), expected) > 0.1


def test_layouts_refuse_rows_the_warps_cannot_share() -> None:
    from omni_gateway.kernels import int4_fragments as fragments

    with pytest.raises(ValueError, match="multiple of 16 x warps"):
        fragments.layouts(32, 4)


def test_split_divides_the_groups() -> None:
    from omni_gateway.kernels.int4_fragments import split_for

    assert [split_for(g, 128) for g in (1, 7, 9, 11, 32, 48, 64, 112)] == [1, 7, 3, 1, 8, 12, 16, 16]
    assert split_for(32, 4008) == 1  # the row blocks alone fill the GPU


def test_adding_launches_split_finer() -> None:
    """With no split tail, up to 4,096 programs of at least two groups each, and eight splits where the groups
    allow however many row blocks there are."""
    from omni_gateway.kernels.int4_fragments import add_split_for

    assert [add_split_for(g, 128) for g in (1, 3, 4, 7, 32, 112)] == [1, 1, 2, 1, 16, 28]
    assert add_split_for(32, 896) == 8 and add_split_for(32, 4008) == 8 and add_split_for(112, 4096) == 8


SASS = """
import collections, json, torch
from benchmarks.analysis import kernel_sass as ks
from omni_gateway.kernels import int4_fragments as fr
from omni_gateway.kernels.int4_row_epilogue import RotaryWrite
from omni_gateway.kernels.int4_row_stream import GateSums, StreamRow
catcher = ks.LaunchCatcher(fr._fragments_kernel)
fr._fragments_kernel = catcher
n, k = 256, 2048
bf16, f32 = torch.bfloat16, torch.float32
def weights(n, k):
    return (torch.zeros(n // 64, k // 128, 64, 64, dtype=torch.uint8), torch.zeros(n, k // 128, dtype=bf16),
            torch.zeros(n, k // 128, dtype=torch.uint8))
def run(x, out, n=n, k=k, norm=False, **kw):
    kw.setdefault("residual", None)
    kw.setdefault("gated", False)
    fr.launch(x, *weights(n, k), kw.pop("bias", None), out, torch.zeros(64, dtype=torch.int32),
              norm_weight=torch.zeros(k, dtype=bf16) if norm else None, eps=1e-5, **kw)
# the bfloat16 row: plain; gated with the norm in the loop and a bias; with a residual
run(torch.zeros(1, k, dtype=bf16), torch.zeros(1, n, dtype=bf16))
run(torch.zeros(1, k, dtype=bf16), torch.zeros(1, n // 2, dtype=bf16), norm=True, gated=True,
    bias=torch.zeros(n, dtype=bf16))
run(torch.zeros(1, k, dtype=bf16), torch.zeros(1, n, dtype=bf16), residual=torch.zeros(1, n, dtype=bf16))
# the float32 stream: the o projection adding into it, the gate/up projection reading it into GateSums, the down
# projection finishing them into it
run(torch.zeros(1, k, dtype=bf16), StreamRow(torch.zeros(1, n, dtype=f32)))
run(StreamRow(torch.zeros(1, k, dtype=f32)), GateSums(torch.zeros(1, n), torch.zeros(1), k, 1e-5), norm=True,
    gated=True)
run(GateSums(torch.zeros(1, 2 * k), torch.zeros(1), n, 1e-5), StreamRow(torch.zeros(1, n, dtype=f32)))
# a qkv projection of 4 q and 2 x 2 kv heads reading the stream, rotating q and k and writing the cache
d, hq, hkv = 128, 4, 2
cache = torch.zeros(8, 16, hkv, d, dtype=bf16)
rotary = RotaryWrite(torch.zeros(1, dtype=torch.int64), torch.zeros(64, d), cache, cache.clone(),
                     torch.zeros(1, dtype=torch.int64), hq, hkv)
qkv = (hq + 2 * hkv) * d
run(StreamRow(torch.zeros(1, k, dtype=f32)), torch.zeros(1, qkv, dtype=bf16), n=qkv, norm=True, rotary=rotary)
for launch in catcher.launches:
    sass = ks.disassemble(ks.compile_sm90(launch))
    print(json.dumps([collections.Counter(map(ks.opcode, ks.main_loop(sass))),
                      collections.Counter(ks.opcode(i) for _, i in sass)]))
"""


def test_kernel_keeps_weights_in_registers() -> None:
    """Compiled for sm_90 with each fusion: per group, one tensor-core product per 16 x 8 x 16 and one packed
    subtraction per pair of weights. A bfloat16 row's loop touches no shared memory (the operand's layout is
    asserted trivial too); a loop over float32 stream rows loads its group's activations from shared memory,
    staged before the loop, and is as lean as the plain row's otherwise. The launches that add into a float32
    row end in reductions (``red``): no fence and no split counter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", SASS], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    launches = [json.loads(line) for line in run.stdout.strip().splitlines()[-7:]]
    loops = [loop for loop, _ in launches]
    plain, in_loop, residual, adding, gate_up, down, qkv = (sum(c.values()) for c in loops)
    assert plain == residual == adding < in_loop
    # a staged loop reads its activations with four 16-byte shared loads instead of four global ones
    assert all(count <= plain + 6 for count in (gate_up, down, qkv)), (plain, gate_up, down, qkv)
    assert all(loops[i].get("LDG.E.128", 0) == loops[0]["LDG.E.128"] - 4 for i in (4, 5, 6))
    for i, opcodes in enumerate(loops):
        weights = 32 * 128 // 64  # a group of the program's 32 rows over its 64 threads
        assert opcodes["HMMA.16816.F32.BF16"] == weights // 8
        assert weights // 2 <= opcodes["HADD2.BF16_V2"] <= weights // 2 + 2  # + the zero points, per row
        shared = [op for op in opcodes if op.startswith(("LDS", "STS", "SHFL", "BAR"))]
        assert shared == (["LDS.128"] if i in (4, 5, 6) else []), (i, shared)
    for i, (_, kernel) in enumerate(launches):
        fenced = kernel.get("MEMBAR.ALL.GPU", 0) > 0 and kernel.get("ATOMG.E.ADD.STRONG.GPU", 0) == 1
        reduced = kernel.get("REDG.E.ADD.F32.FTZ.RN.STRONG.GPU", 0) > 0
        assert (fenced, reduced) == ((False, True) if i in (3, 4, 5) else (True, False)), (i, kernel)


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
def test_stream_rows_follow_the_unfused_layer(rel_err) -> None:
    """A decode layer's linears over the float32 residual stream (kernels/int4_row_stream.py): the normed
    reads, the o and down projections adding into the stream and the gate/up projection's GateSums, which
    the down projection finishes, give what the bfloat16 rows give with their norms, residual adds and gate
    in the kernel; and the combinations without a kernel name themselves."""
    from omni_gateway.kernels.int4_row_stream import GateSums, StreamRow
    from omni_gateway.kernels.quant_linear import int4_row_linear
    from omni_gateway.kernels.quant_tuning import INT4_GROUPED, tuned_config

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the fragment kernel needs sm_90")
    dev = torch.device("cuda")
    hidden, inter = 512, 384  # gate/up: 768 x 512, split 2 ways; down: 512 x 384, 3 groups unsplit
    gen, h, packed, scales, zeros = _case(2 * inter, hidden, seed=5)
    _, a, packed2, scales2, zeros2 = _case(hidden, inter, seed=6)
    gate_up = (qref.tile_int4(packed, 128).to(dev), scales.to(dev), zeros.to(dev))
    down = (qref.tile_int4(packed2, 128).to(dev), scales2.to(dev), zeros2.to(dev))
    norm = (1 + torch.rand(hidden, generator=gen)).to(torch.bfloat16).to(dev)
    h, a = h.to(dev), a[:, :inter].to(dev)

    # a normed read: the qkv projection or the LM head
    normed = int4_row_linear(StreamRow(h.float()), *gate_up, norm_weight=norm, eps=1e-5)
    assert rel_err(normed, int4_row_linear(h, *gate_up, norm_weight=norm, eps=1e-5)) < 1e-2
    # the MLP: gate/up into GateSums, down finishing them into the stream
    sums = GateSums.zeros(2, inter, hidden, 1e-5, dev)
    assert len(sums) == 2 and all(s.sums.data_ptr() % 128 == 0 for s in sums)
    stream = StreamRow(h.float())
    assert int4_row_linear(stream, *gate_up, norm_weight=norm, eps=1e-5, gated=True, into=sums[1]) is sums[1]
    assert not sums[0].sums.any() and not sums[0].squares.any()
    assert rel_err(sums[1].squares, h.double().square().sum()) < 1e-5
    act = int4_row_linear(h, *gate_up, norm_weight=norm, eps=1e-5, gated=True)
    assert int4_row_linear(sums[1], *down, into=stream) is stream
    expected = int4_row_linear(act, *down, residual=h)
    assert rel_err(stream.row, expected) < 3e-2
    # the o projection: a bfloat16 row added into the stream, split by split
    before = stream.row.clone()
    int4_row_linear(a, *down, into=stream)
    assert rel_err(stream.row - before, int4_row_linear(a, *down).float()) < 1e-2

    bad = [
        dict(x=StreamRow(h.float()), w=gate_up),  # a stream read without its norm
        dict(x=sums[1], w=down, norm_weight=norm[:inter], eps=1e-5),  # GateSums with a norm of their own
        dict(x=a, w=down, into=sums[0]),  # ungated into GateSums
        dict(x=StreamRow(h.float()), w=gate_up, norm_weight=norm, eps=1e-5, gated=True, into=stream),
        dict(x=StreamRow(h.float()), w=gate_up, norm_weight=norm, config=tuned_config(INT4_GROUPED, 1, 768, 512)),
        dict(x=StreamRow(h), w=gate_up, norm_weight=norm),  # a bfloat16 tensor as the stream
    ]
    for case in bad:
        x, w = case.pop("x"), case.pop("w")
        with pytest.raises(ValueError):
            int4_row_linear(x, *w, **case)


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
