"""Argument checks shared by the Triton launchers.

Triton kernels index raw pointers, so a wrong layout, dtype or device silently reads garbage or
faults; every launcher validates its arguments first and raises ValueError naming what it expected
and what arrived.
"""

from __future__ import annotations

import os

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# A paged KV cache holds the activation dtype, or float8_e4m3fn (``--kv-cache-dtype fp8``).
KV_CACHE_DTYPES = (*FLOAT_DTYPES, torch.float8_e4m3fn)


def interpreting() -> bool:
    """True when Triton runs its CPU interpreter (TRITON_INTERPRET=1) instead of compiling."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_tensor(
    name: str,
    t: torch.Tensor,
    *,
    ndim: int,
    dtypes: tuple[torch.dtype, ...],
    device: torch.device | None = None,
    contiguous: bool = True,
) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d) for d in dtypes)
        raise ValueError(f"{name}: expected dtype in ({allowed}), got {t.dtype}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()} for shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if t.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"{name}: Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 on the CPU), got device {t.device}"
        )


def check_token_rows(
    name: str, t: torch.Tensor, *, dtypes: tuple[torch.dtype, ...], device: torch.device | None = None
) -> None:
    """A ``[T, H, D]`` tensor whose per-token rows are contiguous; the token stride may be anything,
    so column slices of a fused QKV projection are accepted without a copy."""
    check_tensor(name, t, ndim=3, dtypes=dtypes, device=device, contiguous=False)
    if t.stride(2) != 1 or (t.shape[1] > 1 and t.stride(1) != t.shape[2]):
        raise ValueError(
            f"{name}: expected [T, H, D] with contiguous [H, D] rows per token, got shape "
            f"{tuple(t.shape)} with strides {t.stride()}"
        )


def check_same_dtype(dtype: torch.dtype, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.dtype != dtype:
            raise ValueError(f"{name}: expected dtype {dtype} (matching the other operands), got {t.dtype}")


def check_cache_dtype(dtype: torch.dtype, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Both caches hold ``dtype`` (the activations') or both float8_e4m3fn."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype not in (dtype, torch.float8_e4m3fn) or t.dtype != k_cache.dtype:
            raise ValueError(
                f"{name}: expected dtype {dtype} (the activations') or torch.float8_e4m3fn for both caches, "
                f"got k_cache {k_cache.dtype} and v_cache {v_cache.dtype}"
            )


def check_dim(name: str, actual: int, expected: int, what: str) -> None:
    if actual != expected:
        raise ValueError(f"{name}: expected {what} = {expected}, got {actual}")


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
