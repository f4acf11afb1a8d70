"""What the talkers of speaking checkpoints (Qwen2.5-Omni, Qwen3-Omni) load alike: the checkpoint's config, its
``talker.*`` tensors, and the ``LoadedModel`` of a talker decoder that the engine runs over codec tokens. Each
model's module says how its config and tensor names map onto the decoder's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.runner.prefixed_tensors import read_prefixed_tensors

PREFIX = "talker."  # the talker's tensors in a whole speaking checkpoint


class CodecTokenizer:
    """Codec tokens have no text: the engine's detokenizer gets empty strings."""

    chat_template = None

    def decode(self, ids: Any, **_: Any) -> str:
        return ""

    def encode(self, text: str, **_: Any) -> list[int]:
        raise ValueError("the talker takes codec token ids, not text")


def read_config(root: Path) -> Any:
    """The checkpoint's whole transformers config (thinker, talker and the rest)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(root))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read the config in {str(root)!r}: {exc}") from exc


def read_talker_tensors(root: Path) -> dict[str, torch.Tensor]:
    """Every ``talker.*`` tensor of the checkpoint's safetensors shards (the thinker's and the rest are skipped)."""
    return read_prefixed_tensors(root, PREFIX)


def loaded_talker(
    root: Path,
    cfg: Any,
    *,
    architecture: str,
    stop_ids: frozenset[int],
    weights: dict[str, torch.Tensor],
    missing: list[str],
    max_model_len: int | None,
    source: Any = None,
) -> Any:
    """The ``LoadedModel`` of the talker decoder whose config is ``cfg`` (named ``architecture`` for the registry),
    once no decoder tensor is ``missing`` and ``max_model_len`` fits its context."""
    from omni_gateway.engine.runner.loader import LoadedModel

    if missing:
        raise ModelLoadError(f"{str(root)!r} lacks {len(missing)} talker tensor(s): {', '.join(missing[:6])}")
    model_len = int(cfg.max_position_embeddings)
    if max_model_len is not None and max_model_len > model_len:
        raise ModelLoadError(f"max_model_len={max_model_len} exceeds the talker's context length {model_len}")
    return LoadedModel(
        hf_config=cfg,
        tokenizer=CodecTokenizer(),
        eos_token_ids=stop_ids,
        max_model_len=max_model_len or model_len,
        vocab_size=int(cfg.vocab_size),
        chat_template=None,
        name=f"{root.name}-talker",
        architecture=architecture,
        weights=weights,
        source=source,
    )
