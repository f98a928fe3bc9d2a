"""What chapter 5's two lessons compute from data: the Amdahl view of a BitNet decode step, the bounds of the
problem, each step's time against its floor, the results against the baselines and peers, what was tried and
did not help (read from ``lab/ternary/results``), the SASS of the CUDA C++ steps, and the two cards and host
clocks that the book's "How we measure" page describes.

Every time is read from the committed benchmark file on the **GPU clock**
(:func:`studylog.ternary.results.on_gpu_clock`); where a file has no GPU-clock time for a series, the functions
return ``None`` and the tables say "pending".
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Optional

from book.common import PENDING, and_list, fmt, is_tie, lab_or_none, latency_floor_ms
from book.ternary.results import failed_peer_checks, series_label, step_label
from studylog import plotting
from studylog.ternary.formats import packed_cols
from studylog.ternary.results import (CUBLAS, FLOAT_X_SERIES, GEMLITE, INT_MM, PLAN, W2A8_PLACE_SERIES, W2A8_SERIES,
                                      fastest, on_gpu_clock)
from studylog.ternary.steps import SERIES, STEPS

H100 = "nvidia-h100-80gb-hbm3"
H200 = "nvidia-h200"
#: The two Llama shapes the targets are set on (N x K): an MLP down projection of an 8B and of a 70B model.
MAIN, BIG = "4096x14336", "8192x28672"
#: Under a table whose "–" cells are series the benchmark does not run at that size (only where a cell is "–").
NOT_MEASURED = "\n\n– : not measured at this size."


def _with_legend(table: str) -> str:
    """A table, with the legend of its "–" cells under it only when one of its cells is "–"."""
    body = table.splitlines()[2:]
    return table + (NOT_MEASURED if any("| – |" in line or line.rstrip().endswith("| –") for line in body) else "")

# ----------------------------------------------------------------------------------------------
# Reading the committed file
# ----------------------------------------------------------------------------------------------


def load():
    """The chapter's committed results on its card (:data:`book.ternary.figures.CARD`, the H200: both lessons read
    one card), or the newest of any card where that one has none; None without results."""
    from book.ternary.figures import CARD

    try:
        return plotting.load_results("ternary", gpu=CARD)
    except FileNotFoundError:
        pass
    try:
        return plotting.load_results("ternary")
    except FileNotFoundError:
        return None


def card(results) -> str:
    """The card of a results file in a few words ("H200"), for tables' captions."""
    return "no card" if results is None else results.gpu.replace("NVIDIA ", "")


def caption(results) -> str:
    if results is None:
        return "No GPU results are committed for this chapter yet: every measured number below reads pending."
    return results.caption()


def gpu_row(results, series: str, shape: str = MAIN, m: int = 1) -> Optional[dict]:
    """The row of ``series`` on the GPU clock, or None."""
    if results is None:
        return None
    rows = on_gpu_clock(results).select(series, shape=shape, m=m)
    return rows[0] if rows else None


def us(results, series: str, shape: str = MAIN, m: int = 1) -> Optional[float]:
    """GPU-clock time of ``series`` (µs), or None."""
    row = gpu_row(results, series, shape, m)
    return None if row is None else row["ms"] * 1e3


def floor_us(results, shape: str = MAIN, m: int = 1, fmt: str = "2bit") -> Optional[float]:
    """The bandwidth floor of a format at one case (µs), as the bench wrote it beside a series of that format."""
    if results is None:
        return None
    series = {"2bit": [SERIES[n] for n in (5, 6, 14, 17, 21, 23, 25, 3)], "base3": [SERIES[7], SERIES[8]],
              "int8": [SERIES[2]], "bf16": [CUBLAS, SERIES[1]]}[fmt]
    for s in series:
        rows = [r for r in results.select(s, shape=shape, m=m) if "floor_ms" in r]
        if rows:
            return rows[0]["floor_ms"] * 1e3
    return None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None or b == 0 else a / b


def faster(ours: Optional[float], theirs: Optional[float], we: str = "ours", they: str = "it") -> str:
    """Which of two times is faster and by how much, in words that hold either way: "ours is 1.28× faster" where
    ``ours`` (µs) is the shorter time, "it is 1.03× faster than ours" where ``theirs`` is; "pending" where one is
    missing."""
    if ours is None or theirs is None or ours <= 0 or theirs <= 0:
        return PENDING
    if ours <= theirs:
        return f"{we} is {theirs / ours:.2f}× faster"
    return f"{they} is {ours / theirs:.2f}× faster than {we}"


def device(results) -> dict:
    return {} if results is None else results.data.get("device", {})


# ----------------------------------------------------------------------------------------------
# Why it matters: a BitNet b1.58 2B4T decode step
# ----------------------------------------------------------------------------------------------

#: BitNet b1.58 2B4T's shape (its config.json on Hugging Face: microsoft/bitnet-b1.58-2B-4T).
BITNET_2B4T = {"hidden": 2560, "intermediate": 6912, "layers": 30, "heads": 20, "kv_heads": 5, "vocab": 128256,
               "context": 4096}
#: Its ternary linear layers as (name, N, K, how many a layer), and the benchmark shape each is timed at where
#: the benchmark lacks its own shape and :func:`layer_run` has no run (k and v, 640 x 2560, are not in the
#: benchmark: then q's time).
BITNET_LAYERS = (("q, o", 2560, 2560, 2, "2560x2560"), ("k, v", 640, 2560, 2, "2560x2560"),
                 ("gate and up (fused)", 13824, 2560, 1, "13824x2560"), ("down", 2560, 6912, 1, "2560x6912"))


#: lab/ternary's run of every layer at its own shape (k and v included): only the shapes the benchmark lacks are
#: read from it, so that a page quotes one time for a kernel at a shape.
LAYER_RUN = "amdahl_shapes"
def lab_file(name: str, gpu: str = H200) -> str:
    """The path, from the repository's root, of lab/ternary's run ``name`` on ``gpu``: the file a page's closing
    list ("Where the numbers come from") names, so that a reader can trace its numbers."""
    return f"lab/ternary/results/{gpu}/{name if Path(name).suffix else name + '.json'}"


#: What each lab run times, in the words a table's note gives it (the files are listed once, at the end of a page).
RUN_WORDS = {LAYER_RUN: "every kernel the table compares"}


def run_source(name: str, gpu: str = H200) -> str:
    """The sentence under a table read from lab/ternary's run ``name`` on ``gpu``, in plain words (no path: the page
    lists its files once, at its end): a further run of the benchmark's harness on the same card, its date, and what
    it times (:data:`RUN_WORDS`, else one change at a time), every kernel it compares timed in it (so a table's
    ratios are from one run). "" where it is not committed."""
    data = lab_or_none("ternary", name, gpu)
    if data is None:
        return ""
    card_name = gpu.split("-")[1].upper() if "-" in gpu else gpu
    what = RUN_WORDS.get(name, "one change at a time and every kernel it compares")
    return f"Timed outside the benchmark on the same {card_name}, with {what}."


def bench_file(results) -> str:
    """The path, from the repository's root, of the benchmark file ``results`` was read from."""
    from studylog import paths

    path = Path(results.path).resolve()
    try:
        return str(path.relative_to(paths.REPO_ROOT.resolve()))
    except ValueError:
        return str(path)


def further_run(results, name: str) -> str:
    """:func:`run_source` for the card of ``results``; "" where the results or the run are missing."""
    if results is None or getattr(results, "path", None) is None:
        return ""
    return run_source(name, Path(results.path).parent.name)


def provenance(results, part: int, bitnet_run=None) -> str:
    """The page's one sentence, beside its caption, on a run of the benchmark other than the caption's: for part 2,
    BitNet's comparison where it is a second run (``bitnet_run``, the raw file of the benchmark's quick mode,
    dated; the page lists its file at its end). "" otherwise: the further lab runs are said under the tables they
    fill (:func:`further_run`)."""
    if results is None or bitnet_run is None or not bitnet_run.get("quick") or part != 2:
        return ""
    return (f"BitNet's comparison was timed outside the benchmark on the same {card(results)}, ours beside BitNet's "
            "kernel at BitNet's shapes.")


def layer_run(results):
    """The lab run that times each of :data:`BITNET_LAYERS` at its own shape on the card of ``results``, or None
    where it is not committed for that card (then the benchmark's shapes stand in, k and v at q's)."""
    if results is None or getattr(results, "path", None) is None:
        return None
    data = lab_or_none("ternary", LAYER_RUN, Path(results.path).parent.name)
    return None if data is None else plotting.Results(None, data)


def layer_source(results, layers, n: int, k: int, shape: str):
    """(the results to read a layer from, the shape to read, whether it is the separate layer run): the benchmark
    at the layer's own shape where it has it; else :func:`layer_run` (``layers``) at that shape; else the benchmark
    at the stand-in ``shape``."""
    own = f"{n}x{k}"
    if results is not None and gpu_row(results, CUBLAS, own) is not None:
        return results, own, False
    if layers is not None:
        return layers, own, True
    return results, shape, False


def layers_note(view: dict[str, Any]) -> str:
    """How :func:`amdahl` timed the layers, in a few words for the page."""
    if not view.get("measured"):
        return "k and v, 640 × 2560, charged q's time, not run"
    return "every layer at its own shape"


def amdahl(results, series=FLOAT_X_SERIES) -> dict[str, Any]:
    """The share of a BitNet b1.58 2B4T decode step (one token, a full context of KV cache) that its ternary
    layers take when they are bf16 matmuls, by bytes moved (``share``) and by time (``time_share``: the layers'
    cuBLAS bf16 times, measured at the model's own shapes, against the LM head and KV cache at the copy bandwidth,
    their floor, so the share is an upper bound), and what the measured speedup of the fastest of ``series`` (our
    bf16-x kernels unless told; part 1 passes step 14 alone) over cuBLAS bf16 there (GPU clock) buys end to end by
    Amdahl's law on that time share (``end_to_end``; ``limit`` with the layers made free)."""
    c = BITNET_2B4T
    head_dim = c["hidden"] // c["heads"]
    linear = c["layers"] * sum(n * k * count for _, n, k, count, _ in BITNET_LAYERS)  # weights
    rest = {"LM head (tied embedding, bf16)": c["vocab"] * c["hidden"] * 2,
            "KV cache (bf16, full context)": c["layers"] * 2 * c["kv_heads"] * head_dim * c["context"] * 2}
    linear_bytes = linear * 2
    share = linear_bytes / (linear_bytes + sum(rest.values()))
    base = ours = 0.0
    per_shape = {}
    layers = layer_run(results)
    separate = []
    for name, n, k, count, shape in BITNET_LAYERS:
        source, at, apart = layer_source(results, layers, n, k, shape)
        if apart:
            separate.append(at)
        b = us(source, CUBLAS, at)
        row, name = fastest(source, list(series), shape=at, m=1) if source is not None else (None, None)
        if b is None or row is None:
            base = ours = None
            break
        per_shape[at] = (b / (row["ms"] * 1e3), name)
        base += count * b
        ours += count * row["ms"] * 1e3
    speedup = None if base is None else base / ours
    bandwidth = results.data.get("ceilings", {}).get("copy_bandwidth_gbs") if results is not None else None
    linear_us = None if base is None else c["layers"] * base  # the ternary layers as cuBLAS bf16, one token
    rest_us = None if not bandwidth else sum(rest.values()) / (bandwidth * 1e9) * 1e6  # at the copy bandwidth
    time_share = None if None in (linear_us, rest_us) else linear_us / (linear_us + rest_us)
    end_to_end = None if None in (speedup, time_share) else 1 / ((1 - time_share) + time_share / speedup)
    bytes_2bit = linear * 2 / 8  # 2 bits a weight
    own = layers is not None or all(gpu_row(results, CUBLAS, f"{n}x{k}") for _, n, k, _, _ in BITNET_LAYERS)
    return {"measured": own, "separate": separate, "weights": linear, "linear_bytes": linear_bytes, "rest": rest,
            "share": share, "speedup": speedup, "linear_us": linear_us, "rest_us": rest_us, "time_share": time_share,
            "end_to_end": end_to_end, "limit": None if time_share is None else 1 / (1 - time_share),
            "per_shape": per_shape,
            "layer_bytes_ratio": linear_bytes / bytes_2bit,
            "bytes_ratio": (linear_bytes + sum(rest.values())) / (bytes_2bit + sum(rest.values()))}


def amdahl_layers_table(results, series=FLOAT_X_SERIES, beside=(), peer: str | None = None) -> str:
    """Markdown, GPU clock, µs, on the results' card: each ternary layer of a BitNet b1.58 2B4T transformer layer at
    M = 1, timed at its own shape in :func:`layer_run`'s run where committed, else at its benchmark shape (k and v
    then charged q's time on both sides, which the caption and their row call an estimate), cuBLAS bf16 against the
    fastest of ``series`` (as :func:`amdahl`), and their sums over one transformer layer (count x time): the sums'
    ratio is :func:`amdahl`'s ``speedup``. With ``beside`` (step numbers), a last column gives the fastest of those
    steps timed at each layer, its time, and the steps timed there where not all of them are, and its sum. With
    ``peer`` (a series), a column gives its time at each layer's own shape (– where the benchmark has none), and a
    last row sums cuBLAS, ours and the peer over the layers it was timed at: :func:`amdahl_peer`'s sums."""
    if results is None:
        return PENDING
    layers = layer_run(results)
    own = layers is not None or all(gpu_row(results, CUBLAS, f"{n}x{k}") for _, n, k, _, _ in BITNET_LAYERS)
    head = ("every layer at its own shape" if own
            else "an estimate, since k and v (640 × 2560) were not run and are charged q's time")
    base = ours = best = 0.0
    rows, others, theirs = [], [], []
    kept = [0.0, 0.0, 0.0]  # cuBLAS, ours and the peer over the layers the peer was timed at
    for name, n, k, count, shape in BITNET_LAYERS:
        source, shape, _ = layer_source(results, layers, n, k, shape)
        b = us(source, CUBLAS, shape)
        row, series_ = fastest(source, list(series), shape=shape, m=1)
        if b is None or row is None:
            return PENDING
        t = row["ms"] * 1e3
        base, ours = base + count * b, ours + count * t
        timed = shape.replace("x", " × ") + ("" if shape == f"{n}x{k}" else " (estimate: q's time)")
        rows.append((name, n, k, timed, count, b, t, step_label(series_).split(':')[0]))
        if peer is not None:
            p = us(results, peer, f"{n}x{k}")
            theirs.append(" | –" if p is None else f" | {p:.1f}")
            if p is not None:
                kept = [kept[0] + count * b, kept[1] + count * t, kept[2] + count * p]
        if beside:  # the fastest of the steps beside, where they are timed at this layer's shape
            at = {s: us(source, SERIES[s], shape) for s in beside}
            at = {s: v for s, v in at.items() if v is not None}
            if not at:
                return PENDING
            top = min(at, key=at.get)
            best += count * at[top]
            few = "" if len(at) == len(beside) else f" (only steps {and_list(str(s) for s in sorted(at))} timed)"
            others.append(f" | step {top}: {at[top]:.1f}{few}")
    steps = {r[-1] for r in rows}  # one step at every layer: named once, in the header
    one = f" ({steps.pop()})" if len(steps) == 1 else ""
    extra = f" | the fastest of steps {and_list(str(s) for s in beside)}" if beside else ""
    gem = f" | {step_label(peer).split(',')[0]}" if peer is not None else ""
    lines = [f"GPU clock, µs, one row of x, {card(results)}; {head}.\n",
             f"| layer (N × K) | timed at | a layer has | cuBLAS bf16 | ours, bf16 x{one} | × faster{extra}{gem} |",
             "|---|---|---|---|---|---|" + ("---|" if beside else "") + ("---|" if peer is not None else "")]
    for i, (name, n, k, timed, count, b, t, step) in enumerate(rows):
        lines.append(f"| {name} ({n} × {k}) | {timed} | {count} | {b:.1f} | {t:.1f}"
                     + ("" if one else f" ({step})") + f" | {round(b, 1) / round(t, 1):.2f}" + (others[i] if beside else "")
                     + (theirs[i] if peer is not None else "") + " |")
    lines.append(f"| **a transformer layer's ternary matmuls** | | | **{base:.1f}** | **{ours:.1f}** | "
                 f"**{round(base, 1) / round(ours, 1):.2f}**" + (f" | **{best:.1f}**" if beside else "")
                 + (" |" if peer else "") + " |")  # each ratio as its printed times give it
    if peer is not None and kept[2]:
        lines.append(f"| **the same, the layers {step_label(peer).split(',')[0]} was timed at** | | | "
                     f"**{kept[0]:.1f}** | **{kept[1]:.1f}** | **{round(kept[0], 1) / round(kept[1], 1):.2f}**"
                     + (" |" if beside else "")
                     + f" | **{kept[2]:.1f}** |")
    apart = further_run(results, LAYER_RUN) if layers is not None else ""
    if apart:  # only the shapes the benchmark lacks are read from the layer run
        gpu = Path(results.path).parent.name
        lines.append(f"\nk and v (640 × 2560) were timed in a second run on the same "
                     f"{gpu.split('-')[1].upper() if '-' in gpu else gpu}.")
    return "\n".join(lines)


def amdahl_peer(results, ours: str, peer: str) -> Optional[dict[str, Any]]:
    """:func:`amdahl`'s view against a peer rather than cuBLAS, over the layers of :data:`BITNET_LAYERS` that the
    benchmark times for both at their own shapes (one row of x): "layers" the names kept, "missing" those left out,
    "failed" the shapes kept where the peer's output fails its float64 check, "missing_share" the left-out layers'
    share of the ternary weights, "speedup" the ratio of the
    count-weighted sums (the peer's over ours), and "end_to_end" the whole decode step's time with the peer's kernel
    over its time with ours, by Amdahl's law on the ternary layers' share of a step's time (:func:`amdahl`'s
    ``time_share``) and each kernel's speedup over cuBLAS on the kept layers (the left-out layers taken to scale as
    the kept ones). None without a kept layer or a time share."""
    share = amdahl(results, [ours])["time_share"]
    if share is None:
        return None
    kept, missing, failed = [], [], []
    base = theirs = mine = 0.0
    for name, n, k, count, _ in BITNET_LAYERS:
        shape = f"{n}x{k}"
        b, p, o = (us(results, s, shape) for s in (CUBLAS, peer, ours))
        if None in (b, p, o):
            missing.append(name)
            continue
        kept.append(name)
        base, theirs, mine = base + count * b, theirs + count * p, mine + count * o
        if peer == GEMLITE:
            check = gemlite_check(results, shape)
            if check is not None and not check["passed"]:
                failed.append(shape)
    if not kept:
        return None
    step = lambda speed: (1 - share) + share / speed  # noqa: E731  a step's time, cuBLAS's = 1
    weights = {name: n * k * count for name, n, k, count, _ in BITNET_LAYERS}
    return {"layers": kept, "missing": missing, "failed": failed, "speedup": theirs / mine,
            "missing_share": sum(weights[m] for m in missing) / sum(weights.values()),
            "end_to_end": step(base / theirs) / step(base / mine)}


def amdahl_table(view: dict) -> str:
    lines = ["| part of the step | bytes read (MB) | share |", "|---|---|---|"]
    total = view["linear_bytes"] + sum(view["rest"].values())
    lines.append(f"| ternary linear layers, stored as bf16 ({view['weights'] / 1e9:.2f} G weights) | "
                 f"{view['linear_bytes'] / 1e6:,.0f} | {view['linear_bytes'] / total:.0%} |")
    for name, b in view["rest"].items():
        lines.append(f"| {name} | {b / 1e6:,.0f} | {b / total:.0%} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The numbers that bound it
# ----------------------------------------------------------------------------------------------

def bounds_table(bandwidth_gbs: float, shapes) -> str:
    """Bytes a format moves at M = 1 and the time they take at ``bandwidth_gbs`` (GB/s), per shape."""
    rows = ["| N × K | weights | bf16 MB | 2-bit MB | 1.6-bit MB | bf16 floor µs | int8 floor µs | 2-bit floor µs | "
            "1.6-bit floor µs |", "|---|---|---|---|---|---|---|---|---|"]
    per_us = lambda b: b / (bandwidth_gbs * 1e9) * 1e6  # noqa: E731
    for family, n, k in shapes:
        b16, b8 = 2 * n * k, n * k
        b2, b3 = 4 * n * packed_cols(k, "2bit"), n * packed_cols(k, "base3")
        rows.append(f"| {n} x {k} ({family}) | {n * k / 1e6:.1f} M | {b16 / 1e6:.1f} | {b2 / 1e6:.1f} | "
                    f"{b3 / 1e6:.1f} | {per_us(b16):.1f} | {per_us(b8):.1f} | {per_us(b2):.2f} | {per_us(b3):.2f} |")
    return "\n".join(rows)


def issue_budget(results, bandwidth_gbs: float, n: int = 4096, k: int = 14336) -> dict[str, float]:
    """How many instructions per weight the SMs can issue in the time the 2-bit weights take to stream: SMs x 4
    schedulers x 32 lanes x the top SM clock x the floor, over the weights (the card's numbers from the file)."""
    dev = device(results)
    sms = dev.get("sm_count", 132)
    clock_hz = float(str(dev.get("max_sm_clock", "1980 MHz")).split()[0]) * 1e6
    floor_s = 4 * n * packed_cols(k, "2bit") / (bandwidth_gbs * 1e9)
    lanes_per_s = sms * 4 * 32 * clock_hz
    return {"weights": n * k, "floor_us": floor_s * 1e6, "sms": sms, "clock_ghz": clock_hz / 1e9,
            "per_weight": lanes_per_s * floor_s / (n * k)}


# ----------------------------------------------------------------------------------------------
# Steps against the floor
# ----------------------------------------------------------------------------------------------

def _spread(row: dict) -> str:
    if "spread_ms" not in row:
        return ""
    lo, _, hi = row["spread_ms"]
    return f" ({lo * 1e3:.1f}–{hi * 1e3:.1f})"


def step_table(results, numbers, shapes=(MAIN, BIG), m: int = 1) -> str:
    """Markdown: each step's GPU-clock time (min–max of the repetitions where the file has them), its multiple
    of the 2-bit floor (1.6-bit for steps 7 and 8) and its speedup over cuBLAS bf16, per shape; "pending"
    where the file has no GPU-clock time for it."""
    lines = ["| step | N × K, M | GPU clock (µs) | × its floor | × faster than cuBLAS bf16 |", "|---|---|---|---|---|"]
    for number in numbers:
        step = STEPS[number - 1]
        for shape in shapes:
            row = gpu_row(results, step.series, shape, m)
            floor = floor_us(results, shape, m, "base3" if number in (7, 8) else "2bit")
            base = us(results, CUBLAS, shape, m)
            if row is None:
                lines.append(f"| `{step.name}` | {shape.replace('x', ' × ')}, {m} | {PENDING} | {PENDING} | {PENDING} |")
                continue
            t = row["ms"] * 1e3
            lines.append(f"| `{step.name}` | {shape.replace('x', ' × ')}, {m} | {t:.1f}{_spread(row)} | {fmt(ratio(t, floor), '.2f')} | "
                         f"{fmt(ratio(base, t), '.2f')} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The result against the baselines and peers
# ----------------------------------------------------------------------------------------------

def result_table(results, cases=((MAIN, 1), (BIG, 1), ("14336x4096", 1), ("2560x2560", 1), (MAIN, 16),
                                 (MAIN, 128), (BIG, 128)), w2a8=W2A8_SERIES) -> str:
    """Markdown, GPU clock, µs: per case, cuBLAS bf16, our fastest with bf16 x and the fastest of ``w2a8`` (each with
    its step; every launch of step 23 unless told), the peers (GemLite, torch._int_mm) and the binding floor (the
    larger of the 2-bit weights' time at the copy bandwidth and the card's latency floor, an empty kernel); speedups
    over cuBLAS in brackets; a peer's time is marked where its output fails its float64 check there (:data:`FAILS`).
    The headers say which columns compute cuBLAS's product, ``x @ W.T`` itself, and which another one: the W2A8
    columns round x to int8 a row first, so their speedup over cuBLAS is not like for like."""
    if results is None:
        return PENDING
    lines = ["| N × K, M | cuBLAS bf16 (x @ W.T) | ours, bf16 x (same product as cuBLAS) | GemLite, bf16 x (same "
             "product as cuBLAS) | ours, W2A8 (x rounded to int8 first) | torch._int_mm, W8A8 (x rounded to int8 "
             "first) | floor |",
             "|---|---|---|---|---|---|---|"]
    failed, marked = failed_peer_checks(results.data), False
    empty = latency_floor_ms(results) * 1e3  # the card's latency floor: no call ends sooner
    for shape, m in cases:
        base = us(results, CUBLAS, shape, m)
        if base is None:
            lines.append(f"| {shape.replace('x', ' × ')}, {m} | " + " | ".join([PENDING] * 6) + " |")
            continue
        base = round(base, 1)  # every time as printed, one decimal: a speedup is the ratio of the two printed
        cells = [f"{shape.replace('x', ' × ')}, {m}", f"{base:.1f}"]
        for group, peer in ((FLOAT_X_SERIES, GEMLITE), (list(w2a8), INT_MM)):
            row, s = fastest(results, group, shape=shape, m=m)
            t = None if row is None else round(row["ms"] * 1e3, 1)
            cells.append("–" if row is None else f"{t:.1f} ({base / t:.1f}×, {_launch(s, results, shape, m)})")
            p = us(results, peer, shape, m)
            p = None if p is None else round(p, 1)
            bad = p is not None and bool({(peer, shape, m), (peer, shape, None)} & failed)
            # a failing output gets its time and the mark, no ratio (no ratio is drawn from a failing output)
            cells.append("–" if p is None else f"{p:.1f} {FAILS}" if bad else f"{p:.1f} ({base / p:.1f}×)")
            marked |= bad
        two_bit = floor_us(results, shape, m)
        cells.append(fmt(None if two_bit is None else max(two_bit, empty), '.1f'))
        lines.append("| " + " | ".join(cells) + " |")
    return _with_legend("\n".join(lines)) + (FAILS_NOTE if marked else "")


#: After a peer's time where its output fails our float64 check at that case, and the note under such a table.
FAILS = "✗"
FAILS_NOTE = f"\n\n{FAILS}: the peer's output fails our float64 check here; its time as measured, no ratio."


def _launch(series: str, results=None, shape: str | None = None, m: int | None = None) -> str:
    """A series as a table names it: the step's name, and where it is one of the step's other launches (the place
    x is quantised), that place: "`step23_w2a8_fused`, x quantised in every block". Step 23 at a case (``results``,
    ``shape``, ``m``) where its default quantises x by a kernel of its own (above 8 rows) says so instead of
    "fused"."""
    if series == SERIES[23] and results is not None and shape is not None and m is not None:
        from studylog.ternary.w2a8 import w2a8_default_quantize

        n, k = (int(v) for v in shape.split("x"))
        sms = results.data.get("device", {}).get("sm_count", 132)
        if w2a8_default_quantize(m, n, k, sms) == "separate":
            return f"step 23 at {m} rows: W2A8, x quantised by a kernel of its own"
    name, _, option = series_label(series).split(" (")[0].partition(", x quantised at quantize=")
    place = {"every block": "in every block", "separate": "by a kernel of its own"}.get(option.strip("'"),
                                                                                         option.strip("'"))
    number = int(name[4:6]) if re.fullmatch(r"step\d\d_\w+", name) else None
    return (step_label(number) if number else name) + (f", x quantised {place}" if option else "")


# ----------------------------------------------------------------------------------------------
# What was tried and did not help
# ----------------------------------------------------------------------------------------------


def _best(rows, key="graph_us"):
    rows = [r for r in rows if key in r]
    return min(rows, key=lambda r: r[key]) if rows else None


def first_attempt():
    """``lab/ternary/first_attempt.py`` as a module: the first attempt's kernel and ``ternary_first_attempt``, which
    runs it with its bugs (a rejected kernel lives beside the library, not in it)."""
    import importlib.util
    import sys

    from studylog import paths

    name = "lab_ternary_first_attempt"
    if name not in sys.modules:  # loaded once: Triton keeps a kernel's compiled code on its function object
        spec = importlib.util.spec_from_file_location(name, paths.LAB / "ternary" / "first_attempt.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# ----------------------------------------------------------------------------------------------
# SASS of the CUDA C++ steps (compiled with NVRTC, disassembled with the cuobjdump Triton ships)
# ----------------------------------------------------------------------------------------------

def cuobjdump() -> Optional[str]:
    tool = Path(__import__("triton").__file__).parent / "backends/nvidia/bin/cuobjdump"
    return str(tool) if tool.is_file() else shutil.which("cuobjdump")


def sass(source: str, instance: str, arch: str = "sm_90") -> Optional[str]:
    """The SASS of one instance of a chapter kernel, or None without a disassembler."""
    from studylog import cuda

    tool = cuobjdump()
    if tool is None:
        return None
    cubin = cuda.compile_source(source, arch=arch, name_expressions=[instance]).cubin
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout


#: One instance of each CUDA C++ step at one tile of 16 weight rows and one of 8 rows of x (bf16 x):
#: its kernel handles one group of 256 weights a row per iteration of its main loop.
SASS_INSTANCES = {17: ("ternary_mma", "cuda_mma_kernel<true, 1, 1, 2, true>"),
                  20: ("ternary_bulk", "tma_kernel<true, 1, 1, 4, 1, false, false>"),
                  21: ("ternary_bulk", "tma_kernel<true, 1, 1, 4, 1, false, true>"),
                  23: ("ternary_w2a8", "w2a8_kernel<0, true, 1, 1, 4, 1>")}


def sass_counts(step: int, source: Optional[str] = None) -> Optional[dict[str, int]]:
    """Counts of the instructions that carry a group's arithmetic in a step's SASS: the MMAs (HMMA bf16, IMMA
    int8), the LOP3s, the packed FMAs of the float decode, and the moves that rebuild the decode's magic
    constant in a register (``IMAD.MOV ... 0x43004300``). ``source``: the step's kernel file changed (its text),
    compiled to the same instance."""
    name, instance = SASS_INSTANCES[step]
    text = sass(name if source is None else source, instance)
    return None if text is None else count_sass(text)


def magic_literal_counts() -> Optional[dict[str, int]]:
    """:func:`sass_counts` of step 21 with its decode's constant written as a literal instead of read from shared
    memory (part 2's exercise 6 answer): what the read alone saves."""
    from book.ternary.solutions import magic_literal
    from studylog import cuda

    return sass_counts(21, magic_literal(cuda.read_source(SASS_INSTANCES[21][0])))


def count_sass(text: str) -> dict[str, int]:
    """:func:`sass_counts` of a disassembly (``cuobjdump -sass``'s text)."""
    lines = [line for line in text.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", line)]
    return {"instructions": len(lines),
            "HMMA": sum("HMMA" in line for line in lines),
            "IMMA": sum("IMMA" in line for line in lines),
            "LOP3": sum("LOP3" in line for line in lines),
            "HFMA2": sum("HFMA2" in line for line in lines),
            "magic moves": sum(bool(re.search(r"IMAD\.MOV\.U32 R\d+, RZ, RZ, 0x43004300", line)) for line in lines)}


# ----------------------------------------------------------------------------------------------
# Two cards, one kernel; when the host is the bottleneck ("How we measure" links these)
# ----------------------------------------------------------------------------------------------

def cards() -> dict[str, Any]:
    """Every committed results file of the chapter, by card ("H100", "H200")."""
    out = {}
    for f in plotting.result_files("ternary"):
        res = plotting.load_results("ternary", gpu=f.parent.name)
        out[res.gpu.replace("NVIDIA ", "").split()[0]] = res
    return out


def cards_table(cards_: dict, series=(CUBLAS, SERIES[21], SERIES[23], "read_weights"),
                cases=((MAIN, 1), (BIG, 1), (MAIN, 16))) -> str:
    """Markdown, GPU clock, µs: the same series on each card; and how close cuBLAS runs to each card's copy
    bandwidth."""
    head = ["N × K, M"] + [f"{series_label(s).split(' (')[0].split(':')[0]} on the {c}" for s in series for c in cards_]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, m in cases:
        cells = [f"{shape.replace('x', ' × ')}, {m}"]
        for s in series:
            for res in cards_.values():
                t = us(res, s, shape, m)
                cells.append("–" if t is None else f"{t:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return _with_legend("\n".join(lines))


def bandwidth_share(res, shape: str = MAIN, m: int = 1) -> Optional[float]:
    """The fraction of the run's copy bandwidth at which cuBLAS bf16 streams its weights (GPU clock)."""
    row = gpu_row(res, CUBLAS, shape, m)
    if row is None or "bytes" not in row:
        return None
    return row["bytes"] / (row["ms"] * 1e-3) / (res.data["ceilings"]["copy_bandwidth_gbs"] * 1e9)


def host_table(results, cases=((MAIN, 1), ("2560x2560", 1))) -> str:
    """Markdown, µs: each step's GPU time against the host time per call of its public function (the file's
    ``host_ms``), and the run's empty launch."""
    if results is None:
        return PENDING
    empty = results.data.get("ceilings", {}).get("empty_launch_host_ms")
    lines = [f"| kernel ({card(results)}) | N × K, M | GPU time | host time per call | host / GPU |", "|---|---|---|---|---|"]
    for shape, m in cases:
        for s in [CUBLAS] + [SERIES[n] for n in (5, 14, 17, 21, 23)] + [PLAN, SERIES[25], GEMLITE, INT_MM]:
            row = gpu_row(results, s, shape, m)
            if row is None or "host_ms" not in row:
                continue
            name = step_label(s) if s in SERIES.values() else f"{step_label(SERIES[23])}, through `W2A8Plan`" \
                if s == PLAN else series_label(s).split(' (')[0].split(':')[0]
            lines.append(f"| {name} | {shape.replace('x', ' × ')}, {m} | {row['ms'] * 1e3:.1f} | "
                         f"{row['host_ms'] * 1e3:.1f} | {row['host_ms'] / row['ms']:.1f} |")
    if empty is not None:
        lines.append(f"| an empty Triton kernel launched from Python (host time only, this run's) | – | – | "
                     f"{empty * 1e3:.1f} | – |")
    plain, plan = (gpu_row(results, s, cases[0][0], cases[0][1]) for s in (SERIES[23], PLAN))
    if plain is not None and plan is not None and f"{plain['ms'] * 1e3:.1f}" != f"{plan['ms'] * 1e3:.1f}":
        lines.append(f"\nThe plan runs step 23's kernel; its GPU time is a second timing of that kernel "
                     f"({plan['ms'] * 1e3:.1f} µs through the plan, {plain['ms'] * 1e3:.1f} µs called plainly: two "
                     "runs of the same kernel).")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The CUDA C++ steps: what each buys, from the compiler's output and the probes
# ----------------------------------------------------------------------------------------------

def sass_table(steps=(17, 20, 21, 23)) -> Optional[str]:
    """Markdown: per group of 256 weights a row (one tile of 16 rows, one of 8 rows of x), the instructions of each
    step's arithmetic in its SASS: MMAs, packed FMAs of the float decode, and the moves that rebuild the magic."""
    lines = ["| step | MMAs a group | HFMA2 (float decode) a group | moves of the magic constant a group |",
             "|---|---|---|---|"]
    for step in steps:
        c = sass_counts(step)
        if c is None:
            return None
        groups = c["IMMA"] / 8 if c["IMMA"] else c["HMMA"] / 16  # 8 int8 MMAs (k32) or 16 bf16 MMAs (k16) a group
        mma = f"{c['IMMA'] / groups:.0f} IMMA (m16n8k32, int8)" if c["IMMA"] else f"{c['HMMA'] / groups:.0f} HMMA (m16n8k16, bf16)"
        lines.append(f"| `{STEPS[step - 1].name}` | {mma} | {c['HFMA2'] / groups:.0f} | {c['magic moves'] / groups:.1f} |")
    return "\n".join(lines)


def in_flight(n: int = 4096, k: int = 14336, bandwidth_gbs: float = 3000.0) -> dict[str, float]:
    """Step 17's weights in flight at M = 1 (its default launch): each thread holds ``stages`` groups of its
    ``row_tiles`` tiles in registers, 16 bytes of each of the two halves of a group; and the DRAM latency that much
    in flight covers at ``bandwidth_gbs`` (Little's law: bytes in flight = bandwidth x latency)."""
    from studylog.ternary.cuda_steps import cuda_mma_config

    cfg = cuda_mma_config(1, n, k)
    per_thread = cfg.stages * cfg.row_tiles * 2 * 16
    blocks = -(-(-(-n // 16)) // (cfg.row_tiles * cfg.warps)) * cfg.slices
    total = per_thread * 32 * cfg.warps * blocks
    return {"per_thread": per_thread, "per_block": per_thread * 32 * cfg.warps, "blocks": blocks, "bytes": total,
            "latency_us": total / (bandwidth_gbs * 1e9) * 1e6, "config": str(cfg)}


def ring_in_flight(n: int = 4096, k: int = 14336) -> dict[str, float]:
    """Step 21's weights in flight at M = 1 (its default launch): every stage of every block's ring, a stage
    holding ``warps x row_tiles x chunk`` groups of 1 KiB (16 rows x 256 weights x 2 bits)."""
    from studylog.ternary.cuda_steps import tma_config

    cfg = tma_config(1, n, k)
    per_block = cfg.stages * cfg.warps * cfg.row_tiles * cfg.chunk * 1024
    blocks = -(-(-(-n // 16)) // cfg.row_tiles) * cfg.slices
    return {"per_block": per_block, "blocks": blocks, "bytes": per_block * blocks, "config": str(cfg)}


def ncu_metrics(name: str) -> dict[str, float]:
    """Nsight Compute's counters in one of lab/ternary/results/nvidia-h200's reports, as numbers."""
    text = plotting.load_lab("ternary", name, H200)
    out = {}
    for label in ("Duration", "Elapsed Cycles", "SM Active Cycles", "DRAM Throughput", "Eligible Warps Per Scheduler",
                  "Issued Warp Per Scheduler"):
        m = re.search(rf"^\s*{label}\s+(?:\S+\s+)?([\d,.]+)\s*$", text, re.M)
        out[label] = float(m.group(1).replace(",", "")) if m else None
    # the launch profiled (the report's first line names its config), which may differ from today's default
    m = re.search(r"^config \w+\((.*)\)$", text, re.M)
    out["config"] = dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))) if m else None
    return out


def _probe_series(step: int) -> list[str]:
    from studylog.ternary.cuda_steps import PROBES

    return [SERIES[step]] + [f"{SERIES[step]}_probe_{p}" for p in PROBES] + ["read_weights"]


def probe_clock(results, step: int, shapes=(MAIN, BIG)) -> str:
    """"GPU clock" where the file has a step and every one of its probes on it, else pending."""
    every = results is not None and all(gpu_row(results, s, shape) for s in _probe_series(step) for shape in shapes)
    return "GPU clock" if every else PENDING


def probe_us(results, step: int, probe: Optional[int], shape: str = MAIN) -> Optional[float]:
    """A step's (probe=None) or a probe build's GPU time at M = 1 (µs), or None."""
    return us(results, SERIES[step] if probe is None else f"{SERIES[step]}_probe_{probe}", shape)


def probe_table(results, step: int, shapes=(MAIN, BIG)) -> tuple[str, str]:
    """(Markdown, clock): a step's kernel and its probe builds at M = 1 (copies only, arithmetic only, launch only)
    and a kernel that only reads the weights, in µs on the GPU clock ("–" where the file lacks one)."""
    from studylog.ternary.cuda_steps import PROBES

    if results is None:
        return PENDING, PENDING
    head = ["N × K (M = 1)", f"`{STEPS[step - 1].name}`"] + [PROBES[p] for p in PROBES] + ["only reading the weights"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape in shapes:
        rows = [gpu_row(results, s, shape) for s in _probe_series(step)]
        lines.append("| " + " | ".join([shape] + ["–" if r is None else f"{r['ms'] * 1e3:.1f}{_spread(r)}"
                                                  for r in rows]) + " |")
    return "\n".join(lines), probe_clock(results, step, shapes)


#: Nsight Compute's details page (CSV) of ``lab/ternary/w2a8_ncu.py``: the final kernels and cuBLAS at 4096 x 14336.
NCU_TARGETS = "w2a8_ncu_targets.csv"
#: Kernel name (its start) -> (what it is, rows of x) in that file, in the order the script launches them.
NCU_KERNELS = (("void w2a8_kernel<", "step 23", 1), ("nvjet_", "cuBLAS bf16", 1), ("void quantize_x<", None, 16),
               ("void w2a8_tiles_kernel<", "step 25", 16), ("step14_workspace_kernel", "step 14", 16),
               ("nvjet_", "cuBLAS bf16", 16))


def ncu_targets() -> list[dict]:
    """Each profiled kernel of :data:`NCU_TARGETS` (cuBLAS's split-K reduce and step 25's ``quantize_x`` left out):
    what it is, rows of x, and its counters as numbers (duration in µs, DRAM throughput as % of peak, cycles with no
    eligible warp in %, active and eligible warps a scheduler, waves a SM)."""
    import csv

    text = plotting.load_lab("ternary", NCU_TARGETS, H200)
    rows = list(csv.DictReader(line for line in text.splitlines() if line.startswith('"')))
    by_id: dict[str, dict] = {}
    for r in rows:
        by_id.setdefault(r["ID"], {"kernel": r["Kernel Name"]})[r["Metric Name"]] = r["Metric Value"]
    wanted = iter(NCU_KERNELS)
    out = []
    for _, k in sorted(by_id.items(), key=lambda kv: int(kv[0])):
        if k["kernel"].startswith("void cublasLt::splitKreduce"):
            continue
        start, what, m = next(wanted)
        if not k["kernel"].startswith(start):
            raise ValueError(f"{NCU_TARGETS}: expected a kernel named {start}..., found {k['kernel'][:60]}")
        if what is None:
            continue
        number = lambda name: float(k[name].replace(",", ""))  # noqa: E731
        out.append({"what": what, "m": m, "us": number("Duration") / 1e3, "dram": number("DRAM Throughput"),
                    "idle": number("No Eligible"), "active": number("Active Warps Per Scheduler"),
                    "eligible": number("Eligible Warps Per Scheduler"), "waves": number("Waves Per SM")})
    return out


def ncu_targets_table(rows: list[dict]) -> str:
    """Markdown: :func:`ncu_targets`' rows."""
    lines = ["| kernel | rows of x | duration, one cold call (µs) | DRAM throughput (% of peak) | cycles no warp can "
             "issue | warps a scheduler: active / eligible | waves |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['what']} | {r['m']} | {r['us']:.1f} | {r['dram']:.0f}% | {r['idle']:.0f}% | "
              f"{r['active']:.2f} / {r['eligible']:.2f} | {r['waves']:.2f} |" for r in rows]
    return "\n".join(lines)


def ncu_table(names=("w2a8_tiles_ncu_m1.txt", "w2a8_tiles_ncu_m16.txt"), rows_of_x=(1, 16)) -> str:
    """Markdown: Nsight Compute's counters of step 25 at 4096 x 14336 (lab/ternary/results/nvidia-h200)."""
    labels = ("Duration", "Elapsed Cycles", "SM Active Cycles", "DRAM Throughput", "Eligible Warps Per Scheduler",
              "Issued Warp Per Scheduler")

    def metrics(name):
        text = plotting.load_lab("ternary", name, H200)
        return [re.search(rf"^\s*{label}\s+(\S+\s+)?([\d,.]+)\s*$", text, re.M) for label in labels]

    lines = ["| rows of x | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for m, name in zip(rows_of_x, names):
        found = metrics(name)
        lines.append(f"| {m} | " + " | ".join(f"{g.group(2)} {(g.group(1) or '').strip()}".strip() if g else "–"
                                             for g in found) + " |")
    return "\n".join(lines)


__all__ = ["H100", "H200", "MAIN", "BIG", "PENDING", "load", "caption", "gpu_row", "us", "floor_us", "ratio", "faster",
           "device",
           "BITNET_2B4T", "BITNET_LAYERS", "LAYER_RUN", "layer_run", "layers_note", "EXCERPTS", "excerpt", "w2a8_launch_listing", "amdahl", "amdahl_layers_table", "amdahl_table", "card", "core_diff",
           "first_attempt_excerpt", "bounds_table", "issue_budget", "step_table",
           "result_table", "first_attempt", "cuobjdump", "sass",
           "SASS_INSTANCES", "sass_counts", "cards", "cards_table", "bandwidth_share",
           "PART1_ROWS", "PART2_ROWS", "PART2_TRIED", "part2_role", "part2_roles_legend", "amdahl_peer", "verdict", "place_times", "gemlite_table", "shape_words", "and_list", "part2_tried", "step25_wins", "further_run", "run_source", "lab_file",
           "bench_file", "provenance", "layer_source",
           "host_table", "sass_table", "in_flight", "ring_in_flight", "ncu_metrics", "probe_clock", "probe_us",
           "probe_table", "ncu_table", "NCU_TARGETS", "ncu_targets", "ncu_targets_table"]


# ----------------------------------------------------------------------------------------------
# One steps table a page
# ----------------------------------------------------------------------------------------------

#: Part 1's rows: (step, rows of x, the step it is measured against, the one change). Steps 6 and 8 to 14 are
#: built for several rows of x, so they are measured at M = 16 against the step they build on, and at M = 1 too.
PART1_ROWS = (
    (1, 1, None, "dense float weights, a sign choice instead of a multiply"),
    (2, 1, 1, "int8 weights (a tie: bytes alone do not set the time)"),
    (3, 1, 2, "2-bit weights, decoded with shifts and masks"),
    (4, 1, 3, "the decode in one AND: a field under a float exponent"),
    (5, 1, 4, "8 rows a program, one load of x for the 8"),
    (6, 1, 5, "decoded weights into `tl.dot` (built for several rows; at one row it loses)"),
    (7, 1, 5, "tried, did not pay at 4096 × 14336: 1.6-bit weights (base 3, a table lookup a byte)"),
    (8, 1, 6, "tried, did not pay at 4096 × 14336: 1.6-bit weights with `tl.dot`"),
    (9, 1, 6, "tried, did not pay at 4096 × 14336: int8 activations on the int8 tensor cores"),
    (10, 1, 6, "step 6 at configs made for the tensor cores"),
    (11, 1, 10, "two weights an AND and a packed FMA, on the `2bit` layout (a prerequisite of step 13)"),
    (12, 1, 11, "no masks in the loop: rows clamped, x unmasked below K"),
    (13, 1, 12, "the `2bit_mma` layout: a word's halves are neighbours along K"),
    (14, 1, 13, "split K through a zeroed workspace, no memset"),
    (6, 16, None, "decoded weights into `tl.dot`, 16 rows of x"),
    (8, 16, 6, "tried, did not pay at 4096 × 14336: 1.6-bit weights with `tl.dot`"),
    (9, 16, 6, "tried, did not pay at 4096 × 14336: int8 activations on the int8 tensor cores"),
    (10, 16, 6, "step 6 at configs made for the tensor cores (kept for step 13)"),
    (11, 16, 10, "two weights an AND and a packed FMA, on the `2bit` layout"),
    (12, 16, 11, "no masks in the loop (kept for step 13)"),
    (13, 16, 12, "the `2bit_mma` layout"),
    (14, 16, 13, "split K through a zeroed workspace, no memset"),
)

#: Part 2's rows, as :data:`PART1_ROWS`: one row a step, each against the step before it, its role said in a column
#: of its own (:func:`part2_role`). Steps 24 and 25, a tried path, have a table of their own (:data:`PART2_TRIED`).
PART2_ROWS = (
    (14, 1, None, "part 1's last Triton step"),
    (15, 1, 14, "`mma.sync`: the loop by hand, K in one slice"),
    (16, 1, 15, "K split across blocks, the slices summed in a fixed order"),
    (17, 1, 16, "x copied once into shared memory"),
    (18, 1, 17, "the weights by the TMA into a ring, sums still through L2"),
    (19, 1, 18, "the warps of a block share its K, the sums in shared memory"),
    (20, 1, 19, "one copy a stage and tile, not one a warp"),
    (21, 1, 20, "the decode's constant kept in a register"),
    (22, 1, 21, "int8 x on the int8 tensor cores (22a), x quantised by a kernel of its own (22b) launched early "
                "(22c)"),
    (23, 1, 22, "x quantised inside the matmul"),
    (14, 16, None, "part 1's step 14 at 16 rows of x"),
    (23, 16, 14, "step 23 at 16 rows (there x is quantised by a kernel of its own)"),
)

#: Part 2's steps that are slower than the step before them, or than the step before their pair, kept because the
#: step named builds on them and pays (one row of x): a role "prerequisite of N".
PART2_NEEDED_BY = {15: 16, 16: 17, 18: 19, 22: 23}
#: The second step of each of part 2's two pairs (one section each), and the step before the pair: its role cell
#: gives its speed over that step too.
PART2_PAIRS = {16: 14, 19: 17}
#: Why a part 2 step that ties the step before it is kept, said in its role cell.
PART2_TIES_KEPT = {20: "step 21 builds on it", 21: "the result sets this bf16-x kernel against cuBLAS"}


def part2_role(results, number: int, m: int, previous, shape: str = MAIN) -> str:
    """A part 2 step's role cell, from its "× previous" (:func:`is_tie`): "baseline" (no previous); "tie, kept
    because …" (:data:`PART2_TIES_KEPT`); "**pays**" where it is faster than the step before it and, for a pair's
    second step (:data:`PART2_PAIRS`), than the step before the pair too (that ratio given); "prerequisite of N"
    (:data:`PART2_NEEDED_BY`) where it is slower than either; else "loses"."""
    if previous is None:
        return "baseline"
    t = shown(us(results, SERIES[number], shape, m))  # the ratios of the times as the table prints them
    r = ratio(shown(us(results, SERIES[previous], shape, m)), t)
    if r is None:
        return "pending"
    start = PART2_PAIRS.get(number)
    whole = None if start is None else ratio(shown(us(results, SERIES[start], shape, m)), t)
    note = "" if whole is None else f" ({whole:.2f}× step {start})"
    if is_tie(r):
        return "tie" + (f", kept because {PART2_TIES_KEPT[number]}" if number in PART2_TIES_KEPT else "")
    if r > 1 and (whole is None or (whole > 1 and not is_tie(whole))):
        return "**pays**" + note
    if m == 1 and number in PART2_NEEDED_BY:
        return f"prerequisite of {PART2_NEEDED_BY[number]}" + note
    return "loses"


def part2_roles_legend() -> str:
    """The one line over part 2's steps table that says what its role words mean."""
    return ("Role: **pays**, above 1.03× the step before; *tie*, 0.97× to 1.03×; *prerequisite of N*, slower than "
            "the step before or step 14, kept because step N builds on it and pays.")


#: Part 2's tried path, built for several rows of x: at one row of the headline shape both lose, at BitNet's largest
#: shapes step 25 wins; at 16 rows each beats the step before it and both lose to part 1's step 14.
PART2_TRIED = (
    (24, 1, 23, "tried, for several rows: one tile of weights a warp, a slice of K a block; loses here"),
    (25, 1, 24, "tried, for several rows: x by the TMA; loses to step 23 here, wins at the largest BitNet shapes"),
    (24, 16, 23, "tried, for several rows: one tile of weights a warp, a slice of K a block"),
    (25, 16, 24, "tried, for several rows: x by the TMA; beats step 23, loses to step 14"),
)


def step25_wins(bitnet_run) -> dict[str, float]:
    """The shapes of BitNet's run (one row of x) where step 25 is faster than step 23: shape -> step 23's time
    over step 25's. Empty without the run."""
    if bitnet_run is None:
        return {}
    out = {}
    for shape in dict.fromkeys(r["params"]["shape"] for r in bitnet_run.select("bitnet_w2a8", m=1)):
        t25, t23 = (bitnet_run.select(SERIES[n], shape=shape, m=1) for n in (25, 23))
        if t25 and t23 and t25[0]["ms"] < t23[0]["ms"]:
            out[shape] = t23[0]["ms"] / t25[0]["ms"]
    return out


def part2_tried(bitnet_run) -> tuple:
    """:data:`PART2_TRIED`, step 25's one-row cell saying where it wins, computed from BitNet's run."""
    wins = step25_wins(bitnet_run)
    if not wins:
        return PART2_TRIED
    where = (f"wins at {len(wins)} BitNet shapes, {', '.join(s.replace('x', ' × ') for s in wins)}, by "
             f"{min(wins.values()):.2f}× to {max(wins.values()):.2f}× step 23's speed")
    return tuple((n, m, p, c.replace("wins at the largest BitNet shapes", where) if (n, m) == (25, 1) else c)
                 for n, m, p, c in PART2_TRIED)


def boehm_table(results, rows, shape: str = MAIN, read_only: bool = False, rows_of_x=None, beside=None,
                roles=None, at=None) -> str:
    """Markdown, one table for each number of rows of x (one row a step, SGEMM-worklog style), each under a caption
    that names the rows of x, the card and the clock: the one change, its GPU-clock time at ``shape`` (µs), its
    speedup over the step it is measured against (named, > 1 is faster) and its multiple of the 2-bit weights'
    bandwidth floor (steps 7 and 8 also over their own 1.6-bit floor); with ``read_only``, also its multiple of the time of
    a kernel that only reads the same 2-bit weights (``read_weights``, timed at one row of x); "pending" where the
    file has no time. ``rows_of_x`` (a number or a tuple of them) keeps those tables alone: a page shows its one-row
    table open and folds the others. ``beside`` (a number of rows of x): one table at ``rows_of_x`` with that
    number's time and × previous in two more columns ("–" for a step not timed there), its caption naming both.
    ``roles`` (a function of results, step, rows of x, the step it is measured against and the shape, such as
    :func:`part2_role`): a "role" column after the step's number. ``at`` (a shape, with ``beside``): a last column,
    each step's one-row time and × previous at that shape ("–" where the benchmark does not time it there)."""
    if beside is not None:
        return _beside_table(results, rows, shape, rows_of_x, beside, at)
    keep = None if rows_of_x is None else set(rows_of_x if isinstance(rows_of_x, (tuple, list)) else (rows_of_x,))
    tables = []
    for m in dict.fromkeys(m for _, m, _, _ in rows if keep is None or m in keep):
        caption = (f"**{'One row' if m == 1 else f'{m} rows'} of x (M = {m}), "
                   f"{shape.replace('x', ' × ')}, {card(results)}, GPU clock**")
        tables.append(caption + "\n\n" + _boehm_rows(results, [r for r in rows if r[1] == m], shape, read_only, roles))
    return "\n\n".join(tables)


#: The steps of part 1 built for one row of x: the one-number table times them at M = 1, the rest at M = 16.
ONE_ROW_STEPS = (1, 2, 3, 4, 5)


def one_number_table(results, rows, shape: str = MAIN, many: int = 16) -> str:
    """Markdown, one number a step, in two tables: the steps of ``rows`` (:data:`PART1_ROWS`' form) in
    :data:`ONE_ROW_STEPS` (built for decode) at one row of x, then the rest at ``many`` rows (built for several), each
    under a caption naming its rows of x (with the shape, card and clock on the first): GPU time at ``shape`` (µs),
    × previous (the step before at the same rows of x; "–" on each table's first step) and × the 2-bit floor at those
    rows. Every ratio is of two times in its table."""
    picked = [r for r in rows if (r[1] == 1) == (r[0] in ONE_ROW_STEPS) and r[1] in (1, many)]
    head = ["| step | the change | µs | × previous | × the 2-bit floor |", "|---|---|---|---|---|"]
    one = [r for r in picked if r[1] == 1]
    several = [r for r in picked if r[1] == many]
    out = []
    for part, caption in ((one, f"**{shape.replace('x', ' × ')}, {card(results)}, GPU clock. At one row of x (M = 1): "
                                f"steps {one[0][0]} to {one[-1][0]}, built for decode**" if one else ""),
                          (several, f"**At {many} rows (M = {many}): steps {several[0][0]} and {several[1][0]} to "
                                    f"{several[-1][0]}, built for several**" if len(several) > 1 else "")):
        if not part:
            continue
        lines = [caption, ""] + head
        for number, m, previous, change in part:
            cells = _boehm_rows(results, [(number, m, previous, change)], shape).splitlines()[2].strip().strip("|")
            cells = [c.strip() for c in cells.split(" | ")]
            if previous is None:
                cells[3] = "–"
            lines.append("| " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def shown(t: Optional[float]) -> Optional[float]:
    """A time (µs) as a steps table prints it, to :data:`SHOWN_DIGITS` decimals: its ratios are of these values."""
    return None if t is None else round(t, SHOWN_DIGITS)


#: The decimals of a steps table's times: two, so that a ratio near the tie rule's edge (1.03×) is the ratio of the
#: times the table shows.
SHOWN_DIGITS = 2


def vs(before: Optional[float], t: Optional[float], previous) -> str:
    """A step table's × previous cell: "1.65× (vs 6)", or "1.03× (vs 20; tie)" by :func:`is_tie`, the ratio of the
    two times as the table prints them (:func:`shown`)."""
    r = ratio(shown(before), shown(t))
    return f"{fmt(r, '.2f', '×')} (vs {previous}{'; tie' if is_tie(r) else ''})"


def _beside_table(results, rows, shape: str, m: int, other: int, at=None) -> str:
    """:func:`boehm_table` at ``m`` rows of x with the time and × previous at ``other`` rows beside each step, put
    first: the steps that have them are built for ``other`` rows; with ``at``, a last column at that shape."""
    there = {n: p for n, rows_of_x, p, _ in rows if rows_of_x == other}
    lines = _boehm_rows(results, [r for r in rows if r[1] == m], shape).splitlines()
    out = [f"| step | the change | µs, M = {other} | × previous, M = {other} | µs, M = {m} | × previous | "
           "× the 2-bit floor |" + (f" µs (× previous), {shape_words(at)}, M = {m} |" if at else ""),
           "|---|---|---|---|---|---|---|" + ("---|" if at else "")]
    for line, (number, _, before_m, _) in zip(lines[2:], [r for r in rows if r[1] == m]):
        cells = line.strip().strip("|").split(" | ")
        if number not in there:
            ahead = "– | –"
        else:
            t, previous = us(results, SERIES[number], shape, other), there[number]
            speed = f"– (the first at {other} rows)" if previous is None else \
                vs(us(results, SERIES[previous], shape, other), t, previous)
            ahead = f"{fmt(shown(t), '.2f')} | {speed}"
        cells = [c.strip() for c in cells]
        if at:
            t = us(results, SERIES[number], at, m)
            before = None if before_m is None else us(results, SERIES[before_m], at, m)
            r = ratio(shown(before), shown(t))
            cells.append("–" if t is None else f"{t:.2f}" + ("" if r is None else
                                                             f" ({r:.2f}×{', tie' if is_tie(r) else ''})"))
        out.append(f"| {cells[0]} | {cells[1]} | {ahead} | " + " | ".join(cells[2:]) + " |")
    caption = f"**{shape.replace('x', ' × ')}, {card(results)}, GPU clock, M = {other} and M = {m}**"
    return caption + "\n\n" + "\n".join(out) + f"\n\nAt {other} rows, –: a one-row kernel, not timed."


def _boehm_rows(results, rows, shape: str, read_only: bool = False, roles=None) -> str:
    lines = ["| step |" + (" role |" if roles else "") + " the change | µs | × previous | × the 2-bit floor |"
             + (" × read-only |" if read_only else ""),
             "|---|---|---|---|---|" + ("---|" if roles else "") + ("---|" if read_only else "")]
    reader = us(results, "read_weights", shape, 1) if read_only else None
    for number, m, previous, change in rows:
        t = us(results, SERIES[number], shape, m)
        floor = floor_us(results, shape, m, "2bit")
        own = (f" (its 1.6-bit floor: {fmt(ratio(t, floor_us(results, shape, m, 'base3')), '.1f')})"
               if number in (7, 8) else "")
        before = None if previous is None else us(results, SERIES[previous], shape, m)
        speed = "–" if previous is None else vs(before, t, previous)
        extra = f" {fmt(ratio(t, reader), '.1f')} |" if read_only else ""
        role = f" {roles(results, number, m, previous, shape)} |" if roles else ""
        lines.append(f"| {number} |{role} {change} | {fmt(shown(t), '.2f')} | {speed} | "
                     f"{fmt(ratio(t, floor), '.1f')}{own} |{extra}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Short listings: the core of a step's diff, the first attempt's bugs
# ----------------------------------------------------------------------------------------------

#: Lines a core diff leaves out: the consumers' zeroing of x past K, which the folded full diff shows.
_NOT_CORE = (("Past K the weights are zeros", "make_uint4(0, 0, 0, 0);"),)


def _region(text: str, start: str, stop: str) -> str:
    """The lines of ``text`` from the first that contains ``start`` to the first after it that contains ``stop``,
    without the lines of :data:`_NOT_CORE`."""
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if start in line)
    j = next(n for n in range(i, len(lines)) if stop in lines[n])
    kept, n = [], i
    while n <= j:
        cut = next((b for a, b in _NOT_CORE if a in lines[n]), None)
        if cut is None:
            kept.append(lines[n])
            n += 1
            continue
        n = next(e for e in range(n, j + 1) if cut in lines[e]) + 1
    return "\n".join(kept)


def w2a8_launch_listing():
    """Step 22's launch as a listing: x quantised by ``quantize_x``, then the matmul launched early (its call)."""
    from studylog import source
    from studylog.ternary import w2a8

    text = _region(source.source_of(w2a8._w2a8_call)[0], "def call()", "return z[0]")
    return source.show_source(text, title="step 22's launch")


def _probe_test(m: re.Match) -> str:
    """``BULK_PROBE == PROBE_X`` (or ``!=``, or W2A8_PROBE) as the default build reads it: the probe is PROBE_NONE."""
    return "true" if (m.group(2) == "NONE") == (m.group(1) == "==") else "false"


def without_instrumentation(text: str) -> str:
    """CUDA C++ ``text`` as the default build compiles it, for a listing: the probe builds' tests (``BULK_PROBE``,
    ``W2A8_PROBE``) read as PROBE_NONE and their branches resolved, the timeline's marks (``W2A8_START``,
    ``W2A8_AT``, ``W2A8_END``, its ``trace`` parameter, ``#if W2A8_TIMELINE`` blocks) gone. The kernel files keep
    both; the page says so once."""
    lines, skip = [], False
    for line in text.splitlines():
        code = line.strip()
        if code == "#if W2A8_TIMELINE":
            skip = True
        elif skip:
            skip = code != "#endif"
        elif not re.fullmatch(r"W2A8_(START|END);|W2A8_AT\(.*\);", code):
            line = line.replace(" W2A8_TRACE_PARAM", "")
            line = re.sub(r"\b(?:BULK|W2A8)_PROBE (==|!=) PROBE_(\w+)", _probe_test, line)
            lines.append(re.sub(r"\btrue && | && true\b", "", line) if "for (" in line else line)
    return "\n".join(_simplify(lines)) + "\n"


#: Each CUDA C++ step's core change, as (old step, new step, (start, stop) in the old kernel, (start, stop) in the
#: new one): the lines that carry the step's idea, the rest of its diff folded on the page.
CORE_REGIONS = {
    18: (17, ("float acc[2][RT][MT][4]", "group_mma<BF16, MT, RT>(acc, a, xv);"),
         ("consumer_barrier(warps);", "group_mma<BF16, MT, RT, false>(acc, a[cg], xv, magic);")),
    24: (23, ("int acc[4][RT][MT][4]", "});"), ("int acc[4][TILES][MT][4]", "w2a8_z(sum, __ldcg(&row_sum[m])")),
}


def core_diff(step: int):
    """The diff of a step's core change (:data:`CORE_REGIONS`): the two kernels' regions that carry the idea."""
    from studylog import source
    from studylog.ternary.steps import STEPS as _STEPS

    old, (a0, a1), (b0, b1) = CORE_REGIONS[step]
    text = lambda number: without_instrumentation(  # noqa: E731
        source.source_of(_STEPS[number - 1].source, _STEPS[number - 1].source_function)[0])
    import textwrap

    return source.show_diff(wrapped(textwrap.dedent(_region(text(old), a0, a1)), 110),
                            wrapped(textwrap.dedent(_region(text(step), b0, b1)), 110),
                            names=(f"step {old} (its main loop)", f"step {step} (the core of the change)"))


def wrapped(text: str, width: int = 105) -> str:
    """CUDA C++ ``text`` with each line longer than ``width`` broken after its outermost comma that fits (inside a
    call's or signature's parentheses: the rest aligned under the parenthesis; between declarators: indented), a
    trailing comment moved to its own line above, so that no line runs past a listing's frame. The same code,
    only its line breaks moved."""
    out = []
    for line in text.splitlines():
        code, sep, note = line.partition("  // ")
        if len(line) > width and sep and code.strip():  # a trailing comment goes on its own line, above
            out.append(" " * (len(line) - len(line.lstrip())) + "// " + note)
            line = code.rstrip()
        if len(line) > width and line.lstrip().startswith("// "):  # a long comment: its words on two lines
            lead = line[:len(line) - len(line.lstrip())] + "// "
            out += [lead + piece for piece in textwrap.wrap(line.lstrip()[3:], min(width, 100) - len(lead))]
            continue
        body = re.fullmatch(r"(\s*)(.*\)) \{ (return .*;) \}", line)
        if len(line) > width and body:  # a function on one line: its body on a line of its own
            out += [f"{body[1]}{body[2]} {{", f"{body[1]}    {body[3]}"]
            line = body[1] + "}"
        while len(line) > width and "//" not in line[:width]:
            closes, stack = {}, []  # the index of each bracket's match
            for i, ch in enumerate(line):
                if ch in "([":
                    stack.append(i)
                elif ch in ")]" and stack:
                    closes[stack.pop()] = i
            end = len(re.sub(r"(\s+const)?\s*[{;]?\s*$", "", line)) - 1  # the statement's or signature's end
            opened, cuts = [], []
            for i, ch in enumerate(line[:width]):
                if ch in "([":
                    opened.append(i)
                elif ch in ")]" and opened:
                    opened.pop()
                elif ch == "," and line[i + 1:i + 2] == " " and len(line) - i > 16:
                    # only where the bracket it sits in closes the line (a call's or signature's arguments)
                    declaration = re.match(r"\s*(const\s+)?(u32|u64|int|float|uint4|size_t|auto)\b", line)
                    if (declaration if not opened else closes.get(opened[-1], len(line)) >= end):
                        indent = opened[-1] + 1 if opened else len(line) - len(line.lstrip()) + 4
                        cuts.append((len(opened), -i, indent))
            ask, other = line.find(" ? "), line.rfind(" : ", 0, width)
            if not cuts and 0 < ask < other:  # a conditional expression: its second branch under the "?"
                cuts.append((0, -other, ask + 1))
            if not cuts:
                break
            depth, i, indent = min(cuts)
            out.append(line[:1 - i].rstrip())
            line = " " * indent + line[1 - i:].lstrip()
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _function_body(file: str, function: str) -> str:
    """A device function of ``file`` without the comment lines above it, long lines :func:`wrapped`."""
    from studylog import cuda
    from studylog.source import source_of

    lines = source_of(cuda.source_path(file), function)[0].splitlines()
    while lines and lines[0].lstrip().startswith("//"):
        lines.pop(0)
    return wrapped("\n".join(lines))


def group_mma_listing():
    """Step 15's core: ``group_mma``, one group of 256 weights a row on ``mma.sync`` (steps 15 to 21 call it)."""
    from studylog import cuda, source

    text = wrapped(source.source_of(cuda.source_path("ternary_common.cuh"), "group_mma")[0])
    return source.Code(text, "cuda", "group_mma: one group of 256 weights a row on mma.sync (steps 15 to 21)")


def w2a8_group_diff():
    """Step 22's core: ``group_mma`` (steps 15 to 21) against ``group_w2a8``, the int8 MMA with its one-AND
    decode, without the comments above them."""
    from studylog import source

    return source.show_diff(_function_body("ternary_common.cuh", "group_mma"),
                            _function_body("ternary_w2a8.cu", "group_w2a8"),
                            names=("step 21: group_mma", "step 22: group_w2a8 (the core of the change)"))


#: Each Triton step whose whole diff runs past 40 changed lines: (start, stop) markers in the step before's source
#: and in its own, the lines that carry the step's idea (:func:`triton_core`).
TRITON_CORE = {
    5: (("word = tl.arange(0, 16)", "acc_hi += "), ("kw_start, kw_end = k_slice", "acc += _field_to_float(high, f)")),
    7: (("for kw0 in range", "acc += _field_to_float(high, f)"), ("for kb0 in range", "acc += _field_to_float(fields, d)")),
    11: (("offs_w = tl.arange", "store_tile("), ("offs_w = tl.arange", "return acc")),
    14: (("scale = tl.load", "store_tile("), ("scale = tl.load", "tl.atomic_xchg(count_ptr")),
}


#: The step a Triton step builds on where it is not the step before (step 7 is step 5's program with other bytes).
TRITON_BASE = {7: 5}


def kernel_diff(old: int, new: int):
    """The diff from one Triton step's kernel to another's, without their Python launch (which only names the step
    and passes its knobs): the change the step makes, as the page shows it."""
    from studylog import source

    texts = [source.source_of(s.source, s.source_function)[0].split("\n# its launch:")[0]
             for s in (STEPS[old - 1], STEPS[new - 1])]
    return source.show_diff(*texts, names=(STEPS[old - 1].name, STEPS[new - 1].name))


def triton_core(step: int, old: Optional[int] = None):
    """The diff of a Triton step's core (:data:`TRITON_CORE`) from the step before (or ``old``): the page's one
    diff for a step whose whole diff is long."""
    from studylog import source

    old = old or TRITON_BASE.get(step, step - 1)
    regions = TRITON_CORE[step]
    texts = []
    for number, (start, stop) in zip((old, step), regions):
        s = STEPS[number - 1]
        texts.append(_region(source.source_of(s.source, s.source_function)[0], start, stop))
    return source.show_diff(*texts, names=(STEPS[old - 1].name, f"{STEPS[step - 1].name} (the core)"))


#: The lines of a CUDA C++ step that the page shows as a listing beside its diffs, as (file, (start, stop) markers,
#: ...): step 18's ring (the producer's fill and the consumers' take, on the two mbarriers of a stage, which
#: part 2's exercise 4 asks about) and step 22's four accumulators brought to one sum (part 2's exercise 2).
EXCERPTS = {
    18: ("ternary_ring.cuh", ("// The producer: chunk c into stage", "                      w + ((size_t)min(tile0"),
         ("    __device__ int take_from(", "return ng;")),
    22: ("ternary_w2a8.cu", ("// acc[p'] counts code p' four^p' times", "return (float)(sum - x_sum)")),
}


def excerpt(step: int):
    """The lines of :data:`EXCERPTS` for a CUDA C++ step, as one listing (``studylog.source.Code``): each region
    dedented, the closing braces of the blocks a region leaves open added, regions apart by a ``// ...`` line (the
    full source is folded beside it on the page)."""
    from studylog import cuda, source

    file, *regions = EXCERPTS[step]
    text = Path(cuda.source_path(file)).read_text()
    parts = []
    for start, stop in regions:
        lines = _region(text, start, stop).splitlines()
        opened = []  # the indent of each block still open at the region's end: its closing brace is added
        indent, previous = 0, ";"
        for line in lines:
            code = line.split("//")[0]
            if previous[-1:] not in ",(" and not line.lstrip().startswith("#"):  # a statement's first line
                indent = len(line) - len(line.lstrip())
            previous = code.rstrip() or previous
            for ch in code:
                if ch == "{":
                    opened.append(indent)
                elif ch == "}" and opened:
                    opened.pop()
        lines += [" " * indent + "}" for indent in reversed(opened)]
        # dedent by the code's common indent; preprocessor lines stay at column 0
        cut = min(len(line) - len(line.lstrip()) for line in lines if line.strip() and not line.startswith("#"))
        parts.append("\n".join(line if line.startswith("#") else line[cut:] for line in lines))
    titles = {18: "step 18: the ring's fill (the producer) and take (a consumer warp), from ternary_ring.cuh",
              22: "step 22: the four accumulators' sum, from ternary_w2a8.cu"}
    return source.Code(wrapped("\n// ...\n".join(parts)), "cuda", titles[step])


#: The first attempt's bugs, each marked on the line that carries it: (a piece of that line, the mark).
FIRST_ATTEMPT_BUGS = (
    ("def first_attempt_kernel(", "W is (K, N) here, the transpose of an nn.Linear weight"),
    ("offs_n = (pid", "BUG: a modulo wraps the outputs instead of masking them"),
    ("x_ptrs = x_ptr + offs_m", "BUG: offs_m not times stride_xm (right only for a contiguous x)"),
    ("elements_to_sum =", "the good idea: a sign choice, no multiply"),
    ("z = accumulator.to(tl.float16)", "BUG: a float32 sum stored as float16"),
)


def first_attempt_excerpt() -> str:
    """The first attempt's kernel (``lab/ternary/first_attempt.py``) without its earlier-version branch and comments,
    its bugs marked in comments; its launch (2 x 2 blocks) in a last comment."""
    import inspect
    import textwrap

    fn = first_attempt().first_attempt_kernel
    text = textwrap.dedent(inspect.getsource(getattr(fn, "fn", fn)))
    out, skip = [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or stripped.startswith("@"):
            continue
        if stripped == "if X_ALONG_N:":  # the earlier version's branch: keep the line that was run
            skip = True
            continue
        if skip and stripped == "else:":
            continue
        if skip and stripped.startswith("x = tl.load"):
            if "[None, :]" in stripped:
                continue
            line, skip = line[4:], False
        mark = next((m for piece, m in FIRST_ATTEMPT_BUGS if piece in line), None)
        if mark and len(f"{line}  # <- {mark}") > 100:  # a comment line above, so no line runs past 100 characters
            out.append(f"{line[:len(line) - len(line.lstrip())]}# {mark}:")
            mark = None
        out.append(f"{line}  # <- {mark}" if mark else line)
    out.append("# launched with BLOCK_SIZE_M = BLOCK_SIZE_N = 2  # <- BUG: 2 x 2 blocks, almost every lane idle")
    return "\n".join(out).replace(", X_ALONG_N: tl.constexpr", "")


# ----------------------------------------------------------------------------------------------
# Step 23: where x is quantised (the designs beside the default)
# ----------------------------------------------------------------------------------------------

#: The places to quantise x (step 22's, then step 23's) and what each does.
W2A8_PLACES = (("staged", "the copy engine brings the block's rows of bf16 x first; the consumers quantise them in "
                "shared memory while the weights stream in behind"),
               ("every block", "the consumers quantise the block's rows of x from global memory; the producer "
                "waits for x before it asks for more than one stage"),
               ("separate", "a kernel of its own (quantize_x) first; the matmul, launched early, loads its slice "
                "of int8 x from L2"))


def _default_rows(place: str, n: int, k: int, sms: int) -> str:
    """The rows of x (1 to 16) for which ``place`` is step 23's default (``w2a8_default_quantize``), as "2 to 8"."""
    from studylog.ternary.w2a8 import w2a8_default_quantize

    ms = [m for m in range(1, 17) if w2a8_default_quantize(m, n, k, sms=sms) == place]
    if not ms:
        return "none"
    return str(ms[0]) if len(ms) == 1 else f"{ms[0]} to {ms[-1]}"


def w2a8_places_table(results, shape: str = MAIN, rows_of_x=(1, 16)) -> str:
    """Markdown, GPU clock, µs: the W2A8 kernel at each place it can quantise x, at ``shape`` and each of
    ``rows_of_x`` (the default place's time is step 23's row, the others' their ``W2A8_PLACE_SERIES`` rows), bold where it is the
    default; "–" where a place is not run at that case."""
    from studylog.ternary.w2a8 import w2a8_default_quantize

    if results is None:
        return PENDING
    n, k = (int(v) for v in shape.split("x"))
    sms = device(results).get("sm_count", 132)
    head = " | ".join(f"M = {m} (µs)" for m in rows_of_x)
    lines = [f"| x quantised | how | step 23's default at M = | {head} |", "|---|---|---|" + "---|" * len(rows_of_x)]
    for place, how in W2A8_PLACES:
        cells = []
        for m in rows_of_x:
            default = w2a8_default_quantize(m, n, k, sms=sms) == place
            t = us(results, SERIES[23] if default else W2A8_PLACE_SERIES[place], shape, m)
            cells.append("–" if t is None else f"**{t:.1f}**" if default else f"{t:.1f}")
        lines.append(f"| {place} | {how} | {_default_rows(place, n, k, sms)} | " + " | ".join(cells) + " |")
    return _with_legend("\n".join(lines))


def widest_spread(results, series=W2A8_SERIES, m: int = 16) -> Optional[dict]:
    """Of the fastest of ``series`` at each shape and ``m`` (the kernel a bar of the peers figure divides by), the
    one whose repetitions spread widest relative to its median: its shape, series and median and max (µs). None
    where no row has a spread."""
    rows = []
    for shape in dict.fromkeys(r["params"]["shape"] for r in on_gpu_clock(results).select(CUBLAS, m=m)):
        row, name = fastest(results, list(series), shape=shape, m=m)
        if row is not None and "spread_ms" in row:
            rows.append((row["spread_ms"][2] / row["spread_ms"][0], shape, name, row["spread_ms"]))
    if not rows:
        return None
    _, shape, name, (_, median, hi) = max(rows)
    return {"shape": shape, "series": name, "median_us": median * 1e3, "max_us": hi * 1e3}


# ----------------------------------------------------------------------------------------------
# GemLite's float64 check
# ----------------------------------------------------------------------------------------------

def gemlite_check(results, shape: str = MAIN) -> Optional[dict]:
    """GemLite's float64 check at one row of x (the benchmark's ``gemlite_w2 within bf16 rounding`` checks): the
    tolerance, its error at ``shape``, the shapes where it fails, the worst error and its shape, and how many
    partial sums its one-row kernel adds into its bf16 output at ``shape`` (GemLite's GEMV_REVSPLITK: grid.y =
    K / (2 BLOCK_SIZE_K) programs a column, each adding its partial sum by an atomic add in the output's dtype,
    bf16 on Hopper; BLOCK_SIZE_K from the config its autotuner chose, the row's ``config``). None without the
    checks."""
    if results is None:
        return None
    checks = [c for c in results.data["checks"] if c["name"].startswith("gemlite_w2 within")
              and c["params"].get("m") == 1]
    at = [c for c in checks if c["params"]["shape"] == shape]
    if not at:
        return None
    worst = max(checks, key=lambda c: c["relative_error"])
    row = gpu_row(results, GEMLITE, shape, 1)
    block_k = re.search(r"BLOCK_SIZE_K: (\d+)", (row or {}).get("config") or "")
    k = int(shape.split("x")[1])
    return {"tolerance": at[0]["tolerance"], "error": at[0]["relative_error"], "passed": at[0]["passed"],
            "failed": [c["params"]["shape"] for c in checks if not c["passed"]],
            "passed_at": [c["params"]["shape"] for c in checks if c["passed"]],
            "worst": worst["relative_error"], "worst_shape": worst["params"]["shape"],
            "partials": None if block_k is None else -(-k // (2 * int(block_k[1])))}


def shape_words(shape: str) -> str:
    """A shape "NxK" written N × K, the transpose of the main shape marked so."""
    n, k = shape.split("x")
    return f"{n} × {k}" + (" (transposed)" if f"{k}x{n}" == MAIN else "")


def gemlite_table(results, step: int = 14) -> Optional[str]:
    """Markdown: GemLite's 2-bit kernel against step ``step`` at one row of x, a row for each shape of its float64
    check (:func:`gemlite_check`): where its output passes, in order of GemLite's time over ours (above 1.00×, ours
    is the faster), GemLite's µs, ours, the ratio; then where it fails, its time as measured, ours, and in place of
    a ratio ✗ with its error against the tolerance. None without the checks."""
    gem = gemlite_check(results)
    if gem is None:
        return None
    checks = {c["params"]["shape"]: c for c in results.data["checks"]
              if c["name"].startswith("gemlite_w2 within") and c["params"].get("m") == 1}
    rows = [(s, shown(us(results, GEMLITE, s, 1)), shown(us(results, SERIES[step], s, 1))) for s in gem["passed_at"]]
    rows.sort(key=lambda r: (ratio(r[1], r[2]) or 0.0))  # the ratios of the times as printed (:func:`shown`)
    lines = [f"| N × K (M = 1) | GemLite (µs) | step {step} (µs) | GemLite / step {step} |", "|---|---|---|---|"]
    lines += [f"| {shape_words(s)} | {fmt(g, '.2f')} | {fmt(o, '.2f')} | {fmt(ratio(g, o), '.2f', '×')} |"
              for s, g, o in rows]
    lines += [f"| {shape_words(s)} | {fmt(us(results, GEMLITE, s, 1), '.2f')} | "
              f"{fmt(us(results, SERIES[step], s, 1), '.2f')} | {FAILS} error {checks[s]['relative_error']:.2%}, "
              f"{checks[s]['tolerance']:.2%} allowed |" for s in gem["failed"]]
    return "\n".join(lines)


def place_times(results, shapes) -> dict[str, dict]:
    """Step 23 at one row of x at each of ``shapes`` (N x K), with x staged and quantised in every block: the
    default place (:func:`studylog.ternary.w2a8.w2a8_default_quantize` on the card's SMs, whose time is step 23's
    series) and the other (its own series), in µs, with ``gain``: staged's time over every block's (above 1, every
    block is the faster). Shapes without both times are left out."""
    from studylog.ternary import w2a8 as W

    sms = device(results).get("sm_count", 132)
    out = {}
    for s in shapes:
        n, k = map(int, s.split("x"))
        default = W.w2a8_default_quantize(1, n, k, sms)
        if default not in ("staged", "every block"):
            continue
        other = "every block" if default == "staged" else "staged"
        times = {default: us(results, SERIES[23], s, 1), other: us(results, W2A8_PLACE_SERIES[other], s, 1)}
        if all(times.values()):
            out[s] = {"default": default, **times, "gain": times["staged"] / times["every block"]}
    return out


def place_waves(results, shapes) -> dict[str, dict]:
    """:func:`place_times` with, for each place's launch (:func:`studylog.ternary.w2a8.w2a8_config`), its blocks,
    the blocks one SM holds (the shared memory of the place's x beside the ring's stages, and registers) and the
    waves they run in on the card's SMs."""
    import triton

    from studylog.ternary import w2a8 as W

    sms = device(results).get("sm_count", 132)
    out = {}
    for s, row in place_times(results, shapes).items():
        n, k = map(int, s.split("x"))
        groups = triton.cdiv(k, 256)
        for place in ("staged", "every block"):
            cfg = W.w2a8_config(1, n, k, sms, quantize=place)
            per_sm = W.w2a8_blocks_per_sm(cfg, 1, groups, staged=place == "staged")
            blocks = W.w2a8_grid(1, n, k, cfg, fused=True)[1][0]
            row[place + " launch"] = {"row_tiles": cfg.row_tiles, "warps": cfg.warps, "x_bytes": k * (2 if place == "staged" else 1),
                                      "stage_bytes": cfg.stages * cfg.stage_bytes, "per_sm": per_sm, "blocks": blocks,
                                      "waves": W.w2a8_waves(1, n, k, place, sms)}
        out[s] = row
    return out


#: Part 1's steps on step 6's line, each against the step before it, and the cases the benchmark times them at.
LATE_STEPS = ((10, 6), (11, 10), (12, 11), (13, 12), (14, 13))
#: The BitNet b1.58 2B4T shape (its MLP's down projection) where the benchmark times steps 4 to 14 at one row of x.
BITNET_STEPS = "2560x6912"
LATE_CASES = ((MAIN, 1), (BITNET_STEPS, 1), (MAIN, 16))


def _case_words(case) -> str:
    shape, m = case
    return f"{shape_words(shape)}, " + ("one row" if m == 1 else f"{m} rows")


def pays_table(results, steps=LATE_STEPS, cases=LATE_CASES) -> str:
    """Markdown: steps 10 to 14, each one's × previous (the step before it over it, > 1 pays) at every case the
    benchmark times it, so that the table says which change pays where; "–" where a time is missing."""
    lines = ["| step | the change | " + " | ".join(_case_words(c) for c in cases) + " |",
             "|---|---|" + "---|" * len(cases)]
    for new, old in steps:
        change = next(c for n, m, p, c in PART1_ROWS if n == new and m == 1).split(" (")[0]
        rs = [ratio(shown(us(results, SERIES[old], *c)), shown(us(results, SERIES[new], *c))) for c in cases]
        cells = [fmt(r, ".2f", "×") + (" (tie)" if is_tie(r) else "") for r in rs]
        lines.append(f"| {new} | {change} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pays_words(results, steps=LATE_STEPS, cases=LATE_CASES) -> str:
    """:func:`pays_table` in a sentence: the steps that pay well at every case (× previous of 1.10 or more at each),
    the most the others gain, and where each loses (× previous under 0.97 at two places: nearer 1.00 is a tie)."""
    f = {new: {c: ratio(shown(us(results, SERIES[old], *c)), shown(us(results, SERIES[new], *c))) for c in cases}
         for new, old in steps}  # as the steps tables print them (:func:`shown`)
    if any(v is None for row in f.values() for v in row.values()):
        return ""
    big = [n for n, row in f.items() if min(row.values()) >= 1.1]
    rest = [n for n in f if n not in big]
    lose = {}
    for n in rest:
        for c in cases:
            if round(f[n][c], 2) < 1 and not is_tie(f[n][c]):
                lose.setdefault(c, []).append(n)
    words = lambda ns: ("steps " + and_list(str(n) for n in ns)) if len(ns) > 1 else f"step {ns[0]}"  # noqa: E731
    head = "; ".join(f"{words([n])} pays at every case ({min(f[n].values()):.2f}× to {max(f[n].values()):.2f}×)"
                     for n in big)
    most = max(max(f[n].values()) for n in rest) if rest else None
    tail = ("" if most is None else f"; the others at most {most:.2f}×"
            + ("" if not lose else "; " + ", ".join(
                f"{words(ns)} {'lose' if len(ns) > 1 else 'loses'} at {shape_words(c[0])} "
                f"({'one row' if c[1] == 1 else f'{c[1]} rows'})" for c, ns in lose.items())))
    return (head + tail).lstrip("; ")


def verdict(results, new: int, old: int, cases=((MAIN, 16), (MAIN, 1))) -> str:
    """Whether step ``new`` pays over step ``old`` at each of ``cases`` (its × previous rounded to two places
    against 1.00), in words for the page: "it pays at both", "it loses at 4096 × 14336, M = 1 and pays at ...";
    "" where a time is missing."""
    factors = {case: ratio(us(results, SERIES[old], *case), us(results, SERIES[new], *case)) for case in cases}
    if any(f is None for f in factors.values()):
        return ""
    words = lambda cs: and_list(f"{shape_words(s)}, M = {m}" for s, m in cs)  # noqa: E731
    losing = [c for c, f in factors.items() if round(f, 2) < 1]
    paying = [c for c in cases if c not in losing]
    if not losing:
        return "it pays at " + ("both cases" if len(cases) == 2 else words(paying))
    if not paying:
        return "it loses at " + ("both cases" if len(cases) == 2 else words(losing))
    return f"it loses at {words(losing)} and pays at {words(paying)}"


# ----------------------------------------------------------------------------------------------
# The device code a CUDA C++ step turns on: its kernel with every choice of its launch read as a constant
# ----------------------------------------------------------------------------------------------

#: Where each CUDA C++ step's code lives: (file, kernel, its compile-time knobs, where x is quantised or None).
_DEVICE = {**{n: ("ternary_mma.cu", "cuda_mma_kernel", {"X_SMEM": n == 17}) for n in (15, 16, 17)},
           **{n: ("ternary_bulk.cu", "tma_kernel", {"WARP_COPIES": n < 20, "MAGIC_REG": n == 21})
              for n in (18, 19, 20, 21)},
           22: ("ternary_w2a8.cu", "w2a8_kernel", {}), 23: ("ternary_w2a8.cu", "w2a8_kernel", {}),
           **{n: ("ternary_w2a8.cu", "w2a8_tiles_kernel", {"X_TMA": n == 25}) for n in (24, 25)}}


def split_k(step: int, m: int = 1, shape: str = MAIN, sms: int = 132) -> bool:
    """Whether CUDA C++ step ``step`` (15 to 21) splits K across blocks (``gridDim.y > 1``) at its default launch
    for ``shape`` and ``m`` rows of x: step 15 keeps K whole, 16 to 18 take :func:`cuda_mma_config`'s slices, 19 to
    21 :func:`tma_config`'s."""
    from studylog.ternary.cuda_steps import cuda_mma_config, tma_config

    n, k = (int(v) for v in shape.split("x"))
    if step == 15:
        return False
    return (cuda_mma_config if step <= 18 else tma_config)(m, n, k, sms=sms).slices > 1


def quant_place(step: int, m: int = 1, shape: str = MAIN, sms: int = 132) -> str:
    """Where step 22 or 23 quantises x at its default launch: step 22 "separate"; step 23 its default there."""
    from studylog.ternary.w2a8 import w2a8_default_quantize

    n, k = (int(v) for v in shape.split("x"))
    return "separate" if step == 22 else w2a8_default_quantize(m, n, k, sms=sms)


_QUANT = {"separate": 0, "every block": 1, "staged": 2}


def _statement_end(lines: list[str], i: int) -> int:
    """The last line of the statement that starts on line ``i`` (a block's closing brace, or the line where its
    brackets balance and it ends with ';')."""
    depth = 0
    for j in range(i, len(lines)):
        code = lines[j].split("//")[0]
        depth += code.count("(") + code.count("{") + code.count("[") - code.count(")") - code.count("}") - code.count("]")
        if depth <= 0 and code.rstrip().endswith((";", "}")):
            return j
    return len(lines) - 1


def _constant(cond: str):
    """A condition with literal ``true``/``false`` in it reduced: True or False where that decides it, else the
    condition without its ``true &&`` terms (``!true`` reads false)."""
    cond = re.sub(r"!\s*true\b", "false", re.sub(r"!\s*false\b", "true", cond.strip()))
    if "||" in cond and "&&" not in cond:
        terms = [t.strip() for t in cond.split("||")]
        return True if "true" in terms else (False if all(t == "false" for t in terms) else cond)
    if "||" not in cond:
        terms = [t.strip() for t in cond.split("&&")]
        if "false" in terms:
            return False
        rest = [t for t in terms if t != "true"]
        return True if not rest else " && ".join(rest)
    return cond


def _ternary(line: str) -> str:
    """``line`` with each ``true ? a : b`` or ``false ? a : b`` replaced by the value it takes."""
    while True:
        m = re.search(r"\b(true|false) \? ", line)
        if not m:
            return line
        depth, j, colon = 0, m.end(), None
        while j < len(line):
            ch = line[j]
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and line.startswith(" : ", j) and colon is None:
                colon = j
                j += 2
            elif depth == 0 and ch in ",;" and colon is not None:
                break
            j += 1
        if colon is None:
            return line
        taken = line[m.end():colon] if m.group(1) == "true" else line[colon + 3:j]
        line = line[:m.start()] + taken + line[j:]


def _simplify(lines: list[str]) -> list[str]:
    """``lines`` with every ``if``, ``if constexpr`` and ``else if`` whose condition is a constant replaced by the
    branch it takes (dedented), ``true && c`` read as ``c`` and ``c ? a : b`` on a constant as the value taken."""
    out, i = [], 0
    while i < len(lines):
        line = _ternary(lines[i])
        if line.lstrip().startswith("static_assert(") and re.search(r"\b(true|false)\b", line):
            i += 1
            continue
        m = re.fullmatch(r"(\s*)(\} else )?if (?:constexpr )?\((.+?)\)( \{)?\s*(//.*)?", line)
        one = None if m else re.fullmatch(r"(\s*)if \(((?:[^()]|\([^()]*\))+)\) (\S.*;)\s*(//.*)?", line)
        value = _constant(m.group(3)) if m else _constant(one.group(2)) if one else None
        if isinstance(value, str):  # a condition with literal terms: the terms go, the test stays
            cond = m.group(3) if m else one.group(2)
            line = line.replace(f"({cond})", f"({value})", 1)
            value = None
        if value is None:
            out.append(line)
            i += 1
            continue
        if one:  # "if (constant) statement;" on one line
            if value:
                out.append(one.group(1) + one.group(3) + (f"  {one.group(4)}" if one.group(4) else ""))
            i += 1
            continue
        indent, chained, _, brace, _ = m.groups()
        if brace:  # a block: its body to the closing brace at the same indent, then perhaps an else block
            close = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(indent + "}"))
            body = lines[i + 1:close]
            other, end = [], close
            if re.fullmatch(re.escape(indent) + r"\} else \{\s*(//.*)?", lines[close]):
                end = next(j for j in range(close + 1, len(lines)) if lines[j] == indent + "}")
                other = lines[close + 1:end]
            elif chained:  # "} else if (constant) {": only that link of the chain goes
                out += (["".join((indent, "} else {"))] + _simplify(body)) if value else []
                i = close
                continue
        else:  # one statement, perhaps followed by "else" and one statement
            close = _statement_end(lines, i + 1)
            body, other, end = lines[i + 1:close + 1], [], close
            if close + 1 < len(lines) and lines[close + 1].strip() == "else":
                end = _statement_end(lines, close + 2)
                other = lines[close + 2:end + 1]
        taken = body if value else other
        out += _simplify([t[4:] if t.startswith(indent + "    ") else t for t in taken])
        i = end + 1
    return out


def _read_as(lines: list[str], values: dict[str, str]) -> list[str]:
    """``lines`` with each name of ``values`` read as its value outside comments, a declaration of one dropped."""
    out = []
    for line in lines:
        code, sep, comment = line.partition("//")
        if any(re.search(rf"\b(const|constexpr) (bool|int) {re.escape(name)} =", code) for name in values):
            continue
        if not line.lstrip().startswith(("template <", "//")):
            for name, value in values.items():
                code = re.sub(rf"(?<![\w.]){re.escape(name)}(?![\w(])", value, code)
        out.append(code + sep + comment)
    return out


def _rejoined(lines: list[str]) -> list[str]:
    """``lines`` with an assignment broken after its ``=`` put back on one line where it now fits in 120 characters
    (a resolved condition leaves its value alone on the next line)."""
    out = []
    for line in lines:
        if out and out[-1].endswith(" =") and len(out[-1]) + len(line.strip()) < 120:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


def device_source(step: int, helpers: bool = True) -> str:
    """The device code CUDA C++ step ``step`` runs at 4096 × 14336 and one row of x: its kernel with its
    compile-time knobs and the choices of its launch (K split across blocks or not, where x is quantised) read as
    constants and every branch on them resolved; with ``helpers``, the device functions whose use changes from one
    step to the next (the ring's fill, the decode, the split's sum) beside it."""
    from studylog.source import source_of
    from studylog.source import resolve_constexpr

    file, kernel, knobs = _DEVICE[step]
    values = {name: "true" if v else "false" for name, v in knobs.items()}
    if step <= 21:
        split = "true" if split_k(step) else "false"
        values.update({"gridDim.y > 1": split, "split": split})
    if step in (22, 23):
        q = _QUANT[quant_place(step)]
        values.update({"QUANT == QUANT_SEPARATE": str(q == 0).lower(), "QUANT == QUANT_EVERY_BLOCK": str(q == 1).lower(),
                       "QUANT == QUANT_STAGED": str(q == 2).lower(), "STAGED": str(q == 2).lower(),
                       "FUSED": str(q > 0).lower()})
    parts = []
    if helpers and 18 <= step <= 21:
        parts.append(source_of(file, "fill_per_warp")[0] if step < 20 else
                     textwrap.dedent(source_of("ternary_ring.cuh", "fill")[0]))
    if helpers and 15 <= step <= 21:
        magic = {"MAGIC_REG": "true" if step == 21 else "false"}
        group = source_of("ternary_common.cuh", "group_mma")[0]
        parts.append(source_of("ternary_common.cuh", "decode_pair_reg" if step == 21 else "decode_pair")[0])
        parts.append("\n".join(_simplify(_read_as(group.splitlines(), magic))))
    text = without_instrumentation(source_of(file, kernel)[0])
    lines = resolve_constexpr(text.splitlines(), knobs, read_values=True)
    lines = _simplify(_read_as(lines, {k: v for k, v in values.items() if " " in k}))
    lines = _simplify(_read_as(lines, {k: v for k, v in values.items() if " " not in k}))
    parts.append("\n".join(_rejoined(lines)))
    if helpers and step <= 21 and values["split"] == "true":
        finish = source_of("ternary_common.cuh", "finish_split")[0].splitlines()
        parts.append("\n".join(line for line in finish if not line.startswith("//")))  # its comment: an old numbering
    return "\n\n".join(p.strip("\n") for p in parts) + "\n"


def device_diff(step: int, helpers: bool = True, region: Optional[tuple[str, str]] = None):
    """The diff of :func:`device_source` from step ``step - 1`` to step ``step``: the device code the step's change
    turns on and off, no Python launcher; with ``region`` (start, stop), only the lines of both from the first that
    contains ``start`` to the first after it that contains ``stop`` (:data:`DEVICE_CORE`)."""
    from studylog import source

    texts = [device_source(n, helpers) for n in (step - 1, step)]
    if region is not None:
        texts = [textwrap.dedent(_region(t, *region)) for t in texts]
    texts = [wrapped(t, 110) for t in texts]  # no line past a listing's frame
    # the step's heading sits above the diff: its caption names the steps only
    what = lambda n: f"step {n}" + ("" if region is None else " (the core)")  # noqa: E731
    return source.show_diff(*texts, names=(what(step - 1), what(step)), context=1)  # one line of context: short


#: The lines of a long device-code diff the page shows open: step 23's producer copying x and its consumers
#: quantising it (the rest of its diff reads the row's sum and scale from shared memory, not from quantize_x).
DEVICE_CORE = {23: ("if (warp == warps) {", "consumer_barrier(warps);")}


def place_us(results, place: str, shape: str = MAIN, m: int = 1) -> Optional[float]:
    """The W2A8 kernel's GPU-clock time (µs) with x quantised at ``place`` ("separate" is step 22; step 23's
    default place is step 23's own row, the others their ``W2A8_PLACE_SERIES`` rows)."""
    from studylog.ternary.w2a8 import w2a8_default_quantize

    n, k = (int(v) for v in shape.split("x"))
    default = w2a8_default_quantize(m, n, k, sms=device(results).get("sm_count", 132)) == place
    return us(results, SERIES[23] if default and place != "separate" else W2A8_PLACE_SERIES[place], shape, m)
