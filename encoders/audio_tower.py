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

Any sample rate is resampled to the extractor's. Outputs are cached by content hash (encoders/cache.py),
so a repeated clip is encoded once; the same hash keys the engine's prefix cache.

The Qwen2.5-Omni and Qwen3-Omni towers are ``chunk_stable`` (``GroupedAudioEncoder``): their attention stays
within fixed groups of mel frames (Qwen2.5-Omni: its chunks of ``2 * n_window`` frames, paired for pooling;
Qwen3-Omni: its attention windows of ``n_window_infer`` frames, 8 s in the released checkpoint), so a clip is
encoded group by group, each group cached under the hash of its own mel frames, and its tokens carry that hash
as their prefix-cache key. A turn still being spoken is then heard as far as it is settled (``settled_only``):
the next reading, and the whole turn at its end, encode and prefill only the groups that are new. Qwen2-Audio
attends over its whole 30 s window and Voxtral pads each 30 s window before attending across it, so a
later sample changes every embedding of the window: they hear a clip only whole.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omni_gateway.encoders.audio import resample
from omni_gateway.encoders.cache import EncoderCache, content_key
from omni_gateway.encoders.vision import VisionLoadError, _load_module, _vision_weights

# Resampling a growing clip (24 kHz realtime audio to 16 kHz) changes the last ~35 ms it gives as more
# arrives: frames within this much of the clip's end are not settled yet.
_RESAMPLE_EDGE_S = 0.064

FAMILIES = {
    "Qwen2AudioForConditionalGeneration": "qwen2_audio",
    "VoxtralForConditionalGeneration": "voxtral",
    "Qwen2_5OmniForConditionalGeneration": "qwen2_5_omni",
    "Qwen2_5OmniThinkerForConditionalGeneration": "qwen2_5_omni",
    "Qwen3OmniMoeForConditionalGeneration": "qwen3_omni",
}


class AudioLoadError(RuntimeError):
    """The checkpoint has no usable audio tower (unsupported architecture, missing weights or files)."""


class UnusableAudio(ValueError):
    """Audio this model cannot take (empty, not finite, longer than its window); client-safe text."""


@dataclass(frozen=True, slots=True)
class AudioFeatures:
    """One clip as the LLM sees it: ``embeds [num_tokens, hidden]``; ``key`` is the content hash that also
    keys the KV prefix cache."""

    embeds: torch.Tensor
    key: str
    # One prefix-cache key per token (the hash of the group of mel frames it was encoded from), for a tower
    # that encodes groups on their own: a clip that begins with another's groups shares their cached KV.
    position_keys: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return int(self.embeds.shape[0])


@dataclass(frozen=True, slots=True)
class AudioPlaceholders:
    """Token ids around a clip in the prompt: ``start`` (when the model has one), ``audio`` repeated once
    per embedding, ``end`` (when the model has one)."""

    audio: int
    start: int | None = None
    end: int | None = None


def checkpoint_family(model_dir: str | Path) -> str | None:
    """``"qwen2_audio"``, ``"voxtral"``, ``"qwen2_5_omni"``, ``"qwen3_omni"`` or None for a directory whose config
    names none."""
    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return None
    try:
        names = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError):
        return None
    return next((FAMILIES[n] for n in names if n in FAMILIES), None)


def special_token_ids(model_dir: Path) -> dict[str, int]:
    """Added/special tokens of the directory's tokenizer (``tokenizer.json`` or Mistral's ``tekken.json``)."""
    found: dict[str, int] = {}
    try:
        if (model_dir / "tokenizer.json").is_file():
            for token in json.loads((model_dir / "tokenizer.json").read_text()).get("added_tokens", []):
                found[str(token["content"])] = int(token["id"])
        elif (model_dir / "tekken.json").is_file():
            for token in json.loads((model_dir / "tekken.json").read_text()).get("special_tokens", []):
                found[str(token["token_str"])] = int(token["rank"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise AudioLoadError(f"cannot read the special tokens of {str(model_dir)!r}: {exc}") from exc
    return found


class AudioEncoder(abc.ABC):
    """Common part: feature extractor, resampling, length checks, device/dtype, the output cache."""

    family: str
    placeholders: AudioPlaceholders
    # Samples (at ``sampling_rate``) one clip may hold; None when longer clips are split into windows.
    max_samples: int | None
    # Whether the embeddings of a clip's settled start do not change as the clip grows (``encode``'s
    # ``settled_only``): a turn can be heard while it is spoken.
    chunk_stable = False

    def __init__(
        self,
        model_dir: Path,
        hf_config: Any,
        *,
        device: torch.device,
        dtype: torch.dtype,
        cache: EncoderCache | None,
    ) -> None:
        from transformers import AutoFeatureExtractor

        self.model_dir = model_dir
        self.hf_config = hf_config
        self.device = device
        self.dtype = dtype
        self.cache = cache if cache is not None else EncoderCache(256 << 20)
        try:
            self.extractor = AutoFeatureExtractor.from_pretrained(str(model_dir))
        except Exception as exc:  # missing or malformed preprocessor_config.json
            raise AudioLoadError(f"cannot load the audio feature extractor of {str(model_dir)!r}: {exc}") from exc
        self.sampling_rate = int(self.extractor.sampling_rate)
        self.window_samples = int(self.extractor.n_samples)
        self.settings = content_key(str(model_dir.resolve()), self.extractor.to_json_string(), str(dtype))

    def encode(self, samples: np.ndarray, sample_rate: int, *, settled_only: bool = False) -> AudioFeatures:
        """Embeddings of float mono ``samples`` at ``sample_rate`` (resampled to the model's rate). With
        ``settled_only`` the clip is still growing (a turn being spoken): only the embeddings that more audio
        cannot change, which a ``chunk_stable`` tower alone can tell apart; UnusableAudio when there are none."""
        samples = self.prepare(samples, sample_rate)
        key = content_key(b"audio", str(self.sampling_rate), samples.tobytes(), self.settings)
        if settled_only:  # its groups are cached; this reading of a growing clip is not
            return self._encode_settled(samples, key)
        cached = self.cache.get(key)
        if cached is None:
            cached = self._encode(samples, key)
            self.cache.put(key, cached, cached.embeds.numel() * cached.embeds.element_size())
        return cached

    def prepare(self, samples: np.ndarray, sample_rate: int) -> np.ndarray:
        """float32 mono at the model's rate, or UnusableAudio saying what is wrong with it."""
        samples = np.asarray(samples, dtype=np.float32)
        if samples.ndim != 1:
            raise UnusableAudio(f"expected mono audio (one channel of samples), got an array of shape {samples.shape}")
        if sample_rate <= 0:
            raise UnusableAudio(f"sample rate must be positive, got {sample_rate}")
        if samples.size == 0:
            raise UnusableAudio("audio holds no samples")
        if not np.isfinite(samples).all():
            raise UnusableAudio("audio holds NaN or infinite samples")
        if sample_rate != self.sampling_rate:
            samples = resample(samples, sample_rate, self.sampling_rate)
        if self.embeddings_for(samples.size) < 1:
            raise UnusableAudio(
                f"audio is {1000 * samples.size / self.sampling_rate:.1f} ms at this model's {self.sampling_rate} Hz; "
                f"it hears clips of at least {1000 * self.shortest_samples() / self.sampling_rate:.1f} ms"
            )
        if self.max_samples is not None and samples.size > self.max_samples:
            raise UnusableAudio(
                f"audio is {samples.size / self.sampling_rate:.2f} s; this model hears at most "
                f"{self.max_samples / self.sampling_rate:g} s per clip"
            )
        return np.ascontiguousarray(samples)

    def embeddings_for(self, samples: int) -> int:
        """How many embeddings the tower makes of a clip of ``samples`` samples at ``sampling_rate``: Whisper-style
        towers halve the clip's mel frames twice (a strided convolution, then pooling)."""
        frames = -(-samples // int(self.extractor.hop_length))  # the extractor's attention mask, one per hop
        _, tokens = self.tower._get_feat_extract_output_lengths(torch.tensor([frames]))
        return int(tokens[0])

    def shortest_samples(self) -> int:
        """The fewest samples that give at least one embedding."""
        low, high = 1, self.window_samples
        while low < high:
            mid = (low + high) // 2
            low, high = (low, mid) if self.embeddings_for(mid) >= 1 else (mid + 1, high)
        return low

    @abc.abstractmethod
    def _encode(self, samples: np.ndarray, key: str) -> AudioFeatures:
        """Run the tower on one clip (the cache missed)."""

    def _encode_settled(self, samples: np.ndarray, key: str) -> AudioFeatures:
        """The embeddings of a growing clip's settled start, which only a ``chunk_stable`` tower can tell."""
        raise UnusableAudio(f"the {self.family} audio tower hears a clip only whole")

    def _features(self, samples: np.ndarray, **kwargs: Any) -> Any:
        return self.extractor(samples, sampling_rate=self.sampling_rate, return_tensors="pt", **kwargs)

    def _done(self, embeds: torch.Tensor, key: str) -> AudioFeatures:
        return AudioFeatures(embeds=embeds.detach(), key=key)


def _weights(model_dir: Path, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return _vision_weights(model_dir, prefixes)


def _load(module: torch.nn.Module, weights: dict[str, torch.Tensor], what: str, model_dir: Path) -> None:
    try:
        _load_module(module, weights, what, model_dir)
    except VisionLoadError as exc:
        raise AudioLoadError(str(exc)) from None


def thinker_token_rows(model_dir: Path, ids: list[int | None]) -> torch.Tensor:
    """``[len(ids), hidden]`` rows of the thinker's token embedding table, read without loading the rest."""
    from safetensors import safe_open

    if any(i is None for i in ids):
        raise AudioLoadError(f"the tokenizer of {str(model_dir)!r} lacks an audio or vision marker token")
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            if "thinker.model.embed_tokens.weight" in f.keys():  # noqa: SIM118 (not a dict)
                table = f.get_slice("thinker.model.embed_tokens.weight")
                return torch.cat([table[i : i + 1] for i in ids])  # type: ignore[misc]
    raise AudioLoadError(f"{str(model_dir)!r} lacks thinker.model.embed_tokens.weight")


class GroupedAudioEncoder(AudioEncoder):
    """A tower whose attention stays within groups of ``group_frames`` mel frames: a clip is encoded group by
    group, each group cached under the hash of its mel frames (its tokens' prefix-cache key), and a growing clip
    is heard as far as its groups are settled."""

    chunk_stable = True
    group_frames: int

    @abc.abstractmethod
    def mel(self, samples: np.ndarray) -> torch.Tensor:
        """``[mels, frames]`` log-mel of the clip's real frames, as the thinker's processor makes it."""

    @abc.abstractmethod
    def _encode_groups(self, groups: list[torch.Tensor], whole: int) -> list[torch.Tensor]:
        """The embeddings of each group (``[mels, frames]``, on the host) of a reading of ``whole`` mel frames,
        each exactly as within that reading's one-pass encoding."""

    def _group_context(self, whole: int) -> tuple[str, ...]:
        """What besides its own mel frames a group's embeddings depend on in a reading of ``whole`` frames."""
        return ()

    def settled_frames(self, samples: int) -> int:
        """Mel frames of a clip of ``samples`` samples that more audio after it cannot change: each frame's
        STFT window ends inside the clip, clear of the edge that resampling a growing clip moves."""
        reach = samples - int(self.extractor.n_fft) // 2 - int(_RESAMPLE_EDGE_S * self.sampling_rate)
        return 0 if reach < 0 else reach // int(self.extractor.hop_length) + 1

    def _encode(self, samples: np.ndarray, key: str) -> AudioFeatures:
        mel = self.mel(samples)
        return self._grouped(mel, mel.shape[1], key)

    def _encode_settled(self, samples: np.ndarray, key: str) -> AudioFeatures:
        mel = self.mel(samples)
        frames = min(mel.shape[1], self.settled_frames(samples.size)) // self.group_frames * self.group_frames
        if frames == 0:
            raise UnusableAudio("no group of this growing clip is settled yet")
        return self._grouped(mel, frames, key)

    @torch.inference_mode()
    def _grouped(self, mel: torch.Tensor, frames: int, key: str) -> AudioFeatures:
        """The embeddings of ``mel``'s first ``frames`` frames, group by group, each group from the cache
        when an earlier clip had it."""
        step = self.group_frames
        groups = [mel[:, i : min(i + step, frames)].contiguous() for i in range(0, frames, step)]
        # A group's embeddings depend on its mel frames (and ``_group_context``) alone (the log-mel floor follows
        # the clip's loudest frame, so a louder continuation changes them, and then their key): keyed by them, a
        # group reused from an earlier reading of the clip is exactly what encoding the whole clip gives.
        context = self._group_context(frames)
        keys = [content_key(b"omni-audio-group", g.numpy().tobytes(), self.settings, *context) for g in groups]
        found: list[torch.Tensor | None] = [self.cache.get(k) for k in keys]
        missing = [i for i, f in enumerate(found) if f is None]
        if missing:
            for i, embeds in zip(missing, self._encode_groups([groups[i] for i in missing], frames)):
                found[i] = embeds
                self.cache.put(keys[i], embeds, embeds.numel() * embeds.element_size())
        pieces = [f for f in found if f is not None]
        position_keys = tuple(int(k[:15], 16) for k, f in zip(keys, pieces) for _ in range(f.shape[0]))
        return AudioFeatures(embeds=torch.cat(pieces), key=key, position_keys=position_keys)


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
        _load(tower, _weights(model_dir, ("model.audio_tower.", "audio_tower.")), "audio tower", model_dir)
        prefixes = ("model.multi_modal_projector.", "multi_modal_projector.")
        _load(projector, _weights(model_dir, prefixes), "audio projector", model_dir)
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
        _load(tower, _weights(model_dir, ("model.audio_tower.", "audio_tower.")), "audio tower", model_dir)
        prefixes = ("model.multi_modal_projector.", "multi_modal_projector.")
        _load(projector, _weights(model_dir, prefixes), "audio projector", model_dir)
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
        _load(tower, _weights(model_dir, prefixes), "audio tower", model_dir)
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
    if family == "qwen3_omni":  # its own module, which builds on this one's AudioEncoder
        from omni_gateway.encoders.qwen3_omni_audio import Qwen3OmniAudioTower

        return Qwen3OmniAudioTower(path, hf_config, fill, device=torch.device(device), dtype=dtype, cache=cache)
    return _CLASSES[family](path, hf_config, device=torch.device(device), dtype=dtype, cache=cache)
