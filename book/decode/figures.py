"""Chapter 07's figures, drawn from a results file (the committed JSON, or an earlier run kept in ``lab/decode``)
through :mod:`studylog.decode.report`'s readings: where each configuration's time per output token goes, and each
schema's speedup of steps 2 and 3 over step 1."""

from __future__ import annotations

from typing import Any, Sequence

from studylog.decode.loop import COMPONENTS
from book.decode.results import breakdown
from book.decode.lesson import REAL, STEP_3A, STEP_LABELS
from studylog.decode.report import rows_of

#: Each component's legend label and colour in the stacked bars.
LABELS = {"body": "model body", "mask_wait": "mask (host, not hidden)", "head": "LM head",
          "mask_apply": "mask application", "sampling": "sampling", "host": "host overhead"}
COLORS = {"body": "#4c72b0", "mask_wait": "#dd8452", "head": "#c44e52", "mask_apply": "#8172b3",
          "sampling": "#937860", "host": "#8c8c8c"}
#: The tick's legend label: the timed total, measured in runs without the instrumented run's CUDA events.
TICK_LABEL = "timed total, no instrumentation (written beside the bar)"
#: One colour per configuration across the chapter's figures (the components have theirs in :data:`COLORS`).
CONFIG_COLORS = {"baseline": "#4d4d4d", "jump_forward": "#1b9e77", "masked_head": "#d95f02",
                 "automaton_mask": "#7570b3", "char_jump": "#e7298a"}
#: The bars' order: the steps, step 3's first change alone (3a, ``automaton_mask``) just before step 3, as the page
#: lists step 3's changes, then chapter 01's character-level jumps, which are not a step.
BAR_ORDER = ("baseline", "jump_forward", "automaton_mask", "masked_head", "char_jump")
#: The configurations the page's breakdown figures draw: the steps and, greyed, the character-level jumps. 3a alone
#: is drawn on the real model only, whose open steps table gives it a row from the same run (:data:`DRAWN_REAL`).
DRAWN = ("baseline", "jump_forward", "masked_head", "char_jump")
#: The real model's bars: its steps table's rows, 3a included, and the character-level jumps greyed.
DRAWN_REAL = ("baseline", "jump_forward", "automaton_mask", "masked_head", "char_jump")
#: Each bar's label: a step's as the steps table gives it ("step N: short name"), step 3's first change as its chain
#: table labels it, and chapter 01's character-level jumps, which are not a step.
BAR_LABELS = {**STEP_LABELS, "automaton_mask": STEP_3A[0],
              "char_jump": "not a step: character-level jumps"}
#: Configurations drawn greyed out (faded bars): chapter 01's character-level jumps change what a model writes, so
#: they are shown for scale, not as a step.
NOT_A_STEP = ("char_jump",)
NOT_A_STEP_ALPHA = 0.3
#: How figure titles name the cost models' shapes (each a body of a public model's shape and a head of chapter 01's
#: ``cl100k_base`` vocabulary).
SHAPES = {"1b": "1B cost model, cl100k head", "8b": "8B cost model, cl100k head",
          REAL: "SmolLM2-135M, real weights, its own answers"}
#: The smallest text of a figure, in points at its saved size.
FONT = 9


def unattributed(parts: dict[str, float]) -> float:
    """A configuration's timed total per output token less the sum of its instrumented parts (ms). The parts come
    from a separate run with CUDA events between them, whose own cost the timed runs do not pay, so this is often
    negative: the instrumented parts then add up to more than the timed total."""
    return parts["wall"] - sum(max(parts[k], 0.0) for k in COMPONENTS)


#: A part whose longest piece is under this share of the longest bar without the body, at every batch size, is not
#: drawn (:func:`too_short`): at the book's width it would be a sliver of a few pixels whose colour could not be
#: found. The legend leaves it out, and the caption names it with its largest value instead (:func:`hidden_parts`).
VISIBLE_SHARE = 0.03


def plot_breakdown(parts: dict[str, dict[str, float]], ax=None, title: str = "", unit: str = "ms",
                   legend: bool = True, body: bool = True, names: bool = True, hide: Sequence[str] = ()):
    """Stacked horizontal bars on a linear axis, one per configuration (top to bottom in :data:`BAR_ORDER`): the
    instrumented run's total per output token, split into the loop's components as that run measured them (CUDA
    events between the components), unscaled, so a part the configurations share keeps its length from bar to bar;
    the parts in ``hide`` (:func:`too_short`) are not drawn.
    A black tick marks the timed total, measured without the events and written beside the bar; the bar's end less
    the tick is what the events themselves cost (:func:`instrumentation_caption`). With ``body`` off, the bars leave
    the model body out, so the parts the chapters change are drawn large enough to read; they have no tick (the timed
    total holds the body) and each bar's sum of parts is written beside it. ``names``: the configurations' labels on
    the axis (off for a panel beside one that has them)."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6.4, 3.6))[1]
    configs = sorted(parts, key=lambda c: BAR_ORDER.index(c) if c in BAR_ORDER else len(BAR_ORDER))
    scale = 1e3 if unit == "µs" else 1.0
    keys = [k for k in COMPONENTS if (body or k != "body") and k not in hide]
    for i, config in enumerate(configs):
        left = 0.0
        for k in keys:
            v = max(parts[config][k], 0.0) * scale
            ax.barh(i, v, left=left, color=COLORS[k], label=LABELS[k] if i == 0 else None,
                    height=0.62, alpha=NOT_A_STEP_ALPHA if config in NOT_A_STEP else 1.0)
            left += v
        end = left
        if body:
            wall = parts[config]["wall"] * scale
            ax.vlines(wall, i - 0.4, i + 0.4, color="black", lw=2.0, label=TICK_LABEL if i == 0 else None)
            end = max(left, wall)
            written = wall
        else:
            written = left
        # one precision a panel: ms to two decimals (1.20 ms), µs to the unit; the unit written, so that a total
        # never reads as a ratio
        ax.annotate(f"{written:.2f} ms" if unit == "ms" else f"{written:.0f} µs", (end, i), xytext=(6, 0), textcoords="offset points", ha="left", va="center",
                    fontsize=FONT)
    ax.set_yticks(range(len(configs)), [BAR_LABELS.get(n, n) for n in configs] if names else [""] * len(configs),
                  fontsize=FONT)
    ax.set_ylim(len(configs) - 0.5, -0.5)  # the first configuration on top
    ax.tick_params(axis="x", labelsize=FONT)
    ax.set_xlabel(f"time per output token ({unit})", fontsize=FONT)
    ax.set_xlim(0, ax.get_xlim()[1] * 1.3)  # room for the numbers beside the bars, clear of the panel's edge
    ax.set_title(title, fontsize=FONT + 1)
    if legend:
        handles, labels = ax.get_legend_handles_labels()
        order = ([labels.index(TICK_LABEL)] if TICK_LABEL in labels else []) + \
            [j for j, label in enumerate(labels) if label != TICK_LABEL]
        ax.legend([handles[j] for j in order], [labels[j] for j in order], fontsize=FONT, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), frameon=False, title="bar: instrumented run, parts stacked",
                  title_fontsize=FONT, alignment="left")
    ax.grid(True, axis="x", alpha=0.3)
    return ax


def too_short(panels: Sequence[dict[str, dict[str, float]]]) -> list[str]:
    """The parts other than the body that no panel could show (each panel: one batch size's configurations): in
    every panel, the part's longest piece is under :data:`VISIBLE_SHARE` of the panel's longest bar without the
    body."""
    def longest(parts, keys) -> float:
        return max(sum(max(p[k], 0.0) for k in keys) for p in parts.values())

    rest = [k for k in COMPONENTS if k != "body"]
    return [k for k in rest if all(longest(parts, [k]) < VISIBLE_SHARE * longest(parts, rest) for parts in panels)]


def hidden_parts(panels: Sequence[dict[str, dict[str, float]]], hidden: Sequence[str]) -> str:
    """A caption's line for the parts left out (:func:`too_short`), each with its largest value over the panels'
    bars, in µs per output token; empty where every part is drawn."""
    if not hidden:
        return ""
    words = "; ".join(f"{LABELS[k]}, at most {max(max(p[k], 0.0) for parts in panels for p in parts.values()) * 1e3:.1f} µs"
                      for k in hidden)
    return f"Too short to draw, so left out: {words} per token."


def instrumentation_cost(panels: Sequence[dict[str, dict[str, float]]]) -> tuple[float, float]:
    """The smallest and largest excess of a bar's instrumented total over its timed total (ms per output token)
    across the panels' bars: what the instrumentation's events cost, up to run-to-run noise (which can make the
    smallest negative)."""
    excess = [-unattributed(p) for parts in panels for p in parts.values()]
    return min(excess), max(excess)


def instrumentation_caption(panels: Sequence[dict[str, dict[str, float]]]) -> str:
    """One line for a breakdown figure: the bar's top less the tick, how far the instrumented parts' sum differs
    from the uninstrumented total (the timing's cost, up to noise), as the range :func:`instrumentation_cost`
    gives over the figure's bars (µs per output token)."""
    lo, hi = (v * 1e3 for v in instrumentation_cost(panels))
    def signed(v: float) -> str:
        return f"{v:+.0f}".replace("-", "−")

    return (f"Bar end − tick: the parts' sum less the timed total, {signed(lo)} to {signed(hi)} µs per token over "
            f"these {sum(len(p) for p in panels)} bars (the timing's cost, and noise).")


def breakdown_figure(rows: Sequence[dict], model: str, caption: str, what: str = ""):
    """One figure per model shape, three panels side by side sharing the configurations' axis: the whole step at
    batch 1 (batch 8 where only it was measured), then the parts other than the model body at batch 1 and at batch
    8, where the chapters' changes are large enough to read (at most three panels; two where one batch size is
    missing); None when the rows hold neither batch size. The cost models' bars are medians over the JSON schemas;
    the real model's over all its requests, regexes included, with 3a its own bar, as its steps table gives them."""
    import matplotlib.pyplot as plt

    kind, drawn = (None, DRAWN_REAL) if model == REAL else ("json", DRAWN)
    batches = [b for b in (1, 8) if breakdown(rows, model, b, kind=kind)]
    if not batches:
        return None
    parts = {b: {c: p for c, p in breakdown(rows, model, b, kind=kind).items() if c in drawn} for b in batches}
    n_requests = len({r["params"]["schema"] for r in rows_of(rows, model=model, batch=batches[0], config="baseline")})
    panels = [(batches[0], True)] + [(b, False) for b in batches]
    fig, axes = plt.subplots(1, len(panels), figsize=(9.6, 4.6), squeeze=False,
                             gridspec_kw={"width_ratios": [1.15] + [1] * (len(panels) - 1)})
    hide = too_short(list(parts.values()))
    for j, (ax, (b, body)) in enumerate(zip(axes[0], panels)):
        whole = parts[b]
        shares = [p["body"] / sum(max(p[k], 0.0) for k in COMPONENTS) for p in whole.values()]
        lo, hi = (f"{100 * v:.0f}" for v in (min(shares), max(shares)))
        # short lines: the panels sit side by side, and a longer title runs into its neighbour's
        title = (f"batch {b}: the whole step" if body else
                 f"batch {b}: without the body\n(body: {lo if lo == hi else f'{lo}–{hi}'}% of a bar)")
        plot_breakdown(whole, ax=ax, title=title, unit="ms" if body else "µs", legend=False, body=body,
                       names=j == 0, hide=hide)
    handles, labels = {}, []
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = h
                labels.append(label)
    order = [k for k in (TICK_LABEL, *(LABELS[c] for c in COMPONENTS)) if k in labels]  # the tick, then the parts
    # below the panels, the legend, then the parts too thin to draw (what bar and tick differ by, and the run, are
    # the page's "Where the numbers come from": :func:`figure_notes`)
    lines = [line for line in (hidden_parts(list(parts.values()), hide), caption) if line]
    height = fig.get_figheight()
    text_in = 0.05 + 0.17 * sum(line.count("\n") + 1 for line in lines)  # the caption's height, inches
    legend_in = 0.2 * (1 + -(-len(order) // 3))  # its title and rows
    fig.legend([handles[k] for k in order], order, fontsize=FONT, loc="lower center",
               bbox_to_anchor=(0.5, text_in / height), ncol=3, frameon=False,
               title="bar: instrumented run, parts stacked", title_fontsize=FONT)
    over = f"median of its {n_requests} requests" if model == REAL else "median of the JSON schemas"
    fig.suptitle(f"{what}{SHAPES.get(model, model + ' shape')}: time per output token by part ({over})",
                 fontsize=FONT + 1)
    if lines:
        fig.text(0.01, 0.005, "\n".join(lines), fontsize=FONT, ha="left", va="bottom")
    fig.tight_layout(rect=(0, (text_in + legend_in + 0.1) / height, 1, 1))
    return fig


def speedup_figure(rows: Sequence[dict], caption: str, model: str = "1b", batch: int = 1, what: str = ""):
    """Steps 2 and 3 over step 1 per JSON schema of chapter 01's suite (the requests the chapter's tables take
    medians over), end to end, on a linear axis; the bars' whiskers span the repetitions' spread (the fastest and
    slowest combinations of the two rows' ``spread_ms``)."""
    import matplotlib.pyplot as plt

    from studylog.decode.grammar import suite_names

    json_names = set(suite_names("json"))
    base = {r["params"]["schema"]: r for r in rows_of(rows, model=model, batch=batch, config="baseline",
                                                       whitespace="compact") if r["params"]["schema"] in json_names}
    if not base:
        return None
    fig, ax = plt.subplots(figsize=(8.8, 4.6))
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
        ax.bar(xs, ys, width, color=CONFIG_COLORS[config], label=BAR_LABELS[config],
               yerr=[lo, hi], capsize=2, error_kw={"elinewidth": 0.8})
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=FONT)
    ax.tick_params(axis="y", labelsize=FONT)
    ax.set_ylabel("speedup over step 1\n(end to end, per output token)", fontsize=FONT)
    ax.set_title(f"{what}{SHAPES.get(model, model + ' shape')}, batch {batch}: each of the {len(names)} JSON schemas, steps 2 and 3 "
                 "against step 1" + (f"\n{caption}" if caption else ""),
                 fontsize=FONT)
    ax.legend(fontsize=FONT, loc="upper right")  # inside: a legend beside the bars would make the figure wider
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def order_caption(parts: dict[str, dict[str, float]]) -> str:
    """One line for a whole-step panel whose bar ends and ticks rank two configurations in opposite orders (the
    events' cost larger than the gap between their timed totals): why neither orders them; empty where they agree."""
    names = [c for c in BAR_ORDER if c in parts and c not in NOT_A_STEP]
    flipped = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
               if (parts[a]["wall"] - parts[b]["wall"]) * (unattributed(parts[b]) - unattributed(parts[a])
                                                         + parts[a]["wall"] - parts[b]["wall"]) < 0]
    if not flipped:
        return ""
    a, b = flipped[0]
    lo, hi = (v * 1e3 for v in instrumentation_cost([parts]))
    return (f"{BAR_LABELS[a].split(':')[0]} and {BAR_LABELS[b].split(':')[0]}: bars and ticks rank them in opposite "
            f"orders: the gap is smaller than the bars' events cost ({lo:+.0f} to {hi:+.0f} µs a token) and than\n"
            "the drift between runs; the chapter orders them by runs that alternate the two.").replace("-", "−")


def figure_notes(results) -> str:
    """What the page says of its figures under "Where the numbers come from", not inside them: how far a breakdown
    bar's end sits from its tick at each shape (:func:`instrumentation_cost`, µs per output token), and the run
    (card, date, versions)."""
    def signed(v: float) -> str:
        return f"{v * 1e3:+.0f}".replace("-", "−")

    spans = []
    for model, name in ((REAL, "on SmolLM2-135M"), ("1b", "at the 1B cost model"), ("8b", "at the 8B cost model")):
        kind, drawn = (None, DRAWN_REAL) if model == REAL else ("json", DRAWN)
        panels = [{c: p for c, p in breakdown(results.rows, model, b, kind=kind).items() if c in drawn}
                  for b in (1, 8)]
        panels = [p for p in panels if p]
        if panels:
            lo, hi = instrumentation_cost(panels)
            spans.append(f"{signed(lo)} to {signed(hi)} µs per token {name}")
    bars = ("" if not spans else
            "In the breakdown figures a bar stacks the parts measured in a run with CUDA events between them, "
            "and its tick is the total timed without the events; a bar's end less its tick (the events' cost, and "
            f"noise) is {', '.join(spans[:-1]) + ' and ' * (len(spans) > 1) + spans[-1]}. ")
    return bars + results.caption()


def figures(results, what: str = "") -> dict[str, Any]:
    """``breakdown_smollm2`` (the real model's), ``breakdown_1b`` and ``breakdown_8b``: the stacked bars per
    configuration at batch 1 and 8 for each model measured; ``speedup``: steps 2 and 3 over step 1 per JSON schema, the 1B cost model, batch 1, and
    ``speedup_8b`` the same on the 8B cost model where the file has it. ``what`` starts every title
    (the notebook names an earlier run there)."""
    out = {}
    for model in (REAL, "1b", "8b"):
        kind, drawn = (None, DRAWN_REAL) if model == REAL else ("json", DRAWN)
        first = {c: p for c, p in breakdown(results.rows, model, 1, kind=kind).items() if c in drawn}
        fig = breakdown_figure(results.rows, model, order_caption(first) if first else "", what)
        if fig is not None:
            out[f"breakdown_{model}"] = fig
    for model, name in (("1b", "speedup"), ("8b", "speedup_8b")):
        fig = speedup_figure(results.rows, "", model=model, what=what)
        if fig is not None:
            out[name] = fig
    return out


__all__ = ["BAR_LABELS", "BAR_ORDER", "COLORS", "CONFIG_COLORS", "DRAWN", "DRAWN_REAL", "FONT", "figure_notes", "LABELS", "SHAPES", "TICK_LABEL",
           "breakdown_figure", "figures", "hidden_parts", "instrumentation_caption", "instrumentation_cost", "order_caption", "plot_breakdown",
           "speedup_figure", "too_short", "unattributed", "VISIBLE_SHARE"]
