"""Qwen2.5-Omni's talker: a Qwen2 decoder over codec tokens, conditioned on the thinker's outputs.

Each talker position's input is built in the thinker's embedding space and projected to the talker's
width (``thinker_to_talker_proj``): the codec token's embedding plus a conditioning row, the thinker's
last hidden state plus its input embedding for the text token in step with it. The codec mask token
stands for "no codec token here" and contributes nothing, so a prompt of mask tokens followed by the
codec pad and start tokens reproduces Hugging Face's talker input exactly.

So for this model, ``embeds`` rows (from ``EmbedSpan``s over the prompt and from the sequence's
``input_stream`` over generated positions) are *added* to the codec embeddings rather than replacing
them. Positions are Qwen2-VL's multimodal rotary positions, as in the thinker; for a text-only prompt
all three axes agree and the plain rotary path runs. The talker never emits its codec start token
(Hugging Face's generate suppresses it too).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.models.linear import Linear
from omni_gateway.engine.models.talker_checkpoint import PREFIX, loaded_talker, read_config, read_talker_tensors
from omni_gateway.engine.models.talker_decoder import TalkerDecoder

TALKER_ARCHITECTURE = "Qwen2_5OmniTalkerForConditionalGeneration"


@dataclass(frozen=True, slots=True)
class TalkerTokens:
    """The talker's special ids: codec ones in its own vocabulary, text ones in the thinker's."""

    codec_pad: int
    codec_bos: int
    codec_eos: int
    codec_mask: int
    text_bos: int
    text_eos: int
    text_pad: int

    @classmethod
    def from_hf(cls, cfg: Any) -> TalkerTokens:
        return cls(
            codec_pad=int(cfg.tts_codec_pad_token_id),
            codec_bos=int(cfg.tts_codec_start_token_id),
            codec_eos=int(cfg.tts_codec_end_token_id),
            codec_mask=int(cfg.tts_codec_mask_token_id),
            text_bos=int(cfg.tts_text_start_token_id),
            text_eos=int(cfg.tts_text_end_token_id),
            text_pad=int(cfg.tts_text_pad_token_id),
        )

    @property
    def stop_ids(self) -> frozenset[int]:
        """Codes that end an utterance (Hugging Face's talker stops on the codec pad and end tokens)."""
        return frozenset((self.codec_pad, self.codec_eos))


class Qwen2_5OmniTalkerModel(TalkerDecoder):
    def __init__(self, hf_config: Any, weights: dict[str, torch.Tensor], **kwargs: Any) -> None:
        super().__init__(hf_config, weights, **kwargs)
        self.tokens = TalkerTokens.from_hf(hf_config)
        self.blank = self.tokens.codec_mask
        proj = weights["thinker_to_talker_proj.weight"].to(device=self.device, dtype=self.dtype).contiguous()
        bias = weights["thinker_to_talker_proj.bias"].to(device=self.device, dtype=self.dtype).contiguous()
        self.proj = Linear.build(proj, bias, self.ops.linear, prepack=False)
        self.embedding_size = int(proj.shape[1])

    def to_width(self, rows: torch.Tensor) -> torch.Tensor:
        return self.proj(rows)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        logits[:, self.tokens.codec_bos] = float("-inf")
        return logits


def talker_config(hf_config: Any) -> Any:
    """The talker's config out of a Qwen2.5-Omni config, named so the registry picks this model."""
    sub = getattr(hf_config, "talker_config", None)
    if sub is None:
        raise ModelLoadError(
            f"config of model type {getattr(hf_config, 'model_type', None)!r} has no talker_config "
            "(expected a Qwen2.5-Omni checkpoint that speaks)"
        )
    cfg = copy.deepcopy(sub)
    cfg.architectures = [TALKER_ARCHITECTURE]
    cfg.attention_bias = True  # Qwen2 layers: q/k/v carry biases
    return cfg


def talker_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The talker's tensors under the decoder's names (``model.*``, ``lm_head``, the input projection)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        if not name.startswith(PREFIX):
            continue
        name = name[len(PREFIX) :]
        out["lm_head.weight" if name == "codec_head.weight" else name] = tensor
    return out


def load_talker(path: str | Path, max_model_len: int | None = None) -> Any:
    """A ``LoadedModel`` of the talker in a Qwen2.5-Omni checkpoint directory (for ``LLMEngine(model=...)``)."""
    from omni_gateway.engine.models.llama_shape import missing_weights

    root = Path(path)
    cfg = talker_config(read_config(root))
    weights = talker_weights(read_talker_tensors(root))
    missing = missing_weights(cfg, weights) + [
        n for n in ("thinker_to_talker_proj.weight", "thinker_to_talker_proj.bias") if n not in weights
    ]
    return loaded_talker(
        root,
        cfg,
        architecture=TALKER_ARCHITECTURE,
        stop_ids=TalkerTokens.from_hf(cfg).stop_ids,
        weights=weights,
        missing=missing,
        max_model_len=max_model_len,
    )
