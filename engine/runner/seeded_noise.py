"""Exponential noise for requests with a seed, drawn for every seeded row of a step in one batch of calls.

A seeded request's draws must not depend on what else shares its step. A generator per request gives that,
but costs two calls per row and step (its row of noise, then the draw), each of which gives up the
interpreter lock and waits to take it back on a busy server. Here each row's noise is a counter-based hash
instead: the 32-bit key of (seed, draw number) is made on the host, and one pass of integer mixing over
``key + column`` on the device turns it into uniforms and then into Exp(1) noise, whatever the number of
rows. Integer values stay below 2**63 at every step (32-bit values times 31-bit multipliers), so the
arithmetic is exact on every device.
"""

from __future__ import annotations

from typing import TypeVar

import torch

_T = TypeVar("_T", int, torch.Tensor)

_MASK = 0xFFFFFFFF
# Odd multipliers below 2**31 (a product with a 32-bit value never leaves int64's range), with
# xor-shifts between them: a 32-bit finalizer in the style of MurmurHash3's.
_MUL_A, _MUL_B = 0x7FEB352D, 0x2C1B3C6D
_COLUMN_STEP = 0x61C88647  # spreads neighbouring columns apart before mixing
_UNIFORM_BITS = 24  # float32 holds every 24-bit integer: uniforms strictly inside (0, 1)


def _mix(x: _T) -> _T:
    """The 32-bit finalizer, on a Python int or elementwise on an int64 tensor of 32-bit values alike."""
    x = x ^ (x >> 16)
    x = (x * _MUL_A) & _MASK
    x = x ^ (x >> 15)
    x = (x * _MUL_B) & _MASK
    return x ^ (x >> 16)


def row_key(seed: _T, draw: int) -> _T:
    """The 32-bit key of a request's ``draw``-th noise row (0, 1, ...) under ``seed`` (any Python int, or
    elementwise an int64 tensor of seeds: a key taken as the seed of further draws is made on the device)."""
    folded = _mix(seed & _MASK) ^ _mix((seed >> 32) & _MASK)
    return _mix(folded ^ _mix(draw & _MASK))


def exponential_rows(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 ``[len(keys), vocab]`` Exp(1) noise, row i a function of ``keys[i]`` (int64 ``[n, 1]``) alone."""
    columns = torch.arange(vocab, device=keys.device, dtype=torch.int64) * _COLUMN_STEP
    x = _mix((keys + columns) & _MASK)
    uniform = ((x >> (32 - _UNIFORM_BITS)).float() + 0.5) * 2.0**-_UNIFORM_BITS
    return -torch.log(uniform)
