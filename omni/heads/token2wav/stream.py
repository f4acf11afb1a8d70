"""One utterance's streaming state for ``token2wav.Token2Wav``: the codes so far, which of them have audio, the
mel context the next chunk's vocoder sees on its left, and the seeded noise every window draws from."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from omni_gateway.omni.heads.token2wav.chunking import chunk_window

if TYPE_CHECKING:
    from omni_gateway.omni.heads.token2wav.head import Token2Wav
    from omni_gateway.omni.heads.token2wav.loader import Speaker


class Noise:
    """The ODE's starting noise, ``[1, frames, mel_dim]``, drawn in order from one seeded CPU generator.

    Prefixes agree with a single draw of the whole length (CPU normal sampling fills in order), so a
    stream and a whole-utterance synthesis with the same seed start from the same noise."""

    def __init__(self, seed: int | None, mel_dim: int) -> None:
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        self.mel_dim = mel_dim
        self.frames = torch.empty(1, 0, mel_dim)

    def upto(self, end: int) -> torch.Tensor:
        if end > self.frames.shape[1]:
            more = torch.randn(1, end - self.frames.shape[1], self.mel_dim, generator=self.generator)
            self.frames = torch.cat((self.frames, more), dim=1)
        return self.frames[:, :end]


class Token2WavStream:
    """One utterance: ``push`` codes as the talker makes them and get the chunks now complete; ``finish``
    returns the rest. Each call returns float32 ``[samples]`` waveforms, in order, never overlapping."""

    def __init__(self, t2w: Token2Wav, speaker: Speaker, seed: int | None) -> None:
        self.t2w = t2w
        self.speaker = speaker
        self.noise = Noise(seed, t2w.mel_dim)
        self.codes: list[int] = []
        self.done_codes = 0  # codes whose audio was returned
        self.mel: torch.Tensor | None = None  # [1, mel_dim, <= context] of the returned codes' last frames
        self.finished = False

    @property
    def next_chunk_end(self) -> int:
        cfg = self.t2w.config
        return cfg.first_chunk_codes if self.done_codes == 0 else self.done_codes + cfg.chunk_codes

    def completes_chunk(self, more: int) -> bool:
        """Whether ``push`` of ``more`` codes runs a chunk (a token2wav call) rather than only keeping them."""
        return len(self.codes) + more >= self.next_chunk_end + self.t2w.config.lookahead_codes

    def push(self, codes: list[int], deadline: float | None = None) -> list[torch.Tensor]:
        """``deadline``: when the listener runs out of the audio returned before this call (``time.monotonic()``
        seconds; the batched calls serve the streams due soonest first), or None. The call's chunks share it:
        they run one after another, never competing with each other."""
        if self.finished:
            raise RuntimeError("token2wav stream already finished")
        self.codes.extend(int(c) for c in codes)
        out: list[torch.Tensor] = []
        while len(self.codes) >= self.next_chunk_end + self.t2w.config.lookahead_codes:
            out.append(self._chunk(self.next_chunk_end, final=False, deadline=deadline))
        return out

    def finish(self, deadline: float | None = None) -> list[torch.Tensor]:
        """Audio of every code not yet returned (the last chunk needs no lookahead); ``deadline`` as ``push``'s."""
        out: list[torch.Tensor] = []
        while not self.finished and self.done_codes < len(self.codes):
            end = min(self.next_chunk_end, len(self.codes))
            out.append(self._chunk(end, final=end == len(self.codes), deadline=deadline))
        self.finished = True
        return out

    @torch.inference_mode()
    def _chunk(self, end: int, *, final: bool, deadline: float | None) -> torch.Tensor:
        t2w, cfg, r = self.t2w, self.t2w.config, self.t2w.repeats
        start = self.done_codes
        win_start, win_end, shape = chunk_window(cfg, t2w.block_codes, r, start, end, len(self.codes), final=final)
        code = as_codes(self.codes[win_start:win_end], torch.device("cpu"), t2w.num_codes)
        noise = self.noise.upto(win_end * r)[:, win_start * r :]
        ctx = cfg.vocoder_context_frames
        left = self.mel if self.mel is not None and ctx else torch.zeros(1, t2w.mel_dim, 0)
        self.mel, chunk = t2w.chunk_batched(code, noise, self.speaker, left, shape, deadline)
        self.done_codes = end
        if final:
            self.finished = True
        return chunk


def as_codes(codes: list[int] | torch.Tensor, device: torch.device, num_codes: int) -> torch.Tensor:
    code = torch.as_tensor(codes, dtype=torch.long).reshape(1, -1)
    if code.shape[1] == 0:
        raise ValueError("token2wav needs at least one codec code")
    bad = code[(code < 0) | (code >= num_codes)]
    if bad.numel():
        raise ValueError(f"codec codes must be in [0, {num_codes}); got {bad[:4].tolist()}")
    return code.to(device)
