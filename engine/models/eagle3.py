"""The EAGLE-3 draft head, read from its Hugging Face checkpoint (``LlamaForCausalLMEagle3``).

Its layout, as published checkpoints and vLLM's ``llama_eagle3.py`` have it:

- ``fc.weight`` ``[hidden, 3 * target_hidden]`` fuses the target's hidden states of three layers into one row;
- one decoder layer ``midlayer.*`` whose q/k/v projections read ``2 * hidden`` features: the token embedding
  normed by ``midlayer.input_layernorm`` next to the hidden row normed by ``midlayer.hidden_norm``; the hidden
  row (or, with ``norm_before_residual``, its normed form) is the residual;
- ``norm.weight``, then ``lm_head.weight`` ``[draft_vocab, hidden]`` over a draft vocabulary whose id ``d``
  is target id ``d + d2t[d]`` (``t2d`` is the reverse mask, unused here);
- ``embed_tokens.weight`` may be absent: the head then shares the target's embedding.

At a position ``p`` the head reads the target's hidden row of ``p`` and the token at ``p + 1``, and predicts
the token at ``p + 2``; each further draft feeds back the head's own output before its final norm.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.models.rotary_table import rotary_cos_sin_cache

_LAYER = "midlayer."
_LAYER_ALIASES = ("layers.0.",)  # the speculators format's name for the same layer
ARCHITECTURES = frozenset({"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator"})


@dataclass(frozen=True, slots=True)
class Eagle3Config:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    norm_before_residual: bool
    # vLLM's ids: the residual stream entering each of these target layers (None: the target's default).
    aux_layer_ids: tuple[int, ...] | None
    hf_config: Any  # a transformers LlamaConfig, for the rotary table

    @classmethod
    def read(cls, directory: Path) -> Eagle3Config:
        from transformers import LlamaConfig

        path = directory / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"EAGLE-3 checkpoint {directory}: expected a config.json, found none")
        raw = json.loads(path.read_text())
        layer = dict(raw.get("transformer_layer_config") or raw)  # speculators nest the layer's config
        archs = set(raw.get("architectures") or [])
        if archs and not archs & ARCHITECTURES:
            raise ModelLoadError(
                f"EAGLE-3 checkpoint {directory}: architectures {sorted(archs)}, "
                f"expected one of {sorted(ARCHITECTURES)}"
            )
        for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
            if key not in layer:
                raise ModelLoadError(f"EAGLE-3 checkpoint {directory}: config.json lacks {key!r}")
        layer.pop("architectures", None)
        hf = LlamaConfig(**{k: v for k, v in layer.items() if k != "model_type"})
        heads = int(hf.num_attention_heads)
        eagle = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
        ids = raw.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
        hidden = int(hf.hidden_size)
        return cls(
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(getattr(hf, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(hf, "head_dim", None) or hidden // heads),
            intermediate_size=int(hf.intermediate_size),
            rms_norm_eps=float(hf.rms_norm_eps),
            vocab_size=int(hf.vocab_size),
            draft_vocab_size=int(raw.get("draft_vocab_size") or layer.get("draft_vocab_size") or hf.vocab_size),
            target_hidden_size=int(raw.get("target_hidden_size") or layer.get("target_hidden_size") or hidden),
            # vLLM reads a plain checkpoint's flag with default False (the speculators format's default is True).
            norm_before_residual=bool(raw.get("norm_before_residual", "speculators_config" in raw)),
            aux_layer_ids=tuple(int(i) for i in ids) if ids else None,
            hf_config=hf,
        )

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        inter = self.intermediate_size
        return {
            "fc.weight": (h, 3 * self.target_hidden_size),
            _LAYER + "input_layernorm.weight": (h,),
            _LAYER + "hidden_norm.weight": (h,),
            _LAYER + "post_attention_layernorm.weight": (h,),
            _LAYER + "self_attn.q_proj.weight": (q, 2 * h),
            _LAYER + "self_attn.k_proj.weight": (kv, 2 * h),
            _LAYER + "self_attn.v_proj.weight": (kv, 2 * h),
            _LAYER + "self_attn.o_proj.weight": (h, q),
            _LAYER + "mlp.gate_proj.weight": (inter, h),
            _LAYER + "mlp.up_proj.weight": (inter, h),
            _LAYER + "mlp.down_proj.weight": (h, inter),
            "norm.weight": (h,),
            "lm_head.weight": (self.draft_vocab_size, h),
        }


def read_eagle3_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the names of the module docstring (``model.`` prefixes dropped,
    ``layers.0.`` read as ``midlayer.``), from safetensors files or a ``pytorch_model.bin``."""
    files = sorted(directory.glob("*.safetensors"))
    raw: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for f in files:
            raw.update(load_file(str(f)))
    elif (directory / "pytorch_model.bin").is_file():
        raw = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ModelLoadError(f"EAGLE-3 checkpoint {directory}: no *.safetensors or pytorch_model.bin")
    weights = {}
    for name, tensor in raw.items():
        name = name.removeprefix("model.")
        for alias in _LAYER_ALIASES:
            if name.startswith(alias):
                name = _LAYER + name[len(alias) :]
        weights[name] = tensor
    return weights


def check_eagle3_weights(config: Eagle3Config, weights: dict[str, torch.Tensor]) -> None:
    """Raise ModelLoadError naming the first missing or misshapen tensor."""
    expected = dict(config.expected_shapes())
    if "embed_tokens.weight" in weights:
        expected["embed_tokens.weight"] = (config.vocab_size, config.hidden_size)
    if config.draft_vocab_size != config.vocab_size or "d2t" in weights:
        expected["d2t"] = (config.draft_vocab_size,)
    for name, shape in expected.items():
        if name not in weights:
            raise ModelLoadError(f"EAGLE-3 checkpoint lacks {name!r} (expected shape {list(shape)})")
        got = tuple(weights[name].shape)
        if got != shape:
            raise ModelLoadError(f"EAGLE-3 checkpoint: {name!r} has shape {list(got)}, expected {list(shape)}")


class Eagle3Cache:
    """One sequence's K/V of the head's layer at consecutive positions ``base .. base + length - 1``."""

    def __init__(self, num_kv_heads: int, head_dim: int, device: torch.device, dtype: torch.dtype) -> None:
        self.base = 0
        self.length = 0
        self.k = torch.empty((16, num_kv_heads, head_dim), device=device, dtype=dtype)
        self.v = torch.empty_like(self.k)

    def truncate(self, length: int) -> None:
        self.length = min(self.length, max(length, 0))

    def reset(self, base: int) -> None:
        self.base, self.length = base, 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``k``/``v`` ``[n, kv_heads, head_dim]``; every entry's K and V, these last."""
        end = self.length + k.shape[0]
        if end > self.k.shape[0]:
            size = max(end, 2 * self.k.shape[0])
            self.k = torch.cat([self.k[: self.length], self.k.new_empty((size - self.length, *k.shape[1:]))])
            self.v = torch.cat([self.v[: self.length], self.v.new_empty((size - self.length, *v.shape[1:]))])
        self.k[self.length : end] = k
        self.v[self.length : end] = v
        self.length = end
        return self.k[:end], self.v[:end]


class Eagle3Head:
    """The head's weights on one device, and its forward over one sequence's new rows."""

    def __init__(
        self,
        config: Eagle3Config,
        weights: dict[str, torch.Tensor],
        *,
        device: torch.device,
        dtype: torch.dtype,
        max_positions: int,
        shared_embedding: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        check_eagle3_weights(config, weights)
        self.config = c = config
        self.device, self.dtype = device, dtype

        def w(name: str) -> torch.Tensor:
            return weights[name].to(device=device, dtype=dtype).contiguous()

        self.fc = w("fc.weight")
        p = _LAYER
        self.input_norm = w(p + "input_layernorm.weight")
        self.hidden_norm = w(p + "hidden_norm.weight")
        self.post_norm = w(p + "post_attention_layernorm.weight")
        self.qkv = torch.cat([w(f"{p}self_attn.{n}_proj.weight") for n in ("q", "k", "v")])
        self.o = w(p + "self_attn.o_proj.weight")
        self.gate, self.up = w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")
        self.down = w(p + "mlp.down_proj.weight")
        self.norm = w("norm.weight")
        self.lm_head = w("lm_head.weight")
        d2t = weights.get("d2t")
        offsets = d2t.to(device=device, dtype=torch.int64) if d2t is not None else 0
        # Target id of each draft id.
        self.draft_to_target = torch.arange(c.draft_vocab_size, device=device) + offsets
        if "embed_tokens.weight" in weights:
            table = w("embed_tokens.weight")
            self.embed: Callable[[torch.Tensor], torch.Tensor] = lambda ids: F.embedding(ids, table)
        elif shared_embedding is not None:
            self.embed = lambda ids: shared_embedding(ids).to(dtype)
        else:
            raise ModelLoadError("EAGLE-3 checkpoint has no embed_tokens.weight and no target embedding was given")
        self.cos_sin = rotary_cos_sin_cache(c.hf_config, c.head_dim, max_positions).to(device)
        self.q_size, self.kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim

    def new_cache(self) -> Eagle3Cache:
        return Eagle3Cache(self.config.num_kv_heads, self.config.head_dim, self.device, self.dtype)

    def combine(self, aux_rows: torch.Tensor) -> torch.Tensor:
        """``[n, hidden]`` from the target's ``[n, 3, target_hidden]`` rows (layers in the checkpoint's order)."""
        rows = aux_rows.reshape(aux_rows.shape[0], -1).to(self.dtype)
        return rows @ self.fc.T

    def forward(
        self, token_ids: torch.Tensor, hidden: torch.Tensor, first_position: int, cache: Eagle3Cache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's rows for consecutive positions from ``first_position`` (the cache's next):
        ``token_ids`` ``[n]`` the token after each position, ``hidden`` ``[n, hidden]`` its hidden row.
        Appends their K/V to ``cache`` and returns (float32 draft logits ``[n, draft_vocab]``, the output
        before the final norm ``[n, hidden]``, which the next draft reads as its hidden row)."""
        return self.forward_batch(token_ids, hidden, [first_position], [int(token_ids.shape[0])], [cache])

    def forward_batch(
        self,
        token_ids: torch.Tensor,
        hidden: torch.Tensor,
        first_positions: list[int],
        counts: list[int],
        caches: list[Eagle3Cache],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` of several sequences in one pass: their rows concatenated in order (``counts[i]`` rows
        of sequence i from ``first_positions[i]`` over ``caches[i]``). The projections run over every row
        at once; attention runs over the caches padded to the longest, each row seeing its own sequence's
        entries up to its own."""
        c, eps = self.config, self.config.rms_norm_eps
        for first, cache in zip(first_positions, caches):
            if first != cache.base + cache.length:
                raise ValueError(f"rows from position {first}; the cache ends at {cache.base + cache.length}")
        n = token_ids.shape[0]
        if sum(counts) != n or len(counts) != len(caches):
            raise ValueError(f"{n} rows for sequences of {counts} rows over {len(caches)} caches")
        normed_hidden = _rms(hidden, self.hidden_norm, eps)
        residual = normed_hidden if c.norm_before_residual else hidden
        x = torch.cat([_rms(self.embed(token_ids), self.input_norm, eps), normed_hidden], dim=-1)
        q, k, v = (x @ self.qkv.T).split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        positions = torch.cat([torch.arange(f, f + m, device=self.device) for f, m in zip(first_positions, counts)])
        q = _rotate(q.view(n, c.num_heads, c.head_dim), self.cos_sin[positions])
        k = _rotate(k.view(n, c.num_kv_heads, c.head_dim), self.cos_sin[positions])
        v = v.view(n, c.num_kv_heads, c.head_dim)
        attn = self._attend(q, k, v, counts, caches).reshape(n, self.q_size)
        h = attn @ self.o.T + residual
        y = _rms(h, self.post_norm, eps)
        prenorm = (F.silu(y @ self.gate.T) * (y @ self.up.T)) @ self.down.T + h
        logits = (_rms(prenorm, self.norm, eps) @ self.lm_head.T).float()
        return logits, prenorm

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, counts: list[int], caches: list[Eagle3Cache]
    ) -> torch.Tensor:
        """``[n, heads, head_dim]``: each sequence's new rows over its cache (their K/V appended first)."""
        c, b = self.config, len(caches)
        pasts = [cache.length for cache in caches]
        entries = []
        offset = 0
        for cache, m in zip(caches, counts):
            entries.append(cache.append(k[offset : offset + m], v[offset : offset + m]))
            offset += m
        most_rows, most_keys = max(counts), max(p + m for p, m in zip(pasts, counts))
        qs = q.new_zeros((b, most_rows, c.num_heads, c.head_dim))
        ks = k.new_zeros((b, most_keys, c.num_kv_heads, c.head_dim))
        vs = torch.zeros_like(ks)
        offset = 0
        for i, ((keys, values), m) in enumerate(zip(entries, counts)):
            qs[i, :m] = q[offset : offset + m]
            ks[i, : len(keys)], vs[i, : len(values)] = keys, values
            offset += m
        group = c.num_heads // c.num_kv_heads
        ks, vs = ks.repeat_interleave(group, dim=2), vs.repeat_interleave(group, dim=2)
        # Row r of sequence i sees its entries up to its own (index pasts[i] + r); a padding row sees the
        # first entry only, so no row of the softmax is empty.
        row = torch.arange(most_rows, device=self.device)
        last = torch.tensor(pasts, device=self.device)[:, None] + row[None, :]
        pad = row[None, :] >= torch.tensor(counts, device=self.device)[:, None]
        last = torch.where(pad, torch.zeros_like(last), last)
        visible = torch.arange(most_keys, device=self.device)[None, None, :] <= last[:, :, None]
        out = F.scaled_dot_product_attention(
            qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2), attn_mask=visible.unsqueeze(1)
        ).transpose(1, 2)
        return torch.cat([out[i, :m] for i, m in enumerate(counts)])

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.draft_to_target[draft_ids]


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def _rotate(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """HF-Llama rotary (the two halves of each head) by ``cos_sin`` ``[n, head_dim]`` = cat(cos, sin)."""
    cos, sin = cos_sin.to(x.dtype).unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
