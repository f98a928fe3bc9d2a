"""Chapter 6's exercises, each with a check that a reader runs on a CPU.

Every ``check_*`` function runs the reader's function on small random inputs against the chapter's reference
(the dense mask, a plain softmax, the tile accounting of :mod:`studylog.multi_item.tiles`), prints what is
wrong on the first input where it disagrees, and returns ``True`` when every input agrees. A plain solution of
each exercise is here too (:func:`visible`, :func:`online_softmax`, :func:`key_tiles`, :func:`max_programs`):
the notebook checks them, so that the checks themselves run in CI; try your own before reading them.

1. :func:`check_visible`: FlashInfer's multi-item mask for one (query, key) pair, from the metadata.
2. :func:`check_online_softmax`: a flash-attention row loop over key blocks that survives fully masked
   blocks and rows that see no key at all.
3. :func:`check_key_tiles`: which key tiles a query tile must load (step 4's three ranges).
4. :func:`check_max_programs`: the fixed grid of :class:`~studylog.multi_item.plan.MultiItemPlan`, the most
   programs any layout within a capacity can need.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor

from book.common import report
from studylog.multi_item.formats import MultiItemBatch, dense_mask
from studylog.multi_item.tiles import TILE_SKIPPED, tile_map

__all__ = ["check_visible", "check_online_softmax", "check_key_tiles", "check_max_programs",
           "visible", "online_softmax", "key_tiles", "max_programs"]


def _random_prompt(gen: torch.Generator) -> MultiItemBatch:
    """One prompt: a prefix of 0 to 12 tokens, 0 to 5 items of 1 to 6 tokens."""
    prefix = int(torch.randint(0, 13, (1,), generator=gen))
    items = torch.randint(1, 7, (int(torch.randint(0, 6, (1,), generator=gen)),), generator=gen).tolist()
    return MultiItemBatch.from_item_lens([prefix], [items], device="cpu")


def _positions(batch: MultiItemBatch) -> list[int]:
    """The prompt's ``token_pos_in_items`` without its padding: one entry per token from the prefix's end on."""
    return batch.token_pos[0, : batch.seq_lens[0] - batch.prefix_lens[0]].tolist()


# --------------------------------------------------------------------------------------
# 1. The mask from the metadata
# --------------------------------------------------------------------------------------

def visible(q: int, k: int, prefix_len: int, pos: Sequence[int]) -> bool:
    """A solution of exercise 1: may query ``q`` see key ``k`` under FlashInfer's rule? ``pos[j]`` is the
    position inside its item of token ``prefix_len + j`` (0 at a delimiter)."""
    if k > q:
        return False
    if k < prefix_len or q < prefix_len:
        return True
    return k > q - pos[q - prefix_len]  # after the delimiter that opens the query's item


def check_visible(fn: Callable[[int, int, int, Sequence[int]], bool], cases: int = 60) -> bool:
    """``fn(q, k, prefix_len, pos) -> bool`` for every (query, key) pair of random prompts, against the
    dense mask of FlashInfer's rule (:func:`~studylog.multi_item.formats.dense_mask`)."""
    gen = torch.Generator().manual_seed(6)
    for _ in range(cases):
        batch = _random_prompt(gen)
        p, pos, want = batch.prefix_lens[0], _positions(batch), dense_mask(batch).tolist()
        for q in range(batch.seq_lens[0]):
            for k in range(batch.seq_lens[0]):
                got = bool(fn(q, k, p, list(pos)))
                if got != want[q][k]:
                    return report("check_visible", False, f"prefix {p}, pos {pos}: query {q}, key {k} should "
                                   f"{'' if want[q][k] else 'not '}be visible", cases)
    return report("check_visible", True, None, cases)


# --------------------------------------------------------------------------------------
# 2. The online softmax over key blocks, with masked keys
# --------------------------------------------------------------------------------------

def online_softmax(scores: Tensor, values: Tensor, block_n: int) -> Tensor:
    """A solution of exercise 2: ``softmax(scores) @ values`` row by row, reading ``block_n`` keys at a time
    with a running maximum and sum (steps 2 to 5's loop). Masked scores are ``-inf``; a row with no visible
    key is 0. The maximum starts finite, so a block of ``-inf`` gives ``exp(-inf) = 0`` and never NaN."""
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


def check_online_softmax(fn: Callable[[Tensor, Tensor, int], Tensor], cases: int = 40) -> bool:
    """``fn(scores [M, S], values [S, D], block_n) -> [M, D]``, against a plain masked softmax in float64;
    the inputs hold fully masked blocks, rows that see no key and block sizes that do not divide ``S``."""
    gen = torch.Generator().manual_seed(7)
    for case in range(cases):
        rows, keys, dim = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((1, 9), (1, 40), (1, 6)))
        block_n = int(torch.randint(1, 17, (1,), generator=gen))
        scores = torch.randn(rows, keys, generator=gen, dtype=torch.float64) * 4
        keep = torch.rand(rows, keys, generator=gen) < 0.6
        keep[:, :min(block_n, keys)] &= case % 2 == 0  # every other case: the first block masked for all rows
        keep[0] &= case % 3 != 0  # every third case: a row that sees nothing
        scores = scores.masked_fill(~keep, float("-inf"))
        values = torch.randn(keys, dim, generator=gen, dtype=torch.float64)
        want = torch.softmax(scores, dim=1).nan_to_num(0.0) @ values
        got = torch.as_tensor(fn(scores.clone(), values.clone(), block_n)).double()
        if got.shape != want.shape:
            return report("check_online_softmax", False, f"expected shape {tuple(want.shape)}, got "
                           f"{tuple(got.shape)}", cases)
        bad = ~torch.isclose(got, want, rtol=1e-9, atol=1e-9)
        if bad.any():
            r = int(bad.any(dim=1).nonzero()[0])
            seen = int(keep[r].sum())
            return report("check_online_softmax", False, f"{rows} rows, {keys} keys, block_n {block_n}: row {r} "
                           f"(sees {seen} keys) gives {got[r].tolist()}, expected {want[r].tolist()}", cases)
    return report("check_online_softmax", True, None, cases)


# --------------------------------------------------------------------------------------
# 3. The key tiles a query tile must load
# --------------------------------------------------------------------------------------

def key_tiles(prefix_len: int, pos: Sequence[int], m_lo: int, m_hi: int, block_n: int) -> list[int]:
    """A solution of exercise 3: the key tiles (``block_n`` keys each) that query rows ``[m_lo, m_hi)`` of one
    prompt load under FlashInfer's rule: the prefix up to the diagonal, then from the first key the tile's
    first item row sees (the token after its delimiter) up to the diagonal."""
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    prefix_hi = cdiv(min(prefix_len, m_hi), block_n)  # prefix tiles (the causal ones for prefix rows)
    tiles = set(range(prefix_hi))
    if m_hi > prefix_len:  # the tile holds item rows
        first = max(m_lo, prefix_len)
        items_lo = first + 1 - pos[first - prefix_len]
        tiles |= set(range(items_lo // block_n, cdiv(m_hi, block_n)))
    return sorted(tiles)


def check_key_tiles(fn: Callable[[int, Sequence[int], int, int, int], Iterable[int]], cases: int = 80) -> bool:
    """``fn(prefix_len, pos, m_lo, m_hi, block_n) -> key tile indices``: it must name every key tile that holds
    a visible pair of the query tile's rows (or rows would be wrong), and no more tiles than step 4 loads."""
    gen = torch.Generator().manual_seed(8)
    for _ in range(cases):
        batch = _random_prompt(gen)
        block_m, block_n = (int(x) for x in torch.tensor([2, 4, 8])[torch.randint(0, 3, (2,), generator=gen)])
        s, p, pos = batch.seq_lens[0], batch.prefix_lens[0], _positions(batch)
        mask = dense_mask(batch)
        planned = tile_map(batch, block_m, block_n)
        for t, m_lo in enumerate(range(0, s, block_m)):
            m_hi = min(m_lo + block_m, s)
            got = set(int(x) for x in fn(p, list(pos), m_lo, m_hi, block_n))
            where = f"prefix {p}, pos {pos}, rows [{m_lo}, {m_hi}), {block_n}-key tiles"
            for n in range(-(-s // block_n)):
                holds = mask[m_lo:m_hi, n * block_n:(n + 1) * block_n].nonzero()
                if len(holds) and n not in got:
                    q, k = (int(x) for x in holds[0])
                    return report("check_key_tiles", False, f"{where}: tile {n} is skipped but row {m_lo + q} "
                                   f"sees key {n * block_n + k}", cases)
            most = int((planned[t] != TILE_SKIPPED).sum())
            if len(got) > most:
                return report("check_key_tiles", False, f"{where}: {len(got)} tiles {sorted(got)}, but step 4 "
                               f"loads only {most}", cases)
    return report("check_key_tiles", True, None, cases)


# --------------------------------------------------------------------------------------
# 4. A grid that fits every layout of a capacity
# --------------------------------------------------------------------------------------

def max_programs(max_tokens: int, max_prompts: int, block_m: int) -> int:
    """A solution of exercise 4: the most query tiles (per head) any batch of at most ``max_prompts`` prompts and
    ``max_tokens`` tokens can have: each prompt adds a partial tile at most, so
    ``sum cdiv(S_b, block_m) <= cdiv(T, block_m) + B - 1``."""
    return -(-max_tokens // block_m) + max_prompts - 1


def _most_tiles(max_tokens: int, max_prompts: int, block_m: int) -> tuple[int, list[int]]:
    """The true maximum of ``sum cdiv(S_b, block_m)`` over layouts within the capacity, and a layout that
    reaches it: ``b`` prompts of one token each but the first, which takes the rest."""
    best = (0, [])
    for b in range(1, min(max_prompts, max_tokens) + 1):
        lens = [max_tokens - (b - 1)] + [1] * (b - 1)
        tiles = sum(-(-s // block_m) for s in lens)
        best = max(best, (tiles, lens))
    return best


def check_max_programs(fn: Callable[[int, int, int], int], cases: int = 300) -> bool:
    """``fn(max_tokens, max_prompts, block_m) -> programs per head``: enough for every layout within the
    capacity (a grid too small leaves query tiles uncomputed), and no looser than ``cdiv(T, BLOCK_M) + B - 1``
    (each extra program is an empty one the GPU still launches)."""
    gen = torch.Generator().manual_seed(9)
    for _ in range(cases):
        tokens = int(torch.randint(1, 3000, (1,), generator=gen))
        prompts = int(torch.randint(1, 40, (1,), generator=gen))
        block_m = [16, 32, 64, 128][int(torch.randint(0, 4, (1,), generator=gen))]
        got, (need, layout) = int(fn(tokens, prompts, block_m)), _most_tiles(tokens, prompts, block_m)
        where = f"{tokens} tokens, {prompts} prompts, BLOCK_M {block_m}"
        if got < need:
            shown = layout if len(layout) <= 6 else layout[:3] + ["..."] + [f"({len(layout)} prompts)"]
            return report("check_max_programs", False, f"{where}: {got} programs, but prompts of {shown} tokens "
                           f"have {need} query tiles", cases)
        if got > max_programs(tokens, prompts, block_m):
            return report("check_max_programs", False, f"{where}: {got} programs, more than the "
                           f"{max_programs(tokens, prompts, block_m)} any layout can need", cases)
    return report("check_max_programs", True, None, cases)
