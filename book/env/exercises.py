"""Chapter 0's exercises that run on a CPU: a floor computed from bytes and bandwidth, and a tail without a mask.

:func:`check_two_launches` runs the reader's ``scale_two_launches(x, alpha)`` at lengths no block divides (and ones it
does) against a float64 reference, exactly, through Triton's interpreter where there is no GPU.
:func:`check_head_floor` runs the reader's ``head_floor_us(allowed, bandwidth_gbs, empty_kernel_us)`` over a range of
allowed rows, bandwidths and empty-kernel times against the chapter's answer (:mod:`book.env.solutions`, which the
notebook does not import; the check loads it only to compare) and prints the first cases where the two differ.
"""

from __future__ import annotations

import math
import random
from typing import Callable

from book.common import guarded, report_failures

__all__ = ["check_head_floor", "check_two_launches"]


def _solutions():
    from book.env import solutions  # the answer, loaded only to compare with the reader's

    return solutions


@guarded
def check_head_floor(fn: Callable[[int, float, float], float], *, cases: int = 200, seed: int = 0,
                     verbose: bool = True) -> bool:
    """Exercise 2. ``fn(allowed, bandwidth_gbs, empty_kernel_us)`` returns the floor in µs of chapter 02's masked head
    at batch 1: ``allowed`` bf16 rows of 3,072 read, one fp32 logit a token of its 128,256 written, at the copy
    bandwidth, and never less than the empty kernel."""
    solutions = _solutions()
    rng = random.Random(seed)
    inputs = [(1000, 4000.0, 0.6), (1, 4000.0, 0.6), (0, 3000.0, 2.0), (solutions.HEAD_ROWS, 3300.0, 0.6)]
    inputs += [(rng.randint(0, solutions.HEAD_ROWS), rng.uniform(500.0, 8000.0), rng.uniform(0.3, 5.0))
               for _ in range(cases)]
    failures = []
    for allowed, bandwidth, empty in inputs:
        want = solutions.reference_head_floor_us(allowed, bandwidth, empty)
        try:
            got = float(fn(allowed, bandwidth, empty))
        except NotImplementedError:
            raise
        except Exception as err:  # noqa: BLE001 - the reader's code may fail in any way; say how
            failures.append(f"allowed={allowed}, bandwidth_gbs={bandwidth:.0f}: {type(err).__name__}: {err}")
            continue
        if not math.isclose(got, want, rel_tol=1e-6):
            failures.append(f"allowed={allowed}, bandwidth_gbs={bandwidth:.0f}, empty_kernel_us={empty:.2f}: "
                            f"got {got:.4g} µs, expected {want:.4g} µs")
    return report_failures("check_head_floor", failures, len(inputs), verbose)


@guarded
def check_two_launches(fn: Callable, *, lengths: tuple[int, ...] = (1, 127, 128, 129, 256, 1000, 1001),
                       verbose: bool = True) -> bool:
    """Exercise 3. ``fn(x, alpha)`` returns ``alpha * x`` for a float32 ``x`` of any length, step 0's kernel over the
    whole blocks and one launch of step 1 on the tail: every element written, equal to the float64 reference."""
    import torch

    from studylog import runtime

    gen = torch.Generator().manual_seed(0)
    failures = []
    for n in lengths:
        x = torch.randn(n, generator=gen).to(runtime.device())
        want = (x.double() * -1.5).float()
        try:
            got = fn(x, -1.5)
        except NotImplementedError:
            raise
        except Exception as err:  # noqa: BLE001 - the reader's code may fail in any way; say how
            failures.append(f"n={n}: {type(err).__name__}: {err}")
            continue
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            failures.append(f"n={n}: expected a tensor of shape {tuple(x.shape)}, got {getattr(got, 'shape', got)!r}")
        elif torch.isnan(got).any():
            failures.append(f"n={n}: {int(torch.isnan(got).sum())} elements never written (NaN)")
        elif not torch.equal(got, want):
            failures.append(f"n={n}: {int((got != want).sum())} elements differ from alpha * x")
    return report_failures("check_two_launches", failures, len(lengths), verbose)
