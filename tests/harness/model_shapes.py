"""The model shapes the GPU benchmarks and the voice-stage checkpoints build with random weights, and a
word-level tokenizer that covers a whole vocabulary (``w2``, ``w3``, ...), so no weights or tokenizer have to
be downloaded."""

from __future__ import annotations

from typing import Any

SHAPES = ("qwen2.5-0.5b", "llama-3.1-8b", "qwen3-30b-a3b", "tiny-moe")


def shape_config(name: str) -> Any:
    """The ``transformers`` config of a model shape (``SHAPES``): a real model's, or ``tiny-moe``, a 2-layer Qwen3-MoE
    with a vocabulary that covers the benchmarks' prompt ids (2..10000), to run their MoE paths on the CPU."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3MoeConfig

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
    if name == "qwen3-30b-a3b":  # Qwen/Qwen3-30B-A3B's config.json: every layer sparse, 3.3B of 30.5B active
        return Qwen3MoeConfig(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            max_position_embeddings=40960,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            eos_token_id=0,
            bos_token_id=1,
        )
    if name == "tiny-moe":
        return Qwen3MoeConfig(
            vocab_size=10240,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            max_position_embeddings=4096,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            eos_token_id=0,
            bos_token_id=1,
        )
    raise SystemExit(f"unknown model shape {name!r}; expected one of {', '.join(SHAPES)}")


def word_tokenizer(vocab_size: int) -> Any:
    """A tokenizer whose ids 2.. are the words ``w2``, ``w3``, ...; 0 is ``<eos>`` (and unknown words), 1 ``<bos>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "<bos>": 1} | {f"w{i}": i for i in range(2, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>")
