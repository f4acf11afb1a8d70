"""token2wav's BigVGAN vocoder with what its activations derive from their parameters computed once.

transformers' ``Qwen2_5OmniToken2WavBigVGANModel`` runs 109 anti-aliased snake activations a call (Qwen2.5-Omni's
shapes), and each one recomputes from its parameters what never changes: ``exp(alpha)``,
``1 / (exp(beta) + eps)`` and its upsampling filter times the ratio. That and the snake's separate products
make about 14 operations an activation, 1,840 a call, which on a GPU a chunk's call spends launching.
``FastVocoder`` keeps those constants and runs an activation in 8 (pad, upsample, the snake's product, sine,
square and multiply-add, pad, downsample). The weights are the model's own modules; the waveform equals
transformers' forward up to float rounding (``tests/omni/test_token2wav.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

_MIN_AMPLITUDE = math.exp(-115 / 20 * math.log(10))  # BigVGAN's mel floor (-115 dB), as a host number


@dataclass(frozen=True, slots=True)
class _Activation:
    """One anti-aliased snake activation: 2x upsample, ``x + sin(alpha x)^2 / beta``, 2x downsample."""

    up_filter: torch.Tensor  # [C, 1, K]: the filter times the ratio, one per channel
    up_pad: int
    up_stride: int
    up_keep: tuple[int, int]
    alpha: torch.Tensor  # [1, C, 1]: exp(alpha)
    inv_beta: torch.Tensor  # [1, C, 1]: 1 / (exp(beta) + eps)
    down_filter: torch.Tensor  # [C, 1, K]
    down_pad: tuple[int, int]
    down_stride: int

    @classmethod
    def of(cls, module: Any) -> _Activation:
        up, snake, down = module.upsample, module.act, module.downsample
        channels = snake.alpha.shape[0]
        with torch.no_grad():
            return cls(
                up_filter=(up.ratio * up.filter).expand(channels, -1, -1).contiguous(),
                up_pad=int(up.pad),
                up_stride=int(up.stride),
                up_keep=(int(up.pad_left), int(up.pad_right)),
                alpha=torch.exp(snake.alpha)[None, :, None],
                inv_beta=(1.0 / (torch.exp(snake.beta) + snake.no_div_by_zero))[None, :, None],
                down_filter=down.filter.expand(channels, -1, -1).contiguous(),
                down_pad=(int(down.pad_left), int(down.pad_right)),
                down_stride=int(down.stride),
            )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        channels = x.shape[1]
        x = F.pad(x, (self.up_pad, self.up_pad), mode="replicate")
        x = F.conv_transpose1d(x, self.up_filter, stride=self.up_stride, groups=channels)
        x = x[..., self.up_keep[0] : x.shape[-1] - self.up_keep[1]]
        x = torch.addcmul(x, self.inv_beta, torch.sin(x * self.alpha).square())
        x = F.pad(x, self.down_pad, mode="replicate")
        return F.conv1d(x, self.down_filter, stride=self.down_stride, groups=channels)


class FastVocoder:
    """``vocoder`` (transformers' BigVGAN, eval mode) from mel ``[B, mel_dim, frames]`` to ``[B, samples]`` on
    the device (no copy to the host), with its mel floor as a host number: the call captures into a CUDA graph."""

    def __init__(self, vocoder: Any) -> None:
        self.vocoder = vocoder
        self._blocks = [
            [(_Activation.of(a1), c1, _Activation.of(a2), c2) for c1, c2, a1, a2 in _units(block)]
            for block in vocoder.resblocks
        ]
        self._post = _Activation.of(vocoder.activation_post)

    def __call__(self, mel: torch.Tensor) -> torch.Tensor:
        v = self.vocoder
        db = 20 * torch.log10(torch.clamp(torch.exp(mel), min=_MIN_AMPLITUDE)) - 20
        x = v.conv_pre(v.normalize_spectrogram(db, 1, -115))
        per_layer = v.num_residual_blocks
        for i in range(v.num_upsample_layers):
            x = v.ups[i][0](x)
            outputs = [self._block(units, x) for units in self._blocks[i * per_layer : (i + 1) * per_layer]]
            total = outputs[0]
            for out in outputs[1:]:
                total = total + out
            x = total / per_layer
        x = v.conv_post(self._post(x))
        return torch.clamp(x, min=-1.0, max=1.0)[:, 0]

    @staticmethod
    def _block(units: list[tuple[_Activation, Any, _Activation, Any]], x: torch.Tensor) -> torch.Tensor:
        for act1, conv1, act2, conv2 in units:
            x = x + conv2(act2(conv1(act1(x))))
        return x


def _units(block: Any) -> list[tuple[Any, Any, Any, Any]]:
    """An AMP block's (conv1, conv2, act1, act2) in the order its forward runs them."""
    acts = list(block.activations)
    return list(zip(block.convs1, block.convs2, acts[::2], acts[1::2]))
