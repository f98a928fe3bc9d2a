"""What reads chapter 5's benchmark results (``assets/bench/<gpu>/ternary.json``): the series' names, the view
of a file on the GPU clock, the targets, the headline and the figures.

Every time here is on the **GPU clock** (the call replayed in a CUDA graph, weights rotated among copies that
together exceed L2; ``studylog.bench``). Files written since the chapter moved to that clock (``"schema": 2``)
have it as each row's ``ms`` (``"clock": "gpu"``, with ``spread_ms`` over three repetitions and ``host_ms``);
older files recorded do_bench's time as ``ms`` and the CUDA-graph time, where they had one, as ``graph_ms``:
:func:`on_gpu_clock` reads both the same way and leaves out what an older file has on no GPU clock.
"""

from __future__ import annotations

from typing import Any, Optional

from studylog.ternary.cuda_steps import PROBES
from studylog.ternary.steps import SERIES, STEPS
from studylog.ternary.w2a8 import W2A8_QUANTIZE

# ----------------------------------------------------------------------------------------------
# Series
# ----------------------------------------------------------------------------------------------

#: Step 12 with x quantised at each place, a series of its own at M = 1 where it is not the default.
W2A8_PLACE_SERIES = {where: f"{SERIES[12]}_{where.replace(' ', '_')}" for where in W2A8_QUANTIZE}
#: Each probe build of steps 11 and 12: its series.
PROBE_SERIES = {(step, probe): f"{SERIES[step]}_probe_{probe}" for step in (11, 12) for probe in PROBES}
#: The peers (studylog/ternary/peers.py).
GEMLITE = "gemlite_w2"
INT_MM = "torch_int_mm"
INT_MM_MATMUL = "torch_int_mm_matmul"
CUBLAS = "cublas_bf16"

#: The series that are not steps: what each one is (CHAPTER.baselines; figure legends and tables).
BASELINES = {
    CUBLAS: "cuBLAS bf16 (torch x @ W.T, the same ternary W stored densely)",
    GEMLITE: "GemLite, 2-bit weights, bf16 x (its BitNet layout: codes w + 1, zero 1, one scale a row; its autotune)",
    INT_MM: "torch._int_mm W8A8: x quantised to int8 as W2A8 does, int8 weights, rows padded to 17, divided in float32",
    INT_MM_MATMUL: "torch._int_mm alone: the int8 GEMM of x already quantised and padded (int32 out)",
    "peak_bf16_matmul": "a dense 8192^3 bf16 matmul (cuBLAS): the MMA peak of this run",
    "peak_int8_matmul": "a dense 8192^3 int8 matmul (torch._int_mm): the int8 MMA peak of this run",
    "read_weights": "a kernel that only reads the 2-bit weights (read_only.cu): the floor a kernel meets",
    **{series: f"{STEPS[11].name}, x quantised at quantize={where!r}" for where, series in W2A8_PLACE_SERIES.items()},
    **{series: f"{STEPS[step - 1].name}, {what} (a probe build)" for (step, probe), series in PROBE_SERIES.items()
       for what in [PROBES[probe]]},
}

#: Ours with bf16 x, the product cuBLAS and GemLite compute.
FLOAT_X_SERIES = [SERIES[n] for n in (1, 2, 3, 4, 5, 6, 7, 9, 10, 11)]
#: Ours computing the W2A8 product from bf16 x, x quantised inside the call (step 8 takes x already
#: quantised, so it is not among them).
W2A8_SERIES = [SERIES[12], SERIES[13], *W2A8_PLACE_SERIES.values()]
#: Series timed at M = 1 (every step), and at M > 1 (the steps made for several rows of x).
M1_SERIES = [SERIES[n] for n in range(1, 14)]
BATCH_SERIES = [SERIES[n] for n in (5, 7, 8, 9, 10, 11, 12, 13)]


def series_label(series: str) -> str:
    """A series' legend: its step's name (``step12_w2a8``), or what a baseline or peer is."""
    for s in STEPS:
        if series == s.series:
            return s.name
    return BASELINES.get(series, series)


# ----------------------------------------------------------------------------------------------
# One clock
# ----------------------------------------------------------------------------------------------

def is_one_clock(results) -> bool:
    """Whether the file was written by the one-clock bench (its rows' ``ms`` are GPU clock)."""
    return results.data.get("schema", 1) >= 2


def on_gpu_clock(results):
    """The rows of ``results`` that have a GPU-clock time, with it as ``ms`` and ``"clock": "gpu"``: a schema-2
    file's GPU rows as they are, an older file's rows that have a ``graph_ms`` with that time (no spread: one
    repetition). Rows on other clocks (the peak matmuls' do_bench) are left out."""
    from studylog.plotting import Results

    rows = []
    for row in results.rows:
        if row.get("clock") == "gpu":
            rows.append(row)
        elif "clock" not in row and "graph_ms" in row:
            rows.append({**row, "ms": row["graph_ms"], "clock": "gpu"})
    return Results(results.path, {**results.data, "measurements": rows})


def shapes_in(results) -> list[str]:
    """The shapes (``NxK``) of a results file, in the order they were measured."""
    seen: dict[str, None] = {}
    for row in results.rows:
        if "shape" in row["params"]:
            seen.setdefault(row["params"]["shape"], None)
    return list(seen)


def series_ms(results, series: str, **params) -> Optional[float]:
    """The GPU-clock time (ms) of the row of ``series`` matching ``params``, or None."""
    rows = on_gpu_clock(results).select(series, **params)
    return rows[0]["ms"] if rows else None


def fastest(results, series: list[str], **params) -> tuple[Optional[dict], Optional[str]]:
    """(row, series) of the fastest of ``series`` at ``params`` on the GPU clock, or (None, None)."""
    view = on_gpu_clock(results)
    found = [(r, s) for s in series for r in view.select(s, **params)]
    return min(found, key=lambda t: t[0]["ms"]) if found else (None, None)


def _us(ms: Optional[float]) -> str:
    return "–" if ms is None else f"{ms * 1e3:.1f}"


# ----------------------------------------------------------------------------------------------
# Targets and headline
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
                 f"our 2-bit weights ({_us(read[0]['ms'])} µs), bound by latency (launch, x's first trip, the "
                 "stream's start): a card with more bandwidth speeds cuBLAS up more than it speeds us")
    return text


def target_checks(results) -> list[dict[str, Any]]:
    """The targets, on the GPU clock: each {"target", "met" (True, False, or None where not measured), "detail"
    (the numbers), "short_by" (where missed: the factor still missing)}."""
    view = on_gpu_clock(results)
    out = []

    def add(target, met, detail, short_by=None):
        out.append({"target": target, "met": met, "detail": detail or "not measured", "short_by": short_by})

    for shape, m, want in CUBLAS_TARGETS:
        base = view.select(CUBLAS, shape=shape, m=m)
        row, s = fastest(view, FLOAT_X_SERIES + W2A8_SERIES, shape=shape, m=m)
        target = f"M={m}, {shape}: >= {want:.0f}x faster than cuBLAS bf16"
        if not base or row is None:
            add(target, None, "")
            continue
        ratio = base[0]["ms"] / row["ms"]
        parts = [f"{series_label(s)} {_us(row['ms'])} µs against {_us(base[0]['ms'])} µs: {ratio:.2f}x"]
        bf16, s16 = fastest(view, FLOAT_X_SERIES, shape=shape, m=m)
        if bf16 is not None and s16 != s:
            parts.append(f"with bf16 x, {series_label(s16)} {_us(bf16['ms'])} µs: {base[0]['ms'] / bf16['ms']:.2f}x")
        if ratio < want:
            parts.append(_bandwidth_note(view, shape, m))
        add(target, ratio >= want, "; ".join(p for p in parts if p), None if ratio >= want else want / ratio)
    shapes, factor = FLOOR_TARGET
    for shape in shapes:
        row, s = fastest(view, FLOAT_X_SERIES + W2A8_SERIES, shape=shape, m=1)
        target = f"M=1, {shape}: within {factor:.0f}x of the 2-bit floor"
        if row is None or "floor_ms" not in row:
            add(target, None, "")
            continue
        times = row["ms"] / row["floor_ms"]
        detail = f"{series_label(s)} {_us(row['ms'])} µs, {times:.2f}x the floor ({_us(row['floor_ms'])} µs)"
        read = view.select("read_weights", shape=shape, m=1)
        if read:
            detail += f"; a kernel that only reads the weights: {_us(read[0]['ms'])} µs"
        add(target, times <= factor, detail, None if times <= factor else times / factor)
    # the peers, at M = 1
    ratios = {}
    for shape in shapes_in(view):
        gem = view.select(GEMLITE, shape=shape, m=1)
        row, s = fastest(view, FLOAT_X_SERIES, shape=shape, m=1)
        if gem and row is not None:
            ratios[shape] = (gem[0]["ms"] / row["ms"], s)
    detail = ", ".join(f"{shape} {r:.2f}x ({series_label(s)})" for shape, (r, s) in ratios.items())
    worst = min((r for r, _ in ratios.values()), default=None)
    add("M=1: faster than GemLite (2-bit, bf16 x) at every shape", None if worst is None else worst > 1.0, detail,
        None if worst is None or worst > 1.0 else 1.0 / worst)
    main = ratios.get(GEMLITE_MAIN_SHAPE)
    add(f"M=1, {GEMLITE_MAIN_SHAPE}: >= {GEMLITE_MAIN_FACTOR}x faster than GemLite", None if main is None else
        main[0] >= GEMLITE_MAIN_FACTOR, "" if main is None else f"{main[0]:.2f}x ({series_label(main[1])})",
        None if main is None or main[0] >= GEMLITE_MAIN_FACTOR else GEMLITE_MAIN_FACTOR / main[0])
    ratios = {}
    for shape in shapes_in(view):
        mm = view.select(INT_MM, shape=shape, m=1)
        row, s = fastest(view, W2A8_SERIES, shape=shape, m=1)
        if mm and row is not None:
            alone = view.select(INT_MM_MATMUL, shape=shape, m=1)
            ratios[shape] = (mm[0]["ms"] / row["ms"], s, alone[0]["ms"] / row["ms"] if alone else None)
    detail = ", ".join(f"{shape} {r:.2f}x ({series_label(s)}" + (f"; {a:.2f}x the int8 GEMM alone)" if a else ")")
                       for shape, (r, s, a) in ratios.items())
    worst = min((r for r, _, _ in ratios.values()), default=None)
    add(f"M=1: W2A8 >= {INT_MM_FACTOR}x faster than torch._int_mm (x quantised, rows padded) at every shape",
        None if worst is None else worst >= INT_MM_FACTOR, detail,
        None if worst is None or worst >= INT_MM_FACTOR else INT_MM_FACTOR / worst)
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


def headline(results) -> list[dict]:
    """The book's headline rows, on the GPU clock (``plotting.headline_row``): the chapter's fastest bf16-x kernel
    against cuBLAS bf16 at M = 1 and 16 (4096 x 14336) and M = 1 (8192 x 28672); at M = 1, 4096 x 14336, the
    same against GemLite and the fastest W2A8 kernel against torch._int_mm, where the run has them."""
    from studylog.plotting import headline_row

    view = on_gpu_clock(results)
    rows = []

    def label(series):
        step = next(st for st in STEPS if series.startswith(st.series))
        where = next((f", quantize={q!r}" for q, s in W2A8_PLACE_SERIES.items() if s == series), "")
        return f"{step.name}{where} ({'CUDA C++' if step.language == 'cuda' else 'Triton'})"

    def case(shape, m, what="bf16 x"):
        n, k = shape.split("x")
        return f"M = {m}, N x K = {n} x {k}, {what}"

    for shape, m in (("4096x14336", 1), ("4096x14336", 16), ("8192x28672", 1)):
        row, series = fastest(view, FLOAT_X_SERIES, shape=shape, m=m)
        if row is None or not view.select(CUBLAS, shape=shape, m=m):
            continue
        rows.append(headline_row(view, series, CUBLAS, case(shape, m), kernel_label=label(series),
                                 baseline_label="cuBLAS bf16 (torch x @ W.T, both in a CUDA graph)", shape=shape, m=m))
    shape = GEMLITE_MAIN_SHAPE
    row, series = fastest(view, FLOAT_X_SERIES, shape=shape, m=1)
    if row is not None and view.select(GEMLITE, shape=shape, m=1):
        rows.append(headline_row(view, series, GEMLITE, case(shape, 1), kernel_label=label(series),
                                 baseline_label="GemLite 2-bit (bf16 x, its autotune)", shape=shape, m=1))
    row, series = fastest(view, W2A8_SERIES, shape=shape, m=1)
    if row is not None and view.select(INT_MM, shape=shape, m=1):
        rows.append(headline_row(view, series, INT_MM, case(shape, 1, "x quantised to int8 in the call"),
                                 kernel_label=label(series),
                                 baseline_label="torch._int_mm W8A8 (int8 weights, rows padded to 17)",
                                 shape=shape, m=1))
    return rows


# ----------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------

def _caption(results, view) -> str:
    text = results.caption()
    if not is_one_clock(results):
        text += ("\nMeasured before the one-clock bench: only what this file timed in a CUDA graph is shown; "
                 "a fresh run times every series that way.")
    return text


#: One colour per series across the chapter (figures of both lessons): the steps, the baselines and the peers.
SERIES_COLOURS = {
    CUBLAS: "#404040", "read_weights": "#a0a0a0", GEMLITE: "#8c564b", INT_MM: "#bcbd22", INT_MM_MATMUL: "#dbdb8d",
    **dict(zip((SERIES[n] for n in range(1, 14)),
               ("#aec7e8", "#ffbb78", "#98df8a", "#1f77b4", "#ff7f0e", "#9edae5", "#c5b0d5", "#f7b6d2", "#2ca02c",
                "#17becf", "#9467bd", "#d62728", "#e377c2"))),
    W2A8_PLACE_SERIES["every block"]: "#ff9896", W2A8_PLACE_SERIES["separate"]: "#c49c94",
}
#: Text sizes of the figures (points at the saved size).
FONT, SMALL = 10, 9


def series_colour(series: str) -> str:
    return SERIES_COLOURS.get(series, "#7f7f7f")


def _short(series: str) -> str:
    """A legend entry: the step's name, or the baseline's or peer's short name."""
    return {CUBLAS: "cuBLAS bf16", "read_weights": "only reading the 2-bit weights", GEMLITE: "GemLite 2-bit (peer)",
            INT_MM: "torch._int_mm W8A8 (peer)", INT_MM_MATMUL: "torch._int_mm, the GEMM alone"}.get(
        series, series_label(series).split(" (")[0].replace("step12_w2a8, x quantised at ", "step12_w2a8, "))


def _ratio_err(base: dict, mine: dict):
    """(value, [low error, high error]) of the speedup base / mine, with the range over the repetitions."""
    value = base["ms"] / mine["ms"]
    if "spread_ms" in base and "spread_ms" in mine:
        lo, hi = base["spread_ms"][0] / mine["spread_ms"][2], base["spread_ms"][2] / mine["spread_ms"][0]
        return value, [value - lo, hi - value]
    return value, [0.0, 0.0]


def _bars(ax, shapes, series, value):
    """Grouped bars: for each shape, one bar a series (value(series, shape) -> (v, [lo, hi]) or None)."""
    import numpy as np

    width = 0.8 / max(1, len(series))
    for i, s in enumerate(series):
        vals, errs = [], [[], []]
        for shape in shapes:
            got = value(s, shape)
            vals.append(np.nan if got is None else got[0])
            errs[0].append(0.0 if got is None else got[1][0])
            errs[1].append(0.0 if got is None else got[1][1])
        peer = s in (GEMLITE, INT_MM)
        spread = errs if any(e > 0 for e in errs[0] + errs[1]) else None
        ax.bar(np.arange(len(shapes)) + (i - (len(series) - 1) / 2) * width, vals, width, yerr=spread, capsize=2,
               color=series_colour(s), hatch="//" if peer else None, edgecolor="k" if peer else None, linewidth=0.3,
               error_kw={"elinewidth": 0.8}, label=_short(s))
    ax.set_xticks(range(len(shapes)), [s.replace("x", " x ") for s in shapes], rotation=25, ha="right",
                  fontsize=SMALL)
    ax.tick_params(axis="y", labelsize=SMALL)
    ax.grid(True, axis="y", alpha=0.3)


def _head(fig, text: str) -> None:
    """The file's caption at the top of a figure, wrapped to its width."""
    import textwrap

    width = int(fig.get_size_inches()[0] * 15)
    fig.text(0.5, 0.995, "\n".join(textwrap.fill(line, width) for line in text.split("\n")), ha="center", va="top",
             fontsize=SMALL - 1)


def _legend_below(fig, axes, ncol=3):
    handles, labels = {}, {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=SMALL,
               frameon=False, bbox_to_anchor=(0.5, 0.0))


def figures(results) -> dict:
    """GPU clock, one colour per series (:data:`SERIES_COLOURS`), legends below the panels, spread where the file
    has it. speedup: M = 1, speedup over cuBLAS bf16 per shape (the targets in red); speedup_batched: the same at
    M = 16 and 128; floor: M = 1, time over the 2-bit floor; steps: M = 1, the time of every step on the Llama
    shapes; peers: our fastest over GemLite and torch._int_mm."""
    import matplotlib.pyplot as plt

    view = on_gpu_clock(results)
    shapes = shapes_in(view)
    ms_present = sorted({r["params"]["m"] for r in view.rows if "m" in r["params"]})
    caption = _caption(results, view)
    figs = {}

    def speedup(m):
        def value(s, shape):
            base, mine = view.select(CUBLAS, shape=shape, m=m), view.select(s, shape=shape, m=m)
            return _ratio_err(base[0], mine[0]) if base and mine else None
        return value

    def panel_series(m):
        wanted = [SERIES[n] for n in ((4, 6, 9, 10, 11, 12, 13) if m == 1 else (5, 7, 8, 9, 10, 11, 12, 13))]
        return [s for s in wanted + [GEMLITE, INT_MM] if view.select(s, m=m)]

    def targets(ax, m):
        for shape, mm, want in CUBLAS_TARGETS:
            if mm == m and shape in shapes:
                j = shapes.index(shape)
                ax.plot([j - 0.45, j + 0.45], [want, want], "r--", lw=1.4, label="target")

    if 1 in ms_present and view.select(CUBLAS, m=1):
        series = panel_series(1)
        fig, ax = plt.subplots(figsize=(9, 5.2))
        _bars(ax, shapes, series, speedup(1))
        ax.axhline(1.0, color="k", lw=1)
        targets(ax, 1)
        ax.set_ylabel("speedup over cuBLAS bf16 (GPU clock)", fontsize=FONT)
        ax.set_title("One row of x (M = 1): each kernel's speedup over cuBLAS bf16", fontsize=FONT + 1)
        _head(fig, caption)
        fig.tight_layout(rect=(0, 0.11, 1, 0.94))
        _legend_below(fig, [ax], ncol=4)
        figs["speedup"] = fig

    batched = [m for m in ms_present if m > 1 and view.select(CUBLAS, m=m)][:3]
    if batched:
        fig, axes = plt.subplots(1, len(batched), figsize=(max(9.0, 5 * len(batched) + 0.5), 5.2), squeeze=False)
        for ax, m in zip(axes[0], batched):
            _bars(ax, shapes, panel_series(m), speedup(m))
            ax.axhline(1.0, color="k", lw=1)
            targets(ax, m)
            ax.set_ylabel("speedup over cuBLAS bf16 (GPU clock)", fontsize=FONT)
            ax.set_title(f"M = {m} rows of x", fontsize=FONT + 1)
        _head(fig, caption)
        fig.tight_layout(rect=(0, 0.16, 1, 0.94))
        _legend_below(fig, list(axes[0]), ncol=4)
        figs["speedup_batched"] = fig

    floor_series = [s for s in [SERIES[n] for n in (4, 6, 9, 10, 11, 12, 13)] + ["read_weights", GEMLITE, CUBLAS]
                    if any("floor_ms" in r for r in view.select(s, m=1))]
    if floor_series:
        def over_floor(s, shape):
            rows = [r for r in view.select(s, shape=shape, m=1) if "floor_ms" in r]
            floor = next((r["floor_ms"] for r in view.select(SERIES[11], shape=shape, m=1) if "floor_ms" in r), None)
            floor = floor or next((r["floor_ms"] for r in view.select("read_weights", shape=shape, m=1)), None)
            if not rows or not floor:
                return None
            r = rows[0]
            lo_hi = [(r["ms"] - r["spread_ms"][0]) / floor, (r["spread_ms"][2] - r["ms"]) / floor] \
                if "spread_ms" in r else [0.0, 0.0]
            return r["ms"] / floor, lo_hi
        shown = [s for s in floor_series if s != CUBLAS]
        fig, ax = plt.subplots(figsize=(9, 5.2))
        _bars(ax, shapes, shown, over_floor)
        ax.axhline(1.0, color="k", lw=1, label="the 2-bit floor")
        ax.axhline(FLOOR_TARGET[1], color="r", ls="--", lw=1.2, label=f"target: {FLOOR_TARGET[1]:.0f} x the floor")
        ax.set_ylabel("GPU time / 2-bit bandwidth floor", fontsize=FONT)
        ax.set_title("One row of x (M = 1): time over the 2-bit floor (bytes / copy bandwidth)", fontsize=FONT + 1)
        _head(fig, caption)
        fig.tight_layout(rect=(0, 0.11, 1, 0.94))
        _legend_below(fig, [ax], ncol=4)
        figs["floor"] = fig

    llama = [s for s in shapes if view.select(CUBLAS, shape=s, family="llama", m=1)]
    steps = [s for s in [CUBLAS] + M1_SERIES + ["read_weights", GEMLITE] if view.select(s, m=1)]
    if llama and steps:
        def time_us(s, shape):
            rows = view.select(s, shape=shape, m=1)
            if not rows:
                return None
            r = rows[0]
            err = [(r["ms"] - r["spread_ms"][0]) * 1e3, (r["spread_ms"][2] - r["ms"]) * 1e3] \
                if "spread_ms" in r else [0.0, 0.0]
            return r["ms"] * 1e3, err
        fig, ax = plt.subplots(figsize=(9, 6.2))
        _bars(ax, llama, steps, time_us)
        ax.set_yscale("log")
        ax.set_ylabel("GPU time (µs, median)", fontsize=FONT)
        ax.set_title("One row of x (M = 1): every step's GPU time on the Llama shapes", fontsize=FONT + 1)
        _head(fig, caption)
        fig.tight_layout(rect=(0, 0.2, 1, 0.94))  # room below for the shapes' labels and a legend of four rows
        _legend_below(fig, [ax], ncol=4)
        figs["steps"] = fig

    peer_ms = [m for m in ms_present if view.select(GEMLITE, m=m) or view.select(INT_MM, m=m)][:3]
    if peer_ms:
        height = 3.3 * len(peer_ms) + 1.6  # one panel per M, stacked so the figure reads at page width
        fig, axes = plt.subplots(len(peer_ms), 1, figsize=(9, height), squeeze=False)
        for ax, m in zip(axes[:, 0], peer_ms):
            def over_peer(peer, shape, m=m):
                ours = FLOAT_X_SERIES if peer == GEMLITE else W2A8_SERIES
                p = view.select(peer, shape=shape, m=m)
                row, _ = fastest(view, ours, shape=shape, m=m)
                return _ratio_err(p[0], row) if p and row is not None else None
            _bars(ax, shapes, [GEMLITE, INT_MM], over_peer)
            ax.axhline(1.0, color="k", lw=1)
            ax.set_ylabel("peer's time / our fastest's (GPU clock)", fontsize=FONT)
            ax.set_title(f"M = {m}", fontsize=FONT + 1)
        _head(fig, "Our fastest kernel against the peers: GemLite against bf16 x, torch._int_mm against W2A8\n"
              + caption)
        fig.tight_layout(rect=(0, 0.55 / height, 1, 1 - 0.75 / height))
        _legend_below(fig, list(axes[:, 0]), ncol=2)
        figs["peers"] = fig
    return figs
