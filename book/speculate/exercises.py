"""Chapter 8's exercise checks (on a CPU, in a second or two). Each takes the reader's function, runs it on
random inputs against the rule, and prints the first input where it goes wrong. The rules' answers are in
:mod:`book.speculate.solutions`, which the notebook does not import."""

from __future__ import annotations

import random
from typing import Callable

import torch

from book.common import guarded

__all__ = ["check_accept", "check_cut", "check_residual", "check_gemv_rows"]


def _verdict(name: str, failures: list[str], tried: int) -> bool:
    if failures:
        print(f"{name}: wrong on {len(failures)} of {tried} inputs; the first:\n  {failures[0]}")
        return False
    print(f"{name}: right on all {tried} inputs")
    return True


@guarded
def check_accept(fn: Callable, *, trials: int = 2000, seed: int = 0) -> bool:
    """Exercise 1. ``fn(draft, chosen) -> (accepted, next_token)``."""
    from book.speculate.solutions import accept

    rng = random.Random(seed)
    failures = []
    for _ in range(trials):
        n = rng.randint(0, 8)
        draft = [rng.randint(0, 4) for _ in range(n)]
        chosen = [rng.randint(0, 4) for _ in range(n + 1)]
        got, want = fn(list(draft), list(chosen)), accept(draft, chosen)
        if tuple(got) != want:
            failures.append(f"draft={draft} chosen={chosen}: got {got}, want {want}")
    return _verdict("check_accept", failures, trials)


@guarded
def check_cut(fn: Callable, *, trials: int = 300, seed: int = 0) -> bool:
    """Exercise 2. ``fn(automaton, state, draft, room) -> tokens`` on chapter 01's automaton of a small schema."""
    from book.speculate.solutions import cut
    from studylog.decode import Grammar

    grammar = Grammar.from_regex(r'\{"id":[0-9]{1,4},"tag":"[a-z]{1,6}"\}', name="exercise")
    auto = grammar.automaton
    text = '{"id":1234,"tag":"abcdef"}'
    ids = grammar.vocab.encode(text)
    rng = random.Random(seed)
    failures = []
    for _ in range(trials):
        k = rng.randint(0, len(ids) - 1)
        state = auto.walk(ids[:k], auto.initial)[-1]
        draft = list(ids[k:k + rng.randint(0, 8)])
        if draft and rng.random() < 0.5:
            draft[rng.randrange(len(draft))] = rng.choice(ids)
        room = rng.randint(0, 8)
        got, want = fn(auto, state, list(draft), room), cut(auto, state, draft, room)
        if list(got) != want:
            failures.append(f"state {state}, draft {draft}, room {room}: got {got}, want {want}")
    return _verdict("check_cut", failures, trials)


@guarded
def check_residual(fn: Callable, *, trials: int = 500, seed: int = 0) -> bool:
    """Exercise 3. ``fn(p, x) -> r``: the distribution to draw from when the drafted ``x`` is rejected. The check
    is the identity that makes the rule exact: ``p[x] * onehot(x) + (1 - p[x]) * r == p``."""
    g = torch.Generator().manual_seed(seed)
    failures = []
    for _ in range(trials):
        n = int(torch.randint(2, 9, (1,), generator=g))
        p = torch.softmax(3 * torch.randn(n, generator=g, dtype=torch.float64), 0)
        x = int(torch.randint(0, n, (1,), generator=g))
        r = fn(p.clone(), x)
        onehot = torch.zeros_like(p)
        onehot[x] = 1
        mixed = p[x] * onehot + (1 - p[x]) * r
        if not (torch.allclose(mixed, p, atol=1e-9) and bool((r >= 0).all())):
            failures.append(f"p={p.numpy().round(3).tolist()}, x={x}: got r={r.numpy().round(3).tolist()}")
    return _verdict("check_residual", failures, trials)


@guarded
def check_gemv_rows(fn: Callable, *, seed: int = 0) -> bool:
    """The kernel exercise. ``fn(x, weight) -> out``: your matrix-vector product over a few token rows (for example
    :func:`studylog.decode.kernels.gemv_kernel` changed to compute two rows per program, each weight tile loaded
    once for both). Each row must equal what the chapter's kernel gives that row alone, bit for bit (under Triton's
    interpreter on a CPU): a token's result must not depend on how many tokens share the launch."""
    from studylog.decode import kernels

    torch.manual_seed(seed)
    failures, tried = [], 0
    for M, N, K in ((1, 33, 40), (2, 17, 64), (3, 50, 72), (5, 8, 130)):
        x, w = torch.randn(M, K), torch.randn(N, K)
        got = fn(x, w)
        for m in range(M):
            tried += 1
            want = kernels.gemv(x[m:m + 1].contiguous(), w)[0]
            if got is None or not torch.equal(got[m], want):
                failures.append(f"M={M}, N={N}, K={K}: row {m} differs from the one-row launch")
    return _verdict("check_gemv_rows", failures, tried)
