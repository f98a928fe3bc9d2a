"""Chapter 6's exercises, each with a check that a reader runs on a CPU.

Every ``check_*`` function runs the reader's function on small random inputs against the chapter's rule (the dense
mask, a plain softmax, the tile accounting of :mod:`studylog.multi_item.tiles`, the float64 reference), prints what is
wrong on the first input where it disagrees, and returns ``True`` when every input agrees. A function that still
raises ``NotImplementedError`` (the page's stub) gets a note instead of a traceback. The answers live in
:mod:`book.multi_item.solutions`, which the notebook does not import: try your own before reading them.

1. :func:`check_visible`: FlashInfer's multi-item mask for one (query, key) pair, from the metadata.
2. :func:`check_online_softmax`: a flash-attention row loop over key blocks that survives fully masked
   blocks and rows that see no key at all.
3. :func:`check_key_tiles`: which key tiles a query tile must load (step 4's three ranges).
4. :func:`check_max_programs`: the fixed grid of :class:`~studylog.multi_item.plan.MultiItemPlan`, the most
   programs any layout within a capacity can need.
5. :func:`check_tile_shape`: step 5 launched at a tile shape the reader picks (then timed on a GPU).
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor

from book.common import guarded, report
from studylog.multi_item.formats import MultiItemBatch, dense_mask
from studylog.multi_item.tiles import TILE_SKIPPED, tile_map

__all__ = ["check_visible", "check_online_softmax", "check_key_tiles", "check_max_programs", "check_tile_shape"]


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

@guarded
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

@guarded
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

@guarded
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

def _most_tiles(max_tokens: int, max_prompts: int, block_m: int) -> tuple[int, list[int]]:
    """The true maximum of ``sum cdiv(S_b, block_m)`` over layouts within the capacity, and a layout that
    reaches it: ``b`` prompts of one token each but the first, which takes the rest."""
    best = (0, [])
    for b in range(1, min(max_prompts, max_tokens) + 1):
        lens = [max_tokens - (b - 1)] + [1] * (b - 1)
        tiles = sum(-(-s // block_m) for s in lens)
        best = max(best, (tiles, lens))
    return best


@guarded
def check_max_programs(fn: Callable[[int, int, int], int], cases: int = 300) -> bool:
    """``fn(max_tokens, max_prompts, block_m) -> programs per head``: enough for every layout within the
    capacity (a grid too small leaves query tiles uncomputed), and no looser than the chapter's bound (each extra
    program is an empty one the GPU still launches; the bound is the answer in :mod:`book.multi_item.solutions`)."""
    from book.multi_item.solutions import max_programs as loosest

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
        if got > loosest(tokens, prompts, block_m):
            return report("check_max_programs", False, f"{where}: {got} programs, more than the "
                           f"{loosest(tokens, prompts, block_m)} of the chapter's bound", cases)
    return report("check_max_programs", True, None, cases)


# --------------------------------------------------------------------------------------
# 5. Step 5 at a tile shape of your choice
# --------------------------------------------------------------------------------------

#: Tile shapes the check asks for in the interpreter: none divides the test prompts, and rows and keys differ.
CHECK_TILES = ((16, 16), (16, 32), (32, 16))


@guarded
def check_tile_shape(fn: Callable, tiles: Sequence[tuple[int, int]] = CHECK_TILES) -> bool:
    """``fn(q, k, v, batch, block_m, block_n) -> out``: step 5 launched with ``block_m`` query rows by ``block_n``
    keys per tile. On small batches in float32 (in Triton's interpreter on a CPU, or on the GPU), at every tile
    shape of ``tiles``: the launch must use the tile asked for (the check watches the step's launcher) and the
    output must match the float64 reference within 1e-5."""
    from studylog import runtime
    from studylog.multi_item import steps
    from studylog.multi_item.formats import reference_attention

    gen = torch.Generator().manual_seed(10)
    device = runtime.device()
    batches = [MultiItemBatch.from_item_lens([17, 0, 40], [[4, 9, 1], [6, 6], [3]], device=device),
               MultiItemBatch.from_item_lens([37], [[5, 13, 2, 8]], device=device)]
    launched: list[tuple[int, int]] = []
    real = steps.launch

    def spy(*args, **kwargs):
        got = real(*args, **kwargs)
        launched.append(got[:2])
        return got

    cases = len(batches) * len(tiles)
    steps.launch = spy
    try:
        for batch in batches:
            q, k, v = (torch.randn(2, batch.total_tokens, 16, generator=gen).to(device) for _ in range(3))
            want = reference_attention(q, k, v, batch)
            for block_m, block_n in tiles:
                launched.clear()
                out = torch.as_tensor(fn(q, k, v, batch, block_m, block_n))
                where = f"{batch.describe()}, tile {block_m} x {block_n}"
                if launched != [(block_m, block_n)]:
                    return report("check_tile_shape", False, f"{where}: the kernel launched with tiles {launched} "
                                  f"(pass the tile to the step)", cases)
                if out.shape != want.shape:
                    return report("check_tile_shape", False, f"{where}: output of shape {tuple(out.shape)}, "
                                  f"expected {tuple(want.shape)}", cases)
                error = (out.double() - want.double()).abs().max().item()
                if not error < 1e-5:
                    return report("check_tile_shape", False, f"{where}: max difference {error:.1e} to the float64 "
                                  "reference", cases)
    finally:
        steps.launch = real
    return report("check_tile_shape", True, None, cases)
