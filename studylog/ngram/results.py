"""Chapter 3's headline, read from the committed benchmark JSON (what :mod:`studylog.ngram.report` measured): no
GPU needed. The lookups the headline uses (a grid case's row, the cases a file holds, the clock of a series, the
same-clock pair the headline compares) are public: the book's figures and lesson tables (``book.ngram``) read a file
through them too."""

from __future__ import annotations

from studylog.ngram.report import NO_BUDGET, SYNCED_SERIES, own_series

def _chapter():
    from studylog.ngram import CHAPTER  # the package defines it after importing this module

    return CHAPTER


def grid_select(results, series, cfg):
    """The grid's rows of ``series`` at ``cfg`` = (batch, seq_len, threshold) (real-text rows excluded)."""
    return results.select(series, corpus=None, batch=cfg[0], seq_len=cfg[1], threshold=cfg[2])


def grid_configs(results) -> list[tuple[int, int, int]]:
    """The grid cases (batch, seq_len, threshold) the file measured a step at, in the file's order."""
    steps = {s.series for s in _chapter().steps}
    seen: dict[tuple, None] = {}
    for row in results.rows:
        if row["series"] in steps and "corpus" not in row["params"]:
            p = row["params"]
            seen.setdefault((p["batch"], p["seq_len"], p["threshold"]), None)
    return list(seen)


def clock_of(results, series) -> str | None:
    """The clock ``series`` was timed on (``do_bench`` for rows older than the field), None if not in the file."""
    rows = results.select(series)
    return rows[0].get("clock", "do_bench") if rows else None


def real_cases_in(results) -> list[tuple[str, int, int, int]]:
    """The real-text cases (corpus, batch, seq_len, threshold) the file measured, in the file's order."""
    seen: dict[tuple, None] = {}
    for row in results.rows:
        p = row["params"]
        if "corpus" in p:
            seen.setdefault((p["corpus"], p["batch"], p["seq_len"], p["threshold"]), None)
    return list(seen)


def real_row(results, series, case):
    """The row of ``series`` at a real-text ``case``, or None when the file has none."""
    corpus, batch, seq_len, threshold = case
    rows = results.select(series, corpus=corpus, batch=batch, seq_len=seq_len, threshold=threshold)
    return rows[0] if rows else None


def same_clock_pair(results, cfg):
    """(CPU path row, kernel row, kernel label) on one clock at a grid config: the final step end to end
    (:data:`SYNCED_SERIES`) where the file has it, else (files measured before it, where every row is a
    do_bench time) the fastest of the chapter's kernels. None when either is missing."""
    chapter = _chapter()
    cpu = grid_select(results, chapter.steps[0].series, cfg)
    synced = grid_select(results, SYNCED_SERIES, cfg)
    if cpu and synced:
        return cpu[0], synced[0], f"{chapter.final.name}, call + sync"
    kernels = [r for s in own_series() for r in grid_select(results, s, cfg)]
    kernels = [r for r in kernels if r.get("clock", "do_bench") == (cpu[0].get("clock", "do_bench") if cpu else None)]
    if cpu and kernels:
        best = min(kernels, key=lambda r: r["ms"])
        return cpu[0], best, chapter.label(best["series"])
    return None


#: The cases the book's headline page quotes: the deployed budget at a small and a mid-size batch, and the
#: largest batch with no budget.
HEADLINE_CASES = ((32, 512, 128), (128, 32768, 128), (256, 131072, NO_BUDGET))
#: The real-text case the headline page quotes: Python source, the deployed budget.
HEADLINE_REAL_CASE = ("code", 32, 4096, 128)


def headline(results) -> list[dict]:
    """For each headline case, the chapter's result against the CPU path it replaces, on one clock: both end
    to end on the host (the call, then a sync), with the kernel's GPU time and host time per call beside it.
    On a file measured before the end-to-end series, the fastest of the chapter's kernels against the CPU path
    (both do_bench)."""
    from studylog.plotting import headline_row

    chapter = _chapter()
    cpu = chapter.steps[0]
    final = chapter.final
    out = []
    cases = [(None, *c) for c in HEADLINE_CASES] + [HEADLINE_REAL_CASE]
    for corpus, batch, seq_len, threshold in cases:
        where = {"batch": batch, "seq_len": seq_len, "threshold": threshold, "corpus": corpus}
        budget = f", budget {threshold}" if threshold != NO_BUDGET else ", no budget"
        what = "" if corpus is None else f" of real {'Python source' if corpus == 'code' else corpus}"
        case = f"{batch} slots x {seq_len} tokens{what}{budget}"
        synced = results.select(SYNCED_SERIES, **where)
        if synced and results.select(cpu.series, **where):
            row = headline_row(results, SYNCED_SERIES, cpu.series, case,
                               kernel_label=f"n-gram matching, {final.name} (call + sync)",
                               baseline_label=f"{cpu.name} (call + sync)", **where)
            gpu = results.select(final.series, **where)
            if gpu:
                row["kernel_gpu_ms"] = gpu[0]["ms"]
                if "spread_ms" in gpu[0]:
                    row["kernel_gpu_spread_ms"] = gpu[0]["spread_ms"]
                if "host_ms" in gpu[0]:
                    row["host_ms"] = gpu[0]["host_ms"]
            row["note"] = ("both sides end to end on the host: the call, then torch.cuda.synchronize(); "
                           "kernel_gpu_ms is the kernel's GPU time (CUDA-graph replay)")
            out.append(row)
            continue
        if corpus is not None:
            continue
        pair = same_clock_pair(results, (batch, seq_len, threshold))
        if pair is not None:
            out.append(headline_row(results, pair[1]["series"], cpu.series, case,
                                    kernel_label=f"n-gram matching, {pair[2]}", baseline_label=cpu.label, **where))
    return out


def gpu_headline(results) -> list[dict]:
    """The book's headline rows, on the GPU clock only (the CPU path's time is host time, which moves with the
    host, so no headline rests on it; :func:`headline` gives that comparison, end to end): the chapter's last
    step against step 3, the two-phase design of the pull request the chapter starts from, at the headline
    cases. On a file measured before the GPU clock, :func:`headline`'s rows."""
    from studylog.plotting import headline_row

    chapter = _chapter()
    final, two_phase = chapter.final, chapter.step(3)
    # the entry point (ngram_match, the step its rule picks) where the file times it, else the last step
    ours = "ngram_match" if results.select("ngram_match") else final.series
    out = []
    for batch, seq_len, threshold in HEADLINE_CASES:
        where = {"batch": batch, "seq_len": seq_len, "threshold": threshold}
        mine, theirs = results.select(ours, **where), results.select(two_phase.series, **where)
        if not (mine and theirs and mine[0].get("clock") == theirs[0].get("clock") == "gpu"):
            continue
        budget = f", budget {threshold}" if threshold != NO_BUDGET else ", no budget"
        label = f"ngram_match ({mine[0].get('step', final.series)})" if ours == "ngram_match" else final.name
        out.append(headline_row(results, ours, two_phase.series, f"{batch} slots x {seq_len} tokens{budget}",
                                kernel_label=f"n-gram matching, {label}",
                                baseline_label=f"{two_phase.name} (the two-phase kernel of the original pull request)",
                                **where))
    return out or headline(results)


__all__ = ["HEADLINE_CASES", "HEADLINE_REAL_CASE", "clock_of", "gpu_headline", "grid_configs", "grid_select",
           "headline", "real_cases_in", "real_row", "same_clock_pair"]
