"""What one reduction step of the decode-sized quantized linear (kernels/quant_gemv.py) computes, per
weight format:

- ``int4_row_step``, one row: 32-bit words of eight 4-bit weights (input features ``8j .. 8j + 7``). The
  reduction order does not matter, so nibble ``i`` of every word forms a plane against activations
  ``x[8j + i]``: the nibble is masked in place and ORed into the mantissa of 2^23 (exact float
  ``2^23 + q * 16^p``), one subtraction makes it ``q * 16^p`` and the activation carries the ``16^-p``.
  The zero point comes off per word through the activations' sum, the group scale multiplies once per
  word: three ALU operations per weight (mask-and-or, subtract, multiply-add; no int-to-float convert).
  With 2^23's bits in a register (``INT4_MAGIC``) each plane's mask is the LOP3's immediate. Even
  so, staged through a three-stage ``cp.async`` pipeline, the one-row int4 kernel saturated neither its
  issue slots nor DRAM (ncu on an H100: 56% and 42%): latency, not arithmetic, bound it. Its tuned
  launches now load the words straight into registers (one stage, no block barrier per step), 15% faster
  over the 8B shapes (kernels/quant_tuning.py).
- ``dot_tile``, 2+ rows: the ``[block_n, SUB]`` tile of unscaled weights for ``tl.dot`` (the raw FP8 value,
  or int4's ``1 + q / 16``, both exact in 16-bit floats), the scale of its partial sums and int4's offset,
  ``1 + zero / 16`` times the activations' sum.
"""

from __future__ import annotations

import triton
import triton.language as tl
from omni_gateway.kernels.row_fusion import norm_input

# The exponent bits of 2^23, passed to the kernel at run time as ``int4_row_step``'s ``magic``: as a
# compile-time constant the compiler re-materialized each nibble plane's mask with a MOV before its LOP3
# (about one extra instruction per int4 weight); held in a register it leaves the masks as the LOP3s'
# immediates.
INT4_MAGIC = 0x4B000000


@triton.jit
def int4_row_step(
    w_rows,
    x_ptr,
    s_ptr,
    z_ptr,
    norm_ptr,
    cols,
    col_ok,
    kb,
    K,
    magic,
    acc,
    squares,
    EVEN: tl.constexpr,
    GROUP: tl.constexpr,
    SUB: tl.constexpr,
    NORM: tl.constexpr,
):
    """One row against ``SUB`` input features of int4 words (inside one group): ``acc`` [block_n,
    SUB / 8] += scale * (sum_i q_i x_i - zero * sum_i x_i) per word; ``squares`` [1, SUB / 8] as
    ``norm_input``. ``magic`` holds the exponent bits of 2^23."""
    words_k = kb // 8 + tl.arange(0, SUB // 8)
    xk = kb + tl.arange(0, SUB // 8) * 8
    g = cols * (K // GROUP) + kb // GROUP
    if EVEN:
        words = tl.load(w_rows + words_k[None, :], eviction_policy="evict_first")
        zero = tl.load(z_ptr + g).to(tl.float32)
        scale = tl.load(s_ptr + g).to(tl.float32)
    else:
        in_k = words_k < K // 8
        words = tl.load(
            w_rows + words_k[None, :], mask=col_ok[:, None] & in_k[None, :], other=0, eviction_policy="evict_first"
        )
        ok = col_ok & ((cols * 0 + kb) < K)  # per feature: the interpreter rejects scalar masks
        zero = tl.load(z_ptr + g, mask=ok, other=0).to(tl.float32)
        scale = tl.load(s_ptr + g, mask=ok, other=0.0).to(tl.float32)
    high = words >> 12  # nibbles 5..7 land on bits 8..19, still inside the 23-bit mantissa
    part = tl.zeros(words.shape, tl.float32)
    x_sum = tl.zeros([1, SUB // 8], tl.float32)
    for i in tl.static_range(8):
        ks = xk[None, :] + i  # [1, SUB / 8]: the words' layout, so the planes need no conversion
        if EVEN:
            x = tl.load(x_ptr + ks).to(tl.float32)
        else:
            x = tl.load(x_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
        x, squares = norm_input(x, squares, norm_ptr, ks, ks < K, EVEN, NORM)
        x_sum += x
        if i < 5:
            bits = (words & (15 << (4 * i))) | magic
            x = x * (1.0 / (1 << (4 * i)))
        else:
            bits = (high & (15 << (4 * (i - 3)))) | magic
            x = x * (1.0 / (1 << (4 * (i - 3))))
        part += (bits.to(tl.float32, bitcast=True) - 8388608.0) * x  # (2^23 + q * 16^p) - 2^23, exact
    return acc + (part - zero[:, None] * x_sum) * scale[:, None], squares


@triton.jit
def int4_dot_features(kb, SUB: tl.constexpr):
    """The input features, in order, of the ``SUB`` columns of ``dot_tile``'s int4 tile at ``kb``: within
    each word's eight, column ``4a + 2b + c`` holds feature ``a + 2b + 4c``."""
    kk = tl.arange(0, SUB)
    return kb + (kk & ~7) + ((kk >> 2) & 1) + (kk & 2) + ((kk & 1) << 2)


@triton.jit
def _bf16_halves(pair):
    """The low and high 16 bits of each int32 of ``pair``, as bfloat16."""
    return pair.to(tl.int16).to(tl.bfloat16, bitcast=True), (pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def dot_tile(
    w_ptr,
    s_ptr,
    z_ptr,
    cols,
    col_ok,
    kb,
    K,
    like,
    EVEN: tl.constexpr,
    FORMAT: tl.constexpr,
    GROUP: tl.constexpr,
    SUB: tl.constexpr,
):
    """The ``[block_n, SUB]`` tile at ``kb`` of unscaled weights in the dtype of ``like``, the per-feature
    scale of its partial sums, and (int4) the offset to take off them per unit of the activations' sum:

    - FP8: the raw value, exact in 16-bit floats; offset 0.
    - int4: ``1 + q / 16`` (exact in bfloat16) with offset ``1 + zero / 16`` and the scale times 16, its
      columns in the order of ``int4_dot_features``. Each 32-bit word of eight weights becomes four
      bfloat16 pairs, one shift and one mask-and-or each: nibbles ``j`` and ``j + 4`` land on the top four
      mantissa bits of a pair of 1.0s. The pair stays whole into the tensor-core operand, which the column
      order arranges: about one ALU instruction a weight, where the plane kernel of one row
      (``int4_row_step``) spends three. The offset adds to the float32 sums' rounding: in float32
      throughout the result is within about 1e-6 of the exact product against 1e-7 for the planes (the
      nibble at the bottom of the mantissa of 128.0 gave 8 times that).
    """
    if FORMAT == 2:
        words_k = kb // 8 + tl.arange(0, SUB // 8)
        ptrs = w_ptr + cols.to(tl.int64)[:, None] * (K // 8) + words_k[None, :]
        g = cols * (K // GROUP) + kb // GROUP
        if EVEN:
            words = tl.load(ptrs, eviction_policy="evict_first")
            zero = tl.load(z_ptr + g).to(tl.float32)
            scale = tl.load(s_ptr + g).to(tl.float32)
        else:
            ok = col_ok & ((cols * 0 + kb) < K)
            words = tl.load(
                ptrs, mask=col_ok[:, None] & (words_k < K // 8)[None, :], other=0, eviction_policy="evict_first"
            )
            zero = tl.load(z_ptr + g, mask=ok, other=0).to(tl.float32)
            scale = tl.load(s_ptr + g, mask=ok, other=0.0).to(tl.float32)
        l0, h0 = _bf16_halves(((words << 3) & 0x00780078) | 0x3F803F80)
        l1, h1 = _bf16_halves(((words >> 1) & 0x00780078) | 0x3F803F80)
        l2, h2 = _bf16_halves(((words >> 5) & 0x00780078) | 0x3F803F80)
        l3, h3 = _bf16_halves(((words >> 9) & 0x00780078) | 0x3F803F80)
        # [.., a, b, c] holds nibble a + 2b + 4c: the last axis pairs each mask's two halves
        low = tl.join(tl.join(l0, l1), tl.join(l2, l3))
        high = tl.join(tl.join(h0, h1), tl.join(h2, h3))
        w = tl.reshape(tl.join(low, high), [cols.shape[0], SUB]).to(like.dtype)
        offset = 1.0 + zero * 0.0625
        scale *= 16.0
    else:
        ks = kb + tl.arange(0, SUB)
        ptrs = w_ptr + cols.to(tl.int64)[:, None] * K + ks[None, :]
        if EVEN:
            w = tl.load(ptrs, eviction_policy="evict_first")
        else:
            w = tl.load(ptrs, mask=col_ok[:, None] & (ks < K)[None, :], other=0.0, eviction_policy="evict_first")
        w = w.to(like.dtype)
        if FORMAT == 1:
            # block_n divides 128, so the program's features share one block row of scales.
            sp = s_ptr + (cols // GROUP) * tl.cdiv(K, GROUP) + kb // GROUP
            if EVEN:
                scale = tl.load(sp)
            else:
                scale = tl.load(sp, mask=col_ok & ((cols * 0 + kb) < K), other=0.0)
        else:
            scale = tl.full([cols.shape[0]], 1.0, tl.float32)
        offset = tl.zeros([cols.shape[0]], tl.float32)
    return w, scale, offset
