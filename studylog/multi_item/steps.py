"""Steps 1 to 6 (``stepNN_<slug>``), each beside its kernel, and :func:`multi_item_attention`.

Every step takes ``q``, ``k``, ``v`` as ``[heads, tokens, head_dim]`` (unit stride on ``head_dim``; query head
``h`` reads key/value head ``h // KV_GROUP``). Every kernel keeps per query row the running maximum ``m_i`` (log2
units), the running sum ``l_i`` and the unnormalised output ``acc``; each row's own keys start at
``row - pos[row] + SKIP_DELIMITER``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

from studylog import runtime
from studylog.chapter import Step
from studylog.multi_item.config import (FEW_GPU_CONFIGS, GPU_CONFIGS, INTERPRETER_BLOCKS, LaunchInfo, check_blocks,
                                        config_name, find_config, size_bucket, strides, tuned)
from studylog.multi_item.formats import (DEFAULT_RULE, ITEM_KEYS_FROM, MultiItemBatch, check_interpretable, check_qkv,
                                         check_rule, dense_mask)
from studylog.multi_item.tiles import DEFAULT_ORDER, schedule_table
from studylog.source import resolve_python, source_of

LOG2E = 1.4426950408889634  # scores times log2(e) once, so the softmax uses exp2 (one GPU instruction)
QKV = Float[Tensor, "h t d"]
#: every tile height the GPU's autotuner may pick (step 5 plans a program table for each)
GPU_BLOCK_MS = tuple(sorted({cfg.kwargs["BLOCK_M"] for cfg in GPU_CONFIGS}))


# Step 1: the dense reference

def _scale(sm_scale: Any, q: Tensor) -> float:
    if sm_scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale) \
            or sm_scale <= 0:
        raise ValueError(f"sm_scale must be a finite positive number, got {sm_scale!r}")
    return float(sm_scale)


def step01_dense_sdpa(q: QKV, k: QKV, v: QKV, batch: MultiItemBatch, *, sm_scale: float | None = None,
                      out: QKV | None = None, rule: str = DEFAULT_RULE) -> QKV:
    """Step 1: build every prompt's ``[S, S]`` boolean mask and call ``scaled_dot_product_attention``.
    Rows that see no key (``rule="flashinfer"`` with an empty prefix: the delimiters) are written 0."""
    check_qkv(q, k, v, batch, out)
    check_rule(rule)
    sm_scale = _scale(sm_scale, q)
    out = torch.empty_like(q) if out is None else out
    for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
        rows = slice(start, start + s)
        mask = dense_mask(batch, b, rule)
        got = torch.nn.functional.scaled_dot_product_attention(
            q[None, :, rows], k[None, :, rows], v[None, :, rows], attn_mask=mask, scale=sm_scale,
            enable_gqa=k.shape[0] != q.shape[0])[0]
        if rule == "flashinfer" and batch.prefix_lens[b] == 0:  # delimiters see nothing: 0, not SDPA's NaN
            got = got.masked_fill(~mask.any(dim=-1)[None, :, None], 0.0)
        out[:, rows] = got
    return out


# Steps 2 to 6: Triton kernels, each launched by the step function below it

def prepare_launch(name: str, q: Any, k: Any, v: Any, batch: Any, sm_scale: float | None, out: Any, blocks: Any,
                   rule: Any, *, one_prompt: bool) -> tuple[float, Tensor, dict[str, Any]]:
    """Check a Triton step's inputs; returns ``qk_scale`` (``sm_scale * log2(e)``), the output, the constexprs."""
    check_qkv(q, k, v, batch, out)
    check_blocks(blocks)
    check_rule(rule)
    if one_prompt and batch.batch_size != 1:
        raise ValueError(f"{name} handles one prompt, the batch has {batch.batch_size}; use step05_batched "
                         "(or call it once per prompt)")
    check_interpretable(q)
    out = torch.empty_like(q) if out is None else out
    return _scale(sm_scale, q) * LOG2E, out, constexprs(q, k)


def constexprs(q: Tensor, k: Tensor, **more: Any) -> dict[str, Any]:
    """The constexprs every kernel takes, and ``more``."""
    return {"HEAD_DIM": int(q.shape[-1]), "KV_GROUP": int(q.shape[0] // k.shape[0]),
            "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32", **more}


@functools.cache
def no_counts(device: torch.device) -> Tensor:
    """The tile-count buffer of a launch that does not count: one int32 per device, allocated once."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def tile_count_buffer(batch: MultiItemBatch, tile_tokens: int, count_tiles: bool,
                      device: torch.device) -> tuple[Tensor, int]:
    """A launch's tile counts (-1 until written) and their stride, ``max_tiles`` entries a prompt."""
    max_tiles = triton.cdiv(batch.max_seq_len, tile_tokens)
    if not count_tiles:
        return no_counts(device), max_tiles
    return torch.full((batch.batch_size * max_tiles,), -1, dtype=torch.int32, device=device), max_tiles


def step_result(out: Tensor, launched: tuple[int, int, str], return_info: bool, batch: MultiItemBatch,
                counts: Tensor | None = None, rows_per_token: int = 1) -> QKV | tuple[QKV, LaunchInfo]:
    """``out``, or ``(out, LaunchInfo)`` with ``counts`` per query tile of ``BLOCK_M // rows_per_token`` tokens."""
    if not return_info:
        return out
    block_m, block_n, name = launched
    tile_counts = None if counts is None else [row[: triton.cdiv(s, block_m // rows_per_token)] for row, s in
                                               zip(counts.view(batch.batch_size, -1).tolist(), batch.seq_lens)]
    return out, LaunchInfo(block_m, block_n, tile_counts, name)


def launch(kernel, grid, args: list, constexprs: dict, blocks: tuple[int, int] | None,
           config: "triton.Config | None" = None) -> tuple[int, int, str]:
    """Launch at ``config``, at ``blocks`` (default warps and stages), or as the GPU's autotuner picks."""
    if config is not None:
        blocks = (config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"])
    if runtime.mode() == "gpu" and blocks is None:
        kernel[grid](*args, **constexprs)
        best = kernel.best_config
        bm, bn = best.kwargs["BLOCK_M"], best.kwargs["BLOCK_N"]
        return bm, bn, config_name(bm, bn, best.num_warps, best.num_stages)
    block_m, block_n = blocks if blocks is not None else INTERPRETER_BLOCKS
    jit_fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel
    extra = {}
    if runtime.mode() == "gpu":
        extra = ({"num_warps": config.num_warps, "num_stages": config.num_stages} if config is not None
                 else {"num_warps": 8 if block_m >= 128 else 4, "num_stages": 2})
    jit_fn[grid](*args, **constexprs, BLOCK_M=block_m, BLOCK_N=block_n, **extra)
    return block_m, block_n, config_name(block_m, block_n, *extra.values())


def tile_heights(cfg: "triton.Config | None", blocks: tuple[int, int] | None) -> tuple[int, ...]:
    """The tile heights (``BLOCK_M``) a batched launch may run at: its schedule table needs a row for each."""
    if cfg is not None or blocks is not None:
        return (cfg.kwargs["BLOCK_M"] if cfg is not None else blocks[0],)
    return GPU_BLOCK_MS if runtime.mode() == "gpu" else (INTERPRETER_BLOCKS[0],)


# What the kernels of steps 2 to 6 share: the query tile, the online softmax and the store

@triton.jit
def query_tile(Q, K, V, start_m, off_h, seq_len, stride_qh, stride_qt, stride_kh, stride_vh,
               HEAD_DIM: tl.constexpr, KV_GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query tile ``start_m`` of head ``off_h``: offsets, which rows the prompt holds, the queries (0 past its
    end) and the bases of its key/value head in K and V."""
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    q = tl.load(Q + off_h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + (off_h // KV_GROUP) * stride_kh  # query heads off_h share one key/value head
    v_base = V + (off_h // KV_GROUP) * stride_vh
    return offs_m, offs_n, offs_d, row_ok, q, k_base, v_base


@triton.jit
def item_row_start(Pos, offs_m, row_ok, prefix_len, SKIP_DELIMITER: tl.constexpr):
    """Where each row's own keys start: its item's delimiter, plus SKIP_DELIMITER (1 under FlashInfer's rule,
    which hides the delimiter from its item and a delimiter from itself); prefix rows get their own index (plus
    SKIP_DELIMITER), and see their keys through the test keys < prefix_len."""
    in_items = row_ok & (offs_m >= prefix_len)
    return offs_m + SKIP_DELIMITER - tl.load(Pos + offs_m - prefix_len, mask=in_items, other=0)


@triton.jit
def softmax_start(BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Running max (finite: a row may see no key in its first tiles), running sum, unnormalised output."""
    return (tl.full([BLOCK_M], -1.0e30, tl.float32), tl.zeros([BLOCK_M], tl.float32),
            tl.zeros([BLOCK_M, HEAD_DIM], tl.float32))


@triton.jit
def load_key_tile(k_base, v_base, cols, seq_len, offs_d, stride_kt, stride_vt):
    """Keys ``[HEAD_DIM, BLOCK_N]`` and values ``[BLOCK_N, HEAD_DIM]`` of columns ``cols``, 0 past the end."""
    col_ok = cols < seq_len
    k = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None], mask=col_ok[None, :], other=0.0)
    v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    return k, v


@triton.jit
def softmax_update(acc, l_i, m_i, qk, v, qk_scale, DOT_PRECISION: tl.constexpr):
    """One key tile (scores ``qk``, -inf where masked) into the online softmax."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # scale after the max: qk_scale > 0
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one fused multiply-add per score
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def masked_update(acc, l_i, m_i, q, k, v, visible, qk_scale, DOT_PRECISION: tl.constexpr):
    """Steps 2 and 3's key tile: its scores, -inf where not ``visible``, into the online softmax."""
    qk = tl.where(visible, tl.dot(q, k, input_precision=DOT_PRECISION), float("-inf"))
    return softmax_update(acc, l_i, m_i, qk, v, qk_scale, DOT_PRECISION)


@triton.jit
def store_rows(Out, off_h, offs_m, offs_d, stride_oh, stride_ot, acc, l_i, row_ok):
    """The normalised output tile; a row that saw no key is written 0 (FlashInfer's convention), not 0/0."""
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + off_h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None])


# Step 2: a flash-attention forward reading the dense mask

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
    offs_m, offs_n, offs_d, row_ok, q, k_base, v_base = query_tile(Q, K, V, start_m, off_h, seq_len, stride_qh,
        stride_qt, stride_kh, stride_vh, HEAD_DIM, KV_GROUP, BLOCK_M, BLOCK_N)
    m_i, l_i, acc = softmax_start(BLOCK_M, HEAD_DIM)
    for start_n in range(0, seq_len, BLOCK_N):
        cols = start_n + offs_n
        k, v = load_key_tile(k_base, v_base, cols, seq_len, offs_d, stride_kt, stride_vt)
        mask_tile = Mask + offs_m[:, None].to(tl.int64) * seq_len + cols[None, :]
        visible = tl.load(mask_tile, mask=row_ok[:, None] & (cols < seq_len)[None, :], other=0) != 0
        acc, l_i, m_i = masked_update(acc, l_i, m_i, q, k, v, visible, qk_scale, DOT_PRECISION)
    store_rows(Out, off_h, offs_m, offs_d, stride_oh, stride_ot, acc, l_i, row_ok)


def step02_dense_mask(q: QKV, k: QKV, v: QKV, batch: MultiItemBatch, *, sm_scale: float | None = None,
                      out: QKV | None = None, blocks: tuple[int, int] | None = None, config: str | None = None,
                      rule: str = DEFAULT_RULE, return_info: bool = False) -> QKV | tuple[QKV, LaunchInfo]:
    """Step 2: our own flash-attention forward, reading the dense ``[S, S]`` mask of ``rule`` (one prompt)."""
    qk_scale, out, common = prepare_launch("step02_dense_mask", q, k, v, batch, sm_scale, out, blocks, rule,
                                           one_prompt=True)
    mask = dense_mask(batch, 0, rule).view(torch.uint8)  # same bytes as bool, a type Triton loads everywhere
    args = [q, k, v, out, mask, *strides(q, k, v, out), batch.seq_lens[0], qk_scale]
    grid = lambda meta: (triton.cdiv(batch.seq_lens[0], meta["BLOCK_M"]), q.shape[0])  # noqa: E731
    launched = launch(attn_fwd_dense_mask, grid, args, common, blocks, find_config(config, blocks))
    return step_result(out, launched, return_info, batch)


# Step 3: the mask from the metadata

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
    offs_m, offs_n, offs_d, row_ok, q, k_base, v_base = query_tile(Q, K, V, start_m, off_h, seq_len, stride_qh,
        stride_qt, stride_kh, stride_vh, HEAD_DIM, KV_GROUP, BLOCK_M, BLOCK_N)
    row_start = item_row_start(Pos, offs_m, row_ok, prefix_len, SKIP_DELIMITER)
    m_i, l_i, acc = softmax_start(BLOCK_M, HEAD_DIM)
    for start_n in range(0, seq_len, BLOCK_N):
        cols = start_n + offs_n
        k, v = load_key_tile(k_base, v_base, cols, seq_len, offs_d, stride_kt, stride_vt)
        # keys past seq_len pass this test only for rows past seq_len, which are never stored
        keys = cols[None, :]
        visible = (keys <= offs_m[:, None]) & ((keys < prefix_len) | (keys >= row_start[:, None]))
        acc, l_i, m_i = masked_update(acc, l_i, m_i, q, k, v, visible, qk_scale, DOT_PRECISION)
    store_rows(Out, off_h, offs_m, offs_d, stride_oh, stride_ot, acc, l_i, row_ok)


def step03_mask_on_the_fly(q: QKV, k: QKV, v: QKV, batch: MultiItemBatch, *, sm_scale: float | None = None,
                           out: QKV | None = None, blocks: tuple[int, int] | None = None, config: str | None = None,
                           rule: str = DEFAULT_RULE, return_info: bool = False) -> QKV | tuple[QKV, LaunchInfo]:
    """Step 3: the mask computed in the kernel from the prefix length and where each row's own keys start
    (one prompt)."""
    qk_scale, out, common = prepare_launch("step03_mask_on_the_fly", q, k, v, batch, sm_scale, out, blocks, rule,
                                           one_prompt=True)
    common["SKIP_DELIMITER"] = ITEM_KEYS_FROM[rule]
    args = [q, k, v, out, batch.token_pos[0], *strides(q, k, v, out), batch.seq_lens[0], batch.prefix_lens[0],
            qk_scale]
    grid = lambda meta: (triton.cdiv(batch.seq_lens[0], meta["BLOCK_M"]), q.shape[0])  # noqa: E731
    launched = launch(attn_fwd_mask_on_the_fly, grid, args, common, blocks, find_config(config, blocks))
    return step_result(out, launched, return_info, batch)


# Step 4: tile skipping

@triton.jit
def attend_key_tiles(
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
            k, v = load_key_tile(k_base, v_base, cols, seq_len, offs_d, stride_kt, stride_vt)
        else:  # whole prefix tiles: in bounds by construction
            k = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None])
            v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :])
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)
        if MASKED:
            keys = cols[None, :]
            visible = (keys <= offs_m[:, None]) & ((keys < prefix_len) | (keys >= row_start[:, None]))
            qk = tl.where(visible, qk, float("-inf"))
        acc, l_i, m_i = softmax_update(acc, l_i, m_i, qk, v, qk_scale, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def attend_visible_tiles(
    acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start, Pos, m_lo, m_hi, prefix_len, seq_len,
    qk_scale,
    SKIP_DELIMITER: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The key tiles some row of tokens ``[m_lo, m_hi)`` sees, in three ranges; also how many it visited."""
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
    # 3. the items, from the first key the first item row's item shows it (row starts never decrease down the
    # rows): the tiles between are never loaded
    first_item_row = tl.maximum(m_lo, prefix_len)
    items_lo = first_item_row + SKIP_DELIMITER - tl.load(Pos + first_item_row - prefix_len)
    items_lo = tl.maximum((items_lo // BLOCK_N) * BLOCK_N, prefix_hi)
    acc, l_i, m_i = attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                     prefix_len, seq_len, items_lo, m_hi, qk_scale,
                                     True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    visited = prefix_hi // BLOCK_N + tl.maximum(tl.cdiv(m_hi - items_lo, BLOCK_N), 0)
    return acc, l_i, m_i, visited


@triton.jit
def attend_query_tile(
    Q, K, V, Out, Pos, TileCounts, prompt, stride_counts, start_m, off_h, seq_len, prefix_len, qk_scale,
    stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt, stride_oh, stride_ot,
    HEAD_DIM: tl.constexpr, KV_GROUP: tl.constexpr, DOT_PRECISION: tl.constexpr, SKIP_DELIMITER: tl.constexpr,
    COUNT_TILES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Step 4's program (and step 5's, after its lookup); COUNT_TILES writes the key tiles it visits."""
    offs_m, _, offs_d, row_ok, q, k_base, v_base = query_tile(Q, K, V, start_m, off_h, seq_len, stride_qh, stride_qt,
        stride_kh, stride_vh, HEAD_DIM, KV_GROUP, BLOCK_M, BLOCK_N)
    row_start = item_row_start(Pos, offs_m, row_ok, prefix_len, SKIP_DELIMITER)
    m_i, l_i, acc = softmax_start(BLOCK_M, HEAD_DIM)
    m_lo = start_m * BLOCK_M
    acc, l_i, m_i, visited = attend_visible_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m,
                                                  row_start, Pos, m_lo, tl.minimum(m_lo + BLOCK_M, seq_len),
                                                  prefix_len, seq_len, qk_scale,
                                                  SKIP_DELIMITER, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    if COUNT_TILES:  # how many key tiles this query tile visited (tests and the tile-skip figure)
        tl.store(TileCounts + prompt * stride_counts + start_m, visited, mask=off_h == 0)
    store_rows(Out, off_h, offs_m, offs_d, stride_oh, stride_ot, acc, l_i, row_ok)


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
    # one program per (query tile, head) of the one prompt
    attend_query_tile(Q, K, V, Out, Pos, TileCounts, 0, 0, tl.program_id(0), tl.program_id(1).to(tl.int64),
                      seq_len, prefix_len, qk_scale, stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt,
                      stride_oh, stride_ot, HEAD_DIM, KV_GROUP, DOT_PRECISION, SKIP_DELIMITER, COUNT_TILES,
                      BLOCK_M, BLOCK_N)


def step04_tile_skip(q: QKV, k: QKV, v: QKV, batch: MultiItemBatch, *, sm_scale: float | None = None,
                     out: QKV | None = None, blocks: tuple[int, int] | None = None, config: str | None = None,
                     rule: str = DEFAULT_RULE, count_tiles: bool = False,
                     return_info: bool = False) -> QKV | tuple[QKV, LaunchInfo]:
    """Step 4: key tiles no row of a query tile sees are never loaded, whole prefix tiles skip the mask
    (one prompt). ``count_tiles``: the key tiles each query tile visits, in the :class:`LaunchInfo`."""
    qk_scale, out, common = prepare_launch("step04_tile_skip", q, k, v, batch, sm_scale, out, blocks, rule,
                                           one_prompt=True)
    seq_len = batch.seq_lens[0]
    counts, _ = tile_count_buffer(batch, 16, count_tiles, q.device)
    args = [q, k, v, out, batch.token_pos[0], counts, *strides(q, k, v, out), seq_len, batch.prefix_lens[0],
            qk_scale, size_bucket(seq_len)]
    common.update(SKIP_DELIMITER=ITEM_KEYS_FROM[rule], COUNT_TILES=count_tiles)
    grid = lambda meta: (triton.cdiv(seq_len, meta["BLOCK_M"]), q.shape[0])  # noqa: E731
    launched = launch(attn_fwd_tile_skip, grid, args, common, blocks, find_config(config, blocks))
    return step_result(out, launched, return_info, batch, counts if count_tiles else None)


# Step 5: a batch of prompts in one launch

@triton.jit
def scheduled_tile(Schedule, stride_schedule, Q, K, V, Out, Pos, stride_pos, stride_qt, stride_kt, stride_vt,
                   stride_ot, BLOCK_M: tl.constexpr):
    """Program ``i``'s entry of the host's table (one row per tile height 16, 32, 64, 128): the GPU starts programs
    roughly in index order. One 32-byte entry carries its prompt's offsets, so a program does one round of loads;
    Q, K, V, Out are moved to the prompt's first token and Pos to its row."""
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
    return prompt, start_m, off_h, seq_len, prefix_len, Q, K, V, Out, Pos


# Steps 5 and 6 are this kernel at PACK_HEADS False and True (step 6 below): each step's listing is its branch.

@tuned(GPU_CONFIGS, key=("HEAD_DIM", "size_bucket", "PACK_HEADS"))
@triton.jit
def attn_fwd_batched(
    Q, K, V, Out, Schedule, stride_schedule, Pos, stride_pos, TileCounts, stride_counts,
    stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt, stride_oh, stride_ot,
    qk_scale, size_bucket,
    HEAD_DIM: tl.constexpr, KV_GROUP: tl.constexpr, DOT_PRECISION: tl.constexpr, SKIP_DELIMITER: tl.constexpr,
    COUNT_TILES: tl.constexpr, PACK_HEADS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    if PACK_HEADS:
        # One program per (prompt, token tile, key/value head), in the order the host planned: the schedule row
        # BLOCK_M selects holds tiles of BLOCK_M // KV_GROUP tokens (schedule_table's rows_per_token).
        TOKENS: tl.constexpr = BLOCK_M // KV_GROUP
        prompt, start_m, off_kv, seq_len, prefix_len, Q, K, V, Out, Pos = scheduled_tile(
            Schedule, stride_schedule, Q, K, V, Out, Pos, stride_pos, stride_qt, stride_kt, stride_vt, stride_ot,
            BLOCK_M)
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
    else:
        # one program per (prompt, query tile, head), in the order of the host's table
        prompt, start_m, off_h, seq_len, prefix_len, Q, K, V, Out, Pos = scheduled_tile(
            Schedule, stride_schedule, Q, K, V, Out, Pos, stride_pos, stride_qt, stride_kt, stride_vt, stride_ot,
            BLOCK_M)
        attend_query_tile(Q, K, V, Out, Pos, TileCounts, prompt, stride_counts, start_m, off_h, seq_len,
                          prefix_len, qk_scale, stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt,
                          stride_oh, stride_ot, HEAD_DIM, KV_GROUP, DOT_PRECISION, SKIP_DELIMITER, COUNT_TILES,
                          BLOCK_M, BLOCK_N)


def step05_batched(q: QKV, k: QKV, v: QKV, batch: MultiItemBatch, *, sm_scale: float | None = None,
                   out: QKV | None = None, blocks: tuple[int, int] | None = None, config: str | None = None,
                   rule: str = DEFAULT_RULE, count_tiles: bool = False, order: str = DEFAULT_ORDER,
                   return_info: bool = False) -> QKV | tuple[QKV, LaunchInfo]:
    """Step 5: every prompt of the batch in one launch, programs in the order the host planned (``order``, one
    of :data:`~studylog.multi_item.tiles.SCHEDULE_ORDERS`); ``count_tiles`` as in step 4, per prompt."""
    return launch_scheduled(q, k, v, batch, sm_scale, out, blocks, config, rule, count_tiles, order, return_info)


def launch_scheduled(q: Any, k: Any, v: Any, batch: Any, sm_scale: float | None, out: Any, blocks: Any,
                     config: str | None, rule: Any, count_tiles: bool, order: str, return_info: bool, *,
                     pack_heads: bool = False) -> QKV | tuple[QKV, LaunchInfo]:
    """Steps 5 and 6: plan the program table (cached on the batch), launch :func:`attn_fwd_batched` a program per
    (prompt, query tile, head), with ``pack_heads`` (step 6) per (prompt, token tile, key/value head)."""
    qk_scale, out, common = prepare_launch("launch_scheduled", q, k, v, batch, sm_scale, out, blocks, rule,
                                           one_prompt=False)
    cfg = find_config(config, blocks)
    heights = tile_heights(cfg, blocks)
    group = common["KV_GROUP"]
    rows_per_token = group if pack_heads else 1  # step 6's BLOCK_M rows: the group's heads of BLOCK_M // group tokens
    if rows_per_token > min(heights):
        raise ValueError(f"step06_packed_heads puts a token's {group} query heads (q's heads over k's) in one tile: "
                         f"BLOCK_M must be at least {group}, got {min(heights)} (pass blocks or config)")
    # the keys and values one program reads, per token: step 5's programs of a group of query heads share them
    kv_bytes = 2 * q.shape[-1] * q.element_size() // (1 if pack_heads else group)
    heads = k.shape[0] if pack_heads else q.shape[0]
    table, programs = schedule_table(batch, heads, order, heights, kv_bytes, rule, rows_per_token=rows_per_token)
    counts, max_tiles = tile_count_buffer(batch, min(heights) // rows_per_token, count_tiles, q.device)
    grid = lambda meta: (programs[meta["BLOCK_M"]],)  # noqa: E731
    args = [q, k, v, out, table, table.stride(0), batch.token_pos, batch.token_pos.stride(0), counts, max_tiles,
            *strides(q, k, v, out), qk_scale, size_bucket(batch.total_tokens)]
    common.update(SKIP_DELIMITER=ITEM_KEYS_FROM[rule], COUNT_TILES=count_tiles, PACK_HEADS=pack_heads)
    launched = launch(attn_fwd_batched, grid, args, common, blocks, cfg)
    return step_result(out, launched, return_info, batch, counts if count_tiles else None, rows_per_token)


# Step 6: under grouped-query attention, the query heads that share a key/value head computed in one tile, so
# each key/value tile is loaded once for the group: attn_fwd_batched at PACK_HEADS=True

def step06_packed_heads(q: QKV, k: QKV, v: QKV, batch: MultiItemBatch, *, sm_scale: float | None = None,
                        out: QKV | None = None, blocks: tuple[int, int] | None = None, config: str | None = None,
                        rule: str = DEFAULT_RULE, count_tiles: bool = False, order: str = DEFAULT_ORDER,
                        return_info: bool = False) -> QKV | tuple[QKV, LaunchInfo]:
    """Step 6: step 5 with a program per (prompt, token tile, key/value head), its ``BLOCK_M`` rows the (token,
    query head) pairs of ``BLOCK_M // KV_GROUP`` tokens: each key/value tile loaded once for the group. Takes what
    step 5 takes (``BLOCK_M >= KV_GROUP``); ``count_tiles`` counts per token tile (``LaunchInfo.block_m`` in rows)."""
    return launch_scheduled(q, k, v, batch, sm_scale, out, blocks, config, rule, count_tiles, order, return_info,
                            pack_heads=True)


def multi_item_attention(q: QKV, k: QKV, v: QKV, batch: MultiItemBatch, *, sm_scale: float | None = None,
                         out: QKV | None = None, blocks: tuple[int, int] | None = None, config: str | None = None,
                         rule: str = DEFAULT_RULE) -> QKV:
    """Multi-item scoring attention over a packed batch: :func:`step05_batched`, or under grouped-query attention
    (groups of up to 16 query heads) ``step06_packed_heads``. ``config``: a name of ``config.config_names()``
    (default: the GPU autotunes, the interpreter uses 16 x 16). After a first eager call on ``batch`` a call syncs
    nothing and allocates only ``out``: a CUDA graph can hold it (``MultiItemPlan`` takes new layouts)."""
    heads, kv_heads = (x.shape[0] if isinstance(x, Tensor) and x.dim() == 3 else 0 for x in (q, k))
    # a group fits the smallest tile (16 rows) whole; anything else, bad input included, goes to step 5's checks
    grouped = kv_heads > 0 and heads % kv_heads == 0 and 1 < heads // kv_heads <= 16
    step = step06_packed_heads if grouped else step05_batched
    return step(q, k, v, batch, sm_scale=sm_scale, out=out, blocks=blocks, config=config, rule=rule)


def at_knob(kernel, **knobs) -> str:
    """The text of ``kernel`` as one step launches it: each ``if KNOB:`` block resolved at the step's value."""
    return "\n".join(resolve_python(source_of(kernel)[0].splitlines(), knobs)) + "\n"


#: The chapter's steps: (function, source shown by show_source, what it adds); step 4's source is the function its
#: kernel (and step 5's) calls per program; steps 5 and 6 are one kernel, listed at each step's PACK_HEADS.
_STEPS = (
    (step01_dense_sdpa, step01_dense_sdpa, "the dense boolean mask handed to PyTorch's SDPA"),
    (step02_dense_mask, attn_fwd_dense_mask, "a Triton flash-attention forward reading the dense mask"),
    (step03_mask_on_the_fly, attn_fwd_mask_on_the_fly, "the mask computed from the prefix length and item positions"),
    (step04_tile_skip, attend_query_tile, "invisible key tiles never loaded, whole prefix tiles unmasked"),
    (step05_batched, at_knob(attn_fwd_batched, PACK_HEADS=False),
     "every prompt of a batch in one launch, programs in a planned order"),
    (step06_packed_heads, at_knob(attn_fwd_batched, PACK_HEADS=True),
     "the query heads that share a key/value head in one tile, each key/value tile loaded once for the group"),
)
STEPS = tuple(Step(n, f.__name__[7:], what, "torch" if n == 1 else "triton", f, kernel)
              for n, (f, kernel, what) in enumerate(_STEPS, 1))
