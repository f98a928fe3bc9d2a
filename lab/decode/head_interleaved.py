"""Chapter 02's head on SmolLM2-135M, with drift cancelled: steps 2, 3a and 3 interleaved request by request.

The chapter's benchmark times every configuration of one request back to back, then the next request, so a slow
stretch of the host lands on whichever configuration runs during it. Two runs of it disagreed on what chapter 02's
head buys on SmolLM2 (step 3 against step 3a: the masked head and the argmax over the allowed ids, everything else
equal). This script asks only that question: for each of ``--rounds`` rounds, every request of the real model runs
in the three configurations one after the other (the order reversed every other round, so neither side always
runs first), one timed generation each, Python's collector paused. A configuration's time per output token in a
round is the median over the requests; the ratio of step 3a to step 3 per round, and its range over the rounds, is
the answer, with each request's own ratio (median over rounds) beside it. Every generation writes the same tokens
as step 2's on its request, or the run fails.

GPU only, public API only. From the repository root, with SmolLM2's GGUF at ``$STUDYLOG_SMOLLM2``:

    PYTHONPATH=$PWD python lab/decode/head_interleaved.py [--rounds 10] [--batches 1]

writes ``lab/decode/results/<gpu>/head_interleaved.json`` (a ``studylog.bench.BenchRun`` file: one row per batch,
request and configuration in series ``head_interleaved``, its repetitions the rounds, each round's time in
``per_round_ms``). ``--smoke`` runs two rounds of two requests on the CPU at the ``tiny`` shape, steered, and writes
nothing: a test of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

#: Step 2, step 3a (step 2 with the automaton's cached allowed sets: host work, the dense head) and step 3 (3a with
#: chapter 02's masked head and the argmax over the allowed ids).
CONFIGS = ("jump_forward", "automaton_mask", "masked_head")
SERIES = "head_interleaved"
MAX_NEW_TOKENS = 160


def rounds_of(n: int) -> list[tuple[str, ...]]:
    """The configurations' order in each of ``n`` rounds: as listed, then reversed, alternately."""
    return [CONFIGS if r % 2 == 0 else CONFIGS[::-1] for r in range(n)]


def summarize(per_round: dict[tuple[str, str], list[float]], schemas, n_rounds: int) -> dict:
    """Per round, each configuration's median over the requests and the ratios 3a/3 and 2/3; over the rounds their
    median, least and most; per request, its ratio 3a/3 (median over the rounds)."""
    med = {c: [statistics.median(per_round[(s, c)][r] for s in schemas) for r in range(n_rounds)] for c in CONFIGS}
    head = [a / b for a, b in zip(med["automaton_mask"], med["masked_head"])]
    both = [a / b for a, b in zip(med["jump_forward"], med["masked_head"])]
    per_request = {s: statistics.median(per_round[(s, "automaton_mask")][r] / per_round[(s, "masked_head")][r]
                                        for r in range(n_rounds)) for s in schemas}
    return {"median_ms_per_round": med,
            "head_ratio": {"median": statistics.median(head), "least": min(head), "most": max(head),
                           "per_round": head},
            "step3_over_step2": {"median": statistics.median(both), "least": min(both), "most": max(both)},
            "head_ratio_per_request": per_request}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--batches", default="1")
    ap.add_argument("--smoke", action="store_true", help="two rounds, the tiny shape on the CPU; writes nothing")
    args = ap.parse_args()
    from studylog import paths, smollm2
    from studylog.bench import BenchRun, Timing, collector_paused, write_lab_output
    from studylog.decode import Decoder, Grammar, LlamaModel, model_config
    from studylog.decode import requests as real_requests
    from studylog.decode.grammar import suite_names
    from studylog.decode.model import load_smollm2
    from studylog.decode.report import REAL_MAX_SEQ, requests

    smoke = args.smoke
    n_rounds = 2 if smoke else args.rounds
    if n_rounds < 1:
        sys.exit("--rounds must be at least 1")
    device = "cpu" if smoke else "cuda"
    if smoke:
        model, vocab, tokenizer = LlamaModel(model_config("tiny"), device="cpu", dtype=torch.float32, seed=0), None, None
        schemas = suite_names()[:2]
    else:
        model = load_smollm2(device=device, dtype=torch.bfloat16)
        vocab, tokenizer = smollm2.vocabulary(), smollm2.tokenizer()
        schemas = suite_names()
    run = BenchRun("decode", command="python " + " ".join(sys.argv)) if not smoke else None
    out_rows, failed, summaries = [], [], {}
    t0 = time.perf_counter()
    for batch in [int(b) for b in args.batches.split(",")]:
        decoder = Decoder(model, vocab, batch=batch, max_seq=200 if smoke else REAL_MAX_SEQ)
        decoder.capture()
        jobs = {}
        for name in schemas:
            grammar = Grammar.from_suite(name, decoder.vocab, whitespace="compact")
            if smoke:
                prompts, targets = requests(name, batch, decoder, "compact")
            else:
                prompts, targets = real_requests.batch_ids(name, tokenizer, batch), None
            jobs[name] = (grammar, prompts, targets)

        def go(name, config):
            grammar, prompts, targets = jobs[name]
            return decoder.generate(grammar, prompts, config, max_new_tokens=64 if smoke else MAX_NEW_TOKENS,
                                    targets=targets, instrument=False)

        first = {name: go(name, CONFIGS[0]) for name in schemas}  # warm-up, and the tokens every run must write
        for name in schemas:
            for config in CONFIGS[1:]:
                go(name, config)
        per_round = {(s, c): [] for s in schemas for c in CONFIGS}
        for r, order in enumerate(rounds_of(n_rounds)):
            with collector_paused():
                for name in schemas:
                    for config in order:
                        g = go(name, config)
                        if g.ids != first[name].ids:
                            failed.append((batch, name, config, r))
                        per_round[(name, config)].append(g.ms_per_token)
            print(f"batch {batch} round {r + 1}/{n_rounds}: " + "  ".join(
                f"{c} {statistics.median(per_round[(s, c)][r] for s in schemas) * 1e3:,.0f} µs/token"
                for c in CONFIGS), flush=True)
        s = summarize(per_round, schemas, n_rounds)
        summaries[batch] = s
        h = s["head_ratio"]
        print(f"batch {batch}: step 3a / step 3 per round: median {h['median']:.3f}x, "
              f"{h['least']:.3f}-{h['most']:.3f}x over {n_rounds} rounds", flush=True)
        for name in schemas:
            for config in CONFIGS:
                params = {"model": "tiny" if smoke else "smollm2", "batch": batch, "schema": name,
                          "whitespace": "compact", "config": config}
                if run is not None:
                    run.check("same tokens as step02_jump_forward in every round",
                              not any(f[:3] == (batch, name, config) for f in failed), params=params)
                    run.record(SERIES, Timing.of(per_round[(name, config)], clock="wall"), params=params,
                               role="kernel" if config == "masked_head" else "baseline",
                               tokens=first[name].tokens, per_round_ms=per_round[(name, config)])
                out_rows.append(params)
        del decoder
    print(f"{len(out_rows)} rows, {len(failed)} generations that changed their tokens, "
          f"{time.perf_counter() - t0:.0f} s")
    if run is not None:
        run.note("Steps 2, 3a and 3 interleaved request by request on SmolLM2-135M-Instruct's real requests "
                 "(lab/decode/head_interleaved.py): a row's repetitions are its rounds (the order of the three "
                 "reversed every other round), one untimed warm-up of each first, the collector paused.")
        run.note("summary: " + json.dumps({str(b): v for b, v in summaries.items()}))
        print("->", write_lab_output(paths.LAB / "decode" / "results", run.device["name"], SERIES, run.to_json()))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
