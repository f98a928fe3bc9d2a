"""What practitioners would run instead, on the real model: Hugging Face ``generate`` with xgrammar's logits
processor beside the chapter's three steps, on the same requests, same clock (ms per output token, the request's
wall time over its tokens, prefill included), batch 1.

SmolLM2-135M-Instruct answers each suite entry's real request (``studylog.decode.requests``), unsteered, greedy.
For every request: step 1, 2 and 3 timed (``report.measure``: a warm-up, ``--repeats`` timed runs), then
``peers.time_hf`` on the same prompt, and whether HF wrote step 1's tokens (its logits are rounded to bf16 before
the mask, so a near-tie may go the other way).

Public API only. On a GPU, from the repository root, with the model's file at ``$STUDYLOG_SMOLLM2``:

    python lab/decode/hf_peer.py [--repeats 3] [--out DIR]

``--out DIR`` writes ``DIR/<gpu>/hf_peer.json``.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch


def main() -> None:
    from studylog import smollm2
    from studylog.bench import write_lab_output
    from studylog.decode import Decoder, Grammar, load_smollm2, peers, report, requests, suite_names

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--schemas", default=None, help="comma-separated suite entries (default: all)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    model = load_smollm2(device="cuda")
    vocab, tok = smollm2.vocabulary(), smollm2.tokenizer()
    decoder = Decoder(model, vocab, batch=1, max_seq=1024)
    decoder.capture()
    hf = peers.hf_model(model)
    rows = []
    for name in args.schemas.split(",") if args.schemas else suite_names():
        grammar = Grammar.from_suite(name, vocab, whitespace="compact")
        prompt = requests.chat_ids(name, tok)
        row = {"schema": name, "prompt_tokens": len(prompt)}
        for config in ("baseline", "jump_forward", "masked_head"):
            runs, timed = report.measure(decoder, grammar, config, [prompt], None,
                                         max_new_tokens=args.max_new_tokens, repeats=args.repeats)
            row[config] = {"ms_per_token": statistics.median(g.ms_per_token for g in runs), "tokens": timed.tokens,
                           "forwards": timed.forwards}
            if config == "baseline":
                step01 = timed.ids[0]
        hf_time = peers.time_hf(hf, grammar, prompt, max_new_tokens=args.max_new_tokens, repeats=args.repeats)
        row["hf_generate"] = {"ms_per_token": hf_time.ms_per_token, "per_repeat": hf_time.per_repeat,
                              "tokens": len(hf_time.ids), "same_tokens_as_step01": hf_time.ids == step01,
                              "repeatable": hf_time.repeatable}
        rows.append(row)
        print(name, {k: round(v["ms_per_token"], 3) for k, v in row.items() if isinstance(v, dict)})
    gpu = torch.cuda.get_device_name()
    data = {"gpu": gpu, "model": model.config.name, "repeats": args.repeats, "rows": rows}
    if args.out is not None:
        print(write_lab_output(args.out, gpu, "hf_peer", data))


if __name__ == "__main__":
    main()
