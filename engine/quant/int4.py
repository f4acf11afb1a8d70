"""int4 weight-only linear layers (AWQ and GPTQ checkpoints): 4-bit weights in groups of 128 along
the input features, each group with its own scale and zero point; activations stay in the model dtype.

Both checkpoint layouts are repacked at load (engine/quant/hf_formats.py) into the one the kernels
read: uint8 ``[N, K / 2]`` (two weights a byte, even input feature in the low nibble), scales
``[N, K / G]`` in the checkpoint's dtype, zero points uint8 ``[N, K / G]`` (kernels/quant_reference.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from omni_gateway.engine.quant.fp8 import kernel_module
from omni_gateway.kernels import quant_reference as qref


@dataclass(frozen=True, slots=True)
class Int4Weight:
    packed: torch.Tensor  # uint8 [N, K / 2]
    scales: torch.Tensor  # [N, K / G]
    zeros: torch.Tensor  # uint8 [N, K / G]

    def __post_init__(self) -> None:
        n, half = self.packed.shape
        if self.packed.dtype != torch.uint8 or self.zeros.dtype != torch.uint8:
            raise ValueError(
                f"Int4Weight: expected uint8 packed weights and zeros, got {self.packed.dtype}, {self.zeros.dtype}"
            )
        if self.scales.shape != self.zeros.shape or self.scales.shape[0] != n or (2 * half) % self.scales.shape[1]:
            raise ValueError(
                f"Int4Weight: scales {tuple(self.scales.shape)} and zeros {tuple(self.zeros.shape)} do not "
                f"divide weights of {n} x {2 * half} into groups"
            )

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.packed.shape[0], self.packed.shape[1] * 2))

    @property
    def group_size(self) -> int:
        return self.shape[1] // self.scales.shape[1]

    def to(self, device: torch.device, dtype: torch.dtype) -> Int4Weight:
        """On ``device``; the scales keep the checkpoint's dtype whatever the activation ``dtype`` (the
        kernels widen them to float32; float16 scales cast to bfloat16 would lose 3 bits)."""
        del dtype
        return Int4Weight(
            self.packed.to(device).contiguous(), self.scales.to(device).contiguous(), self.zeros.to(device).contiguous()
        )

    @staticmethod
    def cat(parts: Sequence[Int4Weight]) -> Int4Weight:
        """Stacked along the output features (q/k/v and gate/up run as one matmul)."""
        return Int4Weight(
            torch.cat([p.packed for p in parts]),
            torch.cat([p.scales.to(parts[0].scales.dtype) for p in parts]),
            torch.cat([p.zeros for p in parts]),
        )

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return qref.dequantize_int4(self.packed, self.scales, self.zeros, dtype)

    def kernel(self) -> Callable[[torch.Tensor, Int4Weight, torch.Tensor | None], torch.Tensor]:
        """``f(x, this weight, bias)`` for the model's ``Linear``."""
        module = kernel_module(self.packed.device)
        if hasattr(module, "prepare_device"):  # the Triton launchers' split-K counters, before any graph capture
            module.prepare_device(self.packed.device)
        fn = module.int4_linear

        def run(x: torch.Tensor, w: Int4Weight, bias: torch.Tensor | None) -> torch.Tensor:
            return fn(x, w.packed, w.scales, w.zeros, bias)  # type: ignore[no-any-return]

        return run

    def row_kernel(self) -> Callable[..., torch.Tensor] | None:
        """``f(x, this weight, bias, **fusion)``: one row with the batch-1 decode fusions
        (kernels/row_fusion.py); CUDA only."""
        if self.packed.device.type != "cuda":
            return None
        fn = kernel_module(self.packed.device).int4_row_linear

        def run(x: torch.Tensor, w: Int4Weight, bias: torch.Tensor | None, **fusion: Any) -> torch.Tensor:
            return fn(x, w.packed, w.scales, w.zeros, bias, **fusion)  # type: ignore[no-any-return]

        return run
