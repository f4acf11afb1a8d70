"""Audio decoding under limits, sample-format conversion and resampling.

Every decoder checks the limits while it decodes, not after: a few MB of low-bitrate Opus can expand to
gigabytes of float PCM, so the duration cap stops decoding the moment it is crossed.
WAV/FLAC/OGG go through libsndfile (header checked before any sample is read); anything else
(mp3, webm, m4a, ...) goes through FFmpeg via PyAV, restricted to a short list of audio demuxers.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass

import numpy as np
import soxr

log = logging.getLogger(__name__)

PCM16_SCALE = 32768.0
# Decoder text names library internals (FFmpeg errno values, file offsets): it goes to the DEBUG log only.
UNDECODABLE = "the audio could not be decoded"

# FFmpeg demuxer names PyAV may pick for uploaded bytes; nothing that reads other files or URLs.
_AV_DEMUXERS = "mp3,aac,ogg,matroska,webm,mov,mp4,m4a,3gp,wav,flac,adts"
_SNDFILE_FORMATS = frozenset({"WAV", "FLAC", "OGG"})
_SNDFILE_BLOCK = 65536


class AudioDecodeError(ValueError):
    """The bytes are not decodable audio (unknown container, truncated or corrupt data)."""


class NoAudioStream(AudioDecodeError):
    """The container is readable but holds no audio stream (a silent video)."""


class AudioLimitError(AudioDecodeError):
    """The audio is decodable but exceeds a configured limit."""


@dataclass(frozen=True, slots=True)
class AudioLimits:
    max_bytes: int = 25 * 1024 * 1024  # encoded size, the OpenAI upload cap
    max_duration_s: float = 600.0
    max_channels: int = 8


@dataclass(frozen=True, slots=True)
class DecodedAudio:
    samples: np.ndarray  # float32 mono in [-1, 1]
    sample_rate: int

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate


def decode_audio(data: bytes, *, limits: AudioLimits = AudioLimits(), target_rate: int | None = None) -> DecodedAudio:
    """Decode an encoded audio file to float32 mono, optionally resampled to ``target_rate``."""
    if len(data) > limits.max_bytes:
        raise AudioLimitError(f"encoded audio is {len(data)} bytes; the limit is max_bytes={limits.max_bytes}")
    if not data:
        raise AudioDecodeError("audio data is empty; expected an encoded audio file")
    if data[:4] in (b"RIFF", b"fLaC", b"OggS"):
        decoded = _decode_sndfile(data, limits)
    else:
        decoded = _decode_av(data, limits)
    if len(decoded.samples) == 0:
        raise AudioDecodeError("audio decoded to zero samples")
    if target_rate is not None and target_rate != decoded.sample_rate:
        decoded = DecodedAudio(resample(decoded.samples, decoded.sample_rate, target_rate), target_rate)
    return decoded


def _check_channels(channels: int, limits: AudioLimits) -> None:
    if channels < 1:
        raise AudioDecodeError(f"audio declares {channels} channels; expected at least 1")
    if channels > limits.max_channels:
        raise AudioLimitError(f"audio has {channels} channels; the limit is max_channels={limits.max_channels}")


def _duration_error(seconds: float, limits: AudioLimits) -> AudioLimitError:
    return AudioLimitError(
        f"audio lasts at least {seconds:.1f} s; the limit is max_duration_s={limits.max_duration_s:g}"
    )


def _decode_sndfile(data: bytes, limits: AudioLimits) -> DecodedAudio:
    import soundfile as sf

    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            if f.format not in _SNDFILE_FORMATS:
                raise AudioDecodeError(
                    f"container {f.format} is not accepted; expected one of {sorted(_SNDFILE_FORMATS)}"
                )
            if f.samplerate <= 0:
                raise AudioDecodeError(f"audio declares sample rate {f.samplerate}; expected a positive rate")
            _check_channels(f.channels, limits)
            max_frames = int(limits.max_duration_s * f.samplerate)
            # Header frame counts can lie (streamed WAVs, crafted files), so the cap is enforced on what is read.
            if f.frames > max_frames and f.frames < 2**62:
                raise _duration_error(f.frames / f.samplerate, limits)
            blocks: list[np.ndarray] = []
            total = 0
            while True:
                block = f.read(_SNDFILE_BLOCK, dtype="float32", always_2d=True)
                if len(block) == 0:
                    break
                total += len(block)
                if total > max_frames:
                    raise _duration_error(total / f.samplerate, limits)
                blocks.append(block.mean(axis=1, dtype=np.float32))
            rate = f.samplerate
    except AudioDecodeError:
        raise
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        log.debug("libsndfile could not decode the audio: %s", exc)
        raise AudioDecodeError(UNDECODABLE) from None
    samples = np.concatenate(blocks) if blocks else np.zeros(0, np.float32)
    return DecodedAudio(samples, rate)


def _decode_av(data: bytes, limits: AudioLimits) -> DecodedAudio:
    import av

    try:
        container = av.open(
            io.BytesIO(data), mode="r", options={"format_whitelist": _AV_DEMUXERS, "probesize": "5000000"}
        )
    except (av.FFmpegError, ValueError, UnicodeDecodeError) as exc:
        log.debug("FFmpeg could not open the audio container: %s", exc)
        raise AudioDecodeError("the audio container could not be read") from None
    pieces: list[np.ndarray] = []
    try:
        if not container.streams.audio:
            raise NoAudioStream("the container has no audio stream")
        stream = container.streams.audio[0]
        rate = stream.codec_context.sample_rate
        if not rate or rate <= 0:
            raise AudioDecodeError(f"audio stream declares sample rate {rate}; expected a positive rate")
        _check_channels(stream.codec_context.channels, limits)
        max_samples = int(limits.max_duration_s * rate)
        # Planar float keeps channels separate so the mono mix is a plain average, as in the sndfile path.
        resampler = av.AudioResampler(format="fltp", rate=rate)
        total = 0
        for frame in container.decode(stream):
            _check_channels(len(frame.layout.channels), limits)
            for converted in resampler.resample(frame):
                mono = converted.to_ndarray().mean(axis=0, dtype=np.float32)
                total += len(mono)
                if total > max_samples:
                    raise _duration_error(total / rate, limits)
                pieces.append(mono)
    except AudioDecodeError:
        raise
    except (av.FFmpegError, ValueError, EOFError) as exc:
        log.debug("FFmpeg stopped decoding the audio after %d blocks: %s", len(pieces), exc)
        if not pieces:
            raise AudioDecodeError(UNDECODABLE) from None
        # A truncated tail still yields the frames before it; keep them as decoders in browsers do.
    finally:
        container.close()
    samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    return DecodedAudio(np.clip(samples, -1.0, 1.0), rate)


# ---- sample formats ------------------------------------------------------------------------------
def pcm16_to_float(pcm16: bytes | np.ndarray) -> np.ndarray:
    """Little-endian 16-bit PCM to float32 in [-1, 1)."""
    if isinstance(pcm16, np.ndarray):
        ints = pcm16.astype(np.int16, copy=False)
    else:
        if len(pcm16) % 2:
            raise ValueError(f"pcm16 data must have an even number of bytes; got {len(pcm16)}")
        ints = np.frombuffer(pcm16, dtype="<i2")
    return ints.astype(np.float32) / PCM16_SCALE


def float_to_pcm16_array(samples: np.ndarray) -> np.ndarray:
    scaled = np.clip(np.asarray(samples, dtype=np.float32) * PCM16_SCALE, -32768.0, 32767.0)
    return np.rint(scaled).astype("<i2")


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """Float samples (clipped to [-1, 1]) to little-endian 16-bit PCM bytes."""
    return float_to_pcm16_array(samples).tobytes()


# ---- resampling ----------------------------------------------------------------------------------
def resample(samples: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Band-limited resampling of a whole mono float32 signal (libsoxr, high quality)."""
    if src_rate <= 0 or dst_rate <= 0:
        raise ValueError(f"sample rates must be positive; got {src_rate} -> {dst_rate}")
    x = np.asarray(samples, dtype=np.float32)
    if src_rate == dst_rate or len(x) == 0:
        return x
    return soxr.resample(x, src_rate, dst_rate, quality="HQ").astype(np.float32, copy=False)


class StreamResampler:
    """Chunk-by-chunk resampling whose concatenated output equals resampling the whole signal.

    Output is delay-compensated: sample i of the output lies at time i / dst_rate of the input.
    """

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        if src_rate <= 0 or dst_rate <= 0:
            raise ValueError(f"sample rates must be positive; got {src_rate} -> {dst_rate}")
        self.src_rate = src_rate
        self.dst_rate = dst_rate
        self._stream = (
            None if src_rate == dst_rate else soxr.ResampleStream(src_rate, dst_rate, 1, dtype="float32", quality="HQ")
        )

    def process(self, samples: np.ndarray, *, last: bool = False) -> np.ndarray:
        x = np.asarray(samples, dtype=np.float32)
        if self._stream is None:
            return x
        return self._stream.resample_chunk(x, last=last)

    def reset(self) -> None:
        if self._stream is not None:
            self._stream.clear()
