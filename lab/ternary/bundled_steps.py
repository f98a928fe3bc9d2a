"""Chapter 5 part 1's bundled steps split into their changes: step 4 (against step 3) and step 9 (against step 5),
each change a ``tl.constexpr`` knob of a frozen variant kernel (``variants/bundled_steps_kernels.py``).

    PYTHONPATH=$PWD python lab/ternary/bundled_steps.py check     # every variant against float64 (CPU or GPU)
    PYTHONPATH=$PWD python lab/ternary/bundled_steps.py measure   # GPU: results/<gpu>/bundled_steps.json

On a CPU, run ``check`` with ``TRITON_INTERPRET=1`` (``studylog`` sets it when it finds no GPU).

**Step 4's chain** (the page's order; (d), one reduction across K after the loop, is not a change against step
3, whose kernel already sums its accumulator once after the loop: it is measured as "step 4 minus (d)"):

* ``step03``: step 3's kernel (its tile, its decode, its configs);
* ``+a``: step 4's decode (the exponent AND trick) on step 3's tile;
* ``+a+b``: step 4's tile (8 rows in every thread, one x load a field for the 8), no split of K (step 4's tiles at
  ``SPLIT_K`` = 1); this is also "step 4 minus (c)";
* ``+a+b+c`` = step 4: step 4's configs, split K among them (the autotuner takes it or not);
* minus one change: ``step04-a`` (step 3's decode on step 4's tile), ``step04-b`` (step 4's decode and split
  K on step 3's tile), ``step04-d`` (a reduction every tile); and ``step04+split`` (step 4's tiles with K forced
  into 4 slices: what the split costs or saves where the autotuner does not take it).

**Step 9's chain** (every variant at step 9's configs after the first, so that each change is measured at the
configs step 9 was tuned with; the autotuner picks a config per variant and case):

* ``step05``: step 5's kernel and configs; ``step05@9``: step 5's kernel at step 9's configs (not a change of the
  page: the configs differ);
* ``+a``: the pair decode (one AND and one HFMA2 for two weights) on the ``"2bit"`` layout, where the two halves
  of a word are 128 apart along K, so x is gathered;
* ``+a+m``: step 9's masks (rows past N clamped, x unmasked on the tiles below K). The page does not list this
  difference between steps 5 and 9; its text counts the masked gather of x among step 5's costs. A knob of its
  own, before the layout, so that (b) is the layout alone;
* ``+a+m+b``: the ``"2bit_mma"`` layout (pairs are K-neighbours; x of a field is a run of 32); this is also
  "step 9 minus (c)". (b) needs (a): without the pair decode the layout only makes step 5's gather stride 2;
* ``+a+m+b+c`` = step 9: split K through the zeroed workspace and per-tile counter instead of atomics into a
  zeroed z (a memset launch a call, where a config splits K);
* minus one change: ``step09-b`` (the ``"2bit"`` layout), ``step09-m`` (step 5's masks). "Step 9 minus (a)" is
  not a kernel (the layout needs the pair decode).

``check`` runs every variant at every config of its list on small awkward shapes (N, K not multiples of the
blocks, M = 1 and a few rows) against float64, and the ends of each chain against the library's step at the
same config: bit-equal where the sum's order is fixed (no split of K, or the interpreter), else within the
chapter's tolerance. On the GPU it also runs the benchmark's divisibility (N, K multiples of 16), which compiles
what ``measure`` then times.

``measure`` times each variant and the library's steps 3, 4, 5 and 9 in the same run on the chapter's GPU clock
(``BenchRun.measure``: CUDA-graph replay, the weights rotated among copies past L2, three repetitions with fresh x
and copies), with the benchmark's weights (``quantize_absmean(randn(N, K))``, one scale), bf16 x and its timing
plan (``report.timing_plan``); ``floor_ms`` is the 2-bit byte floor (weights + x + z at this run's copy
bandwidth, the benchmark's ``floor_mem_ms``). Each row's output is checked against float64 before it is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import triton
import triton.language as tl

from studylog import paths, runtime
from studylog.ternary import FP32_TOLERANCE, PackedTernary, error_ratio, quantize_absmean
from studylog.ternary import step03_2bit, step04_gemv, step05_dot, step09_mma
from studylog.ternary.formats import MMA_X_DTYPES, SplitWorkspace, check_packed_call, error_ratio_from
from studylog.ternary.report import BENCH_SHAPES, call_ms, timing_plan
from studylog.ternary.steps import SERIES
from studylog.ternary.triton_mma import MMA_CONFIGS_FEW, step09_mma_tuned_few
from studylog.ternary.triton_steps import (DOT_CONFIGS_FEW, GEMV_CONFIGS, TL_DTYPES, TWO_BIT_CONFIGS, autotune,
                                           block_m_for, config_dict, launch_tuned, step03_2bit_tuned,
                                           step04_gemv_tuned, step05_dot_tuned_few, triton_config)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from variants.bundled_steps_kernels import step04_variant_kernel, step09_variant_kernel  # noqa: E402

NAME = "bundled_steps"
#: The benchmark's headline shapes (4096 x 14336 at M = 1 and 16) and a smaller one at M = 1, where N / 8 rows a
#: program make the fewest programs of the benchmark's shapes (the case for a split of K).
CASES = (("llama", 4096, 14336, (1, 16)), ("bitnet", 2560, 6912, (1,)))
#: Step 9's variants take the few-rows configs (BLOCK_M 16 or 32), as the benchmark's M = 1 and 16 do.
MAX_ROWS = 32
FORCED_SPLIT = 4


# ----------------------------------------------------------------------------------------------
# The variants
# ----------------------------------------------------------------------------------------------

def _configs(base: list, *, zero_output: bool = True, **override) -> list:
    """``base`` (triton.Configs) with the meta values in ``override`` set; duplicates dropped, order kept."""
    out, seen = [], set()
    for c in base:
        meta = {**c.kwargs, **override}
        key = (tuple(sorted(meta.items())), c.num_warps, c.num_stages)
        if key not in seen:
            seen.add(key)
            out.append(triton_config(num_warps=c.num_warps, num_stages=c.num_stages, zero_output=zero_output, **meta))
    return out


GROUP_CONFIGS = _configs(TWO_BIT_CONFIGS, BLOCK_KW=16, SPLIT_K=1)  # step 3's
GROUP_SPLIT_CONFIGS = GROUP_CONFIGS + _configs(TWO_BIT_CONFIGS, BLOCK_KW=16, SPLIT_K=FORCED_SPLIT)
WIDE_NO_SPLIT_CONFIGS = _configs(GEMV_CONFIGS, SPLIT_K=1)
WIDE_FORCED_SPLIT_CONFIGS = _configs(GEMV_CONFIGS, SPLIT_K=FORCED_SPLIT)
MMA_CONFIGS_ZEROED_Z = _configs(MMA_CONFIGS_FEW, zero_output=True)  # step 9's, split K into a zeroed z


@dataclasses.dataclass
class Variant:
    """One kernel of a chain: its knobs (the kernel's constexprs), its configs, the format it reads and, at the
    ends of a chain, the library step it must equal."""

    name: str
    step: int  # the bundled step it belongs to: 4 or 9
    chain: str  # "cumulative" or "minus one"
    change: str  # what it adds (or leaves out), in words
    knobs: dict
    configs: list
    fmt: str = "2bit"
    workspace: bool = False
    equals: Optional[int] = None  # the library step it computes, at the same config
    _tuner: Any = None

    @property
    def tuner(self):
        if self._tuner is None:
            kernel = step04_variant_kernel if self.step == 4 else step09_variant_kernel
            self._tuner = autotune(self.configs, key=["N", "K"] + (["BLOCK_M"] if self.step == 9 else []))(kernel)
        return self._tuner

    def params(self) -> dict:
        return {"variant": self.name, "step": self.step, "chain": self.chain, "change": self.change, **self.knobs}


def _v4(name, chain, change, decode, wide, split, reduce_at_end, configs, equals=None):
    knobs = {"DECODE": decode, "WIDE": wide, "REDUCE_AT_END": reduce_at_end, "split_k": split}
    return Variant(name, 4, chain, change, knobs, configs, equals=equals)


def _v9(name, chain, change, pair, no_mask, mma, workspace, configs, equals=None):
    knobs = {"PAIR": pair, "NO_MASK": no_mask, "MMA_LAYOUT": mma, "WORKSPACE": workspace,
             "configs": "step05" if configs is DOT_CONFIGS_FEW else "step09"}
    return Variant(name, 9, chain, change, knobs, configs, fmt="2bit_mma" if mma else "2bit",
                   workspace=bool(workspace), equals=equals)


#: split_k: "off" (SPLIT_K = 1 in every config), "tuned" (the step's configs, some with a split), "forced".
STEP04_VARIANTS = [
    _v4("step03", "cumulative", "step 3", 0, 0, "off", 1, GROUP_CONFIGS, equals=3),
    _v4("+a", "cumulative", "(a) the exponent AND decode", 1, 0, "off", 1, GROUP_CONFIGS),
    _v4("+a+b", "cumulative", "(b) 8 rows a thread, one x load for the 8 (= step 4 minus (c))", 1, 1, "off", 1,
        WIDE_NO_SPLIT_CONFIGS),
    _v4("+a+b+c", "cumulative", "(c) split K with atomics among the configs (= step 4; (d) is step 3's already)",
        1, 1, "tuned", 1, GEMV_CONFIGS, equals=4),
    _v4("step04-a", "minus one", "step 4 with step 3's decode", 0, 1, "tuned", 1, GEMV_CONFIGS),
    _v4("step04-b", "minus one", "step 4 on step 3's tile", 1, 0, "tuned", 1, GROUP_SPLIT_CONFIGS),
    _v4("step04-d", "minus one", "step 4 reducing every tile", 1, 1, "tuned", 0, GEMV_CONFIGS),
    _v4("step04+split", "minus one", f"step 4 with K forced into {FORCED_SPLIT} slices", 1, 1, "forced", 1,
        WIDE_FORCED_SPLIT_CONFIGS),
]
STEP09_VARIANTS = [
    _v9("step05", "cumulative", "step 5", 0, 0, 0, 0, DOT_CONFIGS_FEW, equals=5),
    _v9("step05@9", "cumulative", "step 5 at step 9's configs (not a change of the page)", 0, 0, 0, 0,
        MMA_CONFIGS_ZEROED_Z),
    _v9("+a", "cumulative", "(a) the pair decode, 2bit layout (x gathered)", 1, 0, 0, 0, MMA_CONFIGS_ZEROED_Z),
    _v9("+a+m", "cumulative", "step 9's masks (rows clamped, x unmasked below K)", 1, 1, 0, 0, MMA_CONFIGS_ZEROED_Z),
    _v9("+a+m+b", "cumulative", "(b) the 2bit_mma layout (= step 9 minus (c))", 1, 1, 1, 0, MMA_CONFIGS_ZEROED_Z),
    _v9("+a+m+b+c", "cumulative", "(c) split K through the workspace (= step 9)", 1, 1, 1, 1, MMA_CONFIGS_FEW,
        equals=9),
    _v9("step09-b", "minus one", "step 9 on the 2bit layout", 1, 1, 0, 1, MMA_CONFIGS_FEW),
    _v9("step09-m", "minus one", "step 9 with step 5's masks", 1, 0, 1, 1, MMA_CONFIGS_FEW),
]
VARIANTS = STEP04_VARIANTS + STEP09_VARIANTS
LIBRARY = {3: (step03_2bit, step03_2bit_tuned, "2bit"), 4: (step04_gemv, step04_gemv_tuned, "2bit"),
           5: (step05_dot, step05_dot_tuned_few, "2bit"), 9: (step09_mma, step09_mma_tuned_few, "2bit_mma")}
#: The variants' own split-K workspace (not the library's, whose zeros step 9's anchor relies on).
WORKSPACE = SplitWorkspace()


def run_variant(v: Variant, x: torch.Tensor, w: PackedTernary, scale: Any = 1.0, *, out: Optional[torch.Tensor] = None,
                config: Optional[dict] = None) -> torch.Tensor:
    """``x @ W.T / scale`` by variant ``v``: autotuned over its configs, or at ``config`` (``config_dict`` of one)."""
    if v.step == 4:
        x2, vector, w, s, s_stride, z = check_packed_call(x, w, scale, out, v.fmt)
        m, k = x2.shape
        args = (x2, w.data, z, s, w.n, k, w.data.shape[1], x2.stride(0), w.data.stride(0), z.stride(0), s_stride)
        meta = {key: val for key, val in v.knobs.items() if key.isupper()}
        launch_tuned(v.tuner, lambda meta: (triton.cdiv(w.n, meta["BLOCK_N"]), meta["SPLIT_K"], m), args, config,
                     meta)
        return z[0] if vector else z
    x2, vector, w, s, s_stride, z = check_packed_call(x, w, scale, out, v.fmt, dtypes=MMA_X_DTYPES)
    m, k = x2.shape
    if m > MAX_ROWS:
        raise ValueError(f"x has {m} rows; the step 9 variants take at most {MAX_ROWS} (the few-rows configs)")
    sums, counts = WORKSPACE.get(x2.device, m, w.n)
    magic = TL_DTYPES[x2.dtype]
    # The library's types: the interpreter decodes and multiplies in float32 (its bf16 arithmetic is wrong).
    dot = (tl.float32, "ieee") if runtime.mode() == "interpreter" else (magic, "tf32")
    meta = {key: val for key, val in v.knobs.items() if key.isupper()}
    meta.update(BLOCK_M=block_m_for(m), MAGIC=magic, DOT_DTYPE=dot[0], DOT_PRECISION=dot[1])
    args = (x2, w.data, z, s, sums, counts, m, w.n, k, w.data.shape[1], x2.stride(0), w.data.stride(0), z.stride(0),
            s_stride)
    grid = lambda meta: (triton.cdiv(w.n, meta["BLOCK_N"]), meta["SPLIT_K"], triton.cdiv(m, meta["BLOCK_M"]))  # noqa: E731
    launch_tuned(v.tuner, grid, args, config, meta, zero_output=not v.workspace)
    return z[0] if vector else z


def library_config(step: int, config: dict) -> dict:
    """A variant's config as the library step's ``config=`` (step 3's configs have no BLOCK_KW or SPLIT_K)."""
    return {k: val for k, val in config.items() if not (step == 3 and k in ("BLOCK_KW", "SPLIT_K"))}


# ----------------------------------------------------------------------------------------------
# check
# ----------------------------------------------------------------------------------------------

def _ternary(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    u = torch.rand(n, k, generator=gen)
    sign = torch.where(torch.rand(n, k, generator=gen) < 0.5, -1, 1)
    return torch.where(u < 1 / 3, 0, sign).to(torch.int8)


def check_cases() -> list[tuple[int, int, int, torch.dtype, bool]]:
    """(N, K, M, x dtype, every config?) of ``check``: awkward sizes (K not a multiple of 16, 256 or the tiles;
    more slices than tiles; N not a multiple of 8 or 64); on the GPU also the benchmark's divisibility."""
    cases = [(37, 300, 1, torch.bfloat16, True), (19, 2100, 3, torch.bfloat16, True),
             (67, 777, 2, torch.float16, False)]
    if runtime.mode() == "gpu":
        cases += [(4112, 3344, 1, torch.bfloat16, True), (4112, 3344, 16, torch.bfloat16, True)]
    return cases


def check(steps: tuple[int, ...] = (4, 9)) -> int:
    """Every variant of ``steps`` at its configs against float64; the ends of each chain against the library.
    Prints a line per variant and case; returns the number of failures."""
    dev = runtime.device()
    failures = 0
    for n, k, m, dtype, every in check_cases():
        gen = torch.Generator().manual_seed(n * 31 + k * 7 + m)
        w = _ternary(n, k, gen).to(dev)
        x = torch.randn(m, k, generator=gen).to(dev, dtype)
        scale = 0.75 + float(torch.rand(1, generator=gen))
        packed = {fmt: PackedTernary.pack(w, fmt) for fmt in ("2bit", "2bit_mma")}
        for v in (v for v in VARIANTS if v.step in steps):
            configs = v.configs if every else [v.configs[0], v.configs[-1]]
            start, worst, same = time.perf_counter(), 0.0, []
            for c in configs:
                config = config_dict(c)
                z = run_variant(v, x, packed[v.fmt], scale, out=torch.full((m, n), float("nan"), device=dev),
                                config=config)
                ratio = error_ratio(z, x, w, scale)
                worst = max(worst, ratio)
                if ratio > FP32_TOLERANCE:
                    failures += 1
                    print(f"  FAIL {v.name} (step {v.step}) {n}x{k} M={m} {dtype} {config}: error {ratio:.2e}")
                if v.equals is not None:
                    fn, _, fmt = LIBRARY[v.equals]
                    ref = fn(x, packed[fmt], scale, config=library_config(v.equals, config))
                    exact = bool(torch.equal(z, ref))
                    fixed_order = config.get("SPLIT_K", 1) == 1 or runtime.mode() == "interpreter"
                    ok = exact if fixed_order else error_ratio(ref, x, w, scale) <= FP32_TOLERANCE
                    same.append(exact)
                    if not ok:
                        failures += 1
                        print(f"  FAIL {v.name} differs from step {v.equals} at {config}")
            tail = f", bit-equal to step {v.equals} at {sum(same)}/{len(same)} configs" if v.equals else ""
            print(f"{n}x{k} M={m} {str(dtype)[6:]}: step {v.step} {v.name:13s} {len(configs)} configs, "
                  f"max error {worst:.1e}{tail} ({time.perf_counter() - start:.1f} s)", flush=True)
    print(f"{failures} failures")
    return failures


# ----------------------------------------------------------------------------------------------
# measure
# ----------------------------------------------------------------------------------------------

def measure(steps: tuple[int, ...] = (4, 9)) -> Path:
    """Each step's variants (step 4 at M = 1 only) and its library anchors at :data:`CASES`, on the GPU clock."""
    from studylog.bench import BenchRun, gpu_slug

    run = BenchRun("ternary", command=" ".join(sys.argv))
    run.note("Series: step03/step04/step05/step09 are the library's steps (autotuned, as the benchmark calls them); "
             "step04_changes and step09_changes are the frozen variants of lab/ternary/variants/"
             "bundled_steps_kernels.py (params: variant, chain, change and the knobs), each autotuned over its "
             "configs (params.config: the config taken).")
    run.note("Clock: GPU time (CUDA-graph replay, weights rotated among copies past L2, x in L2; median of 3 "
             "repetitions with fresh x and copies). floor_ms: the 2-bit byte floor, (weights + x + z) bytes at this "
             "run's copy bandwidth (the benchmark's floor_mem_ms). Weights: quantize_absmean(randn(N, K)), one "
             "scale; x: randn(M, K) in bf16.")
    dev = runtime.device()
    for family, n, k, ms in CASES:
        if (family, n, k) not in BENCH_SHAPES:
            raise ValueError(f"CASES holds {family} {n}x{k}, not a shape of the benchmark (report.BENCH_SHAPES)")
        torch.manual_seed(n * 31 + k)
        w_t, scale_t = quantize_absmean(torch.randn(n, k, device=dev))
        scale, w64 = float(scale_t), w_t.double()
        packed = {fmt: PackedTernary.pack(w_t, fmt) for fmt in ("2bit", "2bit_mma")}
        for m in ms:
            params = {"shape": f"{n}x{k}", "family": family, "n": n, "k": k, "m": m}
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            x64 = x.double()
            ref, magnitude = (x64 @ w64.T) / scale, (x64.abs() @ w64.abs().T) / abs(scale)
            nbytes = packed["2bit"].nbytes + m * k * 2 + m * n * 4
            floor = run.floor_ms(nbytes)
            wanted = [s for s in steps if s == 9 or m == 1]  # step 4 is a one-row kernel
            series = []
            for step in wanted:
                anchors = (3, 4) if step == 4 else (5, 9)
                series += [(SERIES[a], LIBRARY[a][2], None, a) for a in anchors]
                series += [(f"step{step:02d}_changes", v.fmt, v, None) for v in VARIANTS if v.step == step]
            for name, fmt, v, anchor in series:
                label = v.name if v is not None else "library"
                print(f"{n}x{k} M={m}: {name} {label}", flush=True)

                def make(x_, w_, v=v, anchor=anchor):
                    if v is not None:
                        return lambda: run_variant(v, x_, w_, scale)
                    return lambda: LIBRARY[anchor][0](x_, w_, scale)

                fn = make(x, packed[fmt])
                z = fn()
                torch.cuda.synchronize()
                tuner = v.tuner if v is not None else LIBRARY[anchor][1]
                row_params = {**params, **(v.params() if v is not None else {"variant": SERIES[anchor]})}
                ratio = error_ratio_from(z.float(), ref, magnitude)
                run.check(f"{name} {label} equals float64 reference", ratio <= FP32_TOLERANCE, params=row_params,
                          error_ratio=ratio, tolerance=FP32_TOLERANCE)
                plan = timing_plan(call_ms(fn))

                def make_calls(make=make, w=packed[fmt]):
                    fresh = torch.randn_like(x)
                    return [make(fresh, copy) for copy in run.rotated(w)]

                run.measure(name, make_calls, params=row_params, floor_ms=floor, min_calls=plan["min_calls"],
                            reps=plan["reps"], graph_calls=plan["min_calls"], weight_bytes=packed[fmt].nbytes,
                            bytes=nbytes, config=str(getattr(tuner, "best_config", "") or ""))
            del x
            torch.cuda.empty_cache()
    out = paths.lab_results("ternary", gpu_slug(run.device["name"])) / f"{NAME}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(run.to_json(), indent=1) + "\n")
    bad = [c for c in run.checks if not c["passed"]]
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out}")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("check", "measure"))
    parser.add_argument("--steps", default="4,9", help="which bundled steps: 4, 9 or 4,9 (default)")
    args = parser.parse_args()
    chosen = tuple(int(s) for s in args.steps.split(","))
    if not set(chosen) <= {4, 9}:
        parser.error(f"--steps takes 4, 9 or 4,9; got {args.steps!r}")
    if args.what == "check":
        sys.exit(1 if check(chosen) else 0)
    measure(chosen)
