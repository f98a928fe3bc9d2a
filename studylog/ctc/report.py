"""Chapter 4's benchmark and its inputs: the blog post's grid, the grain sweep, the stress set of long utterances.
What a CUDA graph can capture is timed on the GPU clock, host time beside it; the rest on the ``kernel`` clock."""

from __future__ import annotations

import math
import time
from functools import partial

import numpy as np
import torch
from torch import Tensor

from studylog.bench import Timing
from studylog.ctc import peers
from studylog.ctc.fused import DEFAULT_BLOCK_GRAIN, ctc_loss, final_step, launch_shape, preload_fused
from studylog.ctc.peers import concatenated, padded
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
LESSON_N = (1, 16, 256)
#: Utterances of step 4's grain sweep (strided layout).
SWEEP_N = 64
#: The stress set: blank-heavy utterances of STRESS_T frames (targets of T / 3 labels), and long random ones of
#: LONG_T frames with targets of up to MAX_TARGET_LENGTH labels.
STRESS_T = (50, 100, 200, 400)
STRESS_A, STRESS_N = 28, 8
LONG_T, LONG_N = (1100,), 6
#: (A, N) where the benchmark also records the device time of every kernel of steps 7 to 14 and torch.
PROFILE_CASES = ((28, 1), (28, 256), (5000, 2), (5000, 256))
#: GPU clock: a graph replay holds at least GRAPH_REPLAY_MS of calls (at least 2), replayed GRAPH_REPS times; host
#: time over about HOST_BUDGET_MS of calls; activations rotated among at most MAX_COPIES copies. SPAN_REPS:
#: repetitions of the kernel clock; STRESS_REPS: graph replays per repetition on the stress set (kept for its counts).
GRAPH_REPLAY_MS, GRAPH_REPS, HOST_BUDGET_MS, MAX_COPIES = 1.0, 10, 10.0, 16
SPAN_REPS, STRESS_REPS = 20, 3
#: The steps each section times at each of its points (:func:`grids`), in this order: steps 1 to 6 only at the
#: lesson's points, before the others; ``kernels``: per-kernel device times at PROFILE_CASES.
SECTION_STEPS = {"lesson": tuple(range(1, 7)), "main": tuple(range(7, 15)), "grain": (4,),
                 "stress": tuple(range(5, 15)), "kernels": tuple(range(7, 15))}
#: torch's calls each section checks and times (series of :data:`peers.TORCH_SERIES`); in ``main``, F.ctc_loss on
#: its cuDNN path only at PROFILE_CASES; ``cudnn-set``: on the utterances of a stress input that its cuDNN path takes.
SECTION_TORCH = {"main": tuple(peers.TORCH_SERIES), "cudnn-set": tuple(peers.TORCH_SERIES),
                 "kernels": ("torch-cuDNN", "torch-native")}


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


def grids(quick: bool = False) -> dict[str, list[tuple]]:
    """The benchmark's points by section: ``main``, ``lesson`` (A, N), ``grain`` (A, grain), ``stress`` (T, N)."""
    if quick:  # a smoke test of every section
        return {"main": [(A, N) for A in BENCH_A for N in (BENCH_N[0], BENCH_N[-1])],
                "lesson": [(BENCH_A[0], BENCH_N[0])],
                "grain": [(BENCH_A[0], g) for g in GRAIN_SIZES[:2]], "stress": [(T, STRESS_N) for T in STRESS_T[::2]]}
    return {"main": [(A, N) for A in BENCH_A for N in BENCH_N], "lesson": [(A, N) for A in BENCH_A for N in LESSON_N],
            "grain": [(A, g) for A in BENCH_A for g in GRAIN_SIZES],
            "stress": [(T, STRESS_N) for T in STRESS_T] + [(T, LONG_N) for T in LONG_T]}


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


def _time_step(run, number: int, x: Tensor, batch: CTCTargets, ref, params: dict, *, series: str | None = None,
               counted: bool = False, extra: dict | None = None, entry: bool = False, **how) -> dict:
    """Check step ``number`` (with ``entry``: ``ctc_loss``, which runs it here) against the reference (with
    :func:`outcomes` when ``counted``), then time it; ``how``: the step's options and :func:`timed`'s."""
    step = step_of(number)
    timing = {k: how.pop(k) for k in ("host", "floor_ms", "reps") if k in how}
    call = ctc_loss if entry else lambda xi, b, **out: _call(number, xi, b, **out, **how)
    estimate = torch.empty((x.shape[1],), device=x.device)
    loss, grad = call(x, batch, **({"out_estimate": estimate} if number == 6 else {}))
    err = check_step(run, step, loss, grad, ref, batch, params, estimate)
    if counted:
        err.update(outcomes(loss, grad, *ref))
    del loss, grad
    label = {"step": step.series} if entry else {"title": step.title}
    return timed(run, series or ("ctc_loss" if entry else step.series), lambda: call(x, batch), params, x=x,
                 calls_on=with_outputs(lambda xi, **out: call(xi, batch, **out)), **label, **timing,
                 **(extra or {}), **err)


def _torch_rows(run, x: Tensor, lists, ref, params: dict, capture: dict, floor: float, *, users_path: bool,
                fallback: set, clock: str = "gpu") -> dict[str, dict]:
    """torch's calls at one point, each checked and timed on the GPU clock where a graph captures it, else in the
    kernel clock's pass (``fallback``: the series whose capture failed here); ``users_path``: also F.ctc_loss's."""
    rows = {}
    for series in SECTION_TORCH["main"]:
        if series == "torch-cuDNN F.ctc_loss" and not users_path:
            continue
        ok, why = capture.get(series, (False, "not probed"))
        if (clock == "gpu") != (ok and (series, params["A"], params["N"]) not in fallback):
            continue  # timed in the other pass
        try:
            loss, grad = torch_call(series, x, lists, reduction="none")()
        except Exception as exc:  # a torch build without this path: say so, keep the run
            run.note(f"{series} failed at {params}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        err = check_within(run, f"{series} agrees with the float64 reference (float32 torch: loss within "
                           f"{FAR_LOSS:g}, gradient within {FAR_GRAD:g})", errors_of(loss, grad, ref), params,
                           FAR_LOSS, FAR_GRAD)
        del loss, grad
        extra = {"role": "baseline", "floor_ms": floor, "runs": peers.TORCH_SERIES[series], **err}
        if clock == "gpu":
            try:
                rows[series] = timed(run, series, torch_call(series, x, lists), params, x=x,
                                     calls_on=lambda xi: torch_call(series, xi, lists), **extra)
            except Exception as exc:  # the probe said yes, this process says no: the kernel pass times it, and says so
                run.note(f"{series} at {params}: captured in the probe, not here: {type(exc).__name__}: "
                         f"{str(exc)[:200]}")
                fallback.add((series, params["A"], params["N"]))
            continue
        if ok:
            why = "captured in the probe, not here"
        rows[series] = timed(run, series, torch_call(series, x, lists), params, not_capturable=why, **extra)
    return rows


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


def prepared_batch(lists, T: int, A: int, device) -> CTCTargets:
    return prepare_targets(padded(lists), (T,) * len(lists), tuple(len(l) for l in lists), num_classes=A,
                           max_time=T, device=device)


def reference_of(x: Tensor, lists):
    return reference_ctc(x, padded(lists).to(x.device), (x.shape[0],) * len(lists), tuple(len(l) for l in lists))


# The benchmark

def bench(run) -> None:
    """Forward + backward over :func:`grids`' points: torch and the steps, step 4's grain sweep, the stress set
    against float64, and per-kernel device times."""
    from studylog.ctc import CHAPTER

    started = time.perf_counter()
    device = torch.device("cuda")
    grid = grids(run.quick)
    generator = torch.Generator().manual_seed(BENCH_SEED)
    T, final = BENCH_T, CHAPTER.final
    torch.backends.cudnn.enabled = True

    def drawn_inputs(generator: torch.Generator, N: int, A: int) -> tuple[list, Tensor, dict]:
        """A point's target lists, then its activations (the generator draws them in this order), and its params."""
        lists = random_targets(T, N, A, generator)
        x = torch.randn((T, N, A), generator=generator).to(device)
        return lists, x, {"T": T, "N": N, "A": A}

    capture = peers.capturable()
    for series, (ok, why) in capture.items():
        run.note(f"CUDA-graph capture of {series} ({peers.TORCH_SERIES[series]}): "
                 f"{'captured' if ok else 'not capturable'}; {why}")
    for number in SECTION_STEPS["main"]:  # the grains the grid's targets need (T = 150: at most 301 positions)
        preload_fused(number, (1, 2, 3) if number in (7, 8) else (DEFAULT_BLOCK_GRAIN,) if number == 14 else
                      (4, 6, 8, 10))
    profile_points: list = []
    checked: set[int] = set()
    fallback: set = set()  # (series, A, N) whose capture failed in this process: timed in the profiler's pass
    gpu_points: dict = {}  # (A, N) -> whether a torch call there was timed on the GPU clock
    # Every GPU-clock timing first, then the profiler's pass over the same inputs: once torch's profiler has
    # attached, every later launch in the process runs slower, so nothing that a headline reads may follow it.
    for A, N in run.progress(grid["main"], "T = 150 grid"):
        lists, x, params = drawn_inputs(generator, N, A)
        floor = run.floor_ms(dram_bytes(T, N, A))
        ref = reference_of(x, lists)
        rows = _torch_rows(run, x, lists, ref, params, capture, floor, users_path=(A, N) in PROFILE_CASES,
                           fallback=fallback)
        on_gpu = [r for r in rows.values() if r["clock"] == "gpu"]
        gpu_points[(A, N)] = bool(on_gpu)
        if on_gpu:
            best = min(on_gpu, key=lambda r: r["ms"])
            run.record("torch-best", Timing.of(best["spread_ms"], "gpu"), params=params, role="baseline",
                       floor_ms=floor, host=Timing.of(best["host_spread_ms"], "host"), picked=best["series"],
                       note="the faster of torch's calls timed on the GPU clock in this run")
        batch = prepared_batch(lists, T, A, device)
        for number in (SECTION_STEPS["lesson"] if (A, N) in grid["lesson"] else ()) + SECTION_STEPS["main"]:
            _time_step(run, number, x, batch, ref, params, floor_ms=floor,
                       extra=recursion_shape(number, batch.max_positions) if number >= 7 else None)
        _time_step(run, final_step(T, N, A, batch.max_positions), x, batch, ref, params, floor_ms=floor, entry=True)
        _plan_host(run, final.number, x, lists, params)
        del x, ref, batch
        torch.cuda.empty_cache()

    (number,) = SECTION_STEPS["grain"]
    preload_blocked(number, sorted({grain for _, grain in grid["grain"]}))  # one NVRTC call for the sweep
    for A, grain in run.progress(grid["grain"], "grain sweep"):  # step 4, strided (warp-ctc's layout)
        # the same utterances at every grain
        lists, x, params = drawn_inputs(torch.Generator().manual_seed(1000 + A), SWEEP_N, A)
        batch = prepared_batch(lists, T, A, device)
        if block_threads(batch.max_positions, grain) > 1024:
            continue
        _time_step(run, number, x, batch, reference_of(x, lists), {**params, "grain": grain},
                   series=f"{step_of(number).series} strided", host=False, grain=grain,
                   extra={"threads": block_threads(batch.max_positions, grain)})
        del x, batch

    generator = torch.Generator().manual_seed(BENCH_SEED)  # the profiler's pass: the grid's inputs again
    for A, N in run.progress(grid["main"], "T = 150 grid, profiler"):
        lists, x, params = drawn_inputs(generator, N, A)
        if A not in checked:
            checked.add(A)
            _dispatch_checks(run, x, lists, params)
        floor = run.floor_ms(dram_bytes(T, N, A))
        on_gpu = gpu_points[(A, N)]
        spans = list(_torch_rows(run, x, lists, reference_of(x, lists), params, capture, floor,
                                 users_path=(A, N) in PROFILE_CASES, clock="kernel", fallback=fallback).values())
        batch = prepared_batch(lists, T, A, device)
        if spans and (N in LESSON_N or not on_gpu):  # one clock with the torch calls a graph cannot capture
            timed(run, f"{final.series} span", lambda: _call(final.number, x, batch), params, host=False)
            if capture.get("torch-cuDNN", (False,))[0] and ("torch-cuDNN", A, N) not in fallback:
                spans.append(timed(run, "torch-cuDNN span", torch_call("torch-cuDNN", x, lists), params,
                                   role="baseline", host=False))
            best = min(spans, key=lambda r: r["ms"])
            for series in ("torch-best span",) + (() if on_gpu else ("torch-best",)):
                run.record(series, best["ms"], params=params, role="baseline", clock="kernel", picked=best["series"],
                           floor_ms=floor, note="the faster of torch's calls on the kernel clock in this run")
        if (A, N) in PROFILE_CASES and not run.quick:  # per-kernel device times, at the end
            profile_points.append((x, batch, lists, params))
        del x, batch
        torch.cuda.empty_cache()

    wanted = set(grid["stress"])
    for name, x, lists in run.progress([c for c in stress_set(generator, device) if tuple(c[1].shape[:2]) in wanted],
                                       "stress set"):
        _stress_case(run, name, x, lists)
        torch.cuda.empty_cache()
    for x, batch, lists, params in run.progress(profile_points, "kernel times"):
        _profile_point(run, x, batch, lists, params)
    run.note("Our calls take prepared targets (CTCTargets on the GPU, from prepare_targets); torch's calls get "
             "their lengths as tuples, torch-cuDNN (torch._cudnn_ctc_loss) as int32 device tensors.")
    run.note(f"Steps 12 and 13 run their default recursion, step 14 {DEFAULT_BLOCK_GRAIN} positions per thread, "
             "steps 7 and 8 step 5's grain and block size; the other recursion options and grains are experiments, "
             "measured in lab/ctc.")
    run.note("Torch calls that a CUDA graph cannot capture are timed on the kernel clock (profiler span, L2 flushed); "
             "'<step> span' and 'torch-cuDNN span' are the same clock for comparing with them.")
    run.note(f"The ctc benchmark took {time.perf_counter() - started:.0f} s.")


def recursion_shape(step: int, max_positions: int) -> dict:
    """What a row of step ``step`` (7 to 14) records of its recursion's launch: positions, per lane (or thread),
    and the ``threads`` (7, 8) or ``warps`` (14) of a direction."""
    v, threads = launch_shape(step, max_positions)
    block = {"threads": threads} if step in (7, 8) else {"warps": threads // 32} if step == 14 else {}
    return {"max_positions": max_positions, "positions_per_lane": v, **block}


def _plan_host(run, step: int, x: Tensor, lists, params: dict) -> None:
    """Host time per call of the step through a :class:`CTCPlan`."""
    from studylog.ctc.plan import CTCPlan

    T, N, A = x.shape
    plan = CTCPlan(T, N, A, max(1, max(len(l) for l in lists)), step=step, device=x.device)
    plan.set_targets(padded(lists), (T,) * N, tuple(len(l) for l in lists))
    call = lambda: plan(x)  # noqa: E731
    run.record(f"{step_of(step).series} plan", run.host_time(call, calls=host_calls(estimate_ms(call))),
               params=params, note="CTCPlan call: the kernels only (targets set once, workspace preallocated)")


def _stress_case(run, name: str, x: Tensor, lists) -> None:
    """The stress steps and the entry point on one input of the stress set, then torch's calls and steps 6 and 14 on
    the utterances its cuDNN path takes, each counted against float64 (:func:`outcomes`)."""
    from studylog.ctc import CHAPTER

    T, N, A = x.shape
    lengths = tuple(len(l) for l in lists)
    batch, ref = prepared_batch(lists, T, A, x.device), reference_of(x, lists)
    params = {"T": T, "N": N, "A": A, "inputs": name.split()[0]}
    for number in SECTION_STEPS["stress"]:
        _time_step(run, number, x, batch, ref, params, series=f"stress {step_of(number).series}", host=False,
                   counted=True, reps=STRESS_REPS, extra={"max_positions": batch.max_positions})
    _time_step(run, final_step(T, N, A, batch.max_positions), x, batch, ref, params, series="stress ctc_loss",
               host=False, counted=True, reps=STRESS_REPS, entry=True, extra={"max_positions": batch.max_positions})
    keep = np.flatnonzero(peers.cudnn_eligible((T,) * N, lengths, T))
    if keep.size == 0:
        return
    xs, sub = x[:, torch.as_tensor(keep, device=x.device)].contiguous(), [lists[i] for i in keep]
    sub_ref, sub_batch = reference_of(xs, sub), prepared_batch(sub, T, A, x.device)
    params = {**params, "N": len(sub), "of": N}
    calls = {series: torch_call(series, xs, sub, reduction="none") for series in SECTION_TORCH["cudnn-set"]}
    calls.update({step_of(k).series: partial(_call, k, xs, sub_batch) for k in (6, CHAPTER.final.number)})
    for series, fn in calls.items():
        try:
            loss, grad = fn()
        except Exception as exc:
            run.note(f"cuDNN-set {series} failed at {params}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        counts = {**outcomes(loss, grad, *sub_ref), **errors(loss, grad, *sub_ref)}
        extra = {"runs": peers.TORCH_SERIES[series]} if series in peers.TORCH_SERIES else {}
        if series == "torch-cuDNN F.ctc_loss":
            extra["use_cudnn_ctc_loss"] = bool(torch._use_cudnn_ctc_loss(
                xs.log_softmax(2), concatenated(sub), (T,) * len(sub), tuple(len(l) for l in sub), BLANK))
        try:
            ms = run.kernel_time(fn, reps=5)
        except Exception as exc:  # the counts are what this row is for
            ms, extra["timing_failed"] = math.nan, f"{type(exc).__name__}: {str(exc)[:200]}"
        run.record(f"cudnn-set {series}", ms, params=params, clock="kernel",
                   role="baseline" if series.startswith("torch") else "kernel", **extra, **counts)


def _profile_point(run, x: Tensor, batch: CTCTargets, lists, params: dict) -> None:
    """Per-kernel device times (profiler, no L2 flush) of the fused steps and torch's calls at one point."""
    calls = {series: torch_call(series, x, lists) for series in SECTION_TORCH["kernels"]}
    calls.update({step_of(k).series: partial(_call, k, x, batch) for k in SECTION_STEPS["kernels"]})
    for series, fn in calls.items():
        try:
            kernels = kernel_times_us(fn)
            run.record(f"{series} kernels", sum(kernels.values()) / 1e3, params=params, clock="kernel",
                       role="baseline" if series.startswith("torch") else "kernel", kernels_us=kernels,
                       method="torch.profiler: device time per call, summed over kernels and copies (no L2 flush)")
        except Exception as exc:  # the profile is extra information: never lose the run to it
            run.note(f"profiling {series} at {params} failed: {exc!r}")
