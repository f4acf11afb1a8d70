"""G.711 tables and the wire-format conversions around them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from omni_gateway.gateway.realtime import audio, g711

ALL_SAMPLES = np.arange(-32768, 32768, dtype=np.int16)


def _audioop():  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import audioop
        except ImportError:
            pytest.skip("audioop (the stdlib G.711 reference) is gone from this Python")
    return audioop


def test_encoders_match_the_stdlib_reference_on_every_sample() -> None:
    audioop = _audioop()
    raw = ALL_SAMPLES.tobytes()
    assert g711.pcm_to_ulaw(ALL_SAMPLES) == audioop.lin2ulaw(raw, 2)
    assert g711.pcm_to_alaw(ALL_SAMPLES) == audioop.lin2alaw(raw, 2)


def test_decoders_match_the_stdlib_reference_on_every_code() -> None:
    audioop = _audioop()
    codes = bytes(range(256))
    assert g711.ulaw_to_pcm(codes).tobytes() == audioop.ulaw2lin(codes, 2)
    assert g711.alaw_to_pcm(codes).tobytes() == audioop.alaw2lin(codes, 2)


@pytest.mark.parametrize("encode, decode", [(g711.pcm_to_ulaw, g711.ulaw_to_pcm), (g711.pcm_to_alaw, g711.alaw_to_pcm)])
def test_round_trip_error_is_within_the_logarithmic_step(encode, decode) -> None:  # type: ignore[no-untyped-def]
    back = decode(encode(ALL_SAMPLES)).astype(np.int32)
    err = np.abs(back - ALL_SAMPLES.astype(np.int32))
    # the quantisation step grows with magnitude: 1/16 of a segment, at most 1024 at full scale
    assert err.max() <= 1024
    small = np.abs(ALL_SAMPLES.astype(np.int32)) < 64
    assert err[small].max() <= 8
    # decoded codes are fixed points: encoding a decoded value gives back the same value
    assert np.array_equal(decode(encode(back.astype(np.int16))), back.astype(np.int16))


def test_wire_conversion_resamples_8k_to_24k_and_back() -> None:
    t = np.arange(2400) / 24000
    pcm = (10000 * np.sin(2 * np.pi * 300 * t)).astype("<i2").tobytes()  # 100 ms
    for fmt in ("g711_ulaw", "g711_alaw"):
        wire = audio.encode(pcm, fmt)
        assert len(wire) == 800
        back = np.frombuffer(audio.decode(wire, fmt), dtype="<i2").astype(np.float64)
        assert len(back) == 2400
        ref = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
        assert np.corrcoef(back[:-3], ref[:-3])[0, 1] > 0.995


def test_pcm16_passes_through_and_rejects_odd_lengths() -> None:
    assert audio.decode(b"\x01\x02\x03\x04", "pcm16") == b"\x01\x02\x03\x04"
    with pytest.raises(audio.AudioFormatError, match="even number of bytes"):
        audio.decode(b"\x01\x02\x03", "pcm16")
