"""Chapter 3's lookups in a results file (the committed JSON, what :mod:`studylog.ngram.report` measured), for the
book's figures, tables and lesson numbers: no GPU needed. A grid case's rows, the cases a file holds, the clock of a
series, the same-clock pair of the CPU path and the chapter's kernel, and the end-to-end comparison the lesson
quotes (:func:`headline`; the chapter's own headline, on the GPU clock, is
:func:`studylog.ngram.report.gpu_headline`)."""

from __future__ import annotations

from book.common import floor_ms
from studylog.ngram import CHAPTER
from studylog.ngram.report import FIRST_OWN_STEP, HEADLINE_CASES, NO_BUDGET, SYNCED_SERIES, SYNCED_STEP

#: The real-text case the lesson's end-to-end table quotes: Python source, the deployed budget.
HEADLINE_REAL_CASE = ("code", 32, 4096, 128)


def own_series() -> list[str]:
    """The series of this chapter's own kernels (the others are the deployed path and its published ports)."""
    return [s.series for s in CHAPTER.steps if s.number >= FIRST_OWN_STEP]


def grid_select(results, series, cfg):
    """The grid's rows of ``series`` at ``cfg`` = (batch, seq_len, threshold) (real-text rows excluded)."""
    return results.select(series, corpus=None, batch=cfg[0], seq_len=cfg[1], threshold=cfg[2])


def grid_configs(results) -> list[tuple[int, int, int]]:
    """The grid cases (batch, seq_len, threshold) the file measured a step at, in the file's order."""
    steps = {s.series for s in CHAPTER.steps}
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


def row_bytes(results, row) -> float | None:
    """The bytes a row's call must move: the active slots' haystacks read once (the row's ``haystack_bytes``; on a
    row without it, its ``floor_ms`` at the run's copy bandwidth, which that field counts). None without either."""
    if "haystack_bytes" in row:
        return row["haystack_bytes"]
    if "floor_ms" not in row:
        return None
    return row["floor_ms"] * 1e-3 * results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9


def floor_of(results, row) -> float | None:
    """The book's floor of a row's call, in ms (:func:`book.common.floor_ms`, the scoreboard's): the larger of its
    bytes at the run's copy bandwidth and the card's fastest empty kernel. A file not read from disk has no card,
    so its own run's empty kernel stands in. None where the row has no bytes."""
    nbytes = row_bytes(results, row)
    if nbytes is None:
        return None
    if results.path is None:
        by_bytes = nbytes / (results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9) * 1e3
        return max(by_bytes, results.data["ceilings"].get("empty_launch_gpu_ms") or 0.0)
    return floor_ms(results, nbytes)


def same_clock_pair(results, cfg):
    """(CPU path row, kernel row, kernel label) on one clock at a grid config: step 12 end to end
    (:data:`SYNCED_SERIES`) where the file has it, else (files measured before it, where every row is a
    do_bench time) the fastest of the chapter's kernels. None when either is missing."""
    cpu = grid_select(results, CHAPTER.steps[0].series, cfg)
    synced = grid_select(results, SYNCED_SERIES, cfg)
    if cpu and synced:
        return cpu[0], synced[0], f"{CHAPTER.step(SYNCED_STEP).name}, call + sync"
    kernels = [r for s in own_series() for r in grid_select(results, s, cfg)]
    kernels = [r for r in kernels if r.get("clock", "do_bench") == (cpu[0].get("clock", "do_bench") if cpu else None)]
    if cpu and kernels:
        best = min(kernels, key=lambda r: r["ms"])
        return cpu[0], best, CHAPTER.label(best["series"])
    return None


def headline(results) -> list[dict]:
    """For each headline case, the chapter's result against the CPU path it replaces, on one clock: both end
    to end on the host (the call, then a sync), with the kernel's GPU time and host time per call beside it.
    On a file measured before the end-to-end series, the fastest of the chapter's kernels against the CPU path
    (both do_bench)."""
    from studylog.plotting import headline_row

    cpu = CHAPTER.steps[0]
    final = CHAPTER.step(SYNCED_STEP)
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
            row["where"] = where
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


__all__ = ["HEADLINE_REAL_CASE", "clock_of", "floor_of", "grid_configs", "grid_select", "headline", "own_series",
           "real_cases_in", "real_row", "row_bytes", "same_clock_pair"]
