"""Step 7's three changes one at a time: what each buys against step 5 (chapter 4).

Step 7 (``step07_gradient_pass``) changes three things against step 5 (``step05_shared_rows``): the gradient leaves
beta's loop for a pass of its own, T N blocks of one frame each, after recursions that write every row; alpha and
beta run in one kernel instead of two launches; and the recursion loads its emissions four frames ahead
(``PREFETCH``). The sub-steps add them in that order, each differing from the one before in one change:

| row | gradient | alpha and beta | emissions | function |
|---|---|---|---|---|
| step 5 | in beta's loop | two kernels | when needed | ``ctc.step05_shared_rows`` |
| 7a | a pass of its own | two launches, a direction each | when needed | ``step07a_gradient_pass_two_launches`` |
| 7b | a pass of its own | one kernel, alpha then beta | when needed | ``step07b_one_kernel`` |
| step 7 | a pass of its own | one kernel, alpha then beta | four frames ahead | ``ctc.step07_gradient_pass`` |

7a and 7b (below) launch instances of ``ctc_block_recursion_knobs`` in step 7's source (``DIRECTIONS``: the
directions a launch runs, ``DEPTH``: frames prefetched), between step 7's own first and last passes; with the knobs
at step 7's values that kernel compiles to step 7's recursion (``tests/test_ctc.py`` holds it). No kernel is copied.

The cases are the chapter's (T = 150): both alphabets at one utterance and at the full batch, the ends of the
lesson points step 7's number in the chapter spans (``report.LESSON_N``), among them its headline case (A = 5,000,
N = 256) and the case its text names (A = 5,000, N = 1); ``--cases`` takes any point of the grid. The inputs are
the benchmark's: its generator (``report.BENCH_SEED``) replayed over its grid in its order, so each case has the
targets, and the launch shape, of the committed run.
Each output is checked against the float64 reference first (``report.check_step``: the benchmark's tolerances),
and 7a's and 7b's against step 7's bits; then each is timed as the benchmark times a step (``report.timed``: CUDA
graph replay over rotated copies of the activations, repetitions with their spread kept, host time per call
beside it), all four in the same run.

GPU only. From the repository root (about a minute on an H200):

    PYTHONPATH=$PWD python lab/ctc/step07_changes.py [--cases 5000x256,5000x1,...] [--out DIR]
    PYTHONPATH=$PWD python lab/ctc/step07_changes.py --dry-run    # CPU: the cases and their launches, no timing

writes ``DIR/step07_changes.json`` (``--out``, else ``$OUT``, else ``lab/ctc/results/<gpu>/``): a
``studylog.bench.BenchRun`` file with a ``meta`` block (device, versions, date, commit from ``$STUDYLOG_COMMIT``,
command), one row per case and variant (series ``step05``, ``step07a``, ``step07b``, ``step07``), and its checks.
``book.ctc.lesson.step07_changes`` reads it for notebook 04's step 7.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from book.ctc.compiled import PREFETCH_FRAMES
from studylog import ctc
from studylog.ctc import fused, report
from studylog.ctc.launch import kernels, run_step, workspace_addresses

NAME = "step07_changes"
#: (A, N) at T = BENCH_T: both alphabets at the first and last of the lesson points' batch sizes.
CASES = tuple((A, N) for A in report.BENCH_A for N in (report.LESSON_N[0], report.LESSON_N[-1]))
#: label -> (series, the change the row adds to the one before it)
VARIANTS = {
    "step 5": ("step05", "the chapter's step 5"),
    "7a": ("step07a", "+ the gradient a pass of its own (alpha and beta two launches, emissions loaded when needed)"),
    "7b": ("step07b", "+ alpha and beta in one kernel"),
    "step 7": ("step07", f"+ emissions loaded {PREFETCH_FRAMES} frames ahead"),
}


#: Step 7 taken apart: each part's launches of ``ctc_block_recursion_knobs`` (a ``DIRECTIONS`` mask each: 1 alpha,
#: 2 beta, 3 both) and the frames they prefetch (``DEPTH``; 0: loaded when needed).
PARTS: dict[str, tuple[tuple[int, ...], int]] = {"7a": ((1, 2), 0), "7b": ((3,), 0)}
KNOBS = "ctc_block_recursion_knobs"
#: Step 7's source, which holds its passes and the knob kernel (whose signature is step 7's recursion's).
SOURCE = fused.SOURCES["ctc_block_recursion"]


def part_kernel_names(part: str, v: int) -> tuple[str, ...]:
    """Step 7's first pass, ``part``'s recursion launches at ``v`` positions per thread, step 7's last pass."""
    first, _, last = fused.fused_kernel_names(7, v)
    launches, depth = PARTS[part]
    return first, *(f"{KNOBS}<{v}, true, {d}, {depth}>" for d in launches), last


def _wanted(names) -> list[tuple[str, list[str]]]:
    return [(n, fused.SIGNATURES["ctc_block_recursion" if n.startswith(KNOBS) else n]) for n in names]


def preload_parts(grains) -> None:
    """Compile every part's kernels at ``grains`` in one NVRTC call."""
    kernels(SOURCE, _wanted(dict.fromkeys(n for v in grains for part in PARTS for n in part_kernel_names(part, v))))


_LAUNCH: dict[tuple[str, int], list] = {}


def launch_part(x, batch, loss, grad, zero_infinity: bool, part: str) -> None:
    """Step 7's launch (``fused.launch`` at step 7: its passes, workspace and arguments) with its recursion as
    ``part``'s launches of the knob kernel, in order on the stream (7a: alpha's, then beta's)."""
    T, N, A = x.shape
    v, recursion_threads = fused.launch_shape(7, batch.max_positions)
    if (part, v) not in _LAUNCH:
        _LAUNCH[(part, v)] = kernels(SOURCE, _wanted(part_kernel_names(part, v)))
    first, *recursions, last = _LAUNCH[(part, v)]
    vectorised = int(A % 4 == 0 and x.data_ptr() % 16 == 0 and grad.data_ptr() % 16 == 0)
    threads = 64 if A <= 512 else 256
    row_stride = recursion_threads * v
    buffer, (log_probs, rows, row_shift) = workspace_addresses(
        x.device, fused.scratch_sizes(7, T, N, A, batch.label_stride, row_stride))
    first((T * N,), (threads,), x, batch.input_lengths, log_probs, N, A, vectorised)
    for recursion in recursions:
        recursion((N, 1), (recursion_threads,), log_probs, batch.labels, batch.input_lengths, batch.target_lengths,
                  rows, row_shift, T, N, batch.label_stride, A)
    last((T * N,), (threads,), log_probs, rows, row_shift, batch.input_lengths, batch.target_lengths, batch.labels,
         batch.slot_class, batch.slot_start, batch.slot_members, batch.num_slots, grad, loss, T, N, A,
         batch.label_stride, batch.slot_stride, row_stride, vectorised, int(zero_infinity))
    del buffer  # queued: the memory may be reused by the next allocation on this stream


def step07_part(part: str, activations, targets, input_lengths=None, target_lengths=None, *, zero_infinity=False,
                out_loss=None, out_grad=None):
    """Step 7 with its recursion as ``PARTS[part]`` launches it (step 7's arguments and checks)."""
    return run_step(launch_part, activations, targets, input_lengths, target_lengths, out_loss, out_grad,
                    zero_infinity, part)


def step07a_gradient_pass_two_launches(*args, **kwargs):
    """Step 7a: step 5 with step 7's gradient pass; alpha and beta stay two launches, emissions loaded when needed."""
    return step07_part("7a", *args, **kwargs)


def step07b_one_kernel(*args, **kwargs):
    """Step 7b: 7a with alpha, then beta, in one kernel; step 7 without its emissions prefetched."""
    return step07_part("7b", *args, **kwargs)


FUNCTIONS = {"step 5": ctc.step05_shared_rows, "7a": step07a_gradient_pass_two_launches,
             "7b": step07b_one_kernel, "step 7": ctc.step07_gradient_pass}


def parse_cases(text: str | None) -> list[tuple[int, int]]:
    """``"5000x256,28x1"`` -> [(5000, 256), (28, 1)]; every case a point of the benchmark's grid."""
    if not text:
        return list(CASES)
    grid = set(report.grids()["main"])
    cases = []
    for item in text.split(","):
        try:
            A, N = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--cases: {item!r} is not AxN (e.g. 5000x256)") from None
        if (A, N) not in grid:
            raise SystemExit(f"--cases: {A}x{N} is not a point of the benchmark's grid "
                             f"(A in {report.BENCH_A}, N in {report.BENCH_N})")
        cases.append((A, N))
    return list(dict.fromkeys(cases))


def benchmark_inputs(cases):
    """(A, N, activations on the CPU, target lists) of each case, drawn as the benchmark draws its grid: one
    generator seeded ``BENCH_SEED``, the targets then the activations of every point, in the grid's order."""
    generator = torch.Generator().manual_seed(report.BENCH_SEED)
    wanted = set(cases)
    found = {}
    for A, N in report.grids()["main"]:
        lists = report.random_targets(report.BENCH_T, N, A, generator)
        x = torch.randn((report.BENCH_T, N, A), generator=generator)
        if (A, N) in wanted:
            found[(A, N)] = (A, N, x, lists)
            if len(found) == len(wanted):
                break
    return [found[c] for c in cases]


def describe(A: int, N: int, lists) -> str:
    """A case and the launch shapes its targets give step 5 and step 7's recursion."""
    longest = max(len(l) for l in lists)
    positions = 2 * longest + 1
    v, threads = fused.launch_shape(7, positions)
    names = {part: (fused.fused_kernel_names(7, v) if part == "step 7" else part_kernel_names(part, v))[1:-1]
             for part in ("7a", "7b", "step 7")}
    return (f"A = {A}, N = {N}: longest target {longest} ({positions} positions); step 5 and step 7's recursion: "
            f"{v} positions a thread, {threads} threads; recursions " +
            "; ".join(f"{part} {' then '.join(n)}" for part, n in names.items()))


def measure(run, cases) -> None:
    """Each case: every variant checked against the float64 reference (7a and 7b also against step 7's bits),
    then every variant timed on the benchmark's clock."""
    device = torch.device("cuda")
    T = report.BENCH_T
    fused.preload_fused(7, (1, 2, 3))  # the grains T = 150 needs
    preload_parts((1, 2, 3))
    for A, N, x_cpu, lists in benchmark_inputs(cases):
        print(describe(A, N, lists), flush=True)
        x = x_cpu.to(device)
        del x_cpu
        params = {"T": T, "N": N, "A": A}
        batch = report.prepared_batch(lists, T, A, device)
        ref = report.reference_of(x, lists)
        floor = run.floor_ms(report.dram_bytes(T, N, A))
        outputs, errors = {}, {}
        for label, (series, _) in VARIANTS.items():
            loss, grad = FUNCTIONS[label](x, batch)
            errors[label] = report.check_step(run, SimpleNamespace(number=5 if label == "step 5" else 7,
                                                                    series=series), loss, grad, ref, batch, params)
            outputs[label] = (loss, grad)
        for label in ("7a", "7b"):
            same = all(torch.equal(a.view(torch.int32), b.view(torch.int32))
                       for a, b in zip(outputs[label], outputs["step 7"]))
            run.check(f"{VARIANTS[label][0]} gives step07's bits", same, params=params)
        del outputs, ref
        shape = report.recursion_shape(7, batch.max_positions)
        line = []
        for label, (series, change) in VARIANTS.items():
            function = FUNCTIONS[label]
            row = report.timed(run, series, lambda f=function: f(x, batch), params, x=x,
                                calls_on=report.with_outputs(lambda xi, f=function, **out: f(xi, batch, **out)),
                                floor_ms=floor, label=label, change=change, **shape, **errors[label])
            line.append(f"{label} {row['ms'] * 1e3:,.1f}")
        print(f"A = {A}, N = {N}, µs on the GPU clock: " + "  ".join(line), flush=True)
        del x, batch
        torch.cuda.empty_cache()


def output_folder(out: str | None) -> Path | None:
    """``--out``, else ``$OUT``, else None (the lab's results folder for this GPU)."""
    chosen = out or os.environ.get("OUT")
    return Path(chosen) if chosen else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", help="AxN,... points of the benchmark's grid at T = 150 (default: the lesson points "
                                    f"{', '.join(f'{A}x{N}' for A, N in CASES)})")
    ap.add_argument("--out", help="folder for step07_changes.json (default $OUT, else lab/ctc/results/<gpu>/)")
    ap.add_argument("--dry-run", action="store_true", help="CPU only: the cases, their inputs and launch shapes")
    args = ap.parse_args(argv)
    cases = parse_cases(args.cases)
    started = time.perf_counter()
    if args.dry_run:
        for A, N, _, lists in benchmark_inputs(cases):
            print(describe(A, N, lists))
        folder = output_folder(args.out)
        where = folder / f"{NAME}.json" if folder else f"lab/ctc/results/<gpu>/{NAME}.json"
        print(f"{len(cases)} cases x {len(VARIANTS)} variants ({', '.join(VARIANTS)}); a GPU run writes {where} "
              f"({time.perf_counter() - started:.0f} s)")
        return 0
    from studylog.bench import BenchRun, git_commit, versions, write_lab_output
    from studylog.paths import LAB

    command = "python lab/ctc/step07_changes.py" + "".join(f" {a}" for a in (argv if argv is not None
                                                                              else sys.argv[1:]))
    run = BenchRun("ctc", command=command)
    run.note("Step 7's three changes one at a time (lab/ctc/step07_changes.py): step 5, 7a (the gradient a pass of "
             "its own), 7b (+ alpha and beta in one kernel), step 7 (+ emissions prefetched); the benchmark's inputs "
             "and clock (studylog.ctc.report.timed).")
    measure(run, cases)
    run.note(f"The run took {time.perf_counter() - started:.0f} s.")
    data = run.to_json()
    data["meta"] = {"device": data["device"], "versions": versions(), "date": data["date"], "commit": git_commit(),
                    "command": command}
    data["variants"] = [{"label": label, "series": series, "change": change, "function": FUNCTIONS[label].__name__}
                        for label, (series, change) in VARIANTS.items()]
    data["cases"] = [{"T": report.BENCH_T, "A": A, "N": N} for A, N in cases]
    folder = output_folder(args.out)
    if folder is None:
        path = write_lab_output(LAB / "ctc" / "results", run.device["name"], NAME, data)
    else:
        import json

        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{NAME}.json"
        path.write_text(json.dumps(data, indent=1) + "\n")
    bad = [c for c in run.checks if not c["passed"]]
    print(f"{len(run.rows)} rows, {len(run.checks)} checks ({len(bad)} failed) in "
          f"{time.perf_counter() - started:.0f} s -> {path}")
    for c in bad:
        print("FAILED:", c["name"], c["params"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
