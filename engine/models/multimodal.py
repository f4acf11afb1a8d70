"""Vision- and audio-language checkpoints seen from the engine: their language model only.

The engine runs the LLM; the vision and audio towers and projectors are the encoders' business (they
read their own weights from the same directory). Qwen2.5-Omni and Qwen3-Omni nest their LLM in
``thinker_config``; the talker, token2wav and code2wav weights are left to the speech heads. Here the wrapper
config gives way to its text config and the language model's weights are renamed to the plain causal-LM names
the decoder expects.
"""

from __future__ import annotations

from typing import Any

from omni_gateway.engine.errors import ModelLoadError

MULTIMODAL_ARCHITECTURES: tuple[str, ...] = (
    "LlavaForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen2AudioForConditionalGeneration",
    "VoxtralForConditionalGeneration",
    "Qwen2_5OmniForConditionalGeneration",
    "Qwen3OmniMoeForConditionalGeneration",
)

# Checkpoint prefixes of the language model (older and newer transformers layouts) -> causal-LM names.
_LM_PREFIXES = (
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),
    ("thinker.model.", "model."),
    ("thinker.lm_head.", "lm_head."),
)
# Weights that belong to the vision side.
_VISION_PREFIXES = (
    "vision_tower.",
    "multi_modal_projector.",
    "visual.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
    "model.visual.",
    "audio_tower.",
    "model.audio_tower.",
    "thinker.audio_tower.",
    "thinker.visual.",
    "talker.",
    "token2wav.",
    "code2wav.",
)


def multimodal_architecture(hf_config: Any) -> str | None:
    names = list(getattr(hf_config, "architectures", None) or [])
    for name in names:
        if name in MULTIMODAL_ARCHITECTURES:
            return name
    return None


def language_model_config(hf_config: Any) -> Any:
    """The text config of a multimodal checkpoint, naming the wrapper architecture so the registry
    picks the right decoder (``LlavaForConditionalGeneration`` -> the text model's own family)."""
    arch = multimodal_architecture(hf_config)
    outer = getattr(hf_config, "thinker_config", None) or hf_config
    text = getattr(outer, "text_config", None)
    if arch is None or text is None:
        raise ModelLoadError(
            f"config of architecture {getattr(hf_config, 'architectures', None)!r} "
            "has no text_config for its language model"
        )
    text.architectures = [arch]
    # The wrapper owns the LM head, so its setting wins (the Omni thinker's text config says True by default).
    text.tie_word_embeddings = bool(getattr(outer, "tie_word_embeddings", getattr(text, "tie_word_embeddings", False)))
    return text


def language_model_weights(weights: dict[str, Any]) -> dict[str, Any]:
    """The language model's tensors under causal-LM names; vision, audio and speech weights are left out."""
    out: dict[str, Any] = {}
    for name, tensor in weights.items():
        if name.startswith(_VISION_PREFIXES):
            continue
        for old, new in _LM_PREFIXES:
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        out[name] = tensor
    return out
