"""Step 7's two ideas, one compile-time knob: the experiment that times the union (7a) without ``tl.dot`` (7b).

``step07_changes_kernel`` is step 7's kernel (``batched_union_kernel`` and its ``gathered_dot``), frozen from
``studylog/masked_lm_head/compact.py``, with one knob:

* ``DOT`` on: the tile of union rows is multiplied with the batch's hidden states by ``tl.dot`` (step 7, 7a + 7b);
* ``DOT`` off: the same programs read the same tile of union rows once, chunk by chunk, and each sequence's logits
  are one reduction per sequence, ``tl.sum(w * h, axis=1)`` with ``h`` one sequence's ``[1, BLOCK_D]`` tile, as
  steps 4 and 5 compute a row's logit (7a alone).

Everything else is the library kernel's code as written there: the grid (row programs over union blocks x batch
blocks, then the fill programs), the row and mask loads, the store only where that sequence allows that token,
the fill. With ``DOT`` on the kernel computes exactly what ``step07_batched`` computes at the same tiles (the
outputs are bit-identical). With it off the sums are added in another order, so the logits differ within fp32
accumulation error; the ``-inf`` positions are the same.
"""

from __future__ import annotations

from studylog import runtime  # noqa: F401, I001  (first: it selects GPU or interpreter before triton is imported)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch import Tensor  # noqa: E402

from studylog.masked_lm_head import AllowedTokens  # noqa: E402
from studylog.masked_lm_head.formats import Tiles, check_inputs, default_tiles, dot_dtype, output  # noqa: E402


@triton.jit
def gathered_dot(h_ptr, w_ptr, rows, live, offs_b, in_b, stride_hb, stride_wv, D: tl.constexpr,
                 BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """The library's: [BLOCK_B, BLOCK_V] fp32 products by tl.dot, D walked in chunks of BLOCK_D."""
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
def gathered_sums(h_ptr, w_ptr, rows, live, first_b, B, stride_hb, stride_wv, D: tl.constexpr,
                  BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """The same [BLOCK_B, BLOCK_V] products with no tl.dot: each chunk of the rows is loaded once, then reduced
    against each sequence of the block in turn (only the block's sequences that exist), one tl.sum each. h is a
    [1, BLOCK_D] tile, already in the rows' layout (as in step 5)."""
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
def step07_changes_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, union_ptr, n_union, B, V, n_compute,
    stride_hb, stride_wv, stride_ob, stride_allowed_b,
    D: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
    FILL_BLOCK: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT: tl.constexpr,
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
        if DOT:  # 7a + 7b: step 7
            acc = gathered_dot(h_ptr, w_ptr, rows, live, offs_b, in_b, stride_hb, stride_wv, D, BLOCK_B, BLOCK_V,
                               BLOCK_D, DOT_DTYPE)
        else:  # 7a alone: one reduction per sequence
            acc = gathered_sums(h_ptr, w_ptr, rows, live, pid_b * BLOCK_B, B, stride_hb, stride_wv, D, BLOCK_B,
                                BLOCK_V, BLOCK_D)
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


def changes(h: Tensor, weight: Tensor, allowed: AllowedTokens, *, dot: bool, out: Tensor | None = None,
            tiles: Tiles | None = None) -> Tensor:
    """Step 7 (``dot=True``) or its union with per-sequence reductions (``dot=False``), any batch, weight
    ``[V, D]``, launched as ``step07_batched`` launches its kernel (default tiles: step 7's)."""
    if not isinstance(dot, bool):
        raise TypeError(f"dot must be a bool, got {dot!r}")
    if tiles is not None and not isinstance(tiles, Tiles):
        raise TypeError(f"tiles must be a studylog.masked_lm_head.formats.Tiles, got {type(tiles).__name__}")
    batch, vocab, hidden = check_inputs(h, weight, allowed, "vd", out)
    out = output(out, batch, vocab, h.device)
    n_union = allowed.union_count
    t = tiles or default_tiles(7, batch, n_union)
    n_compute = triton.cdiv(n_union, t.block_v) * triton.cdiv(batch, t.block_b)  # then the fill programs
    step07_changes_kernel[(n_compute + triton.cdiv(batch * vocab, t.fill_block),)](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_union, batch, vocab, n_compute,
        h.stride(0), weight.stride(0), out.stride(0), allowed.mask.stride(0),
        D=hidden, BLOCK_B=t.block_b, BLOCK_V=t.block_v, BLOCK_D=t.block_d, FILL_BLOCK=t.fill_block,
        DOT_DTYPE=dot_dtype(h.dtype), DOT=dot, num_warps=t.num_warps, num_stages=t.num_stages)
    return out
