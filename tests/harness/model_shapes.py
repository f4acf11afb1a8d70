"""The model shapes the GPU benchmarks and the voice-stage checkpoints build with random weights, and a
word-level tokenizer that covers a whole vocabulary (``w2``, ``w3``, ...), so no weights or tokenizer have to
be downloaded."""

from __future__ import annotations

from typing import Any

SHAPES = ("qwen2.5-0.5b", "llama-3.1-8b", "qwen3-30b-a3b", "tiny-llama", "tiny-moe", "qwen3-omni-30b-a3b")


def shape_config(name: str) -> Any:
    """The ``transformers`` config of a model shape (``SHAPES``): a real model's; ``tiny-llama``, a 4-layer Llama that
    runs a benchmark's whole path on the CPU in seconds; or ``tiny-moe``, a 2-layer Qwen3-MoE with a vocabulary that
    covers the benchmarks' prompt ids (2..10000), to run their MoE paths on the CPU."""
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
    if name == "tiny-llama":
        return LlamaConfig(
            vocab_size=4096,
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            max_position_embeddings=4096,
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
    if name == "qwen3-omni-30b-a3b":
        return qwen3_omni_30b_a3b_config()
    raise SystemExit(f"unknown model shape {name!r}; expected one of {', '.join(SHAPES)}")


_MROPE = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [24, 20, 20], "interleaved": True}


def qwen3_omni_30b_a3b_config() -> Any:
    """Qwen/Qwen3-Omni-30B-A3B-Instruct's config.json: a 48-layer MoE thinker (128 experts, 8 routed), a 20-layer
    MoE talker (128 experts, 6 routed, a shared expert), a 5-layer code predictor over 16 codebooks, code2wav at
    24 kHz, a 32-layer audio tower and a 27-layer vision tower. Special ids are the released tokenizer's."""
    from transformers import Qwen3OmniMoeConfig

    media = {"audio_token_id": 151675, "image_token_id": 151655, "video_token_id": 151656}
    thinker = {
        "text_config": dict(
            vocab_size=152064,
            hidden_size=2048,
            intermediate_size=768,
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
            shared_expert_intermediate_size=0,
            max_position_embeddings=65536,
            rms_norm_eps=1e-6,
            rope_parameters=dict(_MROPE),
            tie_word_embeddings=False,
        ),
        "audio_config": dict(
            num_mel_bins=128,
            d_model=1280,
            encoder_layers=32,
            encoder_attention_heads=20,
            encoder_ffn_dim=5120,
            downsample_hidden_size=480,
            output_dim=2048,
            n_window=50,
            n_window_infer=800,
            conv_chunksize=500,
            max_source_positions=1500,
            activation_function="gelu",
        ),
        "vision_config": dict(
            depth=27,
            hidden_size=1152,
            intermediate_size=4304,
            num_heads=16,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=2048,
            num_position_embeddings=2304,
            deepstack_visual_indexes=[8, 16, 24],
            hidden_act="gelu_pytorch_tanh",
        ),
        **media,
        "audio_start_token_id": 151669,
        "audio_end_token_id": 151670,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "user_token_id": 872,
        "position_id_per_seconds": 13,
        "seconds_per_chunk": 2,
    }
    talker = {
        "text_config": dict(
            vocab_size=3072,
            hidden_size=1024,
            intermediate_size=2048,
            moe_intermediate_size=384,
            shared_expert_intermediate_size=768,
            num_hidden_layers=20,
            num_attention_heads=16,
            num_key_value_heads=2,
            head_dim=128,
            num_experts=128,
            num_experts_per_tok=6,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            max_position_embeddings=65536,
            rms_norm_eps=1e-6,
            rope_parameters=dict(_MROPE),
            tie_word_embeddings=False,
        ),
        "code_predictor_config": dict(
            vocab_size=2048,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=5,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            num_code_groups=16,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=False,
        ),
        **media,
        "num_code_groups": 16,
        "thinker_hidden_size": 2048,
        "accept_hidden_layer": 24,
        "spatial_merge_size": 2,
        "position_id_per_seconds": 13,
        "seconds_per_chunk": 2,
        "audio_start_token_id": 151669,
        "audio_end_token_id": 151670,
        "vision_start_token_id": 151652,
        "codec_pad_id": 2148,
        "codec_bos_id": 2149,
        "codec_eos_token_id": 2150,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303},
    }
    code2wav = dict(
        codebook_size=2048,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=8000,
        sliding_window=72,
        rms_norm_eps=1e-5,
        layer_scale_initial_scale=0.01,
        num_quantizers=16,
        num_semantic_quantizers=1,
        semantic_codebook_size=4096,
        vector_quantization_hidden_dimension=512,
        codebook_dim=512,
        decoder_dim=1536,
        upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    return Qwen3OmniMoeConfig(
        architectures=["Qwen3OmniMoeForConditionalGeneration"],
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        enable_audio_output=True,
        im_start_token_id=151644,
        im_end_token_id=151645,
        system_token_id=8948,
        user_token_id=872,
        assistant_token_id=77091,
        tts_pad_token_id=151671,
        tts_bos_token_id=151672,
        tts_eos_token_id=151673,
    )


def word_tokenizer(vocab_size: int) -> Any:
    """A tokenizer whose ids 2.. are the words ``w2``, ``w3``, ...; 0 is ``<eos>`` (and unknown words), 1 ``<bos>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "<bos>": 1} | {f"w{i}": i for i in range(2, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>")


def fill_fused_experts(model: Any, std: float = 0.02) -> None:
    """Draws a transformers model's fused expert tensors (``...mlp.experts.gate_up_proj`` / ``down_proj``) from
    N(0, std). transformers leaves them uninitialized (``torch.empty``: garbage, at times inf or NaN) in a model built
    after another model of the same family in the process, so random-weight models never rely on its init for them."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".mlp.experts." in name:
                param.normal_(0.0, std)
