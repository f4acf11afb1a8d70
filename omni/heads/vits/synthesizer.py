"""Hugging Face ``VitsModel`` (VITS, MMS-TTS) as a batched speech synthesizer, on CPU or GPU.

A batch renders in steps (``VitsRender``): the model pass to the spectrogram (``vits.model_pass``), then the
vocoder one window of frames at a time (``vits.vocoder_batch``), so that a batcher can put other work between them
and hand each window's audio out as soon as it is decoded.
On CUDA a batch takes a few shapes only and replays them from CUDA graphs (``call_graphs``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from omni_gateway.omni.heads.vits.model_pass import duration_noise, expand_priors, flow_stage, frame_lengths, text_stage
from omni_gateway.omni.heads.vits.spline import use_sync_free_spline
from omni_gateway.omni.heads.vits.vocoder_batch import (
    decode_masked,
    decode_window,
    detach_vocoder,
    receptive_frames,
    window_frames,
)

log = logging.getLogger(__name__)

# On CUDA a VITS batch's tokens and frames are padded to powers of two from these (``HfVitsSynthesizer``)...
MIN_TOKENS, MIN_FRAMES = 16, 32
# ...and its model pass replays from CUDA graphs up to these sizes: larger batches are bound by the GPU's
# arithmetic, not by launching its operations, and run eagerly. 512 tokens hold the TTS head's longest clause
# (``ChunkerConfig.max_chars``, 250) with the blank MMS tokenizers put between characters: at 256, every long
# later clause ran eagerly, a pass of about 1 s beside a busy thread instead of 0.1 s.
GRAPH_TOKENS, GRAPH_FRAMES, GRAPH_ROW_FRAMES = 512, 2048, 65536


class HfVitsSynthesizer:
    """A local Hugging Face VITS/MMS-TTS checkpoint directory, on CPU or GPU.

    VITS samples noise in its flow and duration predictor; ``seed`` makes every call reproducible
    (the global torch generator is reseeded under a lock, then restored). On CUDA with ``cuda_graphs`` the
    model pass and the vocoder replay from CUDA graphs that ``prepare`` captures (``call_graphs``): eagerly a
    batch's model pass is a few thousand launches, which a busy server's host issues slowly.
    """

    def __init__(
        self, path: str | Path, *, device: str = "auto", seed: int | None = None, cuda_graphs: bool = True
    ) -> None:
        import torch
        from omni_gateway.kernels.host_copies import to_host
        from transformers import AutoTokenizer, VitsModel

        self._torch = torch
        self._to_host = to_host
        self.device = torch.device(
            "cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device
        )
        self.model = VitsModel.from_pretrained(path).to(self.device).eval()
        use_sync_free_spline(self.model)
        # The model's forward stops at the spectrogram; the vocoder runs on it with each row's length
        # (``vits.vocoder_batch``), so a padded batch renders every row as it would alone.
        self.vocoder = detach_vocoder(self.model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.sample_rate = int(self.model.config.sampling_rate)
        self.voices = (
            tuple(f"speaker_{i}" for i in range(self.model.config.num_speakers))
            if self.model.config.num_speakers > 1
            else (Path(path).name,)
        )
        self.seed = seed
        self.upsampling = int(np.prod(self.model.config.upsample_rates))
        # A vocoder step decodes at most this many frames summed over the batch's rows (2 s of 16 kHz audio
        # for 16 rows at MMS's 256 samples a frame), so what waits between steps never waits long.
        self.window_row_frames = 2048
        self.context = receptive_frames(self.vocoder)  # frames either side of a window
        self._lock = threading.Lock()
        # On CUDA the model runs on a stream of its own: its few synchronizations (the output lengths, each
        # window's samples) then wait for its own kernels only, not for those another stage of the process
        # (the speech recognizer's encoder) queued on the default stream.
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(self.device))  # the weights, loaded on that one
        self._graphs: tuple[Any, Any, Any] | None = None  # the text stage's, the flow's, the vocoder's
        if cuda_graphs and self.device.type == "cuda":
            from omni_gateway.omni.heads.call_graphs import CallGraphs

            self._graphs = (CallGraphs("VITS text stage"), CallGraphs("VITS flow"), CallGraphs("VITS vocoder"))
            for graphs in self._graphs:
                graphs.frozen = True  # captured by ``prepare`` only, never while serving

    def synthesize(
        self, text: str, *, speed: float = 1.0, voice: str | None = None, cancel: threading.Event | None = None
    ) -> np.ndarray:
        if cancel is not None and cancel.is_set():
            return np.zeros(0, np.float32)
        return self.synthesize_batch([text], speed=speed, voice=voice)[0]

    def synthesize_batch(self, texts: list[str], *, speed: float = 1.0, voice: str | None = None) -> list[np.ndarray]:
        """Several texts in one forward pass (padded to the longest; the masks keep each row as it would be
        alone). The noise VITS samples is drawn for the whole batch: with a ``seed``, a batch is as
        reproducible as a single text, but a text's audio depends on the batch it ran in unless the
        model's noise scales are 0."""
        render = self.start_batch(texts, speed=speed, voice=voice)
        parts: list[list[np.ndarray]] = [[] for _ in texts]
        done = False
        while not done:
            done = render.step()
            for part, (samples, _) in zip(parts, render.take()):
                part.append(samples)
        return [np.concatenate(part) for part in parts]

    def start_batch(self, texts: list[str], *, speed: float = 1.0, voice: str | None = None) -> VitsRender:
        """``synthesize_batch`` in steps: this call runs the model up to the spectrogram, and each
        ``step`` of the returned render decodes one window of the vocoder (``window_row_frames``)."""
        torch = self._torch
        ids = [self.tokenizer(text)["input_ids"] for text in texts]
        rows = [i for i, row in enumerate(ids) if row]
        if not rows:
            return VitsRender(self, texts, rows, None, [], None, None)
        # padded here from the ids above: a second, batched tokenizer call cost as much again (VITS's
        # tokenizer is Python, about 1.3 ms per 250-character clause), time the worker holds the interpreter
        pad = self.tokenizer.pad_token_id
        input_ids, attention_mask = _padded(
            [ids[i] for i in rows], self.model.config.pad_token_id if pad is None else pad
        )
        speaker = self.voices.index(voice) if voice in self.voices and self.model.config.num_speakers > 1 else None
        with self._lock, self._on_stream(), torch.inference_mode(), torch.random.fork_rng(devices=self._rng_devices()):
            if self.seed is not None:
                torch.manual_seed(self.seed)
            conditioning = None
            if speaker is not None:
                conditioning = self.model.embed_speaker(torch.full((1,), speaker, device=self.device)).unsqueeze(-1)
            # ``speed`` scales the voice's own rate (its config's speaking_rate, 1.0 in MMS checkpoints)
            rate = speed * float(self.model.config.speaking_rate)
            spectrogram, frames = self._spectrogram(input_ids, attention_mask, 1 / rate, conditioning)
            lengths = [n * self.upsampling for n in frames]
            row_frames = torch.tensor(frames, device=self.device)
            # rows padded to a power of two (rows of no frames) once, here: the vocoder then sees few shapes
            padded = 1 << (len(rows) - 1).bit_length()
            if padded > len(rows):
                spectrogram = torch.cat(
                    [spectrogram, spectrogram.new_zeros(padded - len(rows), *spectrogram.shape[1:])]
                )
                row_frames = torch.cat([row_frames, row_frames.new_zeros(padded - len(rows))])
        return VitsRender(self, texts, rows, spectrogram, lengths, row_frames, conditioning)

    def decode(
        self, spectrogram: Any, frames: Any, conditioning: Any | None, start: int, window: int, rows: int
    ) -> np.ndarray:
        """Samples of frames ``start:start + window`` of a ``start_batch`` spectrogram (whose rows are padded
        to a power of two), as float32 ``(rows, samples)`` for its first ``rows`` rows."""
        with self._lock, self._on_stream(), self._torch.inference_mode():
            wave = decode_window(
                self.vocoder, spectrogram, frames, conditioning, start, window, self.context, run=self._vocode
            )
            return self._to_host(wave[:rows].float())[0].numpy()

    def prepare(self, max_rows: int = 64) -> None:
        """On CUDA, capture the CUDA graphs of the model pass and the vocoder (``cuda_graphs``), or else decode
        once at every window shape, for batches of up to ``max_rows`` rows: then no request pays for cuDNN
        planning a shape (about 0.1 s each on an H200), and none captures a graph while another stage
        uses the GPU. torch keeps cuDNN's plans per thread: the thread that will render calls this
        (``BatchedSynthesizer``'s worker does, first)."""
        if self.device.type != "cuda":
            return
        from omni_gateway.omni.heads.call_graphs import BUCKETS

        torch = self._torch
        began = time.perf_counter()
        bins = int(self.vocoder.conv_pre.in_channels)
        voices = [None]
        if self.model.config.num_speakers > 1:
            voices.append(self.model.embed_speaker(torch.zeros(1, dtype=torch.long, device=self.device)).unsqueeze(-1))
        with self._lock, self._on_stream(), torch.inference_mode():
            for graphs in self._graphs or ():
                graphs.frozen = False
            for rows in (r for r in BUCKETS if r <= max_rows):
                for conditioning in voices:
                    if self._graphs is not None:
                        self._prepare_model_pass(rows, conditioning)
                    longest = window_frames(1 << 30, rows, self.window_row_frames)
                    window = 16
                    while window <= longest:
                        spectrogram = torch.zeros(rows, bins, window, device=self.device)
                        frames = torch.full((rows,), window, device=self.device)
                        for start in range(0, 2 * window, window):  # the first window's context differs
                            decode_window(
                                self.vocoder,
                                spectrogram.repeat(1, 1, 2),
                                frames * 2,
                                conditioning,
                                start,
                                window,
                                self.context,
                                run=self._vocode,
                            )
                        window *= 2
            for graphs in self._graphs or ():
                graphs.frozen = True
            torch.cuda.current_stream(self.device).synchronize()
        log.info(
            "VITS: prepared for batches of up to %d rows in %.1f s (%s)",
            max_rows,
            time.perf_counter() - began,
            "CUDA graphs: " + ", ".join(f"{len(g)} {g.name}" for g in self._graphs) if self._graphs else "eager",
        )

    def _prepare_model_pass(self, rows: int, conditioning: Any | None) -> None:
        """Capture the model pass's graphs for ``rows`` rows: the text stage at every token bucket up to
        ``GRAPH_TOKENS``, the flow at every frame bucket up to ``GRAPH_FRAMES`` (``GRAPH_ROW_FRAMES`` a batch)."""
        torch = self._torch
        tokens = MIN_TOKENS
        while tokens <= GRAPH_TOKENS:
            ids = torch.zeros(rows, tokens, dtype=torch.long, device=self.device)
            self._text(ids, torch.ones_like(ids), 1.0, conditioning)
            tokens *= 2
        frames, channels = MIN_FRAMES, int(self.model.config.flow_size)
        while frames <= GRAPH_FRAMES and rows * frames <= GRAPH_ROW_FRAMES:
            latents = torch.zeros(rows, channels, frames, device=self.device)
            self._flow(latents, torch.ones(rows, 1, frames, device=self.device), conditioning)
            frames *= 2

    def _spectrogram(
        self, input_ids: Any, attention_mask: Any, length_scale: float, conditioning: Any | None
    ) -> tuple[Any, list[int]]:
        """The model up to the spectrogram ``(rows, bins, longest)`` and each row's length in frames. On
        CUDA the tokens and frames are padded to powers of two, so that few shapes occur (each replays
        from a CUDA graph, or at least reuses cuDNN's plans); the one synchronization reads the lengths."""
        torch = self._torch
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        if self.device.type == "cuda":
            pad = _bucket(input_ids.shape[1], MIN_TOKENS) - input_ids.shape[1]
            input_ids = torch.nn.functional.pad(input_ids, (0, pad), value=self.model.config.pad_token_id)
            attention_mask = torch.nn.functional.pad(attention_mask, (0, pad))
        duration, means, log_variances = self._text(input_ids, attention_mask, length_scale, conditioning)
        frames = self._to_host(frame_lengths(duration))[0].tolist()
        longest = max(frames)
        width = _bucket(longest, MIN_FRAMES) if self.device.type == "cuda" else longest
        latents, frame_mask = expand_priors(self.model, duration, means, log_variances, attention_mask, width)
        spectrogram = self._flow(latents, frame_mask, conditioning)
        return spectrogram[..., :longest], frames

    def _text(self, input_ids: Any, attention_mask: Any, length_scale: float, conditioning: Any | None) -> Any:
        rows, tokens = input_ids.shape
        noise = duration_noise(self.model, rows, tokens, self.device)
        scale = noise.new_full((rows, 1, 1), length_scale)

        def run(ids: Any, mask: Any, noise: Any, scale: Any, *voice: Any) -> Any:
            return text_stage(self.model, ids, mask, noise, scale, voice[0] if voice else None)

        return self._replay(0, run, None, conditioning, input_ids, attention_mask, noise, scale)

    def _flow(self, latents: Any, frame_mask: Any, conditioning: Any | None) -> Any:
        def run(latents: Any, frame_mask: Any, *voice: Any) -> Any:
            return flow_stage(self.model, latents, frame_mask, voice[0] if voice else None)

        return self._replay(1, run, None, conditioning, latents, frame_mask)

    def _vocode(self, piece: Any, frames: Any, conditioning: Any | None, first: int) -> Any:
        def run(piece: Any, frames: Any, *voice: Any) -> Any:
            return decode_masked(self.vocoder, piece, frames, voice[0] if voice else None, first)

        return self._replay(2, run, first, conditioning, piece, frames)

    def _replay(self, which: int, run: Any, key: Any, conditioning: Any | None, *inputs: Any) -> Any:
        """``run(*inputs)`` (plus the voice's conditioning, one row per input row) from the CUDA graph of
        ``self._graphs[which]`` that serves it, or eagerly where none does."""
        if conditioning is not None:
            inputs = (*inputs, conditioning.expand(inputs[0].shape[0], -1, -1))
        output = self._graphs[which](run, key, *inputs) if self._graphs is not None else None
        return run(*inputs) if output is None else output

    def _rng_devices(self) -> list[int]:
        return [self.device.index or 0] if self.device.type == "cuda" else []

    def _on_stream(self) -> Any:
        return contextlib.nullcontext() if self._stream is None else self._torch.cuda.stream(self._stream)


class VitsRender:
    """A batch of ``HfVitsSynthesizer`` in progress: ``step`` decodes the next vocoder window and says
    whether the batch is done; ``take`` gives each text's samples decoded since the last ``take`` (empty for
    a text without tokens), so a row's audio goes out window by window, not when the whole batch ends."""

    def __init__(
        self,
        synthesizer: HfVitsSynthesizer,
        texts: list[str],
        rows: list[int],
        spectrogram: Any | None,
        lengths: list[int],
        frames: Any | None,
        conditioning: Any | None,
    ) -> None:
        """``lengths``: each row's samples; ``frames``: the same in frames, on the model's device (the
        spectrogram's and the frames' rows may be padded past ``rows``)."""
        self._synthesizer, self._texts, self._rows = synthesizer, texts, rows
        self._spectrogram, self._conditioning = spectrogram, conditioning
        self._lengths, self._frames = lengths, frames
        total = 0 if spectrogram is None else spectrogram.shape[-1]
        self._window = window_frames(total, len(rows), synthesizer.window_row_frames)
        self._starts = list(range(0, total, self._window))
        self._pieces: list[np.ndarray] = []  # decoded windows not taken yet
        self._decoded = 0  # windows decoded
        self._taken_samples = 0  # samples per row handed out by ``take``

    def step(self) -> bool:
        """Decode the next window, if any; True once every window is decoded."""
        if self._decoded < len(self._starts):
            start = self._starts[self._decoded]
            self._pieces.append(
                self._synthesizer.decode(
                    self._spectrogram, self._frames, self._conditioning, start, self._window, len(self._rows)
                )
            )
            self._decoded += 1
        return self._decoded == len(self._starts)

    def take(self) -> list[tuple[np.ndarray, bool]]:
        """Each text's samples decoded since the last call, and whether that text's audio is now complete."""
        begin = self._taken_samples
        waveform = np.concatenate(self._pieces, axis=1) if self._pieces else None
        self._pieces = []
        if waveform is not None:
            self._taken_samples += waveform.shape[1]
        empty = np.zeros(0, np.float32)
        taken: list[tuple[np.ndarray, bool]] = [(empty, True) for _ in self._texts]
        everything = self._decoded == len(self._starts)
        for row, i in enumerate(self._rows):
            length = self._lengths[row]
            samples = empty if waveform is None else waveform[row, : max(0, length - begin)].copy()
            taken[i] = (samples, everything or self._taken_samples >= length)
        return taken


def _padded(rows: list[list[int]], pad: int) -> tuple[Any, Any]:
    """Token rows as a right-padded ``(rows, longest)`` id tensor and its attention mask."""
    import torch

    longest = max(len(row) for row in rows)
    ids = np.full((len(rows), longest), pad, np.int64)
    mask = np.zeros((len(rows), longest), np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


def _bucket(n: int, smallest: int) -> int:
    """The power of two that holds ``n``, at least ``smallest``."""
    return max(smallest, 1 << max(n - 1, 0).bit_length())
