"""Chapter 5's benchmark (``python -m studylog bench ternary``, GPU only), and what reads its results: the
figures (``python -m studylog plot ternary``), the headline, the speedup tables and the issue's target checks.

Series are named from the chapter's table of steps (``steps.SERIES``: step N's series is ``stepNN``); the
baselines and the variants of a step's launch (``BASELINES``) say what they are.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

import torch

from studylog import runtime
from studylog.ternary.cuda_steps import PROBES, cuda_mma_config, step10_cuda_mma, step11_probe, step11_tma, tma_config
from studylog.ternary.formats import FP32_TOLERANCE, PackedTernary, _ratio, quantize_absmean, quantize_activations
from studylog.ternary.steps import SERIES, STEPS
from studylog.ternary.triton_mma import (MMA_CONFIGS_FEW, MMA_CONFIGS_MANY, mma_2bit_few, mma_2bit_many, mma_block_m,
                                         step08_w2a8_dot, step09_mma, w2a8_dot_few, w2a8_dot_many)
from studylog.ternary.triton_steps import (block_m_for, config_dict, dot_2bit_few, dot_2bit_many, dot_base3_few,
                                           dot_base3_many, gemv_2bit, gemv_base3, int8_v2, packed2_v3, sign_v1,
                                           step01_sign, step02_int8, step03_2bit, step04_gemv, step05_dot,
                                           step06_base3_gemv, step07_base3_dot)
from studylog.ternary.w2a8 import (W2A8_QUANTIZE, step12_probe, step12_w2a8, step13_w2a8_tiles, w2a8_config,
                                   w2a8_default_quantize, w2a8_plan_takes, w2a8_tiles_config)

# ----------------------------------------------------------------------------------------------
# Series
# ----------------------------------------------------------------------------------------------

#: Step 12 with x quantised at each place, a series of its own at M = 1 where it is not the default.
W2A8_PLACE_SERIES = {where: f"{SERIES[12]}_{where.replace(' ', '_')}" for where in W2A8_QUANTIZE}
#: Each probe build of steps 11 and 12: its series.
PROBE_SERIES = {(step, probe): f"{SERIES[step]}_probe_{probe}" for step in (11, 12) for probe in PROBES}

#: The series that are not steps: what each one is (CHAPTER.baselines; figure legends and tables).
BASELINES = {
    "cublas_bf16": "cuBLAS bf16 (torch x @ W.T, the same ternary W stored densely)",
    "peak_bf16_matmul": "a dense 8192^3 bf16 matmul (cuBLAS): the MMA peak of this run",
    "peak_int8_matmul": "a dense 8192^3 int8 matmul (torch._int_mm): the int8 MMA peak of this run",
    "read_weights": "a kernel that only reads the 2-bit weights (read_only.cu): the floor a kernel meets",
    **{series: f"{STEPS[11].name}, x quantised at quantize={where!r}" for where, series in W2A8_PLACE_SERIES.items()},
    **{series: f"{STEPS[step - 1].name}, {what} (a probe build)" for (step, probe), series in PROBE_SERIES.items()
       for what in [PROBES[probe]]},
    **{f"{SERIES[9]}_cfg{i}": f"{STEPS[8].name}, config {i} alone (a --quick run)" for i in range(len(MMA_CONFIGS_FEW))},
}


def series_label(series: str) -> str:
    """A series' legend: its step's name (``step12_w2a8``), or what a baseline is."""
    for s in STEPS:
        if series == s.series:
            return s.name
    return BASELINES.get(series, series)


# ----------------------------------------------------------------------------------------------
# Benchmark (GPU only): python -m studylog bench ternary
# ----------------------------------------------------------------------------------------------

#: (family, N, K): BitNet b1.58 2B4T-style and Llama-style projections, as the issue lists them.
BENCH_SHAPES = [
    ("bitnet", 2560, 2560), ("bitnet", 13824, 2560), ("bitnet", 2560, 6912), ("bitnet", 20480, 3200),
    ("llama", 4096, 14336), ("llama", 14336, 4096), ("llama", 8192, 28672),
]
BENCH_MS = (1, 16, 128)
QUICK_SHAPES = [("llama", 4096, 14336), ("llama", 8192, 28672), ("llama", 14336, 4096)]
QUICK_MS = (1, 16, 128)
#: Series timed at M=1 (every step), and at M > 1 (the steps made for several rows of x).
M1_SERIES = [SERIES[n] for n in range(1, 14)]
BATCH_SERIES = [SERIES[n] for n in (5, 7, 8, 9, 10, 11, 12, 13)]
#: A --quick run: steps 9 to 13 only.
QUICK_SERIES = [SERIES[n] for n in (9, 10, 11, 12, 13)]
#: Also timed by kernel time (the profiler), beside do_bench: our last steps and the baselines.
KERNEL_TIME_SERIES = ("cublas_bf16", *QUICK_SERIES, *W2A8_PLACE_SERIES.values(), "read_weights")


def _autotuner_for(series: str, m: int):
    few = block_m_for(m) <= 32
    return {
        SERIES[1]: sign_v1, SERIES[2]: int8_v2, SERIES[3]: packed2_v3, SERIES[4]: gemv_2bit, SERIES[6]: gemv_base3,
        SERIES[5]: dot_2bit_few if few else dot_2bit_many, SERIES[7]: dot_base3_few if few else dot_base3_many,
        SERIES[8]: w2a8_dot_few if few else w2a8_dot_many,
        SERIES[9]: mma_2bit_few if mma_block_m(m) <= 32 else mma_2bit_many,
    }.get(series)


def _peak_matmul(run, dtype) -> tuple[float, float]:
    """(median ms, rate in T(FL)OP/s) of a dense 8192^3 matmul measured in this run (bf16: cuBLAS;
    int8: torch._int_mm)."""
    n = 8192
    if dtype == torch.int8:
        a = torch.randint(-127, 128, (n, n), dtype=torch.int8, device="cuda")
        b = torch.randint(-127, 128, (n, n), dtype=torch.int8, device="cuda").T.contiguous().T
        ms = run.time(lambda: torch._int_mm(a, b))
    else:
        a = torch.randn(n, n, dtype=dtype, device="cuda")
        b = torch.randn(n, n, dtype=dtype, device="cuda")
        ms = run.time(lambda: a @ b)
    return ms, 2 * n**3 / (ms * 1e-3) / 1e12


def bench(run) -> None:
    """cuBLAS bf16 against every step, per shape and M; correctness checked on the same inputs."""
    shapes, ms_list = (QUICK_SHAPES, QUICK_MS) if run.quick else (BENCH_SHAPES, BENCH_MS)
    (bf16_ms, bf16_rate), (int8_ms, int8_rate) = _peak_matmul(run, torch.bfloat16), _peak_matmul(run, torch.int8)
    peak = {"bf16": bf16_rate, "int8": int8_rate}
    run.record("peak_bf16_matmul", bf16_ms, params={"n": 8192}, role="baseline", tflops=bf16_rate)
    run.record("peak_int8_matmul", int8_ms, params={"n": 8192}, role="baseline", tops=int8_rate)
    s, name = SERIES, {st.number: st.name for st in STEPS}
    run.note("Series: stepNN is step NN of the chapter (its public function stepNN_<slug>); the others are baselines "
             "or launches of a step with another option (CHAPTER.baselines).")
    run.note("Weights: quantize_absmean(randn(N, K)), one scale per tensor; x: randn(M, K) in bf16. Baseline: "
             "cuBLAS bf16 x @ W.T on the same ternary matrix stored densely (bf16 out, no scale). Ours: float32 out, "
             f"divided by the scale. {s[8]} ({name[8]}) times the matmul alone, x already quantised to int8. "
             f"{s[1]} ({name[1]}) includes its check that the dense weights are -1, 0 or +1 (one pass over them).")
    run.note("floor_ms = max(bytes moved / copy bandwidth of this run, 2MNK / measured matmul peak of the MMA the "
             "kernel uses); bytes = weights + x + z.")
    run.note(f"{s[9]} ({name[9]}): the same 2 bits a weight in MMA order (PackedTernary.pack(w, '2bit_mma')); its "
             "split-K slices add into a workspace that the last slice of each tile empties, so no memset is timed.")
    run.note(f"{s[10]} ({name[10]}): CUDA C++ (studylog/ternary/csrc/ternary_mma.cu) on mma.sync, weights in the "
             f"2bit_tiles format ({s[9]}'s words, a warp's 16 rows x 256 weights in 1 KiB of consecutive memory), launch "
             "from cuda_mma_config; the last K slice of each tile sums the slices' partial sums, so no memset is timed.")
    run.note(f"{s[11]} ({name[11]}): CUDA C++ (studylog/ternary/csrc/ternary_bulk.cu), {s[10]}'s arithmetic with "
             "weights and x copied into shared memory by the TMA (cp.async.bulk, mbarriers, a producer warp), the K of "
             f"a block shared by its warps and summed in shared memory; launch from tma_config. {s[11]}_probe_* are "
             "builds of it with parts left out (copies only, arithmetic only, launch only), timed to show what limits it.")
    run.note("kernel_ms: the same call timed by the profiler (CUPTI kernel start to end, L2 flushed before each "
             "repetition), without do_bench's launch and event overhead (ceilings.empty_launch_ms). Targets are "
             "judged on each of ms (do_bench), kernel_ms and graph_ms, each ours against cuBLAS by the same clock.")
    run.note(f"{s[12]} ({name[12]}): CUDA C++ (studylog/ternary/csrc/ternary_w2a8.cu), timed from bf16 x: x quantised "
             "as quantize_activations does (int8, per-row absmax) into the int8 MMA's order, then step 11's plumbing "
             "feeds mma.sync m16n8k32 (u8 codes x s8 x, int32 sums), one AND per 4 weights, same 2bit_tiles weights. "
             "Checked against float64 of the quantised x (ref_q), the product W2A8 defines. By default every block of "
             "the matmul quantises x itself: at M = 1 from a copy of x that the copy engine brings into shared memory "
             "ahead of the weights (quantize='staged', where it fits), else from global memory (quantize='every "
             "block', where M <= 8 and K fit), else a kernel of its own does it first ('separate': quantize_x, then "
             "the matmul launched early by a programmatic dependent launch). At M = 1 also, each place where it is "
             f"not the default and fits: {', '.join(W2A8_PLACE_SERIES.values())}. {s[12]}_probe_* as {s[11]}_probe_*, "
             f"for the default. {s[13]} ({name[13]}): the same W2A8 product, quantize_x then a matmul launched early "
             "whose warps each own a tile of 16 weight rows over a slice of K (x in shared memory for that slice "
             "only); launch from w2a8_tiles_config.")
    run.note("graph_ms: the call replayed in a CUDA graph (BenchRun.graph_time): no host in the loop, each call "
             "reading its own copy of the weights from DRAM (copies rotated, together 4x the L2), x in L2 as the "
             "kernel before it would leave it; timed with events around the replay, per call.")
    torch.manual_seed(0)
    for family, n, k in run.progress(shapes, "shapes"):
        _bench_shape(run, family, n, k, ms_list, peak)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _bench_shape(run, family: str, n: int, k: int, ms_list, peak: dict) -> None:
    dev = runtime.device()
    w_t, scale_t = quantize_absmean(torch.randn(n, k, device=dev))
    scale = float(scale_t)  # one number: no per-call tensor
    w_bf16 = w_t.to(torch.bfloat16)
    p2, p3 = PackedTernary.pack(w_t, "2bit"), PackedTernary.pack(w_t, "base3")
    pm = PackedTernary.pack(w_t, "2bit_mma")
    pt = PackedTernary.pack(w_t, "2bit_tiles")
    w64 = w_t.double()
    copies: dict[int, list] = {}
    s = SERIES

    def rotated(weights) -> list:
        """The weights and copies of them (BenchRun.rotated), made once a shape for the series that share them."""
        if id(weights) not in copies:
            copies[id(weights)] = run.rotated(weights)
        return copies[id(weights)]

    for m in ms_list:
        params = {"shape": f"{n}x{k}", "family": family, "n": n, "k": k, "m": m}
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        xq, x_scale = quantize_activations(x)
        x64, xq64 = x.double(), xq.double()
        ref = (x64 @ w64.T) / scale
        magnitude = (x64.abs() @ w64.abs().T) / abs(scale)
        ref_q = (xq64 @ w64.T) / (x_scale.double()[:, None] * scale)
        magnitude_q = (xq64.abs() @ w64.abs().T) / (x_scale.double()[:, None] * abs(scale))
        flops = 2 * m * n * k
        x_bytes, z_bytes = m * k * 2, m * n * 4

        # the calls also timed in a CUDA graph, up to 16 rows of x (BenchRun.graph_time): (their weights, the
        # call on a copy of them)
        graphed = {
            "cublas_bf16": (w_bf16, lambda w: x @ w.T),
            s[9]: (pm, lambda w: step09_mma(x, w, scale)),
            s[10]: (pt, lambda w: step10_cuda_mma(x, w, scale)),
            s[11]: (pt, lambda w: step11_tma(x, w, scale)),
            s[12]: (pt, lambda w: step12_w2a8(x, w, scale)),
            s[13]: (pt, lambda w: step13_w2a8_tiles(x, w, scale)),
            **{series: (pt, lambda w, q=where: step12_w2a8(x, w, scale, quantize=q))
               for where, series in W2A8_PLACE_SERIES.items()},
        }

        def timings(series, fn) -> dict:
            """kernel_ms and graph_ms where the series has them (up to 16 rows of x)."""
            out = {}
            if series in KERNEL_TIME_SERIES and m <= 16:
                out["kernel_ms"] = run.kernel_time(fn)
            if series in graphed and m <= 16:
                weights, call = graphed[series]
                out["graph_ms"] = run.graph_time([functools.partial(call, w) for w in rotated(weights)])
            return out

        def record(series, fn, weight_bytes, mma, reference, mag, role="kernel", out_bytes=z_bytes,
                   in_bytes=x_bytes, check=True, config_text=""):
            z = fn()  # the first call autotunes
            if check:
                ratio = _ratio(z.float(), reference, mag)
                run.check(f"{series} equals float64 reference", ratio <= FP32_TOLERANCE, params=params,
                          error_ratio=ratio, tolerance=FP32_TOLERANCE)
            ms = run.time(fn)
            kernel = timings(series, fn)
            nbytes = weight_bytes + in_bytes + out_bytes
            mem = run.floor_ms(nbytes)
            compute = flops / (peak[mma] * 1e12) * 1e3 if mma else 0.0
            best = str(getattr(_autotuner_for(series, m), "best_config", "")) or config_text
            run.record(series, ms, params=params, role=role, floor_ms=max(mem, compute), floor_mem_ms=mem,
                       floor_compute_ms=compute, weight_bytes=weight_bytes, bytes=nbytes,
                       gbs=nbytes / (ms * 1e-3) / 1e9, config=best, **kernel)

        record("cublas_bf16", lambda: x @ w_bf16.T, n * k * 2, "bf16", ref, magnitude, role="baseline",
               out_bytes=m * n * 2, check=False)
        exact = ref * scale
        z_bf16 = (x @ w_bf16.T).double()
        # a sanity check that the baseline computes the same product (cuBLAS may reduce in bf16)
        run.check("cublas_bf16 within bf16 rounding of float64", bool(
            ((z_bf16 - exact).abs() <= 2**-7 * exact.abs() + 2**-10 * magnitude * abs(scale)).all()), params=params)
        runs = {
            s[1]: (lambda: step01_sign(x, w_bf16, scale), n * k * 2, None),
            s[2]: (lambda: step02_int8(x, w_t, scale), n * k, None),
            s[3]: (lambda: step03_2bit(x, p2, scale), p2.nbytes, None),
            s[4]: (lambda: step04_gemv(x, p2, scale), p2.nbytes, None),
            s[5]: (lambda: step05_dot(x, p2, scale), p2.nbytes, "bf16"),
            s[6]: (lambda: step06_base3_gemv(x, p3, scale), p3.nbytes, None),
            s[7]: (lambda: step07_base3_dot(x, p3, scale), p3.nbytes, "bf16"),
            s[9]: (lambda: step09_mma(x, pm, scale), pm.nbytes, "bf16"),
            s[10]: (lambda: step10_cuda_mma(x, pt, scale), pt.nbytes, "bf16", str(cuda_mma_config(m, n, k))),
            s[11]: (lambda: step11_tma(x, pt, scale), pt.nbytes, "bf16", str(tma_config(m, n, k))),
        }
        names = M1_SERIES if m == 1 else BATCH_SERIES
        if run.quick:
            names = [name for name in names if name in QUICK_SERIES]
            # every step-9 config on its own too: which split of K, which tile, wins where
            configs = MMA_CONFIGS_FEW if mma_block_m(m) <= 32 else MMA_CONFIGS_MANY
            for i, config in enumerate(configs):
                runs[f"{s[9]}_cfg{i}"] = (lambda c=config_dict(config): step09_mma(x, pm, scale, config=c),
                                          pm.nbytes, "bf16", str(config))
                names = names + [f"{s[9]}_cfg{i}"]
        for name in names:
            if name == s[8]:
                record(name, lambda: step08_w2a8_dot(xq, x_scale, p2, scale), p2.nbytes, "int8", ref_q, magnitude_q,
                       in_bytes=m * k + m * 4)
            elif name == s[13]:
                record(name, lambda: step13_w2a8_tiles(x, pt, scale), pt.nbytes, "int8", ref_q, magnitude_q,
                       config_text=str(w2a8_tiles_config(m, n, k)))
            elif name == s[12]:
                default = w2a8_default_quantize(m, n, k)
                record(name, lambda: step12_w2a8(x, pt, scale), pt.nbytes, "int8", ref_q, magnitude_q,
                       config_text=f"{w2a8_config(m, n, k, quantize=default)}, quantize={default!r}")
                if m == 1:  # the other places to quantise x
                    for where, series in W2A8_PLACE_SERIES.items():
                        if where == default or not w2a8_plan_takes(m, n, k, where):
                            continue  # the default's own series, or x's row does not fit beside the stages
                        record(series, lambda q=where: step12_w2a8(x, pt, scale, quantize=q), pt.nbytes, "int8",
                               ref_q, magnitude_q, config_text=f"{w2a8_config(m, n, k, quantize=where)}")
            else:
                fn, weight_bytes, mma, *text = runs[name]
                record(name, fn, weight_bytes, mma, ref, magnitude, config_text="".join(text))
        if m == 1:
            # the floor a real kernel meets: one that only reads the 2-bit weights, launch and latency included
            from studylog.bench import read_only
            read = read_only(pt.data)
            graphed["read_weights"] = (pt, lambda w: read_only(w.data)())
            run.record("read_weights", run.time(read), params=params, role="baseline", **timings("read_weights", read),
                       weight_bytes=pt.nbytes, floor_ms=run.floor_ms(pt.nbytes))
        if m == 1 and family == "llama":
            # what limits steps 11 and 12: the same launch with parts left out (its outputs mean nothing)
            for step, make_probe, config in ((11, step11_probe, tma_config(m, n, k)),
                                             (12, step12_probe, w2a8_config(m, n, k))):
                if s[step] not in names:
                    continue
                for probe, what in PROBES.items():
                    fn = make_probe(x, pt, scale, probe)
                    fn()
                    run.record(PROBE_SERIES[step, probe], run.time(fn), params=params, kernel_ms=run.kernel_time(fn),
                               probe=what, config=str(config))


# ----------------------------------------------------------------------------------------------
# Figures and target checks, from a results file (python -m studylog plot ternary; the notebook)
# ----------------------------------------------------------------------------------------------

def shapes_in(results) -> list[str]:
    """The shapes (``NxK``) of a results file, in the order they were measured."""
    seen: dict[str, None] = {}
    for row in results.rows:
        if "shape" in row["params"]:
            seen.setdefault(row["params"]["shape"], None)
    return list(seen)


def series_ms(results, series: str, **params) -> Optional[float]:
    """The time (ms, do_bench) of the first row of ``series`` matching ``params``, or None."""
    rows = results.select(series, **params)
    return rows[0]["ms"] if rows else None


def speedup_table(results, m: int) -> str:
    """Markdown: time per series (µs) and speedup over cuBLAS bf16, one line per shape."""
    series = [s for s in (M1_SERIES if m == 1 else BATCH_SERIES) if results.select(s, m=m)]
    head = ["shape", "cuBLAS bf16 (µs)"] + [f"{series_label(s)} (µs, x)" for s in series] + ["2-bit floor (µs)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape in shapes_in(results):
        base = series_ms(results, "cublas_bf16", shape=shape, m=m)
        if base is None:
            continue
        cells = [shape, f"{base * 1e3:.1f}"]
        for s in series:
            t = series_ms(results, s, shape=shape, m=m)
            cells.append("–" if t is None else f"{t * 1e3:.1f} ({base / t:.1f}x)")
        floor = results.select(SERIES[4] if m == 1 else SERIES[5], shape=shape, m=m)
        cells.append(f"{floor[0]['floor_ms'] * 1e3:.1f}" if floor else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The three clocks of a results file: do_bench (``ms``), the profiler's kernel time and CUDA-graph replay.
TIMERS = {"ms": "do_bench", "kernel_ms": "kernel time", "graph_ms": "CUDA graph"}
#: Every series of ours a target may be met by.
TARGET_SERIES = [SERIES[n] for n in range(4, 14)] + list(W2A8_PLACE_SERIES.values())


def target_checks(results) -> list[dict[str, Any]]:
    """The issue's targets, each judged on every clock the run recorded (``TIMERS``): the best of our
    series by that clock against cuBLAS by the same clock. Each: {"target", "met": {clock: True, False
    or None where not measured}, "detail": the numbers behind it}."""
    out = []

    def best(shape, m, clock):
        found = [(r, s) for s in TARGET_SERIES for r in results.select(s, shape=shape, m=m) if clock in r]
        return min(found, key=lambda t: t[0][clock]) if found else (None, None)

    for shape, m, want in (("4096x14336", 1, 4.0), ("8192x28672", 1, 6.0), ("4096x14336", 16, 3.0)):
        base_rows = results.select("cublas_bf16", shape=shape, m=m)
        met, parts = {}, []
        for clock, label in TIMERS.items():
            row, s = best(shape, m, clock)
            if not base_rows or clock not in base_rows[0] or row is None:
                met[clock] = None
                continue
            base = base_rows[0][clock]
            met[clock] = base / row[clock] >= want
            parts.append(f"{label}: {series_label(s)} {row[clock] * 1e3:.1f} vs {base * 1e3:.1f} µs, "
                         f"{base / row[clock]:.2f}x")
        out.append({"target": f"M={m}, {shape}: >= {want:.0f}x faster than cuBLAS bf16", "met": met,
                    "detail": "; ".join(parts) or "not measured"})
    for shape in ("4096x14336", "8192x28672"):
        met, parts = {}, []
        for clock, label in TIMERS.items():
            row, s = best(shape, 1, clock)
            if row is None:
                met[clock] = None
                continue
            met[clock] = row[clock] <= 2.0 * row["floor_ms"]
            parts.append(f"{label}: {series_label(s)} {row[clock] * 1e3:.1f} µs, {row[clock] / row['floor_ms']:.2f}x "
                         f"the floor ({row['floor_ms'] * 1e3:.1f} µs)")
        read = results.select("read_weights", shape=shape, m=1)
        if read:
            parts.append("a kernel that only reads the weights: " + ", ".join(
                f"{read[0][c] * 1e3:.1f} µs by {label}" for c, label in TIMERS.items() if c in read[0]))
        out.append({"target": f"M=1, {shape}: within 2x of the 2-bit floor", "met": met,
                    "detail": "; ".join(parts) or "not measured"})
    checks = results.data.get("checks", [])
    bad = [c for c in checks if not c["passed"]]
    passed = not bad and bool(checks)
    out.append({"target": "results equal a float64 reference within float32 tolerance",
                "met": {clock: passed for clock in TIMERS}, "detail": f"{len(checks) - len(bad)} of {len(checks)} checks passed"})
    return out


#: The kernels that take the activations as they come (bf16), for the headline.
FLOAT_X_SERIES = [SERIES[n] for n in (4, 5, 6, 7, 9, 10, 11)]


def headline(results) -> list[dict]:
    """The book's headline rows: the chapter's fastest bf16-activation kernel against cuBLAS bf16 on the
    issue's three target cases (M = 1 and 16 at 4096 x 14336, M = 1 at 8192 x 28672), by CUDA-graph replay
    where the run recorded it (do_bench's time of a Python-launched kernel follows the host's speed: notebook
    05, "Three clocks"), else by do_bench."""
    rows = []
    for shape, m in (("4096x14336", 1), ("4096x14336", 16), ("8192x28672", 1)):
        base_rows = results.select("cublas_bf16", shape=shape, m=m)
        if not base_rows:
            continue
        clock = "graph_ms" if "graph_ms" in base_rows[0] else "ms"
        found = [(r[0], s) for s in FLOAT_X_SERIES if (r := results.select(s, shape=shape, m=m)) and clock in r[0]]
        if not found:
            continue
        row, series = min(found, key=lambda t: t[0][clock])
        n, k = shape.split("x")
        step = next(st for st in STEPS if st.series == series)
        language = "CUDA C++" if step.language == "cuda" else "Triton"
        how = ", both in a CUDA graph" if clock == "graph_ms" else ""
        rows.append({"kernel": f"{step.name} ({language})",
                     "baseline": f"cuBLAS bf16 (torch x @ W.T{how})",
                     "case": f"M = {m}, N x K = {n} x {k}, bf16 x", "speedup": base_rows[0][clock] / row[clock]})
    return rows


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


def figures(results) -> dict:
    """speedup: over cuBLAS bf16 per shape and M. floor: M=1 time against each format's floor.
    steps: M=1 time of every step on the Llama shapes."""
    import matplotlib.pyplot as plt
    import numpy as np

    shapes = shapes_in(results)
    ms_present = sorted({r["params"]["m"] for r in results.rows if "m" in r["params"]})
    figs = {}

    def speedup_figure(panels, clock, label, width_each):
        """One panel per M: for each series, cuBLAS bf16's time over its own by `clock`, per shape; the
        issue's targets as red dashes. panels: (M, series, title) each; a series keeps its colour."""
        colours = {}
        cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        fig, axes = plt.subplots(1, len(panels), figsize=(width_each * len(panels), 4.2), squeeze=False)
        for ax, (m, series, title) in zip(axes[0], panels):
            bar = 0.8 / max(1, len(series))
            for i, s in enumerate(series):
                vals = []
                for shape in shapes:
                    base, mine = results.select("cublas_bf16", shape=shape, m=m), results.select(s, shape=shape, m=m)
                    ok = base and mine and clock in base[0] and clock in mine[0]
                    vals.append(base[0][clock] / mine[0][clock] if ok else np.nan)
                colour = colours.setdefault(s, cycle[len(colours) % len(cycle)])
                ax.bar(np.arange(len(shapes)) + (i - (len(series) - 1) / 2) * bar, vals, bar, label=series_label(s),
                       color=colour)
            ax.axhline(1.0, color="k", lw=1)
            for want, shape in {1: ((4.0, "4096x14336"), (6.0, "8192x28672")), 16: ((3.0, "4096x14336"),)}.get(m, ()):
                if shape in shapes:
                    j = shapes.index(shape)
                    ax.plot([j - 0.45, j + 0.45], [want, want], "r--", lw=1.2)
            ax.set_xticks(range(len(shapes)), shapes, rotation=35, ha="right", fontsize=8)
            ax.set_ylabel(f"speedup over cuBLAS bf16 ({label})")
            ax.set_title(title, fontsize=10)
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(results.caption(), fontsize=8)
        fig.tight_layout()
        return fig

    m1 = [SERIES[n] for n in (4, 6, 5, 8, 9, 10, 11, 12, 13)]
    figs["speedup"] = speedup_figure(
        [(m, [s for s in (m1 if m == 1 else BATCH_SERIES) if results.select(s, m=m)],
          f"M = {m}" + ("  (red: the issue's targets)" if m in (1, 16) else "")) for m in ms_present],
        "ms", "do_bench", 5.2)
    graphed = (*QUICK_SERIES, W2A8_PLACE_SERIES["every block"], W2A8_PLACE_SERIES["separate"])
    graph_panels = [(m, [s for s in graphed if any("graph_ms" in r for r in results.select(s, m=m))],
                     f"M = {m}, each replayed in a CUDA graph (red: the issue's targets)")
                    for m in ms_present if any("graph_ms" in r for r in results.select("cublas_bf16", m=m))]
    if graph_panels:
        figs["speedup_graph"] = speedup_figure(graph_panels, "graph_ms", "CUDA graph", 5.6)

    fig, ax = plt.subplots(figsize=(6.4, 5))
    lo, hi = math.inf, 0.0
    markers = ("s", "o", "^", "v", "*", "P", "X", "D", "h", "_")
    for s, marker in zip(("cublas_bf16", *(SERIES[n] for n in (4, 6, 5, 9, 10, 11, 12, 13)), "read_weights"), markers):
        rows = results.select(s, m=1)
        if not rows:
            continue
        xs = [r["floor_ms"] * 1e3 for r in rows]
        ys = [r["ms"] * 1e3 for r in rows]
        lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
        ax.scatter(xs, ys, marker=marker, label=f"{series_label(s)} (vs its own format's floor)")
    if hi > 0:
        line = np.array([lo / 1.5, hi * 1.5])
        ax.plot(line, line, "k-", lw=1, label="time = floor")
        ax.plot(line, 2 * line, "k--", lw=1, label="time = 2 x floor")
        env = results.data["ceilings"].get("empty_launch_ms")
        if env:
            ax.axhline(env * 1e3, color="gray", ls=":", lw=1, label="empty Triton kernel")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bandwidth floor (µs): bytes / measured copy bandwidth")
    ax.set_ylabel("measured time (µs, median)")
    ax.set_title(f"M = 1: time against the floor\n{results.caption()}", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    figs["floor"] = fig

    llama = [s for s in shapes if results.select("cublas_bf16", shape=s, family="llama", m=1)]
    if llama:
        steps = [s for s in ["cublas_bf16"] + M1_SERIES if results.select(s, m=1)]
        fig, ax = plt.subplots(figsize=(8.5, 4.2))
        width = 0.8 / len(llama)
        for i, shape in enumerate(llama):
            vals = [(series_ms(results, s, shape=shape, m=1) or np.nan) * 1e3 for s in steps]
            ax.bar(np.arange(len(steps)) + (i - (len(llama) - 1) / 2) * width, vals, width, label=shape)
        ax.set_xticks(range(len(steps)), [series_label(s) for s in steps], rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("time (µs, median)")
        ax.set_title(f"M = 1, step by step\n{results.caption()}", fontsize=8)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        figs["steps"] = fig
    return figs
