"""Wire audio formats of the Realtime API <-> the internal 24 kHz mono pcm16 stream.

Everything inside the session is 24 kHz pcm16 (what the VAD, ASR and TTS are fed); G.711 runs at
8 kHz, so it is resampled at the edge. Resampling is linear interpolation, enough for telephone-band
audio whose content is already below 4 kHz.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from omni_gateway.gateway.realtime import g711

AudioFormat = Literal["pcm16", "g711_ulaw", "g711_alaw"]
AUDIO_FORMATS: tuple[AudioFormat, ...] = ("pcm16", "g711_ulaw", "g711_alaw")
SAMPLE_RATE = 24000
G711_RATE = 8000
BYTES_PER_MS = SAMPLE_RATE * 2 // 1000  # 48


class AudioFormatError(ValueError):
    """Client audio that is not in the session's input format (the media decoders' errors are the model side's)."""


def resample(samples: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Linear-interpolation resampling of int16 samples."""
    if src_rate == dst_rate or samples.size == 0:
        return samples.astype(np.int16, copy=False)
    n_out = max(1, round(samples.size * dst_rate / src_rate))
    positions = np.arange(n_out, dtype=np.float64) * (src_rate / dst_rate)
    out = np.interp(positions, np.arange(samples.size, dtype=np.float64), samples.astype(np.float64))
    return np.clip(np.rint(out), -32768, 32767).astype(np.int16)


def decode(data: bytes, fmt: AudioFormat) -> bytes:
    """Client audio in ``fmt`` -> 24 kHz pcm16 bytes."""
    if fmt == "pcm16":
        if len(data) % 2:
            raise AudioFormatError(f"pcm16 audio must have an even number of bytes, got {len(data)}")
        return data
    samples = g711.ulaw_to_pcm(data) if fmt == "g711_ulaw" else g711.alaw_to_pcm(data)
    return resample(samples, G711_RATE, SAMPLE_RATE).astype("<i2").tobytes()


def encode(pcm16: bytes | bytearray, fmt: AudioFormat, sample_rate: int = SAMPLE_RATE) -> bytes:
    """pcm16 at ``sample_rate`` -> bytes in the client's output format (pcm16 always at 24 kHz)."""
    samples = np.frombuffer(pcm16[: len(pcm16) - len(pcm16) % 2], dtype="<i2")
    if fmt == "pcm16":
        if sample_rate == SAMPLE_RATE:
            return samples.tobytes()
        return resample(samples, sample_rate, SAMPLE_RATE).astype("<i2").tobytes()
    narrow = resample(samples, sample_rate, G711_RATE)
    encoded: bytes = g711.pcm_to_ulaw(narrow) if fmt == "g711_ulaw" else g711.pcm_to_alaw(narrow)
    return encoded


def duration_ms(pcm16_24k: bytes | bytearray | int) -> float:
    n = pcm16_24k if isinstance(pcm16_24k, int) else len(pcm16_24k)
    return n / BYTES_PER_MS


def wire_duration_ms(size: int, fmt: AudioFormat) -> float:
    """How long ``size`` bytes of audio in the client's format ``fmt`` play: G.711 is one byte a sample at 8 kHz."""
    return duration_ms(size) if fmt == "pcm16" else size / (G711_RATE // 1000)
