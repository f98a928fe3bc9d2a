"""The answers to chapter 4's exercises. The notebook does not import this module: read it after trying."""

from __future__ import annotations

import math
from typing import Sequence

from torch import Tensor

from book.ctc.exercises import extended, logsumexp
from studylog.ctc.targets import BLANK

__all__ = ["frames_needed", "forward_loss", "ctc_gradient", "bank_conflict_ways", "dispatcher", "off_grid",
           "not_unrolled"]


def frames_needed(labels: Sequence[int]) -> int:
    """Exercise 1: one frame per label, and one more for the blank between two equal labels."""
    labels = list(labels)
    return len(labels) + sum(a == b for a, b in zip(labels, labels[1:]))


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
    """Exercise 2: ``-log P`` of one utterance from its ``(T, A)`` log-probabilities, by the
    alpha recursion over the blank-interleaved target (``inf`` when no alignment exists)."""
    ext = extended(target)
    last = _alphas(log_probs, ext)[-1]
    return -logsumexp(last[-2:] if len(ext) > 1 else last[-1:])


def ctc_gradient(activations: Tensor, target: Sequence[int]) -> Tensor:
    """Exercise 3: ``d(-log P)/d(activations)`` for one utterance, ``(T, A)`` float64:
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


def bank_conflict_ways(grain: int, blocked: bool, threads: int = 128) -> int:
    """Exercise 4: the largest number of a warp's 32 lanes that read the same one of 32
    four-byte banks when each lane reads its i-th position, over i < grain. Strided: lane l's i-th position
    is ``l + i * threads``; blocked: ``l * grain + i``."""
    worst = 1
    for i in range(grain):
        banks = [((lane * grain + i) if blocked else (lane + i * threads)) % 32 for lane in range(32)]
        worst = max(worst, max(banks.count(b) for b in set(banks)))
    return worst


def dispatcher(A: int, N: int, positions: int) -> int:
    """Exercise 5: step 14's block of warps pays only when one warp at four positions per lane cannot hold the
    longest extended target (more than 32 x 4 positions); otherwise a barrier per frame costs more than it saves.
    Read off the committed grid (T = 150, A of 28 and 5,000)."""
    return 13 if positions <= 32 * 4 else 14



def off_grid(results=None) -> str:
    """Exercise 5's recorded answer off the grid, as Markdown: no run timed the exercise's A = 1,000, but the
    benchmark timed steps 13 and 14 at other T on its blank-heavy utterances (A = 28, N = 8, targets of T / 3
    labels, so positions grow with T): each row's times and the faster step, which a rule read off the grid at
    T = 150 should pick (:func:`dispatcher` does, on the committed H200 run)."""
    from book.ctc.lesson import off_grid_dispatch
    from studylog.plotting import load_results

    results = results or load_results("ctc")
    rows = off_grid_dispatch(results)
    if not rows:
        return "No recorded run off the grid in this results file."
    lines = [f"Steps 13 and 14 off the grid on the {results.gpu} (A = {rows[0]['A']}, N = {rows[0]['N']}, "
             "blank-heavy utterances of T / 3 labels):", "",
             "| T | positions | step 13, µs | step 14, µs | faster step | dispatcher picks |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['T']} | {r['positions']} | {r[13]:,.1f} | {r[14]:,.1f} | {r['faster']} | "
              f"{dispatcher(r['A'], r['N'], r['positions'])} |" for r in rows]
    return "\n".join(lines)


#: The forward direction's frame update in step 12's recursion, and the same loop left rolled.
UNROLLED = "#pragma unroll\n            for (int i = V - 1; i >= 0; --i) {"
ROLLED = "#pragma unroll 1\n            for (int i = V - 1; i >= 0; --i) {"


def not_unrolled(source: str) -> str:
    """Exercise 6: the forward frame update left rolled. A register has no address, so ``r[i]``, ``r[i - 1]`` and
    ``el[p][i >> 1]`` with an ``i`` known only at run time cannot live in registers: ptxas moves the lane's
    positions to local memory (a stack frame, ``ld.local``/``st.local`` in the PTX: a round trip through the L1
    cache at every position of every frame, on the recursion's dependent chain), and the loop's counter and
    branch come back. Unrolled, every index is a constant and the V positions are V registers; that is what
    register blocking (step 4's grain, step 9's lanes) rests on. On a GPU the cost should show most at A = 28 and
    N = 1, where the recursion is the whole time (an expectation: this change was compiled, not timed, for the
    chapter)."""
    if source.count(UNROLLED) != 1:
        raise ValueError("step 12's forward frame update was not found once")
    return source.replace(UNROLLED, ROLLED)
