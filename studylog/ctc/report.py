"""Chapter 4's benchmark and the inputs it uses (the blog post's grid, the grain sweep and the stress set of
long utterances); its headline is in :mod:`studylog.ctc.results`, its figures are the book's. Series names come from
``CHAPTER.steps``.

Clocks (the harness's policy, ``studylog/bench.py``): every step and every torch call that a CUDA graph can
capture is timed on the GPU clock (graph replay, repeated three times, with its spread), with the host time
per call of the same public call beside it. A torch call that cannot be captured (the probe says which,
:func:`studylog.ctc.peers.capturable`) is timed on the ``kernel`` clock (the profiler's span from its first
kernel to its last, L2 flushed), and its row says so; no headline rests on it.
"""

from __future__ import annotations

import math
import re
import time
import numpy as np
import torch
from torch import Tensor

from studylog.ctc import peers
from studylog.ctc.fused import DEFAULT_BLOCK_GRAIN, ctc_loss, final_step, preload_fused, recursion_warps, warp_grain
from studylog.ctc.peers import concatenated, padded
from studylog.ctc.reference import (FAR_GRAD, FAR_LOSS, GRAD_TOLERANCE, LOSS_TOLERANCE, errors, outcomes,
                                    reference_ctc, wrong_utterances)
from studylog.ctc.targets import BLANK, MAX_TARGET_LENGTH, CTCTargets, min_frames, prepare_targets
from studylog.ctc.warpctc import GRAIN_SIZES, block_threads, preload_blocked, untrusted_answers

BENCH_T = 150
BENCH_N = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BENCH_A = (28, 5000)
#: Batch sizes at which steps 1 to 6 (the warp-ctc design, milliseconds a call at A = 5000) are timed.
LESSON_N = (1, 16, 256)
#: Utterances of the grain-size sweep (step 4, strided layout).
SWEEP_N = 64
#: Utterance lengths of the rescaling stress test (targets of T / 3 labels, blank-heavy frames).
STRESS_T = (50, 100, 200, 400)
STRESS_A, STRESS_N = 28, 8
BENCH_DEVICE = "cuda"
#: (A, N) where the benchmark also records the device time of every kernel of steps 7 to 10 and torch.
PROFILE_CASES = ((28, 1), (28, 256), (5000, 2), (5000, 256))
#: The long utterances of the stress set (A = 28): random activations, targets of up to
#: MAX_TARGET_LENGTH labels, T frames. Short targets among them leave float32 probability space
#: finite and wrong.
LONG_T = (1100,)
LONG_N = 6
#: GPU clock settings: a graph replay holds at least GRAPH_REPLAY_MS of calls (at least 2), replayed
#: GRAPH_REPS times; host time per call over about HOST_BUDGET_MS of calls; activations rotated among at most
#: MAX_COPIES copies (a smaller input is a layer's fresh output, which a real step finds in L2).
GRAPH_REPLAY_MS, GRAPH_REPS, HOST_BUDGET_MS, MAX_COPIES = 1.0, 10, 10.0, 16
#: Repetitions of the profiler's span (kernel clock) for calls a graph cannot capture.
SPAN_REPS = 20
#: Graph replays per repetition on the stress set (its times are not what its rows are for).
STRESS_REPS = 3


def random_targets(T: int, N: int, A: int, generator: torch.Generator, max_length: int = 255) -> list[np.ndarray]:
    """Target label sequences as in the blog post's benchmark: length uniform in [1, min(T, max_length)],
    labels uniform in [1, A), shortened until they fit T frames (a blank between repeats); all valid
    for torch's cuDNN path (shorter than 256, no longer than the input)."""
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
    """Long utterances whose frames strongly prefer the blank, with targets that must still be
    emitted (L about T / 3): the surviving alignments are, at every frame, far less likely than
    the best partial path, which is exactly what per-frame rescaling in float32 cannot hold."""
    x = torch.randn((T, N, A), generator=generator) * 2.0
    x[:, :, BLANK] += 6.0
    lists = [torch.randint(1, A, (min(T // 3, MAX_TARGET_LENGTH),), generator=generator).numpy() for _ in range(N)]
    return x.to(device), lists


def long_inputs(T: int, N: int, A: int, generator: torch.Generator, device) -> tuple[Tensor, list[np.ndarray]]:
    """Long utterances with random activations and targets drawn as the benchmark's, up to
    MAX_TARGET_LENGTH labels: the short targets among them keep a finite loss in float32 probability
    space that is nonetheless wrong (the alignments that finish late underflow early)."""
    lists = random_targets(T, N, A, generator, max_length=MAX_TARGET_LENGTH)
    return torch.randn((T, N, A), generator=generator).to(device), lists


def stress_set(generator: torch.Generator, device, *, quick: bool = False) -> list[tuple[str, Tensor, list]]:
    """The chapter's stress set: (name, activations, target lists), every input at full length T.
    Blank-heavy utterances of STRESS_T frames (STRESS_N of them) and long random ones of LONG_T frames."""
    cases = []
    for T in STRESS_T[::2] if quick else STRESS_T:
        x, lists = stress_inputs(T, STRESS_N, STRESS_A, generator, device)
        cases.append((f"blank-heavy T={T}", x, lists))
    for T in LONG_T:
        x, lists = long_inputs(T, LONG_N, STRESS_A, generator, device)
        cases.append((f"long T={T}", x, lists))
    return cases


def kernel_times_us(fn, calls: int = 10) -> dict[str, float]:
    """Mean device time per call (µs) of every kernel or copy ``fn`` runs, from torch.profiler (CUPTI).
    No L2 flush between calls, unlike the benchmark's timings."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        # only work that ran on the device: API calls (cudaLaunchKernel, cuLaunchKernel, ...) may carry
        # the time of the kernel they launched, which would count it twice
        if getattr(event, "device_type", DeviceType.CUDA) != DeviceType.CUDA or re.match(r"cu(da)?[A-Z]", event.key):
            continue
        total = getattr(event, "device_time_total", None)
        total = getattr(event, "cuda_time_total", 0.0) if total is None else total
        if total:
            key = _short_kernel_name(event.key)
            times[key] = times.get(key, 0.0) + total / calls
    return times


def _short_kernel_name(name: str) -> str:
    """``void ctc_warps_recursion<4>(float const*, ...)`` -> ``ctc_warps_recursion<4>``."""
    name = name.removeprefix("void ")
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            return name[:i]
    return name


# --------------------------------------------------------------------------------------
# What the benchmark runs (the grids; also read by the cost estimate)
# --------------------------------------------------------------------------------------

def grids(quick: bool = False) -> dict[str, list[tuple]]:
    """The benchmark's points, by section: ``main`` (A, N): torch and steps 7 to 10; ``lesson`` (A, N):
    steps 1 to 6; ``grain`` (A, grain): step 4's sweep at ``SWEEP_N``; ``stress`` (T, N): the stress set."""
    if quick:  # a smoke test of every section
        return {"main": [(A, N) for A in BENCH_A for N in (BENCH_N[0], BENCH_N[-1])],
                "lesson": [(BENCH_A[0], BENCH_N[0])],
                "grain": [(BENCH_A[0], g) for g in GRAIN_SIZES[:2]], "stress": [(T, STRESS_N) for T in STRESS_T[::2]]}
    return {"main": [(A, N) for A in BENCH_A for N in BENCH_N], "lesson": [(A, N) for A in BENCH_A for N in LESSON_N],
            "grain": [(A, g) for A in BENCH_A for g in GRAIN_SIZES],
            "stress": [(T, STRESS_N) for T in STRESS_T] + [(T, LONG_N) for T in LONG_T]}


def graph_settings(estimate_ms: float, reps: int = GRAPH_REPS) -> dict[str, int]:
    """``min_calls`` and ``reps`` of :meth:`BenchRun.gpu_time` for a call of about ``estimate_ms``: calls of a
    millisecond or more vary little from replay to replay, and get half the replays."""
    return {"min_calls": int(min(60, max(2, math.ceil(GRAPH_REPLAY_MS / max(estimate_ms, 1e-3))))),
            "reps": reps if estimate_ms < 1.0 else max(3, reps // 2)}


def host_calls(estimate_ms: float) -> int:
    """Calls per repetition of the host time: about HOST_BUDGET_MS of GPU work, 5 to 200."""
    return int(min(200, max(5, HOST_BUDGET_MS / max(estimate_ms, 1e-3))))


def copies(l2_bytes: int, nbytes: int) -> int:
    """Copies of the activations to rotate among: enough to exceed 4x L2 together (the harness's rule), but
    only for inputs of at least a quarter of L2 (MAX_COPIES copies); a smaller input stays in L2."""
    n = max(1, -(-4 * l2_bytes // max(nbytes, 1)))
    return n if n <= MAX_COPIES else 1


# --------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------

def _step(number: int):
    from studylog.ctc import CHAPTER

    return CHAPTER.step(number)


def _call(number: int, x: Tensor, batch: CTCTargets, **how):
    """One call of a step, graph-safe and without a host synchronisation (step 6 does not warn)."""
    if number == 6:
        how = {"warn": False, **how}
    return _step(number).function(x, batch, **how)


def _estimate_ms(fn) -> float:
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


def _gpu_row(run, series: str, make_calls, host_fn, params: dict, *, role: str = "kernel", host: bool = True,
             floor_ms: float | None = None, reps: int = GRAPH_REPS, **extra) -> dict:
    """The GPU clock of ``make_calls`` (with the host time of ``host_fn`` beside it), recorded."""
    estimate = _estimate_ms(host_fn)
    timing = run.gpu_time(make_calls, repeats=3, **graph_settings(estimate, reps))
    host_timing = run.host_time(host_fn, calls=host_calls(estimate)) if host else None
    return run.record(series, timing, params=params, role=role, floor_ms=floor_ms, host=host_timing, **extra)


def _span_row(run, series: str, fn, params: dict, *, role: str = "baseline", host: bool = True, **extra) -> dict:
    """The kernel clock of ``fn`` (a call a graph cannot capture), with its host time beside it, recorded."""
    estimate = _estimate_ms(fn)
    ms = run.kernel_time(fn, reps=SPAN_REPS)
    host_timing = run.host_time(fn, calls=host_calls(estimate)) if host else None
    return run.record(series, ms, params=params, role=role, clock="kernel", host=host_timing, **extra)


def _rotated(run, x: Tensor, factory):
    """``make_calls`` for :meth:`BenchRun.gpu_time`: fresh activations of ``x``'s shape, rotated among
    :func:`copies` of them; ``factory(x_i)`` builds one call on a copy (its outputs and constant inputs
    allocated there, before any capture)."""
    n = copies(run.device.get("l2_cache_bytes") or 64 * 2**20, x.numel() * 4)
    return lambda: [factory(torch.randn_like(x)) for _ in range(n)]


def _ours(number: int, batch: CTCTargets, **how):
    """A factory for :func:`_rotated`: step ``number`` on ``x_i`` with its own output buffers."""
    def factory(xi):
        loss, grad = torch.empty((xi.shape[1],), device=xi.device), torch.empty_like(xi)
        return lambda: _call(number, xi, batch, out_loss=loss, out_grad=grad, **how)
    return factory


def _check_step(run, step, loss, grad, ref, batch, params, estimate=None) -> dict:
    err = errors(loss, grad, *ref)
    err["infinite_losses"] = int((~torch.isfinite(loss)).sum())
    if step.number == 6:  # probability space is measured, not held to the log-space tolerances
        wrong = wrong_utterances(loss, grad, *ref)
        flagged = untrusted_answers(loss, estimate, batch)
        err["flagged"], err["wrong"] = int(flagged.sum()), int(wrong.sum())
        run.check(f"{step.series} flags every answer it gets wrong", not bool((wrong & ~flagged).any()),
                  params=params, **err)
    else:
        run.check(f"{step.series} matches the float64 reference", err["mismatched"] == 0 and
                  err["loss_rel"] <= LOSS_TOLERANCE and err["grad_rel"] <= GRAD_TOLERANCE, params=params, **err)
    return err


def _time_step(run, number: int, x: Tensor, batch: CTCTargets, ref, params: dict, *, series: str | None = None,
               host: bool = True, floor_ms: float | None = None, extra: dict | None = None,
               counted: bool = False, reps: int = GRAPH_REPS, **how) -> dict:
    """Check step ``number`` on ``x`` against the reference (with :func:`outcomes` in the row when
    ``counted``), then time it on the GPU clock."""
    step = _step(number)
    estimate = torch.empty((x.shape[1],), device=x.device)
    loss, grad = _call(number, x, batch, **({"out_estimate": estimate} if number == 6 else {}), **how)
    err = _check_step(run, step, loss, grad, ref, batch, params, estimate)
    if counted:
        err.update(outcomes(loss, grad, *ref))
    del loss, grad
    return _gpu_row(run, series or step.series, _rotated(run, x, _ours(number, batch, **how)),
                    lambda: _call(number, x, batch, **how), params, host=host, floor_ms=floor_ms, title=step.title,
                    reps=reps, **(extra or {}), **err)


#: The series of the chapter's entry point, ``ctc_loss`` (the step its rule, ``fused.final_step``, picks for the
#: shape; the row's ``step`` says which).
ENTRY_SERIES = "ctc_loss"


def _time_entry(run, x: Tensor, batch: CTCTargets, ref, params: dict, floor: float) -> dict:
    """``ctc_loss`` itself at one point: checked against the reference, then timed on the GPU clock."""
    number = final_step(*x.shape)
    loss, grad = ctc_loss(x, batch)
    err = _check_step(run, _step(number), loss, grad, ref, batch, params)
    del loss, grad

    def factory(xi):
        loss, grad = torch.empty((xi.shape[1],), device=xi.device), torch.empty_like(xi)
        return lambda: ctc_loss(xi, batch, out_loss=loss, out_grad=grad)

    return _gpu_row(run, ENTRY_SERIES, _rotated(run, x, factory), lambda: ctc_loss(x, batch), params,
                    floor_ms=floor, step=f"step{number:02d}", **err)


def _torch_rows(run, x: Tensor, lists, ref, params: dict, capture: dict, floor: float, *, users_path: bool
                ) -> dict[str, dict]:
    """torch's calls at one point: each checked against the reference (within float32 torch's accuracy)
    and timed on the GPU clock when a graph can capture it, else on the kernel clock. ``users_path``: also
    ``F.ctc_loss`` on its cuDNN path."""
    factories = {"torch-cuDNN": lambda xi: peers.cudnn_direct(xi, lists),
                 "torch-cuDNN F.ctc_loss": lambda xi: peers.functional(xi, lists, "cudnn"),
                 "torch-native": lambda xi: peers.functional(xi, lists, "native")}
    if not users_path:
        del factories["torch-cuDNN F.ctc_loss"]
    rows = {}
    for series, factory in factories.items():
        path = "cudnn" if "cuDNN" in series else "native"
        checked = peers.cudnn_direct(x, lists) if series == "torch-cuDNN" else \
            peers.functional(x, lists, path, reduction="none")
        try:
            loss, grad = checked()
        except Exception as exc:  # a torch build without this path: say so, keep the run
            run.note(f"{series} failed at {params}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        err = errors(loss, grad, *ref)
        err["infinite_losses"] = int((~torch.isfinite(loss)).sum())
        run.check(f"{series} agrees with the float64 reference (float32 torch: loss within {FAR_LOSS:g}, gradient "
                  f"within {FAR_GRAD:g})", err["mismatched"] == 0 and err["loss_rel"] <= FAR_LOSS
                  and err["grad_rel"] <= FAR_GRAD, params=params, **err)
        del loss, grad
        ok, why = capture.get(series, (False, "not probed"))
        extra = {"floor_ms": floor, "runs": peers.TORCH_SERIES[series], **err}
        try:
            if ok:
                rows[series] = _gpu_row(run, series, _rotated(run, x, factory), factory(x), params, role="baseline",
                                        **extra)
                continue
        except Exception as exc:  # the probe said yes, this process says no: fall back, and say so
            why = f"captured in the probe, not here: {type(exc).__name__}: {str(exc)[:200]}"
            run.note(f"{series} at {params}: {why}")
        rows[series] = _span_row(run, series, factory(x), params, not_capturable=why, **extra)
    return rows


def _dispatch_checks(run, x: Tensor, lists, params: dict) -> None:
    """Does each torch call run the path it is named after? ATen's own rule and the kernels it launches."""
    T, N, _ = x.shape
    lengths = tuple(len(l) for l in lists)
    log_probs = x.log_softmax(2)
    for series, targets, want in (("torch-cuDNN F.ctc_loss", concatenated(lists), True),
                                  ("torch-native", padded(lists).to(x.device), False)):
        aten = bool(torch._use_cudnn_ctc_loss(log_probs, targets, (T,) * N, lengths, BLANK))
        model = peers.takes_cudnn_path(log_probs, targets, (T,) * N, lengths)
        names = peers.kernel_names(peers.functional(x, lists, "cudnn" if want else "native"))
        native = any(peers.NATIVE_MARKER in n for n in names)
        run.check(f"{series} takes torch's {'cuDNN' if want else 'native'} path (ATen's rule, the model of it, "
                  "and the kernels it launches)", aten == want and model == want and native != want, params=params,
                  use_cudnn_ctc_loss=aten, model=model, kernels=names)
    names = peers.kernel_names(peers.cudnn_direct(x, lists))
    run.check("torch-cuDNN (torch._cudnn_ctc_loss) launches no native CTC kernel",
              bool(names) and not any(peers.NATIVE_MARKER in n for n in names), params=params, kernels=names)


def bench(run) -> None:
    """Forward + backward from activations for T = 150, N = 1..256, A in {28, 5000}: torch's cuDNN and native
    paths and steps 7 to 10 at every N, steps 1 to 6 at a few; then step 4's grain sweep, the stress set (steps 5
    to 10), torch on the stress set against float64 (the blog post's question), and per-kernel device times."""
    from studylog.ctc import CHAPTER

    started = time.perf_counter()
    device = torch.device(BENCH_DEVICE)
    grid = grids(run.quick)
    generator = torch.Generator().manual_seed(2024)
    T = BENCH_T
    torch.backends.cudnn.enabled = True
    capture = peers.capturable()
    for series, (ok, why) in capture.items():
        run.note(f"CUDA-graph capture of {series} ({peers.TORCH_SERIES[series]}): "
                 f"{'captured' if ok else 'not capturable'}; {why}")
    final = CHAPTER.final
    preload_fused(7, (4, 6, 8, 10))
    preload_fused(8, (4, 6, 8, 10))
    preload_fused(9, (4, 6, 8, 10))
    preload_fused(10, (DEFAULT_BLOCK_GRAIN,))
    lesson = set(grid["lesson"])
    profile_points: list = []
    checked: set[int] = set()
    for A, N in run.progress(grid["main"], "T = 150 grid"):
        lists = random_targets(T, N, A, generator)
        x = torch.randn((T, N, A), generator=generator).to(device)
        lengths = tuple(len(l) for l in lists)
        params = {"T": T, "N": N, "A": A}
        floor = run.floor_ms(dram_bytes(T, N, A))
        ref = reference_ctc(x, padded(lists).to(device), (T,) * N, lengths)
        if A not in checked:
            checked.add(A)
            _dispatch_checks(run, x, lists, params)
        rows = _torch_rows(run, x, lists, ref, params, capture, floor, users_path=(A, N) in PROFILE_CASES)
        on_gpu = [r for r in rows.values() if r["clock"] == "gpu"]
        if on_gpu:
            best = min(on_gpu, key=lambda r: r["ms"])
            run.record("torch-best", _timing(best), params=params, role="baseline", floor_ms=floor,
                       host=_host_timing(best), picked=best["series"],
                       note="the faster of torch's calls timed on the GPU clock in this run")
        spans = [r for r in rows.values() if r["clock"] == "kernel"]
        batch = prepare_targets(padded(lists), (T,) * N, lengths, num_classes=A, max_time=T, device=device)
        shape = {"max_positions": batch.max_positions, "positions_per_lane": warp_grain(batch.max_positions)}
        block_shape = {"max_positions": batch.max_positions, "positions_per_lane": DEFAULT_BLOCK_GRAIN,
                       "warps": recursion_warps(batch.max_positions, DEFAULT_BLOCK_GRAIN)}
        for s in CHAPTER.steps:
            if s.number <= 6 and (A, N) not in lesson:
                continue
            _time_step(run, s.number, x, batch, ref, params, floor_ms=floor,
                       extra=block_shape if s.number == 10 else shape if s.number >= 7 else None)
        _time_entry(run, x, batch, ref, params, floor)
        if spans and (N in LESSON_N or not on_gpu):  # one clock with the torch calls a graph cannot capture
            _span_row(run, f"{final.series} span", lambda: _call(final.number, x, batch), params, role="kernel",
                      host=False)
            if "torch-cuDNN" in rows and rows["torch-cuDNN"]["clock"] == "gpu":
                spans.append(_span_row(run, "torch-cuDNN span", peers.cudnn_direct(x, lists), params, host=False))
            best = min(spans, key=lambda r: r["ms"])
            for series in ("torch-best span",) + (() if on_gpu else ("torch-best",)):
                run.record(series, best["ms"], params=params, role="baseline", clock="kernel", picked=best["series"],
                           floor_ms=floor, note="the faster of torch's calls on the kernel clock in this run")
        _plan_host(run, final.number, x, lists, params)
        if (A, N) in PROFILE_CASES and not run.quick:  # per-kernel device times, at the end
            profile_points.append((x, batch, lists, params))
        del x, ref, batch
        torch.cuda.empty_cache()

    preload_blocked(4, sorted({grain for _, grain in grid["grain"]}))  # one NVRTC call for the sweep
    for A, grain in run.progress(grid["grain"], "grain sweep"):  # step 4, strided (warp-ctc's layout)
        gen = torch.Generator().manual_seed(1000 + A)  # the same utterances at every grain
        lists = random_targets(T, SWEEP_N, A, gen)
        x = torch.randn((T, SWEEP_N, A), generator=gen).to(device)
        lengths = tuple(len(l) for l in lists)
        batch = prepare_targets(padded(lists), (T,) * SWEEP_N, lengths, num_classes=A, max_time=T, device=device)
        if block_threads(batch.max_positions, grain) > 1024:
            continue
        ref = reference_ctc(x, padded(lists).to(device), (T,) * SWEEP_N, lengths)
        _time_step(run, 4, x, batch, ref, {"T": T, "N": SWEEP_N, "A": A, "grain": grain},
                   series=f"{_step(4).series} strided", host=False, grain=grain,
                   extra={"threads": block_threads(batch.max_positions, grain)})
        del x, ref, batch

    wanted = set(grid["stress"])
    stress = [c for c in stress_set(generator, device) if tuple(c[1].shape[:2]) in wanted]
    for name, x, lists in run.progress(stress, "stress set"):
        _stress_case(run, name, x, lists)
        torch.cuda.empty_cache()
    for x, batch, lists, params in run.progress(profile_points, "kernel times"):
        _profile_point(run, x, batch, lists, params)
    run.note("Our calls take prepared targets (CTCTargets on the GPU, from prepare_targets); torch's calls get "
             "their lengths as tuples, torch-cuDNN (torch._cudnn_ctc_loss) as int32 device tensors.")
    run.note(f"Steps 8 and 9 run their default recursion, step 10 {DEFAULT_BLOCK_GRAIN} positions per thread; "
             "the other recursion options and grains are experiments, measured in lab/ctc.")
    run.note("Torch calls that a CUDA graph cannot capture are timed on the kernel clock (profiler span, L2 flushed); "
             "'<step> span' and 'torch-cuDNN span' are the same clock for comparing with them.")
    run.note(f"The ctc benchmark took {time.perf_counter() - started:.0f} s.")


def _timing(row: dict):
    from studylog.bench import Timing

    return Timing.of(row["spread_ms"], row["clock"]) if "spread_ms" in row else row["ms"]


def _host_timing(row: dict):
    from studylog.bench import Timing

    return Timing.of(row["host_spread_ms"], "host") if "host_spread_ms" in row else None


def _plan_host(run, step: int, x: Tensor, lists, params: dict) -> None:
    """Host time per call of the step through a :class:`CTCPlan` (what a graph-less loop pays per call)."""
    from studylog.ctc.plan import CTCPlan

    T, N, A = x.shape
    plan = CTCPlan(T, N, A, max(1, max(len(l) for l in lists)), step=step, device=x.device)
    plan.set_targets(padded(lists), (T,) * N, tuple(len(l) for l in lists))
    call = lambda: plan(x)  # noqa: E731
    run.record(f"{_step(step).series} plan", run.host_time(call, calls=host_calls(_estimate_ms(call))),
               params=params, note="CTCPlan call: the kernels only (targets set once, workspace preallocated)")


def _stress_case(run, name: str, x: Tensor, lists) -> None:
    """Steps 5 to 10 on one input of the stress set (checked, timed), then torch's calls and steps 6 and 10
    on its utterances that torch's cuDNN path takes, each counted against float64 (:func:`outcomes`)."""
    from studylog.ctc import CHAPTER

    T, N, A = x.shape
    final = CHAPTER.final.number
    lengths = tuple(len(l) for l in lists)
    device = x.device
    batch = prepare_targets(padded(lists), (T,) * N, lengths, num_classes=A, max_time=T, device=device)
    ref = reference_ctc(x, padded(lists).to(device), (T,) * N, lengths)
    params = {"T": T, "N": N, "A": A, "inputs": name.split()[0]}
    for number in (5, 6, 7, 8, 9, 10):
        _time_step(run, number, x, batch, ref, params, series=f"stress {_step(number).series}", host=False,
                   counted=True, reps=STRESS_REPS)
    keep = np.flatnonzero(peers.cudnn_eligible((T,) * N, lengths, T))
    if keep.size == 0:
        return
    xs, sub = x[:, torch.as_tensor(keep, device=device)].contiguous(), [lists[i] for i in keep]
    sub_lengths = tuple(len(l) for l in sub)
    sub_ref = reference_ctc(xs, padded(sub).to(device), (T,) * len(sub), sub_lengths)
    sub_batch = prepare_targets(padded(sub), (T,) * len(sub), sub_lengths, num_classes=A, max_time=T, device=device)
    params = {**params, "N": len(sub), "of": N}
    calls = {"torch-cuDNN": peers.cudnn_direct(xs, sub),
             "torch-cuDNN F.ctc_loss": peers.functional(xs, sub, "cudnn", reduction="none"),
             "torch-native": peers.functional(xs, sub, "native", reduction="none"),
             **{_step(k).series: (lambda k=k: _call(k, xs, sub_batch)) for k in (6, final)}}
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
                xs.log_softmax(2), concatenated(sub), (T,) * len(sub), sub_lengths, BLANK))
        try:
            ms = run.kernel_time(fn, reps=5)
        except Exception as exc:  # the counts are what this row is for
            ms, extra["timing_failed"] = math.nan, f"{type(exc).__name__}: {str(exc)[:200]}"
        run.record(f"cudnn-set {series}", ms, params=params, clock="kernel",
                   role="baseline" if series.startswith("torch") else "kernel", **extra, **counts)
    del xs, sub_ref, sub_batch


def _profile_point(run, x: Tensor, batch: CTCTargets, lists, params: dict) -> None:
    """Per-kernel device times (profiler, no L2 flush) of steps 7 to 10 and torch's calls at one point."""
    calls = {"torch-cuDNN": peers.cudnn_direct(x, lists), "torch-native": peers.functional(x, lists, "native")}
    calls.update({_step(k).series: (lambda k=k: _call(k, x, batch)) for k in (7, 8, 9, 10)})
    for series, fn in calls.items():
        try:
            kernels = kernel_times_us(fn)
            run.record(f"{series} kernels", sum(kernels.values()) / 1e3, params=params, clock="kernel",
                       role="baseline" if series.startswith("torch") else "kernel", kernels_us=kernels,
                       method="torch.profiler: device time per call, summed over kernels and copies (no L2 flush)")
        except Exception as exc:  # the profile is extra information: never lose the run to it
            run.note(f"profiling {series} at {params} failed: {exc!r}")
