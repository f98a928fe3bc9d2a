"""Step 7's two ideas, one number each: the batch's union read once (7a) without ``tl.dot`` (7b), and with it.

Step 7 (``step07_batched``) reads each row of the batch's union once for all sequences (7a) and multiplies a tile
of those rows with every hidden state of the batch by one ``tl.dot`` (7b). ``variants/step07_changes.py`` is its
kernel frozen with one compile-time knob, DOT: on, step 7 as the library has it; off, the same programs read the
same rows once, and each sequence's logits are one reduction per sequence, as steps 4 and 5 compute a row's logit.
So the chain reads: step 6 -> 7a (DOT off) -> step 7 (DOT on).

    PYTHONPATH=$PWD python lab/masked_lm_head/step07_changes.py check     # CPU (interpreter) or GPU
    PYTHONPATH=$PWD python lab/masked_lm_head/step07_changes.py measure   # GPU -> results/<gpu>/step07_changes.json
    PYTHONPATH=$PWD python lab/masked_lm_head/step07_changes.py ptx       # any machine: PTX for sm_90 compared

``check``: both settings at batches 1, 3 and 5 at sizes that are multiples of no block, at small tiles and step 7's
own (on a GPU also the chapter's head, batches 1, 3, 5 and 64): DOT on bit-identical to ``step07_batched``, DOT off
within the chapter's float64 bound and ``-inf`` exactly where ``step07_batched`` writes it. ``ptx``: DOT on
compiles to step 7's PTX (sm_90). ``measure``: the chapter benchmark's inputs, clock and head rotation; README.md
("Step 7's two ideas") lists the series.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
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

from studylog.masked_lm_head import (CHAPTER, HIDDEN, VOCAB, AllowedTokens, step05_stream, step06_few_ids,  # noqa: E402
                                     step07_batched)
from studylog.masked_lm_head.formats import Tiles, compare_logits, default_tiles, fp32_gamma  # noqa: E402
from studylog.masked_lm_head.masks import clustered_sets, random_sets, structured_sets  # noqa: E402
from studylog.masked_lm_head.report import HeadCopies, cases  # noqa: E402
from variants.step07_changes import changes  # noqa: E402

SERIES = "step07_changes"
#: Step 5 launched once per sequence: every sequence reads its own rows, no union.
PER_SEQUENCE = "step05_per_sequence"
#: (batch, allowed per sequence) of step 7's cases measured here, random sets; step 6 at its own case.
CASES = ((64, 10), (64, 100))
STEP6_CASE = (1, 1)
VARIANT = {False: "7a: the union, one reduction per sequence", True: "step 7: the union and tl.dot"}
#: GPU-clock settings, the chapter benchmark's for kernels under 100 µs.
MIN_CALLS, REPS = 60, 15


def reference(h: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 logits (unmasked) and sum |h_i w_i|, the scale of the chapter's error bound."""
    w64 = weight.double()
    return h.double() @ w64.t(), h.double().abs() @ w64.abs().t()


def verdict(out, ref, scale, allowed, hidden, summation) -> dict:
    """compare_logits against float64: allowed entries within the bound, the rest exactly -inf, no NaN."""
    return compare_logits(out, ref, fp32_gamma(hidden, summation) * scale + 1e-30, allowed.mask)


# -- check -------------------------------------------------------------------------------------------------------

def check_tiles(batch: int, n_union: int, small: bool) -> list[tuple[str, Tiles]]:
    """Small blocks that cut rows, D and the flat output in awkward places, and step 7's own."""
    out = [(f"small {v}x{d}", Tiles(block_b=16, block_v=v, block_d=d, fill_block=64, num_warps=4, num_stages=1))
           for v, d in ((16, 32), (32, 16))] if small else []
    return out + [("step 7's", default_tiles(7, batch, n_union))]


def case_inputs(vocab, hidden, batch, kind, gen, dev):
    g = torch.Generator().manual_seed(int(gen.integers(2**31)))
    h = torch.randn(batch, hidden, generator=g).to(torch.bfloat16).to(dev)
    weight = (torch.randn(vocab, hidden, generator=g) * 0.02).to(torch.bfloat16).to(dev)
    draw = {"none": lambda b: np.array([], dtype=np.int64), "one": lambda b: np.array([vocab - 1 - b]),
            "few": lambda b: gen.choice(vocab, size=3, replace=False),
            "many": lambda b: np.flatnonzero(gen.random(vocab) < 0.3), "all": lambda b: np.arange(vocab)}[kind]
    return h, weight, AllowedTokens.from_ids([draw(b) for b in range(batch)], vocab, device=dev)


def check(seed: int | None = None) -> int:
    """Both settings against float64 and against the library's step 7; returns the number of failures."""
    seed = int(np.random.SeedSequence().entropy % 2**31) if seed is None else seed
    gen = np.random.default_rng(seed)
    dev = runtime.device()
    gpu = runtime.mode() == "gpu"
    print(f"check on {runtime.mode()} ({dev}), seed {seed}", flush=True)
    sizes = [(203, 77, (1, 3, 5), True)]
    sizes.append((VOCAB, HIDDEN, (1, 3, 5, 64), False) if gpu else (421, 130, (1, 3, 5), True))
    failures = checks = 0
    for vocab, hidden, batches, small in sizes:
        for batch in batches:
            for kind in ("none", "one", "few", "many", "all"):
                h, weight, allowed = case_inputs(vocab, hidden, batch, kind, gen, dev)
                ref, scale = reference(h, weight)
                tiles = check_tiles(batch, allowed.union_count, small)
                for name, t in tiles:
                    lib = step07_batched(h, weight, allowed, out=torch.full((batch, vocab), torch.nan, device=dev),
                                         tiles=t)
                    for dot in (True, False):
                        out = changes(h, weight, allowed, dot=dot, tiles=t,
                                      out=torch.full((batch, vocab), torch.nan, device=dev))
                        res = verdict(out, ref, scale, allowed, hidden, "dot" if dot else "row")
                        # DOT on: step 7's logits bit for bit; off: -inf exactly where step 7 writes it
                        same = torch.equal(out, lib) if dot else torch.equal(out.isneginf(), lib.isneginf())
                        checks += 2
                        if not res["passed"] or not same:
                            failures += (not res["passed"]) + (not same)
                            print(f"FAILED V={vocab} D={hidden} B={batch} {kind} (union {allowed.union_count}) "
                                  f"tiles {name} dot={dot}: {res}, as step07_batched: {same}", flush=True)
                print(f"  V={vocab} D={hidden} B={batch} {kind:4s} (union {allowed.union_count}): 2 settings x "
                      f"{len(tiles)} tiles checked", flush=True)
    failures += check_refusals(dev)
    print(f"{checks} checks, {failures} failures (seed {seed})")
    return failures


def check_refusals(dev: torch.device) -> int:
    """The wrapper names the argument it refuses; returns the number of failures."""
    h, weight, allowed = case_inputs(40, 24, 2, "few", np.random.default_rng(0), dev)
    failures = 0
    for kw, words in (({"dot": 1}, "dot must be a bool"), ({"dot": True, "tiles": (1, 2)}, "tiles must be")):
        try:
            changes(h, weight, allowed, **kw)
            message = "no error"
        except (TypeError, ValueError) as exc:
            message = str(exc)
        if words not in message:
            failures += 1
            print(f"FAILED: {kw} gave {message!r}, not an error that says {words!r}")
    return failures


# -- ptx ---------------------------------------------------------------------------------------------------------

def ptx() -> int:
    """DOT on compiles to the PTX of the library's ``batched_union_kernel`` (bf16, D = 3,072, step 7's tiles at
    batch 64 and a small union); DOT off compiles, with no tensor-core instruction and nothing spilled."""
    import triton.language as tl
    from ptx_unchanged import ptx as compile_ptx

    from studylog.masked_lm_head import batched_union_kernel
    from variants.step07_changes import step07_changes_kernel

    def text(kernel, constexprs):
        lines = compile_ptx(kernel, constexprs).replace(kernel.__name__, "KERNEL").splitlines()
        return [" ".join(line.split()) for line in lines if not line.lstrip().startswith("//")]

    t = default_tiles(7, 64, 100)
    shape = dict(D=HIDDEN, BLOCK_B=t.block_b, BLOCK_V=t.block_v, BLOCK_D=t.block_d, FILL_BLOCK=t.fill_block,
                 DOT_DTYPE=tl.bfloat16)
    same = text(step07_changes_kernel, shape | dict(DOT=True)) == text(batched_union_kernel, shape)
    off = text(step07_changes_kernel, shape | dict(DOT=False))
    plain = not any("mma" in line or "ld.local" in line or "st.local" in line for line in off)
    print(f"DOT on and batched_union_kernel: PTX {'same' if same else 'DIFFERS'}; DOT off: {len(off)} lines, "
          f"{'no mma, no local memory' if plain else 'mma or local memory FOUND'}")
    return 0 if same and plain else 1


# -- measure -----------------------------------------------------------------------------------------------------

def bench_inputs(dev: torch.device):
    """The chapter benchmark's head, hidden states and random sets at :data:`CASES` and :data:`STEP6_CASE`: the
    same seeds and the same draws in the same order as ``run_sweep`` (every case before the last one wanted is
    drawn, structured picks at batch > 1 included, so the generator is where the benchmark's is)."""
    gen = np.random.default_rng(1234)
    torch.manual_seed(1234)
    weight = (torch.randn(VOCAB, HIDDEN, device=dev) * 0.02).to(torch.bfloat16)
    data = structured_sets(VOCAB)
    sizes = np.array([s.size for s in data.sets])
    wanted = {(b, c) for b, c in CASES + (STEP6_CASE,)}
    h, sets = {}, {}
    for batch, kind, count in cases(VOCAB, quick=False, third_kind="real" if data.is_real else "grammar"):
        if not wanted - set(sets):
            break
        if batch not in h:  # run_sweep draws a batch's hidden state before its cases
            h[batch] = torch.randn(batch, HIDDEN, device=dev).to(torch.bfloat16)
        if kind == "random":
            drawn = random_sets(count, VOCAB, batch, gen)
        elif kind == "clustered":
            drawn = clustered_sets(count, VOCAB, batch, gen)
        else:  # a structured pick: at batch > 1 it draws from gen (as report.run_sweep's picker does)
            near = np.flatnonzero((sizes >= count / 2) & (sizes <= count * 2) & (sizes > 0))
            if batch > 1 and near.size:
                gen.choice(near, size=batch, replace=True)
            continue
        if (batch, count) in wanted and kind == "random":
            sets[batch, count] = drawn
    return weight, h, sets


def measure() -> Path:
    from studylog.bench import BenchRun, gpu_slug, write_lab_output

    run = BenchRun("masked_lm_head", command="python lab/masked_lm_head/step07_changes.py measure")
    dev = runtime.device()
    weight, hs, sets = bench_inputs(dev)
    vocab, hidden = weight.shape
    row_bytes = hidden * weight.element_size()
    S6, S7 = CHAPTER.step(6).series, CHAPTER.step(7).series
    run.note(f"{SERIES}: step 7's kernel frozen with one compile-time knob (lab/masked_lm_head/variants/"
             "step07_changes.py): dot=True is step 7 (each program reads a tile of the batch's union once and "
             "multiplies it with the batch's hidden states by tl.dot); dot=False reads the same tile once, chunk by "
             "chunk, and reduces it against each sequence in turn (tl.sum, one per sequence): 7a alone. Both at "
             f"step 7's default tiles. {S7} is the library's step 7 (the twin of dot=True); index_select is the "
             f"table of steps' reference for step 7; {PER_SEQUENCE} is step05_stream launched once per sequence "
             f"on its own set (no union: each sequence reads its own rows); {S6} is the library's step 6 at its "
             "own case of the table (batch 1, one random id).")
    run.note("Inputs as the chapter's benchmark builds them (seed 1234, its head, hidden states and random sets "
             "drawn in its order); floor_ms as there; clock: BenchRun.measure, 60 calls a graph, 15 replays, 3 "
             "repetitions, the calls rotated over exact copies of the head (HeadCopies: the bytes a call reads "
             "times the copies above four times L2, at most 48 GiB of copies; where that cap binds, a row's "
             "rotation_capped is true); the checks run on the head itself, on a poisoned (NaN) output.")
    copies = HeadCopies(run)
    twins = []

    def timed(series, fn, nbytes, params, **extra) -> dict:
        """``fn(w)`` on the GPU clock, rotated over the copies of the head a call reading ``nbytes`` needs."""
        n, capped = copies.count(weight, nbytes)
        return run.measure(series, lambda: [functools.partial(fn, w) for w in copies.of(weight, n)],
                           params=params, min_calls=MIN_CALLS, reps=REPS, copies=n, read_bytes=int(nbytes),
                           rotation_capped=capped, **extra)

    for batch, count in (STEP6_CASE,) + CASES:
        h = hs[batch]
        allowed = AllowedTokens.from_ids(sets[batch, count], vocab, device=dev)
        n = allowed.union_count
        ref, scale = reference(h, weight)
        torch.cuda.empty_cache()
        base = {"batch": batch, "kind": "random", "allowed": count, "layout": "vd"}
        extra = {"allowed_actual": float(np.mean(allowed.counts)), "union": n,
                 "floor_ms": max(run.floor_ms(n * row_bytes + batch * vocab * 4), run.empty_launch_gpu.median)}
        out = torch.empty(batch, vocab, device=dev)

        def poisoned():
            return torch.full((batch, vocab), float("nan"), device=dev)

        def checked(series, got, summation, params, **more):
            torch.cuda.synchronize()
            res = verdict(got, ref, scale, allowed, hidden, summation)
            return run.check(series, res.pop("passed"), params=params | {"series": series}, summation=summation,
                             **res, **more)

        print(f"batch {batch}, {count} allowed (union {n:,})", flush=True)
        if (batch, count) == STEP6_CASE:
            checked(S6, step06_few_ids(h, weight, allowed, out=poisoned()), "row", base)
            timed(S6, lambda w: step06_few_ids(h, w, allowed, out=out), n * row_bytes, base, **extra)
            copies.release()
            continue
        t = default_tiles(7, batch, n)
        tiles = {"block_b": t.block_b, "block_v": t.block_v, "block_d": t.block_d, "fill_block": t.fill_block,
                 "num_warps": t.num_warps, "num_stages": t.num_stages}
        lib = step07_batched(h, weight, allowed, out=poisoned())
        checked(S7, lib, "dot", base)
        anchor = timed(S7, lambda w: step07_batched(h, w, allowed, out=out), n * row_bytes, base, **extra)
        for dot in (False, True):
            params = base | {"dot": dot, "variant": VARIANT[dot]} | tiles
            got = changes(h, weight, allowed, dot=dot, out=poisoned())
            checked(SERIES, got, "dot" if dot else "row", params)
            same = torch.equal(got, lib) if dot else torch.equal(got.isneginf(), lib.isneginf())
            run.check(f"{SERIES} " + ("bit-identical to" if dot else "-inf exactly where") + f" {S7}", same,
                      params=params)
            row = timed(SERIES, lambda w, dot=dot: changes(h, w, allowed, dot=dot, out=out), n * row_bytes, params,
                        **extra)
            if dot:
                twins.append((anchor, row))
        union = allowed.union_ids
        timed("index_select", lambda w: torch.matmul(h, w.index_select(0, union).t()), n * row_bytes,
              {k: v for k, v in base.items() if k != "layout"}, role="baseline", **extra)  # as the benchmark
        own = [AllowedTokens.from_ids([ids], vocab, device=dev) for ids in sets[batch, count]]

        def per_sequence(w, out):
            for b, a in enumerate(own):
                step05_stream(h[b:b + 1], w, a, out=out[b:b + 1])
            return out

        checked(PER_SEQUENCE, per_sequence(weight, poisoned()), "row", base)
        timed(PER_SEQUENCE, lambda w: per_sequence(w, out), sum(a.union_count for a in own) * row_bytes, base,
              **extra)
        copies.release()
    for anchor, twin in twins:
        lo_a, _, hi_a = anchor["spread_ms"]
        lo_t, _, hi_t = twin["spread_ms"]
        text = (f"anchor {S7} at batch {anchor['params']['batch']}, {anchor['params']['allowed']} allowed: "
                f"{anchor['ms'] * 1e3:.2f} µs [{lo_a * 1e3:.2f}, {hi_a * 1e3:.2f}], its twin (dot=True) "
                f"{twin['ms'] * 1e3:.2f} µs [{lo_t * 1e3:.2f}, {hi_t * 1e3:.2f}]: spreads "
                f"{'overlap' if lo_a <= hi_t and lo_t <= hi_a else 'do NOT overlap'} "
                f"(ratio {twin['ms'] / anchor['ms']:.3f})")
        run.note(text)
        print(text, flush=True)

    data = run.to_json()
    name = run.device["name"]
    out_path = paths.lab_results("masked_lm_head", gpu_slug(name)) / f"{SERIES}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(data, indent=1) + "\n")
    if os.environ.get("OUT"):
        write_lab_output(Path(os.environ["OUT"]), name, SERIES, data)
    bad = [c for c in run.checks if not c["passed"]]
    for r in run.rows:
        print(f"  {r['series']:22s} {json.dumps({k: r['params'].get(k) for k in ('batch', 'allowed', 'dot')})} "
              f"{r['ms'] * 1e3:9.2f} µs  (union {r['union']:,}, copies {r['copies']})")
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out_path}")
    return out_path


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
