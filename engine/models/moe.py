"""The mixture-of-experts MLP of a decoder layer (Qwen2-MoE, Qwen3-MoE, Mixtral): router, experts, and the
gated shared expert where the config has one.

The router picks each token's top-k experts (kernels/moe_reference.py ``route``); the experts run as one fused
call over stacked weights: the Triton grouped GEMMs of kernels/fused_moe.py where the backend is Triton (CUDA,
or its interpreter), their per-expert torch twin elsewhere. Under tensor parallel the block's output is this
rank's partial sum (its expert slices, or its whole experts under expert parallel, see
engine/parallel/layout.py); the layer's all-reduce adds the ranks' parts.

A float checkpoint loaded with ``--quantization fp8`` (its linears arrive as ``Fp8Pending``) gets its experts in
FP8 too, per expert and output channel, quantized on the device; the router and the shared expert stay in float.
FP8 checkpoints' own expert weights (per-block scales) are not read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.models.moe_config import MoeConfig
from omni_gateway.engine.parallel.layout import ShardLayout
from omni_gateway.engine.quant.fp8 import Fp8Pending
from omni_gateway.kernels import moe_reference


@dataclass(frozen=True, slots=True)
class SharedExpert:
    gate_up: Any  # a Linear of the merged gate and up rows
    down: Any
    gate: torch.Tensor  # [1, hidden]: sigmoid of its product scales the shared expert's output
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down(self.silu_and_mul(self.gate_up(x)))
        return torch.sigmoid(F.linear(x, self.gate)) * out


@dataclass(frozen=True, slots=True)
class MoeBlock:
    router: torch.Tensor  # [E, hidden], every expert's (replicated over the ranks)
    w13: torch.Tensor  # [E_here, 2 * I_here, hidden]: gate rows then up rows of each expert held here
    w2: torch.Tensor  # [E_here, hidden, I_here]
    expert_map: torch.Tensor | None  # global expert id -> row of w13/w2, -1 where another rank holds it
    top_k: int
    renormalize: bool
    experts: Callable[..., torch.Tensor]  # kernels.fused_moe.fused_moe or its torch twin
    shared: SharedExpert | None
    # FP8 experts: float32 scales per expert and output channel of w13 and w2 (None: float weights).
    w13_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, hidden]``: this rank's part of the layer's MLP output (before the all-reduce)."""
        weights, ids = moe_reference.route(F.linear(x, self.router), self.top_k, self.renormalize)
        out = self.experts(
            x,
            self.w13,
            self.w2,
            weights,
            ids,
            expert_map=self.expert_map,
            w13_scale=self.w13_scale,
            w2_scale=self.w2_scale,
        )
        if self.shared is not None:
            out = out + self.shared(x)
        return out


def build_moe_block(
    weights: dict[str, Any],
    layer: int,
    config: MoeConfig,
    layout: ShardLayout,
    *,
    device: torch.device,
    dtype: torch.dtype,
    triton: bool,
    linear: Callable[[Any], Any],
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor],
) -> MoeBlock:
    """Layer ``layer``'s block from this rank's tensors under checkpoint names (``MoeConfig.weight_names``),
    each expert's projections stacked into ``w13``/``w2``. ``linear`` builds the shared expert's linears
    (the decoder's own); ``triton`` picks the fused kernels."""
    p = f"model.layers.{layer}.mlp."
    start, end = layout.expert_range()

    def tensor(name: str) -> torch.Tensor:
        value = weights[name]
        if not isinstance(value, torch.Tensor) or value.dtype == moe_reference.FP8_DTYPE:
            raise ModelLoadError(f"{name}: expert weights run in float (bf16/fp16/fp32), got {type(value).__name__}")
        return value

    def stacked(parts: list[list[str]]) -> torch.Tensor:
        rows = [torch.cat([tensor(n) for n in names]) for names in parts]
        return torch.stack(rows).to(device=device, dtype=dtype).contiguous()

    experts = range(start, end)
    w13 = stacked([[f"{p}experts.{j}.gate_proj.weight", f"{p}experts.{j}.up_proj.weight"] for j in experts])
    w2 = stacked([[f"{p}experts.{j}.down_proj.weight"] for j in experts])
    scales: dict[str, torch.Tensor] = {}
    if isinstance(weights.get(f"model.layers.{layer}.self_attn.o_proj.weight"), Fp8Pending):
        (w13, scales["w13_scale"]), (w2, scales["w2_scale"]) = (moe_reference.quantize_experts(w) for w in (w13, w2))
    expert_map = None
    if layout.expert_parallel:
        expert_map = torch.full((config.num_experts,), -1, dtype=torch.int64)
        expert_map[start:end] = torch.arange(end - start)
        expert_map = expert_map.to(device)
    shared = None
    if config.shared_expert_intermediate_size:
        s = p + "shared_expert."
        gate_up = torch.cat([tensor(s + "gate_proj.weight"), tensor(s + "up_proj.weight")])
        shared = SharedExpert(
            gate_up=linear(gate_up.to(device=device, dtype=dtype).contiguous()),
            down=linear(tensor(s + "down_proj.weight").to(device=device, dtype=dtype).contiguous()),
            gate=tensor(p + "shared_expert_gate.weight").to(device=device, dtype=dtype),
            silu_and_mul=silu_and_mul,
        )
    if triton:
        from omni_gateway.kernels.fused_moe import fused_moe
    else:
        fused_moe = moe_reference.fused_moe
    return MoeBlock(
        router=tensor(p + "gate.weight").to(device=device, dtype=dtype).contiguous(),
        w13=w13,
        w2=w2,
        expert_map=expert_map,
        top_k=config.top_k,
        renormalize=config.renormalize,
        experts=fused_moe,
        shared=shared,
        **scales,
    )
