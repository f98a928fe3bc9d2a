"""Step 5's three changes against step 4, one compile-time knob each: the experiment that times each change alone.

``step05_changes_kernel`` is step 4's kernel (``compact_rows_kernel``) and step 5's (``compact_stream_kernel``) in
one source, frozen from ``studylog/masked_lm_head/compact.py``:

* ``ONE_WAIT``: the row programs load a whole row as one ``[BLOCK_V, D_POW2]`` tile (padded to a power of two and
  masked) and reduce it once, h loaded first as a ``[1, D_POW2]`` tile (step 5); off, they walk the row in chunks
  of ``BLOCK_D`` and reduce each chunk with ``tl.sum`` (step 4);
* ``FILL_FIRST``: the fill programs (the ``-inf`` over the disallowed outputs) take the first grid slots and the
  row programs come after them (step 5); off, the row programs come first (step 4);
* ``EVICT_FIRST``: the weight rows are loaded with an L2 evict-first policy (step 5); off, with no policy (step 4).

Each branch is the library kernel's code as written there, so with every knob off the kernel computes exactly what
``step04_compact`` computes and with every knob on exactly what ``step05_stream`` computes (at the same tiles: the
outputs are bit-identical, and ``lab/masked_lm_head/step05_changes.py ptx`` checks that the PTX for sm_90 is the
same). Neither FILL_FIRST nor EVICT_FIRST changes a sum, so every variant's logits are bit-identical to those of
the library step with the same reduction: step 4 with ONE_WAIT off, step 5 with it on.
"""

from __future__ import annotations

import dataclasses

from studylog import runtime  # noqa: F401, I001  (first: it selects GPU or interpreter before triton is imported)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch import Tensor  # noqa: E402

from studylog.masked_lm_head import AllowedTokens  # noqa: E402
from studylog.masked_lm_head.formats import (Tiles, check_inputs, default_tiles, need_batch1, output,  # noqa: E402
                                             stream_tiles)

#: The knobs, in the order the tables list them; each is one of step 5's changes.
KNOBS = ("one_wait", "fill_first", "evict_first")


@triton.jit
def program_block(pid, n_first, AFTER_FIRST: tl.constexpr):
    """Which block of its kind (rows or fill) program ``pid`` takes: ``pid - n_first`` when its kind comes after
    the grid's first ``n_first`` programs, else ``pid``."""
    if AFTER_FIRST:
        block = pid - n_first
    else:
        block = pid
    return block


@triton.jit
def step05_changes_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, ids_ptr, n_ids, V, n_first, stride_wv,
    D: tl.constexpr, D_POW2: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, FILL_BLOCK: tl.constexpr,
    ONE_WAIT: tl.constexpr, FILL_FIRST: tl.constexpr, EVICT_FIRST: tl.constexpr,
):
    pid = tl.program_id(0)
    # the grid's first n_first programs are the fill programs (FILL_FIRST) or the row programs
    if FILL_FIRST:
        row_program = pid >= n_first
    else:
        row_program = pid < n_first
    if row_program:
        if ONE_WAIT:  # step 5: the whole row as one tile, one reduction
            offs_d = tl.arange(0, D_POW2)[None, :]
            in_d = offs_d < D
            # h as a [1, D] tile: already in the rows' layout
            h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
            slots = program_block(pid, n_first, FILL_FIRST) * BLOCK_V + tl.arange(0, BLOCK_V)
            live = slots < n_ids
            rows = tl.load(ids_ptr + slots, mask=live, other=0)
            w = tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wv + offs_d,
                        mask=live[:, None] & in_d, other=0.0,
                        eviction_policy="evict_first" if EVICT_FIRST else "").to(tl.float32)
            tl.store(out_ptr + rows, tl.sum(w * h, axis=1), mask=live)
        else:  # step 4: chunks of BLOCK_D, each reduced with tl.sum (which ends in a barrier)
            slots = program_block(pid, n_first, FILL_FIRST) * BLOCK_V + tl.arange(0, BLOCK_V)
            live = slots < n_ids
            rows = tl.load(ids_ptr + slots, mask=live, other=0)
            row_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wv
            acc = tl.zeros((BLOCK_V,), dtype=tl.float32)
            for k in tl.static_range(0, D, BLOCK_D):
                offs_d = k + tl.arange(0, BLOCK_D)
                in_d = offs_d < D
                h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
                w = tl.load(row_ptrs + offs_d[None, :], mask=live[:, None] & in_d[None, :], other=0.0,
                            eviction_policy="evict_first" if EVICT_FIRST else "").to(tl.float32)
                acc += tl.sum(w * h[None, :], axis=1)
            tl.store(out_ptr + rows, acc, mask=live)
    else:
        offs = program_block(pid, n_first, not FILL_FIRST) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        inside = offs < V
        keep = tl.load(allowed_ptr + offs, mask=inside, other=1)
        tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=inside & (keep == 0))


def shared_tiles(n_ids: int) -> Tiles:
    """The tiles every variant of the 2^3 grid runs at: step 5's (``stream_tiles``), with step 4's chunk width
    ``block_d``, which only a variant with ``one_wait`` off reads (step 5's tiles keep the default 128, which step 5
    never reads). Where step 4's own tiles differ from these (``block_v``: 2 rows a program from 2,049 to 16,384
    ids, where step 5 takes 1), :func:`step04_tiles` gives them."""
    return dataclasses.replace(stream_tiles(n_ids), block_d=step04_tiles(n_ids).block_d)


def step04_tiles(n_ids: int) -> Tiles:
    """Step 4's own tiles (``step04_compact``'s default)."""
    return default_tiles(4, 1, n_ids)


def changes(h: Tensor, weight: Tensor, allowed: AllowedTokens, *, one_wait: bool, fill_first: bool,
            evict_first: bool, out: Tensor | None = None, tiles: Tiles | None = None) -> Tensor:
    """Step 4 with any of step 5's changes (batch 1, weight ``[V, D]``), at ``tiles`` (default
    :func:`shared_tiles`); the launch is step 4's (``step04_compact``) or step 5's (``step05_stream``), whichever
    order of programs ``fill_first`` says."""
    for name, value in (("one_wait", one_wait), ("fill_first", fill_first), ("evict_first", evict_first)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    if tiles is not None and not isinstance(tiles, Tiles):
        raise TypeError(f"tiles must be a studylog.masked_lm_head.formats.Tiles, got {type(tiles).__name__}")
    batch, vocab, hidden = check_inputs(h, weight, allowed, "vd", out)
    need_batch1("step05_changes", batch)
    out = output(out, batch, vocab, h.device)
    n_ids = allowed.union_count
    t = tiles or shared_tiles(n_ids)
    n_rows = triton.cdiv(n_ids, t.block_v)
    n_fill = triton.cdiv(vocab, t.fill_block)
    step05_changes_kernel[(n_rows + n_fill,)](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_ids, vocab, n_fill if fill_first else n_rows,
        weight.stride(0),
        D=hidden, D_POW2=triton.next_power_of_2(hidden), BLOCK_V=t.block_v,
        BLOCK_D=min(t.block_d, triton.next_power_of_2(hidden)), FILL_BLOCK=t.fill_block,
        ONE_WAIT=one_wait, FILL_FIRST=fill_first, EVICT_FIRST=evict_first,
        num_warps=t.num_warps, num_stages=t.num_stages)
    return out
