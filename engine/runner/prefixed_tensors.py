"""One part of a whole checkpoint read on its own (a speaking model's talker, token2wav or code2wav): the tensors
under one name prefix, from every safetensors shard of the directory; the other tensors are never read."""

from __future__ import annotations

from pathlib import Path

import torch
from omni_gateway.engine.errors import ModelLoadError


def read_prefixed_tensors(root: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor whose stored name starts with ``prefix``, under its stored name."""
    from safetensors import safe_open

    shards = sorted(root.glob("*.safetensors"))
    if not shards:
        raise ModelLoadError(f"no safetensors weights in {str(root)!r}")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        with safe_open(str(shard), "pt") as f:
            tensors.update({n: f.get_tensor(n) for n in f.keys() if n.startswith(prefix)})
    return tensors
