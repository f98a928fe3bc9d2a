"""Step 6 of the chapter (listed in :data:`studylog.multi_item.steps.STEPS`): under grouped-query attention, the
query heads that share a key/value head computed in one tile, so each key/value tile is loaded once for the
group instead of once per query head.

It is a module of its own because ``steps.py`` would otherwise pass the library's limit on a module's length;
``steps`` imports it after defining the helpers it uses (the launch, the input checks, the key-tile loop).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from studylog.multi_item.config import (
    GPU_CONFIGS,
    LaunchInfo,
    find_config,
    size_bucket,
    strides,
    tuned,
)
from studylog.multi_item.formats import DEFAULT_RULE, ITEM_KEYS_FROM, MultiItemBatch
from studylog.multi_item.steps import QKV, attend_key_tiles, launch, no_counts, prepare_launch, tile_heights
from studylog.multi_item.tiles import DEFAULT_ORDER, SCHEDULE_ORDERS, schedule_table


# ---------------------------------------------------------------------------------------------
# Step 6: the query heads of a key/value group in one tile
# ---------------------------------------------------------------------------------------------

@tuned(GPU_CONFIGS, key=("HEAD_DIM", "size_bucket"))
@triton.jit
def attn_fwd_packed_heads(
    Q, K, V, Out, Schedule, stride_schedule, Pos, stride_pos, TileCounts, stride_counts,
    stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt, stride_oh, stride_ot,
    qk_scale, size_bucket,
    HEAD_DIM: tl.constexpr, KV_GROUP: tl.constexpr, DOT_PRECISION: tl.constexpr, SKIP_DELIMITER: tl.constexpr,
    COUNT_TILES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # One program per (prompt, token tile, key/value head), in the order the host planned: the schedule row
    # BLOCK_M selects holds tiles of BLOCK_M // KV_GROUP tokens (schedule_table's rows_per_token), one entry of
    # (prompt, token tile, key/value head, seq_begin, seq_len, prefix_len) per program.
    TOKENS: tl.constexpr = BLOCK_M // KV_GROUP
    work = Schedule + ((BLOCK_M >= 32) + (BLOCK_M >= 64) + (BLOCK_M >= 128)) * stride_schedule \
        + tl.program_id(0) * 8
    prompt = tl.load(work)
    start_m = tl.load(work + 1)
    off_kv = tl.load(work + 2).to(tl.int64)
    seq_begin = tl.load(work + 3)
    seq_len = tl.load(work + 4)
    prefix_len = tl.load(work + 5)
    Q += seq_begin.to(tl.int64) * stride_qt
    K += seq_begin.to(tl.int64) * stride_kt
    V += seq_begin.to(tl.int64) * stride_vt
    Out += seq_begin.to(tl.int64) * stride_ot
    Pos += prompt.to(tl.int64) * stride_pos
    # row r is (token m_lo + r // KV_GROUP, query head off_kv * KV_GROUP + r % KV_GROUP): the group's heads side
    # by side, so every key/value tile loaded below serves all of them. Tokens never decrease down the rows,
    # which the item range below needs. Rows from TOKENS * KV_GROUP on (KV_GROUP not dividing BLOCK_M) hold no
    # pair: masked off like the rows past the prompt's end, and never stored.
    rows = tl.arange(0, BLOCK_M)
    m_lo = start_m * TOKENS
    offs_m = m_lo + rows // KV_GROUP
    off_h = off_kv * KV_GROUP + (rows % KV_GROUP).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = (rows < TOKENS * KV_GROUP) & (offs_m < seq_len)
    q = tl.load(Q + off_h[:, None] * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    k_base = K + off_kv * stride_kh
    v_base = V + off_kv * stride_vh
    # where each row's own keys start: its item's delimiter, plus SKIP_DELIMITER (1 under FlashInfer's rule,
    # which hides the delimiter from its item and a delimiter from itself); prefix rows get their own index
    # (plus SKIP_DELIMITER), and see their keys through the test keys < prefix_len
    in_items = row_ok & (offs_m >= prefix_len)
    row_start = offs_m + SKIP_DELIMITER - tl.load(Pos + offs_m - prefix_len, mask=in_items, other=0)
    # running max (finite: a row may see no key in its first tiles), running sum, unnormalised output
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # the key ranges are step 5's, in tokens: the tile's tokens are [m_lo, m_hi)
    m_hi = tl.minimum(m_lo + TOKENS, seq_len)
    # 1. prefix tiles every row sees whole (keys < P and <= the first row): no mask arithmetic
    full_hi = (tl.minimum(prefix_len, m_lo + 1) // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, 0, full_hi, qk_scale,
                                      False, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    # 2. the rest of the prefix, up to the diagonal
    prefix_hi = tl.cdiv(tl.minimum(prefix_len, m_hi), BLOCK_N) * BLOCK_N
    acc, l_i, m_i = attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, full_hi, prefix_hi, qk_scale,
                                      True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    # 3. the items, from the first key the first item token's item shows it: the tiles between are never loaded
    first_item_row = tl.maximum(m_lo, prefix_len)
    items_lo = first_item_row + SKIP_DELIMITER - tl.load(Pos + first_item_row - prefix_len)
    items_lo = tl.maximum((items_lo // BLOCK_N) * BLOCK_N, prefix_hi)
    acc, l_i, m_i = attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, items_lo, m_hi, qk_scale,
                                      True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    if COUNT_TILES:  # how many key tiles this token tile visited, once per tile (the first key/value head)
        visited = prefix_hi // BLOCK_N + tl.maximum(tl.cdiv(m_hi - items_lo, BLOCK_N), 0)
        tl.store(TileCounts + prompt * stride_counts + start_m, visited, mask=off_kv == 0)
    # a row that saw no key would divide 0 by 0; it is written 0 (FlashInfer's convention)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + off_h[:, None] * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=row_ok[:, None])


def step06_packed_heads(q: QKV, k: QKV, v: QKV, batch: MultiItemBatch, *, sm_scale: float | None = None,
                        out: QKV | None = None, blocks: tuple[int, int] | None = None, config: str | None = None,
                        rule: str = DEFAULT_RULE, count_tiles: bool = False, order: str = DEFAULT_ORDER,
                        return_info: bool = False) -> QKV | tuple[QKV, LaunchInfo]:
    """Step 6: step 5 with one program per (prompt, token tile, key/value head), whose ``BLOCK_M`` rows are the
    (token, query head) pairs of ``BLOCK_M // KV_GROUP`` tokens and the group's ``KV_GROUP = q heads // k heads``
    query heads, so each key/value tile is loaded once for the group. With ``KV_GROUP = 1`` it computes what
    :func:`~studylog.multi_item.steps.step05_batched` computes.

    Takes what step 5 takes; ``BLOCK_M`` must be at least ``KV_GROUP`` (a tile holds a token at least).
    ``count_tiles`` counts the key tiles each token tile visits, per prompt: ``LaunchInfo.tile_counts`` is
    what :func:`~studylog.multi_item.tiles.planned_key_tiles` plans at ``BLOCK_M // KV_GROUP`` x ``BLOCK_N``
    (``LaunchInfo.block_m`` is the kernel's ``BLOCK_M``, in rows)."""
    qk_scale, out, common = prepare_launch("step06_packed_heads", q, k, v, batch, sm_scale, out, blocks, rule,
                                     one_prompt=False)
    if order not in SCHEDULE_ORDERS:
        raise ValueError(f"order must be one of {SCHEDULE_ORDERS}, got {order!r}")
    cfg = find_config(config, blocks)
    group = common["KV_GROUP"]
    kv_heads, _, head_dim = k.shape
    heights = tile_heights(cfg, blocks)
    if group > min(heights):
        raise ValueError(f"step06_packed_heads puts a token's {group} query heads (q's heads over k's) in one tile: "
                         f"BLOCK_M must be at least {group}, got {min(heights)} (pass blocks or config)")
    # the programs' heads are key/value heads: a key and a value per token each
    kv_bytes = 2 * head_dim * q.element_size()
    table, programs = schedule_table(batch, kv_heads, order, heights, kv_bytes, rule, rows_per_token=group)
    max_tiles = triton.cdiv(batch.max_seq_len, min(heights) // group)  # token tiles of a prompt, at most
    counts = (torch.full((batch.batch_size * max_tiles,), -1, dtype=torch.int32, device=q.device) if count_tiles
              else no_counts(q.device))
    grid = lambda meta: (programs[meta["BLOCK_M"]],)  # noqa: E731
    args = [q, k, v, out, table, table.stride(0), batch.token_pos, batch.token_pos.stride(0), counts, max_tiles,
            *strides(q, k, v, out), qk_scale, size_bucket(batch.total_tokens)]
    common.update(SKIP_DELIMITER=ITEM_KEYS_FROM[rule], COUNT_TILES=count_tiles)
    block_m, block_n, name = launch(attn_fwd_packed_heads, grid, args, common, blocks, cfg)
    if not return_info:
        return out
    tile_counts = None
    if count_tiles:
        rows = counts.view(batch.batch_size, max_tiles).tolist()
        tile_counts = [row[: triton.cdiv(s, block_m // group)] for row, s in zip(rows, batch.seq_lens)]
    return out, LaunchInfo(6, block_m, block_n, tile_counts, name)
