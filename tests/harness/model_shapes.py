"""The model shapes the GPU benchmarks and the voice-stage checkpoints build with random weights, and a
word-level tokenizer that covers a whole vocabulary (``w2``, ``w3``, ...), so no weights or tokenizer have to
be downloaded."""

from __future__ import annotations

from typing import Any


def shape_config(name: str) -> Any:
    """The ``transformers`` config of a real model's shape: ``qwen2.5-0.5b`` or ``llama-3.1-8b``."""
    from transformers import LlamaConfig, Qwen2Config

    if name == "qwen2.5-0.5b":
        return Qwen2Config(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            eos_token_id=0,
            bos_token_id=1,
        )
    if name == "llama-3.1-8b":
        return LlamaConfig(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            eos_token_id=0,
            bos_token_id=1,
        )
    raise SystemExit(f"unknown model shape {name!r}; expected qwen2.5-0.5b or llama-3.1-8b")


def word_tokenizer(vocab_size: int) -> Any:
    """A tokenizer whose ids 2.. are the words ``w2``, ``w3``, ...; 0 is ``<eos>`` (and unknown words), 1 ``<bos>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "<bos>": 1} | {f"w{i}": i for i in range(2, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>")
