"""Audio towers of audio-in checkpoints: waveform -> embeddings in the LLM's hidden size.

Three families, each a Whisper-style tower (two convolutions, then transformer layers) built from the
checkpoint's own config with the Hugging Face modules, loading only the audio weights (the language
model is the engine's). Log-mel features come from the checkpoint's feature extractor:

- Qwen2-Audio (``Qwen2AudioForConditionalGeneration``): one window (30 s) padded to full length, the
  tower masks the padding, average-pools pairs of frames; ``multi_modal_projector`` maps them. Audio
  longer than the window is refused (the HF processor would cut it silently).
- Voxtral (``VoxtralForConditionalGeneration``): audio padded to a whole number of windows, each window
  encoded on its own, every 4 frames stacked into one token by the projector. Any length is taken.
- Qwen2.5-Omni (``Qwen2_5OmniForConditionalGeneration``'s thinker): only the real frames, attended in
  ``n_window`` chunks, pooled and projected inside the tower; one window at most, like Qwen2-Audio.
- Qwen3-Omni (``Qwen3OmniMoeForConditionalGeneration``'s thinker): its own tower, encoders/qwen3_omni_audio.py
  (Conv2d downsampling by 8, windowed attention, any length).

Any sample rate is resampled to the extractor's, and outputs are cached by content hash (``AudioEncoder``,
encoders/audio_encoder.py).

The Qwen2.5-Omni and Qwen3-Omni towers are ``chunk_stable`` (``GroupedAudioEncoder``, encoders/audio_grouped.py):
they encode a clip group by group and hear a turn as far as it is settled while it is spoken. Qwen2-Audio attends
over its whole 30 s window and Voxtral pads each 30 s window before attending across it, so a later sample changes
every embedding of the window: they hear a clip only whole.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omni_gateway.encoders.audio_checkpoint import (
    FAMILIES,
    checkpoint_family,
    load_tower,
    special_token_ids,
    thinker_token_rows,
    tower_weights,
)
from omni_gateway.encoders.audio_encoder import AudioEncoder, AudioFeatures, AudioLoadError, AudioPlaceholders
from omni_gateway.encoders.audio_grouped import GroupedAudioEncoder
from omni_gateway.encoders.cache import EncoderCache
from omni_gateway.encoders.qwen3_omni_audio import Qwen3OmniAudioTower


class Qwen2AudioTower(AudioEncoder):
    family = "qwen2_audio"

    def __init__(self, model_dir: Path, hf_config: Any, **kwargs: Any) -> None:
        super().__init__(model_dir, hf_config, **kwargs)
        from transformers.models.qwen2_audio.modeling_qwen2_audio import (
            Qwen2AudioEncoder,
            Qwen2AudioMultiModalProjector,
        )

        tower = Qwen2AudioEncoder._from_config(hf_config.audio_config)
        projector = Qwen2AudioMultiModalProjector(hf_config)
        load_tower(tower, tower_weights(model_dir, ("model.audio_tower.", "audio_tower.")), "audio tower", model_dir)
        prefixes = ("model.multi_modal_projector.", "multi_modal_projector.")
        load_tower(projector, tower_weights(model_dir, prefixes), "audio projector", model_dir)
        self.tower = tower.to(device=self.device, dtype=self.dtype).eval()
        self.projector = projector.to(device=self.device, dtype=self.dtype).eval()
        self.max_samples = self.window_samples
        tokens = special_token_ids(model_dir)
        self.placeholders = AudioPlaceholders(
            audio=int(hf_config.audio_token_id), start=tokens.get("<|audio_bos|>"), end=tokens.get("<|audio_eos|>")
        )

    @torch.inference_mode()
    def _encode(self, samples: np.ndarray, key: str) -> AudioFeatures:
        from transformers.masking_utils import create_bidirectional_mask

        batch = self._features(samples, padding="max_length", return_attention_mask=True)
        mel = batch["input_features"].to(device=self.device, dtype=self.dtype)
        after_cnn, out_len = self.tower._get_feat_extract_output_lengths(batch["attention_mask"].sum(-1))
        frames = (mel.shape[-1] - 2) // 2 + 1
        valid = (torch.arange(frames) < after_cnn[:, None]).long().to(self.device)
        mask = create_bidirectional_mask(
            config=self.tower.config,
            inputs_embeds=torch.zeros((1, frames, 1), dtype=self.dtype, device=self.device),
            attention_mask=valid,
        )
        hidden = self.tower(mel, attention_mask=mask).last_hidden_state
        return self._done(self.projector(hidden)[0, : int(out_len[0])], key)


class VoxtralTower(AudioEncoder):
    family = "voxtral"

    def __init__(self, model_dir: Path, hf_config: Any, **kwargs: Any) -> None:
        super().__init__(model_dir, hf_config, **kwargs)
        from transformers.models.voxtral.modeling_voxtral import VoxtralEncoder, VoxtralMultiModalProjector

        tower = VoxtralEncoder._from_config(hf_config.audio_config)
        projector = VoxtralMultiModalProjector(hf_config)
        load_tower(tower, tower_weights(model_dir, ("model.audio_tower.", "audio_tower.")), "audio tower", model_dir)
        prefixes = ("model.multi_modal_projector.", "multi_modal_projector.")
        load_tower(projector, tower_weights(model_dir, prefixes), "audio projector", model_dir)
        self.tower = tower.to(device=self.device, dtype=self.dtype).eval()
        self.projector = projector.to(device=self.device, dtype=self.dtype).eval()
        self.max_samples = None  # split into windows as VoxtralProcessor does
        self.window_frames = 2 * int(hf_config.audio_config.max_source_positions)  # mel frames per window
        self.stack = int(hf_config.audio_config.intermediate_size)
        tokens = special_token_ids(model_dir)
        self.placeholders = AudioPlaceholders(audio=int(hf_config.audio_token_id), start=tokens.get("[BEGIN_AUDIO]"))

    def embeddings_for(self, samples: int) -> int:
        """Each started window is padded whole and gives a full window's embeddings."""
        windows = -(-samples // self.window_samples)
        return windows * (self.window_frames // 2) * int(self.hf_config.audio_config.hidden_size) // self.stack

    @torch.inference_mode()
    def _encode(self, samples: np.ndarray, key: str) -> AudioFeatures:
        batch = self._features(samples, padding=True, truncation=False, pad_to_multiple_of=self.window_samples)
        mel = batch["input_features"]  # [1, mels, windows * window_frames]
        windows = mel.reshape(mel.shape[1], -1, self.window_frames).transpose(0, 1)
        hidden = self.tower(windows.to(device=self.device, dtype=self.dtype)).last_hidden_state
        return self._done(self.projector(hidden.reshape(-1, self.stack)), key)


class OmniAudioTower(GroupedAudioEncoder):
    family = "qwen2_5_omni"

    def __init__(self, model_dir: Path, hf_config: Any, **kwargs: Any) -> None:
        thinker = getattr(hf_config, "thinker_config", hf_config)
        super().__init__(model_dir, thinker, **kwargs)
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniAudioEncoder

        tower = Qwen2_5OmniAudioEncoder._from_config(thinker.audio_config)
        prefixes = ("thinker.audio_tower.", "audio_tower.")
        load_tower(tower, tower_weights(model_dir, prefixes), "audio tower", model_dir)
        self.tower = tower.to(device=self.device, dtype=self.dtype).eval()
        self.max_samples = self.window_samples
        self.placeholders = AudioPlaceholders(
            audio=int(thinker.audio_token_id),
            start=int(thinker.audio_start_token_id),
            end=int(thinker.audio_end_token_id),
        )
        # Audio heard inside a video (``omni.audio_in_video``) is interleaved with the frames in 2 s chunks.
        self.positions_per_second = int(thinker.position_id_per_seconds)
        self.seconds_per_chunk = float(thinker.seconds_per_chunk)
        self.video_token = int(thinker.video_token_id)
        self.vision_end = int(thinker.vision_end_token_id)
        self._marker_rows: torch.Tensor | None = None
        # The tower attends within chunks of 2 * n_window mel frames, and after its stride-2 convolution (n_window
        # frames a chunk) averages pairs of frames: a group of chunks whose frames pair up among themselves is
        # encoded alone exactly as within the whole clip.
        n_window = int(thinker.audio_config.n_window)
        self.group_frames = 2 * n_window if n_window % 2 == 0 else 4 * n_window

    def marker_embeds(self) -> torch.Tensor:
        """``[3, hidden]`` token embeddings of audio start, audio end and vision end: an interleaved
        video span carries its own end markers (they share positions the text cannot give them)."""
        if self._marker_rows is None:
            ids = [self.placeholders.start, self.placeholders.end, self.vision_end]
            self._marker_rows = thinker_token_rows(self.model_dir, ids).to(device=self.device, dtype=self.dtype)
        return self._marker_rows

    def mel(self, samples: np.ndarray) -> torch.Tensor:
        """``[mels, frames]`` log-mel of the real (unpadded) frames, as the thinker packs them."""
        batch = self._features(samples, padding="max_length", return_attention_mask=True)
        mask = batch["attention_mask"][0].bool()
        return batch["input_features"][0][:, mask]

    def _encode_groups(self, groups: list[torch.Tensor], whole: int) -> list[torch.Tensor]:
        """The embeddings of each group of mel frames, encoded in one pass as separate clips."""
        lengths = torch.tensor([g.shape[1] for g in groups])
        after_cnn, tokens = self.tower._get_feat_extract_output_lengths(lengths)
        out = self.tower(
            torch.cat(groups, dim=1).to(device=self.device, dtype=self.dtype),
            feature_lens=lengths.to(self.device),
            aftercnn_lens=after_cnn.to(self.device),
        )
        return [e.detach() for e in out.last_hidden_state.split(tokens.tolist())]


_CLASSES: dict[str, type[AudioEncoder]] = {
    "qwen2_audio": Qwen2AudioTower,
    "voxtral": VoxtralTower,
    "qwen2_5_omni": OmniAudioTower,
}


def load_audio_encoder(
    model_dir: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    cache: EncoderCache | None = None,
    fill: Callable[[str, tuple[int, ...]], torch.Tensor] | None = None,
) -> AudioEncoder:
    """The audio tower of a Qwen2-Audio, Voxtral, Qwen2.5-Omni or Qwen3-Omni checkpoint directory. ``fill``: makes
    each tensor from its checkpoint name and shape instead of reading it (random weights; Qwen3-Omni only)."""
    from transformers import AutoConfig

    path = Path(model_dir)
    family = checkpoint_family(path)
    if family is None:
        raise AudioLoadError(
            f"{str(path)!r} is not an audio-in checkpoint; supported architectures: {', '.join(FAMILIES)}"
        )
    if fill is not None and family != "qwen3_omni":
        raise AudioLoadError(f"random audio-tower weights are made for Qwen3-Omni; {str(path)!r} is {family}")
    if fill is None and not any(path.glob("*.safetensors")):
        raise AudioLoadError(f"{str(path)!r} has no *.safetensors weights")
    hf_config = AutoConfig.from_pretrained(str(path))
    if family == "qwen3_omni":
        return Qwen3OmniAudioTower(path, hf_config, fill, device=torch.device(device), dtype=dtype, cache=cache)
    return _CLASSES[family](path, hf_config, device=torch.device(device), dtype=dtype, cache=cache)
