"""Chapter 5's result tables from the committed benchmark file (``assets/bench/<gpu>/ternary.json``), on the GPU
clock: each step's speedup over cuBLAS bf16 per shape, our fastest against the peers; and step 23's timeline
figure from the in-kernel timestamps of ``lab/ternary/w2a8_timeline.py``; the chapter's targets
(:func:`target_checks`)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable, Optional

from book.common import lab_or_none, param_values, us
from studylog.plotting import Results
from studylog.ternary import CHAPTER
from studylog.ternary.results import (BITNET, CUBLAS, FLOAT_X_SERIES, GEMLITE, INT_MM, INT_MM_MATMUL, PLAN,
                                      W2A8_SERIES, fastest, on_gpu_clock)
from studylog.ternary.report import BATCH_STEPS
from studylog.ternary.steps import SERIES

__all__ = ["speedup_table", "peers_table", "timeline_figure", "prefill", "host_over_gpu", "bitnet_table", "bitnet_host", "bitnet_results", "BITNET_OURS",
           "series_label", "step_label", "STEP_SHORT", "shapes_in", "failed_peer_checks", "target_checks"]

#: what BitNet's kernel (one row of x only) is compared with: step 23, the one-row W2A8 kernel, at its default
#: launch. One kernel, as a deployer calls it, not the faster of steps 23 and 25 picked per shape after the fact.
BITNET_OURS = SERIES[23]
#: the lab's run with BitNet's W2A8 kernel beside ours (``lab/ternary/results/nvidia-h200/``; lab/ternary/README.md),
#: read where the chapter's own run has no BitNet rows (:func:`bitnet_results`)
BITNET_RUN = "ternary_bitnet_quick"
#: Series timed at M = 1 (every step), and at M > 1 (the steps made for several rows of x).
M1_SERIES = [SERIES[n] for n in range(1, 26)]
BATCH_SERIES = [SERIES[n] for n in BATCH_STEPS]


#: What each step is, in a few words: the label "step N: ..." that tables and figures give it (:func:`step_label`).
STEP_SHORT = {1: "sign selection", 2: "int8 weights", 3: "2 bits, shift and mask", 4: "the AND decode",
              5: "8 rows a program", 6: "tl.dot", 7: "base 3, one row", 8: "base 3, tl.dot", 9: "W2A8 in Triton",
              10: "tensor-core configs", 11: "two weights an AND", 12: "no masks", 13: "the 2bit_mma layout",
              14: "split K, no memset", 15: "mma.sync by hand", 16: "K split across blocks",
              17: "x in shared memory", 18: "the TMA ring", 19: "the warps share K", 20: "one copy a tile",
              21: "the constant in a register", 22: "W2A8, separate quantise", 23: "W2A8, fused quantise",
              24: "a tile a warp", 25: "x by the TMA"}


def step_label(step) -> str:
    """A step (its number or its series) as the page names it: "step 21: the constant in a register"; any other
    series as :func:`series_label` names it."""
    number = step if isinstance(step, int) else next((n for n, s in SERIES.items() if s == step), None)
    return series_label(step) if number is None else f"step {number}: {STEP_SHORT[number]}"


def series_label(series: str) -> str:
    """A series' legend: its step's name (``step23_w2a8_fused``), or what a baseline or peer is."""
    return CHAPTER.label(series)


def shapes_in(results) -> list[str]:
    """The shapes (``NxK``) of a results file, in the order they were measured."""
    return param_values(results, "shape")


def failed_peer_checks(data: dict) -> set[tuple[str, str, object]]:
    """(series, shape, M) of each failed check of a peer's output in a results file
    (:func:`studylog.bench.failed_checks` with ``peers``), the series read from the check's name (``"gemlite_w2 within bf16 rounding of float64"``); M is
    None where the check is not per M."""
    from studylog.bench import failed_checks

    return {(c["name"].split(" ", 1)[0], c["params"].get("shape"), c["params"].get("m"))
            for c in failed_checks(data, peers=True)}


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
    head = ["shape", "cuBLAS bf16 (µs)"] + [f"{series_label(s)} (µs, ×)" for s in ours] + \
        [f"{'GemLite' if s == GEMLITE else 'torch._int_mm'} (µs, ×)" for s in peers] + ["2-bit floor (µs)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape in shapes_in(view):
        base = series_ms(view, CUBLAS, shape=shape, m=m)
        if base is None:
            continue
        cells = [shape, us(base)]
        for s in ours + peers:
            t = series_ms(view, s, shape=shape, m=m)
            cells.append("–" if t is None else f"{t * 1e3:.1f} ({base / t:.1f}×)")
        floors = [r["floor_ms"] for s in (SERIES[5], SERIES[6], SERIES[14], SERIES[21])
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
                      f"**{gem[0]['ms'] / row['ms']:.2f}×**" if gem and row else "–"]
            row, s = fastest(view, W2A8_SERIES, shape=shape, m=m)
            alone = view.select(INT_MM_MATMUL, shape=shape, m=m)
            cells += [f"{us(row['ms'])} ({series_label(s)})" if row else "–",
                      (us(mm[0]["ms"]) if mm else "–") + (f" ({us(alone[0]['ms'])})" if alone else ""),
                      f"**{mm[0]['ms'] / row['ms']:.2f}×**" if mm and row else "–"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def timeline_figure(timeline: dict, title: str = "Step 23 at M = 1: where a block's time goes (in-kernel "
                                                   "timestamps)"):
    """Step 23's blocks over time, from lab/ternary/w2a8_timeline.py's output (``plotting.load_lab``): for each
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
    """At ``m`` rows of x (prefill), per shape, cuBLAS bf16 against ``series`` (ours, default the W2A8 steps 23
    and 13 and the fastest of all ours): ``{"rows": [(shape, cuBLAS ms, {series: ms})], "ratio": {series: (lowest,
    highest)} of cuBLAS time over ours, "table": markdown}`` on the GPU clock."""
    view = on_gpu_clock(results)
    series = list(series or (SERIES[23], SERIES[25]))
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
    head = [f"shape ({_card(results)}M = {m})", "cuBLAS bf16 (µs)"] + [f"{step_label(s)} (µs, × cuBLAS)" for s in series] + \
        ["fastest of ours (µs, × cuBLAS)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, base, times, name in rows:
        cells = [shape.replace("x", " × "), us(base)] + [("–" if times[s] is None else f"{us(times[s])} ({base / times[s]:.2f}×)")
                                     for s in series]
        t = times["fastest"]
        cells.append("–" if t is None else f"{us(t)} ({base / t:.2f}×, {step_label(name)})")
        lines.append("| " + " | ".join(cells) + " |")
    return {"rows": rows, "ratio": {s: (min(r), max(r)) if r else None for s, r in ratios.items()},
            "table": "\n".join(lines) if rows else f"(no GPU-clock times at M = {m} in this file)"}


def host_over_gpu(results, m: int = 1, series=(SERIES[23], SERIES[25])) -> tuple[float, float] | None:
    """The lowest and highest host time per call (eager, back-to-back) over GPU time of ``series`` at ``m`` rows,
    over every shape of the file: how many times longer the Python call takes than the kernel it launches."""
    view = on_gpu_clock(results)
    r = [row["host_ms"] / row["ms"] for s in series for row in view.select(s, m=m) if "host_ms" in row]
    return (min(r), max(r)) if r else None


def bitnet_results(results) -> Optional[Results]:
    """The run that times BitNet's W2A8 kernel beside ours on the card of ``results``: ``results`` itself where it
    has BitNet's rows, else the lab's quick run (:data:`BITNET_RUN`) of that card, else None."""
    if results is None:
        return None
    if results.select(BITNET):
        return results
    gpu = Path(results.path).parent.name if getattr(results, "path", None) is not None else None
    data = lab_or_none("ternary", BITNET_RUN, gpu) if gpu else None
    return Results(None, data) if data is not None else None


def bitnet_table(results) -> dict:
    """Ours (step 23, :data:`BITNET_OURS`, x quantised inside the call) against BitNet's W2A8 kernel (x already int8) at
    M = 1, at every (N, K) its kernel is compiled for: ``{"rows": [(shape, BitNet ms, ours ms, our series)],
    "worst"/"best": the lowest/highest BitNet / ours, "table": markdown, "checks"/"passed": how many float64 checks
    of BitNet's output the file has, and how many passed}``; ``None`` where the file has no BitNet rows."""
    view = on_gpu_clock(results)
    rows = []
    for shape in shapes_in(view):
        peer = series_ms(view, BITNET, shape=shape, m=1)
        row, s = fastest(view, (BITNET_OURS,), shape=shape, m=1)
        if peer is not None and row is not None:
            rows.append((shape, peer, row["ms"], s, series_ms(view, CUBLAS, shape=shape, m=1)))
    if not rows:
        return None
    lines = [f"| N × K ({_card(results)}M = 1) | BitNet W2A8 (µs) | ours, step 23 (µs) | BitNet / step 23 "
             "| step 25 (µs) |", "|---|---|---|---|---|"]
    for shape, peer, ours, _, _ in rows:  # step 25 beside step 23, bold where it is the faster of the two
        t25 = series_ms(view, SERIES[25], shape=shape, m=1)
        cell = "–" if t25 is None else (f"**{us(t25)}**" if t25 < ours else us(t25))
        lines.append(f"| {shape.replace('x', ' × ')} | {us(peer)} | {us(ours)} | {peer / ours:.2f}× | {cell} |")
    ratios = [p / o for _, p, o, _, _ in rows]
    checks = [c for c in results.data.get("checks", []) if c["name"].startswith(f"{BITNET} ")]
    return {"rows": rows, "worst": min(ratios), "best": max(ratios), "table": "\n".join(lines),
            "checks": len(checks), "passed": sum(c["passed"] for c in checks)}


def bitnet_host(results) -> Optional[dict]:
    """The host time per call (eager, back-to-back Python calls) of BitNet's W2A8 kernel and of ours (the series
    :func:`bitnet_table` compares at each shape) at M = 1, from the run with BitNet's kernel: ``{"rows": [(shape,
    BitNet host ms, BitNet GPU ms, our host ms, our GPU ms, our series)], "bitnet"/"ours": (lowest, highest) host
    ms, "medians": (BitNet's, ours) median over the shapes of the per-shape medians (ms), "noisiest": (shape, lowest,
    highest repetition, ms) where our host time spread widest, "host_bound": whether our host time exceeds our GPU
    time at every shape, "slower_eager": at how many shapes our call's lower bound when called eagerly (the longer of
    its host and GPU times) exceeds BitNet's, "plan": step 23 through W2A8Plan where the run timed it at every shape
    (``{"host": (lowest, highest) ms, "median", "slower_eager", "host_bound": at how many shapes its host time
    exceeds its GPU time}``, else None), "table": markdown of the host times}``; ``None`` where the file has no
    BitNet rows with a host time. BitNet's call takes x already quantised (its model quantises with torch ops first, launches not counted here); ours quantises x
    inside the call."""
    table = bitnet_table(results)
    if table is None:
        return None
    view = on_gpu_clock(results)
    rows = []
    for shape, peer_ms, ours_ms, s, _ in table["rows"]:
        peer, ours = (view.select(name, shape=shape, m=1) for name in (BITNET, s))
        if peer and ours and "host_ms" in peer[0] and "host_ms" in ours[0]:
            rows.append((shape, peer[0]["host_ms"], peer_ms, ours[0]["host_ms"], ours_ms, s))
    if not rows:
        return None
    # step 23 through W2A8Plan (checks and choices made once a layer), where the run timed it: (host, GPU) ms
    plan = {shape: (r[0]["host_ms"], r[0]["ms"]) for shape, *_ in rows
            for r in [view.select(PLAN, shape=shape, m=1)] if r and "host_ms" in r[0]}
    lines = [f"| N × K ({_card(results)}M = 1) | BitNet W2A8: host per call (µs) | step 23: host per call (µs) |"
             + (" step 23 through its plan (µs) |" if plan else ""), "|---|---|---|" + ("---|" if plan else "")]
    lines += [f"| {shape.replace('x', ' × ')} | {us(bh)} | {us(oh)} |" + (f" {us(plan[shape][0])} |" if plan else "")
              for shape, bh, _, oh, _, _ in rows]
    # each host time is a median of repetitions; how far ours spread at one shape says how much of the range
    # across shapes is run noise
    spreads = [(r["host_spread_ms"][2] - r["host_spread_ms"][0], shape, r["host_spread_ms"])
               for shape, *_, s in rows for r in view.select(s, shape=shape, m=1) if "host_spread_ms" in r]
    noisiest = max(spreads) if spreads else None
    return {"rows": rows, "bitnet": (min(r[1] for r in rows), max(r[1] for r in rows)),
            "ours": (min(r[3] for r in rows), max(r[3] for r in rows)),
            "medians": (statistics.median(r[1] for r in rows), statistics.median(r[3] for r in rows)),
            "noisiest": None if noisiest is None else (noisiest[1], noisiest[2][0], noisiest[2][2]),
            "host_bound": all(oh > og for _, _, _, oh, og, _ in rows),
            "slower_eager": sum(max(oh, og) > max(bh, bg) for _, bh, bg, oh, og, _ in rows),
            "plan": None if len(plan) < len(rows) else {
                "host": (min(h for h, _ in plan.values()), max(h for h, _ in plan.values())),
                "median": statistics.median(h for h, _ in plan.values()),
                "slower_eager": sum(max(plan[shape]) > max(bh, bg) for shape, bh, bg, *_ in rows),
                "host_bound": sum(h > g for h, g in plan.values())},
            "table": "\n".join(lines)}


# ----------------------------------------------------------------------------------------------
# The chapter's targets
# ----------------------------------------------------------------------------------------------

#: (shape, M, how many times faster than cuBLAS bf16) of the targets.
CUBLAS_TARGETS = (("4096x14336", 1, 4.0), ("8192x28672", 1, 6.0), ("4096x14336", 16, 3.0))
#: (shapes, most our time may be, in multiples of the 2-bit floor).
FLOOR_TARGET = (("4096x14336", "8192x28672"), 2.0)
#: Against the peers at M = 1: faster than GemLite at every shape, by GEMLITE_MAIN_FACTOR at GEMLITE_MAIN_SHAPE;
#: W2A8 faster than torch._int_mm by INT_MM_FACTOR.
GEMLITE_MAIN_SHAPE, GEMLITE_MAIN_FACTOR, INT_MM_FACTOR = "4096x14336", 1.5, 1.5


def _bandwidth_note(view, shape: str, m: int) -> str:
    """Why a cuBLAS ratio comes out lower on one card than another: how close cuBLAS runs to the copy
    bandwidth (bandwidth-bound), and how far our fastest is from only reading its weights (latency)."""
    base = view.select(CUBLAS, shape=shape, m=m)
    row, s = fastest(view, FLOAT_X_SERIES + W2A8_SERIES, shape=shape, m=m)
    bandwidth = view.data.get("ceilings", {}).get("copy_bandwidth_gbs")
    if not base or row is None or not bandwidth or "bytes" not in base[0]:
        return ""
    share = base[0]["bytes"] / (base[0]["ms"] * 1e-3) / (bandwidth * 1e9)
    text = f"cuBLAS streams its bf16 weights at {share:.0%} of this run's copy bandwidth (bound by bandwidth)"
    read = view.select("read_weights", shape=shape, m=1)
    if read:
        text += (f"; {series_label(s)} takes {row['ms'] / read[0]['ms']:.2f}x the time of a kernel that only reads "
                 f"our 2-bit weights ({us(read[0]['ms'])} µs), bound by latency (launch, x's first trip, the "
                 "stream's start): a card with more bandwidth speeds cuBLAS up more than it speeds us")
    return text


def _peer_ratios(view, peer: str, ours: list[str]) -> dict[str, tuple[float, str, dict]]:
    """Per shape at M = 1 where both were measured: (the peer's time over our fastest of ``ours``, that series,
    its row)."""
    out = {}
    for shape in shapes_in(view):
        theirs = view.select(peer, shape=shape, m=1)
        row, s = fastest(view, ours, shape=shape, m=1)
        if theirs and row is not None:
            out[shape] = (theirs[0]["ms"] / row["ms"], s, row)
    return out


def _worst(ratios: dict) -> Optional[float]:
    return min((r for r, _, _ in ratios.values()), default=None)


def _ratios_text(ratios: dict, more: Callable[[str, dict], str] = lambda shape, row: "") -> str:
    return ", ".join(f"{shape} {r:.2f}x ({series_label(s)}{more(shape, row)})"
                     for shape, (r, s, row) in ratios.items())


def target_checks(results) -> list[dict[str, Any]]:
    """The targets, on the GPU clock: each {"target", "met" (True, False, or None where not measured), "detail"
    (the numbers), "short_by" (where missed: the factor still missing)}."""
    view = on_gpu_clock(results)
    out = []

    def add(target, met, detail, short_by=None):
        out.append({"target": target, "met": met, "detail": detail or "not measured", "short_by": short_by})

    def add_ratio(target, ratio, want, detail, strict=False):
        """A target met when ``ratio`` reaches ``want`` (exceeds it, ``strict``); None where not measured."""
        met = None if ratio is None else (ratio > want if strict else ratio >= want)
        add(target, met, detail, None if met is not False else want / ratio)

    for shape, m, want in CUBLAS_TARGETS:
        base = view.select(CUBLAS, shape=shape, m=m)
        row, s = fastest(view, FLOAT_X_SERIES + W2A8_SERIES, shape=shape, m=m)
        target = f"M={m}, {shape}: >= {want:.0f}x faster than cuBLAS bf16"
        if not base or row is None:
            add(target, None, "")
            continue
        ratio = base[0]["ms"] / row["ms"]
        parts = [f"{series_label(s)} {us(row['ms'])} µs against {us(base[0]['ms'])} µs: {ratio:.2f}x"]
        bf16, s16 = fastest(view, FLOAT_X_SERIES, shape=shape, m=m)
        if bf16 is not None and s16 != s:
            parts.append(f"with bf16 x, {series_label(s16)} {us(bf16['ms'])} µs: {base[0]['ms'] / bf16['ms']:.2f}x")
        if ratio < want:
            parts.append(_bandwidth_note(view, shape, m))
        add_ratio(target, ratio, want, "; ".join(p for p in parts if p))
    shapes, factor = FLOOR_TARGET
    for shape in shapes:
        row, s = fastest(view, FLOAT_X_SERIES + W2A8_SERIES, shape=shape, m=1)
        target = f"M=1, {shape}: within {factor:.0f}x of the 2-bit floor"
        if row is None or "floor_ms" not in row:
            add(target, None, "")
            continue
        times = row["ms"] / row["floor_ms"]
        detail = f"{series_label(s)} {us(row['ms'])} µs, {times:.2f}x the floor ({us(row['floor_ms'])} µs)"
        read = view.select("read_weights", shape=shape, m=1)
        if read:
            detail += f"; a kernel that only reads the weights: {us(read[0]['ms'])} µs"
        add(target, times <= factor, detail, None if times <= factor else times / factor)
    # the peers, at M = 1
    gem = _peer_ratios(view, GEMLITE, FLOAT_X_SERIES)
    add_ratio("M=1: faster than GemLite (2-bit, bf16 x) at every shape", _worst(gem), 1.0, _ratios_text(gem),
              strict=True)
    main = gem.get(GEMLITE_MAIN_SHAPE)
    add_ratio(f"M=1, {GEMLITE_MAIN_SHAPE}: >= {GEMLITE_MAIN_FACTOR}x faster than GemLite", main and main[0],
              GEMLITE_MAIN_FACTOR, "" if main is None else f"{main[0]:.2f}x ({series_label(main[1])})")
    int_mm = _peer_ratios(view, INT_MM, W2A8_SERIES)

    def alone(shape, row):
        rows = view.select(INT_MM_MATMUL, shape=shape, m=1)
        return f"; {rows[0]['ms'] / row['ms']:.2f}x the int8 GEMM alone" if rows else ""

    add_ratio(f"M=1: W2A8 >= {INT_MM_FACTOR}x faster than torch._int_mm (x quantised, rows padded) at every shape",
              _worst(int_mm), INT_MM_FACTOR, _ratios_text(int_mm, alone))
    bitnet = _peer_ratios(view, BITNET, W2A8_SERIES)
    add_ratio("M=1: W2A8 faster than BitNet's W2A8 kernel at every shape it takes", _worst(bitnet), 1.0,
              _ratios_text(bitnet), strict=True)
    from studylog.bench import failed_checks

    checks = results.data.get("checks", [])
    bad, of_peers = failed_checks(results.data), failed_checks(results.data, peers=True)

    def named(cs):
        return ", ".join(f"{c['name']} {c['params'].get('shape', '')} M={c['params'].get('m', '')}" for c in cs[:5])

    add("our results equal their float64 reference", not bad and bool(checks),
        f"{len(checks) - len(bad) - len(of_peers)} of {len(checks) - len(of_peers)} checks of our kernels passed"
        + (f"; failed: {named(bad)}" if bad else "")
        + (f"; a peer's output failed its check (a finding about the peer, not a target): {named(of_peers)}"
           if of_peers else ""))
    return out
