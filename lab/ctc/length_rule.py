"""Which of chapter 4's last steps is fastest as the targets grow: the data behind ``ctc_loss``'s rule.

The benchmark's grid draws targets at T = 150 only; its stress set (blank-heavy utterances, targets of T / 3 labels)
showed the rule's step slower than the others at short T. This script times steps 11 to 14 and the entry point,
``ctc_loss``, over T in (50, 100, 150, 200, 400), N in (1, 4, 16, 64, 256), A in (28, 5000), on two kinds of input:
the grid's random targets (length uniform in [1, min(T, 255)]) and the stress set's blank-heavy ones. Every call is
checked against the float64 reference first, then timed on the GPU clock (``BenchRun.gpu_time``: a CUDA graph of
calls over rotated copies of the activations, three repetitions, spread kept).

GPU only. From the repository root (a few minutes on an H200):

    PYTHONPATH=$PWD python lab/ctc/length_rule.py [--out DIR] [--quick]

writes ``DIR/length_rule.json`` (``--out``, else ``$OUT``, else ``lab/ctc/results/<gpu>/``): a BenchRun file, one
row a (step, case), params T, N, A, inputs, positions (2 L_max + 1 of the case's longest target).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from studylog.ctc import (GRAD_TOLERANCE, LOSS_TOLERANCE, ctc_loss, errors, padded, prepare_targets, random_targets,
                          reference_ctc, step11_branch_free, step12_flush_to_zero, step13_two_passes,
                          step14_warps_per_direction, stress_inputs)
from studylog.ctc.fused import final_step

NAME = "length_rule"
STEPS = {"step11": step11_branch_free, "step12": step12_flush_to_zero, "step13": step13_two_passes,
         "step14": step14_warps_per_direction, "ctc_loss": ctc_loss}
T_VALUES, N_VALUES, A_VALUES, INPUTS = (50, 100, 150, 200, 400), (1, 4, 16, 64, 256), (28, 5000), ("random",
                                                                                                  "blank-heavy")
SEED = 4040


def case_inputs(kind: str, T: int, N: int, A: int, generator: torch.Generator):
    if kind == "random":
        lists = random_targets(T, N, A, generator)
        return torch.randn((T, N, A), generator=generator).cuda(), lists
    return stress_inputs(T, N, A, generator, "cuda")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="folder for length_rule.json (default $OUT, else lab/ctc/results/<gpu>/)")
    ap.add_argument("--quick", action="store_true", help="two cases only")
    args = ap.parse_args(argv)
    from studylog.bench import BenchRun, write_lab_output
    from studylog.paths import LAB

    started = time.perf_counter()
    command = "python lab/ctc/length_rule.py" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    run = BenchRun("ctc", command=command, quick=args.quick)
    generator = torch.Generator().manual_seed(SEED)
    cases = [(k, T, N, A) for k in INPUTS for A in A_VALUES for N in N_VALUES for T in T_VALUES]
    if args.quick:
        cases = [("blank-heavy", 50, 8, 28), ("random", 150, 16, 5000)]
    l2 = run.device.get("l2_cache_bytes") or 64 * 2**20
    for kind, T, N, A in run.progress(cases, "cases"):
        x, lists = case_inputs(kind, T, N, A, generator)
        lengths = tuple(len(l) for l in lists)
        batch = prepare_targets(padded(lists), (T,) * N, lengths, num_classes=A, max_time=T, device="cuda")
        ref = reference_ctc(x, padded(lists).cuda(), (T,) * N, lengths)
        params = {"T": T, "N": N, "A": A, "inputs": kind, "positions": batch.max_positions}
        copies = max(1, min(16, -(-4 * l2 // (x.numel() * 4))))
        for series, fn in STEPS.items():
            loss, grad = fn(x, batch)
            err = errors(loss, grad, *ref)
            ok = err["mismatched"] == 0 and err["loss_rel"] <= LOSS_TOLERANCE and err["grad_rel"] <= GRAD_TOLERANCE
            run.check(f"{series} matches the float64 reference", ok, params=params, **err)
            del loss, grad
            if not ok:
                continue

            def make_calls(fn=fn):
                calls = []
                for _ in range(copies):
                    xi = torch.randn_like(x)
                    loss, grad = torch.empty((N,), device="cuda"), torch.empty_like(xi)
                    calls.append(lambda xi=xi, loss=loss, grad=grad: fn(xi, batch, out_loss=loss, out_grad=grad))
                return calls

            timing = run.gpu_time(make_calls, repeats=3, min_calls=20, reps=10)
            extra = {"step": f"step{final_step(T, N, A, batch.max_positions):02d}"} if series == "ctc_loss" else {}
            run.record(series, timing, params=params, rotated_copies=copies, **extra)
        del x, ref, batch
    run.note(f"wall time {time.perf_counter() - started:.0f} s")
    folder = Path(args.out or os.environ.get("OUT") or LAB / "ctc" / "results")
    path = write_lab_output(folder, run.device["name"], NAME, run.to_json())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
