"""The Qwen2.5-Omni thinker and Qwen2.5-VL over the paged engine against Hugging Face transformers.

A tiny random Qwen2.5-Omni checkpoint (thinker only) is saved in the test; the engine runs the thinker's
language model with audio, image and video embeddings in EmbedSpans, and the greedy text must equal
the HF thinker's ``generate`` for the same media, with the same time-aligned M-RoPE positions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from omni_gateway.encoders.vision import load_vision_encoder
from omni_gateway.engine.runner.mrope import mrope_positions
from omni_gateway.omni.protocol import AudioPart, ImagePart, TextPart, VideoPart
from omni_gateway.omni.vision import VisionPrompt, build_vision_prompt

from tests.engine.test_audio_parity import Stack, heard, hf_generate, pcm16
from tests.harness.audio_checkpoints import (
    SAMPLE_RATE,
    save_tiny_qwen2_5_omni,
    save_tiny_qwen2_5_vl,
    tone,
    video_with_sound,
)
from tests.harness.checkpoints import picture, png_bytes

pytestmark = pytest.mark.slow
FPS = 1.0  # frames given as a list are taken at the limits' sampling rate (1 fps)


@pytest.fixture(scope="module")
def omni(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    directory = tmp_path_factory.mktemp("omni")
    hf = save_tiny_qwen2_5_omni(directory)
    return Stack(directory, hf, vision=load_vision_encoder(directory), max_num_batched_tokens=9)


def omni_media(
    stack: Stack, clips: list[np.ndarray], images: list[Any], video: list[Any] | None = None
) -> dict[str, Any]:
    """What the HF thinker takes for the same media, prepared by its feature extractor and image processor."""
    assert stack.vision is not None
    media: dict[str, Any] = {}
    if clips:
        batch = stack.audio.extractor(
            clips, sampling_rate=SAMPLE_RATE, padding="max_length", return_attention_mask=True, return_tensors="pt"
        )
        media.update(input_features=batch["input_features"], feature_attention_mask=batch["attention_mask"])
    if images:
        batch = stack.vision.processor(images=images, return_tensors="pt")
        media.update(pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"])
    if video:
        pixels, grid = stack.vision.video_patches(video)
        seconds = stack.vision.temporal_patch / FPS
        media.update(
            pixel_values_videos=pixels, video_grid_thw=grid.view(1, 3), video_second_per_grid=torch.tensor([seconds])
        )
    return media


def check_positions(stack: Stack, prompt: VisionPrompt, media: dict[str, Any]) -> None:
    ids = torch.tensor([prompt.token_ids])
    mask = media.get("feature_attention_mask")
    expected, delta = stack.hf.get_rope_index(
        ids,
        media.get("image_grid_thw"),
        media.get("video_grid_thw"),
        torch.ones_like(ids),
        bool(media.get("use_audio_in_video")),
        mask.sum(-1) if mask is not None else None,
        media.get("video_second_per_grid"),
    )
    n = len(prompt.token_ids)
    assert torch.equal(mrope_positions(prompt.embed_spans, 0, n), expected[:, 0])
    assert int(mrope_positions(prompt.embed_spans, n, n + 1)[0, 0]) == n + int(delta)


def test_omni_text_only_matches_hf(omni: Stack) -> None:
    prompt = omni.prompt(TextPart("the quick brown fox"))
    assert not prompt.embed_spans
    assert omni.run(prompt).outputs[0].token_ids == hf_generate(omni.hf, prompt.token_ids)


def test_omni_audio_matches_hf(omni: Stack) -> None:
    clips = [heard(tone(1, 0.7)), heard(tone(2, 0.3))]
    prompt = omni.prompt(
        AudioPart(pcm16(clips[0]), SAMPLE_RATE), TextPart("what is said"), AudioPart(pcm16(clips[1]), SAMPLE_RATE)
    )
    media = omni_media(omni, clips, [])
    lengths = media["feature_attention_mask"].sum(-1)
    assert [s.length for s in prompt.embed_spans] == [((int(n) - 1) // 2 + 1 - 2) // 2 + 1 for n in lengths]
    assert omni.run(prompt).outputs[0].token_ids == hf_generate(omni.hf, prompt.token_ids, **media)


def test_omni_image_matches_hf(omni: Stack) -> None:
    image = picture(3, (56, 84))
    prompt = omni.prompt(TextPart("what is in"), ImagePart(png_bytes(image)), TextPart(" this picture"))
    media = omni_media(omni, [], [image])
    check_positions(omni, prompt, media)
    assert omni.run(prompt).outputs[0].token_ids == hf_generate(omni.hf, prompt.token_ids, **media)


def test_omni_video_matches_hf(omni: Stack) -> None:
    frames = [picture(20 + i, (56, 56)) for i in range(6)]
    prompt = omni.prompt(TextPart("what changed"), VideoPart(b"", frames=tuple(png_bytes(f) for f in frames)))
    (span,) = prompt.embed_spans
    assert span.length == 3 * 2 * 2
    assert span.positions[0].tolist() == [0] * 4 + [50] * 4 + [100] * 4  # 2 s per temporal patch, 25 per second
    media = omni_media(omni, [], [], video=frames)
    check_positions(omni, prompt, media)
    assert omni.run(prompt).outputs[0].token_ids == hf_generate(omni.hf, prompt.token_ids, **media)


def test_omni_mixed_audio_image_video_matches_hf(omni: Stack) -> None:
    clip = heard(tone(9, 0.8))
    image = picture(4, (84, 56))
    frames = [picture(30 + i, (56, 84)) for i in range(4)]
    prompt = omni.prompt(
        TextPart("a"),
        ImagePart(png_bytes(image)),
        TextPart("b c"),
        AudioPart(pcm16(clip), SAMPLE_RATE),
        VideoPart(b"", frames=tuple(png_bytes(f) for f in frames)),
        TextPart("end"),
    )
    media = omni_media(omni, [clip], [image], video=frames)
    check_positions(omni, prompt, media)
    assert omni.run(prompt).outputs[0].token_ids == hf_generate(omni.hf, prompt.token_ids, **media)


def test_omni_video_heard_with_its_sound_matches_hf(omni: Stack) -> None:
    from omni_gateway.encoders.audio import decode_audio
    from omni_gateway.encoders.video import VideoLimits, decode_video

    data = video_with_sound(11, video_s=4, audio_s=3.0)
    prompt = omni.prompt(TextPart("what happens"), VideoPart(data), TextPart("and then"))
    (span,) = prompt.embed_spans
    frames = decode_video(data, VideoLimits(), fps=FPS)
    sound = decode_audio(data).samples
    media = omni_media(omni, [sound], [], video=frames)
    media["use_audio_in_video"] = True
    # Two 2 s chunks: 4 frames -> 2 temporal patches of 2x2 tokens, 3 s of sound -> 75 audio tokens.
    kinds = prompt.token_ids[span.offset : span.offset + span.length]
    marks = omni.audio.placeholders
    video_id = omni.vision.placeholders.video
    assert kinds == [marks.start] + [video_id] * 4 + [marks.audio] * 50 + [video_id] * 4 + [marks.audio] * 25 + [
        marks.end,
        omni.vision.placeholders.end,
    ]
    check_positions(omni, prompt, media)
    assert omni.run(prompt).outputs[0].token_ids == hf_generate(omni.hf, prompt.token_ids, **media)
    again = omni.prompt(VideoPart(data), TextPart("x"))  # the same file's span: the same content key
    assert again.embed_spans[0].key == span.key


# ---- Qwen2.5-VL (the same vision path without audio) ---------------------------------------------


def test_qwen2_5_vl_images_and_video_match_hf(tmp_path_factory: pytest.TempPathFactory) -> None:
    from omni_gateway.engine.config import EngineConfig
    from omni_gateway.engine.core.llm_engine import LLMEngine
    from omni_gateway.engine.sampling_params import SamplingParams
    from omni_gateway.omni.protocol import Message, OmniRequest

    directory = tmp_path_factory.mktemp("qwen25vl")
    hf = save_tiny_qwen2_5_vl(directory)
    vision = load_vision_encoder(directory)
    engine = LLMEngine(EngineConfig(model=str(directory), device="cpu", num_kv_blocks=96, max_num_batched_tokens=7))
    images = [picture(5, (84, 56)), picture(6, (112, 112))]
    frames = [picture(40 + i, (56, 56)) for i in range(2)]  # one temporal patch (see docs: text after a video)
    parts = (
        ImagePart(png_bytes(images[0])),
        TextPart("versus"),
        ImagePart(png_bytes(images[1])),
        VideoPart(b"", frames=tuple(png_bytes(f) for f in frames)),
        TextPart("end"),
    )
    request = OmniRequest(request_id="r", messages=(Message("user", parts),))
    prompt = build_vision_prompt(request, engine.tokenizer, vision)
    ids = torch.tensor([prompt.token_ids])
    marks = vision.placeholders
    batch = vision.processor(images=images, return_tensors="pt")
    pixels, grid = vision.video_patches(frames)
    media = dict(
        mm_token_type_ids=(ids == marks.image).int() + 2 * (ids == marks.video).int(),
        pixel_values=batch["pixel_values"],
        image_grid_thw=batch["image_grid_thw"],
        pixel_values_videos=pixels,
        video_grid_thw=grid.view(1, 3),
        second_per_grid_ts=torch.tensor([vision.temporal_patch / FPS]),
    )
    expected, _ = hf.model.get_rope_index(
        ids, media["mm_token_type_ids"], media["image_grid_thw"], media["video_grid_thw"], media["second_per_grid_ts"]
    )
    assert torch.equal(mrope_positions(prompt.embed_spans, 0, ids.shape[1]), expected[:, 0])
    engine.add_request(
        "q",
        prompt.token_ids,
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
        embed_spans=prompt.embed_spans,
    )
    while engine.has_unfinished():
        engine.step()
    (out,) = engine.pop_finished()
    assert out.outputs[0].token_ids == hf_generate(hf, prompt.token_ids, **media)


def test_served_prompts_hold_their_pixels_from_the_budget(omni: Stack) -> None:
    import asyncio

    from omni_gateway.encoders.budget import PixelBudget
    from omni_gateway.omni.audio_input import build_audio_prompt_async
    from omni_gateway.omni.media import MediaTooLarge
    from omni_gateway.omni.protocol import Message, OmniRequest

    image = picture(8, (56, 84))
    parts = (AudioPart(pcm16(heard(tone(4, 0.5))), SAMPLE_RATE), ImagePart(png_bytes(image)), TextPart("both"))
    request = OmniRequest(request_id="r", messages=(Message("user", parts),))
    budget = PixelBudget(capacity=56 * 84)
    built = asyncio.run(build_audio_prompt_async(request, omni.engine.tokenizer, omni.audio, omni.vision, budget))
    assert built == omni.prompt(*parts) and budget.in_use == 0  # released once the towers are done
    assert built.num_audio_tokens == 12 and built.num_image_tokens == 6  # 50 mel frames -> 12; 2x3 merged patches
    with pytest.raises(MediaTooLarge, match="decodes at most 4703"):
        asyncio.run(
            build_audio_prompt_async(
                request, omni.engine.tokenizer, omni.audio, omni.vision, PixelBudget(capacity=56 * 84 - 1)
            )
        )
