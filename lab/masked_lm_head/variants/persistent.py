"""A candidate for the batch-1 streaming kernel (``step07_stream``) that was measured and not kept: a persistent
grid.

Frozen from ``studylog/masked_lm_head.py`` at commit 69a3b83 (where it was ``compact_persistent_kernel`` and
``step4_persistent``, the streaming kernel being "step 4b"). The kernel is unchanged; the wrapper takes the SM count
from ``studylog.runtime.sm_count()`` and, for tests, an explicit ``programs``. See ``lab/masked_lm_head/README.md``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from studylog import runtime
from studylog.masked_lm_head import AllowedTokens
from studylog.masked_lm_head.formats import Tiles, check_inputs, need_batch1, output, stream_tiles

EVICTIONS = ("evict_first", "", "evict_last")


# --------------------------------------------------------------------------------------------
# A candidate the bench measured next to the streaming kernel (step 7, "step 4b" then): a persistent
# grid. A fixed number of programs loop over the blocks of ids; each issues the next block's row loads
# (and the ids of the block after it) before it reduces the current one, so a program always has a
# block of rows in flight and h is loaded once per program instead of once per block.
# --------------------------------------------------------------------------------------------

@triton.jit
def compact_persistent_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, ids_ptr, n_ids, V, n_fill, n_programs, stride_wv,
    D: tl.constexpr, D_POW2: tl.constexpr, BLOCK_V: tl.constexpr, FILL_BLOCK: tl.constexpr,
    EVICTION: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid >= n_fill:
        p = pid - n_fill
        stride_slots = n_programs * BLOCK_V  # slots a program advances per iteration
        offs_d = tl.arange(0, D_POW2)[None, :]  # whole rows, h as a [1, D] tile, as in step 4b
        in_d = offs_d < D
        h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
        slots = p * BLOCK_V + tl.arange(0, BLOCK_V)
        live = slots < n_ids
        rows = tl.load(ids_ptr + slots, mask=live, other=0)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wv + offs_d,
                    mask=live[:, None] & in_d, other=0.0, eviction_policy=EVICTION)
        next_slots = slots + stride_slots
        next_live = next_slots < n_ids
        next_rows = tl.load(ids_ptr + next_slots, mask=next_live, other=0)
        for _ in range(tl.cdiv(n_ids - p * BLOCK_V, stride_slots)):
            # in flight while this block is reduced: the next block's rows and the ids after it
            w_next = tl.load(w_ptr + next_rows[:, None].to(tl.int64) * stride_wv + offs_d,
                             mask=next_live[:, None] & in_d, other=0.0, eviction_policy=EVICTION)
            after_slots = next_slots + stride_slots
            after_live = after_slots < n_ids
            after_rows = tl.load(ids_ptr + after_slots, mask=after_live, other=0)
            acc = tl.sum(w.to(tl.float32) * h, axis=1)
            tl.store(out_ptr + rows, acc, mask=live)
            rows, live, w = next_rows, next_live, w_next
            next_slots, next_live, next_rows = after_slots, after_live, after_rows
    else:
        offs = pid * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        inside = offs < V
        keep = tl.load(allowed_ptr + offs, mask=inside, other=1)
        tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=inside & (keep == 0))



def persistent(h: Tensor, weight: Tensor, allowed: AllowedTokens, *, out: Tensor | None = None,
               tiles: Tiles | None = None, programs_per_sm: int = 4, programs: int | None = None,
               eviction: str = "evict_first") -> Tensor:
    """Batch 1: at most ``programs_per_sm`` programs per SM (``runtime.sm_count()``), or exactly ``programs``
    when given (a test makes it small, so that each program loops over many blocks of ids), loop over the
    blocks of ids, prefetching the next block's rows while they reduce the current one."""
    batch, vocab, hidden = check_inputs(h, weight, allowed, "vd", out)
    need_batch1("the persistent kernel", batch)
    if eviction not in EVICTIONS:
        raise ValueError(f"eviction must be one of {EVICTIONS}, got {eviction!r}")
    if programs_per_sm < 1 or (programs is not None and programs < 1):
        raise ValueError(f"programs_per_sm and programs must be at least 1, got {programs_per_sm}, {programs}")
    n_ids = allowed.union_count
    t = tiles or stream_tiles(n_ids)
    out = output(out, batch, vocab, h.device)
    n_fill = triton.cdiv(vocab, t.fill_block)
    limit = programs if programs is not None else runtime.sm_count() * programs_per_sm
    n_programs = min(triton.cdiv(n_ids, t.block_v), limit)
    compact_persistent_kernel[(n_fill + n_programs,)](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_ids, vocab, n_fill, max(n_programs, 1),
        weight.stride(0), D=hidden, D_POW2=triton.next_power_of_2(hidden), BLOCK_V=t.block_v,
        FILL_BLOCK=t.fill_block, EVICTION=eviction, num_warps=t.num_warps, num_stages=t.num_stages)
    return out
