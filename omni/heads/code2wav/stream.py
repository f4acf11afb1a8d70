"""Streaming Qwen3-Omni's code2wav: frames of codes in, waveform out chunk by chunk, equal to decoding the whole
utterance at once (up to float rounding).

An utterance keeps its transformer's sliding-window keys and values (``Window``) and its last
``context_frames`` transformer outputs. A chunk of new frames runs the transformer over the new frames only,
then the conv stack over those kept outputs and the new ones; the samples that the kept frames' outputs
reach are thrown away, and of the rest only those the whole-utterance decode has for the frames so far go out
(``Code2Wav.samples``). ``decode_chunks`` runs several utterances' chunks as one batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from omni_gateway.omni.heads.code2wav.model import Code2Wav


@dataclass(frozen=True, slots=True)
class Chunking:
    first_chunk_frames: int = 4  # ~0.3 s at 12.5 frames/s: the first audio goes out early
    chunk_frames: int = 25  # 2 s per later chunk

    def __post_init__(self) -> None:
        if self.first_chunk_frames < 1 or self.chunk_frames < 1:
            raise ValueError(f"chunks need at least one frame, got {self.first_chunk_frames}/{self.chunk_frames}")


class Code2WavStream:
    """One utterance: ``push`` frames as the talker makes them and get the chunks now complete; ``finish``
    returns the rest. Each call returns float32 ``[samples]`` waveforms, in order, never overlapping."""

    def __init__(self, model: Code2Wav, chunking: Chunking = Chunking()) -> None:
        self.model = model
        self.chunking = chunking
        self.window = model.new_window()
        self.pending: list[torch.Tensor] = []  # [Q] code columns not decoded yet
        self.frames = 0  # frames decoded
        self.emitted = 0  # samples returned
        self.hidden = torch.empty(0, model.config.hidden_size, device=model.device, dtype=model.dtype)
        self.finished = False

    @property
    def next_chunk(self) -> int:
        return self.chunking.first_chunk_frames if self.frames == 0 else self.chunking.chunk_frames

    def push(self, frames: torch.Tensor) -> list[torch.Tensor]:
        """``frames``: ``[Q, n]`` codes (one column per frame)."""
        if self.finished:
            raise RuntimeError("push after finish")
        q = self.model.config.num_quantizers
        if frames.dim() != 2 or frames.shape[0] != q:
            raise ValueError(f"expected frames of shape [{q}, n], got {tuple(frames.shape)}")
        self.pending.extend(frames.unbind(1))
        waves = []
        while len(self.pending) >= self.next_chunk:
            waves += decode_chunks(self.model, [(self, self.take(self.next_chunk))])
        return waves

    def finish(self) -> list[torch.Tensor]:
        self.finished = True
        if not self.pending:
            return []
        return decode_chunks(self.model, [(self, self.take(len(self.pending)))])

    def take(self, n: int) -> torch.Tensor:
        chunk, self.pending = self.pending[:n], self.pending[n:]
        return torch.stack(chunk, dim=1)


@torch.inference_mode()
def decode_chunks(model: Code2Wav, work: list[tuple[Code2WavStream, torch.Tensor]]) -> list[torch.Tensor]:
    """Decode one chunk (``[Q, n]`` codes) of each stream as a batch; their waveforms, in order."""
    if len({id(stream) for stream, _ in work}) != len(work):
        raise ValueError("one chunk per stream in a batch")
    lengths = [int(codes.shape[1]) for _, codes in work]
    codes = torch.stack([F.pad(c, (0, max(lengths) - c.shape[1])) for _, c in work])
    hidden = model.transformer(model.embed(codes).to(model.dtype), [s.window for s, _ in work], lengths)
    # The conv stack's inputs: each stream's kept outputs then its new ones, right-padded (it is causal, so
    # padding after an input changes none of its outputs that are kept).
    inputs, starts = [], []
    for (stream, _), new, n in zip(work, hidden, lengths):
        frames = torch.cat((stream.hidden, new[:n]))
        starts.append(stream.frames - stream.hidden.shape[0])  # the first input's frame index
        stream.frames += n
        stream.hidden = frames[-model.context_frames :]
        inputs.append(frames)
    width = max(len(f) for f in inputs)
    waves = model.vocode(torch.stack([F.pad(f, (0, 0, 0, width - len(f))) for f in inputs]))
    out = []
    upsample = model.config.upsample
    for (stream, _), start, wave in zip(work, starts, waves):
        end = model.samples(stream.frames)
        lo, hi = stream.emitted - start * upsample, end - start * upsample
        out.append(wave[lo:hi].float() if hi > lo else wave[:0].float())
        stream.emitted = max(end, stream.emitted)
    return out
