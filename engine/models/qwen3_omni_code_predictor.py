"""Qwen3-Omni's code predictor: given the talker's state and a frame's first code, the frame's other codebooks.

A small dense Qwen3 decoder (q/k norms, plain rotary positions) over at most ``num_code_groups`` positions:
position 0 is the talker's final-normed hidden state of the step that chose the first code, position 1 that
code's talker embedding, position ``g`` (``g >= 2``) the embedding of codebook ``g - 1``'s code in the
predictor's own table ``g - 2``. The output at position ``g`` (``g >= 1``) is read by head ``g - 1`` and gives
codebook ``g``'s code. ``predict`` runs this for a batch of frames of different sequences at once, with its own
tiny key/value tensors (every frame is at the same step, so no padding), and returns the codes and the sum of
the residual codebooks' embeddings, which (with the first code's embedding and the text row) is the talker's
next input.

Sampled codes are ``argmax(probs / E)`` with ``E ~ Exp(1)``, as the engine's sampler draws. A row with a seed takes
its noise from ``engine.runner.seeded_noise``: codebook ``g`` of frame ``f`` draws under the key
``row_key(row_key(seed, f), g)``, a function of those three alone, so a seeded utterance speaks the same codes
whatever else shares the batch. The other rows draw from torch's generator.

Weights: the checkpoint's ``talker.code_predictor.*`` tensors without that prefix, and the talker's codec
embedding (``talker.model.codec_embedding.weight``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from omni_gateway.engine.runner.seeded_noise import exponential_rows, row_key
from omni_gateway.kernels.host_copies import to_device


@dataclass(frozen=True, slots=True)
class CodePredictorConfig:
    num_code_groups: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int
    rms_norm_eps: float
    rope_theta: float

    @classmethod
    def from_hf(cls, cfg: Any) -> CodePredictorConfig:
        heads = int(cfg.num_attention_heads)
        groups = int(cfg.num_code_groups)
        window = getattr(cfg, "sliding_window", None)
        sliding = "sliding_attention" in list(getattr(cfg, "layer_types", None) or ())
        if sliding and window is not None and int(window) < groups:
            raise ValueError(f"code predictor's sliding window {window} is shorter than its {groups} positions")
        rope = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
        return cls(
            num_code_groups=groups,
            hidden_size=int(cfg.hidden_size),
            num_heads=heads,
            num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
            num_layers=int(cfg.num_hidden_layers),
            rms_norm_eps=float(cfg.rms_norm_eps),
            rope_theta=float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))),
        )


@dataclass(frozen=True, slots=True)
class FrameSampling:
    """How the residual codes are chosen: greedy at temperature 0, else top-k/top-p sampling."""

    temperature: float = 0.0
    top_k: int = 50
    top_p: float = 0.8


@dataclass(frozen=True, slots=True)
class _Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class CodePredictor:
    def __init__(
        self,
        config: CodePredictorConfig,
        weights: dict[str, torch.Tensor],
        talker_embedding: torch.Tensor,
        *,
        device: Any,
        dtype: torch.dtype,
    ) -> None:
        self.config = c = config
        self.device = torch.device(device)
        self.dtype = dtype

        def w(name: str) -> torch.Tensor:
            return weights[name].to(device=self.device, dtype=dtype).contiguous()

        self.talker_embedding = talker_embedding.to(device=self.device, dtype=dtype)
        residual = range(c.num_code_groups - 1)
        self.embeddings = [w(f"model.codec_embedding.{g}.weight") for g in residual]
        self.heads = [w(f"lm_head.{g}.weight") for g in residual]
        self.layers = []
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            self.layers.append(
                _Layer(
                    input_norm=w(p + "input_layernorm.weight"),
                    qkv=torch.cat([w(f"{a}{n}_proj.weight") for n in "qkv"]),
                    q_norm=w(a + "q_norm.weight"),
                    k_norm=w(a + "k_norm.weight"),
                    o=w(a + "o_proj.weight"),
                    post_norm=w(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]),
                    down=w(p + "mlp.down_proj.weight"),
                )
            )
        self.final_norm = w("model.norm.weight")
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        freqs = torch.arange(c.num_code_groups, dtype=torch.float32)[:, None] * inv_freq
        table = torch.cat((freqs, freqs), dim=-1)
        self.cos = table.cos().to(device=self.device, dtype=dtype)
        self.sin = table.sin().to(device=self.device, dtype=dtype)
        if self.talker_embedding.shape[1] != c.hidden_size:
            raise ValueError(
                f"the talker's codec embedding is {self.talker_embedding.shape[1]} wide, "
                f"the code predictor {c.hidden_size}: Qwen3-Omni feeds one to the other unprojected"
            )

    def _forward(self, x: torch.Tensor, start: int, cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """``x``: ``[B, n, hidden]`` at positions ``start..start+n``; ``cache`` per layer, extended in place."""
        c = self.config
        batch, n = x.shape[:2]
        heads, kv_heads, d = c.num_heads, c.num_kv_heads, c.head_dim
        cos, sin = self.cos[start : start + n], self.sin[start : start + n]
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.input_norm, c.rms_norm_eps)
            q, k, v = F.linear(h, layer.qkv).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
            q = _rotate(_rms_norm(q.view(batch, n, heads, d), layer.q_norm, c.rms_norm_eps).transpose(1, 2), cos, sin)
            k = _rotate(
                _rms_norm(k.view(batch, n, kv_heads, d), layer.k_norm, c.rms_norm_eps).transpose(1, 2), cos, sin
            )
            v = v.view(batch, n, kv_heads, d).transpose(1, 2)
            if i < len(cache):
                k, v = torch.cat((cache[i][0], k), dim=2), torch.cat((cache[i][1], v), dim=2)
                cache[i] = (k, v)
            else:
                cache.append((k, v))
            if heads != kv_heads:
                k, v = k.repeat_interleave(heads // kv_heads, dim=1), v.repeat_interleave(heads // kv_heads, dim=1)
            # A prefill's queries see the positions up to their own; a later single query sees all of the cache.
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=n > 1)
            x = x + F.linear(attn.transpose(1, 2).reshape(batch, n, heads * d), layer.o)
            gate, up = F.linear(_rms_norm(x, layer.post_norm, c.rms_norm_eps), layer.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        return _rms_norm(x[:, -1], self.final_norm, c.rms_norm_eps)

    @torch.inference_mode()
    def predict(
        self,
        hidden: torch.Tensor,
        first_codes: torch.Tensor,
        sampling: FrameSampling = FrameSampling(),
        seeds: Sequence[tuple[int, int] | None] = (),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden``: ``[B, hidden]`` talker states, ``first_codes``: ``[B]`` the codes the talker chose from them.
        ``seeds``: per row, ``(seed, frame number)`` for codes drawn from those alone, or None (and rows past the
        end) for fresh ones. Returns the residual codes ``[B, num_code_groups - 1]`` and their embeddings' sum
        ``[B, hidden]``."""
        first_codes = first_codes.to(self.device)
        x = torch.stack((hidden.to(device=self.device, dtype=self.dtype), self.talker_embedding[first_codes]), dim=1)
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        codes, total = [], torch.zeros(x.shape[0], self.config.hidden_size, device=self.device, dtype=self.dtype)
        noise = _FrameNoise(seeds, self.device) if sampling.temperature > 0 else None
        start = 0
        for g, head in enumerate(self.heads):
            out = self._forward(x, start, cache)
            start += x.shape[1]
            logits = F.linear(out, head).float()
            code = logits.argmax(dim=-1) if noise is None else noise.choose(_probs(logits, sampling), g)
            embedded = self.embeddings[g][code]
            codes.append(code)
            total = total + embedded
            x = embedded[:, None]
        return torch.stack(codes, dim=1), total


class _FrameNoise:
    """The Exp(1) noise of one frame's draws. The seeded rows' frame keys go up to the device in one copy; each
    codebook's keys are mixed from them there, so the draws wait for the device at no point."""

    def __init__(self, seeds: Sequence[tuple[int, int] | None], device: torch.device) -> None:
        seeded = [(i, row_key(*entry)) for i, entry in enumerate(seeds) if entry is not None]
        self._seeded: tuple[torch.Tensor, torch.Tensor] | None = None  # rows [n], their frame keys [n, 1]
        if seeded:
            rows, keys = to_device(seeded, torch.int64, device).split(1, dim=1)
            self._seeded = (rows.squeeze(1), keys)

    def choose(self, probs: torch.Tensor, codebook: int) -> torch.Tensor:
        """Each row's draw from ``probs`` for ``codebook`` (0 for the frame's second code, and so on)."""
        noise = torch.empty_like(probs).exponential_()
        if self._seeded is not None:
            rows, keys = self._seeded
            noise.index_copy_(0, rows, exponential_rows(row_key(keys, codebook), probs.shape[1]))
        return (probs / noise).argmax(dim=-1)


def _probs(logits: torch.Tensor, sampling: FrameSampling) -> torch.Tensor:
    """The distribution a sampled code is drawn from: temperature, then top-k, then top-p."""
    logits = logits / sampling.temperature
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        drop = cumulative - torch.softmax(ordered, dim=-1) > sampling.top_p  # keep the first token past top_p
        logits = logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    return torch.softmax(logits, dim=-1)
