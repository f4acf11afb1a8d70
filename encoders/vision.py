"""Vision towers of vision-language checkpoints: pixels -> embeddings in the LLM's hidden size.

Two families, built from the checkpoint's own config with the Hugging Face modules for the towers
and loading only the vision weights (the language model is the engine's):

- LLaVA (``LlavaForConditionalGeneration``): a CLIP-style tower, hidden states of
  ``vision_feature_layer`` (CLS dropped for the ``default`` strategy), then ``multi_modal_projector``.
  A fixed number of tokens per image.
- Qwen2-VL (``Qwen2VLForConditionalGeneration``): the native-resolution ViT with its patch merger;
  tokens per image follow the image size (``grid_thw``), and each token carries a 3-D position
  (time, height, width) for the LLM's M-RoPE. Video frames go in pairs (temporal patch 2).
- Qwen2.5-VL and the Qwen2.5-Omni thinker: the same layout with a windowed-attention ViT; a video's
  temporal positions advance with time (``tokens_per_second`` / ``position_id_per_seconds`` per second).
- The Qwen3-Omni thinker: a Qwen3-VL tower that also hands the decoder DeepStack features
  (encoders/qwen3_omni_vision.py).

Outputs are cached by content hash (encoders/cache.py), so a repeated image or frame is encoded once.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omni_gateway.encoders.cache import EncoderCache, frames_key, image_key
from omni_gateway.encoders.checkpoint_encoder import CheckpointEncoder
from PIL import Image

FAMILIES = {
    "LlavaForConditionalGeneration": "llava",
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Qwen2_5OmniForConditionalGeneration": "qwen2_5_omni",
    "Qwen3OmniMoeForConditionalGeneration": "qwen3_omni",
}


class UnusableImage(ValueError):
    """A decoded image this model's preprocessing refuses (e.g. an extreme aspect ratio); client-safe text."""


class VisionLoadError(RuntimeError):
    """The checkpoint has no usable vision tower (unsupported architecture, missing weights or files)."""


@dataclass(frozen=True, slots=True)
class VisualFeatures:
    """One image or video as the LLM sees it: ``embeds [num_tokens, hidden]``; for M-RoPE models
    ``positions [3, num_tokens]`` (time, height, width offsets from the first token); ``key`` is the
    content hash that also keys the KV prefix cache, or with ``position_keys`` (one per token, for audio
    encoded group by group) the part of the key all its tokens share. ``deepstack [layers, num_tokens, hidden]``:
    rows the decoder adds to these tokens' hidden states after each of its first ``layers`` layers (Qwen3-VL's
    DeepStack)."""

    embeds: torch.Tensor
    key: str
    positions: torch.Tensor | None = None
    position_keys: tuple[int, ...] = ()
    deepstack: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.embeds.shape[0])


@dataclass(frozen=True, slots=True)
class PlaceholderTokens:
    """Token ids the prompt uses around media. ``image``/``video`` is repeated once per embedding;
    ``start``/``end`` wrap each item where the model has them (Qwen2-VL's vision start/end)."""

    image: int
    video: int | None = None
    start: int | None = None
    end: int | None = None


def checkpoint_family(model_dir: str | Path) -> str | None:
    """The family (a value of ``FAMILIES``) of a directory's checkpoint, or None for one that does not see."""
    return architecture_family(model_dir, FAMILIES)


def architecture_family(model_dir: str | Path, families: Mapping[str, str]) -> str | None:
    """``families``' value for the first architecture a directory's ``config.json`` names that it knows; None
    for none, or for a missing or unreadable config."""
    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return None
    try:
        names = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError):
        return None
    return next((families[n] for n in names if n in families), None)


def _vision_weights(model_dir: Path, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The tensors under ``prefixes`` (first matching prefix stripped), read without touching the rest."""
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                for prefix in prefixes:
                    if name.startswith(prefix):
                        out[name[len(prefix) :]] = f.get_tensor(name)
                        break
    return out


def _load_module(module: torch.nn.Module, weights: dict[str, torch.Tensor], what: str, model_dir: Path) -> None:
    result = module.load_state_dict(weights, strict=False)
    # Non-persistent buffers (rotary tables, position ids) are rebuilt by the module itself.
    missing = [n for n in result.missing_keys if n in dict(module.named_parameters())]
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise VisionLoadError(f"{what} weights missing from {str(model_dir)!r}: {shown}")


class VisionEncoder(CheckpointEncoder, abc.ABC):
    """Common part: image processor from the checkpoint, device/dtype, the output cache."""

    family: str
    placeholders: PlaceholderTokens

    def __init__(
        self, model_dir: Path, hf_config: Any, *, device: torch.device, dtype: torch.dtype, cache: EncoderCache | None
    ) -> None:
        from transformers import AutoImageProcessor

        super().__init__(model_dir, hf_config, device=device, dtype=dtype, cache=cache)
        self.processor = self._preprocessor(AutoImageProcessor.from_pretrained, VisionLoadError, "image processor")

    def encode_image(self, image: Image.Image) -> VisualFeatures:
        key = image_key(image, self.settings)
        cached = self.cache.get(key)
        if cached is None:
            self.check_image(image)
            cached = self._encode_image(image, key)
            self.cache.put(key, cached, _nbytes(cached))
        return cached

    def check_image(self, image: Image.Image) -> None:  # noqa: B027 - a hook: most towers take any image
        """Raise UnusableImage for an image the preprocessing cannot take."""

    @abc.abstractmethod
    def encode_video(self, frames: list[Image.Image], fps: float = 1.0) -> list[VisualFeatures]:
        """Features of a frame sequence sampled at ``fps``: one item for models with video support, else one
        per frame."""

    @abc.abstractmethod
    def _encode_image(self, image: Image.Image, key: str) -> VisualFeatures:
        """Run the tower on one image (the cache missed)."""


def _nbytes(features: VisualFeatures) -> int:
    size = features.embeds.numel() * features.embeds.element_size()
    for extra in (features.positions, features.deepstack):
        if extra is not None:
            size += extra.numel() * extra.element_size()
    return size


class LlavaVision(VisionEncoder):
    family = "llava"

    def __init__(self, model_dir: Path, hf_config: Any, **kwargs: Any) -> None:
        super().__init__(model_dir, hf_config, **kwargs)
        from transformers import AutoModel
        from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

        cfg = hf_config
        self.feature_layer = cfg.vision_feature_layer
        self.select_strategy = cfg.vision_feature_select_strategy
        if self.select_strategy not in ("default", "full"):
            raise VisionLoadError(f"unsupported vision_feature_select_strategy {self.select_strategy!r}")
        tower = AutoModel.from_config(cfg.vision_config)
        projector = LlavaMultiModalProjector(cfg)
        _load_module(
            tower, _vision_weights(model_dir, ("model.vision_tower.", "vision_tower.")), "vision tower", model_dir
        )
        _load_module(
            projector,
            _vision_weights(model_dir, ("model.multi_modal_projector.", "multi_modal_projector.")),
            "projector",
            model_dir,
        )
        self.tower = tower.to(device=self.device, dtype=self.dtype).eval()
        self.projector = projector.to(device=self.device, dtype=self.dtype).eval()
        self.placeholders = PlaceholderTokens(image=int(cfg.image_token_id))

    @torch.inference_mode()
    def _encode_image(self, image: Image.Image, key: str) -> VisualFeatures:
        pixels = self.processor(images=[image], return_tensors="pt")["pixel_values"]
        out = self.tower(pixels.to(device=self.device, dtype=self.dtype), output_hidden_states=True)
        layers = [self.feature_layer] if isinstance(self.feature_layer, int) else list(self.feature_layer)
        states = [out.hidden_states[i] for i in layers]
        if self.select_strategy == "default":
            states = [s[:, 1:] for s in states]
        embeds = self.projector(torch.cat(states, dim=-1))[0]
        return VisualFeatures(embeds=embeds, key=key)

    def encode_video(self, frames: list[Image.Image], fps: float = 1.0) -> list[VisualFeatures]:
        # LLaVA has no temporal model: a video is its sampled frames, each an image.
        return [self.encode_image(frame) for frame in frames]


class Qwen2VLVision(VisionEncoder):
    family = "qwen2_vl"
    weight_prefixes: tuple[str, ...] = ("model.visual.", "visual.")

    def __init__(self, model_dir: Path, hf_config: Any, **kwargs: Any) -> None:
        super().__init__(model_dir, hf_config, **kwargs)
        vcfg = hf_config.vision_config
        tower = self.tower_class()._from_config(vcfg)
        _load_module(tower, _vision_weights(model_dir, self.weight_prefixes), "vision tower", model_dir)
        self.tower = tower.to(device=self.device, dtype=self.dtype).eval()
        self.merge = int(vcfg.spatial_merge_size)
        self.temporal_patch = int(vcfg.temporal_patch_size)
        self.patch = int(vcfg.patch_size)
        self.placeholders = PlaceholderTokens(
            image=int(hf_config.image_token_id),
            video=int(hf_config.video_token_id),
            start=int(hf_config.vision_start_token_id),
            end=int(hf_config.vision_end_token_id),
        )

    @staticmethod
    def tower_class() -> Any:
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

        return Qwen2VisionTransformerPretrainedModel

    def time_interval(self, fps: float) -> torch.Tensor | None:
        """Temporal position step per temporal patch of a video sampled at ``fps``; None: one per patch."""
        return None

    def check_image(self, image: Image.Image) -> None:
        # The processor's resize keeps the aspect ratio and refuses beyond 200:1.
        ratio = max(image.size) / min(image.size)
        if ratio > 200:
            raise UnusableImage(f"image is {image.width}x{image.height}; this model takes aspect ratios up to 200:1")

    def _encode_image(self, image: Image.Image, key: str) -> VisualFeatures:
        batch = self.processor(images=[image], return_tensors="pt")
        return self._encode(batch["pixel_values"], batch["image_grid_thw"][0], key)

    def encode_video(self, frames: list[Image.Image], fps: float = 1.0) -> list[VisualFeatures]:
        if not frames:
            raise ValueError("a video needs at least one frame")
        if fps <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        interval = self.time_interval(fps)
        keys = [image_key(f, self.settings) for f in frames]
        key = frames_key(keys, self.settings if interval is None else f"{self.settings} {interval.item()!r}")
        cached = self.cache.get(key)
        if cached is None:
            self.check_image(frames[0])
            pixels, grid = self.video_patches(frames)
            cached = self._encode(pixels, grid, key, interval)
            self.cache.put(key, cached, _nbytes(cached))
        return [cached]

    def video_sizing(self) -> dict[str, Any]:
        """Image processor arguments for video frames where the model's video processor sizes them otherwise."""
        return {}

    def video_patches(self, frames: list[Image.Image]) -> tuple[torch.Tensor, torch.Tensor]:
        """Flattened video patches in the layout of the HF Qwen2-VL video processor: each frame is
        resized and normalized by the image processor (all frames to the first frame's size), then
        consecutive frames fill the temporal slots of one patch (the last frame repeats to pad)."""
        size = frames[0].size
        frames = [f if f.size == size else f.resize(size, Image.Resampling.BICUBIC) for f in frames]
        if pad := -len(frames) % self.temporal_patch:
            frames = frames + [frames[-1]] * pad
        batch = self.processor(images=frames, return_tensors="np", **self.video_sizing())
        grid_h, grid_w = (int(v) for v in batch["image_grid_thw"][0][1:])
        t, p = self.temporal_patch, self.patch
        per_frame = batch["pixel_values"].reshape(len(frames), grid_h * grid_w, 3, t, p, p)[:, :, :, 0]
        grid_t = len(frames) // t
        # [grid_t, t, N, C, p, p] -> [grid_t, N, C, t, p, p]: one patch row holds t frames per channel.
        video = per_frame.reshape(grid_t, t, grid_h * grid_w, 3, p, p).transpose(0, 2, 3, 1, 4, 5)
        flat = np.ascontiguousarray(video).reshape(grid_t * grid_h * grid_w, 3 * t * p * p)
        return torch.from_numpy(flat), torch.tensor([grid_t, grid_h, grid_w])

    @torch.inference_mode()
    def _encode(
        self, pixels: torch.Tensor, grid: torch.Tensor, key: str, interval: torch.Tensor | None = None
    ) -> VisualFeatures:
        out = self.tower(pixels.to(device=self.device, dtype=self.dtype), grid_thw=grid.view(1, 3).to(self.device))
        embeds = out.pooler_output  # after the patch merger: one row per LLM token
        t, h, w = int(grid[0]), int(grid[1]) // self.merge, int(grid[2]) // self.merge
        times = torch.arange(t) if interval is None else (torch.arange(t) * interval).long()
        tt, hh, ww = torch.meshgrid(times, torch.arange(h), torch.arange(w), indexing="ij")
        positions = torch.stack((tt, hh, ww)).reshape(3, -1)
        if embeds.shape[0] != positions.shape[1]:
            raise RuntimeError(f"vision tower gave {embeds.shape[0]} embeddings for a {t}x{h}x{w} grid")
        return VisualFeatures(embeds=embeds, key=key, positions=positions)


class Qwen25VLVision(Qwen2VLVision):
    family = "qwen2_5_vl"

    @staticmethod
    def tower_class() -> Any:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

        return Qwen2_5_VisionTransformerPretrainedModel

    def time_interval(self, fps: float) -> torch.Tensor | None:
        # As the HF rope index computes it: float32 seconds per temporal patch times tokens per second.
        seconds = torch.tensor(self.temporal_patch / fps, dtype=torch.float32)
        return int(self.hf_config.vision_config.tokens_per_second) * seconds


class OmniVision(Qwen2VLVision):
    """The Qwen2.5-Omni thinker's tower (its config and weights sit under ``thinker``)."""

    family = "qwen2_5_omni"
    weight_prefixes = ("thinker.visual.", "visual.")

    def __init__(self, model_dir: Path, hf_config: Any, **kwargs: Any) -> None:
        super().__init__(model_dir, getattr(hf_config, "thinker_config", hf_config), **kwargs)

    @staticmethod
    def tower_class() -> Any:
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniVisionEncoder

        return Qwen2_5OmniVisionEncoder

    def time_interval(self, fps: float) -> torch.Tensor | None:
        seconds = torch.tensor(self.temporal_patch / fps, dtype=torch.float32)
        return seconds * int(self.hf_config.position_id_per_seconds)


_CLASSES: dict[str, type[VisionEncoder]] = {
    "llava": LlavaVision,
    "qwen2_vl": Qwen2VLVision,
    "qwen2_5_vl": Qwen25VLVision,
    "qwen2_5_omni": OmniVision,
}


def load_vision_encoder(
    model_dir: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    cache: EncoderCache | None = None,
) -> VisionEncoder:
    """The vision encoder of a LLaVA, Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni or Qwen3-Omni checkpoint directory."""
    from transformers import AutoConfig

    path = Path(model_dir)
    family = checkpoint_family(path)
    if family is None:
        raise VisionLoadError(
            f"{str(path)!r} is not a vision-language checkpoint; supported architectures: {', '.join(FAMILIES)}"
        )
    if not any(path.glob("*.safetensors")):
        raise VisionLoadError(f"{str(path)!r} has no *.safetensors weights")
    hf_config = AutoConfig.from_pretrained(str(path))
    if family == "qwen3_omni":  # its own module, which builds on this one's Qwen2VLVision
        from omni_gateway.encoders.qwen3_omni_vision import Qwen3OmniVision

        return Qwen3OmniVision(path, hf_config, device=torch.device(device), dtype=dtype, cache=cache)
    return _CLASSES[family](path, hf_config, device=torch.device(device), dtype=dtype, cache=cache)
