"""Where compiled kernels are kept: Triton's cache, and torch inductor's where it is used; and the
record of which engine configurations a persisted cache was fully warmed for."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

_WARMED = "warmed"  # subdirectory of one marker file per configuration a full warm-up completed for


def use_compile_cache(directory: str) -> Path:
    """Point Triton and torch inductor at ``directory`` (created if missing). Both read the variables
    when they first compile, so this must run before any kernel compiles; the engine calls it first
    thing when it builds its runner."""
    path = Path(directory).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = str(path / "triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path / "inductor")
    return path


def configuration_key(parts: dict[str, Any]) -> str:
    """A stable digest of ``parts`` (JSON-serializable values): what decides which kernels an engine
    compiles, together with the sources of those kernels."""
    kernels = Path(__file__).resolve().parents[2] / "kernels"
    sources = hashlib.sha256()
    for source in sorted(kernels.glob("*.py")):
        sources.update(source.name.encode() + b"\0" + source.read_bytes())
    described = json.dumps({**parts, "kernel_sources": sources.hexdigest()}, sort_keys=True, default=str)
    return hashlib.sha256(described.encode()).hexdigest()[:32]


def is_warmed(directory: str, key: str) -> bool:
    """Whether a full warm-up of configuration ``key`` completed over the cache at ``directory``."""
    return (Path(directory).expanduser() / _WARMED / key).is_file()


def mark_warmed(directory: str, key: str, description: dict[str, Any]) -> None:
    """Record that the cache at ``directory`` holds every kernel configuration ``key`` compiles."""
    folder = Path(directory).expanduser() / _WARMED
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{key}.{os.getpid()}"
    partial.write_text(json.dumps(description, sort_keys=True, default=str, indent=1) + "\n", encoding="utf-8")
    partial.replace(folder / key)  # atomic: a reader never sees half a record
