"""The Qwen3-Omni thinker watching video over the paged engine, against Hugging Face transformers.

The tiny full checkpoint of tests/harness/tiny_qwen3_omni.py. Frames are sized as ``Qwen3OmniMoeProcessor`` sizes
video (its own ``videos_kwargs``, not the checkpoint's image sizes), consecutive frames fill a temporal patch, the
tower's DeepStack rows go to the video tokens, and a temporal patch sits ``2 / fps * position_id_per_seconds`` time
positions after the one before, as the thinker's rope index puts it. A video file with sound is heard too: its audio
tokens and video tokens interleaved one by one in time order, the markers where the rope index puts them. Greedy text
must equal the HF thinker's ``generate`` given the same pixel values and mel features.
"""

from __future__ import annotations

import io
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omni_gateway.encoders.qwen3_omni_vision import VIDEO_SIZE, Qwen3OmniVision
from omni_gateway.encoders.vision import UnusableImage, load_vision_encoder
from omni_gateway.engine.runner.mrope import mrope_positions
from omni_gateway.omni.media import MediaError
from omni_gateway.omni.protocol import ImagePart, TextPart, VideoPart
from omni_gateway.omni.vision import VisionPrompt
from PIL import Image

from tests.engine.test_audio_parity import Stack, hf_generate
from tests.harness.audio_checkpoints import SAMPLE_RATE, video_with_sound
from tests.harness.checkpoints import picture, png_bytes

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CHUNK = 64  # prefill tokens per step: cuts the video spans below
STEP = 2 * 25  # time positions per temporal patch at 1 frame a second (the tiny thinker's position_id_per_seconds)


@pytest.fixture(scope="module")
def stack(qwen3_omni_thinker: tuple[Path, Any]) -> Stack:
    directory, hf = qwen3_omni_thinker
    vision = load_vision_encoder(directory)
    assert isinstance(vision, Qwen3OmniVision)
    return Stack(directory, hf.thinker, vision, max_num_batched_tokens=CHUNK)


def _decoded(frames: list[Image.Image]) -> list[Image.Image]:
    """The frames as the prompt builder sees them (PNG round trip)."""
    return [Image.open(io.BytesIO(png_bytes(f))).convert("RGB") for f in frames]


def _video(frames: list[Image.Image], fps: float | None = None) -> VideoPart:
    return VideoPart(b"", frames=tuple(png_bytes(f) for f in frames), fps=fps)


def _hf_media(stack: Stack, frames: list[Image.Image], fps: float = 1.0) -> dict[str, Any]:
    """What the HF thinker takes for one video: the same pixel values, its grid and seconds per temporal patch."""
    assert isinstance(stack.vision, Qwen3OmniVision)
    pixels, grid = stack.vision.video_patches(_decoded(frames))
    seconds = torch.tensor([stack.vision.temporal_patch / fps])
    return dict(pixel_values_videos=pixels, video_grid_thw=grid.view(1, 3), video_second_per_grid=seconds)


def _hf_positions(stack: Stack, prompt: VisionPrompt, media: dict[str, Any], **images: Any) -> torch.Tensor:
    return _hf_rope_index(stack, prompt, media, **images)[0]


def _hf_rope_index(
    stack: Stack, prompt: VisionPrompt, media: dict[str, Any], **images: Any
) -> tuple[torch.Tensor, int]:
    """transformers' positions ``[3, n]`` of the prompt and its text position shift after it."""
    ids = torch.tensor([prompt.token_ids])
    rope_index = getattr(stack.hf, "get_rope_index", None) or stack.hf.model.get_rope_index  # where releases keep it
    mask = media.get("feature_attention_mask")
    expected, delta = rope_index(
        ids,
        images.get("image_grid_thw"),
        media["video_grid_thw"],
        torch.ones_like(ids),
        bool(media.get("use_audio_in_video")),
        mask.sum(-1) if mask is not None else None,
        media["video_second_per_grid"],
    )
    return expected[:, 0], int(delta)


def test_frames_are_sized_by_the_processors_video_size() -> None:
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    assert dict(Qwen3OmniMoeProcessor.videos_kwargs["size"]) == VIDEO_SIZE


def test_a_video_prompt_matches_transformers_with_chunks_cutting_the_video(stack: Stack) -> None:
    frames = [picture(i, (64, 48)) for i in range(3)]  # three frames: the last repeats to fill a second patch
    prompt = stack.prompt(TextPart("what happens"), _video(frames), TextPart("in it"))
    (span,) = prompt.embed_spans
    media = _hf_media(stack, frames)
    # 64x48 grows to the processor's 128 blocks of 32x32 at least: 320x448 pixels, a 20x28 patch grid.
    assert media["video_grid_thw"].tolist() == [[2, 20, 28]]
    assert span.length == 2 * 10 * 14 and span.deepstack is not None and span.deepstack.shape[:2] == (1, span.length)
    marks = stack.vision.placeholders  # type: ignore[union-attr]
    ids = prompt.token_ids
    assert ids[span.offset - 1] == marks.start and ids[span.offset + span.length] == marks.end
    assert set(ids[span.offset : span.offset + span.length]) == {marks.video}
    assert (span.offset // CHUNK + 1) * CHUNK < span.offset + span.length
    assert span.positions is not None and sorted(set(span.positions[0].tolist())) == [0, STEP]
    assert stack.run(prompt).outputs[0].token_ids == hf_generate(stack.hf, ids, **media)


def test_video_positions_follow_the_hf_rope_index_at_each_frame_rate(stack: Stack) -> None:
    frames = [picture(10 + i, (48, 64)) for i in range(4)]
    for fps in (1.0, 0.5):
        prompt = stack.prompt(TextPart("look"), _video(frames, fps=fps), TextPart("then say"))
        expected = _hf_positions(stack, prompt, _hf_media(stack, frames, fps))
        got = mrope_positions(prompt.embed_spans, 0, len(prompt.token_ids))
        assert got.tolist() == expected.long().tolist()
        assert torch.equal(got.to(expected.dtype), expected)  # transformers' float positions are whole numbers here


def test_an_image_and_a_video_in_one_prompt_match_transformers(stack: Stack) -> None:
    image = picture(20, (64, 64))
    frames = [picture(21 + i, (64, 64)) for i in range(2)]
    prompt = stack.prompt(ImagePart(png_bytes(image)), TextPart("then"), _video(frames), TextPart("compare"))
    assert [s.deepstack is not None for s in prompt.embed_spans] == [True, True]
    assert stack.vision is not None
    batch = stack.vision.processor(images=[image], return_tensors="pt")
    images = dict(pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"])
    media = _hf_media(stack, frames)
    got = mrope_positions(prompt.embed_spans, 0, len(prompt.token_ids))
    assert got.tolist() == _hf_positions(stack, prompt, media, **images).long().tolist()
    assert stack.run(prompt).outputs[0].token_ids == hf_generate(stack.hf, prompt.token_ids, **images, **media)


def test_consecutive_frames_fill_one_temporal_patch(stack: Stack) -> None:
    vision = stack.vision
    assert isinstance(vision, Qwen3OmniVision)
    levels = [0, 60, 120]  # flat grey frames; the third repeats to pad the second patch
    frames = [Image.new("RGB", (64, 64), (v, v, v)) for v in levels]
    pixels, grid = vision.video_patches(frames)
    t, p = vision.temporal_patch, vision.patch
    rows = pixels.reshape(int(grid[0]), -1, 3, t, p, p)  # [temporal patch, patch, channel, slot, p, p]
    mean, std = np.array(vision.processor.image_mean), np.array(vision.processor.image_std)
    for patch, pair in enumerate(((0, 60), (120, 120))):
        for slot, level in enumerate(pair):
            expected = (level / 255 - mean) / std
            got = rows[patch, :, :, slot].mean(dim=(0, 2, 3)).numpy()
            assert np.allclose(got, expected, atol=1e-4), (patch, slot, got, expected)


def test_a_frame_rate_with_a_fractional_time_step_is_refused(stack: Stack) -> None:
    vision = stack.vision
    assert isinstance(vision, Qwen3OmniVision)
    frames = [picture(30, (64, 64))] * 2
    with pytest.raises(UnusableImage, match="whole number"):
        vision.encode_video(frames, fps=0.3)  # 2 / 0.3 * 25 = 166.7 positions a patch
    with pytest.raises(MediaError, match="whole number"):
        stack.prompt(TextPart("x"), _video(frames, fps=0.3))
    assert vision.time_interval(0.5) == 2 * STEP


def test_a_repeated_video_is_encoded_once(stack: Stack) -> None:
    vision = stack.vision
    assert isinstance(vision, Qwen3OmniVision)
    frames = [picture(40 + i, (64, 64)) for i in range(2)]
    (first,) = vision.encode_video(frames)
    (again,) = vision.encode_video([f.copy() for f in frames])
    assert again is first
    (slower,) = vision.encode_video(frames, fps=0.5)
    assert slower is not first  # the frame rate moves the time positions, so it keys the cache too


# 4 s of 56x56 frames at 1 frame a second: 2 temporal patches of 12x12 tokens at times 0 and 50. 3 s of sound makes
# 39 audio tokens, all before the second patch, which then ends the span; 5 s makes 65, the 51st tied with the second
# patch (the video token goes first) and the last 15 ending the span.
@pytest.mark.parametrize(
    ("audio_s", "runs"),
    [(3.0, [("v", 144), ("a", 39), ("v", 144)]), (5.0, [("v", 144), ("a", 50), ("v", 144), ("a", 15)])],
)
def test_a_video_heard_with_its_sound_matches_transformers(
    stack: Stack, audio_s: float, runs: list[tuple[str, int]]
) -> None:
    from omni_gateway.encoders.audio import decode_audio
    from omni_gateway.encoders.video import VideoLimits, decode_video

    data = video_with_sound(11, video_s=4, audio_s=audio_s)
    prompt = stack.prompt(TextPart("what happens"), VideoPart(data), TextPart("and then"))
    (span,) = prompt.embed_spans
    video_marks, audio_marks = stack.vision.placeholders, stack.audio.placeholders  # type: ignore[union-attr]
    ids = prompt.token_ids
    kinds = ids[span.offset : span.offset + span.length]
    assert ids[span.offset - 1] == video_marks.start and kinds[0] == audio_marks.start
    assert kinds[-2:] == [audio_marks.end, video_marks.end]
    names = {video_marks.video: "v", audio_marks.audio: "a"}
    assert [(names[k], len(list(g))) for k, g in itertools.groupby(kinds[1:-2])] == runs
    assert span.deepstack is not None
    assert torch.count_nonzero(span.deepstack[0].abs().sum(-1)) == 288  # the video tokens' rows only
    frames = decode_video(data, VideoLimits(), fps=1.0)
    sound = decode_audio(data).samples
    batch = stack.audio.extractor(
        [sound],
        sampling_rate=SAMPLE_RATE,
        padding=True,
        truncation=False,
        return_attention_mask=True,
        return_tensors="pt",
    )
    media = _hf_media(stack, frames) | dict(
        input_features=batch["input_features"], feature_attention_mask=batch["attention_mask"], use_audio_in_video=True
    )
    expected, delta = _hf_rope_index(stack, prompt, media)
    n = len(ids)
    assert torch.equal(mrope_positions(prompt.embed_spans, 0, n).to(expected.dtype), expected)
    assert int(mrope_positions(prompt.embed_spans, n, n + 1)[0, 0]) == n + delta
    assert stack.run(prompt).outputs[0].token_ids == hf_generate(stack.hf, ids, **media)


def test_a_video_heard_without_its_sound_is_the_silent_video(stack: Stack) -> None:
    from omni_gateway.omni.audio_input import build_audio_prompt
    from omni_gateway.omni.protocol import Message, OmniRequest

    data = video_with_sound(12, video_s=2, audio_s=2.0)
    request = OmniRequest("r", (Message("user", (VideoPart(data), TextPart("x"))),))
    silent = build_audio_prompt(request, stack.engine.tokenizer, stack.audio, stack.vision, audio_in_video=False)
    (span,) = silent.embed_spans
    assert set(silent.token_ids[span.offset : span.offset + span.length]) == {stack.vision.placeholders.video}  # type: ignore[union-attr]
    assert silent.num_audio_tokens == 0 and stack.prompt(VideoPart(data), TextPart("x")).num_audio_tokens > 0
