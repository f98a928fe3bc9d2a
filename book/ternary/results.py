"""Chapter 5's result tables from the committed benchmark file (``assets/bench/<gpu>/ternary.json``), on the GPU
clock: each step's speedup over cuBLAS bf16 per shape, our fastest against the peers; and step 12's timeline
figure from the in-kernel timestamps of ``lab/ternary/w2a8_timeline.py``."""

from __future__ import annotations

from book.common import us
from studylog.ternary.results import (BITNET, CUBLAS, FLOAT_X_SERIES, GEMLITE, INT_MM, INT_MM_MATMUL, W2A8_SERIES,
                                      fastest, on_gpu_clock, series_label, shapes_in)
from studylog.ternary.steps import SERIES

__all__ = ["speedup_table", "peers_table", "timeline_figure", "prefill", "host_over_gpu", "bitnet_table"]

#: the run with BitNet's W2A8 kernel beside ours (``lab/ternary/results/nvidia-h200/``; lab/ternary/README.md)
BITNET_RUN = "ternary_bitnet_quick"
#: Series timed at M = 1 (every step), and at M > 1 (the steps made for several rows of x).
M1_SERIES = [SERIES[n] for n in range(1, 14)]
BATCH_SERIES = [SERIES[n] for n in (5, 7, 8, 9, 10, 11, 12, 13)]


def series_ms(results, series: str, **params) -> float | None:
    """The GPU-clock time (ms) of the row of ``series`` matching ``params``, or None."""
    rows = on_gpu_clock(results).select(series, **params)
    return rows[0]["ms"] if rows else None


def speedup_table(results, m: int) -> str:
    """Markdown, GPU clock: per shape, cuBLAS bf16's time, each of ours with its speedup over it, the peers',
    and the 2-bit floor (µs)."""
    view = on_gpu_clock(results)
    ours = [s for s in (M1_SERIES if m == 1 else BATCH_SERIES) if view.select(s, m=m)]
    peers = [s for s in (GEMLITE, INT_MM) if view.select(s, m=m)]
    head = ["shape", "cuBLAS bf16 (µs)"] + [f"{series_label(s)} (µs, x)" for s in ours] + \
        [f"{'GemLite' if s == GEMLITE else 'torch._int_mm'} (µs, x)" for s in peers] + ["2-bit floor (µs)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape in shapes_in(view):
        base = series_ms(view, CUBLAS, shape=shape, m=m)
        if base is None:
            continue
        cells = [shape, us(base)]
        for s in ours + peers:
            t = series_ms(view, s, shape=shape, m=m)
            cells.append("–" if t is None else f"{t * 1e3:.1f} ({base / t:.1f}x)")
        floors = [r["floor_ms"] for s in (SERIES[4], SERIES[5], SERIES[9], SERIES[11])
                  for r in view.select(s, shape=shape, m=m) if "floor_ms" in r]
        cells.append(us(floors[0]) if floors else "–")
        lines.append("| " + " | ".join(cells) + " |")
    if len(lines) == 2:
        return f"(no GPU-clock times at M = {m} in this file)"
    return "\n".join(lines)


def peers_table(results) -> str:
    """Markdown, GPU clock: per M and shape, our fastest bf16-x kernel against GemLite and our fastest W2A8
    kernel against torch._int_mm (x quantised in the call; the int8 GEMM alone in brackets), µs and speedup."""
    view = on_gpu_clock(results)
    lines = ["| M | shape | ours, bf16 x | GemLite | ours / GemLite | ours, W2A8 | torch._int_mm (GEMM alone) | "
             "ours / torch._int_mm |", "|---|---|---|---|---|---|---|---|"]
    for m in sorted({r["params"]["m"] for r in view.rows if "m" in r["params"]}):
        for shape in shapes_in(view):
            gem, mm = view.select(GEMLITE, shape=shape, m=m), view.select(INT_MM, shape=shape, m=m)
            if not gem and not mm:
                continue
            cells = [str(m), shape]
            row, s = fastest(view, FLOAT_X_SERIES, shape=shape, m=m)
            cells += [f"{us(row['ms'])} ({series_label(s)})" if row else "–", us(gem[0]["ms"]) if gem else "–",
                      f"**{gem[0]['ms'] / row['ms']:.2f}x**" if gem and row else "–"]
            row, s = fastest(view, W2A8_SERIES, shape=shape, m=m)
            alone = view.select(INT_MM_MATMUL, shape=shape, m=m)
            cells += [f"{us(row['ms'])} ({series_label(s)})" if row else "–",
                      (us(mm[0]["ms"]) if mm else "–") + (f" ({us(alone[0]['ms'])})" if alone else ""),
                      f"**{mm[0]['ms'] / row['ms']:.2f}x**" if mm and row else "–"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def timeline_figure(timeline: dict, title: str = "Step 12 at M = 1: where a block's time goes (in-kernel "
                                                   "timestamps)"):
    """Step 12's blocks over time, from lab/ternary/w2a8_timeline.py's output (``plotting.load_lab``): for each
    case the median (over blocks) of when a block has read x, has quantised it, has taken its last weights and
    has ended, from the first block's start (the last of the script's repetitions), and when the last block
    ended."""
    import matplotlib.pyplot as plt

    cases = timeline.get("cases", timeline)
    phases = (("reading x", "start", "x_read"), ("quantising x (and, in a cluster, sharing it)", "x_read", "x_ready"),
              ("the weights", "x_ready", "loop_end"), ("the sums", "loop_end", "end"))
    colors = ("tab:orange", "tab:red", "tab:blue", "tab:gray")
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(cases) + 1.6))
    labels = []
    for i, (name, case) in enumerate(cases.items()):
        run = case["runs"][-1]
        for j, ((what, begin, end), color) in enumerate(zip(phases, colors)):
            lo, hi = run[begin][1], run[end][1]
            ax.barh(i, hi - lo, left=lo, color=color, label=what if i == 0 else None)
        ax.plot(run["end"][2], i, "k|", markersize=16, mew=2, label="the last block ends" if i == 0 else None)
        shape, place = name.split(" probe")[0].split(" ", 1)
        size = int(name.rsplit(" cluster", 1)[1].split()[0]) if " cluster" in name else 1
        where = f"cluster of {size}" if place == "cluster" else place
        labels.append(f"{shape}, {where}\n{case['kernel_us']:.1f} µs kernel time")
    ax.set_yticks(range(len(cases)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("µs since the first block started (medians over the blocks)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def _card(results) -> str:
    """"H200, " for a table's first header cell: the card its numbers were measured on ("" where the file does not
    say)."""
    try:
        return results.gpu.replace("NVIDIA ", "") + ", "
    except (KeyError, AttributeError, TypeError):
        return ""


def prefill(results, m: int = 128, series=None) -> dict:
    """At ``m`` rows of x (prefill), per shape, cuBLAS bf16 against ``series`` (ours, default the W2A8 steps 12
    and 13 and the fastest of all ours): ``{"rows": [(shape, cuBLAS ms, {series: ms})], "ratio": {series: (lowest,
    highest)} of cuBLAS time over ours, "table": markdown}`` on the GPU clock."""
    view = on_gpu_clock(results)
    series = list(series or (SERIES[12], SERIES[13]))
    rows, ratios = [], {s: [] for s in series + ["fastest"]}
    for shape in shapes_in(view):
        base = series_ms(view, CUBLAS, shape=shape, m=m)
        if base is None:
            continue
        times = {s: series_ms(view, s, shape=shape, m=m) for s in series}
        best, name = fastest(view, FLOAT_X_SERIES + W2A8_SERIES, shape=shape, m=m)
        times["fastest"] = best["ms"] if best else None
        rows.append((shape, base, times, name))
        for s, t in times.items():
            if t is not None:
                ratios[s].append(base / t)
    head = [f"shape ({_card(results)}M = {m})", "cuBLAS bf16 (µs)"] + [f"{series_label(s)} (µs, x cuBLAS)" for s in series] + \
        ["fastest of ours (µs, x cuBLAS)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, base, times, name in rows:
        cells = [shape, us(base)] + [("–" if times[s] is None else f"{us(times[s])} ({base / times[s]:.2f}x)")
                                     for s in series]
        t = times["fastest"]
        cells.append("–" if t is None else f"{us(t)} ({base / t:.2f}x, {series_label(name)})")
        lines.append("| " + " | ".join(cells) + " |")
    return {"rows": rows, "ratio": {s: (min(r), max(r)) if r else None for s, r in ratios.items()},
            "table": "\n".join(lines) if rows else f"(no GPU-clock times at M = {m} in this file)"}


def host_over_gpu(results, m: int = 1, series=(SERIES[12], SERIES[13])) -> tuple[float, float] | None:
    """The lowest and highest host time per call (eager, back-to-back) over GPU time of ``series`` at ``m`` rows,
    over every shape of the file: how many times longer the Python call takes than the kernel it launches."""
    view = on_gpu_clock(results)
    r = [row["host_ms"] / row["ms"] for s in series for row in view.select(s, m=m) if "host_ms" in row]
    return (min(r), max(r)) if r else None


def bitnet_table(results) -> dict:
    """Ours (the fastest W2A8 step, x quantised inside the call) against BitNet's W2A8 kernel (x already int8) at
    M = 1, at every (N, K) its kernel is compiled for: ``{"rows": [(shape, BitNet ms, ours ms, our series)],
    "worst": the lowest BitNet / ours, "table": markdown}``; ``None`` where the file has no BitNet rows."""
    view = on_gpu_clock(results)
    rows = []
    for shape in shapes_in(view):
        peer = series_ms(view, BITNET, shape=shape, m=1)
        row, s = fastest(view, W2A8_SERIES, shape=shape, m=1)
        if peer is not None and row is not None:
            rows.append((shape, peer, row["ms"], s, series_ms(view, CUBLAS, shape=shape, m=1)))
    if not rows:
        return None
    lines = [f"| N x K ({_card(results)}M = 1) | BitNet W2A8 (µs) | ours, W2A8 (µs) | BitNet / ours | cuBLAS bf16 (µs) |",
             "|---|---|---|---|---|"]
    lines += [f"| {shape} | {us(peer)} | {us(ours)} ({series_label(s)}) | **{peer / ours:.2f}x** | {us(cub)} |"
              for shape, peer, ours, s, cub in rows]
    ratios = [p / o for _, p, o, _, _ in rows]
    return {"rows": rows, "worst": min(ratios), "best": max(ratios), "table": "\n".join(lines)}

