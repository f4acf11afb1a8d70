"""What every encoder read from a checkpoint folder holds: the folder and its config, device and dtype, the
output cache, and the preprocessor saved beside the weights, whose settings are part of every cache key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omni_gateway.encoders.cache import EncoderCache, content_key


class CheckpointEncoder:
    settings: str  # the cache keys' share of the preprocessor (``_preprocessor`` sets it)

    def __init__(
        self, model_dir: Path, hf_config: Any, *, device: torch.device, dtype: torch.dtype, cache: EncoderCache | None
    ) -> None:
        self.model_dir = model_dir
        self.hf_config = hf_config
        self.device = device
        self.dtype = dtype
        self.cache = cache if cache is not None else EncoderCache(256 << 20)

    def _preprocessor(self, load: Callable[[str], Any], error: type[Exception], what: str) -> Any:
        """The checkpoint's preprocessor from ``load`` (a transformers ``Auto*.from_pretrained``); a missing or
        malformed ``preprocessor_config.json`` raises ``error`` naming ``what`` and the folder."""
        try:
            processor = load(str(self.model_dir))
        except Exception as exc:
            raise error(f"cannot load the {what} of {str(self.model_dir)!r}: {exc}") from exc
        # Whatever changes the embeddings of the same input belongs in the cache key.
        self.settings = content_key(str(self.model_dir.resolve()), processor.to_json_string(), str(self.dtype))
        return processor
