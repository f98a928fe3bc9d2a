"""Chapter 4's headline, from a results file (the committed JSON), and the clock of a series that the book's figures
and tables name. It reads the benchmark's series as :mod:`studylog.ctc.report` writes them and, where a file predates
a series, gives the rows it can instead of failing."""

from __future__ import annotations

from studylog.ctc.report import BENCH_A, BENCH_T


def _chapter():
    from studylog.ctc import CHAPTER

    return CHAPTER


def clock_of(results, series: str) -> str:
    """The clock of a series' rows (``"do_bench"`` for files that did not say), or ``""`` without rows."""
    rows = results.select(series)
    return rows[0].get("clock", "do_bench") if rows else ""


def headline(results) -> list[dict]:
    """The book's headline rows (:func:`studylog.plotting.headline_row`): the last step measured against
    ``torch-best`` on the same clock, at the smallest speedup over N for each alphabet and at the largest batch
    of the large alphabet. ``torch-best`` is the faster of torch's calls timed on the GPU clock; where its native
    path cannot be captured in a graph, that is torch's cuDNN call alone, and the baseline says so."""
    from studylog.plotting import headline_row

    CHAPTER = _chapter()
    measured = [s for s in reversed(CHAPTER.steps) if results.select(s.series, T=BENCH_T)]
    if not measured or not results.select("torch-best"):
        return []
    step = measured[0]
    kernel = step.series
    entry = bool(results.select("ctc_loss", T=BENCH_T))  # the entry point, where the file times it
    if entry:
        kernel = "ctc_loss"
    if clock_of(results, "torch-best") != clock_of(results, kernel):  # no torch call on the GPU clock: spans
        kernel = f"{step.series} span"
        if clock_of(results, kernel) != clock_of(results, "torch-best"):
            return []
    native = results.select("torch-native")
    if clock_of(results, "torch-best") == "gpu" and native and not all(r.get("clock") == "gpu" for r in native):
        baseline = "torch cuDNN (graph-timed; torch's native path cannot be captured in a CUDA graph)"
    elif clock_of(results, "torch-best") == "kernel":
        baseline = "faster of torch cuDNN / native (kernel clock: no torch call could be captured in a CUDA graph)"
    else:
        baseline = "faster of torch cuDNN / native"
    rows = []
    for A in BENCH_A:
        ratios = {r["params"]["N"]: r["ms"] / results.ms(kernel, **r["params"])
                  for r in results.select("torch-best", A=A, T=BENCH_T) if results.select(kernel, **r["params"])}
        if not ratios:
            continue
        worst = min(ratios, key=ratios.get)
        picks = [(f"T = {BENCH_T}, A = {A}, N = {worst} (smallest speedup over N = {min(ratios)}..{max(ratios)})",
                  worst)]
        if A == max(BENCH_A):
            picks.append((f"T = {BENCH_T}, A = {A}, N = {max(ratios)}", max(ratios)))
        for case, n in picks:
            label = (f"ctc_loss ({results.select('ctc_loss', T=BENCH_T, A=A, N=n)[0].get('step')}, CUDA C++)"
                     if entry else f"{step.name} (CUDA C++)")
            rows.append(headline_row(results, kernel, "torch-best", case, kernel_label=label,
                                     baseline_label=baseline, T=BENCH_T, A=A, N=n))
    return rows[:3]
