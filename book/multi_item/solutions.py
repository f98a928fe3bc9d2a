"""The answers to chapter 6's exercises. The notebook does not import this module (its checks in
:mod:`book.multi_item.exercises` do): read it after trying."""

from __future__ import annotations

from typing import Sequence

import torch
import triton.language as tl
from torch import Tensor

__all__ = ["visible", "online_softmax", "key_tiles", "max_programs", "step5_at", "items_lo"]


def visible(q: int, k: int, prefix_len: int, pos: Sequence[int]) -> bool:
    """Exercise 1: may query ``q`` see key ``k`` under FlashInfer's rule? ``pos[j]`` is the position inside its
    item of token ``prefix_len + j`` (0 at a delimiter)."""
    if k > q:
        return False
    if k < prefix_len or q < prefix_len:
        return True
    return k > q - pos[q - prefix_len]  # after the delimiter that opens the query's item


def online_softmax(scores: Tensor, values: Tensor, block_n: int) -> Tensor:
    """Exercise 2: ``softmax(scores) @ values`` row by row, reading ``block_n`` keys at a time with a running
    maximum and sum (steps 2 to 5's loop). Masked scores are ``-inf``; a row with no visible key is 0. The maximum
    starts finite, so a block of ``-inf`` gives ``exp(-inf) = 0`` and never NaN."""
    rows = scores.shape[0]
    m = torch.full((rows,), -1e30, dtype=torch.float64)
    l = torch.zeros(rows, dtype=torch.float64)
    acc = torch.zeros(rows, values.shape[1], dtype=torch.float64)
    for lo in range(0, scores.shape[1], block_n):
        s = scores[:, lo:lo + block_n].double()
        m_new = torch.maximum(m, s.max(dim=1).values)
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[:, None])
        l = l * alpha + p.sum(dim=1)
        acc = acc * alpha[:, None] + p @ values[lo:lo + block_n].double()
        m = m_new
    return torch.where(l[:, None] > 0, acc / l.clamp_min(1e-300)[:, None], torch.zeros_like(acc))


def key_tiles(prefix_len: int, pos: Sequence[int], m_lo: int, m_hi: int, block_n: int) -> list[int]:
    """Exercise 3: the key tiles (``block_n`` keys each) that query rows ``[m_lo, m_hi)`` of one prompt load under
    FlashInfer's rule: the prefix up to the diagonal, then from the first key the tile's first item row sees (the
    token after its delimiter) up to the diagonal."""
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    tiles = set(range(cdiv(min(prefix_len, m_hi), block_n)))  # prefix tiles (the causal ones for prefix rows)
    if m_hi > prefix_len:  # the tile holds item rows
        first = max(m_lo, prefix_len)
        items_lo = first + 1 - pos[first - prefix_len]
        tiles |= set(range(items_lo // block_n, cdiv(m_hi, block_n)))
    return sorted(tiles)


def max_programs(max_tokens: int, max_prompts: int, block_m: int) -> int:
    """Exercise 4: the most query tiles (per head) any batch of at most ``max_prompts`` prompts and ``max_tokens``
    tokens can have: each prompt adds a partial tile at most, so ``sum cdiv(S_b, block_m) <= cdiv(T, block_m) +
    B - 1``, reached by one long prompt and ``B - 1`` prompts of one token."""
    return -(-max_tokens // block_m) + max_prompts - 1


def step5_at(q, k, v, batch, block_m: int, block_n: int):
    """Exercise 5: step 5 with its tile fixed to ``block_m`` query rows by ``block_n`` keys instead of the
    autotuner's choice (on a GPU, with the default warps and stages of that tile height)."""
    from studylog import multi_item as mi

    return mi.step05_batched(q, k, v, batch, blocks=(block_m, block_n))


def items_lo(m_lo, prefix_hi, Pos, prefix_len, max_item_len, SKIP_DELIMITER, BLOCK_N):
    """Exercise 6: where a query tile's loop over the items starts, by FlashInfer's bound. Step 4 reads the exact
    start of the tile's first item row (``first + SKIP_DELIMITER - pos[first]``); no item row at or after ``m_lo``
    starts before ``m_lo - max_item_len``, so that key, rounded down to a tile, is safe without reading ``Pos``.
    It loads more tiles wherever a tile's items are shorter than the prompt's longest. (Written with ``tl``
    operations: the check wraps it in ``triton.jit`` and calls it inside the kernel.)"""
    return tl.maximum((tl.maximum(m_lo - max_item_len, 0) // BLOCK_N) * BLOCK_N, prefix_hi)
