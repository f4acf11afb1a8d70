"""Triton kernels are tested on the CPU through Triton's interpreter when no GPU is present.

The interpreter is chosen when ``@triton.jit`` decorates a function, so TRITON_INTERPRET must be
set before the kernel modules are imported; modules an earlier test already imported compiled
are reloaded. Only Triton reads the variable, so torch-only tests are unaffected.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

_TRITON_MODULES = (
    "omni_gateway.kernels.paged_attention",
    "omni_gateway.kernels.kv_cache",
    "omni_gateway.kernels.norm",
    "omni_gateway.kernels.rotary",
    "omni_gateway.kernels.activation",
    "omni_gateway.kernels.argmax",
    "omni_gateway.kernels.row_fusion",  # before the kernels that call its helpers
    "omni_gateway.kernels.gemv",
    "omni_gateway.kernels.quant_tiles",  # before the kernel that calls its helpers
    "omni_gateway.kernels.quant_gemv",
    "omni_gateway.kernels.quant_gemm",
    "omni_gateway.kernels.quant_linear",
)

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    for _name in _TRITON_MODULES:
        if _name in sys.modules:
            importlib.reload(sys.modules[_name])

# Relative error bounds against a float64 reference (METHOD: fp32 far under 1e-3; 16-bit
# operands between 1e-3 and 1e-2).
_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 5e-3}


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not torch.isnan(out).any(), "output holds NaN"
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def _poison(like: torch.Tensor) -> None:
    """Leave NaN in freed device memory so an output element the kernel never wrote shows up."""
    if like.device.type == "cuda":
        garbage = torch.full((like.numel() * 4,), float("nan"), dtype=like.dtype, device=like.device)
        del garbage


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def tolerance() -> dict[torch.dtype, float]:
    return dict(_TOLERANCE)


@pytest.fixture
def rel_err():
    return _rel_err


@pytest.fixture
def poison():
    return _poison
