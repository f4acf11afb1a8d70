"""Qwen2.5-Omni token2wav as a streaming head: codec codes in, waveform chunks out.

token2wav is two models: a DiT that turns codes into a mel spectrogram by flow matching (an ODE from
noise, ``num_steps`` RK4 steps, classifier-free guidance on the codes and the speaker), and a BigVGAN
vocoder from mel to 24 kHz audio. Each code becomes ``repeats`` mel frames; each frame ``hop`` samples.

Streaming runs both on windows of codes. The first chunk is small (``first_chunk_codes``: the latency
knob), later ones larger (``chunk_codes``: fewer DiT passes per second of audio). The first chunk may also
take fewer ODE steps (``first_chunk_steps``): eagerly its DiT call is bound by kernel launches, about
4 DiT evaluations per step, so its time falls with the steps. On CUDA every chunk may replay its ODE
from CUDA graphs (``cuda_graphs``, on by default; ``call_graphs``), captured for every regular window shape
(``regular_shapes``), voice and batch bucket when the head is built (a stream's last window is padded to the
next regular one, its padding masked), and every chunk but a stream's last its vocoder call. The stream's
state is ``token2wav.stream``'s.
Each chunk is one call to worker threads ("lanes", ``token2wav.batcher``) that batch the chunks of every
stream: the DiT, then the vocoder, with first chunks ahead of later ones; with two lanes (``lanes``) one
runs first chunks only, on a high-priority CUDA stream, so a first chunk never waits behind a later one.
While a first chunk's call runs, the process's engines launch no step (``first_chunks_alone``,
``engine.runner.step_gate``): it has the GPU to itself.
The settings and each chunk's window are ``token2wav.chunking``'s. A chunk's DiT window
reaches ``past_codes`` back and ``lookahead_codes`` ahead, starting on a DiT attention block boundary so
the block masks line up with the whole utterance's; the chunk keeps the mel of its own frames only. The
vocoder sees ``vocoder_context_frames`` of mel either side and keeps the samples of the chunk's frames.
The noise that starts the ODE is drawn frame by frame from one seeded generator, so every window of a
stream sees the same noise as the whole utterance would.

Streamed audio is not bit-identical to whole-utterance synthesis: the ODE runs ``3 * num_steps``
DiT evaluations, each widening the context a frame depends on by the look-back/look-ahead blocks, so
the whole utterance's frame depends on codes beyond any finite window; and the vocoder's receptive
field at a chunk edge sees the neighbouring mel of a different window (the lookahead mel is itself a
window-edge estimate). The models are ``transformers``' own modules, loaded from the checkpoint's
``token2wav.`` weights; the DiT is evaluated through ``token2wav.dit.FastDiT``, which computes a chunk's
step-invariant parts once per call, the vocoder through ``token2wav.vocoder.FastVocoder``, which computes
its activations' constants once.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omni_gateway.engine.runner.step_gate import urgent
from omni_gateway.kernels.host_copies import to_host
from omni_gateway.omni.heads.call_graphs import BUCKETS, CallGraphs
from omni_gateway.omni.heads.token2wav.batcher import BatchedCalls
from omni_gateway.omni.heads.token2wav.chunking import (
    ChunkShape,
    Token2WavConfig,
    chunk_window,
    padded_window,
    rk4_intervals,
)
from omni_gateway.omni.heads.token2wav.dit import FastDiT
from omni_gateway.omni.heads.token2wav.loader import Speaker, Token2WavModels, load_token2wav
from omni_gateway.omni.heads.token2wav.stream import Noise, Token2WavStream, as_codes
from omni_gateway.omni.heads.token2wav.vocoder import FastVocoder

log = logging.getLogger(__name__)

# A graphed call's codes (rows x window): its ODE and vocoder are captured up to this size, and a call of
# more rows runs as graphed slices (``Token2Wav.graph_rows``). Past it the float32 DiT is bound by the GPU's
# arithmetic, not by launches (H200, 7B shapes: a 54-code window at 8 rows takes 0.95 s eagerly and 0.89 s
# replayed, at 1 row 1.03 s and 0.31 s), and capturing every bucket of every window took 99 s at load.
GRAPH_CODES = 256

OUTPUT_SAMPLE_RATE = 24000  # Qwen2.5-Omni's BigVGAN: 100 mel frames/s, 240 samples each


class UnknownVoice(ValueError):
    """A voice the checkpoint's speaker map does not have."""


class Token2Wav:
    """The loaded models plus the speaker map; ``stream`` starts one utterance."""

    def __init__(self, models: Token2WavModels, config: Token2WavConfig = Token2WavConfig()) -> None:
        self.models = models
        self.config = config
        self._batched: BatchedCalls | None = None  # started by the first stream
        self._batched_lock = threading.Lock()
        dit = models.dit
        self.repeats: int = int(dit.repeats)
        self.mel_dim: int = int(dit.mel_dim)
        self.block_codes = max(1, int(dit.block_size) // self.repeats)
        self.hop: int = math.prod(int(r) for r in models.vocoder.config.upsample_rates)
        self.max_frames: int = int(dit.config.max_position_embeddings)
        self.num_codes: int = int(dit.config.num_embeds)  # the DiT's table has one more row, for "no code"
        # Regular chunks' windows take a few shapes: their ODE and vocoder calls replay from CUDA graphs, one
        # per batch bucket and shape (config.cuda_graphs, CUDA only); the two kinds fall back to eager apart.
        # Each lane has its own graphs (a graph replays on one stream at a time) and CUDA stream.
        self._graphs: list[tuple[CallGraphs, CallGraphs]] | None = None
        self._streams: list[torch.cuda.Stream | None] = [None] * config.lanes  # made by each lane's first call
        step_counts = {config.num_steps, config.first_chunk_steps or config.num_steps}
        times = [t for n in step_counts for _, _, four in rk4_intervals(n, config.sway_coefficient) for t in four]
        dtype = getattr(torch, config.dit_dtype)
        if dit.dtype != dtype:  # models loaded for another precision (the server loads them in this one)
            dit = copy.deepcopy(dit).to(dtype)
        self._dit = FastDiT(dit, times)
        self._vocoder = FastVocoder(models.vocoder)
        self._graph_windows = sorted({window for window, _, _ in self.regular_shapes()})
        if config.cuda_graphs and models.device.type == "cuda":
            self._graphs = [(CallGraphs("token2wav ODE"), CallGraphs("token2wav vocoder")) for _ in range(config.lanes)]
            self._capture_graphs()

    @classmethod
    def from_pretrained(
        cls, path: str | Path, config: Token2WavConfig = Token2WavConfig(), *, device: str = "auto"
    ) -> Token2Wav:
        return cls(load_token2wav(Path(path), device=device, dit_dtype=config.dit_dtype), config)

    @property
    def voices(self) -> tuple[str, ...]:
        return tuple(self.models.speakers)

    @property
    def device(self) -> torch.device:
        return self.models.device

    def speaker(self, voice: str) -> Speaker:
        try:
            return self.models.speakers[voice]
        except KeyError:
            raise UnknownVoice(f"unknown voice {voice!r}; this model speaks as: {', '.join(self.voices)}") from None

    def text_bos_token(self, voice: str) -> int:
        """The thinker-vocabulary token that starts the talker's text stream for ``voice``."""
        return self.speaker(voice).bos_token

    @torch.inference_mode()
    def synthesize(self, codes: list[int] | torch.Tensor, voice: str, *, seed: int | None = None) -> torch.Tensor:
        """float32 ``[samples]`` waveform of a whole utterance (HF's ``Qwen2_5OmniToken2WavModel.forward``)."""
        code = as_codes(codes, self.device, self.num_codes)
        noise = Noise(seed, self.mel_dim).upto(code.shape[1] * self.repeats)
        mel = self._mel(code, noise, self.speaker(voice), self.config.num_steps)
        return to_host(self._wave(mel).reshape(-1).float())[0]

    def stream(self, voice: str, *, seed: int | None = None) -> Token2WavStream:
        return Token2WavStream(self, self.speaker(voice), seed)

    def regular_shapes(self) -> list[tuple[int, int, ChunkShape]]:
        """Every regular chunk's (window codes, left mel frames, shape), in stream order: the first chunk's,
        then later ones' until they repeat (a window's start is block-aligned, so its length cycles)."""
        cfg = self.config
        shapes: list[tuple[int, int, ChunkShape]] = []
        start = left = 0
        while True:
            end = cfg.first_chunk_codes if start == 0 else start + cfg.chunk_codes
            ahead = end + cfg.lookahead_codes
            b, r = self.block_codes, self.repeats
            win_start, win_end, shape = chunk_window(cfg, b, r, start, end, ahead, final=False)
            entry = (win_end - win_start, left, shape)
            if entry in shapes or (win_end - win_start) * self.repeats > self.max_frames:
                return shapes
            shapes.append(entry)
            kept = shape.hi - shape.lo
            left = min(left + kept, cfg.vocoder_context_frames) if cfg.vocoder_context_frames else 0
            start = end

    def _capture_graphs(self) -> None:
        """Capture every regular chunk's ODE and vocoder graphs (on the first-chunk lane, the first chunk's
        only), for each lane, batch bucket and reference-mel length, by running the calls on zeros; then
        freeze the graphs (nothing is captured while serving)."""
        assert self._graphs is not None
        began = time.perf_counter()
        voices = {s.ref_mel.shape[1]: s for s in self.models.speakers.values()}
        shapes = self.regular_shapes()
        for lane in range(self.config.lanes):
            for window, left, shape in shapes:
                if self._first_chunks_only(lane) and not shape.first:
                    continue
                code = torch.zeros(1, window, dtype=torch.long)
                noise = torch.zeros(1, window * self.repeats, self.mel_dim)
                edge = torch.zeros(1, self.mel_dim, left)
                for speaker in voices.values():
                    for rows in BUCKETS:
                        if rows * window <= GRAPH_CODES:
                            self._chunk_group([(code, noise, speaker, edge, shape)] * rows, lane)
        for pair in self._graphs:
            for graphs in pair:
                graphs.frozen = True
        log.info(
            "token2wav: captured %d ODE and %d vocoder CUDA graphs (%d window shapes, %d voices, %d lanes) in %.1f s",
            sum(len(ode) for ode, _ in self._graphs),
            sum(len(vocoder) for _, vocoder in self._graphs),
            len(shapes),
            len(voices),
            self.config.lanes,
            time.perf_counter() - began,
        )

    def _first_chunks_only(self, lane: int) -> bool:
        return lane == 0 and self.config.lanes > 1

    def close(self) -> None:
        """Stop the batching worker (streams started later start it again)."""
        with self._batched_lock:
            batched, self._batched = self._batched, None
        if batched is not None:
            batched.close()

    # ---- batched across streams (each stream's chunk calls these from its own thread) --------------

    def chunk_batched(
        self,
        code: torch.Tensor,
        noise: torch.Tensor,
        speaker: Speaker,
        left: torch.Tensor,
        chunk: ChunkShape,
        deadline: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One stream's chunk, batched with the other streams' chunks of the same shape: the mel the next
        chunk's vocoder sees on its left (``left`` then the chunk's, the last ``vocoder_context_frames``) and the
        chunk's float32 ``[samples]`` waveform (on the host). ``code`` and ``noise`` are on the host.
        ``deadline``: when the stream's listener runs out of audio (``BatchedCalls``), or None."""
        frames = code.shape[1] * self.repeats
        if frames > self.max_frames:
            raise ValueError(f"{frames} mel frames exceed the DiT's {self.max_frames} positions; use shorter chunks")
        with self._batched_lock:
            if self._batched is None:
                self._batched = BatchedCalls(self._chunk_group, "token2wav", lanes=self.config.lanes)
            batched = self._batched
        key = (chunk, code.shape[1], speaker.ref_mel.shape[1], left.shape[2])
        return batched(key, code, noise, speaker, left, chunk, urgent=chunk.first, deadline=deadline)

    def _chunk_group(self, calls: list[tuple[Any, ...]], lane: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # First audio waits on a first chunk's call: the process's engines launch no step meanwhile.
        alone = self.config.first_chunks_alone and calls[0][4].first
        with urgent() if alone else contextlib.nullcontext():
            if self.device.type != "cuda":
                return self._run_group(calls, lane)
            return self._run_on_lane(calls, lane)

    def _run_on_lane(self, calls: list[tuple[Any, ...]], lane: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        stream = self._streams[lane]
        if stream is None:  # the lane's own CUDA stream: the engines' steps and token2wav's interleave
            # The first-chunk lane's kernels go ahead of the engines' and the other lanes' pending ones.
            priority = -1 if self._first_chunks_only(lane) else 0  # lower is sooner
            stream = self._streams[lane] = torch.cuda.Stream(self.device, priority=priority)
            stream.wait_stream(torch.cuda.current_stream(self.device))  # the weights, loaded on this one
        with torch.cuda.stream(stream):
            return self._run_group(calls, lane)

    def graph_rows(self, window: int) -> int:
        """The most rows of a ``window``-code chunk one graphed call holds (0: none)."""
        return max((rows for rows in BUCKETS if rows * window <= GRAPH_CODES), default=0)

    @torch.inference_mode()
    def _run_group(self, calls: list[tuple[Any, ...]], lane: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # Every device tensor made here is made on the worker's stream; what a caller passes is on the host,
        # or made here by an earlier call (``left``), or the voice's, made at load.
        chunk: ChunkShape = calls[0][4]
        window = calls[0][0].shape[1]
        ode_graphs, vocoder_graphs = self._graphs[lane] if self._graphs is not None else (None, None)
        # A stream's last window has a one-off length: its ODE runs in the graphs of the next regular window
        # up, padded with frames no real frame attends to, and its vocoder eagerly (a convolution's edge
        # would see the padding). Without such a window, or without graphs, the ODE runs eagerly, unpadded.
        ode_window = window if chunk.regular else padded_window(window, self._graph_windows)
        if ode_window is None or ode_graphs is None:
            ode_graphs, ode_window = None, window
        if not chunk.regular:
            vocoder_graphs = None
        rows = self.graph_rows(ode_window) if ode_graphs is not None else 0
        if 0 < rows < len(calls):
            # More rows than a graph holds: graphed slices, not thousands of eager launches (32 sessions'
            # later chunks, 26 rows: 0.95 s eagerly on an H100).
            return [out for i in range(0, len(calls), rows) for out in self._run_group(calls[i : i + rows], lane)]
        code = torch.cat([c[0] for c in calls])
        ref_mel = torch.cat([c[2].ref_mel for c in calls])
        x0 = torch.cat([c[1] for c in calls])
        frames = window * self.repeats
        if ode_window > window:
            code = F.pad(code, (0, ode_window - window))
            x0 = F.pad(x0, (0, 0, 0, (ode_window - window) * self.repeats))
        code, x0 = code.to(self.device), x0.to(device=self.device, dtype=ref_mel.dtype)
        valid = torch.full((len(calls),), frames, dtype=torch.long, device=self.device)
        cond = torch.cat([c[2].cond for c in calls])
        left = torch.cat([c[3] for c in calls]).to(device=self.device, dtype=ref_mel.dtype)
        steps = chunk.steps

        def ode(c: torch.Tensor, x: torch.Tensor, s: torch.Tensor, r: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return self._ode(c, x, s, r, steps, v)

        mel = ode_graphs(ode, steps, code, x0, cond, ref_mel, valid) if ode_graphs is not None else None
        if mel is None:
            mel = ode(code, x0, cond, ref_mel, valid)
        mel = mel[:, :, :frames]
        kept = mel[:, :, chunk.lo : chunk.hi]
        vocoder_in = torch.cat((left, kept, mel[:, :, chunk.hi : chunk.hi + self.config.vocoder_context_frames]), 2)
        wav = vocoder_graphs(self._wave, None, vocoder_in) if vocoder_graphs is not None else None
        if wav is None:
            wav = self._wave(vocoder_in)
        a = left.shape[2] * self.hop
        tail = torch.cat((left, kept), 2)[:, :, -max(self.config.vocoder_context_frames, 1) :]
        (wav,) = to_host(wav[:, a : a + kept.shape[2] * self.hop].float())  # also waits for ``tail``
        return [(tail[i : i + 1], wav[i]) for i in range(len(calls))]

    # ---- the two models ---------------------------------------------------------------------------

    def _mel(self, code: torch.Tensor, noise: torch.Tensor, speaker: Speaker, steps: int) -> torch.Tensor:
        """``[B, mel_dim, frames]`` mel of ``code`` ``[B, n]`` from ``noise`` ``[B, n * repeats, mel_dim]``
        (``speaker`` rows: one per batch row), ``steps`` ODE steps."""
        frames = code.shape[1] * self.repeats
        if frames > self.max_frames:
            raise ValueError(f"{frames} mel frames exceed the DiT's {self.max_frames} positions; use shorter chunks")
        x0 = noise.to(device=self.device, dtype=speaker.ref_mel.dtype)
        return self._ode(code, x0, speaker.cond, speaker.ref_mel, steps)

    def _ode(
        self,
        code: torch.Tensor,
        x0: torch.Tensor,
        cond: torch.Tensor,
        ref_mel: torch.Tensor,
        steps: int,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """transformers' flow-matching ODE (``Qwen2_5OmniToken2WavDiTModel.sample``: RK4 in its 3/8 form over
        sway-warped times), with the times as host numbers: no step waits for the device, so it also
        captures into a CUDA graph. ``valid`` (``[B]``): each row's real frames, the rest padding."""
        cfg = self.config
        guided = cfg.guidance_scale >= 1e-5
        chunk = self._dit.prepare(code, cond.unsqueeze(1).repeat(1, x0.shape[1], 1), ref_mel, guided, valid)

        def velocity(t: float, x: torch.Tensor) -> torch.Tensor:
            out = self._dit.velocity(chunk, x, t)
            if not guided:
                return out
            with_cond, null = torch.chunk(out, 2, dim=0)
            return with_cond + (with_cond - null) * cfg.guidance_scale

        x = x0
        for t0, t1, (ta, tb, tc, td) in rk4_intervals(steps, cfg.sway_coefficient):
            dt = t1 - t0
            k1 = velocity(ta, x)
            k2 = velocity(tb, x + dt * k1 / 3)
            k3 = velocity(tc, x + dt * (k2 - k1 / 3))
            k4 = velocity(td, x + dt * (k1 - k2 + k3))
            x = x + (k1 + 3 * (k2 + k3) + k4) * dt / 8
        return x.permute(0, 2, 1)

    def _wave(self, mel: torch.Tensor) -> torch.Tensor:
        """``[B, samples]`` waveform of ``mel`` ``[B, mel_dim, frames]`` on the device (``FastVocoder``)."""
        return self._vocoder(mel)
