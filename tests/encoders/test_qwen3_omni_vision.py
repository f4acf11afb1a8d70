"""Qwen3-Omni's vision tower on its own: token embeddings and DeepStack features equal to transformers' thinker's
vision encoder for square, wide and tall pictures; preprocessing as the checkpoint's image processor does it (resize
to the merged patch grid, normalisation, the picture in both temporal slots); M-RoPE positions, placeholders and the
cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.encoders.qwen3_omni_vision import Qwen3OmniVision, block_order, grid_positions
from omni_gateway.encoders.vision import UnusableImage, checkpoint_family, load_vision_encoder
from PIL import Image

from tests.harness.audio_checkpoints import token_id
from tests.harness.checkpoints import picture

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tower(qwen3_omni_thinker: tuple[Path, Any]) -> Qwen3OmniVision:
    encoder = load_vision_encoder(qwen3_omni_thinker[0])
    assert isinstance(encoder, Qwen3OmniVision)
    return encoder


def _hf(hf: Any, tower: Qwen3OmniVision, image: Image.Image) -> tuple[torch.Tensor, list[torch.Tensor], Any]:
    """transformers' embeddings and DeepStack features of the image (releases return a tuple or an output)."""
    batch = tower.processor(images=[image], return_tensors="pt")
    with torch.inference_mode():
        visual = getattr(hf.thinker, "visual", None) or hf.thinker.model.visual  # where releases keep it
        out = visual(batch["pixel_values"], grid_thw=batch["image_grid_thw"])
    embeds, deepstack = out if isinstance(out, tuple) else (out.pooler_output, out.deepstack_features)
    return embeds, list(deepstack), batch["image_grid_thw"][0]


# 64x64: a 4x4 patch grid; 160x100 and 70x200: wide and tall, resized to other grids; 300x300: shrunk to the budget.
@pytest.mark.parametrize("size", [(64, 64), (160, 100), (70, 200), (300, 300)])
def test_embeddings_and_deepstack_match_transformers(
    qwen3_omni_thinker: tuple[Path, Any], tower: Qwen3OmniVision, size: tuple[int, int]
) -> None:
    image = picture(sum(size), size)
    embeds, deepstack, grid = _hf(qwen3_omni_thinker[1], tower, image)
    got = tower.encode_image(image)
    tokens = int(grid.prod()) // 4
    assert got.embeds.shape == embeds.shape == (tokens, 64)
    assert got.deepstack is not None and got.deepstack.shape == (1, tokens, 64) and len(deepstack) == 1
    torch.testing.assert_close(got.embeds, embeds, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.deepstack[0], deepstack[0], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(got.deepstack[0], got.embeds, atol=1e-2), "DeepStack rows are a layer's of their own"


def test_preprocessing_resizes_to_the_merged_grid_and_fills_both_temporal_slots(tower: Qwen3OmniVision) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    image = picture(1, (150, 90))
    batch = tower.processor(images=[image], return_tensors="pt")
    t, h, w = batch["image_grid_thw"][0].tolist()
    height, width = smart_resize(90, 150, factor=32, min_pixels=32 * 32, max_pixels=128 * 128)
    assert (t, h * 16, w * 16) == (1, height, width) and h % 2 == 0 and w % 2 == 0
    rows = batch["pixel_values"].view(h * w, 3, 2, 16, 16)
    torch.testing.assert_close(rows[:, :, 0], rows[:, :, 1])  # a picture is its own second frame
    # Each channel scaled to [0, 1], then normalised by the processor's mean and std.
    colour = (200, 30, 90)
    flat = tower.processor(images=[Image.new("RGB", (64, 64), colour)], return_tensors="pt")["pixel_values"]
    mean, std = (torch.tensor(v, dtype=torch.float32) for v in (tower.processor.image_mean, tower.processor.image_std))
    expected = (torch.tensor(colour) / 255 - mean) / std
    torch.testing.assert_close(
        flat.view(-1, 3, 2 * 16 * 16), expected[None, :, None].expand(16, 3, 512), atol=1e-5, rtol=0
    )


def test_patches_are_in_merge_block_order() -> None:
    positions = grid_positions(4, 6, 2)
    assert positions[:4].tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]  # the first 2x2 block
    assert positions[4:8].tolist() == [[0, 2], [0, 3], [1, 2], [1, 3]]
    raster = torch.arange(24)
    assert sorted(block_order(raster, 4, 6, 2).tolist()) == list(range(24))
    try:
        from transformers.vision_utils import get_vision_position_ids
    except ImportError:  # older releases compute them inside the module
        return
    assert positions.tolist() == get_vision_position_ids(torch.tensor([[1, 4, 6]]), 2).tolist()


def test_positions_and_placeholders(qwen3_omni_thinker: tuple[Path, Any], tower: Qwen3OmniVision) -> None:
    assert checkpoint_family(qwen3_omni_thinker[0]) == "qwen3_omni"
    marks = tower.placeholders
    assert (marks.image, marks.video, marks.start, marks.end) == tuple(
        token_id(t) for t in ("<|IMAGE|>", "<|VIDEO|>", "<|vision_bos|>", "<|vision_eos|>")
    )
    features = tower.encode_image(picture(2, (128, 64)))  # 8 x 4 patches: a 2 x 4 token grid
    assert features.positions is not None
    assert features.positions.tolist() == [[0] * 8, [0, 0, 0, 0, 1, 1, 1, 1], [0, 1, 2, 3] * 2]


def test_a_repeated_image_is_encoded_once(tower: Qwen3OmniVision) -> None:
    image = picture(9, (96, 96))
    first = tower.encode_image(image)
    assert tower.encode_image(image.copy()) is first


def test_extreme_shapes_are_refused(tower: Qwen3OmniVision) -> None:
    with pytest.raises(UnusableImage, match="200:1"):
        tower.encode_image(Image.new("RGB", (4020, 20)))


def test_video_embeddings_and_deepstack_match_transformers(
    qwen3_omni_thinker: tuple[Path, Any], tower: Qwen3OmniVision
) -> None:
    # Five frames: three temporal patches (the last frame repeats), each attended on its own by the tower.
    frames = [picture(50 + i, (80, 64)) for i in range(5)]
    pixels, grid = tower.video_patches(frames)
    assert int(grid[0]) == 3
    with torch.inference_mode():
        visual = getattr(qwen3_omni_thinker[1].thinker, "visual", None) or qwen3_omni_thinker[1].thinker.model.visual
        out = visual(pixels, grid_thw=grid.view(1, 3))
    embeds, deepstack = out if isinstance(out, tuple) else (out.pooler_output, out.deepstack_features)
    (got,) = tower.encode_video(frames)
    assert got.deepstack is not None and got.embeds.shape == embeds.shape == (int(grid.prod()) // 4, 64)
    torch.testing.assert_close(got.embeds, embeds, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.deepstack[0], deepstack[0], rtol=1e-4, atol=1e-4)
