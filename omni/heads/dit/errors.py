"""Errors of the image head, importable without torch so the pipeline can map them to protocol errors."""

from __future__ import annotations

from omni_gateway.omni.protocol import InvalidInput


class ImageModelLoadError(RuntimeError):
    """The image model directory is missing, unreadable, or holds a pipeline this head cannot drive."""


class ImageRequestError(InvalidInput):
    """A request's image options do not fit the loaded model (size, steps, guidance, count)."""


class ImageGenerationError(RuntimeError):
    """Denoising or decoding failed for a valid request (out of memory, a broken checkpoint, ...)."""
