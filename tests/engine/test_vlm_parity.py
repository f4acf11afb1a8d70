"""Vision-language models over the paged engine against Hugging Face transformers.

Tiny random LLaVA and Qwen2-VL checkpoints are saved in the test; the engine runs the language
model with the vision tower's embeddings in EmbedSpans (built by omni.vision), and greedy outputs
must equal ``generate`` of the full HF model given the same pixels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.encoders.vision import VisionEncoder, load_vision_encoder
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.outputs import RequestOutput
from omni_gateway.engine.runner.mrope import mrope_positions
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.prompting import UnsupportedInput
from omni_gateway.omni.protocol import ImagePart, Message, OmniRequest, TextPart, VideoPart
from omni_gateway.omni.vision import VisionPrompt, build_vision_prompt

from tests.harness.checkpoints import (
    picture,
    png_bytes,
    save_tiny_llava,
    save_tiny_qwen2_vl,
    vlm_tokenizer,
)

NEW_TOKENS = 8


class Stack:
    def __init__(self, directory: Path, hf: Any, **engine_kwargs: Any) -> None:
        self.hf = hf
        self.encoder: VisionEncoder = load_vision_encoder(directory)
        engine_kwargs.setdefault("device", "cpu")
        self.engine = LLMEngine(EngineConfig(model=str(directory), num_kv_blocks=96, **engine_kwargs))
        self._n = 0

    def prompt(self, *parts: Any) -> VisionPrompt:
        request = OmniRequest(request_id="r", messages=(Message("user", tuple(parts)),))
        return build_vision_prompt(request, self.engine.tokenizer, self.encoder)

    def run(self, prompt: VisionPrompt) -> RequestOutput:
        self._n += 1
        self.engine.add_request(
            f"q{self._n}",
            prompt.token_ids,
            SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True),
            embed_spans=prompt.embed_spans,
        )
        while self.engine.has_unfinished():
            self.engine.step()
        (out,) = self.engine.pop_finished()
        return out


def hf_generate(model: Any, ids: list[int], **media: Any) -> list[int]:
    model.generation_config.eos_token_id = None
    tensor = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(
            tensor,
            attention_mask=torch.ones_like(tensor),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
            **media,
        )
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    directory = tmp_path_factory.mktemp("llava")
    return Stack(directory, save_tiny_llava(directory))


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    directory = tmp_path_factory.mktemp("qwen2vl")
    # A small step budget splits image spans across prefill chunks (positions and embeds per chunk).
    return Stack(directory, save_tiny_qwen2_vl(directory), max_num_batched_tokens=7)


# ---- LLaVA ---------------------------------------------------------------------------------------


def llava_processor_ids(stack: Stack, text: str, images: list[Any]) -> tuple[list[int], torch.Tensor]:
    from transformers import LlavaProcessor

    processor = LlavaProcessor(
        image_processor=stack.encoder.processor,
        tokenizer=vlm_tokenizer(),
        patch_size=14,
        vision_feature_select_strategy="default",
        image_token="<image>",
        num_additional_image_tokens=1,
    )
    batch = processor(text=[text], images=images, return_tensors="pt")
    return batch["input_ids"][0].tolist(), batch["pixel_values"]


@pytest.mark.parametrize("num_images", [1, 2])
def test_llava_matches_hf(llava: Stack, num_images: int) -> None:
    images = [picture(10 + i, (60 + 20 * i, 48)) for i in range(num_images)]
    parts: list[Any] = [TextPart("describe")]
    for image in images:
        parts += [ImagePart(png_bytes(image)), TextPart(" and")]
    prompt = llava.prompt(*parts)
    text = "user: describe" + "<image> and" * num_images + "\nassistant:"
    ids, pixels = llava_processor_ids(llava, text, images)
    assert prompt.token_ids == ids  # placeholder expansion as the HF processor does it
    assert [s.length for s in prompt.embed_spans] == [16] * num_images
    assert llava.run(prompt).outputs[0].token_ids == hf_generate(llava.hf, ids, pixel_values=pixels)


def test_llava_text_spelling_the_image_token_is_refused(llava: Stack) -> None:
    with pytest.raises(UnsupportedInput, match="placeholder"):
        llava.prompt(TextPart("sneaky <image> token"), ImagePart(png_bytes(picture(1))))


# ---- Qwen2-VL ------------------------------------------------------------------------------------


def qwen_media(stack: Stack, prompt: VisionPrompt, images: list[Any], video: list[Any] | None = None) -> dict[str, Any]:
    """What the HF model takes for the same media: pixels, grids and the token type ids for M-RoPE."""
    marks = stack.encoder.placeholders
    ids = torch.tensor([prompt.token_ids])
    media: dict[str, Any] = {"mm_token_type_ids": (ids == marks.image).int() + 2 * (ids == marks.video).int()}
    if images:
        batch = stack.encoder.processor(images=images, return_tensors="pt")
        media.update(pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"])
    if video:
        pixels, grid = stack.encoder.video_patches(video)
        media.update(pixel_values_videos=pixels, video_grid_thw=grid.view(1, 3))
    return media


def test_qwen2_vl_one_image_matches_hf(qwen: Stack) -> None:
    image = picture(3, (56, 84))
    prompt = qwen.prompt(TextPart("what is in"), ImagePart(png_bytes(image)), TextPart(" this picture"))
    media = qwen_media(qwen, prompt, [image])
    grid = media["image_grid_thw"][0]
    assert prompt.embed_spans[0].length == int(grid.prod()) // 4  # tokens per image as the processor counts them
    assert qwen.run(prompt).outputs[0].token_ids == hf_generate(qwen.hf, prompt.token_ids, **media)


def test_qwen2_vl_two_images_of_different_sizes_match_hf(qwen: Stack) -> None:
    images = [picture(4, (84, 56)), picture(5, (112, 112))]
    prompt = qwen.prompt(ImagePart(png_bytes(images[0])), TextPart("versus"), ImagePart(png_bytes(images[1])))
    assert [s.length for s in prompt.embed_spans] == [6, 16]
    media = qwen_media(qwen, prompt, images)
    assert qwen.run(prompt).outputs[0].token_ids == hf_generate(qwen.hf, prompt.token_ids, **media)


def test_qwen2_vl_video_frames_match_hf(qwen: Stack) -> None:
    frames = [picture(20 + i, (56, 56)) for i in range(4)]
    prompt = qwen.prompt(TextPart("what changed"), VideoPart(b"", frames=tuple(png_bytes(f) for f in frames)))
    (span,) = prompt.embed_spans
    assert span.length == 2 * 2 * 2  # 4 frames -> 2 temporal patches, 56x56 -> 2x2 merged tokens
    assert prompt.token_ids[span.offset] == qwen.encoder.placeholders.video
    media = qwen_media(qwen, prompt, [], video=frames)
    assert qwen.run(prompt).outputs[0].token_ids == hf_generate(qwen.hf, prompt.token_ids, **media)


def test_mrope_positions_match_hf_rope_index(qwen: Stack) -> None:
    images = [picture(6, (84, 56)), picture(7, (56, 56))]
    frames = [picture(30 + i, (56, 84)) for i in range(4)]
    prompt = qwen.prompt(
        TextPart("a"),
        ImagePart(png_bytes(images[0])),
        TextPart("b c"),
        VideoPart(b"", frames=tuple(png_bytes(f) for f in frames)),
        ImagePart(png_bytes(images[1])),
        TextPart("end"),
    )
    media = qwen_media(qwen, prompt, images, video=frames)
    ids = torch.tensor([prompt.token_ids])
    expected, delta = qwen.hf.model.get_rope_index(
        ids, media["mm_token_type_ids"], media["image_grid_thw"], media["video_grid_thw"]
    )
    n = len(prompt.token_ids)
    assert torch.equal(mrope_positions(prompt.embed_spans, 0, n), expected[:, 0])
    # Any chunking gives the same positions, and generated tokens continue with HF's rope delta.
    chunks = [mrope_positions(prompt.embed_spans, s, min(s + 5, n + 3)) for s in range(0, n + 3, 5)]
    joined = torch.cat(chunks, dim=1)
    assert torch.equal(joined[:, :n], expected[:, 0])
    assert torch.equal(joined[:, n:], (torch.arange(n, n + 3) + int(delta)).repeat(3, 1))


# ---- prefix cache --------------------------------------------------------------------------------


def test_prefix_cache_keys_on_image_content(llava: Stack) -> None:
    text = TextPart("the quick brown fox jumps over the lazy dog, describe the picture in one short sentence please")
    first, second = picture(40), picture(41)
    a = llava.prompt(text, ImagePart(png_bytes(first)), TextPart(" now"))
    b = llava.prompt(text, ImagePart(png_bytes(second)), TextPart(" now"))
    assert a.token_ids == b.token_ids  # same placeholder tokens: only the image content tells them apart
    span = a.embed_spans[0]
    block = llava.engine.config.block_size
    text_blocks = span.offset // block * block

    out_a = llava.run(a)
    out_b = llava.run(b)
    assert out_b.num_cached_tokens == text_blocks  # the text before the image is shared, no block with it
    again = llava.run(llava.prompt(text, ImagePart(png_bytes(first)), TextPart(" now")))
    assert again.num_cached_tokens >= (span.offset + span.length) // block * block  # the image's blocks are reused
    assert again.outputs[0].token_ids == out_a.outputs[0].token_ids
    # Reusing KV must not change results: the second image's output equals HF's for that image.
    ids, pixels = llava_processor_ids(llava, "user: " + text.text + "<image> now\nassistant:", [second])
    assert out_b.outputs[0].token_ids == hf_generate(llava.hf, ids, pixel_values=pixels)


def test_media_are_counted_before_decoding_and_bad_media_refused_cleanly(llava: Stack) -> None:
    from omni_gateway.omni.vision import MediaError, MediaLimits

    request = OmniRequest(request_id="r", messages=(Message("user", (ImagePart(b"never decoded"),) * 3),))
    with pytest.raises(MediaError, match="3 image/video parts; the limit is 2"):
        build_vision_prompt(request, llava.engine.tokenizer, llava.encoder, limits=MediaLimits(max_items=2))
    with pytest.raises(MediaError, match="not a supported image"):
        llava.prompt(TextPart("x"), ImagePart(b"GIF89a not really"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_qwen2_vl_on_the_triton_backend_matches_hf(tmp_path: Path) -> None:
    stack = Stack(
        tmp_path,
        save_tiny_qwen2_vl(tmp_path),
        device="cuda",
        dtype="float32",
        attention_backend="triton",
        max_num_batched_tokens=7,
    )
    images = [picture(50, (84, 56)), picture(51, (56, 56))]
    prompt = stack.prompt(
        TextPart("what is in"), ImagePart(png_bytes(images[0])), TextPart(" and"), ImagePart(png_bytes(images[1]))
    )
    media = qwen_media(stack, prompt, images)
    assert stack.run(prompt).outputs[0].token_ids == hf_generate(stack.hf, prompt.token_ids, **media)


def test_qwen2_vl_encoded_video_matches_hf(qwen: Stack) -> None:
    import io

    import av
    import numpy as np
    from omni_gateway.encoders.video import VideoLimits, decode_video

    out = io.BytesIO()
    rng = np.random.default_rng(7)
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=4)
        stream.width, stream.height, stream.pix_fmt = 56, 56, "yuv420p"
        for _ in range(8):  # 2 s at 4 fps
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 256, (56, 56, 3), dtype=np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    data = out.getvalue()
    prompt = qwen.prompt(VideoPart(data, fps=1.0), TextPart("what happens"))
    frames = decode_video(data, VideoLimits(), fps=1.0)
    assert len(frames) == 2 and prompt.embed_spans[0].length == 4  # 2 frames -> 1 temporal patch of 2x2 tokens
    media = qwen_media(qwen, prompt, [], video=frames)
    assert qwen.run(prompt).outputs[0].token_ids == hf_generate(qwen.hf, prompt.token_ids, **media)


@pytest.mark.parametrize("size", [(1, 1), (2, 3), (1000, 7)])
def test_tiny_and_thin_images_work_and_extreme_ratios_are_refused(qwen: Stack, size: tuple[int, int]) -> None:
    from omni_gateway.omni.vision import MediaError

    image = picture(60, size)
    prompt = qwen.prompt(ImagePart(png_bytes(image)))
    media = qwen_media(qwen, prompt, [image])
    assert qwen.run(prompt).outputs[0].token_ids == hf_generate(qwen.hf, prompt.token_ids, **media)
    with pytest.raises(MediaError, match="aspect ratios up to 200:1"):
        qwen.prompt(ImagePart(png_bytes(picture(61, (1, 300)))))
