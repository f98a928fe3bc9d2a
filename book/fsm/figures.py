"""Chapter 1's figure: the forward passes steps 2 and 3 save on the schema suite (:func:`studylog.fsm.run_suite`,
run on the CPU: the chapter has no GPU benchmark), beside llguidance's fast-forward tokens (the strongest peer,
where it is installed), each under both whitespace patterns, all counted the same way (passes saved);
``python -m book plot fsm`` saves it as ``assets/figures/fsm_savings.png`` (the chapter's teaser on the blog's
landing page). The colours are the chapter's other drawings' too (``book.fsm.lesson``)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from book.plotting import step_words
from studylog.fsm import CHAPTER
from studylog.fsm.report import EntryResult

__all__ = ["MODE_LABELS", "MODE_STEPS", "SERIES_COLORS", "figures", "plot_savings"]

#: One colour per series across the chapter's figures: the two jump steps under each whitespace pattern,
#: the peers' policies, the published reference, and series that are not steps.
SERIES_COLORS: dict[str, str] = {
    "step02_token_jumps": "#9ecae1", "step03_char_jumps": "#3182bd",
    "step02_token_jumps[compact]": "#fdae6b", "step03_char_jumps[compact]": "#e6550d",
    "xgrammar": "#756bb1", "llguidance": "#31a354", "llguidance[compact]": "#a1d99b", "MaskBench": "#969696",
    "neutral": "#525252",
}
#: The step each decode mode runs (its key in :data:`SERIES_COLORS`).
MODE_STEPS: dict[str, str] = {"token": CHAPTER.step(2).name, "char": CHAPTER.step(3).name}
#: The step each decode mode runs, as the legend names it ("step 2: token jumps").
MODE_LABELS: dict[str, str] = {mode: step_words(CHAPTER.step(name)) for mode, name in MODE_STEPS.items()}


def figures(results: Sequence[EntryResult]) -> dict[str, Any]:
    """``savings`` (:func:`plot_savings`), from the suite's results (:func:`studylog.fsm.run_suite`), with
    llguidance's bars where xgrammar and llguidance are installed (the peers' comparison run on the same suite, and
    on its JSON schemas with compact whitespace, as ``book.results.write_fsm_peers`` runs it)."""
    from book.fsm import peers
    from studylog.fsm import schemas

    peer_rows = compact_rows = None
    if all(v is not None for v in peers.peer_versions().values()):
        peer_rows = peers.compare_peers(n_samples=8, seed=0)
        compact_rows = peers.compare_peers([e for e in schemas.suite() if e.kind == "json"], whitespace="compact",
                                           n_samples=8, seed=0)
    return {"savings": plot_savings(results, peer_rows, compact_peer_rows=compact_rows).figure}


def plot_savings(results: Sequence[EntryResult], peer_rows: Optional[Sequence] = None, ax=None,
                 title: Optional[str] = None, compact_peer_rows: Optional[Sequence] = None):
    """Share of forward passes saved per suite entry by steps 2 and 3, under both whitespace patterns, and by
    llguidance's fast-forward tokens where ``peer_rows`` (:func:`book.fsm.peers.compare_peers`, default whitespace)
    and ``compact_peer_rows`` (the same on the JSON schemas, compact) are given: one measure, the steps table's.
    Bars, one colour per series (:data:`SERIES_COLORS`), each whitespace's peer bar after its steps; the legend sits
    above the axes."""
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r.name for r in results))
    rows = {(r.name, r.whitespace): r for r in results}
    wss = list(dict.fromkeys(r.whitespace for r in results))
    series: list = [(ws, mode) for ws in wss for mode in ("token", "char")]
    llg = {}  # (entry, whitespace) -> share llguidance's fast-forward tokens save (the peers' comparison)
    for ws, rows_ in (("default", peer_rows), ("compact", compact_peer_rows)):
        for r in rows_ or ():
            if r.library == "llguidance":
                ours = next(o for o in rows_ if o.entry == r.entry and o.library == "ours")
                llg[r.entry, ws] = r.saved("tokens", ours)
    for ws in dict.fromkeys(w for _, w in llg):  # beside the steps of the same whitespace it is compared with
        after = max((k + 1 for k, (w, _) in enumerate(series) if w == ws), default=len(series))
        series.insert(after, (ws, "llguidance"))
    ax = ax or plt.subplots(figsize=(10, 4.6))[1]
    width = 0.84 / len(series)
    for k, (ws, mode) in enumerate(series):
        xs, ys = [], []
        for i, n in enumerate(names):
            if mode == "llguidance":
                y = llg.get((n, ws))
            else:
                r = rows.get((n, ws))
                y = None if r is None else 1 - r.passes[mode] / r.passes["none"]  # a regex has no whitespace variant
            if y is None:
                continue
            xs.append(i + (k - (len(series) - 1) / 2) * width)
            ys.append(100 * y)
        if mode == "llguidance":
            label = f"llguidance: fast-forward tokens (a peer), {ws} whitespace"
            color = SERIES_COLORS["llguidance" + ("" if ws == "default" else f"[{ws}]")]
        else:
            key = MODE_STEPS[mode] + ("" if ws == "default" else f"[{ws}]")
            label, color = f"{MODE_LABELS[mode]}, {ws} whitespace", SERIES_COLORS[key]
        ax.bar(xs, ys, width, label=label, color=color)
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=9)
    ax.tick_params(axis="y", labelsize=9)
    ax.set_ylabel("forward passes saved (%)", fontsize=10)
    ax.set_ylim(0, 100)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=9, loc="lower center", bbox_to_anchor=(0.5, 1.01), ncol=2, frameon=False)
    ax.set_title(title or "Forward passes saved on the suite (cl100k_base, greedy writer model)", fontsize=11,
                 pad=62)
    return ax
