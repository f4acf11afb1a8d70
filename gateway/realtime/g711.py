"""G.711 mu-law and A-law codecs (ITU-T G.711) as numpy lookup tables.

Decoding is one table lookup per byte. Encoding indexes a 65536-entry table by the 16-bit sample,
so both directions are a single vectorised gather with no per-sample Python work.
"""

from __future__ import annotations

import numpy as np

_BIAS = 0x84
_BIAS14 = 0x21
_CLIP14 = 8159


def _ulaw_decode_table() -> np.ndarray:
    codes = ~np.arange(256, dtype=np.int32) & 0xFF
    sign = codes & 0x80
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = (((mantissa << 3) + _BIAS) << exponent) - _BIAS
    return np.where(sign != 0, -magnitude, magnitude).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.int32) ^ 0x55
    sign = codes & 0x80
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    # A-law's sign bit set means positive (the opposite of mu-law).
    return np.where(sign != 0, magnitude, -magnitude).astype(np.int16)


def _ulaw_encode_table() -> np.ndarray:
    # Works on the 14-bit value (sample >> 2), as the reference G.711 C code does.
    samples = np.arange(-32768, 32768, dtype=np.int32) >> 2
    sign = np.where(samples < 0, 0x80, 0)
    # Clipped magnitudes beyond the top segment saturate to the largest code.
    magnitude = np.minimum(np.minimum(np.where(samples < 0, -samples, samples), _CLIP14) + _BIAS14, 0x1FFF)
    exponent = np.zeros(samples.shape, dtype=np.int32)
    for bit in range(1, 8):
        exponent = np.where(magnitude >= (0x20 << bit), bit, exponent)
    mantissa = (magnitude >> (exponent + 1)) & 0x0F
    table: np.ndarray = (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8)
    return table


def _alaw_encode_table() -> np.ndarray:
    samples = np.arange(-32768, 32768, dtype=np.int32)
    sign = np.where(samples >= 0, 0x80, 0)
    magnitude = np.minimum(np.where(samples < 0, -samples - 1, samples), 32767) >> 3  # 13-bit magnitude
    exponent = np.zeros(samples.shape, dtype=np.int32)
    for bit in range(1, 8):
        exponent = np.where(magnitude >= (0x10 << bit), bit, exponent)
    mantissa = np.where(exponent == 0, magnitude >> 1, magnitude >> exponent) & 0x0F
    table: np.ndarray = ((sign | (exponent << 4) | mantissa) ^ 0x55).astype(np.uint8)
    return table


_ULAW_DECODE = _ulaw_decode_table()
_ALAW_DECODE = _alaw_decode_table()
_ULAW_ENCODE = _ulaw_encode_table()
_ALAW_ENCODE = _alaw_encode_table()


def ulaw_to_pcm(data: bytes) -> np.ndarray:
    """mu-law bytes -> int16 samples."""
    return _ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def alaw_to_pcm(data: bytes) -> np.ndarray:
    """A-law bytes -> int16 samples."""
    return _ALAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def pcm_to_ulaw(samples: np.ndarray) -> bytes:
    """int16 samples -> mu-law bytes."""
    return _ULAW_ENCODE[samples.astype(np.int32) + 32768].tobytes()


def pcm_to_alaw(samples: np.ndarray) -> bytes:
    """int16 samples -> A-law bytes."""
    return _ALAW_ENCODE[samples.astype(np.int32) + 32768].tobytes()
