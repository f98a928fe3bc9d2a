"""Chapter 6's figures, drawn from the committed JSON: every approach's time per call on each shape, and the key
tiles never loaded; one colour per series across the chapter."""

from __future__ import annotations

from typing import Any

from book.common import param_values
from book.plotting import series_words
from studylog.multi_item import CHAPTER
from studylog.multi_item.report import (BENCH_HEAD_DIM, BENCH_HEADS, FLASHINFER, FLEX, ONE_PASS_PER_ITEM, SDPA_CAUSAL,
                                        SDPA_DENSE, STEP04, STEP04_PER_PROMPT, STEP05, STEP06)

__all__ = ["COLOURS", "FONT", "approaches", "colour", "figures", "series_label", "shape_names", "shape_title",
           "tiles_figure", "times_figure"]


def series_label(series: str) -> str:
    """A series' legend label and table row: a step's number and name in words ("step 5: batched"), or the
    baseline's description with its steps named by number (``book.plotting.series_words``)."""
    return series_words(CHAPTER, series)


def approaches() -> list[str]:
    """The series of the ``times`` figure and of the lesson's table (``book.multi_item.lesson``), baselines and peers
    first."""
    return [SDPA_DENSE, ONE_PASS_PER_ITEM, FLEX, FLASHINFER, SDPA_CAUSAL, *(s.series for s in CHAPTER.steps[1:4]),
            STEP04_PER_PROMPT, STEP05.series]


def shape_names(results) -> list[str]:
    """The benchmark's shapes, in the order the results hold them."""
    return param_values(results, "shape")


def shape_title(shape: str) -> str:
    """A shape as a figure writes it: ``prefix 2048, 32 items × 32`` (the results file's name, with a times sign)."""
    return shape.replace(" x ", " × ")


#: Text sizes of the figures (points at the saved size): a figure wider than the page is shown scaled down to it,
#: and at these widths this keeps text of about 10 px or more there.
FONT = 10

#: One colour per series across the chapter: every figure draws a series in the same colour.
COLOURS = {
    SDPA_DENSE: "#7f7f7f",
    ONE_PASS_PER_ITEM: "#8c564b",
    FLEX: "#9467bd",
    FLASHINFER: "#d62728",
    SDPA_CAUSAL: "#17becf",
    CHAPTER.step(2).series: "#c6dbef",
    CHAPTER.step(3).series: "#9ecae1",
    STEP04.series: "#4292c6",
    STEP04_PER_PROMPT: "#4292c6",  # step 4's kernel, launched once per prompt: step 4's colour
    STEP05.series: "#08306b",
    STEP06.series: "#2ca02c",
}


def colour(series: str) -> str:
    """The chapter's colour of a series (grey for one outside :data:`COLOURS`)."""
    return COLOURS.get(series, "#bbbbbb")


def figures(results) -> dict[str, Any]:
    """``times``: every approach's time per call on each shape, against the compute floor; ``times_mixed``: the
    same on the mixed batches alone (the headline's shapes, short enough for a chapter's card); ``tiles``: the
    fraction of key tiles never loaded."""
    mixed = [shape for shape in shape_names(results) if "mixed" in shape]
    out = {"times": times_figure(results)}
    if mixed:
        out["times_mixed"] = times_figure(results, shapes=mixed)
    return out | {"tiles": tiles_figure(results)}


def _times_label(series: str) -> str:
    """The times figure's name of a series: step 5 in its default order. The figure has one bar per numbered step,
    as the steps table has one row: 5a lives in step 5's chain table only (its own run, one value on the page)."""
    return {STEP05.series: f"{series_label(STEP05.series)} (head groups, heaviest first)",
            STEP04_PER_PROMPT: f"{series_label(STEP04.series)}, a launch per prompt",
            SDPA_DENSE: f"step 1: {series_label(SDPA_DENSE)}"}.get(series, series_label(series))


def times_figure(results, columns: int = 1, shapes: list[str] | None = None):
    """One panel per benchmark shape, the grouped-query layout's included, on a grid of ``columns`` columns: a dot
    per approach the benchmark ran on that shape (step 6 included; the median, with the repetitions' range where the
    file keeps it, the value printed beside it), and the compute floor as a dashed line named in the panel's legend.
    Dots, not bars: the time axis is logarithmic (the slowest approaches take about ten times the fastest, and a
    linear axis would squash the gaps between the fast ones), where a bar's length means nothing. An approach not run
    on a shape has no row in its panel (the steps that take one prompt, step 6 outside the grouped-query layout).
    Colours from :data:`COLOURS`: step 4 launched once per prompt is step 4's kernel, in step 4's colour. One column
    by default: the panels stacked read at the page's width. ``shapes``: the panels to draw (every shape of the
    file by default)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    shapes = shapes or shape_names(results)
    wanted = approaches()
    wanted.append(STEP06.series)
    ran = {shape: [s for s in wanted if results.select(s, shape=shape)] for shape in shapes}
    rows_of_panels = -(-len(shapes) // columns)
    most = max(len(v) for v in ran.values())
    fig, axes = plt.subplots(rows_of_panels, columns, squeeze=False, layout="constrained",
                             figsize=(8.2 * columns, (0.27 * most + 1.0) * rows_of_panels + 0.6))
    for ax in axes.flat[len(shapes):]:
        ax.set_visible(False)
    for ax, shape in zip(axes.flat, shapes):
        series = ran[shape]
        mids, errs, cols = [], [[], []], []
        for s in series:
            row = results.select(s, shape=shape)[0]
            mid = row["ms"] * 1e3
            lo, _, hi = (x * 1e3 for x in row.get("spread_ms", [row["ms"]] * 3))
            mids.append(mid)
            errs[0].append(mid - lo)
            errs[1].append(hi - mid)
            cols.append(colour(s))
        floors = [r["compute_floor_ms"] * 1e3 for r in results.select(shape=shape) if "compute_floor_ms" in r]
        left = min(mids + floors[:1]) / 2  # a log axis has no zero: start at half the fastest
        ys = list(range(len(series)))
        if any(map(any, errs)):  # no error bars where the file keeps no spread
            ax.errorbar(mids, ys, xerr=errs, fmt="none", ecolor="k", elinewidth=0.8, capsize=2, zorder=2)
        ax.scatter(mids, ys, c=cols, s=55, edgecolors="k", linewidths=0.6, zorder=3)
        for mid, y in zip(mids, ys):
            ax.annotate(f"{mid:,.0f}", (mid, y), xytext=(7, 0), textcoords="offset points", va="center",
                        fontsize=FONT)
        if floors:
            ax.axvline(floors[0], color="k", ls="--", lw=1)
            ax.legend(handles=[Line2D([], [], color="k", ls="--", lw=1, label="compute floor")], fontsize=FONT,
                      loc="lower right")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        # "1k", "2k": thousands in four digits would run into each other at this panel width
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:g}k" if v >= 1000 else f"{v:,.0f}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        # room for the slowest dot's value: a fixed share of the log axis, so a narrow panel does not clip it
        ax.set_xlim(left, max(mids) * (max(mids) / left) ** 0.3)
        ax.set_title(shape_title(shape), fontsize=FONT + 1)
        ax.set_xlabel("µs per call (median, log scale)", fontsize=FONT)
        ax.grid(True, axis="x", which="both", alpha=0.3)
        ax.grid(True, axis="y", ls=":", alpha=0.5)  # a guide from each name to its dot
        ax.tick_params(labelsize=FONT)
        ax.set_yticks(ys, [_times_label(s) for s in series], fontsize=FONT)
        ax.set_ylim(len(series) - 0.4, -0.6)
    clock = results.select(STEP05.series)[0].get("clock", "do_bench")
    clock = {"gpu": "GPU"}.get(clock, clock)
    # the heads as every panel has them: a key/value head per query head, but where a panel names its KV heads
    kv = sorted({r["params"]["kv_heads"] for r in results.select() if r["params"].get("kv_heads") not in
                 (None, BENCH_HEADS)})
    grouped = f" ({', '.join(map(str, kv))} KV heads where the panel says so)" if kv else ""
    fig.suptitle(f"Time per call of every approach on {results.gpu}, bf16, {BENCH_HEADS} query heads of "
                 f"{BENCH_HEAD_DIM}\n{grouped.strip(' ()') + '; ' if grouped else ''}{clock} clock; error bars: the "
                 "repetitions' range where measured", fontsize=FONT + 1)
    fig.get_layout_engine().set(h_pad=0.2)  # room between a panel's axis label and the next one's title
    return fig


def tiles_figure(results):
    """The fraction of key tiles never loaded, per shape: causal attention, steps 4 and 5, the least any kernel
    can load at that tiling, and FlexAttention's block mask."""
    import matplotlib.pyplot as plt

    shapes = shape_names(results)
    fig, ax = plt.subplots(figsize=(8.6, 4.8))
    kinds = [("causal attention", SDPA_CAUSAL, lambda r: 1 - r["tiles_causal"] / r["tiles_total"]),
             (f"steps {STEP04.number} and {STEP05.number}", STEP05.series, lambda r: 1 - r["tiles_visited"] / r["tiles_total"]),
             ("the least any kernel must load", None, lambda r: 1 - r["tiles_needed"] / r["tiles_total"])]
    flex = [r for r in results.select(FLEX) if "flex_block_density" in r]
    if flex:  # its block mask at the block size it ran (its default, 128 x 128, before the sweep)
        kinds.append((f"{FLEX} (its {shape_title(flex[0].get('block_size', '128 x 128'))} blocks)", FLEX, None))
    width = 0.8 / len(kinds)
    for j, (kind, series, skipped) in enumerate(kinds):
        xs, ys = [], []
        for i, shape in enumerate(shapes):
            if skipped is None:  # FlexAttention's own block mask, over one prompt (a batch's is over the packed
                rows = results.select(FLEX, shape=shape)  # sequence of all prompts: not the same fraction)
                value = (1 - rows[0]["flex_block_density"] if rows and "flex_block_density" in rows[0]
                         and rows[0]["params"].get("prompts", 1) == 1 else None)
            else:
                rows = [r for r in results.select(STEP05.series, shape=shape) if "tiles_total" in r]
                value = skipped(rows[0]) if rows else None
            if value is not None:
                xs.append(i + (j - (len(kinds) - 1) / 2) * width)
                ys.append(value)
        style = {"color": colour(series)} if series else {"color": "white", "edgecolor": "k", "hatch": "//"}
        bars = ax.bar(xs, ys, width=width, label=kind, **style)
        ax.bar_label(bars, labels=[f"{y:.0%}" for y in ys], fontsize=FONT - 1)
    ax.set_xticks(range(len(shapes)), [shape_title(shape).replace(", ", ",\n", 1) for shape in shapes], fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax.set_ylim(0, 1.0)
    ax.set_ylabel("fraction of key tiles never loaded", fontsize=FONT)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=FONT, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    block = results.select(STEP05.series)[0]
    ax.set_title(f"Key tiles skipped at {block.get('block_m')}-by-{block.get('block_n')} tiles "
                 f"(steps {CHAPTER.step(2).number} and {CHAPTER.step(3).number} skip none)", fontsize=FONT + 1)
    fig.tight_layout()
    return fig
