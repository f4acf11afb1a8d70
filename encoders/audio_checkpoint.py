"""What an audio-in checkpoint directory says of itself: its family, its special tokens, its audio weights and
the thinker's token embedding rows, each read without loading the language model."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omni_gateway.encoders.audio_encoder import AudioLoadError
from omni_gateway.encoders.vision import VisionLoadError, _load_module, _vision_weights, architecture_family

FAMILIES = {
    "Qwen2AudioForConditionalGeneration": "qwen2_audio",
    "VoxtralForConditionalGeneration": "voxtral",
    "Qwen2_5OmniForConditionalGeneration": "qwen2_5_omni",
    "Qwen2_5OmniThinkerForConditionalGeneration": "qwen2_5_omni",
    "Qwen3OmniMoeForConditionalGeneration": "qwen3_omni",
}


def checkpoint_family(model_dir: str | Path) -> str | None:
    """``"qwen2_audio"``, ``"voxtral"``, ``"qwen2_5_omni"``, ``"qwen3_omni"`` or None for a directory whose config
    names none."""
    return architecture_family(model_dir, FAMILIES)


def special_token_ids(model_dir: Path) -> dict[str, int]:
    """Added/special tokens of the directory's tokenizer (``tokenizer.json`` or Mistral's ``tekken.json``)."""
    found: dict[str, int] = {}
    try:
        if (model_dir / "tokenizer.json").is_file():
            for token in json.loads((model_dir / "tokenizer.json").read_text()).get("added_tokens", []):
                found[str(token["content"])] = int(token["id"])
        elif (model_dir / "tekken.json").is_file():
            for token in json.loads((model_dir / "tekken.json").read_text()).get("special_tokens", []):
                found[str(token["token_str"])] = int(token["rank"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise AudioLoadError(f"cannot read the special tokens of {str(model_dir)!r}: {exc}") from exc
    return found


def tower_weights(model_dir: Path, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return _vision_weights(model_dir, prefixes)


def load_tower(module: torch.nn.Module, weights: dict[str, torch.Tensor], what: str, model_dir: Path) -> None:
    try:
        _load_module(module, weights, what, model_dir)
    except VisionLoadError as exc:
        raise AudioLoadError(str(exc)) from None


def thinker_token_rows(model_dir: Path, ids: list[int | None]) -> torch.Tensor:
    """``[len(ids), hidden]`` rows of the thinker's token embedding table, read without loading the rest."""
    from safetensors import safe_open

    if any(i is None for i in ids):
        raise AudioLoadError(f"the tokenizer of {str(model_dir)!r} lacks an audio or vision marker token")
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            if "thinker.model.embed_tokens.weight" in f.keys():  # noqa: SIM118 (not a dict)
                table = f.get_slice("thinker.model.embed_tokens.weight")
                return torch.cat([table[i : i + 1] for i in ids])  # type: ignore[misc]
    raise AudioLoadError(f"{str(model_dir)!r} lacks thinker.model.embed_tokens.weight")
