"""Loading a diffusers text-to-image transformer pipeline from a local directory.

Supported: pipelines whose denoiser is a transformer and whose latents decode through ``vae``
(PixArt-alpha/Sigma, Stable Diffusion 3 and their relatives). Components that ``model_index.json``
lists as ``[null, null]`` (SD3 saved without its T5 encoder, say) are passed as ``None`` so that
diffusers does not insist on them.
"""

from __future__ import annotations

import inspect
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omni_gateway.omni.heads.dit.errors import ImageModelLoadError
from omni_gateway.omni.heads.dit.options import ImageLimits

log = logging.getLogger(__name__)

SUPPORTED_PIPELINES = frozenset({"PixArtAlphaPipeline", "PixArtSigmaPipeline", "StableDiffusion3Pipeline"})


@dataclass(frozen=True, slots=True)
class ImageHeadConfig:
    min_side: int = 32
    max_side: int = 2048
    max_steps: int = 100
    max_images: int = 4  # per request (OpenAI's ``n``)
    max_guidance: float = 30.0
    max_batch_images: int = 8  # per denoising loop, summed over the requests batched together
    batch_window_s: float = 0.01
    preview_max_side: int = 256  # previews are decoded from pooled latents at most this large
    queue_size: int = 16  # outputs buffered per request before denoising waits for the consumer


def select_device(device: str = "auto") -> tuple[torch.device, torch.dtype]:
    """cuda with bf16 (fp16 on cards without bf16) when available, else cpu with fp32."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ImageModelLoadError(f"device must be 'auto', 'cpu' or 'cuda[:N]'; got {device!r}") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ImageModelLoadError(f"device {device!r} was asked for but torch sees no CUDA device")
        return dev, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dev.type != "cpu":
        raise ImageModelLoadError(f"device must be 'auto', 'cpu' or 'cuda[:N]'; got {device!r}")
    return dev, torch.float32


def read_model_index(path: str | Path) -> dict[str, Any]:
    root = Path(path)
    if not root.is_dir():
        raise ImageModelLoadError(f"image model directory {str(root)!r} does not exist or is not a directory")
    index = root / "model_index.json"
    if not index.is_file():
        raise ImageModelLoadError(f"{str(root)!r} is not a diffusers pipeline directory: model_index.json is missing")
    try:
        data = json.loads(index.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImageModelLoadError(f"{index} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("_class_name"), str):
        raise ImageModelLoadError(f"{index} names no pipeline class (_class_name)")
    if data["_class_name"] not in SUPPORTED_PIPELINES:
        raise ImageModelLoadError(
            f"pipeline {data['_class_name']!r} in {str(root)!r} is not supported; "
            f"expected one of {sorted(SUPPORTED_PIPELINES)}"
        )
    return data


def load_pipeline(path: str | Path, device: torch.device, dtype: torch.dtype) -> Any:
    index = read_model_index(path)
    from diffusers import DiffusionPipeline  # slow to import: only once the directory looks right

    absent = {
        name: None
        for name, spec in index.items()
        if not name.startswith("_") and isinstance(spec, list) and spec == [None, None]
    }
    try:
        pipe = DiffusionPipeline.from_pretrained(str(path), dtype=dtype, local_files_only=True, **absent)
    except Exception as exc:  # diffusers, transformers and safetensors each raise their own kinds
        raise ImageModelLoadError(f"could not load the {index['_class_name']} in {str(path)!r}: {exc}") from exc
    for part in ("transformer", "vae", "scheduler"):
        if getattr(pipe, part, None) is None:
            raise ImageModelLoadError(f"the pipeline in {str(path)!r} has no {part}")
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def image_limits(pipe: Any, config: ImageHeadConfig) -> ImageLimits:
    """Size granularity and bounds from the model; step and guidance defaults from the pipeline's own call."""
    vae_scale = int(getattr(pipe, "vae_scale_factor", 8))
    patch = int(getattr(pipe.transformer.config, "patch_size", 1) or 1)
    granularity = vae_scale * patch
    max_side = config.max_side
    pos_embed_max = getattr(pipe.transformer.config, "pos_embed_max_size", None)
    if pos_embed_max:  # SD3-style cropped positional embeddings cover at most this many patches per side
        max_side = min(max_side, int(pos_embed_max) * granularity)
    min_side = max(config.min_side, granularity)
    # PixArt's single-step path reads a second scheduler output that multistep solvers do not return.
    min_steps = 2 if type(pipe).__name__.startswith("PixArt") else 1
    params = inspect.signature(pipe.__call__).parameters
    return ImageLimits(
        granularity=granularity,
        min_side=min_side,
        max_side=max_side,
        min_steps=min_steps,
        max_steps=config.max_steps,
        max_images=config.max_images,
        max_guidance=config.max_guidance,
        default_steps=_default(params, "num_inference_steps", 20),
        default_guidance=float(_default(params, "guidance_scale", 4.5)),
    )


def _default(params: Any, name: str, fallback: Any) -> Any:
    p = params.get(name)
    return fallback if p is None or p.default is inspect.Parameter.empty or p.default is None else p.default
