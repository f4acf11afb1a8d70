"""Copies between the host and a CUDA device that make no other thread's launches wait.

A copy from the device into pageable host memory is synchronous in the driver: it waits for everything
queued on its stream, and meanwhile the launches of other threads, on other streams, wait too (an engine
step launched beside a 60 ms token2wav call started on the device only when that call's copy returned;
``benchmarks/host_copy_stall.py``). Into pinned memory the copy is queued like a kernel, and the wait is a
stream synchronization, which holds no one else up. The other way, a copy from pageable memory first waits
for the kernels queued on its stream; from pinned memory it does not.
"""

from __future__ import annotations

from typing import Any

import torch


def to_device(values: list[Any] | torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list or tensor on ``device`` as ``dtype``, queued without waiting for the device (through
    pinned memory on CUDA)."""
    if not isinstance(values, torch.Tensor):
        return _upload(torch.tensor(values, dtype=dtype), device)
    return values.to(dtype) if values.device == device else _upload(values.to(dtype), device)


def _upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def to_host(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """``tensors`` (all on one device) on the host, with one wait for the current stream however many there
    are. From CUDA they land in pinned memory (a non-blocking copy to the host allocates its result pinned)."""
    if not tensors or tensors[0].device.type != "cuda":
        return [t.cpu() for t in tensors]
    copies = [t.to("cpu", non_blocking=True) for t in tensors]
    torch.cuda.current_stream(tensors[0].device).synchronize()
    return copies
