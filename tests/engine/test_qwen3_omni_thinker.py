"""The Qwen3-Omni thinker over the paged engine against Hugging Face transformers.

A tiny random full ``Qwen3OmniMoeForConditionalGeneration`` checkpoint (thinker, talker, code2wav; built by
tests/harness/tiny_qwen3_omni.py) is saved once; the engine runs the thinker's Qwen3-MoE decoder with interleaved
M-RoPE, and heard audio through the Qwen3-Omni audio tower, and its greedy text must equal the HF thinker's
``generate`` for the same input. Tensor parallel over gloo (experts sliced, or whole per rank) generates what one
rank generates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omni_gateway.encoders.audio_checkpoint import checkpoint_family
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.models import MROPE_ARCHITECTURES, build_model
from omni_gateway.engine.models.qwen2_vl import axis_of_frequency
from omni_gateway.engine.runner.loader import load_model
from omni_gateway.engine.runner.model_runner import ModelRunner
from omni_gateway.omni.prompting import UnsupportedInput
from omni_gateway.omni.protocol import AudioPart, ImagePart, TextPart

from tests.engine.test_audio_parity import Stack, heard, hf_generate, pcm16
from tests.engine.test_tensor_parallel import assert_same, generate
from tests.harness.audio_checkpoints import SAMPLE_RATE, tone
from tests.harness.checkpoints import picture, png_bytes
from tests.harness.runner_driver import RunnerDriver, greedy_seq
from tests.harness.tiny_qwen3_omni import save_tiny_qwen3_omni, thinker_text_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ARCH = "Qwen3OmniMoeForConditionalGeneration"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    directory = tmp_path_factory.mktemp("qwen3omni")
    return directory, save_tiny_qwen3_omni(directory)


@pytest.fixture(scope="module")
def stack(saved: tuple[Path, Any]) -> Stack:
    directory, model = saved
    # A small step budget splits the audio spans across prefill chunks.
    return Stack(directory, model.thinker, max_num_batched_tokens=9)


def test_the_checkpoint_is_a_full_omni_one_and_the_engine_reads_its_thinker_only(saved: tuple[Path, Any]) -> None:
    from safetensors import safe_open

    directory, _ = saved
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    for prefix in ("thinker.model.layers.", "thinker.audio_tower.", "thinker.visual.", "talker.", "code2wav."):
        assert any(n.startswith(prefix) for n in names), prefix
    loaded = load_model(EngineConfig(model=str(directory)))
    assert loaded.architecture == ARCH and ARCH in MROPE_ARCHITECTURES
    assert loaded.hf_config.model_type == "qwen3_omni_moe_text"
    assert all(n.startswith(("model.", "lm_head.")) for n in loaded.weights), "talker/code2wav/towers left out"
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in loaded.weights
    assert checkpoint_family(directory) == "qwen3_omni", "the model hears"


def test_the_decoder_is_qwen3_moe_with_interleaved_mrope(saved: tuple[Path, Any]) -> None:
    directory, _ = saved
    loaded = load_model(EngineConfig(model=str(directory)))
    model = ModelRunner(EngineConfig(model=str(directory), device="cpu", num_kv_blocks=16), loaded).model
    assert model.uses_mrope and model.shape.qk_norm and not model.shape.qkv_bias
    assert all(layer.moe is not None and tuple(layer.moe.w13.shape) == (8, 64, 64) for layer in model.layers)
    # mrope_section [2, 3, 3] over 8 frequencies: height at 1, 4, 7; width at 2, 5 (8 is past the end).
    assert model.axis_of_freq.tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert axis_of_frequency([24, 20, 20], 64, True).bincount().tolist() == [24, 20, 20]
    assert axis_of_frequency([2, 3, 3], 8, False).tolist() == [0, 0, 1, 1, 1, 2, 2, 2], "Qwen2-VL's sections"


def test_mrope_tables_match_transformers_rotary(saved: tuple[Path, Any]) -> None:
    directory, hf = saved
    loaded = load_model(EngineConfig(model=str(directory)))
    model = build_model(
        loaded.hf_config, loaded.weights, ops=_ops(), device=torch.device("cpu"), dtype=torch.float32, max_positions=64
    )
    positions = torch.tensor([[3, 7, 9, 20], [3, 1, 12, 20], [3, 5, 0, 20]])
    rotary = hf.thinker.model.language_model.rotary_emb
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions[:, None, :])
    half = model.shape.head_dim // 2
    table = model.mrope_table(positions)
    torch.testing.assert_close(table[:, :half], cos[0, :, :half])
    torch.testing.assert_close(table[:, half:], sin[0, :, :half])


def _ops() -> Any:
    from omni_gateway.engine.runner.attention import select_kernels

    return select_kernels("torch", torch.device("cpu"))


def test_text_greedy_output_matches_transformers(saved: tuple[Path, Any]) -> None:
    directory, hf = saved
    loaded = load_model(EngineConfig(model=str(directory)))
    runner = ModelRunner(EngineConfig(model=str(directory), device="cpu", num_kv_blocks=96), loaded)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 300, (n,), generator=gen).tolist() for n in (5, 33, 18)]
    got = RunnerDriver(runner).generate([greedy_seq(p, f"r{i}") for i, p in enumerate(prompts)], 8, chunk=16)
    for prompt, tokens in zip(prompts, got):
        assert tokens == hf_generate(hf.thinker, prompt)


def test_a_head_dim_apart_from_the_width_matches_transformers(tmp_path: Path) -> None:
    # The released thinker's heads are 128 wide at hidden size 2048 over 32 heads: ``head_dim`` is its own field.
    text = thinker_text_config(head_dim=32)
    text["rope_parameters"]["mrope_section"] = [6, 5, 5]
    hf = save_tiny_qwen3_omni(tmp_path, text_config=text, enable_audio_output=False).thinker
    loaded = load_model(EngineConfig(model=str(tmp_path)))
    runner = ModelRunner(EngineConfig(model=str(tmp_path), device="cpu", num_kv_blocks=64), loaded)
    assert runner.model.shape.head_dim == 32
    prompt = torch.randint(2, 300, (20,), generator=torch.Generator().manual_seed(2)).tolist()
    (tokens,) = RunnerDriver(runner).generate([greedy_seq(prompt, "r")], 8, chunk=9)
    assert tokens == hf_generate(hf, prompt)


def _media(stack: Stack, clips: list[np.ndarray]) -> dict[str, Any]:
    """What the HF thinker takes for the clips, made as Qwen3-Omni's processor makes them (whole clips)."""
    batch = stack.audio.extractor(
        clips,
        sampling_rate=SAMPLE_RATE,
        padding=True,
        truncation=False,
        return_attention_mask=True,
        return_tensors="pt",
    )
    return dict(input_features=batch["input_features"], feature_attention_mask=batch["attention_mask"])


def test_heard_audio_greedy_output_matches_transformers(stack: Stack) -> None:
    # 2.7 s: three conv chunks and two attention windows of the tiny tower.
    clips = [heard(tone(1, 2.7)), heard(tone(2, 0.45))]
    prompt = stack.prompt(
        AudioPart(pcm16(clips[0]), SAMPLE_RATE), TextPart("what is said"), AudioPart(pcm16(clips[1]), SAMPLE_RATE)
    )
    assert [s.length for s in prompt.embed_spans] == [35, 6]
    ids = prompt.token_ids
    start, audio = stack.audio.placeholders.start, stack.audio.placeholders.audio
    assert ids.count(start) == 2 and ids.count(audio) == 41
    assert stack.run(prompt).outputs[0].token_ids == hf_generate(stack.hf, ids, **_media(stack, clips))


def test_images_are_refused_where_no_vision_encoder_is_given(stack: Stack) -> None:
    # Served images are tests/engine/test_qwen3_omni_vision.py's; a builder handed no vision tower refuses them.
    with pytest.raises(UnsupportedInput, match="no image or video input"):
        stack.prompt(TextPart("what is in"), ImagePart(png_bytes(picture(3, (64, 64)))))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_ranks_with_and_without_expert_parallel_generate_what_one_generates(saved: tuple[Path, Any]) -> None:
    model = str(saved[0])
    single = generate(model, 1)
    assert_same(single, generate(model, 2))
    assert_same(single, generate(model, 2, enable_expert_parallel=True))
