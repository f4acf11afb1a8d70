"""Quantized weight matrices held as their codes and group scales, and the linears that run on them.

Two layouts cover the GGUF types read here (see ``gguf_blocks.py``):

- ``q4``: 4-bit codes ``c`` in 32-weight groups, ``w = c * scale + bias`` (Q4_0, Q4_1, Q4_K);
- ``q8``: int8 codes, ``w = c * scale`` per ``group`` weights (Q8_0 with groups of 32, Q6_K of 16).

Every product ``c * scale`` is exact in float32 for these types, so a decoded weight is bit for bit
the float32 value the reference de-quantizer gives; the matmuls then differ from a float32 GEMM only
in the order their float32 sums are taken.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from omni_gateway.engine.quant.cpu_ext import load_kernels

# From this many rows (prefill chunks) a float32 copy of the weight, made per call, through the float
# GEMM beats decoding the weight once per 8 rows: the copy costs O(N*K), the product O(M*N*K). Not for
# matrices whose copy outgrows the caches (a 49k-row LM head: 113 MB written per call).
DEQUANTIZED_GEMM_ROWS = 48
DEQUANTIZED_GEMM_MAX_WEIGHTS = 4 << 20


@dataclass(frozen=True, slots=True, eq=False)
class QuantizedWeight:
    """One ``[rows, cols]`` matrix: ``codes`` (uint8 ``[rows, cols/2]`` for q4, int8 ``[rows, cols]`` for
    q8), float32 ``scale`` (and ``bias`` for q4) of shape ``[rows, cols/group]``."""

    layout: str  # "q4" | "q8"
    gguf_type: str
    codes: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None
    group: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.scale.shape[0], self.scale.shape[1] * self.group

    @property
    def nbytes(self) -> int:
        extra = 0 if self.bias is None else self.bias.nbytes
        return self.codes.nbytes + self.scale.nbytes + extra

    def same_layout(self, other: QuantizedWeight) -> bool:
        return self.layout == other.layout and self.group == other.group and self.shape[1] == other.shape[1]

    @staticmethod
    def concat(parts: list[QuantizedWeight]) -> QuantizedWeight:
        """Row-wise concatenation (merged q/k/v); every part must share the layout."""
        first = parts[0]
        assert all(first.same_layout(p) for p in parts), "concat needs one layout"
        bias = None if first.bias is None else torch.cat([p.bias for p in parts])  # type: ignore[misc]
        gguf_type = first.gguf_type if all(p.gguf_type == first.gguf_type for p in parts) else "mixed"
        return QuantizedWeight(
            first.layout,
            gguf_type,
            torch.cat([p.codes for p in parts]),
            torch.cat([p.scale for p in parts]),
            bias,
            first.group,
        )

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """float32 rows ``index`` (embedding lookups), decoded exactly."""
        codes, scale = self.codes[index], self.scale[index]
        if self.layout == "q8":
            values = codes.to(torch.float32).view(*codes.shape[:-1], -1, self.group)
            return (values * scale.unsqueeze(-1)).flatten(-2)
        low, high = codes & 0x0F, codes >> 4
        half = self.group // 2
        values = torch.cat((low.view(*codes.shape[:-1], -1, half), high.view(*codes.shape[:-1], -1, half)), dim=-1).to(
            torch.float32
        )
        assert self.bias is not None
        return (values * scale.unsqueeze(-1) + self.bias[index].unsqueeze(-1)).flatten(-2)

    def dequantize(self) -> torch.Tensor:
        """The float32 matrix, as the reference de-quantizer gives it."""
        lib = load_kernels()
        if lib is None:
            return self.rows(torch.arange(self.shape[0]))
        out = torch.empty(self.shape, dtype=torch.float32)
        threads = torch.get_num_threads()
        if self.layout == "q4":
            assert self.bias is not None
            lib.q4_dequantize(
                _ptr(self.codes), _ptr(self.scale), _ptr(self.bias), self.shape[0], self.shape[1], _ptr(out), threads
            )
        else:
            lib.q8_dequantize(
                _ptr(self.codes), _ptr(self.scale), self.group, self.shape[0], self.shape[1], _ptr(out), threads
            )
        return out

    def matmul(self, x: torch.Tensor, lib: ctypes.CDLL) -> torch.Tensor:
        """``x @ W.T`` for float32 ``x [M, cols]``: int8 products of block-quantized ``x`` (see
        ``cpu_kernels.c``), or a float32 GEMM on a de-quantized copy for large ``M``."""
        rows, (out_rows, cols) = x.shape[0], self.shape
        if rows >= DEQUANTIZED_GEMM_ROWS and out_rows * cols <= DEQUANTIZED_GEMM_MAX_WEIGHTS:
            return F.linear(x, self.dequantize())
        x = x.contiguous()
        out = torch.empty(rows, out_rows, dtype=torch.float32)
        threads = torch.get_num_threads()
        if self.layout == "q4":
            assert self.bias is not None
            status = lib.q4_linear(
                _ptr(x), rows, cols, _ptr(self.codes), _ptr(self.scale), _ptr(self.bias), out_rows, _ptr(out), threads
            )
        else:
            status = lib.q8_linear(
                _ptr(x), rows, cols, _ptr(self.codes), _ptr(self.scale), self.group, out_rows, _ptr(out), threads
            )
        if status != 0:
            raise MemoryError(f"no memory for the int8 copy of a [{rows}, {cols}] input to a quantized linear")
        return out


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


@dataclass(frozen=True, slots=True, eq=False)
class QuantizedLinear:
    """``x @ W.T + bias`` over quantized ``parts`` stacked by rows (a merged q/k/v whose parts differ in
    type, as in Q4_K_M files, keeps one part per layout)."""

    parts: tuple[QuantizedWeight, ...]
    bias: torch.Tensor | None
    lib: ctypes.CDLL

    @classmethod
    def build(cls, weights: list[QuantizedWeight], bias: torch.Tensor | None) -> QuantizedLinear:
        lib = load_kernels()
        assert lib is not None, "quantized linears need the CPU kernels (see keeps_quantized)"
        parts: list[QuantizedWeight] = []
        run: list[QuantizedWeight] = []
        for weight in weights:
            if run and not run[0].same_layout(weight):
                parts.append(run[0] if len(run) == 1 else QuantizedWeight.concat(run))
                run = []
            run.append(weight)
        parts.append(run[0] if len(run) == 1 else QuantizedWeight.concat(run))
        return cls(tuple(parts), bias, lib)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise TypeError(f"quantized CPU linears take float32 activations, got {x.dtype}")
        outs = [part.matmul(x, self.lib) for part in self.parts]
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return out if self.bias is None else out + self.bias


def keeps_quantized(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether GGUF weights stay quantized on this device: float32 on a CPU the kernels run on."""
    return device.type == "cpu" and dtype == torch.float32 and load_kernels() is not None
