"""Chapter 4's figures, from a results file (the committed JSON), and the clock words the lesson's tables share
with them. They read the benchmark's series as :mod:`studylog.ctc.report` writes them and, where a file predates a
series, leave it out instead of failing."""

from __future__ import annotations

from studylog.ctc import CHAPTER
from studylog.ctc.report import BENCH_A, BENCH_N, BENCH_T
from studylog.ctc.results import clock_of
from studylog.ctc.warpctc import default_grain

#: One colour per series across the chapter: every figure draws a series in the same colour.
COLOURS = {
    "torch-cuDNN": "#222222", "torch-native": "#8c8c8c", "torch-best": "#222222",
    "step01": "#1f77b4", "step02": "#6baed6", "step03": "#9ecae1", "step04": "#17becf", "step05": "#2ca02c",
    "step06": "#d62728", "step07": "#ff7f0e", "step08": "#ffbb78", "step09": "#c5b0d5", "step10": "#e377c2",
    "step11": "#dbdb8d", "step12": "#bcbd22", "step13": "#9467bd", "step14": "#8c564b",
}
#: Series of the times figure: torch's two paths, the warp-ctc design before and after its best change, the
#: first three-pass step and the last step (every step's time is in the table of steps of the notebook).
TIMES_SERIES = ("torch-cuDNN", "torch-native", "step01", "step05", "step07", "step14")
#: Steps drawn against torch in the speedup figure: the first three-pass step, the first with alpha and beta side by
#: side, the two the entry point chooses between and the step before its choice.
SPEEDUP_STEPS = (7, 10, 12, 13, 14)
#: The entry point's series: drawn beside the steps, since it picks among them by shape.
ENTRY = "ctc_loss"
#: Font size of legends and labels at the saved size (figures are saved about 9 inches wide).
FONT = 10


def main_clock(results) -> str:
    """The clock of the last step's rows: what a figure's title names; other clocks are named in legends."""
    return clock_of(results, CHAPTER.final.series) or "gpu"


def step_words(series: str) -> str:
    """A step's series in the words of the lesson's table of steps (``step 11: the warp recursion without ...``);
    any other series as it is."""
    from book.ctc.compiled import PREFETCH_FRAMES

    for step in CHAPTER.steps:
        if step.series == series and step.number == 7:  # the lesson's 7a, 7b and 7c: the series is after the last
            return f"step 7c: emissions loaded {PREFETCH_FRAMES} frames ahead (after 7a and 7b)"
        if step.series == series:
            return f"step {step.number}: {step.title}"
    return series


def label(results, series: str) -> str:
    """A legend label: a step's number and what it changed (the words of the table of steps) for a step's series,
    with the clock where it is not the clock of the chapter's own steps (the GPU clock in new files)."""
    clock = clock_of(results, series)
    name = step_words(series)
    main = main_clock(results)
    return name if clock in (main, "") else f"{name} ({clock} clock)"


def colour(series: str) -> str:
    return COLOURS.get(series.split()[0], "#7f7f7f")


def clock_words(clock: str) -> str:
    return {"gpu": "GPU clock", "do_bench": "do_bench", "kernel": "kernel clock"}.get(clock, clock)


def best_torch_name(results, short: bool = False) -> str:
    """What ``torch-best`` holds, named for the reader: the one call it picked at every point and how it was timed
    (``torch-cuDNN (graph-captured)``; ``short``: the call alone), or "the faster torch call" where the pick varies."""
    picks = {r.get("picked") for r in results.select("torch-best")}
    if len(picks) != 1 or None in picks:
        return "the faster torch call"
    clock = clock_of(results, "torch-best")
    if short:
        return next(iter(picks))
    return f"{next(iter(picks))} ({'graph-captured' if clock == 'gpu' else clock_words(clock)})"


#: The series of step 4's grain sweep (warp-ctc's strided layout, one grain a row).
GRAIN_SERIES = f"{CHAPTER.step(4).series} strided"


def grain_sweep(results) -> dict[int, dict]:
    """Step 4's grain sweep per alphabet: its batch ``N``, per grain the row (``ms``, ``threads`` per utterance,
    spread), and ``rule``, the grain warp-ctc's rule (:func:`~studylog.ctc.warpctc.default_grain`, about 128 threads
    an utterance) gives that batch, the grain step 4 runs there. The rule needs the batch's longest extended target:
    the grain-1 block covers it in whole warps, so its thread count is that length rounded up to a multiple of 32,
    which leaves the rule's answer (one more grain per 128 positions) unchanged. Empty without the sweep."""
    out: dict[int, dict] = {}
    for row in results.select(GRAIN_SERIES):
        A = row["params"]["A"]
        entry = out.setdefault(A, {"N": row["params"]["N"], "rows": {}})
        entry["rows"][row["params"]["grain"]] = row
    for entry in out.values():
        one = entry["rows"].get(1)
        entry["rule"] = default_grain(one["threads"]) if one and "threads" in one else None
    return dict(sorted(out.items()))


def _thousands(n) -> str:
    """An integer with a thousands separator, as the pages write numbers (5,000); anything else as it is."""
    return f"{n:,}" if isinstance(n, int) else str(n)


def _spread(row: dict) -> tuple[float, float, float]:
    """(min, median, max) in ms: the repetitions' spread where the row has it, else the median three times."""
    lo, mid, hi = row.get("spread_ms") or (row["ms"], row["ms"], row["ms"])
    return lo, mid, hi


def _times_panel(ax, results, A: int) -> None:
    where = {"A": A, "T": BENCH_T}
    floor: dict = {}
    for series in TIMES_SERIES:
        rows = sorted(results.select(series, **where), key=lambda r: r["params"]["N"])
        if not rows:
            continue
        ns = [r["params"]["N"] for r in rows]
        lo, mid, hi = zip(*(_spread(r) for r in rows))
        ax.errorbar(ns, [m * 1e3 for m in mid], yerr=[[(m - a) * 1e3 for a, m in zip(lo, mid)],
                                                      [(b - m) * 1e3 for b, m in zip(hi, mid)]],
                    marker="o", ms=4, lw=1.5, capsize=2, color=colour(series), label=label(results, series))
        for r in rows:
            if "floor_ms" in r:
                floor[r["params"]["N"]] = r["floor_ms"] * 1e3
    if floor:
        ns = sorted(floor)
        ax.plot(ns, [floor[n] for n in ns], "k--", lw=1, label="floor (bytes / measured bandwidth)")
    _n_axis(ax)
    ax.set_yscale("log")
    ax.set_xlabel("N (utterances)", fontsize=FONT)
    ax.set_ylabel("µs per call (median)", fontsize=FONT)
    ax.set_title(f"A = {A:,}", fontsize=FONT + 1)
    ax.grid(True, which="both", alpha=0.3)
    ax.tick_params(labelsize=FONT - 1)


def _n_axis(ax) -> None:
    """A log2 axis of batch sizes, labelled with the sizes themselves."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(BENCH_N), [f"{n:,}" for n in BENCH_N])
    ax.minorticks_off()


def _speedup_panel(ax, results, A: int) -> None:
    where = {"A": A, "T": BENCH_T}
    base = {r["params"]["N"]: r for r in results.select("torch-best", **where)}
    for series in [CHAPTER.step(n).series for n in SPEEDUP_STEPS] + [ENTRY]:
        rows = sorted((r for r in results.select(series, **where) if r["params"]["N"] in base),
                      key=lambda r: r["params"]["N"])
        if not rows:
            continue
        ns, mid, lo, hi = [], [], [], []
        for r in rows:
            b_lo, b_mid, b_hi = _spread(base[r["params"]["N"]])
            o_lo, o_mid, o_hi = _spread(r)
            ns.append(r["params"]["N"])
            mid.append(b_mid / o_mid)
            lo.append(b_mid / o_mid - b_lo / o_hi)
            hi.append(b_hi / o_lo - b_mid / o_mid)
        entry = series == ENTRY  # the call a reader makes: drawn thick, on top
        ax.errorbar(ns, mid, yerr=[lo, hi], marker="s" if entry else "o", ms=5 if entry else 4,
                    lw=3 if entry else 1.5, capsize=2, color="#000000" if entry else colour(series),
                    alpha=0.55 if entry else 1.0, zorder=1 if entry else 2,
                    label="ctc_loss: the entry point, the step its rule picks" if entry else label(results, series))
    ax.axhline(1.0, color="k", lw=1, ls=":")
    _n_axis(ax)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("N (utterances)", fontsize=FONT)
    ax.set_ylabel(f"{best_torch_name(results, short=True)} time / step time", fontsize=FONT)
    ax.set_title(f"A = {A:,}", fontsize=FONT + 1)
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=FONT - 1)


def _shared_legend(fig, axes, ncol: int) -> None:
    """One legend for the panels, below them, outside the data."""
    seen: dict = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(text, handle)
    fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=ncol, fontsize=FONT,
               frameon=False)


def figures(results) -> dict[str, "matplotlib.figure.Figure"]:  # noqa: F821
    """``times`` (torch's paths and four of our steps against the floor), ``speedup`` (steps of
    :data:`SPEEDUP_STEPS` over :func:`best_torch_name`, linear axis, with the range of the repetitions) and ``grain`` (step 4's grain sweep),
    two panels each (A = 28 and 5,000); each series in its colour of :data:`COLOURS`."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import StrMethodFormatter

    figs = {}
    clock = clock_words(main_clock(results))
    fig, axes = plt.subplots(1, 2, figsize=(9, 5.6), layout="constrained")
    for ax, A in zip(axes, BENCH_A):
        _times_panel(ax, results, A)
    _shared_legend(fig, axes, ncol=1)
    bars = "; bars: min–max over repetitions" if any("spread_ms" in r for r in results.rows) else ""
    fig.suptitle(f"CTC loss + gradient, T = {BENCH_T:,}: torch against our steps ({clock}, {results.gpu}{bars})",
                 fontsize=FONT + 1)
    figs["times"] = fig
    if results.select("torch-best"):
        fig, axes = plt.subplots(1, 2, figsize=(9, 4.8), layout="constrained")
        for ax, A in zip(axes, BENCH_A):
            _speedup_panel(ax, results, A)
        _shared_legend(fig, axes, ncol=1)
        bars = " (bars: min–max over repetitions)" if any("spread_ms" in r for r in results.rows) else ""
        steps = ", ".join(str(k) + ("c" if k == 7 else "") for k in SPEEDUP_STEPS[:-1]) + f" and {SPEEDUP_STEPS[-1]}"
        # the last step is not on top at every N: the entry point runs step 12, 13 or 14 by shape and longest target
        fig.suptitle(f"Speedup of steps {steps} and ctc_loss over {best_torch_name(results)}{bars}\nthe entry "
                     "point ctc_loss runs step 12 or 14 by shape: the last step is not on top at every N",
                     fontsize=FONT + 1)
        figs["speedup"] = fig
    sweep = grain_sweep(results)
    if sweep:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), layout="constrained")
        for ax, A in zip(axes, BENCH_A):
            entry = sweep.get(A, {"N": "?", "rows": {}, "rule": None})
            grains = sorted(entry["rows"])
            rows = [entry["rows"][g] for g in grains]
            lo, mid, hi = zip(*(_spread(r) for r in rows)) if rows else ((), (), ())
            ax.errorbar(grains, [m * 1e3 for m in mid], yerr=[[(m - a) * 1e3 for a, m in zip(lo, mid)],
                                                              [(b - m) * 1e3 for b, m in zip(hi, mid)]],
                        marker="o", ms=5, lw=1.5, capsize=2, color=colour(GRAIN_SERIES), label="step 4")
            if entry["rule"] in entry["rows"]:
                ax.axvline(entry["rule"], color="k", ls=":", lw=1.2,
                           label=f"warp-ctc's rule, step 4's grain here (VT = {entry['rule']})")
            ax.set_xticks(grains or [1], [f"{g:,}\n{_thousands(r.get('threads', '?'))}" for g, r in zip(grains, rows)]
                          or ["1"])
            ax.set_ylim(bottom=0)
            ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))  # 6,000 µs, as the pages write it
            ax.set_xlabel("grain VT (positions per thread) / threads per utterance", fontsize=FONT)
            ax.set_ylabel("µs per call (median)", fontsize=FONT)
            ax.set_title(f"A = {A:,}, N = {_thousands(entry['N'])}", fontsize=FONT + 1)
            ax.grid(True, alpha=0.3)
            ax.tick_params(labelsize=FONT - 1)
        _shared_legend(fig, axes, ncol=2)
        fig.suptitle(f"step 4: time against the grain size ({clock})", fontsize=FONT + 1)
        figs["grain"] = fig
    return figs
