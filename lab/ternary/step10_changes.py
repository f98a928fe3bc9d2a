"""Chapter 5 part 2's step 10 split into its changes, one measured number each.

Step 10 (``step10_cuda_mma``, ``studylog/ternary/csrc/ternary_mma.cu``) ports step 9 to CUDA C++ and brings four
changes with the port: the loop written by hand with each thread's weight loads two groups ahead of its decode
(on the ``2bit_tiles`` layout, whose 16 rows of a group are one run of memory), x copied once into shared memory,
and K split across blocks with a last slice that adds the partial sums in a fixed order. A frozen copy of the
kernel (``variants/step10_changes.cu``, which includes the library's ``ternary_common.cuh``) takes x back to global
memory (``X_SMEM`` = false) and the loads to one group ahead (``STAGES`` = 1); the split is a launch setting
(``CudaMmaConfig.slices``). The chain from step 9 adds the changes one at a time:

* ``step10-b-c``: the hand-written loop, loads two groups ahead on the ``2bit_tiles`` layout, x read from global
  memory (L2) by every warp for every group, K in one slice: **10a**, against step 9;
* ``step10-b``: K split as the library splits it, x still from global memory: **10c** = ``step10-b-c`` /
  ``step10-b`` (the split first: in one slice a 4096-row layer has 16 blocks for 132 SMs);
* ``step10``: the frozen kernel at the library's settings and launch (its SASS is the library's, names aside): x
  copied once into shared memory, **10b** = ``step10-b`` / ``step10``;
* ``step10-c``: x in shared memory, K in one slice (the other order's middle link);
* ``step10-depth1``: step 10 with loads one group ahead instead of two (how deep the ring of registers must be).

The layout is not a knob: the kernel's addressing is the ``2bit_tiles`` layout's, so 10a carries it with the
hand-written loop. Every variant keeps step 10's arithmetic order, so each is bit-equal to the library's step 10 at
the same number of slices.

    PYTHONPATH=$PWD python lab/ternary/step10_changes.py check --compile-only   # CPU: NVRTC, spills, SASS
    PYTHONPATH=$PWD python lab/ternary/step10_changes.py check                  # GPU: float64 and bit-equality
    PYTHONPATH=$PWD python lab/ternary/step10_changes.py measure                # GPU: results/<gpu>/step10_changes.json

``measure`` times each variant and the library's steps 9 and 10 (the anchors, as the benchmark calls them) at
4096 x 14336 and 2560 x 6912, M = 1, on the chapter's GPU clock (``BenchRun.measure``), with the benchmark's
weights, bf16 x and timing plan, as ``step11_changes.py`` does; every row is checked against float64 (and each
variant bit-equal to the library's step 10 at its slices) before it is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch
import triton

from lab.ternary.step11_changes import cuobjdump, random_ternary, sass_functions
from studylog import cuda, paths, runtime
from studylog.ternary import FP32_TOLERANCE, PackedTernary, error_ratio, quantize_absmean, step09_mma, step10_cuda_mma
from studylog.ternary.cuda_steps import (CUDA_MMA_SIGNATURE, CUDA_WORKSPACE, CudaMmaConfig, cuda_call_args,
                                         cuda_mma_config, cuda_mma_max_groups_per_slice, cuda_mma_smem_bytes)
from studylog.ternary.formats import GROUP_WEIGHTS_2BIT, error_ratio_from
from studylog.ternary.report import BENCH_SHAPES, call_ms, timing_plan
from studylog.ternary.steps import SERIES

SOURCE = Path(__file__).resolve().parent / "variants" / "step10_changes.cu"
NAME = "step10_changes"
CASES = (("llama", 4096, 14336, (1,)), ("bitnet", 2560, 6912, (1,)))

STEP10 = {"x": "shared", "stages": 2, "split": True}
VARIANTS = {
    "step10": STEP10,
    "step10-b": STEP10 | {"x": "global"},
    "step10-c": STEP10 | {"split": False},
    "step10-b-c": STEP10 | {"x": "global", "split": False},
    "step10-depth1": STEP10 | {"stages": 1},
}
CHANGES = {"step10": "none (step 10)", "step10-b": "(b) x read from global memory",
           "step10-c": "(c) K in one slice",
           "step10-b-c": "(b) x read from global memory, (c) K in one slice",
           "step10-depth1": "loads one group ahead instead of two"}
#: The link of the chain each change adds: label -> (without it, with it). The split comes before x's copy: without
#: it a 4096-row layer has 16 blocks for 132 SMs, and every other change would be timed on an idle GPU.
CHAIN = {"10a": ("step09", "step10-b-c"), "10c": ("step10-b-c", "step10-b"), "10b": ("step10-b", "step10")}


def instance(knobs: dict, bf16: bool, col_tiles: int, row_tiles: int) -> str:
    flag = lambda b: "true" if b else "false"  # noqa: E731
    return (f"step10_changes_kernel<{flag(bf16)}, {col_tiles}, {row_tiles}, {knobs['stages']}, "
            f"{flag(knobs['x'] == 'shared')}>")


def _library_instance(bf16: bool, col_tiles: int, row_tiles: int) -> str:
    return f"step10_cuda_mma_kernel<{'true' if bf16 else 'false'}, {col_tiles}, {row_tiles}, 2>"


def _compiled_knobs() -> list[dict]:
    out = []
    for knobs in VARIANTS.values():
        compiled = {"x": knobs["x"], "stages": knobs["stages"]}
        if compiled not in out:
            out.append(compiled)
    return out


INSTANCES = tuple(instance(k, b, mt, rt) for k in _compiled_knobs() for b in (True, False) for mt in (1, 2)
                  for rt in (1, 2))


def config_for(name: str, m: int, n: int, k: int) -> CudaMmaConfig:
    """Variant ``name``'s launch: the library's ``cuda_mma_config`` for the case, in one slice where it says so."""
    cfg = cuda_mma_config(m, n, k)
    return cfg if VARIANTS[name]["split"] else CudaMmaConfig(row_tiles=cfg.row_tiles, stages=2, warps=cfg.warps,
                                                             slices=1)


_KERNELS: dict = {}


def _kernel(name: str, device_index: int):
    key = (name, device_index)
    if key not in _KERNELS:
        module = cuda.load(SOURCE, name_expressions=INSTANCES, device=device_index)
        _KERNELS[key] = module.kernel(name, CUDA_MMA_SIGNATURE)
    return _KERNELS[key]


def run_variant(name: str, x: torch.Tensor, w: PackedTernary, scale: Any = 1.0, *,
                out: Optional[torch.Tensor] = None, config: Optional[CudaMmaConfig] = None) -> torch.Tensor:
    """``x @ W.T / scale`` by variant ``name``, launched as the library's step 10 launches its kernel (the same grid,
    slices and workspace; no shared memory where x stays in global memory)."""
    if name not in VARIANTS:
        raise ValueError(f"name must be one of {list(VARIANTS)}, got {name!r}")
    knobs = VARIANTS[name]
    x2, vector, w, s, s_stride, z = cuda_call_args(x, w, scale, out, config, CudaMmaConfig, f"variant {name}")
    m, k = x2.shape
    cfg = config or config_for(name, m, w.n, k)
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    col_tiles = 1 if m <= 8 else 2
    per_slice = min(triton.cdiv(groups, cfg.slices), cuda_mma_max_groups_per_slice(min(m, 8 * col_tiles)))
    slices = triton.cdiv(groups, per_slice)
    grid = (triton.cdiv(w.n, cfg.rows), slices, triton.cdiv(m, 8 * col_tiles))
    sums, counts = CUDA_WORKSPACE.get(x2.device, slices * m, w.n) if slices > 1 else (None, None)
    kernel = _kernel(instance(knobs, x2.dtype == torch.bfloat16, col_tiles, cfg.row_tiles), x2.device.index or 0)
    smem = cuda_mma_smem_bytes(min(m, 8 * col_tiles), per_slice) if knobs["x"] == "shared" else 0
    kernel(grid, (32 * cfg.warps,), x2, w.data, z, s, sums, counts, m, w.n, k, groups, x2.stride(0), s_stride,
           per_slice, shared_mem=smem)
    return z[0] if vector else z


def compile_check() -> int:
    """Every instance compiles (sm_90) without spills; those at step 10's knobs give the library's SASS."""
    failures = 0
    start = time.perf_counter()
    ours = cuda.compile_source(SOURCE, arch="sm_90", name_expressions=INSTANCES)
    print(f"{len(INSTANCES)} instances compiled in {time.perf_counter() - start:.0f} s")
    report = ours.ptxas_report()
    for expr in INSTANCES:
        r = report.get(ours.lowered_names[expr], {})
        if r.get("spill_stores", 1) or r.get("spill_loads", 1) or r.get("stack_bytes", 1):
            failures += 1
            print(f"  FAIL {expr}: spills or a stack frame {r}")
        else:
            print(f"  {expr}: {r['registers']} registers, no spills")
    shapes = [(b, mt, rt) for b in (True, False) for mt in (1, 2) for rt in (1, 2)]
    lib_exprs = [_library_instance(*s) for s in shapes]
    lib = cuda.compile_source("ternary_mma", arch="sm_90", name_expressions=lib_exprs)
    tool = cuobjdump()
    if tool is None:
        print("no cuobjdump: SASS not compared")
        return failures
    ours_sass, lib_sass = sass_functions(ours.cubin, tool), sass_functions(lib.cubin, tool)
    same = 0
    for shape, lib_expr in zip(shapes, lib_exprs):
        if ours_sass[ours.lowered_names[instance(STEP10, *shape)]] == lib_sass[lib.lowered_names[lib_expr]]:
            same += 1
        else:
            failures += 1
            print(f"  FAIL {instance(STEP10, *shape)}: SASS differs from {lib_expr}")
    print(f"step 10's knobs: SASS the same as the library's step 10 at {same}/{len(lib_exprs)} instances")
    return failures


#: (N, K, M, x dtype): N, K not multiples of 16 or 256 (K not of 8), both tiles of x (M > 8), fp16.
CHECK_CASES = ((37, 300, 1, torch.bfloat16), (19, 2100, 3, torch.bfloat16), (67, 777, 2, torch.float16),
               (45, 5000, 12, torch.bfloat16), (4240, 9000, 1, torch.bfloat16))


def check() -> int:
    failures = compile_check()
    if runtime.mode() != "gpu":
        print("no GPU: only compiled (run `check` on a GPU for the float64 and bit-equality checks)")
        return failures
    dev = runtime.device()
    for n, k, m, dtype in CHECK_CASES:
        gen = torch.Generator().manual_seed(n * 31 + k * 7 + m)
        w = random_ternary(n, k, gen).to(dev)
        x = torch.randn(m, k, generator=gen).to(dev, dtype)
        scale = 0.75 + float(torch.rand(1, generator=gen))
        packed = PackedTernary.pack(w, "2bit_tiles")
        for name in VARIANTS:
            configs = [config_for(name, m, n, k), CudaMmaConfig(row_tiles=1, warps=4, slices=3),
                       CudaMmaConfig(row_tiles=2, warps=8, slices=1)]
            for cfg in configs:
                z = run_variant(name, x, packed, scale, out=torch.full((m, n), float("nan"), device=dev), config=cfg)
                ref = step10_cuda_mma(x, packed, scale, config=cfg)
                torch.cuda.synchronize()
                ratio, exact = error_ratio(z, x, w, scale), bool(torch.equal(z, ref))
                if ratio > FP32_TOLERANCE or not exact:
                    failures += 1
                    print(f"  FAIL {name} {n}x{k} M={m} {cfg}: error {ratio:.2e}, bit-equal to step 10: {exact}")
            print(f"{n}x{k} M={m} {str(dtype)[6:]}: {name} checked at {len(configs)} configs", flush=True)
    print(f"{failures} failures")
    return failures


def measure() -> Path:
    """The variants and the library's steps 9 and 10 at :data:`CASES`, on the GPU clock."""
    from studylog.bench import BenchRun, gpu_slug, write_lab_output

    run = BenchRun("ternary", command=" ".join(sys.argv))
    run.note("Series: step09/step10 are the library's steps as the benchmark calls them (their default launch); "
             "step10_changes are the variants of lab/ternary/variants/step10_changes.cu (params: variant, change, "
             "x, stages, split and the launch taken: row_tiles, warps, slices).")
    run.note("Clock: GPU time (CUDA-graph replay, weights rotated among copies past L2, x in L2; median of 3 "
             "repetitions with fresh x and copies). floor_ms: the 2-bit byte floor, (weights + x + z) bytes at this "
             "run's copy bandwidth. Weights: quantize_absmean(randn(N, K)), one scale; x: randn(M, K) in bf16.")
    dev = runtime.device()
    for family, n, k, ms in CASES:
        if (family, n, k) not in BENCH_SHAPES:
            raise ValueError(f"CASES holds {family} {n}x{k}, not a shape of the benchmark (report.BENCH_SHAPES)")
        torch.manual_seed(n * 31 + k)
        w_t, scale_t = quantize_absmean(torch.randn(n, k, device=dev))
        scale, w64 = float(scale_t), w_t.double()
        packed = {"2bit_tiles": PackedTernary.pack(w_t, "2bit_tiles"), "2bit_mma": PackedTernary.pack(w_t, "2bit_mma")}
        for m in ms:
            params = {"shape": f"{n}x{k}", "family": family, "n": n, "k": k, "m": m}
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            x64 = x.double()
            ref, magnitude = (x64 @ w64.T) / scale, (x64.abs() @ w64.abs().T) / abs(scale)
            rows = [(SERIES[9], None), (SERIES[10], None)] + [("step10_changes", name) for name in VARIANTS]
            for series, name in rows:
                print(f"{n}x{k} M={m}: {series} {name or 'library'}", flush=True)
                weights = packed["2bit_mma" if series == SERIES[9] else "2bit_tiles"]
                if name is None:
                    fn_of = step09_mma if series == SERIES[9] else step10_cuda_mma
                    make = lambda x_, w_, f=fn_of: (lambda: f(x_, w_, scale))  # noqa: E731
                    row_params = {**params, "variant": series}
                    cfg = cuda_mma_config(m, n, k) if series == SERIES[10] else None
                else:
                    cfg = config_for(name, m, n, k)
                    make = lambda x_, w_, v=name, c=cfg: (lambda: run_variant(v, x_, w_, scale, config=c))  # noqa: E731
                    row_params = {**params, "variant": name, "change": CHANGES[name], **VARIANTS[name]}
                if cfg is not None:
                    row_params.update(row_tiles=cfg.row_tiles, warps=cfg.warps, slices=cfg.slices)
                nbytes = weights.nbytes + m * k * 2 + m * n * 4
                fn = make(x, weights)
                z = fn()
                torch.cuda.synchronize()
                ratio = error_ratio_from(z.float(), ref, magnitude)
                label = f"{series} {name or 'library'}"
                run.check(f"{label} equals float64 reference", ratio <= FP32_TOLERANCE, params=row_params,
                          error_ratio=ratio, tolerance=FP32_TOLERANCE)
                if name is not None:
                    run.check(f"{label} bit-equal to the library's step 10 at its slices",
                              bool(torch.equal(z, step10_cuda_mma(x, weights, scale, config=cfg))), params=row_params)
                plan = timing_plan(call_ms(fn))

                def make_calls(make=make, weights=weights):
                    fresh = torch.randn_like(x)
                    return [make(fresh, copy) for copy in run.rotated(weights)]

                run.measure(series, make_calls, params=row_params, floor_ms=run.floor_ms(nbytes),
                            min_calls=plan["min_calls"], reps=plan["reps"], graph_calls=plan["min_calls"],
                            weight_bytes=weights.nbytes, bytes=nbytes, config=str(cfg))
            del x
            torch.cuda.empty_cache()
    data = run.to_json()
    out = paths.lab_results("ternary", gpu_slug(run.device["name"])) / f"{NAME}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    if os.environ.get("OUT"):
        write_lab_output(Path(os.environ["OUT"]), run.device["name"], NAME, data)
    bad = [c for c in run.checks if not c["passed"]]
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out}")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("check", "measure"))
    parser.add_argument("--compile-only", action="store_true",
                        help="check: compile (NVRTC), spills and SASS only (what a machine without a GPU can do)")
    args = parser.parse_args()
    if args.what == "check":
        sys.exit(1 if (compile_check() if args.compile_only else check()) else 0)
    if args.compile_only:
        parser.error("--compile-only goes with check")
    measure()
