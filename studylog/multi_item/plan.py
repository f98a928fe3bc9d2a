"""Step 5 in a form a CUDA graph captures once and replays over new inputs *and new batch layouts*: the layout in
device buffers sized for a capacity, the grid the most programs any layout within it needs (entries past a layout's
programs are zero: empty programs); a layout uses the first ``batch.total_tokens`` positions of the buffers."""

from __future__ import annotations

import math

import torch
import triton
from torch import Tensor

from studylog import runtime
from studylog.checks import check_choice, check_int, check_out
from studylog.multi_item.config import INTERPRETER_BLOCKS, find_config, strides
from studylog.multi_item.formats import (DEFAULT_RULE, ITEM_KEYS_FROM, SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS,
                                         MultiItemBatch, check_batch, check_rule)
from studylog.multi_item.steps import LOG2E, attn_fwd_batched, constexprs, launch, no_counts, step05_batched
from studylog.multi_item.tiles import DEFAULT_ORDER, SCHEDULE_BLOCK_MS, SCHEDULE_ORDERS, schedule_table


class MultiItemPlan:
    """Step 5's launch, its layout in device buffers: capture :meth:`run` once, replay it after :meth:`set_layout`
    or new values in ``q``, ``k``, ``v``. ``max_tokens``, ``max_prompts`` and ``max_width`` (positions after a
    prefix) bound the layouts. ``config`` (of :func:`~studylog.multi_item.config.config_names`) fixes the tiles;
    ``None`` picks them on the first :meth:`run` (an autotuned eager call on the GPU, not capturable)."""

    def __init__(self, *, heads: int, head_dim: int, dtype: torch.dtype, max_tokens: int, max_prompts: int,
                 max_width: int | None = None, config: str | None = None, rule: str = DEFAULT_RULE,
                 order: str = DEFAULT_ORDER, sm_scale: float | None = None,
                 device: torch.device | str | None = None, kv_heads: int | None = None):
        check_rule(rule)
        check_choice("order", order, SCHEDULE_ORDERS)
        check_choice("head_dim", head_dim, SUPPORTED_HEAD_DIMS)
        if dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"dtype must be one of {SUPPORTED_DTYPES}, got {dtype}")
        self.kv_heads = heads if kv_heads is None else kv_heads
        self.max_width = max_tokens if max_width is None else max_width
        for name, value in (("heads", heads), ("max_tokens", max_tokens), ("max_prompts", max_prompts),
                            ("max_width", self.max_width), ("kv_heads", self.kv_heads)):
            check_int(name, value, low=1)
        if heads % self.kv_heads:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({self.kv_heads}): each key/value head "
                             "serves a group of query heads")
        self.heads, self.head_dim, self.dtype = heads, head_dim, dtype
        self.max_tokens, self.max_prompts = max_tokens, max_prompts
        self.rule, self.order = rule, order
        self.sm_scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
        self.device = torch.device(device) if device is not None else runtime.device()
        if self.device == torch.device("cuda"):  # "cuda" means the current device: name it
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.config = self._cfg = self.batch = self._table = None  # set by _pin and set_layout
        self._pos = torch.zeros(max_prompts, self.max_width, dtype=torch.int32, device=self.device)
        if config is not None or runtime.mode() != "gpu":  # else the first run picks it
            self._pin(config)

    def _pin(self, config: str | None) -> None:
        self._cfg = find_config(config)
        self.config = config
        self.block_m, self.block_n = ((self._cfg.kwargs["BLOCK_M"], self._cfg.kwargs["BLOCK_N"]) if self._cfg
                                      else INTERPRETER_BLOCKS)
        # every prompt's query tiles, for every head: sum of cdiv(S_b, BLOCK_M) <= cdiv(T, BLOCK_M) + B - 1
        self.programs = self.heads * (triton.cdiv(self.max_tokens, self.block_m) + self.max_prompts - 1)
        self._table = torch.zeros(self.programs, 8, dtype=torch.int32, device=self.device)
        if self.batch is not None:
            self.set_layout(self.batch)

    def set_layout(self, batch: MultiItemBatch) -> None:
        """Put ``batch``'s layout in the plan's buffers, in stream order. Not capturable: call it between replays."""
        check_batch(batch)
        if batch.device != self.device:
            raise ValueError(f"the batch layout is on {batch.device}, the plan on {self.device}")
        width = batch.token_pos.shape[1]
        if batch.total_tokens > self.max_tokens or batch.batch_size > self.max_prompts or width > self.max_width:
            raise ValueError(f"the batch ({batch.describe()}, {width} positions after a prefix) does not fit the "
                             f"plan: at most {self.max_tokens} tokens, {self.max_prompts} prompts, "
                             f"{self.max_width} positions")
        self.batch = batch
        if self._table is None:  # the config is picked on the first run; the table is sized then
            return
        # the keys and values one query head reads, per token: a group of query heads shares them
        kv_bytes = 2 * self.head_dim * self.dtype.itemsize * self.kv_heads // self.heads
        table, programs = schedule_table(batch, self.heads, self.order, (self.block_m,), kv_bytes, self.rule)
        n = programs[self.block_m]
        self._table[:n].copy_(table[SCHEDULE_BLOCK_MS.index(self.block_m), :n])
        self._table[n:].zero_()
        self._pos.zero_()
        self._pos[: batch.batch_size, :width].copy_(batch.token_pos)

    def run(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor) -> Tensor:
        """Attention over the layout last set, into ``out`` (``[heads or kv_heads, max_tokens, head_dim]``).
        Capturable once the config is pinned (after the first run, or a ``config`` given)."""
        if self.batch is None:
            raise RuntimeError("set_layout(batch) before run")
        for name, x in (("q", q), ("k", k), ("v", v), ("out", out)):  # the plan's capacity, dtype and device
            heads = self.kv_heads if name in ("k", "v") else self.heads
            check_out(name, x, shape=(heads, self.max_tokens, self.head_dim), dtype=self.dtype, device=self.device,
                      contiguous=False)
        if self._table is None:  # GPU, no config given: an autotuned eager call picks it, then pin it
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("the plan's config is picked by its first run, which cannot be captured: run "
                                   "once before capturing, or give config=")
            n = self.batch.total_tokens
            _, info = step05_batched(q[:, :n], k[:, :n], v[:, :n], self.batch, sm_scale=self.sm_scale,
                                     out=out[:, :n], rule=self.rule, order=self.order, return_info=True)
            self._pin(info.config)
        # the table has one row: the kernel's row for BLOCK_M times a stride of 0
        args = [q, k, v, out, self._table, 0, self._pos, self._pos.stride(0), no_counts(q.device), 0,
                *strides(q, k, v, out), self.sm_scale * LOG2E, 0]
        launch(attn_fwd_batched, (self.programs,), args,
               constexprs(q, k, SKIP_DELIMITER=ITEM_KEYS_FROM[self.rule], COUNT_TILES=False, PACK_HEADS=False),
               (self.block_m, self.block_n), self._cfg)
        return out
