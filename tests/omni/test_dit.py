"""The DiT image head over tiny random PixArt and SD3 pipelines loaded from disk: sizes, seeds, previews,
cancellation, batching and errors."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from omni_gateway.omni.heads.dit.errors import ImageModelLoadError, ImageRequestError
from omni_gateway.omni.heads.dit.head import ImageHead, load_image_head
from omni_gateway.omni.heads.dit.loader import ImageHeadConfig, select_device
from omni_gateway.omni.protocol import ImageFinal, ImageOutputOptions, ImagePartial
from PIL import Image

from tests.harness.tiny_dit import save_tiny_pixart, save_tiny_sd3

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# A wide window makes concurrently submitted requests reliably meet in one batch on a loaded machine.
BATCHING = ImageHeadConfig(min_side=16, batch_window_s=0.3)


@pytest.fixture(scope="module")
def pixart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_pixart(tmp_path_factory.mktemp("pixart"))


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_sd3(tmp_path_factory.mktemp("sd3"))


@pytest.fixture(scope="module")
def pixart(pixart_dir: Path):
    head = load_image_head(pixart_dir, device="cpu", config=ImageHeadConfig(min_side=16, batch_window_s=0.0))
    yield head
    head.close()


def collect(head: ImageHead, prompt: str, options: ImageOutputOptions, cancel=None) -> list:
    async def run() -> list:
        return [chunk async for chunk in head.generate(prompt, options, cancel)]

    return asyncio.run(run())


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def finals(chunks: list) -> list[ImageFinal]:
    return [c for c in chunks if isinstance(c, ImageFinal)]


# ---- loading ---------------------------------------------------------------------------------------


def test_missing_directory_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(ImageModelLoadError, match="does not exist"):
        load_image_head(tmp_path / "nowhere", device="cpu")


def test_directory_without_model_index_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(ImageModelLoadError, match="model_index.json is missing"):
        load_image_head(tmp_path, device="cpu")


def test_unsupported_pipeline_class_is_named(tmp_path: Path) -> None:
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "DiTPipeline"}))
    with pytest.raises(ImageModelLoadError, match="'DiTPipeline'.*not supported"):
        load_image_head(tmp_path, device="cpu")


def test_corrupt_weights_are_a_load_error(pixart_dir: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(pixart_dir, broken)
    weights = next((broken / "transformer").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ImageModelLoadError, match="could not load the PixArtAlphaPipeline"):
        load_image_head(broken, device="cpu")


def test_device_selection() -> None:
    assert select_device("cpu") == (torch.device("cpu"), torch.float32)
    with pytest.raises(ImageModelLoadError, match="device must be"):
        select_device("tpu")
    if not torch.cuda.is_available():
        assert select_device("auto") == (torch.device("cpu"), torch.float32)
        with pytest.raises(ImageModelLoadError, match="no CUDA device"):
            select_device("cuda")


def test_limits_come_from_the_model(pixart: ImageHead, sd3_dir: Path) -> None:
    # tiny VAE: 2 blocks = scale factor 2; patch size 2 -> sides must be multiples of 4
    assert pixart.limits.granularity == 4
    assert pixart.limits.default_steps == 20 and pixart.limits.default_guidance == 4.5
    sd3 = load_image_head(sd3_dir, device="cpu")
    try:
        assert sd3.limits.max_side == 16 * 4  # pos_embed_max_size patches per side
        assert sd3.limits.default_guidance == 7.0
    finally:
        sd3.close()


# ---- generation ------------------------------------------------------------------------------------


def test_previews_then_final_at_requested_size(pixart: ImageHead) -> None:
    chunks = collect(
        pixart, "a red cat", ImageOutputOptions(size=(32, 24), num_inference_steps=4, seed=7, preview_every=2)
    )
    previews = [c for c in chunks if isinstance(c, ImagePartial)]
    assert [(p.index, p.step) for p in previews] == [(0, 2), (1, 4)]
    assert isinstance(chunks[-1], ImageFinal) and len(finals(chunks)) == 1
    assert chunks[-1].seed == 7
    assert pixels(chunks[-1].png).shape == (24, 32, 3)
    assert pixels(previews[0].png).shape == (24, 32, 3)  # under preview_max_side: not shrunk


def test_preview_count_is_steps_over_preview_every(pixart: ImageHead) -> None:
    chunks = collect(pixart, "a dog", ImageOutputOptions(size=(16, 16), num_inference_steps=5, seed=1, preview_every=2))
    assert [c.step for c in chunks if isinstance(c, ImagePartial)] == [2, 4]
    none = collect(pixart, "a dog", ImageOutputOptions(size=(16, 16), num_inference_steps=3, seed=1))
    assert not [c for c in none if isinstance(c, ImagePartial)] and len(finals(none)) == 1


def test_previews_are_shrunk_to_the_preview_limit(pixart_dir: Path) -> None:
    head = load_image_head(pixart_dir, device="cpu", config=ImageHeadConfig(min_side=16, preview_max_side=16))
    try:
        chunks = collect(
            head, "a cat", ImageOutputOptions(size=(64, 32), num_inference_steps=2, seed=3, preview_every=1)
        )
    finally:
        head.close()
    preview = next(c for c in chunks if isinstance(c, ImagePartial))
    assert pixels(preview.png).shape == (8, 16, 3)
    assert pixels(finals(chunks)[0].png).shape == (32, 64, 3)


def test_same_seed_same_image_other_seed_other_image(pixart: ImageHead) -> None:
    options = ImageOutputOptions(size=(32, 32), num_inference_steps=2, seed=11)
    a = finals(collect(pixart, "a blue sky", options))[0].png
    b = finals(collect(pixart, "a blue sky", options))[0].png
    c = finals(collect(pixart, "a blue sky", ImageOutputOptions(size=(32, 32), num_inference_steps=2, seed=12)))[0].png
    assert a == b
    assert not np.array_equal(pixels(a), pixels(c))


def test_unseeded_requests_report_the_seed_that_reproduces_them(pixart: ImageHead) -> None:
    options = ImageOutputOptions(size=(16, 16), num_inference_steps=2)
    first = finals(collect(pixart, "a tree", options))[0]
    assert first.seed is not None
    again = finals(
        collect(pixart, "a tree", ImageOutputOptions(size=(16, 16), num_inference_steps=2, seed=first.seed))
    )[0]
    assert again.png == first.png


def test_n_images_get_consecutive_seeds_and_their_own_previews(pixart: ImageHead) -> None:
    chunks = collect(
        pixart,
        "a cat on the mat",
        ImageOutputOptions(size=(16, 16), num_inference_steps=2, seed=40, n=2, preview_every=1),
    )
    assert sorted((c.image_index, c.step) for c in chunks if isinstance(c, ImagePartial)) == [
        (0, 1),
        (0, 2),
        (1, 1),
        (1, 2),
    ]
    done = {f.image_index: f for f in finals(chunks)}
    assert (done[0].seed, done[1].seed) == (40, 41)
    alone = finals(
        collect(pixart, "a cat on the mat", ImageOutputOptions(size=(16, 16), num_inference_steps=2, seed=41))
    )[0]
    assert np.abs(pixels(alone.png).astype(int) - pixels(done[1].png).astype(int)).max() <= 1


def test_sd3_style_pipeline_streams_previews(sd3_dir: Path) -> None:
    head = load_image_head(sd3_dir, device="cpu", config=ImageHeadConfig(min_side=16))
    try:
        chunks = collect(
            head, "a green tree", ImageOutputOptions(size=(32, 32), num_inference_steps=3, seed=5, preview_every=1)
        )
        again = collect(head, "a green tree", ImageOutputOptions(size=(32, 32), num_inference_steps=3, seed=5))
    finally:
        head.close()
    assert [c.step for c in chunks if isinstance(c, ImagePartial)] == [1, 2, 3]
    assert pixels(finals(chunks)[0].png).shape == (32, 32, 3)
    assert finals(again)[0].png == finals(chunks)[0].png


# ---- cancellation ----------------------------------------------------------------------------------


def test_cancel_stops_denoising_early_and_frees_the_worker(pixart: ImageHead) -> None:
    steps = 12
    before = pixart.metrics()["image_steps_run"]
    cancel = threading.Event()

    async def run() -> list:
        out = []
        async for chunk in pixart.generate(
            "a dog", ImageOutputOptions(size=(32, 32), num_inference_steps=steps, seed=1, preview_every=1), cancel
        ):
            out.append(chunk)
            cancel.set()
        return out

    chunks = asyncio.run(run())
    assert [c.step for c in chunks] == [1]  # no more previews and no final after the cancel
    after_cancel = pixart.metrics()["image_steps_run"]
    # the worker is free again: the next request runs to the end
    assert len(finals(collect(pixart, "a cat", ImageOutputOptions(size=(16, 16), num_inference_steps=2, seed=2)))) == 1
    assert after_cancel - before < steps


def test_closing_the_stream_cancels_it(pixart: ImageHead) -> None:
    steps = 12
    before = pixart.metrics()

    async def run() -> None:
        stream = pixart.generate(
            "a dog", ImageOutputOptions(size=(32, 32), num_inference_steps=steps, seed=1, preview_every=1)
        )
        await stream.__anext__()
        await stream.aclose()

    asyncio.run(run())
    collect(pixart, "a cat", ImageOutputOptions(size=(16, 16), num_inference_steps=2, seed=2))
    after = pixart.metrics()
    assert after["image_steps_run"] - before["image_steps_run"] < steps  # 12 + 2 had it run to the end
    assert after["image_images_finished"] - before["image_images_finished"] == 1  # only the second request


# ---- batching --------------------------------------------------------------------------------------


def test_compatible_requests_share_a_batch_and_match_unbatched_images(pixart_dir: Path, pixart: ImageHead) -> None:
    head = load_image_head(pixart_dir, device="cpu", config=BATCHING)
    prompts = [("a red cat", 1), ("a blue dog", 2), ("the sky", 3)]

    async def together() -> list[list]:
        async def one(prompt: str, seed: int) -> list:
            opts = ImageOutputOptions(size=(32, 32), num_inference_steps=2, seed=seed, preview_every=1)
            return [c async for c in head.generate(prompt, opts)]

        return await asyncio.gather(*(one(p, s) for p, s in prompts))

    try:
        batched = asyncio.run(together())
        stats = head.metrics()
    finally:
        head.close()
    assert stats["image_batches_run"] == 1 and stats["image_largest_batch"] == 3
    for (prompt, seed), chunks in zip(prompts, batched):
        assert [c.step for c in chunks if isinstance(c, ImagePartial)] == [1, 2]
        alone = finals(collect(pixart, prompt, ImageOutputOptions(size=(32, 32), num_inference_steps=2, seed=seed)))
        diff = np.abs(pixels(alone[0].png).astype(int) - pixels(finals(chunks)[0].png).astype(int))
        assert diff.max() <= 1  # batched matmuls may round differently in the last bit


def test_incompatible_requests_run_in_separate_batches(pixart_dir: Path) -> None:
    head = load_image_head(pixart_dir, device="cpu", config=BATCHING)

    async def together() -> list[list]:
        return await asyncio.gather(
            *(
                collect_async(head, "a cat", ImageOutputOptions(size=size, num_inference_steps=2, seed=1))
                for size in ((16, 16), (32, 16))
            )
        )

    try:
        results = asyncio.run(together())
        stats = head.metrics()
    finally:
        head.close()
    assert stats["image_batches_run"] == 2
    assert [pixels(finals(r)[0].png).shape for r in results] == [(16, 16, 3), (16, 32, 3)]


async def collect_async(head: ImageHead, prompt: str, options: ImageOutputOptions) -> list:
    return [c async for c in head.generate(prompt, options)]


# ---- bad requests ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (ImageOutputOptions(size=(30, 32)), r"multiple of 4 .*got 30x32"),
        (ImageOutputOptions(size=(32, 4096)), r"from 16 to 2048 .*got 32x4096"),
        (ImageOutputOptions(size=(8, 8)), r"from 16 to"),
        (ImageOutputOptions(num_inference_steps=1), r"num_inference_steps must be an integer from 2 to 100 .*got 1"),
        (ImageOutputOptions(num_inference_steps=101), r"got 101"),
        (ImageOutputOptions(guidance_scale=-1.0), r"guidance_scale must be a number from 0 to 30; got -1.0"),
        (ImageOutputOptions(n=5), r"n must be an integer from 1 to 4; got 5"),
        (ImageOutputOptions(preview_every=-2), r"preview_every must be a non-negative integer"),
    ],
)
def test_bad_options_are_rejected_before_any_work(pixart: ImageHead, options: ImageOutputOptions, message: str) -> None:
    before = pixart.metrics()["image_batches_run"]
    with pytest.raises(ImageRequestError, match=message):
        collect(pixart, "a cat", options)
    assert pixart.metrics()["image_batches_run"] == before


def test_empty_prompt_is_rejected(pixart: ImageHead) -> None:
    with pytest.raises(ImageRequestError, match="non-empty text prompt"):
        collect(pixart, "  ", ImageOutputOptions(size=(16, 16)))
