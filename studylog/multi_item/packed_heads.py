"""Step 6: under grouped-query attention, the query heads that share a key/value head computed in one tile, so
each key/value tile is loaded once for the group (``steps`` imports it after the helpers it uses).
"""

from __future__ import annotations

import triton
import triton.language as tl

from studylog.multi_item.config import GPU_CONFIGS, LaunchInfo, tuned
from studylog.multi_item.formats import DEFAULT_RULE, MultiItemBatch
from studylog.multi_item.steps import (QKV, attend_visible_tiles, item_row_start, launch_scheduled, scheduled_tile,
                                       softmax_start, store_rows)
from studylog.multi_item.tiles import DEFAULT_ORDER


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
    # BLOCK_M selects holds tiles of BLOCK_M // KV_GROUP tokens (schedule_table's rows_per_token).
    TOKENS: tl.constexpr = BLOCK_M // KV_GROUP
    prompt, start_m, off_kv, seq_len, prefix_len, Q, K, V, Out, Pos = scheduled_tile(
        Schedule, stride_schedule, Q, K, V, Out, Pos, stride_pos, stride_qt, stride_kt, stride_vt, stride_ot, BLOCK_M)
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
    row_start = item_row_start(Pos, offs_m, row_ok, prefix_len, SKIP_DELIMITER)
    m_i, l_i, acc = softmax_start(BLOCK_M, HEAD_DIM)
    # the key ranges are step 5's, in tokens: the tile's tokens are [m_lo, m_lo + TOKENS)
    acc, l_i, m_i, visited = attend_visible_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m,
                                                  row_start, Pos, m_lo, tl.minimum(m_lo + TOKENS, seq_len),
                                                  prefix_len, seq_len, qk_scale,
                                                  SKIP_DELIMITER, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    if COUNT_TILES:  # how many key tiles this token tile visited, once per tile (the first key/value head)
        tl.store(TileCounts + prompt * stride_counts + start_m, visited, mask=off_kv == 0)
    store_rows(Out, off_h[:, None], offs_m, offs_d, stride_oh, stride_ot, acc, l_i, row_ok)


def step06_packed_heads(q: QKV, k: QKV, v: QKV, batch: MultiItemBatch, *, sm_scale: float | None = None,
                        out: QKV | None = None, blocks: tuple[int, int] | None = None, config: str | None = None,
                        rule: str = DEFAULT_RULE, count_tiles: bool = False, order: str = DEFAULT_ORDER,
                        return_info: bool = False) -> QKV | tuple[QKV, LaunchInfo]:
    """Step 6: step 5 with a program per (prompt, token tile, key/value head), its ``BLOCK_M`` rows the (token,
    query head) pairs of ``BLOCK_M // KV_GROUP`` tokens: each key/value tile loaded once for the group. Takes what
    step 5 takes (``BLOCK_M >= KV_GROUP``); ``count_tiles`` counts per token tile (``LaunchInfo.block_m`` in rows)."""
    return launch_scheduled(6, attn_fwd_packed_heads, q, k, v, batch, sm_scale, out, blocks, config, rule,
                            count_tiles, order, return_info, pack_heads=True)
