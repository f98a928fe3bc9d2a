"""Chapter 3's steps 5, 6 and 7 split into the changes each bundles, one measured number each.

Step 5 (``step05_one_pass``) is 5a, one pass for every n (windows aligned by their end, a thread per end measuring
the common suffix). 5b, an early exit once no later window can beat the slot's best key, checked behind two barriers
a tile, was measured here and rejected (step 7 keeps the exit as one load a tile). Step 6 (``step06_one_pass_fused``)
bundles 6a, each slot split over a column of blocks (the best key published with a global atomicMin, blocks stopping
when they cannot beat it), and 6b, phase 2 fused into the last block to finish (a ticket) instead of a second launch.
A frozen copy of the kernels (``variants/step05_06_changes.cu``, which includes the library's ``ngram_common.cuh``)
has one compile-time knob for each of 5b and 6b, so the chain step 4 -> 5a -> 6a -> step 6 is timed one change at a
time, and 5b beside it:

* ``5a``: ``one_pass_search<false>`` (no early exit, no barrier in its loop), the library's step 5 (the same PTX as
  ``ngram_search_one_pass``, names aside), then the library's ``ngram_budget_scan``, step 5's phase 2;
* ``5``: ``one_pass_search<true>``, 5a with the early exit (rejected), then ``ngram_budget_scan``;
* ``6a``: ``one_pass_split<false>``, step 6's split search, then phase 2 in a second launch
  (``budget_scan_reset``: the library's ``budget_scan_block``, resetting the keys as step 6's last block does);
* ``6``: ``one_pass_split<true>``, the library's step 6 (the same PTX as ``ngram_one_pass_fused``), one launch.

Step 7 (``measure --step 7``, ``variants/step07_changes.cu``, a frozen copy of ``ngram_stream.cu`` with two knobs)
takes back the two changes it inherits from steps 5 and 6: ``7 no exit`` (no per-tile read of the slot's key),
``7 unfused`` (phase 2 in a second launch, ``budget_scan_reset``) and ``7 neither``; ``7a`` is step 7's first change
alone, ``ngram_stream<4, 1, 0, 0>`` of ``variants/ngram_stream_variants.cu`` (7b, 7c and 7d all taken back: 8-byte
default-policy loads, no budget skip); ``7`` is the library's step 7 (the same PTX, names aside).

Step 7's chain (``measure --step 7 --chain``) adds its four changes one at a time, each a knob of
``ngram_stream<LOADS, VEC, BUDGET_SKIP, CACHE>`` in ``variants/ngram_stream_variants.cu``: step 6 -> ``7a``
(``<4, 1, 0, 0>``: no barrier in the loop, 8-byte default-policy loads, no budget skip) -> ``7b`` (``<4, VEC, 0, 0>``:
16-byte loads where the rows allow) -> ``7c`` (``<4, VEC, 0, 2>``: the L2 evict-first hint) -> ``7d``
(``<4, VEC, 2, 2>``: refused slots skip their search, which is the library's step 7: the same PTX, names aside) ->
the library's step 7. Each link takes the library's split for its load width.

Each launch takes the arguments, grid and scratch of the library's step bound to the same batch
(``NgramMatcher(step05_one_pass | step06_one_pass_fused, ...)``), so every variant is bit-identical to it.

    PYTHONPATH=$PWD python lab/ngram/step05_06_changes.py check --compile-only  # CPU: NVRTC, spills, the PTX
    PYTHONPATH=$PWD python lab/ngram/step05_06_changes.py check                 # GPU: bit-identical
    PYTHONPATH=$PWD python lab/ngram/step05_06_changes.py measure               # GPU: the timings, as JSON
    PYTHONPATH=$PWD python lab/ngram/step05_06_changes.py measure --step 7 --chain  # GPU: step 7's chain

``measure`` times the variants and the library's steps 4, 5 and 6 (the anchors) at the table of steps' three
cases (``book.ngram.lesson.BOEHM_CASES``) as the chapter's benchmark times a step (``studylog.ngram.report``):
the benchmark's batch, the GPU clock (CUDA-graph replay over rotated copies of the batch, three repetitions),
fewer calls a replay when a call is slow; every row checked bit-identical to the CPU path before and after.
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
from studylog.ngram.kernels import SIGNATURE, STREAM_INSTANCES, STREAM_LOADS, THREADS, stream_vec
from studylog.ngram.report import BENCH_GRID, GRAPH_BUDGET_MS, MAX_COPIES, SLOW_CALL_MS, gen_width_for

SOURCE = Path(__file__).resolve().parent / "variants" / "step05_06_changes.cu"
SOURCE7 = Path(__file__).resolve().parent / "variants" / "step07_changes.cu"
#: Step 7's knobs (``stream_variants.py``): 7a alone is its instance with 7b, 7c and 7d all taken back.
STREAM_SOURCE = Path(__file__).resolve().parent / "variants" / "ngram_stream_variants.cu"
STEP7A = "ngram_stream<4, 1, 0, 0>"  # 4 loads of one token (8 bytes), no budget skip, default-policy loads
NAME = SERIES = "step05_06_changes"
#: ``measure --step 7`` writes the step-7 variants (and the anchors steps 6 and 7) to this file instead.
NAME7 = "step07_changes"
#: ``measure --step 7 --chain`` writes step 7's cumulative chain (and the anchors steps 6 and 7) to this file.
NAME_CHAIN = "step07_chain"
#: Step 7's chain: each link adds one change to the link before it (7d is the library's step 7).
CHAIN7 = ("7a", "7b", "7c", "7d")
#: Variant -> its search kernel, its phase 2 ((source, kernel), or None: fused), the library step that binds it.
VARIANTS = {
    "5a": ("one_pass_search<false>", ("ngram_two_phase", "ngram_budget_scan"), ngram.step05_one_pass),
    "5": ("one_pass_search<true>", ("ngram_two_phase", "ngram_budget_scan"), ngram.step05_one_pass),
    "6a": ("one_pass_split<false>", (SOURCE, "budget_scan_reset"), ngram.step06_one_pass_fused),
    "6": ("one_pass_split<true>", None, ngram.step06_one_pass_fused),
    "7a": (STEP7A, None, ngram.step07_stream),
    "7b": ("ngram_stream<4, {vec}, 0, 0>", None, ngram.step07_stream),
    "7c": ("ngram_stream<4, {vec}, 0, 2>", None, ngram.step07_stream),
    "7d": ("ngram_stream<4, {vec}, 2, 2>", None, ngram.step07_stream),
    "7": ("stream_changes<4, {vec}, 2, 2, true, true>", None, ngram.step07_stream),
    "7 unfused": ("stream_changes<4, {vec}, 2, 2, true, false>", (SOURCE7, "budget_scan_reset"), ngram.step07_stream),
    "7 no exit": ("stream_changes<4, {vec}, 2, 2, false, true>", None, ngram.step07_stream),
    "7 neither": ("stream_changes<4, {vec}, 2, 2, false, false>", (SOURCE7, "budget_scan_reset"),
                  ngram.step07_stream),
}
CHANGES = {"5a": "step 4 + 5a (one pass for every n, no early exit): step 5", "5": "5a + 5b (early exit, rejected)",
           "6a": "step 5 + 6a (split over blocks, phase 2 launched apart)", "6": "6a + 6b (phase 2 fused): step 6",
           "7a": "step 6 + 7a (no barrier in the loop; 8-byte default-policy loads, no budget skip)",
           "7b": "7a + 7b (16-byte loads where the rows allow)", "7c": "7b + 7c (L2 evict-first hint on the loads)",
           "7d": "7c + 7d (refused slots skip their search): step 7 (frozen copy)",
           "7": "step 7 (frozen copy)", "7 unfused": "step 7, phase 2 launched apart",
           "7 no exit": "step 7, no per-tile read of the slot's key (no early exit)",
           "7 neither": "step 7, no early exit and phase 2 launched apart"}
KNOBS = {"5a": {"early_exit": False}, "5": {"early_exit": True}, "6a": {"fused": False}, "6": {"fused": True},
         "7a": {"early_exit": True, "fused": True, "vec": 1, "cache": "ldg", "budget_skip": "off"},
         **{v: {"early_exit": True, "fused": True, "cache": cache, "budget_skip": skip}
            for v, cache, skip in (("7b", "ldg", "off"), ("7c", "evict_first", "off"), ("7d", "evict_first", "lazy"))},
         "7": {"early_exit": True, "fused": True}, "7 unfused": {"early_exit": True, "fused": False},
         "7 no exit": {"early_exit": False, "fused": True}, "7 neither": {"early_exit": False, "fused": False}}
STEP7 = tuple(v for v in VARIANTS if v.startswith("7"))
INSTANCES = tuple(search for v, (search, _, _) in VARIANTS.items() if v not in STEP7)
INSTANCES7 = tuple(VARIANTS[v][0].format(vec=vec) for v in STEP7 if v not in CHAIN7 for vec in (2, 1))
#: The chain's instances of the frozen ``ngram_stream`` (7a has one load width; the others both).
INSTANCES_CHAIN = tuple(dict.fromkeys(VARIANTS[v][0].format(vec=vec) for v in CHAIN7 for vec in (2, 1)))
#: Spills a chain instance is known to have (ptxas' report), which the compile check accepts as they are and no other:
#: at 16-byte evict-first loads without the budget skip (7c) ptxas keeps 48 registers and spills one 4-byte value,
#: stored before the tile loop and reloaded inside it (an L1 hit). It is the variant as ``stream_variants.py``
#: measured it; a different report means the frozen source or the compiler changed.
KNOWN_SPILLS = {"ngram_stream<4, 2, 0, 2>": {"stack_bytes": 8, "spill_stores": 4, "spill_loads": 4}}
#: The instances at the library's setting, and the library kernel each must compile to.
LIBRARY_TWINS = {"one_pass_search<false>": "ngram_search_one_pass", "one_pass_split<true>": "ngram_one_pass_fused",
                 **{VARIANTS[v][0].format(vec=vec): STREAM_INSTANCES[i] for v in ("7", "7d")
                    for i, vec in enumerate((2, 1))}}


@functools.lru_cache(maxsize=None)
def kernel(source, name: str, device: int) -> cuda.CudaKernel:
    names = {SOURCE: INSTANCES, SOURCE7: INSTANCES7, STREAM_SOURCE: INSTANCES_CHAIN,
             "ngram_stream": STREAM_INSTANCES}.get(source, ())
    module = cuda.load(source, name_expressions=names, device=device)
    return module.kernel(name, SIGNATURE)


def bind(variant: str, inputs: NgramInputs, draft, this_time, config: NgramConfig, chunk_tiles=None):
    """(matcher, launches): the library step bound to the batch (arguments, scratch, split), and the variant's
    launches on it in order (the search, then phase 2 unless fused)."""
    search, phase2, step = VARIANTS[variant]
    options = {"chunk_tiles": chunk_tiles} if chunk_tiles and step is ngram.step06_one_pass_fused else {}
    if step is ngram.step07_stream:
        vec = 1 if variant == "7a" else stream_vec(inputs.prompt_ids, inputs.generated_ids)
        options = {"vec": vec} | ({"chunk_len": chunk_tiles * THREADS * STREAM_LOADS * vec} if chunk_tiles else {})
    m = NgramMatcher(step, inputs, draft, this_time, config=config, check_values=False, **options)
    dev = torch.cuda.current_device()
    grid = (m.batch,) if step is ngram.step05_one_pass else (m.batch, m.prompt_chunks + m.gen_chunks)
    source = STREAM_SOURCE if variant in CHAIN7 else SOURCE7 if variant in STEP7 else SOURCE
    k = kernel(source, search.format(vec=m.vec) if variant in STEP7 else search, dev)
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
    sources = [(cuda.compile_source(SOURCE, arch="sm_90", name_expressions=INSTANCES),
                cuda.compile_source("ngram_one_pass", arch="sm_90"), INSTANCES + ("budget_scan_reset",)),
               (cuda.compile_source(SOURCE7, arch="sm_90", name_expressions=INSTANCES7),
                cuda.compile_source("ngram_stream", arch="sm_90", name_expressions=STREAM_INSTANCES),
                INSTANCES7 + ("budget_scan_reset",)),
               (cuda.compile_source(STREAM_SOURCE, arch="sm_90", name_expressions=INSTANCES_CHAIN),
                cuda.compile_source("ngram_stream", arch="sm_90", name_expressions=STREAM_INSTANCES), INSTANCES_CHAIN)]
    print(f"{len(INSTANCES) + len(INSTANCES7) + len(INSTANCES_CHAIN) + 3} kernels compiled in {time.perf_counter() - start:.0f} s")
    for ours, lib, exprs in sources:
        failures += _compare(ours, lib, exprs)
    print(f"compile-only: {failures} failures")
    return failures


def _compare(ours: cuda.CompiledSource, lib: cuda.CompiledSource, exprs) -> int:
    failures = 0
    report, lib_report = ours.ptxas_report(), lib.ptxas_report() if lib else {}
    for expr in exprs:
        r = report.get(ours.lowered_names.get(expr, expr), {})
        spills = {k: r.get(k, -1) for k in ("stack_bytes", "spill_stores", "spill_loads")}
        known = KNOWN_SPILLS.get(expr, dict.fromkeys(spills, 0))
        ok = spills == known
        twin = LIBRARY_TWINS.get(expr)
        said = "no spills" if ok and not any(known.values()) else f"the known spills {known}" if ok else f"SPILLS {r}"
        line = f"  {expr:24s} {r.get('registers')} registers, {said}"
        if twin:
            same = code(ours, expr) == code(lib, twin)
            twin_name = lib.lowered_names.get(twin, twin)
            line += f"; PTX {'the same as' if same else 'DIFFERS from'} the library's {twin} " \
                    f"({lib_report[twin_name]['registers']} registers), names aside"
            ok &= same
        failures += not ok
        print(line)
    return failures


# ---------------------------------------------------------------------------------------------
# check (GPU): every variant bit-identical to the library's step and to the reference
# ---------------------------------------------------------------------------------------------

def check_batch(inputs, draft, this_time, config, expected, tiles=(None, 1)) -> int:
    """Each variant (6a and 6 at each split of ``tiles``), called twice (the state written back between, as a
    serving loop does): drafts and counts equal ``expected`` and the library step's; the keys after the search
    equal the library step 5's (6: reset to none, as 6a's are after its phase 2; no ticket left)."""
    library = {}
    for step in (ngram.step05_one_pass, ngram.step06_one_pass_fused, ngram.step07_stream):
        d, t = draft.clone(), this_time.clone()
        m = NgramMatcher(step, inputs, d, t, config=config, check_values=False)
        m()
        library[step] = (d, t, m.match_keys.clone())
    failures = 0
    for variant, (_, _, step) in VARIANTS.items():
        for chunk_tiles in tiles if step is not ngram.step05_one_pass else (None,):
            d, t = draft.clone(), this_time.clone()
            m, launches = bind(variant, inputs, d, t, config, chunk_tiles)
            for _ in range(2):
                d.copy_(draft), t.copy_(this_time)
                launches[0]()
                keys = m.match_keys.clone()
                run_all(launches[1:])
                torch.cuda.synchronize()
                ok = ngram.same_state((d, t), expected) and ngram.same_state((d, t), library[step][:2])
                keys5 = library[ngram.step05_one_pass][2]
                if variant not in STEP7:  # step 7's budget skip may stop a refused slot's search early
                    ok &= bool((keys == -1).all()) if variant == "6" else torch.equal(keys, keys5)
                if step is not ngram.step05_one_pass:
                    ok &= bool((m.match_keys == -1).all()) and int(m.blocks_done) == 0
                if not ok:
                    failures += 1
                    print("MISMATCH", variant, f"chunk_len={m.chunk_len}", inputs.prompt_ids.shape, config)
    return failures


def check() -> int:
    failures = compile_check()
    if runtime.mode() != "gpu":
        print("no GPU: only compiled (run `check` on a GPU for the bit-identity checks)")
        return failures
    cases = 0
    for seed in range(50):  # random batches: small vocabularies, decoys, high ids, hybrid, any budget; the last
        r = random.Random(seed)  # ten wide enough for several blocks a haystack at chunk_tiles=1
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
    for threshold in (128, 1500, 1 << 30):  # benchmark-sized, decoys and high ids; splits of 1, 3 and 16 tiles
        inputs, draft, this_time = ngram.make_batch(128, 4096, 512, decoys=True, id_base=1 << 40, seed=threshold,
                                                    device="cuda")
        config = NgramConfig(threshold=threshold)
        failures += check_batch(inputs, draft, this_time, config, _cpu_path(inputs, draft, this_time, config),
                                tiles=(None, 1, 3, 16))
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

def measure(step7: bool = False, chain: bool = False) -> Path:
    """Time the variants of steps 5 and 6 with the anchors steps 4, 5 and 6, or (``step7``) step 7's variants
    with the anchors steps 6 and 7, or (``step7`` and ``chain``) step 7's chain with the anchors steps 6 and 7."""
    from studylog.bench import BenchRun, gpu_slug, write_lab_output

    run = BenchRun("ngram", command=" ".join(["python", *sys.argv]))
    name = NAME_CHAIN if chain else NAME7 if step7 else NAME
    variants = list(CHAIN7) if chain else [v for v in VARIANTS if (v in STEP7) == step7 and v not in CHAIN7[1:]]
    anchors = [ngram.CHAPTER.step(n) for n in ((6, 7) if step7 else (4, 5, 6))]
    if chain:
        run.note(f"Series {NAME_CHAIN}: step 7's chain, each link one change over the link before it, from "
                 "lab/ngram/variants/ngram_stream_variants.cu (params variant, change, vec, cache, budget_skip, "
                 "launches, chunk_len): step 6 -> 7a = ngram_stream<4, 1, 0, 0> (no barrier in the loop; 8-byte "
                 "default-policy loads, no budget skip) -> 7b = <4, VEC, 0, 0> (16-byte loads) -> 7c = <4, VEC, 0, 2> "
                 "(L2 evict-first hint) -> 7d = <4, VEC, 2, 2> (refused slots skip their search: the library's step 7, "
                 "frozen); each at the library's split for its load width. "
                 f"{', '.join(s.series for s in anchors)} are the library's steps, timed in the same run.")
    elif step7:
        run.note(f"Series {NAME7}: the variants of lab/ngram/variants/step07_changes.cu (params variant, change, "
                 "early_exit, fused, launches, chunk_len): 7 = the library's step 7 (frozen), '7 unfused' = phase 2 "
                 "launched apart (budget_scan_reset), '7 no exit' = no per-tile read of the slot's key, '7 neither' "
                 f"= both. {', '.join(s.series for s in anchors)} are the library's steps, timed in the same run.")
    else:
        run.note(f"Series {SERIES}: the variants of lab/ngram/variants/step05_06_changes.cu (params variant, change, "
             "early_exit or fused, launches, chunk_len): 5a = step 4 + one pass for every n (no early exit), "
             "5 = 5a + the early exit (the library's step 5, frozen), 6a = step 5 split over blocks with phase 2 "
             "launched apart, 6 = 6a + phase 2 fused (the library's step 6, frozen). "
                 f"{', '.join(s.series for s in anchors)} are the library's steps, timed in the same run as "
                 "anchors.")
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
        for series, step, variant in todo:
            def make(batch_inputs, step=step, variant=variant):
                state = (draft0.clone(), this0.clone())
                if variant is None:
                    m = NgramMatcher(step, batch_inputs, *state, config=config, check_values=False)
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
            params = base | ({"step": step.__name__} if variant is None else
                             {"variant": variant, "change": CHANGES[variant], **KNOBS[variant],
                              "launches": 1 + (VARIANTS[variant][1] is not None)}
                             | ({"vec": m.vec} if variant in CHAIN7 else {})
                             | ({"chunk_len": m.chunk_len} if variant[0] in "67" else {}))
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
            twins[variant or step.__name__] = row
            made.clear()  # the copies and their matchers go before the next row
        pairs = [(ngram.step07_stream.__name__, "7d" if chain else "7")] if step7 else \
            [(ngram.step05_one_pass.__name__, "5a"), (ngram.step06_one_pass_fused.__name__, "6")]
        for anchor, frozen in pairs:
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
    parser.add_argument("--step", type=int, choices=(5, 7), default=5,
                        help="measure: the variants of steps 5 and 6 (5, the default) or of step 7 (7)")
    parser.add_argument("--chain", action="store_true",
                        help="measure --step 7: step 7's four changes added one at a time (step07_chain.json)")
    args = parser.parse_args()
    if args.what == "check":
        sys.exit(1 if (compile_check() if args.compile_only else check()) else 0)
    if args.compile_only:
        parser.error("--compile-only goes with check")
    if args.chain and args.step != 7:
        parser.error("--chain goes with --step 7")
    measure(step7=args.step == 7, chain=args.chain)
