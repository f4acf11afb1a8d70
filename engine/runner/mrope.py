"""Multimodal rotary positions (M-RoPE, Qwen2-VL): one position per rotary axis (time, height, width).

Text tokens carry the same position on all three axes. A media span brings its own per-axis offsets
(``EmbedSpan.positions``, relative to the span's first token, negative ones included); the text after
it resumes one past the position of the span's last token, so a span of ``length`` tokens may advance the
position by less than ``length``. That shift carries over to every later token, the generated ones included.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from omni_gateway.engine.core.sequence import EmbedSpan


def span_advance(span: EmbedSpan) -> int:
    """How far the text position moves past a span: one beyond its last token's largest axis position.

    For a picture or video the last token holds the largest position of all; a Qwen2.5-Omni video with
    its audio interleaved ends with its end markers, whose position decides where the text resumes."""
    if span.positions is None:
        return span.length
    return int(span.positions[:, -1].max()) + 1


def text_shift(spans: Iterable[EmbedSpan]) -> int:
    """Position minus token index of text after every span (all three axes agree there): a decoded token's
    rotary position is its index plus this."""
    return sum(span_advance(span) - span.length for span in spans if span.positions is not None)


def mrope_positions(spans: Iterable[EmbedSpan], start: int, end: int) -> torch.Tensor:
    """int64 ``[3, end - start]`` positions of token indices ``[start, end)`` of one sequence."""
    pos = torch.arange(start, end, dtype=torch.int64).repeat(3, 1)
    shift = 0  # position minus token index, for text after the spans seen so far
    for span in sorted(spans, key=lambda s: s.offset):
        if span.positions is None:
            continue
        rel = span.positions
        if tuple(rel.shape) != (3, span.length):
            raise ValueError(
                f"span at {span.offset} has positions of shape {tuple(rel.shape)}; expected (3, {span.length})"
            )
        lo, hi = max(span.offset, start), min(span.offset + span.length, end)
        if lo < hi:
            base = span.offset + shift
            pos[:, lo - start : hi - start] = base + rel[:, lo - span.offset : hi - span.offset].to(torch.int64)
        new_shift = shift + span_advance(span) - span.length
        tail = max(span.offset + span.length, start)
        if tail < end and new_shift != shift:
            pos[:, tail - start :] += new_shift - shift
        shift = new_shift
    return pos
