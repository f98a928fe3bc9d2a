"""Why some repetitions of one decode request take half as long again as the others: Python's garbage collector.

On one H100 host the benchmark's masked-head rows came out bimodal (for one schema: 1.24 ms per token in some
repetitions, 1.83 in others), while the baseline beside them varied by under 1%. This script repeats a few
requests at the ~1B shape, batch 1, and records per repetition its time per output token and the time the
cyclic garbage collector spent in it (``gc.callbacks``: the pause of each collection, by generation), first
with the collector on, as a plain Python loop runs, then with it paused as the benchmark now times
(``studylog.bench.collector_paused``).

Public API only. On a GPU, from the repository root (a minute or two):

    python lab/decode/gc_pauses.py [--schemas product,tool_call,...] [--repeats 8] [--out DIR]

``--out DIR`` writes ``DIR/<gpu>/gc_pauses.json``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

import torch


class Pauses:
    """The collector's pauses (ms), by generation, while ``on``."""

    def __init__(self):
        self.ms = {0: 0.0, 1: 0.0, 2: 0.0}
        self.count = {0: 0, 1: 0, 2: 0}
        self._t = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            g = info["generation"]
            self.ms[g] += (time.perf_counter() - self._t) * 1e3
            self.count[g] += 1

    def reset(self) -> None:
        for g in self.ms:
            self.ms[g], self.count[g] = 0.0, 0


def main() -> None:
    from studylog.bench import collector_paused, write_lab_output
    from studylog.decode import Decoder, Grammar, LlamaModel, model_config, suite_names
    from studylog.decode.report import requests

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="1b")
    ap.add_argument("--schemas", default="product,tool_call,article_summary,calendar_event")
    ap.add_argument("--configs", default="baseline,masked_head")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--device", default="cuda", help="cpu with --model tiny: a smoke test of the script")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    # the benchmark's heap: every grammar of the suite compiled, as the sweep has them by its later schemas
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = LlamaModel(model_config(args.model), device=args.device, dtype=dtype, seed=0)
    decoder = Decoder(model, batch=1, max_seq=512)  # cl100k over the head's rows
    grammars = {n: Grammar.from_suite(n, decoder.vocab, whitespace="compact") for n in suite_names()}
    decoder.capture()
    gc.collect()
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"{gpu}: {len(gc.get_objects())} objects tracked by the collector; "
          f"a full collection now takes ", end="")
    t = time.perf_counter()
    gc.collect()
    full_ms = (time.perf_counter() - t) * 1e3
    print(f"{full_ms:.1f} ms")
    pauses = Pauses()
    gc.callbacks.append(pauses)
    rows = []
    for name in args.schemas.split(","):
        prompts, targets = requests(name, 1, decoder)
        for config in args.configs.split(","):
            decoder.generate(grammars[name], prompts, config, max_new_tokens=160, targets=targets, instrument=False)
            for mode in ("collector on", "collector paused"):
                per_token, paused_ms, full = [], [], []
                for _ in range(args.repeats):
                    pauses.reset()
                    if mode == "collector on":
                        g = decoder.generate(grammars[name], prompts, config, max_new_tokens=160, targets=targets,
                                             instrument=False)
                    else:
                        with collector_paused():
                            pauses.reset()  # the one collection before the block is not the request's
                            g = decoder.generate(grammars[name], prompts, config, max_new_tokens=160,
                                                 targets=targets, instrument=False)
                    per_token.append(g.ms_per_token)
                    paused_ms.append(sum(pauses.ms.values()) / max(g.tokens, 1))
                    full.append(pauses.count[2])
                row = {"schema": name, "config": config, "mode": mode, "ms_per_token": per_token,
                       "gc_ms_per_token": paused_ms, "full_collections": full}
                rows.append(row)
                print(f"{name:16s} {config:12s} {mode:16s} ms/token min {min(per_token):.3f} median "
                      f"{statistics.median(per_token):.3f} max {max(per_token):.3f}; collector "
                      f"{statistics.median(paused_ms):.3f} ms/token median, {max(paused_ms):.3f} max; "
                      f"full collections {sum(full)}")
    gc.callbacks.remove(pauses)
    out = {"gpu": gpu, "model": args.model, "batch": 1, "repeats": args.repeats,
           "tracked_objects": len(gc.get_objects()), "full_collection_ms": full_ms, "rows": rows,
           "python": __import__("platform").python_version(), "torch": torch.__version__}
    if args.out is not None:
        print(f"wrote {write_lab_output(args.out, gpu, 'gc_pauses', out)}")
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
