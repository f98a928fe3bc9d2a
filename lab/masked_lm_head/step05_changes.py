"""Step 5's three changes against step 4, each with its own number; and the decode loop's bitmask copy and union
build, each with its own number.

Step 5 (``step05_stream``) changes three things against step 4 (``step04_compact``): one wait per row (the whole
row loaded as one tile and reduced once, not chunk by chunk), the fill programs first in the grid, and an L2
evict-first hint on the weight rows. ``variants/step05_changes.py`` holds both kernels in one source with a
compile-time knob per change (ONE_WAIT, FILL_FIRST, EVICT_FIRST); this script times all 2^3 combinations (step 4's
settings, each change alone, step 5 minus each change, step 5's settings) beside the library's own two steps.

The grid runs at step 5's tiles. Where step 4's default tiles differ from them (at 10,000 allowed ids step 4 takes
two rows a program, step 5 one), step 4's settings and step 5's settings are also timed at step 4's tiles, so the
tile change has its number too and the library's step 4 has its exact twin.

Second series: the chapter's decode loop (``MaskedHeadPlan``) replays the whole step from the packed bitmask; the
page times "the bitmask's copy and the union build" only together (the plan's step less step 9's kernel). Here each
part of the plan's step is timed alone at batch 1: the host-to-device copy of the bitmask, the count's zeroing,
the union kernel, the two together (the union build), the plan's row kernel, the plan's step without the copy, the
whole step, and step 9 on precomputed sets (what the page subtracts).

    PYTHONPATH=$PWD python lab/masked_lm_head/step05_changes.py check     # CPU (interpreter) or GPU
    PYTHONPATH=$PWD python lab/masked_lm_head/step05_changes.py measure   # GPU -> results/<gpu>/step05_changes.json
    PYTHONPATH=$PWD python lab/masked_lm_head/step05_changes.py ptx       # any machine: PTX for sm_90 compared

``check``: every variant against a float64 reference of the masked logits on a poisoned (NaN) output, at sizes
that are multiples of no block (and, on a GPU, at the chapter's head), with 0, 1, 3, many and all ids allowed, at
several tiles; and every variant's output bit-identical to the library step with the same reduction (step 4 with
ONE_WAIT off, step 5 with it on) at the same tiles. ``ptx``: the variant with every knob off compiles to step 4's
PTX and with every knob on to step 5's (sm_90, no GPU needed; source-line records left out).

``measure`` builds its inputs as the chapter's benchmark (``studylog.masked_lm_head.report.run_sweep``) does: the
same seeds, the same head (V = 128,256, D = 3,072, bf16), the same hidden state and the same random sets (drawn in
the benchmark's order), the same floor and the same clock (``BenchRun.measure``: CUDA-graph replay, 60 calls a
graph, 15 replays, three repetitions), with the calls rotated over exact copies of the head as there
(``HeadCopies``: enough that the union's rows over all copies exceed four times L2, at most 48 GiB of copies; the
rows say ``copies`` and whether that cap bound, ``rotation_capped``), so the evict-first hint acts on rows read
from DRAM. The plan's parts that read the head (whole, launch, row_kernel, step09) rotate over one plan per copy;
the others read no weight and run on one. Every variant is checked on a poisoned output (on the head itself)
before it is timed; a failed check is recorded and the row still written.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the frozen variants beside this script

if __name__ == "__main__" and sys.argv[1:2] == ["ptx"]:
    # compiling for sm_90 without a GPU: ptx_unchanged says there is one before studylog is imported
    import ptx_unchanged  # noqa: F401

from studylog import paths, runtime  # noqa: E402, I001  (before triton: it selects GPU or interpreter)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

from studylog.masked_lm_head import (CHAPTER, HIDDEN, VOCAB, AllowedTokens, MaskedHeadPlan, check_logits,  # noqa: E402
                                     dispatch_rule, pack_bitmask, step04_compact, step05_stream, step09_dispatch)
from studylog.masked_lm_head.dispatch import launch_constexprs  # noqa: E402
from studylog.masked_lm_head.formats import Tiles, compare_logits, fp32_gamma, stream_tiles  # noqa: E402
from studylog.masked_lm_head.masks import random_sets  # noqa: E402
from studylog.masked_lm_head.plan import (UNION_BLOCK_B, UNION_BLOCK_W, stream_count_kernel,  # noqa: E402
                                          union_ids_kernel)
from studylog.masked_lm_head.report import HeadCopies, cases  # noqa: E402
from variants.step05_changes import KNOBS, changes, shared_tiles, step04_tiles  # noqa: E402

#: Every combination of the three knobs: step 4's settings, each change alone, step 5 minus each change, step 5's.
COMBINATIONS = [dict(zip(KNOBS, bits)) for bits in sorted(itertools.product((False, True), repeat=3),
                                                         key=lambda bits: (sum(bits), [not b for b in bits]))]
#: The chapter benchmark's batch-1 allowed counts this script measures (random sets).
COUNTS = (1, 1000, 10_000)
#: The counts of the page's table "Where the plan's step goes at batch 1".
PLAN_COUNTS = (1, 1000)
SERIES = "step05_changes"
PLAN_SERIES = "decode_split"
#: GPU-clock settings of a measurement, the chapter benchmark's for kernels under 100 µs.
MIN_CALLS, REPS = 60, 15


def label(knobs: dict) -> str:
    """A variant's name in words: step 4 plus the changes it has, or step 5 minus those it lacks."""
    on = [k for k in KNOBS if knobs[k]]
    off = [k for k in KNOBS if not knobs[k]]
    if len(on) <= 1:
        return "step 4" + "".join(f" + {k}" for k in on)
    return "step 5" + "".join(f" - {k}" for k in off)


def library_twin(knobs: dict):
    """The library step whose logits a variant's equal bit for bit: the reduction is the only knob that changes
    a sum (step 4's chunks with ONE_WAIT off, step 5's one tile with it on)."""
    return step05_stream if knobs["one_wait"] else step04_compact


# -- check -------------------------------------------------------------------------------------------------------

def check_tiles(n_ids: int, rows: tuple[int, ...] = (1, 2, 4)) -> list[tuple[str, Tiles]]:
    """Tiles a check runs every variant at: small blocks that cut rows and outputs in awkward places (``rows``
    rows a program, 32-wide chunks, 64-output fill programs), and the defaults (the grid's, step 4's)."""
    small = [(f"small block_v={v}", Tiles(block_b=1, block_v=v, block_d=32, fill_block=64, num_warps=4,
                                           num_stages=1)) for v in rows]
    defaults = [("shared (step 5's)", shared_tiles(n_ids))]
    if step04_tiles(n_ids) != shared_tiles(n_ids):
        defaults.append(("step 4's", step04_tiles(n_ids)))
    return small + defaults


def case_inputs(vocab: int, hidden: int, kind: str, gen: np.random.Generator, dev: torch.device):
    g = torch.Generator().manual_seed(int(gen.integers(2**31)))
    h = torch.randn(1, hidden, generator=g).to(torch.bfloat16).to(dev)
    weight = (torch.randn(vocab, hidden, generator=g) * 0.02).to(torch.bfloat16).to(dev)
    ids = {"none": lambda: np.array([], dtype=np.int64), "one": lambda: np.array([vocab - 1]),
           "few": lambda: gen.choice(vocab, size=3, replace=False),
           "many": lambda: np.flatnonzero(gen.random(vocab) < 0.3), "all": lambda: np.arange(vocab)}[kind]()
    return h, weight, AllowedTokens.from_ids([ids], vocab, device=dev)


def check(seed: int | None = None) -> int:
    """Every variant against float64 and bit-identical to its library twin; returns the number of failures."""
    seed = int(np.random.SeedSequence().entropy % 2**31) if seed is None else seed
    gen = np.random.default_rng(seed)
    dev = runtime.device()
    print(f"check on {runtime.mode()} ({dev}), seed {seed}", flush=True)
    # (V, D, rows a program of the small tiles): V a multiple of no block, D not a power of two (nor of a chunk)
    sizes = [(203, 77, (1, 2, 4))]
    # on a GPU, the chapter's head (D = 3,072 pads to 4,096); on the CPU, a second small size
    sizes.append((VOCAB, HIDDEN, (2,)) if runtime.mode() == "gpu" else (421, 130, (1, 2, 4)))
    failures = checks = 0
    for vocab, hidden, rows in sizes:
        for kind in ("none", "one", "few", "many", "all"):
            h, weight, allowed = case_inputs(vocab, hidden, kind, gen, dev)
            for tiles_name, t in check_tiles(allowed.union_count, rows):
                twins = {}
                for fn in (step04_compact, step05_stream):
                    twins[fn] = fn(h, weight, allowed, out=torch.full((1, vocab), float("nan"), device=dev), tiles=t)
                for knobs in COMBINATIONS:
                    out = changes(h, weight, allowed, **knobs, tiles=t,
                                  out=torch.full((1, vocab), float("nan"), device=dev))
                    res = check_logits(out, h, weight, allowed, summation="row")
                    same = torch.equal(out, twins[library_twin(knobs)])
                    checks += 2
                    if not res["passed"] or not same:
                        failures += (not res["passed"]) + (not same)
                        print(f"FAILED V={vocab} D={hidden} {kind} ({allowed.union_count} ids) tiles {tiles_name} "
                              f"{label(knobs)}: {res}, bit-identical to {library_twin(knobs).__name__}: {same}",
                              flush=True)
            print(f"  V={vocab} D={hidden} {kind:4s} ({allowed.union_count} ids): {len(COMBINATIONS)} variants x "
                  f"{len(check_tiles(allowed.union_count, rows))} tiles checked", flush=True)
    failures += check_refusals(dev)
    print(f"{len(COMBINATIONS)} variants: {checks} checks, {failures} failures (seed {seed})")
    return failures


def check_refusals(dev: torch.device) -> int:
    """The wrapper names the argument it refuses."""
    h, weight, allowed = case_inputs(40, 24, "few", np.random.default_rng(0), dev)
    two = AllowedTokens.from_ids([allowed.ids(0), allowed.ids(0)], 40, device=dev)
    knobs = dict.fromkeys(KNOBS, True)
    wrong = [(lambda: changes(h, weight, allowed, **(knobs | {"fill_first": 1})), "fill_first must be a bool"),
             (lambda: changes(torch.cat([h, h]), weight, two, **knobs), "handles one sequence"),
             (lambda: changes(h, weight, allowed, **knobs, tiles=(1, 2)), "tiles must be")]
    failures = 0
    for call, words in wrong:
        try:
            call()
            failures += 1
            print(f"FAILED: no error for a call that should say {words!r}")
        except (TypeError, ValueError) as exc:
            if words not in str(exc):
                failures += 1
                print(f"FAILED: error {exc!r} does not say {words!r}")
    return failures


# -- ptx ---------------------------------------------------------------------------------------------------------

def ptx() -> int:
    """The variant at step 4's settings and at step 5's compiles to the library kernel's PTX (sm_90, bf16,
    D = 3,072, one row a program): the same code, not only the same outputs."""
    from ptx_unchanged import ptx as compile_ptx

    from studylog.masked_lm_head import compact_rows_kernel, compact_stream_kernel
    from variants.step05_changes import step05_changes_kernel

    def text(kernel, constexprs):
        lines = compile_ptx(kernel, constexprs).replace(kernel.__name__, "KERNEL").splitlines()
        return [" ".join(line.split()) for line in lines if not line.lstrip().startswith("//")]

    shape = dict(D=HIDDEN, BLOCK_V=1, FILL_BLOCK=4096)
    variant = shape | dict(D_POW2=triton.next_power_of_2(HIDDEN), BLOCK_D=1024)
    pairs = [("step 4's settings", compact_rows_kernel, shape | dict(BLOCK_D=1024), dict.fromkeys(KNOBS, False)),
             ("step 5's settings", compact_stream_kernel,
              shape | dict(D_POW2=triton.next_power_of_2(HIDDEN), EVICTION="evict_first"), dict.fromkeys(KNOBS, True))]
    same = True
    for name, kernel, constexprs, knobs in pairs:
        mine = text(step05_changes_kernel, variant | {k.upper(): v for k, v in knobs.items()})
        ok = mine == text(kernel, constexprs)
        same &= ok
        print(f"{name}: step05_changes_kernel and {kernel.__name__}: PTX {'same' if ok else 'DIFFERS'}")
    return 0 if same else 1


# -- measure -----------------------------------------------------------------------------------------------------

def bench_inputs(dev: torch.device):
    """The chapter benchmark's head, batch-1 hidden state and random sets at :data:`COUNTS`: the same seeds and
    the same draws in the same order as ``run_sweep`` (batch 1 comes first, its random counts first)."""
    gen = np.random.default_rng(1234)
    torch.manual_seed(1234)
    weight = (torch.randn(VOCAB, HIDDEN, device=dev) * 0.02).to(torch.bfloat16)
    h = torch.randn(1, HIDDEN, device=dev).to(torch.bfloat16)
    order = [c for b, kind, c in cases(VOCAB, quick=False, third_kind="real") if b == 1 and kind == "random"]
    sets = {}
    for count in order[: max(order.index(c) for c in COUNTS) + 1]:
        sets[count] = random_sets(count, VOCAB, 1, gen)
    return weight, h, {c: sets[c] for c in COUNTS}


def measure() -> Path:
    from studylog.bench import BenchRun, gpu_slug

    run = BenchRun("masked_lm_head", command="python lab/masked_lm_head/step05_changes.py measure")
    dev = runtime.device()
    weight, h, sets = bench_inputs(dev)
    vocab, hidden = weight.shape
    row_bytes = hidden * weight.element_size()
    w64 = weight.double()
    ref, scale = h.double() @ w64.t(), h.double().abs() @ w64.abs().t()
    del w64
    torch.cuda.empty_cache()
    bound = fp32_gamma(hidden, "row") * scale + 1e-30
    S4, S5 = CHAPTER.step(4).series, CHAPTER.step(5).series
    run.note(f"{SERIES}: step 4 (step04_compact) with any of step 5's three changes, one compile-time knob each "
             "(lab/masked_lm_head/variants/step05_changes.py): one_wait (the whole row one tile, reduced once), "
             "fill_first (fill programs first in the grid), evict_first (L2 evict-first hint on the weight rows). "
             "Every combination at step 5's tiles (params tiles='step05'); where step 4's default tiles differ, "
             "step 4's and step 5's settings also at step 4's tiles (tiles='step04'). "
             f"{S4} and {S5} are the library's steps, timed in the same run as anchors.")
    run.note("Inputs as the chapter's benchmark builds them (seed 1234, the batch-1 hidden state, the random sets "
             "drawn in its order); floor_ms as there; clock: BenchRun.measure, 60 calls a graph, 15 replays, 3 "
             "repetitions, the calls rotated over exact copies of the head as there (HeadCopies: the union's rows "
             "times the copies above four times L2, at most 48 GiB of copies; where that cap binds, a row's "
             "rotation_capped is true); the check runs on the head itself.")
    copies = HeadCopies(run)

    def checked(series: str, out: torch.Tensor, allowed: AllowedTokens, params: dict) -> None:
        torch.cuda.synchronize()
        res = compare_logits(out, ref, bound, allowed.mask)
        run.check(series, res.pop("passed"), params=params | {"series": series}, summation="row", **res)

    def timed(series: str, fn, nbytes: int, params: dict, **extra) -> dict:
        """``fn(w)`` on the GPU clock, rotated over the copies of the head that a call reading ``nbytes`` needs."""
        n, capped = copies.count(weight, nbytes)
        return run.measure(series, lambda: [functools.partial(fn, w) for w in copies.of(weight, n)], params=params,
                           min_calls=MIN_CALLS, reps=REPS, copies=n, read_bytes=int(nbytes), rotation_capped=capped,
                           **extra)

    allowed_of = {}
    anchors = []
    for count in COUNTS:
        allowed = allowed_of[count] = AllowedTokens.from_ids(sets[count], vocab, device=dev)
        n = allowed.union_count
        base = {"batch": 1, "kind": "random", "allowed": count, "layout": "vd"}
        extra = {"allowed_actual": float(np.mean(allowed.counts)), "union": n,
                 "floor_ms": max(run.floor_ms(n * row_bytes + vocab * 4), run.empty_launch_gpu.median)}
        print(f"{count:,} allowed: anchors ({S4}, {S5})", flush=True)
        out = torch.empty(1, vocab, device=dev)
        rows = {}
        for series, fn in ((S4, step04_compact), (S5, step05_stream)):
            checked(series, fn(h, weight, allowed, out=torch.full((1, vocab), float("nan"), device=dev)), allowed,
                    base)
            rows[series] = timed(series, lambda w, fn=fn: fn(h, w, allowed, out=out), n * row_bytes, base, **extra)
        grid = shared_tiles(n)
        todo = [(knobs, "step05", grid) for knobs in COMBINATIONS]
        if step04_tiles(n) != grid:  # the tile change, on its own
            todo += [(dict.fromkeys(KNOBS, on), "step04", step04_tiles(n)) for on in (False, True)]
        for knobs, tiles_name, t in todo:
            params = base | knobs | {"variant": label(knobs), "tiles": tiles_name, "block_v": t.block_v,
                                     "block_d": t.block_d, "fill_block": t.fill_block, "num_warps": t.num_warps,
                                     "num_stages": t.num_stages}
            print(f"{count:,} allowed: {label(knobs)}, {tiles_name}'s tiles (block_v={t.block_v})", flush=True)
            got = changes(h, weight, allowed, **knobs, tiles=t, out=torch.full((1, vocab), float("nan"), device=dev))
            checked(SERIES, got, allowed, params)
            twin = library_twin(knobs)
            run.check(f"{SERIES} bit-identical to {twin.__name__} at the same tiles",
                      torch.equal(got, twin(h, weight, allowed, tiles=t)), params=params)
            row = timed(SERIES, lambda w, knobs=knobs, t=t: changes(h, w, allowed, **knobs, tiles=t, out=out),
                        n * row_bytes, params, **extra)
            if all(not v for v in knobs.values()) and t == step04_tiles(n):
                anchors.append((rows[S4], row))
            if all(knobs.values()) and tiles_name == "step05":  # step 5's tiles (block_d it does not read)
                anchors.append((rows[S5], row))
        copies.release()
    for anchor, twin in anchors:
        lo_a, _, hi_a = anchor["spread_ms"]
        lo_t, _, hi_t = twin["spread_ms"]
        overlap = lo_a <= hi_t and lo_t <= hi_a
        text = (f"anchor {anchor['series']} at {anchor['params']['allowed']:,} allowed: {anchor['ms'] * 1e3:.2f} µs "
                f"[{lo_a * 1e3:.2f}, {hi_a * 1e3:.2f}], its twin ({twin['params']['variant']}, "
                f"{twin['params']['tiles']}'s tiles) {twin['ms'] * 1e3:.2f} µs [{lo_t * 1e3:.2f}, {hi_t * 1e3:.2f}]: "
                f"{'spreads overlap' if overlap else 'spreads do NOT overlap'} "
                f"(ratio {twin['ms'] / anchor['ms']:.3f})")
        run.note(text)
        print(text, flush=True)

    measure_plan(run, weight, h, allowed_of, checked, copies)

    out_path = paths.lab_results("masked_lm_head", gpu_slug(run.device["name"])) / f"{SERIES}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(run.to_json(), indent=1) + "\n")
    bad = [c for c in run.checks if not c["passed"]]
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out_path}")
    return out_path


def measure_plan(run, weight: torch.Tensor, h: torch.Tensor, allowed_of: dict, checked, copies: HeadCopies) -> None:
    """The plan's step from the bitmask at batch 1, part by part (series :data:`PLAN_SERIES`, params ``part``); the
    parts that read the head rotate over ``copies`` of it, one plan per copy."""
    dev = weight.device
    vocab, hidden = weight.shape
    rule = dispatch_rule()
    plan = MaskedHeadPlan(weight, 1, rule=rule)
    plan.h.copy_(h)
    words = plan.bitmask.shape[1]
    union_constexprs = {"BLOCK_W": UNION_BLOCK_W, "BLOCK_B": min(UNION_BLOCK_B, triton.next_power_of_2(1)),
                        "num_warps": 4}
    union_grid = (triton.cdiv(words, UNION_BLOCK_W),)
    run.note(f"{PLAN_SERIES}: MaskedHeadPlan's step from the packed bitmask at batch 1, part by part (params part): "
             "whole = the bitmask's host-to-device copy (pinned, non_blocking) then plan.launch, as the chapter's "
             "benchmark times plan_bitmask; launch = plan.launch alone (count zeroed, union kernel, row kernel); "
             "copy = the copy alone; union_build = the count zeroed, then union_ids_kernel, as the plan launches "
             "them; count_zero = the zeroing alone; union_kernel = union_ids_kernel alone; row_kernel = the plan's "
             "row kernel (stream_count_kernel) alone, on a union built before; step09 = step09_dispatch on "
             "precomputed AllowedTokens, the kernel the page subtracts from the whole step. Every part is captured "
             "in the CUDA graph of the GPU clock. whole, launch, row_kernel and step09 read the head: they rotate "
             "over its copies (one MaskedHeadPlan per copy, h shared); copy, union_build, count_zero and "
             "union_kernel read no weight and run on one plan (copies=1).")

    def union_kernel(ids: torch.Tensor, count: torch.Tensor, bitmask: torch.Tensor = plan.bitmask) -> None:
        union_ids_kernel[union_grid](bitmask, ids, count, 1, vocab, words, bitmask.stride(0), **union_constexprs)

    for count in PLAN_COUNTS:
        allowed = allowed_of[count]
        n = allowed.union_count
        path, capacity = bucket = plan.bucket(n)
        host_bitmask = pack_bitmask(allowed.mask.cpu()).pin_memory()
        base = {"batch": 1, "kind": "random", "allowed": count, "layout": "vd"}
        extra = {"union": n, "bucket": f"{path} {capacity}"}
        if path != "stream":
            raise RuntimeError(f"at {count} allowed the plan takes bucket {bucket}, not the stream bucket the "
                               "parts below rebuild")
        t = stream_tiles(capacity)
        n_fill = triton.cdiv(vocab, t.fill_block)
        row_constexprs = launch_constexprs("stream", t, hidden, weight.dtype)

        def copy(p: MaskedHeadPlan = plan):
            p.bitmask.copy_(host_bitmask, non_blocking=True)

        def union_build(p: MaskedHeadPlan = plan):
            p.count.zero_()
            union_kernel(p.ids, p.count, p.bitmask)

        def row_kernel(p: MaskedHeadPlan = plan):
            stream_count_kernel[(n_fill + triton.cdiv(capacity, t.block_v),)](
                p.h, p.weight, p.out, p.bitmask, p.ids, p.count, vocab, n_fill, p.weight.stride(0), **row_constexprs)

        def whole(p: MaskedHeadPlan = plan):
            copy(p)
            return p.launch(n)

        read = n * hidden * weight.element_size()  # the union's rows
        n_copies, capped = copies.count(weight, read)

        def on_plans(fn, ready=None):
            """Calls of ``fn(p)`` over one plan per copy of the head, the plan first (h shared; ``ready(p)`` run
            on each before the calls)."""
            def make_calls():
                held = copies.of(weight, n_copies)
                plans = [plan] + [MaskedHeadPlan(w, 1, h=plan.h, rule=rule) for w in held[1:]]
                for p in plans if ready else ():
                    ready(p)
                return [functools.partial(fn, p) for p in plans]
            return make_calls

        def built(p: MaskedHeadPlan):  # the union the row kernel reads, in the plan's own buffers
            copy(p)
            union_build(p)

        # the whole step on a poisoned output, against float64; the parts rebuilt here give the plan's logits
        plan.out.fill_(float("nan"))
        whole()
        checked(f"{PLAN_SERIES} whole", plan.out, allowed, base)
        expected = plan.out.clone()
        plan.out.fill_(float("nan"))
        copy()
        union_build()
        row_kernel()
        torch.cuda.synchronize()
        run.check(f"{PLAN_SERIES}: copy, union_build and row_kernel give the plan's logits bit for bit",
                  torch.equal(plan.out, expected), params=base)
        run.check(f"{PLAN_SERIES}: the union build counts the union", int(plan.count) == n, params=base,
                  count=int(plan.count), union=n)

        out = torch.empty(1, vocab, device=dev)
        scratch: list[tuple[torch.Tensor, torch.Tensor]] = []

        def union_alone():
            """union_ids_kernel alone: its count is never zeroed, so each call appends its ids after the last
            call's; a fresh count and an id buffer with room for every call of a repetition (graph_time runs a
            sequence once before its capture, once after, then REPS times: MIN_CALLS calls each, plus one call
            first), four times over."""
            room = vocab + 64 + 4 * n * (1 + MIN_CALLS * (REPS + 2))
            ids = torch.zeros(room, dtype=torch.int32, device=dev)
            count_buf = torch.zeros(1, dtype=torch.int32, device=dev)
            scratch.append((ids, count_buf))
            return [lambda: union_kernel(ids, count_buf)]

        def step09(w: torch.Tensor) -> torch.Tensor:
            return step09_dispatch(h, w, allowed, out=out)

        rotated = {"copies": n_copies, "read_bytes": read, "rotation_capped": capped}
        alone = {"copies": 1, "read_bytes": 0, "rotation_capped": False}
        parts = [("whole", on_plans(whole), rotated), ("launch", on_plans(lambda p: p.launch(n)), rotated),
                 ("copy", lambda: [copy], alone), ("union_build", lambda: [union_build], alone),
                 ("count_zero", lambda: [plan.count.zero_], alone), ("union_kernel", union_alone, alone),
                 ("row_kernel", on_plans(row_kernel, built), rotated),
                 ("step09", lambda: [functools.partial(step09, w) for w in copies.of(weight, n_copies)], rotated)]
        for part, make_calls, rotation in parts:
            print(f"{count:,} allowed: plan part {part}", flush=True)
            params = base | {"part": part}
            try:
                run.measure(PLAN_SERIES, make_calls, params=params, min_calls=MIN_CALLS, reps=REPS, **extra,
                            **rotation)
            except RuntimeError as exc:  # a part a CUDA graph cannot capture: the harness's host clock instead
                torch.cuda.synchronize()
                calls = make_calls()
                run.record(PLAN_SERIES, run.host_time(lambda: [c() for c in calls]), params=params, **extra,
                           **rotation, note=f"not capturable in a CUDA graph ({type(exc).__name__}: {exc}); host "
                                            "time per call (BenchRun.host_time), not GPU time")
        for ids, count_buf in scratch:
            got = int(count_buf)
            run.check(f"{PLAN_SERIES} union_kernel stayed inside its id buffer",
                      got % max(n, 1) == 0 and got <= ids.numel(), params=base, count=got,
                      room=ids.numel())
        # the whole step once more: the parts left the plan's buffers as a step does
        plan.out.fill_(float("nan"))
        whole()
        torch.cuda.synchronize()
        run.check(f"{PLAN_SERIES} whole, after the parts", torch.equal(plan.out, expected), params=base)
        copies.release()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("check", "measure", "ptx"))
    parser.add_argument("--seed", type=int, default=None, help="check: the inputs' seed (default: a fresh one)")
    args = parser.parse_args(argv)
    if args.what == "check":
        return 1 if check(args.seed) else 0
    if args.what == "ptx":
        return ptx()
    if runtime.mode() != "gpu":
        sys.exit("measure needs a CUDA GPU (here Triton runs in its interpreter)")
    measure()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
