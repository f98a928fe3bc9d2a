"""Chapter 5's figures, from the committed benchmark file (``assets/bench/<gpu>/ternary.json``) read on the GPU clock
through :mod:`studylog.ternary.results`: one colour per series across both lessons, legends below the panels, the
repetitions' spread where the file has it."""

from __future__ import annotations

from book.ternary.results import (BITNET_OURS, bitnet_results, failed_peer_checks, series_label, shapes_in,
                                  step_label)
from studylog.ternary.results import (BITNET, CUBLAS, FLOAT_X_SERIES, GEMLITE, INT_MM, INT_MM_MATMUL,
                                      W2A8_PLACE_SERIES, fastest, on_gpu_clock)
from studylog.ternary.steps import SERIES

__all__ = ["CARD", "EVERY_SHAPE_STEPS", "FONT", "SERIES_COLOURS", "SMALL", "W2A8_DEFAULTS", "figures", "series_colour"]

#: The card both lessons of the chapter read (its results folder): the one whose run also has BitNet's kernel and
#: the Nsight Compute profile beside ours, so that every number on a page comes from one card.
CARD = "nvidia-h200"


#: One colour per series across the chapter (figures of both lessons): the steps, the baselines and the peers.
SERIES_COLOURS = {
    CUBLAS: "#404040", "read_weights": "#a0a0a0", GEMLITE: "#8c564b", INT_MM: "#bcbd22", INT_MM_MATMUL: "#dbdb8d",
    BITNET: "#393b79",
    **dict(zip((SERIES[n] for n in (1, 2, 3, 5, 6, 7, 8, 9, 14, 17, 21, 23, 25)),
               ("#aec7e8", "#ffbb78", "#98df8a", "#1f77b4", "#ff7f0e", "#9edae5", "#c5b0d5", "#f7b6d2", "#2ca02c",
                "#17becf", "#9467bd", "#d62728", "#e377c2"))),
    # the steps that split a change out, paler or darker kin of the step they lead to
    **dict(zip((SERIES[n] for n in (4, 10, 11, 12, 13, 15, 16, 18, 19, 20, 22, 24)),
               ("#6baed6", "#a1d99b", "#74c476", "#41ab5d", "#238b45", "#9ecae1", "#4292c6", "#bcbddc", "#9e9ac8",
                "#807dba", "#c49c94", "#f4a6c8"))),
    W2A8_PLACE_SERIES["every block"]: "#ff9896", W2A8_PLACE_SERIES["staged"]: "#fdd0a2",
}
#: Text sizes of the figures (points at the saved size): the book scales a figure wider than the page down to it, and
#: at these figures' widths (about 9 to 10 inches) this keeps their smallest text at about 10 px or more there.
FONT, SMALL = 11, 10


def series_colour(series: str) -> str:
    return SERIES_COLOURS.get(series, "#7f7f7f")


def _short(series: str) -> str:
    """A legend entry: the step's name, or the baseline's or peer's short name."""
    return {CUBLAS: "cuBLAS bf16", "read_weights": "only reading the 2-bit weights", GEMLITE: "GemLite 2-bit (peer)",
            BITNET: "BitNet's W2A8 kernel (peer)", INT_MM: "torch._int_mm W8A8 (peer)", INT_MM_MATMUL: "torch._int_mm, the GEMM alone"}.get(
        series, _step_short(series))


def _step_short(series: str) -> str:
    """A step's legend entry, "step 23: W2A8, x quantised inside", with the place x is quantised where the series
    is one of step 23's other launches."""
    name, _, option = series_label(series).split(" (")[0].partition(", x quantised at quantize=")
    step = next((n for n, s in SERIES.items() if name.startswith(s + "_")), None)
    if option:  # one of step 23's other launches: the place it quantises x
        where = {"every block": "x quantised in every block", "staged": "x staged by the TMA"}.get(
            option.strip("'"), f"x quantised at {option}")
        return f"step {step}, {where}"
    return name if step is None else step_label(step)


def _ratio_err(base: dict, mine: dict):
    """(value, [low error, high error]) of the speedup base / mine, with the range over the repetitions."""
    value = base["ms"] / mine["ms"]
    if "spread_ms" in base and "spread_ms" in mine:
        lo, hi = base["spread_ms"][0] / mine["spread_ms"][2], base["spread_ms"][2] / mine["spread_ms"][0]
        return value, [value - lo, hi - value]
    return value, [0.0, 0.0]


def _own_err(base: dict, mine: dict):
    """(value, [low error, high error]) of the speedup base / mine, the range over ``base``'s repetitions alone
    (``mine`` at its median): a bar's whisker then shows the spread of the kernel the bar stands for, not of the
    kernel it is divided by, whose spread is drawn on its own bar elsewhere."""
    value = base["ms"] / mine["ms"]
    if "spread_ms" in base:
        lo, hi = base["spread_ms"][0] / mine["ms"], base["spread_ms"][2] / mine["ms"]
        return value, [value - lo, hi - value]
    return value, [0.0, 0.0]


def _bars(ax, shapes, series, value):
    """Grouped bars: for each shape, one bar a series (value(series, shape) -> (v, [lo, hi]) or None)."""
    import numpy as np

    width = 0.8 / max(1, len(series))
    for i, s in enumerate(series):
        vals, errs = [], [[], []]
        for shape in shapes:
            got = value(s, shape)
            vals.append(np.nan if got is None else got[0])
            errs[0].append(0.0 if got is None else got[1][0])
            errs[1].append(0.0 if got is None else got[1][1])
        peer = s in (GEMLITE, INT_MM, BITNET)
        spread = errs if any(e > 0 for e in errs[0] + errs[1]) else None
        ax.bar(np.arange(len(shapes)) + (i - (len(series) - 1) / 2) * width, vals, width, yerr=spread, capsize=2,
               color=series_colour(s), edgecolor="k" if peer else None, linewidth=0.3,  # solid: a failed
               # check has no bar, only a note (_mark_failed)
               error_kw={"elinewidth": 0.8}, label=_short(s))
    ax.set_xticks(range(len(shapes)), [s.replace("x", " × ") for s in shapes], rotation=25, ha="right",
                  fontsize=SMALL)
    ax.tick_params(axis="y", labelsize=SMALL)
    ax.grid(True, axis="y", alpha=0.3)


#: The colour of the note over a group of bars where a peer's output fails our float64 check (no bar is drawn for
#: that peer there: a failing output gets no ratio, as in the tables).
FAILED_EDGE = "#d62728"


def _group_top(ax, index: int) -> float:
    """The top of the ``index``-th group of grouped bars (:func:`_bars`): its tallest bar or whisker."""
    import numpy as np
    from matplotlib.container import BarContainer

    top = 0.0
    for container in ax.containers:
        if not isinstance(container, BarContainer):
            continue
        for bar in container.patches:
            if abs(bar.get_x() + bar.get_width() / 2 - index) < 0.5 and np.isfinite(bar.get_height()):
                top = max(top, bar.get_height())
        whiskers = getattr(container, "errorbar", None)
        for segment in ([] if whiskers is None else whiskers.lines[2][0].get_segments()):
            if len(segment) > 1 and abs(segment[0][0] - index) < 0.5 and np.isfinite(segment[1][1]):  # none: no bar
                top = max(top, segment[1][1])
    return top


#: The note above a group of bars in which a peer's output fails its float64 check (``{peer}``: its short name).
FAILED_NOTE = "{peer}: ✗ fails\ncheck, no ratio"


def _failed(failed, series: str, shape: str, m) -> bool:
    """Whether ``series``'s output fails its float64 check at (``shape``, ``m``) (or at every M of that shape)."""
    return (series, shape, m) in failed or (series, shape, None) in failed


def _mark_failed(ax, shapes, failed, m) -> None:
    """Note, above the shape's whole group of bars (above the group, it meets neither bar), each peer whose output
    failed its float64 check at (shape, ``m``): that peer has no bar there (its value function gives none), only
    the note. Raises the axis' top so the notes fit inside it."""
    notes: dict[int, list[str]] = {}
    for container in ax.containers:
        series = next((s for s in (GEMLITE, INT_MM) if container.get_label() == _short(s)), None)
        if series is None:
            continue
        for i, (shape, bar) in enumerate(zip(shapes, container.patches)):
            if _failed(failed, series, shape, m):
                notes.setdefault(i, []).append(_short(series).split(" ")[0])
    if not notes:
        return
    highest = 0.0
    for i, peers in notes.items():
        top = _group_top(ax, i)
        highest = max(highest, top)
        ax.annotate(FAILED_NOTE.format(peer=" and ".join(peers)), (i, top), xytext=(0, 4),
                    textcoords="offset points", ha="center", va="bottom", color=FAILED_EDGE, fontsize=SMALL - 1)
    # room above the highest note: two lines of text and the offset, as a share of the panel's height (about
    # 2 inches once laid out), so the top of the axis is at least (highest - share * bottom) / (1 - share)
    share = (2.6 * (SMALL - 1) + 4) / (2.0 * 72)
    bottom, top = ax.get_ylim()
    ax.set_ylim(bottom, max(top, (highest - share * bottom) / (1 - share)))


def _wrap(fig, text: str) -> str:
    import textwrap

    width = int(fig.get_size_inches()[0] * 13)
    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


def _head(fig, text: str) -> None:
    """What a figure's marks mean, at its top, wrapped to its width."""
    fig.text(0.5, 0.995, _wrap(fig, text), ha="center", va="top", fontsize=SMALL - 1)


def _foot(fig, caption: str) -> None:
    """The run's caption (``Measured on ...``) at the bottom of a figure, under its legend, as in the other
    chapters' figures."""
    fig.text(0.5, 0.005, _wrap(fig, caption), ha="center", va="bottom", fontsize=SMALL - 1, color="#444444")


#: Where a legend below the panels sits (figure fraction of its bottom edge): above the caption (:func:`_foot`).
LEGEND_Y = 0.05


def _legend_below(fig, axes, ncol=3, y=LEGEND_Y):
    handles, labels = {}, {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=SMALL,
               frameon=False, bbox_to_anchor=(0.5, y))


#: The W2A8 kernel a peer's bar divides by: step 23, the kernel `W2A8Plan` runs at every M, as the result table
#: pairs it (the tried steps 24 and 25 are the steps section's).
W2A8_DEFAULTS = [SERIES[23]]


#: How a peer's time whose output fails our float64 check is drawn in the steps figure (a red cross instead of a
#: dot), and its legend entry.
FAILED_MARKER = "X"


#: Part 1's Triton steps that the benchmark times at every Llama shape and one row of x (the steps figure); the
#: others (4, the AND decode, and 10 to 13, each one change on the way to 14) are timed at the steps table's cases.
EVERY_SHAPE_STEPS = (1, 2, 3, 5, 6, 7, 8, 9, 14)
#: Steps timed only at the steps table's cases that the steps figure draws anyway, in their panel alone: step 4
#: and step 13 (the second-largest gain of part 1).
MAIN_SHAPE_STEPS = (4, 13)


def _ranges(numbers) -> str:
    """Numbers in words, runs as ranges: [4, 10, 11, 12, 13] -> "4 and 10 to 13"."""
    runs = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    words = [str(a) if a == b else f"{a} and {b}" if b == a + 1 else f"{a} to {b}" for a, b in runs]
    return ", ".join(words[:-1]) + (" and " if len(words) > 1 else "") + (words[-1] if words else "")


def _steps_dots(view, shapes, series, failed, card: str, caption: str, title: str | None = None, columns: int = 3):
    """Part 1's steps figure: one panel a shape, one row a kernel (cuBLAS, the Triton steps timed at every Llama
    shape, :data:`EVERY_SHAPE_STEPS`, labelled "step N: what it is", GemLite), its median GPU
    time as a dot on a linear axis that starts at zero (whiskers: the repetitions' range) and the value written
    right of its range, clear of the whisker; cuBLAS's time a dashed line across the panel; a peer whose output fails our float64 check at that
    shape and one row drawn as a red cross, with one legend entry. ``title``: the figure's (the Llama shapes' by
    default); ``columns``: panels a row."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    columns = min(columns, len(shapes))
    grid = -(-len(shapes) // columns)
    fig, axes = plt.subplots(grid, columns, figsize=(2.6 * columns + 1.8, (0.42 * len(series) + 0.6) * grid + 1.4),
                             sharey=True, squeeze=False)
    for ax in axes.flat[len(shapes):]:
        ax.set_visible(False)
    rows = list(range(len(series)))[::-1]  # cuBLAS on top, GemLite at the bottom
    marked = False
    for ax, shape in zip(axes.flat, shapes):
        top = 0.0
        for y, s in zip(rows, series):
            got = view.select(s, shape=shape, m=1)
            if not got:
                continue
            r = got[0]
            t = r["ms"] * 1e3
            lo, hi = ((r["spread_ms"][0] * 1e3, r["spread_ms"][2] * 1e3) if "spread_ms" in r else (t, t))
            top = max(top, hi)
            fails = (s, shape, 1) in failed or (s, shape, None) in failed
            ax.plot([lo, hi], [y, y], color=series_colour(s), lw=1.2)
            ax.plot([t], [y], marker=FAILED_MARKER if fails else "o", ms=8 if fails else 7, linestyle="none",
                    color=FAILED_EDGE if fails else series_colour(s), markeredgecolor=FAILED_EDGE if fails else "k",
                    markeredgewidth=0.6)
            ax.annotate(f"{t:.1f}", (max(hi, t), y), xytext=(7, 0), textcoords="offset points", ha="left",
                        va="center", fontsize=SMALL - 1, color=FAILED_EDGE if fails else "k",
                        bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.9))  # right of its range
            marked = marked or fails
            if s == CUBLAS:
                ax.axvline(t, color=series_colour(CUBLAS), lw=0.8, ls="--", zorder=0)
        ax.set_xlim(0, top * 1.3)  # room for the values written right of their ranges
        ax.set_title(shape.replace("x", " × "), fontsize=FONT)
        ax.set_xlabel("GPU time (µs, median)", fontsize=SMALL)
        ax.tick_params(labelsize=SMALL)
        ax.grid(True, axis="x", alpha=0.3)
    axes[0, 0].set_yticks(rows, [_short(s) for s in series], fontsize=SMALL)
    axes[0, 0].set_ylim(-0.7, len(series) - 0.3)
    for ax in axes[1:, 0]:
        ax.tick_params(labelleft=True)
    handles = [Line2D([], [], color=series_colour(CUBLAS), lw=0.8, ls="--", label="cuBLAS bf16's time")]
    if marked:
        handles.append(Line2D([], [], marker=FAILED_MARKER, color=FAILED_EDGE, linestyle="none", ms=8,
                              label="GemLite's output fails our float64 check there"))
    drawn = [n for n in range(1, 15) if SERIES[n] in series]
    one = _ranges([n for n in drawn if n not in EVERY_SHAPE_STEPS])
    left = _ranges([n for n in range(1, 15) if n not in drawn])
    where = [s for s in shapes if any(view.select(SERIES[n], shape=s, m=1) for n in drawn if n not in EVERY_SHAPE_STEPS)]
    notes = ([f"step{'s' if ' ' in one else ''} {one}: timed at {' and '.join(s.replace('x', ' × ') for s in where)} "
              "only"] if one else []) \
        + ([f"step{'s' if ' ' in left else ''} {left}: only in the steps table"] if left else [])
    fig.suptitle(title or f"{card}, one row of x (M = 1): the Triton steps timed at every Llama shape"
                 + (f"\n({'; '.join(notes)})" if notes else ""), fontsize=FONT + 1)
    _foot(fig, caption)
    height = fig.get_figheight()  # the caption's lines, then the legend, under the panels (in inches)
    fig.tight_layout(rect=(0, 1.1 / height, 1, 1))
    fig.legend(handles=handles, loc="lower center", ncol=1, fontsize=SMALL, frameon=False,
               bbox_to_anchor=(0.5, 0.42 / height))
    return fig


def figures(results, bitnet=None) -> dict:
    """GPU clock, one colour per series (:data:`SERIES_COLOURS`), legends below the panels, spread where the file
    has it, the card in every title. speedup: M = 1, speedup over cuBLAS bf16 per shape; speedup_batched: the same
    at M = 16 and 128; floor: M = 1, time over the 2-bit floor; steps: M = 1, the time of part 1's Triton steps
    timed at every Llama shape (:data:`EVERY_SHAPE_STEPS`) beside cuBLAS and GemLite, dots on linear axes (:func:`_steps_dots`); peers: our fastest over GemLite and torch._int_mm, and
    with ``bitnet`` (the run with BitNet's kernel beside ours, ``Results``) a first panel of BitNet's W2A8 kernel
    over step 23 (the one-row W2A8 kernel) of that same run at its shapes, M = 1 (then the M = 128 panel is left out)."""
    import matplotlib.pyplot as plt

    view = on_gpu_clock(results)
    shapes = shapes_in(view)
    ms_present = sorted({r["params"]["m"] for r in view.rows if "m" in r["params"]})
    caption = results.caption()
    card = results.gpu.replace("NVIDIA ", "")
    figs = {}

    def speedup(m):
        def value(s, shape):
            base, mine = view.select(CUBLAS, shape=shape, m=m), view.select(s, shape=shape, m=m)
            return _ratio_err(base[0], mine[0]) if base and mine else None
        return value

    def panel_series(m):
        wanted = [SERIES[n] for n in ((5, 7, 14, 17, 21, 23, 25) if m == 1 else (6, 8, 9, 14, 17, 21, 23, 25))]
        return [s for s in wanted + [GEMLITE, INT_MM] if view.select(s, m=m)]

    if 1 in ms_present and view.select(CUBLAS, m=1):
        series = panel_series(1)
        fig, ax = plt.subplots(figsize=(9, 5.2))
        _bars(ax, shapes, series, speedup(1))
        ax.axhline(1.0, color="k", lw=1)
        ax.set_ylabel("speedup over cuBLAS bf16 (GPU clock)", fontsize=FONT)
        ax.set_title(f"{card}, one row of x (M = 1): each kernel's speedup over cuBLAS bf16", fontsize=FONT + 1)
        _foot(fig, caption)
        fig.tight_layout(rect=(0, 0.22, 1, 1))
        _legend_below(fig, [ax], ncol=3)
        figs["speedup"] = fig

    batched = [m for m in ms_present if m > 1 and view.select(CUBLAS, m=m)][:3]
    if batched:
        fig, axes = plt.subplots(1, len(batched), figsize=(max(9.0, 4.3 * len(batched) + 0.5), 5.6), squeeze=False)
        for ax, m in zip(axes[0], batched):
            _bars(ax, shapes, panel_series(m), speedup(m))
            ax.axhline(1.0, color="k", lw=1)
            ax.set_ylabel("speedup over cuBLAS bf16 (GPU clock)", fontsize=FONT)
            ax.set_title(f"{card}, M = {m} rows of x", fontsize=FONT + 1)
        _foot(fig, caption)
        fig.tight_layout(rect=(0, 0.24, 1, 1))
        _legend_below(fig, list(axes[0]), ncol=3)
        figs["speedup_batched"] = fig

    floor_series = [s for s in [SERIES[n] for n in (5, 7, 14, 17, 21, 23, 25)] + ["read_weights", GEMLITE, CUBLAS]
                    if any("floor_ms" in r for r in view.select(s, m=1))]
    if floor_series:
        def over_floor(s, shape):
            rows = [r for r in view.select(s, shape=shape, m=1) if "floor_ms" in r]
            floor = next((r["floor_ms"] for r in view.select(SERIES[21], shape=shape, m=1) if "floor_ms" in r), None)
            floor = floor or next((r["floor_ms"] for r in view.select("read_weights", shape=shape, m=1)), None)
            if not rows or not floor:
                return None
            r = rows[0]
            lo_hi = [(r["ms"] - r["spread_ms"][0]) / floor, (r["spread_ms"][2] - r["ms"]) / floor] \
                if "spread_ms" in r else [0.0, 0.0]
            return r["ms"] / floor, lo_hi
        shown = [s for s in floor_series if s != CUBLAS]
        fig, ax = plt.subplots(figsize=(9, 5.2))
        _bars(ax, shapes, shown, over_floor)
        ax.axhline(1.0, color="k", lw=1, label="the 2-bit floor")
        ax.set_ylabel("GPU time / 2-bit bandwidth floor", fontsize=FONT)
        ax.set_title(f"{card}, one row of x (M = 1): time over the 2-bit floor (bytes / copy bandwidth)",
                     fontsize=FONT + 1)
        _foot(fig, caption)
        fig.tight_layout(rect=(0, 0.22, 1, 1))
        _legend_below(fig, [ax], ncol=3)
        figs["floor"] = fig

    llama = [s for s in shapes if view.select(CUBLAS, shape=s, family="llama", m=1)]
    steps = [s for s in [CUBLAS] + [SERIES[n] for n in EVERY_SHAPE_STEPS] + [GEMLITE] if view.select(s, m=1)]
    drawn = [s for s in [CUBLAS] + [SERIES[n] for n in sorted(EVERY_SHAPE_STEPS + MAIN_SHAPE_STEPS)] + [GEMLITE]
             if view.select(s, m=1)]
    if llama and steps:
        figs["steps"] = _steps_dots(view, llama, drawn, failed_peer_checks(results.data), card, caption)
    # the same at BitNet b1.58's shapes where GemLite's output passes our check (three at most: a figure's panels)
    failed = failed_peer_checks(results.data)
    bit = [s for s in shapes if view.select(GEMLITE, shape=s, family="bitnet", m=1)
           and (GEMLITE, s, 1) not in failed and (GEMLITE, s, None) not in failed][:3]
    bit_steps = [s for s in steps if any(view.select(s, shape=b, m=1) for b in bit)]
    if bit and bit_steps:
        timed = [n for n in EVERY_SHAPE_STEPS if SERIES[n] in bit_steps]
        figs["steps_bitnet"] = _steps_dots(
            view, bit, bit_steps, failed, card, caption,
            title=f"{card}, one row of x (M = 1): the Triton steps at BitNet b1.58's shapes where GemLite passes "
                  f"our check\n(steps {_ranges(timed)}; the others only at the Llama shapes or in the steps table)")

    peer_ms = [m for m in ms_present if view.select(GEMLITE, m=m) or view.select(INT_MM, m=m)][:3]
    bitnet = bitnet if bitnet is not None else bitnet_results(results)
    bit_view = None if bitnet is None else on_gpu_clock(bitnet)
    if bit_view is not None and not bit_view.select(BITNET, m=1):
        bit_view = None
    if bit_view is not None:
        peer_ms = peer_ms[:2]  # three panels at most: BitNet's, M = 1 and M = 16
    if peer_ms:
        failed = failed_peer_checks(results.data)
        panels = len(peer_ms) + (bit_view is not None)
        height = 3.3 * panels + 1.6  # one panel per M, stacked so the figure reads at page width
        fig, axes = plt.subplots(panels, 1, figsize=(9, height), squeeze=False)
        if bit_view is not None:
            _bitnet_panel(axes[0, 0], bit_view, card, bitnet.data.get("quick"))
        for ax, m in zip(axes[int(bit_view is not None):, 0], peer_ms):
            def over_peer(peer, shape, m=m):
                ours = W2A8_DEFAULTS if peer == INT_MM else FLOAT_X_SERIES
                if _failed(failed, peer, shape, m):
                    return None  # a failing output gets no ratio: no bar, a note (_mark_failed)
                p = view.select(peer, shape=shape, m=m)
                row, _ = fastest(view, ours, shape=shape, m=m)
                return _own_err(p[0], row) if p and row is not None else None
            timed = [s for s in shapes if any(view.select(p, shape=s, m=m) for p in (GEMLITE, INT_MM))]
            _bars(ax, timed, [CUBLAS, GEMLITE, INT_MM], over_peer)
            _mark_failed(ax, timed, failed, m)
            ax.axhline(1.0, color="k", lw=1)
            ax.set_ylabel("peer's time / our fastest's (GPU clock)", fontsize=FONT)
            ax.set_title(f"{card}, M = {m}", fontsize=FONT + 1)
        _head(fig, "The rival's time over ours: step 23's against BitNet's kernel and torch._int_mm, our fastest bf16-x"
                   " kernel's against GemLite and cuBLAS (below 1:"
              " the rival is faster; no bar: not run there, or, under a red ✗ note, the rival's output fails our float64"
              " check, so no ratio; whiskers: the rival's repetitions)" if bit_view is not None else
              "The rival's time over our fastest kernel's (below 1: the rival is faster; no bar: not run there, or, under"
              " a red ✗ note, the rival's output fails our float64 check, so no ratio; whiskers: the rival's"
              " repetitions)")
        _foot(fig, caption)
        fig.tight_layout(rect=(0, 1.2 / height, 1, 1 - 0.8 / height))
        _legend_below(fig, list(axes[:, 0]), ncol=2, y=0.45 / height)
        figs["peers"] = fig
    if bit_view is not None:  # the chapter's headline alone: the landing page's figure
        fig, ax = plt.subplots(figsize=(9, 4.6))
        _bitnet_panel(ax, bit_view, card, bitnet.data.get("quick"))
        _head(fig, "BitNet's W2A8 kernel's time over step 23's (above 1: step 23 is faster; whiskers: BitNet's "
              "repetitions)")
        _foot(fig, bitnet.caption())
        fig.tight_layout(rect=(0, 0.08, 1, 0.9))
        figs["bitnet"] = fig
    return figs


def _bitnet_panel(ax, bit_view, card: str, quick: bool) -> None:
    """BitNet's W2A8 kernel's time over step 23's (the one-row W2A8 kernel), M = 1, at the shapes it is built for."""
    bit_shapes = [s for s in shapes_in(bit_view) if bit_view.select(BITNET, shape=s, m=1)]

    def over_bitnet(peer, shape):
        p = bit_view.select(peer, shape=shape, m=1)
        row, _ = fastest(bit_view, (BITNET_OURS,), shape=shape, m=1)
        return _own_err(p[0], row) if p and row is not None else None
    _bars(ax, bit_shapes, [BITNET], over_bitnet)
    ax.axhline(1.0, color="k", lw=1)
    ax.set_ylabel("BitNet's time / step 23's", fontsize=FONT)
    apart = "; a separate run on the same card" if quick else ""
    ax.set_title(f"{card}, M = 1, the {len(bit_shapes)} shapes BitNet's kernel is built for (W2A8, both{apart})",
                 fontsize=FONT + 1)
