"""Chapter 3's figures and headline, drawn from the committed benchmark JSON (what :mod:`studylog.ngram.report`
measured): no GPU needed. Colours are one per series across the chapter. The lookups the figures use (a grid
case's row, the cases a file holds, the clock of a series, the same-clock pair the headline compares) are public:
the lesson's tables in ``book.ngram.lesson`` read a file through them too."""

from __future__ import annotations

from studylog.ngram.report import CHUNK_SWEEPS, CORPORA, NO_BUDGET, SYNCED_SERIES, own_series, sweep_series

#: Colour and marker of each step's series, by step number: one colour per series across the chapter's figures.
STYLE = {1: ("#7f7f7f", "s"), 2: ("#bcbd22", "v"), 3: ("#1f77b4", "o"), 4: ("#2ca02c", "o"),
         5: ("#ff7f0e", "D"), 6: ("#d62728", "D"), 7: ("#9467bd", "*")}
#: Colours of the series that are not steps (the end-to-end series, the floor, the drafts).
OTHER_COLORS = {SYNCED_SERIES: "#17becf", "floor": "#000000", "drafted": "#c49c94", "accepted": "#8c564b"}
FONT = 9  # points, at the saved size: every label, tick and legend of the chapter's figures


def _chapter():
    from studylog.ngram import CHAPTER  # the package defines it after importing this module

    return CHAPTER


def series_color(series: str) -> str:
    """The chapter's fixed colour of a series (a step's, or one of :data:`OTHER_COLORS`)."""
    if series in OTHER_COLORS:
        return OTHER_COLORS[series]
    return STYLE[_chapter().step(series).number][0]


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


def case_label(cfg: tuple[int, int, int]) -> str:
    """A grid case as an axis label: ``32x512``, the budget on a second line when there is one."""
    b, s, t = cfg
    return f"{b}x{s}" + (f"\nbudget {t}" if t != NO_BUDGET else "")


def clock_of(results, series) -> str | None:
    """The clock ``series`` was timed on (``do_bench`` for rows older than the field), None if not in the file."""
    rows = results.select(series)
    return rows[0].get("clock", "do_bench") if rows else None


def _errorbar(ax, xs, rows, scale, **style):
    """Markers at each row's median, with error bars from its spread (min, max) where the row has one; no
    line joins them (the x positions are separate cases)."""
    ys = [r["ms"] * scale for r in rows]
    lo = [(r["ms"] - r["spread_ms"][0]) * scale if "spread_ms" in r else 0.0 for r in rows]
    hi = [(r["spread_ms"][2] - r["ms"]) * scale if "spread_ms" in r else 0.0 for r in rows]
    ax.errorbar(xs, ys, yerr=[lo, hi], ls="none", capsize=2, elinewidth=1, **style)


def caption(results) -> str:
    """The figures' footnote: the GPU, the date and the software of the run."""
    v = results.data.get("versions", {})
    return (f"Measured on {results.gpu} on {results.date} (torch {v.get('torch', '?')}); copy bandwidth "
            f"{results.data.get('ceilings', {}).get('copy_bandwidth_gbs', float('nan')):,.0f} GB/s.")


def figures(results) -> dict:
    """Every step across the grid (markers with the repetitions' spread, one per case); kernel time over the
    one-pass floor; the split sweeps of the fused kernels; and, when the file has them, the real-text cases
    (time, and drafts found and accepted)."""
    import matplotlib.pyplot as plt

    chapter = _chapter()
    configs = grid_configs(results)
    xs = list(range(len(configs)))
    figs = {}

    fig, ax = plt.subplots(figsize=(9, 5.2))
    drawn = [s for s in chapter.steps if any(grid_select(results, s.series, c) for c in configs)]
    synced = any(grid_select(results, SYNCED_SERIES, c) for c in configs)
    n_series = len(drawn) + synced
    dodge = 0.7 / max(n_series, 1)
    for k, step in enumerate(drawn):
        color, marker = STYLE[step.number]
        pts = [(i, grid_select(results, step.series, c)) for i, c in enumerate(configs)]
        pts = [(i, rows[0]) for i, rows in pts if rows]
        clock = clock_of(results, step.series)
        _errorbar(ax, [i + (k - (n_series - 1) / 2) * dodge for i, _ in pts], [r for _, r in pts], 1e3,
                  marker=marker, color=color, ms=7 if marker == "*" else 5,
                  label=f"{chapter.label(step.series)} ({clock_words(clock)})")
    if synced:
        pts = [(i, grid_select(results, SYNCED_SERIES, c)) for i, c in enumerate(configs)]
        pts = [(i, rows[0]) for i, rows in pts if rows]
        _errorbar(ax, [i + (n_series - 1) / 2 * dodge for i, _ in pts], [r for _, r in pts], 1e3, marker="*",
                  color=series_color(SYNCED_SERIES), ms=7, markeredgecolor="k", markeredgewidth=0.5,
                  label=f"{chapter.final.name}, call + sync ({clock_words(clock_of(results, SYNCED_SERIES))})")
    floors = []
    for i, c in enumerate(configs):
        rows = [r for r in results.select(corpus=None, batch=c[0], seq_len=c[1], threshold=c[2]) if "floor_ms" in r]
        if rows:
            floors.append((i, rows[0]["floor_ms"] * 1e3))
    if floors:
        ax.hlines([f for _, f in floors], [i - 0.42 for i, _ in floors], [i + 0.42 for i, _ in floors],
                  colors=series_color("floor"), linestyles="--", lw=1, label="floor: haystacks read once")
    ax.set_xticks(xs, [case_label(c) for c in configs], fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax.set_yscale("log")
    ax.set_ylabel("µs per call (median; bars: min–max)", fontsize=FONT)
    ax.set_xlabel("batch x prompt length (separate cases)", fontsize=FONT)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(fontsize=FONT, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    ax.set_title("N-gram matching: every step against the CPU path and the floor", fontsize=FONT + 1)
    fig.text(0.5, 0.005, caption(results), ha="center", fontsize=FONT)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    figs["latency"] = fig

    fig, ax = plt.subplots(figsize=(9, 4.6))
    kernel_series = [s for s in own_series() if results.select(s)]
    dodge = 0.6 / max(len(kernel_series), 1)
    for k, series in enumerate(kernel_series):
        color, marker = STYLE[chapter.step(series).number]
        pts = [(i, grid_select(results, series, c)) for i, c in enumerate(configs)]
        pts = [(i + (k - (len(kernel_series) - 1) / 2) * dodge, rows[0]["ms"] / rows[0]["floor_ms"])
               for i, rows in pts if rows and rows[0].get("floor_ms")]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ls="none", marker=marker, color=color,
                ms=8 if marker == "*" else 6, label=chapter.label(series))
    ax.axhline(1.0, color="k", lw=1, label="the floor")
    ax.axhline(1.5, color="k", lw=1, ls=":", label="1.5x the floor")
    ax.set_xticks(xs, [case_label(c) for c in configs], fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax.set_yscale("log")
    ax.set_ylabel("time / one-pass floor", fontsize=FONT)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(fontsize=FONT, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.17), frameon=False)
    ax.set_title("How far each kernel is from reading every haystack once", fontsize=FONT + 1)
    fig.text(0.5, 0.005, caption(results), ha="center", fontsize=FONT)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    figs["vs_floor"] = fig

    sweeps = [(step, results.select(sweep_series(step))) for step in CHUNK_SWEEPS]
    if any(rows for _, rows in sweeps):
        fig, ax = plt.subplots(figsize=(9, 4.4))
        dashes = ["-", "--", ":", "-."]
        for step, sweep in sweeps:
            number = int(step.__name__[4:6])
            color, marker = STYLE[number]
            cfgs = sorted({(r["params"]["batch"], r["params"]["seq_len"], r["params"]["threshold"]) for r in sweep})
            for j, cfg in enumerate(cfgs):
                rows = sorted((r for r in sweep if (r["params"]["batch"], r["params"]["seq_len"],
                                                    r["params"]["threshold"]) == cfg),
                              key=lambda r: r["params"]["chunk_len"])
                # one line per case: its points are one split varied over a numeric axis
                ax.plot([r["params"]["chunk_len"] for r in rows], [r["ms"] / r["floor_ms"] for r in rows],
                        marker=marker, color=color, ls=dashes[j % len(dashes)],
                        label=f"{step.__name__}, {case_label(cfg).replace(chr(10), ', ')}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("haystack positions per block (chunk_len)", fontsize=FONT)
        ax.set_ylabel("time / one-pass floor", fontsize=FONT)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=FONT)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        ax.set_title("Fused kernels: how finely to split each slot", fontsize=FONT + 1)
        fig.text(0.5, 0.005, caption(results), ha="center", fontsize=FONT)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        figs["chunks"] = fig

    cases = real_cases_in(results)
    if cases:
        figs["real_text"] = _real_text_figure(results, cases)
    return figs


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


def shape_label(case) -> str:
    """A real-text case's shape in words: ``32x4096, budget 128`` (or ``no budget``)."""
    _, b, s, t = case
    return f"{b}x{s}" + (f", budget {t}" if t != NO_BUDGET else ", no budget")


def _real_text_figure(results, cases):
    """Two panels over the real-text cases (each a separate category: markers and bars, no lines): the CPU path
    and step 7 end to end and step 7's GPU time; the drafts the batch got and those the true continuation
    accepts."""
    import matplotlib.pyplot as plt

    chapter = _chapter()
    order = {c: k for k, c in enumerate(CORPORA)}
    cases = sorted(cases, key=lambda c: (c[1:], order.get(c[0], 9)))
    xs = list(range(len(cases)))
    labels = [f"{c[0]}\n{shape_label(c).replace(', ', chr(10))}" for c in cases]
    fig, (ax_t, ax_d) = plt.subplots(2, 1, figsize=(9, 7.4), sharex=True)
    shown = [(chapter.steps[0].series, chapter.steps[0].name, "s"),
             (SYNCED_SERIES, f"{chapter.final.name}, call + sync", "*"),
             (chapter.final.series, chapter.final.name, "*")]
    for k, (series, name, marker) in enumerate(shown):
        rows = [(x + (k - 1) * 0.18, real_row(results, series, c)) for x, c in zip(xs, cases)]
        rows = [(x, r) for x, r in rows if r]
        if not rows:
            continue
        _errorbar(ax_t, [x for x, _ in rows], [r for _, r in rows], 1e3, marker=marker, color=series_color(series),
                  ms=8 if marker == "*" else 6, label=f"{name} ({clock_words(rows[0][1].get('clock', 'do_bench'))})")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("µs per call (median; bars: min–max)", fontsize=FONT)
    ax_t.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax_t.set_title("Real text and code against synthetic ids", fontsize=FONT + 1)
    drafts = [((real_row(results, chapter.final.series, c) or {}).get("drafts") or {}) for c in cases]
    ax_d.bar([x - 0.2 for x in xs], [d.get("drafted_tokens", float("nan")) for d in drafts], 0.4,
             color=series_color("drafted"), label="drafted")
    ax_d.bar([x + 0.2 for x in xs], [d.get("accepted_tokens", float("nan")) for d in drafts], 0.4,
             color=series_color("accepted"), label="accepted by the true continuation")
    ax_d.set_ylabel("draft tokens in the batch", fontsize=FONT)
    ax_d.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax_d.set_title("Drafts proposed, and accepted", fontsize=FONT + 1)
    for ax in (ax_t, ax_d):
        ax.tick_params(labelsize=FONT)
        ax.grid(True, axis="y", alpha=0.3)
    ax_d.set_xticks(xs, labels, fontsize=FONT)
    fig.text(0.5, 0.005, caption(results), ha="center", fontsize=FONT)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


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


def clock_words(clock: str) -> str:
    """A row's ``clock`` field in words (``GPU clock``, ``host clock, end to end``...)."""
    return {"gpu": "GPU clock", "host_e2e": "host clock, end to end", "host": "host clock",
            "do_bench": "do_bench clock"}.get(clock, f"{clock} clock")


__all__ = ["FONT", "HEADLINE_CASES", "HEADLINE_REAL_CASE", "OTHER_COLORS", "STYLE", "caption", "case_label",
           "clock_of", "clock_words", "figures", "gpu_headline", "grid_configs", "grid_select", "headline",
           "real_cases_in", "real_row", "same_clock_pair", "series_color", "shape_label"]
