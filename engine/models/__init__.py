"""Model registry: Hugging Face architecture names -> our paged-attention implementations."""

from __future__ import annotations

from typing import Any

from omni_gateway.engine.errors import ModelLoadError

# All of these share one decoder implementation; the differences (qkv bias, per-head q/k norm,
# head_dim, rope scaling) are read from the config and the weights present.
SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    # Mixtures of experts: the same decoder, its sparse layers' MLPs engine/models/moe.py.
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "MixtralForCausalLM",
    # Vision-language checkpoints: the engine runs their language model (engine/models/multimodal.py).
    "LlavaForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    # Audio-in checkpoints: likewise their language model; the audio tower is encoders/audio_tower.py.
    "Qwen2AudioForConditionalGeneration",
    "VoxtralForConditionalGeneration",
    "Qwen2_5OmniForConditionalGeneration",  # the thinker (text out); talker and token2wav are heads
    "Qwen3OmniMoeForConditionalGeneration",  # the thinker: a Qwen3-MoE decoder with interleaved M-RoPE
    # Qwen2.5-Omni's talker (codec tokens from the thinker's states), loaded by qwen2_5_omni_talker.load_talker.
    "Qwen2_5OmniTalkerForConditionalGeneration",
    # Qwen3-Omni's MoE talker (first codebook of each frame), loaded by qwen3_omni_talker.load_talker.
    "Qwen3OmniMoeTalkerForConditionalGeneration",
)

# Architectures whose language model takes multimodal rotary positions (engine/runner/mrope.py).
MROPE_ARCHITECTURES: frozenset[str] = frozenset(
    {
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen2_5OmniForConditionalGeneration",
        "Qwen3OmniMoeForConditionalGeneration",
    }
)

# GGUF ``general.architecture`` values we read, and the HF model_type each becomes.
GGUF_ARCHITECTURES: dict[str, str] = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


def resolve_architecture(hf_config: Any) -> str:
    """The supported architecture named by a config, or ModelLoadError listing the supported ones."""
    names = list(getattr(hf_config, "architectures", None) or [])
    for name in names:
        if name in SUPPORTED_ARCHITECTURES:
            return name
    by_type = {
        "llama": "LlamaForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
        "qwen2_moe": "Qwen2MoeForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM",
        "mixtral": "MixtralForCausalLM",
    }
    model_type = getattr(hf_config, "model_type", None)
    if not names and model_type in by_type:
        return by_type[model_type]
    raise ModelLoadError(
        f"unsupported architecture {names or model_type!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def build_model(hf_config: Any, weights: dict[str, Any], **kwargs: Any) -> Any:
    """The model object for a supported architecture (all run on ``LlamaModel``; M-RoPE ones on its subclass)."""
    architecture = resolve_architecture(hf_config)
    if architecture == "Qwen2_5OmniTalkerForConditionalGeneration":
        from omni_gateway.engine.models.qwen2_5_omni_talker import Qwen2_5OmniTalkerModel

        return Qwen2_5OmniTalkerModel(hf_config, weights, **kwargs)
    if architecture == "Qwen3OmniMoeTalkerForConditionalGeneration":
        from omni_gateway.engine.models.qwen3_omni_talker import Qwen3OmniTalkerModel

        return Qwen3OmniTalkerModel(hf_config, weights, **kwargs)
    if architecture in MROPE_ARCHITECTURES:
        from omni_gateway.engine.models.qwen2_vl import Qwen2VLModel

        return Qwen2VLModel(hf_config, weights, **kwargs)
    from omni_gateway.engine.models.llama import LlamaModel

    return LlamaModel(hf_config, weights, **kwargs)
