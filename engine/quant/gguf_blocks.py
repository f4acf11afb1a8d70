"""GGUF tensor blocks -> the ``q4``/``q8`` layouts of ``cpu_linear.py``, or float32 for the other types.

What each kept type becomes, and why the decoded weights equal the reference de-quantizer's:

- Q4_0 (d, 32 x 4-bit q): ``q4``, scale ``d``, bias ``-8d``; ``d*q - 8d`` is exact in float32.
- Q4_1 (d, m, 32 x 4-bit q): ``q4``, scale ``d``, bias ``m``.
- Q4_K (256-weight super-blocks, eight 32-weight sub-blocks with 6-bit scale and min): ``q4`` with
  scale ``d*sc`` and bias ``-dmin*m`` per sub-block (both products exact in float32).
- Q8_0 (d, 32 x int8): ``q8``, groups of 32.
- Q6_K (256-weight super-blocks, sixteen 16-weight sub-blocks with int8 scales, 6-bit q): ``q8`` codes
  ``q - 32`` with scale ``d*sc`` per 16 weights (8 bits held per 6-bit weight, exact).

In each case a weight is ``round(code * scale + bias)`` with ``code * scale`` exact, which is also
what gguf's de-quantizer computes, so both give the same float32 weight.
"""

from __future__ import annotations

import numpy as np
import torch
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.quant.cpu_linear import QuantizedWeight, pair_groups

KEPT_QUANTIZED = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")
DEQUANTIZED = ("F32", "F16", "BF16", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K")
SUPPORTED = KEPT_QUANTIZED + DEQUANTIZED


def check_type(name: str, type_name: str) -> None:
    if type_name not in SUPPORTED:
        raise ModelLoadError(
            f"GGUF tensor {name!r} has type {type_name}, which this engine does not read; supported: "
            f"{', '.join(SUPPORTED)} ({', '.join(KEPT_QUANTIZED)} are kept quantized on the CPU)"
        )


def decode_quantized(name: str, type_name: str, data: np.ndarray, rows: int, cols: int) -> QuantizedWeight:
    """``data``: the tensor's raw block bytes (``rows`` rows of ``cols`` weights)."""
    blocks = np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)
    decoder = _DECODERS[type_name]
    layout, codes, scale, bias, group = decoder(blocks, rows, cols)
    for label, values in (("scale", scale), ("min", bias)):
        if values is not None and not np.isfinite(values).all():
            bad = int((~np.isfinite(values)).sum())
            raise ModelLoadError(f"GGUF tensor {name!r} ({type_name}) has {bad} non-finite block {label}(s)")
    packed = torch.from_numpy(np.ascontiguousarray(codes))
    return QuantizedWeight(
        layout,
        type_name,
        pair_groups(packed).contiguous() if layout == "q4" else packed,
        torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32)),
        None if bias is None else torch.from_numpy(np.ascontiguousarray(bias, dtype=np.float32)),
        group,
    )


def check_finite(name: str, type_name: str, array: np.ndarray) -> None:
    """De-quantized (or float) tensors: a NaN/inf is a corrupt block, not a weight."""
    if not np.isfinite(array).all():
        bad = int((~np.isfinite(array)).sum())
        raise ModelLoadError(f"GGUF tensor {name!r} ({type_name}) holds {bad} non-finite value(s)")


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)[..., 0]


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """``[..., 32]`` 4-bit values -> ``[..., 16]`` bytes, low nibble = value j, high = value j + 16."""
    packed: np.ndarray = q[..., :16] | (q[..., 16:] << np.uint8(4))
    return packed


Decoded = tuple[str, np.ndarray, np.ndarray, "np.ndarray | None", int]


def _q4_0(blocks: np.ndarray, rows: int, cols: int) -> Decoded:
    b = blocks.reshape(rows, cols // 32, 18)
    d = _f16(b[..., 0:2])
    return "q4", b[..., 2:].reshape(rows, -1), d, -8 * d, 32


def _q4_1(blocks: np.ndarray, rows: int, cols: int) -> Decoded:
    b = blocks.reshape(rows, cols // 32, 20)
    return "q4", b[..., 4:].reshape(rows, -1), _f16(b[..., 0:2]), _f16(b[..., 2:4]), 32


def _q8_0(blocks: np.ndarray, rows: int, cols: int) -> Decoded:
    b = blocks.reshape(rows, cols // 32, 34)
    return "q8", b[..., 2:].reshape(rows, cols).view(np.int8), _f16(b[..., 0:2]), None, 32


def _q4_k(blocks: np.ndarray, rows: int, cols: int) -> Decoded:
    from gguf.quants import Q4_K

    n = rows * (cols // 256)
    b = blocks.reshape(n, 144)
    d, dmin = _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None]
    sc, m = Q4_K.get_scale_min(b[:, 4:16])
    qs = b[:, 16:].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & np.uint8(0x0F)).reshape(n, 8, 32)
    scale = (d * sc.astype(np.float32)).reshape(rows, -1)
    bias = -(dmin * m.astype(np.float32)).reshape(rows, -1)
    return "q4", _pack_nibbles(q).reshape(rows, -1), scale, bias, 32


def _q6_k(blocks: np.ndarray, rows: int, cols: int) -> Decoded:
    n = rows * (cols // 256)
    b = blocks.reshape(n, 210)
    ql, qh, scales, d = b[:, :128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])[:, None]
    low = ql.reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    low = (low & np.uint8(0x0F)).reshape(n, 2, 4, 32)
    high = qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    high = (high & np.uint8(0x03)).reshape(n, 2, 4, 32)
    q = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
    scale = (d * scales.view(np.int8).astype(np.float32)).reshape(rows, -1)
    return "q8", q.reshape(rows, cols), scale, None, 16


_DECODERS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q6_K": _q6_k}
