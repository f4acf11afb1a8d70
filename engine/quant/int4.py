"""int4 weight-only linear layers (AWQ and GPTQ checkpoints): 4-bit weights in groups of 128 along
the input features, each group with its own scale and zero point; activations stay in the model dtype.

Both checkpoint layouts are repacked at load (engine/quant/hf_formats.py) into the row layout: uint8
``[N, K / 2]`` (two weights a byte, even input feature in the low nibble), scales ``[N, K / G]`` in the
checkpoint's dtype, zero points uint8 ``[N, K / G]`` (kernels/quant_reference.py). Moved to a CUDA device,
weights whose output features fill 64-row tiles are laid out in row tiles, uint8 ``[N / 64, K / G, 64,
G / 2]``, in which a kernel's block of rows is read as contiguous runs (on an H100, a kernel that only
loads the words of the 8B gate_up projection for one row took 23.8 us from tiles against 35.3 us from
rows); scales and zero points keep their layout. Every method takes either layout.
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
    packed: torch.Tensor  # uint8 [N, K / 2] (rows) or [N / T, K / G, T, G / 2] (row tiles of T rows)
    scales: torch.Tensor  # [N, K / G]
    zeros: torch.Tensor  # uint8 [N, K / G]

    def __post_init__(self) -> None:
        if self.packed.dtype != torch.uint8 or self.zeros.dtype != torch.uint8:
            raise ValueError(
                f"Int4Weight: expected uint8 packed weights and zeros, got {self.packed.dtype}, {self.zeros.dtype}"
            )
        if self.packed.dim() not in (2, 4):
            raise ValueError(
                "Int4Weight: expected packed weights [N, K / 2] (rows) or [N / T, K / G, T, G / 2] (row tiles), "
                f"got shape {tuple(self.packed.shape)}"
            )
        n, k = self.shape
        groups = self.scales.shape[1] if self.scales.dim() == 2 else 0
        if self.scales.shape != self.zeros.shape or groups == 0 or self.scales.shape[0] != n or k % groups:
            raise ValueError(
                f"Int4Weight: scales {tuple(self.scales.shape)} and zeros {tuple(self.zeros.shape)} do not "
                f"divide weights of {n} x {k} into groups"
            )
        if self.packed.dim() == 4 and self.packed.shape[1] != groups:
            raise ValueError(
                f"Int4Weight: row tiles {tuple(self.packed.shape)} hold groups of {2 * self.packed.shape[3]} "
                f"weights, expected {k // groups} (the scales' {groups} groups a row)"
            )

    @property
    def shape(self) -> torch.Size:
        """``[N, K]``, whatever the layout."""
        return torch.Size(qref.int4_layout(self.packed)[:2])

    @property
    def row_tile(self) -> int:
        """Rows a tile of ``packed``; 1 for the row layout."""
        return qref.int4_layout(self.packed)[2]

    @property
    def group_size(self) -> int:
        return self.shape[1] // self.scales.shape[1]

    def to(self, device: torch.device, dtype: torch.dtype) -> Int4Weight:
        """On ``device``; the scales keep the checkpoint's dtype whatever the activation ``dtype`` (the
        kernels widen them to float32; float16 scales cast to bfloat16 would lose 3 bits). Row-layout
        weights moved to CUDA are tiled in ``INT4_ROW_TILE`` rows when their output features allow."""
        del dtype
        packed = self.packed.to(device).contiguous()
        if packed.device.type == "cuda" and packed.dim() == 2 and packed.shape[0] % qref.INT4_ROW_TILE == 0:
            packed = qref.tile_int4(packed, self.group_size)
        return Int4Weight(packed, self.scales.to(device).contiguous(), self.zeros.to(device).contiguous())

    @staticmethod
    def cat(parts: Sequence[Int4Weight]) -> Int4Weight:
        """Stacked along the output features (q/k/v and gate/up run as one matmul). Parts tiled alike stack
        tile after tile; mixed layouts stack as rows."""
        if len({p.row_tile for p in parts}) == 1:
            packed = torch.cat([p.packed for p in parts])
        else:
            packed = torch.cat([qref.untile_int4(p.packed) for p in parts])
        return Int4Weight(
            packed,
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

    @property
    def row_streams(self) -> bool:
        """Whether ``row_kernel`` takes the float32 rows of kernels/int4_row_stream.py and ``rotary``
        (kernels/quant_linear.py ``int4_row_linear``): on the tensor-core kernel, for bfloat16 activations."""
        if self.packed.device.type != "cuda":
            return False
        from omni_gateway.kernels import int4_fragments

        return int4_fragments.takes(self.packed, self.group_size)

    def row_kernel(self) -> Callable[..., Any] | None:
        """``f(x, this weight, bias, **fusion)``: one row with the batch-1 decode fusions
        (kernels/row_fusion.py); CUDA only."""
        if self.packed.device.type != "cuda":
            return None
        fn = kernel_module(self.packed.device).int4_row_linear

        def run(x: Any, w: Int4Weight, bias: torch.Tensor | None, **fusion: Any) -> Any:
            return fn(x, w.packed, w.scales, w.zeros, bias, **fusion)

        return run
