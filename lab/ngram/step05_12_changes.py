"""Chapter 3: a change tried on step 5 and not kept (5b), and two changes taken back from step 12, each timed alone.

* ``5b``: an early exit added to step 5 (``step05_one_pass``): the block stops once no later window can beat the
  slot's best key, which every thread must see: two barriers a tile. ``variants/step05_exit.cu`` is a frozen copy
  of step 5's kernel with a knob for it, ``one_pass_search<EARLY_EXIT>``; at ``false`` (variant ``5``) it is the
  library's ``ngram_search_one_pass``, the same PTX, names aside. Phase 2 is the library's ``ngram_budget_scan``.
* Step 12 (``step12_skip_refused``) without the early exit it inherits (``12 no exit``: no per-tile read of the
  slot's key), without its fused phase 2 (``12 unfused``: phase 2 a second launch, ``budget_scan_reset``, as in
  step 6), or without both (``12 neither``): ``variants/step12_changes.cu``, a frozen copy of ``ngram_stream.cu``
  with a knob for each, ``stream_changes<LOADS, VEC, SKIP_LAZY, CACHE_EVICT_FIRST, EXIT, FUSED>``; at
  ``true, true`` (variant ``12``) it is the library's ``ngram_stream<4, VEC, true, true>``, the same PTX.

Each launch takes the arguments, grid, split and scratch of the library's step bound to the same batch
(``NgramMatcher(step05_one_pass | step12_skip_refused, ...)``), so every variant is bit-identical to it.

    PYTHONPATH=$PWD python lab/ngram/step05_12_changes.py check --compile-only   # CPU: NVRTC, spills, the PTX
    PYTHONPATH=$PWD python lab/ngram/step05_12_changes.py check                  # GPU: bit-identical
    PYTHONPATH=$PWD python lab/ngram/step05_12_changes.py measure --step 5       # GPU: 5 and 5b, as JSON
    PYTHONPATH=$PWD python lab/ngram/step05_12_changes.py measure --step 12      # GPU: step 12's take-backs

``measure`` times the variants beside the library's steps (the anchors: steps 4 and 5, or 8 and 12) at the table of
steps' three cases (``book.ngram.lesson.BOEHM_CASES``) as the chapter's benchmark times a step
(``studylog.ngram.report``): the benchmark's batch, the GPU clock (CUDA-graph replay over rotated copies of the
batch, three repetitions), fewer calls a replay when a call is slow, and the host time per eager call; every row
checked bit-identical to the CPU path before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import re
import sys
import time
from pathlib import Path

import torch

from book.ngram.lesson import BOEHM_CASES as CASES
from studylog import cuda, ngram, paths, runtime
from studylog.ngram import SCAN_THREADS, NgramConfig, NgramInputs, NgramMatcher
from studylog.ngram.kernels import SIGNATURE, STREAM_INSTANCES, THREADS
from studylog.ngram.report import BENCH_GRID, GRAPH_BUDGET_MS, MAX_COPIES, SLOW_CALL_MS, gen_width_for

SOURCE5 = Path(__file__).resolve().parent / "variants" / "step05_exit.cu"
SOURCE12 = Path(__file__).resolve().parent / "variants" / "step12_changes.cu"
#: Variant -> its search kernel, its phase 2 ((source, kernel), or None: fused), the library step that binds it.
VARIANTS = {
    "5": ("one_pass_search<false>", ("ngram_two_phase", "ngram_budget_scan"), ngram.step05_one_pass),
    "5b": ("one_pass_search<true>", ("ngram_two_phase", "ngram_budget_scan"), ngram.step05_one_pass),
    "12": ("stream_changes<4, {vec}, 2, 2, true, true>", None, ngram.step12_skip_refused),
    "12 unfused": ("stream_changes<4, {vec}, 2, 2, true, false>", (SOURCE12, "budget_scan_reset"),
                   ngram.step12_skip_refused),
    "12 no exit": ("stream_changes<4, {vec}, 2, 2, false, true>", None, ngram.step12_skip_refused),
    "12 neither": ("stream_changes<4, {vec}, 2, 2, false, false>", (SOURCE12, "budget_scan_reset"),
                   ngram.step12_skip_refused),
}
CHANGES = {"5": "step 4 + one pass for every n: step 5 (frozen copy)",
           "5b": "step 5 + the early exit behind two barriers a tile (5b, not kept)",
           "12": "step 12 (frozen copy)", "12 unfused": "step 12, phase 2 launched apart",
           "12 no exit": "step 12, no per-tile read of the slot's key (no early exit)",
           "12 neither": "step 12, no early exit and phase 2 launched apart"}
KNOBS = {"5": {"early_exit": False}, "5b": {"early_exit": True}, "12": {"early_exit": True, "fused": True},
         "12 unfused": {"early_exit": True, "fused": False}, "12 no exit": {"early_exit": False, "fused": True},
         "12 neither": {"early_exit": False, "fused": False}}
#: ``measure --step N``: the variants, the library's steps timed beside them (the anchors), the file and series.
RUNS = {5: (("5", "5b"), (4, 5), "step05_changes"), 12: (("12", "12 unfused", "12 no exit", "12 neither"), (8, 12),
                                                        "step12_changes")}
INSTANCES5 = tuple(VARIANTS[v][0] for v in RUNS[5][0])
INSTANCES12 = tuple(VARIANTS[v][0].format(vec=vec) for v in RUNS[12][0] for vec in (2, 1))
#: The instances at the library's setting, and the library kernel each must compile to.
LIBRARY_TWINS = {"one_pass_search<false>": ("ngram_one_pass", "ngram_search_one_pass"),
                 **{VARIANTS["12"][0].format(vec=vec): ("ngram_stream", f"ngram_stream<4, {vec}, true, true>")
                    for vec in (2, 1)}}


@functools.lru_cache(maxsize=None)
def kernel(source, name: str, device: int) -> cuda.CudaKernel:
    names = {SOURCE5: INSTANCES5, SOURCE12: INSTANCES12, "ngram_stream": STREAM_INSTANCES}.get(source, ())
    module = cuda.load(source, name_expressions=names, device=device)
    return module.kernel(name, SIGNATURE)


def bind(variant: str, inputs: NgramInputs, draft, this_time, config: NgramConfig):
    """(matcher, launches): the library step bound to the batch (arguments, scratch, split), and the variant's
    launches on it in order (the search, then phase 2 unless fused)."""
    search, phase2, step = VARIANTS[variant]
    m = NgramMatcher(step, inputs, draft, this_time, config=config, check_values=False)
    dev = torch.cuda.current_device()
    grid = (m.batch,) if step is ngram.step05_one_pass else (m.batch, m.prompt_chunks + m.gen_chunks)
    k = kernel(SOURCE5 if step is ngram.step05_one_pass else SOURCE12, search.format(vec=m.vec), dev)
    launches = [lambda: k(grid, (THREADS,), *m.args)]
    if phase2 is not None:
        p2 = kernel(*phase2, dev)
        launches.append(lambda: p2((1,), (SCAN_THREADS,), *m.args))
    return m, launches


def run_all(launches) -> None:
    for launch in launches:
        launch()


# ---------------------------------------------------------------------------------------------
# check --compile-only (CPU): NVRTC, spills, the library's PTX
# ---------------------------------------------------------------------------------------------

def code(compiled: cuda.CompiledSource, entry: str) -> tuple[list[str], list[str]]:
    """One kernel's PTX, names aside: (its instructions, its shared variables' declarations, sorted). Kernel
    and local names become placeholders, block labels are numbered per module in PTX (renumbered here), and a
    shared variable two kernels use is declared once for the module, not in either: declarations are compared
    as a set."""
    lowered = compiled.lowered_names.get(entry, entry)
    body = compiled.ptx_function(entry)

    def plain(text: str) -> str:
        text = re.sub(r"_ZZ\w*E\d+([A-Za-z_]\w*)", r"<local \1>", text)
        return re.sub(r"\$L__BB\d+_", "$L__BB_", text.replace(lowered, "<kernel>"))

    skip = re.compile(r"\s*(\.shared\b|// demoted variable|\.(file|loc)\b)")
    lines = [plain(s) for s in body.splitlines() if not skip.match(s)]
    shared = sorted({plain(d.strip()) for name in set(re.findall(r"_ZZ\w+", body))
                     for d in re.findall(r"^\s*\.shared[^;\n]*\b" + name + r"\b[^;\n]*;", compiled.ptx, re.M)})
    return lines, shared


def compile_check() -> int:
    """Every instance compiles for sm_90 without spills; at the library's setting, to the library's PTX."""
    failures = 0
    if not set(CASES) <= set(BENCH_GRID):
        failures += 1
        print(f"FAIL the table's cases {CASES} are not all benchmark cases")
    start = time.perf_counter()
    library = {"ngram_one_pass": cuda.compile_source("ngram_one_pass", arch="sm_90"),
               "ngram_stream": cuda.compile_source("ngram_stream", arch="sm_90", name_expressions=STREAM_INSTANCES)}
    for source, exprs in ((SOURCE5, INSTANCES5), (SOURCE12, INSTANCES12 + ("budget_scan_reset",))):
        ours = cuda.compile_source(source, arch="sm_90", name_expressions=[e for e in exprs if "<" in e])
        report = ours.ptxas_report()
        for expr in exprs:
            r = report.get(ours.lowered_names.get(expr, expr), {})
            ok = r.get("spill_stores", -1) == 0 and r.get("spill_loads", -1) == 0
            line = f"  {expr:44s} {r.get('registers')} registers, {'no spills' if ok else f'SPILLS {r}'}"
            if expr in LIBRARY_TWINS:
                lib_source, twin = LIBRARY_TWINS[expr]
                same = code(ours, expr) == code(library[lib_source], twin)
                line += f"; PTX {'the same as' if same else 'DIFFERS from'} the library's {twin}, names aside"
                ok &= same
            failures += not ok
            print(line)
    print(f"compiled in {time.perf_counter() - start:.0f} s; compile-only: {failures} failures")
    return failures


# ---------------------------------------------------------------------------------------------
# check (GPU): every variant bit-identical to the library's step and to the reference
# ---------------------------------------------------------------------------------------------

def check_batch(inputs, draft, this_time, config, expected) -> int:
    """Each variant, called twice (the state written back between, as a serving loop does): drafts and counts equal
    ``expected`` and the library step's; step 5's variants leave the library step 5's keys; step 12's leave the keys
    reset and no ticket."""
    library = {}
    for step in (ngram.step05_one_pass, ngram.step12_skip_refused):
        d, t = draft.clone(), this_time.clone()
        m = NgramMatcher(step, inputs, d, t, config=config, check_values=False)
        m()
        library[step] = (d, t, m.match_keys.clone())
    failures = 0
    for variant, (_, _, step) in VARIANTS.items():
        d, t = draft.clone(), this_time.clone()
        m, launches = bind(variant, inputs, d, t, config)
        for _ in range(2):
            d.copy_(draft), t.copy_(this_time)
            run_all(launches)
            torch.cuda.synchronize()
            ok = ngram.same_state((d, t), expected) and ngram.same_state((d, t), library[step][:2])
            if step is ngram.step05_one_pass:
                ok &= torch.equal(m.match_keys, library[step][2])
            else:
                ok &= bool((m.match_keys == -1).all()) and int(m.blocks_done) == 0
            if not ok:
                failures += 1
                print("MISMATCH", variant, inputs.prompt_ids.shape, config)
    return failures


def check() -> int:
    failures = compile_check()
    if runtime.mode() != "gpu":
        print("no GPU: only compiled (run `check` on a GPU for the bit-identity checks)")
        return failures
    cases = 0
    for seed in range(50):  # random batches: small vocabularies, decoys, high ids, hybrid, any budget; the last
        r = random.Random(seed)  # ten wide enough for several blocks a haystack
        b, width = (r.randint(1, 40), 300) if seed < 40 else (r.randint(1, 8), 6000)
        pw, gw = r.randint(1, width), r.randint(1, width // 2 + 2)
        hybrid = r.random() < 0.3
        inputs, draft, this_time = ngram.make_batch(
            b, pw, gw, kinds=[r.choice(ngram.batches.SLOT_KINDS) for _ in range(b)], draft_width=r.randint(2, 9),
            vocab=r.choice([2, 3, 5, 50]), id_base=r.choice([0, 1 << 40]), decoys=r.random() < 0.5,
            capped_fraction=0.3, hybrid=hybrid, seed=seed)
        dw = draft.shape[1]
        max_n = r.randint(1, 4)
        config = NgramConfig(max_n, r.randint(1, max_n), r.choice([0, 1, 2, 3, 5, 8, 13, 21, 40, 1 << 30]), hybrid,
                             r.randint(dw // 2, dw - 1) if hybrid else 10)
        expected = ngram.reference_ngram_match(inputs, draft, this_time, config) if seed < 40 else \
            _cpu_path(inputs, draft, this_time, config)
        failures += check_batch(inputs.to("cuda"), draft.cuda(), this_time.cuda(), config, expected)
        cases += 1
    for threshold in (1 << 30, 6000, 900):  # more slots than phase 2's block: the budget bites in a later chunk
        inputs, draft, this_time = ngram.make_batch(2500, 64, 32, vocab=4, seed=threshold)
        config = NgramConfig(threshold=threshold)
        failures += check_batch(inputs.to("cuda"), draft.cuda(), this_time.cuda(), config,
                                _cpu_path(inputs, draft, this_time, config))
        cases += 1
    for threshold in (128, 1500, 1 << 30):  # benchmark-sized, decoys and high ids
        inputs, draft, this_time = ngram.make_batch(128, 4096, 512, decoys=True, id_base=1 << 40, seed=threshold,
                                                    device="cuda")
        config = NgramConfig(threshold=threshold)
        failures += check_batch(inputs, draft, this_time, config, _cpu_path(inputs, draft, this_time, config))
        cases += 1
    print(f"{len(VARIANTS)} variants on {cases} batches, each called twice: {failures} failures")
    return failures


def _cpu_path(inputs, draft, this_time, config):
    expected = (draft.cpu(), this_time.cpu())
    ngram.cpu_path.cpu_path_inplace(inputs.to("cpu"), *expected, config)
    return expected


# ---------------------------------------------------------------------------------------------
# measure (GPU)
# ---------------------------------------------------------------------------------------------

def measure(step: int) -> Path:
    """Time the variants of ``RUNS[step]`` with the library's steps beside them (the anchors)."""
    from studylog.bench import BenchRun, gpu_slug, write_lab_output

    run = BenchRun("ngram", command=" ".join(["python", *sys.argv]))
    variants, anchor_numbers, name = RUNS[step]
    anchors = [ngram.CHAPTER.step(n) for n in anchor_numbers]
    run.note(f"Series {name}: variants of a frozen copy of step {step}'s kernel (params variant, change, early_exit "
             "or fused, launches, chunk_len): " + "; ".join(f"{v} = {CHANGES[v]}" for v in variants) + ". "
             f"{', '.join(s.series for s in anchors)} are the library's steps, timed in the same run as anchors.")
    run.note("Inputs and clock as the chapter's benchmark (studylog.ngram.report): make_batch(batch, seq_len, "
             "gen_width_for(seq_len), seed=1000 + batch + seq_len); each call graph-replayed over rotated copies of "
             f"the batch (at least four times the L2, at most {MAX_COPIES}), three repetitions, 60 calls a graph "
             f"and 15 replays; a call slower than {SLOW_CALL_MS} ms gets about {GRAPH_BUDGET_MS:.0f} ms of work a "
             "replay (graph_calls) and 5 replays. Beside it host_ms, the host time per eager call (the launches "
             "back to back, no sync; a variant's launches go straight to its kernels, the anchors through the "
             "library's matcher). Each row is checked bit-identical to the CPU path before timing and after the "
             "replays.")
    for batch, seq_len, threshold in run.progress(CASES, "cases"):
        config = NgramConfig(threshold=threshold)
        inputs, draft0, this0 = ngram.make_batch(batch, seq_len, gen_width_for(seq_len),
                                                 kinds=["short"] if batch == 1 else None,
                                                 seed=1000 + batch + seq_len, device="cuda")
        base = {"batch": batch, "seq_len": seq_len, "threshold": threshold}
        floor = run.floor_ms(ngram.batches.haystack_bytes(inputs, this0, config))
        expected = _cpu_path(inputs, draft0, this0, config)
        nbytes = (inputs.prompt_ids.numel() + inputs.generated_ids.numel()) * 8
        twins = {}
        todo = [(s.series, s.function, None) for s in anchors] + [(name, None, v) for v in variants]
        for series, function, variant in todo:
            def make(batch_inputs, function=function, variant=variant):
                state = (draft0.clone(), this0.clone())
                if variant is None:
                    m = NgramMatcher(function, batch_inputs, *state, config=config, check_values=False)
                    return m, m
                m, launches = bind(variant, batch_inputs, *state, config)
                return m, functools.partial(run_all, launches)

            m, call = make(inputs)
            call()  # untimed: compiles and loads the kernels
            torch.cuda.synchronize()
            m.draft_tokens.copy_(draft0), m.seq_lens_this_time.copy_(this0)
            t0 = time.perf_counter()
            call()
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - t0) * 1e3
            params = base | ({"step": function.__name__} if variant is None else
                             {"variant": variant, "change": CHANGES[variant], **KNOBS[variant],
                              "launches": 1 + (VARIANTS[variant][1] is not None)}
                             | ({"chunk_len": m.chunk_len} if step == 12 else {}))
            state = (m.draft_tokens, m.seq_lens_this_time)
            run.check("bit-identical to the CPU path", ngram.same_state(state, expected), params=params)
            slow = first_ms > SLOW_CALL_MS
            per_replay = max(1, int(GRAPH_BUDGET_MS / first_ms)) if slow else None
            copies = max(1, min(run.rotation(nbytes), per_replay or MAX_COPIES))
            made = []

            def make_calls(make=make, copies=copies, made=made):
                batches = [inputs] + [NgramInputs(**{f.name: getattr(inputs, f.name).clone()
                                                     for f in dataclasses.fields(inputs)}) for _ in range(copies - 1)]
                made[:] = [make(c) for c in batches]
                return [call for _, call in made]

            timing = run.gpu_time(make_calls, min_calls=per_replay or 60, reps=5 if slow else 15)
            # host time per eager call (back to back, no sync): what a launch more or fewer costs a loop
            host = run.host_time(call, calls=max(3, min(per_replay or 200, 200)), repeats=3)
            row = run.record(series, timing, params=base if variant is None else params, floor_ms=floor, host=host,
                             rotated_copies=copies, **({"graph_calls": per_replay} if slow else {}))
            torch.cuda.synchronize()
            run.check("bit-identical after graph replays", all(
                ngram.same_state((x.draft_tokens, x.seq_lens_this_time), expected) for x, _ in (made[0], made[-1])),
                params=params)
            twins[variant or function.__name__] = row
            made.clear()  # the copies and their matchers go before the next row
        anchor, frozen = (ngram.step05_one_pass.__name__, "5") if step == 5 else \
            (ngram.step12_skip_refused.__name__, "12")
        a, f = twins[anchor], twins[frozen]
        overlap = a["spread_ms"][0] <= f["spread_ms"][2] and f["spread_ms"][0] <= a["spread_ms"][2]
        run.note(f"{batch}x{seq_len} threshold {threshold}: {anchor} {a['ms'] * 1e3:.2f} µs, its frozen copy "
                 f"(variant {frozen}) {f['ms'] * 1e3:.2f} µs: spreads {'overlap' if overlap else 'do NOT overlap'}")
        del inputs, draft0, this0
        torch.cuda.empty_cache()
    data = run.to_json()
    out = paths.lab_results("ngram", gpu_slug(run.device["name"])) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    if os.environ.get("OUT"):
        write_lab_output(Path(os.environ["OUT"]), run.device["name"], name, data)
    bad = [c for c in run.checks if not c["passed"]]
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out}")
    for note in run.notes[2:]:
        print(note)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("check", "measure"))
    parser.add_argument("--compile-only", action="store_true", help="check: NVRTC, spills and PTX only (no GPU)")
    parser.add_argument("--step", type=int, choices=sorted(RUNS), default=5,
                        help="measure: 5 and 5b (5, the default), or step 12's take-backs (12)")
    args = parser.parse_args()
    if args.what == "check":
        sys.exit(1 if (compile_check() if args.compile_only else check()) else 0)
    if args.compile_only:
        parser.error("--compile-only goes with check")
    measure(args.step)
