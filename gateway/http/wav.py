"""WAV reading and writing: uploads become mono pcm16, speech becomes a WAV file.

The stdlib ``wave`` parser reads the header (pure Python, so no native decoder sees client bytes) and
numpy converts samples. Everything but PCM WAV is left to the backend's decoders and their limits.
"""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
from omni_gateway.gateway.http.errors import invalid

# Above studio rates a header is an attack or a broken file; low rates are bounded by the duration check
# (which is what limits resampling work), so the floor only refuses what cannot be sound at all.
MIN_RATE, MAX_RATE = 100, 384000
MAX_CHANNELS = 8


def is_wav(data: bytes) -> bool:
    return len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WAVE"


def decode_wav(data: bytes, *, max_seconds: float, param: str) -> tuple[bytes, int]:
    """Mono 16-bit little-endian PCM and its sample rate; the duration is checked from the header first."""
    try:
        with wave.open(io.BytesIO(data), "rb") as reader:
            channels, width, rate, frames = (
                reader.getnchannels(),
                reader.getsampwidth(),
                reader.getframerate(),
                reader.getnframes(),
            )
            if not MIN_RATE <= rate <= MAX_RATE or not 1 <= channels <= MAX_CHANNELS:
                raise invalid(
                    f"'{param}': the WAV header declares {channels} channels at {rate} Hz; expected "
                    f"1 to {MAX_CHANNELS} channels at {MIN_RATE} to {MAX_RATE} Hz.",
                    param,
                    "invalid_audio",
                )
            if frames / rate > max_seconds:
                raise invalid(
                    f"'{param}': the audio lasts {frames / rate:.1f} s; at most {max_seconds:.0f} s are accepted.",
                    param,
                    "audio_too_long",
                )
            if width not in (1, 2, 3, 4):
                raise invalid(f"'{param}': {8 * width}-bit WAV samples are not supported.", param)
            raw = reader.readframes(frames)
    except (wave.Error, EOFError, struct.error):
        raise invalid(
            f"'{param}' is not a readable PCM WAV file (16-bit, 8-bit, 24-bit or 32-bit integer samples are accepted).",
            param,
            "invalid_audio",
        ) from None
    samples = _to_int16(raw, width)
    return _downmix(samples, channels).astype("<i2").tobytes(), rate


def _to_int16(raw: bytes, width: int) -> np.ndarray:
    usable = len(raw) - len(raw) % width
    if width == 1:  # WAV 8-bit is unsigned
        return ((np.frombuffer(raw, dtype=np.uint8).astype(np.int16) - 128) << 8).astype(np.int16)
    if width == 2:
        return np.frombuffer(raw[:usable], dtype="<i2")
    # 24/32-bit little-endian signed: keep the two most significant bytes of each sample
    frames = np.frombuffer(raw[:usable], dtype=np.uint8).reshape(-1, width)[:, width - 2 :]
    return np.ascontiguousarray(frames).view("<i2").reshape(-1)


def _downmix(samples: np.ndarray, channels: int) -> np.ndarray:
    if channels == 1:
        return samples
    frames = len(samples) // channels
    mixed = samples[: frames * channels].reshape(frames, channels).astype(np.int32).sum(axis=1) // channels
    downmixed: np.ndarray = mixed.astype("<i2")
    return downmixed


def wav_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """Header of a mono pcm16 WAV; ``None`` marks an unknown length (streamed output), as players accept."""
    size = 0xFFFFFFFF if data_bytes is None else data_bytes
    riff = 0xFFFFFFFF if data_bytes is None else 36 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", size)
    )


def encode_wav(pcm16: bytes, sample_rate: int) -> bytes:
    return wav_header(sample_rate, len(pcm16)) + pcm16
