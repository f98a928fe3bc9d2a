"""The answers to chapter 0's exercises 2 and 3. The notebook does not import this module: read it after trying.

The checks of :mod:`book.env.exercises` compare a reader's function with these.
"""

from __future__ import annotations

import math

__all__ = ["HEAD_ROWS", "HEAD_COLUMNS", "reference_head_floor_us", "reference_rows_where_bytes_set_the_floor",
           "scale_two_launches"]

#: Chapter 02's language-model head: 128,256 rows (one a token) of 3,072 bf16 weights.
HEAD_ROWS, HEAD_COLUMNS = 128256, 3072


def reference_head_floor_us(allowed: int, bandwidth_gbs: float, empty_kernel_us: float) -> float:
    """The floor, in µs, of chapter 02's masked head at batch 1 with ``allowed`` rows: it reads those rows (two bytes
    a weight) and writes one fp32 logit for every token of the vocabulary, so its bytes are
    ``allowed × 3072 × 2 + 128256 × 4``; at ``bandwidth_gbs`` (1 GB/s moves 1,000 bytes a microsecond) they take
    ``bytes / (bandwidth_gbs × 1000)`` µs, and no kernel takes less than an empty one."""
    nbytes = allowed * HEAD_COLUMNS * 2 + HEAD_ROWS * 4
    return max(nbytes / (bandwidth_gbs * 1e3), empty_kernel_us)


def reference_rows_where_bytes_set_the_floor(bandwidth_gbs: float, empty_kernel_us: float) -> int:
    """The fewest allowed rows whose bytes take longer than an empty kernel: below it the empty kernel sets the floor.
    On the H200 of the course's runs it is about three hundred rows, so at a thousand allowed rows the bytes set it."""
    spare = empty_kernel_us * bandwidth_gbs * 1e3 - HEAD_ROWS * 4  # bytes the empty kernel's time leaves for rows
    return max(0, math.floor(spare / (HEAD_COLUMNS * 2)) + 1)


def scale_two_launches(x, alpha: float, block: int = 128):
    """Exercise 3: ``alpha * x`` at any length with no mask on the whole blocks. Step 0's kernel covers the
    ``len(x) // block`` whole blocks; one program of step 1 covers the tail (fewer than ``block`` elements), its mask
    the only one. The output is poisoned with NaN first, as :func:`studylog.tour.scale` does.

    A prediction to check on a GPU: the two run alike, since a mask is a compare and a predicate per element, which a
    kernel waiting on memory hides, and the second launch costs a launch of its own."""
    import torch

    from studylog import tour

    n = x.numel()
    y = torch.full_like(x, float("nan"))
    whole = n // block
    if whole:
        tour.scale_step0[(whole,)](x, y, alpha, BLOCK=block)
    if n % block:
        start = whole * block
        tour.scale_step1[(1,)](x[start:], y[start:], alpha, n - start, BLOCK=block)
    return y
