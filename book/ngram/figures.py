"""Chapter 3's figures, drawn from the committed benchmark JSON through the lookups of :mod:`book.ngram.results`:
no GPU needed. Colours are one per series across the chapter; the labels of the cases and the clocks are the
lesson's tables' too (``book.ngram.lesson``)."""

from __future__ import annotations

from book.plotting import step_words
from book.ngram.results import (clock_of, floor_of, grid_configs, grid_select, own_series, real_cases_in, real_row,
                                row_bytes)
from studylog.ngram import CHAPTER
from studylog.ngram.report import CHUNK_SWEEPS, CORPORA, NO_BUDGET, SYNCED_SERIES, SYNCED_STEP, sweep_series

#: Colour and marker of each step's series, by step number: one colour per series across the chapter's figures (the
#: star is the entry point's alone).
STYLE = {1: ("#7f7f7f", "s"), 2: ("#bcbd22", "v"), 3: ("#1f77b4", "o"), 4: ("#2ca02c", "o"),
         5: ("#ff7f0e", "D"), 6: ("#e377c2", "D"), 7: ("#8c564b", "P"), 8: ("#d62728", "D"), 9: ("#ff9896", "^"),
         10: ("#98df8a", "^"), 11: ("#c5b0d5", "^"), 12: ("#9467bd", "X")}
#: Colours of the series that are not steps (the end-to-end series, the floor, the drafts).
OTHER_COLORS = {SYNCED_SERIES: "#17becf", "floor": "#000000", "drafted": "#c49c94", "accepted": "#7b4173"}
#: Points, at the saved size: every label, tick and legend of the chapter's figures. The book scales a figure wider
#: than its page down to it; at this size and these widths text stays about 10 px or more on the page.
FONT = 10
#: The steps the figure of times per case draws beside the entry point (the two tables of steps have them all): the
#: deployed CPU path, the pull request's kernel ported and corrected, the first one-pass kernel, and step 6, where the two paths
#: start (the panel below reads each path's last step against it).
FIGURE_STEPS = (1, 3, 4, 5, 6)
#: The last step of each path from step 6 (long haystacks under a budget: 8 to 12; the main line: 7), drawn against
#: step 6 in the figure's second panel.
PATH_ENDS = (12, 7)
#: The colour of the entry point ``ngram_match`` (the steps keep theirs).
ENTRY_COLOR = "#000080"


def _entry_gpu_row(results, cfg: tuple[int, int, int]) -> dict | None:
    """The entry point's GPU-clock row at grid case ``cfg``, or None where the file has none."""
    rows = [r for r in grid_select(results, "ngram_match", cfg) if r.get("clock") == "gpu"]
    return rows[0] if rows else None


def series_color(series: str) -> str:
    """The chapter's fixed colour of a series (a step's, or one of :data:`OTHER_COLORS`)."""
    if series in OTHER_COLORS:
        return OTHER_COLORS[series]
    return STYLE[CHAPTER.step(series).number][0]


def case_label(cfg: tuple[int, int, int]) -> str:
    """A grid case as an axis label: ``32 × 512``, the budget on a second line when there is one."""
    b, s, t = cfg
    return f"{b} × {s}" + (f"\nbudget {t}" if t != NO_BUDGET else "")


def shape_label(case) -> str:
    """A real-text case's shape in words: ``32 × 4096, budget 128`` (or ``no budget``)."""
    _, b, s, t = case
    return f"{b} × {s}" + (f", budget {t}" if t != NO_BUDGET else ", no budget")


def clock_words(clock: str) -> str:
    """A row's ``clock`` field in words (``GPU clock``, ``host clock, end to end``...)."""
    return {"gpu": "GPU clock", "host_e2e": "host clock, end to end", "host": "host clock",
            "do_bench": "do_bench clock"}.get(clock, f"{clock} clock")


def caption(results) -> str:
    """The figures' footnote: the GPU, the date and the software of the run."""
    v = results.data.get("versions", {})
    return (f"Measured on {results.gpu} on {results.date} (torch {v.get('torch', '?')}); copy bandwidth "
            f"{results.data.get('ceilings', {}).get('copy_bandwidth_gbs', float('nan')):,.0f} GB/s.")


def floor_ms(results, cfg: tuple[int, int, int]) -> float | None:
    """The floor of a grid case in ms, the table of steps' (:func:`book.ngram.lesson.table_floor_us`): the book's
    (:func:`book.ngram.results.floor_of`: the active slots' haystacks read once at the copy bandwidth, or the card's
    fastest empty kernel where that is larger), but under a budget that lets fewer slots search, only theirs; None
    without one."""
    from book.ngram.lesson import table_floor_us

    rows = [r for r in results.select(corpus=None, batch=cfg[0], seq_len=cfg[1], threshold=cfg[2])
            if row_bytes(results, r) is not None]
    if not rows:
        return None
    us = table_floor_us(results, cfg)
    return floor_of(results, rows[0]) if us is None else us / 1e3


def _errorbar(ax, xs, rows, scale, **style):
    """Markers at each row's median, with error bars from its spread (min, max) where the row has one; no
    line joins them (the x positions are separate cases)."""
    ys = [r["ms"] * scale for r in rows]
    lo = [(r["ms"] - r["spread_ms"][0]) * scale if "spread_ms" in r else 0.0 for r in rows]
    hi = [(r["spread_ms"][2] - r["ms"]) * scale if "spread_ms" in r else 0.0 for r in rows]
    ax.errorbar(xs, ys, yerr=[lo, hi], ls="none", capsize=2, elinewidth=1, **style)


def figures(results) -> dict:
    """Every step across the grid (markers with the repetitions' spread, one per case); kernel time over the
    one-pass floor; the split sweeps of the fused kernels; and, when the file has them, the real-text cases
    (time, and drafts found and accepted)."""
    import matplotlib.pyplot as plt

    configs = grid_configs(results)
    xs = list(range(len(configs)))
    figs = {}

    # two panels: the times on a log axis (the CPU path, the ported rivals, steps 5 and 6, the entry point, the
    # floor), then the two paths' last steps against step 6 on a linear axis, where a few percent can be read; one
    # legend under both
    fig, (ax, ax_p) = plt.subplots(2, 1, figsize=(9, 8.2), sharex=True, gridspec_kw={"height_ratios": [3, 1.5]})
    drawn = [CHAPTER.step(n) for n in FIGURE_STEPS
             if any(grid_select(results, CHAPTER.step(n).series, c) for c in configs)]
    entry = [(i, _entry_gpu_row(results, c)) for i, c in enumerate(configs)]
    entry = [(i, r) for i, r in entry if r]
    synced = any(grid_select(results, SYNCED_SERIES, c) for c in configs)
    n_series = len(drawn) + bool(entry) + synced
    dodge = 0.7 / max(n_series, 1)
    offset = lambda k: (k - (n_series - 1) / 2) * dodge  # noqa: E731  (the k-th series' place beside its case)
    for k, step in enumerate(drawn):
        color, marker = STYLE[step.number]
        pts = [(i, grid_select(results, step.series, c)) for i, c in enumerate(configs)]
        pts = [(i, rows[0]) for i, rows in pts if rows]
        clock = clock_of(results, step.series)
        host = {} if clock == "gpu" else dict(mfc="none", mew=1.2)  # a host-clock point is drawn open
        _errorbar(ax, [i + offset(k) for i, _ in pts], [r for _, r in pts], 1e3, marker=marker, color=color, ms=6,
                  label=step_words(step) + ("" if clock == "gpu" else " (host clock)"), **host)
    if entry:
        _errorbar(ax, [i + offset(len(drawn)) for i, _ in entry], [r for _, r in entry], 1e3, marker="*",
                  color=ENTRY_COLOR, ms=9, label="ngram_match: step 7 or 12, by its rule")
    if synced:
        pts = [(i, grid_select(results, SYNCED_SERIES, c)) for i, c in enumerate(configs)]
        pts = [(i, rows[0]) for i, rows in pts if rows]
        _errorbar(ax, [i + offset(n_series - 1) for i, _ in pts], [r for _, r in pts], 1e3, marker="h",
                  color=series_color(SYNCED_SERIES), ms=8, mfc="none", markeredgewidth=1.2,
                  label=f"step {SYNCED_STEP}'s own function, call + sync (host clock; not ngram_match)")
    floors = []
    for i, c in enumerate(configs):
        floor = floor_ms(results, c)
        if floor is not None:
            floors.append((i, floor * 1e3))
    if floors:
        ax.hlines([f for _, f in floors], [i - 0.42 for i, _ in floors], [i + 0.42 for i, _ in floors],
                  colors=series_color("floor"), linestyles="--", lw=1,
                  label="floor: the searching slots' haystacks read once, or an empty kernel")
    ax.tick_params(labelsize=FONT)
    ax.set_yscale("log")
    ax.set_ylabel("µs per call\n(GPU clock; open: host)", fontsize=FONT)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.set_title("N-gram matching: the entry point, its rivals and the floor; below, the two paths' last steps",
                 fontsize=FONT + 1)
    # below: step 6's time over each path's last step, one marker per case, side by side
    for k, number in enumerate(PATH_ENDS):
        color, marker = STYLE[number]
        pts = []
        for i, c in enumerate(configs):
            six, row = (grid_select(results, CHAPTER.step(n).series, c) for n in (6, number))
            if six and row and clock_of(results, CHAPTER.step(number).series) == "gpu":
                pts.append((i + (k - (len(PATH_ENDS) - 1) / 2) * 0.3, six[0]["ms"] / row[0]["ms"]))
        ax_p.plot([x for x, _ in pts], [y for _, y in pts], ls="none", marker=marker, color=color, ms=8,
                  label=f"{step_words(CHAPTER.step(number))}: step 6's time ÷ its time")
    ax_p.axhline(1.0, color="k", lw=1)
    ax_p.set_ylabel("× step 6\n(above 1: faster)", fontsize=FONT)
    ax_p.grid(True, which="major", axis="y", alpha=0.3)
    ax_p.tick_params(labelsize=FONT)
    ax_p.set_xticks(xs, [case_label(c) for c in configs], fontsize=FONT, rotation=30, ha="right")
    ax_p.set_xlabel("batch × prompt length (separate cases)", fontsize=FONT)
    fig.tight_layout(rect=(0, 0.19, 1, 1))
    handles, labels = (sum(pair, []) for pair in zip(*(a.get_legend_handles_labels() for a in (ax, ax_p))))
    fig.legend(handles, labels, fontsize=FONT, loc="upper center", bbox_to_anchor=(0.5, 0.185), ncol=2,
               frameon=False)
    fig.text(0.5, 0.005, caption(results), ha="center", fontsize=FONT)
    figs["latency"] = fig

    fig, ax = plt.subplots(figsize=(9, 4.6))
    kernel_series = [s for s in own_series() if results.select(s)]
    dodge = 0.6 / max(len(kernel_series), 1)
    for k, series in enumerate(kernel_series):
        color, marker = STYLE[CHAPTER.step(series).number]
        pts = [(i, grid_select(results, series, c)) for i, c in enumerate(configs)]
        pts = [(i + (k - (len(kernel_series) - 1) / 2) * dodge, rows[0]["ms"] / floor_of(results, rows[0]))
               for i, rows in pts if rows and floor_of(results, rows[0])]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ls="none", marker=marker, color=color,
                ms=8 if marker == "*" else 6, label=step_words(CHAPTER.step(series)))
    ax.axhline(1.0, color="k", lw=1, label="the floor")
    ax.axhline(1.5, color="k", lw=1, ls=":", label="1.5× the floor")
    ax.set_xticks(xs, [case_label(c) for c in configs], fontsize=FONT, rotation=30, ha="right")
    ax.tick_params(labelsize=FONT)
    ax.set_yscale("log")
    ax.set_ylabel("time / floor (bytes, or an empty kernel)", fontsize=FONT)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(fontsize=FONT, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.36), frameon=False)
    ax.set_title("How far each kernel is from reading every haystack once", fontsize=FONT + 1)
    fig.text(0.5, 0.005, caption(results), ha="center", fontsize=FONT)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    figs["vs_floor"] = fig

    sweeps = [(step, results.select(sweep_series(step))) for step in CHUNK_SWEEPS]
    if any(rows for _, rows in sweeps):
        fig, ax = plt.subplots(figsize=(9, 4.4))
        dashes, case_markers = ["-", "--", ":", "-."], ["o", "s", "^", "D"]  # a case: its dashes and marker
        for step, sweep in sweeps:
            number = int(step.__name__[4:6])
            color = STYLE[number][0]
            cfgs = sorted({(r["params"]["batch"], r["params"]["seq_len"], r["params"]["threshold"]) for r in sweep})
            for j, cfg in enumerate(cfgs):
                rows = sorted((r for r in sweep if (r["params"]["batch"], r["params"]["seq_len"],
                                                    r["params"]["threshold"]) == cfg),
                              key=lambda r: r["params"]["chunk_len"])
                # one line per case: its points are one split varied over a numeric axis
                ax.plot([r["params"]["chunk_len"] for r in rows], [r["ms"] / floor_of(results, r) for r in rows],
                        marker=case_markers[j % len(case_markers)], color=color, ls=dashes[j % len(dashes)],
                        label=f"{step_words(CHAPTER.step(number))}, {case_label(cfg).replace(chr(10), ', ')}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("haystack positions per block (chunk_len)", fontsize=FONT)
        ax.set_ylabel("time / floor (bytes, or an empty kernel)", fontsize=FONT)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=FONT)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, handlelength=4)
        ax.set_title("Fused kernels: how finely to split each slot", fontsize=FONT + 1)
        fig.text(0.5, 0.005, caption(results), ha="center", fontsize=FONT)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        figs["chunks"] = fig

    cases = real_cases_in(results)
    if cases:
        figs["real_text"] = _real_text_figure(results, cases)
    return figs


def _real_text_figure(results, cases):
    """Two panels over the real-text cases (each a separate category: markers and bars, no lines): the CPU path
    and step 12 end to end and step 12's GPU time; the drafts the batch got and those the true continuation
    accepts."""
    import matplotlib.pyplot as plt

    order = {c: k for k, c in enumerate(CORPORA)}
    cases = sorted(cases, key=lambda c: (c[1:], order.get(c[0], 9)))
    xs = list(range(len(cases)))
    fig, (ax_t, ax_d) = plt.subplots(2, 1, figsize=(9, 7.4), sharex=True)
    synced = step_words(CHAPTER.step(SYNCED_STEP))
    shown = [(CHAPTER.steps[0].series, step_words(CHAPTER.steps[0]), "s"),
             (SYNCED_SERIES, f"{synced}, call + sync", "*"), (CHAPTER.step(SYNCED_STEP).series, synced, "*")]
    for k, (series, name, marker) in enumerate(shown):
        rows = [(x + (k - 1) * 0.18, real_row(results, series, c)) for x, c in zip(xs, cases)]
        rows = [(x, r) for x, r in rows if r]
        if not rows:
            continue
        _errorbar(ax_t, [x for x, _ in rows], [r for _, r in rows], 1e3, marker=marker, color=series_color(series),
                  ms=8 if marker == "*" else 6, label=f"{name} ({clock_words(rows[0][1].get('clock', 'do_bench'))})")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("µs per call (median; bars: min–max)", fontsize=FONT)
    ax_t.set_title("Real text and code against synthetic ids", fontsize=FONT + 1)
    drafts = [((real_row(results, CHAPTER.step(SYNCED_STEP).series, c) or {}).get("drafts") or {}) for c in cases]
    ax_d.bar([x - 0.2 for x in xs], [d.get("drafted_tokens", float("nan")) for d in drafts], 0.4,
             color=series_color("drafted"), label="drafted")
    ax_d.bar([x + 0.2 for x in xs], [d.get("accepted_tokens", float("nan")) for d in drafts], 0.4,
             color=series_color("accepted"), label="accepted by the true continuation")
    ax_d.set_ylabel("draft tokens in the batch", fontsize=FONT)
    ax_d.set_title("Drafts proposed, and accepted", fontsize=FONT + 1)
    for ax in (ax_t, ax_d):
        ax.tick_params(labelsize=FONT)
        ax.grid(True, axis="y", alpha=0.3)
    # one tick per corpus; the shape once per group of cases below the ticks, groups parted by a line
    ax_d.set_xticks(xs, [c[0] for c in cases], fontsize=FONT)
    groups: dict[tuple, list[int]] = {}
    for x, c in zip(xs, cases):
        groups.setdefault(c[1:], []).append(x)
    for k, (shape, members) in enumerate(groups.items()):
        ax_d.annotate(shape_label(("",) + shape), xy=(sum(members) / len(members), 0),
                      xycoords=("data", "axes fraction"),
                      xytext=(0, -2.4 * FONT), textcoords="offset points", ha="center", va="top", fontsize=FONT)
        if k:
            for ax in (ax_t, ax_d):
                ax.axvline(members[0] - 0.5, color="#999999", lw=0.8)
    # one legend under both panels, so the panels take the figure's whole width and the groups spread out
    handles, labels = (sum(pair, []) for pair in zip(*(ax.get_legend_handles_labels() for ax in (ax_t, ax_d))))
    fig.legend(handles, labels, fontsize=FONT, loc="lower center", bbox_to_anchor=(0.5, 0.03), ncol=2, frameon=False)
    fig.text(0.5, 0.005, caption(results), ha="center", fontsize=FONT)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    return fig


__all__ = ["FONT", "OTHER_COLORS", "STYLE", "caption", "case_label", "clock_words", "figures", "floor_ms",
           "series_color", "shape_label"]
