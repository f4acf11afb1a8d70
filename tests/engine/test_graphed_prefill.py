"""Prefill graphs: token buckets and the packing of a planned step on the CPU; replays against the
eager forward on a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.runner.graphed_prefill import MAX_GRAPH_TOKENS, pack_prefill_inputs, prefill_buckets
from omni_gateway.engine.runner.step_plan import StepPlan

MAX_SEQS, MAX_BLOCKS, CAPACITY = 6, 8, 64


def _plan(positions: list[int] | torch.Tensor) -> StepPlan:
    # Two decodes (contexts 5 and 17), then prefill chunks of 3 and 4 tokens (contexts 3 and 20).
    return StepPlan(
        ids=[11, 12, 21, 22, 23, 31, 32, 33, 34],
        num_tokens=9,
        positions=positions,
        slots=[100, 200, 300, 301, 302, 416, 417, 418, 419],
        num_decode=2,
        decode_lens=[5, 17],
        decode_tables=np.array([[7, 0], [8, 9]], dtype=np.int32),
        cu_q=[0, 3, 7],
        prefill_lens=[3, 20],
        prefill_tables=np.array([[4, 0], [5, 6]], dtype=np.int32)[:, :2],
        sample_rows=[0, 1, 4, 8],
        embed_rows=[2, 3, 4],
        embeds=None,
    )


def _buffers() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rows = np.full((CAPACITY, 5), 99, dtype=np.int64)  # stale values a pack must overwrite
    seq_meta = np.full(2 * MAX_SEQS + 1, 99, dtype=np.int32)
    tables = np.full(MAX_SEQS * MAX_BLOCKS, 99, dtype=np.int32)
    embed_rows = np.full(CAPACITY, 99, dtype=np.int64)
    return rows, seq_meta, tables, embed_rows


def test_buckets_double_to_256_then_step_by_256_up_to_the_cap():
    assert prefill_buckets(2048) == [16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048]
    assert prefill_buckets(600) == [16, 32, 64, 128, 256, 512, 600]
    assert prefill_buckets(100) == [16, 32, 64, 100]
    assert prefill_buckets(16) == [16]
    assert prefill_buckets(3) == [3]
    with pytest.raises(ValueError, match="at least 1"):
        prefill_buckets(0)
    assert MAX_GRAPH_TOKENS in prefill_buckets(MAX_GRAPH_TOKENS)


def test_pack_lays_out_decodes_as_one_token_chunks_and_pads_the_rest():
    rows, seq_meta, tables, embed_rows = _buffers()
    n, width = pack_prefill_inputs(_plan(list(range(9))), rows, seq_meta, tables, embed_rows, bucket=17)
    assert (n, width) == (4, 2)
    assert rows[:9, 0].tolist() == [11, 12, 21, 22, 23, 31, 32, 33, 34]
    assert rows[:9, 1].tolist() == [100, 200, 300, 301, 302, 416, 417, 418, 419]
    assert rows[:9, 2].tolist() == list(range(9))
    # Padding tokens up to the bucket (the last one the scratch row) write no KV; rows past it are left alone.
    assert rows[9:17].tolist() == [[0, -1, 0, 0, 0]] * 8
    assert (rows[17:] == 99).all()
    cu, lens = seq_meta[: MAX_SEQS + 1], seq_meta[MAX_SEQS + 1 :]
    assert cu.tolist() == [0, 1, 2, 5, 9, 9, 9]  # padding sequences: empty queries at the end
    assert lens.tolist() == [5, 17, 3, 20, 0, 0]
    assert tables[: n * width].reshape(n, width).tolist() == [[7, 0], [8, 9], [4, 0], [5, 6]]
    # Index entries past the step's embeddings point at the scratch row, whatever they held before.
    assert embed_rows[:17].tolist() == [2, 3, 4] + [16] * 14


def test_pack_writes_mrope_positions_per_axis_and_zero_fills_narrower_tables():
    positions = torch.stack([torch.arange(9), torch.arange(9) * 2, torch.arange(9) * 3])
    plan = _plan(positions)
    plan.decode_tables = np.array([[7], [8]], dtype=np.int32)  # one block each: narrower than the prefill's
    rows, seq_meta, tables, embed_rows = _buffers()
    n, width = pack_prefill_inputs(plan, rows, seq_meta, tables, embed_rows, bucket=10)
    assert rows[:9, 2:5].T.tolist() == positions.tolist()
    assert tables[: n * width].reshape(n, width).tolist() == [[7, 0], [8, 0], [4, 0], [5, 6]]


def test_pack_refuses_a_step_past_the_capacity():
    rows, seq_meta, tables, embed_rows = _buffers()
    with pytest.raises(ValueError, match="does not fit"):  # no room for the scratch row past 9 tokens
        pack_prefill_inputs(_plan(list(range(9))), rows, seq_meta, tables, embed_rows, bucket=9)
    small_meta = np.zeros(2 * 3 + 1, dtype=np.int32)  # room for 3 sequences, the step has 4
    with pytest.raises(ValueError, match="4 sequences"):
        pack_prefill_inputs(_plan(list(range(9))), rows, small_meta, tables, embed_rows, bucket=16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prefill_graphs_match_the_eager_forward(arch: str, tmp_path: Path) -> None:
    from omni_gateway.engine.core.sequence import ScheduledBatch
    from omni_gateway.engine.runner.loader import load_model
    from omni_gateway.engine.runner.model_runner import ModelRunner

    from tests.harness.checkpoints import save_tiny_checkpoint
    from tests.harness.runner_driver import RunnerDriver, greedy_seq

    save_tiny_checkpoint(arch, tmp_path)
    config = EngineConfig(
        model=str(tmp_path),
        device="cuda",
        dtype="float32",
        attention_backend="triton",
        num_kv_blocks=64,
        max_num_seqs=8,
        max_num_batched_tokens=100,
    )
    runner = ModelRunner(config, load_model(config))
    graphs = runner.prefill_graphs
    assert graphs is not None and graphs.buckets == [16, 32, 64, 100]
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(2, 300, (n,), generator=gen).tolist() for n in (9, 33, 45, 70)]
    seqs = [greedy_seq(p, str(i)) for i, p in enumerate(prompts)]
    driver = RunnerDriver(runner)
    driver.generate(seqs[:2], 2)  # now both decode
    cases = [
        ScheduledBatch(seqs[:3], [1, 1, 45], []),  # decodes beside a whole prompt: the 64-token bucket
        ScheduledBatch([seqs[3]], [20], []),  # a first chunk that samples nothing
        ScheduledBatch([seqs[3]], [50], []),  # the rest, 50 tokens on a 20-token prefix
    ]
    for batch in cases:
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            driver.allocate(seq, seq.num_computed_tokens + n)
        plan = runner._plan(batch)[0]
        assert graphs.fits(plan)
        got: Any = runner.run_plan(plan)
        got = None if got is None else got.clone()
        runner.prefill_graphs = None
        want = runner.run_plan(plan)  # the same KV writes again, eagerly
        runner.prefill_graphs = graphs
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += n
    too_long = greedy_seq(torch.randint(2, 300, (101,), generator=gen).tolist(), "long")
    driver.allocate(too_long, 101)
    assert not graphs.fits(runner._plan(ScheduledBatch([too_long], [101], []))[0])
