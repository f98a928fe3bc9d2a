"""Step 7's changes, one at a time: step 7 minus one change (``measure``), or the cumulative chain from step 5 to
step 7 one change per link (``measure --chain``), each timed beside step 7 and step 5.

Step 7 of chapter 4 (``step07_fused_softmax``) changes five things against step 5 at once. The frozen source
``variants/ctc_step07_changes.cu`` (a copy of step 7's kernels with compile-time knobs) undoes three of them, one
at a time, keeping everything else of step 7 (its passes, block sizes, prefetching and arithmetic):

* change 1 undone (``softmax="written"``): the first pass writes the whole (T, N, A) log-softmax, as steps 1 to 6
  do; the recursion gathers its emissions from it and the last pass reads it instead of the activations;
* change 2 undone (``recursion="block"``): a block of threads per direction, step 5's grain and block size
  (``default_grain``, ``block_threads``), positions strided by the block, the two live rows in shared memory and
  one barrier per frame, instead of one warp with its rows in registers and shuffles;
* change 3 undone (``directions="in turn"``): one warp per utterance runs alpha, then beta (grid (N, 1)),
  instead of two warps side by side (grid (N, 2)).

Changes 4 (the gradient a pass of its own) and 5 (no alpha matrix read back in a frame loop) have no knob: the
README says why. The three knobs compose (all eight combinations compile), so the chain (``CHAIN``) starts from
step 7 with all three undone, "7a": step 5 plus the two changes without a knob. Every variant does step 7's
arithmetic in step 7's order, so each is expected to match the library's step 7 bit for bit; ``check`` says whether
it does, and holds every variant to the chapter's float64 reference.

    PYTHONPATH=$PWD python lab/ctc/step07_changes.py check --compile-only  # CPU: NVRTC, registers, no spills
    PYTHONPATH=$PWD python lab/ctc/step07_changes.py check                 # GPU: every variant against float64
    PYTHONPATH=$PWD python lab/ctc/step07_changes.py measure               # GPU -> results/<gpu>/step07_changes.json
    PYTHONPATH=$PWD python lab/ctc/step07_changes.py measure --chain       # GPU -> results/<gpu>/step07_chain.json

``measure`` times the cases of the chapter's table of steps (``book.ctc.lesson.BOEHM_CASES``) and one middle
point of the benchmark grid, on the chapter's inputs (the benchmark's generator, seeded ``BENCH_SEED``, replayed
through its grid) and GPU clock (CUDA-graph replay over fresh copies of the activations, ``report.copies`` of them,
``report.graph_settings``), with the library's step 7 and step 5 as anchors in the same run. With ``--chain`` the
chain's links are also held to the library's step 7 bit for bit (recorded as checks).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

import torch

from studylog import ctc, cuda, paths
from studylog.ctc import fused, report
from studylog.ctc.launch import workspace_addresses
from studylog.ctc.peers import padded
from studylog.ctc.reference import GRAD_TOLERANCE, LOSS_TOLERANCE, errors, reference_ctc
from studylog.ctc.warpctc import block_threads, default_grain

SOURCE = Path(__file__).resolve().parent / "variants" / "ctc_step07_changes.cu"
RESULT_NAME = "step07_changes"
SENTINEL = -12345.0  # poison for outputs: no correct loss or gradient entry takes this value

#: The knobs' values in the frozen source.
SOFTMAX = {"not written": 0, "written": 1}
DIRECTIONS = {"side by side": "true", "in turn": "false"}
RECURSIONS = ("warp", "block")
#: Step 7: every change on.
STEP7 = {"softmax": "not written", "recursion": "warp", "directions": "side by side"}
#: (name, knobs, the change of step 7 it undoes): step 7 itself first, then one change undone at a time.
VARIANTS = [
    ("step 7", STEP7, None),
    ("softmax written", STEP7 | {"softmax": "written"}, 1),
    ("block recursion", STEP7 | {"recursion": "block"}, 2),
    ("directions in turn", STEP7 | {"directions": "in turn"}, 3),
]
#: The cumulative chain from step 5 to step 7, one change added per link: (link, knobs, the change it adds). 7a is
#: step 7's structure with all three knobs undone, so it differs from step 5 by the two changes that have no knob
#: (the gradient a pass of its own; no alpha matrix read back in a frame loop). The order of the three knobbed links
#: is a choice: the memory change first (it is what step 7 is named after), then the recursion's grain, then
#: running its two directions side by side. The last link is step 7 itself (the frozen copy, bit for bit).
CHAIN_STEP5 = {"softmax": "written", "recursion": "block", "directions": "in turn"}
CHAIN = [
    ("7a", CHAIN_STEP5, "the gradient a pass of its own (no alpha matrix read back in a frame loop)"),
    ("7b", CHAIN_STEP5 | {"softmax": "not written"}, "softmax not written"),
    ("7c", CHAIN_STEP5 | {"softmax": "not written", "recursion": "warp"}, "one warp per direction"),
    ("step 7", STEP7, "directions side by side"),
]
CHAIN_NAME = "step07_chain"
#: Positions per lane compiled for the warp recursion (the library's WARP_GRAINS up to 320 positions: targets of
#: up to 159 labels, which covers the benchmark's T = 150) and per thread for the block recursion (step 5's grains).
LANE_GRAINS = tuple(v for v in fused.WARP_GRAINS if v <= 10)
THREAD_GRAINS = ctc.GRAIN_SIZES

_SIG_STATS = ["ptr"] * 7 + ["i32"] * 5
_SIG_RECURSION = ["ptr"] * 7 + ["i32"] * 4
_SIG_GRAD = ["ptr"] * 15 + ["i32"] * 8


def row_threads(num_classes: int) -> int:
    """Threads of step 7's per-frame blocks (its first and last passes): the library's rule in
    ``studylog/ctc/fused.py``, restated here because it is not public."""
    return 64 if num_classes <= 512 else 256


def kernel_names(variant: dict, v: int) -> tuple[str, str, str]:
    """(first pass, recursion, last pass) name expressions of a variant with ``v`` positions per lane/thread."""
    s = SOFTMAX[variant["softmax"]]
    if variant["recursion"] not in RECURSIONS:
        raise ValueError(f"recursion must be one of {RECURSIONS}, got {variant['recursion']!r}")
    kernel = "v7_block_recursion" if variant["recursion"] == "block" else "v7_recursion"
    recursion = f"{kernel}<{v}, {s}, {DIRECTIONS[variant['directions']]}>"
    return f"v7_stats<{s}>", recursion, f"v7_grad<{s}>"


#: Every combination of the three knobs (all eight compile: the chain below uses four of them, the one-at-a-time
#: variants three more).
ALL_KNOBS = [{"softmax": s, "recursion": r, "directions": d}
             for s in SOFTMAX for r in RECURSIONS for d in DIRECTIONS]


def instances() -> list[str]:
    """Every name expression of every knob combination, compiled in one NVRTC call."""
    names = []
    for variant in ALL_KNOBS:
        grains = THREAD_GRAINS if variant["recursion"] == "block" else LANE_GRAINS
        names += [n for v in grains for n in kernel_names(variant, v)]
    return list(dict.fromkeys(names))


INSTANCES = instances()


def launch_shape(variant: dict, max_positions: int) -> tuple[int, int]:
    """(positions per lane or thread, threads per direction): step 7's warp (``warp_grain``), or step 5's block."""
    if variant["recursion"] == "block":
        grain = default_grain(max_positions)
        threads = block_threads(max_positions, grain)
        if threads > 1024:
            raise ValueError(f"{max_positions} positions need {threads} threads at grain {grain}; at most 1024")
        return grain, threads
    v = fused.warp_grain(max_positions)
    if v not in LANE_GRAINS:
        raise ValueError(f"{max_positions} positions need {v} positions per lane; compiled: {LANE_GRAINS}")
    return v, 32


def _kernels(names: tuple[str, str, str]) -> list:
    module = cuda.load(SOURCE, name_expressions=INSTANCES)
    return [module.kernel(name, sig) for name, sig in zip(names, (_SIG_STATS, _SIG_RECURSION, _SIG_GRAD))]


def launch(variant: dict, x, batch, loss, grad, zero_infinity: bool = False) -> None:
    """One call of a variant on checked inputs (as ``studylog.ctc.fused.launch`` launches step 7): its first pass,
    recursion and last pass, with their scratch carved from one allocation."""
    T, N, A = x.shape
    smax, lmax, umax = batch.max_positions, batch.label_stride, batch.slot_stride
    v, threads = launch_shape(variant, smax)
    row_stride = threads * v
    written = variant["softmax"] == "written"
    sizes = fused.scratch_sizes(T, N, lmax, row_stride) + ([T * N * A * 4] if written else [])
    buffer, addresses = workspace_addresses(x.device, sizes)
    row_lse, emissions, rows, row_shift = addresses[:4]
    log_probs = addresses[4] if written else 0
    first, recursion, last = _kernels(kernel_names(variant, v))
    vectorised = int(A % 4 == 0 and x.data_ptr() % 16 == 0 and grad.data_ptr() % 16 == 0)
    frame_threads = row_threads(A)
    labels, input_lengths, target_lengths = batch.labels, batch.input_lengths, batch.target_lengths
    first((T * N,), (frame_threads,), x, labels, input_lengths, target_lengths, row_lse, emissions, log_probs,
          T, N, A, lmax, vectorised)
    recursion((N, 2 if variant["directions"] == "side by side" else 1), (threads,), emissions, log_probs, labels,
              input_lengths, target_lengths, rows, row_shift, T, N, A, lmax)
    last((T * N,), (frame_threads,), x, log_probs, row_lse, emissions, rows, row_shift, input_lengths,
         target_lengths, labels, batch.slot_class, batch.slot_start, batch.slot_members, batch.num_slots, grad, loss,
         T, N, A, lmax, umax, row_stride, vectorised, int(zero_infinity))
    del buffer  # queued: the memory may be reused by the next allocation on this stream


def call(variant: dict, x, batch, *, zero_infinity: bool = False, out_loss=None, out_grad=None):
    """A variant as a step is called: (loss, grad), into the caller's outputs when given."""
    T, N, A = x.shape
    loss = torch.empty((N,), device=x.device) if out_loss is None else out_loss
    grad = torch.empty_like(x) if out_grad is None else out_grad
    launch(variant, x, batch, loss, grad, zero_infinity)
    return loss, grad


# --------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------

def ptx_opcodes(compiled: cuda.CompiledSource, kernel: str) -> collections.Counter:
    """How many times each PTX instruction occurs in one kernel (names and parameter numbers left out)."""
    return collections.Counter(re.findall(r"^\s+(?:@!?%p\d+\s+)?([a-z][\w.]*)", compiled.ptx_function(kernel), re.M))


def library_counterpart(name: str) -> str | None:
    """The library's step 7 kernel that a step-7 instance of the frozen source copies (None for the variants)."""
    if name == "v7_stats<0>":
        return "ctc_fused_stats"
    if name == "v7_grad<0>":
        return "ctc_fused_grad"
    if name.startswith("v7_recursion<") and name.endswith(", 0, true>"):
        return f"ctc_fused_recursion<{name.split('<')[1].split(',')[0]}>"
    return None


def compile_report() -> list[dict]:
    """Every instance compiled by NVRTC for sm_90 (no GPU needed): registers and spills per kernel; for step 7's
    own instances, the library's step 7 kernel beside it (its registers, and whether the two have the same PTX
    instructions, counted by opcode)."""
    compiled = cuda.compile_source(SOURCE, arch=cuda.DEFAULT_ARCH, name_expressions=INSTANCES)
    ptxas = compiled.ptxas_report()
    library = ctc.compile_step(7, grains=LANE_GRAINS)  # step 7's source, its recursion at these lane grains
    library_ptxas = library.ptxas_report()
    rows = []
    for name in INSTANCES:
        entry = ptxas.get(compiled.lowered_names.get(name, name))
        if entry is None:
            raise RuntimeError(f"ptxas reported nothing for {name}")
        row = {"kernel": name, **entry, "library": library_counterpart(name)}
        if row["library"]:
            row["library_registers"] = library_ptxas[library.lowered_names.get(row["library"], row["library"])][
                "registers"]
            row["same_ptx_opcodes"] = ptx_opcodes(compiled, name) == ptx_opcodes(library, row["library"])
        rows.append(row)
    return rows


def compile_only() -> int:
    """Print :func:`compile_report`; returns the number of problems (a stack frame or spills anywhere, or a step 7
    instance whose registers or PTX instructions differ from the library's)."""
    rows = compile_report()
    spills = [r for r in rows if r.get("spill_stores", 0) or r.get("spill_loads", 0) or r.get("stack_bytes", 0)]
    differ = [r for r in rows if r["library"] and (r["library_registers"] != r["registers"]
                                                   or not r["same_ptx_opcodes"])]
    print(f"{'kernel':30s} {'regs':>5s} {'stack':>5s} {'spill st/ld':>11s}  library step 7: regs, same PTX")
    for r in rows:
        lib = f"{r['library']}: {r['library_registers']}, {r['same_ptx_opcodes']}" if r["library"] else ""
        print(f"{r['kernel']:30s} {r['registers']:5d} {r.get('stack_bytes', 0):5d} "
              f"{r.get('spill_stores', 0):5d}/{r.get('spill_loads', 0):<5d}  {lib}")
    print(f"{len(rows)} kernels compiled; {len(spills)} with a stack frame or spills; {len(differ)} of step 7's "
          "instances differ from the library's (registers or PTX instructions)")
    return len(spills) + len(differ)


def same_bits(a, b) -> bool:
    """Whether two float tensors hold the same bits (same shape; NaNs and signed zeros included)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def check_cases(gen: torch.Generator):
    """(name, activations, padded targets, input lengths, target lengths, zero_infinity): awkward sizes (odd T and
    A, N = 1 and several, varied lengths, repeated labels), the tests' edge cases, and benchmark-sized inputs."""
    def random_case(T, N, A, max_target, repeats):
        x = torch.randn(T, N, A, generator=gen) * 1.5
        il = torch.randint(1, T + 1, (N,), generator=gen)
        tl = torch.randint(0, max_target + 1, (N,), generator=gen)
        targets = torch.randint(1, A, (N, max(1, max_target)), generator=gen)
        if repeats:  # neighbours repeat in every other pair
            targets[:, 1::2] = targets[:, 0::2][:, : targets[:, 1::2].shape[1]]
        return x, targets, il.tolist(), tl.tolist()

    for T, N, A, max_target, repeats in [(1, 1, 2, 1, False), (7, 1, 5, 3, True), (33, 7, 5, 12, True),
                                         (61, 9, 37, 29, False), (45, 5, 1001, 20, False), (151, 3, 29, 75, True),
                                         (149, 1, 4999, 74, False), (97, 11, 5000, 48, True)]:
        yield f"random T={T} N={N} A={A}", *random_case(T, N, A, max_target, repeats), False
    x = torch.randn(8, 5, 6, generator=gen)
    targets = torch.tensor([[1, 1, 2, 0, 0, 0], [3, 3, 3, 3, 3, 0], [0, 0, 0, 0, 0, 0],
                            [1, 2, 3, 4, 5, 1], [2, 2, 2, 0, 0, 0]])
    for zero_infinity in (False, True):  # repeats; infinite; empty; too long; repeats too long
        yield f"edge cases zero_infinity={zero_infinity}", x, targets, [8, 8, 5, 4, 3], [3, 5, 0, 6, 3], zero_infinity
    for A in report.BENCH_A:
        lists = report.random_targets(report.BENCH_T, 16, A, gen)
        x = torch.randn(report.BENCH_T, 16, A, generator=gen)
        il = torch.randint(report.BENCH_T // 2, report.BENCH_T + 1, (16,), generator=gen).tolist()
        yield f"benchmark-sized A={A}", x, padded(lists), il, [min(len(l), i) for l, i in zip(lists, il)], False


def checked() -> list[tuple[str, dict]]:
    """(name, knobs) of every variant that ``measure`` times, with or without ``--chain``: the one-at-a-time
    variants, then the chain's links that are not among them."""
    out = [(name, variant) for name, variant, _ in VARIANTS]
    out += [(f"chain {link}", variant) for link, variant, _ in CHAIN if variant not in [v for _, v in out]]
    return out


def check(seed: int = 7) -> int:
    """Every variant (and the library's step 7) against the float64 reference on fresh inputs, outputs poisoned;
    each variant also compared bit for bit with the library's step 7. Returns the number of failures."""
    gen = torch.Generator().manual_seed(seed)
    failures = 0
    for name, x, targets, il, tl, zero_infinity in check_cases(gen):
        for offset in (0, 1) if x.shape[2] % 4 == 0 else (0,):  # 1: rows not 16-byte aligned (scalar path)
            storage = torch.empty(x.numel() + offset, device="cuda")
            xd = storage[offset:].view(x.shape)
            xd.copy_(x)
            T, N, A = x.shape
            batch = ctc.prepare_targets(targets, il, tl, num_classes=A, max_time=T, device="cuda")
            ref = reference_ctc(xd, targets.cuda(), il, tl, zero_infinity=zero_infinity)
            lib = ctc.step07_fused_softmax(xd, batch, zero_infinity=zero_infinity)
            for label, run_ in [("library step 7", lambda lo, g: ctc.step07_fused_softmax(
                    xd, batch, zero_infinity=zero_infinity, out_loss=lo, out_grad=g))] + [
                    (vname, lambda lo, g, v=variant: call(v, xd, batch, zero_infinity=zero_infinity,
                                                          out_loss=lo, out_grad=g)) for vname, variant in checked()]:
                loss = torch.full((N,), SENTINEL, device="cuda")
                grad = torch.full((T, N, A), SENTINEL, device="cuda")
                run_(loss, grad)
                torch.cuda.synchronize()
                written = not (loss == SENTINEL).any() and not (grad == SENTINEL).any()
                same_inf = torch.equal(torch.isinf(loss).cpu(), torch.isinf(ref[0]).cpu()) and \
                    torch.equal(torch.isnan(grad).cpu(), torch.isnan(ref[1]).cpu())
                err = errors(loss, grad, *ref)
                ok = written and same_inf and err["mismatched"] == 0 and err["loss_rel"] <= LOSS_TOLERANCE \
                    and err["grad_rel"] <= GRAD_TOLERANCE
                identical = same_bits(loss, lib[0]) and same_bits(grad, lib[1])
                if label == "step 7" and not identical:
                    ok = False  # the frozen source's step 7 must be the library's
                failures += not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name:34s} offset={offset} {label:20s} "
                      f"loss_rel={err['loss_rel']:.1e} grad_rel={err['grad_rel']:.1e} "
                      f"{'bit-identical to step 7' if identical else 'differs from step 7'}"
                      f"{'' if written else ' (outputs left unwritten)'}")
    print(f"{len(checked())} variants and the library's step 7: {failures} failures")
    return failures


# --------------------------------------------------------------------------------------
# measure
# --------------------------------------------------------------------------------------

#: The point of the benchmark grid between the two cases of the table of steps: a mid-size batch of the large
#: alphabet (step 5 is timed there too: ``report.LESSON_N``).
MIDDLE_CASE = (5000, 16)


def bench_inputs(cases) -> dict[tuple[int, int], tuple]:
    """The benchmark's inputs at ``cases`` ((A, N) points of its grid): its generator (``BENCH_SEED``) replayed
    through the grid in order, each point drawing its targets and then its activations, as ``report.bench`` does."""
    generator = torch.Generator().manual_seed(report.BENCH_SEED)
    wanted, out = set(cases), {}
    for A, N in report.grids()["main"]:
        lists = report.random_targets(report.BENCH_T, N, A, generator)
        x = torch.randn((report.BENCH_T, N, A), generator=generator)
        if (A, N) in wanted:
            out[(A, N)] = (lists, x)
        if len(out) == len(wanted):
            break
    missing = wanted - set(out)
    if missing:
        raise ValueError(f"cases {sorted(missing)} are not points of the benchmark's grid")
    return out


def timed_variants(batch, chained: bool) -> list[tuple[str, dict, dict]]:
    """(series, knobs, recorded params) of what ``measure`` times beside the library's steps: step 7, then step 7 with
    one change undone at a time; or, ``chained``, the links of :data:`CHAIN`, each adding one change to the one
    before."""
    if chained:
        specs = [(CHAIN_NAME, link, variant, {"change_added": added}) for link, variant, added in CHAIN]
    else:
        specs = [(RESULT_NAME, name, variant, {"change_undone": undone}) for name, variant, undone in VARIANTS]
    out = []
    for series, name, variant, what in specs:
        v, threads = launch_shape(variant, batch.max_positions)
        out.append((series, variant, {"variant": name, **what, **variant, "positions_per_thread": v,
                                      "recursion_threads": threads, "max_positions": batch.max_positions}))
    return out


def measure(chained: bool = False) -> Path:
    """Each case: the library's step 5 and step 7, then every variant (step 7 with one change undone at a time, or
    with ``chained`` the links of :data:`CHAIN`), each checked against the float64 reference (a failed check is
    recorded and the row still written), then timed on the chapter's GPU clock. The chain's links are also held to
    the library's step 7 bit for bit: they do its arithmetic in its order."""
    from studylog.bench import BenchRun, write_lab_output

    from book.ctc.lesson import BOEHM_CASES

    name = CHAIN_NAME if chained else RESULT_NAME
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
        library7 = ctc.step07_fused_softmax(x, batch)
        entries = [("step05", {"variant": "library step 5"}, ctc.step05_shared_rows),
                   ("step07", {"variant": "library step 7"}, ctc.step07_fused_softmax)]
        for series, variant, knobs in timed_variants(batch, chained):
            entries.append((series, knobs, lambda xi, b, v=variant, **out: call(v, xi, b, **out)))
        for series, knobs, fn in entries:
            print(f"ctc {name}: A={A} N={N} {knobs['variant']}", flush=True)
            loss = torch.full((N,), SENTINEL, device="cuda")
            grad = torch.full((T, N, A), SENTINEL, device="cuda")
            fn(x, batch, out_loss=loss, out_grad=grad)
            err = errors(loss, grad, *ref)
            written = not bool((loss == SENTINEL).any()) and not bool((grad == SENTINEL).any())
            identical = same_bits(loss, library7[0]) and same_bits(grad, library7[1])
            run.check(f"{knobs['variant']} matches the float64 reference", written and err["mismatched"] == 0
                      and err["loss_rel"] <= LOSS_TOLERANCE and err["grad_rel"] <= GRAD_TOLERANCE,
                      params=params | knobs, outputs_written=written, bit_identical_to_step07=identical, **err)
            if knobs["variant"] == "step 7":
                run.check("the frozen source's step 7 is the library's, bit for bit", identical, params=params)
            elif series == CHAIN_NAME:
                run.check(f"{knobs['variant']} is bit-identical to the library's step 7", identical,
                          params=params | knobs)
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
            run.record(series, timing, params=params | knobs, floor_ms=floor, bit_identical_to_step07=identical,
                       **err)
        del x, ref, batch, library7
        torch.cuda.empty_cache()
    if chained:
        run.note("The cumulative chain from step 5 to step 7, built from lab/ctc/variants/ctc_step07_changes.cu: "
                 "7a is step 7 with its three knobs undone (softmax written, block recursion, directions in turn), "
                 "each later link adds one change (change_added) to the one before, and the last link is step 7; "
                 "step05 and step07 are the library's steps, timed in the same run on the same inputs (the "
                 "benchmark's, BENCH_SEED).")
    else:
        run.note("Variants of step 7 from lab/ctc/variants/ctc_step07_changes.cu, each undoing one change "
                 "(change_undone: 1 softmax written, 2 block recursion, 3 directions in turn); step05 and step07 are "
                 "the library's steps, timed in the same run on the same inputs (the benchmark's, BENCH_SEED).")
    out = write_lab_output(paths.LAB / "ctc" / "results", run.device["name"], name, run.to_json())
    bad = [c for c in run.checks if not c["passed"]]
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("check", "measure"))
    parser.add_argument("--compile-only", action="store_true",
                        help="check: compile every variant with NVRTC (no GPU), report registers and spills")
    parser.add_argument("--chain", action="store_true",
                        help=f"measure: the cumulative chain step 5 -> 7a -> ... -> step 7 (results/<gpu>/"
                             f"{CHAIN_NAME}.json) instead of step 7 minus one change at a time")
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
    measure(chained=args.chain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
