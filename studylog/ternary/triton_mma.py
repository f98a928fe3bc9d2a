"""Chapter 5, steps 9 to 14 (Triton): int8 activations on the tensor cores (9), then on step 6's tl.dot: configs for
the tensor cores (10), two weights decoded a 32-bit op (11), no masks (12), ``"2bit_mma"`` (13), no memset (14)."""

from __future__ import annotations

from typing import Any, Optional

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int8
from torch import Tensor

from studylog import runtime
from studylog.checks import check_tensor
from studylog.ternary.formats import MMA_X_DTYPES, PackedTernary, Scale, SplitWorkspace, check_device, check_packed_call
from studylog.ternary.triton_steps import (DOT_CONFIGS_MANY, TL_DTYPES, autotune, dot_meta, dot_program, dot_step,
                                           k_slice, launch_dot, load_tile, step06_dot_kernel, store_tile,
                                           triton_config, unit_offsets)

#: Step 9's tiles: int8 MMA steps over 32 k, so BLOCK_KW >= 32 (many rows of x: step 6's tiles).
W2A8_DOT_CONFIGS_FEW = [triton_config(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=split, num_stages=2) for split in (1, 4)]
W2A8_DOT_CONFIGS = W2A8_DOT_CONFIGS_FEW + DOT_CONFIGS_MANY


# Steps 10 to 14. BLOCK_N = 64 rows and 4 warps: one warpgroup, Hopper's wgmma. Each dot waits for its wgmma before
# the next decode, so the SM hides that wait with other programs: small tiles let several share an SM, and K is
# split so that N = 4096 still makes 256-512 programs (a split costs a few atomics, not a launch).
MMA_TILES_FEW = [
    dict(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=2, num_stages=3),
    dict(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=4, num_stages=3),
    dict(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=8, num_stages=2),
    dict(BLOCK_N=64, BLOCK_KW=16, SPLIT_K=1, num_stages=3),
    dict(BLOCK_N=64, BLOCK_KW=16, SPLIT_K=4, num_stages=3),
    dict(BLOCK_N=64, BLOCK_KW=16, SPLIT_K=8, num_stages=3),
    dict(BLOCK_N=128, BLOCK_KW=32, SPLIT_K=8, num_stages=3, num_warps=8),
]
# Many rows: the rows of x a program covers are tuned too (a 64-row block decodes the weights twice for M = 128,
# but takes half the shared memory of a 128-row one).
MMA_TILES_MANY = [
    dict(BLOCK_N=64, BLOCK_KW=16, SPLIT_K=2, BLOCK_M=128, num_stages=2),
    dict(BLOCK_N=64, BLOCK_KW=16, SPLIT_K=2, BLOCK_M=64, num_stages=3),
    dict(BLOCK_N=64, BLOCK_KW=16, SPLIT_K=4, BLOCK_M=64, num_stages=3),
    dict(BLOCK_N=128, BLOCK_KW=16, SPLIT_K=2, BLOCK_M=64, num_stages=3, num_warps=8),
]
#: Steps 10 to 13 split K by atomics into z, zeroed by each config's pre_hook; step 14 reduces its slices itself.
DOT_MMA_CONFIGS_FEW = [triton_config(**tile) for tile in MMA_TILES_FEW]
DOT_MMA_CONFIGS_MANY = [triton_config(**tile) for tile in MMA_TILES_MANY]
MMA_CONFIGS_FEW = [triton_config(zero_output=False, **tile) for tile in MMA_TILES_FEW]
MMA_CONFIGS_MANY = [triton_config(zero_output=False, **tile) for tile in MMA_TILES_MANY]


# Step 9: int8 activations (W2A8): int8 x int8 -> int32 on the tensor cores, scales at the end

@triton.jit
def _field_to_int8(words, f: tl.constexpr):
    return (((words >> (2 * f)) & 3) - 1).to(tl.int8)


@triton.jit(do_not_specialize=["M"])
def step09_w2a8_dot_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, x_scale_ptr, M, N, K, KW, stride_xm, stride_pn, stride_zm,
                           scale_stride, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr,
                           BLOCK_M: tl.constexpr):
    # One program: a BLOCK_N x BLOCK_M tile of z transposed, over one of SPLIT_K slices of K.
    kw_start, kw_end, rows, row_mask, cols, col_mask, p_rows, x_cols = dot_program(
        x_ptr, p_ptr, M, N, KW, stride_xm, stride_pn, BLOCK_N, BLOCK_M, BLOCK_KW, SPLIT_K)
    offs_w, x_of_word = unit_offsets(BLOCK_KW, 256)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.int32)  # exact: |sum| <= 128 K < 2^31
    for kw0 in range(kw_start, kw_end, BLOCK_KW):
        words = load_tile(p_rows, kw0 + offs_w, kw_end, row_mask, 0x55555555)
        offs_k = kw0 * 16 + x_of_word
        for f in tl.static_range(16):
            k_f = offs_k + 16 * f
            xt = tl.load(x_cols + k_f[:, None], mask=(k_f < K)[:, None] & col_mask[None, :], other=0)
            acc = tl.dot(_field_to_int8(words, f), xt, acc, out_dtype=tl.int32)  # triton 3.6 needs it spelled out
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    x_scale = tl.load(x_scale_ptr + cols, mask=col_mask, other=1.0)
    z = acc.to(tl.float32) / (scale[:, None] * x_scale[None, :])
    store_tile(z_ptr, z, rows, row_mask, cols, col_mask, stride_zm, SPLIT_K)


step09_w2a8_dot_tuned_few = autotune(W2A8_DOT_CONFIGS_FEW, key=["N", "K", "BLOCK_M"])(step09_w2a8_dot_kernel)
step09_w2a8_dot_tuned_many = autotune(DOT_CONFIGS_MANY, key=["N", "K", "BLOCK_M"])(step09_w2a8_dot_kernel)


# Steps 11 to 14: two weights a 32-bit op, decoded straight into the MMA's A operand.

#: Exponent bits OR-ed into both 16-bit halves of a word before the decode (see pair_weights): bf16 0.5; fp16's
#: are 1.0, 0x3C003C00 (the kernels spell them out: Triton kernels read only constexpr globals).
BF16_HALF_BITS = 0x3F003F00


@triton.jit
def _with_pair_exponent(words, q: tl.constexpr, MAGIC: tl.constexpr):
    # Byte q of each 16-bit half (pairs 4q..4q+3) moved to the bottom of the half, under the exponent
    # bits of the decode. The other byte's bits stay: every decode AND clears them.
    return (words >> (8 * q)) | (0x3C003C00 if MAGIC == tl.float16 else 0x3F003F00)


@triton.jit
def pair_weights(src, f: tl.constexpr, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr):
    # Field f (bits 2f, 2f+1; f < 4) of both halves of words prepared by _with_pair_exponent, as two
    # weights (-1, 0, +1) in a [..., 2] tensor of DOT_DTYPE. One AND keeps the two fields and the
    # exponent bits: in bf16 each half then reads 0.5 + code * 2^(2f-8) exactly (for f = 3 the code's
    # high bit is the exponent's lowest, and 0.5, 0.75, 1.0 are still 0.5 + code / 4); in fp16,
    # 1 + code * 2^(2f-10). One fused multiply-add on the pair (HFMA2) turns that into code - 1.
    bits = src & ((0x00030003 << (2 * f)) | (0x3C003C00 if MAGIC == tl.float16 else 0x3F003F00))
    lo = bits.to(tl.int16).to(MAGIC, bitcast=True).to(DOT_DTYPE)
    hi = (bits >> 16).to(tl.int16).to(MAGIC, bitcast=True).to(DOT_DTYPE)
    if MAGIC == tl.float16:
        lo = lo * (2.0 ** (10 - 2 * f)) - (2.0 ** (10 - 2 * f) + 1.0)
        hi = hi * (2.0 ** (10 - 2 * f)) - (2.0 ** (10 - 2 * f) + 1.0)
    else:
        lo = lo * (2.0 ** (8 - 2 * f)) - (2.0 ** (7 - 2 * f) + 1.0)
        hi = hi * (2.0 ** (8 - 2 * f)) - (2.0 ** (7 - 2 * f) + 1.0)
    return tl.join(lo, hi)


# Step 10: step 6's kernel, launched with the configs below (made for the tensor cores: 64-row tiles, K split)

step10_dot_configs_tuned_few = autotune(DOT_MMA_CONFIGS_FEW, key=["N", "K", "BLOCK_M"])(step06_dot_kernel)
step10_dot_configs_tuned_many = autotune(DOT_MMA_CONFIGS_MANY, key=["N", "K", "M"])(step06_dot_kernel)


# Steps 11 to 13: one kernel, each step a setting of its knobs: NO_MASK (step 12) and MMA_LAYOUT (step 13). Step 14
# decodes its tiles with pair_step at MMA_LAYOUT, as step 13 does.

@triton.jit
def pair_step(acc, words, x_cols, kw0, K, col_mask, r_k, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
              MASK_K: tl.constexpr, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
              MMA_LAYOUT: tl.constexpr):
    # One tile of BLOCK_KW words a row: 8 dots, one a field of both halves, each over 2 * BLOCK_KW weights. r_k:
    # the k of column r of a dot from the tile's start, for field 0. "2bit_mma": field p is k + 32 p (a run of 32
    # a group); "2bit": field j of the low half is k + 16 j, and the high half's column sits 128 further (in r_k).
    for q in tl.static_range(2):
        src = _with_pair_exponent(words, q, MAGIC)
        for f in tl.static_range(4):
            a = tl.reshape(pair_weights(src, f, MAGIC, DOT_DTYPE), (BLOCK_N, 2 * BLOCK_KW))
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
def pair_program(x_ptr, p_ptr, M, N, KW, stride_xm, stride_pn, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
                 SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, NO_MASK: tl.constexpr):
    # A program of steps 11 to 14 (grid: N blocks, K slices, M blocks), a BLOCK_N x BLOCK_M tile of z transposed:
    # its blocks, its weight rows (rows_in: those it reads) and rows of x, their masks and pointers, its slice of K.
    tl.static_assert(BLOCK_KW % 16 == 0)
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
    kw_start, kw_end = k_slice(pid_k, KW, SPLIT_K, BLOCK_KW)
    return pid_n, pid_m, rows, row_mask, rows_in, cols, col_mask, p_rows, x_cols, kw_start, kw_end


@triton.jit
def pair_tiles_unmasked(acc, p_rows, x_cols, offs_w, kw_start, full_end, kw_end, K, col_mask, r_k,
                        BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr,
                        DOT_PRECISION: tl.constexpr, MMA_LAYOUT: tl.constexpr):
    # The tiles [kw_start, kw_end) of rows read unmasked: those below full_end with no mask at all, the rest masked.
    for kw0 in range(kw_start, full_end, BLOCK_KW):
        words = tl.load(p_rows + (kw0 + offs_w)[None, :])
        acc = pair_step(acc, words, x_cols, kw0, K, col_mask, r_k, BLOCK_N, BLOCK_KW, False, MAGIC, DOT_DTYPE,
                        DOT_PRECISION, MMA_LAYOUT)
    for kw0 in range(tl.maximum(kw_start, full_end), kw_end, BLOCK_KW):
        kw = kw0 + offs_w
        words = tl.load(p_rows + kw[None, :], mask=(kw < kw_end)[None, :], other=0x55555555)
        acc = pair_step(acc, words, x_cols, kw0, K, col_mask, r_k, BLOCK_N, BLOCK_KW, True, MAGIC, DOT_DTYPE,
                        DOT_PRECISION, MMA_LAYOUT)
    return acc


@triton.jit(do_not_specialize=["M"])
def pair_dot_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, M, N, K, KW, stride_xm, stride_pn, stride_zm, scale_stride,
                    BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                    MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    NO_MASK: tl.constexpr, MMA_LAYOUT: tl.constexpr):
    # One program: its tile of z over its slice of K (added into z, zeroed by the config's pre_hook), in tiles of
    # BLOCK_KW words a row.
    _, _, rows, row_mask, rows_in, cols, col_mask, p_rows, x_cols, kw_start, kw_end = pair_program(
        x_ptr, p_ptr, M, N, KW, stride_xm, stride_pn, BLOCK_N, BLOCK_KW, SPLIT_K, BLOCK_M, NO_MASK)
    offs_w = tl.arange(0, BLOCK_KW)
    r = tl.arange(0, 2 * BLOCK_KW)
    if MMA_LAYOUT:
        r_k = (r // 32) * 256 + r % 32  # column r of a pair's dot: word r // 2, half r % 2, K-neighbours
    else:
        r_k = ((r // 2) // 16) * 256 + (r // 2) % 16 + 128 * (r % 2)  # the "2bit" layout's halves: 128 apart
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if NO_MASK:
        # Tiles whose k all lie below K need no mask on x: every tile but the last one or two.
        full_end = tl.minimum(kw_end, (K // (16 * BLOCK_KW)) * BLOCK_KW)
        acc = pair_tiles_unmasked(acc, p_rows, x_cols, offs_w, kw_start, full_end, kw_end, K, col_mask, r_k, BLOCK_N,
                                  BLOCK_KW, MAGIC, DOT_DTYPE, DOT_PRECISION, MMA_LAYOUT)
        scale = tl.load(scale_ptr + rows_in * scale_stride)
    else:
        for kw0 in range(kw_start, kw_end, BLOCK_KW):
            words = load_tile(p_rows, kw0 + offs_w, kw_end, row_mask, 0x55555555)
            acc = pair_step(acc, words, x_cols, kw0, K, col_mask, r_k, BLOCK_N, BLOCK_KW, True, MAGIC, DOT_DTYPE,
                            DOT_PRECISION, MMA_LAYOUT)
        scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = acc / scale[:, None]
    store_tile(z_ptr, z, rows, row_mask, cols, col_mask, stride_zm, SPLIT_K)


pair_dot_tuned_few = autotune(DOT_MMA_CONFIGS_FEW, key=["N", "K", "BLOCK_M", "NO_MASK", "MMA_LAYOUT"])(pair_dot_kernel)
pair_dot_tuned_many = autotune(DOT_MMA_CONFIGS_MANY, key=["N", "K", "M", "NO_MASK", "MMA_LAYOUT"])(pair_dot_kernel)


# Step 14: K split through a zeroed workspace, no memset

@triton.jit(do_not_specialize=["M"])
def step14_workspace_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, ws_ptr, count_ptr, M, N, K, KW, stride_xm, stride_pn,
                            stride_zm, scale_stride, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
                            SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, MAGIC: tl.constexpr,
                            DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # One program: step 13's (the activations of a pair are runs of 32 k), its slices of K summed in a workspace.
    pid_n, pid_m, rows, row_mask, rows_in, cols, col_mask, p_rows, x_cols, kw_start, kw_end = pair_program(
        x_ptr, p_ptr, M, N, KW, stride_xm, stride_pn, BLOCK_N, BLOCK_KW, SPLIT_K, BLOCK_M, True)
    # Tiles whose k all lie below K need no mask on x: every tile but the last one or two.
    full_end = tl.minimum(kw_end, (K // (16 * BLOCK_KW)) * BLOCK_KW)
    offs_w = tl.arange(0, BLOCK_KW)
    r = tl.arange(0, 2 * BLOCK_KW)
    r_k = (r // 32) * 256 + r % 32  # column r of a pair's dot: word r // 2, half r % 2
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc = pair_tiles_unmasked(acc, p_rows, x_cols, offs_w, kw_start, full_end, kw_end, K, col_mask, r_k, BLOCK_N,
                              BLOCK_KW, MAGIC, DOT_DTYPE, DOT_PRECISION, True)
    scale = tl.load(scale_ptr + rows_in * scale_stride)
    z = acc / scale[:, None]
    out_mask = row_mask[:, None] & col_mask[None, :]
    z_offs = cols.to(tl.int64)[None, :] * stride_zm + rows[:, None]
    if SPLIT_K == 1:
        tl.store(z_ptr + z_offs, z, mask=out_mask)
    else:
        # The slices add into a workspace that is all zeros between launches; the last slice of a tile
        # to arrive (a counter per tile) swaps the sums out for zeros and stores them. No memset, and
        # z is written once, by a plain store.
        ws_offs = cols.to(tl.int64)[None, :] * N + rows[:, None]
        tl.atomic_add(ws_ptr + ws_offs, z, mask=out_mask, sem="relaxed")
        tl.debug_barrier()  # every thread's partial sums are in before the tile's counter moves
        tile = pid_m * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            # (exchanged as int32 bits: the interpreter has no float exchange)
            bits = tl.atomic_xchg(ws_ptr.to(tl.pointer_type(tl.int32)) + ws_offs, 0, mask=out_mask, sem="relaxed")
            tl.store(z_ptr + z_offs, bits.to(tl.float32, bitcast=True), mask=out_mask)
            tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed")


step14_workspace_tuned_few = autotune(MMA_CONFIGS_FEW, key=["N", "K", "BLOCK_M"])(step14_workspace_kernel)
step14_workspace_tuned_many = autotune(MMA_CONFIGS_MANY, key=["N", "K", "M"])(step14_workspace_kernel)


# The wrappers

def step09_w2a8_dot(xq: Int8[Tensor, "*m k"], x_scale: Float[Tensor, " m"], w: PackedTernary, scale: Scale = 1.0, *,
                    out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 9: ``z = (xq @ W.T) / (x_scale[:, None] * scale)`` with int8 activations (from
    :func:`quantize_activations`), 2-bit weights and exact int32 sums on the tensor cores."""
    m = xq.shape[0] if isinstance(xq, Tensor) and xq.ndim == 2 else 1
    check_tensor("x_scale", x_scale, dtype=torch.float32, shape=(m,), contiguous=True)  # one scale a row of xq
    check_device(x_scale, "x_scale")
    x2, vector, w, s, s_stride, z = check_packed_call(xq, w, scale, out, "2bit", dtypes=(torch.int8,), x_name="xq")
    launch_dot((step09_w2a8_dot_tuned_few, step09_w2a8_dot_tuned_many), x2, w, s, s_stride, z, config, {}, (x_scale,))
    return z[0] if vector else z


#: Step 14's split-K workspace (its sums must stay zeros between launches: see step14_workspace_kernel).
SPLIT_WORKSPACE = SplitWorkspace()


def mma_meta(x_dtype: torch.dtype) -> dict:
    """MAGIC, DOT_DTYPE and DOT_PRECISION of steps 11 to 14: the weights decoded and the dot in x's type."""
    return {"MAGIC": TL_DTYPES[x_dtype], **dot_meta(torch.float32 if runtime.mode() == "interpreter" else x_dtype)}


def step10_dot_configs(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                       out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 10: step 6's kernel at configs made for the tensor cores (64-row tiles, K in 2 to 8 slices)."""
    return dot_step((step10_dot_configs_tuned_few, step10_dot_configs_tuned_many), x, w, scale, out, config, "2bit")


def _pair_dot(x: Any, w: Any, scale: Any, out: Optional[Tensor], config: Optional[dict], fmt: str,
              no_mask: bool, mma_layout: bool) -> Tensor:
    """Steps 11 to 13: the pair decode at their knobs (``fmt``: the layout step 13 makes, "2bit_mma")."""
    x2, vector, w, s, s_stride, z = check_packed_call(x, w, scale, out, fmt, dtypes=MMA_X_DTYPES)
    launch_dot((pair_dot_tuned_few, pair_dot_tuned_many), x2, w, s, s_stride, z, config,
               {**mma_meta(x2.dtype), "NO_MASK": no_mask, "MMA_LAYOUT": mma_layout})
    return z[0] if vector else z


def step11_pair_decode(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                       out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 11: step 10 with two weights decoded by one AND and one packed multiply-add into the MMA's operand, on
    the ``"2bit"`` layout (a word's halves are 128 apart along K: x is gathered); bf16/fp16 x."""
    return _pair_dot(x, w, scale, out, config, "2bit", no_mask=False, mma_layout=False)


def step12_unmasked(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                    out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 12: step 11 with no masks in its loop: rows past N read row N - 1, tiles below K load x unmasked."""
    return _pair_dot(x, w, scale, out, config, "2bit", no_mask=True, mma_layout=False)


def step13_mma_layout(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                      out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 13: step 12 on the ``"2bit_mma"`` layout: a word's two halves are K-neighbours, so the decoded pair is
    the MMA's operand and a field's x is a run of 32 consecutive k."""
    return _pair_dot(x, w, scale, out, config, "2bit_mma", no_mask=True, mma_layout=True)


def step14_workspace(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                     out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 14: step 13 with K split through a workspace that stays zeros between launches (the last slice of a
    tile stores z and restores the zeros): no memset, one plain store of z; one kernel for every M."""
    x2, vector, w, s, s_stride, z = check_packed_call(x, w, scale, out, "2bit_mma", dtypes=MMA_X_DTYPES)
    sums, counts = SPLIT_WORKSPACE.get(x2.device, x2.shape[0], w.n)
    launch_dot((step14_workspace_tuned_few, step14_workspace_tuned_many), x2, w, s, s_stride, z, config,
               mma_meta(x2.dtype), (sums, counts), zero_output=False)
    return z[0] if vector else z
