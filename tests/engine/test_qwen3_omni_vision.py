"""The Qwen3-Omni thinker seeing images over the paged engine, against Hugging Face transformers.

The tiny full checkpoint of tests/harness/tiny_qwen3_omni.py (a 2-layer Qwen3-VL tower with one DeepStack layer);
the engine places the tower's embeddings at the image placeholders, adds its DeepStack rows after the first decoder
layer, and gives the image tokens their M-RoPE positions. Greedy text must equal the HF thinker's ``generate`` given
the same pixels, also when prefill chunks cut the image tokens apart, and two tensor-parallel ranks generate what one
does. Video: tests/engine/test_qwen3_omni_video.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.encoders.qwen3_omni_vision import Qwen3OmniVision
from omni_gateway.encoders.vision import load_vision_encoder
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.core.sequence import EmbedSpan
from omni_gateway.engine.errors import InvalidRequest
from omni_gateway.engine.runner.mrope import mrope_positions
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.protocol import AudioPart, ImagePart, TextPart
from omni_gateway.omni.vision import VisionPrompt
from PIL import Image

from tests.engine.test_audio_parity import Stack, heard, hf_generate, pcm16
from tests.engine.test_qwen3_omni_thinker import _media
from tests.harness.audio_checkpoints import SAMPLE_RATE, tone
from tests.harness.checkpoints import picture, png_bytes

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CHUNK = 9  # prefill tokens per step: cuts the image spans below


@pytest.fixture(scope="module")
def stack(qwen3_omni_thinker: tuple[Path, Any]) -> Stack:
    directory, hf = qwen3_omni_thinker
    vision = load_vision_encoder(directory)
    assert isinstance(vision, Qwen3OmniVision)
    return Stack(directory, hf.thinker, vision, max_num_batched_tokens=CHUNK)


def _pixels(stack: Stack, images: list[Image.Image]) -> dict[str, Any]:
    """What the HF thinker takes for the images, made by the checkpoint's own image processor."""
    assert stack.vision is not None
    batch = stack.vision.processor(images=images, return_tensors="pt")
    return dict(pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"])


def _cut_inside(prompt: VisionPrompt) -> bool:
    """Whether some prefill chunk boundary falls strictly inside an image span."""
    return any(
        (s.offset // CHUNK + 1) * CHUNK < s.offset + s.length for s in prompt.embed_spans if s.deepstack is not None
    )


def test_an_image_prompt_matches_transformers_with_chunks_cutting_the_image(stack: Stack) -> None:
    image = picture(3, (128, 96))  # 8 x 6 patches: 12 tokens after the 2 x 2 merge
    prompt = stack.prompt(TextPart("what is in"), ImagePart(png_bytes(image)), TextPart("this picture"))
    (span,) = prompt.embed_spans
    assert span.length == 12 and prompt.num_image_tokens == 12 and tuple(span.deepstack.shape) == (1, 12, 64)
    marks = stack.vision.placeholders  # type: ignore[union-attr]
    ids = prompt.token_ids
    assert ids[span.offset - 1] == marks.start and ids[span.offset + span.length] == marks.end
    assert _cut_inside(prompt)
    expected = hf_generate(stack.hf, ids, **_pixels(stack, [image]))
    assert stack.run(prompt).outputs[0].token_ids == expected


def test_two_images_and_audio_in_one_prompt_match_transformers(stack: Stack) -> None:
    images = [picture(4, (64, 64)), picture(5, (160, 100))]
    clip = heard(tone(1, 0.6))
    prompt = stack.prompt(
        ImagePart(png_bytes(images[0])),
        TextPart("and"),
        AudioPart(pcm16(clip), SAMPLE_RATE),
        ImagePart(png_bytes(images[1])),
        TextPart("compare them"),
    )
    assert [s.deepstack is not None for s in prompt.embed_spans] == [True, False, True]
    assert _cut_inside(prompt)
    media = _pixels(stack, images) | _media(stack, [clip])
    assert stack.run(prompt).outputs[0].token_ids == hf_generate(stack.hf, prompt.token_ids, **media)


def test_without_deepstack_rows_the_output_differs(stack: Stack) -> None:
    # The rows are not decoration: the same prompt and embeddings without them answer otherwise.
    image = picture(6, (128, 128))
    prompt = stack.prompt(TextPart("describe"), ImagePart(png_bytes(image)))
    (span,) = prompt.embed_spans
    bare = EmbedSpan(span.offset, span.length, span.key + " bare", span.embeds, span.positions)
    with_rows = stack.run(prompt).outputs[0].token_ids
    without = stack.run(VisionPrompt(prompt.token_ids, (bare,), prompt.num_image_tokens)).outputs[0].token_ids
    assert with_rows == hf_generate(stack.hf, prompt.token_ids, **_pixels(stack, [image]))
    assert without != with_rows


def test_image_positions_follow_the_hf_rope_index(stack: Stack) -> None:
    image = picture(7, (96, 64))
    prompt = stack.prompt(TextPart("look"), ImagePart(png_bytes(image)), TextPart("then say"))
    ids = torch.tensor([prompt.token_ids])
    grid = _pixels(stack, [image])["image_grid_thw"]
    rope_index = getattr(stack.hf, "get_rope_index", None) or stack.hf.model.get_rope_index  # where releases keep it
    expected, _ = rope_index(ids, grid, None, torch.ones_like(ids))
    got = mrope_positions(prompt.embed_spans, 0, len(prompt.token_ids))
    assert got.tolist() == expected[:, 0].long().tolist()


def _engine_tokens(directory: Path, prompt: VisionPrompt, tp: int) -> list[int]:
    config = EngineConfig(
        model=str(directory),
        device="cpu",
        dtype="float32",
        tensor_parallel_size=tp,
        num_kv_blocks=96,
        max_num_batched_tokens=CHUNK,
        warmup="off",
    )
    engine = LLMEngine(config)
    try:
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        engine.add_request("r", prompt.token_ids, params, embed_spans=prompt.embed_spans)
        while engine.has_unfinished():
            engine.step()
        (out,) = engine.pop_finished()
        return list(out.outputs[0].token_ids)
    finally:
        engine.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ranks_add_the_deepstack_rows_as_one_does(qwen3_omni_thinker: tuple[Path, Any], stack: Stack) -> None:
    prompt = stack.prompt(TextPart("what is in"), ImagePart(png_bytes(picture(3, (128, 96)))))
    assert _cut_inside(prompt)
    assert _engine_tokens(qwen3_omni_thinker[0], prompt, 2) == _engine_tokens(qwen3_omni_thinker[0], prompt, 1)


def test_deepstack_rows_of_the_wrong_length_are_refused(stack: Stack) -> None:
    prompt = stack.prompt(TextPart("x"), ImagePart(png_bytes(picture(8, (64, 64)))))
    (span,) = prompt.embed_spans
    bad = EmbedSpan(span.offset, span.length, span.key, span.embeds, span.positions, deepstack=span.deepstack[:, :-1])
    with pytest.raises(InvalidRequest, match="DeepStack rows"):
        stack.engine.add_request("bad", prompt.token_ids, SamplingParams(max_tokens=1), embed_spans=(bad,))
