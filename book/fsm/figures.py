"""Chapter 1's figure: the forward passes steps 2 and 3 save on the schema suite (:func:`studylog.fsm.run_suite`,
run on the CPU: the chapter has no GPU benchmark), beside MaskBench's published share of forced tokens;
``python -m book plot fsm`` saves it as ``assets/figures/fsm_savings.png`` (the chapter's teaser on the blog's
landing page). The colours are the chapter's other drawings' too (``book.fsm.lesson``)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from book.plotting import step_words
from studylog.fsm import CHAPTER
from studylog.fsm.report import EntryResult

__all__ = ["MASKBENCH_FORCED_SHARE", "MODE_LABELS", "MODE_STEPS", "SERIES_COLORS", "figures", "plot_savings"]

#: Published reference point: share of tokens a grammar forces on JSON schemas, with JSON's whitespace and
#: compact (MaskBench's table of fast-forward tokens, Llama 3 tokenizer, about ten thousand schemas:
#: https://github.com/guidance-ai/jsonschemabench/tree/main/maskbench).
MASKBENCH_FORCED_SHARE = (0.13, 0.15)

#: One colour per series across the chapter's figures: the two jump steps under each whitespace pattern,
#: the peers' policies, the published reference, and series that are not steps.
SERIES_COLORS: dict[str, str] = {
    "step02_token_jumps": "#9ecae1", "step03_char_jumps": "#3182bd",
    "step02_token_jumps[compact]": "#fdae6b", "step03_char_jumps[compact]": "#e6550d",
    "xgrammar": "#756bb1", "llguidance": "#31a354", "MaskBench": "#969696", "neutral": "#525252",
}
#: The step each decode mode runs (its key in :data:`SERIES_COLORS`).
MODE_STEPS: dict[str, str] = {"token": CHAPTER.step(2).name, "char": CHAPTER.step(3).name}
#: The step each decode mode runs, as the legend names it ("step 2: token jumps").
MODE_LABELS: dict[str, str] = {mode: step_words(CHAPTER.step(name)) for mode, name in MODE_STEPS.items()}


def figures(results: Sequence[EntryResult]) -> dict[str, Any]:
    """``savings`` (:func:`plot_savings`), from the suite's results (:func:`studylog.fsm.run_suite`)."""
    return {"savings": plot_savings(results).figure}


def plot_savings(results: Sequence[EntryResult], ax=None, title: Optional[str] = None):
    """Share of forward passes saved per suite entry by steps 2 and 3, under both whitespace patterns, with
    MaskBench's published share of forced tokens as a band. Bars, one colour per series
    (:data:`SERIES_COLORS`); the legend sits above the axes."""
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r.name for r in results))
    rows = {(r.name, r.whitespace): r for r in results}
    wss = list(dict.fromkeys(r.whitespace for r in results))
    series = [(ws, mode) for ws in wss for mode in ("token", "char")]
    ax = ax or plt.subplots(figsize=(9, 4.6))[1]
    width = 0.8 / len(series)
    for k, (ws, mode) in enumerate(series):
        xs, ys = [], []
        for i, n in enumerate(names):
            r = rows.get((n, ws))
            if r is None:  # regex entries have no whitespace variants
                continue
            xs.append(i + (k - (len(series) - 1) / 2) * width)
            ys.append(100 * r.saved(mode))
        key = MODE_STEPS[mode] + ("" if ws == "default" else f"[{ws}]")
        ax.bar(xs, ys, width, label=f"{MODE_LABELS[mode]}, {ws} whitespace", color=SERIES_COLORS[key])
    lo, hi = MASKBENCH_FORCED_SHARE
    ax.axhspan(100 * lo, 100 * hi, color=SERIES_COLORS["MaskBench"], alpha=0.3,
               label="MaskBench: share of tokens forced (Llama 3 tokenizer)")
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=9)
    ax.tick_params(axis="y", labelsize=9)
    ax.set_ylabel("forward passes saved (%)", fontsize=10)
    ax.set_ylim(0, 100)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=9, loc="lower center", bbox_to_anchor=(0.5, 1.01), ncol=2, frameon=False)
    ax.set_title(title or "Forward passes saved on the suite (cl100k_base, greedy writer model)", fontsize=11,
                 pad=62)
    return ax
