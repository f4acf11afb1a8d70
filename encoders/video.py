"""Decode untrusted video (an encoded container, or a list of JPEG frames from a webcam) into RGB
frames sampled at a fixed rate, under limits on bytes, duration, resolution and frame count.

Limits are enforced while decoding, not only from the header: a container that lies about its
duration still stops at ``max_duration_s`` of presentation time and at ``max_decoded_frames`` of
decode work. Decoder failures become ``VideoDecodeError`` with a fixed message.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from omni_gateway.encoders.image import ImageDecodeError, ImageLimits, decode_image, image_pixels
from PIL import Image

log = logging.getLogger(__name__)

# Demuxers accepted for client bytes (FFmpeg names; "mov,mp4,..." is one demuxer with several names).
ALLOWED_CONTAINERS: frozenset[str] = frozenset({"mov", "mp4", "m4a", "3gp", "3g2", "mj2", "matroska", "webm", "avi"})


class VideoDecodeError(ValueError):
    """The video is unacceptable; the message is safe to show to the client."""


@dataclass(frozen=True, slots=True)
class VideoLimits:
    max_bytes: int = 64 << 20
    max_duration_s: float = 120.0
    max_side: int = 4096
    max_pixels: int = 4096 * 2304  # per frame
    max_frames: int = 32  # frames sampled (what reaches the vision tower)
    max_decoded_frames: int = 20_000  # frames decoded, sampled or not (bounds the work of a long/high-fps file)
    sample_fps: float = 1.0
    probe_bytes: int = 5 << 20

    def __post_init__(self) -> None:
        if self.sample_fps <= 0 or self.max_frames < 1 or self.max_duration_s <= 0:
            raise ValueError(f"video limits must be positive, got {self}")


def sample_times(duration_s: float, fps: float, max_frames: int) -> list[float]:
    """Sampling instants ``0, 1/fps, 2/fps, ...`` below ``duration_s``, at most ``max_frames``."""
    count = min(max_frames, max(1, int(duration_s * fps + 1e-9)))
    return [i / fps for i in range(count)]


def video_pixels(data: bytes, limits: VideoLimits = VideoLimits(), *, fps: float | None = None) -> int:
    """Pixels of the frames ``decode_video`` will return (frame size times frames to sample), read from the
    container's header after every check decoding makes first; decoding never holds more."""
    with _opened(data, limits, fps) as (container, stream, rate):
        width, height = _frame_size(stream)
        return width * height * _planned_frames(container, stream, rate, limits)


def decode_video(data: bytes, limits: VideoLimits = VideoLimits(), *, fps: float | None = None) -> list[Image.Image]:
    """RGB frames of the first video stream, one per ``1/fps`` seconds (the limits' fps by default,
    never above it), at most ``limits.max_frames`` and at most what the declared duration holds. Every
    frame has the stream's declared size (a frame that changes size mid-stream is scaled to it)."""
    with _opened(data, limits, fps) as (container, stream, rate):
        return _sample(container, stream, rate, limits, _planned_frames(container, stream, rate, limits))


@contextlib.contextmanager
def _opened(data: bytes, limits: VideoLimits, fps: float | None) -> Iterator[tuple[Any, Any, float]]:
    """The container and its first video stream, header checked; decoder failures become fixed messages."""
    import av

    rate = min(fps or limits.sample_fps, limits.sample_fps)
    if rate <= 0:
        raise VideoDecodeError(f"fps must be positive, got {fps}")
    if not data:
        raise VideoDecodeError("video is empty")
    if len(data) > limits.max_bytes:
        raise VideoDecodeError(f"video has {len(data)} bytes; the limit is {limits.max_bytes}")
    try:
        container = av.open(
            io.BytesIO(data),
            mode="r",
            metadata_errors="ignore",
            options={"probesize": str(limits.probe_bytes), "analyzeduration": "5000000"},
        )
    except Exception as exc:  # av.error.InvalidDataError and friends; their text names internal state
        log.debug("FFmpeg could not open the video container: %s", exc)
        raise VideoDecodeError("not a readable video container") from None
    try:
        names = set((container.format.name or "").split(","))
        if not names & ALLOWED_CONTAINERS:
            raise VideoDecodeError("unsupported video container; expected one of mp4, mov, webm, mkv, avi")
        if not container.streams.video:
            raise VideoDecodeError("the container has no video stream")
        stream = container.streams.video[0]
        _check_size(*_frame_size(stream), limits)
        declared = _declared_duration(container, stream)
        if declared is not None and declared > limits.max_duration_s + 1e-6:
            raise VideoDecodeError(f"video lasts {declared:.1f} s; the limit is {limits.max_duration_s:g} s")
        yield container, stream, rate
    except VideoDecodeError:
        raise
    except Exception as exc:
        log.debug("FFmpeg could not read the video: %s", exc)
        raise VideoDecodeError("video data is truncated or corrupt") from None
    finally:
        container.close()


def _frame_size(stream: Any) -> tuple[int, int]:
    return int(stream.codec_context.width or 0), int(stream.codec_context.height or 0)


def _planned_frames(container: Any, stream: Any, rate: float, limits: VideoLimits) -> int:
    """Frames to sample: what the declared duration holds at ``rate``, or the limit when none is declared."""
    declared = _declared_duration(container, stream)
    if declared is None:
        return limits.max_frames
    return len(sample_times(declared, rate, limits.max_frames))


def _check_size(width: int, height: int, limits: VideoLimits) -> None:
    if width < 1 or height < 1:
        raise VideoDecodeError("video stream declares no frame size")
    if width > limits.max_side or height > limits.max_side or width * height > limits.max_pixels:
        raise VideoDecodeError(
            f"video frames are {width}x{height}; the limits are {limits.max_side} pixels a side "
            f"and {limits.max_pixels} pixels a frame"
        )


def _declared_duration(container: Any, stream: Any) -> float | None:
    if getattr(stream, "duration", None) and getattr(stream, "time_base", None):
        return float(stream.duration * stream.time_base)
    duration = getattr(container, "duration", None)
    return duration / 1_000_000 if duration else None


def _sample(container: Any, stream: Any, rate: float, limits: VideoLimits, max_frames: int) -> list[Image.Image]:
    frames: list[Image.Image] = []
    width, height = _frame_size(stream)
    next_time = 0.0
    first_time: float | None = None
    for decoded, frame in enumerate(container.decode(stream), start=1):
        if decoded > limits.max_decoded_frames:
            break
        if frame.width != width or frame.height != height:
            _check_size(frame.width, frame.height, limits)  # a mid-stream size change is checked too
        t = float(frame.time) if frame.time is not None else (decoded - 1) / rate
        first_time = t if first_time is None else first_time
        t -= first_time
        if t > limits.max_duration_s:
            break
        if t + 1e-6 >= next_time:
            # Scaled to the declared size, so the frames never hold more than ``video_pixels`` said.
            frames.append(frame.to_image(width=width, height=height).convert("RGB"))
            if len(frames) >= max_frames:
                break
            next_time += 1.0 / rate
            while next_time <= t:  # a gap in the stream: don't emit a burst of stale frames after it
                next_time += 1.0 / rate
    if not frames:
        raise VideoDecodeError("video holds no decodable frame")
    return frames


def frames_pixels(
    frames: Sequence[bytes], limits: VideoLimits = VideoLimits(), image_limits: ImageLimits | None = None
) -> int:
    """Pixels ``decode_frames`` will hold once every frame is scaled to the first one's size, from the
    headers alone (the largest frame stands for each, an upper bound)."""
    _check_frames(frames, limits)
    image_limits = image_limits or _frame_image_limits(limits)
    sizes = []
    for i, data in enumerate(frames):
        try:
            sizes.append(image_pixels(data, image_limits))
        except ImageDecodeError as exc:
            raise VideoDecodeError(f"frame {i}: {exc}") from None
    return max(sizes) * len(sizes)


def decode_frames(
    frames: Sequence[bytes], limits: VideoLimits = VideoLimits(), image_limits: ImageLimits | None = None
) -> list[Image.Image]:
    """Already separate frames (JPEG from a webcam stream): counted before any is decoded, each
    decoded through the image path; all are resized to the first frame's size."""
    _check_frames(frames, limits)
    image_limits = image_limits or _frame_image_limits(limits)
    out: list[Image.Image] = []
    for i, data in enumerate(frames):
        try:
            image = decode_image(data, image_limits)
        except ImageDecodeError as exc:
            raise VideoDecodeError(f"frame {i}: {exc}") from None
        if out and image.size != out[0].size:
            image = image.resize(out[0].size, Image.Resampling.BICUBIC)
        out.append(image)
    return out


def _check_frames(frames: Sequence[bytes], limits: VideoLimits) -> None:
    if not frames:
        raise VideoDecodeError("a frame list needs at least one frame")
    if len(frames) > limits.max_frames:
        raise VideoDecodeError(f"got {len(frames)} frames; the limit is {limits.max_frames}")
    total = sum(len(f) for f in frames)
    if total > limits.max_bytes:
        raise VideoDecodeError(f"frames hold {total} bytes; the limit is {limits.max_bytes}")


def _frame_image_limits(limits: VideoLimits) -> ImageLimits:
    return ImageLimits(max_pixels=limits.max_pixels, max_side=limits.max_side)
