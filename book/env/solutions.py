"""The answers to chapter 0's exercises: 1 as measured on the course's card, 2 and 3 as code. The notebook does not
import this module: read it after trying.

The checks of :mod:`book.env.exercises` compare a reader's function with these.
"""

from __future__ import annotations

import math

__all__ = ["HEAD_ROWS", "HEAD_COLUMNS", "reference_head_floor_us", "reference_rows_where_bytes_set_the_floor",
           "scale_two_launches", "axpy_measured", "restrict_ldg_in_chapter_04"]

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
    the only one. The output is poisoned with NaN first, as :func:`book.env.tour.scale` does.

    A prediction to check on a GPU: the two run alike, since a mask is a compare and a predicate per element, which a
    kernel waiting on memory hides, and the second launch costs a launch of its own."""
    import torch

    from book.env import tour

    n = x.numel()
    y = torch.full_like(x, float("nan"))
    whole = n // block
    if whole:
        tour.scale_step0[(whole,)](x, y, alpha, BLOCK=block)
    if n % block:
        start = whole * block
        tour.scale_step1[(1,)](x[start:], y[start:], alpha, n - start, BLOCK=block)
    return y


def axpy_measured(gpu: str = "nvidia-h200") -> str:
    """Exercise 1, as measured on the course's card (``lab/tour/axpy_exercise.py``, its committed run): it does not
    pay. At 2**26 floats, well past L2, both kernels take about the same time: a streaming kernel reads each byte
    once, so the read-only cache has nothing to keep. Its two reads and one write move less than a copy's one read and
    one write, so the plain kernel sits above its byte floor."""
    from studylog import plotting

    run = plotting.load_lab("tour", "axpy_exercise", gpu=gpu)
    plain, ldg = (next(r for r in run["measurements"] if r["series"] == s) for s in ("axpy_plain", "axpy_restrict_ldg"))
    moved_gbs = 3 * 4 * plain["params"]["n"] / (plain["ms"] * 1e6)  # read x and y, write y: 12 bytes a float
    return (f"{run['device']['name']}: axpy_plain {plain['ms'] * 1e3:,.1f} µs ({plain['ms'] / plain['floor_ms']:.2f}× "
            f"its byte floor, {moved_gbs:,.0f} GB/s), axpy_restrict_ldg {ldg['ms'] * 1e3:,.1f} µs: "
            f"{plain['ms'] / ldg['ms']:.2f}×, a tie.")


def restrict_ldg_in_chapter_04(gpu: str = "nvidia-h200") -> str:
    """Exercise 1 on a real kernel: chapter 04's step 2 marks every pointer ``__restrict__`` and its step 3 adds
    ``__ldg``; neither pays, since those kernels wait on a barrier every frame, not on the path their loads take.
    Each step's speed over the step before it, over the chapter's lesson cases in its committed benchmark."""
    from studylog import plotting
    from studylog.ctc import CHAPTER as CTC
    from studylog.ctc.report import BENCH_A, BENCH_T, LESSON_N

    ctc = plotting.load_results("ctc", gpu=gpu)
    cases = [(A, N) for A in BENCH_A for N in LESSON_N]
    ms = {s: [ctc.select(CTC.step(s).series, T=BENCH_T, A=A, N=N) for A, N in cases] for s in (1, 2, 3)}
    gain = {s: [b[0]["ms"] / a[0]["ms"] for b, a in zip(ms[s - 1], ms[s]) if a and b] for s in (2, 3)}  # > 1: faster
    def span(ratios):  # one number where every case rounds to the same
        lo, hi = f"{min(ratios):.2f}×", f"{max(ratios):.2f}×"
        return f"{lo} at every case" if lo == hi else f"{lo} to {hi}"

    return "; ".join(f"step {s} runs at {span(g)} step {s - 1}'s speed" for s, g in gain.items()) \
        + f" ({len(gain[3])} cases on the {ctc.gpu})."
