"""How much of chapter 8's step 2 gain over step 1 is the two-row verify layer's? Runs steps 1 and 2 (``masked_head``,
``ngram_draft``) on every extraction request at batch 1 in two speculative decoders of one model: ``tuned``, whose
verifying forward takes the six-launch layer where ``SpeculativeDecoder.tune`` measures it faster (the benchmark's
loop), and ``nine``, the same decoder with the six-launch layer kept for one-token forwards only (as chapter 7's
loop runs), so every forward of two tokens or more takes the nine-launch layer. The two decoders alternate which
runs first request by request. Writes OUT/<gpu>/verify_layer_split.json: per request and variant, each step's
milliseconds per output token (median of ``repeats`` timed runs), and the medians the page's split reads.

    python lab/speculate/verify_layer_split.py measure --out lab/speculate/results    (a GPU)
    python lab/speculate/verify_layer_split.py check --out /tmp/split                 (a CPU: one request, 8 tokens, fp32)
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from studylog import smollm2
from studylog.bench import git_commit, write_lab_output
from studylog.decode.model import load_smollm2
from studylog.decode.report import measure
from studylog.speculate import report
from studylog.speculate.loop import SpeculativeDecoder

STEPS = {"step01": "masked_head", "step02": "ngram_draft"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("check", "measure"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    gpu = args.mode == "measure"
    if gpu and not torch.cuda.is_available():
        raise SystemExit("measure needs a GPU; check runs on a CPU")
    device = "cuda" if gpu else "cpu"
    model = load_smollm2(device=device, dtype=torch.bfloat16 if gpu else torch.float32)
    vocab, tok = smollm2.vocabulary(), smollm2.tokenizer()
    decoders = {}
    for name in ("tuned", "nine"):
        spec = SpeculativeDecoder(model, vocab, batch=1, max_seq=report.MAX_SEQ, graphs=gpu)
        tuned = spec.tune()
        if name == "nine":  # one-token forwards keep the six-launch layer, as in chapter 7's loop
            spec.gemv_chunks = frozenset(T for T in spec.gemv_chunks if T == 1)
        if gpu:
            spec.capture()
        decoders[name] = (spec, tuned)
    jobs = report.batches_of("extraction", 1, tok)[: None if gpu else 1]
    max_new = report.MAX_NEW if gpu else 8  # a CPU check only runs the plumbing
    cache: dict = {}
    rows = []
    for k, (names, prompts) in enumerate(jobs):
        grammar = report.grammar_for("extraction", names[0], vocab, cache)
        order = ("tuned", "nine") if k % 2 == 0 else ("nine", "tuned")
        for variant in order:
            spec = decoders[variant][0]
            for step, config in STEPS.items():
                runs, timed = measure(spec, grammar, config, prompts, None, max_new_tokens=max_new,
                                      repeats=args.repeats if gpu else 1)
                rows.append({"request": names[0], "variant": variant, "step": step,
                             "ms_per_token": statistics.median(g.ms_per_token for g in runs),
                             "tokens": timed.tokens, "forwards": timed.forwards,
                             "two_token_forwards": sum(1 for c in timed.chunk_lengths if c == 2), "ids": timed.ids})
    same = all(a["ids"] == b["ids"] for a in rows for b in rows
               if a["request"] == b["request"] and a["step"] == b["step"] and a["variant"] != b["variant"])
    for r in rows:
        del r["ids"]

    def med(variant: str, step: str) -> float:
        return statistics.median(r["ms_per_token"] for r in rows if r["variant"] == variant and r["step"] == step)

    summary = {v: {s: med(v, s) for s in STEPS} for v in decoders}
    summary["draft_verify"] = summary["tuned"]["step01"] / summary["nine"]["step02"]
    summary["layer"] = summary["nine"]["step02"] / summary["tuned"]["step02"]
    summary["step2_over_step1"] = summary["tuned"]["step01"] / summary["tuned"]["step02"]
    name = torch.cuda.get_device_name() if gpu else "cpu"
    data = {"command": f"python lab/speculate/verify_layer_split.py {args.mode}", "git_commit": git_commit(),
            "device": name, "torch": torch.__version__, "repeats": args.repeats,
            "gemv_chunks": {v: sorted(d[0].gemv_chunks) for v, d in decoders.items()},
            "tune_ms": {str(T): t for T, t in decoders["tuned"][1].items()},
            "same_tokens_in_both_variants": same, "summary": summary, "rows": rows}
    path = write_lab_output(Path(args.out), name, "verify_layer_split", data)
    print(path, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in summary.items()})
    if not same:
        print("note: the two layers' tokens differ somewhere (near ties sum in another order on the two layers)")


if __name__ == "__main__":
    main()
