"""Tensor parallel on the CPU over gloo: the shard layout, the sliced weights, and TP=N generating
exactly what TP=1 generates (greedy tokens identical; log-probabilities within float32 rounding,
since the all-reduce sums the partial products of o_proj/down_proj in another order)."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.parallel.layout import ShardLayout
from omni_gateway.engine.parallel.weights import SafetensorsSource, shard_weights
from omni_gateway.engine.quant.cpu_linear import QuantizedWeight
from omni_gateway.engine.runner.loader import load_model
from omni_gateway.engine.sampling_params import SamplingParams

from tests.harness.checkpoints import save_tiny_checkpoint

LOGPROB_ATOL = 1e-4  # float32 reduction order; measured differences stay below 2e-5


def tp_ranks() -> list[multiprocessing.process.BaseProcess]:
    """The live rank workers of this process's tensor-parallel engines (other tests may leave engine
    core processes of their own running)."""
    return [p for p in multiprocessing.active_children() if p.name.startswith("omni-tp-rank")]


def _layout(rank: int, world: int, heads: int, kv: int, inter: int = 96, vocab: int = 10) -> ShardLayout:
    layout = ShardLayout(rank, world, heads, kv, 4, inter, vocab)
    layout.validate()
    return layout


@pytest.mark.parametrize(("heads", "kv", "world"), [(4, 2, 2), (8, 2, 4), (8, 2, 8), (8, 8, 4), (12, 4, 2), (4, 1, 4)])
def test_each_rank_holds_the_kv_heads_its_query_heads_read(heads: int, kv: int, world: int) -> None:
    group = heads // kv  # query heads per KV head (GQA)
    held_kv: list[int] = []
    for rank in range(world):
        layout = _layout(rank, world, heads, kv)
        q_start, q_end = (r // layout.head_dim for r in layout.q_rows())
        kv_start, kv_end = (r // layout.head_dim for r in layout.kv_rows())
        assert {h // group for h in range(q_start, q_end)} <= set(range(kv_start, kv_end))
        held_kv += range(kv_start, kv_end)
    assert set(held_kv) == set(range(kv)), "every KV head lives somewhere"
    assert len(held_kv) == max(kv, world), "KV heads are replicated only past their count"


@pytest.mark.parametrize(
    ("heads", "kv", "inter", "world", "says"),
    [(4, 2, 96, 3, "4 attention heads"), (6, 3, 96, 2, "3 KV heads"), (8, 4, 90, 4, "intermediate size 90")],
)
def test_a_model_that_does_not_split_evenly_is_refused(heads: int, kv: int, inter: int, world: int, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        _layout(0, world, heads, kv, inter)


def test_the_vocabulary_is_split_in_equal_padded_shards() -> None:
    shards = [_layout(rank, 4, 4, 2, vocab=10).vocab_rows() for rank in range(4)]
    assert shards == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert _layout(0, 4, 4, 2, vocab=10).vocab_per_rank == 3


class _Checkpoints(dict[str, Path]):
    """Tiny checkpoints by kind, each saved the first time a test asks for it."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        super().__init__()
        self._factory = factory

    def __missing__(self, kind: str) -> Path:
        directory = self._factory.mktemp(kind)
        save_tiny_checkpoint(kind, directory)
        self[kind] = directory
        return directory


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Checkpoints(tmp_path_factory)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_shards_put_back_together_are_the_checkpoint(checkpoints: dict[str, Path], kind: str) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig

    directory = checkpoints[kind]
    full = load_file(str(directory / "model.safetensors"))
    source = SafetensorsSource(sorted(directory.glob("*.safetensors")))
    config = AutoConfig.from_pretrained(directory)
    world = 2
    shards = [shard_weights(source, ShardLayout.of(config, rank, world)) for rank in range(world)]
    p = "model.layers.1."
    for name in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "mlp.up_proj.weight"):
        torch.testing.assert_close(torch.cat([s[p + name] for s in shards], dim=0), full[p + name], rtol=0, atol=0)
    for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
        torch.testing.assert_close(torch.cat([s[p + name] for s in shards], dim=1), full[p + name], rtol=0, atol=0)
    if kind == "qwen2":  # q/k/v biases follow their rows
        name = p + "self_attn.v_proj.bias"
        torch.testing.assert_close(torch.cat([s[name] for s in shards]), full[name], rtol=0, atol=0)
    embed = torch.cat([s["model.embed_tokens.weight"] for s in shards])
    vocab = full["model.embed_tokens.weight"].shape[0]
    torch.testing.assert_close(embed[:vocab], full["model.embed_tokens.weight"], rtol=0, atol=0)
    assert not embed[vocab:].any(), "padding rows of the last vocabulary shard are zero"
    assert torch.equal(shards[1][p + "input_layernorm.weight"], full[p + "input_layernorm.weight"])


def test_an_unsplittable_model_fails_before_any_process_starts(checkpoints: dict[str, Path]) -> None:
    config = EngineConfig(model=str(checkpoints["llama"]), device="cpu", tensor_parallel_size=3, num_kv_blocks=16)
    with pytest.raises(ValueError, match="tensor_parallel_size=3 must divide the model's 4 attention heads"):
        LLMEngine(config)
    assert tp_ranks() == []


def test_tensor_parallel_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1, got 0"):
        EngineConfig(tensor_parallel_size=0)


def test_the_cli_takes_vllms_flag_and_its_short_form() -> None:
    from omni_gateway.gateway import cli

    for argv in (["serve", "-tp", "2"], ["serve", "--tensor-parallel-size", "2"]):
        _, omni_config = cli.configs(cli.build_parser().parse_args(argv))
        assert omni_config.engine.tensor_parallel_size == 2


# ---- end to end: spawned ranks ------------------------------------------------------------------


def generate(
    model: str, tp: int, device: str = "cpu", *, dequantized: bool = False, **config: Any
) -> dict[str, tuple[list[int], list[float]]]:
    """Greedy continuations of prompts that share a prefix (prefix cache) and run chunked prefill
    next to decodes (a small step budget), with each chosen token's log-probability. ``dequantized``: a
    GGUF's quantized weights de-quantized to float32 at load, as tensor parallel slices them."""
    engine_config = EngineConfig(
        model=model,
        device=device,
        dtype="float32",
        tensor_parallel_size=tp,
        num_kv_blocks=96,
        max_num_batched_tokens=24,
        warmup="off",
        **config,
    )
    loaded = None
    if dequantized:
        loaded = load_model(engine_config)
        floats = {k: v.dequantize() if isinstance(v, QuantizedWeight) else v for k, v in loaded.weights.items()}
        loaded = dataclasses.replace(loaded, weights=floats)
    engine = LLMEngine(engine_config, model=loaded)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
        prompts = {"a": list(range(5, 45)), "b": list(range(5, 45)) + [7, 8, 9], "c": [11, 3, 99, 4]}
        for rid, prompt in prompts.items():
            engine.add_request(rid, prompt, params)
        outputs = {}
        while engine.has_unfinished():
            engine.step()
        for out in engine.pop_finished():
            completion = out.outputs[0]
            assert completion.logprobs is not None
            outputs[out.request_id] = (list(completion.token_ids), [lp.logprob for lp in completion.logprobs])
        return outputs
    finally:
        engine.shutdown()
        assert tp_ranks() == [], "a rank outlived its engine"


def assert_same(single: dict[str, Any], parallel: dict[str, Any]) -> None:
    assert single.keys() == parallel.keys()
    for rid in single:
        assert parallel[rid][0] == single[rid][0], f"request {rid}: greedy tokens differ"
        torch.testing.assert_close(
            torch.tensor(parallel[rid][1]), torch.tensor(single[rid][1]), rtol=0, atol=LOGPROB_ATOL
        )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_two_ranks_generate_what_one_generates(checkpoints: dict[str, Path], kind: str) -> None:
    model = str(checkpoints[kind])
    assert_same(generate(model, 1), generate(model, 2))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smollm2_split_three_ways_generates_what_one_rank_generates() -> None:
    # SmolLM2-135M has 9 attention heads and 3 KV heads: 3 is the smallest split it allows (2 is refused).
    # Tensor parallel slices the GGUF's weights de-quantized; one rank keeps them quantized (its integer
    # products differ from float32 by the activations' rounding), so the single rank here de-quantizes too.
    single = generate("default", 1, dequantized=True, max_model_len=512)
    assert_same(single, generate("default", 3, max_model_len=512))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_that_dies_fails_the_next_step_with_its_name(checkpoints: dict[str, Path]) -> None:
    from omni_gateway.engine.parallel.executor import TensorParallelError

    config = EngineConfig(
        model=str(checkpoints["llama"]), device="cpu", tensor_parallel_size=2, num_kv_blocks=32, warmup="off"
    )
    engine = LLMEngine(config)
    try:
        engine.add_request("r", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
        engine.step()
        (worker,) = tp_ranks()
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(30)
        with pytest.raises(TensorParallelError, match=r"rank 1 \(pid \d+\) exited with code -9"):
            for _ in range(50):
                engine.step()
        assert tp_ranks() == [], "a failed step stops the ranks"
        with pytest.raises(TensorParallelError, match="shut down"):
            engine.step()
    finally:
        started = time.monotonic()
        engine.shutdown()
        assert time.monotonic() - started < 30
    assert tp_ranks() == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_that_dies_inside_a_collective_is_named_not_waited_for(checkpoints: dict[str, Path]) -> None:
    config = EngineConfig(
        model=str(checkpoints["llama"]), device="cpu", tensor_parallel_size=2, num_kv_blocks=32, warmup="off"
    )
    engine = LLMEngine(config)
    try:
        runner: Any = engine.runner
        (worker,) = tp_ranks()
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(30)
        with pytest.raises(RuntimeError) as caught:  # gloo sees the closed socket at once
            runner.parallel.all_reduce(torch.zeros(4))
        assert "rank 1" in str(runner._workers.explain(caught.value))
    finally:
        engine.shutdown()
    assert tp_ranks() == []


def _pipelined_tokens(model: str, tp: int) -> tuple[dict[str, list[int]], int]:
    engine = LLMEngine(
        EngineConfig(
            model=model, device="cpu", tensor_parallel_size=tp, num_kv_blocks=64, pipeline_decode="on", warmup="off"
        )
    )
    try:
        params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)  # no logprobs: steps go ahead
        for rid, prompt in {"a": [4, 8, 15, 16, 23, 42], "b": list(range(60, 80))}.items():
            engine.add_request(rid, prompt, params)
        while engine.has_unfinished():
            engine.step()
        tokens = {out.request_id: list(out.outputs[0].token_ids) for out in engine.pop_finished()}
        return tokens, engine.num_steps_ahead
    finally:
        engine.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_steps_launched_ahead_take_their_token_ids_from_rank_0(checkpoints: dict[str, Path]) -> None:
    model = str(checkpoints["qwen3"])
    single, _ = _pipelined_tokens(model, 1)
    parallel, ahead = _pipelined_tokens(model, 2)
    assert ahead > 0, "decode steps were launched ahead"
    assert parallel == single


class UnreadablePastRank0(SafetensorsSource):
    """A checkpoint whose slices past the first cannot be read: every rank but 0 fails to load."""

    def read(self, name: str, dim: int | None = None, start: int = 0, end: int | None = None) -> torch.Tensor:
        if start > 0:
            raise OSError(f"cannot read {name}[{start}:{end}]: the disk went away")
        return super().read(name, dim, start, end)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_that_cannot_load_its_shard_fails_the_engine_with_its_error(checkpoints: dict[str, Path]) -> None:
    import dataclasses

    from omni_gateway.engine.parallel.executor import TensorParallelError
    from omni_gateway.engine.runner.loader import load_model

    directory = checkpoints["llama"]
    config = EngineConfig(model=str(directory), device="cpu", tensor_parallel_size=2, num_kv_blocks=32)
    loaded = load_model(config)
    broken = dataclasses.replace(loaded, source=UnreadablePastRank0(sorted(directory.glob("*.safetensors"))))
    with pytest.raises(TensorParallelError, match=r"(?s)rank 1 .*exited with code 1.*the disk went away"):
        LLMEngine(config, model=broken)
    assert tp_ranks() == []
