"""Steps 4-10: programs over the allowed ids only (the union of the batch's sets), reading whole rows of the
``[V, D]`` weight; fill programs of the same launch write the ``-inf``."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from studylog import runtime  # noqa: F401  (selects GPU or interpreter before kernels are defined)
from studylog.masked_lm_head.dense import dot_rows
from studylog.masked_lm_head.formats import (FEW_IDS_MAX, FEW_TILES, AllowedTokens, Hidden, Logits, Tiles, Weight,
                                             check_inputs, default_tiles, dot_dtype, need_batch1, need_layout, output,
                                             stream_tiles)

# Steps 4-7 share their fill programs, and steps 5-7 their row programs: two jit helpers, inlined where called.
# Each takes the program id and the first id of its kind and subtracts them itself: a difference computed before
# the call would be scheduled earlier, and the kernel's PTX would change.

@triton.jit
def fill_disallowed(out_ptr, allowed_ptr, pid, first_pid, V, FILL_BLOCK: tl.constexpr):
    """Fill program ``pid`` of steps 4-7 (fill programs from ``first_pid``): ``-inf`` where its block is disallowed."""
    offs = (pid - first_pid) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
    inside = offs < V
    keep = tl.load(allowed_ptr + offs, mask=inside, other=1)
    tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=inside & (keep == 0))


@triton.jit
def one_wait_rows(h_ptr, w_ptr, out_ptr, ids_ptr, n_ids, pid, first_pid, stride_wv, D: tl.constexpr,
                  D_POW2: tl.constexpr, BLOCK_V: tl.constexpr, EVICTION: tl.constexpr):
    """Row program ``pid`` of steps 5-7 (row programs start at ``first_pid``): its BLOCK_V allowed ids, each row
    loaded as one [1, D_POW2] tile (L2 policy ``EVICTION``, ``""`` the default) and reduced once."""
    offs_d = tl.arange(0, D_POW2)[None, :]
    in_d = offs_d < D
    # h as a [1, D] tile, already in the rows' layout: a 1-D h would go through shared memory, behind barriers
    h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
    slots = (pid - first_pid) * BLOCK_V + tl.arange(0, BLOCK_V)
    live = slots < n_ids
    rows = tl.load(ids_ptr + slots, mask=live, other=0)
    w = tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wv + offs_d,
                mask=live[:, None] & in_d, other=0.0, eviction_policy=EVICTION).to(tl.float32)
    tl.store(out_ptr + rows, tl.sum(w * h, axis=1), mask=live)


# Step 4: compacted ids, batch 1. Programs [0, n_compute) read the whole rows of BLOCK_V allowed ids each; the
# programs after them write the -inf.

@triton.jit
def compact_rows_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, ids_ptr, n_ids, V, n_compute, stride_wv,
    D: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, FILL_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_compute:
        slots = pid * BLOCK_V + tl.arange(0, BLOCK_V)
        live = slots < n_ids
        rows = tl.load(ids_ptr + slots, mask=live, other=0)
        row_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wv
        acc = tl.zeros((BLOCK_V,), dtype=tl.float32)
        for k in tl.static_range(0, D, BLOCK_D):  # unrolled; but each tl.sum ends in a barrier (step 5)
            offs_d = k + tl.arange(0, BLOCK_D)
            in_d = offs_d < D
            h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
            w = tl.load(row_ptrs + offs_d[None, :], mask=live[:, None] & in_d[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(w * h[None, :], axis=1)
        tl.store(out_ptr + rows, acc, mask=live)
    else:
        fill_disallowed(out_ptr, allowed_ptr, pid, n_compute, V, FILL_BLOCK)


# Step 5: one wait per row. The row is one [BLOCK_V, D_POW2] tile (the padding masked off: registers, not bytes),
# its loads issued back to back and reduced once; in step 4 each chunk's tl.sum ends in a barrier before the next
# chunk's loads, so a program waited for memory once per chunk. Step 7 is this kernel with EVICTION set (below);
# step 5 passes "", the default policy.

@triton.jit
def one_wait_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, ids_ptr, n_ids, V, n_compute, stride_wv,
    D: tl.constexpr, D_POW2: tl.constexpr, BLOCK_V: tl.constexpr, FILL_BLOCK: tl.constexpr, EVICTION: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_compute:
        one_wait_rows(h_ptr, w_ptr, out_ptr, ids_ptr, n_ids, pid, 0, stride_wv, D, D_POW2, BLOCK_V, EVICTION)
    else:
        fill_disallowed(out_ptr, allowed_ptr, pid, n_compute, V, FILL_BLOCK)


# Step 6: the fill programs first, so their mask-load -> store chain is not the launch's tail; they delay the row
# programs instead. It did not pay (the page measures it): steps 7 and 8 keep step 5's order.

@triton.jit
def fill_first_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, ids_ptr, n_ids, V, n_fill, stride_wv,
    D: tl.constexpr, D_POW2: tl.constexpr, BLOCK_V: tl.constexpr, FILL_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid >= n_fill:
        one_wait_rows(h_ptr, w_ptr, out_ptr, ids_ptr, n_ids, pid, n_fill, stride_wv, D, D_POW2, BLOCK_V, "")
    else:
        fill_disallowed(out_ptr, allowed_ptr, pid, 0, V, FILL_BLOCK)


# Step 8: a handful of ids (a state that forces one token, or allows a few) are launch arguments: no program loads
# an id or the mask, so the row read is the only access any waits for. Unused slots hold -1, which no output
# position equals. Not specialised on: Triton would compile a variant for every id equal to 1 or divisible by 16.

@triton.jit(do_not_specialize=["n_ids", "id0", "id1", "id2", "id3", "id4", "id5", "id6", "id7"])
def few_ids_kernel(
    h_ptr, w_ptr, out_ptr, n_ids, id0, id1, id2, id3, id4, id5, id6, id7, V, stride_wv,
    D: tl.constexpr, D_POW2: tl.constexpr, FILL_BLOCK: tl.constexpr, EVICTION: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_ids:  # row programs first: their row read is the critical path
        row = tl.where(pid == 0, id0, tl.where(pid == 1, id1, tl.where(pid == 2, id2, tl.where(
            pid == 3, id3, tl.where(pid == 4, id4, tl.where(pid == 5, id5, tl.where(pid == 6, id6, id7)))))))
        offs_d = tl.arange(0, D_POW2)  # the whole row at once, as in step 5
        in_d = offs_d < D
        h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + row.to(tl.int64) * stride_wv + offs_d, mask=in_d, other=0.0,
                    eviction_policy=EVICTION).to(tl.float32)
        tl.store(out_ptr + row, tl.sum(w * h, axis=0))
    else:
        offs = (pid - n_ids) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        keep = ((offs == id0) | (offs == id1) | (offs == id2) | (offs == id3) | (offs == id4) | (offs == id5)
                | (offs == id6) | (offs == id7))
        tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=(offs < V) & ~keep)

# Step 9: batched, each sequence its own mask. A program reads each chunk of BLOCK_V union rows once for BLOCK_B
# sequences, reduced against each in turn (a tl.sum each, as steps 4 to 8 compute a logit), and stores a logit
# only where its sequence allows it. Fill programs write the -inf.

@triton.jit
def gathered_sums(h_ptr, w_ptr, rows, live, first_b, B, stride_hb, stride_wv, D: tl.constexpr,
                  BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """Step 9's [BLOCK_B, BLOCK_V] fp32 tile: each BLOCK_D chunk of the rows ``rows`` (zeros where not ``live``)
    loaded once, then reduced against each existing sequence from ``first_b`` on, one tl.sum each."""
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wv + offs_d
    seqs = tl.arange(0, BLOCK_B)[:, None]
    n_seq = tl.minimum(B - first_b, BLOCK_B)
    acc = tl.zeros((BLOCK_B, BLOCK_V), dtype=tl.float32)
    for k in range(0, tl.cdiv(D, BLOCK_D)):
        d_left = D - k * BLOCK_D
        w = tl.load(w_ptrs, mask=live[:, None] & (offs_d < d_left), other=0.0).to(tl.float32)
        for j in range(0, n_seq):
            h = tl.load(h_ptr + (first_b + j) * stride_hb + k * BLOCK_D + offs_d, mask=offs_d < d_left,
                        other=0.0).to(tl.float32)
            acc = tl.where(seqs == j, acc + tl.sum(w * h, axis=1)[None, :], acc)
        w_ptrs += BLOCK_D
    return acc


@triton.jit
def union_block(pid, union_ptr, n_union, B, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """Row program ``pid`` of steps 9 and 10: its block of the batch (``pid_b``, sequences ``offs_b``, existing
    ``in_b``) and of the union (``rows``, existing ``live``)."""
    num_pid_b = tl.cdiv(B, BLOCK_B)
    pid_v = pid // num_pid_b  # neighbouring programs share rows: the second read hits L2
    pid_b = pid % num_pid_b
    slots = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    live = slots < n_union
    rows = tl.load(union_ptr + slots, mask=live, other=0)
    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    in_b = offs_b < B
    return pid_b, rows, live, offs_b, in_b


@triton.jit
def store_union_tile(out_ptr, allowed_ptr, acc, rows, live, offs_b, in_b, stride_ob, stride_allowed_b):
    """Steps 9 and 10: the tile's logits, each stored only where its sequence allows its token."""
    tile = in_b[:, None] & live[None, :]
    allowed = tl.load(allowed_ptr + offs_b[:, None] * stride_allowed_b + rows[None, :], mask=tile, other=0)
    tl.store(out_ptr + offs_b[:, None] * stride_ob + rows[None, :], acc, mask=tile & (allowed != 0))


@triton.jit
def fill_disallowed_batch(out_ptr, allowed_ptr, pid, first_pid, B, V, stride_ob, stride_allowed_b,
                          FILL_BLOCK: tl.constexpr):
    """Fill program ``pid`` of steps 9 and 10 (from ``first_pid``): ``-inf`` over its block of the flat ``[B, V]``
    output where the sequence disallows."""
    offs = (pid - first_pid) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
    inside = offs < B * V
    seq = offs // V
    tok = offs - seq * V
    keep = tl.load(allowed_ptr + seq * stride_allowed_b + tok, mask=inside, other=1)
    tl.store(out_ptr + seq * stride_ob + tok, tl.full((FILL_BLOCK,), float("-inf"), tl.float32),
             mask=inside & (keep == 0))


@triton.jit
def union_sums_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, union_ptr, n_union, B, V, n_compute,
    stride_hb, stride_wv, stride_ob, stride_allowed_b,
    D: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
    FILL_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_compute:
        pid_b, rows, live, offs_b, in_b = union_block(pid, union_ptr, n_union, B, BLOCK_B, BLOCK_V)
        acc = gathered_sums(h_ptr, w_ptr, rows, live, pid_b * BLOCK_B, B, stride_hb, stride_wv, D, BLOCK_B, BLOCK_V,
                            BLOCK_D)
        store_union_tile(out_ptr, allowed_ptr, acc, rows, live, offs_b, in_b, stride_ob, stride_allowed_b)
    else:
        fill_disallowed_batch(out_ptr, allowed_ptr, pid, n_compute, B, V, stride_ob, stride_allowed_b, FILL_BLOCK)


# Step 10: step 9 with the block of union rows multiplied with the block's BLOCK_B hidden states
# by one tl.dot per chunk, on the tensor cores, instead of a reduction per sequence.

@triton.jit
def gathered_dot(h_ptr, w_ptr, rows, live, offs_b, in_b, stride_hb, stride_wv, D: tl.constexpr,
                 BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Step 10's (and the plan's) [BLOCK_B, BLOCK_V] fp32 tile: step 3's row-tile product (:func:`dot_rows`) of the
    hidden states ``offs_b`` and the weight's rows ``rows`` (zeros where not ``live``), D in chunks of BLOCK_D."""
    return dot_rows(h_ptr, w_ptr, offs_b, rows, tl.arange(0, BLOCK_D), in_b[:, None], live[:, None], None, D,
                    stride_hb, stride_wv, BLOCK_B, BLOCK_V, BLOCK_D, DOT_DTYPE)


@triton.jit
def batched_union_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, union_ptr, n_union, B, V, n_compute,
    stride_hb, stride_wv, stride_ob, stride_allowed_b,
    D: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
    FILL_BLOCK: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_compute:
        pid_b, rows, live, offs_b, in_b = union_block(pid, union_ptr, n_union, B, BLOCK_B, BLOCK_V)
        acc = gathered_dot(h_ptr, w_ptr, rows, live, offs_b, in_b, stride_hb, stride_wv, D, BLOCK_B, BLOCK_V, BLOCK_D,
                           DOT_DTYPE)
        store_union_tile(out_ptr, allowed_ptr, acc, rows, live, offs_b, in_b, stride_ob, stride_allowed_b)
    else:
        fill_disallowed_batch(out_ptr, allowed_ptr, pid, n_compute, B, V, stride_ob, stride_allowed_b, FILL_BLOCK)


# Step 7: step 5's kernel with the weight rows read under an L2 evict-first policy: they are used once, so they
# recycle their own L2 lines rather than evict lines that other data (often dirty) occupies.
EVICTION = "evict_first"  # the L2 policy of steps 7 and 8's row loads: each row is read once
NO_IDS = (-1,) * FEW_IDS_MAX  # step 8's unused id slots: no output position equals -1


def _rows_and_fill(kernel, name: str, h, weight, allowed: AllowedTokens, layout: str, out, tiles: Tiles | None, *,
                   chunked: bool = False, fill_first: bool = False, **constexprs) -> Tensor:
    """Steps 4-7 (batch 1): row programs, then fill programs (``fill_first``: step 6's order); ``chunked``: step 4."""
    need_layout(name, layout)
    batch, vocab, hidden = check_inputs(h, weight, allowed, layout, out)
    need_batch1(name, batch)
    out = output(out, batch, vocab, h.device)
    n_ids = allowed.union_count
    t = tiles or (default_tiles(4, 1, n_ids) if chunked else stream_tiles(n_ids))
    n_rows, n_fill = triton.cdiv(n_ids, t.block_v), triton.cdiv(vocab, t.fill_block)
    d_pow2 = triton.next_power_of_2(hidden)
    constexprs |= dict(BLOCK_D=min(t.block_d, d_pow2)) if chunked else dict(D_POW2=d_pow2)
    kernel[(n_rows + n_fill,)](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_ids, vocab, n_fill if fill_first else n_rows,
        weight.stride(0), D=hidden, BLOCK_V=t.block_v, FILL_BLOCK=t.fill_block, num_warps=t.num_warps,
        num_stages=t.num_stages, **constexprs)
    return out


def step04_compact(h: Hidden, weight: Weight, allowed: AllowedTokens, *, layout: str = "vd", out: Logits | None = None,
                   tiles: Tiles | None = None) -> Logits:
    """Step 4 (batch 1): programs over the allowed ids only, reading whole rows; the rest of the grid writes -inf."""
    return _rows_and_fill(compact_rows_kernel, "step04_compact", h, weight, allowed, layout, out, tiles, chunked=True)


def step05_one_wait(h: Hidden, weight: Weight, allowed: AllowedTokens, *, layout: str = "vd", out: Logits | None = None,
                    tiles: Tiles | None = None) -> Logits:
    """Step 5 (batch 1): step 4, each row loaded as one tile and reduced once (one wait for memory a row)."""
    return _rows_and_fill(one_wait_kernel, "step05_one_wait", h, weight, allowed, layout, out, tiles, EVICTION="")


def step06_fill_first(h: Hidden, weight: Weight, allowed: AllowedTokens, *, layout: str = "vd",
                      out: Logits | None = None, tiles: Tiles | None = None) -> Logits:
    """Step 6 (batch 1): step 5, the fill programs first (it did not pay: steps 7 and 8 build on step 5)."""
    return _rows_and_fill(fill_first_kernel, "step06_fill_first", h, weight, allowed, layout, out, tiles,
                          fill_first=True)


def step07_stream(h: Hidden, weight: Weight, allowed: AllowedTokens, *, layout: str = "vd", out: Logits | None = None,
                  tiles: Tiles | None = None) -> Logits:
    """Step 7 (batch 1): step 5, the rows read once under an L2 evict-first policy (:data:`EVICTION`)."""
    return _rows_and_fill(one_wait_kernel, "step07_stream", h, weight, allowed, layout, out, tiles, EVICTION=EVICTION)


def step08_few_ids(h: Hidden, weight: Weight, allowed: AllowedTokens, *, out: Logits | None = None,
                   tiles: Tiles | None = None) -> Logits:
    """Step 8 (batch 1, at most :data:`FEW_IDS_MAX` ids): the ids are launch arguments (a graph replays the same)."""
    batch, vocab, hidden = check_inputs(h, weight, allowed, "vd", out)
    need_batch1("step08_few_ids", batch)
    ids = allowed.few_ids
    if ids is None:
        raise ValueError(f"step08_few_ids takes at most {FEW_IDS_MAX} allowed ids, got {allowed.union_count} "
                         "(use step07_stream or masked_logits)")
    out = output(out, batch, vocab, h.device)
    t = tiles or FEW_TILES
    n = len(ids)  # row programs first, then the fill programs
    few_ids_kernel[(n + triton.cdiv(vocab, t.fill_block),)](
        h, weight, out, n, *ids, *NO_IDS[n:], vocab, weight.stride(0),
        D=hidden, D_POW2=triton.next_power_of_2(hidden), FILL_BLOCK=t.fill_block, EVICTION=EVICTION,
        num_warps=t.num_warps, num_stages=t.num_stages)
    return out


def _union_and_fill(kernel, name: str, step: int, h, weight, allowed: AllowedTokens, layout: str, out,
                    tiles: Tiles | None, *, dot: bool = False) -> Tensor:
    """Steps 9 and 10 (``dot``: step 10, with ``DOT_DTYPE``): row programs over union x batch blocks, then fill
    programs over the flat ``[B, V]`` output, one grid."""
    need_layout(name, layout)
    batch, vocab, hidden = check_inputs(h, weight, allowed, layout, out)
    out = output(out, batch, vocab, h.device)
    n_union = allowed.union_count
    t = tiles or default_tiles(step, batch, n_union)
    n_compute = triton.cdiv(n_union, t.block_v) * triton.cdiv(batch, t.block_b)  # then the fill programs
    kernel[(n_compute + triton.cdiv(batch * vocab, t.fill_block),)](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_union, batch, vocab, n_compute,
        h.stride(0), weight.stride(0), out.stride(0), allowed.mask.stride(0),
        D=hidden, BLOCK_B=t.block_b, BLOCK_V=t.block_v, BLOCK_D=t.block_d, FILL_BLOCK=t.fill_block,
        num_warps=t.num_warps, num_stages=t.num_stages, **(dict(DOT_DTYPE=dot_dtype(h.dtype)) if dot else {}))
    return out


def step09_union(h: Hidden, weight: Weight, allowed: AllowedTokens, *, layout: str = "vd", out: Logits | None = None,
                 tiles: Tiles | None = None) -> Logits:
    """Step 9: any batch, each sequence its own set; each union row read once, reduced against each sequence."""
    return _union_and_fill(union_sums_kernel, "step09_union", 9, h, weight, allowed, layout, out, tiles)


def step10_batched(h: Hidden, weight: Weight, allowed: AllowedTokens, *, layout: str = "vd", out: Logits | None = None,
                   tiles: Tiles | None = None) -> Logits:
    """Step 10: step 9, each block of union rows multiplied with the hidden states on the tensor cores."""
    return _union_and_fill(batched_union_kernel, "step10_batched", 10, h, weight, allowed, layout, out, tiles, dot=True)
