"""A rank's place in a tensor-parallel group and the collectives the model calls.

``SINGLE`` (one rank) turns every collective into the identity, so the one-device path pays nothing.
Device tensors travel over ``group`` (NCCL on CUDA, gloo on the CPU); step descriptions from rank 0
travel over ``control``, a gloo group on the host, which also notices a peer that died (its socket closes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class ParallelContext:
    rank: int = 0
    world_size: int = 1
    group: Any = None  # torch.distributed group of the device tensors
    control: Any = None  # gloo group of host objects
    device: torch.device | None = None  # this rank's device (None: the config's)
    # Mixture-of-experts layers: each rank holds a share of the experts whole (else a slice of every expert).
    expert_parallel: bool = False

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of ``x`` over the ranks, in place (after a row-parallel linear)."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(x, group=self.group)
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, world*D]``: every rank's ``[N, D]`` side by side, rank order (vocab-parallel logits)."""
        if self.world_size == 1:
            return x
        import torch.distributed as dist

        out = x.new_empty(self.world_size * x.shape[0], *x.shape[1:])
        # all_gather_single is all_gather_into_tensor's newer name (torch 2.13); older releases have only the latter.
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, x.contiguous(), group=self.group)
        return out.view(self.world_size, *x.shape).movedim(0, 1).reshape(x.shape[0], -1)

    def embedding(self, ids: torch.Tensor, shard: torch.Tensor, start: int) -> torch.Tensor:
        """Rows of a vocab-parallel embedding: each rank looks up the ids it holds, zeros elsewhere,
        and the sum over ranks has every row exactly once."""
        if self.world_size == 1:
            return F.embedding(ids, shard)
        local = ids - start
        inside = (local >= 0) & (local < shard.shape[0])
        rows = F.embedding(torch.where(inside, local, 0), shard)
        return self.all_reduce(rows.masked_fill_(~inside.unsqueeze(-1), 0))

    def min_int(self, value: int) -> int:
        """The smallest ``value`` over the ranks (every rank's KV cache gets the same block count)."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        return int(t.item())


SINGLE = ParallelContext()
