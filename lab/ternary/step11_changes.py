"""Chapter 5 part 2's step 11 split into the three changes it bundles with the ring, one measured number each.

Step 11 (``step11_tma``, ``studylog/ternary/csrc/ternary_bulk.cu``) brings the weights by the TMA into a ring and
bundles three smaller changes, measured together on the page. Each is put back here, one at a time, in a frozen
copy of step 11's kernel (``variants/step11_changes.cu``, which includes the library's headers):

* ``step11``: the frozen kernel with every knob at step 11's setting; it compiles to the library's SASS (``check``
  compares them, names aside) and its output is bit-equal to the library's step 11;
* ``step11-c``: the decode's magic constant in step 10's form (``MAGIC_REG`` = false: ORed into each word and into
  each LOP3's mask, which ptxas rebuilds by an ``IMAD.MOV`` before every LOP3: ``check --compile-only`` counts
  these "magic moves" as ``book.ternary.lesson.sass_counts`` does);
* ``step11-a``: many, small copies (``WARP_COPIES`` = true): one copy a stage, tile and consumer warp (1 KiB at
  step 11's chunk of one group) instead of one a stage and tile, into the same places of the stage. It keeps the
  block's tiles and the warps' shared K (step 10's ownership, a warp with its own rows, would also remove (b)'s
  ending and change the sums' order: not a knob of this kernel);
* ``step11-b``: K split across blocks again, into step 10's number of slices (``cuda_mma_config(...).slices``),
  with step 10's split-K ending (partial sums through L2, a fence, a counter; the library kernel's own
  ``finish_split`` path, taken when grid.y > 1). This is a launch knob, and not the ending alone: the split also
  makes more, shorter blocks (each still adds its warps' sums in shared memory first);
* ``step11-a-c``: (a) and (c) put back, K in one slice (step 11's): the link between the ring alone and step 11
  in the chain below;
* ``step11-a-b-c``: all three put back: the ring alone, every other choice step 10's.

``measure --chain`` times step 11 one change at a time, cumulative, between its two anchors: the library's step 10,
then the ring alone (``step11-a-b-c``), K in one slice (``step11-a-c``), one copy a stage and tile
(``step11-c``), the magic constant in a register (``step11``, the frozen kernel), and the library's step 11; each
row adds one change to the row above (:data:`CHAIN`). It writes ``results/<gpu>/step11_chain.json``.

Every variant takes the library's launch for the case (``tma_config``: row tiles, warps, stages, chunk) and keeps
step 11's arithmetic order, so each is bit-equal to the library's step 11 at the same config (``step11-b`` to the
library's step 11 at the same ``slices``).

    PYTHONPATH=$PWD python lab/ternary/step11_changes.py check --compile-only   # CPU: NVRTC, spills, SASS
    PYTHONPATH=$PWD python lab/ternary/step11_changes.py check                  # GPU: float64 and bit-equality
    PYTHONPATH=$PWD python lab/ternary/step11_changes.py measure                # GPU: results/<gpu>/step11_changes.json
    PYTHONPATH=$PWD python lab/ternary/step11_changes.py measure --chain        # GPU: results/<gpu>/step11_chain.json

``check`` on the GPU runs every variant at awkward shapes (N, K not multiples of 16 or 256; M = 1, 3 and 12, so
both tiles of x; bf16 and fp16) at several step-11 configs against the chapter's float64 reference and against
the library's step 11 (bit-equal); it also compiles and checks first (``--compile-only``'s part).

``measure`` times each variant and the library's steps 10 and 11 (the anchors, as the benchmark calls them) at
4096 x 14336 and 2560 x 6912, M = 1, on the chapter's GPU clock (``BenchRun.measure``: CUDA-graph replay, the
weights rotated among copies past L2, three repetitions with fresh x and copies), with the benchmark's weights
(``quantize_absmean(randn(N, K))``, one scale), bf16 x and its timing plan (``report.timing_plan``); ``floor_ms``
is the 2-bit byte floor (weights + x + z bytes at this run's copy bandwidth). Each row's output is checked
against float64 (and the variants against the library's step 11) before it is timed; a failed check is recorded
and the row still written.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import triton

from studylog import cuda, paths, runtime
from studylog.ternary import FP32_TOLERANCE, PackedTernary, error_ratio, quantize_absmean
from studylog.ternary import step10_cuda_mma, step11_tma
from studylog.ternary.cuda_steps import (CUDA_MMA_SIGNATURE, CUDA_WORKSPACE, SMEM_LIMIT, TmaConfig, cuda_call_args,
                                         cuda_mma_config, padded_to_8, require_hopper, tma_config,
                                         tma_max_groups_per_slice, tma_smem_bytes)
from studylog.ternary.formats import GROUP_WEIGHTS_2BIT, error_ratio_from
from studylog.ternary.report import BENCH_SHAPES, call_ms, timing_plan
from studylog.ternary.steps import SERIES

SOURCE = Path(__file__).resolve().parent / "variants" / "step11_changes.cu"
NAME = "step11_changes"
#: The chapter's headline shape and a smaller one of the benchmark, both at M = 1.
CASES = (("llama", 4096, 14336, (1,)), ("bitnet", 2560, 6912, (1,)))

#: Each variant's knobs: the decode's magic in a register (step 11) or rebuilt before each LOP3 (step 10), one
#: copy a stage and tile (step 11) or a stage, tile and warp, and K in one slice (step 11) or step 10's slices.
STEP11 = {"magic": "register", "copies": "tile", "split": False}
VARIANTS = {
    "step11": STEP11,
    "step11-c": STEP11 | {"magic": "rebuilt"},
    "step11-a": STEP11 | {"copies": "warp"},
    "step11-b": STEP11 | {"split": True},
    "step11-a-c": {"magic": "rebuilt", "copies": "warp", "split": False},
    "step11-a-b-c": {"magic": "rebuilt", "copies": "warp", "split": True},
}
CHANGES = {"step11": "none (step 11)", "step11-c": "(c) decode constant back in step 10's form",
           "step11-a": "(a) one copy a warp and tile instead of one a tile",
           "step11-b": "(b) K split across blocks, step 10's split-K ending",
           "step11-a-c": "(a), (c) back, K in one slice", "step11-a-b-c": "(a), (b), (c) all back"}

#: Step 11 one change at a time, cumulative (``measure --chain``): each variant adds to the one before it the
#: change named here; the library's step 10 comes first and its step 11 last (the anchors).
CHAIN = (("step11-a-b-c", "the TMA ring, K split and copies a warp as in step 10"),
         ("step11-a-c", "(b) K in one slice: the block's warps share K"),
         ("step11-c", "(a) one copy a stage and tile"),
         ("step11", "(c) the magic constant in a register"))

#: (row_tiles, stages, chunk) compiled here: the two the default plan takes (tma_config). (A chunk of two groups,
#: (1, 4, 2), spills with copies a warp and the rebuilt magic: not compiled.)
SHAPES = ((1, 4, 1), (2, 4, 1))


def instance(knobs: dict, bf16: bool, col_tiles: int, row_tiles: int, stages: int, chunk: int) -> str:
    flag = lambda b: "true" if b else "false"  # noqa: E731
    return (f"step11_changes_kernel<{flag(bf16)}, {col_tiles}, {row_tiles}, {stages}, {chunk}, "
            f"{flag(knobs['magic'] == 'register')}, {flag(knobs['copies'] == 'warp')}>")


def _library_instance(bf16: bool, col_tiles: int, row_tiles: int, stages: int, chunk: int) -> str:
    return f"step11_tma_kernel<{'true' if bf16 else 'false'}, {col_tiles}, {row_tiles}, {stages}, {chunk}>"


def _distinct_knobs() -> list[dict]:
    """The compiled knob settings (the split is a launch knob: no instance of its own)."""
    out = []
    for knobs in VARIANTS.values():
        compiled = {"magic": knobs["magic"], "copies": knobs["copies"], "split": False}
        if compiled not in out:
            out.append(compiled)
    return out


def changed_knobs(a: str, b: str) -> list[str]:
    """The knobs in which variants ``a`` and ``b`` differ."""
    return [knob for knob in STEP11 if VARIANTS[a][knob] != VARIANTS[b][knob]]


# The chain is cumulative: one knob a link, ending at step 11's knobs, starting from every knob undone.
assert CHAIN[-1][0] == "step11" and all(VARIANTS[CHAIN[0][0]][k] != STEP11[k] for k in STEP11)
assert all(len(changed_knobs(a, b)) == 1 for (a, _), (b, _) in zip(CHAIN, CHAIN[1:]))

INSTANCES = tuple(instance(k, b, mt, *s) for k in _distinct_knobs() for b in (True, False) for mt in (1, 2)
                  for s in SHAPES)


def slices_for(knobs: dict, m: int, n: int, k: int, cfg: TmaConfig) -> int:
    """The K slices a variant asks for: the config's (step 11's plan: 1), or step 10's for this case."""
    return cuda_mma_config(m, n, k).slices if knobs["split"] else cfg.slices


def config_for(name: str, m: int, n: int, k: int, base: Optional[TmaConfig] = None) -> TmaConfig:
    """Variant ``name``'s launch: ``base`` (default: the library's ``tma_config``) with its slices."""
    if name not in VARIANTS:
        raise ValueError(f"name must be one of {list(VARIANTS)}, got {name!r}")
    cfg = base or tma_config(m, n, k)
    return TmaConfig(row_tiles=cfg.row_tiles, warps=cfg.warps, stages=cfg.stages, chunk=cfg.chunk,
                     slices=slices_for(VARIANTS[name], m, n, k, cfg))


def run_variant(name: str, x: torch.Tensor, w: PackedTernary, scale: Any = 1.0, *,
                out: Optional[torch.Tensor] = None, config: Optional[TmaConfig] = None) -> torch.Tensor:
    """``x @ W.T / scale`` by variant ``name`` at ``config`` (default :func:`config_for`), launched as the library's
    step 11 launches its kernel (the same grid, shared memory and workspace)."""
    if name not in VARIANTS:
        raise ValueError(f"name must be one of {list(VARIANTS)}, got {name!r}")
    knobs = VARIANTS[name]
    x2, vector, w, s, s_stride, z = cuda_call_args(x, w, scale, out, config, TmaConfig, f"variant {name}")
    require_hopper(x2.device, 11)
    x2 = x2 if x2.shape[1] % 8 == 0 else padded_to_8(x2)  # the TMA moves x in 16-byte pieces, as step 11 pads it
    m, k = x2.shape
    cfg = config or config_for(name, m, w.n, k)
    shape = (cfg.row_tiles, cfg.stages, cfg.chunk)
    if shape not in SHAPES:
        raise ValueError(f"config's (row_tiles, stages, chunk) must be one of the compiled {SHAPES}, got {shape}")
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    col_tiles = 1 if m <= 8 else 2
    x_rows = min(m, 8 * col_tiles)
    if cfg.warps > 8 and cfg.row_tiles * col_tiles > 1:
        raise ValueError(f"config {cfg}: more than 8 warps a block only with one tile of W and 8 rows of x or fewer")
    per_slice = min(triton.cdiv(groups, cfg.slices), tma_max_groups_per_slice(cfg, x_rows))
    slices = triton.cdiv(groups, per_slice)
    grid = (triton.cdiv(w.n, cfg.rows), slices, triton.cdiv(m, 8 * col_tiles))
    sums, counts = CUDA_WORKSPACE.get(x2.device, slices * m, w.n) if slices > 1 else (None, None)
    kernel = _kernel(instance(knobs, x2.dtype == torch.bfloat16, col_tiles, *shape), x2.device.index or 0)
    kernel(grid, (32 * (cfg.warps + 1),), x2, w.data, z, s, sums, counts, m, w.n, k, groups, x2.stride(0), s_stride,
           per_slice, shared_mem=tma_smem_bytes(cfg, x_rows, per_slice))
    return z[0] if vector else z


_KERNELS: dict = {}


def _kernel(name: str, device_index: int):
    # Looked up once: compiling and finding a kernel costs far more than a launch of a 5-microsecond kernel.
    key = (name, device_index)
    if key not in _KERNELS:
        module = cuda.load(SOURCE, name_expressions=INSTANCES, device=device_index)
        kernel = module.kernel(name, CUDA_MMA_SIGNATURE)
        kernel.set_max_dynamic_shared_memory(SMEM_LIMIT)
        _KERNELS[key] = kernel
    return _KERNELS[key]


# ----------------------------------------------------------------------------------------------
# check --compile-only (CPU): NVRTC, spills, the library's SASS, the magic moves
# ----------------------------------------------------------------------------------------------

def cuobjdump() -> Optional[str]:
    tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    return str(tool) if tool.is_file() else shutil.which("cuobjdump")


def sass_functions(cubin: bytes, tool: str) -> dict[str, list[str]]:
    """Each kernel's SASS instructions (addresses, encodings and the kernel's own name taken out)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    out, current = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            current = out.setdefault(m[1], [])
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*/\*", line)
        if current is not None and m:
            current.append(m[1].strip())
    return {name: [re.sub(r"_Z\w+", "<kernel>", ins) for ins in lines] for name, lines in out.items()}


def _counts(lines: list[str]) -> dict[str, int]:
    """As ``book.ternary.lesson.sass_counts`` counts a step's SASS."""
    return {"instructions": len(lines), "HMMA": sum("HMMA" in s for s in lines),
            "LOP3": sum("LOP3" in s for s in lines), "HFMA2": sum("HFMA2" in s for s in lines),
            "magic moves": sum(bool(re.search(r"IMAD\.MOV\.U32 R\d+, RZ, RZ, 0x43004300", s)) for s in lines)}


def compile_check() -> int:
    """Every instance compiles (sm_90) without spills; those at step 11's knobs give the library's SASS; the magic
    moves per instance. Returns the number of failures."""
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
    print(f"registers: {sorted({r['registers'] for r in report.values()})}; spills: "
          f"{'none' if not failures else failures}")
    step11_shapes = [(b, mt, *s) for b in (True, False) for mt in (1, 2) for s in SHAPES]
    lib_exprs = [_library_instance(*args) for args in step11_shapes]
    lib = cuda.compile_source("ternary_bulk", arch="sm_90", name_expressions=lib_exprs)
    tool = cuobjdump()
    if tool is None:
        print("no cuobjdump: SASS not compared")
        return failures
    ours_sass, lib_sass = sass_functions(ours.cubin, tool), sass_functions(lib.cubin, tool)
    same = 0
    for args, lib_expr in zip(step11_shapes, lib_exprs):
        mine = ours_sass[ours.lowered_names[instance(STEP11, *args)]]
        theirs = lib_sass[lib.lowered_names[lib_expr]]
        if mine == theirs:
            same += 1
        else:
            failures += 1
            diff = next(i for i, (a, b) in enumerate(zip(mine + [""], theirs + [""])) if a != b)
            print(f"  FAIL {instance(STEP11, *args)}: SASS differs from {lib_expr} at instruction {diff} "
                  f"({len(mine)} against {len(theirs)} instructions)")
    print(f"step 11's knobs: SASS the same as the library's step 11 at {same}/{len(lib_exprs)} instances")
    for knobs in _distinct_knobs():
        expr = instance(knobs, True, 1, 1, 4, 1)  # book.ternary.lesson.SASS_INSTANCES[11]'s shape
        print(f"  {expr}: {_counts(ours_sass[ours.lowered_names[expr]])}")
    return failures


# ----------------------------------------------------------------------------------------------
# check (GPU)
# ----------------------------------------------------------------------------------------------

def random_ternary(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    u = torch.rand(n, k, generator=gen)
    sign = torch.where(torch.rand(n, k, generator=gen) < 0.5, -1, 1)
    return torch.where(u < 1 / 3, 0, sign).to(torch.int8)


#: (N, K, M, x dtype) of the GPU check: N, K not multiples of 16 or 256 (K not of 8: x padded), more warps than a
#: block's groups, both tiles of x (M > 8), fp16; the last with more than 264 tiles and a long K (the two-tile plan).
CHECK_CASES = ((37, 300, 1, torch.bfloat16), (19, 2100, 3, torch.bfloat16), (67, 777, 2, torch.float16),
               (45, 5000, 12, torch.bfloat16), (4240, 9000, 1, torch.bfloat16))
#: Step-11 configs checked at every case besides the library's plan: 1 and 2 tiles, 2, 4 and 8 warps, and K cut
#: in 3 slices (the split-K ending at every variant).
CHECK_CONFIGS = (TmaConfig(row_tiles=1, warps=8), TmaConfig(row_tiles=2, warps=4), TmaConfig(row_tiles=2, warps=2),
                 TmaConfig(row_tiles=1, warps=8, slices=3), TmaConfig(row_tiles=2, warps=4, slices=3))


def check() -> int:
    """Every variant at every case and config against float64 and bit-equal to the library's step 11 at the same
    config. Prints a line per case and variant; returns the number of failures."""
    failures = compile_check()
    if runtime.mode() != "gpu":
        print("no GPU: only compiled (run `check` on a Hopper GPU for the float64 and bit-equality checks)")
        return failures
    dev = runtime.device()
    for n, k, m, dtype in CHECK_CASES:
        gen = torch.Generator().manual_seed(n * 31 + k * 7 + m)
        w = random_ternary(n, k, gen).to(dev)
        x = torch.randn(m, k, generator=gen).to(dev, dtype)
        scale = 0.75 + float(torch.rand(1, generator=gen))
        packed = PackedTernary.pack(w, "2bit_tiles")
        for name in VARIANTS:
            worst, same, configs = 0.0, 0, [config_for(name, m, n, k)] + \
                [config_for(name, m, n, k, base) for base in CHECK_CONFIGS]
            for cfg in configs:
                z = run_variant(name, x, packed, scale, out=torch.full((m, n), float("nan"), device=dev), config=cfg)
                ref = step11_tma(x, packed, scale, config=cfg)
                torch.cuda.synchronize()
                ratio = error_ratio(z, x, w, scale)
                worst = max(worst, ratio)
                exact = bool(torch.equal(z, ref))
                same += exact
                if ratio > FP32_TOLERANCE or not exact:
                    failures += 1
                    print(f"  FAIL {name} {n}x{k} M={m} {cfg}: error {ratio:.2e}, bit-equal to step 11: {exact}")
            print(f"{n}x{k} M={m} {str(dtype)[6:]}: {name:13s} {len(configs)} configs, max error {worst:.1e}, "
                  f"bit-equal to step 11 at {same}/{len(configs)}", flush=True)
    print(f"{failures} failures")
    return failures


# ----------------------------------------------------------------------------------------------
# measure (GPU)
# ----------------------------------------------------------------------------------------------

def measure(chain: bool = False) -> Path:
    """The variants and the library's steps 10 and 11 at :data:`CASES`, on the GPU clock: every variant
    (``step11_changes.json``), or with ``chain`` the variants of :data:`CHAIN` in its order between step 10 and
    step 11 (``step11_chain.json``; each row's ``params`` has ``chain``, its place in the chain, 0 for step 10)."""
    from studylog.bench import BenchRun, gpu_slug

    run = BenchRun("ternary", command=" ".join(sys.argv))
    run.note("Series: step10/step11 are the library's steps as the benchmark calls them (their default launch); "
             "step11_changes are the variants of lab/ternary/variants/step11_changes.cu (params: variant, change, "
             "magic, copies, split and the launch taken: row_tiles, warps, stages, chunk, slices).")
    run.note("Clock: GPU time (CUDA-graph replay, weights rotated among copies past L2, x in L2; median of 3 "
             "repetitions with fresh x and copies). floor_ms: the 2-bit byte floor, (weights + x + z) bytes at this "
             "run's copy bandwidth (the benchmark's floor_mem_ms). Weights: quantize_absmean(randn(N, K)), one "
             "scale; x: randn(M, K) in bf16.")
    if chain:
        run.note("Chain: each row's params.chain is its place (0: the library's step 10; last: its step 11); each "
                 "variant's params.adds is the one change it adds to the row before it.")
    dev = runtime.device()
    for family, n, k, ms in CASES:
        if (family, n, k) not in BENCH_SHAPES:
            raise ValueError(f"CASES holds {family} {n}x{k}, not a shape of the benchmark (report.BENCH_SHAPES)")
        torch.manual_seed(n * 31 + k)
        w_t, scale_t = quantize_absmean(torch.randn(n, k, device=dev))
        scale, w64 = float(scale_t), w_t.double()
        packed = PackedTernary.pack(w_t, "2bit_tiles")
        for m in ms:
            params = {"shape": f"{n}x{k}", "family": family, "n": n, "k": k, "m": m}
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            x64 = x.double()
            ref, magnitude = (x64 @ w64.T) / scale, (x64.abs() @ w64.abs().T) / abs(scale)
            nbytes = packed.nbytes + m * k * 2 + m * n * 4
            floor = run.floor_ms(nbytes)
            if chain:
                rows = ([(SERIES[10], None)] + [("step11_changes", name) for name, _ in CHAIN]
                        + [(SERIES[11], None)])
            else:
                rows = [(SERIES[10], None), (SERIES[11], None)] + [("step11_changes", name) for name in VARIANTS]
            for place, (series, name) in enumerate(rows):
                print(f"{n}x{k} M={m}: {series} {name or 'library'}", flush=True)
                if name is None:
                    fn_of = step10_cuda_mma if series == SERIES[10] else step11_tma
                    make = lambda x_, w_, f=fn_of: (lambda: f(x_, w_, scale))  # noqa: E731
                    cfg = cuda_mma_config(m, n, k) if series == SERIES[10] else tma_config(m, n, k)
                    row_params = {**params, "variant": series}
                else:
                    cfg = config_for(name, m, n, k)
                    make = lambda x_, w_, v=name, c=cfg: (lambda: run_variant(v, x_, w_, scale, config=c))  # noqa: E731
                    row_params = {**params, "variant": name, "change": CHANGES[name], **VARIANTS[name]}
                row_params.update({f: getattr(cfg, f) for f in ("row_tiles", "warps", "stages", "chunk", "slices")
                                   if hasattr(cfg, f)})
                if chain:
                    row_params["chain"] = place
                    if name is not None:
                        row_params["adds"] = dict(CHAIN)[name]
                fn = make(x, packed)
                z = fn()
                torch.cuda.synchronize()
                ratio = error_ratio_from(z.float(), ref, magnitude)
                label = f"{series} {name or 'library'}"
                run.check(f"{label} equals float64 reference", ratio <= FP32_TOLERANCE, params=row_params,
                          error_ratio=ratio, tolerance=FP32_TOLERANCE)
                if name is not None:
                    same = step11_tma(x, packed, scale, config=cfg)
                    run.check(f"{label} bit-equal to the library's step 11 at its config",
                              bool(torch.equal(z, same)), params=row_params)
                plan = timing_plan(call_ms(fn))

                def make_calls(make=make):
                    fresh = torch.randn_like(x)
                    return [make(fresh, copy) for copy in run.rotated(packed)]

                run.measure(series, make_calls, params=row_params, floor_ms=floor, min_calls=plan["min_calls"],
                            reps=plan["reps"], graph_calls=plan["min_calls"], weight_bytes=packed.nbytes,
                            bytes=nbytes, config=str(cfg))
            del x
            torch.cuda.empty_cache()
    name = "step11_chain" if chain else NAME
    out = paths.lab_results("ternary", gpu_slug(run.device["name"])) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(run.to_json(), indent=1) + "\n")
    bad = [c for c in run.checks if not c["passed"]]
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out}")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("check", "measure"))
    parser.add_argument("--compile-only", action="store_true",
                        help="check: compile (NVRTC), spills and SASS only (what a machine without a GPU can do)")
    parser.add_argument("--chain", action="store_true",
                        help="measure: step 10, the chain of CHAIN one change at a time, step 11 "
                             "(results/<gpu>/step11_chain.json)")
    args = parser.parse_args()
    if args.what == "check":
        if args.chain:
            parser.error("--chain goes with measure (check runs every variant)")
        sys.exit(1 if (compile_check() if args.compile_only else check()) else 0)
    if args.compile_only:
        parser.error("--compile-only goes with check")
    measure(chain=args.chain)
