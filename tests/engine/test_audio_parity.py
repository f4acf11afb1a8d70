"""Audio-in models over the paged engine against Hugging Face transformers.

Tiny random Qwen2-Audio and Voxtral checkpoints are saved in the test; the engine runs the language
model with the audio tower's embeddings in EmbedSpans (built by omni.audio_input), and greedy outputs
must equal ``generate`` of the full HF model given the same audio, prepared by the HF processor.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omni_gateway.encoders.audio_encoder import AudioEncoder
from omni_gateway.encoders.audio_tower import load_audio_encoder
from omni_gateway.encoders.vision import VisionEncoder
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.outputs import RequestOutput
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.audio_input import build_audio_prompt
from omni_gateway.omni.media import MediaError
from omni_gateway.omni.protocol import AudioPart, Message, OmniRequest, TextPart
from omni_gateway.omni.vision import VisionPrompt

from tests.harness.audio_checkpoints import (
    SAMPLE_RATE,
    audio_tokenizer,
    save_tiny_qwen2_audio,
    save_tiny_voxtral,
    token_id,
    tone,
)

NEW_TOKENS = 8


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def heard(samples: np.ndarray) -> np.ndarray:
    """The samples as the model hears them after the pcm16 round trip."""
    return np.frombuffer(pcm16(samples), "<i2").astype(np.float32) / 32768.0


class Stack:
    def __init__(self, directory: Path, hf: Any, vision: VisionEncoder | None = None, **engine_kwargs: Any) -> None:
        self.hf = hf
        self.audio: AudioEncoder = load_audio_encoder(directory)
        self.vision = vision
        engine_kwargs.setdefault("device", "cpu")
        self.engine = LLMEngine(EngineConfig(model=str(directory), num_kv_blocks=128, **engine_kwargs))
        self._n = 0

    def prompt(self, *parts: Any) -> VisionPrompt:
        request = OmniRequest(request_id="r", messages=(Message("user", tuple(parts)),))
        return build_audio_prompt(request, self.engine.tokenizer, self.audio, self.vision)

    def run(self, prompt: VisionPrompt) -> RequestOutput:
        self._n += 1
        self.engine.add_request(
            f"q{self._n}",
            prompt.token_ids,
            SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True),
            embed_spans=prompt.embed_spans,
        )
        while self.engine.has_unfinished():
            self.engine.step()
        (out,) = self.engine.pop_finished()
        return out


def hf_generate(model: Any, ids: list[int], **media: Any) -> list[int]:
    model.generation_config.eos_token_id = None
    tensor = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(
            tensor,
            attention_mask=torch.ones_like(tensor),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
            **media,
        )
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def qwen2_audio(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    directory = tmp_path_factory.mktemp("qwen2audio")
    # A small step budget splits audio spans across prefill chunks.
    return Stack(directory, save_tiny_qwen2_audio(directory), max_num_batched_tokens=7)


@pytest.fixture(scope="module")
def voxtral(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    directory = tmp_path_factory.mktemp("voxtral")
    return Stack(directory, save_tiny_voxtral(directory))


# ---- Qwen2-Audio ---------------------------------------------------------------------------------


def qwen2_audio_processor(stack: Stack) -> Any:
    from transformers import Qwen2AudioProcessor

    return Qwen2AudioProcessor(feature_extractor=stack.audio.extractor, tokenizer=audio_tokenizer())


@pytest.mark.parametrize("seconds", [[0.6], [0.25, 1.0]])
def test_qwen2_audio_matches_hf(qwen2_audio: Stack, seconds: list[float]) -> None:
    clips = [heard(tone(i, s)) for i, s in enumerate(seconds)]
    parts: list[Any] = [TextPart("what is said")]
    for clip in clips:
        parts += [AudioPart(pcm16(clip), SAMPLE_RATE), TextPart(" and")]
    prompt = qwen2_audio.prompt(*parts)
    text = "user: what is said" + "<|audio_bos|><|AUDIO|><|audio_eos|> and" * len(clips) + "\nassistant:"
    batch = qwen2_audio_processor(qwen2_audio)(text=[text], audio=clips, sampling_rate=SAMPLE_RATE, return_tensors="pt")
    assert prompt.token_ids == batch["input_ids"][0].tolist()  # placeholder expansion as the HF processor does it
    media = {k: batch[k] for k in ("input_features", "feature_attention_mask")}
    assert qwen2_audio.run(prompt).outputs[0].token_ids == hf_generate(qwen2_audio.hf, prompt.token_ids, **media)


def test_qwen2_audio_resamples_other_rates(qwen2_audio: Stack) -> None:
    clip = heard(tone(5, 0.5, rate=8000))
    prompt = qwen2_audio.prompt(AudioPart(pcm16(clip), 8000), TextPart("hi"))
    resampled = qwen2_audio.audio.prepare(clip, 8000)
    assert abs(resampled.size - clip.size * 2) <= 1
    text = "user: <|audio_bos|><|AUDIO|><|audio_eos|>hi\nassistant:"
    batch = qwen2_audio_processor(qwen2_audio)(
        text=[text], audio=[resampled], sampling_rate=SAMPLE_RATE, return_tensors="pt"
    )
    assert prompt.token_ids == batch["input_ids"][0].tolist()
    media = {k: batch[k] for k in ("input_features", "feature_attention_mask")}
    assert qwen2_audio.run(prompt).outputs[0].token_ids == hf_generate(qwen2_audio.hf, prompt.token_ids, **media)


def test_qwen2_audio_longer_than_its_window_is_refused(qwen2_audio: Stack) -> None:
    with pytest.raises(MediaError, match="at most 1 s per clip"):
        qwen2_audio.prompt(AudioPart(pcm16(tone(1, 1.5)), SAMPLE_RATE))


@pytest.mark.parametrize(
    "part",
    [
        AudioPart(b"", 0, encoded=b"RIFF\x00\x00\x00\x00WAVEjunk"),
        AudioPart(b"", 0, encoded=b"\x00" * 64),
        AudioPart(b"\x01\x02\x03", SAMPLE_RATE),
        AudioPart(b"", SAMPLE_RATE),
        AudioPart(b"\x00\x00", 0),
    ],
)
def test_corrupt_audio_is_a_clear_error(qwen2_audio: Stack, part: AudioPart) -> None:
    with pytest.raises(MediaError, match="audio"):
        qwen2_audio.prompt(TextPart("x"), part)


def test_repeated_audio_is_neither_encoded_nor_prefilled_again(qwen2_audio: Stack) -> None:
    clip = heard(tone(42, 0.9))
    words = TextPart("the quick brown fox jumps over the lazy dog, what is said in this recording please")
    encodes = 0
    original = qwen2_audio.audio._encode

    def counting(*args: Any) -> Any:
        nonlocal encodes
        encodes += 1
        return original(*args)

    qwen2_audio.audio._encode = counting  # type: ignore[method-assign]
    try:
        first = qwen2_audio.prompt(words, AudioPart(pcm16(clip), SAMPLE_RATE), TextPart(" now"))
        out_first = qwen2_audio.run(first)
        other = qwen2_audio.prompt(words, AudioPart(pcm16(heard(tone(43, 0.9))), SAMPLE_RATE), TextPart(" now"))
        assert other.token_ids == first.token_ids  # same placeholders: only the audio content tells them apart
        block = qwen2_audio.engine.config.block_size
        span = first.embed_spans[0]
        assert qwen2_audio.run(other).num_cached_tokens == span.offset // block * block
        assert encodes == 2
        again = qwen2_audio.prompt(words, AudioPart(pcm16(clip), SAMPLE_RATE), TextPart(" now"))
        assert encodes == 2  # the encoder cache answered
        assert again.embed_spans[0].key == span.key
        out_again = qwen2_audio.run(again)
    finally:
        del qwen2_audio.audio._encode
    assert out_again.num_cached_tokens >= (span.offset + span.length) // block * block  # the audio's KV is reused
    assert out_again.outputs[0].token_ids == out_first.outputs[0].token_ids


# ---- Voxtral -------------------------------------------------------------------------------------


def voxtral_features(stack: Stack, clip: np.ndarray) -> torch.Tensor:
    """Input features as VoxtralProcessor prepares them (padded to whole windows, split per window)."""
    from transformers import VoxtralProcessor

    fake = types.SimpleNamespace(feature_extractor=stack.audio.extractor)
    return VoxtralProcessor._retrieve_input_features(
        fake,
        [clip],
        max_source_positions=2 * stack.hf.config.audio_config.max_source_positions,
        sampling_rate=SAMPLE_RATE,
        padding=True,
        truncation=False,
        pad_to_multiple_of=stack.audio.window_samples,
        return_tensors="pt",
    )


@pytest.mark.parametrize("seconds", [0.4, 4.5])
def test_voxtral_matches_hf(voxtral: Stack, seconds: float) -> None:
    clip = heard(tone(7, seconds))
    prompt = voxtral.prompt(AudioPart(pcm16(clip), SAMPLE_RATE), TextPart("transcribe it"))
    windows = int(np.ceil(seconds / 2))
    (span,) = prompt.embed_spans
    assert span.length == 25 * windows  # 100 frames per 2 s window, 4 frames per token
    assert prompt.token_ids[span.offset - 1] == token_id("[BEGIN_AUDIO]")
    features = voxtral_features(voxtral, clip)
    assert features.shape[0] == windows
    assert voxtral.run(prompt).outputs[0].token_ids == hf_generate(
        voxtral.hf, prompt.token_ids, input_features=features
    )
