"""Chapter 4's benchmark, figures and headline, and the inputs they use (the benchmark's grid, the
grain sweep and the stress set of long utterances). Series names come from ``CHAPTER.steps``."""

from __future__ import annotations

import math
import re
import time
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from studylog.ctc.fused import (BLOCK_GRAINS, DEFAULT_BLOCK_GRAIN, DEFAULT_RECURSION, RECURSION_OPTIONS,
                                preload_fused, recursion_warps, warp_grain)
from studylog.ctc.reference import GRAD_TOLERANCE, LOSS_TOLERANCE, errors, reference_ctc, wrong_utterances
from studylog.ctc.targets import BLANK, MAX_TARGET_LENGTH, CTCTargets, min_frames, prepare_targets
from studylog.ctc.warpctc import GRAIN_SIZES, block_threads, preload_blocked, untrusted_answers

BENCH_T = 150
BENCH_N = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BENCH_A = (28, 5000)
#: Utterances of the grain-size sweep.
SWEEP_N = 64
#: Utterance lengths of the rescaling stress test (targets of T / 3 labels, blank-heavy frames).
STRESS_T = (50, 100, 200, 400)
STRESS_A, STRESS_N = 28, 8
BENCH_DEVICE = "cuda"
#: Batch sizes at which every recursion option of the last step is measured.
VARIANT_N = BENCH_N
#: (A, N) where the benchmark also records per-kernel device times, host time per call and the
#: time of a CUDA-graph replay (no Python in the loop) for steps 7 to 9.
PROFILE_CASES = ((28, 1), (28, 2), (28, 256), (5000, 2), (5000, 256))
#: Targets (and the tolerance of the checks) for the log-space steps.
#: The step whose recursion options the benchmark compares.
OPTIONS_STEP = 9
#: The long utterances of the stress set (A = 28): random activations, targets of up to
#: MAX_TARGET_LENGTH labels, T frames. Short targets among them leave float32 probability space
#: finite and wrong.
LONG_T = (1100,)
LONG_N = 6


def random_targets(T: int, N: int, A: int, generator: torch.Generator, max_length: int = 255) -> list[np.ndarray]:
    """Target label sequences as in the seed's benchmark: length uniform in [1, min(T, max_length)],
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


def padded(lists: Sequence[np.ndarray], dtype=torch.int64) -> Tensor:
    """Label lists as an (N, L_max) tensor padded with the blank."""
    width = max([len(l) for l in lists] + [1])
    out = torch.zeros((len(lists), width), dtype=dtype)
    for i, labels in enumerate(lists):
        out[i, :len(labels)] = torch.from_numpy(np.asarray(labels, np.int64)).to(dtype)
    return out


def concatenated(lists: Sequence[np.ndarray], dtype=torch.int32) -> Tensor:
    flat = np.concatenate([np.asarray(labels, np.int64) for labels in lists] + [np.zeros(0, np.int64)])
    return torch.from_numpy(flat).to(dtype)


def dram_bytes(T: int, N: int, A: int) -> int:
    """The unavoidable traffic: read the activations once and write the gradient once (float32)."""
    return 2 * 4 * T * N * A


def _torch_timed(x: Tensor, targets: Tensor, lengths_in: tuple, lengths_out: tuple):
    """log_softmax + ctc_loss + backward to the activations: what a training step pays in torch."""
    def run():
        leaf = x.detach().requires_grad_(True)
        loss = torch.nn.functional.ctc_loss(leaf.log_softmax(2), targets, lengths_in, lengths_out, blank=BLANK,
                                            reduction="sum")
        return torch.autograd.grad(loss, leaf)[0]
    return run


def _torch_kernel_names(fn) -> list[str]:
    """Names of the CUDA kernels one call of ``fn`` launches (to tell torch's two paths apart)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages()})


def _short_kernel_name(name: str) -> str:
    """``void ctc_branchless_recursion<10, 4, true, true>(float const*, ...)`` -> ``ctc_branchless_recursion<10, 4, true, true>``."""
    name = name.removeprefix("void ")
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            return name[:i]
    return name


def kernel_times_us(fn, calls: int = 10) -> dict[str, float]:
    """Mean device time per call (µs) of every kernel or copy ``fn`` runs, from torch.profiler (CUPTI).
    No L2 flush between calls, unlike the benchmark's timings."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    from torch.autograd import DeviceType

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


def host_us(fn, calls: int = 30) -> float:
    """Python/driver time (µs) to *queue* one call of ``fn``, measured while the GPU is held busy, so
    that nothing waits for the GPU: the cost a call has even when its kernels take no time."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(100_000_000)  # tens of ms of spinning: the queue never drains while we time
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


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


def _step(number: int):
    """Step ``number``'s public function, from the chapter's table of steps."""
    from studylog.ctc import CHAPTER

    return CHAPTER.step(number).function


def _series(number: int) -> str:
    from studylog.ctc import CHAPTER

    return CHAPTER.step(number).series


def _label(series: str) -> str:
    from studylog.ctc import CHAPTER

    return CHAPTER.label(series)


def _call(number: int, x: Tensor, batch: CTCTargets, **how):
    """One call of a step, graph-safe and without a host synchronisation (step 6 does not warn)."""
    if number == 6:
        how = {"warn": False, **how}
    return _step(number)(x, batch, **how)


def _flag_check(run, step, loss, grad, estimate, ref_loss, ref_grad, batch, params, err) -> None:
    """Step 6 may be wrong, never silently: every utterance it gets wrong must be flagged by its estimate."""
    wrong = wrong_utterances(loss, grad, ref_loss, ref_grad)
    flagged = untrusted_answers(loss, estimate, batch)
    err["flagged"], err["wrong"] = int(flagged.sum()), int(wrong.sum())
    run.check(f"{step.series} flags every answer it gets wrong", not bool((wrong & ~flagged).any()),
              params=params, **err)


def bench(run) -> None:
    """Forward + backward from activations for T = 150, N = 1..256, A in {28, 5000}: torch's cuDNN
    and native paths and the ten steps (with step 9's other recursion options and step 10's other
    grain at every N, and per-kernel, host and CUDA-graph times at a few points); then the grain-size
    sweep and the rescaling stress test."""
    started = time.perf_counter()
    device = torch.device(BENCH_DEVICE)
    ns = (BENCH_N[0], BENCH_N[len(BENCH_N) // 2], BENCH_N[-1]) if run.quick else BENCH_N
    generator = torch.Generator().manual_seed(2024)
    T = BENCH_T
    torch.backends.cudnn.enabled = True
    paths_checked: set[int] = set()
    profile_points: list = []
    # the positions per lane these inputs need, compiled in three NVRTC calls instead of one per new shape
    preload_fused(7, (4, 6, 8, 10))
    preload_fused(OPTIONS_STEP, (4, 6, 8, 10), recursions=list(RECURSION_OPTIONS))
    preload_fused(10, BLOCK_GRAINS)
    from studylog.ctc import CHAPTER
    for A in BENCH_A:
        for N in run.progress(ns, f"A={A}"):
            lists = random_targets(T, N, A, generator)
            x = torch.randn((T, N, A), generator=generator).to(device)
            lengths_in = (T,) * N
            lengths_out = tuple(len(l) for l in lists)
            params = {"T": T, "N": N, "A": A}
            floor = run.floor_ms(dram_bytes(T, N, A))
            ref_loss, ref_grad = reference_ctc(x, padded(lists).to(device), lengths_in, lengths_out)
            cudnn_targets = concatenated(lists, torch.int32)  # int32, CPU, concatenated: cuDNN's conditions
            native_targets = padded(lists, torch.int64).to(device)
            baselines = {"torch-cuDNN": _torch_timed(x, cudnn_targets, lengths_in, lengths_out),
                         "torch-native": _torch_timed(x, native_targets, lengths_in, lengths_out)}
            if A not in paths_checked:  # which kernels does each torch path launch?
                paths_checked.add(A)
                names = {k: _torch_kernel_names(fn) for k, fn in baselines.items()}
                marker = "ctc_loss_log_alpha"  # torch's native forward kernel
                run.check("torch-native runs torch's native CTC kernels",
                          any(marker in n for n in names["torch-native"]), params=params,
                          kernels=names["torch-native"])
                run.check("torch-cuDNN runs cuDNN's CTC (no native CTC kernel)",
                          not any(marker in n for n in names["torch-cuDNN"]), params=params,
                          kernels=names["torch-cuDNN"])
            best = math.inf
            for series, fn in baselines.items():
                grad = fn()
                loss = torch.nn.functional.ctc_loss(x.log_softmax(2), cudnn_targets if "cuDNN" in series else
                                                    native_targets, lengths_in, lengths_out, reduction="none")
                err = errors(loss, grad, ref_loss, ref_grad)
                err["infinite_losses"] = int((~torch.isfinite(loss)).sum())
                ms = run.time(fn)
                best = min(best, ms)
                run.record(series, ms, params=params, role="baseline", floor_ms=floor, **err)
            run.record("torch-best", best, params=params, role="baseline", floor_ms=floor,
                       note="the faster of torch-cuDNN and torch-native in this run")
            batch = prepare_targets(padded(lists), lengths_in, lengths_out, num_classes=A, max_time=T, device=device)
            shape = {"max_positions": batch.max_positions, "positions_per_lane": warp_grain(batch.max_positions)}
            block_shape = {"max_positions": batch.max_positions, "positions_per_lane": DEFAULT_BLOCK_GRAIN,
                           "warps": recursion_warps(batch.max_positions, DEFAULT_BLOCK_GRAIN)}
            for s in CHAPTER.steps:
                step = s.number
                estimate = torch.empty((N,), device=device)
                loss, grad = _call(step, x, batch, **({"out_estimate": estimate} if step == 6 else {}))
                err = errors(loss, grad, ref_loss, ref_grad)
                err["infinite_losses"] = int((~torch.isfinite(loss)).sum())
                if step == 6:  # probability space is measured, not held to the log-space targets
                    _flag_check(run, s, loss, grad, estimate, ref_loss, ref_grad, batch, params, err)
                else:
                    run.check(f"{s.series} matches the float64 reference", err["mismatched"] == 0 and
                              err["loss_rel"] <= LOSS_TOLERANCE and err["grad_rel"] <= GRAD_TOLERANCE,
                              params=params, **err)
                del loss, grad
                ms = run.time(lambda: _call(step, x, batch))
                run.record(s.series, ms, params=params, floor_ms=floor, title=s.title,
                           **(block_shape if step == 10 else shape), **err)
            if N in VARIANT_N:  # the other recursion options of step 9, and step 10's other grain
                variants = [(f"{_series(OPTIONS_STEP)} recursion {o}", (OPTIONS_STEP, {"recursion": o}),
                             {"options": dict(zip(("prefetch", "ftz", "redux"), RECURSION_OPTIONS[o])), **shape})
                            for o in RECURSION_OPTIONS if o != DEFAULT_RECURSION]
                variants += [(f"{_series(10)} grain {g}", (10, {"grain": g}),
                              {**block_shape, "positions_per_lane": g,
                               "warps": recursion_warps(batch.max_positions, g)})
                             for g in BLOCK_GRAINS if g != DEFAULT_BLOCK_GRAIN]
                for series, (number, how), extra in variants:
                    loss, grad = _call(number, x, batch, **how)
                    err = errors(loss, grad, ref_loss, ref_grad)
                    run.check(f"{series} matches the float64 reference", err["mismatched"] == 0 and
                              err["loss_rel"] <= LOSS_TOLERANCE and err["grad_rel"] <= GRAD_TOLERANCE,
                              params=params, **err)
                    del loss, grad
                    ms = run.time(lambda: _call(number, x, batch, **how))
                    run.record(series, ms, params=params, floor_ms=floor, **extra, **err)
            if (A, N) in PROFILE_CASES:  # profiled at the very end, on these same inputs
                profile_points.append((x, batch, baselines, params))
            del x, ref_grad, batch
            torch.cuda.empty_cache()

    # grain sizes: odd and even VT, strided (warp-ctc) and blocked positions
    sweep_n = SWEEP_N
    for A in BENCH_A:
        lists = random_targets(T, sweep_n, A, generator)
        x = torch.randn((T, sweep_n, A), generator=generator).to(device)
        lengths_out = tuple(len(l) for l in lists)
        batch = prepare_targets(padded(lists), (T,) * sweep_n, lengths_out, num_classes=A, max_time=T, device=device)
        ref_loss, ref_grad = reference_ctc(x, padded(lists).to(device), (T,) * sweep_n, lengths_out)
        grains = [g for g in (GRAIN_SIZES[:4] if run.quick else GRAIN_SIZES)
                  if block_threads(batch.max_positions, g) <= 1024]
        for step, layout in run.progress([(4, False), (5, False), (5, True)], f"grain sweep A={A}"):
            preload_blocked(step, grains, (layout,))
            for vt in grains:
                params = {"T": T, "N": sweep_n, "A": A, "grain": vt}
                loss, grad = _call(step, x, batch, grain=vt, blocked=layout)
                err = errors(loss, grad, ref_loss, ref_grad)
                run.check(f"{_series(step)} grain {vt} {'blocked' if layout else 'strided'} matches the reference",
                          err["mismatched"] == 0 and err["loss_rel"] <= LOSS_TOLERANCE and
                          err["grad_rel"] <= GRAD_TOLERANCE, params=params, **err)
                del loss, grad
                ms = run.time(lambda: _call(step, x, batch, grain=vt, blocked=layout))
                run.record(f"{_series(step)} {'blocked' if layout else 'strided'}", ms, params=params,
                           threads=block_threads(batch.max_positions, vt), **err)
        del x, ref_grad, batch
        torch.cuda.empty_cache()

    # where per-frame rescaling breaks: accuracy of step 6 (and the log-space steps) on the stress set
    for name, x, lists in run.progress(stress_set(generator, device, quick=run.quick), "rescaling stress"):
        T_long, N, A = x.shape
        lengths_out = tuple(len(l) for l in lists)
        batch = prepare_targets(padded(lists), (T_long,) * N, lengths_out, num_classes=A, max_time=T_long,
                                device=device)
        ref_loss, ref_grad = reference_ctc(x, padded(lists).to(device), (T_long,) * N, lengths_out)
        params = {"T": T_long, "N": N, "A": A, "inputs": name.split()[0]}
        for step in (5, 6, 7, 8, 9, 10):
            estimate = torch.empty((N,), device=device)
            loss, grad = _call(step, x, batch, **({"out_estimate": estimate} if step == 6 else {}))
            err = errors(loss, grad, ref_loss, ref_grad)
            if step == 6:
                _flag_check(run, CHAPTER.step(6), loss, grad, estimate, ref_loss, ref_grad, batch, params, err)
            else:
                run.check(f"{_series(step)} matches the reference on long utterances",
                          err["mismatched"] == 0 and err["loss_rel"] <= LOSS_TOLERANCE and
                          err["grad_rel"] <= GRAD_TOLERANCE, params=params, **err)
            ms = run.time(lambda: _call(step, x, batch), rep=50)
            run.record(f"stress {_series(step)}", ms, params=params,
                       infinite_losses=int((~torch.isfinite(loss)).sum()), **err)
        del x, ref_grad, batch
        torch.cuda.empty_cache()
    run.note("Timed calls take prepared targets (CTCTargets on the GPU); torch-native gets int64 GPU targets and "
             "both torch paths get lengths as tuples, so no call copies lengths from the device.")
    run.note(f"Recursion options of steps 8 and 9 (prefetch, ftz, redux): {RECURSION_OPTIONS}; "
             f"steps 8 and 9 use {DEFAULT_RECURSION!r}. Step 10 uses {DEFAULT_BLOCK_GRAIN} positions per thread.")
    run.note("Step 6 rows carry 'flagged': utterances whose answer its underflow estimate says cannot be "
             "trusted; 'silently_wrong' counts wrong answers with a finite loss and no NaN (flagged or not).")
    # last, so that nothing it might break (a failed graph capture) can cost the measurements above
    for x, batch, baselines, params in run.progress(profile_points, "kernel times, host time, CUDA graphs"):
        _profile_point(run, x, batch, baselines, params)
    run.note(f"The ctc benchmark took {time.perf_counter() - started:.0f} s.")


def _profile_point(run, x: Tensor, batch: CTCTargets, baselines: dict, params: dict) -> None:
    """Per-kernel device times, host time per call and CUDA-graph replay time at one point."""
    calls = {"torch-cuDNN": baselines["torch-cuDNN"], "torch-native": baselines["torch-native"]}
    calls.update({_series(step): (lambda step=step: _call(step, x, batch)) for step in (7, 8, 9, 10)})
    for series, fn in calls.items():
        try:
            kernels = kernel_times_us(fn)
            run.record(f"{series} kernels", sum(kernels.values()) / 1e3, params=params,
                       role="baseline" if series.startswith("torch") else "kernel", kernels_us=kernels,
                       method="torch.profiler: device time per call, summed over kernels and copies (no L2 flush)")
        except Exception as exc:  # the profile is extra information: never lose the run to it
            run.note(f"profiling {series} at {params} failed: {exc!r}")
        try:
            queued = host_us(fn)
            # a call that waits for the GPU inside waits for the spinning kernel: far above any queuing cost
            run.record(f"{series} host", queued / 1e3, params=params, role="baseline" if series.startswith("torch")
                       else "kernel", synchronises=queued > 1000.0,
                       method="time.perf_counter: Python and driver time to queue one call, GPU held busy")
        except Exception as exc:
            run.note(f"host time of {series} at {params} failed: {exc!r}")
        if series.startswith("torch"):
            continue
        try:
            run.record(f"{series} graph", run.graph_time([fn]), params=params,
                       method="BenchRun.graph_time: the call replayed in a CUDA graph (no Python between the "
                              "kernels), median GPU time per call")
        except Exception as exc:
            run.note(f"CUDA graph of {series} at {params} failed: {exc!r}")


# --------------------------------------------------------------------------------------
# Figures (from the committed benchmark JSON)
# --------------------------------------------------------------------------------------

def _step_series() -> list[str]:
    from studylog.ctc import CHAPTER

    return [s.series for s in CHAPTER.steps]


def _relabel(ax) -> None:
    """Legend labels by the chapter's names (``step07_fused_softmax``), not the series' (``step07``)."""
    from studylog.ctc import CHAPTER

    for line in ax.get_lines():
        label = line.get_label()
        if not label.startswith("_"):
            line.set_label(CHAPTER.label(label))
    if ax.get_legend() is not None:
        ax.legend(fontsize=8)


def figures(results) -> dict[str, "matplotlib.figure.Figure"]:  # noqa: F821
    import matplotlib.pyplot as plt

    from studylog import plotting

    figs = {}
    for A in BENCH_A:
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        plotting.plot_times(results, "N", ["torch-cuDNN", "torch-native"] + _step_series(), where={"A": A}, ax=ax,
                            title=f"CTC loss + gradient, T = {BENCH_T}, A = {A} ({results.gpu})")
        _relabel(ax)
        figs[f"times_A{A}"] = fig
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for ax, A in zip(axes, BENCH_A):
        plotting.plot_speedup(results, "N", "torch-best", _step_series(), where={"A": A}, ax=ax,
                              title=f"speedup over the faster torch path, A = {A} (dashed: the target)")
        _relabel(ax)
        ax.axhline(2.0 if A == 5000 else 1.0, color="tab:red", lw=1, ls="--")
    axes[0].get_legend().remove()  # one legend, beside the plots, where it hides no line
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    figs["speedup"] = fig
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, A in zip(axes, BENCH_A):
        plotting.plot_times(results, "grain", [f"{_series(4)} strided", f"{_series(5)} strided", f"{_series(5)} blocked"],
                            where={"A": A}, ax=ax, logx=False, logy=False, floor=False,
                            title=f"grain size (positions per thread), N = 64, A = {A}")
    fig.tight_layout()
    figs["grain"] = fig
    rows = [r for r in results.rows if r["series"].startswith("stress ") and r["params"].get("inputs", "blank-heavy")
            == "blank-heavy"]
    if rows:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for series in sorted({r["series"] for r in rows}):
            pts = sorted((r["params"]["T"], max(r["loss_rel"], 1e-12)) for r in rows if r["series"] == series)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=_label(series.removeprefix("stress ")))
            for r in rows:
                if r["series"] == series and r["infinite_losses"]:
                    ax.annotate(f"{r['infinite_losses']} inf", (r["params"]["T"], max(r["loss_rel"], 1e-12)),
                                fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(LOSS_TOLERANCE, color="k", lw=1, ls=":", label="tolerance of the log-space steps")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("T (frames); targets of T / 3 labels, blank-heavy frames")
        ax.set_ylabel("largest relative loss error")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"log space vs probability space on long utterances ({results.gpu})", fontsize=10)
        figs["rescaling"] = fig
    if any(results.select(f"{_series(step)} kernels") for step in (7, 8, 9, 10)):
        figs["kernels"] = _kernel_breakdown_figure(results)
    bars = recursion_series()
    if any(results.select(series) for series, label in bars if "default" not in label):
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
        for ax, A in zip(axes, BENCH_A):
            ns = sorted({r["params"]["N"] for series, _ in bars for r in results.select(series, A=A)})
            width = 0.84 / len(bars)
            for i, (series, label) in enumerate(bars):
                ys = [(results.select(series, A=A, N=n) or [{"ms": float("nan")}])[0]["ms"] * 1e3 for n in ns]
                ax.bar([j + (i - (len(bars) - 1) / 2) * width for j in range(len(ns))], ys, width, label=label)
            ax.set_xticks(range(len(ns)), [str(n) for n in ns])
            ax.set_xlabel("N")
            ax.set_yscale("log")
            ax.set_ylabel("time (µs, median)")
            ax.set_title(f"the recursion's options, A = {A}", fontsize=10)
            ax.legend(fontsize=7)
            ax.grid(True, axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        figs["recursion_options"] = fig
    return figs


def recursion_series() -> list[tuple[str, str]]:
    """(series, label) of every recursion measured between step 9's two passes: the options of the
    branch-free warp (step 9 itself uses the default) and step 10's block of warps."""
    out = []
    for option in RECURSION_OPTIONS:
        series = _series(OPTIONS_STEP) + ("" if option == DEFAULT_RECURSION else f" recursion {option}")
        out.append((series, f"{_label(_series(OPTIONS_STEP))}, {option}" +
                    (" (default)" if option == DEFAULT_RECURSION else "")))
    for grain in BLOCK_GRAINS:
        series = _series(10) + ("" if grain == DEFAULT_BLOCK_GRAIN else f" grain {grain}")
        out.append((series, f"{_label(_series(10))}, {grain} per thread" +
                    (" (default)" if grain == DEFAULT_BLOCK_GRAIN else "")))
    return out


def _kernel_role(name: str) -> str:
    if "recursion" in name:
        return "recursion"
    if name.startswith("ctc_"):
        return "first pass" if ("stats" in name) else "last pass"
    return "other"


def _kernel_breakdown_figure(results):
    """Stacked per-kernel device times of steps 7 to 10 at the profiled points, with the benchmark's
    median (do_bench, L2 flushed) and the CUDA-graph replay as markers."""
    import matplotlib.pyplot as plt

    cases = sorted({(r["params"]["A"], r["params"]["N"]) for step in (7, 8, 9, 10)
                    for r in results.select(f"{_series(step)} kernels")})
    steps = [7, 8, 9, 10]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    colors = {"first pass": "tab:blue", "recursion": "tab:orange", "last pass": "tab:green", "other": "tab:gray"}
    width = 0.8 / len(steps)
    used = set()
    for j, (A, N) in enumerate(cases):
        for i, step in enumerate(steps):
            rows = results.select(f"{_series(step)} kernels", A=A, N=N)
            if not rows:
                continue
            xpos = j + (i - (len(steps) - 1) / 2) * width
            bottom = 0.0
            for name, us in sorted(rows[0]["kernels_us"].items(), key=lambda kv: ("first", "recursion", "last",
                                   "other").index(_kernel_role(kv[0]).split()[0])):
                role = _kernel_role(name)
                ax.bar(xpos, us, width * 0.9, bottom=bottom, color=colors[role],
                       label=role if role not in used else None)
                used.add(role)
                bottom += us
            timed = results.select(_series(step), A=A, N=N)
            top = max([bottom] + [r["ms"] * 1e3 for r in timed + results.select(f"{_series(step)} graph", A=A, N=N)])
            ax.text(xpos, top * 1.12, str(step), ha="center", va="bottom", fontsize=7)
            if timed:
                ax.plot(xpos, timed[0]["ms"] * 1e3, "k_", ms=12, mew=2,
                        label="benchmark median" if "median" not in used else None)
                used.add("median")
            graph = results.select(f"{_series(step)} graph", A=A, N=N)
            if graph:
                ax.plot(xpos, graph[0]["ms"] * 1e3, "rv", ms=5, label="CUDA-graph replay" if "graph" not in used else None)
                used.add("graph")
    ax.set_xticks(range(len(cases)), [f"A = {A}, N = {N}" for A, N in cases])
    ax.set_yscale("log")
    ax.set_ylabel("µs per call")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"device time per kernel of steps 7 to 10 (torch.profiler) against the timed call ({results.gpu})",
                 fontsize=10)
    return fig


def headline(results) -> list[dict]:
    """The book's headline rows: the last step measured against the faster torch path, at the smallest
    speedup over N for each alphabet, and at the largest batch of the large alphabet."""
    from studylog.ctc import CHAPTER

    measured = [s for s in reversed(CHAPTER.steps) if results.select(s.series)]
    if not measured:
        return []
    step = measured[0]
    rows = []
    for A in BENCH_A:
        ratios = {r["params"]["N"]: r["ms"] / results.ms(step.series, **r["params"])
                  for r in results.select("torch-best", A=A, T=BENCH_T) if results.select(step.series, **r["params"])}
        if not ratios:
            continue
        worst = min(ratios, key=ratios.get)
        rows.append({"kernel": f"{step.name} (CUDA C++)", "baseline": "faster of torch cuDNN / native",
                     "case": f"T = {BENCH_T}, A = {A}, N = {worst} (smallest speedup over N = "
                             f"{min(ratios)}..{max(ratios)})", "speedup": ratios[worst]})
        if A == max(BENCH_A):
            n = max(ratios)
            rows.append({"kernel": f"{step.name} (CUDA C++)", "baseline": "faster of torch cuDNN / native",
                         "case": f"T = {BENCH_T}, A = {A}, N = {n}", "speedup": ratios[n]})
    return rows[:3]
