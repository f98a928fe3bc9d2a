"""Chapter 5, steps 1 to 8 in Triton: ``z = x @ W.T / scale`` (float32), from dense weights to packed ones. Each
step's kernel sits next to the previous one, so that the diff is the lesson."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int8
from torch import Tensor

from studylog import runtime
from studylog.ternary.formats import (X_DTYPES, PackedTernary, Scale, base3_table, check_dense, check_packed,
                                      check_packed_call, check_scale, check_ternary_values, check_x, prepare_out,
                                      weights_k)

def _zero_output(nargs):
    """pre_hook of split-K configs: their programs add partial sums into z with atomics."""
    nargs["z_ptr"].zero_()


def triton_config(num_warps: int = 4, num_stages: int = 3, zero_output: bool = True, **meta) -> triton.Config:
    """A config of the autotuned kernels; split-K ones zero z first unless ``zero_output`` is False (step 14)."""
    hook = _zero_output if zero_output and meta.get("SPLIT_K", 1) > 1 else None
    return triton.Config(meta, num_warps=num_warps, num_stages=num_stages, pre_hook=hook)


def autotune(configs: list, key: list[str]):
    """triton.autotune over ``configs``; the first only in the interpreter (it cannot time; the tests run each)."""
    chosen = configs if runtime.mode() == "gpu" else configs[:1]
    return triton.autotune(configs=chosen, key=key)


def config_dict(config: triton.Config) -> dict:
    """A triton.Config as the ``config=`` argument of the wrappers."""
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


# Steps 1 to 4: many rows a program is fine, the kernels are memory-bound on 1-2 bytes a weight.
DENSE_CONFIGS = [triton_config(BLOCK_N=16, BLOCK_K=256), triton_config(BLOCK_N=64, BLOCK_K=64)]
TWO_BIT_CONFIGS = [triton_config(BLOCK_N=16), triton_config(BLOCK_N=4)]
# M=1 kernels (steps 5 and 7): 8 rows a program, x loaded once for the 8, 4 words (or bytes) a thread along K;
# BLOCK_KW = 128 x num_warps keeps every warp on different words. Tiles: (words or bytes a row, slices of K, warps).
_GEMV_TILES = ((512, 1, 4), (256, 1, 2), (128, 4, 1))
GEMV_CONFIGS = [triton_config(BLOCK_N=8, BLOCK_KW=kw, SPLIT_K=split, num_warps=warps)
                for kw, split, warps in _GEMV_TILES]
BASE3_GEMV_CONFIGS = [triton_config(BLOCK_N=8, BLOCK_KB=kb, SPLIT_K=split, num_warps=warps)
                      for kb, split, warps in _GEMV_TILES]
# tl.dot kernels (steps 6 and 8). Few rows of x (BLOCK_M <= 32): pipelined loads and split K (N = 4096 in 64-row
# blocks is 64 programs); many: no pipelining, or the 16 x-tiles a step would not fit in shared memory.
DOT_CONFIGS_FEW = [triton_config(BLOCK_N=64, BLOCK_KW=kw, SPLIT_K=split, num_stages=2)
                   for kw, split in ((64, 1), (32, 4), (32, 8))]
DOT_CONFIGS_MANY = [triton_config(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=1, num_stages=1),
                    triton_config(BLOCK_N=128, BLOCK_KW=32, SPLIT_K=1, num_stages=1, num_warps=8)]
BASE3_DOT_CONFIGS_FEW = [triton_config(BLOCK_N=64, BLOCK_KB=64, SPLIT_K=split, num_stages=2) for split in (1, 4, 8)]
BASE3_DOT_CONFIGS_MANY = [triton_config(BLOCK_N=64, BLOCK_KB=64, SPLIT_K=1, num_stages=1),
                          triton_config(BLOCK_N=128, BLOCK_KB=64, SPLIT_K=1, num_stages=1, num_warps=8)]


# The programs of the row-wise kernels (steps 1 to 5 and 7): a block of weight rows for one row of x

@triton.jit
def row_block(pid_n, m, x_ptr, w_ptr, N, stride_xm, stride_wn, BLOCK_N: tl.constexpr):
    # Weight rows [pid_n * BLOCK_N, ...) and their mask, and pointers to those rows of W and to row m of x. A mask,
    # not a modulo: rows past N are neither read nor written.
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    x_row = x_ptr + m.to(tl.int64) * stride_xm
    return rows, row_mask, w_rows, x_row


@triton.jit
def row_program(x_ptr, w_ptr, N, stride_xm, stride_wn, BLOCK_N: tl.constexpr):
    # A program of steps 1 to 4 (grid: N blocks, M): its row m of x and its row_block.
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    rows, row_mask, w_rows, x_row = row_block(pid_n, m, x_ptr, w_ptr, N, stride_xm, stride_wn, BLOCK_N)
    return m, rows, row_mask, w_rows, x_row


# Steps 1 and 2: the first attempt's idea, made correct, on dense float weights (FLOAT_W), then on int8 weights

@triton.jit
def dense_kernel(x_ptr, w_ptr, z_ptr, scale_ptr, N, K, stride_xm, stride_wn, stride_zm, scale_stride,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FLOAT_W: tl.constexpr):
    # One program: BLOCK_N outputs for one row of x (rows past N masked, not wrapped). W is (N, K), dense, values
    # -1, 0, +1.
    m, rows, row_mask, w_rows, x_row = row_program(x_ptr, w_ptr, N, stride_xm, stride_wn, BLOCK_N)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)  # reduced over K once, after the loop
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_row + offs_k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        if FLOAT_W:
            w = tl.load(w_rows + offs_k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            w = w.to(tl.float32)  # any float type: the sign test is exact (and right in the interpreter)
        else:
            w = tl.load(w_rows + offs_k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0)
        acc += tl.where(w > 0, x, tl.where(w < 0, -x, 0.0))  # sign selection: no multiply
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = tl.sum(acc, axis=1) / scale
    tl.store(z_ptr + m.to(tl.int64) * stride_zm + rows, z, mask=row_mask)  # float32 out


step01_sign_tuned = autotune(DENSE_CONFIGS, key=["N", "K"])(dense_kernel)
step02_int8_tuned = autotune(DENSE_CONFIGS, key=["N", "K"])(dense_kernel)


# Steps 3 to 5: 2-bit packing. First the direct decode, then a decode in one AND, then a kernel built for M=1.

@triton.jit
def step03_2bit_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, N, K, KW, stride_xm, stride_pn, stride_zm, scale_stride,
                       BLOCK_N: tl.constexpr):
    # One program: BLOCK_N outputs for one row of x, one group (16 words, 256 weights) a step.
    m, rows, row_mask, p_rows, x_row = row_program(x_ptr, p_ptr, N, stride_xm, stride_pn, BLOCK_N)
    word = tl.arange(0, 16)  # word t of a group
    field = tl.arange(0, 16)  # field j of a word: bits 2j, 2j+1, the code of weight 16 j + t
    acc = tl.zeros([BLOCK_N, 16, 16], dtype=tl.float32)
    for g in range(0, KW // 16):
        words = tl.load(p_rows + g * 16 + word[None, :], mask=row_mask[:, None], other=0x55555555)
        codes = (words[:, None, :] >> (2 * field)[None, :, None]) & 3  # [n, j, t], code = weight + 1
        offs_k = g * 256 + field[:, None] * 16 + word[None, :]  # [j, t]: the group's 256 k, in order
        x = tl.load(x_row + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)[None, :, :]
        acc += tl.where(codes == 2, x, tl.where(codes == 0, -x, 0.0))  # sign selection: no multiply
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = tl.sum(tl.sum(acc, axis=2), axis=1) / scale
    tl.store(z_ptr + m.to(tl.int64) * stride_zm + rows, z, mask=row_mask)


step03_2bit_tuned = autotune(TWO_BIT_CONFIGS, key=["N", "K"])(step03_2bit_kernel)


@triton.jit
def _with_exponent(words):
    # The low 16 bits of every word (fields 0..7) under an all-ones float exponent: sign and bits
    # 16..22 cleared, bits 23..30 set. Once a word, so that each field then costs one AND.
    return (words & 0xFFFF) | 0x7F800000


@triton.jit
def _field_to_float(src, f: tl.constexpr):
    # Field f (bits 2f, 2f+1; f < 8) of words prepared by _with_exponent, as the weight -1.0, 0.0 or
    # +1.0 in two instructions, with no shift and no int->float conversion. One AND keeps the field
    # and the exponent of 2^(23-2f), where the field's lowest bit weighs exactly 1: the float is
    # 2^(23-2f) + code. Subtracting 2^(23-2f) + 1 leaves code - 1, the weight.
    bits = src & (((150 - 2 * f) << 23) | (3 << (2 * f)))
    return bits.to(tl.float32, bitcast=True) - (2.0 ** (23 - 2 * f) + 1.0)


@triton.jit
def _fields_to_float(src, f8):
    # _field_to_float for the 8 fields f8 = 0..7 at once, [n, t] words -> [n, f, t] weights: the masks and the
    # constants are vectors made once before the loop, so a weight still costs one AND and one subtract.
    mask = ((150 - 2 * f8) << 23) | (3 << (2 * f8))
    bias = ((150 - 2 * f8) << 23).to(tl.float32, bitcast=True) + 1.0  # 2^(23-2f) + 1, exact
    bits = src[:, None, :] & mask[None, :, None]
    return bits.to(tl.float32, bitcast=True) - bias[None, :, None]


@triton.jit
def step04_and_decode_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, N, K, KW, stride_xm, stride_pn, stride_zm,
                             scale_stride, BLOCK_N: tl.constexpr):
    # Step 3's program (BLOCK_N outputs for one row of x, one group a step), step 4's decode: no shift by 2j,
    # no compare, no select; one AND and one multiply-add a weight.
    m, rows, row_mask, p_rows, x_row = row_program(x_ptr, p_ptr, N, stride_xm, stride_pn, BLOCK_N)
    word = tl.arange(0, 16)  # word t of a group
    f8 = tl.arange(0, 8)  # field f of the low half of a word (weight 16 f + t), f + 8 of the high half
    acc_lo = tl.zeros([BLOCK_N, 8, 16], dtype=tl.float32)
    acc_hi = tl.zeros([BLOCK_N, 8, 16], dtype=tl.float32)
    for g in range(0, KW // 16):
        words = tl.load(p_rows + g * 16 + word[None, :], mask=row_mask[:, None], other=0x55555555)
        offs_k = g * 256 + f8[:, None] * 16 + word[None, :]  # [f, t]: fields 0..7, in order
        x_lo = tl.load(x_row + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)[None, :, :]
        x_hi = tl.load(x_row + offs_k + 128, mask=offs_k + 128 < K, other=0.0).to(tl.float32)[None, :, :]
        acc_lo += _fields_to_float(_with_exponent(words), f8) * x_lo
        acc_hi += _fields_to_float(_with_exponent(words >> 16), f8) * x_hi
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = (tl.sum(tl.sum(acc_lo, axis=2), axis=1) + tl.sum(tl.sum(acc_hi, axis=2), axis=1)) / scale
    tl.store(z_ptr + m.to(tl.int64) * stride_zm + rows, z, mask=row_mask)


step04_and_decode_tuned = autotune(TWO_BIT_CONFIGS, key=["N", "K"])(step04_and_decode_kernel)


@triton.jit
def gemv_program(x_ptr, p_ptr, N, stride_xm, stride_pn, BLOCK_N: tl.constexpr):
    # A program of the M = 1 kernels (steps 5 and 7; grid: N blocks, K slices, M): its slice of K, its row m of
    # x and its row_block.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    rows, row_mask, p_rows, x_row = row_block(pid_n, m, x_ptr, p_ptr, N, stride_xm, stride_pn, BLOCK_N)
    return pid_k, m, rows, row_mask, p_rows, x_row


@triton.jit
def k_slice(pid_k, UNITS, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    # [start, end) of slice pid_k of SPLIT_K over a row's UNITS packed words (or bytes), in whole tiles of BLOCK.
    per_split = tl.cdiv(tl.cdiv(UNITS, SPLIT_K), BLOCK) * BLOCK
    start = pid_k * per_split
    return start, tl.minimum(start + per_split, UNITS)


@triton.jit
def unit_offsets(BLOCK: tl.constexpr, GROUP: tl.constexpr):
    # A tile's BLOCK packed units (words or bytes) and the k of each one's first weight from the tile's start, for
    # groups of GROUP weights in 16 units (unit t: weights t, t + 16, ...). Steps 5 and 6 spell it out.
    offs = tl.arange(0, BLOCK)
    return offs, (offs // 16) * GROUP + offs % 16


@triton.jit
def load_tile(p_rows, units, end, row_mask, OTHER: tl.constexpr):
    # The packed units (words or bytes) at ``units`` of each weight row, OTHER (a unit of zero weights) past the
    # slice's end and past N.
    return tl.load(p_rows + units[None, :], mask=row_mask[:, None] & (units < end)[None, :], other=OTHER)


@triton.jit
def store_row(z_ptr, z, m, stride_zm, rows, row_mask, SPLIT_K: tl.constexpr):
    # Row m of z: stored, or with K split added in (z was zeroed; the slices of K add up in it).
    z_ptrs = z_ptr + m.to(tl.int64) * stride_zm + rows
    if SPLIT_K == 1:
        tl.store(z_ptrs, z, mask=row_mask)
    else:
        tl.atomic_add(z_ptrs, z, mask=row_mask, sem="relaxed")


@triton.jit
def step05_gemv_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, N, K, KW, stride_xm, stride_pn, stride_zm, scale_stride,
                       BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr):
    # One program: BLOCK_N outputs for one row of x, over one of SPLIT_K slices of K.
    pid_k, m, rows, row_mask, p_rows, x_row = gemv_program(x_ptr, p_ptr, N, stride_xm, stride_pn, BLOCK_N)
    kw_start, kw_end = k_slice(pid_k, KW, SPLIT_K, BLOCK_KW)
    offs_w = tl.arange(0, BLOCK_KW)
    x_of_word = (offs_w // 16) * 256 + offs_w % 16  # k of field 0 of each word, from the tile start
    acc = tl.zeros([BLOCK_N, BLOCK_KW], dtype=tl.float32)
    for kw0 in range(kw_start, kw_end, BLOCK_KW):
        kw = kw0 + offs_w
        # A wide tile of packed words, BLOCK_N x BLOCK_KW int32 of 16 weights each.
        words = tl.load(p_rows + kw[None, :], mask=row_mask[:, None] & (kw < kw_end)[None, :], other=0x55555555)
        offs_k = kw0 * 16 + x_of_word
        low = _with_exponent(words)  # fields 0..7
        for f in tl.static_range(8):
            x = tl.load(x_row + offs_k + 16 * f, mask=offs_k + 16 * f < K, other=0.0).to(tl.float32)
            acc += _field_to_float(low, f) * x[None, :]  # one x load serves the BLOCK_N rows
        high = _with_exponent(words >> 16)  # fields 8..15, moved down: one shift a word
        for f in tl.static_range(8):
            x = tl.load(x_row + offs_k + 16 * (f + 8), mask=offs_k + 16 * (f + 8) < K, other=0.0).to(tl.float32)
            acc += _field_to_float(high, f) * x[None, :]
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = tl.sum(acc, axis=1) / scale
    store_row(z_ptr, z, m, stride_zm, rows, row_mask, SPLIT_K)


step05_gemv_tuned = autotune(GEMV_CONFIGS, key=["N", "K"])(step05_gemv_kernel)


# Step 6: batched activations, decoded weights into tl.dot

@triton.jit
def dot_program(x_ptr, p_ptr, M, N, UNITS, stride_xm, stride_pn, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK: tl.constexpr, SPLIT_K: tl.constexpr):
    # A program of the tl.dot kernels (steps 6, 8, 9 and 10; grid: N blocks, K slices, M blocks), a BLOCK_N x BLOCK_M
    # tile of z transposed: its slice of K, its weight rows and rows of x (z's columns), their masks and pointers.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    cols = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    col_mask = cols < M
    p_rows = p_ptr + rows.to(tl.int64)[:, None] * stride_pn
    x_cols = x_ptr + cols.to(tl.int64)[None, :] * stride_xm
    start, end = k_slice(pid_k, UNITS, SPLIT_K, BLOCK)
    return start, end, rows, row_mask, cols, col_mask, p_rows, x_cols


@triton.jit
def store_tile(z_ptr, z, rows, row_mask, cols, col_mask, stride_zm, SPLIT_K: tl.constexpr):
    # A tile of z transposed (z[col, row]): stored, or with K split added in (z was zeroed).
    z_ptrs = z_ptr + cols.to(tl.int64)[None, :] * stride_zm + rows[:, None]
    if SPLIT_K == 1:
        tl.store(z_ptrs, z, mask=row_mask[:, None] & col_mask[None, :])
    else:
        tl.atomic_add(z_ptrs, z, mask=row_mask[:, None] & col_mask[None, :], sem="relaxed")


@triton.jit
def dot_field(acc, src, f: tl.constexpr, x_cols, k, K, col_mask, DOT_DTYPE: tl.constexpr,
              DOT_PRECISION: tl.constexpr):
    # acc + field f of src decoded (_field_to_float) [n, k] @ x's columns [k, m] at k (zeros past K and M), in
    # DOT_DTYPE.
    xt = tl.load(x_cols + k[:, None], mask=(k < K)[:, None] & col_mask[None, :], other=0.0).to(DOT_DTYPE)
    return tl.dot(_field_to_float(src, f).to(DOT_DTYPE), xt, acc, input_precision=DOT_PRECISION)


@triton.jit(do_not_specialize=["M"])
def step06_dot_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, M, N, K, KW, stride_xm, stride_pn, stride_zm, scale_stride,
                      BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                      DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # One program: a BLOCK_N x BLOCK_M tile of z transposed, over one of SPLIT_K slices of K. The
    # weights are the MMA's wide side (BLOCK_N >= 64 rows), the few rows of x its narrow side.
    kw_start, kw_end, rows, row_mask, cols, col_mask, p_rows, x_cols = dot_program(
        x_ptr, p_ptr, M, N, KW, stride_xm, stride_pn, BLOCK_N, BLOCK_M, BLOCK_KW, SPLIT_K)
    offs_w = tl.arange(0, BLOCK_KW)
    x_of_word = (offs_w // 16) * 256 + offs_w % 16
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for kw0 in range(kw_start, kw_end, BLOCK_KW):
        words = load_tile(p_rows, kw0 + offs_w, kw_end, row_mask, 0x55555555)
        offs_k = kw0 * 16 + x_of_word
        low = _with_exponent(words)
        high = _with_exponent(words >> 16)
        for f in tl.static_range(8):
            acc = dot_field(acc, low, f, x_cols, offs_k + 16 * f, K, col_mask, DOT_DTYPE, DOT_PRECISION)
        for f in tl.static_range(8):
            acc = dot_field(acc, high, f, x_cols, offs_k + 16 * (f + 8), K, col_mask, DOT_DTYPE, DOT_PRECISION)
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = acc / scale[:, None]
    store_tile(z_ptr, z, rows, row_mask, cols, col_mask, stride_zm, SPLIT_K)


step06_dot_tuned_few = autotune(DOT_CONFIGS_FEW, key=["N", "K", "BLOCK_M"])(step06_dot_kernel)
step06_dot_tuned_many = autotune(DOT_CONFIGS_MANY, key=["N", "K", "BLOCK_M"])(step06_dot_kernel)


# Steps 7 and 8: 1.6-bit packing, 5 weights a byte in base 3

@triton.jit
def base3_fields(p_rows, kb, kb_end, row_mask, table_ptr):
    # A tile of packed bytes (121: five zeros), each looked up in the 1 KB table (it stays in L1): its 5 digits as
    # 2-bit fields under the float exponent, ready for step 4's two-instruction decode.
    return tl.load(table_ptr + load_tile(p_rows, kb, kb_end, row_mask, 121).to(tl.int32))


@triton.jit
def step07_base3_gemv_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, table_ptr, N, K, KB, stride_xm, stride_pn, stride_zm,
                             scale_stride, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, SPLIT_K: tl.constexpr):
    # One program: BLOCK_N outputs for one row of x, over one of SPLIT_K slices of K.
    pid_k, m, rows, row_mask, p_rows, x_row = gemv_program(x_ptr, p_ptr, N, stride_xm, stride_pn, BLOCK_N)
    kb_start, kb_end = k_slice(pid_k, KB, SPLIT_K, BLOCK_KB)
    offs_b, x_of_byte = unit_offsets(BLOCK_KB, 80)  # k of digit 0 of each byte, from the tile start
    acc = tl.zeros([BLOCK_N, BLOCK_KB], dtype=tl.float32)
    for kb0 in range(kb_start, kb_end, BLOCK_KB):
        # A wide tile of packed bytes, BLOCK_N x BLOCK_KB of 5 weights each, one table lookup a byte; 4 bytes a
        # thread, like the 4 x values they meet.
        fields = base3_fields(p_rows, tl.max_contiguous(kb0 + offs_b, 4), kb_end, row_mask, table_ptr)
        offs_k = kb0 * 5 + x_of_byte
        for d in tl.static_range(5):
            x = tl.load(x_row + offs_k + 16 * d, mask=offs_k + 16 * d < K, other=0.0).to(tl.float32)
            acc += _field_to_float(fields, d) * x[None, :]
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = tl.sum(acc, axis=1) / scale
    store_row(z_ptr, z, m, stride_zm, rows, row_mask, SPLIT_K)


@triton.jit(do_not_specialize=["M"])
def step08_base3_dot_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, table_ptr, M, N, K, KB, stride_xm, stride_pn, stride_zm,
                            scale_stride, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, SPLIT_K: tl.constexpr,
                            BLOCK_M: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # One program: a BLOCK_N x BLOCK_M tile of z transposed, over one of SPLIT_K slices of K.
    kb_start, kb_end, rows, row_mask, cols, col_mask, p_rows, x_cols = dot_program(
        x_ptr, p_ptr, M, N, KB, stride_xm, stride_pn, BLOCK_N, BLOCK_M, BLOCK_KB, SPLIT_K)
    offs_b, x_of_byte = unit_offsets(BLOCK_KB, 80)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for kb0 in range(kb_start, kb_end, BLOCK_KB):
        fields = base3_fields(p_rows, kb0 + offs_b, kb_end, row_mask, table_ptr)
        offs_k = kb0 * 5 + x_of_byte
        for d in tl.static_range(5):
            acc = dot_field(acc, fields, d, x_cols, offs_k + 16 * d, K, col_mask, DOT_DTYPE, DOT_PRECISION)
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = acc / scale[:, None]
    store_tile(z_ptr, z, rows, row_mask, cols, col_mask, stride_zm, SPLIT_K)


step07_base3_gemv_tuned = autotune(BASE3_GEMV_CONFIGS, key=["N", "K"])(step07_base3_gemv_kernel)
step08_base3_dot_tuned_few = autotune(BASE3_DOT_CONFIGS_FEW, key=["N", "K", "BLOCK_M"])(step08_base3_dot_kernel)
step08_base3_dot_tuned_many = autotune(BASE3_DOT_CONFIGS_MANY, key=["N", "K", "BLOCK_M"])(step08_base3_dot_kernel)


# The wrappers: check, allocate, launch (nothing waits for the GPU but steps 1 and 2's check of their weights)

def launch_tuned(kernel, grid: Callable, args: tuple, config: Optional[dict], meta: dict, zero_output: bool = True):
    """Launch autotuned ``kernel`` on ``grid``, or at one explicit ``config`` (from :func:`config_dict`)."""
    if config is None:
        kernel[grid](*args, **meta)
        return
    config = dict(config)
    num_warps, num_stages = config.pop("num_warps", 4), config.pop("num_stages", 3)
    if zero_output and config.get("SPLIT_K", 1) > 1:
        args[2].zero_()  # z: the slices of K add into it
    kernel.fn[grid](*args, **meta, **config, num_warps=num_warps, num_stages=num_stages)


def _rowwise(kernel, x: Any, w: Any, scale: Scale, out: Optional[Tensor], config: Optional[dict],
             dense_dtypes: Optional[tuple] = None, fmt: Optional[str] = None, split: bool = False, check_values=False,
             meta: Optional[dict] = None):
    """Steps 1 to 5 and 7: one program column a row of x; ``check_values`` waits for the GPU (dense weights)."""
    x2, vector = check_x(x, weights_k(w))
    m, k = x2.shape
    if dense_dtypes is not None:
        w = check_dense(w, dense_dtypes, k, x2)
        if check_values:
            check_ternary_values("w", w)
        n, data, extra = w.shape[0], w, ()
    else:
        w = check_packed(w, fmt, k, x2)
        n, data, extra = w.n, w.data, (w.data.shape[1],)
    s, s_stride = check_scale(scale, n, x2)
    z = prepare_out(out, m, n, x2)
    table = (base3_table(str(x2.device)),) if fmt == "base3" else ()
    args = (x2, data, z, s, *table, n, k, *extra, x2.stride(0), data.stride(0), z.stride(0), s_stride)
    grid = (lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"], m)) if split else \
        (lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), m))
    launch_tuned(kernel, grid, args, config, meta or {})
    return z[0] if vector else z


def step01_sign(x: Float[Tensor, "*m k"], w: Float[Tensor, "n k"], scale: Scale = 1.0, *,
                out: Optional[Tensor] = None, config: Optional[dict] = None,
                check_values: bool = True) -> Float[Tensor, "*m n"]:
    """Step 1: dense float weights, each -1, 0 or +1, x selected by their sign. The weights are checked first (a pass
    that waits for the GPU); ``check_values=False`` is the form a CUDA graph can capture."""
    return _rowwise(step01_sign_tuned, x, w, scale, out, config, dense_dtypes=X_DTYPES, check_values=check_values,
                    meta={"FLOAT_W": True})


def step02_int8(x: Float[Tensor, "*m k"], w: Int8[Tensor, "n k"], scale: Scale = 1.0, *,
                out: Optional[Tensor] = None, config: Optional[dict] = None,
                check_values: bool = True) -> Float[Tensor, "*m n"]:
    """Step 2: int8 weights, each -1, 0 or +1, checked as :func:`step01_sign` checks its own."""
    return _rowwise(step02_int8_tuned, x, w, scale, out, config, dense_dtypes=(torch.int8,), check_values=check_values,
                    meta={"FLOAT_W": False})


def step03_2bit(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 3: 2-bit weights (``PackedTernary.pack(w)``) decoded with shifts and masks."""
    return _rowwise(step03_2bit_tuned, x, w, scale, out, config, fmt="2bit")


def step04_and_decode(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                      out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 4: step 3's program and 2-bit weights, each weight decoded by one AND under a float exponent."""
    return _rowwise(step04_and_decode_tuned, x, w, scale, out, config, fmt="2bit")


def step05_gemv(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 5, built for M = 1: step 4's decode on wide tiles, 8 rows a program and one load of x for the 8 (any M
    works; each row of x re-reads the weights)."""
    return _rowwise(step05_gemv_tuned, x, w, scale, out, config, fmt="2bit", split=True)


def step07_base3_gemv(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                      out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 7: step 5 on base-3 (1.6-bit) weights (``PackedTernary.pack(w, "base3")``), built for M = 1."""
    return _rowwise(step07_base3_gemv_tuned, x, w, scale, out, config, fmt="base3", split=True)


def block_m_for(m: int) -> int:
    """Rows of x a tl.dot program covers: at least 16 (the MMA's smallest), at most 128."""
    return min(128, max(16, triton.next_power_of_2(m)))


#: The Triton types of x's torch types.
TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def dot_meta(x_dtype: torch.dtype) -> dict:
    """DOT_DTYPE and DOT_PRECISION of the tl.dot kernels: float32 x "ieee" (TF32 would round x); bf16 widened to
    float32 in the interpreter (its bf16 tl.dot is wrong)."""
    if x_dtype == torch.float32 or (x_dtype == torch.bfloat16 and runtime.mode() == "interpreter"):
        return {"DOT_DTYPE": tl.float32, "DOT_PRECISION": "ieee"}
    return {"DOT_DTYPE": TL_DTYPES[x_dtype], "DOT_PRECISION": "tf32"}  # the precision only matters for float32


def launch_dot(kernels: tuple, x2: Tensor, w: PackedTernary, s: Tensor, s_stride: int, z: Tensor,
               config: Optional[dict], meta: dict, extra: tuple = (), zero_output: bool = True) -> None:
    """Launch a tl.dot kernel (steps 6 and 8 to 14) by its autotuners for up to 32 rows of x and for more; BLOCK_M is
    ``block_m_for(M)`` unless the config tunes it; ``extra``: the arguments between scale and M."""
    m, k = x2.shape
    kernel = kernels[0] if block_m_for(m) <= 32 else kernels[1]
    if "BLOCK_M" not in (kernel.configs[0].kwargs if config is None else config):
        meta = {**meta, "BLOCK_M": block_m_for(m)}
    args = (x2, w.data, z, s, *extra, m, w.n, k, w.data.shape[1], x2.stride(0), w.data.stride(0), z.stride(0), s_stride)

    def grid(meta):
        return triton.cdiv(w.n, meta["BLOCK_N"]), meta["SPLIT_K"], triton.cdiv(m, meta["BLOCK_M"])

    launch_tuned(kernel, grid, args, config, meta, zero_output=zero_output)


def dot_step(kernels: tuple, x: Any, w: Any, scale: Scale, out: Optional[Tensor], config: Optional[dict], fmt: str):
    """Steps 6, 8 and 10: ``kernels`` (:func:`launch_dot`) on ``fmt`` weights, the dot in x's type."""
    x2, vector, w, s, s_stride, z = check_packed_call(x, w, scale, out, fmt)
    table = (base3_table(str(x2.device)),) if fmt == "base3" else ()
    launch_dot(kernels, x2, w, s, s_stride, z, config, dot_meta(x2.dtype), table)
    return z[0] if vector else z


def step06_dot(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
               out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 6: 2-bit weights decoded in registers and multiplied with ``tl.dot`` (for M > 1)."""
    return dot_step((step06_dot_tuned_few, step06_dot_tuned_many), x, w, scale, out, config, "2bit")


def step08_base3_dot(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                     out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 8: step 6 on base-3 (1.6-bit) weights (for M > 1)."""
    return dot_step((step08_base3_dot_tuned_few, step08_base3_dot_tuned_many), x, w, scale, out, config, "base3")
