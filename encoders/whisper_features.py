"""Whisper's log-mel spectrogram of a batch, computed on the model's device and left there.

Hugging Face's ``WhisperFeatureExtractor`` computes the spectrogram with torch, on the GPU when asked, but
pads the batch in numpy first and returns a host array, which the recognizer then copies to the GPU again.
In a busy server each of those copies and host passes may wait for the interpreter lock: a batch's
spectrogram took 0.3-1.1 s beside a busy Python thread on an H200, where its encoder pass took 22-240 ms.
Here the batch is padded into one host buffer and copied once; the transform is the extractor's own
(``_torch_extract_fbank_features``: a Hann-windowed STFT, its power through the mel filters, log10,
clamped to 8 below each window's peak, scaled), and the result stays on the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class WhisperLogMel:
    """``log_mel(samples)``: [rows, mel bins, frames] on ``device`` for one window (a 1-D float array) or a list
    of them, each padded with zeros or cut to the extractor's 30 s; equal to ``extractor(samples,
    return_tensors="pt").input_features`` computed on the same device."""

    def __init__(self, extractor: Any, device: Any) -> None:
        import torch

        self._torch = torch
        self.device = torch.device(device)
        self.samples = int(extractor.n_samples)
        self.n_fft, self.hop = int(extractor.n_fft), int(extractor.hop_length)
        self.padding_value = float(extractor.padding_value)
        self.dither = float(getattr(extractor, "dither", 0.0))
        self._window = torch.hann_window(self.n_fft, device=self.device)
        self._filters = torch.from_numpy(np.asarray(extractor.mel_filters, np.float32)).to(self.device).T

    def __call__(self, samples: np.ndarray | list[np.ndarray]) -> Any:
        torch = self._torch
        windows = [samples] if isinstance(samples, np.ndarray) and samples.ndim == 1 else list(samples)
        if not windows:
            raise ValueError("no audio: expected at least one window of samples")
        batch = np.full((len(windows), self.samples), self.padding_value, np.float32)
        for row, window in enumerate(windows):
            window = np.asarray(window, np.float32).reshape(-1)[: self.samples]
            batch[row, : len(window)] = window
        waveform = torch.from_numpy(batch).to(self.device)
        if self.dither:
            waveform += self.dither * torch.randn(waveform.shape, device=self.device)
        stft = torch.stft(waveform, self.n_fft, self.hop, window=self._window, return_complex=True)
        power = (stft[..., :-1].abs() ** 2).contiguous()
        log_spec = torch.clamp(self._filters @ power, min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.amax(dim=(1, 2), keepdim=True) - 8.0)
        return (log_spec + 4.0) / 4.0
