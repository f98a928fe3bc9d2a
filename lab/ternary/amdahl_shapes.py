"""Experiment (GPU): every ternary layer of a BitNet b1.58 2B4T transformer layer at its own shape, in one run.

Chapter 5's Amdahl estimate of a decode step weighs each ternary layer's time, cuBLAS bf16 against our kernels, at
one row of x. The benchmark has no 640 x 2560 case (k and v), so the chapter charged k and v q's time. This run
times all four shapes of the layer (q and o 2560 x 2560, k and v 640 x 2560, gate and up fused 13824 x 2560, down
2560 x 6912) with cuBLAS bf16 and our bf16-x steps 5, 14, 17 and 21 (and step 23, W2A8, beside them), the benchmark's
weights (``quantize_absmean(randn)``, one scale), rotation and GPU clock, each output checked against float64 first.
Writes ``results/<gpu>/amdahl_shapes.json`` (rows as the benchmark's: series, ``params`` shape/n/k/m, ``ms``), which
``book.ternary.lesson.amdahl`` reads where it is committed. Run from the repository root on a GPU machine:
``PYTHONPATH=$PWD python lab/ternary/amdahl_shapes.py`` (about a minute on an H200).
"""
from __future__ import annotations

import sys

import torch

from lab.ternary.step13_changes import w2a8_reference
from lab.ternary.step14_gemv import time_series
from studylog import paths
from studylog import ternary as T
from studylog.bench import BenchRun, write_lab_output
from studylog.ternary import FP32_TOLERANCE, PackedTernary, quantize_absmean
from studylog.ternary.formats import error_ratio, error_ratio_from

NAME = "amdahl_shapes"
#: (N, K) of BitNet b1.58 2B4T's ternary layers: q and o, k and v, gate and up (fused), down.
SHAPES = ((2560, 2560), (640, 2560), (13824, 2560), (2560, 6912))
#: Our steps timed, by series: (function, the weights' format, whether x is rounded to int8 first).
STEPS = {"step04": (T.step05_gemv, "2bit", False), "step09": (T.step14_workspace, "2bit_mma", False),
         "step10": (T.step17_x_smem, "2bit_tiles", False), "step11": (T.step21_magic_reg, "2bit_tiles", False),
         "step12": (T.step23_w2a8_fused, "2bit_tiles", True)}


def main() -> int:
    run = BenchRun("ternary", command=" ".join(sys.argv))
    run.note("Clock: GPU time (CUDA-graph replay, weights rotated among copies past L2, x in L2; median of 3 "
             "repetitions with fresh x). Weights: quantize_absmean(randn(N, K)), one scale; x: randn(1, K) bf16. "
             "cublas_bf16 is x @ W.T on the ternary matrix in bf16; steps 5, 14, 17, 21 take bf16 x, step 23 int8 "
             "(W2A8, x quantised inside the call). Each step checked against float64 before it is timed.")
    failed = 0
    for n, k in SHAPES:
        torch.manual_seed(n * 31 + k)
        w_t, scale_t = quantize_absmean(torch.randn(n, k, device="cuda"))
        scale = float(scale_t)
        dense = w_t.to(torch.bfloat16).contiguous()  # the benchmark's cuBLAS baseline: the ternary matrix in bf16
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        params = {"shape": f"{n}x{k}", "n": n, "k": k, "m": 1}
        series = [("cublas_bf16", lambda x_, w_: (lambda: x_ @ w_.T), dense)]
        for name, (fn, fmt, w2a8) in STEPS.items():
            packed = PackedTernary.pack(w_t, fmt)
            z = fn(x, packed, scale)
            torch.cuda.synchronize()
            ratio = (error_ratio_from(z.float(), *w2a8_reference(x, w_t, scale)) if w2a8
                     else error_ratio(z.float(), x, w_t, scale))
            ok = ratio <= FP32_TOLERANCE
            failed += not ok
            run.check(f"{name} equals float64 {'W2A8 ' if w2a8 else ''}reference", ok, params=params,
                      error_ratio=ratio, tolerance=FP32_TOLERANCE)
            series.append((name, lambda x_, w_, f=fn: (lambda: f(x_, w_, scale)), packed))
        for name, make, weights in series:
            t = time_series(run, name, make, weights, x, params, role="baseline" if name == "cublas_bf16" else "kernel")
            print(f"{n}x{k} {name:12s} {t:7.2f} µs", flush=True)
    out = write_lab_output(paths.LAB / "ternary" / "results", run.device["name"], NAME, run.to_json())
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({failed} failed) -> {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
