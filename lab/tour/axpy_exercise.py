"""Chapter 00's exercise ("predict, then measure"), run once on a GPU so the page can show a measured answer.

Times ``axpy_plain`` and ``axpy_restrict_ldg`` (``studylog/csrc/tour_axpy.cu``) at 2^26 floats, well past L2, each
first checked against float64: on the course's clock (``BenchRun.gpu_time``: CUDA-graph replay, three repetitions)
and with ``triton.testing.do_bench_cudagraph``, the stopwatch the exercise's cell uses, beside the floor of the bytes
(read x and y, write y) at the run's copy bandwidth. Writes ``lab/tour/results/<gpu>/axpy_exercise.json``
(``--out DIR`` or ``$OUT`` instead).

    PYTHONPATH=$PWD python lab/tour/axpy_exercise.py
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import triton.testing

from studylog import cuda, paths
from studylog.bench import BenchRun, write_lab_output

N = 1 << 26
KERNELS = ("axpy_plain", "axpy_restrict_ldg")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="folder for <gpu>/axpy_exercise.json (default $OUT, else lab/tour/results)")
    args = ap.parse_args()
    run = BenchRun("tour", command="python lab/tour/axpy_exercise.py")
    params = {"n": N, "dtype": "float32", "alpha": 2.0}
    floor_ms = run.floor_ms(3 * 4 * N)  # read x and y, write y
    for name in KERNELS:
        kernel = cuda.load("tour_axpy").kernel(name, ["ptr", "ptr", "f32", "i32"])
        grid = ((N + 255) // 256,)
        xs, ys = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
        expected = 2.0 * xs.double() + ys.double()
        kernel(grid, (256,), xs, ys, 2.0, N)
        run.check(f"{name} matches float64", torch.allclose(ys.double(), expected, rtol=1e-6, atol=1e-6),
                  params=params)

        def calls(kernel=kernel, xs=xs, ys=ys):
            return [lambda: kernel(grid, (256,), xs, ys, 2.0, N)]

        stopwatch_ms = float(triton.testing.do_bench_cudagraph(calls()[0], rep=100))
        run.measure(name, calls, params=params, floor_ms=floor_ms, min_calls=20,
                    do_bench_cudagraph_ms=stopwatch_ms)
    folder = Path(args.out or os.environ.get("OUT") or paths.LAB / "tour" / "results")
    print(write_lab_output(folder, run.device["name"], "axpy_exercise", run.to_json()))
    for row in run.rows:
        print(f"{row['series']:18s} {row['ms'] * 1e3:8.1f} µs ({row['ms'] / row['floor_ms']:.2f}× floor), "
              f"do_bench_cudagraph {row['do_bench_cudagraph_ms'] * 1e3:.1f} µs")
    if not all(c["passed"] for c in run.checks):
        raise SystemExit("a check failed")


if __name__ == "__main__":
    main()
