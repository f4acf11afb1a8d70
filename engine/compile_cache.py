"""Where compiled kernels are kept: Triton's cache, and torch inductor's where it is used."""

from __future__ import annotations

import os
from pathlib import Path


def use_compile_cache(directory: str) -> Path:
    """Point Triton and torch inductor at ``directory`` (created if missing). Both read the variables
    when they first compile, so this must run before any kernel compiles; the engine calls it first
    thing when it builds its runner."""
    path = Path(directory).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = str(path / "triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path / "inductor")
    return path
