"""Chapter 3: step 6 with its phase 2 launched early (a programmatic dependent launch), beside steps 6 and 8.

Step 6 runs phase 2 (the budget scan) as a second launch; step 8 fuses it into the search's last block, which costs
the search kernel registers. On the GPU clock step 6 wins on synthetic batches and step 8 on real text under a
budget (about half a microsecond at 32 x 4096): what step 6 pays there is the gap between two dependent kernels.
Both variants launch phase 2 early (``ngram_budget_scan_early``: ``griddepcontrol.wait`` before it reads the keys):

* ``6 early``: step 6's search kernel unchanged (its blocks let phase 2 launch as they exit);
* ``6 trigger``: the search kernel with ``griddepcontrol.launch_dependents`` first, ``ngram_one_pass_split_early``:
  what the library kept as step 7 (``step07_early_phase2``).

The kernels are the library's (``ngram_one_pass.cu``); when this was measured they were a frozen copy in this folder,
the same code.

Each variant takes the arguments, grid, split and scratch of the library's step 6 bound to the same batch
(``NgramMatcher(step06_one_pass_split, ...)``).

    PYTHONPATH=$PWD python lab/ngram/phase2_early.py check     # GPU: bit-identical, keys reset, on random batches
    PYTHONPATH=$PWD python lab/ngram/phase2_early.py measure   # GPU: the bench grid and the real-text cases

``measure`` times steps 6 and 8 (the library's, the anchors) and both variants on every case of the chapter's
benchmark, synthetic grid and real text, as the benchmark times a step (GPU clock over rotated copies, host time
per eager call), every row checked bit-identical to the CPU path; it writes ``results/<gpu>/phase2_early.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import sys
from pathlib import Path

import torch

from studylog import cuda, ngram, paths
from studylog.ngram import SCAN_THREADS, NgramConfig, NgramInputs, NgramMatcher
from studylog.ngram.kernels import SIGNATURE, THREADS
from studylog.ngram.report import BENCH_GRID, CORPORA, MAX_COPIES, REAL_SHAPES, gen_width_for, real_batch

#: Variant -> its search kernel (None: the library's step 6 or 8 through its matcher) and what changed.
VARIANTS = {"6": None, "8": None, "6 early": "ngram_one_pass_split", "6 trigger": "ngram_one_pass_split_early"}
CHANGES = {"6": "step 6 (library)", "8": "step 8 (library)",
           "6 early": "step 6, phase 2 launched early (griddepcontrol.wait), search unchanged",
           "6 trigger": "step 6, phase 2 launched early, the search lets it launch at its start"}
STEPS = {"6": ngram.step06_one_pass_split, "8": ngram.step08_one_pass_fused}


@functools.lru_cache(maxsize=None)
def kernel(name: str, device: int) -> cuda.CudaKernel:
    return cuda.load("ngram_one_pass", device=device).kernel(name, SIGNATURE)


def bind(variant: str, inputs: NgramInputs, draft, this_time, config: NgramConfig):
    """(matcher, call): the library step bound to the batch, and the variant's call on it."""
    step = STEPS.get(variant, ngram.step06_one_pass_split)
    m = NgramMatcher(step, inputs, draft, this_time, config=config, check_values=False)
    if VARIANTS[variant] is None:
        return m, m
    dev = torch.cuda.current_device()
    search, phase2 = kernel(VARIANTS[variant], dev), kernel("ngram_budget_scan_early", dev)
    grid = (m.batch, m.prompt_chunks + m.gen_chunks)

    def call():
        search(grid, (THREADS,), *m.args)
        phase2((1,), (SCAN_THREADS,), *m.args, early=True)
    return m, call


def _cpu_path(inputs, draft, this_time, config):
    expected = (draft.cpu(), this_time.cpu())
    ngram.cpu_path.cpu_path_inplace(inputs.to("cpu"), *expected, config)
    return expected


def check() -> int:
    failures = cases = 0
    for seed in range(40):
        r = random.Random(seed)
        b, width = (r.randint(1, 40), 300) if seed < 30 else (r.randint(1, 8), 6000)
        inputs, draft, this_time = ngram.make_batch(
            b, r.randint(1, width), r.randint(1, width // 2 + 2),
            kinds=[r.choice(ngram.batches.SLOT_KINDS) for _ in range(b)], draft_width=r.randint(2, 9),
            vocab=r.choice([2, 3, 5, 50]), decoys=r.random() < 0.5, capped_fraction=0.3, seed=seed)
        max_n = r.randint(1, 4)
        config = NgramConfig(max_n, r.randint(1, max_n), r.choice([0, 1, 3, 8, 21, 40, 1 << 30]))
        batches = [(inputs, draft, this_time, config)]
        if seed == 0:
            for threshold in (1 << 30, 900):  # more slots than phase 2's block
                i2, d2, t2 = ngram.make_batch(2500, 64, 32, vocab=4, seed=threshold)
                batches.append((i2, d2, t2, NgramConfig(threshold=threshold)))
        for inputs, draft, this_time, config in batches:
            expected = _cpu_path(inputs, draft, this_time, config)
            gi = inputs.to("cuda")
            for variant in VARIANTS:
                d, t = draft.cuda(), this_time.cuda()
                m, call = bind(variant, gi, d, t, config)
                for _ in range(2):  # the second call starts from the state the first leaves
                    d.copy_(draft), t.copy_(this_time)
                    call()
                    torch.cuda.synchronize()
                    ok = ngram.same_state((d, t), expected) and bool((m.match_keys == -1).all())
                    if not ok:
                        failures += 1
                        print("MISMATCH", variant, inputs.prompt_ids.shape, config)
            cases += 1
    print(f"{len(VARIANTS)} variants on {cases} batches, each called twice: {failures} failures")
    return failures


def measure() -> Path:
    from studylog.bench import BenchRun, gpu_slug, write_lab_output

    run = BenchRun("ngram", command=" ".join(["python", *sys.argv]))
    run.note("Series phase2_early: " + "; ".join(f"{v} = {c}" for v, c in CHANGES.items()) + ". Inputs as the "
             "chapter's benchmark (studylog.ngram.report): the synthetic grid's make_batch(batch, seq_len, "
             "gen_width_for(seq_len), seed=1000 + batch + seq_len) and the real-text cases' real_batch; GPU clock "
             "(CUDA-graph replay over rotated copies, three repetitions, 60 calls a graph, 15 replays), host_ms per "
             "eager call; every row checked bit-identical to the CPU path before and after the replays.")
    cases = [("synthetic", *c) for c in BENCH_GRID] + [(c, *s) for s in REAL_SHAPES for c in CORPORA
                                                       if c != "synthetic"]
    for corpus, batch, seq_len, threshold in run.progress(cases, "cases"):
        config = NgramConfig(threshold=threshold)
        if (batch, seq_len, threshold) in BENCH_GRID and corpus == "synthetic":
            inputs, draft0, this0 = ngram.make_batch(batch, seq_len, gen_width_for(seq_len),
                                                     kinds=["short"] if batch == 1 else None,
                                                     seed=1000 + batch + seq_len, device="cuda")
        else:
            inputs, draft0, this0 = real_batch(corpus, batch, seq_len)
        base = {"corpus": corpus, "batch": batch, "seq_len": seq_len, "threshold": threshold}
        floor = run.floor_ms(ngram.batches.haystack_bytes(inputs, this0, config))
        expected = _cpu_path(inputs, draft0, this0, config)
        nbytes = (inputs.prompt_ids.numel() + inputs.generated_ids.numel()) * 8
        copies = max(1, min(run.rotation(nbytes), MAX_COPIES))
        for variant in VARIANTS:
            params = base | {"variant": variant, "change": CHANGES[variant]}
            m, call = bind(variant, inputs, draft0.clone(), this0.clone(), config)
            call()
            torch.cuda.synchronize()
            m.draft_tokens.copy_(draft0), m.seq_lens_this_time.copy_(this0)
            call()
            torch.cuda.synchronize()
            run.check("bit-identical to the CPU path",
                      ngram.same_state((m.draft_tokens, m.seq_lens_this_time), expected), params=params)
            made = []

            def make_calls(variant=variant, made=made):
                batches = [inputs] + [NgramInputs(**{f.name: getattr(inputs, f.name).clone()
                                                     for f in dataclasses.fields(inputs)}) for _ in range(copies - 1)]
                made[:] = [bind(variant, c, draft0.clone(), this0.clone(), config) for c in batches]
                return [c for _, c in made]

            run.measure("phase2_early", make_calls, params=params, host=call, floor_ms=floor, rotated_copies=copies)
            torch.cuda.synchronize()
            run.check("bit-identical after graph replays", all(
                ngram.same_state((x.draft_tokens, x.seq_lens_this_time), expected) for x, _ in (made[0], made[-1])),
                params=params)
            made.clear()
        del inputs, draft0, this0
        torch.cuda.empty_cache()
    data = run.to_json()
    out = paths.lab_results("ngram", gpu_slug(run.device["name"])) / "phase2_early.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    if os.environ.get("OUT"):
        write_lab_output(Path(os.environ["OUT"]), run.device["name"], "phase2_early", data)
    bad = [c for c in run.checks if not c["passed"]]
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out}")
    rows = {}
    for r in run.rows:
        p = r["params"]
        rows.setdefault((p["corpus"], p["batch"], p["seq_len"], p["threshold"]), {})[p["variant"]] = r["ms"] * 1e3
    for case, times in rows.items():
        print(case, "  ".join(f"{v}: {t:.2f}" for v, t in times.items()))
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("check", "measure"))
    args = parser.parse_args()
    sys.exit(1 if check() else 0) if args.what == "check" else measure()
