"""Step 11: step 3 on a vocabulary reordered so that tokens allowed together sit together (fewer active blocks),
and the reordering itself (built once, offline)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np
import torch
import triton
import triton.language as tl
from jaxtyping import Int
from torch import Tensor

from studylog import runtime  # noqa: F401  (selects GPU or interpreter before kernels are defined)
from studylog.masked_lm_head.dense import dot_rows, masked_tile, store_allowed
from studylog.masked_lm_head.formats import (AllowedTokens, Hidden, Logits, Tiles, Weight, check_inputs, default_tiles,
                                             output, tile_constexprs)

# Row j of the weight is token perm[j]; the masks are in the same order; the logits go back to their tokens' places.

@triton.jit
def reordered_rows_kernel(
    a_ptr, b_ptr, c_ptr, allowed_ptr, perm_ptr, M, N, K,
    stride_am, stride_bn, stride_cm, stride_allowed_m,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    offs_m, offs_n, offs_k, c_mask, allowed = masked_tile(allowed_ptr, M, N, stride_allowed_m, BLOCK_M, BLOCK_N,
                                                          BLOCK_K, GROUP_M)
    if tl.sum(allowed.to(tl.int32)) == 0:  # nothing allowed in this block: no loads, no math
        tokens = tl.load(perm_ptr + offs_n, mask=offs_n < N, other=0)  # original id of each reordered row
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + tokens[None, :]
        tl.store(c_ptrs, tl.full((BLOCK_M, BLOCK_N), float("-inf"), tl.float32), mask=c_mask)
        return
    row_wanted = tl.max(allowed.to(tl.int32), axis=0) != 0  # some sequence of the tile allows this token
    acc = dot_rows(a_ptr, b_ptr, offs_m, offs_n, offs_k, offs_m[:, None] < M, offs_n[:, None] < N, row_wanted, K,
                   stride_am, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE)

    tokens = tl.load(perm_ptr + offs_n, mask=offs_n < N, other=0)  # original id of each reordered row
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + tokens[None, :]
    store_allowed(c_ptrs, acc, allowed_ptr, offs_m, offs_n, stride_allowed_m, c_mask)


@dataclass(frozen=True, eq=False)
class VocabOrder:
    """A vocabulary permutation: reordered position ``j`` holds original token ``perm[j]``."""

    perm: Int[Tensor, " v"]

    @property
    def vocab_size(self) -> int:
        return self.perm.numel()

    @cached_property
    def position(self) -> np.ndarray:
        """``position[token]``: where an original token sits in the reordered vocabulary."""
        pos = np.empty(self.vocab_size, dtype=np.int64)
        pos[self.perm.cpu().numpy()] = np.arange(self.vocab_size)
        return pos


def cluster_order(train_sets: Sequence[np.ndarray], vocab_size: int) -> VocabOrder:
    """Tokens allowed by the same sets made neighbours: sorted by which training sets allow them, smallest sets
    leading, each small set is one contiguous run (stable: ties keep id order; tokens no set allows go last)."""
    sets = [np.unique(np.asarray(s, dtype=np.int64)) for s in train_sets]
    sets = [s for s in sets if s.size]
    if not sets:
        return VocabOrder(torch.arange(vocab_size, dtype=torch.int32))
    for s in sets:
        if s[0] < 0 or s[-1] >= vocab_size:
            raise ValueError(f"a training set holds ids outside [0, vocab_size={vocab_size})")
    sets.sort(key=len)
    outside = np.ones((len(sets), vocab_size), dtype=bool)  # False where allowed, so allowed sorts first
    for i, s in enumerate(sets):
        outside[i, s] = False
    packed = np.packbits(outside, axis=0)  # 8 sets per byte, first set in the high bit
    perm = np.lexsort(packed[::-1])  # np.lexsort's last key is the primary one
    return VocabOrder(torch.from_numpy(perm.astype(np.int32)))


def active_blocks(ids: np.ndarray, block: int, order: VocabOrder | None = None) -> int:
    """How many vocabulary blocks of ``block`` tokens hold at least one of ``ids`` (in ``order``)."""
    ids = np.asarray(ids, dtype=np.int64)
    pos = ids if order is None else order.position[ids]
    return int(np.unique(pos // block).size)


@dataclass(frozen=True, eq=False)
class ReorderedHead:
    """A head whose rows are stored in a :class:`VocabOrder` (built once, offline)."""

    weight: Weight
    order: VocabOrder

    @classmethod
    def build(cls, weight: Weight, order: VocabOrder) -> "ReorderedHead":
        if weight.ndim != 2 or weight.shape[0] != order.vocab_size:
            raise ValueError(f"weight must be [V, D] with V = {order.vocab_size}, got {tuple(weight.shape)}")
        perm = order.perm.to(weight.device)
        return cls(weight.index_select(0, perm).contiguous(), VocabOrder(perm.to(torch.int32)))


def step11_reordered(h: Hidden, head: ReorderedHead, allowed_reordered: AllowedTokens, *, out: Logits | None = None,
                      tiles: Tiles | None = None) -> Logits:
    """Step 11: step 3 on a reordered vocabulary (``allowed_reordered = allowed.permuted(head.order)``, once per
    FSM state); logits come out in the original token order."""
    if not isinstance(head, ReorderedHead):
        raise TypeError(f"head must be a ReorderedHead, got {type(head).__name__}")
    batch, vocab, hidden = check_inputs(h, head.weight, allowed_reordered, "vd", out)
    if head.order.perm.device != h.device:
        raise ValueError(f"head.order is on {head.order.perm.device}, h on {h.device}")
    out = output(out, batch, vocab, h.device)
    t = tiles or default_tiles(11, batch)
    reordered_rows_kernel[(triton.cdiv(batch, t.block_b) * triton.cdiv(vocab, t.block_v),)](
        h, head.weight, out, allowed_reordered.mask_u8, head.order.perm, batch, vocab, hidden,
        h.stride(0), head.weight.stride(0), out.stride(0), allowed_reordered.mask.stride(0),
        **tile_constexprs(t, h.dtype))
    return out

