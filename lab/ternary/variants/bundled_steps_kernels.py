"""Frozen Triton sources of chapter 5's bundled steps 4 and 9, each change a ``tl.constexpr`` knob.

Beside the library, not part of it (``lab/ternary/bundled_steps.py`` runs them). The device code is copied
from ``studylog/ternary/triton_steps.py`` (steps 3, 4, 5) and ``studylog/ternary/triton_mma.py`` (step 9), so
that these variants stay as they were measured when the library changes; with every knob at the library's
value a variant computes what the library's step computes, in the same order (``check`` compares them).

``step04_variant_kernel`` (step 3 -> step 4; grid: N blocks, K slices, rows of x):

* ``DECODE``: 0 step 3's decode (shift by 2f, mask, select x, -x or 0 by the code); 1 step 4's (the low or high
  16 bits of a word once under an all-ones float exponent, then per field one AND, a subtract, a multiply-add).
* ``WIDE``: 0 step 3's tile (BLOCK_N rows, one group of 16 words a step, x loaded as the group's 16 x 16);
  1 step 4's (8 rows every thread holds, BLOCK_KW words a step, one x load a field for the 8 rows).
* ``SPLIT_K`` (a config value): slices of K added into z with atomics (z zeroed by the config's pre_hook).
* ``REDUCE_AT_END``: 1 one reduction across K after the loop (steps 3 and 4 both); 0 a reduction every tile
  (only with ``WIDE``: "step 4 minus one reduction").

``step09_variant_kernel`` (step 5 -> step 9; grid: N blocks, K slices, M blocks):

* ``PAIR``: 0 step 5's decode (one float32 a field, converted to the MMA's type, 16 dots a tile); 1 step 9's
  (one AND and one packed multiply-add for the two 16-bit halves of a word, 8 dots a tile of twice the K).
* ``NO_MASK``: 1 step 9's masks: rows past N read row N-1 (not stored), tiles whose k all lie below K load
  x unmasked (a second loop takes the last tiles); 0 step 5's masks on every load.
* ``MMA_LAYOUT``: 0 the ``"2bit"`` layout (a pair is weights 128 apart: x is gathered); 1 ``"2bit_mma"`` (a pair
  is K-neighbours, a field's x is a run of 32 consecutive k). Needs ``PAIR``: without the pair decode the layout
  only makes step 5's gather of x stride 2.
* ``WORKSPACE``: with ``SPLIT_K`` > 1, 0 atomics into z (zeroed by the config's pre_hook, a memset launch);
  1 step 9's zeroed workspace and per-tile counter (the last slice stores z and restores the zeros).
"""

from __future__ import annotations

import triton
import triton.language as tl

# ----------------------------------------------------------------------------------------------
# Step 3 -> step 4
# ----------------------------------------------------------------------------------------------


@triton.jit
def _with_exponent(words):
    # The low 16 bits of every word (fields 0..7) under an all-ones float exponent (step 4's decode).
    return (words & 0xFFFF) | 0x7F800000


@triton.jit
def _field_to_float(src, f: tl.constexpr):
    # Field f (< 8) of words prepared by _with_exponent as -1.0, 0.0 or +1.0: one AND, one subtract.
    bits = src & (((150 - 2 * f) << 23) | (3 << (2 * f)))
    return bits.to(tl.float32, bitcast=True) - (2.0 ** (23 - 2 * f) + 1.0)


@triton.jit
def _fields_to_float(src, f8):
    # _field_to_float for the 8 fields f8 = 0..7 at once, [n, t] words -> [n, f, t] weights: the masks and
    # the constants are vectors made once before the loop, so a weight still costs one AND and one subtract.
    mask = ((150 - 2 * f8) << 23) | (3 << (2 * f8))
    bias = (((150 - 2 * f8) << 23).to(tl.float32, bitcast=True) + 1.0)  # 2^(23-2f) + 1, exact
    bits = src[:, None, :] & mask[None, :, None]
    return bits.to(tl.float32, bitcast=True) - bias[None, :, None]


@triton.jit
def _store_row(z_ptr, z, m, stride_zm, rows, row_mask, SPLIT_K: tl.constexpr):
    z_ptrs = z_ptr + m.to(tl.int64) * stride_zm + rows
    if SPLIT_K == 1:
        tl.store(z_ptrs, z, mask=row_mask)
    else:
        tl.atomic_add(z_ptrs, z, mask=row_mask, sem="relaxed")


@triton.jit
def _k_slice(pid_k, UNITS, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    per_split = tl.cdiv(tl.cdiv(UNITS, SPLIT_K), BLOCK) * BLOCK
    start = pid_k * per_split
    return start, tl.minimum(start + per_split, UNITS)


@triton.jit
def step04_variant_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, N, K, KW, stride_xm, stride_pn, stride_zm, scale_stride,
                          BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr,
                          DECODE: tl.constexpr, WIDE: tl.constexpr, REDUCE_AT_END: tl.constexpr):
    tl.static_assert(WIDE == 1 or REDUCE_AT_END == 1)  # step 3's tile reduces at the end, as step 3 does
    tl.static_assert(WIDE == 1 or BLOCK_KW == 16)  # step 3's tile: one group of 16 words a step
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    p_rows = p_ptr + rows.to(tl.int64)[:, None] * stride_pn
    x_row = x_ptr + m.to(tl.int64) * stride_xm
    kw_start, kw_end = _k_slice(pid_k, KW, SPLIT_K, BLOCK_KW)
    if WIDE == 0:
        # Step 3's tile: BLOCK_N rows, one group (16 words, 256 weights) a step; KW and the slices are whole groups.
        word = tl.arange(0, 16)
        if DECODE == 0:
            field = tl.arange(0, 16)
            acc = tl.zeros([BLOCK_N, 16, 16], dtype=tl.float32)
            for kw0 in range(kw_start, kw_end, 16):
                words = tl.load(p_rows + kw0 + word[None, :], mask=row_mask[:, None], other=0x55555555)
                codes = (words[:, None, :] >> (2 * field)[None, :, None]) & 3  # [n, j, t], code = weight + 1
                offs_k = kw0 * 16 + field[:, None] * 16 + word[None, :]
                x = tl.load(x_row + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)[None, :, :]
                acc += tl.where(codes == 2, x, tl.where(codes == 0, -x, 0.0))
            z = tl.sum(tl.sum(acc, axis=2), axis=1)
        else:
            f8 = tl.arange(0, 8)
            acc_lo = tl.zeros([BLOCK_N, 8, 16], dtype=tl.float32)
            acc_hi = tl.zeros([BLOCK_N, 8, 16], dtype=tl.float32)
            for kw0 in range(kw_start, kw_end, 16):
                words = tl.load(p_rows + kw0 + word[None, :], mask=row_mask[:, None], other=0x55555555)
                offs_k = kw0 * 16 + f8[:, None] * 16 + word[None, :]  # [f, t]: fields 0..7
                x_lo = tl.load(x_row + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)[None, :, :]
                x_hi = tl.load(x_row + offs_k + 128, mask=offs_k + 128 < K, other=0.0).to(tl.float32)[None, :, :]
                acc_lo += _fields_to_float(_with_exponent(words), f8) * x_lo
                acc_hi += _fields_to_float(_with_exponent(words >> 16), f8) * x_hi
            z = tl.sum(tl.sum(acc_lo, axis=2), axis=1) + tl.sum(tl.sum(acc_hi, axis=2), axis=1)
    else:
        # Step 4's tile: BLOCK_N (8) rows in every thread, BLOCK_KW words a step.
        offs_w = tl.arange(0, BLOCK_KW)
        x_of_word = (offs_w // 16) * 256 + offs_w % 16
        acc = tl.zeros([BLOCK_N, BLOCK_KW], dtype=tl.float32)
        z = tl.zeros([BLOCK_N], dtype=tl.float32)
        for kw0 in range(kw_start, kw_end, BLOCK_KW):
            kw = kw0 + offs_w
            words = tl.load(p_rows + kw[None, :], mask=row_mask[:, None] & (kw < kw_end)[None, :], other=0x55555555)
            offs_k = kw0 * 16 + x_of_word
            if REDUCE_AT_END == 0:
                acc = tl.zeros([BLOCK_N, BLOCK_KW], dtype=tl.float32)
            if DECODE == 0:
                for f in tl.static_range(16):
                    x = tl.load(x_row + offs_k + 16 * f, mask=offs_k + 16 * f < K, other=0.0).to(tl.float32)[None, :]
                    codes = (words >> (2 * f)) & 3
                    acc += tl.where(codes == 2, x, tl.where(codes == 0, -x, 0.0))
            else:
                low = _with_exponent(words)
                for f in tl.static_range(8):
                    x = tl.load(x_row + offs_k + 16 * f, mask=offs_k + 16 * f < K, other=0.0).to(tl.float32)
                    acc += _field_to_float(low, f) * x[None, :]
                high = _with_exponent(words >> 16)
                for f in tl.static_range(8):
                    x = tl.load(x_row + offs_k + 16 * (f + 8), mask=offs_k + 16 * (f + 8) < K,
                                other=0.0).to(tl.float32)
                    acc += _field_to_float(high, f) * x[None, :]
            if REDUCE_AT_END == 0:
                z += tl.sum(acc, axis=1)
        if REDUCE_AT_END == 1:
            z = tl.sum(acc, axis=1)
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    _store_row(z_ptr, z / scale, m, stride_zm, rows, row_mask, SPLIT_K)


# ----------------------------------------------------------------------------------------------
# Step 5 -> step 9
# ----------------------------------------------------------------------------------------------


@triton.jit
def _with_pair_exponent(words, q: tl.constexpr, MAGIC: tl.constexpr):
    # Byte q of each 16-bit half (fields 4q..4q+3) moved to the bottom of the half, under the decode's exponent.
    if MAGIC == tl.float16:
        return (words >> (8 * q)) | 0x3C003C00
    else:
        return (words >> (8 * q)) | 0x3F003F00


@triton.jit
def _pair_weights(src, f: tl.constexpr, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr):
    # Field f (< 4) of both halves of words prepared by _with_pair_exponent, as two weights in a [..., 2]
    # tensor: one AND for the two, one fused multiply-add on the pair.
    if MAGIC == tl.float16:
        bits = src & ((0x00030003 << (2 * f)) | 0x3C003C00)
    else:
        bits = src & ((0x00030003 << (2 * f)) | 0x3F003F00)
    lo = bits.to(tl.int16).to(MAGIC, bitcast=True).to(DOT_DTYPE)
    hi = (bits >> 16).to(tl.int16).to(MAGIC, bitcast=True).to(DOT_DTYPE)
    if MAGIC == tl.float16:
        lo = lo * (2.0 ** (10 - 2 * f)) - (2.0 ** (10 - 2 * f) + 1.0)
        hi = hi * (2.0 ** (10 - 2 * f)) - (2.0 ** (10 - 2 * f) + 1.0)
    else:
        lo = lo * (2.0 ** (8 - 2 * f)) - (2.0 ** (7 - 2 * f) + 1.0)
        hi = hi * (2.0 ** (8 - 2 * f)) - (2.0 ** (7 - 2 * f) + 1.0)
    return tl.join(lo, hi)


@triton.jit
def _field_step(acc, words, x_cols, kw0, K, col_mask, offs_k, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
                DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # Step 5's tile: 16 dots, one a field, each over BLOCK_KW weights decoded as float32 then converted.
    low = _with_exponent(words)
    high = _with_exponent(words >> 16)
    for f in tl.static_range(8):
        k_f = offs_k + 16 * f
        xt = tl.load(x_cols + k_f[:, None], mask=(k_f < K)[:, None] & col_mask[None, :], other=0.0).to(DOT_DTYPE)
        acc = tl.dot(_field_to_float(low, f).to(DOT_DTYPE), xt, acc, input_precision=DOT_PRECISION)
    for f in tl.static_range(8):
        k_f = offs_k + 16 * (f + 8)
        xt = tl.load(x_cols + k_f[:, None], mask=(k_f < K)[:, None] & col_mask[None, :], other=0.0).to(DOT_DTYPE)
        acc = tl.dot(_field_to_float(high, f).to(DOT_DTYPE), xt, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _pair_step(acc, words, x_cols, kw0, K, col_mask, r_k, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
               MASK_K: tl.constexpr, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
               MMA_LAYOUT: tl.constexpr):
    # Step 9's tile: 8 dots, one a field of both halves, each over 2 * BLOCK_KW weights. r_k: the k of column
    # r of a dot from the tile's start, for field 0. 2bit_mma: field p is k + 32 p (a run of 32 a group);
    # 2bit: field j of the low half is k + 16 j, and the high half's column sits 128 further (in r_k).
    for q in tl.static_range(2):
        src = _with_pair_exponent(words, q, MAGIC)
        for f in tl.static_range(4):
            a = tl.reshape(_pair_weights(src, f, MAGIC, DOT_DTYPE), (BLOCK_N, 2 * BLOCK_KW))
            if MMA_LAYOUT:
                k = kw0 * 16 + r_k + 32 * (4 * q + f)
            else:
                k = kw0 * 16 + r_k + 16 * (4 * q + f)
            if MASK_K:
                xt = tl.load(x_cols + k[:, None], mask=(k < K)[:, None] & col_mask[None, :], other=0.0)
            else:
                xt = tl.load(x_cols + k[:, None], mask=col_mask[None, :], other=0.0)
            acc = tl.dot(a, xt.to(DOT_DTYPE), acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _tile(acc, words, x_cols, kw0, K, col_mask, offs_k, r_k, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
          MASK_K: tl.constexpr, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
          PAIR: tl.constexpr, MMA_LAYOUT: tl.constexpr):
    if PAIR:
        return _pair_step(acc, words, x_cols, kw0, K, col_mask, r_k, BLOCK_N, BLOCK_KW, MASK_K, MAGIC, DOT_DTYPE,
                          DOT_PRECISION, MMA_LAYOUT)
    else:
        return _field_step(acc, words, x_cols, kw0, K, col_mask, offs_k, BLOCK_N, BLOCK_KW, DOT_DTYPE, DOT_PRECISION)


@triton.jit(do_not_specialize=["M"])
def step09_variant_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, ws_ptr, count_ptr, M, N, K, KW, stride_xm, stride_pn,
                          stride_zm, scale_stride, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
                          SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr,
                          DOT_PRECISION: tl.constexpr, PAIR: tl.constexpr, NO_MASK: tl.constexpr,
                          MMA_LAYOUT: tl.constexpr, WORKSPACE: tl.constexpr):
    tl.static_assert(PAIR == 1 or MMA_LAYOUT == 0)  # the MMA layout pays only with the pair decode
    tl.static_assert(PAIR == 0 or BLOCK_KW % 16 == 0)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    if NO_MASK:
        rows_in = tl.minimum(rows, N - 1)  # rows past N read row N-1 (no mask, no select) and are not stored
    else:
        rows_in = rows
    cols = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    col_mask = cols < M
    p_rows = p_ptr + rows_in.to(tl.int64)[:, None] * stride_pn
    x_cols = x_ptr + cols.to(tl.int64)[None, :] * stride_xm
    kw_start, kw_end = _k_slice(pid_k, KW, SPLIT_K, BLOCK_KW)
    offs_w = tl.arange(0, BLOCK_KW)
    offs_k = (offs_w // 16) * 256 + offs_w % 16  # step 5: k of field 0 of each word, from the tile start
    r = tl.arange(0, 2 * BLOCK_KW)
    if MMA_LAYOUT:
        r_k = (r // 32) * 256 + r % 32  # column r of a pair's dot: word r // 2, half r % 2, K-neighbours
    else:
        r_k = ((r // 2) // 16) * 256 + (r // 2) % 16 + 128 * (r % 2)  # the 2bit layout's halves: 128 apart
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if NO_MASK:
        full_end = tl.minimum(kw_end, (K // (16 * BLOCK_KW)) * BLOCK_KW)
        for kw0 in range(kw_start, full_end, BLOCK_KW):
            words = tl.load(p_rows + (kw0 + offs_w)[None, :])
            acc = _tile(acc, words, x_cols, kw0, K, col_mask, kw0 * 16 + offs_k, r_k, BLOCK_N, BLOCK_KW, False,
                        MAGIC, DOT_DTYPE, DOT_PRECISION, PAIR, MMA_LAYOUT)
        for kw0 in range(tl.maximum(kw_start, full_end), kw_end, BLOCK_KW):
            kw = kw0 + offs_w
            words = tl.load(p_rows + kw[None, :], mask=(kw < kw_end)[None, :], other=0x55555555)
            acc = _tile(acc, words, x_cols, kw0, K, col_mask, kw0 * 16 + offs_k, r_k, BLOCK_N, BLOCK_KW, True,
                        MAGIC, DOT_DTYPE, DOT_PRECISION, PAIR, MMA_LAYOUT)
        scale = tl.load(scale_ptr + rows_in * scale_stride)
    else:
        for kw0 in range(kw_start, kw_end, BLOCK_KW):
            kw = kw0 + offs_w
            words = tl.load(p_rows + kw[None, :], mask=row_mask[:, None] & (kw < kw_end)[None, :], other=0x55555555)
            acc = _tile(acc, words, x_cols, kw0, K, col_mask, kw0 * 16 + offs_k, r_k, BLOCK_N, BLOCK_KW, True,
                        MAGIC, DOT_DTYPE, DOT_PRECISION, PAIR, MMA_LAYOUT)
        scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = acc / scale[:, None]
    out_mask = row_mask[:, None] & col_mask[None, :]
    z_offs = cols.to(tl.int64)[None, :] * stride_zm + rows[:, None]
    if SPLIT_K == 1:
        tl.store(z_ptr + z_offs, z, mask=out_mask)
    elif WORKSPACE == 0:
        tl.atomic_add(z_ptr + z_offs, z, mask=out_mask, sem="relaxed")  # z was zeroed (the config's pre_hook)
    else:
        ws_offs = cols.to(tl.int64)[None, :] * N + rows[:, None]
        tl.atomic_add(ws_ptr + ws_offs, z, mask=out_mask, sem="relaxed")
        tl.debug_barrier()  # every thread's partial sums are in before the tile's counter moves
        tile = pid_m * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            bits = tl.atomic_xchg(ws_ptr.to(tl.pointer_type(tl.int32)) + ws_offs, 0, mask=out_mask, sem="relaxed")
            tl.store(z_ptr + z_offs, bits.to(tl.float32, bitcast=True), mask=out_mask)
            tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed")
