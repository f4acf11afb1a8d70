"""The rotary cos/sin table a decoder's positions index, built from its Hugging Face config."""

from __future__ import annotations

from typing import Any

import torch


def rotary_cos_sin_cache(
    hf_config: Any, head_dim: int, max_positions: int, freq_divisors: torch.Tensor | None = None
) -> torch.Tensor:
    """``[max_positions, head_dim]`` float32: cat(cos, sin) of each position's rotary angles, with
    the attention scaling of the config's rope type folded in (as HF does)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    if not params:  # configs from older transformers keep these as top-level attributes
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        base = float(params.get("rope_theta", 10000.0))
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        scaling = 1.0
    elif rope_type in ROPE_INIT_FUNCTIONS and rope_type != "dynamic":
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config)
    else:
        raise ValueError(f"unsupported rope type {rope_type!r}")
    if freq_divisors is not None:
        inv_freq = inv_freq / freq_divisors.float()
    freqs = torch.arange(max_positions, dtype=torch.float).unsqueeze(1) * inv_freq.float().unsqueeze(0)
    return torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)
