"""What reads chapter 5's benchmark results (``assets/bench/<gpu>/ternary.json``): the series' names, the view
of a file on the GPU clock, the targets (the benchmark notes them) and the headline (the figures and tables are the
book's: ``book.ternary.figures``, ``book.ternary.results``).

Every time here is on the **GPU clock** (the call replayed in a CUDA graph, weights rotated among copies that
together exceed L2; ``studylog.bench``): a row's ``ms`` where its ``"clock"`` is ``"gpu"``, with ``spread_ms`` over
three repetitions and ``host_ms``. :func:`on_gpu_clock` keeps those rows and leaves out the others.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

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
BITNET = "bitnet_w2a8"

#: The series that are not steps: what each one is (CHAPTER.baselines; figure legends and tables).
BASELINES = {
    BITNET: "BitNet's W2A8 GPU kernel (microsoft/BitNet gpu/, int8 x quantised before the call, bf16 out; M = 1)",
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


def series_label(series: str) -> str:
    """A series' legend: its step's name (``step12_w2a8``), or what a baseline or peer is."""
    for s in STEPS:
        if series == s.series:
            return s.name
    return BASELINES.get(series, series)


# ----------------------------------------------------------------------------------------------
# One clock
# ----------------------------------------------------------------------------------------------

def on_gpu_clock(results):
    """The rows of ``results`` timed on the GPU clock; rows on other clocks (the peak matmuls' do_bench) are left
    out."""
    from studylog.plotting import Results

    rows = [row for row in results.rows if row["clock"] == "gpu"]
    return Results(results.path, {**results.data, "measurements": rows})


def shapes_in(results) -> list[str]:
    """The shapes (``NxK``) of a results file, in the order they were measured."""
    seen: dict[str, None] = {}
    for row in results.rows:
        if "shape" in row["params"]:
            seen.setdefault(row["params"]["shape"], None)
    return list(seen)


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
        parts = [f"{series_label(s)} {_us(row['ms'])} µs against {_us(base[0]['ms'])} µs: {ratio:.2f}x"]
        bf16, s16 = fastest(view, FLOAT_X_SERIES, shape=shape, m=m)
        if bf16 is not None and s16 != s:
            parts.append(f"with bf16 x, {series_label(s16)} {_us(bf16['ms'])} µs: {base[0]['ms'] / bf16['ms']:.2f}x")
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
        detail = f"{series_label(s)} {_us(row['ms'])} µs, {times:.2f}x the floor ({_us(row['floor_ms'])} µs)"
        read = view.select("read_weights", shape=shape, m=1)
        if read:
            detail += f"; a kernel that only reads the weights: {_us(read[0]['ms'])} µs"
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
