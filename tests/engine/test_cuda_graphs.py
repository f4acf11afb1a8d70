"""Decode CUDA-graph buckets: bucket choice on the CPU; capture/replay against eager runs on a GPU."""

from __future__ import annotations

import pytest
import torch
from omni_gateway.engine.runner.cuda_graphs import StepGraphs, default_buckets, pick_bucket


def test_pick_bucket_takes_smallest_fitting():
    buckets = [1, 2, 4, 8, 16]
    assert [pick_bucket(buckets, n) for n in (1, 2, 3, 5, 8, 9, 16)] == [1, 2, 4, 8, 8, 16, 16]
    assert pick_bucket(buckets, 17) is None
    with pytest.raises(ValueError, match="at least 1"):
        pick_bucket(buckets, 0)


def test_default_buckets_cover_every_batch_size():
    for max_batch in (1, 3, 8, 12, 64):
        buckets = default_buckets(max_batch)
        assert max(buckets) == max_batch
        assert all(pick_bucket(buckets, n) is not None for n in range(1, max_batch + 1))
    assert default_buckets(20) == [1, 2, 4, 8, 16, 20]


def test_rejects_cpu_buffers():
    with pytest.raises(ValueError, match="CUDA device"):
        StepGraphs(lambda x: x, {"x": torch.zeros(4, 2)}, buckets=[1, 2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_replay_matches_eager_decode_step_with_padding():
    from omni_gateway.kernels.norm import rms_norm
    from omni_gateway.kernels.paged_decode import paged_decode_attention

    torch.manual_seed(0)
    dev = torch.device("cuda")
    hq, hkv, d, page, max_batch, width = 8, 2, 64, 16, 8, 6
    k_cache = torch.randn(64, page, hkv, d, device=dev, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    weight = torch.randn(hq * d, device=dev, dtype=torch.bfloat16)

    def step(q: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor) -> dict[str, torch.Tensor]:
        attn = paged_decode_attention(q, k_cache, v_cache, seq_lens, block_tables, d**-0.5)
        return {"attn": attn, "normed": rms_norm(attn.view(attn.shape[0], -1), weight, 1e-6)}

    static = {
        "q": torch.zeros(max_batch, hq, d, device=dev, dtype=torch.bfloat16),
        "seq_lens": torch.zeros(max_batch, dtype=torch.int32, device=dev),
        "block_tables": torch.zeros(max_batch, width, dtype=torch.int32, device=dev),
    }
    graphs = StepGraphs(step, static, buckets=[1, 2, 4, 8], pad_values={"seq_lens": 0})
    graphs.capture()
    for batch in (1, 3, 8, 5, 3):  # 3 and 5 run padded buckets; repeats prove inputs are re-staged
        q = torch.randn(batch, hq, d, device=dev, dtype=torch.bfloat16)
        seq_lens = torch.randint(1, width * page + 1, (batch,), dtype=torch.int32, device=dev)
        tables = torch.randint(0, 64, (batch, width), dtype=torch.int32, device=dev)
        got = graphs.replay(q=q, seq_lens=seq_lens, block_tables=tables)
        want = step(q, seq_lens, tables)
        assert got["attn"].shape == (batch, hq, d)
        torch.testing.assert_close(got["attn"], want["attn"], rtol=0, atol=0)
        torch.testing.assert_close(got["normed"], want["normed"], rtol=0, atol=0)
    # Narrower block tables are padded into the captured width.
    narrow = torch.randint(0, 64, (2, 3), dtype=torch.int32, device=dev)
    lens = torch.tensor([20, 48], dtype=torch.int32, device=dev)
    q = torch.randn(2, hq, d, device=dev, dtype=torch.bfloat16)
    got = graphs.replay(q=q, seq_lens=lens, block_tables=narrow)
    torch.testing.assert_close(got["attn"], step(q, lens, narrow)["attn"], rtol=1e-2, atol=1e-2)
    assert (
        graphs.replay(
            q=torch.zeros(9, hq, d, device=dev, dtype=torch.bfloat16),
            seq_lens=torch.ones(9, dtype=torch.int32, device=dev),
            block_tables=torch.zeros(9, width, dtype=torch.int32, device=dev),
        )
        is None
    )
