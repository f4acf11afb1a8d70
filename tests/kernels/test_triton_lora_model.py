"""LoRA adapters on the Triton kernels (the CPU interpreter here): the engine's projections add the batched
shrink and expand of kernels/lora.py, and greedy output equals PEFT's merged model, three adapters and the base
model mixed in one batch."""

from __future__ import annotations

from pathlib import Path

import pytest
from omni_gateway.engine import LLM, SamplingParams

from tests.harness.lora_adapters import NEW_TOKENS, PROMPTS, tiny_lora_set

pytestmark = pytest.mark.slow


def test_mixed_adapters_on_triton_kernels_equal_peft_merged(device, tmp_path: Path) -> None:
    expected = tiny_lora_set(tmp_path)
    modules = tuple((name, str(tmp_path / name)) for name in ("all", "attn", "mlp"))
    llm = LLM(
        model=str(tmp_path / "base"), device=str(device), dtype="float32", attention_backend="triton",
        max_model_len=128, enforce_eager=True, lora_modules=modules, max_loras=3,
    )  # fmt: skip
    assert llm.engine.runner.lora._shrink.__module__.endswith("kernels.lora")
    choices = ["all", None, "attn", "mlp"]
    requests = [(p, lora) for lora in choices for p in PROMPTS[:2]]
    outputs = llm.generate(
        [p for p, _ in requests],
        [
            SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, lora_name=lora)
            for _, lora in requests
        ],
    )
    assert [out.outputs[0].token_ids for out in outputs] == [expected[lora][i] for lora in choices for i in range(2)]


def test_batch_one_decode_keeps_the_fused_row_kernels(device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone sequence with an adapter decodes through the one-row kernels plus the adapter's deltas."""
    from omni_gateway.engine.lora import rows
    from omni_gateway.engine.models import llama_rows

    calls: list[int] = []

    def counting(model, hidden, *args):  # type: ignore[no-untyped-def]
        calls.append(hidden.shape[0])
        return rows.decode_row_with_lora(model, hidden, *args)

    monkeypatch.setattr(llama_rows, "decode_row_with_lora", counting)
    expected = tiny_lora_set(tmp_path, names=("all", "attn"))
    modules = tuple((name, str(tmp_path / name)) for name in ("all", "attn"))
    llm = LLM(
        model=str(tmp_path / "base"), device=str(device), dtype="float32", attention_backend="triton",
        max_model_len=128, enforce_eager=True, lora_modules=modules,
    )  # fmt: skip
    assert llm.engine.runner.model.row_fusion
    for lora in ("all", None, "attn"):
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, lora_name=lora)
        assert llm.generate([PROMPTS[1]], params)[0].outputs[0].token_ids == expected[lora][1]
    assert calls and set(calls) == {1}
