"""Chapter 3: step 9's two ideas, each timed alone: 9a drops step 8's barriers, 9b streams (step 9's layout).

* ``9a``: step 8 (``step08_one_pass_fused``) without the two barriers a tile: each thread keeps its own best key,
  publishes it with a global ``atomicMin`` when it improves and reads the slot's key with each tile to stop on its
  own; the pattern is read from the generated tokens (a shared copy needs a barrier). ``variants/step09_parts.cu``
  is a frozen copy of step 8's kernel with a knob for it, ``fused_parts<BARRIERS>``; at ``true`` (variant ``8``) it
  is the library's ``ngram_one_pass_fused``, the same PTX, names aside. It runs at step 8's split (its arguments).
* ``9b``: step 9 (``step09_stream``) itself over 9a: its streaming layout, fewer and longer chunks (about four
  blocks an SM, at least two tiles each: ``stream_chunk_len``) whose loads are issued apart from their compares.
  Two more rows cut 9b in two: ``9a long`` (9a at step 9's split: the split alone) and ``9 short`` (the library's
  step 9 at step 8's split: the code alone).

Each launch takes the arguments, grid, split and scratch of a library step bound to the same batch (``NgramMatcher``:
step 8 for ``8`` and ``9a``, step 9 for ``9a long`` and ``9 short``, the latter with ``chunk_len`` at step 8's), so
every variant is bit-identical to steps 8 and 9.

    PYTHONPATH=$PWD python lab/ngram/step09_parts.py check --compile-only   # CPU: NVRTC, spills, the PTX
    PYTHONPATH=$PWD python lab/ngram/step09_parts.py check                  # GPU: bit-identical
    PYTHONPATH=$PWD python lab/ngram/step09_parts.py measure                # GPU: the sub-steps, as JSON

``measure`` times the variants beside the library's steps 8 and 9 (the anchors) at the table of steps' cases
(``book.ngram.lesson.BOEHM_CASES`` and ``RESULT_CASE``) as the chapter's benchmark times a step
(``studylog.ngram.report``), and writes
``results/<gpu>/step09_parts.json`` (series ``step09_parts``; and under ``$OUT/<gpu>/`` when ``$OUT`` is set).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

from book.ngram.lesson import BOEHM_CASES, RESULT_CASE
from studylog import cuda, ngram, paths, runtime
from studylog.ngram import NgramConfig, NgramInputs, NgramMatcher
from studylog.ngram.kernels import SIGNATURE, STREAM_INSTANCES, THREADS, fused_chunk_len
from studylog.ngram.report import BENCH_GRID, GRAPH_BUDGET_MS, MAX_COPIES, SLOW_CALL_MS, gen_width_for

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "variants" / "step09_parts.cu"
NAME = "step09_parts"
#: The table of steps' cases: the lab's three (``BOEHM_CASES``) and the stress case the table shows beside them.
CASES = (*BOEHM_CASES, RESULT_CASE)
#: Variant -> its kernel ((source, name expression)), the library step whose binding it launches on, and whether
#: that binding takes step 8's split (``chunk_len`` of step 9 set to step 8's).
VARIANTS = {
    "8": ((SOURCE, "fused_parts<true>"), ngram.step08_one_pass_fused, False),
    "9a": ((SOURCE, "fused_parts<false>"), ngram.step08_one_pass_fused, False),
    "9a long": ((SOURCE, "fused_parts<false>"), ngram.step09_stream, False),
    "9 short": (("ngram_stream", "ngram_stream<4, 1, false, false>"), ngram.step09_stream, True),
}
CHANGES = {"8": "step 8 (frozen copy)",
           "9a": "step 8 without its barriers: each thread publishes its own key and stops on its own (9a)",
           "9a long": "9a at step 9's split (longer chunks)",
           "9 short": "step 9's kernel at step 8's split"}
KNOBS = {"8": {"barriers": True, "split": "step 8"}, "9a": {"barriers": False, "split": "step 8"},
         "9a long": {"barriers": False, "split": "step 9"}, "9 short": {"barriers": False, "split": "step 8"}}
ANCHORS = (8, 9)
INSTANCES = ("fused_parts<true>", "fused_parts<false>")
#: The instance at the library's setting, and the library kernel it must compile to.
LIBRARY_TWINS = {"fused_parts<true>": ("ngram_one_pass", "ngram_one_pass_fused")}


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


code = _sibling("step05_12_changes").code  # one kernel's PTX, names aside


@functools.lru_cache(maxsize=None)
def kernel(source, name: str, device: int) -> cuda.CudaKernel:
    names = INSTANCES if source == SOURCE else STREAM_INSTANCES
    return cuda.load(source, name_expressions=names, device=device).kernel(name, SIGNATURE)


def bind(variant: str, inputs: NgramInputs, draft, this_time, config: NgramConfig):
    """(matcher, launch): the library step bound to the batch (arguments, scratch, split), and the variant's one
    launch on it."""
    (source, name), step, short = VARIANTS[variant]
    chunk_len = fused_chunk_len(inputs.batch, inputs.prompt_ids.shape[1], inputs.generated_ids.shape[1]) \
        if short else None
    m = NgramMatcher(step, inputs, draft, this_time, config=config, check_values=False,
                     **({"chunk_len": chunk_len} if short else {}))
    k = kernel(source, name, torch.cuda.current_device())
    return m, lambda: k(m.grid, (THREADS,), *m.args)


# ---------------------------------------------------------------------------------------------
# check --compile-only (CPU): NVRTC, spills, the library's PTX
# ---------------------------------------------------------------------------------------------

def compile_check() -> int:
    """Both instances compile for sm_90 without spills; at the library's setting, to the library's PTX."""
    failures = 0
    if not set(CASES) <= set(BENCH_GRID):
        failures += 1
        print(f"FAIL the table's cases {CASES} are not all benchmark cases")
    start = time.perf_counter()
    library = {"ngram_one_pass": cuda.compile_source("ngram_one_pass", arch="sm_90")}
    ours = cuda.compile_source(SOURCE, arch="sm_90", name_expressions=INSTANCES)
    report = ours.ptxas_report()
    for expr in INSTANCES:
        r = report.get(ours.lowered_names.get(expr, expr), {})
        ok = r.get("spill_stores", -1) == 0 and r.get("spill_loads", -1) == 0
        line = f"  {expr:24s} {r.get('registers')} registers, {'no spills' if ok else f'SPILLS {r}'}"
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
# check (GPU): every variant bit-identical to the library's steps 8 and 9 and to the reference
# ---------------------------------------------------------------------------------------------

def check_batch(inputs, draft, this_time, config, expected) -> int:
    """Each variant, called twice (the state written back between, as a serving loop does): drafts and counts equal
    ``expected`` and those of the library's steps 8 and 9 on the same batch; the keys are left reset, no ticket."""
    library = []
    for step in (ngram.step08_one_pass_fused, ngram.step09_stream):
        d, t = draft.clone(), this_time.clone()
        NgramMatcher(step, inputs, d, t, config=config, check_values=False)()
        library.append((d, t))
    failures = 0
    for variant in VARIANTS:
        d, t = draft.clone(), this_time.clone()
        m, launch = bind(variant, inputs, d, t, config)
        for _ in range(2):
            d.copy_(draft), t.copy_(this_time)
            launch()
            torch.cuda.synchronize()
            ok = ngram.same_state((d, t), expected) and all(ngram.same_state((d, t), s) for s in library)
            ok &= bool((m.match_keys == -1).all()) and int(m.blocks_done) == 0
            if not ok:
                failures += 1
                print("MISMATCH", variant, tuple(inputs.prompt_ids.shape), config)
    return failures


def _cpu_path(inputs, draft, this_time, config):
    expected = (draft.cpu(), this_time.cpu())
    ngram.cpu_path.cpu_path_inplace(inputs.to("cpu"), *expected, config)
    return expected


def check() -> int:
    failures = compile_check()
    if runtime.mode() != "gpu":
        print("no GPU: only compiled (run `check` on a GPU for the bit-identity checks)")
        return failures
    cases = 0
    for seed in range(50):  # random batches: small vocabularies, decoys, high ids, hybrid, any budget; the last
        r = random.Random(seed)  # ten wide enough for several blocks a haystack
        b, width = (r.randint(1, 40), 300) if seed < 40 else (r.randint(1, 8), 20000)
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
    for batch, seq_len, threshold in CASES:  # the benchmark's batches at the table's cases
        inputs, draft, this_time = ngram.make_batch(batch, seq_len, gen_width_for(seq_len),
                                                    seed=1000 + batch + seq_len, device="cuda")
        config = NgramConfig(threshold=threshold)
        failures += check_batch(inputs, draft, this_time, config, _cpu_path(inputs, draft, this_time, config))
        cases += 1
    print(f"{len(VARIANTS)} variants on {cases} batches, each called twice: {failures} failures")
    return failures


# ---------------------------------------------------------------------------------------------
# measure (GPU)
# ---------------------------------------------------------------------------------------------

def measure() -> Path:
    """Time the variants with the library's steps 8 and 9 beside them (the anchors)."""
    from studylog.bench import BenchRun, gpu_slug, write_lab_output

    run = BenchRun("ngram", command=" ".join(["python", *sys.argv]))
    anchors = [ngram.CHAPTER.step(n) for n in ANCHORS]
    run.note(f"Series {NAME}: step 9's two ideas one at a time (params variant, change, barriers, split, chunk_len): "
             + "; ".join(f"{v} = {CHANGES[v]}" for v in VARIANTS) + ". "
             f"{', '.join(s.series for s in anchors)} are the library's steps 8 and 9, timed in the same run as "
             "anchors: 9a is variant 9a over step 8, 9b step 9 over variant 9a.")
    run.note("Inputs and clock as the chapter's benchmark (studylog.ngram.report): make_batch(batch, seq_len, "
             "gen_width_for(seq_len), seed=1000 + batch + seq_len); each call graph-replayed over rotated copies of "
             f"the batch (at least four times the L2, at most {MAX_COPIES}), three repetitions, 60 calls a graph "
             f"and 15 replays; a call slower than {SLOW_CALL_MS} ms gets about {GRAPH_BUDGET_MS:.0f} ms of work a "
             "replay (graph_calls) and 5 replays. Beside it host_ms, the host time per eager call (no sync). Each "
             "row is checked bit-identical to the CPU path before timing and after the replays.")
    for batch, seq_len, threshold in run.progress(CASES, "cases"):
        config = NgramConfig(threshold=threshold)
        inputs, draft0, this0 = ngram.make_batch(batch, seq_len, gen_width_for(seq_len),
                                                 kinds=["short"] if batch == 1 else None,
                                                 seed=1000 + batch + seq_len, device="cuda")
        base = {"batch": batch, "seq_len": seq_len, "threshold": threshold}
        floor = run.floor_ms(ngram.batches.haystack_bytes(inputs, this0, config))
        expected = _cpu_path(inputs, draft0, this0, config)
        nbytes = (inputs.prompt_ids.numel() + inputs.generated_ids.numel()) * 8
        rows = {}
        todo = [(s.series, s.function, None) for s in anchors] + [(NAME, None, v) for v in VARIANTS]
        for series, function, variant in todo:
            def make(batch_inputs, function=function, variant=variant):
                state = (draft0.clone(), this0.clone())
                if variant is None:
                    m = NgramMatcher(function, batch_inputs, *state, config=config, check_values=False)
                    return m, m
                return bind(variant, batch_inputs, *state, config)

            m, call = make(inputs)
            call()  # untimed: compiles and loads the kernels
            torch.cuda.synchronize()
            m.draft_tokens.copy_(draft0), m.seq_lens_this_time.copy_(this0)
            t0 = time.perf_counter()
            call()
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - t0) * 1e3
            params = base | ({"step": function.__name__, "chunk_len": m.chunk_len} if variant is None else
                             {"variant": variant, "change": CHANGES[variant], **KNOBS[variant],
                              "chunk_len": m.chunk_len})
            run.check("bit-identical to the CPU path",
                      ngram.same_state((m.draft_tokens, m.seq_lens_this_time), expected), params=params)
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
            host = run.host_time(call, calls=max(3, min(per_replay or 200, 200)), repeats=3)
            row = run.record(series, timing, params=params if variant else base | {"chunk_len": m.chunk_len},
                             floor_ms=floor, host=host, rotated_copies=copies,
                             **({"graph_calls": per_replay} if slow else {}))
            torch.cuda.synchronize()
            run.check("bit-identical after graph replays", all(
                ngram.same_state((x.draft_tokens, x.seq_lens_this_time), expected) for x, _ in (made[0], made[-1])),
                params=params)
            rows[variant or function.__name__] = row
            made.clear()  # the copies and their matchers go before the next row
        a, f = rows[ngram.step08_one_pass_fused.__name__], rows["8"]
        overlap = a["spread_ms"][0] <= f["spread_ms"][2] and f["spread_ms"][0] <= a["spread_ms"][2]
        s8, s9a, s9 = a["ms"], rows["9a"]["ms"], rows[ngram.step09_stream.__name__]["ms"]
        run.note(f"{batch}x{seq_len} threshold {threshold}: step 8 {s8 * 1e3:.2f} µs, its frozen copy "
                 f"{f['ms'] * 1e3:.2f} µs (spreads {'overlap' if overlap else 'do NOT overlap'}); 9a {s9a * 1e3:.2f} "
                 f"µs ({s8 / s9a:.2f}x step 8), step 9 {s9 * 1e3:.2f} µs ({s9a / s9:.2f}x 9a)")
        del inputs, draft0, this0
        torch.cuda.empty_cache()
    data = run.to_json()
    out = paths.lab_results("ngram", gpu_slug(run.device["name"])) / f"{NAME}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    if os.environ.get("OUT"):
        write_lab_output(Path(os.environ["OUT"]), run.device["name"], NAME, data)
    bad = [c for c in run.checks if not c["passed"]]
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out}")
    for note in run.notes[2:]:
        print(note)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("check", "measure"))
    parser.add_argument("--compile-only", action="store_true", help="check: NVRTC, spills and PTX only (no GPU)")
    args = parser.parse_args()
    if args.what == "check":
        sys.exit(1 if (compile_check() if args.compile_only else check()) else 0)
    if args.compile_only:
        parser.error("--compile-only goes with check")
    measure()
