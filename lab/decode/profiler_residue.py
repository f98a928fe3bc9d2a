"""Does a decode loop run slower in a process that has used torch's profiler once?

The benchmark counts the body's kernels with torch's profiler (CUPTI) before its timed sweep. In that
process, the loop's steps came out about a tenth of a millisecond longer than in a process that never
profiled (``gc_pauses.py``, same requests). This script times a few requests at the ~1B shape, batch 1,
then profiles one forward of the body (as the benchmark's ``count_kernels`` does), then times them again.

Public API only. On a GPU, from the repository root (under a minute):

    python lab/decode/profiler_residue.py [--repeats 6] [--out DIR]

``--out DIR`` writes ``DIR/<gpu>/profiler_residue.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch


def main() -> None:
    from studylog.bench import collector_paused, write_lab_output
    from studylog.decode import Decoder, Grammar, LlamaModel, model_config
    from studylog.decode.report import count_kernels, requests

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schemas", default="product,tool_call")
    ap.add_argument("--configs", default="baseline,masked_head")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    names = args.schemas.split(",")
    model = LlamaModel(model_config("1b"), device="cuda", dtype=torch.bfloat16, seed=0)
    decoder = Decoder(model, batch=1, max_seq=512)  # cl100k over the head's rows
    grammars = {n: Grammar.from_suite(n, decoder.vocab, whitespace="compact") for n in names}
    decoder.capture()

    def timed(stage: str) -> list[dict]:
        rows = []
        for name in names:
            prompts, targets = requests(name, 1, decoder)
            for config in args.configs.split(","):
                decoder.generate(grammars[name], prompts, config, max_new_tokens=160, targets=targets,
                                 instrument=False)
                with collector_paused():
                    runs = [decoder.generate(grammars[name], prompts, config, max_new_tokens=160,
                                             targets=targets, instrument=False) for _ in range(args.repeats)]
                    inst = decoder.generate(grammars[name], prompts, config, max_new_tokens=160, targets=targets,
                                            instrument=True)
                ms = [g.ms_per_token for g in runs]
                body = inst.breakdown_per_token()["body"]
                rows.append({"stage": stage, "schema": name, "config": config, "ms_per_token": ms,
                             "instrumented_body_ms_per_token": body})
                print(f"{stage:22s} {name:12s} {config:12s} ms/token median {statistics.median(ms):.3f} "
                      f"(min {min(ms):.3f}, max {max(ms):.3f}); body per token (instrumented) {body:.3f}")
        return rows

    rows = timed("never profiled")
    kernels = count_kernels(decoder.body_call(1))
    print(f"profiled one forward: {sum(kernels.values())} kernels")
    rows += timed("after the profiler")
    out = {"gpu": torch.cuda.get_device_name(), "model": "1b", "batch": 1, "repeats": args.repeats, "rows": rows,
           "torch": torch.__version__}
    if args.out is not None:
        print(f"wrote {write_lab_output(args.out, torch.cuda.get_device_name(), 'profiler_residue', out)}")
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
