"""What notebook 04 reads from a results file, in one place: each step's time against the one before it and
the floor, the result against torch, where the time goes, the accuracy of every series, the table of what did
not help (from ``lab/ctc``), the answer to the blog post's question, and the numbers its prose quotes (glued
with myst-nb).

Every function takes a :class:`studylog.plotting.Results` and reads series by the names
:mod:`studylog.ctc.report` writes (``CHAPTER.steps``, ``CHAPTER.baselines``); where a file predates a series,
the table says so, and a prose number reads ``pending``, instead of failing.
"""

from __future__ import annotations

import statistics
from typing import Iterable

from book.common import PENDING, floor_ms, us
from book.ctc.figures import best_torch_name, clock_words, grain_sweep
from studylog import paths
from studylog.ctc import CHAPTER
from studylog.ctc.fused import BLOCK_GRAINS, DEFAULT_BLOCK_GRAIN, DEFAULT_RECURSION, RECURSION_OPTIONS
from studylog.ctc.reference import FAR_GRAD, FAR_LOSS
from studylog.ctc.report import BENCH_A, BENCH_N, BENCH_T, LESSON_N
from studylog.ctc.results import clock_of, entry_series
from studylog.plotting import Results, load_lab
from studylog.tails import CTC_FLOOR_SERIES

#: The experiment file of ``lab/ctc`` (recursion options, step 14's other grain, the blocked layout).
OPTIONS_FILE = "options_and_layouts"
#: The step whose recursion options were compared (an experiment: lab/ctc).
OPTIONS_STEP = 13
#: Rows of the comparison on the stress set: ours in probability space, ours in log space, torch's calls.
CUDNN_SET = "cudnn-set "
#: Outcome counts of a row (see :func:`studylog.ctc.reference.outcomes`).
OUTCOMES = ("utterances", "impossible", "infinite", "nan", "finite_wrong", "far", "right")


def bank_ways(grain: int, blocked: bool, threads: int = 128) -> int:
    """Shared-memory bank conflicts of one warp-wide access to the rows of steps 4 to 6 (a model).

    Each of the 32 lanes reads its i-th position (the worst i is taken); 32 banks of 4 bytes. The
    strided layout (s = tid + i * threads) puts neighbouring lanes on neighbouring words: 1-way
    for every grain. The blocked layout (s = tid * VT + i) has a stride of VT words: gcd(VT, 32)
    lanes share a bank, so even grains conflict and odd ones do not (ModernGPU's advice).
    """
    worst = 1
    for i in range(grain):
        words = [(lane * grain + i) if blocked else (lane + i * threads) for lane in range(32)]
        banks = [w % 32 for w in words]
        worst = max(worst, max(banks.count(b) for b in set(banks)))
    return worst

def caption(results) -> str:
    """Where and when a results file was measured (GPU, date, versions, the copy bandwidth of that run)."""
    v = results.data["versions"]
    return (f"Measured on {results.gpu} on {results.date} (torch {v['torch']}, triton {v['triton']}; copy bandwidth "
            f"{results.data['ceilings']['copy_bandwidth_gbs']:,.0f} GB/s in the same run).")


def _row(results, series: str, **params) -> dict | None:
    rows = results.select(series, **params)
    return rows[0] if len(rows) == 1 else None


def _ms(results, series: str, **params) -> float | None:
    row = _row(results, series, **params)
    return None if row is None else row["ms"]


def _with_spread(row: dict | None) -> str:
    """``median (min–max)`` in µs where the row has the repetitions' spread."""
    if row is None:
        return "–"
    if row.get("spread_ms"):
        lo, mid, hi = row["spread_ms"]
        return f"{us(mid)} ({us(lo)}–{us(hi)})"
    return us(row["ms"])


def _ratios(results, before: str, after: str, points: Iterable[tuple[int, int]]) -> list[float]:
    """``before / after`` (above 1: ``after`` is faster) at the (A, N) points where both were measured."""
    out = []
    for A, N in points:
        b, a = _ms(results, before, T=BENCH_T, A=A, N=N), _ms(results, after, T=BENCH_T, A=A, N=N)
        if b is not None and a is not None:
            out.append(b / a)
    return out


def _lesson_points(A: int | None = None) -> list[tuple[int, int]]:
    return [(a, n) for a in BENCH_A for n in LESSON_N if A in (None, a)]


def _all_points(A: int | None = None, ns: Iterable[int] = BENCH_N) -> list[tuple[int, int]]:
    return [(a, n) for a in BENCH_A for n in ns if A in (None, a)]


def _times(values: list[float]) -> str:
    """``1.1× to 1.9×`` (or one value)."""
    if not values:
        return PENDING
    lo, hi = min(values), max(values)
    return _x(lo) if _x(lo) == _x(hi) else f"{_x(lo)} to {_x(hi)}"


def _x(ratio: float) -> str:
    return f"{ratio:.2f}×" if ratio < 3 else f"{ratio:.1f}×"


def _signed(fraction: float) -> str:
    value = round(fraction * 100)
    return f"{value:+d}%" if value else "±0%"


def _percent(value: float) -> str:
    return f"{value * 100:.0f}%"


def _largest_change(values: list[float]) -> str:
    """The largest change of time, in percent (one decimal), of a list of ratios."""
    return f"{max(abs(v - 1) for v in values) * 100:.1f}%" if values else PENDING


# --------------------------------------------------------------------------------------
# Tables (Markdown, printed by the notebook)
# --------------------------------------------------------------------------------------

#: The step each step is compared with in its table: the main line's row above it (step 4 against step 1, steps 2
#: and 3 being tried and dropped; step 7 against step 5, not the counterexample).
PREVIOUS = {4: 1, 7: 5}
#: The course's tie rule: a ratio from 0.97× to 1.03× as printed (two decimals) is a tie.
TIE = (0.97, 1.03)


def tie(ratio: float) -> bool:
    """Whether ``ratio``, printed at two decimals, is a tie (:data:`TIE`)."""
    return TIE[0] <= round(ratio, 2) <= TIE[1]


def step_table(results, number: int) -> str:
    """Step ``number`` at the batch sizes where every step was timed: its time (median, min–max of the
    repetitions where the file has them), the step it builds on, the ratio, the floor and how far above it."""
    step = CHAPTER.step(number)
    before = CHAPTER.step(PREVIOUS.get(number, number - 1)) if number > 1 else None
    if not results.select(step.series, T=BENCH_T):
        return f"{step.name}: {PENDING} (the results file has no rows of it)."
    head = f"| A | N | {step.name} (µs) |"
    sep = "|---|---|---|"
    if before is not None:
        head += f" {before.name} (µs) | speedup over {before.series} |"
        sep += "---|---|"
    lines = [head + " floor (µs) | time / floor |", sep + "---|---|"]
    for A, N in _lesson_points():
        row = _row(results, step.series, T=BENCH_T, A=A, N=N)
        if row is None:
            continue
        cells = [str(A), str(N), _with_spread(row)]
        if before is not None:
            prev = _ms(results, before.series, T=BENCH_T, A=A, N=N)
            cells += [us(prev), "–" if prev is None else f"{prev / row['ms']:.2f}×"]
        floor = row.get("floor_ms")
        cells += [us(floor, 2), "–" if not floor else f"{row['ms'] / floor:,.0f}×"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\nClock: {clock_words(clock_of(results, step.series))}."


def results_table(results) -> str:
    """The chapter's result, the entry point ``ctc_loss`` (the last step where a file predates it), against
    torch's two calls at every point, with the speedup over the faster one timed on the same clock
    (``torch-best``) and the distance to the case's one floor (:func:`case_floor`, the table of steps' too)."""
    final = "ctc_loss" if results.select("ctc_loss", T=BENCH_T) else CHAPTER.final.series
    name = "`ctc_loss`" if final == "ctc_loss" else CHAPTER.final.name
    if not results.select(final, T=BENCH_T):
        return f"{name}: {PENDING}."
    lines = [f"| A | N | torch-cuDNN (µs) | torch-native (µs) | {name} (µs) | host per call (µs) | "
             f"speedup over {best_torch_name(results)} | floor (µs) | "
             "time / floor |",
             "|---|---|---|---|---|---|---|---|---|"]
    for A, N in _all_points():
        row = _row(results, final, T=BENCH_T, A=A, N=N)
        if row is None:
            continue
        best = _row(results, "torch-best", T=BENCH_T, A=A, N=N)
        speedup = "–"
        if best is not None and clock_of(results, "torch-best") == clock_of(results, final):
            speedup = f"{best['ms'] / row['ms']:.2f}×"
            if best.get("spread_ms") and row.get("spread_ms"):
                speedup += f" ({best['spread_ms'][0] / row['spread_ms'][2]:.2f}–" \
                           f"{best['spread_ms'][2] / row['spread_ms'][0]:.2f})"
        floor, kind = case_floor(results, A, N)
        host = "–" if row.get("host_ms") is None else us(row["host_ms"])
        if row.get("host_ms") is not None and row["host_ms"] > row["ms"]:
            host = f"**{host}**"
        lines.append(f"| {A:,} | {N} | {_with_spread(_row(results, 'torch-cuDNN', T=BENCH_T, A=A, N=N))} | "
                     f"{_with_spread(_row(results, 'torch-native', T=BENCH_T, A=A, N=N))} | {_with_spread(row)} | "
                     f"{host} | {speedup} | {floor:,.1f} ({FLOOR_KIND[kind]}) | {row['ms'] * 1e3 / floor:,.1f}× |")
    clocks = {s: clock_words(clock_of(results, s)) for s in ("torch-cuDNN", "torch-native", final)}
    return ("\n".join(lines) + "\n\nClocks: " + ", ".join(f"{s}: {c}" for s, c in clocks.items()) + ". "
            + torch_best_words(results) + " " + host_words(name))


def host_words(name: str = "`ctc_loss`") -> str:
    """What the result table's host column is, in one sentence (the table's reader needs it beside the table)."""
    return f"Host per call: the host time of one eager call of {name} (no CUDA graph), bold where above the GPU time."


def split_table(table: str, *groups: Iterable[int], label: str = "") -> list[str]:
    """A Markdown table (its header, separator and rows; any text after a blank line dropped) cut into narrower
    tables, one per group of column indices (0-based): a wide table read as two. A row whose first cell is empty gets
    ``label`` there (the floor row of the table of steps)."""
    lines = table.split("\n\n")[0].splitlines()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    out = []
    for group in groups:
        group = list(group)
        body = []
        for i, cells in enumerate(rows):
            picked = [cells[k] for k in group]
            if i > 1 and not picked[0] and label:
                picked[0] = label
            body.append("| " + " | ".join(picked) + " |" if i != 1 else "|" + "---|" * len(group))
        out.append("\n".join(body))
    return out


def steps_tables(results) -> list[str]:
    """:func:`boehm_table` as two narrower tables: each step's change and its time at one utterance of the small
    alphabet (where the chain of frames binds) and at the headline case (A = 5,000, N = 8), with the note under it
    (the page shows it); then its times at :data:`FOLDED_CASES`, N = 16 and the largest batch (the page folds it). The steps tried
    and dropped (:data:`TRIED_STEPS`) are left out (:func:`tuning_table` folds them), so that every "× prev." is
    against the row above."""
    changes = step07_changes(results.path.parent.name) if results.path is not None else None  # 7a and 7b's run
    table = boehm_table(results, changes, shown=lambda role: role != TRIED_ROLE)
    first, = split_table(table, [0, 1, 2, *range(3, 9)])
    folded = boehm_table(results, changes, shown=lambda role: role != TRIED_ROLE, cases=FOLDED_CASES)
    second, = split_table(folded, [0, 1, *range(3, 9)], label="floor")
    return [first + "\n\n" + table.split("\n\n", 1)[1], second]


def results_tables(results) -> list[str]:
    """:func:`results_table` as two narrower tables: the times (torch's two calls, ours, our host time per call),
    then the speedup and the floor; the host column's sentence under the first."""
    table = results_table(results)
    times, ratios = split_table(table, range(6), [0, 1, 6, 7, 8])
    name = "`ctc_loss`" if results.select("ctc_loss", T=BENCH_T) else CHAPTER.final.name
    return [times + "\n\n" + host_words(name), ratios]


def results_clocks(results) -> str:
    """The result table's clocks and what ``torch-best`` is (:func:`results_table`'s note without the host
    sentence): for the fold under the tables."""
    note = results_table(results).split("\n\n", 1)[1]
    return note.rsplit(" Host per call:", 1)[0]


def torch_best_words(results) -> str:
    """Which of torch's calls ``torch-best`` is at each point of the grid (its rows' ``picked``), and what the
    kernel clock of a call that no CUDA graph captures leaves out."""
    picked: dict[str, list[tuple[int, int]]] = {}
    for r in results.select("torch-best", T=BENCH_T):
        picked.setdefault(r.get("picked", PENDING), []).append((r["params"]["A"], r["params"]["N"]))
    if not picked:
        return ""
    total = sum(len(v) for v in picked.values())

    def where(points):
        if len(points) == total:
            return f"all {total} points"
        return ", ".join(f"A = {a:,}, N = {n}" for a, n in sorted(points))

    clock = clock_words(clock_of(results, "torch-best"))
    words = (f"The speedup column is over the faster of torch's calls timed on the {clock}: "
             + "; ".join(f"{name} at {where(points)}" for name, points in picked.items()) + ".")
    if clock_of(results, "torch-native") == "kernel":
        pairs = [(_ms(results, "torch-native", T=BENCH_T, A=a, N=n), _ms(results, "torch-cuDNN", T=BENCH_T, A=a, N=n))
                 for a, n in _all_points()]
        both = [pair for pair in pairs if None not in pair]
        slower = sum(native > cudnn for native, cudnn in both)
        words += (" torch-native copies lengths from the host, so no CUDA graph captures it: its kernel clock leaves "
                  f"out the gaps between its launches, which favours it, and it is still slower than torch-cuDNN at "
                  f"{slower} of {len(both)} points.")
    return words


#: The first passes of steps 7 to 14 (every other kernel of theirs is a recursion or a last pass).
FIRST_PASSES = ("ctc_log_softmax_frames", "ctc_fused_stats", "ctc_stats_softmax")


def _kernel_role(name: str) -> str:
    if "recursion" in name:
        return "recursion"
    return "first pass" if name in FIRST_PASSES else "last pass"


def kernel_table(results) -> str:
    """Device time of each kernel of steps 7 to 14 at the profiled points (torch.profiler, no L2 flush): the
    first pass over the activations, the recursion and the last pass; torch's calls as one total."""
    steps = [CHAPTER.step(k) for k in range(7, 15)]
    cases = sorted({(r["params"]["A"], r["params"]["N"]) for s in steps for r in results.select(f"{s.series} kernels")})
    if not cases:
        return f"Per-kernel times: {PENDING}."
    lines = ["| A | N | call | first pass (µs) | recursion (µs) | last pass (µs) | timed call (µs) |",
             "|---|---|---|---|---|---|---|"]
    for A, N in cases:
        for series in ["torch-cuDNN", "torch-native"] + [s.series for s in steps]:
            kernels = _row(results, f"{series} kernels", A=A, N=N)
            if kernels is None:
                continue
            timed = _ms(results, series, T=BENCH_T, A=A, N=N)
            name = series if series.startswith("torch") else CHAPTER.label(series)
            if series.startswith("torch"):
                lines.append(f"| {A} | {N} | {name} | | | all kernels {us(kernels['ms'])} | {us(timed)} |")
                continue
            parts = {"first pass": 0.0, "recursion": 0.0, "last pass": 0.0}
            for kernel, device_us in kernels["kernels_us"].items():
                parts[_kernel_role(kernel)] += device_us
            lines.append(f"| {A} | {N} | {name} | {parts['first pass']:.1f} | {parts['recursion']:.1f} | "
                         f"{parts['last pass']:.1f} | {us(timed)} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Step 7's three changes one at a time (lab/ctc/step07_changes.py)
# --------------------------------------------------------------------------------------

#: The experiment of ``lab/ctc`` that times step 5, 7a, 7b and step 7 in one run (rows 7a and 7b of the table
#: of steps, and the numbers of their sections).
STEP07_CHANGES_FILE = "step07_changes"
def step07_changes(gpu: str = "nvidia-h200", root=None) -> Results | None:
    """The run of ``lab/ctc/step07_changes.py`` on ``gpu`` (a folder name), or None where none is committed."""
    try:
        data = load_lab("ctc", STEP07_CHANGES_FILE, gpu, root=root)
    except FileNotFoundError:
        return None
    folder = paths.lab_results("ctc", gpu) if root is None else root / "ctc" / "results" / gpu
    return Results(folder / f"{STEP07_CHANGES_FILE}.json", data)


def step07_verdict(changes: Results) -> str:
    """The lab run's correctness checks in words: "every output matched float64 first", or how many failed."""
    checks = changes.data.get("checks", [])
    failed = sum(not c["passed"] for c in checks)
    return ("every output matched float64 first" if checks and not failed else
            f"{failed} of its {len(checks)} correctness checks failed" if failed else "no output was checked")


# --------------------------------------------------------------------------------------
# What did not help (lab/ctc)
# --------------------------------------------------------------------------------------

def load_options():
    """The experiment of ``lab/ctc`` (recursion options, step 14's grain 2, the blocked layout)."""
    path = paths.lab_results("ctc", "nvidia-h200") / f"{OPTIONS_FILE}.json"
    return Results(path, load_lab("ctc", OPTIONS_FILE, "nvidia-h200"))


def _change(ratios: list[float]) -> str:
    """Time change of an option against its default (ratio option / default): median, and the range."""
    if not ratios:
        return PENDING
    med = statistics.median(ratios)
    return (f"{_signed(med - 1)} median ({_signed(min(ratios) - 1)} to {_signed(max(ratios) - 1)}) "
            f"over {len(ratios)} points")


#: What each option of the experiment is, in the table's words.
TRIED = {
    "branch-free": "step 13's recursion without flush-to-zero `ex2`/`lg2`, as step 11's "
                   "(`recursion=\"branch-free\"`)",
    "+ redux max": "the row maximum as one `redux.sync` instead of shuffles (`recursion=\"+ redux max\"`)",
    "+ prefetch 8": "`redux.sync` and emissions prefetched eight frames ahead instead of four "
                    "(`recursion=\"+ prefetch 8\"`)",
    "grain 2": "step 14 with two positions per thread instead of four (`grain=2`)",
}


def recursion_series() -> list[tuple[str, str]]:
    """(series, label) of every recursion measured between step 13's two passes in the experiment kept in
    ``lab/ctc`` (the branch-free warp's options, and step 14's block of warps at both grains)."""
    nine, ten = CHAPTER.step(OPTIONS_STEP), CHAPTER.step(14)
    out = []
    for option in RECURSION_OPTIONS:
        series = nine.series + ("" if option == DEFAULT_RECURSION else f" recursion {option}")
        out.append((series, f"{nine.name}, {option}" + (" (default)" if option == DEFAULT_RECURSION else "")))
    for grain in BLOCK_GRAINS:
        series = ten.series + ("" if grain == DEFAULT_BLOCK_GRAIN else f" grain {grain}")
        out.append((series, f"{ten.name}, {grain} per thread" + (" (default)" if grain == DEFAULT_BLOCK_GRAIN else "")))
    return out


def tried_table(options, results) -> str:
    """One line per option that no step keeps: what it is, its measured effect on the time (against the
    default in the same file), and where the details are."""
    lines = ["| what | time against the default | details |", "|---|---|---|"]
    defaults = {CHAPTER.step(OPTIONS_STEP).series, CHAPTER.step(14).series}
    for series, _ in recursion_series():
        if series in defaults:
            continue
        default = CHAPTER.step(14 if series.startswith(CHAPTER.step(14).series) else OPTIONS_STEP).series
        ratios = [1 / r for r in _ratios(options, default, series, _all_points())]
        option = series.removeprefix(default).strip().removeprefix("recursion ")
        lines.append(f"| {TRIED.get(option, option)} | {_change(ratios)} | `lab/ctc/README.md` |")
    five = CHAPTER.step(5).series
    blocked = [(r["ms"] / s["ms"]) for r in options.select(f"{five} blocked")
               for s in options.select(f"{five} strided", **r["params"])]
    odd = [x for r, x in zip(options.select(f"{five} blocked"), blocked) if r["params"]["grain"] % 2]
    lines.append(f"| blocked layout in {CHAPTER.step(5).name} (ModernGPU's: a thread's positions consecutive) | "
                 f"{_change(blocked)}; odd grains alone {_change(odd)} | `lab/ctc/README.md` |")
    four = f"{CHAPTER.step(4).series} strided"
    sweep = {}
    for r in results.select(four):
        sweep.setdefault(r["params"]["A"], {})[r["params"]["grain"]] = r["ms"]
    effects = []
    for A, by_grain in sorted(sweep.items()):
        odd_vs_even = [by_grain[g] / statistics.mean([by_grain[g - 1], by_grain[g + 1]])
                       for g in by_grain if g % 2 and g - 1 in by_grain and g + 1 in by_grain]
        if odd_vs_even:
            effects.append(f"A = {A:,}: {_change(odd_vs_even)}")
    lines.append(f"| odd grain sizes in {CHAPTER.step(4).name} (against the mean of the two even neighbours) | "
                 f"{'; '.join(effects) or PENDING} | the grain figure (step 4) |")
    return "\n".join(lines)


def grain_summary(results) -> dict[int, dict] | None:
    """What step 4's grain sweep says, per alphabet (:func:`~book.ctc.figures.grain_sweep`): the grain warp-ctc's rule
    picks (``rule``) and its threads per utterance, the grain-1 block's threads and its speedup over the rule's
    (``one_over_rule``), and, over the grains that share the fewest threads, how many there are and how far their
    times spread (``flat``: slowest over fastest, minus one). None without the sweep or where the rule's grain or
    grain 1 was not timed."""
    out = {}
    for A, entry in grain_sweep(results).items():
        rows, rule = entry["rows"], entry["rule"]
        if rule not in rows or 1 not in rows:
            return None
        fewest = min(r["threads"] for r in rows.values())
        flat = [r["ms"] for r in rows.values() if r["threads"] == fewest]
        out[A] = {"N": entry["N"], "rule": rule, "rule_threads": rows[rule]["threads"],
                  "one_threads": rows[1]["threads"], "one_over_rule": rows[rule]["ms"] / rows[1]["ms"],
                  "fewest_threads": fewest,
                  "flat_grains": sorted(g for g, r in rows.items() if r["threads"] == fewest),
                  "flat": max(flat) / min(flat) - 1}
    return out or None


# --------------------------------------------------------------------------------------
# The blog post's question: does cuDNN work in float32 probability space?
# --------------------------------------------------------------------------------------

def cudnn_counts(results) -> dict[str, dict[str, int]]:
    """Outcome counts on the stress set's utterances that torch's cuDNN path takes, summed over its inputs,
    per series (``"torch-cuDNN"``, ``"step06"``...); empty for files that predate the comparison."""
    out: dict[str, dict[str, int]] = {}
    for row in results.rows:
        if row["series"].startswith(CUDNN_SET):
            series = row["series"].removeprefix(CUDNN_SET)
            total = out.setdefault(series, dict.fromkeys(OUTCOMES, 0))
            for key in OUTCOMES:
                total[key] += int(row.get(key, 0))
    return out


def cudnn_cases(results) -> list[dict]:
    """Per input of the stress set: its name, T, the utterances compared (of how many) and, per series, the
    utterances lost (:func:`lost`), to see where each backend loses them."""
    cases: dict[tuple, dict] = {}
    for row in results.rows:
        if row["series"].startswith(CUDNN_SET):
            p = row["params"]
            case = cases.setdefault((p.get("inputs"), p["T"]), {"inputs": p.get("inputs"), "T": p["T"], "N": p["N"],
                                                                "of": p.get("of", p["N"]), "lost": {}})
            case["lost"][row["series"].removeprefix(CUDNN_SET)] = lost({k: int(row.get(k, 0)) for k in OUTCOMES})
    return [cases[k] for k in sorted(cases, key=lambda k: (str(k[0]), k[1]))]


#: How the page names the stress comparison's series where the benchmark's name would read like another's: the
#: autograd call that takes cuDNN's path (series ``torch-cuDNN F.ctc_loss``) beside cuDNN called directly
#: (``torch-cuDNN``).
SERIES_LABELS = {"torch-cuDNN F.ctc_loss": "`F.ctc_loss` (cuDNN path)"}


def series_label(series: str) -> str:
    """A series' name on the page: step N for a step's series, :data:`SERIES_LABELS` where set, else the series."""
    if series.startswith("step") and series[4:].isdigit():
        return f"step {int(series[4:])}"
    return SERIES_LABELS.get(series, series)


def lost(counts: dict[str, int]) -> int:
    """Utterances lost to what underflow does: an infinite or NaN answer, or a finite one far from float64."""
    return counts["infinite"] + counts["nan"] + counts["far"]


def cudnn_verdict(results) -> dict | None:
    """The blog post's question, answered from the comparison on the stress set: does cuDNN lose the utterances that
    float32 probability space (step 6, same inputs, same run) loses? None when the file holds no such comparison."""
    counts = cudnn_counts(results)
    prob = counts.get(CHAPTER.step(6).series)
    cudnn = {k: v for k, v in counts.items() if k.startswith("torch-cuDNN")}
    if prob is None or not cudnn:
        return None
    took_cudnn = all(r.get("use_cudnn_ctc_loss", True) for r in results.rows
                     if r["series"] == f"{CUDNN_SET}torch-cuDNN F.ctc_loss")
    worst = max(cudnn.values(), key=lost)
    verdict = {"counts": counts, "probability_space_lost": lost(prob), "cudnn_lost": lost(worst),
               "took_cudnn": took_cudnn, "supports": None}
    n = prob["utterances"] - prob["impossible"]
    if not took_cudnn:
        verdict["text"] = "F.ctc_loss did not take its cuDNN path on these inputs: no answer from this run."
    elif lost(prob) == 0:
        verdict["text"] = (f"Float32 probability space lost none of these {n} utterances: this run cannot tell "
                           "where cuDNN's arithmetic works.")
    elif lost(worst) > 0:
        verdict["supports"] = True
        verdict["text"] = (f"cuDNN loses {lost(worst)} of the {n} utterances (infinite {worst['infinite']}, NaN "
                           f"{worst['nan']}, finite but far from float64 {worst['far']}) where float32 probability "
                           f"space loses {lost(prob)}: this supports the hypothesis that cuDNN works in "
                           "probability space.")
    else:
        verdict["supports"] = False
        inexact = any(v["finite_wrong"] for v in cudnn.values())
        close = "" if not inexact else " (their misses of the tight tolerances are rounding)"
        verdict["text"] = (f"Float32 probability space loses {lost(prob)} of these {n} utterances; neither cuDNN call "
                           f"loses one, nor misses by more than {FAR_LOSS:g} on the loss or {FAR_GRAD:g} on the "
                           f"gradient{close}. So cuDNN does not work in plain float32 probability space: its speed "
                           "comes from elsewhere.")
    return verdict


# --------------------------------------------------------------------------------------
# The numbers the prose quotes
# --------------------------------------------------------------------------------------

def where(cases: list[tuple[int, int]], among: Iterable[tuple[int, int]] | None = None, *,
          complement: bool = True) -> str:
    """(A, N) cases in words, grouped by alphabet ("A = 28, N = 1; A = 5,000, N = 16 and 32"); where they are more
    than half of ``among`` (the grid's points by default) and ``complement``, by the ones they leave out ("every
    shape but A = 28, N = 1", "every shape" for all of them); empty for none."""
    among = list(_all_points() if among is None else among)
    if not cases:
        return ""

    def listed(points):
        by_a: dict[int, list[int]] = {}
        for A, N in points:
            by_a.setdefault(A, []).append(N)
        return "; ".join(f"A = {A:,}, N = " + (str(ns[0]) if len(ns) == 1 else
                                              ", ".join(map(str, ns[:-1])) + f" and {ns[-1]}") for A, ns in by_a.items())

    left = [p for p in among if p not in set(cases)]
    if 2 * len(cases) <= len(among) or not complement:
        return listed(cases)
    return "every shape" + (f" but {listed(left)}" if left else "")


def most(results, number: int) -> str:
    """Where on the grid step ``number`` gains most over the step it builds on: "A = 28, N = 1" (``pending`` without
    both series)."""
    step, before = CHAPTER.step(number), CHAPTER.step(PREVIOUS.get(number, number - 1))
    gains = {p: r for p in _all_points() for r in _ratios(results, before.series, step.series, [p])}
    if not gains:
        return PENDING
    A, N = max(gains, key=gains.get)
    return f"A = {A:,}, N = {N}"


def losing(results, number: int, points: Iterable[tuple[int, int]] | None = None) -> list[tuple[int, int]]:
    """The grid's (A, N) points (``points``: those only) where step ``number`` is slower than the step it builds on,
    as the tables round it: below 0.97×, a tie (:func:`tie`) being no loss."""
    step, before = CHAPTER.step(number), CHAPTER.step(PREVIOUS.get(number, number - 1))
    return [p for p in (_all_points() if points is None else points)
            if [r for r in _ratios(results, before.series, step.series, [p]) if round(r, 2) < TIE[0]]]


def float64_checks(results, number: int) -> dict | None:
    """Step ``number``'s float64 checks in the benchmark file: how many shapes, how many passed, and the largest
    relative error of the loss and of the gradient over them; None without checks."""
    import json

    series = CHAPTER.step(number).series
    rows = [c for c in json.loads(results.path.read_text()).get("checks", [])
            if c["name"] == f"{series} matches the float64 reference"]
    if not rows:
        return None
    shapes = {tuple(sorted(c["params"].items())) for c in rows}
    return {"shapes": len(shapes), "passed": all(c["passed"] for c in rows),
            "loss_rel": max(c.get("loss_rel", 0.0) for c in rows),
            "grad_rel": max(c.get("grad_rel", 0.0) for c in rows)}


def prose_numbers(results) -> dict[str, str]:
    """Every measured number notebook 04's prose quotes, formatted, by glue name; ``pending`` where the file
    does not have it."""
    s = {step.number: step.series for step in CHAPTER.steps}
    out: dict[str, str] = {}
    big, small = max(BENCH_A), min(BENCH_A)
    final = "ctc_loss" if results.select("ctc_loss", T=BENCH_T) else s[14]  # the entry point, where timed
    last = _row(results, final, T=BENCH_T, A=big, N=max(BENCH_N))
    floor = case_floor(results, big, max(BENCH_N))[0] * 1e-3 if last else None  # ms: the case's one floor
    out["floor_big"] = f"{floor * 1e3:.0f} µs" if floor else PENDING
    out["final_over_floor_big"] = f"{last['ms'] / floor:.1f}×" if last and floor else PENDING
    out["restrict_change"] = _largest_change(_ratios(results, s[1], s[2], _lesson_points()))
    out["ldg_change"] = _largest_change(_ratios(results, s[2], s[3], _lesson_points()))
    out["rows_change"] = _largest_change(_ratios(results, s[4], s[5], _lesson_points()))
    rows6 = results.select(s[6], T=BENCH_T)
    if rows6:
        lost = sum(r.get("mismatched", 0) for r in rows6)
        out["prob_lost"] = f"{lost} of {sum(r['params']['N'] for r in rows6)}"
    else:
        out["prob_lost"] = PENDING
    out["gradient_pass"] = _times(_ratios(results, s[5], s[7], _lesson_points()))
    for key, k in (("no_softmax", 8), ("one_warp", 9), ("side_by_side", 10), ("branch_free", 11), ("ftz", 12)):
        ratios = _ratios(results, s[k - 1], s[k], _all_points())
        out[key] = _times(ratios)
        out[f"{key}_slower"] = where(losing(results, k)) if ratios else PENDING
        out[f"{key}_most"] = most(results, k)
    one = _ratios(results, s[13], s[14], [(small, min(BENCH_N))])
    out["warps_small_one"] = _percent(1 / one[0] - 1) if one else PENDING
    for A, key in ((small, "final_small"), (big, "final_big")):
        same = clock_of(results, "torch-best") == clock_of(results, final)
        out[key] = _times(_ratios(results, "torch-best", final, _all_points(A))) if same else PENDING
    out["clock"] = clock_words(clock_of(results, s[14])) or PENDING
    return out


def rival_ms(results, A: int, N: int, strongest: bool = False) -> float | None:
    """``torch-best``'s time at (A, N); with ``strongest``, torch's native path's where it reads faster (on the kernel
    clock: no graph captures it), as the results page sets ours against the faster of torch's two paths."""
    best = _ms(results, "torch-best", T=BENCH_T, A=A, N=N)
    native = _ms(results, "torch-native", T=BENCH_T, A=A, N=N) if strongest else None
    return best if best is None or native is None else min(best, native)


def native_faster(results) -> list[dict]:
    """The cases where torch-native, on its kernel clock, reads faster than ``torch-best`` (torch's faster call on the
    GPU clock), so that :func:`rival_ms` with ``strongest`` picks it: per case, A, N, both torch times (µs) and the
    entry point's speedup over each. Empty where cuDNN is the faster path at every case."""
    final = "ctc_loss" if results.select("ctc_loss", T=BENCH_T) else CHAPTER.final.series
    out = []
    for A, N in _all_points():
        best = _ms(results, "torch-best", T=BENCH_T, A=A, N=N)
        native = _ms(results, "torch-native", T=BENCH_T, A=A, N=N)
        ours = _ms(results, final, T=BENCH_T, A=A, N=N)
        if None not in (best, native, ours) and native < best:
            out.append({"A": A, "N": N, "native_us": native * 1e3, "cudnn_us": best * 1e3,
                        "over_native": native / ours, "over_cudnn": best / ours})
    return out


def speedup_minima(results, strongest: bool = False) -> dict | None:
    """The smallest speedup of the entry point over ``torch-best`` (same clock; with ``strongest``: over
    :func:`rival_ms`) over the whole grid and per alphabet, and the largest over the grid, each with where it is:
    ``{"all": (ratio, A, N), "max": (ratio, A, N), A: (ratio, A, N), ...}``; None without the rows."""
    final = "ctc_loss" if results.select("ctc_loss", T=BENCH_T) else CHAPTER.final.series
    if clock_of(results, "torch-best") != clock_of(results, final):
        return None
    points = [(b / a, A, N) for A, N in _all_points()
              for b, a in [(rival_ms(results, A, N, strongest), _ms(results, final, T=BENCH_T, A=A, N=N))]
              if b is not None and a is not None]
    if not points:
        return None
    out = {"all": min(points), "max": max(points)}
    for A in BENCH_A:
        mine = [p for p in points if p[1] == A]
        if mine:
            out[A] = min(mine)
    return out


def least_cases(results, key="all", strongest: bool = False) -> str:
    """Where the smallest speedup of :func:`speedup_minima` (``key``: "all" or an alphabet) is, every case that
    prints the same two decimals named ("A = 28, N = 2 and 4")."""
    mins = speedup_minima(results, strongest)
    final = "ctc_loss" if results.select("ctc_loss", T=BENCH_T) else CHAPTER.final.series
    low = round(mins[key][0], 2)
    cases = [(A, N) for A, N in _all_points(None if key == "all" else key)
             if (b := rival_ms(results, A, N, strongest))
             and (a := _ms(results, final, T=BENCH_T, A=A, N=N)) and round(b / a, 2) == low]
    return where(cases)


#: The steps the entry point chooses between.
DISPATCH_STEPS = (12, 13, 14)


def dispatch_rows(results) -> list[dict]:
    """The entry point's rule on one card's measured cases: the grid (T = BENCH_T) and the stress set, each case
    where steps 12, 13 and 14 were all timed on the GPU clock: its (T, N, A), inputs (``"random"`` on the grid), the
    longest target's row of alpha (``positions``), those steps' µs, the step :func:`~studylog.ctc.fused.final_step`
    picks and its time over the fastest step timed there (the entry point's own time where the file times it)."""
    from studylog.ctc.fused import final_step

    out = []
    cases = [("", {"T": BENCH_T, "N": N, "A": A}) for A in BENCH_A for N in BENCH_N]
    cases += [("stress ", r["params"]) for r in results.select(f"stress {CHAPTER.step(DISPATCH_STEPS[0]).series}")]
    for prefix, where in cases:
        ms, positions = {}, None
        for s in CHAPTER.steps:
            rows = [r for r in results.select(prefix + s.series, **where) if set(r["params"]) == set(where)]
            if rows and rows[0].get("clock") == "gpu":
                ms[s.number] = rows[0]["ms"]
                positions = rows[0].get("max_positions") or positions
        if not set(DISPATCH_STEPS) <= set(ms) or positions is None:
            continue
        picked = final_step(where["T"], where["N"], where["A"], positions)
        entry = [r for r in results.select(prefix + "ctc_loss", **where) if set(r["params"]) == set(where)]
        out.append({**{k: where[k] for k in ("T", "N", "A")}, "inputs": where.get("inputs", "random"),
                    "positions": positions, "us": {k: ms[k] * 1e3 for k in DISPATCH_STEPS}, "picked": picked,
                    "over_fastest": (entry[0]["ms"] if entry else ms[picked]) / min(ms.values()),
                    "entry_timed": bool(entry)})
    return out


def dispatch_table(results) -> str:
    """Markdown of :func:`dispatch_rows`: per case, steps 12, 13 and 14 (GPU clock), the step ``ctc_loss`` runs
    and its time over the fastest step there."""
    lines = ["| T | N | A | targets | longest row | " + " | ".join(f"step {k} (µs)" for k in DISPATCH_STEPS)
             + " | `ctc_loss` runs | its time / the fastest step |", "|---|---|---|---|---|---|---|---|---|---|"]
    rows = dispatch_rows(results)
    for r in rows:
        cells = " | ".join(f"{r['us'][k]:,.1f}" for k in DISPATCH_STEPS)
        lines.append(f"| {r['T']} | {r['N']} | {r['A']:,} | {r['inputs']} | {r['positions']} | {cells} | "
                     f"step {r['picked']} | {r['over_fastest']:.2f}{'' if r['entry_timed'] else '*'} |")
    if any(not r["entry_timed"] for r in rows):
        lines.append("\n*: the entry point is not timed there: the time of the step it picks.")
    return "\n".join(lines) if len(lines) > 2 else f"({PENDING}: this file times steps 12 to 14 nowhere)"


#: The two cases of the table of steps: one utterance of the small alphabet, where the recursion's chain of frames
#: is the time, and a full batch of the large one, where the bytes are.
BOEHM_CASES = ((28, 1), (5000, 256))
#: The headline case (the large alphabet's smallest speedup over torch): the benchmark times every step there.
HEADLINE_CASE = (5000, 8)
#: The columns of the table of steps: :data:`BOEHM_CASES` with the headline case between them, a small batch of the
#: large alphabet where step 14's several warps per direction apply (the longest target needs more than one warp).
TABLE_CASES = (BOEHM_CASES[0], HEADLINE_CASE, BOEHM_CASES[1])
#: The folded table of steps' two cases: a batch twice the headline's and the largest batch.
FOLDED_CASES = ((5000, 16), BOEHM_CASES[1])


def floor_us(results, A: int, N: int) -> float:
    """The least time a call can take, in µs (the book's floor, :func:`book.common.floor_ms`): the larger of the
    activations read and the gradient written once at the copy bandwidth and the card's fastest empty kernel."""
    from studylog.ctc.report import dram_bytes

    return floor_ms(results, dram_bytes(BENCH_T, N, A)) * 1e3


#: The tails run's kernel that does only the recursion's chain of dependent frames (``studylog.ctc.floor``).
CHAIN_SERIES = CTC_FLOOR_SERIES


def _tails_row(results, series: str, **params) -> dict | None:
    """The tails run's one row of ``series`` at ``params``, on the card of ``results``; None where there is none."""
    from studylog.plotting import load_results

    try:
        tails = load_results("tails", gpu=results.path.parent.name, root=results.path.parent.parent)
    except FileNotFoundError:
        return None
    rows = tails.select(series, T=BENCH_T, **params)
    return rows[0] if len(rows) == 1 else None


def _chain_row(results, frames: int) -> dict | None:
    """The tails run's row of the chain kernel over ``frames`` dependent frames at the small case of
    :data:`BOEHM_CASES`, on the card of ``results``; None where the card has no such run."""
    A, N = BOEHM_CASES[0]
    return _tails_row(results, CHAIN_SERIES, A=A, N=N, frames=frames)


def chain_floor_us(results, frames: int) -> float | None:
    """The recursion's latency floor at the small case of :data:`BOEHM_CASES` (A = 28, N = 1), in µs: the tails run,
    on the same card as ``results``, of a kernel that runs only ``frames`` dependent frames (a log-sum-exp and a warp
    shuffle each, no memory) over that utterance's positions. ``T`` frames for steps that run alpha and beta side by
    side (10 to 14), ``2 T`` for steps that run them one after the other (1 to 9). None where the card has no such
    run."""
    row = _chain_row(results, frames)
    return None if row is None else row["ms"] * 1e3


def longest_target(results, A: int, N: int) -> int | None:
    """Positions (2 L + 1) of the longest extended target of the benchmark's batch at (A, N), as the fused steps'
    rows record it; None where no such row says."""
    for number in range(7, 15):
        row = _row(results, CHAPTER.step(number).series, T=BENCH_T, A=A, N=N)
        if row and row.get("max_positions"):
            return row["max_positions"]
    return None


#: The lab run that times each case's own chain: ``T`` dependent frames over the states of its longest target
#: (lab/ctc/case_chains.py), one row per case of the benchmark's grid.
CASE_CHAINS_FILE = "case_chains"
CASE_CHAIN_SERIES = "ctc recursion chain, the case's longest target"


def case_chain_us(results, A: int, N: int) -> float | None:
    """The case's own latency floor, in µs: the lab run's chain of ``T`` dependent frames over the states of the
    case's longest target, on the card of ``results``; None where that card has no such run (the H100)."""
    try:
        data = load_lab("ctc", CASE_CHAINS_FILE, results.path.parent.name)
    except FileNotFoundError:
        return None
    rows = [r for r in data["measurements"] if r["series"] == CASE_CHAIN_SERIES
            and r["params"]["T"] == BENCH_T and r["params"]["A"] == A and r["params"]["N"] == N]
    return rows[0]["ms"] * 1e3 if len(rows) == 1 else None


def case_floor(results, A: int, N: int) -> tuple[float, str]:
    """The one floor of a case, in µs, and its kind, by one rule for every case of every table: the larger of
    :func:`floor_us` (the bytes at the copy bandwidth, or the card's fastest empty kernel where that is larger) and
    the case's own chain (:func:`case_chain_us`: ``T`` dependent frames over its longest target's states, timed for
    every case). Where the card timed no chain (the H100) the bytes alone, a lower bound there. Kinds: ``"bytes"``,
    ``"empty kernel"``, ``"chain"``."""
    from studylog.ctc.report import dram_bytes

    by_bytes = floor_us(results, A, N)
    bytes_us = dram_bytes(BENCH_T, N, A) / (results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9) * 1e6
    kind = "bytes" if bytes_us >= by_bytes else "empty kernel"
    chain_us = case_chain_us(results, A, N) or 0.0
    return (chain_us, "chain") if chain_us > by_bytes else (by_bytes, kind)


#: How the tables name each kind of floor.
FLOOR_KIND = {"bytes": "bytes", "empty kernel": "empty kernel", "chain": "chain of T frames"}


def kernel_parts_us(results, series: str, A: int, N: int) -> dict[str, float] | None:
    """Device time per role of a step's kernels at a profiled point (torch.profiler, the kernel clock): the first
    pass over the activations, the recursion and the last pass, in µs; None where the point was not profiled."""
    kernels = _row(results, f"{series} kernels", A=A, N=N)
    if kernels is None:
        return None
    parts = {"first pass": 0.0, "recursion": 0.0, "last pass": 0.0}
    for kernel, device_us in kernels["kernels_us"].items():
        parts[_kernel_role(kernel)] += device_us
    return parts


#: Steps kept although they gain nothing or cost time somewhere: what builds on them (said in the table of steps,
#: after the change).
PREREQUISITES = {5: "step 7 builds on its rows", 9: "steps 10 to 14 build on the warp"}
#: The steps tried and dropped: neither on the main line nor built on by it (the page folds them under the table).
TRIED_STEPS = (2, 3, 6)
#: Why a step that loses has a row: said in its row of the table of steps.
WHY_SHOWN = {6: "it tests the guess that cuDNN is fast in probability space; on long targets its loss turns "
                "infinite"}
#: Why a step that moves no case of the table (every "× prev." between 0.99× and 1.01×, as the table rounds it) is in
#: the chain: said in its row, after the change.
FLAT_WHY = {2: "the loads become `ld.global.nc`; loads were not what costs",
            3: "the same loads as step 2",
            5: "steps 6 and 7 build on it"}
#: The table of steps' "role" column: each step is on the main line (the steps that pay, in order), or one of these.
MAIN_LINE, NO_GAIN, PREREQUISITE, SIDE_BRANCH, TRIED_ROLE = ("main line", "no gain", "prerequisite", "side branch",
                                                             "tried")


#: Step 7's first two changes, each a row of the table of steps between step 6 and step 7 (timed by the lab run
#: :data:`STEP07_CHANGES_FILE` with step 5 and step 7): (row, the one change, series, the row it builds on).
STEP07_ROWS = (("7a", "the gradient a pass of its own, a block per frame, after alpha and beta (still two launches)",
                "step07a", "step05"),
               ("7b", "alpha and beta in one kernel", "step07b", "step07a"))
#: Why 7b stays where it costs time (said in its row and its section).
STEP07B_KEPT = "step 10 runs both directions in one kernel"
STEP07B_NEEDED_BY = 10
#: How a "× prev." cell of the table of steps names the run of :data:`STEP07_ROWS` where the ratio crosses from the
#: benchmark to that run (7a over step 5, 7c over 7b): its two times follow.
STEP07_RUN = "7a's run"
#: Step 7's row label when 7a and 7b stand above it: its last change, the library's step 7 (7a to 7c together).
STEP07_LABEL = "7c"
#: Step 7's row in the table when 7a and 7b stand above it: its own change, the last of the three.
STEP07_LAST = "emissions loaded {prefetch} frames ahead"
#: Step 7's one row in the table of steps: its three changes (7a to 7c) in words.
STEP07_WHOLE = ("7a to 7c: the gradient a pass of its own, alpha and beta in one kernel, emissions loaded "
                "{prefetch} frames ahead")


def flat(results, number: int) -> bool:
    """Whether step ``number`` moves no case of :data:`TABLE_CASES`: its "× prev." is a tie (:func:`tie`) at every
    one (False where a case is not timed)."""
    before = CHAPTER.step(PREVIOUS.get(number, number - 1)).series
    ratios = [_ratios(results, before, CHAPTER.step(number).series, [case]) for case in TABLE_CASES]
    return all(ratios) and all(tie(r[0]) for r in ratios)


def _labels() -> list[str]:
    """The table of steps' step rows in order: "1" to "14", one per step of the benchmark."""
    return [str(s.number) for s in CHAPTER.steps]


def roles(results, changes: Results | None = None) -> dict[str, str]:
    """Each step row of the table of steps (:func:`_labels`) and its role: :data:`TRIED_ROLE` for a step of
    :data:`TRIED_STEPS` (tried and dropped); :data:`PREREQUISITE` for a step of :data:`PREREQUISITES` that
    ties (:func:`flat`) or is slower than the row it builds on at a case of :data:`TABLE_CASES`; else
    :data:`MAIN_LINE`, the steps that pay, in order. The main line with its prerequisites is one chain. (``changes``
    is not read: step 7 is one row, from the benchmark.)"""
    out = {}
    for label in _labels():
        number = int(label) if label.isdigit() else None
        if number in TRIED_STEPS:
            out[label] = TRIED_ROLE
        elif number in PREREQUISITES and (losing(results, number, TABLE_CASES) or flat(results, number)):
            out[label] = PREREQUISITE
        else:
            out[label] = MAIN_LINE
    return out


def _listed(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def line_words(results, changes: Results | None = None) -> str:
    """The one-line legend over the table of steps: how to read its numbers (every step tried is numbered, so the
    rows skip those dropped; 7a to 7c split step 7) and what its role words mean, from :func:`roles` and
    :data:`CASHED_BY` (the note under the table gives the threshold of "pays")."""
    r = roles(results, changes)
    kept = [label for label, x in r.items() if x == PREREQUISITE]
    tried = [label for label, x in r.items() if x == TRIED_ROLE]
    runs = changes if changes is not None or results.path is None else step07_changes(results.path.parent.name)
    if runs is not None:  # 7b, a row of its own, is kept for step 10 where it does not pay at every case shown
        r7b = step_ratios(results, "7b", runs)
        if not all((x := r7b.get(tuple(c))) is not None and round(x, 2) > TIE[1] for c in TABLE_CASES):
            kept = [k for k in kept if int(k) < 7] + ["7b"] + [k for k in kept if int(k) > 7]
    words = "The numbers count every step tried: the main line **pays** at a case shown"
    if kept:
        words += (f"; a step *kept for step N* ({_listed(kept)}) ties or loses alone, and step N, which builds on "
                  "it, pays")
    words += "; step 7 is three changes, 7a to 7c, a row each"
    if tried:
        words += f". Steps {_listed(tried)} were tried and dropped (folded below)"
    return words + "."


#: The step that cashes in each prerequisite (:func:`roles`): it builds on the prerequisite and pays. Step 7
#: builds on step 5's rows; step 10 runs step 9's warp for each direction.
CASHED_BY = {"5": "7", "9": "10"}


def role_word(label: str, role: str) -> str:
    """A step row's role cell in the table of steps, in plain words: "baseline" (step 1), "pays" (bold; "pays by
    shape" for the last step, which the entry point runs only where the target needs several warps); "kept for
    step N" for a prerequisite (:data:`CASHED_BY`: the step that builds on it and pays); else the role as it is."""
    if role == PREREQUISITE:
        return f"kept for step {CASHED_BY[label]}"
    if role != MAIN_LINE:
        return role
    if label == "1":
        return "**baseline**"
    return "**pays** by shape" if label == str(DISPATCH_STEPS[-1]) else "**pays**"


def boehm_table(results, changes: Results | None = None, shown=lambda role: True, greyed=lambda role: False,
                cases: Iterable[tuple[int, int]] | None = None) -> str:
    """Markdown, one row per step and one for the entry point (``ctc_loss``) and torch's faster call: its role
    (:func:`roles`; the main line in bold), the one change, then per case of :data:`TABLE_CASES` the GPU-clock time
    in µs, × the step it builds on (:data:`PREVIOUS`, else the step before), × the case's one floor
    (:func:`case_floor`). The rows run in step order, every time from the benchmark; with ``changes`` (the run of
    :data:`STEP07_CHANGES_FILE`) step 7's three changes are a row each, 7a and 7b timed in that run, step 7 as 7c,
    and the note says how far that run's steps 5 and 7 sit from the benchmark's. A prerequisite says
    in its change what builds on it; a step that moves no case (:func:`flat`) says why it is there
    (:data:`FLAT_WHY`); a main-line step flat at the first case says where it pays. The entry point's row, right
    under step 14's, names the step it ran in each case and compares it with that step timed as a step (what the
    choice costs), so the table ends on the chapter's result. ``shown(role)`` False leaves a step's row out (the page
    folds the steps that gain nothing); ``greyed(role)`` True greys a step's row (the page's open table greys them
    instead); a "× prev." against a step that is not the row above names that step. ``cases`` replaces
    :data:`TABLE_CASES` as the columns (the roles and the change cells still read :data:`TABLE_CASES`); a step not
    timed at a case shows "–" there."""
    cases = TABLE_CASES if cases is None else tuple(cases)
    head = ["step", "role", "the one change"]
    for A, N in cases:
        head += [f"A = {A:,}, N = {N}: µs", "× prev.", "× floor"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    floors = [case_floor(results, A, N) for A, N in cases]
    floor_cells = [cell for f, kind in floors for cell in (f"{f:,.1f} ({FLOOR_KIND[kind]})", "", "")]
    lines.append("| | | floor: the bytes or the chain of T frames, the larger | " + " | ".join(floor_cells) + " |")
    floors = [f for f, _ in floors]

    def code(title: str) -> str:
        for word in ("__restrict__", "__ldg", "ex2", "lg2"):
            title = title.replace(word, f"`{word}`")
        return title

    def kept(number: int) -> str:
        return f" (kept: {PREREQUISITES[number]})" if role.get(str(number)) == PREREQUISITE else ""

    def chosen(number: int) -> str:  # the last step pays only where the target needs several warps
        if number != DISPATCH_STEPS[-1]:
            return ""
        return " (`ctc_loss` runs it where the target needs several warps)"  # its "× prev." says where not

    def no_gain(number: int) -> str:
        return f" ({FLAT_WHY[number]})" if role.get(str(number)) == NO_GAIN else ""

    def elsewhere(number: int) -> str:  # flat at the first case, paying at every other: say where it pays
        if role.get(str(number)) != MAIN_LINE or number in (1, DISPATCH_STEPS[-1]):
            return ""
        before = CHAPTER.step(PREVIOUS.get(number, number - 1)).series
        ratios = [_ratios(results, before, CHAPTER.step(number).series, [case]) for case in TABLE_CASES]
        if not all(ratios) or not tie(ratios[0][0]) or all(round(r[0], 2) <= TIE[1] for r in ratios[1:]):
            return ""
        pays = [case for case, r in zip(TABLE_CASES[1:], ratios[1:]) if round(r[0], 2) > TIE[1]]
        return f" (pays at {where(pays, TABLE_CASES[1:], complement=False)})" if len(pays) < len(ratios) - 1 else \
            f" (pays at A = {', '.join(sorted({f'{A:,}' for A, _ in TABLE_CASES[1:]}))})"

    from book.ctc.compiled import PREFETCH_FRAMES

    role = roles(results)
    entries = []
    for s in CHAPTER.steps:
        title = code(s.title) + kept(s.number) + chosen(s.number) + elsewhere(s.number) + no_gain(s.number)
        if s.number in WHY_SHOWN:  # after a colon where the title ends with brackets of its own
            title += f": {WHY_SHOWN[s.number]}" if title.endswith(")") else f" ({WHY_SHOWN[s.number]})"
        if s.number == 7 and changes is not None:  # its three changes a row each: 7a and 7b from their own run
            entries += [(label, change, series) for label, change, series, _ in STEP07_ROWS]
            entries.append((STEP07_LABEL, STEP07_LAST.format(prefetch=PREFETCH_FRAMES), s.series))
            continue
        if s.number == 7:  # its three changes, 7a to 7c, in words (no run of them one at a time)
            title = STEP07_WHOLE.format(prefetch=PREFETCH_FRAMES) + elsewhere(7)
        entries.append((str(s.number), title, s.series))
    entries.append(("entry point", "`ctc_loss`: step 12, 13 or 14 by shape and longest target (the step it ran in "
                    "brackets)", "ctc_loss"))
    picked = [(_row(results, "torch-best", T=BENCH_T, A=A, N=N) or {}).get("picked") for A, N in cases]
    picked_words = ", ".join(dict.fromkeys(p for p in picked if p))
    entries.append(("torch", "torch's faster CTC call"
                    + (f" ({picked_words} here)" if picked_words else ""), "torch-best"))
    before_choice = CHAPTER.step(DISPATCH_STEPS[1])  # a file without the step the entry point ran: the step before
    role_cell = {"entry point": "the result", "torch": "the rival"}
    times: dict[str, list] = {}
    rows: list[list[str]] = []
    above = None  # the label of the last step row shown
    # 7a and 7b: their run's times; each pays where it is faster than the row above at every case of TABLE_CASES,
    # else it is kept for the step that needs it (7b: step 10's one kernel)
    sub = {} if changes is None else {label: (base, series) for label, _, series, base in STEP07_ROWS}
    sub_words = {}
    for label, (base, series) in sub.items():
        r = step_ratios(results, label, changes)
        pays = all((x := r.get(tuple(c))) is not None and round(x, 2) > TIE[1] for c in TABLE_CASES)
        sub_words[label] = "**pays**" if pays else f"kept for step {STEP07B_NEEDED_BY}"
    for number, title, series in entries:
        if number in sub:
            kind, hidden = MAIN_LINE, False
            kept = "" if sub_words[number] == "**pays**" else f" (kept: {STEP07B_KEPT})"
            cells = [number, sub_words[number], title + kept]
        else:
            label = "7" if number == STEP07_LABEL else number
            kind = role.get(label, role_cell.get(label, MAIN_LINE))
            hidden = label in role and not shown(kind)
            cells = [number, role_word(label, kind) if label in role else kind, title]
        times[series] = [None] * len(cases)
        for i, (A, N) in enumerate(cases):
            row = _row(changes if number in sub else results, series, T=BENCH_T, A=A, N=N)
            if row is None:
                cells += ["–", "–", "–"]
                continue
            t = times[series][i] = row["ms"] * 1e3
            time_cell = f"{t:,.1f}"
            against = ""
            if series == "ctc_loss":  # against the step it ran, timed as a step: what the choice costs
                ran = CHAPTER.step(row["step"]) if row.get("step") else before_choice
                prev, against = times[ran.series][i], f"vs step {ran.number}"
                if row.get("step"):
                    time_cell += f" (step {ran.number})"
            elif series == "torch-best" or number == "1":
                prev = None
            elif number in sub or (number == STEP07_LABEL and times.get("step07b", [None] * len(cases))[i]):
                base = {"7a": "step05", "7b": "step07a", STEP07_LABEL: "step07b"}[number]
                prev = times[base][i]
                named = {"step05": "5", "step07a": "7a", "step07b": "7b"}[base]
                against = f"vs step {named}" if named != above else ""
            else:  # step 6 is a side branch: step 7 builds on step 5
                step = 7 if number == STEP07_LABEL else int(number)
                before = PREVIOUS.get(step, step - 1)
                prev = times[CHAPTER.step(before).series][i]
                against = f"vs step {before}" if str(before) != ("7" if above == STEP07_LABEL else above) else ""
            if prev and tie(prev / t):
                against += ", tie" if against else "tie"
            elif number == str(DISPATCH_STEPS[-1]) and (r := _row(results, "ctc_loss", T=BENCH_T, A=A, N=N)) and \
                    r.get("step") not in (None, series):  # the last step loses where the entry point runs another
                against += f"the entry point runs step {CHAPTER.step(r['step']).number} here"
            versus = (f"{prev / t:.2f}×" + (f" ({against})" if against else "")) if prev else "–"
            cells += [time_cell, versus, f"{t / floors[i]:,.1f}×"]
        if not hidden:
            if number in role and greyed(kind) and number not in sub:
                cells = [f'<span style="color: grey">{c}</span>' if c else c for c in cells]
            rows.append(cells)
            above = number
    for cells in rows:
        lines.append("| " + " | ".join(cells) + " |")
    note = ("“× prev.”: the time of the step built on over this one's (above 1.03×, it pays; 0.97× to 1.03×, a "
            "tie); for the entry point, the step it ran over the call (what the choice costs).")
    if changes is not None:  # 7a and 7b come from a run of their own: how far it sits from the benchmark
        gaps = [abs(_ms(changes, s, T=BENCH_T, A=A, N=N) / _ms(results, s, T=BENCH_T, A=A, N=N) - 1)
                for s in ("step05", "step07") for A, N in cases
                if _ms(changes, s, T=BENCH_T, A=A, N=N) and _ms(results, s, T=BENCH_T, A=A, N=N)]
        note += (" 7a and 7b come from a separate run, whose steps 5 and 7 are within "
                 f"{max(gaps):.1%} of this table's." if gaps else " 7a and 7b come from a separate run.")
    return "\n".join(lines) + "\n\n" + note


def step_ratios(results, number, changes: Results | None = None) -> dict[tuple[int, int], float]:
    """Step ``number``'s "× prev." at every case where it and the step it builds on were timed, {(A, N): ratio}:
    a step of the chapter against :data:`PREVIOUS` (else the step before) in the benchmark; "7a", "7b" and "7c" (step
    7's three changes), each against the one before (7a against step 5), 7a and 7b from the lab run that timed them,
    steps 5 and 7 (7c) from the benchmark, as the table of steps shows them."""
    labels = {label: (base, series) for label, _, series, base in STEP07_ROWS}
    labels[STEP07_LABEL] = ("step07b", "step07")
    if str(number) in labels:  # as the table of steps divides them: steps 5 and 7 from the benchmark, 7a and 7b not
        changes = step07_changes(results.path.parent.name) if changes is None else changes
        if changes is None:
            return {}
        (before, after), out = labels[str(number)], {}
        for A, N in sorted({(r["params"]["A"], r["params"]["N"]) for r in changes.select(after, T=BENCH_T)}):
            b = _ms(results if before == "step05" else changes, before, T=BENCH_T, A=A, N=N)
            a = _ms(results if after == "step07" else changes, after, T=BENCH_T, A=A, N=N)
            if a and b:
                out[A, N] = b / a
        return out
    before, after = CHAPTER.step(PREVIOUS.get(number, number - 1)).series, CHAPTER.step(number).series
    return {p: r for p in _all_points() for r in _ratios(results, before, after, [p])}


def factor(results, number, case: tuple[int, int], changes: Results | None = None) -> str:
    """Step ``number``'s "× prev." at one case as the table of steps prints it ("1.12×"); ``pending`` where either
    step is not timed there."""
    ratio = step_ratios(results, number, changes).get(tuple(case))
    return PENDING if ratio is None else f"{ratio:.2f}×"


def entry_point(results, A: int, N: int) -> dict | None:
    """The entry point's own row (series ``ctc_loss``, timed separately) at (A, N) beside the row of the step it
    ran there: µs of each, their ratio, their spreads over the repetitions (µs) and whether the spreads overlap.
    None where either row is missing."""
    entry = _row(results, "ctc_loss", T=BENCH_T, A=A, N=N)
    step = _row(results, entry["step"], T=BENCH_T, A=A, N=N) if entry and entry.get("step") else None
    if step is None:
        return None
    spread = [[x * 1e3 for x in (r.get("spread_ms") or [r["ms"]] * 3)] for r in (entry, step)]
    return {"step": CHAPTER.step(entry["step"]).number, "us": entry["ms"] * 1e3, "step_us": step["ms"] * 1e3,
            "ratio": entry["ms"] / step["ms"], "spread": (spread[0][0], spread[0][2]),
            "step_spread": (spread[1][0], spread[1][2]),
            "overlap": spread[0][0] <= spread[1][2] and spread[1][0] <= spread[0][2]}


def tuning_table(results, numbers: Iterable[int] = TRIED_STEPS) -> str:
    """Markdown, one row per step of ``numbers`` (the steps tried and dropped): what it changes, then its speedup
    over the step before it at every point where the lesson timed steps 1 to 6 (both alphabets, ``LESSON_N``); above
    1 the step is faster, a tie (:func:`tie`) marked."""
    points = _lesson_points()
    head = "| step | the one change | " + " | ".join(f"A = {a:,}, N = {n}" for a, n in points) + " | why dropped |"
    lines = [head, "|---|---|" + "---|" * (len(points) + 1)]
    for number in numbers:
        step, before = CHAPTER.step(number), CHAPTER.step(number - 1)
        cells = []
        for point in points:
            ratio = _ratios(results, before.series, step.series, [point])
            cells.append(f"{ratio[0]:.2f}×" if ratio else "–")
        title = step.title.replace("__restrict__", "`__restrict__`").replace("__ldg", "`__ldg`")
        why = (f"a tie at every case: {FLAT_WHY[number]}" if number in FLAT_WHY and all(tie(r) for p in points
               for r in _ratios(results, before.series, step.series, [p])) else WHY_SHOWN.get(number, ""))
        lines.append(f"| {number} | {title} | " + " | ".join(cells) + f" | {why} |")
    return "\n".join(lines)


#: The cards' short names, for prose.
CARD_NAMES = {"nvidia-h200": "H200", "nvidia-h100-80gb-hbm3": "H100"}


def host_bound(gpu: str = "nvidia-h200") -> dict | None:
    """The grid's cases on one card where our call, made eagerly, takes longer on the host than on the GPU (its host
    time per call above its GPU time): ``cases``, (A, N, host µs, GPU µs) in the grid's order; ``of``, the cases with
    a host time; ``card``, the card's short name. Our call is the entry point's row where the card's run times it,
    else the step the entry point picks for the case (:func:`studylog.ctc.results.entry_series`), as on the landing
    page. None where the card has no run."""
    from studylog.plotting import load_results

    try:
        results = load_results("ctc", gpu)
    except FileNotFoundError:
        return None
    cases, of = [], 0
    for A, N in _all_points():
        row = _row(results, entry_series(results, T=BENCH_T, N=N, A=A), T=BENCH_T, A=A, N=N)
        if row is None or row.get("host_ms") is None:
            continue
        of += 1
        if row["host_ms"] > row["ms"]:
            cases.append((A, N, row["host_ms"] * 1e3, row["ms"] * 1e3))
    return {"cases": cases, "of": of, "card": CARD_NAMES.get(gpu, gpu)}


def host_noise(gpu: str = "nvidia-h200") -> dict | None:
    """How far to trust :func:`host_bound`'s verdicts on one card: over the grid, the widest spread of a case's host
    repetitions, ``widest`` (A, N, (max - min) / median); per alphabet, the smallest and largest median host time,
    ``span`` {A: (µs, µs)}, and whether those medians rise with N, ``ordered`` {A: bool}; and ``fragile``, the
    host-bound cases (median host time above the GPU time) whose fastest repetition is not above it. None where the
    card's rows carry no host repetitions."""
    from studylog.plotting import load_results

    bound = host_bound(gpu)
    if bound is None:
        return None
    results = load_results("ctc", gpu)
    widest, medians = None, {}
    for A, N in _all_points():
        row = _row(results, entry_series(results, T=BENCH_T, N=N, A=A), T=BENCH_T, A=A, N=N)
        if row is None or not row.get("host_spread_ms"):
            continue
        lo, med, hi = row["host_spread_ms"]
        medians.setdefault(A, []).append(med * 1e3)
        if widest is None or (hi - lo) / med > widest[2]:
            widest = (A, N, (hi - lo) / med)
    if widest is None:
        return None
    fragile = []
    for A, N, _, gpu_us in bound["cases"]:
        row = _row(results, entry_series(results, T=BENCH_T, N=N, A=A), T=BENCH_T, A=A, N=N)
        if row.get("host_spread_ms") and row["host_spread_ms"][0] * 1e3 <= gpu_us:
            fragile.append((A, N))
    return {"widest": widest, "span": {A: (min(m), max(m)) for A, m in medians.items()},
            "ordered": {A: m == sorted(m) for A, m in medians.items()}, "fragile": fragile}


def plan_host(gpu: str = "nvidia-h200") -> dict | None:
    """What :class:`studylog.ctc.CTCPlan` does to the host-bound cases of :func:`host_bound` on one card: its host
    time per call (the final step's ``plan`` series: targets set once, workspace allocated once, the kernels only) per
    case, ``plan_us`` {(A, N): µs}; ``cases``, those of :func:`host_bound`'s cases where even the plan's host time is
    above our call's GPU time, (A, N, plan host µs, GPU µs). None where the card's run has no plan series."""
    from studylog.plotting import load_results

    bound = host_bound(gpu)
    if bound is None:
        return None
    results = load_results("ctc", gpu)
    plan = {(r["params"]["A"], r["params"]["N"]): r["ms"] * 1e3
            for r in results.select(f"{CHAPTER.final.series} plan", T=BENCH_T)}
    if not plan:
        return None
    still = [(A, N, plan[A, N], g) for A, N, _, g in bound["cases"] if (A, N) in plan and plan[A, N] > g]
    return {"plan_us": plan, "cases": still}


def cases_words(cases: Iterable[tuple]) -> str:
    """Cases (A, N, ...) in words, grouped by alphabet: "A = 28 at N = 1, 2 and 8; A = 5,000 at N = 1"."""
    by_a: dict[int, list[int]] = {}
    for case in cases:
        by_a.setdefault(case[0], []).append(case[1])

    def listed(ns):
        ns = [str(n) for n in ns]
        return ns[0] if len(ns) == 1 else ", ".join(ns[:-1]) + " and " + ns[-1]

    return "; ".join(f"A = {a:,} at N = {listed(ns)}" for a, ns in by_a.items())


def host_at_headline(A: int, N: int, gpus: Iterable[str] = ("nvidia-h200", "nvidia-h100-80gb-hbm3")) -> dict:
    """Per card with a committed run: our call's GPU-clock time and host time per call at (A, N) (the entry point
    where the card timed it, else the final step), and torch-best's; µs."""
    from studylog.plotting import load_results

    out = {}
    for gpu in gpus:
        try:
            results = load_results("ctc", gpu)
        except FileNotFoundError:
            continue
        ours = _row(results, "ctc_loss", T=BENCH_T, A=A, N=N) or _row(results, CHAPTER.final.series, T=BENCH_T,
                                                                       A=A, N=N)
        torch_row = _row(results, "torch-best", T=BENCH_T, A=A, N=N)
        if ours is None or torch_row is None or ours.get("host_ms") is None:
            continue
        out[gpu] = {"gpu_us": ours["ms"] * 1e3, "host_us": ours["host_ms"] * 1e3,
                    "torch_gpu_us": torch_row["ms"] * 1e3, "torch_host_us": torch_row["host_ms"] * 1e3,
                    "card": CARD_NAMES.get(gpu, gpu)}
    return out


def eager_lead(A: int, N: int) -> dict[str, float]:
    """Per card of :func:`host_at_headline`: the lead at (A, N) when both calls are made eagerly, one after another,
    each costing the larger of its host time and its GPU time (µs): ``{card: torch's / ours}``."""
    return {h["card"]: max(h["torch_host_us"], h["torch_gpu_us"]) / max(h["host_us"], h["gpu_us"])
            for h in host_at_headline(A, N).values()}


def off_grid_dispatch(results) -> list[dict]:
    """Steps 13 and 14 off the dispatch's grid (T = BENCH_T), as the benchmark recorded them on the stress set's
    blank-heavy utterances: T, A, N, the longest extended target's positions (every target has T / 3 labels, at most
    MAX_TARGET_LENGTH), each step's µs, and the faster step. Exercise 5's recorded answer."""
    from studylog.ctc.report import STRESS_A, STRESS_N, STRESS_T
    from studylog.ctc.targets import MAX_TARGET_LENGTH

    out = []
    for T in STRESS_T:
        params = {"T": T, "A": STRESS_A, "N": STRESS_N, "inputs": "blank-heavy"}
        times = {k: _row(results, f"stress {CHAPTER.step(k).series}", **params) for k in (13, 14)}
        if None in times.values():
            continue
        us_ = {k: row["ms"] * 1e3 for k, row in times.items()}
        out.append({"T": T, "A": STRESS_A, "N": STRESS_N, "positions": 2 * min(T // 3, MAX_TARGET_LENGTH) + 1,
                    13: us_[13], 14: us_[14], "faster": min(us_, key=us_.get)})
    return out


def diff_excerpt(diff, what: str | None, *elide: tuple[str, str | None, str], left_out: bool = False,
                 folded: bool = True):
    """The core of a step's change the page shows open: ``diff`` with the runs of lines ``elide`` names left out,
    each replaced by one grey line that says what it holds and how many changed lines. A run is ``(first, last,
    words)``: from the first line (after the file names) that contains ``first`` to the next that contains
    ``last`` (None: to the end), both included. The shown lines keep their hunks, each under a header with its true
    line numbers and counts, so nothing left out reads as the whole change; titled ``new name: what`` (``what``
    None: the new name alone). ``left_out``: the opposite, the runs ``elide`` names and nothing else, each under a
    grey line that says what it holds (the page folds them under the core). ``folded`` False: the grey lines do not
    say "folded below" (lines moved unchanged, said where they go)."""
    import re

    numbered, old_no, new_no = [], 0, 0  # (line, its old and new line numbers) of every line but the headers
    for line in diff.lines[2:]:
        if line.startswith("@@"):
            old_no, new_no = (int(n) for n in re.match(r"@@ -(\d+)(?:,\d+)? \+(\d+)", line).groups())
            numbered.append((None, old_no, new_no))  # a hunk's start: its lines do not follow the one before
            continue
        numbered.append((line, old_no, new_no))
        old_no += line[:1] in " -"
        new_no += line[:1] in " +"
    gaps: dict[int, tuple[int, str]] = {}  # first index of a run left out -> (its end, the grey line)
    for first, last, words in elide:
        a = next(i for i, (ln, _, _) in enumerate(numbered) if ln is not None and first in ln)
        b = len(numbered) - 1 if last is None else next(i for i in range(a, len(numbered))
                                                         if numbered[i][0] is not None and last in numbered[i][0])
        changed = sum(ln is not None and ln[:1] in "+-" for ln, _, _ in numbered[a:b + 1])
        gaps[a] = (b, f"@@ ⋯ {words}: {changed} changed lines{', folded below' if folded else ''} @@"
                   if not left_out else f"@@ ⋯ {words} @@")
    out, run, i = [], [], 0

    def close():  # the run of shown lines, under a header with its true numbers
        if run:
            olds, news = [o for ln, o, _ in run if ln[:1] in " -"], [n for ln, _, n in run if ln[:1] in " +"]
            start_old, start_new = run[0][1], run[0][2]
            start_old -= not olds  # an empty side is numbered by the line before it, as diff does
            start_new -= not news
            out.append(f"@@ -{start_old},{len(olds)} +{start_new},{len(news)} @@")
            out.extend(ln for ln, _, _ in run)
            run.clear()

    while i < len(numbered):
        if i in gaps and left_out:  # the run itself, under its grey line; what lies between runs is the core
            close()
            end, grey = gaps[i]
            out.append(grey)
            for j in range(i, end + 1):
                if numbered[j][0] is None:
                    close()
                else:
                    run.append(numbered[j])
            close()
            i = end + 1
            continue
        if i in gaps:
            close()
            end, grey = gaps[i]
            out.append(grey)
            i = end + 1
            continue
        if left_out:
            i += 1
            continue
        if numbered[i][0] is None:
            close()
        else:
            run.append(numbered[i])
        i += 1
    close()
    core = _Core.__new__(_Core)
    core.old_name, core.new_name = diff.old_name, diff.new_name if what is None else f"{diff.new_name}: {what}"
    core.lines = diff.lines[:2] + out
    core.whole = (len(diff.added), len(diff.removed))
    return core


def _core_class():
    from studylog.source import Diff

    class Core(Diff):
        """A diff core whose title counts the whole change beside the lines shown: "(+13 / −8 of +30 / −27
        lines)"."""

        def _repr_html_(self) -> str:
            shown = f"(+{len(self.added)} / −{len(self.removed)} lines)"
            if (len(self.added), len(self.removed)) == tuple(self.whole):
                return super()._repr_html_()
            whole = f"(+{len(self.added)} / −{len(self.removed)} of +{self.whole[0]} / −{self.whole[1]} lines)"
            return super()._repr_html_().replace(shown, whole, 1)

    return Core


_Core = _core_class()


#: Steps 4, 6, 7 (7a) and 13, whose diff the page shows after a change of signature or names that its one sentence
#: above the diff says: the old side takes the new side's signature (its lines up to the first ") {"), then the
#: ``replace`` pairs the sentence names (each found in the old body); the titles name the two sides so made.
PREAMBLES = {
    4: (("ctc_baseline.cuh", "ctc_step04_05_blocked.cu", "alpha_baseline", "ctc_alpha_step4"),
        (("<LDG>", "<true>"),),  # the template flag LDG is gone: its uses take step 3's value
        ("step 3's alpha, step 4's signature", "step 4's alpha")),
    6: (("ctc_step04_05_blocked.cu", "ctc_step06_probability.cu", "ctc_alpha_step5", "ctc_alpha_step6"),
        (("warp_maxima", "warp_sums"),  # the renames the page's sentence names: the row's sums, not its maxima
         ("const float* lp = log_probs +", "const float* y = probs +"), ("__ldg(lp + ", "__ldg(y + ")),
        ("step 5's alpha, step 6's names", "step 6's alpha")),
    7: (("ctc_warpctc.cuh", "ctc_step07_10_three_passes.cu", "frame_gradient", "ctc_grad_from_log_softmax"),
        (),  # a function of beta's frame loop given the kernel's signature: its arguments, every tensor it reads
        ("step 5's frame gradient, step 7a's signature", "step 7a's")),
    13: (("ctc_step07_10_three_passes.cu", "ctc_step13_two_passes.cu", "ctc_fused_stats", "ctc_stats_softmax"),
         (("    const float* xr = x + (size_t)row * A;\n",  # g: the frame's row of the new argument grad
           "    const float* xr = x + (size_t)row * A;\n    float* g = grad + (size_t)row * A;\n"),),
         ("steps 8 to 12's first pass, step 13's signature and g", "step 13's")),
}
#: Lines of context around each change of a diff of :data:`PREAMBLES` (7a's shows its kernel's whole signature).
PREAMBLE_CONTEXT = {7: 6}


def signature(code: str) -> str:
    """A function's lines up to its body's opening brace (the first line ending ") {"), included."""
    return code[:code.index(") {\n") + len(") {\n")]


def preamble_sides(number: int) -> tuple[str, str]:
    """The two sides of step ``number``'s diff (:data:`PREAMBLES`), comments left out: the old function with the
    new one's signature and the named replacements, and the new function."""
    from studylog.source import source_of

    (old, new, old_function, new_function), replace, _ = PREAMBLES[number]
    before, after = (code_only(source_of(f, fn)[0]) for f, fn in ((old, old_function), (new, new_function)))
    body = before[len(signature(before)):]
    for a, b in replace:
        assert a in body, (number, a)
        body = body.replace(a, b)
    return signature(after) + body, after


def step_diff(number: int, part: int | None = None):
    """Step ``number``'s whole diff after the change of signature its page sentence says (:data:`PREAMBLES`),
    comments left out, titled with its counts; for a step of :data:`PARTS`, ``part`` (1 or 2) picks one of its two
    diffs, each whole in itself (the second starts where the first ends, and ends at the step's source)."""
    from studylog.source import show_diff

    if number in PARTS and part is not None:
        sides, names = step_stages(number), PARTS[number][2]
        return diff_excerpt(show_diff(sides[part - 1], sides[part], names=names[part - 1]), None,
                            *MOVED.get((number, part), ()), folded=False)
    old, new = preamble_sides(number)
    return diff_excerpt(show_diff(old, new, names=PREAMBLES[number][2], context=PREAMBLE_CONTEXT.get(number, 3)),
                        None)


#: Steps 11 and 13, whose diff the page shows in two parts, each with its own sentence: (the sources, as
#: :data:`PREAMBLES` has them; how the middle version is made; the titles of the two diffs). Step 11's middle is its
#: frame update with step 10's backward direction (part 1: forward; part 2: backward, the mirror image); step 13's is
#: step 12's first pass (step 13's signature and ``g`` as :data:`PREAMBLES` gives them) that writes the softmax as
#: the gradient by reading the frame again: zeros past the input, ``write_softmax`` last (part 1); part 2 holds the
#: frame in registers so that it is read once.
PARTS = {
    11: (("ctc_step07_10_three_passes.cu", "ctc_step11_12_branch_free.cu", "FrameUpdate", "FrameUpdate"),
         "backward",
         (("step 10's frame update", "step 11's, forward"), ("step 11's, forward", "step 11's"))),
    13: (None,
         (("    if (t >= __ldg(input_lengths + n)) return;  // the whole block: this frame is past the input\n", ""),
          ("    float* g = grad + (size_t)row * A;\n",
           "    float* g = grad + (size_t)row * A;\n    if (t >= __ldg(input_lengths + n)) {  // past the input: no "
           "gradient (the whole block)\n        fill_frame(g, A, 0.0f);\n        return;\n    }\n"),
          ("    write_emissions(em, xr, labels, n, Lmax, L, lse);\n",
           "    write_emissions(em, xr, labels, n, Lmax, L, lse);\n    write_softmax(g, xr, A, vectorised, lse);  "
           "// each thread re-reads exactly the float4s it reduced above\n")),
         (("steps 8 to 12's first pass, step 13's signature and g", "the softmax written as the gradient"),
          ("the softmax written as the gradient", "step 13's: the frame read once"))),
}


#: Lines a part of :data:`PARTS` moves unchanged, each run shown as one grey line that says where it goes, so
#: that the step's open diffs stay within 40 changed lines together: (first, last, words) as :func:`diff_excerpt`.
MOVED = {(13, 2): (("-    const float lse = frame_lse", "-    if (threadIdx.x == 0) row_lse",
                    "the log-sum-exp and its store move unchanged to the path after the branch"),
                   ("+    const float lse = frame_lse", "+    if (threadIdx.x == 0) row_lse",
                    "the log-sum-exp and its store, moved here unchanged"))}


def step_stages(number: int) -> tuple[str, str, str]:
    """The three versions of a step of :data:`PARTS`, comments left out: the old function (for step 13, with
    :data:`PREAMBLES`' signature and ``g``), the middle one, and the new function."""
    from studylog.source import source_of

    sources, how, _ = PARTS[number]
    if number == 11:
        old_file, new_file, old_function, new_function = sources
        old, new = (code_only(source_of(f, fn)[0]) for f, fn in ((old_file, old_function), (new_file, new_function)))
        o, n = old.splitlines(), new.splitlines()
        i = next(k for k, ln in enumerate(o) if ln.strip() == "} else {")
        j = next(k for k, ln in enumerate(n) if ln.strip() == "} else {")
        middle = n[:j + 1] + o[i + 1:_block_end(o, i)] + n[_block_end(n, j):]
        return old, "\n".join(middle) + "\n", new
    old, new = preamble_sides(number)
    middle = old
    for a, b in how:
        assert a in middle, (number, a)
        middle = middle.replace(a, b)
    return old, middle, new


def code_only(text: str) -> str:
    """CUDA C++ source without its comment lines (a line whose first non-blank characters are ``//``): a step's
    diff shows the code that changed, not comments rewrapped or rewritten beside it."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//")) + "\n"


def listing(file: str, function: str, title: str | None = None):
    """A function of a ``.cu``/``.cuh`` file shown without its comment lines (the page's prose says what it does)."""
    from studylog.source import Code, source_of

    return Code(code_only(source_of(file, function)[0]), "cuda", title)


def _resolve_depth(lines: list[str], depth: int) -> list[str]:
    """``lines`` of a template body with its prefetch switches resolved for ``DEPTH = depth``: an ``if constexpr
    (DEPTH > 0)`` / ``(DEPTH == 0)`` block kept (its body dedented one level) or dropped, and the refill ``if
    (DEPTH > 0 && ...)`` kept as a plain ``if`` or dropped with the line before it that only feeds it."""
    out, i = [], 0
    while i < len(lines):
        ln = lines[i].strip()
        if ln.startswith("if constexpr (DEPTH"):
            end = _block_end(lines, i)
            holds = (depth > 0) if "DEPTH > 0" in ln else (depth == 0)
            if holds:
                out += [x[4:] if x.startswith(_indent(lines[i]) + "    ") else x for x in lines[i + 1:end]]
            i = end + 1
            continue
        if ln.startswith("if (DEPTH > 0 && "):
            end = _block_end(lines, i)
            if depth > 0:
                out.append(lines[i].replace("DEPTH > 0 && ", ""))
                out += lines[i + 1:end + 1]
            else:
                out.pop()  # the line that names the slot's next frame
            i = end + 1
            continue
        out.append(lines[i])
        i += 1
    return out


def step07_prefetch_core():
    """Step 7's last change against 7b: the recursion's frame loop (``block_direction_rows``, the one template both
    compile from) at ``DEPTH = 0``, each frame's emissions loaded by its own update, and at ``DEPTH = PREFETCH``,
    loaded that many frames ahead into a ring of register slots; the rest of the body, the same in both, left out."""
    from book.ctc.compiled import PREFETCH_FRAMES
    from studylog.source import show_diff, source_of

    body = code_only(source_of("ctc_step07_10_three_passes.cu", "block_direction_rows")[0]).splitlines()
    a = next(i for i, ln in enumerate(body) if "constexpr int SLOTS" in ln)
    b = next(i for i, ln in enumerate(body) if "const float* prev = row[b ^ 1];" in ln)
    c = next(i for i, ln in enumerate(body) if "const int kn = k + DEPTH;" in ln)
    d = next(i for i in range(c, len(body)) if "__syncthreads();" in body[i])
    cut = body[a:b] + [_indent(body[b]) + "// ... the frame's update, as in 7b"] + body[c:d + 1]
    def slots(depth: int) -> list[str]:  # DEPTH as each instantiates it: 0 (7b), PREFETCH (step 7)
        lines = [(_indent(ln) + f"constexpr int SLOTS = {max(depth, 1)};") if "constexpr int SLOTS" in ln else ln
                 for ln in _resolve_depth(cut, depth)]
        return [ln.replace("DEPTH", "SLOTS" if depth else "PREFETCH") for ln in lines]  # SLOTS = DEPTH from 1 on

    shift = len(_indent(cut[0])) - 4
    side = lambda lines: "\n".join(ln[shift:] if ln.startswith(" " * shift) else ln for ln in lines) + "\n"
    return show_diff(side(slots(0)), side(slots(PREFETCH_FRAMES)),
                     names=("step 7b: a frame's emissions loaded by its update",
                            f"step 7c: loaded {PREFETCH_FRAMES} frames ahead"))


def comment_free_diff(old, new, *, old_function: str, new_function: str, names: tuple[str, str], context: int = 3):
    """The diff (:func:`studylog.source.show_diff`) between two functions of ``.cu`` files, comment lines left out on
    both sides (:func:`code_only`): a file's comment header rewritten for the new step is no change of code."""
    from studylog.source import show_diff, source_of

    return show_diff(code_only(source_of(old, old_function)[0]), code_only(source_of(new, new_function)[0]),
                     context=context, names=names)


def show_diff_without_comments(old, new, *, old_function: str, new_function: str, names: tuple[str, str]):
    """A step's whole diff between two functions of ``.cu`` files, comments left out (:func:`comment_free_diff`),
    titled with its counts (:func:`diff_excerpt`)."""
    return diff_excerpt(comment_free_diff(old, new, old_function=old_function, new_function=new_function,
                                          names=names), None)


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


def _block_end(lines: list[str], start: int) -> int:
    """The index of the line that closes the block opened on ``lines[start]`` (a line at its indent starting "}")."""
    return next(j for j in range(start + 1, len(lines)) if lines[j].startswith(_indent(lines[start]) + "}"))


def step9_core():
    """Step 9's frame update (``FrameUpdate``), its forward direction: the lane's ``V`` positions, the neighbour's
    by ``__shfl_up_sync``; the backward direction, its mirror image, is one comment."""
    from studylog.source import Code, show_source

    lines = show_source("ctc_step07_10_three_passes.cu", function="FrameUpdate").text.rstrip("\n").splitlines()
    other = next(i for i, ln in enumerate(lines) if ln.strip() == "} else {")
    end = _block_end(lines, other)
    body = _indent(lines[other]) + "    "
    out = lines[:other + 1] + [body + "// backward: the mirror image, neighbours by __shfl_down_sync"] + lines[end:]
    return Code("\n".join(out), "cuda", "step 9's frame update, forward (the backward direction elided)")


def step14_core():
    """Step 14's change to a frame of the recursion, forward: the warp's boundary value read from and written to
    shared memory (``exchange``, by frame parity), the block's maximum from every warp's, one ``__syncthreads``;
    against one frame of steps 10 to 13's one-warp recursion. The lane's update loop (as before, with the boundary
    from the warp to the left) and the backward direction are one comment each."""
    from studylog.source import show_diff, source_of

    old = source_of("ctc_warp_recursion.cuh", "warp_recursion_direction")[0].splitlines()
    new = source_of("ctc_step14_warps.cu", "ctc_warps_direction")[0].splitlines()
    a = next(i for i, ln in enumerate(old) if "the old row's maximum is reduced" in ln)
    b = next(i for i, ln in enumerate(old) if "Update::template frame" in ln)
    old_cut = old[a:b + 1]
    a = next(i for i, ln in enumerate(new) if "const float chunk_max" in ln)
    b = next(i for i, ln in enumerate(new) if ln.strip() == "offset = prev_max;")
    cut = new[a:b + 1]
    loop = next(i for i, ln in enumerate(cut) if ln.strip().startswith("for (int i = V - 1;"))
    cut[loop - 1:_block_end(cut, loop) + 1] = [_indent(cut[loop]) + "// ... the lane's V positions updated as in "
                                                "step 13, position s0 - 1 read as up1"]
    other = next(i for i, ln in enumerate(cut) if ln.strip() == "} else {")
    cut[other + 1:_block_end(cut, other)] = [_indent(cut[other]) + "    // backward: the mirror image, the "
                                             "boundary values of warp + 1"]
    shift = len(_indent(cut[0])) - 4  # both sides at the frame loop's indent: dedented to one level

    def side(lines: list[str]) -> str:
        return "\n".join(ln[shift:] if ln.startswith(" " * shift) else ln for ln in lines) + "\n"

    return show_diff(side(old_cut), side(cut), names=("steps 10 to 13: a frame, one warp", "step 14: a frame, W warps"))
