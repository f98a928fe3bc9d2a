"""The Triton kernels of steps 2 to 5: flash-attention forwards under the multi-item mask.

Layout: ``q``, ``k``, ``v`` and ``out`` are ``[heads, tokens, head_dim]`` with a unit stride on ``head_dim``;
``k`` and ``v`` may have fewer heads (grouped-query attention): query head ``h`` reads key/value head
``h // KV_GROUP``.
Every kernel keeps, per query row, the running maximum ``m_i`` (in log2 units), the running sum ``l_i`` and
the unnormalised output ``acc`` (online softmax); scores are scaled by ``sm_scale * log2(e)`` so the
exponentials are ``exp2``.

* step 2, :func:`attn_fwd_dense_mask`: every key tile, the visibility read from a dense ``[S, S]`` mask;
* step 3, :func:`attn_fwd_mask_on_the_fly`: every key tile, the visibility computed from the prefix length
  and where each row's own keys start (``row - pos[row] + SKIP_DELIMITER``; the constexpr is 1 under
  FlashInfer's rule, 0 when the delimiter is visible, see :mod:`studylog.multi_item.formats`);
* step 4, :func:`attn_fwd_tile_skip`: three ranges of key tiles per query tile (whole prefix tiles without
  mask arithmetic, the rest of the prefix, the items from the first key of the first item row's item on),
  each walked by :func:`attend_key_tiles`; the tiles between the prefix and that key are never loaded;
* step 5, :func:`attn_fwd_batched`: step 4's body for every prompt of a packed batch in one launch, program
  ``i`` reading what it computes from entry ``i`` of a table planned on the host
  (:func:`studylog.multi_item.tiles.schedule_table`).

The wrappers that check inputs and launch these are in :mod:`studylog.multi_item.steps`; on the GPU the
kernels are autotuned over :mod:`studylog.multi_item.config`'s tile shapes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from studylog.multi_item.config import FEW_GPU_CONFIGS, GPU_CONFIGS, tuned

# -- step 2 -----------------------------------------------------------------------------------

@tuned(FEW_GPU_CONFIGS)
@triton.jit
def attn_fwd_dense_mask(
    Q, K, V, Out, Mask,
    stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt, stride_oh, stride_ot,
    seq_len, qk_scale,
    HEAD_DIM: tl.constexpr, KV_GROUP: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    q = tl.load(Q + off_h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + (off_h // KV_GROUP) * stride_kh  # query heads off_h share one key/value head
    v_base = V + (off_h // KV_GROUP) * stride_vh
    # running max (finite: a row may see no key in its first tiles), running sum, unnormalised output
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < seq_len
        k = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None], mask=col_ok[None, :], other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        mask_tile = Mask + offs_m[:, None].to(tl.int64) * seq_len + cols[None, :]
        visible = tl.load(mask_tile, mask=row_ok[:, None] & col_ok[None, :], other=0) != 0
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # scale after the max: qk_scale > 0
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one fused multiply-add per score
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    # a row that saw no key would divide 0 by 0; it is written 0 (FlashInfer's convention)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + off_h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None])


# -- step 3 -----------------------------------------------------------------------------------

@tuned(FEW_GPU_CONFIGS)
@triton.jit
def attn_fwd_mask_on_the_fly(
    Q, K, V, Out, Pos,
    stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt, stride_oh, stride_ot,
    seq_len, prefix_len, qk_scale,
    HEAD_DIM: tl.constexpr, KV_GROUP: tl.constexpr, DOT_PRECISION: tl.constexpr, SKIP_DELIMITER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    q = tl.load(Q + off_h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + (off_h // KV_GROUP) * stride_kh  # query heads off_h share one key/value head
    v_base = V + (off_h // KV_GROUP) * stride_vh
    # where each row's own keys start: its item's delimiter, plus SKIP_DELIMITER (1 under FlashInfer's rule,
    # which hides the delimiter from its item and a delimiter from itself); prefix rows get their own index
    # (plus SKIP_DELIMITER), and see their keys through the test keys < prefix_len
    in_items = row_ok & (offs_m >= prefix_len)
    row_start = offs_m + SKIP_DELIMITER - tl.load(Pos + offs_m - prefix_len, mask=in_items, other=0)
    # running max (finite: a row may see no key in its first tiles), running sum, unnormalised output
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < seq_len
        k = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None], mask=col_ok[None, :], other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        # keys past seq_len pass this test only for rows past seq_len, which are never stored
        keys = cols[None, :]
        visible = (keys <= offs_m[:, None]) & ((keys < prefix_len) | (keys >= row_start[:, None]))
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # scale after the max: qk_scale > 0
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one fused multiply-add per score
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    # a row that saw no key would divide 0 by 0; it is written 0 (FlashInfer's convention)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + off_h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None])


# -- step 4 -----------------------------------------------------------------------------------

@triton.jit
def _attend_key_tiles(
    acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start, prefix_len, seq_len, lo, hi, qk_scale,
    MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Step 3's loop body over the key tiles ``[lo, hi)``; ``MASKED=False`` for tiles every row sees whole."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if MASKED:
            col_ok = cols < seq_len
            k = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None], mask=col_ok[None, :], other=0.0)
            v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        else:  # whole prefix tiles: in bounds by construction
            k = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None])
            v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :])
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)
        if MASKED:
            keys = cols[None, :]
            visible = (keys <= offs_m[:, None]) & ((keys < prefix_len) | (keys >= row_start[:, None]))
            qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # scale after the max: qk_scale > 0
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one fused multiply-add per score
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@tuned(GPU_CONFIGS, key=("HEAD_DIM", "size_bucket"))
@triton.jit
def attn_fwd_tile_skip(
    Q, K, V, Out, Pos, TileCounts,
    stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt, stride_oh, stride_ot,
    seq_len, prefix_len, qk_scale, size_bucket,
    HEAD_DIM: tl.constexpr, KV_GROUP: tl.constexpr, DOT_PRECISION: tl.constexpr, SKIP_DELIMITER: tl.constexpr,
    COUNT_TILES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    q = tl.load(Q + off_h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + (off_h // KV_GROUP) * stride_kh  # query heads off_h share one key/value head
    v_base = V + (off_h // KV_GROUP) * stride_vh
    # where each row's own keys start: its item's delimiter, plus SKIP_DELIMITER (1 under FlashInfer's rule,
    # which hides the delimiter from its item and a delimiter from itself); prefix rows get their own index
    # (plus SKIP_DELIMITER), and see their keys through the test keys < prefix_len
    in_items = row_ok & (offs_m >= prefix_len)
    row_start = offs_m + SKIP_DELIMITER - tl.load(Pos + offs_m - prefix_len, mask=in_items, other=0)
    # running max (finite: a row may see no key in its first tiles), running sum, unnormalised output
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    m_lo = start_m * BLOCK_M
    m_hi = tl.minimum(m_lo + BLOCK_M, seq_len)
    # 1. prefix tiles every row sees whole (keys < P and <= the first row): no mask arithmetic
    full_hi = (tl.minimum(prefix_len, m_lo + 1) // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, 0, full_hi, qk_scale,
                                      False, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    # 2. the rest of the prefix, up to the diagonal
    prefix_hi = tl.cdiv(tl.minimum(prefix_len, m_hi), BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, full_hi, prefix_hi, qk_scale,
                                      True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    # 3. the items, from the first key the first item row's item shows it (row starts never decrease down the
    # rows): the tiles between are never loaded
    first_item_row = tl.maximum(m_lo, prefix_len)
    items_lo = first_item_row + SKIP_DELIMITER - tl.load(Pos + first_item_row - prefix_len)
    items_lo = tl.maximum((items_lo // BLOCK_N) * BLOCK_N, prefix_hi)
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, items_lo, m_hi, qk_scale,
                                      True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    if COUNT_TILES:  # how many key tiles this query tile visited (tests and the tile-skip figure)
        visited = prefix_hi // BLOCK_N + tl.maximum(tl.cdiv(m_hi - items_lo, BLOCK_N), 0)
        tl.store(TileCounts + start_m, visited, mask=off_h == 0)
    # a row that saw no key would divide 0 by 0; it is written 0 (FlashInfer's convention)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + off_h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None])


# -- step 5 -----------------------------------------------------------------------------------

@tuned(GPU_CONFIGS, key=("HEAD_DIM", "size_bucket"))
@triton.jit
def attn_fwd_batched(
    Q, K, V, Out, Schedule, stride_schedule, Pos, stride_pos, TileCounts, stride_counts,
    stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt, stride_oh, stride_ot,
    qk_scale, size_bucket,
    HEAD_DIM: tl.constexpr, KV_GROUP: tl.constexpr, DOT_PRECISION: tl.constexpr, SKIP_DELIMITER: tl.constexpr,
    COUNT_TILES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # One program per (prompt, query tile, head), in the order the host planned (schedule_table): the GPU
    # starts programs roughly in index order, so entry i says what program i computes. The table has one row
    # per tile height (16, 32, 64, 128 rows); each entry carries its prompt's offsets, so one round of loads
    # from a single 32-byte entry is all the lookup a program does, and no program is empty.
    work = Schedule + ((BLOCK_M >= 32) + (BLOCK_M >= 64) + (BLOCK_M >= 128)) * stride_schedule \
        + tl.program_id(0) * 8
    prompt = tl.load(work)
    start_m = tl.load(work + 1)
    off_h = tl.load(work + 2).to(tl.int64)
    seq_begin = tl.load(work + 3)
    seq_len = tl.load(work + 4)
    prefix_len = tl.load(work + 5)
    Q += seq_begin.to(tl.int64) * stride_qt
    K += seq_begin.to(tl.int64) * stride_kt
    V += seq_begin.to(tl.int64) * stride_vt
    Out += seq_begin.to(tl.int64) * stride_ot
    Pos += prompt.to(tl.int64) * stride_pos
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    q = tl.load(Q + off_h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + (off_h // KV_GROUP) * stride_kh  # query heads off_h share one key/value head
    v_base = V + (off_h // KV_GROUP) * stride_vh
    # where each row's own keys start: its item's delimiter, plus SKIP_DELIMITER (1 under FlashInfer's rule,
    # which hides the delimiter from its item and a delimiter from itself); prefix rows get their own index
    # (plus SKIP_DELIMITER), and see their keys through the test keys < prefix_len
    in_items = row_ok & (offs_m >= prefix_len)
    row_start = offs_m + SKIP_DELIMITER - tl.load(Pos + offs_m - prefix_len, mask=in_items, other=0)
    # running max (finite: a row may see no key in its first tiles), running sum, unnormalised output
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    m_lo = start_m * BLOCK_M
    m_hi = tl.minimum(m_lo + BLOCK_M, seq_len)
    # 1. prefix tiles every row sees whole (keys < P and <= the first row): no mask arithmetic
    full_hi = (tl.minimum(prefix_len, m_lo + 1) // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, 0, full_hi, qk_scale,
                                      False, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    # 2. the rest of the prefix, up to the diagonal
    prefix_hi = tl.cdiv(tl.minimum(prefix_len, m_hi), BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, full_hi, prefix_hi, qk_scale,
                                      True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    # 3. the items, from the first key the first item row's item shows it (row starts never decrease down the
    # rows): the tiles between are never loaded
    first_item_row = tl.maximum(m_lo, prefix_len)
    items_lo = first_item_row + SKIP_DELIMITER - tl.load(Pos + first_item_row - prefix_len)
    items_lo = tl.maximum((items_lo // BLOCK_N) * BLOCK_N, prefix_hi)
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, items_lo, m_hi, qk_scale,
                                      True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    if COUNT_TILES:  # how many key tiles this query tile visited (tests and the tile-skip figure)
        visited = prefix_hi // BLOCK_N + tl.maximum(tl.cdiv(m_hi - items_lo, BLOCK_N), 0)
        tl.store(TileCounts + prompt * stride_counts + start_m, visited, mask=off_h == 0)
    # a row that saw no key would divide 0 by 0; it is written 0 (FlashInfer's convention)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + off_h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None])


#: The loop over a range of key tiles that steps 4 and 5 call once per range (its Triton name keeps the
#: leading underscore it was written with, so the kernels that call it are unchanged).
attend_key_tiles = _attend_key_tiles
