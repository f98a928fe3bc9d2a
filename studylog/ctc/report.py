"""Chapter 4's benchmark: :data:`TABLE` declares what it records (series x points, each row's clock), :func:`bench`
measures it. What a CUDA graph can capture is timed on the GPU clock, host time beside it; the rest on the
``kernel`` clock."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch
from torch import Tensor

from studylog.bench import Timing
from studylog.ctc import peers
from studylog.ctc.fused import DEFAULT_BLOCK_GRAIN, ctc_loss, final_step, launch_shape, preload_fused
from studylog.ctc.peers import TORCH_SERIES, concatenated, padded
from studylog.ctc.reference import (FAR_GRAD, FAR_LOSS, GRAD_TOLERANCE, LOSS_TOLERANCE, errors, outcomes,
                                    reference_ctc, wrong_utterances)
from studylog.ctc.targets import BLANK, MAX_TARGET_LENGTH, CTCTargets, min_frames, prepare_targets
from studylog.ctc.warpctc import GRAIN_SIZES, block_threads, preload_blocked, untrusted_answers

BENCH_T = 150
BENCH_N = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BENCH_A = (28, 5000)
#: The seed of the generator the grid draws its targets with (the tails run redraws the first: the latency floor).
BENCH_SEED = 2024
#: Batch sizes at which steps 1 to 6 (the warp-ctc design) are timed.
LESSON_N = (1, 8, 16, 256)
#: Utterances of step 4's grain sweep (strided layout).
SWEEP_N = 64
#: The stress set: blank-heavy utterances of STRESS_T frames (targets of T / 3 labels), and long random ones of
#: LONG_T frames with targets of up to MAX_TARGET_LENGTH labels.
STRESS_T = (50, 100, 200, 400)
STRESS_A, STRESS_N = 28, 8
LONG_T, LONG_N = (1100,), 6
#: (A, N) where the benchmark also times F.ctc_loss on its cuDNN path and records every kernel's device time.
PROFILE_CASES = ((28, 1), (28, 256), (5000, 2), (5000, 256))
#: GPU clock: a graph replay holds at least GRAPH_REPLAY_MS of calls (at least 2), replayed GRAPH_REPS times; host
#: time over about HOST_BUDGET_MS of calls; activations rotated among at most MAX_COPIES copies. SPAN_REPS:
#: repetitions of the kernel clock; STRESS_REPS: graph replays per repetition on the stress set (kept for its counts).
GRAPH_REPLAY_MS, GRAPH_REPS, HOST_BUDGET_MS, MAX_COPIES = 1.0, 10, 10.0, 16
SPAN_REPS, STRESS_REPS = 20, 3


@dataclass(frozen=True)
class Measure:
    """Rows ``series`` (``{step}``: that of each of ``steps``, step numbers or torch's calls), measured by ``how``
    (:data:`MEASURES`) at the points of ``section`` where ``at`` holds (:func:`holds`), on ``clock`` ("torch": the
    GPU clock where a graph captures the call, else the kernel clock, in the profiler's pass)."""

    section: str
    how: str
    series: str
    steps: tuple = (None,)
    at: str = "every"
    clock: str = "gpu"
    role: str = "kernel"


FINAL = 14  # CHAPTER.final.number (the chapter imports this module)
TORCH = tuple(TORCH_SERIES)
#: What the benchmark records, in the order it measures it, section by section (:data:`SECTIONS`).
TABLE = (
    Measure("grid", "torch", "{step}", TORCH, at="torch", clock="torch", role="baseline"),
    Measure("grid", "best", "torch-best", at="graph", role="baseline"),
    Measure("grid", "step", "{step}", tuple(range(1, 7)), at="lesson"),
    Measure("grid", "step", "{step}", tuple(range(7, 15))),
    Measure("grid", "entry", "ctc_loss"),
    Measure("grid", "plan", "{step} plan", (FINAL,), clock="host"),
    Measure("grain", "step", "{step} strided", (4,)),
    Measure("profiler", "span", "{step} span", (FINAL,), at="span", clock="kernel"),
    Measure("profiler", "span", "{step} span", ("torch-cuDNN",), at="span cuDNN", clock="kernel", role="baseline"),
    Measure("profiler", "best", "torch-best span", at="span", clock="kernel", role="baseline"),
    Measure("profiler", "best", "torch-best", at="span, no graph", clock="kernel", role="baseline"),
    Measure("stress", "step", "stress {step}", tuple(range(5, 15))),
    Measure("stress", "entry", "stress ctc_loss"),
    Measure("stress", "counts", "cudnn-set {step}", TORCH + (6, FINAL), at="cudnn-set", clock="kernel"),
    Measure("kernels", "kernels", "{step} kernels", ("torch-cuDNN", "torch-native", *range(7, 15)), clock="kernel"),
)
#: The sections in the order they run, with their progress bars. The profiler's pass times the grid's inputs again
#: after every GPU-clock timing: once torch's profiler has attached, every later launch in the process runs slower,
#: so nothing that a headline reads may follow it.
SECTIONS = {"grid": "T = 150 grid", "grain": "grain sweep", "profiler": "T = 150 grid, profiler",
            "stress": "stress set", "kernels": "kernel times"}


def random_targets(T: int, N: int, A: int, generator: torch.Generator, max_length: int = 255) -> list[np.ndarray]:
    """Targets as in the blog post's benchmark: length uniform in [1, min(T, max_length)], labels uniform in
    [1, A), shortened until they fit T frames."""
    lists = []
    for _ in range(N):
        length = int(torch.randint(1, min(T, max_length) + 1, (1,), generator=generator))
        labels = torch.randint(1, A, (length,), generator=generator).numpy().astype(np.int64)
        while min_frames(labels) > T:
            labels = labels[:-1]
        lists.append(labels)
    return lists


def dram_bytes(T: int, N: int, A: int) -> int:
    """The unavoidable traffic: read the activations once and write the gradient once (float32)."""
    return 2 * 4 * T * N * A


def stress_inputs(T: int, N: int, A: int, generator: torch.Generator, device) -> tuple[Tensor, list[np.ndarray]]:
    """Long utterances whose frames strongly prefer the blank, with targets of T / 3 labels: alignments far less
    likely than the best partial path, which float32 rescaling cannot hold."""
    x = torch.randn((T, N, A), generator=generator) * 2.0
    x[:, :, BLANK] += 6.0
    lists = [torch.randint(1, A, (min(T // 3, MAX_TARGET_LENGTH),), generator=generator).numpy() for _ in range(N)]
    return x.to(device), lists


def long_inputs(T: int, N: int, A: int, generator: torch.Generator, device) -> tuple[Tensor, list[np.ndarray]]:
    """Long utterances, random activations, targets of up to MAX_TARGET_LENGTH labels."""
    lists = random_targets(T, N, A, generator, max_length=MAX_TARGET_LENGTH)
    return torch.randn((T, N, A), generator=generator).to(device), lists


def stress_set(generator: torch.Generator, device) -> list[tuple[str, Tensor, list]]:
    """The stress set: (name, activations, target lists), every input at full length T."""
    cases = [(f"blank-heavy T={T}", *stress_inputs(T, STRESS_N, STRESS_A, generator, device)) for T in STRESS_T]
    return cases + [(f"long T={T}", *long_inputs(T, LONG_N, STRESS_A, generator, device)) for T in LONG_T]


def grids(quick: bool = False) -> dict[str, list[tuple]]:
    """The benchmark's points by section: ``main``, ``lesson`` (A, N), ``grain`` (A, grain), ``stress`` (T, N)."""
    if quick:  # a smoke test of every section
        return {"main": [(A, N) for A in BENCH_A for N in (BENCH_N[0], BENCH_N[-1])],
                "lesson": [(BENCH_A[0], BENCH_N[0])],
                "grain": [(BENCH_A[0], g) for g in GRAIN_SIZES[:2]], "stress": [(T, STRESS_N) for T in STRESS_T[::2]]}
    return {"main": [(A, N) for A in BENCH_A for N in BENCH_N], "lesson": [(A, N) for A in BENCH_A for N in LESSON_N],
            "grain": [(A, g) for A in BENCH_A for g in GRAIN_SIZES],
            "stress": [(T, STRESS_N) for T in STRESS_T] + [(T, LONG_N) for T in LONG_T]}


def section_points(section: str, quick: bool = False) -> list[dict]:
    """The params of each point of ``section``, in order."""
    grid = grids(quick)
    if section == "grain":
        return [{"T": BENCH_T, "N": SWEEP_N, "A": A, "grain": g} for A, g in grid["grain"]]
    if section == "stress":
        return [{"T": T, "N": N, "A": STRESS_A, "inputs": "blank-heavy" if T in STRESS_T else "long"}
                for T, N in grid["stress"]]
    main = [{"T": BENCH_T, "N": N, "A": A} for A, N in grid["main"]]
    return [p for p in main if (p["A"], p["N"]) in PROFILE_CASES and not quick] if section == "kernels" else main


def holds(at: str, step, params: dict, *, graph: bool, cudnn_graph: bool, spans: bool, quick: bool) -> bool:
    """Whether a :data:`TABLE` entry with ``at`` records ``step`` at ``params``. ``graph``: a torch call there is
    timed on the GPU clock (``cudnn_graph``: torch-cuDNN is); ``spans``: one on the kernel clock."""
    point = (params["A"], params["N"])
    span = spans and (params["N"] in LESSON_N or not graph)
    return {"every": True, "cudnn-set": True, "lesson": point in grids(quick)["lesson"], "graph": graph,
            "torch": step != "torch-cuDNN F.ctc_loss" or point in PROFILE_CASES,  # its cuDNN path: at PROFILE_CASES
            "span": span, "span cuDNN": span and cudnn_graph, "span, no graph": span and not graph}[at]


def series_of(step) -> str:
    """The series of step ``step``, or torch's call ``step``; "" for None."""
    return step if step in TORCH_SERIES else "" if step is None else step_of(step).series


def measures(section: str, on_gpu):
    """(entry of :data:`TABLE`, step) measured in ``section``, in order; ``on_gpu(series)``: whether a torch call is
    timed on the GPU clock (in the grid's pass) or the kernel clock (in the profiler's)."""
    for m in TABLE:
        if m.clock == "torch":
            if section in ("grid", "profiler"):
                yield from ((m, s) for s in m.steps if on_gpu(s) == (section == "grid"))
        elif m.section == section:
            yield from ((m, step) for step in m.steps)


def graph_settings(estimate_ms: float, reps: int = GRAPH_REPS) -> dict[str, int]:
    """``min_calls`` and ``reps`` of :meth:`BenchRun.gpu_time` for a call of about ``estimate_ms`` (half the replays
    from a millisecond on: such calls vary little)."""
    return {"min_calls": int(min(60, max(2, math.ceil(GRAPH_REPLAY_MS / max(estimate_ms, 1e-3))))),
            "reps": reps if estimate_ms < 1.0 else max(3, reps // 2)}


def host_calls(estimate_ms: float) -> int:
    """Calls per repetition of the host time: about HOST_BUDGET_MS of GPU work, 5 to 200."""
    return int(min(200, max(5, HOST_BUDGET_MS / max(estimate_ms, 1e-3))))


def copies(l2_bytes: int, nbytes: int) -> int:
    """Copies of the activations to rotate among: 4x L2 together, or 1 where that takes more than MAX_COPIES."""
    n = max(1, -(-4 * l2_bytes // max(nbytes, 1)))
    return n if n <= MAX_COPIES else 1


# How one row is measured

def step_of(number: int):
    from studylog.ctc import CHAPTER

    return CHAPTER.step(number)


def _call(number: int, x: Tensor, batch: CTCTargets, **how):
    """One call of a step, graph-safe and without a host synchronisation (step 6 does not warn)."""
    return step_of(number).function(x, batch, **({"warn": False} if number == 6 else {}), **how)


def torch_call(series: str, x: Tensor, lists, **how):
    """torch's call ``series`` (:data:`peers.TORCH_SERIES`) on ``x``; ``how``: F.ctc_loss's options."""
    if series == "torch-cuDNN":
        return peers.cudnn_direct(x, lists)
    return peers.functional(x, lists, "native" if series == "torch-native" else "cudnn", **how)


def estimate_ms(fn) -> float:
    """A first, rough time of ``fn`` (events around three eager calls), to size the measurements."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 3


def timed(run, series: str, fn, params: dict, *, calls_on=None, x: Tensor | None = None, role: str = "kernel",
          host: bool = True, reps: int = GRAPH_REPS, **extra) -> dict:
    """Record ``fn`` on the GPU clock, its calls ``calls_on(x_i)`` over :func:`copies` of activations like ``x``
    (without ``calls_on``: on the kernel clock), and its host time."""
    estimate = estimate_ms(fn)
    if calls_on is None:
        timing, extra["clock"] = run.kernel_time(fn, reps=SPAN_REPS), "kernel"
    else:
        n = copies(run.device.get("l2_cache_bytes") or 64 * 2**20, x.numel() * 4)
        timing = run.gpu_time(lambda: [calls_on(torch.randn_like(x)) for _ in range(n)], repeats=3,
                              **graph_settings(estimate, reps))
    host_timing = run.host_time(fn, calls=host_calls(estimate)) if host else None
    return run.record(series, timing, params=params, role=role, host=host_timing, **extra)


def with_outputs(call):
    """``calls_on`` for :func:`timed`: ``call(x_i, out_loss=, out_grad=)`` with its own outputs on the copy."""
    def on(xi):
        loss, grad = torch.empty((xi.shape[1],), device=xi.device), torch.empty_like(xi)
        return lambda: call(xi, out_loss=loss, out_grad=grad)
    return on


def errors_of(loss: Tensor, grad: Tensor, ref) -> dict:
    """:func:`errors` against the float64 reference ``ref``, and the count of infinite losses."""
    return {**errors(loss, grad, *ref), "infinite_losses": int((~torch.isfinite(loss)).sum())}


def check_within(run, name: str, err: dict, params: dict, loss_tolerance: float, grad_tolerance: float) -> dict:
    run.check(name, err["mismatched"] == 0 and err["loss_rel"] <= loss_tolerance and err["grad_rel"] <= grad_tolerance,
              params=params, **err)
    return err


def check_step(run, step, loss, grad, ref, batch, params, estimate=None) -> dict:
    err = errors_of(loss, grad, ref)
    if step.number != 6:
        return check_within(run, f"{step.series} matches the float64 reference", err, params, LOSS_TOLERANCE,
                            GRAD_TOLERANCE)
    # probability space is measured, not held to the log-space tolerances
    wrong = wrong_utterances(loss, grad, *ref)
    flagged = untrusted_answers(loss, estimate, batch)
    err["flagged"], err["wrong"] = int(flagged.sum()), int(wrong.sum())
    run.check(f"{step.series} flags every answer it gets wrong", not bool((wrong & ~flagged).any()), params=params,
              **err)
    return err


def prepared_batch(lists, T: int, A: int, device) -> CTCTargets:
    return prepare_targets(padded(lists), (T,) * len(lists), tuple(len(l) for l in lists), num_classes=A,
                           max_time=T, device=device)


def reference_of(x: Tensor, lists):
    return reference_ctc(x, padded(lists).to(x.device), (x.shape[0],) * len(lists), tuple(len(l) for l in lists))


def recursion_shape(step: int, max_positions: int) -> dict:
    """What a row of step ``step`` (7 to 14) records of its recursion's launch: positions, per lane (or thread),
    and the ``threads`` (7, 8) or ``warps`` (14) of a direction."""
    v, threads = launch_shape(step, max_positions)
    block = {"threads": threads} if step in (7, 8) else {"warps": threads // 32} if step == 14 else {}
    return {"max_positions": max_positions, "positions_per_lane": v, **block}


@dataclass
class Point:
    """A point's inputs (its reference, prepared targets and cuDNN set made when first read) and, in this pass,
    torch's rows recorded there (``spans``: those on the kernel clock)."""

    section: str
    params: dict
    x: Tensor
    lists: list
    floor: float | None = None
    rows: list = field(default_factory=list)
    spans: list = field(default_factory=list)

    @cached_property
    def batch(self) -> CTCTargets:
        return prepared_batch(self.lists, self.x.shape[0], self.x.shape[2], self.x.device)

    @cached_property
    def ref(self):
        return reference_of(self.x, self.lists)

    @cached_property
    def cudnn_set(self) -> Point | None:
        """The utterances of a stress input that torch's cuDNN path takes (params: ``of`` = the input's N)."""
        T, N, _ = self.x.shape
        keep = np.flatnonzero(peers.cudnn_eligible((T,) * N, tuple(len(l) for l in self.lists), T))
        if keep.size == 0:
            return None
        xs, sub = self.x[:, torch.as_tensor(keep, device=self.x.device)].contiguous(), [self.lists[i] for i in keep]
        return Point("cudnn-set", {**self.params, "N": len(sub), "of": N}, xs, sub)


def _torch(run, m: Measure, series: str, point: Point, fallback: set, capture: dict) -> None:
    """torch's call ``series``, checked, then timed on the GPU clock (in the grid's pass) or the kernel clock (in the
    profiler's: no graph captured it, or ``fallback``, where its capture failed in this process)."""
    params = point.params
    try:
        loss, grad = torch_call(series, point.x, point.lists, reduction="none")()
    except Exception as exc:  # a torch build without this path: say so, keep the run
        run.note(f"{series} failed at {params}: {type(exc).__name__}: {str(exc)[:200]}")
        return
    err = check_within(run, f"{series} agrees with the float64 reference (float32 torch: loss within "
                       f"{FAR_LOSS:g}, gradient within {FAR_GRAD:g})", errors_of(loss, grad, point.ref), params,
                       FAR_LOSS, FAR_GRAD)
    del loss, grad
    extra = {"role": m.role, "floor_ms": point.floor, "runs": TORCH_SERIES[series], **err}
    ok, why = capture.get(series, (False, "not probed"))
    if point.section == "grid":
        try:
            point.rows.append(timed(run, series, torch_call(series, point.x, point.lists), params, x=point.x,
                                    calls_on=lambda xi: torch_call(series, xi, point.lists), **extra))
        except Exception as exc:  # the probe said yes, this process says no: the kernel pass times it, and says so
            run.note(f"{series} at {params}: captured in the probe, not here: {type(exc).__name__}: "
                     f"{str(exc)[:200]}")
            fallback.add((series, params["A"], params["N"]))
        return
    point.spans.append(timed(run, series, torch_call(series, point.x, point.lists), params,
                             not_capturable="captured in the probe, not here" if ok else why, **extra))


def _best(run, m: Measure, _, point: Point, *args) -> None:
    """The faster of torch's rows here on one clock: the GPU clock's in the grid's pass, else the kernel clock's."""
    gpu = point.section == "grid"
    best = min(point.rows if gpu else point.spans, key=lambda r: r["ms"])
    timing = Timing.of(best["spread_ms"], "gpu") if gpu else best["ms"]
    run.record(m.series, timing, params=point.params, role=m.role, floor_ms=point.floor, picked=best["series"],
               **({"host": Timing.of(best["host_spread_ms"], "host")} if gpu else {"clock": "kernel"}),
               note=f"the faster of torch's calls {'timed on the GPU clock' if gpu else 'on the kernel clock'} in "
                    "this run")


def _step(run, m: Measure, number: int | None, point: Point, *args) -> dict:
    """Step ``number`` (None: ``ctc_loss``, which runs the step it picks here) at the point with its section's options,
    checked against the reference (in the stress set, its :func:`outcomes` counted), then timed."""
    x, batch, entry = point.x, point.batch, number is None
    number = final_step(*x.shape, batch.max_positions) if entry else number
    step, how, timing = step_of(number), {}, {"host": False}
    if point.section == "grid":
        extra, timing = recursion_shape(number, batch.max_positions) if number >= 7 and not entry else {}, {}
        timing["floor_ms"] = point.floor
    elif point.section == "grain":  # strided (warp-ctc's layout), the same utterances at every grain
        how["grain"] = point.params["grain"]
        extra = {"threads": block_threads(batch.max_positions, how["grain"])}
    else:
        extra, timing["reps"] = {"max_positions": batch.max_positions}, STRESS_REPS
    call = ctc_loss if entry else lambda xi, b, **out: _call(number, xi, b, **out, **how)
    estimate = torch.empty((x.shape[1],), device=x.device)
    loss, grad = call(x, batch, **({"out_estimate": estimate} if number == 6 else {}))
    err = check_step(run, step, loss, grad, point.ref, batch, point.params, estimate)
    if point.section == "stress":
        err.update(outcomes(loss, grad, *point.ref))
    del loss, grad
    label = {"step": step.series} if entry else {"title": step.title}
    return timed(run, m.series.format(step=step.series), lambda: call(x, batch), point.params, x=x,
                 calls_on=with_outputs(lambda xi, **out: call(xi, batch, **out)), **label, **timing, **extra, **err)


def _plan(run, m: Measure, step, point: Point, *args) -> None:
    """Host time per call of the step through a :class:`CTCPlan`."""
    from studylog.ctc.plan import CTCPlan

    (T, N, A), lists = point.x.shape, point.lists
    plan = CTCPlan(T, N, A, max(1, max(len(l) for l in lists)), step=step, device=point.x.device)
    plan.set_targets(padded(lists), (T,) * N, tuple(len(l) for l in lists))
    call = lambda: plan(point.x)  # noqa: E731
    run.record(m.series.format(step=series_of(step)), run.host_time(call, calls=host_calls(estimate_ms(call))),
               params=point.params, note="CTCPlan call: the kernels only (targets set once, workspace preallocated)")


def call_of(step, point: Point, **how):
    """A step's call (graph-safe) or torch's call ``step`` at ``point``; ``how``: F.ctc_loss's options."""
    if step in TORCH_SERIES:
        return torch_call(step, point.x, point.lists, **how)
    return lambda: _call(step, point.x, point.batch)


def _span(run, m: Measure, step, point: Point, *args) -> None:
    """The final step, or torch-cuDNN, on the kernel clock, to compare with torch's calls a graph cannot capture."""
    row = timed(run, m.series.format(step=series_of(step)), call_of(step, point), point.params, role=m.role,
                host=False)
    if step in TORCH_SERIES:
        point.spans.append(row)


def _counts(run, m: Measure, step, point: Point, *args) -> None:
    """Outcome counts against float64 (:func:`outcomes`), and a kernel-clock time, on a stress input's cuDNN set."""
    sub = point.cudnn_set
    if sub is None:
        return
    series, (T, N, _) = series_of(step), sub.x.shape
    fn = call_of(step, sub, reduction="none")
    try:
        loss, grad = fn()
    except Exception as exc:
        run.note(f"cuDNN-set {series} failed at {sub.params}: {type(exc).__name__}: {str(exc)[:200]}")
        return
    counts = {**outcomes(loss, grad, *sub.ref), **errors(loss, grad, *sub.ref)}
    extra = {"runs": TORCH_SERIES[series]} if series in TORCH_SERIES else {}
    if series == "torch-cuDNN F.ctc_loss":
        extra["use_cudnn_ctc_loss"] = bool(torch._use_cudnn_ctc_loss(
            sub.x.log_softmax(2), concatenated(sub.lists), (T,) * N, tuple(len(l) for l in sub.lists), BLANK))
    try:
        ms = run.kernel_time(fn, reps=5)
    except Exception as exc:  # the counts are what this row is for
        ms, extra["timing_failed"] = math.nan, f"{type(exc).__name__}: {str(exc)[:200]}"
    run.record(m.series.format(step=series), ms, params=sub.params, clock="kernel",
               role="baseline" if series in TORCH_SERIES else "kernel", **extra, **counts)


def _kernels(run, m: Measure, step, point: Point, *args) -> None:
    """Per-kernel device times (profiler, no L2 flush) of a step or torch's call at the point."""
    series = series_of(step)
    try:  # the profile is extra information: never lose the run to it
        kernels = kernel_times_us(call_of(step, point))
        run.record(m.series.format(step=series), sum(kernels.values()) / 1e3, params=point.params, clock="kernel",
                   role="baseline" if series in TORCH_SERIES else "kernel", kernels_us=kernels,
                   method="torch.profiler: device time per call, summed over kernels and copies (no L2 flush)")
    except Exception as exc:
        run.note(f"profiling {series} at {point.params} failed: {exc!r}")


#: How each ``how`` of :data:`TABLE` is measured: ``(run, entry, step, point, fallback, capture)``.
MEASURES = {"torch": _torch, "best": _best, "step": _step, "entry": _step, "plan": _plan,
            "span": _span, "counts": _counts, "kernels": _kernels}


def kernel_times_us(fn) -> dict[str, float]:
    """Mean device time per call (µs, over 10 calls) of every kernel or copy ``fn`` runs, by short name."""
    times: dict[str, float] = {}
    for name, us in peers.device_work(fn, 10).items():
        if us:
            times[short_kernel_name(name)] = times.get(short_kernel_name(name), 0.0) + us
    return times


def short_kernel_name(name: str) -> str:
    """``void ctc_warps_recursion<4>(float const*, ...)`` -> ``ctc_warps_recursion<4>``."""
    name, depth = name.removeprefix("void "), 0
    for i, ch in enumerate(name):
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0:
            return name[:i]
    return name


def _dispatch_checks(run, x: Tensor, lists, params: dict) -> None:
    """Does each torch call run the path it is named after (ATen's rule, our model of it, its kernels)?"""
    T, N, _ = x.shape
    lengths = tuple(len(l) for l in lists)
    log_probs = x.log_softmax(2)
    for series, targets, want in (("torch-cuDNN F.ctc_loss", concatenated(lists), True),
                                  ("torch-native", padded(lists).to(x.device), False)):
        aten = bool(torch._use_cudnn_ctc_loss(log_probs, targets, (T,) * N, lengths, BLANK))
        model = peers.takes_cudnn_path(log_probs, targets, (T,) * N, lengths)
        names = peers.kernel_names(torch_call(series, x, lists))
        native = any(peers.NATIVE_MARKER in n for n in names)
        run.check(f"{series} takes torch's {'cuDNN' if want else 'native'} path (ATen's rule, the model of it, "
                  "and the kernels it launches)", aten == want and model == want and native != want, params=params,
                  use_cudnn_ctc_loss=aten, model=model, kernels=names)
    names = peers.kernel_names(torch_call("torch-cuDNN", x, lists))
    run.check("torch-cuDNN (torch._cudnn_ctc_loss) launches no native CTC kernel",
              bool(names) and not any(peers.NATIVE_MARKER in n for n in names), params=params, kernels=names)


# The benchmark

def bench(run) -> None:
    """Measure :data:`TABLE`: forward + backward at every point, each checked against float64 first."""
    started = time.perf_counter()
    device = torch.device("cuda")
    T = BENCH_T
    torch.backends.cudnn.enabled = True
    capture = peers.capturable()
    for series, (ok, why) in capture.items():
        run.note(f"CUDA-graph capture of {series} ({TORCH_SERIES[series]}): "
                 f"{'captured' if ok else 'not capturable'}; {why}")
    for number in range(7, 15):  # the grains the grid's targets need (T = 150: at most 301 positions)
        preload_fused(number, (1, 2, 3) if number in (7, 8) else (DEFAULT_BLOCK_GRAIN,) if number == 14 else
                      (4, 6, 8, 10))
    preload_blocked(4, sorted({p["grain"] for p in section_points("grain", run.quick)}))  # one NVRTC call
    fallback: set = set()  # (series, A, N) whose capture failed in this process: timed in the profiler's pass
    graph: dict = {}  # (A, N) -> whether a torch call there was timed on the GPU clock
    checked: set = set()
    kept: list = []

    def on_gpu(series: str, A: int, N: int) -> bool:
        """A graph captured torch's call ``series`` in the probe and, at (A, N), in this process."""
        return capture.get(series, (False,))[0] and (series, A, N) not in fallback

    def drawn(generator: torch.Generator, N: int, A: int) -> tuple[list, Tensor]:
        """A point's target lists, then its activations (the generator draws them in this order)."""
        lists = random_targets(T, N, A, generator)
        return lists, torch.randn((T, N, A), generator=generator).to(device)

    for section, desc in SECTIONS.items():
        if section in ("grid", "profiler"):  # the profiler's pass: the grid's inputs again
            generator = torch.Generator().manual_seed(BENCH_SEED)
        if section == "stress":  # drawn whole, after the grid's draws, before the quick run picks
            stress = {tuple(x.shape[:2]): (x, lists) for _, x, lists in stress_set(generator, device)}
        for params in run.progress(section_points(section, run.quick), desc):
            A, N = params["A"], params["N"]
            if section == "kernels":
                point = kept.pop(0)
            elif section == "stress":
                point = Point(section, params, *stress.pop((params["T"], N)))
            else:
                gen = torch.Generator().manual_seed(1000 + A) if section == "grain" else generator
                point = Point(section, params, *reversed(drawn(gen, N, A)), floor=run.floor_ms(dram_bytes(T, N, A)))
            if section == "profiler" and A not in checked:
                checked.add(A)
                _dispatch_checks(run, point.x, point.lists, params)
            for m, step in measures(section, lambda s: on_gpu(s, A, N)):
                state = {"graph": graph.get((A, N), bool(point.rows)), "spans": bool(point.spans),
                         "cudnn_graph": on_gpu("torch-cuDNN", A, N)}
                if holds(m.at, step, params, **state, quick=run.quick):
                    MEASURES[m.how](run, m, step, point, fallback, capture)
            if section == "grid":
                graph[(A, N)] = bool(point.rows)
            if section == "profiler" and (A, N) in PROFILE_CASES and not run.quick:  # per-kernel times, at the end
                kept.append(Point("kernels", params, point.x, point.lists, point.floor))
            del point
            torch.cuda.empty_cache()
    run.note("Our calls take prepared targets (CTCTargets on the GPU, from prepare_targets); torch's calls get "
             "their lengths as tuples, torch-cuDNN (torch._cudnn_ctc_loss) as int32 device tensors.")
    run.note(f"Steps 12 and 13 run their default recursion, step 14 {DEFAULT_BLOCK_GRAIN} positions per thread, "
             "steps 7 and 8 step 5's grain and block size; the other recursion options and grains are experiments, "
             "measured in lab/ctc.")
    run.note("Torch calls that a CUDA graph cannot capture are timed on the kernel clock (profiler span, L2 flushed); "
             "'<step> span' and 'torch-cuDNN span' are the same clock for comparing with them.")
    run.note(f"The ctc benchmark took {time.perf_counter() - started:.0f} s.")
