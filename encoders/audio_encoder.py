"""The common part of the audio towers (``encoders/audio_tower.py``, ``encoders/qwen3_omni_audio.py``): feature
extractor, resampling, length checks, device and dtype, and the output cache, keyed by content hash
(encoders/cache.py), so a repeated clip is encoded once; the same hash keys the engine's prefix cache.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omni_gateway.encoders.audio import resample
from omni_gateway.encoders.cache import EncoderCache, content_key
from omni_gateway.encoders.checkpoint_encoder import CheckpointEncoder


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


class AudioEncoder(CheckpointEncoder, abc.ABC):
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

        super().__init__(model_dir, hf_config, device=device, dtype=dtype, cache=cache)
        self.extractor = self._preprocessor(
            AutoFeatureExtractor.from_pretrained, AudioLoadError, "audio feature extractor"
        )
        self.sampling_rate = int(self.extractor.sampling_rate)
        self.window_samples = int(self.extractor.n_samples)

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
