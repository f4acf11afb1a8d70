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
