"""Which plain int arguments of each launched Triton kernel are specialized by value.

Triton compiles a kernel again for every new value class of a specialized int (== 1, divisible by
16). An argument that varies per request or per step must be unspecialized (or a bucketed constexpr),
otherwise a request with a new shape waits for a compile. This lists the specialized non-pointer
arguments straight from the JIT objects, so adding a per-step one shows up here.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from triton.runtime.jit import JITFunction

# module -> kernel -> non-pointer arguments that stay specialized: per-model constants (strides,
# matrix sizes), values always in one class (tokens_per_split: a multiple of the 16+ token tile) and
# floats (Triton never specializes floats by value).
_SPECIALIZED = {
    "omni_gateway.kernels.paged_decode": {
        "_decode_split_kernel": {"qk_scale", "tokens_per_split", "stride_cache_block", "stride_cache_tok"},
        "_decode_reduce_kernel": set(),
    },
    "omni_gateway.kernels.paged_prefill": {"_prefill_kernel": {"qk_scale", "stride_cache_block", "stride_cache_tok"}},
    "omni_gateway.kernels.gemv": {"_gemv_kernel": {"N", "K", "eps"}},
    "omni_gateway.kernels.quant_gemv": {"_gemv_kernel": {"N", "K", "stride_xm", "k_per_split", "eps"}},
    "omni_gateway.kernels.quant_gemm": {
        "_dequant_gemm_kernel": {"N", "K", "stride_xm"},
        "_quant_rows_kernel": {"K", "stride_xm"},
        "_dequant_kernel": {"N", "K"},
    },
    "omni_gateway.kernels.norm": {"_rms_norm_kernel": {"eps"}},
    "omni_gateway.kernels.rotary": {
        "_rotary_kernel": {"stride_q", "stride_k"},
        "_rotary_write_kv_kernel": {"stride_q", "stride_k", "stride_v"},
    },
    "omni_gateway.kernels.activation": {"_silu_and_mul_kernel": set()},
    "omni_gateway.kernels.argmax": {"_chunk_max_kernel": set(), "_row_max_kernel": set()},
    # SLOTS: the engine's max_loras.
    "omni_gateway.kernels.lora": {"_shrink_kernel": {"stride_x"}, "_expand_kernel": {"stride_y", "SLOTS"}},
}


def _jit(kernel: Any) -> JITFunction:
    """The compiled form of ``kernel``; under the interpreter, rebuilt from its function and options."""
    if isinstance(kernel, JITFunction):
        return kernel
    return JITFunction(kernel.fn, do_not_specialize=kernel.kwargs.get("do_not_specialize"))


def _specialized(kernel: Any) -> set[str]:
    return {
        p.name
        for p in _jit(kernel).params
        if not p.is_constexpr and not p.do_not_specialize and not p.name.endswith("_ptr")
    }


@pytest.mark.parametrize(
    ("module", "name"), [(module, name) for module, kernels in _SPECIALIZED.items() for name in kernels]
)
def test_only_per_model_ints_are_specialized(module: str, name: str) -> None:
    kernel = getattr(importlib.import_module(module), name)
    assert _specialized(kernel) == _SPECIALIZED[module][name]


def test_per_step_counts_are_unspecialized() -> None:
    decode = importlib.import_module("omni_gateway.kernels.paged_decode")
    prefill = importlib.import_module("omni_gateway.kernels.paged_prefill")
    unspecialized = {p.name for p in _jit(decode._decode_split_kernel).params if p.do_not_specialize}
    assert unspecialized == {"max_blocks", "num_splits"}
    assert {p.name for p in _jit(prefill._prefill_kernel).params if p.do_not_specialize} == {"num_seqs", "max_blocks"}


def test_tokens_per_split_stays_in_one_specialization_class() -> None:
    """Left specialized, tokens_per_split must never change class (== 1, divisible by 16) between steps."""
    attention = importlib.import_module("omni_gateway.kernels.attention_config")
    configs = [
        attention.gpu_decode_config(132, batch, 8, context, head_dim=head_dim, element_size=element_size)
        for batch in (1, 3, 16, 64, 256)
        for element_size in (1, 2)
        for context in (16, 1000, 8192, 131072)
        for head_dim in (64, 128, 256)
    ]
    for config in configs:
        for batch in (1, 5, 64):
            for context in (1, 17, 500, 4096, 100_000):
                _, per_split = attention.num_decode_splits(batch, 8, context, config)
                assert per_split > 1 and per_split % 16 == 0, (config, batch, context, per_split)
