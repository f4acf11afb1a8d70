"""FP8 (e4m3) linear layers: float8_e4m3fn weights with a float32 scale per output channel or per
128x128 block; activations stay in the model dtype (on CUDA, more than 16 rows with per-channel scales
run W8A8 through ``torch._scaled_mm``, kernels/quant_gemm.py).

A checkpoint's weights arrive as ``Fp8Weight``; a float checkpoint loaded with ``--quantization fp8``
arrives as ``Fp8Pending``, which quantizes per output channel on the device it is moved to (the
float copy never needs to fit next to the quantized one in host memory, and the device does the work).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from omni_gateway.kernels import quant_reference as qref


def kernel_module(device: torch.device) -> Any:
    """The Triton launchers on CUDA; elsewhere their torch twins, which de-quantize the weight on
    every call (correct and slow: quantized weights on the CPU are GGUF's job)."""
    return importlib.import_module("omni_gateway.kernels.quant_linear") if device.type == "cuda" else qref


@dataclass(frozen=True, slots=True)
class Fp8Weight:
    weight: torch.Tensor  # float8_e4m3fn [N, K]
    scale: torch.Tensor  # float32 [N] (per channel) or [cdiv(N, 128), cdiv(K, 128)] (per block)

    def __post_init__(self) -> None:
        n, k = self.weight.shape
        if self.weight.dtype != qref.FP8_DTYPE:
            raise ValueError(f"Fp8Weight: expected float8_e4m3fn weights, got {self.weight.dtype}")
        blocks = (-(-n // qref.FP8_BLOCK), -(-k // qref.FP8_BLOCK))
        if tuple(self.scale.shape) not in ((n,), blocks):
            raise ValueError(
                f"Fp8Weight: scale of weight {tuple(self.weight.shape)} must be [{n}] or {list(blocks)}, "
                f"got {tuple(self.scale.shape)}"
            )

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    def to(self, device: torch.device, dtype: torch.dtype) -> Fp8Weight:
        """On ``device``; the scales stay float32 whatever the activation ``dtype``."""
        del dtype
        return Fp8Weight(self.weight.to(device).contiguous(), self.scale.to(device, torch.float32).contiguous())

    @staticmethod
    def cat(parts: Sequence[Fp8Weight]) -> Fp8Weight:
        """Stacked along the output features (q/k/v and gate/up run as one matmul)."""
        if all(p.scale.dim() == 1 for p in parts):
            return Fp8Weight(torch.cat([p.weight for p in parts]), torch.cat([p.scale for p in parts]))
        if any(p.scale.dim() == 1 for p in parts[:-1]) or any(p.shape[0] % qref.FP8_BLOCK for p in parts[:-1]):
            raise ValueError(
                "per-block FP8 weights stack only when every part but the last has a multiple of "
                f"{qref.FP8_BLOCK} output features and all use per-block scales; got "
                f"{[tuple(p.shape) for p in parts]}"
            )
        return Fp8Weight(torch.cat([p.weight for p in parts]), torch.cat([p.scale for p in parts]))

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return qref.dequantize_fp8(self.weight, self.scale, dtype)

    def kernel(self) -> Callable[[torch.Tensor, Fp8Weight, torch.Tensor | None], torch.Tensor]:
        """``f(x, this weight, bias)`` for the model's ``Linear``."""
        module = kernel_module(self.weight.device)
        if hasattr(module, "prepare_device"):  # the Triton launchers' split-K counters, before any graph capture
            module.prepare_device(self.weight.device)
        fn = module.fp8_linear

        def run(x: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None) -> torch.Tensor:
            return fn(x, w.weight, w.scale, bias)  # type: ignore[no-any-return]

        return run

    def row_kernel(self) -> Callable[..., torch.Tensor] | None:
        """``f(x, this weight, bias, **fusion)``: one row with the batch-1 decode fusions
        (kernels/row_fusion.py); per-channel scales on CUDA only."""
        if self.scale.dim() != 1 or self.weight.device.type != "cuda":
            return None
        fn = kernel_module(self.weight.device).fp8_row_linear

        def run(x: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None, **fusion: Any) -> torch.Tensor:
            return fn(x, w.weight, w.scale, bias, **fusion)  # type: ignore[no-any-return]

        return run


@dataclass(frozen=True, slots=True)
class Fp8Pending:
    """A float weight to quantize per output channel once it is on its device."""

    weight: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    def to(self, device: torch.device, dtype: torch.dtype) -> Fp8Weight:
        del dtype
        q, scale = qref.quantize_fp8_per_channel(self.weight.to(device))
        return Fp8Weight(q, scale)

    @staticmethod
    def cat(parts: Sequence[Fp8Pending]) -> Fp8Pending:
        return Fp8Pending(torch.cat([p.weight for p in parts]))
