"""An float8_e4m3fn KV cache (``--kv-cache-dtype fp8``): the Triton cache write and the decode and
prefill attention kernels reading it, against the torch twins (which the CPU engine runs)."""

from __future__ import annotations

import math

import pytest
import torch
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.attention_config import DecodeConfig
from omni_gateway.kernels.paged_decode import paged_decode_attention
from omni_gateway.kernels.paged_prefill import paged_prefill_attention
from omni_gateway.kernels.rotary import rotary_write_kv

FP8 = torch.float8_e4m3fn
PAGE = 16
SPLIT = DecodeConfig(block_n=32, num_warps=4, num_stages=2, target_programs=64, min_split_tokens=32)


def _fp8_cache(lens: list[int], hkv: int, d: int, device: torch.device, gen: torch.Generator):
    need = [math.ceil(n / PAGE) for n in lens]
    perm = torch.randperm(sum(need) + 2, generator=gen)
    tables = torch.zeros(len(lens), max(need) + 1, dtype=torch.int32)
    pos = 0
    for b, n in enumerate(need):
        tables[b, :n] = perm[pos : pos + n].to(torch.int32)
        pos += n
    shape = (sum(need) + 2, PAGE, hkv, d)
    k_cache = (torch.randn(shape, generator=gen) * 2).to(FP8)
    v_cache = (torch.randn(shape, generator=gen) * 2).to(FP8)
    return k_cache.to(device), v_cache.to(device), tables.to(device)


@pytest.mark.parametrize("config", [None, SPLIT], ids=["default", "split"])
def test_decode_reads_an_fp8_cache(device, config, rel_err, tolerance):
    gen = torch.Generator().manual_seed(5)
    lens = [3, 40, 77]
    k_cache, v_cache, tables = _fp8_cache(lens, 2, 64, device, gen)
    q = torch.randn(3, 4, 64, generator=gen).to(torch.bfloat16).to(device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = paged_decode_attention(q, k_cache, v_cache, seq_lens, tables, 0.125, config=config)
    # The float64 spec over the cache's exact values, and the CPU twin (which upcasts the same way).
    expected = ref.paged_decode_attention(q.double(), k_cache.double(), v_cache.double(), seq_lens, tables, 0.125)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, expected) < tolerance[torch.bfloat16]
    twin = ref.paged_decode_attention(q, k_cache, v_cache, seq_lens, tables, 0.125)
    assert rel_err(twin, expected) < tolerance[torch.bfloat16]


def test_prefill_reads_an_fp8_cache(device, rel_err, tolerance):
    gen = torch.Generator().manual_seed(6)
    lens, q_lens = [20, 33], [20, 5]
    k_cache, v_cache, tables = _fp8_cache(lens, 2, 64, device, gen)
    q = torch.randn(sum(q_lens), 4, 64, generator=gen).to(torch.bfloat16).to(device)
    cu = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = paged_prefill_attention(q, k_cache, v_cache, cu, seq_lens, tables, 0.125)
    expected = ref.paged_prefill_attention(q.double(), k_cache.double(), v_cache.double(), cu, seq_lens, tables, 0.125)
    assert rel_err(out, expected) < tolerance[torch.bfloat16]
    assert rel_err(ref.paged_prefill_attention(q, k_cache, v_cache, cu, seq_lens, tables, 0.125), expected) < 1e-2


def test_cache_write_rounds_to_fp8_and_saturates(device):
    gen = torch.Generator().manual_seed(7)
    tokens, hq, hkv, d = 5, 4, 2, 32
    q = torch.randn(tokens, hq, d, generator=gen).to(device)
    k = (torch.randn(tokens, hkv, d, generator=gen) * 4).to(device)
    v = (torch.randn(tokens, hkv, d, generator=gen) * 4).to(device)
    k[1, 0, :4] = 1000.0  # past e4m3's largest finite value
    v[3, 1, 3] = -1e5
    positions = torch.arange(tokens, device=device) * 3
    angles = torch.arange(32, dtype=torch.float32)[:, None] * torch.linspace(0.1, 1.0, d // 2)[None, :]
    cos_sin = torch.cat((angles.cos(), angles.sin()), dim=1).to(device)
    slots = torch.tensor([0, 17, -1, 3, 30], device=device)
    caches = [torch.zeros(2, PAGE, hkv, d, dtype=FP8, device=device) for _ in range(4)]
    rotary_write_kv(q, k, v, positions, cos_sin, caches[0], caches[1], slots)
    ref.rotary_write_kv(q, k, v, positions, cos_sin, caches[2], caches[3], slots)
    _, k_rot = ref.apply_rotary(q.double(), k.double(), positions, cos_sin.double())
    for got_k, got_v in ((caches[0], caches[1]), (caches[2], caches[3])):
        flat_k, flat_v = got_k.view(-1, hkv, d).double(), got_v.view(-1, hkv, d).double()
        assert not flat_k.isnan().any() and not flat_v.isnan().any()
        for t, slot in enumerate(slots.tolist()):
            if slot < 0:
                continue
            exact_k, exact_v = k_rot[t].clamp(-448, 448), v[t].double().clamp(-448, 448)
            # e4m3: a relative rounding error of at most 2^-4 (plus 2^-10 in the subnormal range).
            assert ((flat_k[slot] - exact_k).abs() <= exact_k.abs() / 16 + 2**-10).all()
            assert ((flat_v[slot] - exact_v).abs() <= exact_v.abs() / 16 + 2**-10).all()
        assert flat_k[17, 0, :4].abs().max() <= 448 and flat_v.abs().max() == 448
    assert caches[1].view(-1, hkv, d)[17].double().abs().max() > 0 and (caches[1].view(-1, hkv, d)[5] == 0).all()


def test_mismatched_caches_are_rejected(device):
    q = torch.zeros(1, 2, 32, dtype=torch.bfloat16, device=device)
    k_cache = torch.zeros(2, PAGE, 1, 32, dtype=FP8, device=device)
    v_cache = torch.zeros(2, PAGE, 1, 32, dtype=torch.bfloat16, device=device)
    tables = torch.zeros(1, 1, dtype=torch.int32, device=device)
    lens = torch.ones(1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="float8_e4m3fn for both caches"):
        paged_decode_attention(q, k_cache, v_cache, lens, tables, 1.0)


@pytest.mark.slow
def test_triton_runner_with_an_fp8_cache_matches_the_torch_one(device: torch.device, tmp_path) -> None:
    """The whole model over an fp8 cache: the Triton kernels (write, prefill chunks, decodes) and the
    torch twins store and read the same e4m3 values, so greedy tokens agree."""
    from omni_gateway.engine.config import EngineConfig
    from omni_gateway.engine.runner.loader import load_model
    from omni_gateway.engine.runner.model_runner import ModelRunner

    from tests.harness.checkpoints import save_tiny_checkpoint
    from tests.harness.runner_driver import RunnerDriver, greedy_seq

    save_tiny_checkpoint("llama", tmp_path)
    gen = torch.Generator().manual_seed(8)
    prompts = [torch.randint(2, 300, (n,), generator=gen).tolist() for n in (7, 30)]
    outputs = []
    for backend in ("triton", "torch"):
        config = EngineConfig(
            model=str(tmp_path),
            device=str(device),
            dtype="float32",
            attention_backend=backend,
            num_kv_blocks=32,
            enforce_eager=True,
            kv_cache_dtype="fp8",
        )
        runner = ModelRunner(config, load_model(config))
        assert runner.kv_cache.dtype == FP8
        seqs = [greedy_seq(p, str(i)) for i, p in enumerate(prompts)]
        outputs.append(RunnerDriver(runner).generate(seqs, 5, chunk=16))
    assert outputs[0] == outputs[1]
