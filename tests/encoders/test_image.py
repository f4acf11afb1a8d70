"""Image decoding under hostile input, and the encoder output cache."""

from __future__ import annotations

import base64
import io
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omni_gateway.encoders.cache import EncoderCache, image_key
from omni_gateway.encoders.image import ImageDecodeError, ImageLimits, decode_image, image_pixels
from PIL import Image


def encode(image: Image.Image, fmt: str, **kwargs: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **kwargs)
    return out.getvalue()


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def png_with_size(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares ``width`` x ``height`` (a decompression bomb's signature)."""
    data = bytearray(encode(Image.new("L", (1, 1)), "PNG"))
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr : ihdr + 17])) & 0xFFFFFFFF
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", crc)
    return bytes(data)


def assert_clean(message: str) -> None:
    """Client-safe text: no object reprs, addresses or file paths."""
    assert not re.search(r"0x[0-9a-fA-F]{8,}", message), message
    assert not any(leak in message for leak in ("<", "object at", "BytesIO", "Traceback", ".py", "/tmp", "/root")), (
        message
    )


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_decodes_allowed_formats_to_rgb(fmt: str) -> None:
    image = noise(37, 23)
    out = decode_image(encode(image, fmt, **({"quality": 100} if fmt != "PNG" else {})))
    assert out.mode == "RGB" and out.size == (37, 23)
    if fmt == "PNG":
        assert out.tobytes() == image.tobytes()


def test_data_uri_and_raw_bytes_give_the_same_pixels() -> None:
    data = encode(noise(8, 8), "PNG")
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    assert decode_image(uri).tobytes() == decode_image(data).tobytes() == decode_image(uri.encode()).tobytes()


def test_exif_orientation_is_applied() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to view"
    out = decode_image(encode(noise(40, 20), "JPEG", exif=exif))
    assert out.size == (20, 40)


def test_transparency_becomes_white_not_hidden_colour() -> None:
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))  # fully transparent red
    assert decode_image(encode(rgba, "PNG")).getpixel((0, 0)) == (255, 255, 255)
    grey = Image.new("L", (4, 4), 77)
    assert decode_image(encode(grey, "PNG")).getpixel((1, 1)) == (77, 77, 77)


@pytest.mark.parametrize("width,height", [(30000, 30000), (9000, 9000), (20000, 1)])
def test_bombs_and_giant_headers_are_refused_before_decoding(width: int, height: int) -> None:
    with pytest.raises(ImageDecodeError) as err:
        decode_image(png_with_size(width, height), ImageLimits(max_pixels=40_000_000, max_side=16384))
    assert_clean(str(err.value))


def test_image_pixels_come_from_the_header_alone() -> None:
    data = encode(noise(30, 20), "PNG")
    assert image_pixels(data) == 600 == decode_image(data).width * decode_image(data).height
    # A header that lies about a 20-Mpx canvas is sized without allocating it (decoding then fails).
    assert image_pixels(png_with_size(5000, 4000)) == 20_000_000
    with pytest.raises(ImageDecodeError, match="truncated or corrupt"):
        decode_image(png_with_size(5000, 4000))
    with pytest.raises(ImageDecodeError, match="pixels in all"):
        image_pixels(png_with_size(8000, 8000))


def test_limits_are_configurable() -> None:
    data = encode(noise(64, 32), "PNG")
    with pytest.raises(ImageDecodeError, match="64x32"):
        decode_image(data, ImageLimits(max_pixels=1000))
    with pytest.raises(ImageDecodeError, match="bytes"):
        decode_image(data, ImageLimits(max_bytes=len(data) - 1))
    with pytest.raises(ImageDecodeError, match="at least"):
        decode_image(data, ImageLimits(min_side=40))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_truncated_images_fail_cleanly(fmt: str) -> None:
    data = encode(noise(64, 64), fmt)
    with pytest.raises(ImageDecodeError) as err:
        decode_image(data[: len(data) // 2])
    assert_clean(str(err.value))


@pytest.mark.parametrize(
    "data",
    [
        b"hello world, not an image",
        b"\x89PNG\r\n\x1a\n" + b"\0" * 40,
        b"GIF89a" + b"\0" * 40,
        b"%PDF-1.4 ...",
        b"\xff\xd8\xff",
    ],
)
def test_non_images_fail_cleanly(data: bytes) -> None:
    with pytest.raises(ImageDecodeError) as err:
        decode_image(data)
    assert_clean(str(err.value))


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF"])
def test_other_formats_pillow_knows_are_not_opened(fmt: str) -> None:
    with pytest.raises(ImageDecodeError, match="PNG, JPEG, WEBP"):
        decode_image(encode(noise(8, 8).convert("P") if fmt == "GIF" else noise(8, 8), fmt))


@pytest.mark.parametrize("uri", ["data:image/png,rawtext", "data:image/png;base64,@@@@", "http://x/y.png", ""])
def test_bad_uris_and_empty_input_fail_cleanly(uri: str) -> None:
    with pytest.raises(ImageDecodeError):
        decode_image(uri)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 2000))
def test_mutated_images_never_raise_anything_else(noise_bytes: bytes, cut: int) -> None:
    base = encode(noise(16, 16), "PNG")
    data = base[:cut] + noise_bytes + base[cut + len(noise_bytes) :]
    try:
        out = decode_image(data)
    except ImageDecodeError as exc:
        assert_clean(str(exc))
    else:
        assert out.mode == "RGB"


# ---- encoder cache --------------------------------------------------------------------------------


def test_cache_is_lru_within_its_byte_budget() -> None:
    cache = EncoderCache(max_bytes=100)
    cache.put("a", 1, 40)
    cache.put("b", 2, 40)
    assert cache.get("a") == 1  # "a" is now the most recent
    cache.put("c", 3, 40)  # over budget: the least recent ("b") goes
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    assert cache.num_bytes == 80
    cache.put("huge", 4, 101)  # larger than the whole budget: not kept, nothing evicted for it
    assert cache.get("huge") is None and len(cache) == 2


def test_image_key_depends_on_pixels_and_settings_not_encoding() -> None:
    image = noise(16, 16)
    same = decode_image(encode(image, "PNG"))
    assert image_key(image, "s") == image_key(same, "s")
    assert image_key(image, "s") != image_key(image, "t")
    assert image_key(image, "s") != image_key(noise(16, 16, seed=1), "s")
    # Same bytes, other shape: the key covers the size too.
    assert image_key(image.resize((8, 32)), "s") != image_key(image, "s")


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    directory = tmp_path_factory.mktemp("llava")
    torch.manual_seed(0)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        ),
        text_config=LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
        ),
        image_token_id=63,
    )
    LlavaForConditionalGeneration(config).save_pretrained(directory)
    CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}).save_pretrained(directory)
    return directory


def test_vision_encoder_encodes_a_repeated_image_once(tiny_llava: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from omni_gateway.encoders.vision import LlavaVision, load_vision_encoder

    encoder = load_vision_encoder(tiny_llava, cache=EncoderCache(1 << 20))
    calls: list[str] = []
    original = LlavaVision._encode_image
    monkeypatch.setattr(
        LlavaVision, "_encode_image", lambda self, img, key: calls.append(key) or original(self, img, key)
    )
    image = noise(40, 30)
    first = encoder.encode_image(decode_image(encode(image, "PNG")))
    again = encoder.encode_image(decode_image(encode(image, "WEBP", lossless=True)))
    other = encoder.encode_image(noise(40, 30, seed=5))
    assert len(calls) == 2 and encoder.cache.hits == 1
    assert again is first and first.key != other.key
    assert first.embeds.shape == (4, 32)  # (28/14)^2 patches, CLS dropped, LM hidden size
    assert not torch.equal(first.embeds, other.embeds)
