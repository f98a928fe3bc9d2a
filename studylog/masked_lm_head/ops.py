"""Chapter 2's entry point as a PyTorch operator, ``torch.ops.studylog.masked_logits``: the plan's kernels from the
packed int32 bitmask and a bound on the union's count (``torch.compile`` cannot graph an ``AllowedTokens``). On the
GPU a ``triton_op``; in the interpreter an opaque ``custom_op`` (Dynamo stops at its ``uint64`` pointers)."""

from __future__ import annotations

import torch
from torch import Tensor

from studylog import runtime
from studylog.checks import check_tensor
from studylog.masked_lm_head.dispatch import dispatch_rule
from studylog.masked_lm_head.formats import WEIGHT_DTYPES, bitmask_words
from studylog.masked_lm_head.plan import bucket_for, bucket_launches

#: whether the operator is a ``triton_op`` (Inductor sees its kernels), not an opaque ``custom_op``
TRITON_OP = runtime.mode() == "gpu"

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


def bucket_of_bound(batch: int, vocab: int, max_allowed: int) -> tuple[str, int]:
    """(path, grid capacity) for a union of at most ``max_allowed`` tokens (-1: unknown), as the plan's."""
    return bucket_for(batch, vocab, vocab if max_allowed < 0 else max_allowed, dispatch_rule())


def _masked_logits(h: Tensor, weight: Tensor, bitmask: Tensor, max_allowed: int = -1) -> Tensor:
    """fp32 ``h @ weight.T`` ``[B, V]``, ``-inf`` where ``bitmask``'s bit is 0; ``max_allowed`` bounds the union."""
    max_allowed = int(max_allowed)  # a traced SymInt is specialised: the bound picks the path and the grid
    batch, vocab, _ = _check(h, weight, bitmask, max_allowed)
    bucket = bucket_of_bound(batch, vocab, max_allowed)
    if bucket[0] != "dense":
        out = torch.empty(batch, vocab, dtype=torch.float32, device=h.device)
    elif h.is_cuda and hasattr(torch.ops.aten.mm, "dtype"):  # fp32 h @ weight.T: cuBLAS with fp32 output
        out = torch.ops.aten.mm.dtype(h, weight.t(), torch.float32)
    else:  # where torch has no such mm, the operands widened (exact)
        out = torch.mm(h.float(), weight.float().t())
    # the buffers the path writes: the row-skip path's mask, the compacted paths' union ids and count
    mask = torch.empty(batch, vocab, dtype=torch.uint8, device=h.device) if bucket[0] == "row_skip" else None
    compacted = bucket[0] in ("stream", "batched")
    ids = torch.zeros(vocab + 64, dtype=torch.int32, device=h.device) if compacted else None
    count = torch.zeros(1, dtype=torch.int32, device=h.device) if compacted else None
    for kernel, grid, args, constexprs in bucket_launches(bucket, h, weight, out, bitmask, ids, count, mask):
        wrap_triton(kernel)[(grid,)](*args, **constexprs)
    return out


masked_logits = (torch.library.triton_op if TRITON_OP else torch.library.custom_op)(
    "studylog::masked_logits", _masked_logits, mutates_args=())
masked_logits.__doc__ = _masked_logits.__doc__


@masked_logits.register_fake
def _(h: Tensor, weight: Tensor, bitmask: Tensor, max_allowed: int = -1) -> Tensor:
    batch, vocab, _ = _check(h, weight, bitmask, int(max_allowed))
    return h.new_empty((batch, vocab), dtype=torch.float32)


__all__ = ["masked_logits", "TRITON_OP"]
