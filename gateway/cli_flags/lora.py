"""``omni serve``'s LoRA flags: whether adapters are served, those loaded from the start, and how many and how
large the device holds."""

from __future__ import annotations

import argparse
import json

from omni_gateway.gateway.cli_flags.flag import Flag, _positive


def _lora_module(value: str) -> tuple[str, str]:
    """One ``--lora-modules`` value, as vLLM takes it: ``name=path`` or a JSON object with "name" and "path"."""
    if value.lstrip().startswith("{"):
        try:
            spec = json.loads(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"--lora-modules: {value!r} is not valid JSON: {exc}") from exc
        if not isinstance(spec, dict) or not all(isinstance(spec.get(k), str) and spec[k] for k in ("name", "path")):
            raise argparse.ArgumentTypeError(f"--lora-modules: expected {{'name': ..., 'path': ...}}, got {value!r}")
        return spec["name"], spec["path"]
    name, sep, path = value.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"--lora-modules: expected name=path, got {value!r}")
    return name.strip(), path.strip()


def lora_flags() -> tuple[Flag, ...]:
    # Imported here: omni.config names the engine's config type, and importing the CLI stays light.
    from omni_gateway.omni.config import EngineConfig

    eng = EngineConfig
    return (
        Flag(
            "--enable-lora",
            eng,
            "enable_lora",
            "serve LoRA adapters over the model: each is a model name of its own, loaded by --lora-modules or "
            "POST /v1/load_lora_adapter",
            "lora",
            switch=True,
        ),
        Flag(
            "--lora-modules",
            eng,
            "lora_modules",
            "adapters served from the start, each name=path (a PEFT adapter folder) or a JSON object with "
            "name and path; several after one flag or the flag repeated; they enable LoRA",
            "lora",
            type=_lora_module,
            listing=True,
            many=True,
        ),
        Flag(
            "--max-loras",
            eng,
            "max_loras",
            "adapters resident on the device at once, the most one engine step mixes; beyond them the least "
            "recently used leaves (default %(default)s)",
            "lora",
            type=_positive,
        ),
        Flag(
            "--max-lora-rank",
            eng,
            "max_lora_rank",
            "the largest adapter rank served, up to 64; device memory for adapters grows with it (default %(default)s)",
            "lora",
            type=_positive,
        ),
    )
