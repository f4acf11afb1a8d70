"""Qwen3-Omni's audio tower (``Qwen3OmniMoeForConditionalGeneration``'s ``thinker.audio_tower``): log-mel -> the
thinker's hidden size.

It differs from Qwen2.5-Omni's Whisper-style tower in three ways, all followed here:

- Downsampling: the mel frames are cut into chunks of ``2 * n_window`` (100) frames, the last one shorter and
  zero-padded to the longest chunk; three stride-2 3x3 Conv2d over (mel bins, frames) with GELU divide both by 8,
  and ``conv_out`` flattens channels x bins into ``d_model``. A full chunk gives 13 frames; each chunk's frames
  take the sinusoidal positions from 0 again, and only the frames of real (unpadded) input are kept.
- Attention windows: the kept frames attend within windows of ``n_window_infer / (2 * n_window)`` chunks
  (8 s of audio in the released checkpoint), not over the whole clip. A window's embeddings therefore depend on
  its own mel frames alone (and, for a last chunk shorter than ``2 * n_window``, on whether the clip has a whole
  chunk, which its zero padding follows): the tower is ``chunk_stable``, its groups are the windows
  (``GroupedAudioEncoder``), and a turn still spoken is heard window by window as they settle.
- Output projection: ``ln_post``, then ``proj1``, the activation and ``proj2`` (no average pooling).

The forward is ours, over the Hugging Face module's parameters (built from the checkpoint's config, loaded
with the ``thinker.audio_tower.`` weights), so it does not depend on how a transformers release packs the
chunks for its attention kernels. Features are the checkpoint's Whisper feature extractor's over the whole clip
(128 bins, not truncated to its 30 s window), as Qwen3-Omni's processor makes them.

``fill`` (``load_format="dummy"``) makes each tensor, by its checkpoint name and shape, instead of reading the
checkpoint: the module is built on the meta device and takes the made tensors as they are (on the device, in its
dtype), so a random tower never passes through host memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omni_gateway.encoders.audio_checkpoint import load_tower, special_token_ids, thinker_token_rows, tower_weights
from omni_gateway.encoders.audio_encoder import AudioLoadError, AudioPlaceholders
from omni_gateway.encoders.audio_grouped import GroupedAudioEncoder

_TOWER = "thinker.audio_tower."
_EMBED = "thinker.model.embed_tokens.weight"


def frames_after_convs(frames: int) -> int:
    """Frames left of ``frames`` mel frames after the three stride-2 convolutions (kernel 3, padding 1)."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


def chunk_lengths(frames: int, n_window: int) -> list[int]:
    """Mel frames of each chunk of a clip of ``frames`` frames: ``2 * n_window`` each, the last the rest."""
    chunk = 2 * n_window
    return [chunk] * (frames // chunk) + ([frames % chunk] if frames % chunk else [])


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """``[length, channels]`` Whisper's sinusoidal positions: sines, then cosines."""
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-increment * torch.arange(channels // 2).float())
    scaled = torch.arange(length)[:, None].float() * inv_timescales[None, :]
    return torch.cat([scaled.sin(), scaled.cos()], dim=1)


class Qwen3OmniAudioTower(GroupedAudioEncoder):
    family = "qwen3_omni"

    def __init__(
        self,
        model_dir: Path,
        hf_config: Any,
        fill: Callable[[str, tuple[int, ...]], torch.Tensor] | None = None,
        **kwargs: Any,
    ) -> None:
        thinker = getattr(hf_config, "thinker_config", hf_config)
        super().__init__(model_dir, thinker, **kwargs)
        self.fill = fill
        try:
            from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeAudioEncoder
        except ImportError as exc:
            raise AudioLoadError(f"this transformers release has no Qwen3-Omni audio encoder: {exc}") from None
        config = thinker.audio_config
        if fill is None:
            tower = Qwen3OmniMoeAudioEncoder._from_config(config)
            load_tower(
                tower, tower_weights(model_dir, ("thinker.audio_tower.", "audio_tower.")), "audio tower", model_dir
            )
            self.tower = tower.to(device=self.device, dtype=self.dtype).eval()
        else:
            with torch.device("meta"):
                tower = Qwen3OmniMoeAudioEncoder._from_config(config)
            shapes = {name: tuple(t.shape) for name, t in tower.state_dict().items()}
            # Buffers left out of the state dict stay empty: the forward here reads the parameters only.
            tower.to_empty(device=self.device)
            made = {name: fill(_TOWER + name, shape) for name, shape in shapes.items()}
            tower.load_state_dict(made, assign=True)
            self.tower = tower.eval()
        self.n_window = int(config.n_window)
        self.window_chunks = max(1, int(config.n_window_infer) // (2 * self.n_window))
        self.group_frames = 2 * self.n_window * self.window_chunks  # one attention window of a clip's chunks
        self.num_heads = int(config.encoder_attention_heads)
        self.positions = sinusoids(int(config.max_source_positions), int(config.d_model)).to(self.device, self.dtype)
        from transformers.activations import ACT2FN

        self.act = ACT2FN[config.activation_function]
        self.max_samples = None  # any length: the processor does not truncate, the tower windows it
        tokens = special_token_ids(model_dir)
        end = tokens.get("<|audio_end|>", tokens.get("<|audio_eos|>"))
        self.placeholders = AudioPlaceholders(
            audio=int(thinker.audio_token_id), start=int(thinker.audio_start_token_id), end=end
        )
        # Audio heard inside a video (``omni.audio_in_video``) is interleaved with the frames token by token in time.
        self.video_token = int(thinker.video_token_id)
        vision_end = getattr(thinker, "vision_end_token_id", None)
        self.vision_end = vision_end if vision_end is not None else tokens.get("<|vision_eos|>")
        self._marker_rows: torch.Tensor | None = None

    def marker_embeds(self) -> torch.Tensor:
        """``[3, hidden]`` token embeddings of audio start, audio end and vision end: an interleaved video span
        carries its own markers (the end markers sit where the last piece of the span puts them)."""
        if self._marker_rows is None:
            ids = [self.placeholders.start, self.placeholders.end, self.vision_end]
            if self.fill is None:
                rows = thinker_token_rows(self.model_dir, ids)
            elif any(i is None for i in ids):
                raise AudioLoadError(f"the tokenizer of {str(self.model_dir)!r} lacks an audio or vision marker token")
            else:
                text = self.hf_config.text_config
                table = self.fill(_EMBED, (int(text.vocab_size), int(text.hidden_size)))
                rows = table[torch.tensor(ids, device=table.device)]
            self._marker_rows = rows.to(device=self.device, dtype=self.dtype)
        return self._marker_rows

    def embeddings_for(self, samples: int) -> int:
        frames = -(-samples // int(self.extractor.hop_length))  # the extractor's attention mask, one per hop
        return sum(frames_after_convs(n) for n in chunk_lengths(frames, self.n_window))

    def shortest_samples(self) -> int:
        return 1

    def mel(self, samples: np.ndarray) -> torch.Tensor:
        """``[mels, frames]`` log-mel of the whole clip (its real frames), as Qwen3-Omni's processor makes it."""
        batch = self._features(samples, padding=True, truncation=False, return_attention_mask=True)
        mask = batch["attention_mask"][0].bool()
        return batch["input_features"][0][:, mask]

    def _group_context(self, whole: int) -> tuple[str, ...]:
        return (str(min(whole, 2 * self.n_window)),)  # the length a short last chunk is zero-padded to

    def _encode_groups(self, groups: list[torch.Tensor], whole: int) -> list[torch.Tensor]:
        """Each group (at most one attention window of a clip of ``whole`` mel frames) encoded in one pass. As
        transformers batches a clip's chunks, every chunk is zero-padded to the clip's longest: ``2 * n_window``
        frames once the clip has a whole chunk."""
        t = self.tower
        lengths = [chunk_lengths(int(g.shape[1]), self.n_window) for g in groups]
        pieces = [c for g, n in zip(groups, lengths) for c in g.T.split(n)]  # [len, mels] each
        longest = min(whole, 2 * self.n_window)
        chunks = torch.stack([F.pad(c, (0, 0, 0, longest - c.shape[0])) for c in pieces])  # [C, len, mels]
        x = chunks.to(device=self.device, dtype=self.dtype).transpose(1, 2).unsqueeze(1)  # [C, 1, mels, len]
        for conv in (t.conv2d1, t.conv2d2, t.conv2d3):
            x = F.gelu(conv(x))
        c, channels, bins, frames = x.shape
        x = t.conv_out(x.permute(0, 3, 1, 2).reshape(c, frames, channels * bins)) + self.positions[:frames]
        kept = [frames_after_convs(int(p.shape[0])) for p in pieces]
        hidden = torch.cat([x[i, :n] for i, n in enumerate(kept)])
        sizes = [sum(frames_after_convs(n) for n in group) for group in lengths]  # one attention window each
        for layer in t.layers:
            hidden = hidden + self._attention(layer.self_attn, layer.self_attn_layer_norm(hidden), sizes)
            hidden = hidden + layer.fc2(self.act(layer.fc1(layer.final_layer_norm(hidden))))
        return [e.detach() for e in t.proj2(self.act(t.proj1(t.ln_post(hidden)))).split(sizes)]

    def _attention(self, attn: Any, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Bidirectional attention of ``x [T, d]`` within consecutive windows of ``sizes`` rows."""
        heads, projections = self.num_heads, (attn.q_proj, attn.k_proj, attn.v_proj)
        out = []
        for part in x.split(sizes):
            n = part.shape[0]
            q, k, v = (proj(part).view(n, heads, -1).transpose(0, 1) for proj in projections)
            out.append(F.scaled_dot_product_attention(q, k, v).transpose(0, 1).reshape(n, -1))
        return attn.out_proj(torch.cat(out))
