"""Chapter 2's entry point as a PyTorch operator: ``torch.ops.studylog.masked_logits``.

It takes the packed int32 bitmask and a bound on the union's count (no ``AllowedTokens``, which ``torch.compile``
cannot put in a graph) and runs :class:`~studylog.masked_lm_head.plan.MaskedHeadPlan`'s kernels, reading nothing
back. On the GPU a ``triton_op``; in the interpreter an opaque ``custom_op`` (Dynamo stops at its ``uint64``
pointers); ``STUDYLOG_OPAQUE_OPS=1`` makes the GPU operator opaque too.
"""

from __future__ import annotations

import os

import torch
import triton
from torch import Tensor

from studylog import runtime
from studylog.checks import check_tensor
from studylog.masked_lm_head.compact import EVICTION
from studylog.masked_lm_head.dense import row_skip_kernel
from studylog.masked_lm_head.dispatch import dispatch_rule
from studylog.masked_lm_head.formats import WEIGHT_DTYPES, bitmask_words, default_tiles, dot_dtype, stream_tiles
from studylog.masked_lm_head.plan import (APPLY_BLOCK, APPLY_WARPS, UNION_BLOCK_B, UNION_BLOCK_W, apply_bitmask_kernel,
                                          batched_count_kernel, bucket_for, stream_count_kernel, union_ids_kernel,
                                          unpack_bitmask_kernel)

#: Whether the operator is a ``triton_op`` (Inductor sees its kernels) rather than an opaque ``custom_op``.
TRITON_OP = runtime.mode() == "gpu" and os.environ.get("STUDYLOG_OPAQUE_OPS") != "1"

if TRITON_OP:
    from torch.library import wrap_triton
else:
    def wrap_triton(kernel):
        """The opaque operator launches its kernels itself (the name stays: torch finds a triton_op's kernels by it)."""
        return kernel


def _check(h: Tensor, weight: Tensor, bitmask: Tensor, max_allowed: int) -> tuple[int, int, int]:
    """(B, V, D) after the metadata checks (no device synchronisation: the bits are not read)."""
    check_tensor("h", h, dtype=WEIGHT_DTYPES, ndim=2, contiguous=True)
    check_tensor("weight", weight, dtype=h.dtype, ndim=2, contiguous=True, like=h)
    check_tensor("bitmask", bitmask, dtype=torch.int32, ndim=2, contiguous=True, like=h)
    # plain ints (a traced SymInt is specialised): the sizes pick the path, the tiles and the grids
    batch, hidden, vocab = int(h.shape[0]), int(h.shape[1]), int(weight.shape[0])
    if weight.shape[1] != hidden:
        raise ValueError(f"weight must be [V, D] with D = {hidden} (h's), got shape {tuple(weight.shape)}")
    if bitmask.shape[0] != batch or bitmask.shape[1] != bitmask_words(vocab):
        raise ValueError(f"bitmask must be [B, ceil(V / 32)] = [{batch}, {bitmask_words(vocab)}], got shape "
                         f"{tuple(bitmask.shape)}")
    if batch == 0 or hidden == 0 or vocab == 0:
        raise ValueError(f"empty input: B={batch}, V={vocab}, D={hidden}")
    if isinstance(max_allowed, bool) or not isinstance(max_allowed, int) or max_allowed < -1:
        raise ValueError(f"max_allowed must be -1 (unknown) or a bound >= 0 on the union's count, got {max_allowed!r}")
    want = "cuda" if runtime.mode() == "gpu" else "cpu"
    if h.device.type not in (want, "meta"):
        raise ValueError(f"h must be on {want} (Triton runs in {runtime.mode()} mode), got {h.device}")
    return batch, vocab, hidden


def _bucket(batch: int, vocab: int, max_allowed: int) -> tuple[str, int]:
    """(path, grid capacity) for a union of at most ``max_allowed`` tokens (-1: unknown), as the plan's."""
    return bucket_for(batch, vocab, vocab if max_allowed < 0 else max_allowed, dispatch_rule())


def _dense_logits(h: Tensor, weight: Tensor) -> Tensor:
    """``h @ weight.T`` in fp32 (cuBLAS with fp32 output where torch has it; else the operands widened, exact)."""
    if h.is_cuda and hasattr(torch.ops.aten.mm, "dtype"):
        return torch.ops.aten.mm.dtype(h, weight.t(), torch.float32)
    return torch.mm(h.float(), weight.float().t())


def _masked_logits(h: Tensor, weight: Tensor, bitmask: Tensor, max_allowed: int = -1) -> Tensor:
    """fp32 ``h @ weight.T`` ``[B, V]``, ``-inf`` where ``bitmask``'s bit is 0; ``max_allowed`` bounds the union."""
    max_allowed = int(max_allowed)  # a traced SymInt is specialised: the bound picks the path and the grid
    batch, vocab, hidden = _check(h, weight, bitmask, max_allowed)
    path, capacity = _bucket(batch, vocab, max_allowed)
    words = int(bitmask.shape[1])  # every tensor here is contiguous: a row stride is the row's length
    if path == "dense":
        out = _dense_logits(h, weight)
        wrap_triton(apply_bitmask_kernel)[(batch * triton.cdiv(vocab, APPLY_BLOCK),)](
            out, bitmask, vocab, words, vocab, words, FILL_BLOCK=APPLY_BLOCK, num_warps=APPLY_WARPS)
        return out
    out = torch.empty(batch, vocab, dtype=torch.float32, device=h.device)
    if path == "row_skip":
        mask = torch.empty(batch, vocab, dtype=torch.uint8, device=h.device)
        wrap_triton(unpack_bitmask_kernel)[(batch * triton.cdiv(vocab, APPLY_BLOCK),)](
            bitmask, mask, vocab, words, vocab, FILL_BLOCK=APPLY_BLOCK, num_warps=4)
        t = default_tiles(3, batch)
        wrap_triton(row_skip_kernel)[(triton.cdiv(batch, t.block_b) * triton.cdiv(vocab, t.block_v),)](
            h, weight, out, mask, batch, vocab, hidden, hidden, hidden, vocab, vocab,
            BLOCK_M=t.block_b, BLOCK_N=t.block_v, BLOCK_K=t.block_d, GROUP_M=t.group,
            DOT_DTYPE=dot_dtype(weight.dtype), num_warps=t.num_warps, num_stages=t.num_stages)
        return out
    # the union of the batch's sets as ids and a count, on the device; the compacted kernels read the count
    ids = torch.zeros(vocab + 64, dtype=torch.int32, device=h.device)
    count = torch.zeros(1, dtype=torch.int32, device=h.device)
    wrap_triton(union_ids_kernel)[(triton.cdiv(words, UNION_BLOCK_W),)](
        bitmask, ids, count, batch, vocab, words, words, BLOCK_W=UNION_BLOCK_W,
        BLOCK_B=min(UNION_BLOCK_B, triton.next_power_of_2(batch)), num_warps=4)
    if path == "stream":
        t = stream_tiles(capacity)
        n_compute = triton.cdiv(capacity, t.block_v)
        wrap_triton(stream_count_kernel)[(n_compute + triton.cdiv(vocab, t.fill_block),)](
            h, weight, out, bitmask, ids, count, vocab, n_compute, hidden, D=hidden,
            D_POW2=triton.next_power_of_2(hidden), BLOCK_V=t.block_v, FILL_BLOCK=t.fill_block, EVICTION=EVICTION,
            num_warps=t.num_warps, num_stages=t.num_stages)
        return out
    t = default_tiles(10, batch, capacity)
    n_compute = triton.cdiv(capacity, t.block_v) * triton.cdiv(batch, t.block_b)
    wrap_triton(batched_count_kernel)[(n_compute + batch * triton.cdiv(vocab, t.fill_block),)](
        h, weight, out, bitmask, ids, count, batch, vocab, n_compute, hidden, hidden, vocab, words, D=hidden,
        BLOCK_B=t.block_b, BLOCK_V=t.block_v, BLOCK_D=t.block_d, FILL_BLOCK=t.fill_block,
        DOT_DTYPE=dot_dtype(weight.dtype), num_warps=t.num_warps, num_stages=t.num_stages)
    return out


if TRITON_OP:
    masked_logits = torch.library.triton_op("studylog::masked_logits", _masked_logits, mutates_args=())
else:
    masked_logits = torch.library.custom_op("studylog::masked_logits", _masked_logits, mutates_args=())
masked_logits.__doc__ = _masked_logits.__doc__


@masked_logits.register_fake
def _(h: Tensor, weight: Tensor, bitmask: Tensor, max_allowed: int = -1) -> Tensor:
    batch, vocab, _ = _check(h, weight, bitmask, int(max_allowed))
    return h.new_empty((batch, vocab), dtype=torch.float32)


__all__ = ["masked_logits", "TRITON_OP"]
