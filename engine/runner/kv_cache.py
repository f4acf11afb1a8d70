"""The paged KV cache's size (how many blocks the memory budget holds) and its zeroed allocation."""

from __future__ import annotations

import mmap

import torch
from omni_gateway.engine.config import EngineConfig

_CPU_DEFAULT_KV_BYTES = 1 << 30


def decide_num_blocks(
    config: EngineConfig,
    device: torch.device,
    block_bytes: int,
    max_blocks_per_seq: int,
    vocab_size: int,
) -> int:
    """The configured block count, else as many blocks of ``block_bytes`` as the budget holds (capped at what
    ``max_num_seqs`` sequences of the longest length need)."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    needed = config.max_num_seqs * max_blocks_per_seq + 1
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        # Room for activations: the step's hidden states several times over, plus sampling buffers.
        reserve = (512 << 20) + config.max_num_seqs * vocab_size * 4 * 4
        budget = int(total * config.gpu_memory_utilization) - (total - free) - reserve
    else:
        budget = config.kv_cache_bytes or _CPU_DEFAULT_KV_BYTES
    blocks = min(budget // block_bytes, needed)
    if blocks < 2:
        raise ValueError(
            f"KV cache budget of {budget} bytes holds {blocks} blocks of {block_bytes} bytes; "
            "need at least 2 (raise kv_cache_bytes or gpu_memory_utilization)"
        )
    return int(blocks)


def zeroed(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``torch.zeros``; on the CPU over an anonymous mapping, whose pages read as zeros and become
    resident only once written, so an idle server does not hold its whole KV cache in RSS."""
    if device.type != "cpu":
        return torch.zeros(shape, device=device, dtype=dtype)
    numel = 1
    for size in shape:
        numel *= size
    return torch.frombuffer(mmap.mmap(-1, numel * dtype.itemsize), dtype=dtype).view(shape)
