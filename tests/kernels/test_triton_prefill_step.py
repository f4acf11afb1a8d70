"""The step the prefill graphs capture, run without a capture on the Triton kernels (the CPU interpreter
here), against the runner's eager forward: decodes beside a prompt, media embeddings that replace token
embeddings, and the talker's rows from the thinker that add to them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.sequence import EmbedSpan, ScheduledBatch, Sequence
from omni_gateway.engine.models.qwen2_5_omni_talker import TalkerTokens, load_talker
from omni_gateway.engine.runner import graphed_prefill
from omni_gateway.engine.runner.cuda_graphs import pick_bucket
from omni_gateway.engine.runner.input_stream import InputStream
from omni_gateway.engine.runner.loader import load_model
from omni_gateway.engine.runner.model_runner import ModelRunner
from omni_gateway.engine.runner.step_plan import StepPlan
from omni_gateway.engine.sampling_params import SamplingParams

from tests.harness.checkpoints import save_tiny_checkpoint
from tests.harness.runner_driver import RunnerDriver, greedy_seq
from tests.harness.tiny_omni import save_tiny_omni

MAX_SEQS = 8


class _Unreplayed:
    """Stands in for ``StepGraphs``: keeps the static buffers, captures nothing."""

    def __init__(self, step: Any, static: dict[str, torch.Tensor], buckets: list[int], **_: Any) -> None:
        self.step, self.static, self.buckets = step, static, buckets


def _graphed(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> graphed_prefill.GraphedPrefill:
    monkeypatch.setattr(graphed_prefill, "StepGraphs", _Unreplayed)
    monkeypatch.setattr(graphed_prefill, "PrefillStaging", lambda *_: None)  # pinned memory needs CUDA
    return graphed_prefill.GraphedPrefill(
        runner.model,
        runner.kv_caches,
        max_tokens=128,
        max_seqs=MAX_SEQS,
        max_blocks_per_seq=runner.max_blocks_per_seq,
        device=runner.device,
    )


def _captured_step(graphed: graphed_prefill.GraphedPrefill, plan: StepPlan) -> torch.Tensor:
    """What a replay computes: ``plan`` packed and staged into the static buffers, then the captured step."""
    assert graphed.fits(plan)
    tokens = pick_bucket(graphed.buckets, plan.num_tokens)
    assert tokens is not None
    bucket = tokens + 1
    static = graphed._graphs.static  # type: ignore[attr-defined]
    rows = np.zeros((bucket, 5), dtype=np.int64)
    seq_meta = np.zeros(2 * MAX_SEQS + 1, dtype=np.int32)
    tables = np.zeros(static["tables"].numel(), dtype=np.int32)
    embed_rows = np.zeros(bucket, dtype=np.int64)
    n, width = graphed_prefill.pack_prefill_inputs(plan, rows, seq_meta, tables, embed_rows, bucket)
    static["rows"][:bucket] = torch.from_numpy(rows)
    static["seq_meta"][:] = torch.from_numpy(seq_meta)
    static["tables"][:n, :width] = torch.from_numpy(tables[: n * width].reshape(n, width))
    static["embed_rows"][:bucket] = torch.from_numpy(embed_rows)
    static["embeds"].fill_(float("nan"))  # rows no live index points at must not matter
    if plan.embeds is not None:
        static["embeds"][: len(plan.embed_rows)] = plan.embeds
    hidden, _ = graphed._step(
        static["rows"][:bucket],
        static["seq_meta"],
        static["tables"],
        static["embed_rows"][:bucket],
        static["embeds"][:bucket],
    )
    return hidden[: plan.num_tokens]


def _check(runner: ModelRunner, graphed: graphed_prefill.GraphedPrefill, batch: ScheduledBatch) -> None:
    plan = runner._plan(batch)[0]
    hidden = _captured_step(graphed, plan)
    got = runner.model.compute_logits(hidden[torch.tensor(plan.sample_rows, device=hidden.device)])
    want = runner.run_plan(plan)  # the same KV writes again, eagerly
    assert want is not None and not got.isnan().any()  # the talker bars one code with -inf
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _config(device: torch.device, model: str = "default") -> EngineConfig:
    return EngineConfig(
        model=model,
        device=str(device),
        dtype="float32",
        attention_backend="triton",
        num_kv_blocks=64,
        enforce_eager=True,
    )


def test_decodes_beside_a_prompt_and_media_that_replaces_token_embeddings(
    device: torch.device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_tiny_checkpoint("qwen2", tmp_path)
    config = _config(device, str(tmp_path))
    runner = ModelRunner(config, load_model(config))
    graphed = _graphed(runner, monkeypatch)
    gen = torch.Generator().manual_seed(4)
    seqs = [greedy_seq(torch.randint(2, 300, (n,), generator=gen).tolist(), str(i)) for i, n in enumerate((9, 20))]
    driver = RunnerDriver(runner)
    driver.generate(seqs, 2)  # both decode now
    hidden = runner.model.shape.hidden_size
    media = EmbedSpan(offset=3, length=6, key="img", embeds=torch.randn(6, hidden, generator=gen).to(device))
    prompt = torch.randint(2, 300, (30,), generator=gen).tolist()
    seqs.append(Sequence("media", prompt, SamplingParams(temperature=0.0), embed_spans=(media,)))
    batch = ScheduledBatch(seqs, [1, 1, 30], [])
    for seq, n in zip(batch.seqs, batch.num_new_tokens):
        driver.allocate(seq, seq.num_computed_tokens + n)
    assert runner._plan(batch)[0].embeds is not None
    _check(runner, graphed, batch)


def test_talker_rows_from_the_thinker_add_to_its_token_embeddings(
    device: torch.device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = load_talker(save_tiny_omni(tmp_path))
    runner = ModelRunner(_config(device), loaded)
    graphed = _graphed(runner, monkeypatch)
    tokens = TalkerTokens.from_hf(loaded.hf_config)
    width = runner.model.embedding_size
    gen = torch.Generator().manual_seed(5)
    seqs = []
    for i, p in enumerate((6, 11)):
        ids = [tokens.codec_mask] * p + [tokens.codec_pad, tokens.codec_bos]
        cond = torch.randn(p + 2, width, generator=gen).to(device)
        seq = Sequence(str(i), ids, SamplingParams(temperature=0.0), embed_spans=(EmbedSpan(0, p + 2, str(i), cond),))
        seq.input_stream = InputStream(start=len(ids))
        seq.input_stream.append([torch.randn(width, generator=gen).to(device) for _ in range(3)])
        seqs.append(seq)
    driver = RunnerDriver(runner)
    batch = ScheduledBatch(seqs, [len(s) for s in seqs], [])
    for seq in seqs:
        driver.allocate(seq, len(seq) + 1)
    _check(runner, graphed, batch)
