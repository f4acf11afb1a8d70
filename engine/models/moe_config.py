"""What a Hugging Face config says about its mixture-of-experts layers (Qwen2-MoE, Qwen3-MoE, Mixtral), and the
checkpoint names of their weights. Plain arithmetic on the config: no torch, so the shard layout can read it.

Expert weights are named as Qwen's checkpoints name them, ``mlp.experts.{j}.{gate,up,down}_proj.weight`` and the
router ``mlp.gate.weight``; Mixtral's (``block_sparse_moe.experts.{j}.w1/w3/w2``) are renamed to these at load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# Mixtral's names -> Qwen's, applied to the part after ``model.layers.{i}.``.
_MIXTRAL_NAMES = re.compile(r"^(model\.layers\.\d+\.)block_sparse_moe\.(gate\.|experts\.\d+\.)(w[123]\.)?")
_MIXTRAL_PROJ = {"w1.": "gate_proj.", "w3.": "up_proj.", "w2.": "down_proj."}


@dataclass(frozen=True, slots=True)
class MoeConfig:
    num_experts: int
    top_k: int
    renormalize: bool  # the top-k weights rescaled to sum to one
    expert_intermediate_size: int
    shared_expert_intermediate_size: int  # 0: no shared expert
    sparse_step: int
    dense_layers: frozenset[int]  # ``mlp_only_layers``

    @classmethod
    def of(cls, hf_config: Any) -> MoeConfig | None:
        """The config's experts, or None for a dense model."""
        experts = int(getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None) or 0)
        if experts <= 0:
            return None
        # The Qwen MoEs say in ``norm_topk_prob`` whether they rescale; Mixtral, which has no such field, always
        # does. ``num_local_experts`` tells nothing apart: Qwen3-MoE's and Qwen3-Omni's talker configs alias
        # ``num_experts`` to it.
        norm_topk_prob = getattr(hf_config, "norm_topk_prob", None)
        return cls(
            num_experts=experts,
            top_k=int(hf_config.num_experts_per_tok),
            renormalize=True if norm_topk_prob is None else bool(norm_topk_prob),
            expert_intermediate_size=int(
                getattr(hf_config, "moe_intermediate_size", None) or hf_config.intermediate_size
            ),
            shared_expert_intermediate_size=int(getattr(hf_config, "shared_expert_intermediate_size", None) or 0),
            sparse_step=int(getattr(hf_config, "decoder_sparse_step", None) or 1),
            dense_layers=frozenset(int(i) for i in getattr(hf_config, "mlp_only_layers", None) or ()),
        )

    def is_sparse(self, layer: int) -> bool:
        """Whether layer ``layer`` runs the experts (else a dense MLP of ``intermediate_size``), as HF decides."""
        return layer not in self.dense_layers and (layer + 1) % self.sparse_step == 0

    def weight_names(self, layer: int) -> list[str]:
        """The tensors a sparse layer's MLP reads."""
        p = f"model.layers.{layer}.mlp."
        names = [p + "gate.weight"]
        names += [f"{p}experts.{j}.{n}_proj.weight" for j in range(self.num_experts) for n in ("gate", "up", "down")]
        if self.shared_expert_intermediate_size:
            names += [f"{p}shared_expert.{n}_proj.weight" for n in ("gate", "up", "down")]
            names.append(p + "shared_expert_gate.weight")
        return names


def mlp_weight_names(hf_config: Any, layer: int) -> list[str]:
    """The MLP tensors of layer ``layer``: its experts' where it is sparse, else the dense gate/up/down."""
    moe = MoeConfig.of(hf_config)
    if moe is not None and moe.is_sparse(layer):
        return moe.weight_names(layer)
    return [f"model.layers.{layer}.mlp.{n}_proj.weight" for n in ("gate", "up", "down")]


def canonical_expert_names(named: dict[str, T]) -> dict[str, T]:
    """``named`` with Mixtral's expert and router names turned into Qwen's (other names as they are)."""

    def rename(name: str) -> str:
        match = _MIXTRAL_NAMES.match(name)
        if match is None:
            return name
        layer, part, proj = match.groups()
        return f"{layer}mlp.{part}{_MIXTRAL_PROJ[proj] if proj else ''}{name[match.end() :]}"

    return {rename(name): value for name, value in named.items()}
