"""Chapter 5's benchmark (``python -m studylog bench ternary``, GPU only): the cases and series it measures, and
how each series is built, checked and timed (by the harness's policy, ``studylog.bench``)."""

from __future__ import annotations

import copy
import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from studylog import runtime
from studylog.bench import read_only
from studylog.ternary import peers as P
from studylog.ternary import triton_mma as TM
from studylog.ternary import triton_steps as TS
from studylog.ternary.bitnet import (BITNET_ENV, BITNET_SHAPES, bitnet_checkout, bitnet_library, bitnet_linear,
                                     bitnet_pack, bitnet_scales)
from studylog.ternary.cuda_steps import PROBES, cuda_mma_config, step21_probe, tma_config
from studylog.ternary.formats import (FP32_TOLERANCE, PackedTernary, error_ratio_from, quantize_absmean,
                                      quantize_activations)
from studylog.ternary.results import (BITNET, CUBLAS, GEMLITE, INT_MM, INT_MM_MATMUL, PLAN, PROBE_SERIES,
                                      W2A8_PLACE_SERIES)
from studylog.ternary.steps import SERIES, STEPS
from studylog.ternary.triton_steps import block_m_for
from studylog.ternary.w2a8 import (W2A8Plan, step23_probe, w2a8_config, w2a8_default_quantize, w2a8_takes,
                                   w2a8_tiles_config)

# What is measured

#: (family, N, K): BitNet b1.58 2B4T-style and Llama-style projections.
BENCH_SHAPES = [
    ("bitnet", 2560, 2560), ("bitnet", 13824, 2560), ("bitnet", 2560, 6912), ("bitnet", 20480, 3200),
    ("llama", 4096, 14336), ("llama", 14336, 4096), ("llama", 8192, 28672),
]
BENCH_MS = (1, 16, 128)
#: A --quick run: the targets' cases only (the Llama shapes, and BitNet's kernel at every shape it takes).
QUICK_CASES = (("llama", 4096, 14336, (1, 16)), ("llama", 8192, 28672, (1,)),
               *(("bitnet", n, k, (1,)) for n, k in BITNET_SHAPES))
#: BitNet's kernel's shapes that BENCH_SHAPES lacks: measured at M = 1 against our W2A8 steps and cuBLAS only.
BITNET_EXTRA_SHAPES = tuple((n, k) for n, k in BITNET_SHAPES if ("bitnet", n, k) not in BENCH_SHAPES)
#: What a shape measured only for BitNet's kernel times.
BITNET_ONLY_STEPS = (23, 25)
#: GemLite above one row of x only here: its autotune compiles some twenty configs a shape for each batched kernel.
GEMLITE_BATCH_SHAPES = ((4096, 14336),)
#: The steps made for several rows of x, timed at M > 1 (steps 10 to 13 and 24 only where SPLIT_CASES says).
BATCH_STEPS = (6, 8, 9, 10, 11, 12, 13, 14, 17, 21, 23, 24, 25)
#: The steps that make one change each on the way to the next shipped kernel (the steps tables' rows; steps 5,
#: 14, 17, 21, 23 and 25 are the entry point's): timed only at the cases those tables use, (N, K) -> rows of x.
SPLIT_STEPS = (4, 10, 11, 12, 13, 15, 16, 18, 19, 20, 22, 24)
SPLIT_CASES = {(4096, 14336): (1, 16), (2560, 6912): (1,)}
#: Each step's function: the series stepNN calls it (steps 1, 2 and 9 with the options their series below add).
STEP = {step.number: step.function for step in STEPS}
#: The steps on packed weights: number -> (their format, the MMA their floor counts; "int8": the W2A8 product).
PACKED_STEPS = {**{i: ("2bit", None) for i in (3, 4, 5)}, 6: ("2bit", "bf16"), 7: ("base3", None),
                8: ("base3", "bf16"), **{i: ("2bit", "bf16") for i in (10, 11, 12)}, 13: ("2bit_mma", "bf16"),
                14: ("2bit_mma", "bf16"), **{i: ("2bit_tiles", "bf16") for i in range(15, 22)},
                **{i: ("2bit_tiles", "int8") for i in range(22, 26)}}


@dataclass(frozen=True)
class Case:
    """One case of the benchmark: a shape and a number of rows of x, in a full run or a --quick one."""

    family: str
    n: int
    k: int
    m: int
    quick: bool = False

    @property
    def params(self) -> dict:
        return {"shape": f"{self.n}x{self.k}", "family": self.family, "n": self.n, "k": self.k, "m": self.m}

    @property
    def bitnet_only(self) -> bool:  # a shape measured for BitNet's kernel only
        return (self.quick and self.family == "bitnet") or (self.n, self.k) in BITNET_EXTRA_SHAPES


def bench_cases(quick: bool = False) -> list[Case]:
    """The cases in the order the benchmark runs them."""
    if quick:
        return [Case(f, n, k, m, True) for f, n, k, ms in QUICK_CASES for m in ms]
    return ([Case(f, n, k, m) for f, n, k in BENCH_SHAPES for m in BENCH_MS]
            + [Case("bitnet", n, k, 1) for n, k in BITNET_EXTRA_SHAPES])


def _step_at(i: int) -> Callable[[Case], bool]:
    """Where step i is timed (steps 1-3 at M = 1 on the step figure's shapes only)."""
    def at(c: Case) -> bool:
        if c.bitnet_only:
            return i in BITNET_ONLY_STEPS
        steps = (14, 17, 21, 23, 25) if c.quick else (range(1 if c.family == "llama" else 4, 26) if c.m == 1
                                                      else BATCH_STEPS)
        split_here = c.m in SPLIT_CASES.get((c.n, c.k), ())
        return i in steps and (i not in SPLIT_STEPS or (split_here and (c.m == 1 or i in BATCH_STEPS)))
    return at


#: The benchmark, declared: each series in the order a case runs them, and the cases it is measured at (how each
#: is built, checked and timed: :func:`_specs`). Step 23 through its plan (the host time an eager loop pays) beside
#: BitNet's kernel and at the targets' shape; at M = 1, step 23 at each other place that takes the problem, and the
#: probes (what limits steps 21 and 23).
TABLE: list[tuple[str, Callable[[Case], bool]]] = [
    (CUBLAS, lambda c: True),
    *((SERIES[i], _step_at(i)) for i in range(1, 26)),
    ("read_weights", lambda c: c.m == 1),
    (GEMLITE, lambda c: not c.bitnet_only and (c.m == 1 or (not c.quick and (c.n, c.k) in GEMLITE_BATCH_SHAPES))),
    (INT_MM, lambda c: not c.bitnet_only),
    (INT_MM_MATMUL, lambda c: not c.bitnet_only and c.m == 1),
    (PLAN, lambda c: c.m == 1 and ((c.n, c.k) in BITNET_SHAPES or (c.n, c.k) == (4096, 14336))),
    (BITNET, lambda c: c.m == 1 and (c.n, c.k) in BITNET_SHAPES),
    *((series, lambda c, q=where: not c.quick and c.m == 1 and q != w2a8_default_quantize(c.m, c.n, c.k)
       and w2a8_takes(c.m, c.n, c.k, q)) for where, series in W2A8_PLACE_SERIES.items() if where != "separate"),
    *((series, lambda c: not c.quick and c.m == 1 and c.family == "llama") for series in PROBE_SERIES.values()),
]


def series_at(case: Case) -> list[str]:
    """The series the table measures at ``case``, in order."""
    return [name for name, at in TABLE if at(case)]


# How a series is timed

#: GPU time of one graph replay of slow calls (ms): MIN_GRAPH_CALLS to MAX_GRAPH_CALLS (the harness's default).
GRAPH_BUDGET_MS = 2.0
MIN_GRAPH_CALLS, MAX_GRAPH_CALLS = 4, 60
#: Host time measured over this much GPU time of calls at most (ms), 10 to 200 calls a repetition.
HOST_BUDGET_MS = 20.0
#: Replays a repetition: 15, or 5 for calls slower than SLOW_CALL_MS.
SLOW_CALL_MS = 0.2


def timing_plan(call_ms: float) -> dict[str, int]:
    """How to time a call that takes about ``call_ms``: calls a graph replay, replays a repetition, host calls."""
    call_ms = max(call_ms, 1e-4)
    return {"min_calls": max(MIN_GRAPH_CALLS, min(MAX_GRAPH_CALLS, int(GRAPH_BUDGET_MS / call_ms))),
            "reps": 15 if call_ms < SLOW_CALL_MS else 5,
            "host_calls": max(10, min(200, int(HOST_BUDGET_MS / call_ms)))}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def call_ms(fn: Callable[[], Any], calls: int = 3) -> float:
    """Wall time of a call, host and GPU, after the first (an upper bound on its GPU time, for timing_plan)."""
    _sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync()
    return (time.perf_counter() - start) / calls * 1e3


@dataclass
class Series:
    """One series at one case: ``make(x, w)`` returns the call (graph-safe) on x and one copy of ``weights``;
    ``host(x, w)`` the public call, where it differs; ``check`` what :func:`_check` checks its output against."""

    weights: Any
    make: Callable[[Tensor, Any], Callable[[], Any]]
    weight_bytes: int
    check: Optional[str] = "float"
    mma: Optional[str] = None
    role: str = "kernel"
    host: Optional[Callable[[Tensor, Any], Callable[[], Any]]] = None
    config: Callable[[], str] = lambda: ""
    in_bytes: Optional[int] = None
    out_bytes: Optional[int] = None
    floor: bool = True
    host_time: bool = True


def _tuned_config(series: str, m: int) -> str:
    """The config a Triton step's autotuner chose for this case ("" for the other series)."""
    few = block_m_for(m) <= 32
    tuner = {
        SERIES[1]: TS.step01_sign_tuned, SERIES[2]: TS.step02_int8_tuned, SERIES[3]: TS.step03_2bit_tuned,
        SERIES[4]: TS.step04_and_decode_tuned, SERIES[5]: TS.step05_gemv_tuned, SERIES[7]: TS.step07_base3_gemv_tuned,
        SERIES[6]: TS.step06_dot_tuned_few if few else TS.step06_dot_tuned_many,
        SERIES[8]: TS.step08_base3_dot_tuned_few if few else TS.step08_base3_dot_tuned_many,
        SERIES[9]: TM.step09_w2a8_dot_tuned_few if few else TM.step09_w2a8_dot_tuned_many,
        SERIES[10]: TM.step10_dot_configs_tuned_few if few else TM.step10_dot_configs_tuned_many,
        **{SERIES[i]: TM.pair_dot_tuned_few if few else TM.pair_dot_tuned_many for i in (11, 12, 13)},
        SERIES[14]: TM.step14_workspace_tuned_few if few else TM.step14_workspace_tuned_many,
    }.get(series)
    return str(getattr(tuner, "best_config", "") or "")


def _cuda_config(step: int, m: int, n: int, k: int) -> str:
    """The config a CUDA C++ step launches at this case ("" for the Triton steps: :func:`_tuned_config`)."""
    if step in (15, 16, 17):
        return f"{cuda_mma_config(m, n, k)}" + (", one slice of K" if step == 15 else "")
    if step == 18:
        return f"{tma_config(m, n, k)}, slices of K {cuda_mma_config(m, n, k).slices}"
    if step in (19, 20, 21):
        return str(tma_config(m, n, k))
    if step in (22, 23):
        where = "separate" if step == 22 else w2a8_default_quantize(m, n, k)
        return f"{w2a8_config(m, n, k, quantize=where)}, quantize={where!r}"
    return str(w2a8_tiles_config(m, n, k)) if step in (24, 25) else ""


def _peak_matmul(run, dtype) -> tuple[float, float]:
    """(median ms, T(FL)OP/s) of a dense 8192^3 bf16 or int8 matmul, by do_bench (long enough for it)."""
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


def _specs(case: Case, scale: float, weights: dict, x: Tensor, refs: dict, layer: Any, bitnet: Any) -> dict:
    """How each series at ``case`` is built: {series: Series} (a peer that is not here: none)."""
    m, n, k = case.m, case.n, case.k
    pt = weights["2bit_tiles"]

    def call(step, **options):
        """A step's call on x and one copy of its weights."""
        return lambda x, w: (lambda: STEP[step](x, w, scale, **options))

    def quantized(x, w):
        """Step 9: x quantised beforehand (not timed)."""
        q, qs = quantize_activations(x)
        return lambda: STEP[9](q, qs, w, scale)

    def int_mm(x, w):
        plan = P.IntMMPlan(w, scale, m)
        return lambda: plan(x)

    def int_mm_matmul(x, w):
        plan = P.IntMMPlan(w, scale, m)
        plan.quantize(x)
        return plan.matmul

    specs = {
        CUBLAS: Series(weights["bf16"], lambda x, w: (lambda: x @ w.T), n * k * 2, "cublas", "bf16", "baseline",
                       out_bytes=m * n * 2),
        SERIES[1]: Series(weights["bf16"], call(1, check_values=False), n * k * 2, host=call(1)),
        SERIES[2]: Series(weights["int8"], call(2, check_values=False), n * k, host=call(2)),
        SERIES[9]: Series(weights["2bit"], quantized, weights["2bit"].nbytes, "w2a8", "int8", in_bytes=m * k + m * 4),
        **{SERIES[i]: Series(weights[fmt], call(i), weights[fmt].nbytes, "w2a8" if mma == "int8" else "float", mma,
                             config=functools.partial(_cuda_config, i, m, n, k))
           for i, (fmt, mma) in PACKED_STEPS.items()},
        PLAN: Series(pt, lambda x, w: functools.partial(W2A8Plan(w, scale, m=m, dtype=x.dtype), x), pt.nbytes,
                     "w2a8", "int8", config=functools.partial(_cuda_config, 23, m, n, k)),
        "read_weights": Series(pt, lambda x, w: read_only(w.data), pt.nbytes, None, role="baseline",
                               in_bytes=0, out_bytes=0, host_time=False),
        INT_MM: Series(weights["int8"], int_mm, n * k, "w2a8", "int8", "baseline", in_bytes=m * k * 2),
        INT_MM_MATMUL: Series(weights["int8"], int_mm_matmul, n * k, "int32", "int8", "baseline",
                              in_bytes=P.int_mm_rows(m) * k, out_bytes=P.int_mm_rows(m) * n * 4),
        **{series: Series(pt, call(23, quantize=where), pt.nbytes, "w2a8", "int8",
                          config=lambda q=where: f"{w2a8_config(m, n, k, quantize=q)}")
           for where, series in W2A8_PLACE_SERIES.items() if where != "separate"},
    }
    for (step, probe), series in PROBE_SERIES.items():
        make_probe, config = {21: (step21_probe, tma_config), 23: (step23_probe, w2a8_config)}[step]
        specs[series] = Series(pt, lambda x, w, f=make_probe, p=probe: f(x, w, scale, p), pt.nbytes, None,
                               config=lambda c=config, p=probe: f"{c(m, n, k)}; {PROBES[p]}", floor=False,
                               host_time=False)
    if layer is not None:
        specs[GEMLITE] = Series(layer, lambda x, w: (lambda: w(x)), layer.W_q.numel() * 4, "bf16", "bf16", "peer",
                                config=lambda: P.gemlite_best_config(P.gemlite_matmul_type(m)), out_bytes=m * n * 2)
    if bitnet is not None and BITNET in series_at(case):
        xq, x_scale = quantize_activations(x)
        s_bf16, ws = bitnet_scales(x_scale, scale, x.device)
        refs["bitnet"] = (xq.double() @ weights["float64"].T) / s_bf16.double() * ws[0].double()

        def bitnet_call(x, w):
            xq_, xs_ = quantize_activations(x)
            s_, ws_ = bitnet_scales(xs_, scale, x.device)
            out = torch.empty(1, n, dtype=torch.bfloat16, device=x.device)
            return lambda: bitnet_linear(bitnet, xq_, w, s_, ws_, out)

        packed = bitnet_pack(weights["int8"])
        specs[BITNET] = Series(packed, bitnet_call, packed.numel(), "bitnet", "int8", "peer", in_bytes=k + 2,
                               out_bytes=n * 2)
    return specs


# The benchmark

def _notes(run, gemlite: Any) -> None:
    s, name = SERIES, {st.number: st.name for st in STEPS}
    run.note("Clock: every series' ms is its GPU time (CUDA-graph replay, weights rotated among copies 4x the L2, x "
             "in L2; median of 3 repetitions, each with fresh x and fresh copies: spread_ms = [min, median, max]); "
             "host_ms is the host time per call of the public call, eager (back-to-back calls, no sync). Slow calls "
             "get fewer calls a replay (graph_calls). The peak matmuls alone are do_bench (long kernels).")
    run.note("Series: stepNN is step NN of the chapter (its public function stepNN_<slug>); the others are baselines, "
             "peers or launches of a step with another option (CHAPTER.baselines).")
    run.note("Weights: quantize_absmean(randn(N, K)), one scale per tensor; x: randn(M, K) in bf16. Baseline: cuBLAS "
             "bf16 x @ W.T on the same ternary matrix stored densely (bf16 out, no scale). Ours: float32 out, divided "
             f"by the scale. {s[9]} ({name[9]}) times the matmul alone, x already quantised to int8. {s[1]} and {s[2]} "
             "in the graph skip their check of the dense weights (check_values=False: the check waits for the GPU); "
             "their host time is of the default call, check included.")
    run.note("floor_ms = max(bytes moved / copy bandwidth of this run, 2MNK / measured matmul peak of the MMA the "
             "kernel uses); bytes = weights + x + z.")
    run.note(f"{s[22]} to {s[25]} ({name[22]} to {name[25]}): W2A8 from bf16 x, x quantised inside the call as "
             "quantize_activations does; checked against float64 of the quantised x. At M = 1 also step 23 at each "
             f"other place in the matmul to quantise x that fits ({W2A8_PLACE_SERIES['every block']}, "
             f"{W2A8_PLACE_SERIES['staged']}); {s[21]}_probe_* and {s[23]}_probe_* are builds with parts left out "
             "(copies only, arithmetic only, launch only), on the Llama shapes. Steps "
             f"{', '.join(str(i) for i in SPLIT_STEPS)} (one change each on the way to the next kernel the entry "
             "point ships) are timed only at " + ", ".join(f"{n}x{k}, M = {' and '.join(map(str, ms))}"
                                                           for (n, k), ms in SPLIT_CASES.items()) + ".")
    run.note(f"{INT_MM}: the W2A8 product by torch._int_mm (cuBLASLt int8 x int8 -> int32): x quantised to int8 in "
             "the call (quantize_activations, eager torch: the bits steps 22 to 25 use), copied into a buffer of "
             f"max(M, {P.INT_MM_MIN_ROWS}) rows (cuBLASLt takes more than 16; the padding stays zero), int8 weights "
             f"(N, K) as its column-major operand, then divided by both scales in float32. {INT_MM_MATMUL}: the int8 "
             "GEMM alone on x already quantised and padded (int32 out), at M = 1.")
    if isinstance(gemlite, str):
        run.note(f"{GEMLITE}: not measured: {gemlite}")
    else:
        types = {m: P.gemlite_matmul_type(m) for m in BENCH_MS}
        version = getattr(gemlite, "__version__", "?")
        run.note(f"{GEMLITE}: GemLite {version} with 2-bit weights and bf16 x (codes w + 1, zero 1, one float32 scale "
                 "1/scale a row, applied after the sum; the layout of its BitNet processor A16W158_INT, checked by "
                 "decoding its packed words back to our weights); bf16 out. Its kernels: "
                 + ", ".join(f"M = {m}: {t} (autotune {P.gemlite_autotune_setting(t)!r})" for m, t in types.items())
                 + "; the config its autotune chose is each row's config. Checked against float64 within bf16 "
                 f"rounding (norm of the error <= {P.BF16_NORM_TOLERANCE} of the reference's). Above M = 1 only at "
                 + ", ".join(f"{n}x{k}" for n, k in GEMLITE_BATCH_SHAPES) + " (its autotune compiles about twenty "
                 "configs a shape for each batched kernel).")


def _load_gemlite() -> Any:
    """GemLite, or the reason it is not measured (a string)."""
    try:
        return P.import_gemlite()
    except ImportError as err:
        return f"{err} (an optional peer: pip install gemlite)"


def bench(run) -> None:
    """cuBLAS bf16, the peers and every step, per shape and M; correctness checked on the same inputs."""
    (bf16_ms, bf16_rate), (int8_ms, int8_rate) = _peak_matmul(run, torch.bfloat16), _peak_matmul(run, torch.int8)
    peak = {"bf16": bf16_rate, "int8": int8_rate}
    run.record("peak_bf16_matmul", bf16_ms, params={"n": 8192}, role="baseline", clock="do_bench", tflops=bf16_rate)
    run.record("peak_int8_matmul", int8_ms, params={"n": 8192}, role="baseline", clock="do_bench", tops=int8_rate)
    gemlite = _load_gemlite()
    _notes(run, gemlite)
    bitnet = _load_bitnet(run)
    torch.manual_seed(0)
    shapes: dict[tuple, list[Case]] = {}
    for case in bench_cases(run.quick):
        shapes.setdefault((case.family, case.n, case.k), []).append(case)
    bar = run.progress(list(shapes.values()), "shapes")
    for cases in bar:
        _bench_shape(run, cases, peak, gemlite, bar, bitnet)
        torch.cuda.empty_cache()


def _load_bitnet(run) -> Any:
    """BitNet's kernel built from the checkout given in BITNET_ENV, or None (with a note saying why)."""
    try:
        root = bitnet_checkout()
        if root is None:
            run.note(f"{BITNET}: not measured: no checkout of microsoft/BitNet given (set {BITNET_ENV} to one)")
            return None
        library = bitnet_library(root)
    except Exception as err:  # noqa: BLE001 (a peer that fails to build is a note, not a lost run)
        run.note(f"{BITNET}: not measured: {type(err).__name__}: {err}")
        return None
    commit = (root / "COMMIT").read_text().split()[0] if (root / "COMMIT").is_file() else "?"
    run.note(f"{BITNET}: microsoft/BitNet gpu/bitnet_kernels/bitnet_kernels.cu (commit {commit}) built with nvcc as "
             "its compile.sh does, for this GPU's sm instead of compute_80 PTX; called through ctypes as its "
             "gpu/test.py does, at M = 1 on the (N, K) it is compiled for; x quantised to int8 before the call (not "
             "timed: its model quantises with torch ops first), so its time is the matmul alone while ours includes "
             "quantising x. Weights packed from our ternary matrix (bitnet_pack, its convert_weight_int8_to_int2); "
             "bf16 out, checked elementwise against float64 of the quantised x with its bf16 scales.")
    return library


def _gemlite_layer(run, gemlite: Any, w_t: Tensor, scale: float, params: dict) -> Any:
    """GemLite's layer of the ternary weights, built and checked once a shape (None where it cannot be)."""
    if isinstance(gemlite, str):
        return None
    try:
        layer = P.gemlite_ternary(w_t, scale)
        decoded, scales, zeros = P.gemlite_weights(layer)
        run.check(f"{GEMLITE} holds the ternary weights exactly", bool(
            torch.equal(decoded, w_t) and torch.all(scales == torch.tensor(1.0 / scale, dtype=torch.float32))
            and int(zeros.reshape(-1)[0]) == 1), params=params)
        return layer
    except Exception as err:  # noqa: BLE001 (a peer that fails is a note, not a lost run)
        run.note(f"{GEMLITE} at {params['shape']}: could not be built: {type(err).__name__}: {err}")
        return None


def _bench_shape(run, cases: list[Case], peak: dict, gemlite: Any, bar: Any = None, bitnet: Any = None) -> None:
    """The table's series at the cases of one shape, on one draw of its weights."""
    dev, n, k = runtime.device(), cases[0].n, cases[0].k
    w_t, scale_t = quantize_absmean(torch.randn(n, k, device=dev))
    scale = float(scale_t)  # one number: no per-call tensor
    weights = {"int8": w_t, "bf16": w_t.to(torch.bfloat16), "float64": w_t.double(),
               **{fmt: PackedTernary.pack(w_t, fmt) for fmt in ("2bit", "base3", "2bit_mma", "2bit_tiles")}}
    shape_params = {name: v for name, v in cases[0].params.items() if name != "m"}
    layer = _gemlite_layer(run, gemlite, w_t, scale, shape_params) \
        if any(GEMLITE in series_at(c) for c in cases) else None
    for case in cases:
        x = torch.randn(case.m, k, device=dev, dtype=torch.bfloat16)
        xq, x_scale = quantize_activations(x)
        x64, xq64, xs64, w64 = x.double(), xq.double(), x_scale.double()[:, None], weights["float64"]
        refs = {"float": ((x64 @ w64.T) / scale, (x64.abs() @ w64.abs().T) / abs(scale)),
                "w2a8": ((xq64 @ w64.T) / (xs64 * scale), (xq64.abs() @ w64.abs().T) / (xs64 * abs(scale))),
                "int32": (xq64 @ w64.T, None), "scale": scale}
        specs = _specs(case, scale, weights, x, refs, layer, bitnet)
        for name in (name for name in series_at(case) if name in specs):
            spec = specs[name]
            if bar is not None and hasattr(bar, "set_postfix_str"):  # where a long sweep is, in the log too
                bar.set_postfix_str(f"{n}x{k} M={case.m} {name}")
            try:
                _bench_series(run, name, spec, x, case, refs, peak)
            except Exception as err:  # noqa: BLE001
                if spec.role == "kernel" or name == CUBLAS:
                    raise
                run.note(f"{name} at {n}x{k}, M = {case.m}: raised {type(err).__name__}: {err}; not measured")


def _check(run, name: str, spec: Series, z: Tensor, params: dict, refs: dict, m: int) -> None:
    """``z`` checked against what ``spec.check`` names (recorded as a check of the run)."""
    if spec.check in ("float", "w2a8"):
        ref, magnitude = refs[spec.check]
        ratio = error_ratio_from(z.float(), ref, magnitude)
        run.check(f"{name} equals float64 reference", ratio <= FP32_TOLERANCE, params=params, error_ratio=ratio,
                  tolerance=FP32_TOLERANCE)
    elif spec.check == "bf16":
        error = P.relative_norm_error(z, refs["float"][0])
        run.check(f"{name} within bf16 rounding of float64", error <= P.BF16_NORM_TOLERANCE, params=params,
                  relative_error=error, tolerance=P.BF16_NORM_TOLERANCE)
    elif spec.check == "bitnet":  # bf16 out: within its rounding of float64 with the same (bf16) scales
        ref = refs["bitnet"]
        err = (z.double() - ref).abs()
        run.check(f"{name} within bf16 rounding of float64", bool((err <= 2**-8 * ref.abs() + 1e-9).all()),
                  params=params, max_relative_error=float((err / ref.abs().clamp(min=1e-30)).max()))
    elif spec.check == "int32":
        run.check(f"{name} equals the exact int32 sums", bool(torch.equal(z[:m].double(), refs["int32"][0])),
                  params=params)
    elif spec.check == "cublas":  # cuBLAS computes x @ W.T on the ternary matrix: the reference times the scale
        ref, magnitude = refs["float"]
        exact, mag = ref * refs["scale"], magnitude * abs(refs["scale"])
        run.check(f"{name} within bf16 rounding of float64", bool(
            ((z.double() - exact).abs() <= 2**-7 * exact.abs() + 2**-10 * mag).all()), params=params)


def _bench_series(run, name: str, spec: Series, x: Tensor, case: Case, refs: dict, peak: dict) -> None:
    """One series at one case: checked on its first call (which compiles and autotunes), then timed and recorded."""
    m, n, k, params = case.m, case.n, case.k, case.params
    fn = spec.make(x, spec.weights)
    z = fn()
    _sync()
    _check(run, name, spec, z, params, refs, m)
    plan = timing_plan(call_ms(fn))
    nbytes = spec.weight_bytes + (m * k * 2 if spec.in_bytes is None else spec.in_bytes) + \
        (m * n * 4 if spec.out_bytes is None else spec.out_bytes)
    extra = {"weight_bytes": spec.weight_bytes, "bytes": nbytes, "config": _tuned_config(name, m) or spec.config()}
    if spec.floor:
        mem, compute = run.floor_ms(nbytes), 2 * m * n * k / (peak[spec.mma] * 1e12) * 1e3 if spec.mma else 0.0
        extra.update(floor_ms=max(mem, compute), floor_mem_ms=mem, floor_compute_ms=compute)

    def make_calls():  # fresh x, and the weights with copies of them together past L2 (a GemLite layer deep-copied)
        fresh, w = torch.randn_like(x), spec.weights
        if isinstance(w, (Tensor, PackedTernary)):
            return [spec.make(fresh, one) for one in run.rotated(w)]
        count = run.rotation(w.W_q.numel() * w.W_q.element_size())
        return [spec.make(fresh, one) for one in [w] + [copy.deepcopy(w) for _ in range(count - 1)]]

    host = (spec.host or spec.make)(x, spec.weights) if spec.host_time else None
    row = run.measure(name, make_calls, params=params, role=spec.role, host=host, min_calls=plan["min_calls"],
                      reps=plan["reps"], host_calls=plan["host_calls"], graph_calls=plan["min_calls"], **extra)
    row["gbs"] = nbytes / (row["ms"] * 1e-3) / 1e9
