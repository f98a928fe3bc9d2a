"""Chapter 5's series names and its headline, read from a benchmark file on the GPU clock."""

from __future__ import annotations

from typing import Optional

from studylog.ternary.cuda_steps import PROBES
from studylog.ternary.steps import SERIES, STEPS
from studylog.ternary.w2a8 import W2A8_QUANTIZE

#: The W2A8 matmul with x quantised at each place: step 22 ("separate"), else step 23 at that place (at M = 1).
W2A8_PLACE_SERIES = {where: SERIES[22] if where == "separate" else f"{SERIES[23]}_{where.replace(' ', '_')}"
                     for where in W2A8_QUANTIZE}
#: Each probe build of steps 21 and 23: its series.
PROBE_SERIES = {(step, probe): f"{SERIES[step]}_probe_{probe}" for step in (21, 23) for probe in PROBES}
#: The peers (studylog/ternary/peers.py).
GEMLITE = "gemlite_w2"
INT_MM = "torch_int_mm"
INT_MM_MATMUL = "torch_int_mm_matmul"
CUBLAS = "cublas_bf16"
BITNET = "bitnet_w2a8"
#: Step 23 through a W2A8Plan made once for the layer (a call checks x and launches): what an eager decode loop pays.
PLAN = f"{SERIES[23]}_plan"

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
    PLAN: f"{STEPS[22].name} through W2A8Plan: checks, choices, output and packed arguments made once a layer",
    **{series: f"{STEPS[22].name}, x quantised at quantize={where!r}" for where, series in W2A8_PLACE_SERIES.items()
       if series != SERIES[22]},
    **{series: f"{STEPS[step - 1].name}, {what} (a probe build)" for (step, probe), series in PROBE_SERIES.items()
       for what in [PROBES[probe]]},
}

#: Ours with bf16 x, the product cuBLAS and GemLite compute: the steps ``ternary_matmul`` runs, so that "ours" on a
#: results page is always a kernel a caller gets.
FLOAT_X_SERIES = [SERIES[n] for n in (5, 6, 7, 8, 14, 17, 21)]
#: Ours computing the W2A8 product from bf16 x, quantised inside the call (not step 9: it takes x quantised).
W2A8_SERIES = list(dict.fromkeys([SERIES[22], SERIES[23], SERIES[24], SERIES[25], *W2A8_PLACE_SERIES.values()]))


def on_gpu_clock(results):
    """The rows of ``results`` timed on the GPU clock (not the peak matmuls' do_bench)."""
    from studylog.plotting import Results

    rows = [row for row in results.rows if row["clock"] == "gpu"]
    return Results(results.path, {**results.data, "measurements": rows})


def fastest(results, series: list[str], **params) -> tuple[Optional[dict], Optional[str]]:
    """(row, series) of the fastest of ``series`` at ``params`` on the GPU clock, or (None, None)."""
    view = on_gpu_clock(results)
    found = [(r, s) for s in series for r in view.select(s, **params)]
    return min(found, key=lambda t: t[0]["ms"]) if found else (None, None)


def headline(results) -> list[dict]:
    """The fastest bf16-x kernel against cuBLAS (M = 1 and 16 at 4096 x 14336, M = 1 at 8192 x 28672) and GemLite
    (where its output passed), and the fastest W2A8 kernel against torch._int_mm (M = 1, 4096 x 14336)."""
    from studylog.plotting import headline_row

    view = on_gpu_clock(results)
    rows = []

    def label(series):
        step = next(st for st in STEPS if series.startswith(st.series))
        where = next((f", quantize={q!r}" for q, s in W2A8_PLACE_SERIES.items() if s == series), "")
        return f"{step.name}{where} ({'CUDA C++' if step.language == 'cuda' else 'Triton'})"

    def add(candidates, baseline, baseline_label, shape, m, what="bf16 x"):  # the fastest candidate, where both ran
        row, series = fastest(view, candidates, shape=shape, m=m)
        if row is None or not view.select(baseline, shape=shape, m=m):
            return
        n, k = shape.split("x")
        rows.append(headline_row(view, series, baseline, f"M = {m}, N x K = {n} x {k}, {what}",
                                 kernel_label=label(series), baseline_label=baseline_label, shape=shape, m=m))

    def gemlite_failed(shape):  # no headline against a wrong answer
        return any(c["name"].startswith(f"{GEMLITE} ") and not c["passed"] and c["params"].get("shape") == shape
                   and c["params"].get("m", 1) == 1 for c in results.data.get("checks", []))

    for shape, m in (("4096x14336", 1), ("4096x14336", 16), ("8192x28672", 1)):
        add(FLOAT_X_SERIES, CUBLAS, "cuBLAS bf16 (torch x @ W.T, both in a CUDA graph)", shape, m)
    shape = "4096x14336"  # the peers, at the shape of their targets
    if not gemlite_failed(shape):
        add(FLOAT_X_SERIES, GEMLITE, "GemLite 2-bit (bf16 x, its autotune)", shape, 1)
    add(W2A8_SERIES, INT_MM, "torch._int_mm W8A8 (int8 weights, rows padded to 17)", shape, 1,
        "x quantised to int8 in the call")
    # part 1's answer: its last Triton step against GemLite, the Triton peer, at every shape where GemLite's output
    # passed our check
    for peer in view.select(GEMLITE, m=1):
        if not gemlite_failed(peer["params"]["shape"]):
            add([SERIES[14]], GEMLITE, "GemLite 2-bit (bf16 x, its autotune)", peer["params"]["shape"], 1)
    return rows
