"""Decode untrusted image bytes (PNG, JPEG, WebP; raw or as a ``data:`` URI) into RGB under limits.

Pillow reads only the header at open time, so the pixel count is checked before any pixel is
decoded: a small file that declares a huge canvas (a decompression bomb) is refused without
allocating it. Decoder failures become ``ImageDecodeError`` with a fixed message; the decoder's own
text (which can carry object reprs and memory addresses) never reaches the client.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from dataclasses import dataclass

from PIL import Image, ImageOps

# Only these decoders ever run on client bytes; everything else Pillow knows stays out of reach.
ALLOWED_FORMATS: tuple[str, ...] = ("PNG", "JPEG", "WEBP")


class ImageDecodeError(ValueError):
    """The bytes are not an acceptable image; the message is safe to show to the client."""


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_bytes: int = 20 << 20
    max_pixels: int = 40_000_000  # width * height, checked from the header before decoding
    max_side: int = 16384
    min_side: int = 1

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_pixels < 1 or self.max_side < 1 or self.min_side < 1:
            raise ValueError(f"image limits must be positive, got {self}")


def split_data_uri(data: bytes | str) -> bytes:
    """Raw bytes from a ``data:image/...;base64,...`` URI; anything else is returned as bytes."""
    if isinstance(data, str):
        text = data
    elif data[:5].lower() == b"data:":
        text = data.decode("ascii", errors="replace")
    else:
        return bytes(data)
    if not text[:5].lower() == "data:":
        raise ImageDecodeError("image must be raw bytes or a data: URI")
    header, sep, payload = text.partition(",")
    if not sep or ";base64" not in header.lower():
        raise ImageDecodeError("image data: URI must be base64 encoded")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageDecodeError("image data: URI holds invalid base64") from None


def image_pixels(data: bytes | str, limits: ImageLimits = ImageLimits()) -> int:
    """Width times height as the header declares them, after every check ``decode_image`` makes before
    decoding: what decoding this image will hold, known without decoding it."""
    width, height = _open(data, limits).size
    return width * height


def decode_image(data: bytes | str, limits: ImageLimits = ImageLimits()) -> Image.Image:
    """An RGB ``PIL.Image`` with EXIF orientation applied, or ``ImageDecodeError``."""
    image = _open(data, limits)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            if getattr(image, "n_frames", 1) > 1:
                image.seek(0)  # animated PNG/WebP: the first frame stands for the image
            image.load()
            image = ImageOps.exif_transpose(image)
            return _to_rgb(image)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise ImageDecodeError(f"image declares too many pixels (limit {limits.max_pixels})") from None
        except Exception:  # truncated data: OSError; corrupt streams: ValueError, SyntaxError, ...
            raise ImageDecodeError("image data is truncated or corrupt") from None


def _open(data: bytes | str, limits: ImageLimits) -> Image.Image:
    """The image with only its header read, its size checked against the limits."""
    if isinstance(data, str) and len(data) > limits.max_bytes * 4 // 3 + 128:
        raise ImageDecodeError(f"image is larger than the {limits.max_bytes} byte limit")
    raw = split_data_uri(data)
    if not raw:
        raise ImageDecodeError("image is empty")
    if len(raw) > limits.max_bytes:
        raise ImageDecodeError(f"image has {len(raw)} bytes; the limit is {limits.max_bytes}")
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(raw), formats=list(ALLOWED_FORMATS))
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise ImageDecodeError(f"image declares too many pixels (limit {limits.max_pixels})") from None
        except Image.UnidentifiedImageError:
            raise ImageDecodeError(f"not a supported image; expected one of {', '.join(ALLOWED_FORMATS)}") from None
        except Exception:  # malformed headers raise SyntaxError, OSError, struct.error, ...
            raise ImageDecodeError("image header is malformed") from None
    width, height = image.size
    if width < limits.min_side or height < limits.min_side:
        raise ImageDecodeError(f"image is {width}x{height}; each side must be at least {limits.min_side} pixels")
    if width > limits.max_side or height > limits.max_side or width * height > limits.max_pixels:
        raise ImageDecodeError(
            f"image is {width}x{height}; the limits are {limits.max_side} pixels a side "
            f"and {limits.max_pixels} pixels in all"
        )
    return image


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        # Transparent pixels over white, as a viewer shows them, rather than whatever colour they hide.
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
