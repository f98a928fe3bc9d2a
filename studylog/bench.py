"""Benchmark harness: ``python -m studylog bench <chapter|all>``, into ``assets/bench/<gpu>/<chapter>.json``.

It refuses to run without a GPU and measures the device's ceilings in the same run, so floors never mix runs. The
policy is the book's "How we measure" page: GPU time (:meth:`BenchRun.gpu_time`), host time per call beside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import gc
import importlib.metadata
import json
import time as _time
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from studylog import runtime
from studylog.paths import BENCH_RESULTS as DEFAULT_OUT
from studylog.paths import REPO_ROOT

CPU_REFUSAL = ("python -m studylog bench needs a CUDA GPU, and torch sees none on this machine. Here Triton kernels "
               "run in its CPU interpreter, whose timings say nothing about GPU speed. The committed GPU results are "
               "under assets/bench/; the notebooks plot from them.")


@contextlib.contextmanager
def collector_paused():
    """The cyclic garbage collector off inside the block (after one collection), as ``timeit`` runs: a collection
    over chapter 1's grammars takes tens of milliseconds."""
    was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


class NoGPUError(RuntimeError):
    """A benchmark asked for on a machine without a GPU."""


def gpu_slug(name: str) -> str:
    """Folder name for a GPU: ``'NVIDIA H100 80GB HBM3'`` -> ``'nvidia-h100-80gb-hbm3'``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def write_lab_output(folder: Path, gpu_name: str, name: str, data: Any) -> Path:
    """Write ``data`` as JSON to ``folder/<gpu slug>/<name>.json`` (what ``plotting.load_lab`` reads)."""
    path = Path(folder) / gpu_slug(gpu_name) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def git_commit() -> str:
    """The commit measured: ``$STUDYLOG_COMMIT`` (a copied tree may have no ``.git``), else git's, else unknown."""
    if os.environ.get("STUDYLOG_COMMIT"):
        return os.environ["STUDYLOG_COMMIT"]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

    try:
        return git("rev-parse", "HEAD") + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_info() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    info: dict[str, Any] = {"name": props.name, "sm_count": props.multi_processor_count,
                            "compute_capability": f"{props.major}.{props.minor}", "memory_bytes": props.total_memory,
                            "l2_cache_bytes": getattr(props, "L2_cache_size", None), "cuda_runtime": torch.version.cuda}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        driver, max_sm, max_mem = [s.strip() for s in smi.stdout.splitlines()[0].split(",")]
        info.update(driver=driver, max_sm_clock=max_sm, max_mem_clock=max_mem)
    except Exception:
        info["driver"] = "unknown"
    return info


#: The rivals' distributions whose versions a results file records where installed (the benchmarks time those found).
PEER_DISTRIBUTIONS = ("xgrammar", "outlines-core", "llguidance", "flashinfer-python", "flashinfer", "gemlite",
                      "transformers", "cupy-cuda12x", "cupy-cuda13x")


def versions() -> dict[str, str]:
    import triton

    import studylog

    out = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "studylog": studylog.__version__}
    for name in ("cuda-bindings",) + PEER_DISTRIBUTIONS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out


#: The layout of a results file.
SCHEMA = 2
ROLES = ("kernel", "baseline", "peer")
#: The clocks a row can be timed on, and what each one is.
CLOCKS = {
    "gpu": "GPU time per call: the call replayed in a CUDA graph, large inputs rotated among copies "
           "larger than L2 together, after a 256 MB memset; median of the replays (BenchRun.gpu_time)",
    "host": "host time per call: back-to-back Python calls, no synchronisation, garbage collector paused "
            "(BenchRun.host_time)",
    "host_e2e": "wall time per call of the call followed by torch.cuda.synchronize(): what a loop that waits "
                "for the result sees, end to end (garbage collector paused, as for host)",
    "wall": "wall time of a whole decode loop per output token, waiting for the device where its algorithm "
            "must (the sampled token), garbage collector paused, median of repetitions",
    "do_bench": "triton.testing.do_bench, median, L2 flushed before each repetition; includes the host's "
                "launch whenever it is longer than the flush before it",
    "kernel": "the profiler's (CUPTI) span from the first kernel's start to the last one's end, "
              "L2 flushed before each repetition (BenchRun.kernel_time)",
    "cpu": "wall time of a CPU computation (time.perf_counter), median",
}


@dataclasses.dataclass(frozen=True)
class Timing:
    """Repeated measurements of one thing on one clock, in milliseconds."""

    samples: tuple[float, ...]
    clock: str

    @classmethod
    def of(cls, samples: Iterable[float], clock: str) -> "Timing":
        samples = tuple(float(x) for x in samples)
        if not samples:
            raise ValueError("a Timing needs at least one sample")
        return cls(samples, clock)

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def spread(self) -> list[float]:
        """[min, median, max]."""
        return [min(self.samples), self.median, max(self.samples)]


def failed_checks(data: dict[str, Any], *, peers: bool = False) -> list[dict[str, Any]]:
    """The failed checks of a results file: of our kernels, or with ``peers`` of a peer's (flagged, or named after a
    peer series)."""
    peer_series = {r["series"] for r in data.get("measurements", []) if r.get("role") == "peer"}
    return [c for c in data.get("checks", []) if not c["passed"]
            and (bool(c.get("peer")) or any(c["name"].startswith(f"{s} ") for s in peer_series)) == peers]


class BenchRun:
    """One chapter's benchmark run: measures, records and saves."""

    def __init__(self, chapter: str, *, command: str, quick: bool = False):
        if not torch.cuda.is_available():
            raise NoGPUError(CPU_REFUSAL)
        self.chapter, self.command, self.quick = chapter, command, quick
        self.rows: list[dict[str, Any]] = []
        self.checks: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.started = _dt.datetime.now(_dt.timezone.utc)
        self.device = device_info()
        # the ceilings: device-to-device copy bandwidth (bytes read plus bytes written, 1 GiB) and an empty launch
        src = torch.empty(1 << 28, dtype=torch.float32, device="cuda").uniform_()
        dst = torch.empty_like(src)
        self.copy_bandwidth_gbs = 2 * src.nbytes / (self.time(lambda: dst.copy_(src), rep=200) * 1e-3) / 1e9
        del src, dst
        launch = empty_launch()
        self.empty_launch_ms = self.time(launch)
        self.empty_launch_host = self.host_time(launch)
        #: An empty kernel's GPU time: the least any kernel costs on the GPU clock.
        self.empty_launch_gpu = self.gpu_time(lambda: [launch])

    def time(self, fn: Callable[[], Any], *, warmup: int = 25, rep: int = 100) -> float:
        """Median time of ``fn()`` in ms by ``triton.testing.do_bench`` (``warmup`` and ``rep`` in ms too)."""
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))

    def kernel_time(self, fn: Callable[[], Any], *, reps: int = 40) -> float:
        """Median GPU time (ms) of ``fn()``'s kernels as the profiler records them, first start to last end, L2
        flushed before each repetition."""
        from torch.profiler import ProfilerActivity, profile

        flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")

        def gpu_events(prof):
            return sorted((e.start_ns(), e.start_ns() + e.duration_ns(), e.name())
                          for e in prof.profiler.kineto_results.events()
                          if e.device_type() == torch.autograd.DeviceType.CUDA)

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            flush.zero_()
            torch.cuda.synchronize()
        flush_names = {name for _, _, name in gpu_events(prof)}
        for _ in range(3):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                flush.zero_()
                fn()
            torch.cuda.synchronize()
        spans, current = [], None
        for start, end, name in gpu_events(prof):
            if name in flush_names:
                current = []
                spans.append(current)
            elif current is not None:
                current.append((start, end))
        spans = [(max(e for _, e in s) - min(b for b, _ in s)) / 1e6 for s in spans if s]
        if len(spans) < reps // 2:
            raise RuntimeError(f"the profiler saw kernels in {len(spans)} of {reps} repetitions")
        return float(statistics.median(spans))

    def rotation(self, nbytes: int) -> int:
        """How many copies of an input of ``nbytes`` to rotate among, together four times L2, so each misses L2."""
        l2 = self.device.get("l2_cache_bytes") or 64 * 2**20
        return max(1, -(-4 * l2 // max(int(nbytes), 1)))

    def rotated(self, weights: Any) -> list:
        """``weights`` and copies, :meth:`rotation` in all: a tensor, or a dataclass with its bytes in ``data``."""
        data = weights if isinstance(weights, torch.Tensor) else weights.data
        clone = weights.clone if data is weights else lambda: dataclasses.replace(weights, data=data.clone())
        return [weights] + [clone() for _ in range(self.rotation(data.numel() * data.element_size()) - 1)]

    def graph_time(self, calls: list[Callable[[], Any]], *, min_calls: int = 60, reps: int = 15,
                   samples: bool = False) -> float | list[float]:
        """Median GPU time per call (ms) of ``calls`` (one graph-safe call on copies of its input, :meth:`rotation`)
        replayed in a CUDA graph, ``min_calls`` at least, each replay after a 256 MB memset that hides the launch.
        ``samples``: each replay's time a call."""
        if not calls:
            raise ValueError("graph_time needs at least one call")
        sequence = calls * -(-min_calls // len(calls))
        for call in calls:  # compile, autotune and allocate before the capture
            call()
        torch.cuda.synchronize()
        graph, _ = runtime.cuda_graph(lambda: [call() for call in sequence], warmups=1)
        flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            flush.zero_()
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / len(sequence))
        del graph
        return times if samples else float(statistics.median(times))

    def gpu_time(self, make_calls: Callable[[], list[Callable[[], Any]]], *, repeats: int = 3,
                 min_calls: int = 60, reps: int = 15) -> "Timing":
        """The headline clock: :meth:`graph_time` in ``repeats`` repetitions, each with fresh ``make_calls()``."""
        return Timing.of([self.graph_time(make_calls(), min_calls=min_calls, reps=reps) for _ in range(repeats)],
                         clock="gpu")

    def host_time(self, fn: Callable[[], Any], *, calls: int = 200, repeats: int = 3) -> "Timing":
        """Host time per call (ms): ``calls`` back-to-back calls of ``fn``, no synchronisation, garbage collector
        paused, in ``repeats`` repetitions."""
        fn()
        torch.cuda.synchronize()
        samples = []
        with collector_paused():
            for _ in range(repeats):
                torch.cuda.synchronize()
                start = _time.perf_counter()
                for _ in range(calls):
                    fn()
                samples.append((_time.perf_counter() - start) / calls * 1e3)
                torch.cuda.synchronize()
        return Timing.of(samples, clock="host")

    def floor_ms(self, nbytes: float) -> float:
        """Time to move ``nbytes`` through device memory at the copy bandwidth measured in this run."""
        return nbytes / (self.copy_bandwidth_gbs * 1e9) * 1e3

    def record(self, series: str, ms: "float | Timing", *, params: dict[str, Any], role: str = "kernel",
               floor_ms: float | None = None, clock: str | None = None, host: "Timing | None" = None,
               **extra: Any) -> dict[str, Any]:
        """Record ``ms`` on ``clock`` (``"do_bench"`` unless said), or a :class:`Timing` (median and ``spread_ms``),
        with ``host``, the call's host time, beside it. ``role``: ours, a baseline or a peer (another library)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        row = {"series": series, "role": role, "params": dict(params)}
        if isinstance(ms, Timing):
            if clock is not None and clock != ms.clock:
                raise ValueError(f"a {ms.clock} timing recorded as clock {clock!r}")
            row.update(ms=ms.median, clock=ms.clock, spread_ms=ms.spread)
        else:
            clock = clock or "do_bench"
            if clock not in CLOCKS:
                raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
            row.update(ms=float(ms), clock=clock)
        if host is not None:
            row.update(host_ms=host.median, host_spread_ms=host.spread)
        if floor_ms is not None:
            row["floor_ms"] = float(floor_ms)
        row.update(extra)
        self.rows.append(row)
        return row

    def measure(self, series: str, make_calls: Callable[[], list[Callable[[], Any]]], *, params: dict[str, Any],
                role: str = "kernel", host: Callable[[], Any] | None = None, floor_ms: float | None = None,
                repeats: int = 3, min_calls: int = 60, reps: int = 15, host_calls: int = 200,
                **extra: Any) -> dict[str, Any]:
        """Record a series' GPU time (:meth:`gpu_time`) and, given ``host`` (the user's eager call), its host time."""
        timing = self.gpu_time(make_calls, repeats=repeats, min_calls=min_calls, reps=reps)
        host_timing = self.host_time(host, calls=host_calls) if host is not None else None
        return self.record(series, timing, params=params, role=role, floor_ms=floor_ms, host=host_timing, **extra)

    def check(self, name: str, passed: bool, *, params: dict[str, Any] | None = None, **detail: Any) -> bool:
        """Record a check made on a benchmark input; a failure fails the run unless it is a peer's (a finding)."""
        self.checks.append({"name": name, "passed": bool(passed), "params": params or {}, **detail})
        return bool(passed)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def progress(self, iterable: Iterable, desc: str):
        """A progress bar over a sweep (tqdm, on stderr)."""
        from tqdm.auto import tqdm

        return tqdm(iterable, desc=f"{self.chapter}: {desc}", leave=False, file=sys.stderr)

    def to_json(self) -> dict[str, Any]:
        return {
            "chapter": self.chapter, "device": self.device, "versions": versions(),
            "date": self.started.isoformat(timespec="seconds"), "git_commit": git_commit(), "command": self.command,
            "quick": self.quick, "schema": SCHEMA, "clocks": CLOCKS,
            "ceilings": {"copy_bandwidth_gbs": self.copy_bandwidth_gbs, "empty_launch_ms": self.empty_launch_ms,
                         "empty_launch_host_ms": self.empty_launch_host.median,
                         "empty_launch_host_spread_ms": self.empty_launch_host.spread,
                         "empty_launch_gpu_ms": self.empty_launch_gpu.median},
            "measurements": self.rows, "checks": self.checks, "notes": self.notes,
        }

    def save(self, out_dir: Path = DEFAULT_OUT) -> Path:
        return write_lab_output(out_dir, self.device["name"], self.chapter, self.to_json())


def empty_launch() -> Callable[[], None]:
    """A compiled launch of a Triton kernel that does nothing: the least a call of a Triton kernel costs the host."""
    import triton
    import triton.language as tl

    @triton.jit
    def empty_kernel(x_ptr, n):
        pid = tl.program_id(0)
        if pid < 0:  # never true: the kernel does no work
            tl.store(x_ptr + pid, n)

    x = torch.empty(1, device="cuda")
    empty_kernel[(1,)](x, 0)
    return lambda: empty_kernel[(1,)](x, 0)


def read_only(t: torch.Tensor, sink: torch.Tensor | None = None) -> Callable[[], None]:
    """A launch of ``read_only`` (csrc/read_only.cu) over ``t``'s bytes: the floor under any kernel that must read
    them once. It writes ``sink[0]`` only where a thread's XOR of its 16-byte pieces is 0x9E3779B9."""
    from studylog import cuda

    if not t.is_cuda or not t.is_contiguous() or t.numel() * t.element_size() % 16 or t.data_ptr() % 16:
        raise ValueError("read_only takes a contiguous CUDA tensor of a multiple of 16 bytes, 16-byte aligned")
    kernel = cuda.load("read_only").kernel("read_only", ["ptr", "u64", "ptr"])
    n16 = t.numel() * t.element_size() // 16
    sink = torch.empty(1, dtype=torch.int32, device=t.device) if sink is None else sink
    grid = (2 * runtime.sm_count(),)
    return lambda: kernel(grid, (1024,), t, n16, sink)


# Command line

def run_chapters(chapters: list[str], *, out_dir: Path, command: str, quick: bool = False) -> list[Path]:
    from studylog import chapter as registry

    paths, failures = [], []
    for declared in registry.select(chapters, need="bench"):
        chapter = declared.name
        run = BenchRun(chapter, command=command, quick=quick)
        try:
            declared.bench(run)
        except Exception:  # keep going: one broken chapter should not cost the others' GPU time
            import traceback

            traceback.print_exc()
            failures.append(f"{chapter}: the benchmark raised (traceback above); no results saved")
            continue
        path = run.save(out_dir)
        paths.append(path)
        data = {"measurements": run.rows, "checks": run.checks}
        bad, of_peers = failed_checks(data), failed_checks(data, peers=True)
        print(f"{chapter}: {len(run.rows)} measurements, {len(run.checks)} checks "
              f"({len(bad)} failed{f', and {len(of_peers)} of peers' if of_peers else ''}) -> {path}", flush=True)
        for c in of_peers:
            print(f"  a peer's output failed its check (kept as a finding): {c['name']} {c['params']}", flush=True)
        failures += [f"{chapter}: {c['name']} {c['params']}" for c in bad]
    if failures:
        raise RuntimeError("benchmark failures:\n" + "\n".join(failures))
    return paths
