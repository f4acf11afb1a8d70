"""Qwen2-VL's language model: the Qwen2 decoder with multimodal rotary positions (M-RoPE).

The rotary frequencies are split into three sections (``mrope_section``: time, height, width); each
section rotates by the position on its own axis. Positions arrive as ``[3, T]`` (engine/runner/mrope.py);
one ``[T, head_dim]`` cos/sin table per step then feeds the ordinary rotary kernel, indexed by row.
"""

from __future__ import annotations

from typing import Any

import torch
from omni_gateway.engine.models.llama import LlamaModel
from omni_gateway.engine.runner.attention import AttentionMetadata


def _rope_parameters(hf_config: Any) -> dict[str, Any]:
    return dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})


class Qwen2VLModel(LlamaModel):
    uses_mrope = True

    def __init__(self, hf_config: Any, weights: dict[str, torch.Tensor], **kwargs: Any) -> None:
        super().__init__(hf_config, weights, **kwargs)
        section = [int(n) for n in _rope_parameters(hf_config).get("mrope_section") or ()]
        half = self.shape.head_dim // 2
        if len(section) != 3 or sum(section) != half:
            raise ValueError(f"mrope_section must be three sizes summing to head_dim/2={half}, got {section}")
        # Which axis (0 time, 1 height, 2 width) drives each rotary frequency.
        self.axis_of_freq = torch.cat([torch.full((n,), axis, dtype=torch.int64) for axis, n in enumerate(section)]).to(
            self.device
        )

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
    ) -> torch.Tensor:
        if positions.dim() == 1:  # text only: all three axes agree, plain rotary
            return super().forward(input_ids, positions, meta, kv_caches, embed_rows, embeds)
        table = self.mrope_table(positions)
        rows = torch.arange(positions.shape[1], device=positions.device)
        return super().forward(input_ids, rows, meta, kv_caches, embed_rows, embeds, cos_sin_cache=table)
