"""Mixture-of-experts text models (Qwen3-MoE, Qwen2-MoE with its shared expert, Mixtral) on the paged runner:
greedy output token-identical to transformers, sparse and dense layers where the config puts them, and under
tensor parallel (experts sliced, or whole per rank with expert parallel) the same tokens as one rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.models.moe_config import MoeConfig
from omni_gateway.engine.parallel.layout import ShardLayout
from omni_gateway.engine.parallel.weights import SafetensorsSource, shard_weights
from omni_gateway.engine.runner.loader import load_model
from omni_gateway.engine.runner.model_runner import ModelRunner

from tests.engine.test_tensor_parallel import assert_same, generate
from tests.harness.checkpoints import MOE_KINDS, save_tiny_checkpoint, tiny_config
from tests.harness.runner_driver import RunnerDriver, greedy_seq, hf_greedy

pytestmark = pytest.mark.usefixtures("one_torch_thread")
NEW_TOKENS = 10


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 300, (n,), generator=gen).tolist() for n in lengths]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    saved = {}
    for kind in MOE_KINDS:
        directory = tmp_path_factory.mktemp(kind)
        saved[kind] = (directory, save_tiny_checkpoint(kind, directory))
    return saved


@pytest.mark.parametrize("kind", MOE_KINDS)
def test_greedy_output_matches_transformers(checkpoints: dict[str, tuple[Path, Any]], kind: str) -> None:
    directory, hf = checkpoints[kind]
    loaded = load_model(EngineConfig(model=str(directory)))
    runner = ModelRunner(EngineConfig(model=str(directory), device="cpu", num_kv_blocks=96), loaded)
    prompts = _prompts([5, 33, 18], seed=1)
    # chunk 16: the long prompt prefills over three steps while the short one already decodes.
    got = RunnerDriver(runner).generate([greedy_seq(p, f"r{i}") for i, p in enumerate(prompts)], NEW_TOKENS, chunk=16)
    for prompt, tokens in zip(prompts, got):
        assert tokens == hf_greedy(hf, prompt, NEW_TOKENS)


def test_sparse_layers_follow_the_config(checkpoints: dict[str, tuple[Path, Any]]) -> None:
    directory, _ = checkpoints["qwen3-moe"]
    loaded = load_model(EngineConfig(model=str(directory)))
    model = ModelRunner(EngineConfig(model=str(directory), device="cpu", num_kv_blocks=16), loaded).model
    dense, sparse = model.layers
    assert dense.moe is None and dense.down is not None, "mlp_only_layers keeps layer 0 dense"
    assert sparse.moe is not None and sparse.down is None
    assert tuple(sparse.moe.w13.shape) == (8, 64, 64) and tuple(sparse.moe.w2.shape) == (8, 64, 32)
    stepped = MoeConfig.of(tiny_config("qwen3-moe"))
    assert stepped is not None and stepped.renormalize
    every_other = MoeConfig(8, 2, True, 32, 0, sparse_step=2, dense_layers=frozenset())
    assert [every_other.is_sparse(i) for i in range(4)] == [False, True, False, True]


def test_top_k_weights_are_renormalized_as_the_config_says() -> None:
    from transformers import Qwen3MoeConfig

    # Qwen3-MoE's config aliases num_experts to Mixtral's num_local_experts: norm_topk_prob still decides.
    plain = MoeConfig.of(Qwen3MoeConfig(num_experts=8, num_experts_per_tok=2, norm_topk_prob=False))
    assert plain is not None and plain.num_experts == 8 and not plain.renormalize
    assert not MoeConfig.of(tiny_config("qwen2-moe")).renormalize
    assert MoeConfig.of(tiny_config("mixtral")).renormalize  # no norm_topk_prob: Mixtral always rescales


def test_fp8_quantization_at_load_puts_the_experts_in_fp8(checkpoints: dict[str, tuple[Path, Any]]) -> None:
    directory, _ = checkpoints["mixtral"]
    blocks = []
    for quantization in (None, "fp8"):
        config = EngineConfig(model=str(directory), device="cpu", num_kv_blocks=16, quantization=quantization)
        blocks.append(ModelRunner(config, load_model(config)).model.layers[1].moe)
    plain, fp8 = blocks
    assert fp8.w13.dtype == torch.float8_e4m3fn and fp8.w2_scale is not None and plain.w13_scale is None
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(0))
    expected = plain(x)
    assert float((fp8(x) - expected).norm() / expected.norm()) < 0.1


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_the_shards_put_back_together_are_the_experts(
    checkpoints: dict[str, tuple[Path, Any]], expert_parallel: bool
) -> None:
    from safetensors.torch import load_file

    directory, _ = checkpoints["qwen2-moe"]
    full = load_file(str(directory / "model.safetensors"))
    source = SafetensorsSource(sorted(directory.glob("*.safetensors")))
    config = tiny_config("qwen2-moe")
    shards = [shard_weights(source, ShardLayout.of(config, rank, 2, expert_parallel)) for rank in range(2)]
    p = "model.layers.1.mlp."
    for j in range(8):
        gate, down = f"{p}experts.{j}.gate_proj.weight", f"{p}experts.{j}.down_proj.weight"
        if expert_parallel:  # experts 0-3 on rank 0, 4-7 on rank 1, whole
            owner, other = shards[j // 4], shards[1 - j // 4]
            assert torch.equal(owner[gate], full[gate]) and gate not in other
        else:
            torch.testing.assert_close(torch.cat([s[gate] for s in shards]), full[gate], rtol=0, atol=0)
            torch.testing.assert_close(torch.cat([s[down] for s in shards], dim=1), full[down], rtol=0, atol=0)
    shared = p + "shared_expert.down_proj.weight"  # split like a dense MLP either way
    torch.testing.assert_close(torch.cat([s[shared] for s in shards], dim=1), full[shared], rtol=0, atol=0)
    assert torch.equal(shards[1][p + "gate.weight"], full[p + "gate.weight"]), "the router is replicated"


def test_experts_that_do_not_split_evenly_are_refused() -> None:
    config = tiny_config("mixtral")
    config.num_local_experts = 6
    with pytest.raises(ValueError, match="must divide the model's 6 experts"):
        ShardLayout.of(config, 0, 4, expert_parallel=True)
    assert ShardLayout.of(config, 3, 4).expert_rows() == (24, 32), "sliced, each rank holds every expert"
    config = tiny_config("qwen3-moe")
    config.moe_intermediate_size = 30
    with pytest.raises(ValueError, match="experts' intermediate size 30 .or run --enable-expert-parallel"):
        ShardLayout.of(config, 0, 4)
    assert ShardLayout.of(config, 1, 4, expert_parallel=True).expert_range() == (2, 4)


def test_the_cli_takes_vllms_expert_parallel_flag() -> None:
    from omni_gateway.gateway import cli

    _, omni_config = cli.configs(cli.build_parser().parse_args(["serve", "-tp", "2", "--enable-expert-parallel"]))
    assert omni_config.engine.enable_expert_parallel and omni_config.engine.tensor_parallel_size == 2
    _, omni_config = cli.configs(cli.build_parser().parse_args(["serve"]))
    assert not omni_config.engine.enable_expert_parallel


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["qwen3-moe", "qwen2-moe"])
def test_two_ranks_with_and_without_expert_parallel_generate_what_one_generates(
    checkpoints: dict[str, tuple[Path, Any]], kind: str
) -> None:
    model = str(checkpoints[kind][0])
    single = generate(model, 1)
    assert_same(single, generate(model, 2))
    assert_same(single, generate(model, 2, enable_expert_parallel=True))
