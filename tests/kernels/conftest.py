"""Triton kernels are tested on the CPU through Triton's interpreter when no GPU is present.

The interpreter is chosen when ``@triton.jit`` decorates a function, so TRITON_INTERPRET must be
set before Triton is first imported: a test module collected before this directory must import
Triton, and the kernel modules, inside its tests. Only Triton reads the variable, so torch-only
tests are unaffected.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    # Triton's own library (tl.zeros, tl.max, ...) is built when Triton is first imported: imported before
    # this point, it stays compiled and every interpreted kernel fails on its first call into it with
    # "Cannot call @triton.jit'd outside of the scope of a kernel". Say so once, here.
    import triton.language.standard as _standard

    if type(_standard.zeros).__name__ != "InterpretedFunction":
        raise pytest.UsageError(
            "Triton was imported before tests/kernels/conftest.py set TRITON_INTERPRET=1, so its library is "
            "compiled and the interpreted kernels cannot call it: a test module collected earlier imports "
            "Triton (or a kernels module) at module level; import it inside the test instead"
        )

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
