"""Chapter 4's exercises, each with a check that a reader runs on a CPU.

Every ``check_*`` function runs the reader's function on small random inputs against the chapter's
float64 reference (or its model), prints what is wrong on the first input where it disagrees, and returns
``True`` when every input agrees. A plain solution of each exercise is here too (``frames_needed``,
``forward_loss``, ``ctc_gradient``, ``bank_conflict_ways``): the notebook checks them, so that the checks
themselves are tested in CI; try your own before reading them.

1. :func:`check_min_frames`: the fewest frames a target needs (a blank between repeated labels).
2. :func:`check_forward`: the loss of one utterance by the log-space alpha recursion.
3. :func:`check_gradient`: the gradient with respect to the activations (softmax included), from alpha
   and beta.
4. :func:`check_bank_ways`: the shared-memory bank model of step 4's two layouts (the odd-grain advice).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import Tensor

from book.common import report
from studylog.ctc.reference import reference_ctc
from studylog.ctc.targets import BLANK, min_frames
from studylog.ctc.warpctc import GRAIN_SIZES, bank_ways

__all__ = ["check_min_frames", "check_forward", "check_gradient", "check_bank_ways",
           "frames_needed", "forward_loss", "ctc_gradient", "bank_conflict_ways"]

#: Inputs per check; small shapes, so that a reader's plain-Python loop is quick.
CASES = 40


def _random_target(gen: torch.Generator, A: int, max_len: int) -> list[int]:
    """A label list (labels 1..A-1), often with repeats (A small), sometimes empty."""
    length = int(torch.randint(0, max_len + 1, (1,), generator=gen))
    return torch.randint(1, A, (length,), generator=gen).tolist()


def _cases(seed: int, cases: int):
    """(activations (T, A) float64, target) pairs: repeats, empty targets, targets too long for T."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(cases):
        T = int(torch.randint(1, 13, (1,), generator=gen))
        A = int(torch.randint(2, 6, (1,), generator=gen))
        yield torch.randn(T, A, generator=gen, dtype=torch.float64) * 2, _random_target(gen, A, T)


def _reference(x: Tensor, target: Sequence[int]) -> tuple[float, Tensor]:
    T = x.shape[0]
    labels = torch.tensor([list(target) or [1]])
    loss, grad = reference_ctc(x[:, None], labels, [T], [len(target)])
    return float(loss[0]), grad[:, 0]


# --------------------------------------------------------------------------------------
# 1. How many frames does a target need?
# --------------------------------------------------------------------------------------

def frames_needed(labels: Sequence[int]) -> int:
    """A solution of exercise 1: one frame per label, and one more for the blank between two equal labels."""
    labels = list(labels)
    return len(labels) + sum(a == b for a, b in zip(labels, labels[1:]))


def check_min_frames(fn: Callable[[list[int]], int], cases: int = 200) -> bool:
    """``fn(labels) -> int``: the fewest frames in which CTC can emit ``labels`` (a list of labels >= 1)."""
    gen = torch.Generator().manual_seed(1)
    for _ in range(cases):
        labels = _random_target(gen, int(torch.randint(2, 5, (1,), generator=gen)), 8)
        want, got = min_frames(labels), fn(list(labels))
        if got != want:
            return report("check_min_frames", False, f"labels {labels}: expected {want}, got {got}", cases)
    return report("check_min_frames", True, None, cases)


# --------------------------------------------------------------------------------------
# 2. The forward recursion in log space
# --------------------------------------------------------------------------------------

def extended(target: Sequence[int]) -> list[int]:
    """The blank-interleaved target the recursion runs over: ``blank l1 blank l2 ... blank``."""
    ext = [BLANK]
    for label in target:
        ext += [label, BLANK]
    return ext


def logsumexp(values: Sequence[float]) -> float:
    """``log(sum(exp(values)))`` without overflow; ``-inf`` when every value is."""
    top = max(values)
    return top if top == -math.inf else top + math.log(sum(math.exp(v - top) for v in values))


def _alphas(log_probs: Tensor, ext: list[int]) -> list[list[float]]:
    T, S = log_probs.shape[0], len(ext)
    alpha = [[-math.inf] * S for _ in range(T)]
    for s in range(min(2, S)):
        alpha[0][s] = float(log_probs[0, ext[s]])
    for t in range(1, T):
        for s in range(S):
            terms = [alpha[t - 1][s]] + ([alpha[t - 1][s - 1]] if s >= 1 else [])
            if s >= 2 and ext[s] != BLANK and ext[s] != ext[s - 2]:
                terms.append(alpha[t - 1][s - 2])
            alpha[t][s] = logsumexp(terms) + float(log_probs[t, ext[s]])
    return alpha


def forward_loss(log_probs: Tensor, target: Sequence[int]) -> float:
    """A solution of exercise 2: ``-log P`` of one utterance from its ``(T, A)`` log-probabilities, by the
    alpha recursion over the blank-interleaved target (``inf`` when no alignment exists)."""
    ext = extended(target)
    last = _alphas(log_probs, ext)[-1]
    return -logsumexp(last[-2:] if len(ext) > 1 else last[-1:])


def check_forward(fn: Callable[[Tensor, list[int]], float], cases: int = CASES) -> bool:
    """``fn(log_probs, target) -> float``: the loss ``-log P`` of one utterance; ``log_probs`` is ``(T, A)``
    float64 (already log-softmaxed), ``target`` a list of labels >= 1 (0 is the blank). A target that
    cannot fit must give ``inf``."""
    for x, target in _cases(2, cases):
        want, _ = _reference(x, target)
        got = float(fn(x.log_softmax(1), list(target)))
        close = got == want if math.isinf(want) else abs(got - want) <= 1e-9 * max(1.0, abs(want))
        bad = not close  # NaN is never close
        if bad:
            return report("check_forward", False, f"T = {x.shape[0]}, A = {x.shape[1]}, target {target}: "
                           f"expected {want:.10g}, got {got:.10g}", cases)
    return report("check_forward", True, None, cases)


# --------------------------------------------------------------------------------------
# 3. The gradient
# --------------------------------------------------------------------------------------

def ctc_gradient(activations: Tensor, target: Sequence[int]) -> Tensor:
    """A solution of exercise 3: ``d(-log P)/d(activations)`` for one utterance, ``(T, A)`` float64:
    ``softmax - posterior``, with the posterior of class k at frame t the sum over the positions s that carry
    k of ``alpha_t(s) beta_t(s) / (P y_t(k))`` (beta includes ``y_t``)."""
    log_probs = activations.log_softmax(1)
    ext = extended(target)
    alpha = _alphas(log_probs, ext)
    beta = [list(reversed(row)) for row in reversed(_alphas(log_probs.flip(0), ext[::-1]))]
    log_p = -forward_loss(log_probs, target)
    grad = log_probs.exp().clone()
    for t in range(activations.shape[0]):
        for s, k in enumerate(ext):
            grad[t, k] -= math.exp(alpha[t][s] + beta[t][s] - float(log_probs[t, k]) - log_p)
    return grad


def check_gradient(fn: Callable[[Tensor, list[int]], Tensor], cases: int = CASES) -> bool:
    """``fn(activations, target) -> Tensor``: the gradient of ``-log P`` with respect to the ``(T, A)``
    float64 activations (softmax included), for targets that fit their frames."""
    for x, target in _cases(3, cases):
        while target and min_frames(target) > x.shape[0]:
            target = target[:-1]
        _, want = _reference(x, target)
        got = torch.as_tensor(fn(x.clone(), list(target)), dtype=torch.float64)
        if got.shape != want.shape:
            return report("check_gradient", False, f"expected shape {tuple(want.shape)}, got {tuple(got.shape)}",
                           cases)
        err = float((got - want).abs().max())
        if not err <= 1e-9:
            t, k = divmod(int((got - want).abs().nan_to_num(math.inf).argmax()), x.shape[1])
            return report("check_gradient", False, f"T = {x.shape[0]}, A = {x.shape[1]}, target {target}: largest "
                           f"|difference| {err:.2e} at frame {t}, class {k} (expected {float(want[t, k]):.6f}, "
                           f"got {float(got[t, k]):.6f})", cases)
    return report("check_gradient", True, None, cases)


# --------------------------------------------------------------------------------------
# 4. Bank conflicts of the two layouts
# --------------------------------------------------------------------------------------

def bank_conflict_ways(grain: int, blocked: bool, threads: int = 128) -> int:
    """A solution of exercise 4: the largest number of a warp's 32 lanes that read the same one of 32
    four-byte banks when each lane reads its i-th position, over i < grain. Strided: lane l's i-th position
    is ``l + i * threads``; blocked: ``l * grain + i``."""
    worst = 1
    for i in range(grain):
        banks = [((lane * grain + i) if blocked else (lane + i * threads)) % 32 for lane in range(32)]
        worst = max(worst, max(banks.count(b) for b in set(banks)))
    return worst


def check_bank_ways(fn: Callable[[int, bool], int]) -> bool:
    """``fn(grain, blocked) -> int``: the ways of the worst bank conflict of one warp's access (see
    :func:`bank_conflict_ways`), for grains 1 to 8 and 128 threads per block, in both layouts."""
    cases = [(grain, blocked) for blocked in (False, True) for grain in GRAIN_SIZES]
    for grain, blocked in cases:
        want, got = bank_ways(grain, blocked=blocked), fn(grain, blocked)
        if got != want:
            layout = "blocked" if blocked else "strided"
            return report("check_bank_ways", False, f"grain {grain}, {layout} layout: expected {want}-way, "
                           f"got {got}-way", len(cases))
    return report("check_bank_ways", True, None, len(cases))
