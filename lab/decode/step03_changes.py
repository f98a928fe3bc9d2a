"""Step 3's three changes, one at a time: what each buys a decode step.

Step 3 (``masked_head``) changes three things against step 2 (``jump_forward``): the host's mask comes from
chapter 1's automaton (each state's allowed set, precomputed) instead of xgrammar's matcher and bitmask; the LM head
is chapter 2's masked head, which computes only the allowed rows' logits; and the greedy token is picked among the
allowed ids alone (``kernels.allowed_argmax``) instead of by an argmax over the whole row. The configurations add
them in that order, each differing from the one before in one knob: ``jump``, ``head`` and ``mask`` are
``studylog.decode.DecodeConfig``'s; ``sample`` is this script's (``WholeRowDecoder``, the library's decoder whose
sampler is handed no allowed sets, so it reads the masked head's row whole as the dense path does):

| configuration | jump | head | mask | sample | the change it adds |
|---|---|---|---|---|---|
| ``jump_forward`` (step 2) | token | dense | xgrammar | – | |
| ``automaton_mask`` | token | dense | automaton | – | + the automaton's masks |
| ``masked_full_argmax`` (here only) | token | masked | automaton | all | + the masked head |
| ``masked_head`` (step 3) | token | masked | automaton | allowed | + the argmax over the allowed ids only |

``baseline`` (step 1) runs too: every configuration must write its tokens, and it is checked on every request
(``run.check``) before its row is kept. Every request is timed as the chapter's benchmark times it
(``studylog.decode.report.measure``: a warm-up, timed runs with the collector paused, an instrumented run for the
breakdown; the same steered requests, ``report.requests``; the same repetitions per shape, ``report.plan``), so
the rows compare with ``assets/bench/<gpu>/decode.json``.

GPU only, public API only. From the repository root (a few minutes at most on an H200):

    PYTHONPATH=$PWD python lab/decode/step03_changes.py [--schemas a,b,...] [--batches 1,8]

writes ``lab/decode/results/<gpu>/step03_changes.json`` (a ``studylog.bench.BenchRun`` file: one row per shape,
batch, schema and configuration in series ``step03_changes``, the knobs in ``params``). ``--smoke`` runs the same
loop on the CPU at the ``tiny`` shape and writes nothing: a test of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from dataclasses import replace

import torch

from studylog.decode import DecodeConfig, Decoder
from studylog.decode.generation import CONFIGS

#: The extra configuration: step 3 without its last change (the masked head's row read whole by the argmax), run
#: on a :class:`WholeRowDecoder` with ``whole_row`` set.
MASKED_FULL_ARGMAX = replace(CONFIGS["masked_head"], name="masked_full_argmax")
#: Step 1, then step 2 and step 3's changes added one at a time.
VARIANTS = (CONFIGS["baseline"], CONFIGS["jump_forward"], CONFIGS["automaton_mask"], MASKED_FULL_ARGMAX,
            CONFIGS["masked_head"])
#: The change each configuration adds to the one before it (what the lesson's table names its rows).
CHANGES = {"automaton_mask": "+ automaton masks", "masked_full_argmax": "+ masked head",
           "masked_head": "+ allowed-only argmax"}
#: The nine JSON schemas of chapter 1's suite, the requests of the chapter's headline.
SCHEMAS = ("classifier", "weather_call", "tool_call", "user_profile", "ticket_triage", "shopping_list", "product",
           "calendar_event", "article_summary")
SERIES = "step03_changes"


class WholeRowDecoder(Decoder):
    """The library's decoder with one knob of this script's: with ``whole_row`` set, the sampler is handed no
    allowed sets, so it reads the masked head's row whole (the dense path's argmax and seeded sampling)."""

    whole_row = False

    def _sample(self, temperature, seed, allowed=None):
        super()._sample(temperature, seed, None if self.whole_row else allowed)


class CpuRun:
    """What ``--smoke`` records into: ``BenchRun``'s ``record``, ``check`` and ``note`` without its GPU clock."""

    def __init__(self):
        self.rows, self.checks, self.notes = [], [], []

    def record(self, series, timing, *, params, role="kernel", **extra):
        row = {"series": series, "role": role, "params": dict(params), "ms": timing.median, "clock": "cpu",
               "spread_ms": timing.spread, **extra}
        self.rows.append(row)
        return row

    def check(self, name, passed, *, params=None, **detail):
        self.checks.append({"name": name, "passed": bool(passed), "params": params or {}, **detail})
        return bool(passed)

    def note(self, text):
        self.notes.append(text)


def knobs(cfg: DecodeConfig) -> dict:
    return {"config": cfg.name, "jump": cfg.jump, "head": cfg.head, "mask": cfg.mask,
            "sample": "all" if cfg is MASKED_FULL_ARGMAX else "allowed"}


def sweep(run, *, device: str, shapes, batches, schemas, repeats: dict, max_new_tokens: int = 160,
          max_seq: int = 512, dtype: torch.dtype = torch.bfloat16) -> None:
    """Every variant on every request, each checked against step 1's tokens, then recorded with its breakdown."""
    from studylog.bench import Timing
    from studylog.decode import Grammar, LlamaModel, describe, model_config
    from studylog.decode.report import measure, requests

    for shape in shapes:
        cfg = model_config(shape)
        model = LlamaModel(cfg, device=device, dtype=dtype, seed=0)  # the benchmark's weights (seed 0)
        run.note(f"model {shape}: {describe(cfg)}")
        for batch in batches:
            t0 = time.perf_counter()
            decoder = WholeRowDecoder(model, batch=batch, max_seq=max_seq)
            decoder.capture()
            for name in schemas:
                grammar = Grammar.from_suite(name, decoder.vocab, whitespace="compact")
                prompts, targets = requests(name, batch, decoder, "compact")
                first = None
                for variant in VARIANTS:
                    decoder.whole_row = variant is MASKED_FULL_ARGMAX
                    runs, timed = measure(decoder, grammar, variant, prompts, targets,
                                          max_new_tokens=max_new_tokens, repeats=repeats[shape])
                    first = first or timed
                    same = timed.ids == first.ids
                    params = {"model": shape, "batch": batch, "schema": name, "whitespace": "compact",
                              **knobs(variant)}
                    if variant is not VARIANTS[0]:
                        run.check("same tokens as step01_baseline", same, params=params)
                    run.record(SERIES, Timing.of([g.ms_per_token for g in runs], clock="wall"), params=params,
                               role="kernel" if variant.name == "masked_head" else "baseline",
                               tokens=timed.tokens, forwards=timed.forwards, jumped=sum(timed.jumped),
                               finished=all(timed.finished), same_tokens_as_step01=same,
                               breakdown_ms_per_token=timed.breakdown_per_token(),
                               instrumented_ms_per_token=timed.ms_per_token)
                line = "  ".join(f"{r['params']['config']} {r['ms'] * 1e3:,.0f}" for r in run.rows[-len(VARIANTS):])
                print(f"{shape} batch {batch} {name:16s} µs per token: {line}", flush=True)
            print(f"{shape} batch {batch}: {time.perf_counter() - t0:.0f} s", flush=True)
            del decoder
        del model
        if device == "cuda":
            torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schemas", default=",".join(SCHEMAS))
    ap.add_argument("--shapes", default="1b,8b")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--smoke", action="store_true", help="the tiny shape on the CPU; writes nothing")
    args = ap.parse_args()
    from studylog import paths
    from studylog.bench import BenchRun, gpu_slug
    from studylog.decode.report import plan

    schemas = args.schemas.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    # the benchmark's repetitions per shape (its full plan), so a row's median is taken as the committed one is
    repeats = {shape: p["repeats"] for p in plan(False) for shape in p["shapes"]}
    t0 = time.perf_counter()
    if args.smoke:
        run = CpuRun()
        sweep(run, device="cpu", shapes=("tiny",), batches=batches, schemas=schemas, repeats={"tiny": 1},
              max_new_tokens=64, max_seq=200, dtype=torch.float32)
    else:
        run = BenchRun("decode", command="python " + " ".join(sys.argv))
        run.note("Step 3's changes one at a time (lab/decode/step03_changes.py): each configuration differs from the "
                 "one before in one knob (params: jump, head, mask of DecodeConfig; sample, the script's "
                 "WholeRowDecoder); timed as the chapter's benchmark times a request "
                 "(studylog.decode.report.measure), steered to the same samples.")
        sweep(run, device="cuda", shapes=args.shapes.split(","), batches=batches, schemas=schemas, repeats=repeats)
    bad = [c for c in run.checks if not c["passed"]]
    print(f"{len(run.rows)} rows, {len(run.checks)} checks ({len(bad)} failed) in {time.perf_counter() - t0:.0f} s")
    for c in bad:
        print("FAILED:", c["name"], c["params"])
    if not args.smoke:
        out = paths.lab_results("decode", gpu_slug(run.device["name"])) / f"{SERIES}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(run.to_json(), indent=1) + "\n")
        print(f"-> {out}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
