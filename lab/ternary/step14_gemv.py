"""Experiment (GPU): a candidate step after step 23 for one row of x (a dp4a GEMV; its functions and series are named step14 after the numbering of its time), measured and not kept.

Step 23 feeds the int8 tensor cores from a TMA ring. At one row of x the tensor cores do 1/8 useful work, so this
candidate (``variants/step14_gemv.cu``, ``step14_w2a8_gemv_kernel<BF16, R, CH, WARPS, UNITS>``) drops both: each warp
owns R weight rows (the "2bit_mma" format), issues all of its loads at the start (CH 16-byte loads a lane a row), then
quantises x into shared memory as step 23 does and sums with one AND and one dp4a per 4 weights. It is bit-equal to
step 23 (same exact int32 sums, same epilogue).

``check`` (GPU): awkward sizes (N, K not multiples of 16 or 256, K not of 8) and the three benchmark shapes, bf16
and fp16, against the float64 W2A8 reference, and bit-equal to step 23 where K is a multiple of 8. ``measure``
(GPU): the candidate at several (R, CH, WARPS, UNITS) beside step 23, cuBLAS bf16 and the read-only floor
(``read_weights``) at 4096 x 14336, 2560 x 6912 and 8192 x 28672, M = 1, the benchmark's weights, rotation and GPU
clock; writes ``results/<gpu>/step14_gemv.json``. Run from the repository root on a GPU machine:
``PYTHONPATH=$PWD python lab/ternary/step14_gemv.py`` (both, about 80 s on an H200). ``profile``: one call each of
the two fastest candidates and step 23 at 4096 x 14336 inside cudaProfilerStart/Stop, for Nsight Compute:
``ncu --clock-control none --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis
--section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --csv --page details
python lab/ternary/step14_gemv.py profile > results/nvidia-h200/step14_gemv_ncu.csv``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton

from lab.ternary.step13_changes import w2a8_reference
from studylog import cuda, paths
from studylog import ternary as T
from studylog.bench import BenchRun, read_only, write_lab_output
from studylog.ternary import FP32_TOLERANCE, PackedTernary, quantize_absmean
from studylog.ternary.formats import MMA_X_DTYPES, check_packed_call, error_ratio_from
from studylog.ternary.report import call_ms, timing_plan

SOURCE = Path(__file__).resolve().parent / "variants" / "step14_gemv.cu"
NAME = "step14_gemv"
#: (R, CH, WARPS, UNITS) per shape: R rows a warp, CH loads a lane a row (CH x 32 >= K / 64), UNITS x 16 x 32 x WARPS
#: >= K (x read once).
CONFIGS = {
    (4096, 14336): [(4, 7, 8, 4), (2, 7, 16, 2), (4, 7, 4, 7), (1, 7, 32, 1), (2, 7, 8, 4)],
    (2560, 6912): [(4, 4, 8, 2), (2, 4, 4, 4), (2, 4, 8, 2), (1, 4, 8, 2)],
    (8192, 28672): [(2, 14, 8, 7), (2, 14, 16, 4), (1, 14, 16, 4)],
}
CHECKS = [(333, 3001, (4, 4, 8, 2)), (4096, 14336, (4, 7, 8, 4)), (2560, 6912, (1, 4, 8, 2)),
          (8192, 28672, (2, 14, 8, 7)), (17, 14336, (2, 7, 16, 2)), (40, 5000, (2, 4, 4, 4))]
SIGNATURE = ["ptr", "ptr", "ptr", "ptr", "i32", "i32", "i32", "i32"]


def instance(bf16: bool, cfg: tuple[int, int, int, int]) -> str:
    return f"step14_w2a8_gemv_kernel<{'true' if bf16 else 'false'}, {cfg[0]}, {cfg[1]}, {cfg[2]}, {cfg[3]}>"


INSTANCES = sorted({instance(b, c) for cs in CONFIGS.values() for c in cs for b in (True, False)})


def kernels() -> dict:
    module = cuda.load(SOURCE, name_expressions=INSTANCES)
    return {name: module.kernel(name, SIGNATURE) for name in INSTANCES}


def step14(kernels: dict, x, w: PackedTernary, scale, cfg):
    x2, _, w, s, s_stride, z = check_packed_call(x, w, scale, None, "2bit_mma", dtypes=MMA_X_DTYPES)
    if x2.shape[0] != 1:
        raise ValueError(f"the candidate takes one row of x, got {x2.shape[0]}")
    rows, loads, warps, _ = cfg
    groups = triton.cdiv(w.k, 256)
    if groups * 4 > loads * 32:
        raise ValueError(f"K = {w.k} needs more than {loads} loads a lane a row")
    kernels[instance(x2.dtype == torch.bfloat16, cfg)]((triton.cdiv(w.n, warps * rows),), (warps * 32,), x2, w.data,
                                                       z, s, w.n, w.k, groups, s_stride, shared_mem=loads * 8 * 256)
    return z


def time_series(run: BenchRun, name: str, make, weights, x: torch.Tensor, params: dict, **kw) -> float:
    """Time ``make(x, weights)`` (a call built on x and one copy of the weights) as the benchmark times a step: the
    weights rotated among copies past L2, fresh x in each repetition, the timing plan of the call's own time. Records
    the row in ``run`` and returns its time in µs."""
    fn = make(x, weights)
    fn()
    torch.cuda.synchronize()
    plan = timing_plan(call_ms(fn))

    def make_calls():
        fresh = torch.randn_like(x)
        return [make(fresh, copy) for copy in run.rotated(weights)]

    run.measure(name, make_calls, params=params, min_calls=plan["min_calls"], reps=plan["reps"], **kw)
    return run.rows[-1]["ms"] * 1e3


def ternary(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    u = torch.rand(n, k, generator=gen)
    sign = torch.where(torch.rand(n, k, generator=gen) < 0.5, -1, 1)
    return torch.where(u < 1 / 3, 0, sign).to(torch.int8)


def check(kern: dict) -> int:
    gen, bad = torch.Generator().manual_seed(0), 0
    for n, k, cfg in CHECKS:
        w = ternary(n, k, gen).cuda()
        packed = PackedTernary.pack(w, "2bit_mma")
        for dtype in MMA_X_DTYPES:
            x = (torch.randn(1, k, generator=gen) * 3).to(dtype).cuda()
            z = step14(kern, x, packed, 0.7, cfg)
            ratio = error_ratio_from(z.float(), *w2a8_reference(x, w, 0.7))
            same = None
            if k % 8 == 0:
                same = bool(torch.equal(z.view(-1), T.step23_w2a8_fused(x, PackedTernary.pack(w, "2bit_tiles"), 0.7).view(-1)))
            ok = ratio <= FP32_TOLERANCE and same is not False
            bad += not ok
            print(f"check n={n} k={k} cfg={cfg} {dtype}: error {ratio:.2e}, bit-equal to step 23: {same}",
                  "OK" if ok else "FAIL", flush=True)
    return bad


def measure(kern: dict) -> Path:
    run = BenchRun("ternary", command=" ".join(sys.argv))
    run.note("Clock: GPU time (CUDA-graph replay, weights rotated among copies past L2, x in L2; median of 3 "
             "repetitions). Series 'step14 (R, CH, WARPS, UNITS)' are the candidate at that template; step12 the "
             "library's default launch; read_weights the read-only floor over step 12's weights.")
    for (n, k), cfgs in CONFIGS.items():
        torch.manual_seed(n * 31 + k)
        w_t, scale_t = quantize_absmean(torch.randn(n, k, device="cuda"))
        scale = float(scale_t)
        mma, tiles = PackedTernary.pack(w_t, "2bit_mma"), PackedTernary.pack(w_t, "2bit_tiles")
        dense = (w_t.to(torch.bfloat16) / scale).contiguous()
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        series = [("cublas_bf16", lambda x_, w_: (lambda: torch.matmul(x_, w_.t())), dense),
                  ("read_weights", lambda x_, w_: read_only(w_.data), tiles),
                  ("step12", lambda x_, w_: (lambda: T.step23_w2a8_fused(x_, w_, scale)), tiles)]
        series += [(f"step14 {c}", lambda x_, w_, c=c: (lambda: step14(kern, x_, w_, scale, c)), mma) for c in cfgs]
        for name, make, weights in series:
            t = time_series(run, name, make, weights, x, {"n": n, "k": k, "m": 1})
            print(f"{n}x{k} {name:28s} {t:7.2f} µs", flush=True)
    return write_lab_output(paths.LAB / "ternary" / "results", run.device["name"], NAME, run.to_json())


def profile(kern: dict) -> None:
    n, k = 4096, 14336
    torch.manual_seed(n * 31 + k)
    w_t, scale_t = quantize_absmean(torch.randn(n, k, device="cuda"))
    mma, tiles = PackedTernary.pack(w_t, "2bit_mma"), PackedTernary.pack(w_t, "2bit_tiles")
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    calls = [lambda c=c: step14(kern, x, mma, float(scale_t), c) for c in CONFIGS[(n, k)][:2]]
    calls.append(lambda: T.step23_w2a8_fused(x, tiles, float(scale_t)))
    for call in calls:  # compiled and warm before the profiled calls
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    compiled = kernels()
    if sys.argv[1:] == ["profile"]:
        profile(compiled)
        sys.exit(0)
    failures = check(compiled)
    if failures:
        sys.exit(f"{failures} checks failed: nothing measured")
    print(f"-> {measure(compiled)}")
