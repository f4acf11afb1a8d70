"""Qwen3-Omni's code2wav: a frame's codes (one per codebook) -> 24 kHz waveform, as plain tensors and functions.

It is causal end to end, which is what lets it stream:
- the codes of a frame are embedded (the mean of one embedding per codebook);
- a transformer whose every layer attends causally within a sliding window of ``sliding_window`` frames (the
  frame itself included), so a frame's output needs only the keys and values of the ``sliding_window - 1``
  frames before it, per layer (``Window``);
- an upsampling conv stack: causal convolutions (left zero padding) and transposed convolutions of kernel
  ``k`` and stride ``s`` whose output is trimmed by ``k - s`` on both sides. The decoder's (``k = 2s``) output
  ``m`` reads inputs ``m // s`` and ``m // s + 1``: one input sample ahead, never more. So the stack's output
  for ``n`` frames is the first ``samples(n)`` samples of its output for any longer input, a fixed ``lag``
  short of ``n * upsample``. Its left reach is fixed too (``reach`` samples), so decoding a chunk needs only a
  fixed number of frames on its left (``context_frames``).

Weights arrive under the checkpoint's names without the ``code2wav.`` prefix (see ``loader.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class Code2WavConfig:
    codebook_size: int
    num_quantizers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int
    sliding_window: int
    rope_theta: float
    rms_norm_eps: float
    upsampling_ratios: tuple[int, ...]  # transposed convs + ConvNeXt blocks after the transformer
    upsample_rates: tuple[int, ...]  # the decoder blocks' transposed convs
    decoder_dim: int

    @classmethod
    def from_hf(cls, cfg: Any) -> Code2WavConfig:
        heads = int(cfg.num_attention_heads)
        rope = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        return cls(
            codebook_size=int(cfg.codebook_size),
            num_quantizers=int(cfg.num_quantizers),
            hidden_size=int(cfg.hidden_size),
            num_heads=heads,
            num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
            num_layers=int(cfg.num_hidden_layers),
            sliding_window=int(cfg.sliding_window),
            rope_theta=float(theta),
            rms_norm_eps=float(cfg.rms_norm_eps),
            upsampling_ratios=tuple(int(r) for r in cfg.upsampling_ratios),
            upsample_rates=tuple(int(r) for r in cfg.upsample_rates),
            decoder_dim=int(cfg.decoder_dim),
        )

    @property
    def upsample(self) -> int:
        """Waveform samples per frame."""
        return math.prod(self.upsampling_ratios + self.upsample_rates)


# ---- the conv stack, as a list of steps ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Conv:  # causal: zero padding of (k - 1) * dilation on the left, stride 1
    weight: torch.Tensor
    bias: torch.Tensor
    dilation: int
    groups: int = 1

    @property
    def reach(self) -> int:
        return (self.weight.shape[-1] - 1) * self.dilation

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv1d(F.pad(x, (self.reach, 0)), self.weight, self.bias, dilation=self.dilation, groups=self.groups)


@dataclass(frozen=True, slots=True)
class _TransConv:  # kernel 2 * stride, its output trimmed by the stride on both sides
    weight: torch.Tensor
    bias: torch.Tensor
    stride: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = F.conv_transpose1d(x, self.weight, self.bias, stride=self.stride)
        trim = self.weight.shape[-1] - self.stride
        return out[..., trim : out.shape[-1] - trim]


@dataclass(frozen=True, slots=True)
class _Snake:  # x + sin(alpha x)^2 / beta, with exp(alpha) and 1 / (exp(beta) + eps) computed once
    alpha: torch.Tensor  # [1, C, 1]
    inv_beta: torch.Tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(x, self.inv_beta, torch.sin(x * self.alpha).square())


@dataclass(frozen=True, slots=True)
class _ConvNeXt:
    dwconv: _Conv
    norm: tuple[torch.Tensor, torch.Tensor]
    pw1: tuple[torch.Tensor, torch.Tensor]
    pw2: tuple[torch.Tensor, torch.Tensor]
    gamma: torch.Tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dwconv(x).transpose(1, 2)
        h = F.layer_norm(h, (h.shape[-1],), *self.norm, eps=1e-6)
        h = F.linear(F.gelu(F.linear(h, *self.pw1)), *self.pw2)
        return x + (self.gamma * h).transpose(1, 2)


@dataclass(frozen=True, slots=True)
class _Residual:
    act1: _Snake
    conv1: _Conv
    act2: _Snake
    conv2: _Conv

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


def _stack_samples(steps: list[Any], frames: int) -> int:
    length = frames
    for step in steps:
        if isinstance(step, _TransConv):  # (L - 1) * s + k, less the trims of k - s on both sides
            length = max(length * step.stride + step.stride - step.weight.shape[-1], 0)
    return length


def _stack_reach(steps: list[Any]) -> int:
    """How many output samples before an output sample the stack's earliest input for it lies."""
    reach = 0
    for step in steps:
        if isinstance(step, _TransConv):
            reach = reach * step.stride + step.stride - 1
        elif isinstance(step, _Conv):
            reach += step.reach
        elif isinstance(step, _ConvNeXt):
            reach += step.dwconv.reach
        elif isinstance(step, _Residual):
            reach += step.conv1.reach + step.conv2.reach
    return reach


# ---- the transformer --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    attn_scale: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    mlp_scale: torch.Tensor


@dataclass(slots=True)
class Window:
    """One utterance's transformer state: per layer the rotated keys and values of its last
    ``sliding_window - 1`` frames ``[kv_heads, <= window - 1, head_dim]``, and how many frames it has seen."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    frames: int = 0


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Code2Wav:
    """The model's tensors on one device; ``decode`` runs a whole utterance, ``step`` a chunk of several."""

    def __init__(self, config: Code2WavConfig, weights: dict[str, torch.Tensor], device: Any, dtype: torch.dtype):
        self.config = c = config
        self.device = torch.device(device)
        self.dtype = dtype

        def w(name: str) -> torch.Tensor:
            return weights[name].to(device=self.device, dtype=dtype).contiguous()

        def snake(prefix: str) -> _Snake:
            alpha, beta = w(prefix + "alpha"), w(prefix + "beta")
            return _Snake(torch.exp(alpha)[None, :, None], (1.0 / (torch.exp(beta) + 1e-9))[None, :, None])

        def conv(prefix: str, dilation: int = 1, groups: int = 1) -> _Conv:
            return _Conv(w(prefix + "conv.weight"), w(prefix + "conv.bias"), dilation, groups)

        def trans(prefix: str, stride: int) -> _TransConv:
            return _TransConv(w(prefix + "conv.weight"), w(prefix + "conv.bias"), stride)

        self.embedding = w("code_embedding.weight")
        self.offsets = torch.arange(c.num_quantizers, device=self.device) * c.codebook_size
        self.layers: list[_Layer] = []
        for i in range(c.num_layers):
            p = f"pre_transformer.layers.{i}."
            a = p + "self_attn."
            self.layers.append(
                _Layer(
                    input_norm=w(p + "input_layernorm.weight"),
                    qkv=torch.cat([w(f"{a}{n}_proj.weight") for n in "qkv"]),
                    o=w(a + "o_proj.weight"),
                    attn_scale=w(p + "self_attn_layer_scale.scale"),
                    post_norm=w(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]),
                    down=w(p + "mlp.down_proj.weight"),
                    mlp_scale=w(p + "mlp_layer_scale.scale"),
                )
            )
        self.final_norm = w("pre_transformer.norm.weight")
        self.inv_freq = 1.0 / (
            c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32, device=self.device) / c.head_dim)
        )
        steps: list[Any] = []
        for j, ratio in enumerate(c.upsampling_ratios):
            p = f"upsample.{j}."
            steps.append(trans(p + "0.", ratio))
            steps.append(
                _ConvNeXt(
                    dwconv=conv(p + "1.dwconv.", groups=c.hidden_size),
                    norm=(w(p + "1.norm.weight"), w(p + "1.norm.bias")),
                    pw1=(w(p + "1.pwconv1.weight"), w(p + "1.pwconv1.bias")),
                    pw2=(w(p + "1.pwconv2.weight"), w(p + "1.pwconv2.bias")),
                    gamma=w(p + "1.gamma"),
                )
            )
        steps.append(conv("decoder.0."))
        for j, rate in enumerate(c.upsample_rates):
            p = f"decoder.{j + 1}.block."
            steps += [snake(p + "0."), trans(p + "1.", rate)]
            for k, dilation in enumerate((1, 3, 9)):
                r = f"{p}{k + 2}."
                steps.append(
                    _Residual(snake(r + "act1."), conv(r + "conv1.", dilation), snake(r + "act2."), conv(r + "conv2."))
                )
        last = len(c.upsample_rates) + 1
        steps += [snake(f"decoder.{last}."), conv(f"decoder.{last + 1}.")]
        self.steps = steps
        self.reach = _stack_reach(steps)
        probe = 64
        self.lag = probe * c.upsample - _stack_samples(steps, probe)
        # Frames on a chunk's left whose conv outputs are thrown away: enough that the first kept sample's
        # reach, and the lag, stay inside them.
        self.context_frames = -(-(self.reach + self.lag) // c.upsample) + 1

    def samples(self, frames: int) -> int:
        """Waveform samples of ``frames`` frames decoded whole."""
        return _stack_samples(self.steps, frames)

    def new_window(self) -> Window:
        c = self.config
        empty = torch.empty(c.num_kv_heads, 0, c.head_dim, device=self.device, dtype=self.dtype)
        return Window([empty] * c.num_layers, [empty] * c.num_layers)

    # ---- stages -----------------------------------------------------------------------------------------

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, Q, T]`` codes -> ``[B, T, hidden]`` (the mean of the codebooks' embeddings)."""
        if codes.shape[1] != self.config.num_quantizers:
            raise ValueError(f"expected codes of {self.config.num_quantizers} codebooks, got {codes.shape[1]}")
        return F.embedding(codes.to(self.device) + self.offsets[None, :, None], self.embedding).mean(1)

    def transformer(self, x: torch.Tensor, windows: list[Window], lengths: list[int]) -> torch.Tensor:
        """``x``: ``[B, N, hidden]``, row ``b`` holding ``lengths[b]`` new frames of utterance ``b`` (the rest
        padding); its ``windows[b]`` are read and advanced. Returns the normed outputs ``[B, N, hidden]``."""
        c = self.config
        batch, n = x.shape[:2]
        heads, kv_heads, d = c.num_heads, c.num_kv_heads, c.head_dim
        q_pos = torch.stack([torch.arange(win.frames, win.frames + n, device=self.device) for win in windows])
        valid_q = torch.arange(n, device=self.device)[None, :] < torch.tensor(lengths, device=self.device)[:, None]
        freqs = q_pos[..., None].float() * self.inv_freq
        cos = torch.cat((freqs, freqs), -1).cos().to(self.dtype)[:, None]  # [B, 1, N, d]
        sin = torch.cat((freqs, freqs), -1).sin().to(self.dtype)[:, None]
        past = [win.keys[0].shape[1] for win in windows]
        width = max(past)
        # Key positions: each utterance's kept past frames, right-aligned to ``width``, then the new frames.
        k_pos = torch.full((batch, width + n), -(10**9), device=self.device, dtype=torch.long)
        for b, win in enumerate(windows):
            k_pos[b, width - past[b] : width] = torch.arange(win.frames - past[b], win.frames, device=self.device)
            k_pos[b, width : width + lengths[b]] = q_pos[b, : lengths[b]]
        rel = q_pos[:, :, None] - k_pos[:, None, :]
        mask = ((rel >= 0) & (rel < c.sliding_window))[:, None]  # [B, 1, N, S]
        # A padded query row still needs one key, or its softmax is all -inf (its output is thrown away).
        mask = mask | ~valid_q[:, None, :, None]
        kept = c.sliding_window - 1
        new_keys: list[list[torch.Tensor]] = [[] for _ in windows]
        new_values: list[list[torch.Tensor]] = [[] for _ in windows]
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.input_norm, c.rms_norm_eps)
            q, k, v = F.linear(h, layer.qkv).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
            q = _rotate(q.view(batch, n, heads, d).transpose(1, 2), cos, sin)
            k = _rotate(k.view(batch, n, kv_heads, d).transpose(1, 2), cos, sin)
            v = v.view(batch, n, kv_heads, d).transpose(1, 2)
            pk = torch.zeros(batch, kv_heads, width, d, device=self.device, dtype=self.dtype)
            pv = torch.zeros_like(pk)
            for b, win in enumerate(windows):
                if past[b]:
                    pk[b, :, width - past[b] :] = win.keys[i]
                    pv[b, :, width - past[b] :] = win.values[i]
                new_keys[b].append(
                    torch.cat((win.keys[i], k[b, :, : lengths[b]]), dim=1)[:, -kept:] if kept else k[b, :, :0]
                )
                new_values[b].append(
                    torch.cat((win.values[i], v[b, :, : lengths[b]]), dim=1)[:, -kept:] if kept else v[b, :, :0]
                )
            keys, values = torch.cat((pk, k), dim=2), torch.cat((pv, v), dim=2)
            if heads != kv_heads:
                keys = keys.repeat_interleave(heads // kv_heads, dim=1)
                values = values.repeat_interleave(heads // kv_heads, dim=1)
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + layer.attn_scale * F.linear(attn.transpose(1, 2).reshape(batch, n, heads * d), layer.o)
            h = _rms_norm(x, layer.post_norm, c.rms_norm_eps)
            gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
            x = x + layer.mlp_scale * F.linear(F.silu(gate) * up, layer.down)
        for b, win in enumerate(windows):
            win.keys, win.values = new_keys[b], new_values[b]
            win.frames += lengths[b]
        return _rms_norm(x, self.final_norm, c.rms_norm_eps)

    def vocode(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, T, hidden]`` transformer outputs -> ``[B, samples(T)]`` waveform in [-1, 1]."""
        x = hidden.transpose(1, 2)
        for step in self.steps:
            x = step(x)
        return x[:, 0].clamp(-1.0, 1.0)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """A whole utterance at once: ``[B, Q, T]`` codes -> ``[B, samples(T)]`` float32 waveforms."""
        x = self.embed(codes).to(self.dtype)
        windows = [self.new_window() for _ in range(codes.shape[0])]
        hidden = self.transformer(x, windows, [codes.shape[-1]] * codes.shape[0])
        return self.vocode(hidden).float()
