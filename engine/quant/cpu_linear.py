"""Quantized weight matrices held as their codes and group scales, and the linears that run on them.

Two layouts cover the GGUF types read here (see ``gguf_blocks.py``):

- ``q4``: 4-bit codes ``c`` in 32-weight groups, ``w = c * scale + bias`` (Q4_0, Q4_1, Q4_K); a group
  is 16 bytes (low nibbles = weights 0..15, high = 16..31), and the bytes of each pair of groups are
  interleaved (``pair_groups``), which lets the kernel unpack two groups from one 32-byte load;
- ``q8``: int8 codes, ``w = c * scale`` per ``group`` weights (Q8_0 with groups of 32, Q6_K of 16).

Every product ``c * scale`` is exact in float32 for these types, so a decoded weight is bit for bit
the float32 value the reference de-quantizer gives. The linears take their input as ``Activations``:
the float32 rows and, where the int16 kernels of ``cpu_kernels.c`` run, their block-quantized codes,
made once per input and shared by every part of a linear (see that file for the error bound).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

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
        codes = group_major(codes)
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

    @property
    def float_gemm_rows(self) -> int:
        """From how many input rows (prefill chunks) the product is a float32 GEMM on a de-quantized copy."""
        out_features, in_features = self.shape
        return DEQUANTIZED_GEMM_ROWS if out_features * in_features <= DEQUANTIZED_GEMM_MAX_WEIGHTS else sys.maxsize


def pair_groups(codes: torch.Tensor) -> torch.Tensor:
    """q4 codes ``[..., groups * 16]``, one group after another -> the kernel's layout: the 16 bytes of
    groups ``2i`` and ``2i + 1`` interleaved byte by byte (an odd last group stays as it is)."""
    head, tail = _split_pairs(codes)
    paired = head.unflatten(-1, (-1, 2, 16)).transpose(-1, -2).flatten(-3)
    return torch.cat((paired, tail), dim=-1)


def group_major(codes: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pair_groups``."""
    head, tail = _split_pairs(codes)
    return torch.cat((head.unflatten(-1, (-1, 16, 2)).transpose(-1, -2).flatten(-3), tail), dim=-1)


def _split_pairs(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    paired = codes.shape[-1] // 32 * 32
    return codes[..., :paired], codes[..., paired:]


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def activation_bytes(rows: int, cols: int) -> int:
    """Size of the quantized activations of ``[rows, cols]`` floats: int16 codes, two floats per 32."""
    return rows * cols * 2 + rows * (cols // 32) * 8


@dataclass(frozen=True, slots=True)
class Activations:
    """Input rows of a quantized linear: float32 ``values [M, K]`` and, unless every part of the linear
    runs a float GEMM for ``M`` rows, ``codes`` (the int16 block quantization the kernels read)."""

    values: torch.Tensor
    codes: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class _Part:
    """One weight of a linear with its kernel arguments bound: ``columns`` of the output it writes."""

    weight: QuantizedWeight
    columns: slice
    float_gemm_rows: int
    kernel: Callable[..., None]
    arguments: tuple[int, ...]  # the weight's pointers (and group) after the input's, before the output's


@dataclass(frozen=True, slots=True, eq=False)
class QuantizedLinear:
    """``x @ W.T + bias`` over quantized ``parts`` stacked by rows (a merged q/k/v whose parts differ in
    type, as in Q4_K_M files, keeps one part per layout; all of them read one quantized input)."""

    parts: tuple[QuantizedWeight, ...]
    bias: torch.Tensor | None
    lib: ctypes.CDLL
    _bound: tuple[_Part, ...] = field(repr=False)
    in_features: int
    out_features: int
    codes_below: int  # inputs of fewer rows are quantized for the integer kernels

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
        bound, start = [], 0
        for part in parts:
            rows = part.shape[0]
            if part.layout == "q4":
                assert part.bias is not None
                kernel, arguments = lib.q4_linear, (_ptr(part.codes), _ptr(part.scale), _ptr(part.bias), rows)
            else:
                kernel, arguments = lib.q8_linear, (_ptr(part.codes), _ptr(part.scale), part.group, rows)
            bound.append(_Part(part, slice(start, start + rows), part.float_gemm_rows, kernel, arguments))
            start += rows
        codes_below = max(p.float_gemm_rows for p in bound)
        return cls(tuple(parts), bias, lib, tuple(bound), parts[0].shape[1], start, codes_below)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply(self.activations(x))

    def _codes_buffer(self, rows: int) -> torch.Tensor | None:
        """Room for ``rows`` rows' int16 codes where this linear's kernels read codes at that many rows."""
        if rows >= self.codes_below:
            return None
        return torch.empty(activation_bytes(rows, self.in_features), dtype=torch.uint8)

    def _check(self, x: torch.Tensor) -> None:
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.in_features:
            raise TypeError(
                f"quantized CPU linears take float32 [rows, {self.in_features}] activations, "
                f"got {x.dtype} {list(x.shape)}"
            )

    def activations(self, x: torch.Tensor) -> Activations:
        """``x`` with its codes where this linear's kernels need them."""
        self._check(x)
        x = x.contiguous()
        rows = x.shape[0]
        codes = self._codes_buffer(rows)
        if codes is None:
            return Activations(x, None)
        self.lib.quantize(_ptr(x), rows, self.in_features, _ptr(codes), torch.get_num_threads())
        return Activations(x, codes)

    def add_rms_norm(
        self, x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> Activations:
        """``residual += x`` in place (unless ``x`` is None), then ``RMSNorm(residual) * weight`` as this
        linear's input: one C call for the norm and the quantization of its output."""
        self._check(residual)
        assert residual.is_contiguous() and weight.dtype == torch.float32 and weight.is_contiguous()
        rows = residual.shape[0]
        out = torch.empty_like(residual)
        codes = self._codes_buffer(rows)
        if x is not None:
            self._check(x)
            x = x.contiguous()
        self.lib.add_rms_norm(
            None if x is None else _ptr(x),
            _ptr(residual),
            _ptr(weight),
            eps,
            rows,
            self.in_features,
            _ptr(out),
            None if codes is None else _ptr(codes),
            torch.get_num_threads(),
        )
        return Activations(out, codes)

    def silu_mul(self, gate_up: torch.Tensor) -> Activations:
        """``silu(gate) * up`` of ``gate_up = cat(gate, up)`` as this linear's input (down_proj's), made
        and quantized in one C call."""
        rows = gate_up.shape[0]
        if gate_up.dtype != torch.float32 or gate_up.shape != (rows, 2 * self.in_features):
            raise TypeError(
                f"silu_mul takes float32 [rows, {2 * self.in_features}] gate/up rows, "
                f"got {gate_up.dtype} {list(gate_up.shape)}"
            )
        gate_up = gate_up.contiguous()
        out = torch.empty(rows, self.in_features, dtype=torch.float32)
        codes = self._codes_buffer(rows)
        self.lib.silu_mul(
            _ptr(gate_up),
            rows,
            self.in_features,
            _ptr(out),
            None if codes is None else _ptr(codes),
            torch.get_num_threads(),
        )
        return Activations(out, codes)

    def apply(self, x: Activations) -> torch.Tensor:
        rows = x.values.shape[0]
        if len(self._bound) == 1 and x.codes is None:
            return F.linear(x.values, self.parts[0].dequantize(), self.bias)
        out = torch.empty(rows, self.out_features, dtype=torch.float32)
        threads = torch.get_num_threads()
        for part in self._bound:
            if rows >= part.float_gemm_rows or x.codes is None:
                out[:, part.columns] = F.linear(x.values, part.weight.dequantize())
            else:
                part.kernel(
                    _ptr(x.codes),
                    rows,
                    self.in_features,
                    *part.arguments,
                    _ptr(out) + part.columns.start * 4,
                    self.out_features,
                    threads,
                )
        return out if self.bias is None else out.add_(self.bias)


def keeps_quantized(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether GGUF weights stay quantized on this device: float32 on a CPU the kernels run on."""
    return device.type == "cpu" and dtype == torch.float32 and load_kernels() is not None
