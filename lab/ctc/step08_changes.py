"""Step 8's changes, one at a time: step 8 minus one change, each timed beside step 8 and step 7.

Step 8 of chapter 4 (``step08_branch_free``, launched with ``fused.DEFAULT_RECURSION``) changes two things in
step 7's warp recursion, and its template has two more options that its default leaves off:

* change 1 undone (``branch put back``): step 7's recursion, its branch between the two- and the three-term
  log-sum-exp included, with step 8's flush-to-zero ``ex2``/``lg2`` (``variants/ctc_step08_changes.cu``);
* change 2 undone (``exp2f and __log2f``): step 8 without flush-to-zero, the library's option ``"branch-free"``;
* options step 8 does not use, added to it (``"+ redux max"``: the row maximum as one ``redux.sync``;
  ``"+ prefetch 8"``: that, and the emissions prefetched eight frames ahead instead of four).

Every row runs step 7's first and last passes around its recursion, as step 8 does. A three-term sum whose third
term is ``-inf`` equals the two-term one, so ``branch put back`` and the two options should match step 8 bit for
bit, and ``exp2f and __log2f`` should match step 7 bit for bit; ``check`` says whether they do, and holds every
row to the chapter's float64 reference.

    PYTHONPATH=$PWD python lab/ctc/step08_changes.py check --compile-only  # CPU: NVRTC, registers, branches
    PYTHONPATH=$PWD python lab/ctc/step08_changes.py check                 # GPU: every variant against float64
    PYTHONPATH=$PWD python lab/ctc/step08_changes.py measure               # GPU -> results/<gpu>/step08_changes.json

``measure`` times what ``step07_changes.py`` times, the same way: the cases of the chapter's table of steps and
one middle point of the benchmark grid, on the benchmark's inputs, on the GPU clock (CUDA-graph replay over
``report.copies`` fresh copies of the activations, ``report.graph_settings``, three repetitions).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from lab.ctc.step07_changes import (MIDDLE_CASE, SENTINEL, bench_inputs, check_cases, ptx_opcodes, row_threads,
                                    same_bits)
from studylog import ctc, cuda, paths
from studylog.ctc import fused, report
from studylog.ctc.launch import kernels, workspace_addresses
from studylog.ctc.peers import padded
from studylog.ctc.reference import GRAD_TOLERANCE, LOSS_TOLERANCE, errors, reference_ctc

SOURCE = Path(__file__).resolve().parent / "variants" / "ctc_step08_changes.cu"
RESULT_NAME = "step08_changes"
#: Positions per lane compiled (the library's WARP_GRAINS up to 320 positions, as step07_changes.py).
LANE_GRAINS = tuple(v for v in fused.WARP_GRAINS if v <= 10)

#: (name, how it runs, the change of step 8 it undoes or None, the option it adds or None). ``("library", option)``
#: is ``ctc.step08_branch_free(..., recursion=option)``; ``("branched", ftz)`` is the lab's recursion.
VARIANTS = [
    ("branch put back", ("branched", True), 1, None),
    ("exp2f and __log2f", ("library", "branch-free"), 2, None),
    ("+ redux max", ("library", "+ redux max"), None, "+ redux max"),
    ("+ prefetch 8", ("library", "+ prefetch 8"), None, "+ prefetch 8"),
]
#: What each row should match bit for bit: step 8, but for flush-to-zero undone (step 7's arithmetic).
SAME_AS = {"branch put back": "step 8", "exp2f and __log2f": "step 7", "+ redux max": "step 8",
           "+ prefetch 8": "step 8"}
#: The frozen copy of step 7's recursion (FTZ = false), compiled and checked, not timed.
STEP7_COPY = ("step 7 copy", ("branched", False))


def branched_name(v: int, ftz: bool) -> str:
    return f"v8_branched_recursion<{v}, {str(ftz).lower()}>"


INSTANCES = [branched_name(v, ftz) for v in LANE_GRAINS for ftz in (True, False)]


def _passes() -> list:
    """Step 7's first and last passes, the library's kernels (step 8 launches them)."""
    return kernels(fused.SOURCES["ctc_fused_stats"],
                   [(name, fused.SIGNATURES[name]) for name in ("ctc_fused_stats", "ctc_fused_grad")])


def launch_branched(ftz: bool, x, batch, loss, grad, zero_infinity: bool = False) -> None:
    """Step 8 with its branch put back (``ftz``) or step 7's copy (not ``ftz``), launched as
    ``studylog.ctc.fused.launch`` launches step 8: step 7's passes around the recursion, scratch from one allocation."""
    T, N, A = x.shape
    smax, lmax, umax = batch.max_positions, batch.label_stride, batch.slot_stride
    v = fused.warp_grain(smax)
    if v not in LANE_GRAINS:
        raise ValueError(f"{smax} positions need {v} positions per lane; compiled: {LANE_GRAINS}")
    row_stride = 32 * v
    buffer, (row_lse, emissions, rows, row_shift) = workspace_addresses(
        x.device, fused.scratch_sizes(T, N, lmax, row_stride))
    first, last = _passes()
    recursion = cuda.load(SOURCE, name_expressions=INSTANCES).kernel(
        branched_name(v, ftz), fused.SIGNATURES["ctc_branchless_recursion"])
    vectorised = int(A % 4 == 0 and x.data_ptr() % 16 == 0 and grad.data_ptr() % 16 == 0)
    threads = row_threads(A)
    labels, input_lengths, target_lengths = batch.labels, batch.input_lengths, batch.target_lengths
    first((T * N,), (threads,), x, labels, input_lengths, target_lengths, row_lse, emissions, T, N, A, lmax,
          vectorised)
    recursion((N, 2), (32,), emissions, labels, input_lengths, target_lengths, rows, row_shift, T, N, lmax)
    last((T * N,), (threads,), x, row_lse, emissions, rows, row_shift, input_lengths, target_lengths,
         batch.slot_class, batch.slot_start, batch.slot_members, batch.num_slots, grad, loss,
         T, N, A, lmax, umax, row_stride, vectorised, int(zero_infinity))
    del buffer  # queued: the memory may be reused by the next allocation on this stream


def call(how: tuple, x, batch, *, zero_infinity: bool = False, out_loss=None, out_grad=None):
    """A row as a step is called: (loss, grad), into the caller's outputs when given."""
    kind, arg = how
    if kind == "library":
        return ctc.step08_branch_free(x, batch, zero_infinity=zero_infinity, recursion=arg, out_loss=out_loss,
                                      out_grad=out_grad)
    T, N, A = x.shape
    loss = torch.empty((N,), device=x.device) if out_loss is None else out_loss
    grad = torch.empty_like(x) if out_grad is None else out_grad
    launch_branched(arg, x, batch, loss, grad, zero_infinity)
    return loss, grad


# --------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------

def _counts(compiled: cuda.CompiledSource, kernel: str) -> dict:
    ops = ptx_opcodes(compiled, kernel)
    return {"branches": sum(n for op, n in ops.items() if op.startswith("bra")),
            "ex2_ftz": ops.get("ex2.approx.ftz.f32", 0), "ex2": ops.get("ex2.approx.f32", 0),
            "redux": sum(n for op, n in ops.items() if op.startswith("redux")), "opcodes": ops}


def compile_report() -> list[dict]:
    """Every recursion of the ablation compiled by NVRTC for sm_90 (no GPU needed): registers, spills, PTX
    branches and ``ex2`` flavours per kernel, at each compiled positions per lane."""
    lab = cuda.compile_source(SOURCE, arch=cuda.DEFAULT_ARCH, name_expressions=INSTANCES)
    step7 = ctc.compile_step(7, grains=LANE_GRAINS)
    step8 = ctc.compile_step(8, grains=LANE_GRAINS, recursions=list(fused.RECURSION_OPTIONS))
    rows = []

    def add(row_name, compiled, kernel, v):
        entry = compiled.ptxas_report().get(compiled.lowered_names.get(kernel, kernel))
        if entry is None:
            raise RuntimeError(f"ptxas reported nothing for {kernel}")
        rows.append({"row": row_name, "kernel": kernel, "v": v, **entry, **_counts(compiled, kernel)})

    for v in LANE_GRAINS:
        add("step 7", step7, f"ctc_fused_recursion<{v}>", v)
        add(STEP7_COPY[0], lab, branched_name(v, False), v)
        add("step 8", step8, fused.recursion_name(v), v)
        for name, (kind, arg), _, _ in VARIANTS:
            add(name, lab if kind == "branched" else step8,
                branched_name(v, arg) if kind == "branched" else fused.recursion_name(v, arg), v)
    return rows


def compile_only() -> int:
    """Print :func:`compile_report`; returns the number of problems: a stack frame or spills anywhere; the lab's
    copy of step 7 not the library's step 7 (registers or PTX instructions); the branch not put back (no more
    PTX branches than step 8); flush-to-zero not where it should be."""
    rows = compile_report()
    by = {(r["row"], r["v"]): r for r in rows}
    problems = []
    for r in rows:
        if r.get("spill_stores", 0) or r.get("spill_loads", 0) or r.get("stack_bytes", 0):
            problems.append(f"{r['kernel']}: stack frame or spills")
        ftz_expected = r["row"] not in ("step 7", STEP7_COPY[0], "exp2f and __log2f")
        if bool(r["ex2_ftz"]) != ftz_expected or bool(r["ex2"]) == ftz_expected:
            problems.append(f"{r['kernel']}: ex2 flavours {r['ex2_ftz']} ftz / {r['ex2']} not ftz")
    for v in LANE_GRAINS:
        copy, step7 = by[(STEP7_COPY[0], v)], by[("step 7", v)]
        if copy["registers"] != step7["registers"] or copy["opcodes"] != step7["opcodes"]:
            problems.append(f"V={v}: the lab's copy of step 7 is not the library's step 7")
        if by[("branch put back", v)]["branches"] <= by[("step 8", v)]["branches"]:
            problems.append(f"V={v}: the branch put back adds no PTX branch to step 8")
    print(f"{'row':20s} {'kernel':52s} {'regs':>4s} {'stack':>5s} {'spill':>5s} {'bra':>4s} "
          f"{'ex2.ftz':>7s} {'ex2':>4s} {'redux':>5s}")
    for r in rows:
        print(f"{r['row']:20s} {r['kernel']:52s} {r['registers']:4d} {r.get('stack_bytes', 0):5d} "
              f"{r.get('spill_stores', 0) + r.get('spill_loads', 0):5d} {r['branches']:4d} {r['ex2_ftz']:7d} "
              f"{r['ex2']:4d} {r['redux']:5d}")
    for p in problems:
        print("FAIL", p)
    print(f"{len(rows)} kernels compiled; {len(problems)} problems")
    return len(problems)


def check(seed: int = 8) -> int:
    """Every row (and the library's steps 7 and 8, and the lab's copy of step 7) against the float64 reference on
    fresh inputs, outputs poisoned; each compared bit for bit with the step it should match. Returns the number of
    failures (a row off the reference, or the lab's copy of step 7 not bit-identical to the library's step 7)."""
    gen = torch.Generator().manual_seed(seed)
    failures = 0
    rows = [("step 7", ("step", ctc.step07_fused_softmax)), ("step 8", ("step", ctc.step08_branch_free)),
            STEP7_COPY] + [(name, how) for name, how, _, _ in VARIANTS]
    for name, x, targets, il, tl, zero_infinity in check_cases(gen):
        for offset in (0, 1) if x.shape[2] % 4 == 0 else (0,):  # 1: rows not 16-byte aligned (scalar path)
            storage = torch.empty(x.numel() + offset, device="cuda")
            xd = storage[offset:].view(x.shape)
            xd.copy_(x)
            T, N, A = x.shape
            batch = ctc.prepare_targets(targets, il, tl, num_classes=A, max_time=T, device="cuda")
            ref = reference_ctc(xd, targets.cuda(), il, tl, zero_infinity=zero_infinity)
            anchors = {"step 7": ctc.step07_fused_softmax(xd, batch, zero_infinity=zero_infinity),
                       "step 8": ctc.step08_branch_free(xd, batch, zero_infinity=zero_infinity)}
            for label, (kind, arg) in rows:
                loss = torch.full((N,), SENTINEL, device="cuda")
                grad = torch.full((T, N, A), SENTINEL, device="cuda")
                if kind == "step":
                    arg(xd, batch, zero_infinity=zero_infinity, out_loss=loss, out_grad=grad)
                else:
                    call((kind, arg), xd, batch, zero_infinity=zero_infinity, out_loss=loss, out_grad=grad)
                torch.cuda.synchronize()
                written = not (loss == SENTINEL).any() and not (grad == SENTINEL).any()
                same_inf = torch.equal(torch.isinf(loss).cpu(), torch.isinf(ref[0]).cpu()) and \
                    torch.equal(torch.isnan(grad).cpu(), torch.isnan(ref[1]).cpu())
                err = errors(loss, grad, *ref)
                ok = written and same_inf and err["mismatched"] == 0 and err["loss_rel"] <= LOSS_TOLERANCE \
                    and err["grad_rel"] <= GRAD_TOLERANCE
                target = SAME_AS.get(label, "step 7" if label == STEP7_COPY[0] else label)
                identical = same_bits(loss, anchors[target][0]) and same_bits(grad, anchors[target][1])
                if label == STEP7_COPY[0] and not identical:
                    ok = False  # the lab's copy of step 7 must be the library's
                failures += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name:34s} offset={offset} {label:18s} "
                      f"loss_rel={err['loss_rel']:.1e} grad_rel={err['grad_rel']:.1e} "
                      f"{'bit-identical to' if identical else 'differs from'} {target}"
                      f"{'' if written else ' (outputs left unwritten)'}")
    print(f"{len(rows)} rows: {failures} failures")
    return failures


# --------------------------------------------------------------------------------------
# measure
# --------------------------------------------------------------------------------------

def measure() -> Path:
    """Each case: the library's steps 7 and 8, then every row, each checked against the float64 reference (a
    failed check is recorded and the row still written), then timed on the chapter's GPU clock."""
    from studylog.bench import BenchRun, write_lab_output

    from book.ctc.lesson import BOEHM_CASES

    run = BenchRun("ctc", command=" ".join(sys.argv))
    cases = list(BOEHM_CASES) + [MIDDLE_CASE]
    inputs = bench_inputs(cases)
    T = report.BENCH_T
    l2 = run.device.get("l2_cache_bytes") or 64 * 2**20
    for A, N in cases:
        lists, x_host = inputs.pop((A, N))
        x = x_host.to("cuda")
        del x_host
        lengths = tuple(len(l) for l in lists)
        params = {"T": T, "N": N, "A": A}
        floor = run.floor_ms(report.dram_bytes(T, N, A))
        ref = reference_ctc(x, padded(lists).to(x.device), (T,) * N, lengths)
        batch = ctc.prepare_targets(padded(lists), (T,) * N, lengths, num_classes=A, max_time=T, device=x.device)
        n_copies = report.copies(l2, x.numel() * 4)
        anchors = {"step 7": ctc.step07_fused_softmax(x, batch), "step 8": ctc.step08_branch_free(x, batch)}
        v = fused.warp_grain(batch.max_positions)
        entries = [("step07", {"variant": "library step 7"}, ctc.step07_fused_softmax, "step 7"),
                   ("step08", {"variant": "library step 8", "recursion": fused.DEFAULT_RECURSION},
                    ctc.step08_branch_free, "step 8")]
        for vname, how, undone, added in VARIANTS:
            knobs = {"variant": vname, "change_undone": undone, "option_added": added,
                     "recursion": how[1] if how[0] == "library" else "branched, ftz ex2/lg2",
                     "positions_per_lane": v, "max_positions": batch.max_positions}
            entries.append((RESULT_NAME, knobs, lambda xi, b, how=how, **out: call(how, xi, b, **out),
                            SAME_AS[vname]))
        for series, knobs, fn, same_as in entries:
            print(f"ctc {RESULT_NAME}: A={A} N={N} {knobs['variant']}", flush=True)
            loss = torch.full((N,), SENTINEL, device="cuda")
            grad = torch.full((T, N, A), SENTINEL, device="cuda")
            fn(x, batch, out_loss=loss, out_grad=grad)
            err = errors(loss, grad, *ref)
            written = not bool((loss == SENTINEL).any()) and not bool((grad == SENTINEL).any())
            identical = same_bits(loss, anchors[same_as][0]) and same_bits(grad, anchors[same_as][1])
            run.check(f"{knobs['variant']} matches the float64 reference", written and err["mismatched"] == 0
                      and err["loss_rel"] <= LOSS_TOLERANCE and err["grad_rel"] <= GRAD_TOLERANCE,
                      params=params | knobs, outputs_written=written, bit_identical_to=same_as if identical else None,
                      **err)
            del loss, grad
            estimate = report.estimate_ms(lambda: fn(x, batch))

            def make_calls(fn=fn):
                calls = []
                for _ in range(n_copies):
                    xi = torch.randn_like(x)
                    lo, g = torch.empty((N,), device=x.device), torch.empty_like(xi)
                    calls.append(lambda xi=xi, lo=lo, g=g: fn(xi, batch, out_loss=lo, out_grad=g))
                return calls
            timing = run.gpu_time(make_calls, repeats=3, **report.graph_settings(estimate))
            run.record(series, timing, params=params | knobs, floor_ms=floor,
                       bit_identical_to=same_as if identical else None, **err)
        del x, ref, batch, anchors
        torch.cuda.empty_cache()
    run.note("Step 8 minus one change (change_undone: 1 the branch put back, lab/ctc/variants/ctc_step08_changes.cu; "
             "2 exp2f and __log2f instead of the flush-to-zero ex2/lg2, the library's option 'branch-free') and "
             "step 8 plus an option its default leaves off (option_added); step07 and step08 are the library's "
             "steps, timed in the same run on the same inputs (the benchmark's, BENCH_SEED).")
    out = write_lab_output(paths.LAB / "ctc" / "results", run.device["name"], RESULT_NAME, run.to_json())
    bad = [c for c in run.checks if not c["passed"]]
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("check", "measure"))
    parser.add_argument("--compile-only", action="store_true",
                        help="check: compile every recursion with NVRTC (no GPU), report registers and branches")
    args = parser.parse_args(argv)
    if args.what == "check":
        if args.compile_only:
            return 1 if compile_only() else 0
        if not torch.cuda.is_available():
            sys.exit("check needs a CUDA GPU (torch sees none); --compile-only runs without one")
        failures = compile_only() + check()
        return 1 if failures else 0
    if args.compile_only:
        sys.exit("--compile-only applies to check")
    measure()
    return 0


if __name__ == "__main__":
    sys.exit(main())
