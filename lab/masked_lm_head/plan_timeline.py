"""Where the plan's whole step goes at batch 1, on one timeline: each activity of the step, as the GPU ran it inside
a CUDA-graph replay.

The chapter times ``MaskedHeadPlan``'s whole step from the packed bitmask (step 13: the host-to-device copy of the
bitmask, then the plan's kernels); timed alone, its parts added up to less than the whole step. This script replays
the whole step in a CUDA graph under ``torch.profiler``, whose
CUPTI records each kernel and copy inside a graph replay with the device's own timestamps, and writes, for every
call of every replay, each activity's start and end relative to the call's first activity (the bitmask's copy),
the gaps between consecutive activities, and the time from one call's copy to the next call's.

Inputs are the chapter's benchmark's (``studylog.masked_lm_head.report.run_sweep``): the same seed, head
(V = 128,256, D = 3,072, bf16), batch-1 hidden state and random set of 1,000 ids (drawn in its order); the bitmask
packed in pinned host memory and copied ``non_blocking``, then ``plan.launch(count)``, as the benchmark's
``step13`` row does on the GPU clock. As there, a graph holds :data:`CALLS` calls rotated over exact copies of the
head, one plan per copy, enough copies that the union's rows over all of them exceed four times L2.

    PYTHONPATH=$PWD python lab/masked_lm_head/plan_timeline.py check     # CPU (interpreter) or GPU
    PYTHONPATH=$PWD python lab/masked_lm_head/plan_timeline.py measure   # GPU -> results/<gpu>/plan_timeline.json

``check``: the whole step (copy, then the plan's kernels) against a float64 reference on a poisoned output at a
small head whose size is a multiple of no block, and the timeline arithmetic (grouping activities into calls,
offsets and gaps) against a hand-built trace; on a GPU it also profiles a small graph and requires every call to
show the four activities. ``measure`` also times the same graph without the profiler (CUDA events around the
replays), so the file says how far tracing moved the step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from studylog import runtime  # noqa: I001  (before triton: it selects GPU or interpreter)

import numpy as np
import torch

from studylog.masked_lm_head import HIDDEN, VOCAB, AllowedTokens, MaskedHeadPlan, check_logits, pack_bitmask
from studylog.masked_lm_head.masks import random_sets
from studylog.masked_lm_head.report import cases

HERE = Path(__file__).resolve().parent
#: The allowed ids of the page's headline at batch 1 (random).
COUNT = 1000
#: Calls a graph holds and replays profiled: the chapter benchmark's calls per graph and replays per repetition.
CALLS, REPLAYS = 60, 15
#: Replays timed without the profiler, after it.
UNTRACED_REPLAYS = 50
#: The most bytes of head copies held at once (the benchmark's budget).
COPY_BUDGET = 48 * 2**30
#: The step's activities in the order one call enqueues them, and how a trace's event is recognised as each.
PARTS = ("copy", "count_zero", "union_kernel", "row_kernel")


def part_of(event: dict) -> str | None:
    """Which of :data:`PARTS` a trace event is (None for one outside the step): the host-to-device copy of the
    bitmask, the count's zeroing (torch's fill kernel, or a memset), the union kernel, the plan's row kernel."""
    cat, name = event.get("cat", ""), event.get("name", "")
    if cat == "gpu_memcpy":
        return "copy"
    if cat == "gpu_memset" or (cat == "kernel" and "Fill" in name):
        return "count_zero"
    if cat == "kernel" and "union_ids" in name:
        return "union_kernel"
    if cat == "kernel" and "count_kernel" in name:
        return "row_kernel"
    return None


def timeline(events: list[dict], calls: int) -> list[list[dict]]:
    """The step's device activities grouped into replays of ``calls`` calls, from a Chrome trace's events (``ts``
    and ``dur`` in µs): for each replay, one record per call with each part's start and end (µs from the call's
    copy), the gap before each part after the first (its start less the end of the part before it), and
    ``period``, the time from this call's copy to the next call's (None for a replay's last call). Raises where
    the activities do not come in whole calls of :data:`PARTS` in order."""
    acts = sorted(((e["ts"], e["ts"] + e["dur"], p) for e in events if (p := part_of(e)) is not None))
    per_replay = calls * len(PARTS)
    if not acts or len(acts) % per_replay:
        raise ValueError(f"{len(acts)} step activities in the trace: not whole replays of {calls} calls of "
                         f"{len(PARTS)} activities")
    replays = []
    for r in range(0, len(acts), per_replay):
        chunk = acts[r:r + per_replay]
        records = []
        for c in range(calls):
            one = chunk[c * len(PARTS):(c + 1) * len(PARTS)]
            if tuple(p for _, _, p in one) != PARTS:
                raise ValueError(f"call {c} of replay {r // per_replay} runs {[p for _, _, p in one]}, not {PARTS}")
            t0 = one[0][0]
            ns = lambda x: round(x, 3)  # noqa: E731  (the trace's timestamps are whole ns)
            rec = {"start_us": {p: ns(s - t0) for s, _, p in one}, "end_us": {p: ns(e - t0) for _, e, p in one},
                   "gap_before_us": {p: ns(one[i][0] - one[i - 1][1]) for i, (_, _, p) in enumerate(one) if i}}
            rec["period_us"] = ns(chunk[(c + 1) * len(PARTS)][0] - t0) if c + 1 < calls else None
            records.append(rec)
        replays.append(records)
    return replays


def summary(replays: list[list[dict]]) -> dict:
    """Medians over every call of every replay (µs): each part's duration, each gap, the call's span (copy start
    to row kernel end) and its period."""
    calls = [c for r in replays for c in r]
    med = statistics.median
    return {"duration_us": {p: med(c["end_us"][p] - c["start_us"][p] for c in calls) for p in PARTS},
            "gap_before_us": {p: med(c["gap_before_us"][p] for c in calls) for p in PARTS[1:]},
            "start_us": {p: med(c["start_us"][p] for c in calls) for p in PARTS},
            "span_us": med(c["end_us"][PARTS[-1]] for c in calls),
            "period_us": med(c["period_us"] for c in calls if c["period_us"] is not None),
            "calls": len(calls)}


# -- inputs and the step -------------------------------------------------------------------------------------------

def bench_inputs(dev: torch.device, vocab: int = VOCAB, hidden: int = HIDDEN, count: int = COUNT):
    """The chapter benchmark's head, batch-1 hidden state and random set of ``count`` ids: the same seeds and the
    same draws in the same order as ``run_sweep`` (batch 1 comes first, its random counts first)."""
    gen = np.random.default_rng(1234)
    torch.manual_seed(1234)
    weight = (torch.randn(vocab, hidden, device=dev) * 0.02).to(torch.bfloat16)
    h = torch.randn(1, hidden, device=dev).to(torch.bfloat16)
    order = [c for b, kind, c in cases(vocab, quick=False, third_kind="real") if b == 1 and kind == "random"]
    sets = None
    for c in order[: order.index(count) + 1] if count in order else [count]:
        sets = random_sets(c, vocab, 1, gen)
    return weight, h, sets


def whole_step(plan: MaskedHeadPlan, host_bitmask: torch.Tensor, count: int) -> torch.Tensor:
    """The benchmark's ``step13`` call on the GPU clock: the bitmask's copy from pinned memory, then the plan's
    kernels."""
    plan.bitmask.copy_(host_bitmask, non_blocking=True)
    return plan.launch(count)


def step_graph(plans: list[MaskedHeadPlan], host_bitmask: torch.Tensor, count: int, calls: int):
    """A CUDA graph of ``calls`` whole steps, rotating over ``plans`` (warmed up outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for p in plans:
            whole_step(p, host_bitmask, count)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            whole_step(plans[i % len(plans)], host_bitmask, count)
    return graph


def profile(graph, replays: int, calls: int) -> list[list[dict]]:
    """Replay ``graph`` ``replays`` times under ``torch.profiler`` (CUDA activities) and read the timeline back."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    graph.replay()  # once before tracing: nothing left to load or upload
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    return timeline([e for e in events if e.get("ph") == "X"], calls)


def untraced_us(graph, replays: int, calls: int) -> float:
    """The graph's time per call without the profiler (CUDA events around each replay, the median replay)."""
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


# -- check ---------------------------------------------------------------------------------------------------------

def check_arithmetic() -> int:
    """:func:`timeline` and :func:`summary` on a hand-built trace of two replays of two calls; returns failures."""
    names = {"copy": ("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)"),
             "count_zero": ("kernel", "void at::native::vectorized_elementwise_kernel<FillFunctor<int>>"),
             "union_kernel": ("kernel", "union_ids_kernel"), "row_kernel": ("kernel", "stream_count_kernel")}
    events, t = [{"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0.0, "dur": 5.0}], 100.0
    starts = []
    for _ in range(4):  # per call: copy 2 µs, gap 3, zero 1, gap 0.5, union 1.5, gap 1, row 4; next call 5 later
        starts.append(t)
        for part, dur, gap in (("copy", 2.0, 3.0), ("count_zero", 1.0, 0.5), ("union_kernel", 1.5, 1.0),
                               ("row_kernel", 4.0, 5.0)):
            cat, name = names[part]
            events.append({"cat": cat, "name": name, "ts": t, "dur": dur})
            t += dur + gap
    got = timeline(events[::-1], calls=2)  # out of order on purpose: the timeline sorts by start
    s = summary(got)
    want = {"gap_before_us": {"count_zero": 3.0, "union_kernel": 0.5, "row_kernel": 1.0},
            "start_us": {"copy": 0.0, "count_zero": 5.0, "union_kernel": 6.5, "row_kernel": 9.0}}
    failures = 0
    for key, value in want.items():
        if s[key] != value:
            print(f"FAILED timeline {key}: {s[key]} != {value}")
            failures += 1
    if s["span_us"] != 13.0 or s["period_us"] != starts[1] - starts[0] or len(got) != 2 or got[0][1]["period_us"]:
        print(f"FAILED timeline span/period/replays: {s}, {len(got)} replays")
        failures += 1
    try:
        timeline(events[:-1], calls=2)
        print("FAILED timeline accepted a trace missing an activity")
        failures += 1
    except ValueError:
        pass
    print(f"timeline arithmetic: {'ok' if not failures else f'{failures} failures'}")
    return failures


def check() -> int:
    """The whole step against float64 on a poisoned output; on a GPU, a small profiled graph; returns failures."""
    failures = check_arithmetic()
    dev = runtime.device()
    vocab, hidden = (2_003, 77) if runtime.mode() != "gpu" else (VOCAB, HIDDEN)
    weight, h, sets = bench_inputs(dev, vocab, hidden, count=100 if vocab < VOCAB else COUNT)
    allowed = AllowedTokens.from_ids(sets, vocab, device=dev)
    host_bitmask = pack_bitmask(allowed.mask.cpu())
    if dev.type == "cuda":
        host_bitmask = host_bitmask.pin_memory()
    plan = MaskedHeadPlan(weight, 1)
    plan.h.copy_(h)
    plan.out.fill_(float("nan"))
    out = whole_step(plan, host_bitmask, allowed.union_count)
    res = check_logits(out, h, weight, allowed, summation="row")
    print(f"whole step on {runtime.mode()} at V={vocab}, D={hidden}, {allowed.union_count} allowed: "
          f"{'ok' if res['passed'] else res}")
    failures += not res["passed"]
    if dev.type == "cuda":
        graph = step_graph([plan], host_bitmask, allowed.union_count, calls=3)
        try:
            s = summary(profile(graph, replays=2, calls=3))
            print(f"profiled graph: {s['calls']} calls, span {s['span_us']:.1f} µs, period {s['period_us']:.1f} µs")
        except ValueError as exc:
            print(f"FAILED profiled graph: {exc}")
            failures += 1
    return failures


# -- measure -------------------------------------------------------------------------------------------------------

def measure() -> Path:
    from studylog.bench import device_info, git_commit, write_lab_output

    dev = runtime.device()
    weight, h, sets = bench_inputs(dev)
    vocab, hidden = weight.shape
    allowed = AllowedTokens.from_ids(sets, vocab, device=dev)
    n = allowed.union_count
    host_bitmask = pack_bitmask(allowed.mask.cpu()).pin_memory()
    plan = MaskedHeadPlan(weight, 1)
    plan.h.copy_(h)
    bucket = plan.bucket(n)
    plan.out.fill_(float("nan"))
    res = check_logits(whole_step(plan, host_bitmask, n), h, weight, allowed, summation="row")
    if not res["passed"]:
        raise SystemExit(f"the whole step fails its float64 check: {res}")
    # as the benchmark: the union's rows over all copies above four times L2, at most COPY_BUDGET of copies
    read = n * hidden * weight.element_size()
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    wanted = max(1, -(-4 * l2 // read))
    copies = min(wanted, max(1, COPY_BUDGET // (weight.numel() * weight.element_size())))
    heads = [weight] + [weight.clone() for _ in range(copies - 1)]
    plans = [plan] + [MaskedHeadPlan(w, 1, h=plan.h) for w in heads[1:]]
    graph = step_graph(plans, host_bitmask, n, CALLS)
    replays = profile(graph, REPLAYS, CALLS)
    plain = untraced_us(graph, UNTRACED_REPLAYS, CALLS)
    s = summary(replays)
    print(f"{n} allowed, bucket {bucket}: per call span {s['span_us']:.2f} µs, period {s['period_us']:.2f} µs "
          f"(untraced {plain:.2f} µs); durations {s['duration_us']}; gaps {s['gap_before_us']}", flush=True)
    data = {"chapter": "masked_lm_head", "experiment": "plan_timeline", "device": device_info(),
            "versions": {"torch": torch.__version__}, "git_commit": git_commit(),
            "command": "python lab/masked_lm_head/plan_timeline.py measure",
            "params": {"batch": 1, "kind": "random", "allowed": COUNT, "union": n, "bucket": f"{bucket[0]} {bucket[1]}",
                       "calls_per_graph": CALLS, "replays": REPLAYS, "copies": copies,
                       "rotation_capped": wanted > copies},
            "check": "the whole step against float64 on a poisoned output: passed",
            "untraced_us_per_call": plain, "summary": summary(replays), "replays": replays,
            "notes": ["per call: start_us/end_us of each part relative to the call's bitmask copy (device "
                      "timestamps from CUPTI via torch.profiler, inside CUDA-graph replays); gap_before_us = a "
                      "part's start less the previous part's end; period_us = this call's copy to the next call's "
                      "(None for a replay's last call)",
                      "untraced_us_per_call: the same graph without the profiler, CUDA events around each replay, "
                      f"median of {UNTRACED_REPLAYS} replays, divided by {CALLS} calls"]}
    path = write_lab_output(HERE / "results", data["device"]["name"], "plan_timeline", data)
    print(f"-> {path}")
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("check", "measure"))
    args = parser.parse_args(argv)
    if args.what == "check":
        return 1 if check() else 0
    if runtime.mode() != "gpu":
        sys.exit("measure needs a CUDA GPU (here Triton runs in its interpreter)")
    measure()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
