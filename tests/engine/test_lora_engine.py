"""LoRA adapters in the engine over a tiny random checkpoint on the CPU: greedy output equals PEFT's merged
model, a batch mixing adapters gives each row what it gets alone, adapters come and go while requests run,
and past max_loras the least recently used one leaves the device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.engine.errors import InvalidRequest

from tests.harness.lora_adapters import NEW_TOKENS, PROMPTS, tiny_lora_set

pytestmark = pytest.mark.slow
DEVICES = [
    "cpu",
    pytest.param(  # the Triton kernels, replayed from CUDA graphs
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
    ),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny Llama, three adapters of it and HF's greedy continuations."""
    root = tmp_path_factory.mktemp("lora")
    return {"root": root, "expected": tiny_lora_set(root)}


def _llm(tiny: dict[str, Any], device: str = "cpu", **args: Any) -> LLM:
    root = tiny["root"]
    modules = tuple((name, str(root / name)) for name in ("all", "attn", "mlp"))
    args.setdefault("max_loras", 3)
    return LLM(
        model=str(root / "base"), device=device, dtype="float32", max_model_len=128, enable_lora=True,
        lora_modules=modules, **args,
    )  # fmt: skip


def _params(lora: str | None) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, lora_name=lora)


def _run(llm: LLM, requests: list[tuple[list[int], str | None]]) -> list[list[int]]:
    engine = llm.engine
    for i, (prompt, lora) in enumerate(requests):
        engine.add_request(f"r{i}", prompt, _params(lora))
    while engine.has_unfinished():
        engine.step()
    done = {out.request_id: out for out in engine.pop_finished()}
    return [done[f"r{i}"].outputs[0].token_ids for i in range(len(requests))]


@pytest.mark.parametrize("device", DEVICES)
def test_each_adapter_equals_peft_merged_model(tiny: dict[str, Any], device: str) -> None:
    llm = _llm(tiny, device)
    expected = tiny["expected"]
    for lora in ("all", "attn", "mlp"):
        assert expected[lora] != expected[None], f"adapter {lora} must change the output to test anything"
        assert _run(llm, [(p, lora) for p in PROMPTS]) == expected[lora]


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_batch_gives_each_row_its_own_output(tiny: dict[str, Any], device: str) -> None:
    """Three adapters and the base in one batch, the same prompts under each (the prefix cache keys on the
    adapter: a block computed with one never serves another)."""
    llm = _llm(tiny, device)
    choices = ["all", None, "attn", "mlp"]
    requests = [(p, lora) for lora in choices for p in PROMPTS]
    got = _run(llm, requests)
    expected = [tiny["expected"][lora][i] for lora in choices for i in range(len(PROMPTS))]
    assert got == expected


def test_least_recently_used_adapter_leaves_past_max_loras(tiny: dict[str, Any]) -> None:
    llm = _llm(tiny, max_loras=2)
    slots = llm.engine.runner.lora
    loras = llm.engine.loras
    uids = {name: loras.get(name).uid for name in ("all", "attn", "mlp")}
    assert _run(llm, [(PROMPTS[0], "all")]) == [tiny["expected"]["all"][0]]
    assert _run(llm, [(PROMPTS[0], "attn")]) == [tiny["expected"]["attn"][0]]
    assert slots.resident == [uids["all"], uids["attn"]]
    assert _run(llm, [(PROMPTS[1], "mlp")]) == [tiny["expected"]["mlp"][1]]
    assert slots.resident == [uids["attn"], uids["mlp"]]  # "all" was the least recently used
    # All three at once: the scheduler runs at most two adapters together, and each comes back right.
    got = _run(llm, [(p, lora) for lora in ("all", "attn", "mlp") for p in PROMPTS])
    assert got == [tiny["expected"][lora][i] for lora in ("all", "attn", "mlp") for i in range(len(PROMPTS))]


def test_load_and_unload_while_requests_run(tiny: dict[str, Any]) -> None:
    root, expected = tiny["root"], tiny["expected"]
    llm = LLM(model=str(root / "base"), device="cpu", dtype="float32", max_model_len=128, enable_lora=True)
    engine = llm.engine
    assert engine.lora_adapters() == {}
    engine.load_lora("all", str(root / "all"))
    engine.add_request("a", PROMPTS[0], _params("all"))
    engine.add_request("base", PROMPTS[1], _params(None))
    for _ in range(3):
        engine.step()
    engine.load_lora("late", str(root / "mlp"))
    engine.add_request("late", PROMPTS[2], _params("late"))
    engine.unload_lora("all")  # "a" is running with it: it finishes with it
    with pytest.raises(InvalidRequest, match="does not exist"):
        engine.add_request("refused", PROMPTS[0], _params("all"))
    while engine.has_unfinished():
        engine.step()
    done = {out.request_id: out.outputs[0].token_ids for out in engine.pop_finished()}
    assert done == {"a": expected["all"][0], "base": expected[None][1], "late": expected["mlp"][2]}
    assert engine.lora_adapters() == {"late": str(root / "mlp")}
    engine.unload_lora("late")
    with pytest.raises(InvalidRequest, match="not loaded"):
        engine.unload_lora("late")


def test_lora_needs_enable_lora(tiny: dict[str, Any]) -> None:
    llm = LLM(model=str(tiny["root"] / "base"), device="cpu", dtype="float32", max_model_len=128)
    with pytest.raises(InvalidRequest, match="--enable-lora"):
        llm.engine.add_request("x", PROMPTS[0], _params("all"))
    with pytest.raises(InvalidRequest, match="--enable-lora"):
        llm.engine.load_lora("all", str(tiny["root"] / "all"))


def test_adapter_path_of_a_missing_folder_is_refused(tiny: dict[str, Any], tmp_path: Path) -> None:
    llm = _llm(tiny)
    with pytest.raises(InvalidRequest, match="is not a directory"):
        llm.engine.load_lora("ghost", str(tmp_path / "nowhere"))
    assert set(llm.engine.lora_adapters()) == {"all", "attn", "mlp"}


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_adapter_over_qkv_bias_tied_embeddings_and_qk_norm(kind: str, tmp_path: Path) -> None:
    """Qwen2 (q/k/v biases, tied embeddings) and Qwen3 (q/k norms, head_dim apart from hidden/heads)."""
    expected = tiny_lora_set(tmp_path, kind, names=("all",))
    llm = LLM(
        model=str(tmp_path / "base"), device="cpu", dtype="float32", max_model_len=128,
        lora_modules=(("all", str(tmp_path / "all")),),
    )  # fmt: skip
    assert expected["all"] != expected[None]
    assert _run(llm, [(p, lora) for lora in ("all", None) for p in PROMPTS]) == expected["all"] + expected[None]
