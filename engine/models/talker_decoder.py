"""The decoder shape both Omni talkers share: a Qwen2-VL-style decoder over codec tokens whose input rows are the
token's embedding plus a conditioning row from the thinker (``embeds``, added rather than replacing it), where one
``blank`` id stands for "no code here" and embeds to zero. Positions are multimodal rotary positions; a text-only
prompt's are 1-D and take the plain rotary table."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from omni_gateway.engine.models.qwen2_vl import Qwen2VLModel
from omni_gateway.engine.runner.attention import AttentionMetadata


class TalkerDecoder(Qwen2VLModel):
    adds_input_rows = True  # embeds rows add to the codec embeddings (decode graphs stage them, zero = none)
    blank: int  # the id whose embedding counts as zero; set by each talker's __init__

    def to_width(self, rows: torch.Tensor) -> torch.Tensor:
        """The input rows at the decoder's width (Qwen2.5-Omni builds them at the thinker's and projects them)."""
        return rows

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        embed_rows: torch.Tensor | None = None,
        embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed) * (input_ids != self.blank).unsqueeze(-1).to(self.dtype)
        if embed_rows is not None and embeds is not None:
            x = x.index_add(0, embed_rows, embeds.to(x.dtype))
        x = self.to_width(x)
        if positions.dim() == 1:
            return self.decode_layers(x, positions, meta, kv_caches, self.cos_sin_cache)
        rows = torch.arange(positions.shape[1], device=positions.device)
        return self.decode_layers(x, rows, meta, kv_caches, self.mrope_table(positions))
