"""The HiFi-GAN vocoder of a Hugging Face ``VitsModel`` over a padded batch, each row as if it ran alone.

Alone, every convolution of a row sees zeros past the row's end (its padding). In a padded batch the
frames past a shorter row's end are zero only at the vocoder's input: the first convolution's bias
makes them non-zero, and the following convolutions would carry that into the row's last samples.
So the same layers run here with the frames past each row's end zeroed before every convolution,
which keeps each row's samples those of the row alone (up to float rounding).
"""

from __future__ import annotations

from typing import Any


def decode_masked(decoder: Any, spectrogram: Any, frames: Any, conditioning: Any | None = None) -> Any:
    """Waveforms ``(batch, samples)`` of ``spectrogram`` ``(batch, bins, max frames)`` whose rows are
    ``frames`` long (a tensor of lengths), with ``decoder`` a ``transformers`` ``VitsHifiGan``."""
    import torch
    from torch.nn import functional

    keeps: dict[int, torch.Tensor] = {}  # one mask per upsampling stage, not one per convolution

    def zero_past_end(hidden: torch.Tensor) -> torch.Tensor:
        length = hidden.shape[-1]
        if length not in keeps:
            scale = length // spectrogram.shape[-1]  # the upsampling so far
            positions = torch.arange(length, device=hidden.device)
            keeps[length] = (positions[None, :] < (frames * scale)[:, None])[:, None, :].to(hidden.dtype)
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
