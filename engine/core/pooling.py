"""Pooling requests: one vector per prompt from the final-normed last-layer hidden states of its positions.

Which positions count is the checkpoint's to say: a sentence-transformers directory names it in its pooling
module's config (CLS, mean or last token); any other checkpoint, a causal LM, pools its last token, as vLLM
does. The vector is L2-normalized.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

POOLING_METHODS = ("last", "mean", "cls")
# sentence-transformers' pooling config keys, in the order they are tried
_SENTENCE_TRANSFORMERS_MODES = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_lasttoken", "last"),
)


def model_pooling(model_dir: Path) -> str:
    """The pooling a checkpoint directory declares (sentence-transformers' ``modules.json``), else "last"."""
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return "last"
    try:
        entries = json.loads(modules.read_text())
        folder = next(m["path"] for m in entries if m.get("type", "").endswith("Pooling"))
        config = json.loads((model_dir / folder / "config.json").read_text())
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return "last"
    return next((method for key, method in _SENTENCE_TRANSFORMERS_MODES if config.get(key)), "last")


def pool(rows: Any, method: str) -> Any:
    """``rows`` (a float32 ``[positions, hidden]`` tensor of one prompt) pooled by ``method`` and normalized."""
    import torch

    if method == "cls":
        vector = rows[0]
    elif method == "mean":
        vector = rows.mean(dim=0)
    elif method == "last":
        vector = rows[-1]
    else:
        raise ValueError(f"pooling method must be one of {', '.join(POOLING_METHODS)}, got {method!r}")
    return torch.nn.functional.normalize(vector.float(), dim=0)
