"""Chapter 4's headline from a results file, and the series that times what the entry point runs at a case."""

from __future__ import annotations

from typing import TYPE_CHECKING

from studylog.ctc.fused import final_step
from studylog.ctc.report import BENCH_A, BENCH_T

if TYPE_CHECKING:
    from studylog.plotting import Results


def entry_series(results: Results | dict, *, T: int, N: int, A: int) -> str:
    """The series of ``results`` (a :class:`~studylog.plotting.Results` or the file's JSON) that times what
    :func:`~studylog.ctc.ctc_loss` runs on ``(T, N, A)``: ``"ctc_loss"`` where the file times the entry point itself
    there, else the step :func:`~studylog.ctc.fused.final_step` picks for the longest target the file's step rows
    record there (``max_positions``); ``""`` where they record none."""
    for name, value in (("T", T), ("N", N), ("A", A)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    where = {"T": T, "N": N, "A": A}
    here = [r for r in (results["measurements"] if isinstance(results, dict) else results.rows)
            if r["params"] == where]
    if any(r["series"] == "ctc_loss" for r in here):
        return "ctc_loss"
    positions = next((r["max_positions"] for r in here if r.get("max_positions")), None)
    return "" if positions is None else f"step{final_step(T, N, A, positions):02d}"


def clock_of(results, series: str) -> str:
    """The clock of a series' rows (``"do_bench"`` for files that did not say), or ``""`` without rows."""
    rows = results.select(series)
    return rows[0].get("clock", "do_bench") if rows else ""


def headline(results) -> list[dict]:
    """The entry point (in an older file, the step its rule picks, else the last step measured) against
    ``torch-best`` on one clock, at each alphabet's smallest speedup over N and the large alphabet's largest batch."""
    from studylog.ctc import CHAPTER
    from studylog.plotting import headline_row

    measured = [s for s in reversed(CHAPTER.steps) if results.select(s.series, T=BENCH_T)]
    if not measured or not results.select("torch-best"):
        return []
    step = measured[0]
    entry = bool(results.select("ctc_loss", T=BENCH_T))  # the entry point, where the file times it
    kernel = "ctc_loss" if entry else step.series
    span = clock_of(results, "torch-best") != clock_of(results, kernel)
    if span:  # no torch call on the GPU clock: spans
        kernel = f"{step.series} span"
        if clock_of(results, kernel) != clock_of(results, "torch-best"):
            return []

    def kernel_at(A: int, N: int) -> str:
        if span:
            return kernel
        picked = entry_series(results, T=BENCH_T, N=N, A=A)
        return picked if results.select(picked, T=BENCH_T, A=A, N=N) else kernel

    native = results.select("torch-native")
    if clock_of(results, "torch-best") == "gpu" and native and not all(r.get("clock") == "gpu" for r in native):
        baseline = "torch cuDNN (graph-timed; torch's native path cannot be captured in a CUDA graph)"
    elif clock_of(results, "torch-best") == "kernel":
        baseline = "faster of torch cuDNN / native (kernel clock: no torch call could be captured in a CUDA graph)"
    else:
        baseline = "faster of torch cuDNN / native"
    rows = []
    for A in BENCH_A:
        ratios = {r["params"]["N"]: r["ms"] / results.ms(kernel_at(A, r["params"]["N"]), **r["params"])
                  for r in results.select("torch-best", A=A, T=BENCH_T)
                  if results.select(kernel_at(A, r["params"]["N"]), **r["params"])}
        if not ratios:
            continue
        worst = min(ratios, key=ratios.get)
        picks = [(f"T = {BENCH_T}, A = {A}, N = {worst} (smallest speedup over N = {min(ratios)}..{max(ratios)})",
                  worst)]
        if A == max(BENCH_A):
            picks.append((f"T = {BENCH_T}, A = {A}, N = {max(ratios)}", max(ratios)))
        for case, n in picks:
            label = (f"ctc_loss ({results.select('ctc_loss', T=BENCH_T, A=A, N=n)[0].get('step')}, CUDA C++)"
                     if entry else f"{CHAPTER.step(kernel_at(A, n).split()[0]).name} (CUDA C++)")
            rows.append(headline_row(results, kernel_at(A, n), "torch-best", case, kernel_label=label,
                                     baseline_label=baseline, T=BENCH_T, A=A, N=n))
    return rows[:3]
