"""How media refusals reach the client, and the server's default budget of decoded pixels.

Torch-free, so the pipeline can map these refusals onto error chunks without loading the vision stack.

Defaults, for a server whose vision tower shrinks every image to about a megapixel anyway:
- per request, ``MediaLimits.max_request_pixels`` (omni.vision), 128 Mpx declared over all images and
  sampled video frames: ten 12-Mpx phone photos, sixteen 2048x2048 images or a 32-frame 1080p clip fit,
  and the decode work of one request stays bounded (a few CPU seconds).
- per server, ``SERVER_PIXELS`` (256 Mpx) held at once by all requests together. Decoding holds about
  3 bytes a pixel (RGB) and briefly up to ~5 (a transparent image is composited over white), so the
  budget keeps decoded media under ~1.3 GB in the worst case, while still letting six 40-Mpx images
  (the largest one image may be) decode side by side.
- ``WAIT_S``: a request that finds the budget full waits up to 10 s (several full-size decodes finish
  in that time), then gets 429; a realtime turn gets an ``error`` event.
"""

from __future__ import annotations

from omni_gateway.encoders.budget import PixelBudget
from omni_gateway.omni.protocol import InvalidInput

SERVER_PIXELS = 256_000_000
WAIT_S = 10.0


class MediaError(InvalidInput):
    """A media part was refused (undecodable, over a limit, too many); the message is client-safe."""

    status = 400
    code = "invalid_request"


class MediaTooLarge(MediaError):
    """The request's media declare more pixels than one request (or the whole server) may decode."""

    status = 413
    code = "media_too_large"


class MediaBusy(MediaError):
    """The server's pixel budget stayed full for the whole wait; retrying later can succeed."""

    status = 429
    code = "rate_limit_exceeded"


def server_budget(capacity: int = SERVER_PIXELS, wait_s: float = WAIT_S) -> PixelBudget:
    return PixelBudget(capacity, wait_s)
