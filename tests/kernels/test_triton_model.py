"""The model runner on the Triton kernels (the CPU interpreter here) against HF, prefill chunks
next to decodes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.runner.loader import load_model
from omni_gateway.engine.runner.model_runner import ModelRunner

from tests.harness.checkpoints import save_tiny_checkpoint
from tests.harness.runner_driver import RunnerDriver, greedy_seq, hf_greedy


def _triton_runner(directory: Path, device: torch.device) -> ModelRunner:
    config = EngineConfig(
        model=str(directory),
        device=str(device),
        dtype="float32",
        attention_backend="triton",
        num_kv_blocks=32,
        enforce_eager=True,
    )
    return ModelRunner(config, load_model(config))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_triton_runner_matches_hf(kind: str, device: torch.device, tmp_path: Path) -> None:
    hf = save_tiny_checkpoint(kind, tmp_path)
    runner = _triton_runner(tmp_path, device)
    assert runner.ops.name == "triton"
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(2, 300, (n,), generator=gen).tolist() for n in (7, 30, 12)]
    # 16-token prefill chunks share the first steps with the short prompt's decodes.
    got = RunnerDriver(runner).generate([greedy_seq(p, str(i)) for i, p in enumerate(prompts)], 5, chunk=16)
    for prompt, tokens in zip(prompts, got):
        assert tokens == hf_greedy(hf, prompt, 5)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_one_row_decode_runs_fused_and_matches_hf(
    kind: str, device: torch.device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone sequence decodes through the fused one-row kernels (the norms inside the linears, the
    residual adds and the gated activation in their epilogues) and still follows HF greedily."""
    hf = save_tiny_checkpoint(kind, tmp_path)
    runner = _triton_runner(tmp_path, device)
    model = runner.model
    assert model.row_fusion and model.head_fusion
    fused_rows: list[int] = []
    row = model.lm_head.row
    assert row is not None

    def counting(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        fused_rows.append(x.shape[0])
        return row(x, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(model, "lm_head", dataclasses.replace(model.lm_head, row=counting))
    prompt = torch.randint(2, 300, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    assert RunnerDriver(runner).generate([greedy_seq(prompt)], 6) == [hf_greedy(hf, prompt, 6)]
    assert fused_rows == [1] * 6  # the prompt's last row and every decode step's


def test_fused_and_unfused_one_row_steps_agree(device: torch.device, tmp_path: Path) -> None:
    save_tiny_checkpoint("llama", tmp_path)
    model = _triton_runner(tmp_path, device).model
    hidden = torch.randn(1, model.shape.hidden_size, generator=torch.Generator().manual_seed(2)).to(device)
    fused = model.compute_logits(hidden)
    model.head_fusion = False
    unfused = model.compute_logits(hidden)
    assert fused.dtype == unfused.dtype == torch.float32
    torch.testing.assert_close(fused, unfused, rtol=1e-5, atol=1e-5)


def test_torch_backend_and_tensor_parallel_layers_keep_the_unfused_path(tmp_path: Path) -> None:
    save_tiny_checkpoint("llama", tmp_path)
    config = EngineConfig(model=str(tmp_path), device="cpu", dtype="float32", attention_backend="torch")
    assert not ModelRunner(config, load_model(config)).model.row_fusion


def test_fused_layers_feed_an_unfused_head(device: torch.device, tmp_path: Path) -> None:
    """A head without the fused kernel (a per-block FP8 one) takes the fused layers' residual stream through
    the separate final norm."""
    hf = save_tiny_checkpoint("llama", tmp_path)
    runner = _triton_runner(tmp_path, device)
    runner.model.head_fusion = False
    assert runner.model.row_fusion
    prompt = torch.randint(2, 300, (7,), generator=torch.Generator().manual_seed(8)).tolist()
    assert RunnerDriver(runner).generate([greedy_seq(prompt)], 5) == [hf_greedy(hf, prompt, 5)]
