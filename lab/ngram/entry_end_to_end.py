"""Chapter 3: the entry point ``ngram_match`` timed end to end, beside the CPU path it replaces and the steps.

The chapter's benchmark times one kernel end to end (the call, then ``torch.cuda.synchronize()``) at every case:
step 12, bound once to its batch (``NgramMatcher``). A reader who calls the public function instead pays more on
the host: ``ngram_match`` picks its step by shape (step 7 at the small cases, step 12 at the large), checks the
values of its inputs (a device sync) and allocates its scratch on every call. This script times, at the headline's
three cases and in one run, each of:

* ``cpu_path``: step 1, the deployed path (copies to the host, the serial C loop, copies back);
* ``ngram_match``: the public function, as a reader calls it;
* ``matcher``: the step ``ngram_match`` picks, bound once to the batch (no checks, no allocation per call);
* ``step12``: step 12 bound once, the row the benchmark times end to end.

Every variant is first checked bit-identical to the CPU path, then called back to back, each call followed by a
sync, in five repetitions (median and range per call kept); the state is checked again after the timed calls.

    PYTHONPATH=$PWD python lab/ngram/entry_end_to_end.py      # GPU: writes results/<gpu>/entry_end_to_end.json

(and under ``$OUT/<gpu>/`` when ``$OUT`` is set).
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import date
from pathlib import Path

import torch

from studylog import bench
from studylog.ngram import (NO_BUDGET, NgramConfig, NgramMatcher, ngram_match, same_state, step01_cpu_path,
                            step12_skip_refused)
from studylog.ngram.kernels import final_step
from studylog.ngram.report import bench_cases

HERE = Path(__file__).resolve().parent
NAME = "entry_end_to_end"
#: The headline's cases (batch, prompt length, threshold), each the benchmark's own batch.
CASES = ((32, 512, 128), (128, 32768, 128), (256, 131072, NO_BUDGET))
REPEATS = 5
BUDGET_MS = 50.0  # wall time a repetition aims at


def batch_of(batch: int, seq_len: int, threshold: int):
    """The benchmark's own batch at this grid case (``studylog.ngram.report.bench_cases``: its generator and seed)."""
    (case,) = [c for c in bench_cases(quick=False)["grid"]
               if c.params == {"batch": batch, "seq_len": seq_len, "threshold": threshold}]
    return case.batch()


def wall_ms(call, calls: int) -> float:
    """Wall time per call (ms) of ``calls`` calls, each followed by a sync."""
    start = time.perf_counter()
    for _ in range(calls):
        call()
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e3


def end_to_end(call) -> dict:
    """Wall time per call (ms), each call followed by a sync: median and range of :data:`REPEATS` repetitions."""
    wall_ms(call, 1)  # the first call compiles and loads
    calls = max(3, min(200, int(BUDGET_MS / max(wall_ms(call, 1), 1e-3))))
    with bench.collector_paused():
        samples = [wall_ms(call, calls) for _ in range(REPEATS)]
    return {"ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples), "samples": samples,
            "calls": calls}


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("entry_end_to_end.py times GPU calls: run it on a machine with a GPU")
    rows, checks = [], []
    for batch, seq_len, threshold in CASES:
        config = NgramConfig(threshold=threshold)
        inputs, draft0, this0 = batch_of(batch, seq_len, threshold)
        params = {"batch": batch, "seq_len": seq_len, "threshold": threshold}
        cpu = NgramMatcher(step01_cpu_path, inputs, draft0.clone(), this0.clone(), config=config, check_values=False)
        cpu()
        torch.cuda.synchronize()
        expected = (cpu.draft_tokens.cpu(), cpu.seq_lens_this_time.cpu())
        picked = final_step(inputs, config)
        state = {"draft": draft0.clone(), "this": this0.clone()}

        def entry():
            ngram_match(inputs, state["draft"], state["this"], config=config)

        bound = {name: NgramMatcher(step, inputs, draft0.clone(), this0.clone(), config=config, check_values=False)
                 for name, step in (("matcher", picked), ("step12", step12_skip_refused))}
        variants = {"cpu_path": cpu, "ngram_match": entry, **bound}
        outputs = {"cpu_path": lambda: (cpu.draft_tokens, cpu.seq_lens_this_time),
                   "ngram_match": lambda: (state["draft"], state["this"]),
                   **{n: (lambda m=m: (m.draft_tokens, m.seq_lens_this_time)) for n, m in bound.items()}}
        for name, call in variants.items():
            call()
            torch.cuda.synchronize()
            ok = same_state(tuple(t.cpu() for t in outputs[name]()), expected)
            timing = end_to_end(call)
            ok_after = same_state(tuple(t.cpu() for t in outputs[name]()), expected)
            checks.append({"name": "bit-identical to the CPU path, before and after the timed calls",
                           "params": params | {"variant": name}, "passed": bool(ok and ok_after)})
            rows.append({"series": NAME, "variant": name, "params": params, "clock": "host_e2e",
                         "step": picked.__name__ if name in ("ngram_match", "matcher") else
                         (step12_skip_refused.__name__ if name == "step12" else step01_cpu_path.__name__),
                         **timing})
            print(f"{params} {name:12s} {timing['ms'] * 1e3:9.1f} µs ({timing['min_ms'] * 1e3:.1f}-"
                  f"{timing['max_ms'] * 1e3:.1f}) {'ok' if ok and ok_after else 'FAILED'}", flush=True)
        torch.cuda.empty_cache()
    device = bench.device_info()
    data = {"name": NAME, "date": date.today().isoformat(), "commit": bench.git_commit(), "device": device,
            "versions": bench.versions(), "timing": "each call followed by torch.cuda.synchronize(), wall time per "
            f"call; {REPEATS} repetitions of back-to-back calls (about {BUDGET_MS:.0f} ms each), median and range",
            "rows": rows, "checks": checks}
    for folder in [HERE / "results"] + ([Path(os.environ["OUT"])] if os.environ.get("OUT") else []):
        print("wrote", bench.write_lab_output(folder, device["name"], NAME, data))
    failed = [c for c in checks if not c["passed"]]
    if failed:
        raise SystemExit(f"{len(failed)} checks failed: {failed}")


if __name__ == "__main__":
    main()
