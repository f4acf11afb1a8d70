"""Which slice of every weight a tensor-parallel rank holds. Pure arithmetic: no torch, no I/O.

Attention is split by heads: rank r holds query heads ``[r*H/N, (r+1)*H/N)`` and the KV heads they
read. With N up to the KV head count each rank holds ``KV/N`` KV heads; past it each KV head is
replicated on ``N/KV`` consecutive ranks (as vLLM does), so a rank always holds exactly the KV heads
its query heads attend with. The MLP is split by intermediate columns, the vocabulary by rows of
``ceil(V/N)`` (the last rank's shard padded with zero rows, whose logits are cut off after the gather).

Mixture-of-experts layers split one of two ways. By default each expert is split like the dense MLP, by
its intermediate columns, so every rank runs every token through a slice of every expert. With
``expert_parallel`` (vLLM's ``--enable-expert-parallel``) rank r holds experts ``[r*E/N, (r+1)*E/N)`` whole
and runs each token's pairs with those experts only. Either way the ranks' partial outputs are summed in
the all-reduce that ends the layer; a shared expert is always split like the dense MLP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni_gateway.engine.models.moe_config import MoeConfig


@dataclass(frozen=True, slots=True)
class ShardLayout:
    rank: int
    world_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_experts: int = 0  # 0: a dense model
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    expert_parallel: bool = False

    @classmethod
    def of(cls, hf_config: Any, rank: int, world_size: int, expert_parallel: bool = False) -> ShardLayout:
        """The layout of ``rank`` for a HF config; ValueError when the model cannot be split ``world_size`` ways."""
        heads = int(hf_config.num_attention_heads)
        moe = MoeConfig.of(hf_config)
        layout = cls(
            rank=rank,
            world_size=world_size,
            num_heads=heads,
            num_kv_heads=int(getattr(hf_config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads),
            intermediate_size=int(hf_config.intermediate_size),
            vocab_size=int(hf_config.vocab_size),
            num_experts=0 if moe is None else moe.num_experts,
            expert_intermediate_size=0 if moe is None else moe.expert_intermediate_size,
            shared_expert_intermediate_size=0 if moe is None else moe.shared_expert_intermediate_size,
            expert_parallel=expert_parallel and moe is not None,
        )
        layout.validate()
        return layout

    def validate(self) -> None:
        n = self.world_size
        if n < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {n}")
        if not 0 <= self.rank < n:
            raise ValueError(f"rank must be in [0, {n}), got {self.rank}")
        if self.num_heads % n:
            raise ValueError(f"tensor_parallel_size={n} must divide the model's {self.num_heads} attention heads")
        kv = self.num_kv_heads
        if (n <= kv and kv % n) or (n > kv and n % kv):
            raise ValueError(f"tensor_parallel_size={n} must divide the model's {kv} KV heads or be a multiple of them")
        if self.intermediate_size % n:
            raise ValueError(
                f"tensor_parallel_size={n} must divide the model's MLP intermediate size {self.intermediate_size}"
            )
        if self.expert_parallel and self.num_experts % n:
            raise ValueError(f"expert parallel over {n} ranks must divide the model's {self.num_experts} experts")
        if self.num_experts and not self.expert_parallel and self.expert_intermediate_size % n:
            raise ValueError(
                f"tensor_parallel_size={n} must divide the experts' intermediate size {self.expert_intermediate_size} "
                "(or run --enable-expert-parallel)"
            )
        if self.shared_expert_intermediate_size % n:
            raise ValueError(
                f"tensor_parallel_size={n} must divide the shared expert's intermediate size "
                f"{self.shared_expert_intermediate_size}"
            )

    @property
    def heads_per_rank(self) -> int:
        return self.num_heads // self.world_size

    @property
    def kv_heads_per_rank(self) -> int:
        return max(1, self.num_kv_heads // self.world_size)

    @property
    def kv_head_start(self) -> int:
        n, kv = self.world_size, self.num_kv_heads
        return self.rank * kv // n if n <= kv else self.rank // (n // kv)

    def q_rows(self) -> tuple[int, int]:
        """Rows of q_proj (columns of o_proj) this rank holds."""
        size = self.heads_per_rank * self.head_dim
        return self.rank * size, (self.rank + 1) * size

    def kv_rows(self) -> tuple[int, int]:
        """Rows of k_proj and v_proj this rank holds."""
        start = self.kv_head_start * self.head_dim
        return start, start + self.kv_heads_per_rank * self.head_dim

    def mlp_rows(self) -> tuple[int, int]:
        """Rows of gate_proj and up_proj (columns of down_proj) this rank holds."""
        size = self.intermediate_size // self.world_size
        return self.rank * size, (self.rank + 1) * size

    @property
    def vocab_per_rank(self) -> int:
        return -(-self.vocab_size // self.world_size)

    def vocab_rows(self) -> tuple[int, int]:
        """Vocabulary rows of the embedding and LM head this rank reads; the shard is padded to
        ``vocab_per_rank`` rows (the last rank's may read fewer, or none)."""
        start = min(self.rank * self.vocab_per_rank, self.vocab_size)
        return start, min(start + self.vocab_per_rank, self.vocab_size)

    def expert_range(self) -> tuple[int, int]:
        """Experts this rank holds: its share of them under expert parallel, else all (each a slice)."""
        if not self.expert_parallel:
            return 0, self.num_experts
        size = self.num_experts // self.world_size
        return self.rank * size, (self.rank + 1) * size

    def expert_rows(self) -> tuple[int, int]:
        """Rows of each held expert's gate_proj and up_proj (columns of its down_proj) this rank holds."""
        if self.expert_parallel:
            return 0, self.expert_intermediate_size
        size = self.expert_intermediate_size // self.world_size
        return self.rank * size, (self.rank + 1) * size

    def shared_expert_rows(self) -> tuple[int, int]:
        """Rows of the shared expert's gate_proj and up_proj (columns of its down_proj) this rank holds."""
        size = self.shared_expert_intermediate_size // self.world_size
        return self.rank * size, (self.rank + 1) * size
