"""The answers to chapter 2's exercises. The notebook does not import this module: read it after trying."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from studylog.masked_lm_head.formats import AllowedTokens

__all__ = ["active_fraction", "union_from_bitmask", "masked_logits_rows", "compact_threshold", "rows_first",
           "fill_then_rows", "tiles_measured", "rows_first_measured", "fill_then_rows_measured"]


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def active_fraction(n: int, vocab: int, block: int) -> float:
    """Exercise 1: the expected share of the ``ceil(vocab / block)`` blocks that hold at least
    one of ``n`` ids drawn uniformly without replacement from ``range(vocab)``. A block of ``s`` tokens is idle
    when all ``n`` ids fall outside it: probability ``C(vocab - s, n) / C(vocab, n)``; the last block may be
    shorter than ``block``."""
    blocks = -(-vocab // block)
    sizes = [block] * (vocab // block) + ([vocab % block] if vocab % block else [])
    total = _log_comb(vocab, n)
    active = sum(1.0 - (math.exp(_log_comb(vocab - s, n) - total) if vocab - s >= n else 0.0) for s in sizes)
    return active / blocks


def union_from_bitmask(bitmask: np.ndarray, vocab: int) -> np.ndarray:
    """Exercise 2: the sorted int64 ids that at least one row of ``bitmask`` (int32
    ``[B, ceil(vocab / 32)]``, token ``v`` is bit ``v % 32`` of word ``v // 32``) allows; the bits past
    ``vocab`` are ignored."""
    words = np.bitwise_or.reduce(np.asarray(bitmask, dtype=np.int32).reshape(-1, bitmask.shape[-1]), axis=0)
    bits = (words.view(np.uint32)[:, None] >> np.arange(32, dtype=np.uint32)) & 1
    return np.flatnonzero(bits.reshape(-1)[:vocab]).astype(np.int64)


def masked_logits_rows(h: Tensor, weight: Tensor, allowed: AllowedTokens, out: Tensor) -> Tensor:
    """Exercise 3, in torch: gather the union's rows, multiply in fp32, scatter into ``out``
    (``-inf`` everywhere first), keep each sequence's own allowed logits."""
    ids = allowed.union_ids.long()
    out.fill_(float("-inf"))
    if ids.numel():
        logits = h.float() @ weight.index_select(0, ids).float().t()  # [B, union], fp32 products and sums
        out[:, ids] = torch.where(allowed.mask[:, ids], logits, torch.tensor(float("-inf")))
    return out


def compact_threshold(points: Sequence[tuple[int, float, float]], vocab: int) -> float:
    """Exercise 5: ``points`` are ``(union, compacted ms, best dense ms)`` measured at one batch
    size, in any order. The compacted kernel is used up to the largest union at which it was no slower than the
    dense path with no slower point below it: return that union as a fraction of ``vocab`` (at most 1.0; never
    past the largest union measured, even where it never lost), 0.0 if it lost at the smallest union."""
    losses = [u for u, compact, dense in points if compact > dense]
    first_loss = min(losses, default=None)
    wins = [u for u, compact, dense in points if compact <= dense and (first_loss is None or u < first_loss)]
    return min(1.0, max(wins, default=0) / vocab)


def rows_first(source: str) -> str:
    """Exercise 6: step 6's kernel with the row programs first again. The launch is step 6's (as many programs,
    ``n_fill`` passed as there), so the kernel counts its row programs itself, ``tl.cdiv(n_ids, BLOCK_V)``, and
    numbers the fill programs after them."""
    edits = (("    if pid >= n_fill:\n", "    n_rows = tl.cdiv(n_ids, BLOCK_V)\n    if pid < n_rows:\n"),
             ("n_ids, pid, n_fill, stride_wv", "n_ids, pid, 0, stride_wv"),  # the row programs from 0 on
             ("allowed_ptr, pid, 0, V", "allowed_ptr, pid, n_rows, V"))  # the fill programs from n_rows on
    for old, new in edits:
        if source.count(old) != 1:
            raise ValueError(f"step 6's kernel changed: {old.strip()!r} is not there once")
        source = source.replace(old, new)
    return source


def fill_then_rows(h: Tensor, weight: Tensor, allowed: AllowedTokens, out: Tensor) -> Tensor:
    """Exercise 7: ``-inf`` over every output in one launch (no mask read, no test per output), then step 10's row
    programs alone in a second launch: its grid stops before the first fill program, and the row programs overwrite
    the union's outputs (``-inf`` where a sequence does not allow a union token)."""
    import triton

    from studylog.masked_lm_head.compact import batched_union_kernel
    from studylog.masked_lm_head.formats import default_tiles, dot_dtype

    batch, hidden = h.shape
    out.fill_(float("-inf"))  # launch 1: a plain fill, nothing read
    n_union = allowed.union_count
    if n_union == 0:
        return out
    t = default_tiles(10, batch, n_union)
    n_compute = triton.cdiv(n_union, t.block_v) * triton.cdiv(batch, t.block_b)
    batched_union_kernel[(n_compute,)](  # launch 2: the row programs only
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_union, batch, out.shape[1], n_compute,
        h.stride(0), weight.stride(0), out.stride(0), allowed.mask.stride(0),
        D=hidden, BLOCK_B=t.block_b, BLOCK_V=t.block_v, BLOCK_D=t.block_d, FILL_BLOCK=t.fill_block,
        num_warps=t.num_warps, num_stages=t.num_stages, DOT_DTYPE=dot_dtype(h.dtype))
    return out


# --------------------------------------------------------------------------------------
# The measured answers of the timing exercises (4, 6 and 7), read from the committed runs
# --------------------------------------------------------------------------------------

def tiles_measured() -> str:
    """Exercise 4, as measured: the tuning run that chose step 7's tile (``lab/masked_lm_head``'s
    ``candidates_do_bench.json``, on Triton's ``do_bench``, a clock that times calls one by one, so its microseconds
    are not the chapter's tables') swept the rows per program at the default warps. A program already waits for its
    rows once, so more rows a program only leave fewer programs to spread over the SMs."""
    from book.masked_lm_head import lesson
    from studylog.masked_lm_head.formats import default_tiles
    from studylog.plotting import load_lab

    tuning = load_lab("masked_lm_head", lesson.CANDIDATES_FILE, gpu=lesson.CANDIDATES_GPU)
    said = []
    for allowed in (1000, 10_000):
        sweep = lesson.rows_sweep_us(tuning, allowed)
        said.append(f"at {allowed:,} allowed: " + ", ".join(f"{n} row{'s' if n > 1 else ''} {t:.1f} µs"
                                                           for n, t in sweep.items()))
    return (f"do_bench, the tuning run: {'; '.join(said)}. The default takes {default_tiles(7, 1).block_v} row a "
            "program.")


def rows_first_measured() -> str:
    """Exercise 6, as measured in the chapter's benchmark: steps 5 and 6 at batch 1, random masks, 1 and 1,000
    allowed. Step 6 (the fill programs first) ties step 5 at 1,000 and is slower at 1, where nearly every program is
    a fill program and the one row program starts last; putting the rows first again gives step 5's times back."""
    from book.masked_lm_head import lesson
    from studylog.masked_lm_head import CHAPTER
    from studylog.plotting import load_results

    results = load_results("masked_lm_head")
    times = {n: {a: lesson.batch1_ms(results, CHAPTER.step(n).series, a) for a in (1, 1000)} for n in (5, 6)}
    return "; ".join(f"step {n}: {lesson.table_us(t[1])} µs at 1 allowed, {lesson.table_us(t[1000])} µs at 1,000"
                     for n, t in times.items()) + f" ({results.gpu})."


def fill_then_rows_measured() -> str:
    """Exercise 7, as measured: ``lab/masked_lm_head/worst_point_parts.py`` timed step 10 and a plain fill of every
    output followed by step 10's row programs (``fill_all_then_rows_variant``, the same bits) on synthetic masks of
    the worst loss's shape (batch 256, 100 real tokens each)."""
    from studylog.plotting import load_lab

    t = {r["series"]: r["ms"] * 1e3 for r in load_lab("masked_lm_head", "worst_point_parts")["measurements"]}
    whole, both = t["step10"], t["fill_all_then_rows_variant"]
    return (f"step 10 {whole:.1f} µs; fill everything, then the row programs: {both:.1f} µs, "
            f"{whole / both:.2f}× faster (it saves {whole - both:.1f} µs).")
