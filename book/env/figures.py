"""Chapter 0's figure, from the committed ceilings (``assets/bench/<gpu>/env.json``)."""

from __future__ import annotations

__all__ = ["FONT", "figures"]

#: The smallest text of the figure (points at its saved size): about 12 px once the book scales it to the page.
FONT = 10


def figures(results) -> dict:
    """The env chapter's figure: copy bandwidth against size (from zero, so its ramp with size is not
    exaggerated), beside the matmul rates; the run's caption under the panels."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4.0))
    copies = sorted(results.select("copy"), key=lambda r: r["params"]["bytes"])
    left.plot([r["params"]["bytes"] / 2**20 for r in copies], [r["gbs"] for r in copies], marker="o")
    left.set_xscale("log", base=2)
    left.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))  # 16, 256, 4,096: sizes, not powers
    left.set_ylim(0, 1.08 * max((r["gbs"] for r in copies), default=1))
    left.set_xlabel("bytes copied (MiB)", fontsize=FONT + 1)
    left.set_ylabel("GB/s (read + write)", fontsize=FONT + 1)
    left.set_title("device-to-device copy", fontsize=FONT + 2)
    left.grid(True, which="both", alpha=0.3)
    mm = [r for r in results.rows if r["series"].startswith("matmul_")]
    labels = [f"{r['series'].removeprefix('matmul_')}\n{r['params']['n']}³" for r in mm]
    right.bar(labels, [r["tflops"] for r in mm], color="#4c72b0")
    right.set_ylabel("TFLOP/s", fontsize=FONT + 1)
    right.set_title("torch matmul (cuBLAS), random inputs", fontsize=FONT + 2)
    for i, r in enumerate(mm):
        right.text(i, r["tflops"], f"{r['tflops']:.0f}", ha="center", va="bottom", fontsize=FONT)
    right.set_ylim(0, 1.12 * max((r["tflops"] for r in mm), default=1))  # room for the tallest bar's label
    for ax in (left, right):
        ax.tick_params(labelsize=FONT)
    fig.text(0.5, 0.01, results.caption(), ha="center", va="bottom", fontsize=FONT, color="#444444", wrap=True)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return {"ceilings": fig}
