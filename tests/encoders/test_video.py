"""Video decoding: fps sampling, limits during decode, hostile containers, webcam JPEG frames."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from omni_gateway.encoders.video import (
    VideoDecodeError,
    VideoLimits,
    decode_frames,
    decode_video,
    frames_pixels,
    sample_times,
    video_pixels,
)
from PIL import Image


def make_video(
    seconds: float = 3.0, rate: int = 10, size: tuple[int, int] = (64, 48), fmt: str = "mp4", codec: str = "mpeg4"
) -> bytes:
    """Frame ``i`` is a flat grey of level ``8 * i``, so a sampled frame tells its own timestamp."""
    import av

    out = io.BytesIO()
    with av.open(out, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(int(seconds * rate)):
            frame = av.VideoFrame.from_ndarray(np.full((size[1], size[0], 3), 8 * i, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def frame_index(frame: Image.Image) -> int:
    return round(float(np.asarray(frame).mean()) / 8)


def assert_clean(message: str) -> None:
    assert not re.search(r"0x[0-9a-fA-F]{8,}", message), message
    assert not any(leak in message for leak in ("<", "object at", "BytesIO", "Traceback", ".py", "/tmp", "/root")), (
        message
    )


@pytest.fixture(scope="module")
def clip() -> bytes:
    return make_video()


def test_samples_at_the_limits_fps_by_default(clip: bytes) -> None:
    frames = decode_video(clip, VideoLimits(sample_fps=1.0))
    assert [frame_index(f) for f in frames] == [0, 10, 20]
    assert all(f.mode == "RGB" and f.size == (64, 48) for f in frames)


def test_requested_fps_is_honoured_up_to_the_server_ceiling(clip: bytes) -> None:
    limits = VideoLimits(sample_fps=4.0)
    assert [frame_index(f) for f in decode_video(clip, limits, fps=2.0)] == [0, 5, 10, 15, 20, 25]
    # A client asking for 100 fps gets the ceiling, not every frame.
    assert len(decode_video(clip, limits, fps=100.0)) == 12


def test_frame_count_is_capped(clip: bytes) -> None:
    frames = decode_video(clip, VideoLimits(sample_fps=10.0, max_frames=4))
    assert [frame_index(f) for f in frames] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "limits, fps",
    [
        (VideoLimits(sample_fps=1.0), None),
        (VideoLimits(sample_fps=4.0), 2.0),
        (VideoLimits(sample_fps=10.0, max_frames=4), None),
    ],
)
def test_video_pixels_are_what_decoding_holds(clip: bytes, limits: VideoLimits, fps: float | None) -> None:
    frames = decode_video(clip, limits, fps=fps)
    assert video_pixels(clip, limits, fps=fps) == sum(f.width * f.height for f in frames)


def test_sample_times() -> None:
    assert sample_times(3.0, 2.0, 100) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert sample_times(0.1, 1.0, 5) == [0.0]
    assert len(sample_times(1e6, 30.0, 32)) == 32


def test_declared_duration_over_the_limit_is_refused(clip: bytes) -> None:
    with pytest.raises(VideoDecodeError, match="3.0 s; the limit is 2 s"):
        decode_video(clip, VideoLimits(max_duration_s=2.0))


def test_decode_work_is_bounded_even_when_frames_are_not_sampled(clip: bytes) -> None:
    frames = decode_video(clip, VideoLimits(sample_fps=1.0, max_decoded_frames=15))
    assert [frame_index(f) for f in frames] == [0, 10]


def test_resolution_and_size_limits(clip: bytes) -> None:
    with pytest.raises(VideoDecodeError, match="64x48"):
        decode_video(clip, VideoLimits(max_side=32))
    with pytest.raises(VideoDecodeError, match="64x48"):
        decode_video(clip, VideoLimits(max_pixels=64 * 47))
    with pytest.raises(VideoDecodeError, match="bytes"):
        decode_video(clip, VideoLimits(max_bytes=len(clip) - 1))


def test_other_containers_and_codecs() -> None:
    webm = make_video(2.0, 8, (32, 32), fmt="webm", codec="libvpx")
    assert len(decode_video(webm, VideoLimits(sample_fps=1.0))) == 2


@pytest.mark.parametrize("data", [b"", b"not a video at all" * 10, b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64])
def test_garbage_fails_cleanly(data: bytes) -> None:
    with pytest.raises(VideoDecodeError) as err:
        decode_video(data)
    assert_clean(str(err.value))


def test_truncated_video_fails_cleanly(clip: bytes) -> None:
    with pytest.raises(VideoDecodeError) as err:
        decode_video(clip[: len(clip) // 2])
    assert_clean(str(err.value))


def test_image_containers_are_not_accepted_as_video() -> None:
    out = io.BytesIO()
    Image.new("RGB", (16, 16)).save(out, format="PNG")
    with pytest.raises(VideoDecodeError) as err:
        decode_video(out.getvalue())
    assert_clean(str(err.value))


# ---- webcam frames -------------------------------------------------------------------------------


def jpeg(level: int, size: tuple[int, int] = (32, 24)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (level, level, level)).save(out, format="JPEG", quality=95)
    return out.getvalue()


def test_jpeg_frames_decode_in_order_at_one_size() -> None:
    frames = decode_frames([jpeg(10), jpeg(120, (64, 48)), jpeg(240)])
    assert [f.size for f in frames] == [(32, 24)] * 3
    assert [round(float(np.asarray(f).mean()) / 10) for f in frames] == [1, 12, 24]


def test_frames_pixels_bound_the_frames_once_scaled_to_one_size() -> None:
    frames = [jpeg(10, (64, 48)), jpeg(120), jpeg(240)]
    assert frames_pixels(frames) == 3 * 64 * 48 == sum(f.width * f.height for f in decode_frames(frames))
    assert frames_pixels([jpeg(10), jpeg(120, (64, 48))]) >= sum(
        f.width * f.height for f in decode_frames([jpeg(10), jpeg(120, (64, 48))])
    )
    with pytest.raises(VideoDecodeError, match="frame 1: "):
        frames_pixels([jpeg(10), b"not an image"])


def test_frame_count_is_checked_before_decoding() -> None:
    with pytest.raises(VideoDecodeError, match="40 frames; the limit is 32"):
        decode_frames([b"never decoded"] * 40, VideoLimits(max_frames=32))


def test_a_bad_frame_names_its_index() -> None:
    with pytest.raises(VideoDecodeError, match="frame 1: ") as err:
        decode_frames([jpeg(10), jpeg(10)[:40]])
    assert_clean(str(err.value))
