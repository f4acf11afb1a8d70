"""What one reduction step of the decode-sized quantized linear (kernels/quant_gemv.py) computes, per
weight format:

- ``int4_row_step``, one row: 32-bit words of eight 4-bit weights (input features ``8j .. 8j + 7``). The
  reduction order does not matter, so nibble ``i`` of every word forms a plane against activations
  ``x[8j + i]``: the nibble masked in place, read as a float32, is the subnormal ``q * 16^p * 2^-149``
  (exact), and the activation carries ``2^(64 - 4p)``, so one multiply-add adds ``q * x * 2^-85`` exactly:
  two ALU operations per weight (mask, multiply-add; no convert, no subtraction). The sums stay in units
  of 2^-85 until ``int4_row_total``; the zero point comes off per word through the activations' sum in
  the same units, the group scale multiplies once per word. GPUs multiply-add subnormal float32 at full
  rate, and Triton emits ``fma.rn.f32`` without ``.ftz``. The scaled activations overflow only past
  2^64, and products stay normal down to ``|q * x|`` of 2^-41. Compiled for sm_90 the loop issues 3.8-4.4
  instructions a weight against 5.1-5.9 for the 2^23 form (``python -m benchmarks.analysis.kernel_sass``). Loading the
  zero points and scales in the words' own layout instead of per feature (which passes them through shared
  memory, two block barriers per group) made Triton 3.6 lay the activations out per element: 9.4 a weight,
  and twice the time on an H100. Staged through a three-stage ``cp.async`` pipeline, an earlier form of this
  kernel saturated neither its issue slots nor DRAM (ncu on an H100: 56% and 42%): its tuned launches load
  the words straight into registers (one stage, no block barrier per step; kernels/quant_tuning.py).
- ``dot_tile``, 2+ rows: the ``[block_n, SUB]`` tile of unscaled weights for ``tl.dot`` (the raw FP8 value,
  or int4's ``1 + q / 16``, both exact in 16-bit floats), the scale of its partial sums and int4's offset,
  ``1 + zero / 16`` times the activations' sum.

Both int4 layouts (rows, and tiles of ``ROW_TILE`` rows: kernels/quant_reference.py) are read through one
address formula that splits into a part per output feature (``int4_row_start``) and a part per input
feature (``int4_k_offset``); the second holds within one scale group, which every read lies inside.
"""

from __future__ import annotations

import triton
import triton.language as tl
from omni_gateway.kernels.row_fusion import norm_input

# ``int4_row_step``'s plane p meets activations scaled by 2^(PLANE_SHIFT - 4p), so its products and sums are
# in units of 2^(PLANE_SHIFT - 149): 64 keeps both the scaled activations and the products far from float32's
# ends (overflow past 2^64, subnormal products below 2^-41).
PLANE_SHIFT = tl.constexpr(64)


@triton.jit
def int4_row_start(cols, K, GROUP: tl.constexpr, ROW_TILE: tl.constexpr, PER: tl.constexpr):
    """The int64 offsets [block_n] of output features ``cols``' first weights, in units of ``PER`` weights
    (8: int32 words, 2: bytes), in the int4 layout of ``ROW_TILE`` rows a tile (1: the row layout). With
    ``T = ROW_TILE`` and ``GU = GROUP / PER`` units a group, row n starts at ``(n // T) * T * K / PER +
    (n % T) * GU``, to which ``int4_k_offset`` adds the input features' part."""
    if ROW_TILE == 1:
        start = cols.to(tl.int64) * (K // PER)
    else:
        start = (cols // ROW_TILE).to(tl.int64) * (ROW_TILE * (K // PER)) + (cols % ROW_TILE) * (GROUP // PER)
    return start


@triton.jit
def int4_k_offset(kb, GROUP: tl.constexpr, ROW_TILE: tl.constexpr, PER: tl.constexpr):
    """The part of the int4 address that input feature ``kb`` (a multiple of ``PER``) adds to
    ``int4_row_start``'s, in units of ``PER`` weights: ``(kb // GROUP) * T * GU + (kb % GROUP) / PER``.
    The units after it are contiguous only up to the end of kb's group: a read must not cross one."""
    if ROW_TILE == 1:
        offset = kb // PER
    else:
        offset = (kb // GROUP) * (ROW_TILE * (GROUP // PER)) + (kb % GROUP) // PER
    return offset


@triton.jit
def int4_words(
    w_rows, col_ok, kb, K, EVEN: tl.constexpr, SUB: tl.constexpr, GROUP: tl.constexpr = 0, ROW_TILE: tl.constexpr = 1
):
    """The [block_n, SUB / 8] int4 words at input feature ``kb`` (``SUB`` features inside one group) of
    the weight rows ``w_rows`` (the words' pointer plus ``int4_row_start``; ``GROUP`` matters only to
    tiles), the one-row planes' and ``dot_tile``'s, read once (evict first); rows outside ``col_ok`` and
    words past ``K`` read as zeros."""
    words_k = kb // 8 + tl.arange(0, SUB // 8)
    ptrs = w_rows + (int4_k_offset(kb, GROUP, ROW_TILE, 8) + tl.arange(0, SUB // 8))[None, :]
    if EVEN:
        words = tl.load(ptrs, eviction_policy="evict_first")
    else:
        ok = col_ok[:, None] & (words_k < K // 8)[None, :]
        words = tl.load(ptrs, mask=ok, other=0, eviction_policy="evict_first")
    return words


@triton.jit
def int4_row_step(
    words,
    x_ptr,
    s_ptr,
    z_ptr,
    norm_ptr,
    cols,
    col_ok,
    kb,
    K,
    acc,
    squares,
    EVEN: tl.constexpr,
    GROUP: tl.constexpr,
    SUB: tl.constexpr,
    NORM: tl.constexpr,
):
    """One row against the ``SUB`` input features at ``kb`` (inside one group) of its int4 ``words``
    (``int4_words``): ``acc`` [block_n, SUB / 8] += scale * (sum_i q_i x_i - zero * sum_i x_i) per
    word, in units of 2^(PLANE_SHIFT - 149) (``int4_row_total`` sums it); ``squares`` [1, SUB / 8] as
    ``norm_input``."""
    xk = kb + tl.arange(0, SUB // 8) * 8
    g = cols * (K // GROUP) + kb // GROUP
    if EVEN:
        zero = tl.load(z_ptr + g).to(tl.float32)
        scale = tl.load(s_ptr + g).to(tl.float32)
    else:
        ok = col_ok & ((cols * 0 + kb) < K)  # per feature: the interpreter rejects scalar masks
        zero = tl.load(z_ptr + g, mask=ok, other=0).to(tl.float32)
        scale = tl.load(s_ptr + g, mask=ok, other=0.0).to(tl.float32)
    high = words >> 12  # nibbles 5..7 land on bits 8..19, below the exponent like the first five
    part = tl.zeros(words.shape, tl.float32)
    x_sum = tl.zeros([1, SUB // 8], tl.float32)
    x_row = x_ptr + xk[None, :]  # [1, SUB / 8]: the words' layout, so the planes need no conversion
    norm_row = norm_ptr + xk[None, :]
    for i in tl.static_range(8):
        ks = xk[None, :] + i
        if EVEN:
            x = tl.load(x_row + i).to(tl.float32)
        else:
            x = tl.load(x_row + i, mask=ks < K, other=0.0).to(tl.float32)
        x, squares = norm_input(x, squares, norm_row, i, ks < K, EVEN, NORM)
        x_sum += x
        if i < 5:
            bits = words & (15 << (4 * i))
            x = x * (2.0 ** (PLANE_SHIFT - 4 * i))
        else:
            bits = high & (15 << (4 * (i - 3)))
            x = x * (2.0 ** (PLANE_SHIFT - 4 * (i - 3)))
        part += bits.to(tl.float32, bitcast=True) * x  # (q * 16^p * 2^-149) * (x * 2^(PLANE_SHIFT - 4p)), exact
    return acc + (part - zero[:, None] * (x_sum * 2.0 ** (PLANE_SHIFT - 149))) * scale[:, None], squares


@triton.jit
def int4_row_total(acc):
    """The features' sums [1, block_n] of ``int4_row_step``'s accumulator, back from its units."""
    return tl.sum(acc, 1)[None, :] * 2.0 ** (149 - PLANE_SHIFT)


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
    ROW_TILE: tl.constexpr = 1,
):
    """The ``[block_n, SUB]`` tile at ``kb`` of unscaled weights in the dtype of ``like``, the per-feature
    scale of its partial sums, and (int4) the offset to take off them per unit of the activations' sum
    (int4 weights in tiles of ``ROW_TILE`` rows, 1 for the row layout):

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
        w_rows = w_ptr + int4_row_start(cols, K, GROUP, ROW_TILE, 8)[:, None]
        words = int4_words(w_rows, col_ok, kb, K, EVEN, SUB, GROUP, ROW_TILE)
        g = cols * (K // GROUP) + kb // GROUP
        if EVEN:
            zero = tl.load(z_ptr + g).to(tl.float32)
            scale = tl.load(s_ptr + g).to(tl.float32)
        else:
            ok = col_ok & ((cols * 0 + kb) < K)
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
