"""Steps 0-3: the Triton matmul tutorial's structure (all logits, then ``masked_fill``), then three ways for a
tiled matmul to skip what the grammar forbids: empty blocks (step 1), disallowed columns (step 2), and disallowed
rows of the ``[V, D]`` layout, whole cache lines with the loads left vectorised (step 3).
"""

from __future__ import annotations

import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

from studylog import runtime  # noqa: F401  (selects GPU or interpreter before kernels are defined)
from studylog.masked_lm_head.formats import (AllowedTokens, Hidden, Logits, Tiles, Weight, check_inputs, default_tiles,
                                             need_layout, output, tile_constexprs)

WDV = Float[Tensor, "d v"]  # the post's layout of the weight

# Step 0: dense, the Triton matmul tutorial's structure (C[M, N] = A[M, K] @ B[K, N])
# Here A = h [B, D] and "B" is the head seen as [D, V]: its strides say which layout it has.

@triton.jit
def grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's output tile (pid_m, pid_n) in the matmul tutorial's grouped order: GROUP_M row tiles
    walk the column tiles together, so the B tiles they share are read from L2. Steps 0-3 and 11 use it."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def masked_tile(allowed_ptr, M, N, stride_allowed_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's output tile (:func:`grouped_tile`) as steps 1-3 and 11 start it: its rows, columns and first
    K offsets, which of its outputs exist, and its tile of the mask."""
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    allowed = tl.load(allowed_ptr + offs_m[:, None] * stride_allowed_m + offs_n[None, :], mask=c_mask, other=0)
    return offs_m, offs_n, offs_k, c_mask, allowed


@triton.jit
def store_allowed(c_ptrs, acc, allowed_ptr, offs_m, offs_n, stride_allowed_m, c_mask):
    """The tile's logits where its mask allows them, ``-inf`` elsewhere (steps 1-3 and 11)."""
    # reload the mask tile (an L1/L2 hit) rather than hold it in registers through the loop
    allowed = tl.load(allowed_ptr + offs_m[:, None] * stride_allowed_m + offs_n[None, :], mask=c_mask, other=0)
    tl.store(c_ptrs, tl.where(allowed != 0, acc, float("-inf")), mask=c_mask)


@triton.jit
def dot_kn(a_ptr, b_ptr, offs_m, offs_n, offs_k, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, wanted,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """The tile's fp32 products, the tutorial's loop over K (steps 0-2): A's rows ``offs_m`` times B's columns
    ``offs_n``, B read in [BLOCK_K, BLOCK_N] tiles; where ``wanted`` is given (step 2), only its columns are read."""
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b_mask = (offs_k[:, None] < k_left) & (offs_n[None, :] < N)
        if wanted is not None:  # step 2: only the columns that some sequence of the tile allows
            b_mask = b_mask & wanted[None, :]
        b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def dense_matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = dot_kn(a_ptr, b_ptr, offs_m, offs_n, offs_k, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                 None, BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE)

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc, mask=c_mask)


# Step 1: block-level skip (the post's section 3.1). Step 2 (COLUMN_SKIP, section 3.2): inside an active block,
# disallowed columns are not loaded. One kernel, each step's page listing rendered at its knob.

@triton.jit
def block_skip_kernel(
    a_ptr, b_ptr, c_ptr, allowed_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_allowed_m,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr, COLUMN_SKIP: tl.constexpr,
):
    offs_m, offs_n, offs_k, c_mask, allowed = masked_tile(allowed_ptr, M, N, stride_allowed_m, BLOCK_M, BLOCK_N,
                                                          BLOCK_K, GROUP_M)
    if tl.sum(allowed.to(tl.int32)) == 0:  # nothing allowed in this block: no loads, no math
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, tl.full((BLOCK_M, BLOCK_N), float("-inf"), tl.float32), mask=c_mask)
        return
    if COLUMN_SKIP:
        column_wanted = tl.max(allowed.to(tl.int32), axis=0) != 0  # some sequence of the tile allows it
        acc = dot_kn(a_ptr, b_ptr, offs_m, offs_n, offs_k, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     column_wanted, BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE)
    else:
        acc = dot_kn(a_ptr, b_ptr, offs_m, offs_n, offs_k, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     None, BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE)

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    store_allowed(c_ptrs, acc, allowed_ptr, offs_m, offs_n, stride_allowed_m, c_mask)


# Step 3: the [V, D] layout written as rows: a token is one contiguous row of the weight

@triton.jit
def dot_rows(a_ptr, b_ptr, offs_m, offs_n, offs_k, m_ok, n_ok, row_wanted, K, stride_am, stride_bn,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """The tile's fp32 products, B read as rows of the ``[V, D]`` weight: A's rows ``offs_m`` (0 where not ``m_ok``,
    a ``[BLOCK_M, 1]`` mask) times the weight's rows ``offs_n`` where ``n_ok`` (``[BLOCK_N, 1]``) and, where given,
    ``row_wanted``; the others are not read. The loop of steps 3, 10 and 11."""
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_n[:, None].to(tl.int64) * stride_bn + offs_k[None, :]  # [BLOCK_N, BLOCK_K]: rows

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=m_ok & (offs_k[None, :] < k_left), other=0.0)
        b_ok = n_ok
        if row_wanted is not None:  # steps 3 and 11: only the tokens some sequence of the tile allows
            b_ok = b_ok & row_wanted[:, None]
        b = tl.load(b_ptrs, mask=b_ok & (offs_k[None, :] < k_left), other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), tl.trans(b.to(DOT_DTYPE)), acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    return acc


@triton.jit
def row_skip_kernel(
    a_ptr, b_ptr, c_ptr, allowed_ptr, M, N, K,
    stride_am, stride_bn, stride_cm, stride_allowed_m,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    offs_m, offs_n, offs_k, c_mask, allowed = masked_tile(allowed_ptr, M, N, stride_allowed_m, BLOCK_M, BLOCK_N,
                                                          BLOCK_K, GROUP_M)
    if tl.sum(allowed.to(tl.int32)) == 0:  # nothing allowed in this block: no loads, no math
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, tl.full((BLOCK_M, BLOCK_N), float("-inf"), tl.float32), mask=c_mask)
        return
    row_wanted = tl.max(allowed.to(tl.int32), axis=0) != 0  # some sequence of the tile allows this token
    acc = dot_rows(a_ptr, b_ptr, offs_m, offs_n, offs_k, offs_m[:, None] < M, offs_n[:, None] < N, row_wanted, K,
                   stride_am, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE)

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    store_allowed(c_ptrs, acc, allowed_ptr, offs_m, offs_n, stride_allowed_m, c_mask)


def _tiled_matmul(kernel, h, weight, allowed, layout, out, tiles, step, **knobs):
    """Steps 0 to 2: one program per output tile, grouped; steps 1 and 2's kernel also reads the mask."""
    batch, vocab, hidden = check_inputs(h, weight, allowed, layout, out)
    t = tiles or default_tiles(step, batch)
    out = output(out, batch, vocab, h.device)
    # the weight's strides along D and along V: those of the [D, V] matrix 'B' in C = A @ B
    s_bk, s_bn = (weight.stride(1), weight.stride(0)) if layout == "vd" else (weight.stride(0), weight.stride(1))
    mask, mask_stride = ((allowed.mask_u8,), (allowed.mask.stride(0),)) if step else ((), ())
    kernel[(triton.cdiv(batch, t.block_b) * triton.cdiv(vocab, t.block_v),)](
        h, weight, out, *mask, batch, vocab, hidden, h.stride(0), h.stride(1), s_bk, s_bn,
        out.stride(0), out.stride(1), *mask_stride, **tile_constexprs(t, h.dtype), **knobs)
    return out


def step00_dense(h: Hidden, weight: Weight | WDV, allowed: AllowedTokens, *, layout: str = "vd",
                 out: Logits | None = None, tiles: Tiles | None = None) -> Logits:
    """Step 0: every logit (tutorial matmul), then torch's ``masked_fill`` writes the ``-inf``."""
    out = _tiled_matmul(dense_matmul_kernel, h, weight, allowed, layout, out, tiles, 0)
    return out.masked_fill_(allowed.disallowed, float("-inf"))


def step01_block_skip(h: Hidden, weight: Weight | WDV, allowed: AllowedTokens, *, layout: str = "vd",
                      out: Logits | None = None, tiles: Tiles | None = None) -> Logits:
    """Step 1: blocks without an allowed token are skipped; active blocks mask their output."""
    return _tiled_matmul(block_skip_kernel, h, weight, allowed, layout, out, tiles, 1, COLUMN_SKIP=False)


def step02_column_skip(h: Hidden, weight: Weight | WDV, allowed: AllowedTokens, *, layout: str = "vd",
                       out: Logits | None = None, tiles: Tiles | None = None) -> Logits:
    """Step 2: step 1, and inside an active block the disallowed columns are not loaded."""
    return _tiled_matmul(block_skip_kernel, h, weight, allowed, layout, out, tiles, 2, COLUMN_SKIP=True)


def step03_row_skip(h: Hidden, weight: Weight, allowed: AllowedTokens, *, layout: str = "vd", out: Logits | None = None,
                    tiles: Tiles | None = None) -> Logits:
    """Step 3: block skip + row skip on the ``[V, D]`` layout (a disallowed token = a row not read)."""
    need_layout("step03_row_skip", layout)
    batch, vocab, hidden = check_inputs(h, weight, allowed, layout, out)
    t = tiles or default_tiles(3, batch)
    out = output(out, batch, vocab, h.device)
    row_skip_kernel[(triton.cdiv(batch, t.block_b) * triton.cdiv(vocab, t.block_v),)](
        h, weight, out, allowed.mask_u8, batch, vocab, hidden,
        h.stride(0), weight.stride(0), out.stride(0), allowed.mask.stride(0), **tile_constexprs(t, h.dtype))
    return out
