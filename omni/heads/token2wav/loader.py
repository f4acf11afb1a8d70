"""Loading Qwen2.5-Omni's token2wav (DiT + BigVGAN) and its speaker map from a local checkpoint directory.

Only the ``token2wav.`` tensors are read from the safetensors shards; the speaker map is ``spk_dict.pt``
(per voice: the speaker embedding ``cond``, a reference mel ``ref_mel`` and the talker's text start
token ``bos_token``). token2wav runs in float32, as the checkpoint's authors require; the DiT may be loaded
in bfloat16 instead (``dit_dtype``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.runner.prefixed_tensors import read_prefixed_tensors

_PREFIX = "token2wav."


class Token2WavLoadError(RuntimeError):
    """The directory is not a Qwen2.5-Omni checkpoint with a token2wav and a speaker map."""


@dataclass(frozen=True, slots=True)
class Speaker:
    cond: torch.Tensor  # [1, enc_emb_dim]
    ref_mel: torch.Tensor  # [1, frames, mel_dim]
    bos_token: int


@dataclass(frozen=True, slots=True)
class Token2WavModels:
    dit: Any  # transformers' Qwen2_5OmniToken2WavDiTModel
    vocoder: Any  # transformers' Qwen2_5OmniToken2WavBigVGANModel
    speakers: dict[str, Speaker]
    device: torch.device


def checkpoint_tensors(path: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint under ``prefix``, with the prefix removed."""
    try:
        tensors = read_prefixed_tensors(path, prefix)
    except ModelLoadError as exc:
        raise Token2WavLoadError(str(exc)) from exc
    return {name[len(prefix) :]: tensor for name, tensor in tensors.items()}


def load_speakers(path: Path, device: torch.device) -> dict[str, Speaker]:
    spk = path / "spk_dict.pt"
    if not spk.is_file():
        raise Token2WavLoadError(f"{path} has no spk_dict.pt (the speaker map token2wav needs)")
    raw = torch.load(spk, map_location="cpu", weights_only=True)
    speakers: dict[str, Speaker] = {}
    for name, entry in raw.items():
        try:
            speakers[str(name)] = Speaker(
                cond=entry["cond"].float().reshape(1, -1).to(device),
                ref_mel=entry["ref_mel"].float().reshape(1, -1, entry["ref_mel"].shape[-1]).to(device),
                bos_token=int(entry["bos_token"]),
            )
        except (KeyError, AttributeError, TypeError) as exc:
            raise Token2WavLoadError(f"speaker {name!r} in {spk} lacks cond/ref_mel/bos_token: {exc}") from exc
    if not speakers:
        raise Token2WavLoadError(f"{spk} names no speakers")
    return speakers


def load_token2wav(path: Path, *, device: str = "auto", dit_dtype: str = "float32") -> Token2WavModels:
    from transformers import AutoConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise Token2WavLoadError(f"{path} holds no readable Hugging Face config: {exc}") from exc
    t2w_config = getattr(config, "token2wav_config", None)
    if t2w_config is None:
        raise Token2WavLoadError(f"{path} is a {config.model_type!r} checkpoint; token2wav needs Qwen2.5-Omni's")
    t2w_config._attn_implementation = "sdpa"
    model = Qwen2_5OmniToken2WavModel(t2w_config)
    tensors = checkpoint_tensors(path, _PREFIX)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing:
        raise Token2WavLoadError(f"{path} lacks token2wav weights: {missing[:4]} ({len(missing)} in all)")
    if unexpected:
        raise Token2WavLoadError(f"{path} has unknown token2wav weights: {unexpected[:4]}")
    model.float().eval()
    model.code2wav_dit_model.to(getattr(torch, dit_dtype))  # before the move: no float32 copy on the device
    model.to(dev)
    return Token2WavModels(
        dit=model.code2wav_dit_model,
        vocoder=model.code2wav_bigvgan_model,
        speakers=load_speakers(path, dev),
        device=dev,
    )
