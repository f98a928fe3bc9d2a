"""Chapter 0's figure, from the committed ceilings (``assets/bench/<gpu>/env.json``)."""

from __future__ import annotations

__all__ = ["figures"]


def figures(results) -> dict:
    """The env chapter's figure: copy bandwidth against size, beside the matmul rates."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    copies = sorted(results.select("copy"), key=lambda r: r["params"]["bytes"])
    left.plot([r["params"]["bytes"] / 2**20 for r in copies], [r["gbs"] for r in copies], marker="o")
    left.set_xscale("log", base=2)
    left.set_xlabel("bytes copied (MiB)")
    left.set_ylabel("GB/s (read + write)")
    left.set_title("device-to-device copy", fontsize=10)
    left.grid(True, which="both", alpha=0.3)
    mm = [r for r in results.rows if r["series"].startswith("matmul_")]
    labels = [f"{r['series'].removeprefix('matmul_')}\n{r['params']['n']}³" for r in mm]
    right.bar(labels, [r["tflops"] for r in mm], color="#4c72b0")
    right.set_ylabel("TFLOP/s")
    right.set_title("torch matmul (cuBLAS), random inputs", fontsize=10)
    for i, r in enumerate(mm):
        right.text(i, r["tflops"], f"{r['tflops']:.0f}", ha="center", va="bottom", fontsize=9)
    right.set_ylim(0, 1.12 * max((r["tflops"] for r in mm), default=1))  # room for the tallest bar's label
    fig.suptitle(results.caption(), fontsize=8, y=0.02)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return {"ceilings": fig}
