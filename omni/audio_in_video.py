"""A video heard with its sound (Qwen2.5-Omni's ``use_audio_in_video``): frames and audio interleaved by time.

As the model's processor lays it out: the video's audio track goes through the audio tower, and between
``<|vision_bos|><|audio_bos|>`` and ``<|audio_eos|><|vision_eos|>`` the video tokens and the audio tokens
alternate chunk by chunk, a chunk being ``seconds_per_chunk`` of time positions (video tokens by their
temporal position, audio tokens by their index: 25 of each per second). Both start markers share one
position, as do both end markers, which text cannot express; so the span runs from ``<|audio_bos|>`` to
``<|vision_eos|>`` and carries those markers' token embeddings itself:

    relative positions  audio_bos: -1 (with vision_bos) | chunks: 0 + (t, h, w) or 0 + index | ends: last + 1

The Qwen3-Omni thinker (``interleave_by_time``) lays the tokens out one by one in time order instead: a video token
at its temporal position goes before an audio token at its index unless it is later. Here every marker has a
position of its own: ``<|vision_bos|>`` stays text, ``<|audio_bos|>`` follows it, and the two end markers follow the
last piece laid down (the remainder of whichever stream outlasts the other, else the last token):

    relative positions  audio_bos: 0 | tokens: 1 + (t, h, w) or 1 + index | ends: last + 1, last + 2
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from omni_gateway.encoders.audio_tower import OmniAudioTower
from omni_gateway.encoders.cache import content_key
from omni_gateway.encoders.qwen3_omni_audio import Qwen3OmniAudioTower
from omni_gateway.encoders.vision import VisualFeatures


@dataclass(frozen=True, slots=True)
class Interleaved:
    """The span's features and the token ids its placeholder tokens must be (markers, video, audio)."""

    features: VisualFeatures
    token_ids: list[int]


def chunk_bounds(values: list[int], per_chunk: int) -> list[tuple[int, int]]:
    """``[start, end)`` index ranges of ``values`` (non-decreasing) cut where a value reaches the next
    multiple of ``per_chunk``; one cut per element at most, and always a last (possibly empty) range."""
    bounds: list[tuple[int, int]] = []
    start, chunk = 0, 1
    for i, value in enumerate(values):
        if value >= chunk * per_chunk:
            bounds.append((start, i))
            start, chunk = i, chunk + 1
    bounds.append((start, len(values)))
    return bounds


def interleave(video: VisualFeatures, audio: torch.Tensor, audio_key: str, tower: OmniAudioTower) -> Interleaved:
    """One span of ``video`` (features with positions) and its audio embeddings ``audio [n, hidden]``."""
    if video.positions is None:
        raise ValueError("a video to interleave with its audio needs M-RoPE positions")
    marks = tower.placeholders
    assert marks.start is not None and marks.end is not None  # the Omni tower always has both
    per_chunk = int(tower.positions_per_second * tower.seconds_per_chunk)
    video_chunks = chunk_bounds(video.positions[0].tolist(), per_chunk)
    audio_chunks = chunk_bounds(list(range(audio.shape[0])), per_chunk)
    markers = tower.marker_embeds()
    embeds = [markers[0:1]]
    positions = [torch.full((3, 1), -1, dtype=torch.int64)]
    ids = [marks.start]
    for j in range(max(len(video_chunks), len(audio_chunks))):
        if j < len(video_chunks):
            lo, hi = video_chunks[j]
            embeds.append(video.embeds[lo:hi])
            positions.append(video.positions[:, lo:hi].to(torch.int64))
            ids += [tower.video_token] * (hi - lo)
        if j < len(audio_chunks):
            lo, hi = audio_chunks[j]
            embeds.append(audio[lo:hi].to(video.embeds.dtype))
            positions.append(torch.arange(lo, hi, dtype=torch.int64).repeat(3, 1))
            ids += [marks.audio] * (hi - lo)
    # The ends follow the last chunk laid down (not necessarily the largest position), as the model's rope index does.
    last = next(p for p in reversed(positions) if p.shape[1])
    end = int(last.max()) + 1
    embeds.append(markers[1:3].to(video.embeds.dtype))
    positions.append(torch.full((3, 2), end, dtype=torch.int64))
    ids += [marks.end, tower.vision_end]
    features = VisualFeatures(
        embeds=torch.cat([e.to(video.embeds.device) for e in embeds]),
        key=content_key(b"audio-in-video", video.key, audio_key),
        positions=torch.cat(positions, dim=1),
    )
    return Interleaved(features=features, token_ids=ids)


def interleave_by_time(
    video: VisualFeatures, audio: torch.Tensor, audio_key: str, tower: Qwen3OmniAudioTower
) -> Interleaved:
    """One span of ``video`` and its audio embeddings ``audio [n, hidden]``, token by token in time order, as the
    Qwen3-Omni thinker's rope index orders them; DeepStack rows go to the video tokens only (zeros elsewhere)."""
    if video.positions is None:
        raise ValueError("a video to interleave with its audio needs M-RoPE positions")
    marks = tower.placeholders
    times = video.positions[0].tolist()
    n_video, n_audio = len(times), int(audio.shape[0])
    order: list[int] = []  # token i < n_video: video token i; else audio token i - n_video
    v = a = 0
    while v < n_video and a < n_audio:
        if times[v] <= a:
            order.append(v)
            v += 1
        else:
            order.append(n_video + a)
            a += 1
    rest = list(range(v, n_video)) + list(range(n_video + a, n_video + n_audio))
    order += rest
    pick = torch.tensor(order, dtype=torch.int64)
    media_positions = torch.cat(
        (video.positions.to(torch.int64), torch.arange(n_audio, dtype=torch.int64).repeat(3, 1)), dim=1
    )[:, pick]
    last = media_positions[:, -len(rest) :] if rest else media_positions[:, -1:]
    end = int(last.max()) + 2  # relative to <|audio_bos|>: the media sit one past it
    markers = tower.marker_embeds().to(device=video.embeds.device, dtype=video.embeds.dtype)
    media = torch.cat((video.embeds, audio.to(device=video.embeds.device, dtype=video.embeds.dtype)))[pick]
    positions = torch.cat(
        (
            torch.zeros((3, 1), dtype=torch.int64),
            media_positions + 1,
            torch.tensor([[end, end + 1]] * 3, dtype=torch.int64),
        ),
        dim=1,
    )
    deepstack = None
    if video.deepstack is not None:
        layers, _, hidden = video.deepstack.shape
        deepstack = video.deepstack.new_zeros((layers, 1 + len(order) + 2, hidden))
        is_video = pick < n_video
        deepstack[:, 1 : 1 + len(order)][:, is_video] = video.deepstack[:, pick[is_video]]
    ids = [marks.start] + [tower.video_token if i < n_video else marks.audio for i in order]
    ids += [marks.end, tower.vision_end]
    features = VisualFeatures(
        embeds=torch.cat((markers[0:1], media, markers[1:3])),
        key=content_key(b"audio-in-video by time", video.key, audio_key),
        positions=positions,
        deepstack=deepstack,
    )
    return Interleaved(features=features, token_ids=[int(i) for i in ids if i is not None])
