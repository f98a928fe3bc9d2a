"""Why does chapter 8's loop write the `classifier` request (one forward: the prefill, then forced tokens) faster
than chapter 7's loop at batch 1? Times the first step of each loop on that request, alternating which loop runs
first, with CUDA events around the prefill's forward alone, and writes what it measured to OUT/prefill_probe.json.

    python lab/speculate/prefill_probe.py --out DIR      (on a GPU, with STUDYLOG_SMOLLM2 set)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from studylog import smollm2
from studylog.decode.loop import Decoder
from studylog.decode.model import load_smollm2
from studylog.speculate import report
from studylog.speculate.loop import SpeculativeDecoder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    model = load_smollm2(device="cuda", dtype=torch.bfloat16)
    vocab, tok = smollm2.vocabulary(), smollm2.tokenizer()
    spec = SpeculativeDecoder(model, vocab, batch=1, max_seq=report.MAX_SEQ)
    ch7 = Decoder(model, vocab, batch=1, max_seq=report.MAX_SEQ, chunk_sizes=spec.chunk_sizes)
    spec.tune()
    spec.capture()
    ch7.capture()
    names, prompts = next((n, p) for n, p in report.batches_of("low_copy", 1, tok) if n[0] == "classifier")
    grammar = report.grammar_for("low_copy", names[0], vocab, {})
    runs = {"ch7_step03": (ch7, "masked_head"), "step04": (spec, "gated_draft"), "step01": (spec, "masked_head")}
    out = {k: {"first_step_ms": [], "wall_ms": [], "forward_ms": []} for k in runs}
    # the forward alone: the eager prefill at the prompt's length, every=False (chapter 7) and True (chapter 8)
    T = len(prompts[0])
    toks = torch.tensor([prompts[0]], device="cuda")
    start = torch.zeros(1, dtype=torch.int64, device="cuda")
    last = torch.full((1,), T - 1, dtype=torch.int64, device="cuda")
    forward = {"every=False": lambda: model(toks, start, last, ch7.cache, every=False),
               "every=True": lambda: model(toks, start, last, spec.cache, every=True)}
    fwd = {k: [] for k in forward}
    for rnd in range(args.rounds):
        order = list(runs) if rnd % 2 == 0 else list(reversed(runs))
        for k in order:
            decoder, config = runs[k]
            g = decoder.generate(grammar, prompts, config, max_new_tokens=report.MAX_NEW)
            out[k]["first_step_ms"].append(g.first_step_ms)
            out[k]["wall_ms"].append(g.ms["wall"])
        for k in (forward if rnd % 2 == 0 else reversed(list(forward))):
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            a.record()
            forward[k]()
            b.record()
            b.synchronize()
            fwd[k].append({"gpu_ms": a.elapsed_time(b), "host_ms": (time.perf_counter() - t0) * 1e3})
    result = {"request": names[0], "prompt_tokens": T, "rounds": args.rounds,
              "loops": {k: {m: {"median": statistics.median(v), "all": v} for m, v in d.items() if v}
                        for k, d in out.items()},
              "forward_alone": {k: {"gpu_ms_median": statistics.median(x["gpu_ms"] for x in v),
                                    "host_ms_median": statistics.median(x["host_ms"] for x in v), "all": v}
                                for k, v in fwd.items()}}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "prefill_probe.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v["first_step_ms"]["median"] for k, v in result["loops"].items()}),
          json.dumps({k: (v["gpu_ms_median"], v["host_ms_median"]) for k, v in result["forward_alone"].items()}))


if __name__ == "__main__":
    main()
