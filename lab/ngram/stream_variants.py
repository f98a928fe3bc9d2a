"""Step 12's variants, side by side (GPU only; not run by the tests or the bench).

Each variant differs from the library's step 12 (``ngram_stream<4, VEC, SKIP_LAZY, CACHE_EVICT_FIRST>`` here) in
one knob: loads in flight per thread per tile (2, 8), how slots the budget refuses skip their search (not
at all, or the whole block first, behind two barriers), and the L2 policy of the haystack loads (default
``ld.global.nc``, or ``__ldcs``). The kernels come from the frozen source ``variants/ngram_stream_variants.cu``
(the library's ``ngram_stream.cu`` before the variants left it), compiled with ``studylog.cuda.load``; each
launch takes the arguments and the grid of the library's step 12 bound to the same batch
(``NgramMatcher(step12_skip_refused, ...)``), at the split the default's 16-byte instance uses.

    PYTHONPATH=$PWD python lab/ngram/stream_variants.py check     # every variant bit-identical to the reference
    PYTHONPATH=$PWD python lab/ngram/stream_variants.py measure   # the bench grid -> results/<gpu>/stream_variants.json

``measure`` times on the chapter's GPU clock (CUDA-graph replay over rotated copies of the haystack, as the
chapter's benchmark does); ``results/nvidia-h200/stream_variants_do_bench.json`` is the same grid timed earlier
with do_bench.

``check`` is what the library's tests checked of the variants before they left it: random batches against
the reference, each variant at both load widths and two splits; the benchmark's inputs with budgets that
refuse many slots.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from pathlib import Path

import torch

from studylog import cuda, ngram, paths
from studylog.bench import BenchRun, gpu_slug
from studylog.ngram import NgramConfig, NgramInputs, kernels
from studylog.ngram.report import MAX_COPIES

SOURCE = Path(__file__).resolve().parent / "variants" / "ngram_stream_variants.cu"
#: The values of the frozen source's BUDGET_SKIP and CACHE template parameters.
SKIP = {"off": 0, "eager": 1, "lazy": 2}
CACHE = {"ldg": 0, "ldcs": 1, "evict_first": 2}
DEFAULT = {"loads": 4, "budget_skip": "lazy", "cache": "evict_first"}
#: The library's step 12 first, then one knob changed at a time.
VARIANTS = [DEFAULT] + [DEFAULT | change for change in (
    {"loads": 2}, {"loads": 8}, {"budget_skip": "off"}, {"budget_skip": "eager"}, {"cache": "ldg"}, {"cache": "ldcs"})]


def instance(variant: dict, vec: int) -> str:
    return f"ngram_stream<{variant['loads']}, {vec}, {SKIP[variant['budget_skip']]}, {CACHE[variant['cache']]}>"


INSTANCES = [instance(v, vec) for v in VARIANTS for vec in (2, 1)]


def launcher(variant: dict, vec: int, inputs, draft, this_time, config, chunk_len):
    """A call of one variant on this batch: the library's step 12 bound to it gives the arguments and grid.
    ``chunk_len`` is rounded up to whole tiles of the variant, then of the library's instance."""
    p, g = inputs.prompt_ids.shape[1], inputs.generated_ids.shape[1]
    tile = kernels.THREADS * variant["loads"] * vec
    chunk_len = kernels.stream_chunk_len(inputs.batch, p, g, tile, chunk_len=chunk_len)
    bound = ngram.NgramMatcher(ngram.step12_skip_refused, inputs, draft, this_time, config=config, check_values=False,
                               vec=vec, chunk_len=chunk_len)
    kernel = cuda.load(SOURCE, name_expressions=INSTANCES).kernel(instance(variant, vec), kernels.SIGNATURE)
    grid = (bound.batch, bound.prompt_chunks + bound.gen_chunks)  # step12_skip_refused's grid
    return bound, lambda: kernel(grid, (kernels.THREADS,), *bound.args)


def same_split(inputs) -> int:
    """The split of the default's 16-byte instance, which every variant takes (rounded to its own tiles)."""
    p, g = inputs.prompt_ids.shape[1], inputs.generated_ids.shape[1]
    return kernels.stream_chunk_len(inputs.batch, p, g, kernels.THREADS * DEFAULT["loads"] * 2)


def check(seeds: int = 40) -> int:
    """Every variant, both load widths, bit-identical to the reference; returns the number of failures."""
    failures = 0
    for seed in range(seeds):
        r = random.Random(seed)
        b, pw, gw = r.randint(1, 40), r.randint(1, 300), r.randint(1, 152)
        hybrid = r.random() < 0.3
        inputs, draft, this_time = ngram.make_batch(
            b, pw, gw, kinds=[r.choice(ngram.batches.SLOT_KINDS) for _ in range(b)], draft_width=r.randint(2, 9),
            vocab=r.choice([2, 3, 5, 50]), decoys=r.random() < 0.5, capped_fraction=0.3, hybrid=hybrid, seed=seed)
        dw = draft.shape[1]
        max_n = r.randint(1, 4)
        config = NgramConfig(max_n, r.randint(1, max_n), r.choice([0, 1, 2, 3, 5, 8, 13, 21, 40, 1 << 30]), hybrid,
                             r.randint(dw // 2, dw - 1) if hybrid else 10)
        expected = ngram.reference_ngram_match(inputs, draft, this_time, config)
        failures += _check_batch(inputs.to("cuda"), draft.cuda(), this_time.cuda(), config, expected, (None, 2))
    for threshold in (128, 300, 1500):  # the deployed budget over many long slots: most slots skip
        inputs, draft, this_time = ngram.make_batch(128, 4096, 512, seed=threshold, device="cuda")
        config = NgramConfig(threshold=threshold)
        expected = (draft.cpu(), this_time.cpu())
        ngram.cpu_path.cpu_path_inplace(inputs.to("cpu"), *expected, config)
        failures += _check_batch(inputs, draft, this_time, config, expected, (None,))
    print(f"{len(VARIANTS)} variants x 2 load widths: {failures} failures")
    return failures


def _check_batch(inputs, draft, this_time, config, expected, chunk_lens) -> int:
    wide = kernels.stream_vec(inputs.prompt_ids, inputs.generated_ids) == 2
    failures = 0
    for variant in VARIANTS:
        for vec in (1, 2) if wide else (1,):
            for chunk_len in chunk_lens:
                d, t = draft.clone(), this_time.clone()
                bound, call = launcher(variant, vec, inputs, d, t, config, chunk_len)
                call()
                ok = ngram.same_state((d, t), expected) and bool((bound.match_keys == -1).all()) \
                    and int(bound.blocks_done) == 0
                if not ok:
                    failures += 1
                    print("MISMATCH", variant, vec, bound.chunk_len, config)
    return failures


def measure() -> Path:
    """The bench grid, every variant at the same split, each checked against the CPU path; the rows keep
    the old bench's layout (series ``stream_variants``, the knobs in ``params``)."""
    run = BenchRun("ngram", command=" ".join(sys.argv))
    for batch, seq_len, threshold in run.progress(ngram.report.BENCH_GRID, "grid"):
        config = NgramConfig(threshold=threshold)
        inputs, draft0, this0 = ngram.make_batch(batch, seq_len, ngram.gen_width_for(seq_len),
                                                 kinds=["short"] if batch == 1 else None,
                                                 seed=1000 + batch + seq_len, device="cuda")
        params = {"batch": batch, "seq_len": seq_len, "threshold": threshold}
        floor = run.floor_ms(ngram.batches.haystack_bytes(inputs, this0, config))
        expected = (draft0.cpu(), this0.cpu())
        ngram.cpu_path.cpu_path_inplace(inputs.to("cpu"), *expected, config)
        split = same_split(inputs)
        # copies of the haystack to rotate among, as the chapter's benchmark rotates them (past L2 together)
        nbytes = (inputs.prompt_ids.numel() + inputs.generated_ids.numel()) * 8
        copies = [inputs] + [NgramInputs(**{f.name: getattr(inputs, f.name).clone() for f in dataclasses.fields(inputs)})
                             for _ in range(max(1, min(run.rotation(nbytes), MAX_COPIES)) - 1)]
        for variant in VARIANTS:
            for vec in (2, 1) if variant is DEFAULT else (2,):
                state = (draft0.clone(), this0.clone())
                bound, call = launcher(variant, vec, inputs, *state, config, split)
                call()
                knobs = variant | {"vec": vec, "chunk_len": bound.chunk_len}
                run.check("bit-identical to the CPU path", ngram.same_state(state, expected), params=params | knobs)

                def make_calls(variant=variant, vec=vec):
                    return [launcher(variant, vec, c, draft0.clone(), this0.clone(), config, split)[1] for c in copies]
                run.record("stream_variants", run.gpu_time(make_calls, min_calls=60, reps=10), params=params | knobs,
                           floor_ms=floor)
        del inputs, draft0, this0, copies
        torch.cuda.empty_cache()
    out = paths.lab_results("ngram", gpu_slug(run.device["name"])) / "stream_variants.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(run.to_json(), indent=1))
    bad = [c for c in run.checks if not c["passed"]]
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out}")
    return out


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "check"
    if what == "check":
        sys.exit(1 if check() else 0)
    elif what == "measure":
        measure()
    else:
        sys.exit(f"usage: {sys.argv[0]} check|measure")
