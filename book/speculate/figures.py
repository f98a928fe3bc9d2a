"""Chapter 08's figure, drawn from the committed results: each request's speedup of the shipped loop (step 3) over chapter 07's step 3
against the tokens a verifying forward returned, at batch 1 and 8, both workloads."""

from __future__ import annotations

from typing import Any

from studylog.speculate import report

#: Text size (points at the saved size): the book scales a figure wider than the page down to it, and at this
#: figure's width this keeps its smallest text at about 11 px there.
FONT = 10
MARKERS = {"extraction": ("o", "#1b9e77"), "low_copy": ("s", "#d95f02")}
#: A batch-1 request whose shipped step runs as many forwards as chapter 07's step 3 yet is faster by more than this is
#: labelled: its gain is the prefill's run-to-run variation, which the page's exceptions show.
NOISE_SPEEDUP = 1.2


def speedup_figure(results):
    """Per request: tokens per forward of the shipped step (3) over chapter 07's step 3 (x) against the measured speedup (y); the
    diagonal is the speedup if a verifying forward cost a one-token forward. At batch 1 a ring marks the requests
    whose output ran to the output cap, and a label the one whose gain with the same forwards is its prefill's
    noise."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 4.4), sharey=True)
    capped_labelled = False
    for ax, batch in zip(axes, (1, 8)):
        top = 1.0
        for workload, (marker, color) in MARKERS.items():
            rows = report.rows_of(results.rows, batch=batch, workload=workload)
            ref = {r["params"]["request"]: r for r in rows if r["series"] == "ch7_step03"}
            xs, ys, cap_x, cap_y = [], [], [], []
            for r in rows:
                if r["series"] != report.SHIPPED or r["params"]["request"] not in ref:
                    continue
                base = ref[r["params"]["request"]]
                xs.append(base["forwards"] / r["forwards"])
                ys.append(base["ms"] / r["ms"])
                # ran to the output cap (at batch 1, where a row is one sequence): mostly a model repeating itself
                if batch == 1 and r["tokens"] >= report.MAX_NEW:
                    cap_x.append(xs[-1])
                    cap_y.append(ys[-1])
            ax.scatter(xs, ys, marker=marker, color=color, s=28, label=workload.replace("_", "-"), alpha=0.85)
            if cap_x:
                ax.scatter(cap_x, cap_y, marker="o", s=90, facecolors="none", edgecolors="black", lw=0.9,
                           label=f"ran to the {report.MAX_NEW}-token cap\n(left out of the batch-1 result)"
                           if not capped_labelled else None)
                capped_labelled = True
            if batch == 1:  # one forward in both loops, yet faster: the prefill's run-to-run noise (the exceptions)
                for x, y in zip(xs, ys):
                    if x == 1.0 and y > NOISE_SPEEDUP:
                        ax.annotate("same forwards:\nits prefill's noise\n(the exceptions)", (x, y),
                                    xytext=(0.85, 2.25), textcoords="data", fontsize=FONT - 1, va="center",
                                    arrowprops={"arrowstyle": "->", "color": "#444444", "lw": 0.8})
            top = max([top, *xs, *ys])
        ax.plot([0.8, top * 1.05], [0.8, top * 1.05], color="#999999", lw=1, ls="--", label="forward ratio")
        ax.axhline(1.0, color="#4d4d4d", lw=0.8)
        ax.set_title(f"batch {batch}", fontsize=FONT + 1)
        ax.set_xlabel("forwards of chapter 07's step 3 / forwards of step 3", fontsize=FONT)
        ax.tick_params(labelsize=FONT)
    axes[0].set_ylabel("speedup per output token", fontsize=FONT)
    axes[0].legend(fontsize=FONT, loc="upper left")
    fig.suptitle("Grammar-cut drafts (step 3) against chapter 07's step 3, per request", fontsize=FONT + 1)
    fig.text(0.5, 0.005, results.caption(), ha="center", va="bottom", fontsize=FONT, color="#444444", wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def figures(results) -> dict[str, Any]:
    return {"speedup": speedup_figure(results)}


__all__ = ["figures", "speedup_figure"]
