"""Chapter 7's figures, drawn from a results file (the committed JSON, or an earlier run kept in ``lab/decode``)
through :mod:`studylog.decode.report`'s readings: where each configuration's time per output token goes, and each
schema's speedup of steps 2 and 3 over step 1."""

from __future__ import annotations

from typing import Any, Sequence

from studylog.decode.loop import COMPONENTS
from book.decode.results import breakdown
from studylog.decode.report import rows_of, series_label

#: Each component's legend label and colour in the stacked bars.
LABELS = {"body": "model body", "mask_wait": "mask (host, not hidden)", "head": "LM head",
          "mask_apply": "mask application", "sampling": "sampling", "host": "host overhead"}
COLORS = {"body": "#4c72b0", "mask_wait": "#dd8452", "head": "#c44e52", "mask_apply": "#8172b3",
          "sampling": "#937860", "host": "#8c8c8c"}
#: One colour per configuration across the chapter's figures (the components have theirs in :data:`COLORS`).
CONFIG_COLORS = {"baseline": "#4d4d4d", "jump_forward": "#1b9e77", "masked_head": "#d95f02",
                 "automaton_mask": "#7570b3", "char_jump": "#e7298a"}
#: The smallest text of a figure, in points at its saved size.
FONT = 9


def plot_breakdown(parts: dict[str, dict[str, float]], ax=None, title: str = "", unit: str = "ms",
                   legend: bool = True):
    """Stacked bars on a linear axis, one per configuration: time per output token split into the loop's
    components. The split comes from CUDA events between the components in a separate instrumented run, whose
    total is a little larger than the timed one; each bar's components are scaled to the end-to-end time
    (measured without the instrumentation), which is written above the bar, so a bar is exactly as tall as its
    label."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6.4, 4.2))[1]
    names = list(parts)
    scale = 1e3 if unit == "µs" else 1.0
    for i, config in enumerate(names):
        bottom = 0.0
        measured = sum(max(parts[config][k], 0.0) for k in COMPONENTS)
        fit = parts[config]["wall"] / measured if measured > 0 else 1.0  # the instrumented split, to the timed total
        for k in COMPONENTS:
            v = max(parts[config][k], 0.0) * fit * scale
            ax.bar(i, v, bottom=bottom, color=COLORS[k], label=LABELS[k] if i == 0 else None, width=0.62)
            bottom += v
        ax.text(i, bottom, f"{parts[config]['wall'] * scale:.3g}", ha="center", va="bottom", fontsize=FONT)
    ax.set_xticks(range(len(names)), [series_label(n) for n in names], rotation=25, ha="right", fontsize=FONT)
    ax.tick_params(axis="y", labelsize=FONT)
    ax.set_ylabel(f"time per output token ({unit})", fontsize=FONT)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
    ax.set_title(title, fontsize=FONT + 1)
    if legend:
        ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(True, axis="y", alpha=0.3)
    return ax


def breakdown_figure(rows: Sequence[dict], model: str, caption: str, what: str = ""):
    """One figure per model shape: the stacked bars at batch 1 and batch 8 (two panels at most), or None when
    the rows hold neither."""
    import matplotlib.pyplot as plt

    batches = [b for b in (1, 8) if breakdown(rows, model, b)]
    if not batches:
        return None
    # stacked, one panel a batch size, so the figure reads at page width; the legend beside the first panel
    fig, axes = plt.subplots(len(batches), 1, figsize=(8.5, 3.9 * len(batches) + 0.9), squeeze=False)
    for j, (ax, b) in enumerate(zip(axes[:, 0], batches)):
        plot_breakdown(breakdown(rows, model, b), ax=ax, title=f"batch {b}", legend=j == 0)
    fig.suptitle(f"{what}{model} shape: where each configuration's time per output token goes (median of the "
                 f"JSON schemas; the split from a separate instrumented run, scaled to the timed total)\n{caption}",
                 fontsize=FONT)
    fig.tight_layout()
    return fig


def speedup_figure(rows: Sequence[dict], caption: str, model: str = "1b", batch: int = 1, what: str = ""):
    """Steps 2 and 3 over step 1 per JSON schema of chapter 1's suite (the requests the chapter's tables take
    medians over), end to end, on a linear axis; the bars' whiskers span the repetitions' spread (the fastest and
    slowest combinations of the two rows' ``spread_ms``)."""
    import matplotlib.pyplot as plt

    from studylog.decode.grammar import suite_names

    json_names = set(suite_names("json"))
    base = {r["params"]["schema"]: r for r in rows_of(rows, model=model, batch=batch, config="baseline",
                                                       whitespace="compact") if r["params"]["schema"] in json_names}
    if not base:
        return None
    fig, ax = plt.subplots(figsize=(10, 4.4))
    names = list(base)
    width = 0.38
    for k, config in enumerate(("jump_forward", "masked_head")):
        mine = {r["params"]["schema"]: r for r in rows_of(rows, model=model, batch=batch, config=config,
                                                          whitespace="compact")}
        xs, ys, lo, hi = [], [], [], []
        for i, n in enumerate(names):
            if n not in mine:
                continue
            b, m = base[n], mine[n]
            y = b["ms"] / m["ms"]
            bs, ms = b.get("spread_ms") or [b["ms"]] * 3, m.get("spread_ms") or [m["ms"]] * 3
            xs.append(i + (k - 0.5) * width)
            ys.append(y)
            lo.append(max(y - bs[0] / ms[-1], 0.0))
            hi.append(max(bs[-1] / ms[0] - y, 0.0))
        ax.bar(xs, ys, width, color=CONFIG_COLORS[config], label=series_label(config),
               yerr=[lo, hi], capsize=2, error_kw={"elinewidth": 0.8})
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=FONT)
    ax.tick_params(axis="y", labelsize=FONT)
    ax.set_ylabel("speedup over step01_baseline\n(end to end, per output token)", fontsize=FONT)
    ax.set_title(f"{what}{model} shape, batch {batch}: each of the {len(names)} JSON schemas, steps 2 and 3 "
                 f"against step 1\n{caption}",
                 fontsize=FONT)
    ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def figures(results, what: str = "") -> dict[str, Any]:
    """``breakdown_1b`` and ``breakdown_8b``: the stacked bars per configuration at batch 1 and 8 for each
    shape measured; ``speedup``: steps 2 and 3 over step 1 per JSON schema, ~1B shape, batch 1. ``what`` starts
    every title (the notebook names an earlier run there)."""
    out = {}
    for model in ("1b", "8b"):
        fig = breakdown_figure(results.rows, model, results.caption(), what)
        if fig is not None:
            out[f"breakdown_{model}"] = fig
    fig = speedup_figure(results.rows, results.caption(), what=what)
    if fig is not None:
        out["speedup"] = fig
    return out


__all__ = ["COLORS", "CONFIG_COLORS", "FONT", "LABELS", "breakdown_figure", "figures", "plot_breakdown",
           "speedup_figure"]
