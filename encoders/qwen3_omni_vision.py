"""Qwen3-Omni's vision tower (``Qwen3OmniMoeForConditionalGeneration``'s ``thinker.visual``, a Qwen3-VL ViT): pixels
-> the thinker's hidden size, plus the DeepStack features the decoder adds at the image tokens.

What it does, as transformers' ``Qwen3OmniMoeVisionEncoder``:

- Patches: the checkpoint's Qwen2-VL image processor (resize to a multiple of ``patch_size * merge_size``,
  normalise, the picture repeated over ``temporal_patch_size`` slots) gives ``[t*h*w, 3*tp*p*p]`` rows in
  merge-block order (each ``merge x merge`` block of patches consecutive); a Conv3d embeds them.
- Learned positions: a square ``num_position_embeddings`` table, bilinearly resampled (corners aligned) to the
  ``h x w`` patch grid, added to the patch embeddings.
- Blocks: pre-norm attention (2-D rotary: half the rotary frequencies follow the patch row, half its column) and a
  GELU MLP; attention spans one frame.
- Outputs: the patch merger (LayerNorm, then an MLP over each ``merge x merge`` block) after the last block gives the
  token embeddings; after each block in ``deepstack_visual_indexes`` a merger of its own (normed after the merge)
  gives one DeepStack feature map, which the decoder adds to the image tokens' hidden states after its layer of the
  same rank (engine/models/llama.py).

The forward is ours, over the Hugging Face module's parameters, as encoders/qwen3_omni_audio.py does for the audio
tower: transformers releases differ in how this module computes its positions and packs its attention. M-RoPE
positions of an image are Qwen2-VL's (time 0, then row and column of each merged token).

Video, as ``Qwen3OmniMoeProcessor`` and the thinker's rope index take it: the sampled frames are sized by the
processor's own video size (``VIDEO_SIZE``, not the checkpoint's image sizes), consecutive frames fill the temporal
slots of a patch, attention spans one temporal patch, and the DeepStack rows go to the video tokens as to an image's.
A temporal patch sits ``temporal_patch_size / fps * position_id_per_seconds`` time positions after the one before.
transformers keeps those positions as floats (never truncated) all the way into the rotary; the engine's are
integers, so a frame rate whose step is not a whole number is refused rather than rounded.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omni_gateway.encoders.audio_checkpoint import special_token_ids
from omni_gateway.encoders.vision import (
    PlaceholderTokens,
    Qwen2VLVision,
    UnusableImage,
    VisionEncoder,
    VisionLoadError,
    VisualFeatures,
    _load_module,
    _vision_weights,
)

# Qwen3OmniMoeProcessor's videos_kwargs: frame sizes in pixels, at least 128 and at most 768 merged 32x32 blocks a
# frame. The processor passes them to its video processor on every call, so they win over the checkpoint's config.
VIDEO_SIZE = {"shortest_edge": 128 * 32 * 32, "longest_edge": 768 * 32 * 32}


def block_order(rows: torch.Tensor, h: int, w: int, merge: int) -> torch.Tensor:
    """``rows [h*w, ...]`` in raster order -> merge-block order, the order the image processor lays patches in."""
    tail = rows.shape[1:]
    blocks = rows.reshape(h // merge, merge, w // merge, merge, *tail).transpose(1, 2)
    return blocks.reshape(h * w, *tail)


def grid_positions(h: int, w: int, merge: int) -> torch.Tensor:
    """int64 ``[h*w, 2]``: (row, column) of each patch in merge-block order."""
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return block_order(torch.stack((rows, cols), dim=-1).reshape(h * w, 2), h, w, merge)


def resampled_positions(table: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``[h*w, dim]`` raster rows: the square learned table ``[side*side, dim]`` resampled bilinearly to ``h x w``
    with corners aligned (the first and last rows and columns of the grid take the table's own)."""
    side = int(round(table.shape[0] ** 0.5))
    if side * side != table.shape[0]:
        raise VisionLoadError(f"the vision position table has {table.shape[0]} rows; expected a square number")
    square = table.float().T.reshape(1, -1, side, side)
    grid = F.interpolate(square, size=(h, w), mode="bilinear", align_corners=True)
    return grid.reshape(-1, h * w).T


class Qwen3OmniVision(Qwen2VLVision):
    family = "qwen3_omni"
    weight_prefixes = ("thinker.visual.",)

    def __init__(self, model_dir: Path, hf_config: Any, **kwargs: Any) -> None:
        thinker = getattr(hf_config, "thinker_config", hf_config)
        VisionEncoder.__init__(self, model_dir, thinker, **kwargs)
        try:
            from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeVisionEncoder
        except ImportError as exc:
            raise VisionLoadError(f"this transformers release has no Qwen3-Omni vision encoder: {exc}") from None
        config = thinker.vision_config
        tower = Qwen3OmniMoeVisionEncoder._from_config(config)
        _load_module(tower, _vision_weights(model_dir, self.weight_prefixes), "vision tower", model_dir)
        self.tower = tower.to(device=self.device, dtype=self.dtype).eval()
        self.merge = int(config.spatial_merge_size)
        self.temporal_patch = int(config.temporal_patch_size)
        self.patch = int(config.patch_size)
        self.num_heads = int(config.num_heads)
        self.deepstack_layers = [int(i) for i in config.deepstack_visual_indexes]
        # The checkpoint names them ``merger_list``; some releases also call them ``deepstack_merger_list``.
        self.deepstack_mergers = getattr(tower, "merger_list", None) or tower.deepstack_merger_list
        if len(self.deepstack_layers) != len(self.deepstack_mergers):
            raise VisionLoadError(
                f"{len(self.deepstack_layers)} DeepStack layers but {len(self.deepstack_mergers)} DeepStack mergers"
            )
        head_dim = int(config.hidden_size) // self.num_heads
        theta = float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        quarter = head_dim // 2
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, quarter, 2, dtype=torch.float32) / quarter))
        from transformers.activations import ACT2FN

        self.act = ACT2FN[config.hidden_act]
        tokens = special_token_ids(model_dir)
        end = getattr(thinker, "vision_end_token_id", None)
        end = end if end is not None else tokens.get("<|vision_end|>", tokens.get("<|vision_eos|>"))
        if end is None:
            raise VisionLoadError(f"the tokenizer of {str(model_dir)!r} has no <|vision_end|> token")
        self.placeholders = PlaceholderTokens(
            image=int(thinker.image_token_id),
            video=int(thinker.video_token_id),
            start=int(thinker.vision_start_token_id),
            end=int(end),
        )

    def video_sizing(self) -> dict[str, Any]:
        return {"size": dict(VIDEO_SIZE)}

    def time_interval(self, fps: float) -> torch.Tensor | None:
        # float32 as the rope index computes it: seconds per temporal patch times positions per second.
        seconds = torch.tensor(self.temporal_patch / fps, dtype=torch.float32)
        step = seconds * float(self.hf_config.position_id_per_seconds)
        if not math.isclose(float(step), round(float(step)), rel_tol=0.0, abs_tol=1e-4):
            raise UnusableImage(
                f"at {fps:g} frames a second this model's video positions advance {float(step):g} per temporal "
                f"patch; it takes frame rates that make this a whole number, such as 1 or 0.5 frames a second"
            )
        return step.round()

    @torch.inference_mode()
    def _encode(
        self, pixels: torch.Tensor, grid: torch.Tensor, key: str, interval: torch.Tensor | None = None
    ) -> VisualFeatures:
        t, h, w = (int(v) for v in grid)
        embeds, deepstack = self.forward(pixels.to(device=self.device, dtype=self.dtype), t, h, w)
        m = self.merge
        times = torch.arange(t) if interval is None else torch.arange(t) * interval.long()
        tt, hh, ww = torch.meshgrid(times, torch.arange(h // m), torch.arange(w // m), indexing="ij")
        positions = torch.stack((tt, hh, ww)).reshape(3, -1)
        if embeds.shape[0] != positions.shape[1]:
            raise RuntimeError(f"vision tower gave {embeds.shape[0]} embeddings for a {t}x{h // m}x{w // m} grid")
        return VisualFeatures(embeds=embeds, key=key, positions=positions, deepstack=deepstack)

    def forward(self, pixels: torch.Tensor, t: int, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Token embeddings ``[t*h*w / merge², out]`` and DeepStack features ``[layers, t*h*w / merge², out]`` of
        ``pixels [t*h*w, 3*tp*p*p]``, a ``t x h x w`` patch grid in merge-block order."""
        tower, m = self.tower, self.merge
        proj = tower.patch_embed.proj
        x = proj(pixels.view(-1, proj.in_channels, self.temporal_patch, self.patch, self.patch)).view(t * h * w, -1)
        learned = block_order(resampled_positions(tower.pos_embed.weight, h, w), h, w, m)
        x = x + learned.to(x.dtype).repeat(t, 1)
        cos, sin = self._rotary(h, w)
        features = []
        for index, block in enumerate(tower.blocks):
            x = x + self._attention(block.attn, block.norm1(x), cos, sin, frames=t)
            x = x + block.mlp.linear_fc2(self.act(block.mlp.linear_fc1(block.norm2(x))))
            if index in self.deepstack_layers:
                merger = self.deepstack_mergers[self.deepstack_layers.index(index)]
                features.append(self._merge(merger, x, norm_after=True))
        embeds = self._merge(tower.merger, x, norm_after=False)
        deepstack = torch.stack(features) if features else embeds.new_zeros((0, *embeds.shape))
        return embeds, deepstack

    def _rotary(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 ``[h*w, head_dim]`` cos and sin: the row's frequencies, then the column's, twice over."""
        positions = grid_positions(h, w, self.merge).float()
        angles = (positions[:, :, None] * self.inv_freq).reshape(h * w, -1)  # [row freqs | column freqs]
        angles = torch.cat((angles, angles), dim=-1).to(self.device)
        return angles.cos(), angles.sin()

    def _attention(self, attn: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, frames: int) -> torch.Tensor:
        """Bidirectional attention of ``x [t*h*w, d]`` within each frame, q and k rotated in float32."""
        n = x.shape[0]
        q, k, v = attn.qkv(x).view(n, 3, self.num_heads, -1).unbind(1)
        cos, sin = cos.repeat(frames, 1)[:, None], sin.repeat(frames, 1)[:, None]
        q, k = (_rotate(y.float(), cos, sin).to(x.dtype) for y in (q, k))
        out = []
        for qf, kf, vf in zip(*(y.transpose(0, 1).chunk(frames, dim=1) for y in (q, k, v))):
            out.append(F.scaled_dot_product_attention(qf, kf, vf).transpose(0, 1))
        return attn.proj(torch.cat(out).reshape(n, -1))

    def _merge(self, merger: Any, x: torch.Tensor, *, norm_after: bool) -> torch.Tensor:
        """A patch merger: each ``merge x merge`` block of patch rows -> one token row."""
        width = x.shape[-1] * self.merge**2
        x = merger.ln_q(x.reshape(-1, width)) if norm_after else merger.ln_q(x).reshape(-1, width)
        first, act, last = merger.mlp
        return last(act(first(x)))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin
