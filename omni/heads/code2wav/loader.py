"""Loading Qwen3-Omni's code2wav from a local checkpoint directory: its config's ``code2wav_config`` and the
``code2wav.`` tensors of the safetensors shards (nothing else is read)."""

from __future__ import annotations

from pathlib import Path

import torch
from omni_gateway.omni.heads.code2wav.model import Code2Wav, Code2WavConfig
from omni_gateway.omni.heads.token2wav.loader import Token2WavLoadError, checkpoint_tensors

_PREFIX = "code2wav."


class Code2WavLoadError(RuntimeError):
    """The directory is not a Qwen3-Omni checkpoint with a code2wav."""


def load_code2wav(
    path: str | Path,
    *,
    device: str = "auto",
    dtype: torch.dtype = torch.float32,
    tensors: dict[str, torch.Tensor] | None = None,
) -> Code2Wav:
    """``tensors``: code2wav's tensors (without the ``code2wav.`` prefix) to run instead of the checkpoint's, e.g.
    random ones made on the device (``load_format="dummy"``)."""
    from transformers import AutoConfig

    root = Path(path)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        config = AutoConfig.from_pretrained(str(root))
    except (OSError, ValueError) as exc:
        raise Code2WavLoadError(f"{root} holds no readable Hugging Face config: {exc}") from exc
    sub = getattr(config, "code2wav_config", None)
    if sub is None:
        raise Code2WavLoadError(f"{root} is a {config.model_type!r} checkpoint; code2wav needs Qwen3-Omni's")
    if tensors is None:
        try:
            tensors = checkpoint_tensors(root, _PREFIX)
        except Token2WavLoadError as exc:
            raise Code2WavLoadError(str(exc)) from exc
    try:
        return Code2Wav(Code2WavConfig.from_hf(sub), tensors, device, dtype)
    except KeyError as exc:
        raise Code2WavLoadError(f"{root} lacks the code2wav tensor {_PREFIX}{exc.args[0]}") from exc
