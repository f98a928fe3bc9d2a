"""The answers to chapter 08's exercises. The notebook does not import this module: read it after trying."""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["accept", "cut", "residual"]


def accept(draft: Sequence[int], chosen: Sequence[int]) -> tuple[int, int]:
    """Exercise 1: ``chosen[i]`` is the model's greedy token at the position of ``draft[i]`` (and ``chosen[-1]``
    after the whole draft). Keep drafted tokens while they equal the model's; the model's token at the first
    disagreement (or after the draft) comes free."""
    a = 0
    while a < len(draft) and draft[a] == chosen[a]:
        a += 1
    return a, chosen[a]


def cut(automaton, state: int, draft: Sequence[int], room: int) -> list[int]:
    """Exercise 2: the draft's longest prefix the grammar allows, at most ``room`` tokens, stopping where only EOS
    is allowed."""
    out = []
    for t in draft[:room]:
        if automaton.only_eos(state):
            break
        nxt = automaton.next(state, t)
        if nxt is None:
            break
        out.append(t)
        state = nxt
    return out


def residual(p: torch.Tensor, x: int) -> torch.Tensor:
    """Exercise 3: where the drafted ``x`` is rejected (with probability ``1 - p[x]``), draw from ``p`` without
    ``x``: ``p`` with ``x`` zeroed, renormalised. Then ``p[x] * onehot(x) + (1 - p[x]) * residual == p``."""
    r = p.clone()
    r[x] = 0
    return r / r.sum() if r.sum() > 0 else r
