"""One LoRA adapter in PEFT's format (``adapter_config.json`` + ``adapter_model.safetensors``), read on
the host and checked against the base model before anything is registered.

Supported: plain LoRA (no DoRA, no trained biases) on the attention and MLP projections (q/k/v/o,
gate/up/down) of the decoder layers. An adapter that trains the embeddings or the LM head (LoRA on
them, or full copies in ``modules_to_save``) is refused: the engine leaves those tables as they are.
The scaling (``lora_alpha / r``, or ``/ sqrt(r)`` with rsLoRA) is folded into B once, here.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omni_gateway.engine.errors import InvalidRequest

# Projection name -> (input, output) width attribute of LoraTargets.
PROJECTIONS: dict[str, tuple[str, str]] = {
    "q_proj": ("hidden", "q_size"),
    "k_proj": ("hidden", "kv_size"),
    "v_proj": ("hidden", "kv_size"),
    "o_proj": ("q_size", "hidden"),
    "gate_proj": ("hidden", "intermediate"),
    "up_proj": ("hidden", "intermediate"),
    "down_proj": ("intermediate", "hidden"),
}
_UNSUPPORTED_TARGETS = ("embed_tokens", "lm_head", "embed", "wte", "output")
# Encoders beside a multimodal checkpoint's language model, whose layers' names match a decoder layer's.
_TOWERS = ("vision", "visual", "audio_tower", "multi_modal_projector", "talker")
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")
_uids = itertools.count(1)


class LoraAdapterError(InvalidRequest):
    """An adapter that cannot be served: missing files, a bad config, wrong shapes or unsupported targets."""


@dataclass(frozen=True, slots=True)
class LoraTargets:
    """The widths of the base model's projections, which an adapter's matrices must match."""

    num_layers: int
    hidden: int
    q_size: int
    kv_size: int
    intermediate: int

    def widths(self, module: str) -> tuple[int, int]:
        source, target = PROJECTIONS[module]
        return getattr(self, source), getattr(self, target)


@dataclass(frozen=True, slots=True, eq=False)
class LoraAdapter:
    """``weights[(layer, projection)]`` is (A ``[r, in]``, scaled B ``[out, r]``), float32 on the host.
    ``uid`` is unique per load in this process: a reloaded name never shares the old one's KV cache."""

    name: str
    path: str
    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)
    uid: int = field(default_factory=lambda: next(_uids))

    @property
    def cache_key(self) -> str:
        return f"lora:{self.uid}"


def load_adapter(name: str, path: str, targets: LoraTargets, max_rank: int) -> LoraAdapter:
    """Read and check the PEFT adapter in directory ``path``. Raises LoraAdapterError saying what is wrong."""
    folder = Path(path)
    if not folder.is_dir():
        raise LoraAdapterError(f"LoRA adapter {name!r}: {path!r} is not a directory (expected a PEFT adapter folder)")
    config = _read_config(name, folder)
    rank, scaling = _check_config(name, config, max_rank)
    tensors = _read_tensors(name, folder)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if any(t in key for t in ("embed_tokens", "lm_head", "lora_embedding")):
            raise LoraAdapterError(
                f"LoRA adapter {name!r} trains the embeddings or the LM head ({key}); only the attention and MLP "
                "projections (q/k/v/o_proj, gate/up/down_proj) can be served, the embeddings stay the base model's"
            )
        if any(t in key for t in _TOWERS):
            raise LoraAdapterError(
                f"LoRA adapter {name!r} trains a vision or audio tower ({key}); only the language model's "
                "attention and MLP projections can be served"
            )
        if "lora_magnitude_vector" in key:
            raise LoraAdapterError(f"LoRA adapter {name!r} is a DoRA adapter ({key}); only plain LoRA is supported")
        match = _KEY.search(key)
        if match is None:
            raise LoraAdapterError(
                f"LoRA adapter {name!r} holds {key!r}, which is no LoRA A/B matrix of a decoder layer's projection"
            )
        layer, module, which = int(match[1]), match[2], match[3]
        if module not in PROJECTIONS:
            raise LoraAdapterError(f"LoRA adapter {name!r} targets {module!r}; supported: {', '.join(PROJECTIONS)}")
        if not 0 <= layer < targets.num_layers:
            raise LoraAdapterError(f"LoRA adapter {name!r} targets layer {layer}; the model has {targets.num_layers}")
        pairs.setdefault((layer, module), {})[which] = value
    if not pairs:
        raise LoraAdapterError(f"LoRA adapter {name!r} at {path!r} holds no LoRA weights")
    weights = {}
    for (layer, module), parts in sorted(pairs.items()):
        weights[(layer, module)] = _checked_pair(name, layer, module, parts, targets, rank, scaling)
    return LoraAdapter(name=name, path=str(folder), rank=rank, weights=weights)


def _read_config(name: str, folder: Path) -> dict[str, Any]:
    file = folder / "adapter_config.json"
    if not file.is_file():
        raise LoraAdapterError(f"LoRA adapter {name!r}: {file} is missing (expected PEFT's adapter_config.json)")
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise LoraAdapterError(f"LoRA adapter {name!r}: {file} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise LoraAdapterError(f"LoRA adapter {name!r}: {file} must hold a JSON object, got {type(config).__name__}")
    return config


def _check_config(name: str, config: dict[str, Any], max_rank: int) -> tuple[int, float]:
    """(rank, scaling) of a config the engine can serve."""
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise LoraAdapterError(f"LoRA adapter {name!r}: peft_type is {peft_type!r}; only 'LORA' is supported")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise LoraAdapterError(f"LoRA adapter {name!r}: 'r' must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise LoraAdapterError(
            f"LoRA adapter {name!r} has rank {rank}, above --max-lora-rank {max_rank}; restart with a larger "
            "--max-lora-rank (up to 64)"
        )
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise LoraAdapterError(f"LoRA adapter {name!r}: 'lora_alpha' must be a number, got {alpha!r}")
    if config.get("use_dora"):
        raise LoraAdapterError(f"LoRA adapter {name!r} uses DoRA (use_dora); only plain LoRA is supported")
    if config.get("bias", "none") != "none":
        raise LoraAdapterError(f"LoRA adapter {name!r} trains biases (bias={config['bias']!r}); only 'none'")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise LoraAdapterError(f"LoRA adapter {name!r}: per-module rank_pattern/alpha_pattern are not supported")
    saved = config.get("modules_to_save") or []
    targets = config.get("target_modules") or []
    trained = [m for m in [*saved, *([targets] if isinstance(targets, str) else targets)] if m in _UNSUPPORTED_TARGETS]
    if saved or trained:
        raise LoraAdapterError(
            f"LoRA adapter {name!r} trains {', '.join(map(str, trained or saved))} (modules_to_save or "
            "target_modules); only the attention and MLP projections (q/k/v/o_proj, gate/up/down_proj) can be "
            "served, the embeddings and LM head stay the base model's"
        )
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def _read_tensors(name: str, folder: Path) -> dict[str, torch.Tensor]:
    file = folder / "adapter_model.safetensors"
    if not file.is_file():
        raise LoraAdapterError(
            f"LoRA adapter {name!r}: {file} is missing (expected PEFT's adapter_model.safetensors; "
            "adapter_model.bin is not read)"
        )
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise LoraAdapterError(f"LoRA adapter {name!r}: cannot read {file}: {exc}") from exc


def _checked_pair(
    name: str,
    layer: int,
    module: str,
    parts: dict[str, torch.Tensor],
    targets: LoraTargets,
    rank: int,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    where = f"LoRA adapter {name!r}, layer {layer} {module}"
    if set(parts) != {"A", "B"}:
        raise LoraAdapterError(f"{where}: has lora_{''.join(parts)} without its lora_{'B' if 'A' in parts else 'A'}")
    a, b = parts["A"], parts["B"]
    fan_in, fan_out = targets.widths(module)
    if tuple(a.shape) != (rank, fan_in) or tuple(b.shape) != (fan_out, rank):
        raise LoraAdapterError(
            f"{where}: expected lora_A [{rank}, {fan_in}] and lora_B [{fan_out}, {rank}] (rank {rank}, this "
            f"model's widths), got {list(a.shape)} and {list(b.shape)}"
        )
    if not (a.is_floating_point() and b.is_floating_point()):
        raise LoraAdapterError(f"{where}: expected floating-point matrices, got {a.dtype} and {b.dtype}")
    a, b = a.float().contiguous(), (b.float() * scaling).contiguous()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise LoraAdapterError(f"{where}: holds NaN or infinite values")
    return a, b
