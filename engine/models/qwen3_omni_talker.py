"""Qwen3-Omni's talker: a mixture-of-experts decoder (with a shared expert) over codec frames, conditioned on the
thinker's states; it predicts a frame's first codebook, its code predictor (qwen3_omni_code_predictor.py) the rest.

Every input row is built outside the decoder at the talker's width (qwen3_omni_talker_inputs.py): the prompt's
rows in full (projected thinker states plus codec embeddings), and a generated position's row as the sum of
the previous frame's residual codebook embeddings plus the projected text in step with it. The decoder adds
``embeds`` rows to the embedding of the position's token: the first codebook's code at generated positions
(Hugging Face's ``codec_embedding`` of it), and at prompt positions that carry no code the ``silent`` id,
whose embedding counts as zero. The silent id is one of the special ids the talker never emits and the
config names for nothing (Hugging Face's generate suppresses the whole special range but the codec end).

Layers are Qwen3-MoE's (q/k norms, experts routed by softmax then top-k, every layer sparse: the talker's
layers ignore ``mlp_only_layers``/``decoder_sparse_step``) and positions are interleaved multimodal rotary
positions; a text-only prompt has all three axes equal, which is the plain rotary table.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.models.qwen2_vl import _rope_parameters, axis_of_frequency
from omni_gateway.engine.models.talker_checkpoint import PREFIX, loaded_talker, read_config, read_talker_tensors
from omni_gateway.engine.models.talker_decoder import TalkerDecoder

TALKER_ARCHITECTURE = "Qwen3OmniMoeTalkerForConditionalGeneration"
_SPECIAL_RANGE = 1024  # the talker vocabulary's last ids are special tokens, not sounds


@dataclass(frozen=True, slots=True)
class Qwen3TalkerTokens:
    """Codec ids (the talker's vocabulary) and the speaker map of a Qwen3-Omni talker config."""

    codec_pad: int
    codec_bos: int
    codec_eos: int
    codec_nothink: int
    codec_think_bos: int
    codec_think_eos: int
    speakers: tuple[tuple[str, int], ...]  # (voice, codec id), as the config lists them
    vocab_size: int

    @classmethod
    def from_hf(cls, talker_cfg: Any) -> Qwen3TalkerTokens:
        text = getattr(talker_cfg, "text_config", talker_cfg)
        return cls(
            codec_pad=int(talker_cfg.codec_pad_id),
            codec_bos=int(talker_cfg.codec_bos_id),
            codec_eos=int(talker_cfg.codec_eos_token_id),
            codec_nothink=int(talker_cfg.codec_nothink_id),
            codec_think_bos=int(talker_cfg.codec_think_bos_id),
            codec_think_eos=int(talker_cfg.codec_think_eos_id),
            speakers=tuple((str(k), int(v)) for k, v in dict(getattr(talker_cfg, "speaker_id", None) or {}).items()),
            vocab_size=int(text.vocab_size),
        )

    @property
    def voices(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.speakers)

    def speaker(self, voice: str) -> int:
        """The codec id of ``voice`` (case-insensitive, as Hugging Face looks it up)."""
        ids = {name.lower(): code for name, code in self.speakers}
        if voice.lower() not in ids:
            known = ", ".join(self.voices) or "none"
            raise ValueError(f"unknown voice {voice!r}; this talker speaks as: {known}")
        return ids[voice.lower()]

    @property
    def suppressed(self) -> list[int]:
        """Special ids the talker must not emit: the special range but the codec end (as Hugging Face's generate)."""
        lo = max(self.vocab_size - _SPECIAL_RANGE, 0)
        return [i for i in range(lo, self.vocab_size) if i != self.codec_eos]

    @property
    def silent(self) -> int:
        """The id of prompt positions without a code: the highest suppressed id the config names for nothing."""
        named = {self.codec_pad, self.codec_bos, self.codec_eos, self.codec_nothink}
        named |= {self.codec_think_bos, self.codec_think_eos} | {code for _, code in self.speakers}
        free = [i for i in self.suppressed if i not in named]
        if not free:
            raise ModelLoadError("the talker's special ids leave none free for prompt positions without a code")
        return free[-1]

    @property
    def stop_ids(self) -> frozenset[int]:
        return frozenset((self.codec_eos,))


class Qwen3OmniTalkerModel(TalkerDecoder):
    def __init__(self, hf_config: Any, weights: dict[str, torch.Tensor], **kwargs: Any) -> None:
        super().__init__(hf_config, weights, **kwargs)
        self.tokens: Qwen3TalkerTokens = hf_config.talker_tokens
        self.blank = self.tokens.silent
        # Qwen3's interleaved layout, whatever the config's rope parameters say.
        section = [int(n) for n in _rope_parameters(hf_config)["mrope_section"]]
        self.axis_of_freq = axis_of_frequency(section, self.shape.head_dim // 2, interleaved=True).to(self.device)
        self.suppressed = torch.tensor(self.tokens.suppressed, dtype=torch.long, device=self.device)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        logits[:, self.suppressed] = float("-inf")
        return logits


def talker_config(hf_config: Any) -> Any:
    """The talker decoder's config out of a Qwen3-Omni config, named so the registry picks this model; it
    carries the codec ids as ``talker_tokens``."""
    sub = getattr(hf_config, "talker_config", None)
    text = getattr(sub, "text_config", None)
    if sub is None or text is None or getattr(sub, "code_predictor_config", None) is None:
        raise ModelLoadError(
            f"config of model type {getattr(hf_config, 'model_type', None)!r} has no Qwen3-Omni talker_config "
            "(expected a Qwen3-Omni checkpoint that speaks)"
        )
    cfg = copy.deepcopy(text)
    cfg.architectures = [TALKER_ARCHITECTURE]
    cfg.model_type = "qwen3_moe"  # Qwen3-MoE layers: per-head q/k norms
    cfg.mlp_only_layers = []  # every talker layer is sparse, whatever the config says
    cfg.decoder_sparse_step = 1
    cfg.talker_tokens = Qwen3TalkerTokens.from_hf(sub)
    return cfg


def talker_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The talker decoder's tensors under the decoder's names (``model.*``, ``lm_head``)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        if name.startswith(PREFIX + "model."):
            name = name[len(PREFIX) :]
            out["model.embed_tokens.weight" if name == "model.codec_embedding.weight" else name] = tensor
        elif name == PREFIX + "codec_head.weight":
            out["lm_head.weight"] = tensor
    return out


def decoder_checkpoint_name(name: str) -> str:
    """The checkpoint's name of the talker decoder's tensor ``name`` (``talker_weights`` backwards)."""
    if name == "lm_head.weight":
        return PREFIX + "codec_head.weight"
    if name == "model.embed_tokens.weight":
        return PREFIX + "model.codec_embedding.weight"
    return PREFIX + name


def load_talker(
    path: str | Path,
    max_model_len: int | None = None,
    tensors: dict[str, torch.Tensor] | None = None,
    source: Any = None,
) -> Any:
    """A ``LoadedModel`` of the talker decoder in a Qwen3-Omni checkpoint directory (for ``LLMEngine(model=...)``).
    ``tensors``: the checkpoint's ``talker.*`` tensors where the caller has read them already. ``source``: a
    ``WeightSource`` under the decoder's names instead (random weights, ``load_format="dummy"``), which the engine
    reads on its device."""
    from omni_gateway.engine.models.llama_shape import missing_weights

    root = Path(path)
    cfg = talker_config(read_config(root))
    if source is not None:
        weights: dict[str, torch.Tensor] = {}
        missing = missing_weights(cfg, dict.fromkeys(source.names()))
    else:
        weights = talker_weights(tensors if tensors is not None else read_talker_tensors(root))
        missing = missing_weights(cfg, weights)
    return loaded_talker(
        root,
        cfg,
        architecture=TALKER_ARCHITECTURE,
        stop_ids=cfg.talker_tokens.stop_ids,
        weights=weights,
        missing=missing,
        max_model_len=max_model_len,
        source=source,
    )
