from __future__ import annotations

import io
import logging

import av
import numpy as np
import pytest
import soundfile as sf
from hypothesis import given, settings
from hypothesis import strategies as st
from omni_gateway.encoders.audio import (
    AudioDecodeError,
    AudioLimitError,
    AudioLimits,
    StreamResampler,
    decode_audio,
    float_to_pcm16,
    pcm16_to_float,
    resample,
)


def tone(freq: float, rate: int, seconds: float, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def dominant_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[np.argmax(spectrum)])


def encode_sf(x: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def encode_av(x: np.ndarray, rate: int, fmt: str, codec: str) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(x[None, :], format="fltp", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


# ---- decoding ------------------------------------------------------------------------------------
def test_wav_stereo_is_averaged_to_mono_float() -> None:
    left = tone(440, 16000, 0.5)
    stereo = np.stack([left, np.zeros_like(left)], axis=1)
    out = decode_audio(encode_sf(stereo, 16000, "WAV", "PCM_16"))
    assert out.sample_rate == 16000 and out.samples.dtype == np.float32 and out.samples.ndim == 1
    np.testing.assert_allclose(out.samples, left / 2, atol=1 / 32768)


@pytest.mark.parametrize("fmt,subtype", [("FLAC", None), ("OGG", "VORBIS")])
def test_flac_and_ogg_decode_with_frequency_intact(fmt: str, subtype: str | None) -> None:
    out = decode_audio(encode_sf(tone(440, 22050, 1.0), 22050, fmt, subtype))
    assert out.sample_rate == 22050
    assert abs(out.duration_s - 1.0) < 0.01
    assert abs(dominant_hz(out.samples, 22050) - 440) < 3


@pytest.mark.parametrize("fmt,codec", [("mp3", "libmp3lame"), ("webm", "libopus"), ("ipod", "aac")])
def test_compressed_formats_go_through_ffmpeg(fmt: str, codec: str) -> None:
    if codec not in av.codecs_available:
        pytest.skip(f"FFmpeg build lacks {codec}")
    rate = 48000 if codec == "libopus" else 44100
    data = encode_av(tone(440, rate, 1.0), rate, fmt, codec)
    out = decode_audio(data, target_rate=16000)
    assert out.sample_rate == 16000
    assert abs(out.duration_s - 1.0) < 0.1
    assert abs(dominant_hz(out.samples, 16000) - 440) < 5


def test_limits_name_the_limit_and_the_value() -> None:
    wav = encode_sf(tone(440, 8000, 2.0), 8000, "WAV")
    with pytest.raises(AudioLimitError, match=rf"{len(wav)} bytes.*max_bytes=100$"):
        decode_audio(wav, limits=AudioLimits(max_bytes=100))
    with pytest.raises(AudioLimitError, match=r"2\.0 s.*max_duration_s=1"):
        decode_audio(wav, limits=AudioLimits(max_duration_s=1))
    many = encode_sf(np.zeros((800, 10), np.float32), 8000, "WAV")
    with pytest.raises(AudioLimitError, match=r"10 channels.*max_channels=8"):
        decode_audio(many)


def test_duration_cap_applies_during_compressed_decode() -> None:
    if "libmp3lame" not in av.codecs_available:
        pytest.skip("FFmpeg build lacks libmp3lame")
    data = encode_av(tone(300, 16000, 3.0), 16000, "mp3", "libmp3lame")
    with pytest.raises(AudioLimitError, match=r"max_duration_s=1"):
        decode_audio(data, limits=AudioLimits(max_duration_s=1))


def test_wav_header_claiming_endless_data_is_capped_by_what_is_read() -> None:
    wav = bytearray(encode_sf(tone(440, 8000, 3.0), 8000, "WAV", "PCM_16"))
    data_at = wav.index(b"data")
    wav[data_at + 4 : data_at + 8] = b"\xff\xff\xff\xff"  # streamed-WAV style "unknown length"
    assert abs(decode_audio(bytes(wav)).duration_s - 3.0) < 0.01
    with pytest.raises(AudioLimitError, match=r"max_duration_s=1"):
        decode_audio(bytes(wav), limits=AudioLimits(max_duration_s=1))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"RIFF" + b"\x00" * 40,
        b"fLaC\x00\x00",
        b"OggS" + bytes(range(200)),
        b"ID3\x03" + b"\xff" * 300,
        b"hello world, not audio at all" * 10,
    ],
)
def test_garbage_raises_decode_error(data: bytes) -> None:
    with pytest.raises(AudioDecodeError):
        decode_audio(data)


@pytest.mark.parametrize(
    "data",
    [
        b"RIFF" + b"\x00" * 40,
        b"OggS" + bytes(range(200)),
        b"ID3\x03" + b"\xff" * 300,
        b"\x1aE\xdf\xa3" + b"\x00" * 100,
        b"hello world, not audio at all" * 10,
    ],
)
def test_decoder_text_stays_in_the_debug_log(data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """FFmpeg's and libsndfile's own text ("[Errno 1094995529] Invalid data found ...") never reaches a client."""
    with caplog.at_level(logging.DEBUG, logger="omni_gateway.encoders.audio"):
        with pytest.raises(AudioDecodeError) as err:
            decode_audio(data)
    assert str(err.value) in {
        "the audio could not be decoded",
        "the audio container could not be read",
        "the container has no audio stream",
        "audio decoded to zero samples",
    }, str(err.value)
    if str(err.value) != "the container has no audio stream":
        assert caplog.records and all(r.levelno == logging.DEBUG for r in caplog.records)


def test_truncated_files_fail_cleanly_or_return_the_decodable_head() -> None:
    full = {
        "wav": encode_sf(tone(440, 16000, 1.0), 16000, "WAV"),
        "flac": encode_sf(tone(440, 16000, 1.0), 16000, "FLAC"),
    }
    if "libmp3lame" in av.codecs_available:
        full["mp3"] = encode_av(tone(440, 16000, 1.0), 16000, "mp3", "libmp3lame")
    for name, data in full.items():
        for cut in (10, 50, len(data) // 2):
            try:
                out = decode_audio(data[:cut])
            except AudioDecodeError:
                continue
            assert out.duration_s <= 1.05, name


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=0, max_size=2048), st.sampled_from([b"", b"RIFF", b"fLaC", b"OggS", b"\xff\xfb"]))
def test_random_bytes_only_ever_raise_decode_error(data: bytes, magic: bytes) -> None:
    try:
        decode_audio(magic + data)
    except AudioDecodeError:
        pass


# ---- conversion and resampling -------------------------------------------------------------------
def test_pcm16_float_round_trip_and_clipping() -> None:
    ints = np.array([-32768, -1, 0, 1, 12345, 32767], dtype="<i2")
    floats = pcm16_to_float(ints.tobytes())
    assert floats.dtype == np.float32 and floats[0] == -1.0
    assert np.array_equal(np.frombuffer(float_to_pcm16(floats), "<i2"), ints)
    assert np.frombuffer(float_to_pcm16(np.array([2.0, -2.0])), "<i2").tolist() == [32767, -32768]
    with pytest.raises(ValueError, match="even number of bytes; got 3"):
        pcm16_to_float(b"\x00\x01\x02")


def test_resample_keeps_pitch_and_length_and_rejects_aliases() -> None:
    x = tone(440, 48000, 1.0)
    y = resample(x, 48000, 16000)
    assert len(y) == 16000 and abs(dominant_hz(y, 16000) - 440) < 2
    # 10 kHz is above the 8 kHz Nyquist limit of 16 kHz output: it must be filtered, not folded to 6 kHz.
    alias = resample(tone(10000, 24000, 1.0), 24000, 16000)
    assert np.sqrt(np.mean(alias[200:-200] ** 2)) < 0.5 / np.sqrt(2) * 0.01


def test_stream_resampler_matches_one_shot() -> None:
    x = np.random.default_rng(0).standard_normal(24000).astype(np.float32) * 0.1
    stream = StreamResampler(24000, 16000)
    sizes = [1, 479, 480, 2000, 17]
    pieces, at, i = [], 0, 0
    while at < len(x):
        n = sizes[i % len(sizes)]
        pieces.append(stream.process(x[at : at + n]))
        at, i = at + n, i + 1
    pieces.append(stream.process(np.zeros(0, np.float32), last=True))
    streamed = np.concatenate(pieces)
    whole = resample(x, 24000, 16000)
    assert len(streamed) == len(whole)
    np.testing.assert_allclose(streamed, whole, atol=1e-4)
