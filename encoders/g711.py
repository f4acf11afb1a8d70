"""G.711 mu-law and A-law companding (ITU-T G.711) with numpy lookup tables.

Encoding indexes a 65,536-entry table by the 16-bit sample, decoding a 256-entry table by the code,
so a realtime audio chunk converts with one gather and no per-sample Python.
"""
from __future__ import annotations

import numpy as np

_ULAW_BIAS = 0x84


def _ulaw_encode_all() -> np.ndarray:
    # The reference coder works on 14-bit samples (arithmetic shift, so negatives round toward -inf).
    pcm14 = np.arange(-32768, 32768, dtype=np.int32) >> 2
    sign = np.where(pcm14 < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(pcm14), 8158) + 0x21  # top of segment 7
    # Segment = position of the highest set bit above bit 5 (0..7).
    exponent = np.floor(np.log2(magnitude)).astype(np.int32) - 5
    mantissa = (magnitude >> (exponent + 1)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8)


def _ulaw_decode_all() -> np.ndarray:
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (code >> 4) & 0x07
    mantissa = code & 0x0F
    magnitude = (((mantissa << 3) + _ULAW_BIAS) << exponent) - _ULAW_BIAS
    return np.where(code & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_encode_all() -> np.ndarray:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 3  # A-law works on 13-bit samples
    sign = np.where(pcm >= 0, 0x80, 0)
    magnitude = np.where(pcm >= 0, pcm, -pcm - 1)
    magnitude = np.minimum(magnitude, 0x0FFF)
    exponent = np.where(magnitude < 32, 0, np.floor(np.log2(np.maximum(magnitude, 1))).astype(np.int32) - 4)
    mantissa = np.where(exponent == 0, magnitude >> 1, magnitude >> exponent) & 0x0F
    return ((sign | (exponent << 4) | mantissa) ^ 0x55).astype(np.uint8)


def _alaw_decode_all() -> np.ndarray:
    code = np.arange(256, dtype=np.int32) ^ 0x55
    exponent = (code >> 4) & 0x07
    mantissa = code & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(code & 0x80, magnitude, -magnitude).astype(np.int16)


_ULAW_ENC = _ulaw_encode_all()
_ULAW_DEC = _ulaw_decode_all()
_ALAW_ENC = _alaw_encode_all()
_ALAW_DEC = _alaw_decode_all()


def _pcm16_index(pcm16: bytes) -> np.ndarray:
    if len(pcm16) % 2:
        raise ValueError(f"pcm16 data must have an even number of bytes; got {len(pcm16)}")
    return np.frombuffer(pcm16, dtype="<i2").astype(np.int32) + 32768


def ulaw_encode(pcm16: bytes) -> bytes:
    """Little-endian 16-bit PCM to mu-law bytes (one byte per sample)."""
    return _ULAW_ENC[_pcm16_index(pcm16)].tobytes()


def ulaw_decode(data: bytes) -> bytes:
    """Mu-law bytes to little-endian 16-bit PCM."""
    return _ULAW_DEC[np.frombuffer(data, dtype=np.uint8)].astype("<i2").tobytes()


def alaw_encode(pcm16: bytes) -> bytes:
    """Little-endian 16-bit PCM to A-law bytes (one byte per sample)."""
    return _ALAW_ENC[_pcm16_index(pcm16)].tobytes()


def alaw_decode(data: bytes) -> bytes:
    """A-law bytes to little-endian 16-bit PCM."""
    return _ALAW_DEC[np.frombuffer(data, dtype=np.uint8)].astype("<i2").tobytes()
