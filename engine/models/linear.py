"""The model's linear layer: a weight, its bias and the kernels that multiply by it (the backend's
``linear``, oneDNN's prepacked copy on the CPU, the fused one-row kernel of the batch-1 decode), or a
quantized weight (engine/quant) that brings its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def onednn_prepacks(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether linear weights get a copy reordered once into oneDNN's blocked layout (float32 on the CPU).

    MKL's sgemm repacks the weight on every call; from two rows up that costs about as much as the
    product itself. On a 2-core EPYC (one thread, batch 16) the prepacked oneDNN matmul ran the
    decoder layers ~1.15x and the 49k-row LM head ~2x faster. For a single row MKL's matrix-vector
    path stayed ~1.2x faster on the decoder layers, so they keep their plain weight for it too.
    """
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


@dataclass(frozen=True, slots=True)
class Linear:
    """``x @ weight.T + bias`` through ``kernel`` (the backend's ``linear``); inputs of at least
    ``packed_rows`` rows use ``packed``, the oneDNN copy, instead. ``row`` is the one-row kernel with
    the batch-1 decode fusions (kernels/row_fusion.py), None where the weight's format has none."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    kernel: Callable[..., torch.Tensor]
    packed: torch.Tensor | None = None
    packed_rows: int = 1
    row: Callable[..., Any] | None = None
    # ``row`` reads and adds into the float32 rows of kernels/int4_row_stream.py (``into``) and takes ``rotary``
    # (a qkv projection that finishes the attention's input): LlamaModel.row_stream
    row_streams: bool = False

    @classmethod
    def build(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        kernel: Callable[..., torch.Tensor],
        *,
        prepack: bool,
        packed_rows: int = 1,
        row: Callable[..., torch.Tensor] | None = None,
    ) -> Linear:
        if not isinstance(weight, torch.Tensor):  # a quantized weight (engine/quant) brings its own kernels
            row_kernel = getattr(weight, "row_kernel", None)
            row = row_kernel() if row_kernel is not None else None
            streams = row is not None and getattr(weight, "row_streams", False)
            return cls(weight, bias, weight.kernel(), row=row, row_streams=streams)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight) if prepack else None
        return cls(weight, bias, kernel, packed, packed_rows, None if prepack else row)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.shape[0] >= self.packed_rows:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return self.kernel(x, self.weight, self.bias)

    def fused(self, x: Any, **fusion: Any) -> Any:
        """One row through ``row`` with ``fusion`` (``norm_weight``/``eps``, ``residual``, ``gated``,
        ``out_dtype``, and where ``row_streams`` ``into`` and ``rotary``): a ``[1, N]`` tensor, or the row added
        into."""
        assert self.row is not None, "this linear has no fused one-row kernel"
        return self.row(x, self.weight, self.bias, **fusion)
