"""The mixture-of-experts MLP of a decoder layer (Qwen2-MoE, Qwen3-MoE, Mixtral): router, experts, and the
gated shared expert where the config has one.

The router picks each token's top-k experts (kernels/moe_reference.py ``route``); the experts run as one fused
call over stacked weights: the Triton grouped GEMMs of kernels/fused_moe.py where the backend is Triton (CUDA,
or its interpreter), their per-expert torch twin elsewhere. Under tensor parallel the block's output is this
rank's partial sum (its expert slices, or its whole experts under expert parallel, see
engine/parallel/layout.py); the layer's all-reduce adds the ranks' parts.

A float checkpoint loaded with ``--quantization fp8`` (its linears arrive as ``Fp8Pending``) gets its experts in
FP8 too, per expert and output channel, quantized on the device; the router and the shared expert stay in float.
An FP8 checkpoint's experts (``Fp8Weight``, engine/quant/hf_formats.py: per 128x128 block as Qwen's FP8 checkpoints
store them, or per tensor or channel) are de-quantized on the device one expert at a time, in float32 (exact: an
e4m3 code times its float32 scale), and re-quantized per expert and output channel, the one FP8 layout the fused
kernel runs. Its router and shared expert run as the checkpoint has them: FP8 linears stay FP8 (a router or
shared-expert gate, products taken with ``F.linear``, is de-quantized), float ones float.
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
from omni_gateway.engine.quant.fp8 import Fp8Pending, Fp8Weight
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
            raise ModelLoadError(
                f"{name}: expected a float (bf16/fp16/fp32) tensor or an FP8 checkpoint's weight with its scales, "
                f"got {getattr(value, 'dtype', type(value).__name__)}"
            )
        return value

    def dense(name: str) -> torch.Tensor:
        """A weight the block multiplies with ``F.linear``, in ``dtype`` on the device."""
        value = weights[name]
        if isinstance(value, Fp8Weight):
            return value.to(device, dtype).dequantize(dtype)
        return tensor(name).to(device=device, dtype=dtype).contiguous()

    def shared_linear(names: list[str]) -> Any:
        """The shared expert's weight for ``linear``: FP8 parts stay FP8 (merged as a dense FP8 linear's)."""
        values = [weights[n] for n in names]
        if all(isinstance(v, Fp8Weight) for v in values):
            try:
                return Fp8Weight.cat(values).to(device, dtype)
            except ValueError as exc:
                raise ModelLoadError(f"{names[0].rpartition('.')[0].rpartition('.')[0]}: {exc}") from exc
        merged = torch.cat([dense(n) if isinstance(weights[n], Fp8Weight) else tensor(n) for n in names])
        return merged.to(device=device, dtype=dtype).contiguous()

    def fp8_expert(names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """One expert's FP8 checkpoint weights, merged: FP8 codes and float32 scale per output channel."""
        parts = []
        for name in names:
            value = weights[name]
            part = value.to(device, dtype).dequantize(torch.float32) if isinstance(value, Fp8Weight) else None
            parts.append(tensor(name).to(device=device, dtype=torch.float32) if part is None else part)
        codes, scale = moe_reference.quantize_experts(torch.cat(parts).unsqueeze(0))
        return codes[0], scale[0]

    def stacked(parts: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The experts' weights stacked, with their scales (None: float weights to quantize or keep)."""
        if any(isinstance(weights[n], Fp8Weight) for names in parts for n in names):
            codes, scale = zip(*(fp8_expert(names) for names in parts))  # one expert's float32 copy at a time
            return torch.stack(codes), torch.stack(scale)
        rows = [torch.cat([tensor(n) for n in names]) for names in parts]
        return torch.stack(rows).to(device=device, dtype=dtype).contiguous(), None

    experts = range(start, end)
    w13, w13_scale = stacked([[f"{p}experts.{j}.gate_proj.weight", f"{p}experts.{j}.up_proj.weight"] for j in experts])
    w2, w2_scale = stacked([[f"{p}experts.{j}.down_proj.weight"] for j in experts])
    scales: dict[str, torch.Tensor] = {}
    if w13_scale is not None and w2_scale is not None:
        scales = {"w13_scale": w13_scale, "w2_scale": w2_scale}
    elif w13_scale is not None or w2_scale is not None:
        raise ModelLoadError(f"{p}experts: gate/up and down projections must be both FP8 or both float")
    elif isinstance(weights.get(f"model.layers.{layer}.self_attn.o_proj.weight"), Fp8Pending):
        (w13, scales["w13_scale"]), (w2, scales["w2_scale"]) = (moe_reference.quantize_experts(w) for w in (w13, w2))
    expert_map = None
    if layout.expert_parallel:
        expert_map = torch.full((config.num_experts,), -1, dtype=torch.int64)
        expert_map[start:end] = torch.arange(end - start)
        expert_map = expert_map.to(device)
    shared = None
    if config.shared_expert_intermediate_size:
        s = p + "shared_expert."
        shared = SharedExpert(
            gate_up=linear(shared_linear([s + "gate_proj.weight", s + "up_proj.weight"])),
            down=linear(shared_linear([s + "down_proj.weight"])),
            gate=dense(p + "shared_expert_gate.weight"),
            silu_and_mul=silu_and_mul,
        )
    if triton:
        from omni_gateway.kernels.fused_moe import fused_moe
    else:
        fused_moe = moe_reference.fused_moe
    return MoeBlock(
        router=dense(p + "gate.weight"),
        w13=w13,
        w2=w2,
        expert_map=expert_map,
        top_k=config.top_k,
        renormalize=config.renormalize,
        experts=fused_moe,
        shared=shared,
        **scales,
    )
