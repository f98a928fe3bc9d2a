"""Chapter 5 part 2's step 13 with the one change it bundles beside its idea undone: x loaded by the TMA.

Step 13 (``step13_w2a8_tiles``, ``studylog/ternary/csrc/ternary_w2a8.cu``) turns step 12's block around (its warps
own tiles of 16 weight rows over a slice of K instead of sharing the block's K), and with it brings the block's
int8 x into shared memory by the copy engine: one bulk copy a row, issued by a second producer thread once
``quantize_x`` is done. The rest of the diff follows from the idea and is not a change of its own (a ring stage
holds a chunk of each warp's tile; each warp stores its own sums, so no sums across warps; the slices of K meet in
step 12's split-K ending). The copy of x is put back here in a frozen copy of step 13's kernel
(``variants/step13_changes.cu``, which includes the library's ``ternary_w2a8.cu``), as a compile-time knob:

* ``step13``: the frozen kernel at step 13's setting; it compiles to the library's SASS (``check`` compares them,
  names aside) and its output is bit-equal to the library's step 13;
* ``step13-x``: x loaded as step 12 loads it above 8 rows (``QUANT_SEPARATE``): the consumer warps bring the
  block's slice of x from L2 themselves (``load_xq_slice``: plain loads, 4 in flight a thread), then meet at a
  barrier before the first MMA. Same bytes in the same places, so bit-equal to step 13.

Both take the library's launch for the case (``w2a8_tiles_config``: warps, tiles a warp, stages, chunk, slices),
``quantize_x`` first (``w2a8_quantize``) and the matmul launched early (programmatic dependent launch), as the
library's step 13 does.

    PYTHONPATH=$PWD python lab/ternary/step13_changes.py check --compile-only   # CPU: NVRTC, spills, SASS
    PYTHONPATH=$PWD python lab/ternary/step13_changes.py check                  # GPU: float64 and bit-equality
    PYTHONPATH=$PWD python lab/ternary/step13_changes.py measure                # GPU: results/<gpu>/step13_changes.json

``check`` on the GPU runs both variants at awkward shapes (N, K not multiples of 16 or 256; M = 1, 3, 12, 16 and
20, so one and two tiles of x and more than one block of rows; bf16 and fp16) at several configs against the
float64 W2A8 reference (x quantised as ``quantize_activations`` does) and bit-equal to the library's step 13.

``measure`` times the two variants and the library's steps 12 and 13 (the anchors, their default launches as the
benchmark calls them; step 9 too at M = 16) at 4096 x 14336 and 2560 x 6912, M = 1 and 16, on the chapter's GPU clock
(``BenchRun.measure``: CUDA-graph replay, the weights rotated among copies past L2, three repetitions with fresh x
and copies), with the benchmark's weights (``quantize_absmean(randn(N, K))``, one scale), bf16 x and its timing
plan (``report.timing_plan``); ``floor_ms`` is the 2-bit byte floor. Each row is checked before it is timed: the
W2A8 rows against the float64 W2A8 reference, step 9 against the float64 product of bf16 x, and the variants
bit-equal to the library's step 13; a failed check is recorded and the row still written.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch
import triton

from lab.ternary.step11_changes import cuobjdump, sass_functions
from studylog import cuda, paths, runtime
from studylog import ternary as T
from studylog.bench import write_lab_output
from studylog.ternary import FP32_TOLERANCE, PackedTernary, quantize_absmean, quantize_activations
from studylog.ternary.cuda_steps import CUDA_WORKSPACE, SMEM_LIMIT, cuda_call_args, require_hopper
from studylog.ternary.formats import GROUP_WEIGHTS_2BIT, as_scale64, error_ratio_from
from studylog.ternary.report import BENCH_SHAPES, call_ms, timing_plan
from studylog.ternary.steps import SERIES
from studylog.ternary.w2a8 import (W2A8_TILES_SHAPES, W2A8_TILES_SIGNATURE, W2A8TilesConfig, check_w2a8_k,
                                   w2a8_smem_bytes, w2a8_tiles_config)

SOURCE = Path(__file__).resolve().parent / "variants" / "step13_changes.cu"
NAME = "step13_changes"
#: The chapter's headline shape and a smaller one of the benchmark, at one row of x and at the 16 step 13 is for.
CASES = (("llama", 4096, 14336, (1, 16)), ("bitnet", 2560, 6912, (1, 16)))

#: Each variant's knob: x brought by the copy engine (step 13) or loaded by the consumer warps (step 12).
VARIANTS = {"step13": {"x": "tma"}, "step13-x": {"x": "loads"}}
CHANGES = {"step13": "none (step 13)", "step13-x": "x loaded by the consumer warps, as step 12 loads it"}


def instance(knobs: dict, col_tiles: int, warps: int, tiles: int, stages: int, chunk: int) -> str:
    return (f"step13_changes_kernel<{col_tiles}, {warps}, {tiles}, {stages}, {chunk}, "
            f"{'true' if knobs['x'] == 'tma' else 'false'}>")


def _library_instance(col_tiles: int, warps: int, tiles: int, stages: int, chunk: int) -> str:
    return f"step13_w2a8_tiles_kernel<{col_tiles}, {warps}, {tiles}, {stages}, {chunk}>"


#: The library's compiled step-13 instances (8 or 16 rows of x a block, 4 or 8 warps, each ring shape).
LAUNCHES = tuple((mt, warps, *shape) for mt in (1, 2) for warps in (4, 8) for shape in W2A8_TILES_SHAPES)
INSTANCES = tuple(instance(knobs, *launch) for knobs in VARIANTS.values() for launch in LAUNCHES)


def run_variant(name: str, x: torch.Tensor, w: PackedTernary, scale: Any = 1.0, *,
                out: Optional[torch.Tensor] = None, config: Optional[W2A8TilesConfig] = None) -> torch.Tensor:
    """Step 13's W2A8 product by variant ``name`` at ``config`` (default: the library's ``w2a8_tiles_config``),
    launched as the library's step 13 launches its kernel (quantize_x, then the matmul early; the same grid,
    shared memory and workspace)."""
    if name not in VARIANTS:
        raise ValueError(f"name must be one of {list(VARIANTS)}, got {name!r}")
    x2, vector, w, s, s_stride, z = cuda_call_args(x, w, scale, out, config, W2A8TilesConfig, f"variant {name}")
    m, k = x2.shape
    check_w2a8_k(k, 13)
    require_hopper(x2.device, 13)
    cfg = config or w2a8_tiles_config(m, w.n, k, runtime.sm_count())
    per_slice, grid = T.w2a8_grid(m, w.n, k, cfg)
    groups, col_tiles = triton.cdiv(k, GROUP_WEIGHTS_2BIT), 1 if m <= 8 else 2
    smem = w2a8_smem_bytes(cfg, min(m, 8 * col_tiles), per_slice)
    kernel = _kernel(instance(VARIANTS[name], col_tiles, cfg.warps, cfg.tiles, cfg.stages, cfg.chunk),
                     x2.device.index or 0)
    sums, counts = CUDA_WORKSPACE.get(x2.device, grid[1] * m, w.n) if grid[1] > 1 else (None, None)
    partials = sums.view(torch.int32) if sums is not None else None
    xq, x_scale, row_sum = T.w2a8_quantize(x2)
    kernel(grid, (32 * (cfg.warps + 1),), xq, w.data, z, s, x_scale, row_sum, partials, counts, m, w.n, groups,
           s_stride, per_slice, shared_mem=smem, early=True)
    return z[0] if vector else z


_KERNELS: dict = {}


def _kernel(name: str, device_index: int):
    # Looked up once: compiling and finding a kernel costs far more than a launch of a 15-microsecond kernel.
    key = (name, device_index)
    if key not in _KERNELS:
        module = cuda.load(SOURCE, name_expressions=INSTANCES, device=device_index)
        kernel = module.kernel(name, W2A8_TILES_SIGNATURE)
        kernel.set_max_dynamic_shared_memory(SMEM_LIMIT)
        _KERNELS[key] = kernel
    return _KERNELS[key]


# ----------------------------------------------------------------------------------------------
# check --compile-only (CPU): NVRTC, spills, the library's SASS
# ----------------------------------------------------------------------------------------------

def compile_check() -> int:
    """Every instance compiles (sm_90) without spills; those at step 13's knob give the library's SASS. Returns the
    number of failures."""
    failures = 0
    start = time.perf_counter()
    ours = cuda.compile_source(SOURCE, arch="sm_90", name_expressions=INSTANCES)
    print(f"{len(INSTANCES)} instances compiled in {time.perf_counter() - start:.0f} s", flush=True)
    report = ours.ptxas_report()
    for expr in INSTANCES:
        r = report.get(ours.lowered_names[expr], {})
        if r.get("spill_stores", 1) or r.get("spill_loads", 1) or r.get("stack_bytes", 1):
            failures += 1
            print(f"  FAIL {expr}: spills or a stack frame {r}")
    print(f"registers: {sorted({report[ours.lowered_names[e]]['registers'] for e in INSTANCES})}; spills: "
          f"{'none' if not failures else failures}")
    lib_exprs = [_library_instance(*launch) for launch in LAUNCHES]
    lib = cuda.compile_source("ternary_w2a8", arch="sm_90", name_expressions=lib_exprs)
    tool = cuobjdump()
    if tool is None:
        print("no cuobjdump: SASS not compared")
        return failures
    ours_sass, lib_sass = sass_functions(ours.cubin, tool), sass_functions(lib.cubin, tool)
    same = 0
    for launch, lib_expr in zip(LAUNCHES, lib_exprs):
        mine = ours_sass[ours.lowered_names[instance(VARIANTS["step13"], *launch)]]
        theirs = lib_sass[lib.lowered_names[lib_expr]]
        if mine == theirs:
            same += 1
        else:
            failures += 1
            diff = next(i for i, (a, b) in enumerate(zip(mine + [""], theirs + [""])) if a != b)
            print(f"  FAIL {instance(VARIANTS['step13'], *launch)}: SASS differs from {lib_expr} at instruction "
                  f"{diff} ({len(mine)} against {len(theirs)} instructions)")
    print(f"step 13's knob: SASS the same as the library's step 13 at {same}/{len(lib_exprs)} instances")
    for knobs in VARIANTS.values():
        expr = instance(knobs, 2, 4, *W2A8_TILES_SHAPES[0])  # step 13's default launch at 16 rows of x
        lines = ours_sass[ours.lowered_names[expr]]
        print(f"  {expr}: {len(lines)} instructions, {sum('UBLKCP' in s for s in lines)} bulk copies (UBLKCP), "
              f"{sum(bool(re.match(r'LDG', s)) for s in lines)} global loads (LDG)")
    return failures


# ----------------------------------------------------------------------------------------------
# check (GPU)
# ----------------------------------------------------------------------------------------------

def w2a8_reference(x: torch.Tensor, w: torch.Tensor, scale: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 W2A8 product, its magnitude sum): x quantised as ``quantize_activations`` does, exact sums."""
    xq, x_scale = quantize_activations(x.float())
    xq64, s64, w64 = xq.double(), as_scale64(scale, x.device), w.double()
    denominator = x_scale.double()[:, None] * s64
    return (xq64 @ w64.T) / denominator, (xq64.abs() @ w64.abs().T) / denominator.abs()


def _ternary(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    u = torch.rand(n, k, generator=gen)
    sign = torch.where(torch.rand(n, k, generator=gen) < 0.5, -1, 1)
    return torch.where(u < 1 / 3, 0, sign).to(torch.int8)


#: (N, K, M, x dtype): N, K not multiples of 16 or 256 (K not of 8: x padded), one and two tiles of x, more rows
#: than a block takes (M = 20: grid.z = 2), fp16; the last at a long K.
CHECK_CASES = ((37, 300, 1, torch.bfloat16), (67, 777, 3, torch.float16), (45, 5000, 12, torch.bfloat16),
               (130, 2100, 16, torch.bfloat16), (300, 1001, 20, torch.float16), (4240, 9000, 16, torch.bfloat16))
#: Configs checked at every case besides the library's: each compiled ring shape, 4 and 8 warps, K in 1 and 3 slices.
CHECK_CONFIGS = tuple(W2A8TilesConfig(warps, tiles, stages, chunk, slices) for tiles, stages, chunk in W2A8_TILES_SHAPES
                      for warps, slices in ((4, 1), (8, 3)))


def check() -> int:
    """Both variants at every case and config against float64 and bit-equal to the library's step 13 at the same
    config. Prints a line per case and variant; returns the number of failures."""
    failures = compile_check()
    if runtime.mode() != "gpu":
        print("no GPU: only compiled (run `check` on a Hopper GPU for the float64 and bit-equality checks)")
        return failures
    dev = runtime.device()
    for n, k, m, dtype in CHECK_CASES:
        gen = torch.Generator().manual_seed(n * 31 + k * 7 + m)
        w = _ternary(n, k, gen).to(dev)
        x = (3 * torch.randn(m, k, generator=gen)).to(dev, dtype)
        scale = 0.75 + float(torch.rand(1, generator=gen))
        packed = PackedTernary.pack(w, "2bit_tiles")
        ref, magnitude = w2a8_reference(x, w, scale)
        configs = [w2a8_tiles_config(m, n, k, runtime.sm_count())] + list(CHECK_CONFIGS)
        for name in VARIANTS:
            worst, same = 0.0, 0
            for cfg in configs:
                z = run_variant(name, x, packed, scale, out=torch.full((m, n), float("nan"), device=dev), config=cfg)
                lib = T.step13_w2a8_tiles(x, packed, scale, config=cfg)
                torch.cuda.synchronize()
                ratio = error_ratio_from(z, ref, magnitude)
                worst = max(worst, ratio)
                exact = bool(torch.equal(z, lib))
                same += exact
                if not ratio <= FP32_TOLERANCE or not exact:
                    failures += 1
                    print(f"  FAIL {name} {n}x{k} M={m} {cfg}: error {ratio:.2e}, bit-equal to step 13: {exact}")
            print(f"{n}x{k} M={m} {str(dtype)[6:]}: {name:9s} {len(configs)} configs, max error {worst:.1e}, "
                  f"bit-equal to step 13 at {same}/{len(configs)}", flush=True)
    print(f"{failures} failures")
    return failures


# ----------------------------------------------------------------------------------------------
# measure (GPU)
# ----------------------------------------------------------------------------------------------

def measure() -> Path:
    """The variants and the library's steps 12 and 13 (and 9 at M = 16) at :data:`CASES`, on the GPU clock."""
    from studylog.bench import BenchRun

    run = BenchRun("ternary", command=" ".join(sys.argv))
    run.note("Series: step09/step12/step13 are the library's steps as the benchmark calls them (their default "
             "launch); step13_changes are the variants of lab/ternary/variants/step13_changes.cu (params: variant, "
             "change, x and the launch taken: warps, tiles, stages, chunk, slices).")
    run.note("Clock: GPU time (CUDA-graph replay, weights rotated among copies past L2, x in L2; median of 3 "
             "repetitions with fresh x and copies). floor_ms: the 2-bit byte floor, (weights + x + z) bytes at this "
             "run's copy bandwidth (the benchmark's floor_mem_ms). Weights: quantize_absmean(randn(N, K)), one "
             "scale; x: randn(M, K) in bf16. Steps 12 and 13 and the variants compute the W2A8 product (x rounded "
             "to int8) and are checked against its float64 reference; step 9 against x @ W.T in float64.")
    dev = runtime.device()
    for family, n, k, ms in CASES:
        if (family, n, k) not in BENCH_SHAPES:
            raise ValueError(f"CASES holds {family} {n}x{k}, not a shape of the benchmark (report.BENCH_SHAPES)")
        torch.manual_seed(n * 31 + k)
        w_t, scale_t = quantize_absmean(torch.randn(n, k, device=dev))
        scale, w64 = float(scale_t), w_t.double()
        mma_packed = PackedTernary.pack(w_t, "2bit_mma")
        packed = PackedTernary.pack(w_t, "2bit_tiles")
        for m in ms:
            params = {"shape": f"{n}x{k}", "family": family, "n": n, "k": k, "m": m}
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            x64 = x.double()
            float_ref, float_mag = (x64 @ w64.T) / scale, (x64.abs() @ w64.abs().T) / abs(scale)
            w2a8_ref, w2a8_mag = w2a8_reference(x, w_t, scale)
            nbytes = packed.nbytes + m * k * 2 + m * n * 4
            floor = run.floor_ms(nbytes)
            library = {SERIES[9]: (T.step09_mma, mma_packed), SERIES[12]: (T.step12_w2a8, packed),
                       SERIES[13]: (T.step13_w2a8_tiles, packed)}
            if m == 1:  # step 9 is the page's comparison at 16 rows only (and its autotuner costs a run minutes)
                del library[SERIES[9]]
            rows = [(series, None) for series in library] + [("step13_changes", name) for name in VARIANTS]
            for series, name in rows:
                print(f"{n}x{k} M={m}: {series} {name or 'library'}", flush=True)
                if name is None:
                    fn_of, weights = library[series]
                    make = lambda x_, w_, f=fn_of: (lambda: f(x_, w_, scale))  # noqa: E731
                    row_params, cfg = {**params, "variant": series}, None
                    if series == SERIES[13]:
                        cfg = w2a8_tiles_config(m, n, k, runtime.sm_count())
                else:
                    weights, cfg = packed, w2a8_tiles_config(m, n, k, runtime.sm_count())
                    make = lambda x_, w_, v=name, c=cfg: (lambda: run_variant(v, x_, w_, scale, config=c))  # noqa: E731
                    row_params = {**params, "variant": name, "change": CHANGES[name], **VARIANTS[name]}
                if cfg is not None:
                    row_params.update({f: getattr(cfg, f) for f in ("warps", "tiles", "stages", "chunk", "slices")})
                fn = make(x, weights)
                z = fn()
                torch.cuda.synchronize()
                w2a8 = series != SERIES[9]
                ratio = error_ratio_from(z.float(), *((w2a8_ref, w2a8_mag) if w2a8 else (float_ref, float_mag)))
                label = f"{series} {name or 'library'}"
                run.check(f"{label} equals float64 {'W2A8 ' if w2a8 else ''}reference", ratio <= FP32_TOLERANCE,
                          params=row_params, error_ratio=ratio, tolerance=FP32_TOLERANCE)
                if name is not None:
                    same = T.step13_w2a8_tiles(x, packed, scale, config=cfg)
                    run.check(f"{label} bit-equal to the library's step 13 at its config",
                              bool(torch.equal(z, same)), params=row_params)
                plan = timing_plan(call_ms(fn))

                def make_calls(make=make, weights=weights):
                    fresh = torch.randn_like(x)
                    return [make(fresh, copy) for copy in run.rotated(weights)]

                run.measure(series, make_calls, params=row_params, floor_ms=floor, min_calls=plan["min_calls"],
                            reps=plan["reps"], graph_calls=plan["min_calls"], weight_bytes=packed.nbytes,
                            bytes=nbytes, config=str(cfg))
            del x
            torch.cuda.empty_cache()
    out = write_lab_output(paths.LAB / "ternary" / "results", run.device["name"], NAME, run.to_json())
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
