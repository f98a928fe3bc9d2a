"""Each case's own latency floor (chapter 4): the recursion's chain of T dependent frames over the states of the
longest target the benchmark draws at that case.

The chapter's floor of a case is the larger of its bytes and its chain of dependent frames. The benchmark's tails run
times that chain at two states counts only (the small alphabet's first utterance and the headline's longest target),
so for the other cases the first is only a lower bound. This script times the chain at every point of the
benchmark's grid (T = 150, A in ``report.BENCH_A``, N in ``report.BENCH_N``), each at the states its own longest
target needs: ``2 L + 1`` for the targets the benchmark draws there (``studylog.tails.ctc_bench_targets``, the
benchmark's generator replayed over its grid). Same kernel and clock as the tails run: ``chain_floor`` replayed in a
CUDA graph (``BenchRun.gpu_time``), three repetitions, spread kept.

GPU only. From the repository root (well under a minute on an H200):

    PYTHONPATH=$PWD python lab/ctc/case_chains.py [--out DIR]
    PYTHONPATH=$PWD python lab/ctc/case_chains.py --dry-run     # CPU: each case's states, no timing

writes ``DIR/case_chains.json`` (``--out``, else ``$OUT``, else ``lab/ctc/results/<gpu>/``): a BenchRun file with
one row a case (series ``ctc recursion chain, the case's longest target``, params T, N, A, frames, states).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from studylog.ctc import report
from studylog.tails import ctc_bench_targets

NAME = "case_chains"
SERIES = "ctc recursion chain, the case's longest target"


def case_states() -> list[tuple[int, int, int]]:
    """(A, N, states) of every point of the benchmark's grid at T = BENCH_T: 2 L + 1 of its longest target."""
    return [(A, N, 2 * max(map(len, ctc_bench_targets(report.BENCH_T, N, A))) + 1)
            for A, N in report.grids()["main"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="folder for case_chains.json (default $OUT, else lab/ctc/results/<gpu>/)")
    ap.add_argument("--dry-run", action="store_true", help="CPU only: each case's states")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    cases = case_states()
    if args.dry_run:
        for A, N, states in cases:
            print(f"A = {A}, N = {N}: {states} states")
        return 0
    from studylog.bench import BenchRun, write_lab_output
    from studylog.ctc.floor import chain_floor, chain_threads
    from studylog.paths import LAB

    command = "python lab/ctc/case_chains.py" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    run = BenchRun("ctc", command=command)
    T = report.BENCH_T
    for A, N, states in run.progress(cases, "cases"):
        out = torch.empty((states,), dtype=torch.float32, device="cuda")
        run.measure(SERIES, lambda: [lambda: chain_floor(T, states, out=out)], role="baseline",
                    params={"T": T, "N": N, "A": A, "frames": T, "states": states}, floor="latency",
                    threads=chain_threads(states))
    run.note(f"Each case's own chain (lab/ctc/case_chains.py); the run took {time.perf_counter() - started:.0f} s.")
    data = run.to_json()
    chosen = args.out or os.environ.get("OUT")
    if chosen:
        path = Path(chosen) / f"{NAME}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
    else:
        path = write_lab_output(LAB / "ctc" / "results", run.device["name"], NAME, data)
    for row in data["measurements"]:
        p = row["params"]
        print(f"A = {p['A']}, N = {p['N']}: {p['states']} states, {row['ms'] * 1e3:.2f} µs")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
