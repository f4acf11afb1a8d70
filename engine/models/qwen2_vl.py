"""Qwen2-VL's language model: the Qwen2 decoder with multimodal rotary positions (M-RoPE); also the Qwen2.5-VL,
Qwen2.5-Omni and Qwen3-Omni thinkers' (the last a Qwen3-MoE decoder, built the same way by ``LlamaModel``).

Each rotary frequency rotates by the position on one axis (time, height, width), chosen by ``mrope_section``:
Qwen2-VL gives the axes three consecutive sections of the frequencies; Qwen3-Omni interleaves them (frequency
``i`` follows height where ``i % 3 == 1`` and ``i < 3 * section[1]``, width where ``i % 3 == 2`` and
``i < 3 * section[2]``, time elsewhere), so every axis spans low and high frequencies. Positions arrive as
``[3, T]`` (engine/runner/mrope.py); one ``[T, head_dim]`` cos/sin table per step then feeds the ordinary rotary
kernel, indexed by row.
"""

from __future__ import annotations

from typing import Any

import torch
from omni_gateway.engine.models.llama import LlamaModel
from omni_gateway.engine.runner.attention import AttentionMetadata

# Text model types whose M-RoPE is interleaved whatever the config's flags say (transformers ignores them there).
_INTERLEAVED_TYPES = frozenset({"qwen3_omni_moe_text"})


def _rope_parameters(hf_config: Any) -> dict[str, Any]:
    return dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})


def axis_of_frequency(section: list[int], half: int, interleaved: bool) -> torch.Tensor:
    """int64 ``[half]``: the axis (0 time, 1 height, 2 width) whose position drives each rotary frequency."""
    if len(section) != 3 or sum(section) != half:
        raise ValueError(f"mrope_section must be three sizes summing to head_dim/2={half}, got {section}")
    if not interleaved:
        return torch.cat([torch.full((n,), axis, dtype=torch.int64) for axis, n in enumerate(section)])
    axis = torch.zeros(half, dtype=torch.int64)
    for a in (1, 2):
        axis[a : 3 * section[a] : 3] = a
    return axis


class Qwen2VLModel(LlamaModel):
    uses_mrope = True

    def __init__(self, hf_config: Any, weights: dict[str, torch.Tensor], **kwargs: Any) -> None:
        super().__init__(hf_config, weights, **kwargs)
        params = _rope_parameters(hf_config)
        section = [int(n) for n in params.get("mrope_section") or ()]
        interleaved = getattr(hf_config, "model_type", None) in _INTERLEAVED_TYPES or bool(
            params.get("mrope_interleaved") or params.get("interleaved")
        )
        # Which axis (0 time, 1 height, 2 width) drives each rotary frequency.
        self.axis_of_freq = axis_of_frequency(section, self.shape.head_dim // 2, interleaved).to(self.device)

    def mrope_table(self, positions: torch.Tensor) -> torch.Tensor:
        """``[T, head_dim]`` cat(cos, sin) rows for ``[3, T]`` positions."""
        half = self.shape.head_dim // 2
        rows = self.cos_sin_cache[positions]  # [3, T, head_dim]
        index = self.axis_of_freq.view(1, 1, half).expand(1, positions.shape[1], half)
        cos = rows[..., :half].gather(0, index).squeeze(0)
        sin = rows[..., half:].gather(0, index).squeeze(0)
        return torch.cat((cos, sin), dim=-1)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        embed_rows: torch.Tensor | None = None,
        embeds: torch.Tensor | None = None,
        deepstack: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if positions.dim() == 1:  # text only: all three axes agree, plain rotary
            return super().forward(input_ids, positions, meta, kv_caches, embed_rows, embeds, deepstack=deepstack)
        table = self.mrope_table(positions)
        rows = torch.arange(positions.shape[1], device=positions.device)
        return super().forward(
            input_ids, rows, meta, kv_caches, embed_rows, embeds, cos_sin_cache=table, deepstack=deepstack
        )
