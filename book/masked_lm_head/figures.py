"""Chapter 2's figures, from the committed JSON (``studylog.masked_lm_head.report`` keeps the headline): at
most three panels each, one colour per series across the chapter. Series names come from ``CHAPTER`` (steps
``stepNN``, and the other series it lists).

Results files measured before the GPU clock (do_bench rows, no peer, no host time) still draw: a figure uses what a
file holds and leaves out what it does not.
"""

from __future__ import annotations

import textwrap
from typing import Any

from book.masked_lm_head.lesson import floor_ms
from book.plotting import series_words
from studylog.masked_lm_head import CHAPTER
from studylog.masked_lm_head.report import PLAN, XGRAMMAR

__all__ = ["figures", "series_color", "PLAIN_NAMES", "SERIES_COLORS", "SERIES_MARKERS"]


def _s(number: int) -> str:
    """Step ``number``'s series in the benchmark JSON."""
    return CHAPTER.step(number).series


#: One colour per series across the chapter's figures (steps by number, then the baselines and the peer).
SERIES_COLORS: dict[str, str] = {
    "step00": "#7f7f7f", "step01": "#bcbd22", "step02": "#17becf", "step03": "#9467bd", "step04": "#ff7f0e",
    "step05": "#8c564b", "step06": "#c7c7c7", "step07": "#d62728", "step08": "#e377c2", "step09": "#98df8a",
    "step10": "#2ca02c", "step11": "#ff9896", "step12": "#1f77b4", "step13": "#08306b",
    "dense_mask": "#000000", "cublas_fp32_mask": "#555555", "index_select": "#a0522d",
    "reordered_in_sample": "#c49c94", "xgrammar_bitmask": "#f5a623", "xgrammar_bitmask_bf16": "#f8cf86",
    "floor": "#000000",
}
#: Markers, so that series stay apart in grey print too.
SERIES_MARKERS: dict[str, str] = {
    "step00": "x", "step01": "v", "step02": "^", "step03": "D", "step04": "s", "step05": "<", "step06": ">",
    "step07": "o", "step08": "P", "step09": "d", "step10": "o", "step11": "h", "step12": "*", "step13": "*",
    "dense_mask": "s", "cublas_fp32_mask": "D", "index_select": "X", "xgrammar_bitmask": "s",
}
#: Text sizes at the saved size; footnotes one point smaller. The book scales a figure wider than its page down to
#: it, so these keep text of about 10 px or more on the page (``book.plotting.smallest_text_px``).
FONT = 10


def series_color(series: str) -> str:
    """The chapter's colour of a series."""
    return SERIES_COLORS.get(series, "#333333")


def _name(series: str) -> str:
    """A series as the figures name it: :data:`PLAIN_NAMES` ("step 3: step 2 written for [V, D] rows"), or the
    step's number and name in words (``book.plotting.series_words``)."""
    return PLAIN_NAMES.get(series) or series_words(CHAPTER, series)


def _errorbar(ax, xs, rows, value, **style):
    """Markers at each row's ``value`` (the median), with error bars from the repetitions' spread (min, max)
    where the row keeps it; ``value(ms)`` maps a time to what is plotted."""
    ys = [value(r["ms"]) for r in rows]
    lo = [abs(value(r["ms"]) - value(r["spread_ms"][0])) if r.get("spread_ms") else 0.0 for r in rows]
    hi = [abs(value(r["spread_ms"][2]) - value(r["ms"])) if r.get("spread_ms") else 0.0 for r in rows]
    ax.errorbar(xs, ys, yerr=[lo, hi], capsize=2, elinewidth=1, **style)


def _spread_words(results) -> str:
    return ("error bars: min–max of the repetitions" if any(r.get("spread_ms") for r in results.rows)
            else "one median per point (this file keeps no spread)")


def _style(ax, xlabel: str, ylabel: str, *, logy: bool):
    ax.set_xscale("log")
    ax.set_yscale("log" if logy else "linear")
    ax.set_xlabel(xlabel, fontsize=FONT)
    ax.set_ylabel(ylabel, fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax.grid(True, which="major" if not logy else "both", alpha=0.3)


def figures(results) -> dict[str, Any]:
    """The chapter's figures, at most three panels each, one colour per series (:data:`SERIES_COLORS`):
    ``speedup_b1`` (each step's speedup over ``index_select`` + matmul given the ids, at batch 1,
    log axis; the footnote says why every line rises where that rival copies rows one by one), ``layout``
    (steps 1 and 2 on both layouts, bars), ``batched`` (time against allowed count at batches 8, 64 and 256),
    ``practitioners`` (the whole step against xgrammar's path) and ``host`` (host time per call); a figure
    whose series the file lacks is left out."""
    figs: dict[str, Any] = {}
    caption = textwrap.fill(results.caption(), 120)
    if results.select(RIVAL, batch=1, kind="random"):
        figs["speedup_b1"] = _speedup_figure(results, caption)
    if results.select(_s(2), batch=1, layout="dv"):
        figs["layout"] = _layout_figure(results, caption)
    if results.select(_s(10), kind="random"):
        figs["batched"] = _batched_figure(results, caption)
    if results.select(XGRAMMAR):
        figs["practitioners"] = _practitioners_figure(results, caption)
    if any("host_ms" in r for r in results.rows):
        figs["host"] = _host_figure(results, caption)
    return figs


#: The figures' legends: each step by its number and its idea in plain words, and the rivals as the prose names them.
PLAIN_NAMES: dict[str, str] = {
    "step00": "step 0: the tutorial's matmul, then the mask", "step01": "step 1: skip blocks with nothing allowed",
    "step02": "step 2: skip disallowed columns too", "step03": "step 3: step 2 written for [V, D] rows (the dense path)",
    "step04": "step 4: only the allowed ids", "step05": "step 5: one wait per row",
    "step06": "step 6: the fill programs first", "step07": "step 7: an L2 evict-first hint",
    "step08": "step 8: a few ids as launch arguments", "step09": "step 9: the batch's union read once",
    "step10": "step 10: the union on the tensor cores",
    "step11": "step 11 (tried): vocabulary reordered, real grammar masks", "step12": "step 12: the dispatch (picks a path)",
    "step13": "step 13: the whole step from the bitmask",
    "dense_mask": "torch: dense logits, then masked_fill", "cublas_fp32_mask": "cuBLAS fp32 logits, then masked_fill",
    "index_select": "torch: index_select, then a matmul",
}


#: The dense rival the speedup figure divides by: cuBLAS with fp32 output, then masked_fill, the chapter's contract
#: (fp32 logits) and steady at batch 1, where dense + mask's bf16 logits run at two speeds
#: (:func:`book.masked_lm_head.lesson.dense_clusters`).
DENSE = "cublas_fp32_mask"


#: The lead figure's divisor, the rival timed at every allowed count at batch 1: a gather of the allowed rows, then
#: a matmul, given the ids.
RIVAL = "index_select"


def _speedup_figure(results, caption: str):
    """Batch 1, [V, D]: every step's speedup over :data:`RIVAL` against the allowed count on a log axis, random
    masks (step 11 on the real grammar masks it is measured on, against it on the same masks), in two
    panels with one y axis so that the lines do not pile up: the steps that skip blocks or columns of the dense
    kernel (0 to 3, and 11), then those that walk the allowed ids (4, 5, 8 and 12; steps 6 and 7 lie on step 5's line and
    are left to the table), the dense rival (cuBLAS's fp32 logits + masked_fill) dashed in the first; step 12 drawn
    wide and pale under the step it picks. Steps 9 and 10 run above batch 1 (step 10 is in the batched figure)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 6.4), sharey=True)
    panels = (("Skipping inside the dense kernel", [_s(n) for n in (0, 1, 2, 3, 11)] + [DENSE]),
              ("Walking the allowed ids", [_s(n) for n in (4, 5, 8, 12)]))
    for ax, (title, steps) in zip(axes, panels):
        for series in steps:
            kind = "real" if series == _s(11) else "random"
            base = {r["params"]["allowed"]: r for r in results.select(RIVAL, batch=1, kind=kind)
                    if r["params"].get("layout", "vd") == "vd"}
            rows = sorted((r for r in results.select(series, batch=1, kind=kind)
                           if r["params"].get("layout", "vd") == "vd" and r["params"]["allowed"] in base),
                          key=lambda r: r["params"]["allowed"])
            if not rows:
                continue
            xs = [r["params"]["allowed"] for r in rows]
            ys = [base[x]["ms"] / r["ms"] for x, r in zip(xs, rows)]
            lo = [y - base[x]["ms"] / r["spread_ms"][2] if r.get("spread_ms") else 0 for x, y, r in zip(xs, ys, rows)]
            hi = [base[x]["ms"] / r["spread_ms"][0] - y if r.get("spread_ms") else 0 for x, y, r in zip(xs, ys, rows)]
            # step 12 wide and pale under the step it picks; step 2 thick with open markers under step 3, which
            # nearly equals it on [V, D]
            under = {_s(12): dict(ms=11, lw=5, alpha=0.35, zorder=1),
                     _s(2): dict(ms=10, lw=3.5, alpha=0.8, zorder=2, mfc="none", mew=1.5),
                     # step 0 sits on cuBLAS's dense line at its two counts: large open markers, drawn over it
                     _s(0): dict(ms=11, lw=1.3, zorder=4, mfc="none", mew=1.8)}
            style = under.get(series, dict(ms=5, lw=1.3, zorder=3))
            ax.errorbar(xs, ys, yerr=[lo, hi], capsize=2, elinewidth=1, color=series_color(series),
                        marker=SERIES_MARKERS.get(series, "o"), ls="--" if series in (_s(11), DENSE) else "-",
                        label=PLAIN_NAMES.get(series, series), **style)
        ax.axhline(1.0, color="k", lw=1, ls=":")  # the rival itself
        _style(ax, "allowed tokens (batch 1, log scale)",
               "speedup over index_select + matmul, given the ids\n(×, log scale; 1: as fast)" if ax is axes[0] else "",
               logy=True)
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.set_title(title, fontsize=FONT + 1)
        ax.legend(fontsize=FONT, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    fig.suptitle(f"Each step's speedup over index_select + matmul given the allowed ids (unfused; timed at every count), "
                 f"{results.gpu.replace('NVIDIA ', '')}", fontsize=FONT + 2)
    zero = sorted({r["params"]["allowed"] for r in results.select(_s(0), batch=1, kind="random")})
    every = {r["params"]["allowed"] for r in results.select(RIVAL, batch=1, kind="random")}
    zero = f"; step 0 at {' and '.join(f'{c:,}' for c in zero)} only" if zero and len(zero) < len(every) else ""
    fig.tight_layout()
    fig.text(0.01, -0.01, speedup_footnote(results, caption, zero), fontsize=FONT - 1, va="top")
    return fig


def speedup_footnote(results, caption: str, zero: str = "") -> str:
    """The speedup figure's footnote, at most three lines: the run, what the panels leave out, and why the
    ``index_select`` line dips (:func:`_index_select_words`, where the run shows it)."""
    return (caption + "\n" + _spread_words(results) + "; random masks, real ones for step 11; steps 6, 7, 9 and 10 "
            "are in the tables" + zero + _index_select_words(results))


#: torch's ``index_select`` copies up to this many rows with its small-index kernel, each thread looping over the ids
#: in turn, and more with a gather over every element at once (``index_select_out_cuda_impl`` in ATen's Indexing.cu).
SMALL_INDEX = 16


def _index_select_words(results) -> str:
    """The footnote's line on the kernel's rival, ``index_select`` + matmul, slowest at the largest count up to
    :data:`SMALL_INDEX` ids, where torch copies the rows one after another, against the smallest count above it.
    Empty where the run lacks either point."""
    rows = {r["params"]["allowed"]: r["ms"] for r in results.select("index_select", batch=1, kind="random")
            if r["params"].get("layout", "vd") == "vd"}
    few = max((n for n in rows if 1 < n <= SMALL_INDEX), default=None)
    many = min((n for n in rows if n > SMALL_INDEX), default=None)
    if few is None or many is None or rows[few] <= rows[many]:
        return ""
    return (f"\nEvery line rises at {few:,} ids: up to {SMALL_INDEX} ids torch's index_select copies rows one by one, "
            f"the rival's slowest point ({rows[few] * 1e3:.1f} µs; {many:,} ids {rows[many] * 1e3:.1f} µs).")


def _layout_figure(results, caption: str):
    """Steps 1 and 2 on the post's [D, V] layout and on [V, D], batch 1, random masks: bars per allowed
    count."""
    import matplotlib.pyplot as plt
    import numpy as np

    counts = sorted({r["params"]["allowed"] for r in results.select(_s(2), batch=1, kind="random", layout="dv")})
    bars = [(_s(1), "dv"), (_s(2), "dv"), (_s(1), "vd"), (_s(2), "vd")]
    fig, ax = plt.subplots(figsize=(8.6, 5.2))
    width = 0.8 / len(bars)
    for k, (series, layout) in enumerate(bars):
        rows = [results.select(series, batch=1, kind="random", allowed=c, layout=layout) for c in counts]
        xs = [i + (k - (len(bars) - 1) / 2) * width for i in range(len(counts))]
        ys = [r[0]["ms"] * 1e3 if r else 0 for r in rows]
        err = [[(r[0]["ms"] - r[0]["spread_ms"][0]) * 1e3 if r and r[0].get("spread_ms") else 0 for r in rows],
               [(r[0]["spread_ms"][2] - r[0]["ms"]) * 1e3 if r and r[0].get("spread_ms") else 0 for r in rows]]
        ax.bar(xs, ys, width, yerr=err, capsize=2, color=series_color(series),
               hatch="//" if layout == "dv" else None, edgecolor="white",
               label=f"{_name(series)}, {'[D, V]' if layout == 'dv' else '[V, D]'}")
    ax.set_xticks(np.arange(len(counts)), [f"{c:,} allowed" for c in counts], fontsize=FONT)
    ax.set_ylabel("time (µs)", fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title("Steps 1 and 2 on the post's [D, V] layout and on [V, D] (batch 1, random masks)",
                 fontsize=FONT + 1)
    ax.legend(fontsize=FONT, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    fig.tight_layout()
    fig.text(0.01, -0.01, caption + "\n" + _spread_words(results), fontsize=FONT - 1, va="top")
    return fig


def _batched_figure(results, caption: str):
    """Time against allowed tokens per sequence at (up to) three batch sizes, random masks: the dense paths,
    index_select (the union's logits only), steps 3, 10 and 12, and the floor (``lesson.floor_ms``)."""
    import matplotlib.pyplot as plt

    batches = sorted({r["params"]["batch"] for r in results.select(_s(10), kind="random")})
    batches = [b for b in (8, 64, 256) if b in batches] or batches[-3:]
    # narrow panels: a wider figure is shown smaller on the page, and its text with it
    fig, axes = plt.subplots(1, len(batches), figsize=(2.8 * len(batches) + 0.6, 5.0), squeeze=False, sharey=True)
    series = ["dense_mask", "cublas_fp32_mask", "index_select", _s(3), _s(10), _s(12)]
    for ax, batch in zip(axes[0], batches):
        for x in series:
            rows = sorted((r for r in results.select(x, batch=batch, kind="random")
                           if r["params"].get("layout", "vd") == "vd"), key=lambda r: r["params"]["allowed"])
            if rows:
                _errorbar(ax, [r["params"]["allowed"] for r in rows], rows, lambda ms: ms * 1e3,
                          color=series_color(x), marker=SERIES_MARKERS.get(x, "o"), ms=4,
                          lw=2.2 if x == _s(12) else 1.0, label=_name(x))
        floor = sorted((r["params"]["allowed"], floor_ms(results, batch, r["union"]) * 1e3)
                       for r in results.select(_s(12), batch=batch, kind="random") if "union" in r)
        if floor:
            ax.plot([p[0] for p in floor], [p[1] for p in floor], "k--", lw=1, label="floor: union rows + fp32 output")
        _style(ax, "allowed tokens per sequence", "time (µs)" if batch == batches[0] else "", logy=True)
        ax.set_title(f"batch {batch}", fontsize=FONT + 1)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle("A batch with its own mask per sequence: time against allowed tokens (random masks)",
                 fontsize=FONT + 1)
    fig.tight_layout(rect=(0, 0.25, 1, 1))
    fig.legend(handles, labels, fontsize=FONT, loc="upper left", bbox_to_anchor=(0.01, 0.24), ncol=2, frameon=False)
    fig.text(0.01, 0.03, caption + "\n" + _spread_words(results), fontsize=FONT - 1, va="top")
    return fig


#: How far right (a factor on the log axis) the practitioners' figure draws a real-mask point, so that it does not
#: hide a random-mask point of another batch at the same count.
REAL_DODGE = 1.3


def _practitioners_figure(results, caption: str):
    """Our whole decode step from the packed bitmask (MaskedHeadPlan) against the practitioners' path
    (cuBLAS logits + xgrammar's apply_token_bitmask_inplace): speedup against allowed count per batch size,
    random masks as lines, real masks as open markers (linear speedup axis)."""
    import matplotlib.pyplot as plt

    batch_colors = {1: "#1f77b4", 4: "#2ca02c", 8: "#9467bd", 64: "#d62728", 256: "#8c564b"}
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for batch in sorted({r["params"]["batch"] for r in results.select(XGRAMMAR)}):
        for kind in ("random", "real", "grammar", "clustered"):
            base = {r["params"]["allowed"]: r for r in results.select(XGRAMMAR, batch=batch, kind=kind)}
            rows = sorted((r for r in results.select(PLAN, batch=batch, kind=kind) if r["params"]["allowed"] in base),
                          key=lambda r: r["params"]["allowed"])
            if not rows:
                continue
            xs = [r["params"]["allowed"] for r in rows]
            ys = [base[x]["ms"] / r["ms"] for x, r in zip(xs, rows)]
            lo = [y - base[x]["spread_ms"][0] / r["spread_ms"][2] if r.get("spread_ms") and base[x].get("spread_ms")
                  else 0 for x, y, r in zip(xs, ys, rows)]
            hi = [base[x]["spread_ms"][2] / r["spread_ms"][0] - y if r.get("spread_ms") and base[x].get("spread_ms")
                  else 0 for x, y, r in zip(xs, ys, rows)]
            color = batch_colors.get(batch, "#333333")
            if kind == "random":
                ax.errorbar(xs, ys, yerr=[lo, hi], color=color, marker="o", ms=5, lw=1.5, capsize=2,
                            label=f"batch {batch}, random masks")
            elif kind != "clustered":  # drawn a little right of their count, not over another batch's point
                ax.errorbar([x * REAL_DODGE for x in xs], ys, yerr=[lo, hi], color=color, marker="D", mfc="none",
                            ms=7, ls="none",
                            capsize=2, label=f"batch {batch}, {kind} grammar masks")
    ax.axhline(1.0, color="k", lw=1, ls=":")
    _style(ax, "allowed tokens per sequence (log scale)", "speedup of the whole step (×)", logy=False)
    ax.set_ylim(bottom=0)
    ax.set_title("From the packed bitmask, copy included: step 13 against cuBLAS logits\n+ xgrammar's "
                 "apply_token_bitmask_inplace", fontsize=FONT + 1)
    ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.text(0.01, -0.02, caption + "\n" + _spread_words(results) + "; the open diamonds (real grammar masks) are "
             "drawn a little right of their allowed count", fontsize=FONT - 1, va="top")
    fig.tight_layout()
    return fig


def _host_figure(results, caption: str):
    """Host time per call of each public entry point at batch 1 (random masks): bars at the median over the
    run's counts, error bars from the fastest to the slowest count; the empty Triton launch of the same run and
    step 12's GPU time as lines."""
    import matplotlib.pyplot as plt

    short = {XGRAMMAR: "xgrammar's path (cuBLAS + bitmask)"}
    entries = [x for x in [_s(n) for n in (4, 7, 8, 12)] + [PLAN, XGRAMMAR]
               if any("host_ms" in r for r in results.select(x, batch=1, kind="random"))]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for i, x in enumerate(entries):
        values = sorted(r["host_ms"] * 1e3 for r in results.select(x, batch=1, kind="random")
                        if "host_ms" in r and r["params"].get("layout", "vd") == "vd")
        median = values[len(values) // 2]
        ax.barh(i, median, 0.6, xerr=[[median - values[0]], [values[-1] - median]], capsize=3,
                color=series_color(x), edgecolor="white")
    ax.set_yticks(range(len(entries)), [short.get(x, _name(x)) for x in entries], fontsize=FONT)
    ax.invert_yaxis()
    empty = results.data.get("ceilings", {}).get("empty_launch_host_ms")
    if empty:
        ax.axvline(empty * 1e3, color="k", ls="--", lw=1, label="an empty Triton launch from Python (host)")
    gpu = sorted(r["ms"] * 1e3 for r in results.select(_s(12), batch=1, kind="random"))
    if gpu:
        ax.axvline(gpu[len(gpu) // 2], color=series_color(_s(12)), ls=":", lw=1.5,
                   label=f"{_name(_s(12))}: GPU time, median over the counts")
    ax.set_xlabel("host time per call (µs): median over the allowed counts, bars from fastest to slowest",
                  fontsize=FONT)
    ax.tick_params(axis="x", labelsize=FONT)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("What a call costs the host at batch 1 (random masks)", fontsize=FONT + 1)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(-0.45, -0.2), ncol=1, frameon=False)
    fig.text(0.01, 0.0, caption, fontsize=FONT - 1, va="top")
    return fig
