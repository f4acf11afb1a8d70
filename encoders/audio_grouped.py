"""Audio towers whose attention stays within fixed groups of mel frames (``chunk_stable``): Qwen2.5-Omni's
chunks of ``2 * n_window`` frames, paired for pooling, and Qwen3-Omni's attention windows of ``n_window_infer``
frames, 8 s in the released checkpoint. A clip is encoded group by group, each group cached under the hash of its
own mel frames, and its tokens carry that hash as their prefix-cache key. A turn still being spoken is then heard
as far as it is settled (``settled_only``): the next reading, and the whole turn at its end, encode and prefill
only the groups that are new.
"""

from __future__ import annotations

import abc

import numpy as np
import torch
from omni_gateway.encoders.audio_encoder import AudioEncoder, AudioFeatures, UnusableAudio
from omni_gateway.encoders.cache import content_key

# Resampling a growing clip (24 kHz realtime audio to 16 kHz) changes the last ~35 ms it gives as more
# arrives: frames within this much of the clip's end are not settled yet.
_RESAMPLE_EDGE_S = 0.064


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
