"""Steps 4-10: programs that work only on the allowed ids (the union of the batch's allowed sets), reading whole
rows of the ``[V, D]`` weight, with the ``-inf`` written by fill programs of the same launch: the id list (step 4),
each row loaded as one tile (step 5), the fill programs first (step 6, which did not pay: steps 7 and 8 build on
step 5), an L2 evict-first hint on the rows (step 7), the ids as launch arguments (step 8), a batch's union read
once for all its sequences (step 9) and multiplied with them on the tensor cores (step 10).
"""

from __future__ import annotations

import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

from studylog import runtime  # noqa: F401  (selects GPU or interpreter before kernels are defined)
from studylog.masked_lm_head.formats import (FEW_IDS_MAX, AllowedTokens, Tiles, check_inputs, default_tiles,
                                             dot_dtype, few_tiles, need_batch1, need_layout, output, stream_tiles)

# Step 4: compacted ids, batch 1. Programs [0, n_compute) each take BLOCK_V allowed ids and read
# their whole rows; the programs after them write -inf over the disallowed part of the output.

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
        offs = (pid - n_compute) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        inside = offs < V
        keep = tl.load(allowed_ptr + offs, mask=inside, other=1)
        tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=inside & (keep == 0))


# Step 5: one wait per row. The whole row is one tile ([BLOCK_V, D rounded up to a power of two], the
# padding masked off, so it costs registers, not bytes): all of a row's loads are issued back to back and
# reduced once. In step 4 each chunk's tl.sum ends in a barrier, and the next chunk's loads come after it,
# so a program waited for memory once per chunk.

@triton.jit
def one_wait_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, ids_ptr, n_ids, V, n_compute, stride_wv,
    D: tl.constexpr, D_POW2: tl.constexpr, BLOCK_V: tl.constexpr, FILL_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_compute:
        offs_d = tl.arange(0, D_POW2)[None, :]
        in_d = offs_d < D
        # h as a [1, D] tile: already in the rows' layout (a 1-D h would be converted through
        # shared memory, with barriers that hold back the row loads until h has arrived)
        h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
        slots = pid * BLOCK_V + tl.arange(0, BLOCK_V)
        live = slots < n_ids
        rows = tl.load(ids_ptr + slots, mask=live, other=0)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wv + offs_d,
                    mask=live[:, None] & in_d, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, tl.sum(w * h, axis=1), mask=live)
    else:
        offs = (pid - n_compute) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        inside = offs < V
        keep = tl.load(allowed_ptr + offs, mask=inside, other=1)
        tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=inside & (keep == 0))


# Step 6: the fill programs first in the grid. Dispatched last, their mask-load -> store chain could be the
# tail of the launch; dispatched first, they delay the row programs, which wait on memory. It did not pay
# (the page measures it): steps 7 and 8 keep step 5's order, row programs first.

@triton.jit
def fill_first_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, ids_ptr, n_ids, V, n_fill, stride_wv,
    D: tl.constexpr, D_POW2: tl.constexpr, BLOCK_V: tl.constexpr, FILL_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid >= n_fill:
        offs_d = tl.arange(0, D_POW2)[None, :]
        in_d = offs_d < D
        # h as a [1, D] tile: already in the rows' layout (a 1-D h would be converted through
        # shared memory, with barriers that hold back the row loads until h has arrived)
        h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
        slots = (pid - n_fill) * BLOCK_V + tl.arange(0, BLOCK_V)
        live = slots < n_ids
        rows = tl.load(ids_ptr + slots, mask=live, other=0)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wv + offs_d,
                    mask=live[:, None] & in_d, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, tl.sum(w * h, axis=1), mask=live)
    else:
        offs = pid * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        inside = offs < V
        keep = tl.load(allowed_ptr + offs, mask=inside, other=1)
        tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=inside & (keep == 0))


# Step 7: step 5 with the weight rows read under an L2 evict-first policy: they are used once, so they
# recycle their own L2 lines rather than evict lines that other data (often dirty) occupies.

@triton.jit
def compact_stream_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, ids_ptr, n_ids, V, n_compute, stride_wv,
    D: tl.constexpr, D_POW2: tl.constexpr, BLOCK_V: tl.constexpr, FILL_BLOCK: tl.constexpr,
    EVICTION: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_compute:
        offs_d = tl.arange(0, D_POW2)[None, :]
        in_d = offs_d < D
        # h as a [1, D] tile: already in the rows' layout (a 1-D h would be converted through
        # shared memory, with barriers that hold back the row loads until h has arrived)
        h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
        slots = pid * BLOCK_V + tl.arange(0, BLOCK_V)
        live = slots < n_ids
        rows = tl.load(ids_ptr + slots, mask=live, other=0)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wv + offs_d,
                    mask=live[:, None] & in_d, other=0.0, eviction_policy=EVICTION).to(tl.float32)
        tl.store(out_ptr + rows, tl.sum(w * h, axis=1), mask=live)
    else:
        offs = (pid - n_compute) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        inside = offs < V
        keep = tl.load(allowed_ptr + offs, mask=inside, other=1)
        tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=inside & (keep == 0))


# Step 8: a handful of ids (a grammar state that forces one token, or allows a few) travel as
# launch arguments. A row program knows its row without loading an id, and a fill program knows
# which outputs to leave alone without loading the mask: the row read is the only memory access
# any program waits for. Unused slots hold -1, which no output position equals. The ids must not
# be specialised on (Triton would compile a variant for every id equal to 1 or divisible by 16).

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

# Step 9: batched, each sequence its own mask. Programs take BLOCK_V ids of the union of the
# allowed sets and read each chunk of those rows once for BLOCK_B sequences, reducing it against
# each sequence in turn (one tl.sum per sequence, as steps 4 to 8 compute a logit); a logit is
# stored only where that sequence allows that token. Fill programs write the -inf.

@triton.jit
def gathered_sums(h_ptr, w_ptr, rows, live, first_b, B, stride_hb, stride_wv, D: tl.constexpr,
                  BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """[BLOCK_B, BLOCK_V] fp32 products of the hidden states of sequences ``first_b`` on with the weight rows
    ``rows`` (those not ``live`` read as zeros): each chunk of BLOCK_D of the rows loaded once, then reduced against
    each sequence of the block that exists, one tl.sum each, h a [1, BLOCK_D] tile: step 9's tile."""
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
def union_sums_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, union_ptr, n_union, B, V, n_compute,
    stride_hb, stride_wv, stride_ob, stride_allowed_b,
    D: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
    FILL_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_compute:
        num_pid_b = tl.cdiv(B, BLOCK_B)
        pid_v = pid // num_pid_b  # neighbouring programs share rows: the second read hits L2
        pid_b = pid % num_pid_b
        slots = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        live = slots < n_union
        rows = tl.load(union_ptr + slots, mask=live, other=0)
        offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
        in_b = offs_b < B
        acc = gathered_sums(h_ptr, w_ptr, rows, live, pid_b * BLOCK_B, B, stride_hb, stride_wv, D, BLOCK_B, BLOCK_V,
                            BLOCK_D)
        tile = in_b[:, None] & live[None, :]
        allowed = tl.load(allowed_ptr + offs_b[:, None] * stride_allowed_b + rows[None, :], mask=tile, other=0)
        tl.store(out_ptr + offs_b[:, None] * stride_ob + rows[None, :], acc, mask=tile & (allowed != 0))
    else:
        offs = (pid - n_compute) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)  # over the flat [B, V] output
        inside = offs < B * V
        seq = offs // V
        tok = offs - seq * V
        keep = tl.load(allowed_ptr + seq * stride_allowed_b + tok, mask=inside, other=1)
        tl.store(out_ptr + seq * stride_ob + tok, tl.full((FILL_BLOCK,), float("-inf"), tl.float32),
                 mask=inside & (keep == 0))


# Step 10: step 9 with the block of union rows multiplied with the block's BLOCK_B hidden states
# by one tl.dot per chunk, on the tensor cores, instead of a reduction per sequence.

@triton.jit
def gathered_dot(h_ptr, w_ptr, rows, live, offs_b, in_b, stride_hb, stride_wv, D: tl.constexpr,
                 BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """[BLOCK_B, BLOCK_V] fp32 products of the hidden states ``offs_b`` with the weight rows ``rows`` (those
    not ``live`` read as zeros), D walked in chunks of BLOCK_D: step 10's tile, and the plan's."""
    offs_d = tl.arange(0, BLOCK_D)
    h_ptrs = h_ptr + offs_b[:, None] * stride_hb + offs_d[None, :]
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wv + offs_d[None, :]
    acc = tl.zeros((BLOCK_B, BLOCK_V), dtype=tl.float32)
    for k in range(0, tl.cdiv(D, BLOCK_D)):
        d_left = D - k * BLOCK_D
        h = tl.load(h_ptrs, mask=in_b[:, None] & (offs_d[None, :] < d_left), other=0.0)
        w = tl.load(w_ptrs, mask=live[:, None] & (offs_d[None, :] < d_left), other=0.0)
        acc = tl.dot(h.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), acc)
        h_ptrs += BLOCK_D
        w_ptrs += BLOCK_D
    return acc


@triton.jit
def batched_union_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, union_ptr, n_union, B, V, n_compute,
    stride_hb, stride_wv, stride_ob, stride_allowed_b,
    D: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
    FILL_BLOCK: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_compute:
        num_pid_b = tl.cdiv(B, BLOCK_B)
        pid_v = pid // num_pid_b  # neighbouring programs share rows: the second read hits L2
        pid_b = pid % num_pid_b
        slots = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        live = slots < n_union
        rows = tl.load(union_ptr + slots, mask=live, other=0)
        offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
        in_b = offs_b < B
        acc = gathered_dot(h_ptr, w_ptr, rows, live, offs_b, in_b, stride_hb, stride_wv, D, BLOCK_B, BLOCK_V, BLOCK_D,
                           DOT_DTYPE)
        tile = in_b[:, None] & live[None, :]
        allowed = tl.load(allowed_ptr + offs_b[:, None] * stride_allowed_b + rows[None, :], mask=tile, other=0)
        tl.store(out_ptr + offs_b[:, None] * stride_ob + rows[None, :], acc, mask=tile & (allowed != 0))
    else:
        offs = (pid - n_compute) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)  # over the flat [B, V] output
        inside = offs < B * V
        seq = offs // V
        tok = offs - seq * V
        keep = tl.load(allowed_ptr + seq * stride_allowed_b + tok, mask=inside, other=1)
        tl.store(out_ptr + seq * stride_ob + tok, tl.full((FILL_BLOCK,), float("-inf"), tl.float32),
                 mask=inside & (keep == 0))



#: The L2 policy of the weight-row loads of steps 7 and 8: the rows are read once.
EVICTION = "evict_first"
#: Step 8's unused id slots: -1, which no output position equals.
NO_IDS = (-1,) * FEW_IDS_MAX


def step04_compact(h: Float[Tensor, "1 d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                   layout: str = "vd", out: Float[Tensor, "1 v"] | None = None,
                   tiles: Tiles | None = None) -> Float[Tensor, "1 v"]:
    """Step 4 (batch 1): programs run only over the allowed ids, reading whole rows; the rest of
    the grid writes ``-inf`` over the disallowed outputs, in the same launch."""
    need_layout("step04_compact", layout)
    batch, vocab, hidden = check_inputs(h, weight, allowed, layout, out)
    need_batch1("step04_compact", batch)
    out = output(out, batch, vocab, h.device)
    n_ids = allowed.union_count
    t = tiles or default_tiles(4, 1, n_ids)
    n_compute = triton.cdiv(n_ids, t.block_v)  # row programs first, then the fill programs
    compact_rows_kernel[(n_compute + triton.cdiv(vocab, t.fill_block),)](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_ids, vocab, n_compute, weight.stride(0),
        D=hidden, BLOCK_V=t.block_v, BLOCK_D=min(t.block_d, triton.next_power_of_2(hidden)),
        FILL_BLOCK=t.fill_block, num_warps=t.num_warps, num_stages=t.num_stages)
    return out


def step05_one_wait(h: Float[Tensor, "1 d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                    layout: str = "vd", out: Float[Tensor, "1 v"] | None = None,
                    tiles: Tiles | None = None) -> Float[Tensor, "1 v"]:
    """Step 5 (batch 1): step 4 with each row loaded as one tile and reduced once, so a program waits for
    memory once per row."""
    need_layout("step05_one_wait", layout)
    batch, vocab, hidden = check_inputs(h, weight, allowed, layout, out)
    need_batch1("step05_one_wait", batch)
    out = output(out, batch, vocab, h.device)
    n_ids = allowed.union_count
    t = tiles or stream_tiles(n_ids)
    n_compute = triton.cdiv(n_ids, t.block_v)  # row programs first, then the fill programs
    one_wait_kernel[(n_compute + triton.cdiv(vocab, t.fill_block),)](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_ids, vocab, n_compute, weight.stride(0),
        D=hidden, D_POW2=triton.next_power_of_2(hidden), BLOCK_V=t.block_v, FILL_BLOCK=t.fill_block,
        num_warps=t.num_warps, num_stages=t.num_stages)
    return out


def step06_fill_first(h: Float[Tensor, "1 d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                      layout: str = "vd", out: Float[Tensor, "1 v"] | None = None,
                      tiles: Tiles | None = None) -> Float[Tensor, "1 v"]:
    """Step 6 (batch 1): step 5 with the fill programs first in the grid (it did not pay: steps 7 and 8 build on
    step 5)."""
    need_layout("step06_fill_first", layout)
    batch, vocab, hidden = check_inputs(h, weight, allowed, layout, out)
    need_batch1("step06_fill_first", batch)
    out = output(out, batch, vocab, h.device)
    n_ids = allowed.union_count
    t = tiles or stream_tiles(n_ids)
    n_fill = triton.cdiv(vocab, t.fill_block)  # fill programs first, then the row programs
    fill_first_kernel[(n_fill + triton.cdiv(n_ids, t.block_v),)](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_ids, vocab, n_fill, weight.stride(0),
        D=hidden, D_POW2=triton.next_power_of_2(hidden), BLOCK_V=t.block_v, FILL_BLOCK=t.fill_block,
        num_warps=t.num_warps, num_stages=t.num_stages)
    return out


def step07_stream(h: Float[Tensor, "1 d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                  layout: str = "vd", out: Float[Tensor, "1 v"] | None = None,
                  tiles: Tiles | None = None) -> Float[Tensor, "1 v"]:
    """Step 7 (batch 1): step 5 with the weight rows read under an L2 evict-first policy (:data:`EVICTION`: each
    row is read once)."""
    need_layout("step07_stream", layout)
    batch, vocab, hidden = check_inputs(h, weight, allowed, layout, out)
    need_batch1("step07_stream", batch)
    out = output(out, batch, vocab, h.device)
    n_ids = allowed.union_count
    t = tiles or stream_tiles(n_ids)
    n_compute = triton.cdiv(n_ids, t.block_v)  # row programs first, then the fill programs
    compact_stream_kernel[(n_compute + triton.cdiv(vocab, t.fill_block),)](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_ids, vocab, n_compute, weight.stride(0),
        D=hidden, D_POW2=triton.next_power_of_2(hidden), BLOCK_V=t.block_v, FILL_BLOCK=t.fill_block,
        EVICTION=EVICTION, num_warps=t.num_warps, num_stages=t.num_stages)
    return out


def step08_few_ids(h: Float[Tensor, "1 d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                   out: Float[Tensor, "1 v"] | None = None, tiles: Tiles | None = None) -> Float[Tensor, "1 v"]:
    """Step 8 (batch 1, at most :data:`FEW_IDS_MAX` allowed ids): the ids are launch arguments, so no program
    loads an id or the mask (and a CUDA graph of a call replays the same ids)."""
    batch, vocab, hidden = check_inputs(h, weight, allowed, "vd", out)
    need_batch1("step08_few_ids", batch)
    ids = allowed.few_ids
    if ids is None:
        raise ValueError(f"step08_few_ids takes at most {FEW_IDS_MAX} allowed ids, got {allowed.union_count} "
                         "(use step07_stream or masked_logits)")
    out = output(out, batch, vocab, h.device)
    t = tiles or few_tiles()
    n = len(ids)  # row programs first, then the fill programs
    few_ids_kernel[(n + triton.cdiv(vocab, t.fill_block),)](
        h, weight, out, n, *ids, *NO_IDS[n:], vocab, weight.stride(0),
        D=hidden, D_POW2=triton.next_power_of_2(hidden), FILL_BLOCK=t.fill_block, EVICTION=EVICTION,
        num_warps=t.num_warps, num_stages=t.num_stages)
    return out


def step09_union(h: Float[Tensor, "b d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                 layout: str = "vd", out: Float[Tensor, "b v"] | None = None,
                 tiles: Tiles | None = None) -> Float[Tensor, "b v"]:
    """Step 9: any batch, each sequence its own allowed set; every row of the union is read once, and reduced
    against each sequence in turn."""
    need_layout("step09_union", layout)
    batch, vocab, hidden = check_inputs(h, weight, allowed, layout, out)
    out = output(out, batch, vocab, h.device)
    n_union = allowed.union_count
    t = tiles or default_tiles(9, batch, n_union)
    n_compute = triton.cdiv(n_union, t.block_v) * triton.cdiv(batch, t.block_b)  # then the fill programs
    union_sums_kernel[(n_compute + triton.cdiv(batch * vocab, t.fill_block),)](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_union, batch, vocab, n_compute,
        h.stride(0), weight.stride(0), out.stride(0), allowed.mask.stride(0),
        D=hidden, BLOCK_B=t.block_b, BLOCK_V=t.block_v, BLOCK_D=t.block_d, FILL_BLOCK=t.fill_block,
        num_warps=t.num_warps, num_stages=t.num_stages)
    return out


def step10_batched(h: Float[Tensor, "b d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                   layout: str = "vd", out: Float[Tensor, "b v"] | None = None,
                   tiles: Tiles | None = None) -> Float[Tensor, "b v"]:
    """Step 10: step 9 with each block of union rows multiplied with the batch's hidden states on the tensor cores
    (``tl.dot``)."""
    need_layout("step10_batched", layout)
    batch, vocab, hidden = check_inputs(h, weight, allowed, layout, out)
    out = output(out, batch, vocab, h.device)
    n_union = allowed.union_count
    t = tiles or default_tiles(10, batch, n_union)
    n_compute = triton.cdiv(n_union, t.block_v) * triton.cdiv(batch, t.block_b)  # then the fill programs
    batched_union_kernel[(n_compute + triton.cdiv(batch * vocab, t.fill_block),)](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_union, batch, vocab, n_compute,
        h.stride(0), weight.stride(0), out.stride(0), allowed.mask.stride(0),
        D=hidden, BLOCK_B=t.block_b, BLOCK_V=t.block_v, BLOCK_D=t.block_d, FILL_BLOCK=t.fill_block,
        DOT_DTYPE=dot_dtype(h.dtype), num_warps=t.num_warps, num_stages=t.num_stages)
    return out
