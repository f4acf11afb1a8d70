"""The HiFi-GAN vocoder of a Hugging Face ``VitsModel`` over a padded batch, each row as if it ran alone.

Alone, every convolution of a row sees zeros past the row's end (its padding). In a padded batch the
frames past a shorter row's end are zero only at the vocoder's input: the first convolution's bias
makes them non-zero, and the following convolutions would carry that into the row's last samples.
So the same layers run here with the frames past each row's end zeroed before every convolution,
which keeps each row's samples those of the row alone (up to float rounding).

A long batch is decoded in windows of frames (``decode_window``), each with enough frames of context on
either side to cover the vocoder's receptive field, so its samples are those of the whole decode; between
windows the caller may run other work (a batch of first clauses) on the same model. Every window of a
given size is decoded from the same number of frames (zeros, masked, stand in past either end of the
spectrogram): on a GPU each new input shape makes cuDNN plan every convolution again, which cost a
short batch 100-200 ms on an H200, so the shapes a vocoder sees should be few (``window_frames``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def decode_masked(decoder: Any, spectrogram: Any, frames: Any, conditioning: Any | None = None, first: int = 0) -> Any:
    """Waveforms ``(batch, samples)`` of ``spectrogram`` ``(batch, bins, max frames)`` whose rows are
    ``frames`` long (a tensor of lengths) and start at frame ``first`` (the frames before it are padding
    too), with ``decoder`` a ``transformers`` ``VitsHifiGan``."""
    import torch
    from torch.nn import functional

    keeps: dict[int, torch.Tensor] = {}  # one mask per upsampling stage, not one per convolution

    def zero_past_end(hidden: torch.Tensor) -> torch.Tensor:
        length = hidden.shape[-1]
        if length not in keeps:
            scale = length // spectrogram.shape[-1]  # the upsampling so far
            positions = torch.arange(length, device=hidden.device)[None, :]
            keep = (positions >= first * scale) & (positions < (frames * scale)[:, None])
            keeps[length] = keep[:, None, :].to(hidden.dtype)
        return hidden * keeps[length]

    slope = decoder.config.leaky_relu_slope
    hidden = decoder.conv_pre(zero_past_end(spectrogram))
    if conditioning is not None:
        hidden = hidden + decoder.cond(conditioning)
    for i in range(decoder.num_upsamples):
        hidden = decoder.upsampler[i](zero_past_end(functional.leaky_relu(hidden, slope)))
        total = None
        for block in decoder.resblocks[i * decoder.num_kernels : (i + 1) * decoder.num_kernels]:
            state = hidden
            for conv1, conv2 in zip(block.convs1, block.convs2):
                residual = state
                state = conv1(zero_past_end(functional.leaky_relu(state, block.leaky_relu_slope)))
                state = conv2(zero_past_end(functional.leaky_relu(state, block.leaky_relu_slope)))
                state = state + residual
            total = state if total is None else total + state
        hidden = total / decoder.num_kernels
    # the vocoder's last activation uses torch's default slope, as the model's own forward does
    hidden = decoder.conv_post(zero_past_end(functional.leaky_relu(hidden)))
    return torch.tanh(hidden).squeeze(1)


def receptive_frames(decoder: Any) -> int:
    """Spectrogram frames on either side of a frame that reach its samples through ``decoder``'s
    convolutions (rounded up, plus one frame of margin): the context a window needs."""

    def reach(conv: Any) -> int:  # samples either side, at the convolution's own rate
        return int(conv.dilation[0]) * (int(conv.kernel_size[0]) - 1) // 2

    frames = float(reach(decoder.conv_pre))
    scale = 1
    for i, upsampler in enumerate(decoder.upsampler):
        # a transposed convolution's output sample reads ceil(kernel / stride) inputs either side at most
        frames += math.ceil(upsampler.kernel_size[0] / upsampler.stride[0]) / scale
        scale *= int(upsampler.stride[0])
        blocks = decoder.resblocks[i * decoder.num_kernels : (i + 1) * decoder.num_kernels]
        frames += max(sum(reach(a) + reach(b) for a, b in zip(blk.convs1, blk.convs2)) for blk in blocks) / scale
    frames += reach(decoder.conv_post) / scale
    return math.ceil(frames) + 1


def window_frames(frames: int, rows: int, row_frames: int, smallest: int = 16) -> int:
    """The window for a batch of ``rows`` rows and ``frames`` frames: ``row_frames`` frames over the rows
    (a power of two per row, at least ``smallest``), or the power of two that holds the whole batch
    when that is shorter. A batch's windows then take a few sizes, whatever its lengths."""
    per_row = max(smallest, 1 << max(row_frames // max(rows, 1), 1).bit_length() - 1)
    whole = max(smallest, 1 << max(frames - 1, 0).bit_length())
    return min(per_row, whole)


def decode_window(
    decoder: Any,
    spectrogram: Any,
    frames: Any,
    conditioning: Any | None,
    start: int,
    window: int,
    context: int,
    run: Callable[[Any, Any, Any | None, int], Any] | None = None,
) -> Any:
    """The samples ``(batch, (stop - start) * upsampling)`` of frames ``start:stop`` of ``decode_masked``'s
    waveform, where ``stop`` is ``start + window`` or the spectrogram's end. They are decoded from
    ``window + 2 * context`` frames (masked zeros stand in past either end): with ``context`` at least
    ``receptive_frames(decoder)`` they equal the whole decode's, up to float rounding. ``run`` decodes
    the window's frames as ``decode_masked`` would (arguments after ``decoder``), e.g. from a CUDA graph."""
    import torch
    from torch.nn import functional

    total = spectrogram.shape[-1]
    if not 0 <= start < total or window < 1 or context < 0:
        raise ValueError(
            f"decode_window: expected 0 <= start < {total} frames, window >= 1 and context >= 0; "
            f"got start {start}, window {window}, context {context}"
        )
    lo, hi = start - context, start + window + context
    piece = spectrogram[..., max(lo, 0) : min(hi, total)]
    piece = functional.pad(piece, (max(-lo, 0), max(hi - total, 0)))
    upsampling = math.prod(int(u.stride[0]) for u in decoder.upsampler)
    inside = torch.clamp(frames - lo, 0, hi - lo)
    first = max(-lo, 0)
    if run is None:
        wave = decode_masked(decoder, piece, inside, conditioning, first)
    else:
        wave = run(piece, inside, conditioning, first)
    stop = min(start + window, total)
    return wave[:, context * upsampling : (context + stop - start) * upsampling]


def detach_vocoder(model: Any) -> Any:
    """Take the vocoder out of ``model`` (a ``VitsModel``), whose forward then stops at the spectrogram
    (its waveform output is a placeholder), and return it for ``decode_masked``."""
    import torch

    class _NoVocoder(torch.nn.Module):
        def forward(self, spectrogram: torch.Tensor, conditioning: torch.Tensor | None = None) -> torch.Tensor:
            return spectrogram.new_zeros(spectrogram.shape[0], 1, 1)

    vocoder = model.decoder
    model.decoder = _NoVocoder()
    return vocoder
