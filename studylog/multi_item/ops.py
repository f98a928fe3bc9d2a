"""Chapter 6's entry point as a PyTorch operator, ``torch.ops.studylog.multi_item_attention``: it takes what step
5's kernel reads of a batch (:func:`layout`) and never synchronises, so a call can be captured. An opaque
``custom_op``: as a ``triton_op``, Inductor types the float ``qk_scale`` fp64, which ``tl.dot`` refuses.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from studylog.checks import check_tensor
from studylog.multi_item.config import size_bucket, strides
from studylog.multi_item.formats import (DEFAULT_RULE, ITEM_KEYS_FROM, SUPPORTED_DTYPES, MultiItemBatch, check_batch,
                                         check_heads, check_interpretable, check_rule)
from studylog.multi_item.steps import LOG2E, attn_fwd_batched, constexprs, launch, tile_heights
from studylog.multi_item.tiles import DEFAULT_ORDER, SCHEDULE_BLOCK_MS, schedule_table

#: the tile heights the operator's launch may take: the autotuner's, or the interpreter's
HEIGHTS = tile_heights(None, None)


def layout(batch: MultiItemBatch, q: Tensor, rule: str = DEFAULT_RULE,
           kv_heads: Optional[int] = None) -> tuple[Tensor, Tensor, list[int]]:
    """The operator's layout arguments (program table, positions, programs); ``kv_heads`` sizes head groups."""
    check_batch(batch)
    group = q.shape[0] // (kv_heads or q.shape[0])
    table, programs = schedule_table(batch, q.shape[0], DEFAULT_ORDER, HEIGHTS,
                                     2 * q.shape[-1] * q.element_size() // max(group, 1), check_rule(rule))
    return table, batch.token_pos, [programs.get(h, 0) for h in SCHEDULE_BLOCK_MS]


def _check(q: Tensor, k: Tensor, v: Tensor, schedule: Tensor, token_pos: Tensor, programs: list[int],
           rule: str) -> None:
    """Metadata checks only (the tables' values are the layout's, planned and checked on the host)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, dtype=SUPPORTED_DTYPES, ndim=3, like=q, last_dim_contiguous=True)
    check_heads(q, k, v)
    check_tensor("schedule", schedule, dtype=torch.int32, shape=(len(SCHEDULE_BLOCK_MS), None, 8), contiguous=True,
                 like=q)
    check_tensor("token_pos", token_pos, dtype=torch.int32, ndim=2, like=q, last_dim_contiguous=True)
    check_rule(rule)
    if len(programs) != len(SCHEDULE_BLOCK_MS) or min(programs) < 0:
        raise ValueError(f"programs must be {len(SCHEDULE_BLOCK_MS)} counts >= 0 (one per tile height "
                         f"{SCHEDULE_BLOCK_MS}), got {programs!r}")
    missing = [h for h in HEIGHTS if programs[SCHEDULE_BLOCK_MS.index(h)] == 0 and q.shape[1] > 0]
    if missing:
        raise ValueError(f"the schedule has no programs for tile heights {missing}, which this launch may take: "
                         "build the layout with studylog.multi_item.ops.layout")
    check_interpretable(q)


def _attention(q: Tensor, k: Tensor, v: Tensor, schedule: Tensor, token_pos: Tensor, programs: list[int],
               sm_scale: Optional[float] = None, rule: str = DEFAULT_RULE) -> Tensor:
    """Multi-item attention of ``q, k, v [heads, tokens, head_dim]`` over a :func:`layout`; a new output like ``q``."""
    programs = [int(p) for p in programs]  # traced SymInts are specialised: they size the grid
    _check(q, k, v, schedule, token_pos, programs, rule)
    heads, tokens, head_dim = (int(s) for s in q.shape)  # plain ints (a traced SymInt is specialised)
    out = torch.empty_like(q)
    if tokens == 0 or heads == 0:
        return out
    sm_scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    counts = torch.empty(1, dtype=torch.int32, device=q.device)  # never written: COUNT_TILES is off
    args = (q, k, v, out, schedule, int(schedule.stride(0)), token_pos, int(token_pos.stride(0)), counts, 0,
            *(int(s) for s in strides(q, k, v, out)), sm_scale * LOG2E, size_bucket(tokens))
    grid = lambda meta: (programs[SCHEDULE_BLOCK_MS.index(meta["BLOCK_M"])],)  # noqa: E731
    launch(attn_fwd_batched, grid, args,
           constexprs(q, k, SKIP_DELIMITER=ITEM_KEYS_FROM[rule], COUNT_TILES=False, PACK_HEADS=False),
           None)  # autotuned on the GPU
    return out


multi_item_attention = torch.library.custom_op("studylog::multi_item_attention", _attention, mutates_args=())
multi_item_attention.__doc__ = _attention.__doc__


@multi_item_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, schedule: Tensor, token_pos: Tensor, programs: list[int],
      sm_scale: Optional[float] = None, rule: str = DEFAULT_RULE) -> Tensor:
    _check(q, k, v, schedule, token_pos, [int(p) for p in programs], rule)
    return torch.empty_like(q)


__all__ = ["multi_item_attention", "layout"]
