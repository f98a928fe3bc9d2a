"""What notebook 02 reads from a results file, in one place: the numbers its prose quotes (glued with myst-nb),
each step's time against the floor, the result against torch and against the practitioners' path, where we lose,
the table of what did not help (with ``lab/masked_lm_head``), and the targets' and host-time tables.

Every function takes a :class:`studylog.plotting.Results` and reads series by the names the benchmark writes
(``CHAPTER.steps``, ``CHAPTER.baselines``). Where a file predates a series (the first, do_bench run has no
plan, no peer and no host time) a table says so and a prose number reads :data:`PENDING` instead of failing.

The floor of a call is the book's (:func:`book.common.floor_ms`, the scoreboard's): the larger of the bytes it
must move at the copy bandwidth measured in the same run (the allowed rows of the weight, the union's for a batch,
plus the fp32 ``[B, V]`` output) and the card's fastest empty kernel. The benchmark file's own ``floor_ms`` values
are not read here: the lesson computes its floor from the bytes, so the page and the scoreboard agree.
"""

from __future__ import annotations

import json
from typing import Any

from book import common
from book.common import PENDING, fmt, lab_or_none, latency_floor_ms, param_values, us
from studylog.masked_lm_head import CHAPTER
from studylog.masked_lm_head.dispatch import rows_by_case, step_series
from studylog.masked_lm_head.report import PLAN, XGRAMMAR, XGRAMMAR_BF16
from studylog.masked_lm_head.formats import HIDDEN, VOCAB

__all__ = ["PENDING", "CANDIDATES_FILE", "CANDIDATES_GPU", "FIRST_ONE_CLOCK_FILE", "call_bytes", "byte_floor_ms",
           "clock_of", "prose_numbers", "steps_table", "batch_table", "practitioners_table", "losses_table",
           "tried_table", "target_report", "host_table", "our_kernels", "floor_ms", "STEP_CASES", "MAIN_CASE",
           "MAIN_LINE", "TRIED", "CHANGES", "MAIN_RIVALS", "loss_us", "main_steps_table", "step_base", "TRIED_MARK",
           "own_case_steps", "steps_note", "table_us", "chain_base", "PARTS", "bitmask_copy_ms", "OWN_STEPS",
           "CHANGES_FROM_HOST", "rows_sweep_us",
           "result_table", "inline_html", "step_factor", "step_factor_at", "step_floor_ms",
           "paid_words", "rotation", "counts_words", "CHAIN_HEADER", "LATER_HEADER", "STEP13_RATIO",
           "later_steps_table", "HOOKS", "without_hooks", "listing_without_hooks",
           "hook_diff", "HEADLINE_POINTS",
           "TIE", "headline_words", "CAPPED", "capped", "page_capped_key", "PRACTITIONER_POINTS",
           "html_table", "folded", "loss_account", "plan_timeline", "plan_parts", "plan_timeline_table", "mean_period",
           "TIMELINE_PARTS", "timeline_idle", "RIVAL_WORDS", "dense_clusters", "capped_key", "loss_counts", "tied",
           "is_tie", "ties", "ties_words", "dispatch_step", "plan_step", "PATH_STEPS", "PATH_WORDS", "path_words",
           "losses", "COMPILED_GATHER", "compiled_gather_leads", "compiled_gather_times", "compiled_gather_words"]

#: ``lab/masked_lm_head/results/<gpu>/<name>.json``: the first (do_bench) run, with the streaming kernel's candidates.
CANDIDATES_FILE, CANDIDATES_GPU = "candidates_do_bench", "nvidia-h200"
#: The first run of the benchmark on the GPU clock (an H100), kept in ``lab/``.
FIRST_ONE_CLOCK_FILE = "first_one_clock_run"
#: Batch-1 allowed counts the steps table shows.
STEP_COUNTS = (1, 1000, 10_000)


def call_bytes(batch: int, union: int) -> int:
    """The bytes a call must move: ``union`` rows of the bf16 ``[V, D]`` weight read, the fp32 ``[batch, V]``
    output written."""
    return union * HIDDEN * 2 + batch * VOCAB * 4


def byte_floor_ms(results, batch: int, union: int) -> float:
    """The time to move a call's bytes (:func:`call_bytes`) at the run's copy bandwidth, which counts bytes read
    plus bytes written, as the sum does."""
    return call_bytes(batch, union) / (results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9) * 1e3


def floor_ms(results, batch: int, union: int) -> float:
    """The least time a call can take, in ms: the book's floor (:func:`book.common.floor_ms`, the scoreboard's), the
    larger of the call's bytes at the run's copy bandwidth (:func:`byte_floor_ms`) and the card's fastest empty
    kernel (:func:`book.common.latency_floor_ms`)."""
    return common.floor_ms(results, call_bytes(batch, union))


def _row(results, series: str, layout: str = "vd", **params) -> dict | None:
    """The one row of ``series`` at these parameters (our kernels on ``layout``; baselines have none)."""
    rows = [r for r in results.select(series, **params) if r["params"].get("layout", "vd") == layout]
    return rows[0] if len(rows) == 1 else None


def _ms(results, series: str, layout: str = "vd", **params) -> float | None:
    row = _row(results, series, layout, **params)
    return None if row is None else row["ms"]


def clock_of(results) -> str:
    """``GPU clock`` for files timed by CUDA-graph replay, ``do_bench`` for the first run."""
    clocks = {r["clock"] for r in results.rows}
    return "GPU clock" if clocks == {"gpu"} else ", ".join(sorted(clocks))


def _floor(results, batch: int, kind: str, allowed: int) -> float | None:
    for series in (step_series(12), "dense_mask"):
        row = _row(results, series, batch=batch, kind=kind, allowed=allowed)
        if row is not None and "union" in row:
            return floor_ms(results, batch, row["union"])
    return None


def _us(ms: float | None, digits: int = 1) -> str:
    """A prose time: ``12.3 µs``, no decimals from 100 µs on, :data:`PENDING` where there is none."""
    return PENDING if ms is None else f"{us(ms, 0 if ms * 1e3 >= 100 else digits)} µs"


def _x(ratio: float | None, digits: int = 2) -> str:
    return fmt(ratio, f".{digits}f", "×")


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def _change(before: float | None, after: float | None) -> str:
    """``after`` against ``before`` in words: ``2.4× faster``, ``3% faster`` (under 1.1×), ``0.4% slower``, ``9%
    slower``, ``24.94× slower`` (from 2×)."""
    if before is None or after is None:
        return PENDING
    if after <= before:
        ratio = before / after  # two decimals, as the table of steps prints the same ratio
        return f"{ratio:.2f}× faster" if ratio >= 1.1 else f"{_pct(ratio - 1)} faster"
    return f"{after / before:.2f}× slower" if after >= 2 * before else f"{_pct(after / before - 1)} slower"


def _pct(fraction: float) -> str:
    """``3%``; under 1%, one decimal (``0.4%``), so that a small difference does not read as none."""
    return f"{100 * fraction:.0f}%" if fraction >= 0.01 else f"{100 * fraction:.1f}%"


def batch1_ms(results, series: str, allowed: int, layout: str = "vd", kind: str = "random") -> float | None:
    return _ms(results, series, layout, batch=1, kind=kind, allowed=allowed)


#: Step 12's rivals as the prose names them.
RIVAL_WORDS = {"index_select": "`index_select` + matmul", "dense_mask": "dense + mask",
               "cublas_fp32_mask": "cuBLAS with fp32 output, then `masked_fill`"}


#: The headline's points (batch, masks, allowed per sequence): the answer at batch 1, then its range over the
#: practitioners' table's larger batches at the same 1,000 allowed tokens (batch 256 is where the paths meet).
HEADLINE_POINTS = ((1, "random", 1000), (64, "random", 1000), (256, "random", 1000))


#: Two times within this fraction of each other (the larger over the smaller) are a tie, said with both times, not
#: as a ratio of 1.0×, and not counted as a loss: the course's rule (How we measure), one for the whole page
#: (:func:`tied`).
TIE = 0.03


def tied(a: float, b: float) -> bool:
    """Whether times ``a`` and ``b`` are a tie (:data:`TIE`)."""
    return max(a, b) <= min(a, b) * (1 + TIE)


def headline_words(times: dict[int, tuple[float, float]]) -> tuple[str, str]:
    """The headline from ``times`` (batch -> our time, xgrammar's path's, ms), in two parts: the batches where ours
    is faster by more than :data:`TIE` (``10.58× at batch 1 and 1.92× at batch 64``: two decimals, as the landing
    page and the results page print them), then the others, each with both times (``; at batch 256 the two tie,
    within 3% (ours 474.2 µs, xgrammar's path 473.1)``, or ours slower)."""
    faster, rest = [], []
    for batch, (ours, theirs) in times.items():
        x = theirs / ours
        both = f"(ours {ours * 1e3:,.1f} µs, xgrammar's path {theirs * 1e3:,.1f})"
        if x > 1 + TIE:
            faster.append(f"{x:.2f}× at batch {batch}")
        elif tied(ours, theirs):  # the page's first tie: its rule said here, once
            rest.append(f"at batch {batch} the two tie, within {TIE:.0%} {both}")
        else:
            rest.append(f"at batch {batch} ours is {1 / x:.2f}× slower {both}")
    said = ", ".join(faster[:-1]) + (" and " if len(faster) > 1 else "") + (faster[-1] if faster else "")
    return said, "".join(f"; {r}" for r in rest)


def prose_numbers(results) -> dict[str, Any]:
    """Every number the lesson's prose quotes, by glue key, read from ``results`` (``pending`` where the file
    lacks the series)."""
    s = {n: step_series(n) for n in range(14)}
    n: dict[str, Any] = {"mlh_gpu": results.gpu, "mlh_date": results.date, "mlh_clock": clock_of(results)}
    bandwidth = results.data["ceilings"]["copy_bandwidth_gbs"]
    n["mlh_bandwidth"] = f"{bandwidth:,.0f} GB/s"  # the unit of the figures' captions
    n["mlh_weight_mb"] = f"{VOCAB * HIDDEN * 2 / 1e6:.0f} MB"
    n["mlh_weight_read"] = _us(byte_floor_ms(results, 0, VOCAB))
    n["mlh_rows1000_read"] = _us(byte_floor_ms(results, 0, 1000), 2)  # two decimals, as its sum (the floor) has
    n["mlh_output_b1"] = _us(byte_floor_ms(results, 1, 0), 2)
    # the floor of a call: its bytes, or the card's fastest empty kernel where larger
    n["mlh_empty"] = _us(latency_floor_ms(results) or None, 2)
    n["mlh_floor_b1_1000"] = _us(floor_ms(results, 1, 1000), 2)
    n["mlh_floor_b1_1"] = _us(floor_ms(results, 1, 1), 2)
    dense = {c: batch1_ms(results, "dense_mask", c) for c in STEP_COUNTS}
    n["mlh_dense_1000"] = _us(dense[1000])

    # step 0: the tutorial's matmul reads the whole weight, like cuBLAS
    n["mlh_step00_1000"] = _us(batch1_ms(results, s[0], 1000))
    n["mlh_step00_vs_read"] = _x(_ratio(batch1_ms(results, s[0], 1000), byte_floor_ms(results, 1, VOCAB)))
    n["mlh_dense_floor_b1"] = _us(byte_floor_ms(results, 1, VOCAB))  # a dense head's floor: every row read
    n["mlh_step00_vs_floor"] = _x(_ratio(batch1_ms(results, s[0], 1000), _floor(results, 1, "random", 1000)), 0)
    # step 1: block skipping keeps the active blocks' share of the time
    for c in (1000, 10_000):
        n[f"mlh_step01_share_{c}"] = f"{_ratio(batch1_ms(results, s[1], c), batch1_ms(results, s[0], c)):.2f}" \
            if batch1_ms(results, s[1], c) and batch1_ms(results, s[0], c) else PENDING
    n["mlh_step01_1"] = _us(batch1_ms(results, s[1], 1))
    # step 2: column masking, on both layouts
    n["mlh_step02_dv"] = _change(batch1_ms(results, s[1], 1000, "dv"), batch1_ms(results, s[2], 1000, "dv"))
    n["mlh_step02_dv_10000"] = _change(batch1_ms(results, s[1], 10_000, "dv"), batch1_ms(results, s[2], 10_000, "dv"))
    n["mlh_step02_vd"] = _change(batch1_ms(results, s[1], 1000), batch1_ms(results, s[2], 1000))
    # step 3: step 2 written for [V, D]
    n["mlh_step03_vs_step02"] = _change(batch1_ms(results, s[2], 1000), batch1_ms(results, s[3], 1000))
    n["mlh_step03_1"] = _us(batch1_ms(results, s[3], 1))
    n["mlh_step03_1000"] = _us(batch1_ms(results, s[3], 1000))
    # step 4: compacted ids
    n["mlh_step04_vs_step03"] = _change(batch1_ms(results, s[3], 1000), batch1_ms(results, s[4], 1000))
    n["mlh_step04_1000"] = _us(batch1_ms(results, s[4], 1000), 2)  # two decimals under 10 µs, as the tables of steps
    n["mlh_step04_vs_step02"] = _change(batch1_ms(results, s[2], 1000), batch1_ms(results, s[4], 1000))
    # steps 5 to 7, each against the step it builds on (step 7 on step 5: step 6 did not pay), at every batch-1 count
    # the table of steps' point is one of
    for step, base in ((5, 4), (6, 5), (7, 5)):
        for c in STEP_COUNTS:
            n[f"mlh_step{step:02d}_vs_step{base:02d}_{c}"] = _change(batch1_ms(results, s[base], c), batch1_ms(results, s[step], c))
        n[f"mlh_step{step:02d}_{STEP_CASES[step][0]['allowed']}"] = _us(batch1_ms(results, s[step],
                                                                          STEP_CASES[step][0]["allowed"]))
    n["mlh_floor_10000"] = _us(_floor(results, 1, "random", 10_000))
    # step 8: ids as launch arguments
    n["mlh_step08_1"] = _us(batch1_ms(results, s[8], 1), 2)  # two decimals under 10 µs, as the tables of steps
    n["mlh_step08_vs_step07_1"] = _change(batch1_ms(results, s[7], 1), batch1_ms(results, s[8], 1))
    n["mlh_step08_vs_step07_8"] = _change(batch1_ms(results, s[7], 8), batch1_ms(results, s[8], 8))
    # steps 9 and 10: the union of a batch, read once, at the table of steps' point (batch 64)
    b64 = STEP_CASES[10][0]
    row10 = _row(results, s[10], **b64)
    n["mlh_b64_allowed"] = f"{b64['allowed']:,}"
    n["mlh_b64_union"] = f"{row10['union']:,}" if row10 else PENDING
    n["mlh_b64_sum"] = f"{b64['batch'] * b64['allowed']:,}"
    for step in (9, 10):
        row = _row(results, s[step], **b64)
        n[f"mlh_step{step:02d}_b64"] = PENDING if row is None else f"{us(row['ms'])} µs"  # the table's digits
    n["mlh_step09_b64_vs_step03"] = _change(_ms(results, s[3], **b64), _ms(results, s[9], **b64))
    n["mlh_step10_b64_vs_step09"] = _change(_ms(results, s[9], **b64), _ms(results, s[10], **b64))
    n["mlh_step10_b64_vs_dense"] = _change(_ms(results, "dense_mask", **b64), _ms(results, s[10], **b64))
    n["mlh_step10_b64_vs_step03"] = _change(_ms(results, s[3], **b64), _ms(results, s[10], **b64))
    big = dict(batch=64, kind="random", allowed=10_000)
    n["mlh_step10_b64_big_vs_step03"] = _change(_ms(results, s[3], **big), _ms(results, s[10], **big))
    row_big = _row(results, s[10], **big)
    n["mlh_b64_big_union"] = f"{row_big['union'] / VOCAB:.0%}" if row_big else PENDING
    # step 11: a reordered vocabulary, on the real masks
    real = [r for r in results.select(s[11], batch=1) if r["params"]["allowed"] == 1000]
    if real:
        r11 = real[0]
        p = r11["params"]
        n["mlh_step11_blocks"] = f"{r11['active_blocks_original']:,} → {r11['active_blocks']:,}"
        n["mlh_step11_vs_step03"] = _change(_ms(results, s[3], **p), r11["ms"])
        n["mlh_step07_vs_step11"] = _change(r11["ms"], _ms(results, s[7], **p))
    else:
        n["mlh_step11_blocks"] = n["mlh_step11_vs_step03"] = n["mlh_step07_vs_step11"] = PENDING
    # step 12: the dispatch against torch
    # step 12 against the dense path on the chapter's contract (cuBLAS with fp32 output, then masked_fill: steady,
    # where dense + mask's bf16 logits run at two speeds at batch 1, dense_clusters), up to 1,000 allowed: the
    # smallest ratio ("at least") and the point that gives it
    small = [(d["ms"] / r["ms"], r["params"]) for r in results.select(s[12], batch=1)
             if r["params"]["allowed"] <= 1000 and r["params"].get("layout", "vd") == "vd"
             for d in [_row(results, "cublas_fp32_mask", batch=1, kind=r["params"]["kind"],
                            allowed=r["params"]["allowed"])] if d is not None]
    if small:
        low, p = min(small, key=lambda q: q[0])
        n["mlh_dispatch_min_vs_fp32"] = f"{low:.0f}×"
        n["mlh_dispatch_min_at"] = f"{p['allowed']:,} allowed on {p['kind']} masks"
    else:
        n["mlh_dispatch_min_vs_fp32"] = n["mlh_dispatch_min_at"] = PENDING
    n["mlh_fp32_1000"] = _us(batch1_ms(results, "cublas_fp32_mask", 1000))
    n["mlh_step00_vs_fp32"] = _change(batch1_ms(results, "cublas_fp32_mask", 1000), batch1_ms(results, s[0], 1000))
    n["mlh_dispatch_vs_index_10000"] = _x(_ratio(batch1_ms(results, "index_select", 10_000), batch1_ms(results, s[12], 10_000)))
    # the kernel alone against the fastest same-shape rival, at the headline's point (the scoreboard's second row)
    n["mlh_index_1000"] = _us(batch1_ms(results, "index_select", 1000))
    n["mlh_dispatch_vs_index_1000"] = _x(_ratio(batch1_ms(results, "index_select", 1000), batch1_ms(results, s[12], 1000)))
    worst = max(((r["ms"] / d["ms"], r["params"]) for r in results.select(s[12])
                 for d in [_row(results, "dense_mask", batch=r["params"]["batch"], kind=r["params"]["kind"],
                                allowed=r["params"]["allowed"])] if d is not None), default=None, key=lambda q: q[0])
    n["mlh_dispatch_worst"] = (f"{worst[0]:.2f}× the time (batch {worst[1]['batch']}, {worst[1]['allowed']:,} "
                               f"{worst[1]['kind']} per sequence)") if worst else PENDING
    # and against every rival the losses table lists (index_select returns only the union's logits)
    lost12 = [(q["mine"]["ms"] / q["rival"]["ms"], q) for q in _losses(results)
              if q["mine"]["series"] == s[12] and not is_tie(q)]
    if lost12:
        ratio, q = max(lost12, key=lambda x: x[0])
        p = q["params"]
        n["mlh_dispatch_worst_any"] = (f"{ratio:.2f}× the time of {RIVAL_WORDS[q['rival']['series']]} (batch "
                                       f"{p['batch']}, {p['allowed']:,} {p['kind']} per sequence)")
    else:
        n["mlh_dispatch_worst_any"] = PENDING
    # host time and the plan
    empty = results.data.get("ceilings", {}).get("empty_launch_host_ms")
    hosts = sorted(r["host_ms"] for r in results.select(s[12], batch=1) if "host_ms" in r)
    n["mlh_host_dispatch"] = _us(hosts[len(hosts) // 2]) if hosts else PENDING
    n["mlh_host_empty"] = _us(empty) if empty else PENDING
    n["mlh_host_ratio"] = _x(hosts[len(hosts) // 2] / empty, 1) if hosts and empty else PENDING
    plan_1000 = batch1_ms(results, PLAN, 1000)
    n["mlh_plan_1000"] = _us(plan_1000)
    n["mlh_dispatch_1000"] = _us(batch1_ms(results, s[12], 1000), 2)  # two decimals: the tables of steps' digits
    # against the practitioners' path
    for key, batch, allowed in (("b1", 1, 1000), ("b64", 64, 1000)):
        mine = _ms(results, PLAN, batch=batch, kind="random", allowed=allowed)
        theirs = _ms(results, XGRAMMAR, batch=batch, kind="random", allowed=allowed)
        n[f"mlh_plan_vs_xgr_{key}"] = _x(_ratio(theirs, mine))  # two decimals, as the headline
        n[f"mlh_xgr_{key}"] = _us(theirs)
    # the headline with its range: the whole step against xgrammar's path at each batch of HEADLINE_POINTS, a
    # point within TIE of parity said as a tie with both times
    times = {b: (_ms(results, PLAN, batch=b, kind=k, allowed=a), _ms(results, XGRAMMAR, batch=b, kind=k, allowed=a))
             for b, k, a in HEADLINE_POINTS}
    if all(all(pair) for pair in times.values()):
        n["mlh_headline"], n["mlh_headline_rest"] = headline_words(times)
    else:
        n["mlh_headline"], n["mlh_headline_rest"] = PENDING, ""
    (_, _, first), *others = HEADLINE_POINTS
    n["mlh_headline_points"] = (f"{first:,} allowed tokens per sequence" if all(a == first for _, _, a in others)
                                else PENDING)  # the page states one count for every batch
    n["mlh_xgr_bf16_b1"] = _change(_ms(results, XGRAMMAR, batch=1, kind="random", allowed=1000),
                                   _ms(results, XGRAMMAR_BF16, batch=1, kind="random", allowed=1000))
    pairs = []
    for r in results.select(PLAN):
        p = {k: v for k, v in r["params"].items() if k != "layout"}
        theirs = _ms(results, XGRAMMAR, **p)
        if theirs is not None:
            pairs.append((theirs / r["ms"], p))
    if pairs:
        low, p = min(pairs, key=lambda q: q[0])
        where = f"batch {p['batch']}, {p['allowed']:,} {p['kind']} per sequence"
        n["mlh_plan_vs_xgr_worst"] = (f"{where}, {low:.2f}×" if not tied(low, 1) else
                                      f"{where}, the headline's tie" if (p["batch"], p["kind"], p["allowed"])
                                      in HEADLINE_POINTS else f"{where}, a tie")
    else:
        n["mlh_plan_vs_xgr_worst"] = PENDING
    # where we lose
    counts = loss_counts(results)
    have = results.select(PLAN) or counts["rows"]
    n["mlh_losses"] = f"{counts['points']}" if have else PENDING
    n["mlh_losses_step12"] = f"{counts['by_series'].get(s[12], 0)}" if have else PENDING
    n["mlh_losses_plan"] = f"{counts['by_series'].get(PLAN, 0)}" if have else PENDING
    for batch in (64, 256):
        n[f"mlh_output_b{batch}"] = _us(byte_floor_ms(results, batch, 0))
    return n


def _cell(results, series: str, batch: int, kind: str, allowed: int, layout: str = "vd") -> str:
    """``time (× floor)`` of one point, ``–`` where not measured."""
    ms = _ms(results, series, layout, batch=batch, kind=kind, allowed=allowed)
    floor = None if ms is None else _floor(results, batch, kind, allowed)
    if not floor:
        return us(ms)
    ratio = ms / floor
    return f"{us(ms)} ({ratio:,.{0 if ratio >= 100 else 1 if ratio >= 10 else 2}f}×)"


def steps_table(results, counts=STEP_COUNTS) -> str:
    """Batch 1, random masks, ``[V, D]``: every step and the torch baselines at a few allowed counts, in µs,
    with the ratio to the floor (:func:`floor_ms`); the floor on the first line."""
    label = CHAPTER.label
    head = ["series"] + [f"{c:,} allowed: µs (× floor)" for c in counts]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    floors = [_floor(results, 1, "random", c) for c in counts]
    lines.append("| floor: allowed rows read + fp32 output written, or an empty kernel where larger | "
                 + " | ".join(us(f) for f in floors) + " |")
    for series in ["dense_mask", "index_select"] + [step_series(k) for k in (0, 1, 2, 3, 4, 5, 6, 7, 8, 12)]:
        cells = [_cell(results, series, 1, "random", c) for c in counts]
        if any(c != "–" for c in cells):
            lines.append(f"| {label(series)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def batch_table(results) -> str:
    """Batches above 1, random masks: the dense paths, ``index_select`` (the union's logits only), steps 3, 9, 10
    and 12 (with the path it took), µs, and the floor (:func:`floor_ms`)."""
    label = CHAPTER.label
    s12 = step_series(12)
    series = ["dense_mask", "cublas_fp32_mask", "index_select"] + [step_series(k) for k in (3, 9, 10, 12)]
    head = ["batch", "allowed per sequence", "union", "floor (µs)"] + [f"{label(x)} (µs)" for x in series]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    points = sorted({(r["params"]["batch"], r["params"]["allowed"])
                     for r in results.select(step_series(10), kind="random")})
    for batch, allowed in points:
        p = dict(batch=batch, kind="random", allowed=allowed)
        row12 = _row(results, s12, **p)
        cells = []
        for x in series:
            text = us(_ms(results, x, **p))
            if x == s12 and row12 is not None and row12.get("path"):
                text += f" ({row12['path']})"
            cells.append(text)
        union = row12["union"] if row12 else None
        floor = floor_ms(results, batch, union) if union is not None else None
        lines.append(f"| {batch} | {allowed:,} | {'–' if union is None else f'{union:,}'} | "
                     f"{us(floor)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _spread_ratio(theirs: dict, mine: dict) -> str:
    """The speedup's range over the repetitions (their fastest over our slowest, and the other way)."""
    if theirs.get("spread_ms") and mine.get("spread_ms"):
        return f" ({theirs['spread_ms'][0] / mine['spread_ms'][2]:.2f}–{theirs['spread_ms'][2] / mine['spread_ms'][0]:.2f})"
    return ""


#: The mark of a time whose row's rotation was capped (``rotation_capped``: memory held fewer copies of the head
#: than four times L2 needs, so some of its rows may come from L2); the page explains it once, under the run's clock.
CAPPED = "†"


def capped(row: dict | None) -> str:
    """:data:`CAPPED` where ``row``'s rotation over copies of the head was capped, else nothing."""
    return CAPPED if row is not None and row.get("rotation_capped") else ""


def capped_key(rot: dict[str, Any] | None) -> str | None:
    """The key to :data:`CAPPED`, said once on the page: which unions were capped, why their rows may come from L2,
    and whom that flatters (at a capped point every series that reads only the union's rows is capped alike, ours and
    ``index_select`` + matmul; the dense paths and xgrammar's path read the whole head); None where the run marks no
    row, from a run's :func:`rotation`."""
    if rot is None or rot["capped_union"] is None:
        return None
    n = rot["capped_union"]
    union = "A union of one row" if n == 1 else f"A union of at most {n:,} rows"
    where = (f"its {rot['max_copies']} copies fit in the {rot['l2_mib']:.0f} MiB L2" if rot.get("capped_fit_l2") else
             f"it may stay in L2 even across the {rot['max_copies']} copies of the head")
    return (f"{CAPPED} {union}: {where}, so part of its time may come from L2: that can flatter ours against the "
            "paths that read the whole head, not a ratio of two such times (step 8's over step 7's).")


#: The points of the practitioners' table the page shows unfolded (batch, masks, allowed per sequence): batch 1 from
#: one token to every token, a real grammar's mask, and one point per larger batch up to where the paths meet.
PRACTITIONER_POINTS = ((1, "random", 1), (1, "random", 1000), (1, "random", 10_000), (1, "random", VOCAB),
                       (1, "real", 1000), (8, "random", 1000), (64, "random", 1000), (256, "random", 1000))


def practitioners_table(results, points=None) -> str:
    """The whole step from the packed bitmask: ours (``MaskedHeadPlan``) against cuBLAS logits + xgrammar's
    ``apply_token_bitmask_inplace``, µs, with the speedup and its range: every point measured, or those of
    ``points`` ((batch, masks, allowed) as :data:`PRACTITIONER_POINTS`) that the file has. A time whose rotation
    was capped carries :data:`CAPPED`."""
    if not results.select(XGRAMMAR):
        return (f"{PENDING}: the practitioners' path is not in this results file ({results.gpu}, {results.date}); "
                "the benchmark measures it when xgrammar is installed.")
    head = ["batch", "masks", "allowed per sequence", "union", "ours runs", "ours (µs)",
            "xgrammar's path (µs)", "speedup (range)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    wanted = None if points is None else set(points)
    for theirs in results.select(XGRAMMAR):
        p = theirs["params"]
        mine = _row(results, PLAN, **p)
        if mine is None or (wanted is not None and (p["batch"], p["kind"], p["allowed"]) not in wanted):
            continue
        runs = path_words(mine["bucket"]) if mine.get("bucket") else "–"
        lines.append(f"| {p['batch']} | {p['kind']} | {p['allowed']:,} | {mine['union']:,} | {runs} | "
                     f"{mine['ms'] * 1e3:,.1f}{capped(mine)} | {theirs['ms'] * 1e3:,.1f}{capped(theirs)} | "
                     f"{theirs['ms'] / mine['ms']:.2f}×{_spread_ratio(theirs, mine)} |")
    return "\n".join(lines)


def inline_html(text: str) -> str:
    """Prose with Markdown's inline code (`` `x` ``) as HTML, for a fold (``<details>``), where Markdown is not
    parsed: escaped, code spans as ``<code>``, apostrophes curly as on the rest of the page."""
    import re
    from html import escape

    parts = re.split(r"`([^`]*)`", text)  # odd parts are code
    return "".join(f"<code>{escape(p, quote=False)}</code>" if i % 2 else escape(p, quote=False).replace("'", "’")
                   for i, p in enumerate(parts))


def html_table(markdown: str) -> str:
    """A Markdown pipe table (a header row, a rule, rows; no pipes inside cells) as an HTML table, for a fold
    (``<details>``), where a Markdown table would not be parsed (cells through :func:`inline_html`)."""
    header, _, *rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in markdown.splitlines()]
    cells = lambda row, tag: "".join(f"<{tag}>{inline_html(c)}</{tag}>" for c in row)  # noqa: E731
    return ("<table><thead><tr>" + cells(header, "th") + "</tr></thead><tbody>"
            + "".join("<tr>" + cells(r, "td") + "</tr>" for r in rows) + "</tbody></table>")


def folded(summary: str, markdown: str) -> str:
    """HTML: a Markdown table folded under ``summary`` (open it to read)."""
    return f"<details><summary>{inline_html(summary)}</summary>{html_table(markdown)}</details>"


def losses(rows: list[dict]) -> list[str]:
    """Every measured point where step 12 or step 13 (the plan) is slower than a rival, as sentences."""
    s12 = step_series(12)
    out = []
    for (batch, kind, allowed), series in sorted(rows_by_case(rows).items()):
        t = {name: r["ms"] for name, r in series.items()}
        for mine, rival in ((s12, "index_select"), (s12, "dense_mask"), (s12, "cublas_fp32_mask"), (PLAN, XGRAMMAR)):
            if mine in t and rival in t and t[mine] > t[rival]:
                out.append(f"we lose: batch {batch}, {kind} masks, {allowed:,} allowed: {mine} {t[mine] * 1e3:.1f} µs "
                           f"against {rival} {t[rival] * 1e3:.1f} µs ({t[mine] / t[rival]:.2f}x)")
    return out


def _losses(results) -> list[dict]:
    """Every point where a series of ours is slower than a rival (the benchmark's own list, as rows)."""
    out = []
    s12 = step_series(12)
    for r in results.select(s12) + results.select(PLAN):
        p = {k: v for k, v in r["params"].items() if k != "layout"}
        if r["params"].get("layout", "vd") != "vd":
            continue
        rivals = ("index_select", "dense_mask", "cublas_fp32_mask") if r["series"] == s12 else (XGRAMMAR,)
        for rival in rivals:
            other = _row(results, rival, **p)
            if other is not None and other["ms"] < r["ms"]:
                out.append({"mine": r, "rival": other, "params": p})
    return out


def is_tie(q: dict) -> bool:
    """Whether a row of :func:`_losses` is a tie (ours within :data:`TIE` of the rival), said as such on the page and
    not counted as a loss."""
    return tied(q["mine"]["ms"], q["rival"]["ms"])


def ties(results) -> list[dict]:
    """The rows of :func:`_losses` that are ties (:func:`is_tie`), by batch, masks and allowed count."""
    return sorted((q for q in _losses(results) if is_tie(q)),
                  key=lambda q: (q["params"]["batch"], q["params"]["kind"], q["params"]["allowed"]))


def ties_words(results) -> str:
    """The ties, one clause each with both times: ``batch 4, 10 random per sequence (step 12 at 8.6 µs,
    `index_select` + matmul at 8.5)``; empty where there is none."""
    said = []
    for q in ties(results):
        p, mine, rival = q["params"], q["mine"], q["rival"]
        ours = "step 13" if mine["series"] == PLAN else "step 12"
        theirs = RIVAL_WORDS.get(rival["series"], "xgrammar's path")
        said.append(f"batch {p['batch']}, {p['allowed']:,} {p['kind']} per sequence ({ours} at {mine['ms'] * 1e3:,.1f} "
                    f"µs, {theirs} at {rival['ms'] * 1e3:,.1f})")
    return "; ".join(said)


def loss_counts(results) -> dict[str, Any]:
    """How :func:`_losses` counts, ties (:func:`is_tie`) left out: ``rows`` (one per rival faster than ours at a
    point), ``points`` (each point of a series of ours counted once, however many rivals beat it there),
    ``by_series`` (points per series) and ``min_batch`` (the smallest batch with a loss; None where there is none),
    ``clean_batches`` (the batches measured below it, where nothing of ours loses), ``shared`` (the params of each
    point that more than one rival beats, so that the losses table has more rows than points, with ``ours``: "step 12"
    or "step 13") and ``ties`` (how many rows are ties)."""
    lost = [q for q in _losses(results) if not is_tie(q)]
    keys = [(q["mine"]["series"], tuple(sorted(q["params"].items()))) for q in lost]
    points = set(keys)
    shared = [dict(key[1]) | {"ours": "step 12" if key[0] == step_series(12) else "step 13"}
              for key in sorted(points) if keys.count(key) > 1]
    by_series: dict[str, int] = {}
    for series, _ in points:
        by_series[series] = by_series.get(series, 0) + 1
    low = min((q["params"]["batch"] for q in lost), default=None)
    measured = {r["params"]["batch"] for r in results.select(step_series(12)) + results.select(PLAN)}
    return {"rows": len(lost), "points": len(points), "by_series": by_series, "min_batch": low,
            "clean_batches": sorted(b for b in measured if low is None or b < low), "shared": shared,
            "ties": len(ties(results))}


def loss_us(ms: float) -> str:
    """A time of the losses table and of the worst loss's sentence, in µs: two decimals under 100 µs, so that the
    ratio printed beside two times is the ratio of the times as printed (83.05 against 15.26 is 5.44×, where 83.0
    against 15.3 would read 5.42×); one decimal from 100 µs on."""
    return us(ms, 2 if ms * 1e3 < 100 else 1)


def losses_table(results) -> str:
    """Where a series of ours is slower than a rival by more than a tie (:func:`is_tie`), with the union and the fp32
    output's share of the call's bytes; times as :func:`loss_us` prints them."""
    lost = [q for q in _losses(results) if not is_tie(q)]
    if not lost:
        return "No measured point where a series of ours is slower than its rival."
    def label(series: str) -> str:  # "step 12", or the rival as the prose names it
        step = next((st for st in CHAPTER.steps if st.series == series), None)
        return f"step {step.number}" if step else RIVAL_WORDS.get(series, CHAPTER.label(series))

    head = ["batch", "masks", "allowed per sequence", "union", "ours", "rival", "ours is slower by",
            "fp32 output's share of the call's bytes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for q in sorted(lost, key=lambda q: (q["params"]["batch"], q["params"]["kind"], q["params"]["allowed"])):
        p, mine, rival = q["params"], q["mine"], q["rival"]
        union = mine.get("union")
        share = "–" if union is None else f"{call_bytes(p['batch'], 0) / call_bytes(p['batch'], union):.0%}"
        ours = label(mine["series"]) + (f" ({path_words(mine['path'])})" if mine.get("path") else "")
        lines.append(f"| {p['batch']} | {p['kind']} | {p['allowed']:,} | {'–' if union is None else f'{union:,}'} | "
                     f"{ours}: {loss_us(mine['ms'])} µs{capped(mine)} | "
                     f"{label(rival['series'])}: {loss_us(rival['ms'])} µs{capped(rival)} | "
                     f"{mine['ms'] / rival['ms']:.2f}× | {share} |")
    return "\n".join(lines)


def rows_sweep_us(candidates: dict | None, allowed: int = 1000) -> dict[int, float]:
    """Exercise 4's recorded answer: step 7's time at batch 1 with ``allowed`` random ids, in µs, for each number of
    rows per program that the tuning run (:data:`CANDIDATES_FILE`, do_bench's clock) swept, at the default tile's
    warps; empty where the run is absent or has no such rows."""
    from studylog.masked_lm_head.formats import default_tiles

    warps = default_tiles(7, 1).num_warps
    rows = [] if candidates is None else [r for r in candidates["measurements"] if r["series"] == "step07_tiles"
                                          and r["params"].get("allowed") == allowed and r["params"].get("batch") == 1
                                          and r["params"].get("num_warps") == warps]
    return {r["params"]["rows"]: r["ms"] * 1e3 for r in sorted(rows, key=lambda r: r["params"]["rows"])}


def tried_table(results, candidates: dict | None) -> str:
    """What was tried and did not help: one line each, the measured effect, where the details are.
    ``candidates`` is :data:`CANDIDATES_FILE` (``studylog.plotting.load_lab``), or None when absent."""
    s = {k: step_series(k) for k in range(14)}
    rows = []

    def b1(series, allowed, layout="vd", kind="random"):
        return batch1_ms(results, series, allowed, layout, kind)

    rows.append(("block skipping with random masks (step 1)",
                 f"{_change(b1(s[0], 10_000), b1(s[1], 10_000))} than step 0 at 10,000 allowed: nearly every "
                 "block holds an allowed token", "step 1, above"))
    rows.append(("column masking on the post's [D, V] layout (step 2)",
                 f"{_change(b1(s[1], 1000, 'dv'), b1(s[2], 1000, 'dv'))} than step 1 on [D, V] at 1,000 allowed; "
                 "the PTX above shows why", "step 2, above"))
    rows.append(("the fill programs first in the grid (step 6)",
                 f"{_change(b1(s[5], 1000), b1(s[6], 1000))} than step 5 at 1,000 allowed, "
                 f"{_change(b1(s[5], 1), b1(s[6], 1))} at 1: step 7 keeps step 5's order", "step 6, above"))
    if candidates is not None:
        from studylog.plotting import Results

        cand = Results(None, candidates)

        def fastest(series, allowed):
            rows_ = cand.select(series, batch=1, kind="random", allowed=allowed)
            return min(r["ms"] for r in rows_) if rows_ else None

        step4 = fastest("cand_step04", 10_000)
        persistent = {n: fastest("cand_persistent", n) for n in (8, 10_000)}
        rows.append(("a persistent grid that prefetches the next block of rows",
                     f"{_change(fastest('cand_step07', 10_000), persistent[10_000])} than the streaming kernel at "
                     f"10,000 allowed, {_change(fastest('cand_step08', 8), persistent[8])} than step 8 at 8 (best of "
                     f"three shapes; do_bench clock, {cand.gpu})",
                     "`lab/masked_lm_head/variants/persistent.py`"))
        tiles = [r["ms"] for r in cand.select("step04_tiles", batch=1, allowed=10_000)]
        if tiles:
            rows.append(("other rows per program and warps for step 4",
                         f"the fastest of {len(tiles)} shapes is {_change(step4, min(tiles))} than "
                         f"the default at 10,000 allowed (do_bench clock, {cand.gpu})",
                         "`lab/masked_lm_head/candidates.py`"))
    r11 = [r for r in results.select(s[11], batch=1) if r["params"]["allowed"] == 1000]
    if r11:
        p = r11[0]["params"]
        rows.append(("reordering the vocabulary so that block skipping touches fewer blocks (step 11)",
                     f"{_change(_ms(results, s[3], **p), r11[0]['ms'])} than step 3 on a real mask of about 1,000 "
                     f"tokens, yet step 7 is {_change(r11[0]['ms'], _ms(results, s[7], **p))} than it",
                     "step 11, above"))
    big = dict(batch=64, kind="random", allowed=10_000)
    rows.append(("step 10's gathered tiles on a union of most of the vocabulary",
                 f"{_change(_ms(results, s[3], **big), _ms(results, s[10], **big))} than step 3 at batch 64 with "
                 "10,000 allowed per sequence: the dispatch sends such unions to a dense path", "step 12, below"))
    rows.append(("the first wrappers (argument checks one by one, tiles built per call, `kernel[grid]`)",
                 "a host time per call several times the kernel's at batch 1", "`lab/masked_lm_head/host_profile.py`"))
    return "\n".join(["| what | measured effect | details |", "|---|---|---|"]
                     + [f"| {a} | {b} | {c} |" for a, b, c in rows])


# --------------------------------------------------------------------------------------
# The chapter's table of steps, and the steps tried that did not pay
# --------------------------------------------------------------------------------------

#: The chapter's main case: the table of steps gives every step's time here, so its "×" column reads down the table.
MAIN_CASE = dict(batch=1, kind="random", allowed=1000)
#: The steps the page keeps on its main line, in order: each paid at the case its idea is about, except step 3, which
#: ties step 2 at batch 1 and is kept as the dispatch's dense path (step 12) and the base of step 10.
MAIN_LINE = (0, 1, 2, 3, 4, 5, 7, 8, 10, 12, 13)
#: The steps tried that did not pay: rows of the table of steps, marked :data:`TRIED_MARK`; they keep their numbers
#: (the library and the results name them so).
TRIED = (6, 9, 11)
#: The case each step's idea is about and the step it is compared with there (None for step 0). The tables of steps
#: (:func:`main_steps_table`) chain steps 0 to 5 and 7 at :data:`MAIN_CASE`, each against the row above, then give 8,
#: 10, 12 and 13 each at its own case against its base there; 13 starts from the bitmask at the main case. The base is
#: the kept step before it (step 7 builds on step 5: step 6 did not pay), except step 10's: no kept step before it takes a batch, so it is compared with
#: step 3, the dispatch's dense path for batches. Step 12, a dispatch, runs step 7 at the main case; its gain is where
#: it leaves step 10's path for a dense one, at batch 64 with 10,000 allowed each (step 10's section ends there). A step
#: of :data:`TRIED` is compared with the step it modifies (step 11: step 3's kernel over a reordered vocabulary; step 9:
#: step 3, the last step that takes a batch). Step 13's contract starts from the bitmask in host memory: no step before
#: it has that contract, so its base is the rival with its contract, xgrammar's path.
STEP_CASES = {
    0: (MAIN_CASE, None), 1: (MAIN_CASE, 0), 2: (MAIN_CASE, 1), 3: (MAIN_CASE, 2), 4: (MAIN_CASE, 3),
    5: (MAIN_CASE, 4), 6: (MAIN_CASE, 5), 7: (dict(batch=1, kind="random", allowed=10_000), 5),
    8: (dict(batch=1, kind="random", allowed=1), 7), 9: (dict(batch=64, kind="random", allowed=1000), 3),
    10: (dict(batch=64, kind="random", allowed=1000), 3), 11: (dict(batch=1, kind="real", allowed=1000), 3),
    12: (dict(batch=64, kind="random", allowed=10_000), 10), 13: (MAIN_CASE, XGRAMMAR),
}
#: The table of steps' words for each step: its one change.
CHANGES = {0: "the Triton tutorial's matmul: all logits, then `-inf` over the disallowed",
           1: "blocks with nothing allowed return at once",
           2: "disallowed tokens' weights not loaded",
           3: "a row-tile kernel for [V, D] on the tensor cores",
           4: "programs walk the list of allowed ids",
           5: "each row one tile, one wait for memory",
           6: "the fill programs first",
           7: "an L2 evict-first hint on the rows",
           8: "up to eight ids as launch arguments",
           9: "the batch's union, each row read once, reduced per sequence",
           10: "the batch's union, each row read once, on the tensor cores (`tl.dot`)",
           11: "the vocabulary reordered so that allowed tokens cluster",
           12: "a dispatch by shape",
           13: "the whole step from the packed bitmask, in one CUDA graph"}
#: The rivals at :data:`MAIN_CASE`, said under the table of steps in the prose's words (xgrammar's path, which starts
#: from the bitmask, faces step 13 in its row). The dense rival is cuBLAS with fp32 output: the chapter's
#: contract, and steady, where dense + mask's bf16 logits run at two speeds at batch 1 (:func:`dense_clusters`).
MAIN_RIVALS = (("cublas_fp32_mask", "cuBLAS's fp32 logits, then `masked_fill`"),
               ("index_select", "`index_select` + matmul, given the ids"))
#: Steps whose call starts from the bitmask in host memory: their floor starts with that copy (:func:`host_floor_ms`).
FROM_HOST = (13,)


def _base_series(base: int | str) -> str:
    """The series of a base of :data:`STEP_CASES`: a step's number, or a rival's series (step 13's)."""
    return base if isinstance(base, str) else step_series(base)


def step_factor(results, number: int) -> float | None:
    """Step ``number``'s base's time over its own, both at the case its idea is about (:data:`STEP_CASES`); None for
    step 0 or where either time is missing."""
    params, base = STEP_CASES[number]
    if base is None:
        return None
    mine, theirs = _ms(results, step_series(number), **params), _ms(results, _base_series(base), **params)
    return None if mine is None or theirs is None else theirs / mine


def paid_words(factor: float) -> str:
    """What a step's factor over its base says: ``did not pay`` (slower, beyond a tie), ``no gain`` (a tie, within
    :data:`TIE`), else ``paid``."""
    if tied(factor, 1.0):
        return "no gain"
    return "did not pay" if factor < 1 else "paid"


def _vs(row: dict, reference: dict | None) -> str:
    """``reference``'s time over ``row``'s, flagged by :func:`book.results.caveat` where either side's repetitions
    spread past its threshold (``row``'s are "ours", ``reference``'s "the rival's"); ``–`` without a reference."""
    from book.results import caveat, spread

    if reference is None:
        return "–"
    return f"{reference['ms'] / row['ms']:.2f}×" + caveat(spread(*row["spread_ms"]) if row.get("spread_ms") else None,
                                                          spread(*reference["spread_ms"]) if reference.get("spread_ms")
                                                          else None)


def _tails(results) -> dict | None:
    """The card's tails run (:data:`book.scoreboard.TAILS`), beside ``results``' file; None where there is none."""
    from book.scoreboard import TAILS, load

    return load(results.path.parent, TAILS) if getattr(results, "path", None) else None


def host_floor_ms(results) -> float | None:
    """Our design's bound for a batch-1 call that starts from the packed bitmask in host memory (step 13), in ms: the
    bitmask's copy timed alone, then its two dependent kernels at the card's empty kernel
    (:func:`book.scoreboard.bitmask_chain_ms`). A bound of our design, not the card's: the card's floor
    (:func:`floor_ms`) is the call's bytes. None where the card has no such run."""
    from book.scoreboard import bitmask_chain_ms

    return bitmask_chain_ms(_tails(results), common.latency_floor_ms(results))


#: Step 13's floor in a few words: the chain no design that starts from the bitmask in host memory can shorten.
CHAIN_WORDS = "the bitmask's copy, then one launch"


def chain_floor_ms(results) -> float | None:
    """Step 13's floor, in ms: the packed bitmask's copy from host memory, timed alone in the card's tails run, then
    one empty kernel: the shortest chain of any design that starts from the bitmask (the scoreboard's latency floor
    for the same row; our design launches two kernels after the copy, :func:`host_floor_ms`). None where the card
    has no such run."""
    from book.scoreboard import bitmask_chain_ms

    return bitmask_chain_ms(_tails(results), common.latency_floor_ms(results), kernels=1)


def bitmask_copy_ms(results) -> float | None:
    """The packed bitmask's copy from pinned host memory at batch 1, timed alone in the card's tails run, in ms (what
    covers step 13's copy outside the trace); None where it was not timed."""
    from book.scoreboard import BITMASK_COPY, MASKED_HEAD_CASE, one

    tails = _tails(results)
    row = one(tails, BITMASK_COPY, **MASKED_HEAD_CASE) if tails else None
    return None if row is None else row["ms"]


def step_floor_ms(results, row: dict, params: dict) -> tuple[float, str]:
    """The card's floor of a row at its point, in ms (:func:`floor_ms`: its bytes at the copy bandwidth, or the empty
    kernel where larger), and which part binds (``bytes``, ``empty kernel``)."""
    union = row.get("union", params["allowed"])
    floor = floor_ms(results, params["batch"], union)
    return floor, "bytes" if byte_floor_ms(results, params["batch"], union) >= floor else "empty kernel"


def _over_floor(results, row: dict, params: dict) -> str:
    """``2.6×``: the row's time over the card's floor (:func:`step_floor_ms`); the steps table adds step 13's bound of
    our own design (:func:`host_floor_ms`) beside it, the one that binds there."""
    floor, _ = step_floor_ms(results, row, params)
    return f"{row['ms'] / floor:.1f}×"


def table_us(ms: float | None) -> str:
    """A time in the tables of steps, in µs: two decimals under 10 µs, so that close times (steps 5, 7 and 12 at the
    main case, step 13's bound) differ where they differ, one decimal from 10 µs on."""
    return us(ms, 2 if ms is not None and ms * 1e3 < 10 else 1)


def _case(p: dict) -> str:
    per = "" if p["batch"] == 1 else " each"
    return f"batch {p['batch']}, {p['allowed']:,} {p['kind']}{per}"


def chain_base(results, number: int) -> int | None:
    """The base of step ``number``'s "×" in the chain at :data:`MAIN_CASE`: the row above it in the table of steps,
    the nearest kept step above with a time there (step 12's is step 7: steps 8 and 10 have none; step 13's is step
    12, whose kernel it runs after the bitmask's copy and the union's build); None for step 0."""
    above = [n for n in MAIN_LINE[:MAIN_LINE.index(number)] if _row(results, step_series(n), **MAIN_CASE) is not None]
    return above[-1] if above else None


#: The parts of step 13's one change (the path made capturable in one CUDA graph), as its section names them, each with the trace's activities it covers (:data:`TIMELINE_PARTS`).
PARTS = (("the copy", "the packed bitmask copied, without waiting, into a device buffer the graph reads", ("copy",)),
         ("the union", "the union's ids and count built from the buffer on the device", ("count_zero", "union_kernel")),
         ("the count from memory", "step 7's kernel reads the count from memory: one graph per bucket", ("row_kernel",)))
#: The steps timed at :data:`MAIN_CASE` in the table of steps, each against the kept step above it (step 7 ties step
#: 5 and is kept: steps 8 and 13 build on it, the dispatch runs it at batch 1); step 6, tried, sits among them.
CHAIN = (0, 1, 2, 3, 4, 5, 7)
#: Step 13's "one change" cell: an integration, not a faster kernel; its three parts are traced in its section.
CHANGES_FROM_HOST = "the integration: the whole step from the packed bitmask, in one CUDA graph"
#: The rivals' names in the table's "× against" cells.
HEADLINE_RIVAL_WORDS = {"index_select": "`index_select` + matmul", XGRAMMAR: "xgrammar's path"}
#: The kept steps after the chain, each at its own case (:data:`STEP_CASES`); step 12, the entry point, over every
#: case measured (:func:`dispatch_range`).
OWN_STEPS = (8, 10, 12, 13)
#: The marker of a tried step's row in the table of steps (its "one change" cell starts with it).
TRIED_MARK = "tried, not kept:"
#: Why a kept step that ties what it is compared with stays, in its "×" cell.
KEPT_FOR = {3: "kept as the dense path of large batches", 7: "kept: steps 8 and 13 build on it",
            12: "kept: one entry point for every case"}
#: The kernels step 12 chooses from: a compacted one (steps 7, 8, 10) and a dense one (step 3's, or cuBLAS with fp32
#: output and ``masked_fill``).
DISPATCH_KERNELS = ("step07", "step08", "step10", "step03", "cublas_fp32_mask")
#: The header of the table of steps 0 to 7, all at :data:`MAIN_CASE` (:func:`main_steps_table`).
CHAIN_HEADER = "| step | the one change | µs | × previous | × the card's floor |"
#: The header of the table of steps 8 to 13, each at its own case (:func:`later_steps_table`).
LATER_HEADER = "| step | the one change | case | µs | × the step it builds on | × its floor |"
#: Step 13's "×" cell: no step before it starts from the bitmask; the result sets it against xgrammar's path.
STEP13_RATIO = "– (it starts from the bitmask: see the result)"


def tie_mark(ratio: float) -> str:
    """`` (tie)`` where ``ratio``, as printed at two decimals, is a tie by the course's rule (0.97× to 1.03×)."""
    return " (tie)" if common.is_tie(ratio) else ""


def _tie_why(ratio_cell: str, tie: str, number: int) -> str:
    """``ratio_cell`` with the tie mark, and why step ``number`` is kept (:data:`KEPT_FOR`) where it ties."""
    why = f"; {KEPT_FOR[number]}" if tie and number in KEPT_FOR else ""
    return ratio_cell + (tie[:-1] + why + ")" if tie else "")


def dispatch_range(results) -> dict[str, Any] | None:
    """Step 12 over every case the run measured it at: at each, the fastest of the kernels it chooses from
    (:data:`DISPATCH_KERNELS`) measured there over step 12's time; ``worst`` and ``best`` of those ratios and
    ``cases`` (how many). None without step 12."""
    rows = [r for r in results.select(step_series(12), layout="vd") if r["clock"] == "gpu"]
    ratios = []
    for r in rows:
        p = {k: v for k, v in r["params"].items() if k != "layout"}
        best = min((t for s in DISPATCH_KERNELS if (t := _ms(results, s, **p)) is not None), default=None)
        if best is not None:
            ratios.append(best / r["ms"])
    if not ratios:
        return None
    return {"worst": min(ratios), "best": max(ratios), "cases": len(rows)}


def step_base(results, number: int) -> tuple[dict, int | str | None]:
    """(case, base) of step ``number``'s row in the table of steps: a step of :data:`CHAIN` at :data:`MAIN_CASE`
    against the kept step above it (:func:`chain_base`); step 6, tried at that case, against step 5; every other step
    at its own case against its base there (:data:`STEP_CASES`; step 13 against xgrammar's path)."""
    if number in CHAIN:
        return MAIN_CASE, chain_base(results, number)
    return STEP_CASES[number]


def _step_ratio(results, number: int, params: dict, base) -> str:
    """Step ``number``'s "×" cell at ``params``: its base's time over its own, the base named (a step at another case
    than the main one with its time in brackets), a tie said with why the step is kept (:data:`KEPT_FOR`), step 6's
    and step 11's extra words; ``–`` without a base."""
    row = _row(results, step_series(number), **params)
    if base is None:
        return "–"
    reference = _row(results, _base_series(base), **params)
    name = HEADLINE_RIVAL_WORDS[base] if isinstance(base, str) else f"step {base}"
    if reference is None:
        return f"{PENDING} {name}"
    at = "" if params == MAIN_CASE and not isinstance(base, str) else \
        f" ({table_us(reference['ms'])} µs{capped(reference)})"
    ratio = _tie_why(f"{_vs(row, reference)} {name}{at}", tie_mark(reference["ms"] / row["ms"]), number)
    if number == 6:  # a tie at its case: why it is not kept, from the run
        one = step_factor_at(results, 6, dict(params, allowed=1))
        why = f"{_pct(1 / one - 1)} slower at 1 allowed" if one and one < 1 else ""
        ratio = (ratio[:-1] + f"; not kept: {why})" if ratio.endswith("(tie)") else f"{ratio}; {why}") if why \
            else ratio
    if number == 11:
        seven = _row(results, step_series(7), **params)
        ratio += f"; step 7 is {row['ms'] / seven['ms']:.2f}× as fast on this mask" if seven else ""
    return ratio


def _change_cell(number: int) -> str:
    change = CHANGES_FROM_HOST if number == 13 else CHANGES[number]
    return f"*{TRIED_MARK}* {change}" if number in TRIED else change


def main_steps_table(results) -> str:
    """The page's table of steps 0 to 7 (:data:`CHAIN`, step 6 tried among them), all at one case,
    :data:`MAIN_CASE`, said once in the caption: Markdown, the bold caption, the table, then the rivals at that case
    in a sentence (:data:`MAIN_RIVALS`), blocks separated by blank lines. Each row gives its time, its ratio to the
    kept step above it (:func:`chain_base`; step 6 and step 7 against step 5) and its time over the card's floor at
    that case. A tie says so and why the step is kept (:data:`KEPT_FOR`); a time whose rotation was capped carries
    :data:`CAPPED`; a ratio is flagged where either side's repetitions spread past the page's threshold. Steps 8 to 13,
    each at its own case, are :func:`later_steps_table`."""
    lines = [f"**Steps 0 to 7 at one case: {_case(MAIN_CASE)} allowed tokens** (µs, GPU clock, the [V, D] head)", "",
             CHAIN_HEADER, "|---|---|---|---|---|"]
    for number in sorted(CHAIN + (6,)):
        params, base = step_base(results, number)
        row = _row(results, step_series(number), **params)
        if row is None:
            continue
        lines.append(f"| {number} | {_change_cell(number)} | {table_us(row['ms'])}{capped(row)} | "
                     f"{_step_ratio(results, number, params, base)} | {_over_floor(results, row, params)} |")
    rivals = [(words, row) for series, words in MAIN_RIVALS if (row := _row(results, series, **MAIN_CASE)) is not None]
    if rivals:
        lines += ["", "Rivals at that case: " + "; ".join(
            f"{words}, {table_us(row['ms'])} µs{capped(row)} ({_over_floor(results, row, MAIN_CASE)} floor)"
            for words, row in rivals) + "."]
    return "\n".join(lines)


def later_steps_table(results) -> str:
    """The page's table of steps 8 to 13 (:data:`OWN_STEPS`, steps 9 and 11 tried among them), each at the case its
    idea is about (:data:`STEP_CASES`): Markdown, the bold caption, then the table. Each row names its case, its time
    there, its ratio to the step it builds on at that case (that step's time in brackets) and its time over its
    floor there: the card's (:func:`step_floor_ms`), but step 13's, the chain no design can shorten
    (:func:`chain_floor_ms`: the bitmask's copy, then one empty kernel), which binds there. Step 12, the entry point, is one row over every case,
    against the fastest kernel it chooses from at each (:func:`dispatch_range`). Step 13 starts from the bitmask, a
    contract no step before it has: its row has no ratio (the result sets it against xgrammar's path)."""
    lines = ["**Steps 8 to 13, each at the case its idea is about** (µs, GPU clock)", "", LATER_HEADER,
             "|---|---|---|---|---|---|"]
    for number in sorted(OWN_STEPS + (9, 11)):
        if number == 12:
            rng = dispatch_range(results)
            if rng is None:
                continue
            tie = " (tie)" if tie_mark(rng["worst"]) and tie_mark(rng["best"]) else ""
            ratio = _tie_why(f"{rng['worst']:.2f}× to {rng['best']:.2f}× the fastest kernel it chooses from", tie, 12)
            lines.append(f"| 12 | the entry point: a dispatch by shape | all {rng['cases']} cases | – | {ratio} | – |")
            continue
        params, base = STEP_CASES[number]
        row = _row(results, step_series(number), **params)
        if row is None:
            continue
        if number in FROM_HOST:
            chain = chain_floor_ms(results)
            ratio = STEP13_RATIO
            over = f"{row['ms'] / chain:.1f}×, {CHAIN_WORDS}" if chain else _over_floor(results, row, params)
        else:
            ratio, over = _step_ratio(results, number, params, base), _over_floor(results, row, params)
        lines.append(f"| {number} | {_change_cell(number)} | {_case(params)} | {table_us(row['ms'])}{capped(row)} | "
                     f"{ratio} | {over} |")
    return "\n".join(lines)


def loss_lines(results) -> list[str]:
    """Where we lose, one plain sentence a point (ties left out, :func:`is_tie`): the case, our series and time, how
    much slower and than which rival, with its time; a point two rivals beat says both."""
    lost = [q for q in _losses(results) if not is_tie(q)]
    points: dict[tuple, list[dict]] = {}
    for q in sorted(lost, key=lambda q: (q["params"]["batch"], q["params"]["kind"], q["params"]["allowed"],
                                         q["rival"]["ms"])):
        points.setdefault((q["mine"]["series"], tuple(sorted(q["params"].items()))), []).append(q)
    lines = []
    for (series, _), qs in points.items():
        p, mine = qs[0]["params"], qs[0]["mine"]
        step = next((st.number for st in CHAPTER.steps if st.series == series), None)
        ours = f"step {step}" if step is not None else CHAPTER.label(series)
        than = " and ".join(f"{q['mine']['ms'] / q['rival']['ms']:.2f}× slower than "
                            f"{RIVAL_WORDS.get(q['rival']['series'], CHAPTER.label(q['rival']['series']))} "
                            f"({q['rival']['ms'] * 1e3:,.1f} µs{capped(q['rival'])})" for q in qs)
        lines.append(f"* Batch {p['batch']}, {p['allowed']:,} {p['kind']} each: {ours} "
                     f"({mine['ms'] * 1e3:,.1f} µs{capped(mine)}) is {than}.")
    return lines


def own_case_steps() -> list[int]:
    """The kept steps whose idea is about another case than :data:`MAIN_CASE` (:data:`STEP_CASES`): 7, 8, 10, 12."""
    return [n for n in MAIN_LINE if STEP_CASES[n][0] != MAIN_CASE]


def steps_note(results) -> str:
    """The footnote under the table of steps: the key to :data:`CAPPED` (said once on the page) where the run marks
    rows, else empty."""
    key = page_capped_key(results)
    return "" if key is None else key


def step_factor_at(results, number: int, params: dict) -> float | None:
    """Step ``number``'s base's time (:data:`STEP_CASES`) over its own at ``params``; None where either is missing."""
    base = STEP_CASES[number][1]
    mine, theirs = _ms(results, step_series(number), **params), _ms(results, _base_series(base), **params)
    return None if mine is None or theirs is None else theirs / mine


def result_table(results) -> str:
    """The result, Markdown: at each of :data:`HEADLINE_POINTS`, the kernel alone (step 12, given the ids) against its
    strongest rival, and the whole step from the packed bitmask (step 13) against xgrammar's path, side by side with
    equal weight; a ratio under one said as slower. The kernel's strongest rival, torch.compile's fused gather, was
    timed only where the committed lab run timed it (batch 1: both times from that run,
    :func:`compiled_gather_times`); at the other batches the kernel's cells are ``–`` (no ratio against a weaker
    rival stands in for it: the losses there are where we lose)."""
    head = ["batch (1,000 allowed each)", "kernel alone: step 12", "`torch.compile`'s fused gather, given the ids",
            "step 12 is", "whole step: step 13", "xgrammar's path", "step 13 is"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    compiled = compiled_gather_times(COMPILED_GATHER[0]) or {}

    def said(theirs: float, ours: float) -> str:
        x = theirs / ours
        return f"**{x:.2f}×** faster" if x > 1 + TIE else "a tie" if tied(theirs, ours) else f"{1 / x:.2f}× slower"

    for batch, kind, allowed in HEADLINE_POINTS:
        p = dict(batch=batch, kind=kind, allowed=allowed)
        whole, xgr = _row(results, PLAN, **p), _row(results, XGRAMMAR, **p)
        if batch == 1 and kind == "random" and allowed in compiled:
            ours, theirs = compiled[allowed]
            cells = [f"{batch}", f"{table_us(ours)}", f"{table_us(theirs)}", said(theirs, ours)]
        else:
            cells = [f"{batch}", "–", "–", "–"]
        if not (whole and xgr) and cells[1] == "–":
            continue
        cells += ([f"{table_us(whole['ms'])}", f"{table_us(xgr['ms'])}", said(xgr["ms"], whole["ms"])] if whole and xgr
                  else ["–", "–", "–"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def dense_clusters(results, batch: int = 1, gap: float = 0.05) -> dict[str, Any] | None:
    """Dense + mask's repetitions at ``batch``, where they fall in two clusters. At batch 1 every count does the
    same work (the whole head read, the whole row written), so its repetitions (each row's fastest, median and
    slowest of three) are pooled and split at their largest gap. None where that gap is under ``gap`` of the
    fastest time (one cluster) or the rows have no spread. Otherwise each cluster's median time (ms), cuBLAS with
    fp32 output's median over the same points (the same read, with twice the output bytes), and the points
    (kind, allowed) whose median repetition lands in the slow cluster, of ``points`` in all."""
    rows = [r for r in results.select("dense_mask", batch=batch) if r.get("spread_ms")]
    times = sorted(t for r in rows for t in r["spread_ms"])
    if len(times) < 2:
        return None
    width, cut = max((b - a, (a + b) / 2) for a, b in zip(times, times[1:]))
    if width < gap * times[0]:
        return None

    def median(xs):
        return sorted(xs)[len(xs) // 2]

    fp32 = [r["ms"] for r in results.select("cublas_fp32_mask", batch=batch) if r["params"].get("layout", "vd") == "vd"]
    return {"fast_ms": median([t for t in times if t < cut]), "slow_ms": median([t for t in times if t > cut]),
            "fp32_ms": median(fp32) if fp32 else None, "points": len(rows),
            "slow": sorted((r["params"]["kind"], r["params"]["allowed"]) for r in rows if r["ms"] > cut)}


# --------------------------------------------------------------------------------------
# The targets and the host time
# --------------------------------------------------------------------------------------

def _kinds(results) -> list[str]:
    """The mask kinds the file measured, in the file's order."""
    return param_values(results, "kind")


def host_table(results) -> str:
    """Host time per call of every public entry point measured at batch 1 (random masks), as Markdown:
    median over the run's counts, the worst count, and the ratio to an empty Triton launch of the same run."""
    label = CHAPTER.label
    empty = results.data.get("ceilings", {}).get("empty_launch_host_ms")
    lines = ["| entry point | host per call, median (µs) | worst (µs) | × empty launch |", "|---|---|---|---|"]
    for series in results.series():
        rows = [r for r in results.select(series, batch=1) if "host_ms" in r]
        if not rows:
            continue
        values = sorted(r["host_ms"] for r in rows)
        median = values[len(values) // 2]
        ratio = f"{values[-1] / empty:.2f}" if empty else "–"
        lines.append(f"| {label(series)} | {median * 1e3:.1f} | {values[-1] * 1e3:.1f} | {ratio} |")
    if empty:
        lines.append(f"| empty Triton launch | {empty * 1e3:.1f} | | 1 |")
    return "\n".join(lines)


def our_kernels() -> list[str]:
    """Series that count as "our kernel" in the targets: steps 1-12. Left out: step 0 (dense, the
    tutorial's), step 13 (the whole step, its copy from host memory included), cublas_fp32_mask (torch's) and
    reordered_in_sample (its vocabulary order was fitted on the very mask it is measured on)."""
    return [s.series for s in CHAPTER.steps if 1 <= s.number <= 12]


def _best(results, batch: int, kind: str, allowed: int) -> dict | None:
    ours = our_kernels()
    rows = [r for r in results.rows if r["series"] in ours and r["params"].get("layout", "vd") == "vd"
            and r["params"].get("batch") == batch and r["params"].get("kind") == kind
            and r["params"].get("allowed") == allowed]
    return min(rows, key=lambda r: r["ms"]) if rows else None


def target_report(results) -> str:
    """The targets with the ratios measured in one run (the clock each row is on is the file's), as a
    Markdown table, and the points where we lose."""
    label = CHAPTER.label
    dispatch = step_series(12)
    clock = results.rows[0]["clock"] if results.rows else "–"
    lines = [f"Clock: {clock}.", "", "| target | measured | met |", "|---|---|---|"]

    def add(name: str, value: str, ok: bool | None):
        lines.append(f"| {name} | {value} | {'–' if ok is None else ('yes' if ok else '**no**')} |")

    # best kernel within 1.3x of the floor, batch 1, every mask kind and count
    for kind in _kinds(results):
        worst = None
        for r in results.select("dense_mask", batch=1, kind=kind):
            best = _best(results, 1, kind, r["params"]["allowed"])
            if best and "union" in best:
                ratio = best["ms"] / floor_ms(results, 1, best["union"])
                if worst is None or ratio > worst[0]:
                    worst = (ratio, r["params"]["allowed"], label(best["series"]))
        if worst:
            add(f"best kernel ≤ 1.3× the floor (bytes, or the card's fastest empty kernel where larger), batch 1, "
                f"{kind} masks, worst count",
                f"{worst[0]:.2f}× at {worst[1]:,} allowed ({worst[2]})", worst[0] <= 1.3)
    # step 12 (the dispatch) >= 10x dense + mask at <= 1,000 allowed, batch 1
    ratios = []
    for r in results.select("dense_mask", batch=1):
        mine = _row(results, dispatch, batch=1, kind=r["params"]["kind"], allowed=r["params"]["allowed"])
        if mine and r["params"]["allowed"] <= 1000:
            ratios.append((r["ms"] / mine["ms"], r["params"]["allowed"], r["params"]["kind"]))
    if ratios:
        low = min(ratios)
        add(f"{label(dispatch)}, ≤ 1,000 allowed, batch 1: ≥ 10× dense + mask (smallest speedup)",
            f"{low[0]:.1f}× ({low[2]}, {low[1]:,} allowed)", low[0] >= 10)
    # >= 2.5x index_select + matmul at 10,000 allowed
    for kind in _kinds(results):
        base, mine = _row(results, "index_select", batch=1, kind=kind, allowed=10_000), \
            _row(results, dispatch, batch=1, kind=kind, allowed=10_000)
        if base and mine:
            ratio = base["ms"] / mine["ms"]
            add(f"{label(dispatch)}, 10,000 allowed ({kind}), batch 1: ≥ 2.5× index_select + matmul",
                f"{ratio:.2f}×", ratio >= 2.5)
    # host time per call <= 2x an empty Triton launch, batch 1
    empty = results.data.get("ceilings", {}).get("empty_launch_host_ms")
    hosts = sorted((r for r in results.select(dispatch, batch=1) if "host_ms" in r), key=lambda r: r["host_ms"])
    if empty and hosts:
        median_h, worst_h = hosts[len(hosts) // 2], hosts[-1]
        add(f"{label(dispatch)} host time per call ≤ 2× an empty Triton launch, batch 1 (worst count; median "
            "over the counts)",
            f"{median_h['host_ms'] / empty:.2f}× ({median_h['host_ms'] * 1e3:.1f} µs against {empty * 1e3:.1f} µs); "
            f"worst {worst_h['host_ms'] / empty:.2f}× ({worst_h['params']['kind']}, "
            f"{worst_h['params']['allowed']:,} allowed)", worst_h["host_ms"] <= 2 * empty)
    # the whole step from the bitmask against xgrammar's path
    pairs = []
    for r in results.select(XGRAMMAR):
        p = r["params"]
        mine = _row(results, PLAN, batch=p["batch"], kind=p["kind"], allowed=p["allowed"])
        if mine:
            # the spreads overlap: the two are not told apart by this run's repetitions
            overlap = bool(mine.get("spread_ms") and r.get("spread_ms")
                           and mine["spread_ms"][0] <= r["spread_ms"][2])
            pairs.append((r["ms"] / mine["ms"], p, overlap))
    if pairs:
        b1 = [q for q in pairs if q[1]["batch"] == 1 and q[1]["allowed"] <= 1000]
        if b1:
            low = min(b1, key=lambda q: q[0])
            add("whole step, batch 1, ≤ 1,000 allowed: ≥ 10× xgrammar's path (smallest speedup)",
                f"{low[0]:.1f}× ({low[1]['kind']}, {low[1]['allowed']:,} allowed)", low[0] >= 10)
        b64 = [q for q in pairs if q[1]["batch"] == 64 and q[1]["allowed"] <= 0.001 * VOCAB]
        if b64:
            low = min(b64, key=lambda q: q[0])
            add("whole step, batch 64, ≤ 0.1% of V per row: ≥ 3× xgrammar's path (smallest speedup)",
                f"{low[0]:.1f}× ({low[1]['kind']}, {low[1]['allowed']:,} allowed)", low[0] >= 3)
        worst = min(pairs, key=lambda q: q[0])
        add("whole step never slower than xgrammar's path, any batch and density (worst point; slower means "
            "outside the spread of the three repetitions)",
            f"{worst[0]:.2f}× (batch {worst[1]['batch']}, {worst[1]['kind']}, {worst[1]['allowed']:,} allowed"
            f"{', spreads overlap' if worst[0] < 1 and worst[2] else ''})", worst[0] >= 1.0 or worst[2])
    # dispatch never > 5% slower than dense + mask
    worst_d = None
    for r in results.select(dispatch):
        p = r["params"]
        base = results.select("dense_mask", batch=p["batch"], kind=p["kind"], allowed=p["allowed"])
        if base:
            ratio = r["ms"] / base[0]["ms"]
            if worst_d is None or ratio > worst_d[0]:
                worst_d = (ratio, p)
    if worst_d:
        p = worst_d[1]
        add(f"{label(dispatch)} never > 1.05× dense + mask (worst point)",
            f"{worst_d[0]:.2f}× (batch {p['batch']}, {p['kind']}, {p['allowed']:,} allowed)", worst_d[0] <= 1.05)
    lost = losses(results.rows)
    if lost:
        lines += ["", "Where we lose:", ""] + [f"- {text.removeprefix('we lose: ')}" for text in lost]
    return "\n".join(lines)


#: The plan's step's activities on the timeline (``lab/masked_lm_head/plan_timeline.py``), in the order a call
#: enqueues them, as the page names them.
TIMELINE_PARTS = (("copy", "the bitmask's host-to-device copy"), ("count_zero", "the union's count zeroed"),
                  ("union_kernel", "the union kernel"), ("row_kernel", "the plan's row kernel"))


def plan_timeline(gpu: str = "nvidia-h200") -> dict | None:
    """The plan's whole step at batch 1 traced inside CUDA-graph replays (``plan_timeline.py``), or None where
    that run is not committed."""
    return lab_or_none("masked_lm_head", "plan_timeline", gpu)


def timeline_idle(data: dict) -> dict[str, float]:
    """:func:`plan_timeline`'s median idle time before each activity after the copy, and before the next call's
    copy (key ``next``: the period less the row kernel's end), in µs."""
    s = data["summary"]
    last = TIMELINE_PARTS[-1][0]
    return {**{key: s["gap_before_us"][key] for key, _ in TIMELINE_PARTS[1:]},
            "next": s["period_us"] - s["start_us"][last] - s["duration_us"][last]}


def plan_parts(data: dict) -> dict[str, float]:
    """Step 13's parts, each with its own time, from :func:`plan_timeline`'s medians, in µs: each activity of
    :data:`TIMELINE_PARTS` (its start to its end), ``span`` (one call: the copy's start to the row kernel's end),
    ``period`` (one call's copy to the next call's), ``busy`` (the four activities' sum) and ``idle`` (the period less
    ``busy``)."""
    s = data["summary"]
    parts = {key: s["duration_us"][key] for key, _ in TIMELINE_PARTS}
    busy = sum(parts.values())
    return {**parts, "span": s["span_us"], "period": s["period_us"], "busy": busy, "idle": s["period_us"] - busy}


def mean_period(data: dict) -> float:
    """:func:`plan_timeline`'s mean time from one call's copy to the next call's over every traced call, in µs: what
    a benchmark that times whole replays and divides by their calls sees, where the summary's ``period_us`` is the
    median call."""
    periods = [c["period_us"] for replay in data["replays"] for c in replay if c["period_us"] is not None]
    return sum(periods) / len(periods)


def plan_timeline_table(data: dict) -> str:
    """Markdown: step 13's three parts as one call of :func:`plan_timeline` runs them, each with its traced median
    time, the idle time before it and when it ends (µs after the copy starts): the bitmask's copy, the union built
    from it (the count zeroed, then the union kernel) and the bucket's graph (the row kernel); then the idle time
    until the next call's copy. Every cell is the trace's, a run of its own: the benchmark's time of the step (the
    number the steps table and the headline quote) is not a row, so that no table mixes the two runs."""
    s = data["summary"]
    took, start, gap = s["duration_us"], s["start_us"], s["gap_before_us"]
    union = took["count_zero"] + took["union_kernel"]
    rows = [("the bitmask to the device", "its host-to-device copy", took["copy"], "–", took["copy"]),
            ("the union from the bitmask", f"the count zeroed ({took['count_zero']:.1f}), then the union kernel "
             f"({took['union_kernel']:.1f})", union, f"{gap['count_zero'] + gap['union_kernel']:.1f}",
             start["union_kernel"] + took["union_kernel"]),
            ("the bucket's graph", "the row kernel (step 7's)", took["row_kernel"], f"{gap['row_kernel']:.1f}",
             start["row_kernel"] + took["row_kernel"])]
    lines = ["| part of one call | what runs | takes (µs) | idle before it (µs) | done at (µs after the copy starts) |",
             "|---|---|---|---|---|"]
    lines += [f"| {part} | {what} | {t:.1f} | {idle} | {end:.1f} |" for part, what, t, idle, end in rows]
    lines.append(f"| until the next call's copy | | | {timeline_idle(data)['next']:.1f} | {s['period_us']:.1f} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# How the run replays the head
# --------------------------------------------------------------------------------------

def rotation(results) -> dict[str, Any] | None:
    """How the run's GPU-clock rows replayed the head, read from the rows: None where no row records ``copies``
    (each call replayed one copy, so the rows it reads could stay in L2 between calls). Otherwise the most copies
    a row used (the cap), the L2 size (MiB), and where the cap bound (rows marked ``rotation_capped``): the largest
    such union, batch 1's random counts among them, and whether the capped copies' rows fit in L2 together (if not,
    they read less than four times L2 and only some of their rows may come from L2)."""
    rows = [r for r in results.rows if r.get("clock") == "gpu"]
    if not any("copies" in r for r in rows):
        return None
    capped = [r for r in rows if r.get("rotation_capped")]
    l2 = results.data["device"]["l2_cache_bytes"]
    return {"max_copies": max(r.get("copies", 1) for r in rows), "l2_mib": l2 / 2**20,
            "capped_union": max((r["union"] for r in capped if "union" in r), default=None),
            "capped_b1": sorted({r["params"]["allowed"] for r in capped
                                 if r["params"].get("batch") == 1 and r["params"].get("kind") == "random"}),
            "capped_fit_l2": bool(capped) and max(r["read_bytes"] * r["copies"] for r in capped) <= l2}


def counts_words(counts) -> str:
    """``1, 8 and 100`` (numbers with thousands separators; words as they are)."""
    names = [c if isinstance(c, str) else f"{c:,}" for c in counts]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def page_capped_key(results) -> str | None:
    """:func:`capped_key` once for the whole page (the tables of the chapter's run mark their capped rows alike);
    None where the run marks no row."""
    return capped_key(rotation(results))


#: The step whose kernel each path of step 12 (and of the plan's buckets) runs.
PATH_STEPS = {"few_ids": 8, "stream": 7, "batched": 10, "row_skip": 3}


def dispatch_step(results, allowed: int) -> str | None:
    """The step whose kernel step 12 runs at batch 1 on random masks of ``allowed`` ids in ``results`` (``step 8``,
    ``step 7``...), from the path its row records; None where the row is not there."""
    row = _row(results, step_series(12), batch=1, kind="random", allowed=allowed)
    return None if row is None or row.get("path") is None else _path_step(row["path"])


def plan_step(results, **params) -> str | None:
    """The step whose kernel the plan's graph replays at a point of ``results`` (``step 7`` at batch 1), from the
    bucket its row records (``stream 1024``: the path, then the capacity); None where the row is not there."""
    row = _row(results, PLAN, **params)
    return None if row is None or not row.get("bucket") else _path_step(row["bucket"].split()[0])


def _path_step(path: str) -> str:
    return f"step {PATH_STEPS[path]}" if path in PATH_STEPS else path


#: A path of step 12 or a bucket of the plan that runs no step's kernel, in the page's words.
PATH_WORDS = {"cublas": "cuBLAS", "dense": "cuBLAS, then the bitmask"}


def path_words(path: str) -> str:
    """A path (``stream``) or a plan's bucket (``stream 1024``: the path, then the capacity) in the page's words:
    the step whose kernel it runs (``step 7's kernel``, ``step 7's kernel, up to 1,024 rows``) or what runs
    (:data:`PATH_WORDS`), never the code's name for it."""
    name, _, capacity = path.partition(" ")
    words = f"step {PATH_STEPS[name]}'s kernel" if name in PATH_STEPS else PATH_WORDS.get(name, name)
    return words if not capacity or name not in PATH_STEPS else f"{words}, up to {int(capacity):,} rows"


def loss_account(results) -> dict[str, Any] | None:
    """Where the time of the worst loss (the largest "slower by" of :func:`losses_table`) goes, from the run: ``q`` (its
    row of :func:`_losses`), ``rows_us`` and ``output_us`` (the union's rows read and the fp32 ``[B, V]`` output
    written, each at the run's copy bandwidth), ``rest_us`` (ours less both), ``write_gbs`` (the call's bytes over
    its time: the rate it moves them at) and ``bandwidth_gbs``; and ``smaller`` (the same series, masks and path at
    the next smaller batch measured, or None), which shows whether the time follows the batch's output or the rows.
    None where nothing loses."""
    lost = [q for q in _losses(results) if not is_tie(q)]
    if not lost:
        return None
    q = max(lost, key=lambda q: q["mine"]["ms"] / q["rival"]["ms"])
    p, mine = q["params"], q["mine"]
    union = mine.get("union", p["allowed"])
    bandwidth = results.data["ceilings"]["copy_bandwidth_gbs"]
    rows_us = union * HIDDEN * 2 / (bandwidth * 1e3)
    output_us = p["batch"] * VOCAB * 4 / (bandwidth * 1e3)
    same = [r for r in results.select(mine["series"], layout="vd", kind=p["kind"], allowed=p["allowed"])
            if r["clock"] == "gpu" and r.get("path") == mine.get("path") and r["params"]["batch"] < p["batch"]]
    smaller = max(same, key=lambda r: r["params"]["batch"], default=None)
    return {"q": q, "union": union, "rows_us": rows_us, "output_us": output_us,
            "rest_us": mine["ms"] * 1e3 - rows_us - output_us, "bandwidth_gbs": bandwidth,
            "write_gbs": call_bytes(p["batch"], union) / (mine["ms"] * 1e6), "smaller": smaller}


#: ``lab/masked_lm_head/results/nvidia-h200/``: the kernel alone against torch.compile's fused gather, two machines.
COMPILED_GATHER = ("compiled_gather", "compiled_gather_second_host")
COMPILED_RIVALS = ("index_select_compiled", "gather_dot_compiled")


def compiled_gather_leads(name: str) -> dict[int, float] | None:
    """Allowed count -> step 12's lead over torch.compile's faster gather (max-autotune) in one committed lab run
    (``lab/masked_lm_head/compiled_gather.py``), every output checked there; None where the run is not committed."""
    data = lab_or_none("masked_lm_head", name)
    if data is None:
        return None
    if not all(c["passed"] for c in data["checks"]):
        raise ValueError(f"{name}: a check failed; its times are not a comparison")
    by = {(r["series"], r["params"]["allowed"]): r["ms"] for r in data["measurements"]}
    return {n: min(by[(s, n)] for s in COMPILED_RIVALS) / by[("step12", n)]
            for n in sorted({a for _, a in by}) if ("step12", n) in by}


def compiled_gather_times(name: str) -> dict[int, tuple[float, float]] | None:
    """Allowed count -> (step 12's time, torch.compile's faster gather's time), in ms, in one committed lab run: the
    two times whose ratio :func:`compiled_gather_leads` gives; None where the run is not committed."""
    data = lab_or_none("masked_lm_head", name)
    if data is None:
        return None
    by = {(r["series"], r["params"]["allowed"]): r["ms"] for r in data["measurements"]}
    return {n: (by[("step12", n)], min(by[(s, n)] for s in COMPILED_RIVALS))
            for n in sorted({a for _, a in by}) if ("step12", n) in by}


def compiled_gather_words() -> tuple[str, str]:
    """(lead, sentence): step 12's lead at 1,000 allowed over torch.compile's fused gather, and one sentence with
    both counts, each ratio with its two times at two decimals (the ratio of the times as printed), from the first
    run (the second machine's agrees: the lab README);
    ("", "") where none is committed."""
    leads = compiled_gather_leads(COMPILED_GATHER[0])
    if not leads:
        return "", ""
    times = compiled_gather_times(COMPILED_GATHER[0])
    both = " and ".join(f"{_x(x)} at {n:,}{' allowed' if k == 0 else ''} ({us(times[n][0], 2)} against "
                        f"{us(times[n][1], 2)} µs)" for k, (n, x) in enumerate(sorted(leads.items())))
    return _x(leads[1000]), (
        f"Its strongest rival is `torch.compile` (max-autotune) of the same expression, which fuses the gather: step 12 "
        f"leads it by {both}, and also writes `-inf` elsewhere.")


# --------------------------------------------------------------------------------------
# Listings of shared functions without the hooks later steps add
# --------------------------------------------------------------------------------------

#: Shared functions that carry a later step's hook, by name: (the step that adds it, each (text, replacement) that
#: takes it out, what the listing's title says of it). The library keeps one function for every step; an earlier
#: step's listing shows it without the hook, and the step that adds it shows the hook as a diff (:func:`hook_diff`).
HOOKS = {
    "dot_kn": (2, ((", wanted,\n", ",\n"),
                   ("        if wanted is not None:  # step 2: only the columns that some sequence of the tile "
                    "allows\n", ""),
                   ("            b_mask = b_mask & wanted[None, :]\n", "")),
               "without the wanted mask that step 2 adds"),
}


def _source(function) -> str:
    from studylog import source

    return common.without_docstrings(source.source_of(function)[0])


def without_hooks(function, name: str) -> str:
    """``function``'s source without its docstring and without the hook a later step adds (:data:`HOOKS`); a hook
    not found (the library's function changed) raises, so no listing silently shows it."""
    text = _source(function)
    for old, new in HOOKS[name][1]:
        if text.count(old) != 1:
            raise ValueError(f"{name}: the hook text {old!r} is not found once")
        text = text.replace(old, new)
    return text


def listing_without_hooks(function, name: str, title: str):
    """A titled listing (a ``studylog.source.Code``) of ``function`` as an earlier step uses it: its later step's hook
    left out, the title saying so."""
    from studylog import source

    return source.Code(without_hooks(function, name), "python", f"{title} ({HOOKS[name][2]})")


def hook_diff(function, name: str):
    """The diff that adds a later step's hook to ``function`` (:data:`HOOKS`), for that step's section."""
    from studylog import source

    step = HOOKS[name][0]
    return source.show_diff(without_hooks(function, name), _source(function),
                            names=(f"{name} (before step {step})", f"{name} (step {step})"))
