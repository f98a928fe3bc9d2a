"""What notebook 03 reads from a results file besides the figures: a grid case's row (the prose's numbers), the
table of steps (each against the step it builds on and the floor), the summary of every step, the real-text table,
and the targets' verdicts; the lab runs the page reads (the two ideas of steps 6 and 9 one at a time, the splits
of steps 8 and 9); and the model of the published BlockScan budget that
the notebook shows departing from the sequential rule (:func:`published_blockscan_counts`). Every results function
takes a :class:`studylog.plotting.Results` and reads it through the lookups the figures use
(:mod:`book.ngram.results`); a file older than a series gives ``–`` (or leaves the line out) where it lacks one.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from book.common import ChainRow, and_list, us
from book.ngram.figures import case_label, clock_words, shape_label
from book.ngram.results import (clock_of, floor_of, grid_configs, grid_select, own_series, real_cases_in, real_row,
                                same_clock_pair)
from studylog.ngram import CHAPTER, step12_skip_refused, step07_early_phase2
from studylog.ngram.formats import NONE_KEY, NgramConfig, NgramInputs
from studylog.ngram.models import decode_key, slot_plan
from studylog.ngram.report import NO_BUDGET, SYNCED_SERIES, SYNCED_STEP

__all__ = ["published_blockscan_counts", "BOEHM_CASES", "HEADLINE", "RESULT_CASE", "OPEN_CASES", "TABLE_CASES",
           "table_floor_us", "floor_words", "EXIT_RUNS", "lab_run", "variant_row",
           "exit_factor", "STEP9_RUN", "STEP9_PARTS", "step9_times", "step9_factor", "PARTS", "part_us", "part_factor", "part_best", "step6a_diff", "step9_diff", "STEP6_CHAIN", "CHAIN_CASES", "step6_chain", "chain_gap", "case_name", "step_factors", "host_us", "launches", "eager_host", "SHORT_CHANGES", "PATHS", "path_words", "rival_ratios",
           "DIFF_CONTEXT", "SEARCH_DIFFS", "step_diff", "CORES", "step_core",
           "RULE_SPREAD", "rule_misses", "early_exit_share", "active_slots", "step07_launches", "shared_definitions", "entry_row", "floor_us", "grid_row", "result_table", "result_tables", "fold_table", "TIE", "ratio_cell",
           "launch_bound", "kept_note", "STEPS_CASES", "the_steps_table", "case_words", "step_table",
           "real_text_table", "summary_table", "target_verdicts", "BUDGET_EXAMPLE", "budget_example",
           "budget_example_table", "real_text_slower"]


def published_blockscan_counts(inputs: NgramInputs, keys: list[int], seq_lens_this_time: Tensor,
                               config: NgramConfig) -> Tensor:
    """seq_lens_this_time as the published BlockScan phase 2 (ngram variant) computes it: the
    budget of slot b is ``threshold - (tentative counts before b) - (active slots after b)``, and a
    budget <= 1 means no drafts. Kept to show where it departs from the sequential rule."""
    if config.hybrid:
        raise ValueError("published_blockscan_counts models the ngram variant only")
    this_time = seq_lens_this_time.tolist()
    lists = (inputs.step_idx.tolist(), inputs.draft_token_num.tolist(), inputs.max_dec_len.tolist(),
             inputs.seq_lens_encoder.tolist(), inputs.seq_lens_decoder.tolist(), list(this_time))
    prompt_lens, step_idx = inputs.prompt_lens.tolist(), inputs.step_idx.tolist()
    batch = inputs.batch
    tentative, is_active = [], []
    for b in range(batch):
        kind, _, base, cap = slot_plan(b, config, *lists)
        if kind == "keep":  # prefill: its own count, and it counts as active
            tentative.append(base)
            is_active.append(1)
            continue
        drafted = 0
        if kind == "active" and keys[b] != NONE_KEY and cap >= 1:
            n, source, start = decode_key(keys[b])
            drafted = min(cap, (step_idx[b] if source else prompt_lens[b]) - start - n)
        tentative.append(base + drafted if kind == "active" else 0)
        is_active.append(1 if tentative[-1] > 0 else 0)
    out = list(this_time)
    token_prefix = active_prefix = 0
    total_active = sum(is_active)
    for b in range(batch):
        token_prefix += tentative[b]
        active_prefix += is_active[b]
        if inputs.seq_lens_encoder[b] > 0:
            continue
        if tentative[b] == 0:
            out[b] = 0
            continue
        budget = config.threshold - (token_prefix - tentative[b]) - (total_active - active_prefix)
        out[b] = 1 if budget <= 1 else min(tentative[b], budget)
    return torch.tensor(out, dtype=torch.int32)


def grid_row(results, series: str, cfg: tuple[int, int, int]) -> dict | None:
    """The grid's row of ``series`` at ``cfg`` = (batch, seq_len, threshold), or None when the file has none."""
    rows = grid_select(results, series, cfg)
    return rows[0] if rows else None


def _us_cell(row) -> str:
    """A row's time in µs with its repetitions' min–max where it has them; ``–`` where there is no row."""
    if row is None:
        return "–"
    cell = us(row["ms"])
    if "spread_ms" in row:
        lo, _, hi = row["spread_ms"]
        cell += f" ({us(lo)}–{us(hi)})"
    return cell


def step_table(results, steps, configs=None) -> str:
    """Markdown: per grid case, the floor (:func:`floor_us`) and the time of each of ``steps`` (numbers or series; µs
    per call, median, with the repetitions' min–max where the file has them; each column says its clock), and the
    last step's time over the floor."""
    steps = [CHAPTER.step(s) for s in steps]
    configs = configs or grid_configs(results)
    clocks = {s.series: clock_words(clock_of(results, s.series) or "do_bench") for s in steps}
    head = ["case", "floor µs"] + [f"{s.name} µs ({clocks[s.series]})" for s in steps] + [f"{steps[-1].name} / floor"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cfg in configs:
        rows = [grid_row(results, s.series, cfg) for s in steps]
        floor = next((floor_of(results, r) for r in rows if r and floor_of(results, r)), None)
        last = rows[-1]
        ratio = f"{last['ms'] / floor:,.2f}" if last and floor else "–"
        lines.append("| " + " | ".join([case_label(cfg).replace("\n", ", "), f"{floor * 1e3:,.2f}" if floor else "–"]
                                       + [_us_cell(r) for r in rows] + [ratio]) + " |")
    return "\n".join(lines)


def real_text_table(results) -> str:
    """Markdown: per real-text case, the CPU path (host clock, end to end), step 12 (GPU clock, and end to
    end), the drafts found and accepted, and the branches the search took. Empty when the file has none."""
    cases = real_cases_in(results)
    if not cases:
        return ""
    head = ["corpus", "shape", f"{CHAPTER.steps[0].name} µs (host, end to end)",
            f"{CHAPTER.step(SYNCED_STEP).name} µs (GPU)", f"{CHAPTER.step(SYNCED_STEP).name} µs (host, end to end)",
            "slots drafting",
            "drafted", "accepted", "3-gram / shorter / no match", "newest-token hits per 1k", "early exit reads"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in cases:
        cpu, final = real_row(results, CHAPTER.steps[0].series, case), real_row(results, CHAPTER.step(SYNCED_STEP).series, case)
        synced = real_row(results, SYNCED_SERIES, case)
        d, b = (final or {}).get("drafts", {}), (final or {}).get("branches", {})
        accepted = (f"{d['accepted_tokens']} ({d['accepted_tokens'] / d['drafted_tokens']:.0%})"
                    if d.get("drafted_tokens") else str(d.get("accepted_tokens", "–")))
        lines.append("| " + " | ".join([
            case[0], shape_label(case), *(us(r["ms"]) if r else "–" for r in (cpu, final, synced)),
            f"{d['slots_with_drafts']} of {d['active_slots']}" if d else "–", str(d.get("drafted_tokens", "–")),
            accepted,
            f"{b['top_n_matches']} / {b['shorter_matches']} / {b['no_match']}" if b else "–",
            f"{b['newest_token_hits_per_1k']:.1f}" if b else "–",
            f"{b['early_exit_fraction']:.0%}" if b else "–"]) + " |")
    return "\n".join(lines)


def summary_table(results) -> str:
    """Markdown: µs per step (step 1 on the host clock, end to end; the others on the GPU clock), the final
    step end to end, the CPU path's time over it (one clock), and the best kernel's distance to the floor (the book's,
    :func:`book.ngram.results.floor_of`)."""
    steps = CHAPTER.steps
    head = ["config", "threshold"] + [s.name for s in steps] + [f"{steps[-1].name} call + sync",
                                                                "CPU path / kernel (one clock)", "best / floor"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in grid_configs(results):
        cells = [f"{c[0]}x{c[1]}", "none" if c[2] == NO_BUDGET else str(c[2])]
        ms = {}
        for s in steps:
            rows = grid_select(results, s.series, c)
            if rows:
                ms[s.series] = rows[0]
            cells.append(us(ms[s.series]["ms"]) if s.series in ms else "skipped")
        synced = grid_select(results, SYNCED_SERIES, c)
        cells.append(us(synced[0]["ms"]) if synced else "–")
        pair = same_clock_pair(results, c)
        cells.append(f"{pair[0]['ms'] / pair[1]['ms']:,.1f}x" if pair else "–")
        kernels = [r for s, r in ms.items() if s in own_series()]
        best = min(kernels, key=lambda r: r["ms"]) if kernels else None
        if best is not None and floor_of(results, best):
            cells.append(f"{best['ms'] / floor_of(results, best):.2f}")
        else:
            cells.append("–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def target_verdicts(results) -> str:
    """The chapter's goals, each with the measured number that meets or misses it (Markdown list): bit-identical
    results, at least 10x faster than the CPU path at batch >= 32 (one clock), 32x512 under 15 µs, and 256x131072
    within 1.5x of the floor (the book's, :func:`book.ngram.results.floor_of`)."""
    checks = results.data.get("checks", [])
    failed = [c for c in checks if not c["passed"]]
    lines = [f"- bit-identical on every benchmark input: {len(checks) - len(failed)} of {len(checks)} checks passed"
             + (" (failures: " + "; ".join(f"{c['name']} {c['params']}" for c in failed[:5]) + ")" if failed else "")]

    def best(c):
        rows = [r for s in own_series() for r in grid_select(results, s, c)]
        return min(rows, key=lambda r: r["ms"]) if rows else None

    speedups = []
    for c in grid_configs(results):
        pair = same_clock_pair(results, c)
        if c[0] >= 32 and pair:
            speedups.append((pair[0]["ms"] / pair[1]["ms"], c, pair[2], clock_words(pair[1].get("clock", "do_bench"))))
    if speedups:
        worst = min(speedups)
        verdict = "met" if worst[0] >= 10 else "missed"
        lines.append(f"- at least 10x faster than the CPU path at batch >= 32: {verdict}; the smallest speedup is "
                     f"{worst[0]:,.1f}x ({worst[1][0]}x{worst[1][1]}, {worst[2]}, {worst[3]})")
    for (b, s), target, what in (((256, 131072), None, "floor"), ((32, 512), 15.0, "15 µs")):
        cfg = next((c for c in grid_configs(results) if c[:2] == (b, s)), None)
        top = best(cfg) if cfg else None
        if top is None:
            continue
        top_us = top["ms"] * 1e3
        name = CHAPTER.label(top["series"])
        clock = clock_words(top.get("clock", "do_bench"))
        if target is None:
            floor = floor_of(results, top)
            ratio = top["ms"] / floor
            verdict = "met" if ratio <= 1.5 else "missed"
            lines.append(f"- {b}x{s} within 1.5x of the floor: {verdict}; {name} takes {top_us:.1f} µs "
                         f"({clock}), {ratio:.2f}x the floor of {floor * 1e3:.1f} µs")
        else:
            verdict = "met" if top_us < target else "missed"
            lines.append(f"- {b}x{s} under {what}: {verdict}; {name} takes {top_us:.1f} µs ({clock})")
    return "\n".join(lines)


#: The cases of the table of steps: a small batch under the deployed budget, where a launch and one round trip to
#: memory bound the time; the chapter's headline case (:data:`HEADLINE`); and the largest grid case, where the
#: bytes do.
BOEHM_CASES = ((32, 512, 128), (128, 32768, 128), (256, 131072, NO_BUDGET))
#: The case the chapter's headline is quoted at (a column of the table of steps).
HEADLINE = (128, 32768, 128)
#: The case the result leads with: 512 slots of 16,384 tokens and no budget, where the most slots search (the
#: scoreboard's ``NGRAM_LEAD_CASE``). The lab runs of :data:`EXIT_RUNS` do not time it, so it is not in
#: :data:`BOEHM_CASES`; the table of steps shows it beside :data:`HEADLINE`.
RESULT_CASE = (512, 16384, NO_BUDGET)
#: The table of steps' cases, open: the result's, where the main line is quoted, and the budget path's.
OPEN_CASES = (RESULT_CASE, HEADLINE)
#: The table of steps' cases, folded, in order of size: :data:`BOEHM_CASES` with :data:`RESULT_CASE`; index 1 is
#: :data:`HEADLINE`, as in :data:`BOEHM_CASES`.
TABLE_CASES = (BOEHM_CASES[0], HEADLINE, RESULT_CASE, BOEHM_CASES[2])

#: The lab runs of ``lab/ngram/step05_12_changes.py``: an early exit added to step 5 (``5b`` over ``5``, a frozen copy
#: of step 5; the page's step 6 chain starts with it) and step 12 without the early exit it inherits (``12 no exit``
#: over ``12``, a frozen copy of step 12): file -> (series, variant without the exit, variant with it).
EXIT_RUNS = {"step05_changes": ("step05_changes", "5", "5b"), "step12_changes": ("step12_changes", "12 no exit", "12")}


def lab_run(name: str, gpu: str = "nvidia-h200"):
    """A lab run of :data:`EXIT_RUNS` (``lab/ngram/results/<gpu>/<name>.json``), as
    :class:`~studylog.plotting.Results`; None where it is not committed for ``gpu``."""
    from book.common import lab_or_none
    from studylog.plotting import Results

    data = lab_or_none("ngram", name, gpu)
    return None if data is None else Results(None, data)


def variant_row(run, series: str, variant: str, cfg: tuple[int, int, int]) -> dict | None:
    """The row of ``variant`` (a variant of ``series`` in ``run``) at grid case ``cfg``; None where not measured."""
    if run is None:
        return None
    b, s, t = cfg
    rows = run.select(series, variant=variant, batch=b, seq_len=s, threshold=t)
    return rows[0] if rows else None


def exit_factor(run, name: str, cfg: tuple[int, int, int], clock: str = "ms") -> float | None:
    """How much faster the early exit makes its kernel at ``cfg`` in the lab run ``name`` of :data:`EXIT_RUNS`
    (``run``, :func:`lab_run`): the variant without it over the variant with it, on the GPU clock (``"ms"``) or in
    host time per eager call (``"host_ms"``). Above 1 the exit pays."""
    series, without, with_ = EXIT_RUNS[name]
    a, b = (variant_row(run, series, v, cfg) for v in (without, with_))
    if a is None or b is None or a.get(clock) is None or b.get(clock) is None:
        return None
    return a[clock] / b[clock]


#: Step 6's two changes one at a time, from the lab run that timed them beside step 5 (``step05_changes``): step 5
#: (the anchor), the stop added to it (the exit behind two barriers a tile), then the split with the stop kept (step
#: 6): (row, its one change, the run's variant, the main benchmark's step it re-times or None).
STEP6_CHAIN = (("step 5", "one pass for every n", "5", 5),
               ("+ stop", "a block stops once no later window can win", "5b", None),
               ("step 6", "+ the split over a column of blocks", "6", 6))
#: The case step 6's chain is shown at, its one table: the budget path's (:data:`HEADLINE`); the lab run also has the
#: other cases of :data:`BOEHM_CASES`, which the page does not show.
CHAIN_CASES = (HEADLINE,)


#: Step 9's two ideas timed apart (``lab/ngram/step09_parts.py``): 9a, step 8 without its barriers (the run's
#: variant ``9a``, at step 8's split), then 9b, step 9 itself over 9a (its longer chunks and streamed loads). The run
#: times steps 8 and 9 beside it, so both ratios are within the run: {part: (row, the row it is against)}.
STEP9_RUN = "step09_parts"
STEP9_PARTS = {"9a": ("9a", "8"), "9b": ("9", "9a")}


def step9_times(cfg: tuple[int, int, int], gpu: str = "nvidia-h200") -> dict[str, float] | None:
    """The lab run of :data:`STEP9_RUN` at ``cfg``, µs on the GPU clock: ``"8"`` and ``"9"`` (the library's steps,
    timed beside), ``"9a"``, ``"9a long"`` (9a at step 9's split) and ``"9 short"`` (step 9 at step 8's split), and
    ``chunk_8``, ``chunk_9`` (the positions a block takes in steps 8 and 9); None where the run is not committed or
    lacks the case."""
    run = lab_run(STEP9_RUN, gpu)
    if run is None:
        return None
    b, s, t = cfg
    out = {}
    for n in (8, 9):
        rows = run.select(CHAPTER.step(n).series, batch=b, seq_len=s, threshold=t)
        if not rows:
            return None
        out[str(n)], out[f"chunk_{n}"] = rows[0]["ms"] * 1e3, rows[0]["params"]["chunk_len"]
    for variant in ("9a", "9a long", "9 short"):
        row = variant_row(run, STEP9_RUN, variant, cfg)
        if row is None:
            return None
        out[variant] = row["ms"] * 1e3
    return out


#: The sub-steps of steps 6 and 9, each timed in a lab run beside the rows around it: part -> (the run, the row's
#: variant in it or the library step it re-times, and the row it is against). 6a is a stop added to step 5 (the frozen
#: step 5 with the early exit, ``step05_changes``), 6b the split with that stop kept (step 6); 9a and 9b are
#: :data:`STEP9_PARTS`.
PARTS = {"6a": ("step05_changes", "5b", "5"), "6b": ("step05_changes", "6", "5b"),
         "9a": ("step09_parts", "9a", 8), "9b": ("step09_parts", 9, "9a")}


def part_us(part: str, cfg: tuple[int, int, int], which: int = 0, gpu: str = "nvidia-h200") -> float | None:
    """Sub-step ``part``'s row (``which`` 0) or the row it is against (1) at ``cfg``, µs on the GPU clock, from its
    lab run (:data:`PARTS`); None where the run is not committed or lacks the case."""
    name, *rows = PARTS[part]
    run = lab_run(name, gpu)
    if run is None:
        return None
    what = rows[which]
    if isinstance(what, int):
        b, s, t = cfg
        found = run.select(CHAPTER.step(what).series, batch=b, seq_len=s, threshold=t)
        row = found[0] if found else None
    else:
        row = variant_row(run, name, what, cfg)
    return None if row is None else row["ms"] * 1e3


def part_factor(part: str, cfg: tuple[int, int, int], gpu: str = "nvidia-h200") -> float | None:
    """Sub-step ``part`` at ``cfg``: the row it is against over its own, in its lab run on ``gpu`` (above 1 it
    pays)."""
    row, against = part_us(part, cfg, gpu=gpu), part_us(part, cfg, 1, gpu=gpu)
    return None if row is None or against is None else against / row


def part_best(part: str, gpu: str = "nvidia-h200") -> tuple[float, tuple[int, int, int]] | None:
    """Where sub-step ``part`` pays most over every case its lab run times (:data:`BOEHM_CASES` and
    :data:`RESULT_CASE`): ``(factor, case)``; None where the run is not committed."""
    found = [(f, cfg) for cfg in (*BOEHM_CASES, RESULT_CASE) if (f := part_factor(part, cfg, gpu)) is not None]
    return max(found) if found else None


def step9_factor(part: str, cfg: tuple[int, int, int]) -> float | None:
    """Sub-step ``part`` of :data:`STEP9_PARTS` at ``cfg``: the row it is against over its own (above 1 it pays)."""
    return part_factor(part, cfg)


def _crop(text: str, start: str) -> str:
    """``text`` from its line containing ``start``, without lines that are only a comment."""
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if start in ln)
    return "\n".join(ln for ln in lines[i:] if not ln.lstrip().startswith("//")) + "\n"


def step6a_diff():
    """6a as the page shows it: step 5's search against the same kernel with the stop (the frozen copy of step 5,
    ``one_pass_search<EARLY_EXIT>``, each ``if constexpr`` resolved): the loop's test and its two barriers a tile."""
    from studylog import paths
    from studylog.source import Diff, resolve_constexpr, source_of

    text = source_of(paths.REPO_ROOT / "lab" / "ngram" / "variants" / "step05_exit.cu", "one_pass_search")[0]

    def resolved(exit_: bool) -> str:
        out = []
        for ln in resolve_constexpr(text.splitlines(), {"EARLY_EXIT": exit_}):
            if ln.startswith("template <"):
                continue
            m = re.match(r"(\s*)if constexpr \((!?)EARLY_EXIT\) (.*)", ln)  # a one-line `if constexpr`
            if m:
                if (m[2] == "!") != exit_:
                    out.append(m[1] + m[3])
                continue
            out.append(ln.replace("one_pass_search", "ngram_search_one_pass"))
        return "\n".join(out) + "\n"

    return Diff(resolved(False), resolved(True), "step05_one_pass", "6a", DIFF_CONTEXT)


def step9_diff(part: str):
    """Sub-step ``part``'s change as the page shows it. ``"9a"``: step 8's search of a chunk against 9a's, from the
    test that a chunk searches on (the frozen copy's ``search_chunk<false>``, its ``if constexpr`` resolved and the
    shared declarations only the barriers use left out). ``"9b"``: the split, step 8's chunk length against step 9's
    (Python). ``"9b kernel"``: 9a's search against step 9's kernel, what the rest of 9b is (the same loop as the
    template steps 10 to 12 share)."""
    from studylog import paths
    from studylog.ngram import kernels
    from studylog.source import Diff, resolve_constexpr, source_of

    if part == "9b":
        return Diff(source_of(kernels.fused_chunk_len)[0], source_of(kernels.stream_chunk_len)[0],
                    "step 8's split", "step 9's split", DIFF_CONTEXT)
    variant = source_of(paths.REPO_ROOT / "lab" / "ngram" / "variants" / "step09_parts.cu", "search_chunk")[0]
    kept = [ln.replace("<BARRIERS>", "").replace("scan_tile<false>", "scan_tile")
            for ln in resolve_constexpr(variant.splitlines(), {"BARRIERS": False})
            if not ln.startswith("template <") and "__shared__" not in ln]
    nine_a = "\n".join(kept) + "\n"
    if part == "9b kernel":
        return Diff(nine_a, kernels.stream_source(vec=1, evict_first=False, skip_refused=False), "9a",
                    "step09_stream", DIFF_CONTEXT)
    start = "if (p.kind == SLOT_ACTIVE"
    return Diff(_crop(source_of("ngram_one_pass.cu", "search_chunk")[0], start), _crop(nine_a, start),
                "step08_one_pass_fused", "9a", DIFF_CONTEXT)


def case_name(cfg: tuple[int, int, int]) -> str:
    """A case of :data:`BOEHM_CASES` as a column names it: ``32 × 512``."""
    return f"{cfg[0]} × {cfg[1]}"


def step6_chain(gpu: str = "nvidia-h200", cases=BOEHM_CASES) -> list[ChainRow] | None:
    """Step 6's changes one at a time (:data:`STEP6_CHAIN`), µs per case of ``cases`` on the GPU clock, as rows of
    the book's chain table (:func:`book.common.chain_table`); None where the lab run is not committed for ``gpu``
    or lacks a row."""
    run = lab_run("step05_changes", gpu)
    rows = []
    for label, change, variant, _ in STEP6_CHAIN:
        found = {cfg: variant_row(run, "step05_changes", variant, cfg) for cfg in cases}
        if any(r is None for r in found.values()):
            return None
        rows.append(ChainRow(label, change, {cfg: r["ms"] * 1e3 for cfg, r in found.items()}))
    return rows


def chain_gap(results, rows: list[ChainRow], cases=None) -> float:
    """The largest relative gap between a chain's anchors (the rows of :data:`STEP6_CHAIN` that re-time a step of
    the library) and the same steps in ``results``, over ``cases`` (default: every case the chain has): how far its
    run sits from the table of steps."""
    steps = {label: number for label, _, _, number in STEP6_CHAIN if number is not None}
    return max(abs(row.us[cfg] / (grid_row(results, CHAPTER.step(steps[row.label]).series, cfg)["ms"] * 1e3) - 1)
               for row in rows if row.label in steps for cfg in (cases or row.us))


def path_words(results, number: int, cases=None) -> str:
    """Where step ``number`` pays against the step before it on its path (:func:`row_factor`, the table's ratio,
    rounded as the table rounds: above a tie, :data:`TIE`, it pays), in words: "pays at 128 × 32768, not at 32 × 512
    and 512 × 16384",
    "pays at every case" or "pays at no case". The cases are the columns of the page's one table of steps
    (:data:`STEPS_CASES`) unless given, so the sentence names only cases the reader sees there."""
    cases = STEPS_CASES if cases is None else cases
    factors = [row_factor(results, number, cfg) for cfg in cases]
    at = [(f"{b} × {s}", round(f, 2) > TIE[1]) for (b, s, _), f in zip(cases, factors) if f is not None]
    pays, loses = [w for w, ok in at if ok], [w for w, ok in at if not ok]
    if not loses:
        return "pays at every case"
    if not pays:
        return "pays at no case"
    return f"pays at {and_list(pays)}, not at {and_list(loses)}"


def rival_ratios(results, rival: int = 4) -> dict[tuple[int, int, int], float]:
    """Per synthetic grid case, step ``rival``'s GPU-clock time over the entry point's (:func:`entry_row`): how many
    times as fast ``ngram_match`` is as our corrected port of FastDeploy's kernel (step 4) at every shape measured."""
    out = {}
    for cfg in grid_configs(results):
        ours = entry_row(results, {"batch": cfg[0], "seq_len": cfg[1], "threshold": cfg[2], "corpus": None})
        theirs = grid_row(results, CHAPTER.step(rival).series, cfg)
        if ours and theirs and theirs.get("clock") == ours.get("clock") == "gpu":
            out[cfg] = theirs["ms"] / ours["ms"]
    return out


#: Steps that build on another step than the one before them: step -> the step it changes.
BUILDS_ON = {8: 6}


def builds_on(number: int) -> int:
    """The step that step ``number`` changes: its "× previous" is that step's time over its own."""
    return BUILDS_ON.get(number, number - 1)


def step_factors(results, number: int, cases=TABLE_CASES, clock: str = "ms") -> list[float | None]:
    """Step ``number``'s "× previous" at each of ``cases``: the step it builds on (:func:`builds_on`) over it, on the
    GPU clock (``"ms"``) or in host time per eager call (``"host_ms"``); None where either row is missing."""
    out = []
    for cfg in cases:
        before, row = (grid_row(results, CHAPTER.step(n).series, cfg) for n in (builds_on(number), number))
        ok = before and row and before.get(clock) and row.get(clock)
        out.append(before[clock] / row[clock] if ok else None)
    return out


def host_us(results, number: int, cfg: tuple[int, int, int]) -> float | None:
    """Step ``number``'s host time per eager call at ``cfg``, in µs (the launches back to back, no sync)."""
    row = grid_row(results, CHAPTER.step(number).series, cfg)
    return None if row is None or row.get("host_ms") is None else row["host_ms"] * 1e3


def launches(number: int) -> int:
    """How many kernels a call of step ``number`` launches, counted in its step function's source (the launches of
    :mod:`studylog.ngram.kernels`, each through ``_kernel(...)``, each with the same arguments, ``*m.args``)."""
    import inspect

    from studylog.ngram import kernels

    source = inspect.getsource(getattr(kernels, CHAPTER.step(number).name))
    if source.count("_kernel(") != source.count("*m.args"):
        raise ValueError(f"step {number} launches a kernel with other arguments than the matcher's")
    return source.count("_kernel(")


def eager_host(results, cfg: tuple[int, int, int] = HEADLINE) -> dict:
    """What an eager caller of the entry point pays on the host at ``cfg``, in µs, from the benchmark: ``entry_host``
    and ``entry_gpu`` (``ngram_match``'s host time per eager call, back to back, and its GPU-clock time), ``steps``
    (the host time per eager call of steps 7 to the last) and ``same_launch``: ``(case, entry point µs, last step
    µs)`` at the case of :data:`BOEHM_CASES` where the entry point runs the last step and the two host times of that
    one step's launch (timed twice in one run) differ most."""
    where = {"batch": cfg[0], "seq_len": cfg[1], "threshold": cfg[2], "corpus": None}
    entry = entry_row(results, where)
    final = CHAPTER.step(SYNCED_STEP)
    pairs = []
    for case in BOEHM_CASES:
        row = entry_row(results, dict(zip(("batch", "seq_len", "threshold"), case), corpus=None))
        own = host_us(results, final.number, case)
        if row and row.get("step") == final.series and row.get("host_ms") and own:
            pairs.append((case, row["host_ms"] * 1e3, own))
    return {"entry_host": entry["host_ms"] * 1e3, "entry_gpu": entry["ms"] * 1e3,
            "steps": {n: host_us(results, n, cfg) for n in range(7, CHAPTER.final.number + 1)},
            "same_launch": max(pairs, key=lambda p: abs(p[1] - p[2])) if pairs else None}


def floor_us(results, cfg: tuple[int, int, int]) -> float | None:
    """The least time a call can take at ``cfg``, in µs (the book's floor, :func:`book.common.floor_ms`): the larger
    of the active slots' haystacks read once at the copy bandwidth (bytes read plus written per second) and the
    card's fastest empty kernel. At small cases the empty kernel is larger: a latency floor."""
    row = grid_row(results, CHAPTER.step(1).series, cfg)
    return None if row is None else floor_of(results, row) * 1e3


def _bench_batch(results, cfg: tuple[int, int, int]):
    """The benchmark's batch at grid case ``cfg``, rebuilt on the CPU: ``(inputs, seq_lens_this_time, config)``. The
    slots' plan and planted repeats come from a CPU generator, so the rebuilt batch has the benchmark's lengths and
    matches (a chance 3-gram among uniform ids is vanishingly rare); the haystack bytes must equal the committed
    row's, or the rebuild is not the benchmark's batch."""
    from studylog.ngram.batches import haystack_bytes
    from studylog.ngram.report import grid_batch

    batch, seq_len, threshold = cfg
    inputs, draft, this_time = grid_batch(batch, seq_len, device="cpu")
    config = NgramConfig(threshold=threshold)
    nbytes = haystack_bytes(inputs, this_time, config)
    row = grid_row(results, CHAPTER.step(1).series, cfg)
    if row is None or row.get("haystack_bytes") != nbytes:
        raise ValueError(f"the batch rebuilt at {cfg} is not the committed run's ({nbytes:,} haystack bytes)")
    return inputs, this_time, config


def early_exit_share(results, cfg: tuple[int, int, int]) -> float:
    """The share of the floor's bytes that a perfect early exit reads at grid case ``cfg``
    (:func:`studylog.ngram.batches.early_exit_bytes`: each haystack up to the end of its first top-n window, else all
    of it), on the benchmark's batch rebuilt on the CPU (:func:`_bench_batch`)."""
    from studylog.ngram.batches import early_exit_bytes, haystack_bytes

    inputs, this_time, config = _bench_batch(results, cfg)
    return early_exit_bytes(inputs, this_time, config) / haystack_bytes(inputs, this_time, config)


def active_slots(results, cfg: tuple[int, int, int]) -> int:
    """How many slots of the benchmark's batch at ``cfg`` are active with a draft cap of at least one from their
    request, the budget aside: the slots whose haystacks the floor counts (the row's ``haystack_bytes``); the others
    are in prefill or empty."""
    from studylog.ngram.models import slot_plans

    inputs, this_time, config = _bench_batch(results, cfg)
    return sum(kind == "active" and cap >= 1 for kind, _, _, cap in slot_plans(inputs, config, this_time))


def budget_walk(results, cfg: tuple[int, int, int]) -> dict:
    """What the budget leaves to search at grid case ``cfg``, on the benchmark's batch rebuilt on the CPU
    (:func:`_bench_batch`) and walked by the specification (:func:`studylog.ngram.reference_ngram_match`'s trace):
    ``searched`` (slots whose search runs: the loop of steps 1 and 2 searches these only), ``bytes`` (their haystacks'
    bytes, counted as :func:`studylog.ngram.batches.haystack_bytes` counts every active slot's), ``no_match`` (of those,
    searched to the end with no match), ``drafting`` (slots that get a draft), ``tokens`` (draft tokens in all) and
    ``starts`` (the drafting slots' match positions)."""
    import torch

    from studylog.ngram import reference_ngram_match

    inputs, this_time, config = _bench_batch(results, cfg)
    draft = torch.zeros((inputs.batch, config.max_draft_tokens + 1), dtype=torch.int64)
    trace: list = []
    reference_ngram_match(inputs, draft, this_time, config, trace=trace)
    searched = [t for t in trace if t["searched"]]
    prompt_lens, step_idx = inputs.prompt_lens.tolist(), inputs.step_idx.tolist()
    return {"searched": len(searched), "bytes": sum((prompt_lens[t["slot"]] + step_idx[t["slot"]]) * 8 for t in searched),
            "no_match": sum(t["start"] is None for t in searched),
            "drafting": sum(t["drafted"] > 0 for t in trace), "tokens": sum(t["drafted"] for t in trace),
            "starts": [t["start"] for t in trace if t["drafted"] > 0]}


#: The worked example of the budget under "The operation": the drafts each of four active slots wants, and the
#: budget that bites at the third.
BUDGET_EXAMPLE = ((3, 4, 5, 2), 14)


def budget_example(wants=BUDGET_EXAMPLE[0], threshold: int = BUDGET_EXAMPLE[1]) -> list[dict]:
    """The budget on a small batch, as the specification walks it (:func:`studylog.ngram.reference_ngram_match`'s
    trace): one active, counted slot per entry of ``wants``, each with base 1, whose pattern matches at the prompt's
    start with ``wants[b]`` tokens after it, so that with no budget it drafts ``wants[b]``. Per slot: ``wants``,
    ``T`` (its tentative count, base plus wants), ``before`` (the exclusive prefix sum of ``T``), the reference's
    ``sum`` (tokens given so far plus the slot's base) and ``left``, ``room`` (``threshold - sum - left``) and
    ``drafted``."""
    import torch

    from studylog.ngram import reference_ngram_match
    from studylog.ngram.models import slot_plans

    batch, pattern, width = len(wants), [7, 8, 9], 3 + max(wants) + 1
    prompt = torch.tensor([pattern + [10 + k for k in range(width - 3)]] * batch, dtype=torch.int64)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)
    inputs = NgramInputs(prompt_ids=prompt, prompt_lens=i32([width] * batch),
                         generated_ids=torch.tensor([pattern] * batch, dtype=torch.int64),
                         step_idx=i32([len(pattern) - 1] * batch), draft_token_num=i32(list(wants)),
                         max_dec_len=i32([1000] * batch), seq_lens_encoder=i32([0] * batch),
                         seq_lens_decoder=i32([len(pattern)] * batch))
    this_time, traces = i32([1] * batch), {}
    for budget in (NO_BUDGET, threshold):
        traces[budget] = []
        reference_ngram_match(inputs, torch.zeros((batch, max(wants) + 1), dtype=torch.int64), this_time,
                              NgramConfig(threshold=budget), trace=traces[budget])
    tentative = [t["drafted"] for t in traces[NO_BUDGET]]
    assert tentative == list(wants), (tentative, wants)
    bases = [base for _, _, base, _ in slot_plans(inputs, NgramConfig(threshold=threshold), this_time)]
    rows, before = [], 0
    for b, (t, base) in enumerate(zip(traces[threshold], bases)):
        rows.append({"slot": b, "wants": tentative[b], "T": base + tentative[b], "before": before, "sum": t["total"],
                     "left": t["left"], "room": threshold - t["total"] - t["left"], "drafted": t["drafted"]})
        before += base + tentative[b]
    return rows


def budget_example_table(wants=BUDGET_EXAMPLE[0], threshold: int = BUDGET_EXAMPLE[1]) -> str:
    """:func:`budget_example` as the page's Markdown table, the first slot where the budget bites marked."""
    rows = budget_example(wants, threshold)
    first = next((r["slot"] for r in rows if r["drafted"] < r["wants"]), None)
    lines = [f"| slot | wants | `T` (base + wants) | `T` before it | `sum` | `left` | room: {threshold} − `sum` − `left` "
             "| drafts |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = " (the budget bites)" if r["slot"] == first else ""
        lines.append(f"| {r['slot']} | {r['wants']} | {r['T']} | {r['before']} | {r['sum']} | {r['left']} | "
                     f"{r['room']} | **{r['drafted']}**{mark} |")
    return "\n".join(lines)


def real_text_slower(results, number: int = 12) -> list[float]:
    """Step ``number``'s time on each real-text case over its time on uniform ids at the same shape (the "On real
    text" section's cases)."""
    series = CHAPTER.step(number).series
    return [real_row(results, series, c)["ms"] / real_row(results, series, ("synthetic", *c[1:]))["ms"]
            for c in real_cases_in(results) if c[0] != "synthetic"]

#: Each row's one change in the table of steps, in a few words (each step's section says it in full).
SHORT_CHANGES = {1: "CPU loop, copies both ways", 2: "the loop on one GPU thread", 3: "a block a slot; serial budget",
                 4: "budget from prefix sums", 5: "one pass for every n", "6a": "a block stops once beaten",
                 6: "each slot over many blocks", "6b": "each slot over many blocks",
                 7: "phase 2 launched early", 8: "phase 2 in the last block", "9a": "no barrier in the loop",
                 9: "longer chunks per block", "9b": "longer chunks per block",
                 10: "16-byte loads", 11: "L2 evict-first hint", 12: "refused slots skip search"}
#: The two paths from step 6, each with the steps it takes: the budget path, for the case it serves (its section,
#: "The budget path: steps 8 to 12", comes after the table of steps), and the main line's last step: name -> steps.
PATHS = (("long haystacks under a budget", (8, 9, 10, 11, 12)), ("the main line's last step", (7,)))


def _budget_bytes_floor(results, cfg: tuple[int, int, int]) -> bool:
    """Whether the floor at ``cfg`` is set by bytes the budget may not let a kernel need: a budget lets fewer slots
    search than are active (:func:`budget_walk`) and the floor is the active slots' haystacks, not the empty kernel."""
    row = grid_row(results, CHAPTER.step(1).series, cfg)
    if cfg[2] == NO_BUDGET or row is None or not row.get("haystack_bytes"):
        return False
    by_bytes = row["haystack_bytes"] / (results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9) * 1e6
    return by_bytes >= floor_us(results, cfg) and budget_walk(results, cfg)["searched"] < active_slots(results, cfg)


def table_floor_us(results, cfg: tuple[int, int, int]) -> float | None:
    """The floor the table of steps divides by at ``cfg``, in µs: the book's (:func:`floor_us`), except where the
    budget lets fewer slots search than are active and their bytes would set it (:func:`_budget_bytes_floor`): there
    only the haystacks of the slots it lets search (:func:`budget_walk`'s ``bytes``) are read once, or an empty kernel
    where that is larger (:func:`book.common.floor_ms`): the least the operator itself must read."""
    if not _budget_bytes_floor(results, cfg):
        return floor_us(results, cfg)
    from book.common import floor_ms

    return floor_ms(results, budget_walk(results, cfg)["bytes"]) * 1e3


def floor_words(results, cfg: tuple[int, int, int]) -> str:
    """What the table's floor at ``cfg`` counts (:func:`table_floor_us`), in words for its column's head; empty where
    it is the book's floor."""
    if not _budget_bytes_floor(results, cfg):
        return ""
    from book.common import latency_floor_ms

    n = budget_walk(results, cfg)["searched"]
    slots = f"{n} slot{'' if n == 1 else 's'}"
    if table_floor_us(results, cfg) <= latency_floor_ms(results) * 1e3:
        return (f"is an empty kernel's time: the budget lets only {slots} search, and reading "
                f"{'its haystack' if n == 1 else 'theirs'} takes less")
    return f"is reading the haystacks of the {slots} the budget lets search"


def _inline(text: str) -> str:
    """A table cell's Markdown as HTML: code, bold and italics kept (a fold's Markdown is not parsed)."""
    from html import escape

    text = escape(text, quote=False)
    text = re.sub(r"`([^`]*)`", r"<code>\1</code>", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"\*([^*]+)\*", r"<em>\1</em>", text)


def _html_table(markdown: str) -> str:
    """A pipe table as HTML, its cells through :func:`_inline`."""
    head, _, *rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in markdown.splitlines()]
    return ("<table><thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr></thead><tbody>"
            + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows)
            + "</tbody></table>")


def fold_table(summary: str, markdown: str, note: str = "") -> str:
    """A pipe table (and a line of Markdown under it, ``note``) folded under a ``<details>`` whose button reads
    ``summary``: what a reader may open, as HTML."""
    from html import escape

    return (f"<details><summary>{escape(summary)}</summary>" + _html_table(markdown)
            + (f"<p>{_inline(note)}</p>" if note else "") + "</details>")


#: A "× previous" from 0.97× to 1.03×, as the table prints it, is a tie: the row says so and no prose calls it a gain.
TIE = (0.97, 1.03)


def ratio_cell(factor: float, *notes: str) -> str:
    """A "× previous" cell: the factor at two decimals, then in brackets ``notes`` and "tie" where it is one
    (:data:`TIE`)."""
    said = [*notes] + (["tie"] if TIE[0] <= round(factor, 2) <= TIE[1] else [])
    return f"{factor:.2f}×" + (f" ({', '.join(said)})" if said else "")


def launch_bound(results, cfg: tuple[int, int, int]) -> bool:
    """Whether the table's floor at ``cfg`` (:func:`table_floor_us`) is an empty kernel's time: a time over it says
    little, so the "× floor" cells read "launch-bound" there."""
    from book.common import latency_floor_ms

    f = table_floor_us(results, cfg)
    return f is not None and f <= latency_floor_ms(results) * 1e3


def kept_note(results, number: int, cfg: tuple[int, int, int]) -> str:
    """Why the open table keeps step ``number`` where its "× previous" at ``cfg`` is no gain, read from the file:
    step 8 (slower on the GPU clock) for its host time per eager call against step 6's; a tie (:data:`TIE`) because
    the entry point runs it at ``cfg``, if it does, and for the case where it pays most, if any. Empty where the step
    gains at ``cfg``."""
    f = step_factors(results, number, (cfg,))[0]
    if f is None or round(f, 2) > TIE[1]:
        return ""
    if number == 8:
        return (f"kept for host time: {host_us(results, 8, cfg):,.1f} vs {host_us(results, builds_on(8), cfg):,.1f} µs"
                " eager")
    best = max(((g, c) for c, g in zip(TABLE_CASES, step_factors(results, number)) if g), default=None)
    entry = entry_row(results, {"batch": cfg[0], "seq_len": cfg[1], "threshold": cfg[2], "corpus": None}) or {}
    said = ["`ngram_match` runs it"] if entry.get("step") == CHAPTER.step(number).series else []
    if best is not None and round(best[0], 2) > TIE[1]:  # the times it divides, not a ratio of a column not shown
        before, after = (grid_row(results, CHAPTER.step(m).series, best[1])["ms"] * 1e3
                         for m in (builds_on(number), number))
        said.append(f"{before:,.1f} → {after:,.1f} µs at {best[1][0]} × {best[1][1]}")
    return "kept: " + "; ".join(said) if said else ""


#: The cases of the page's table of steps, in its column order, both under the deployed budget (128): the deployed
#: shape (the result's), and the long rows where the budget path (steps 8 to 12) pays. ``BUDGET_CASES``: the budget
#: path's own table, at the long rows alone.
STEPS_CASES = ((32, 512, 128), HEADLINE)
BUDGET_CASES = (HEADLINE,)


def _case_head(cfg: tuple[int, int, int]) -> str:
    b, s, t = cfg
    budget = "" if t == 128 else ", no budget" if t == NO_BUDGET else f", budget {t}"  # 128: the lead says it
    return f"{b} × {s:,}{budget} µs (× prev.)"


#: The rows of the page's table of steps: the main line, which ``ngram_match`` runs at every shape but long rows
#: under a budget, 1 to 7: a step's number, or one idea of a two-idea step ("6a", timed in a separate run, then "6b",
#: the step itself), each its own row. ``BUDGET_ROWS``: the budget path's own table, from 6b (where it starts) to 12,
#: "9a" and "9b" likewise.
MAIN_ROWS = (1, 2, 3, 4, 5, "6a", "6b", 7)
BUDGET_ROWS = ("6b", 8, "9a", "9b", 10, 11, 12)
#: Rows that are a library step under another name: a two-idea step's second idea is the step itself (6b is step 6,
#: 9b step 9).
ROW_STEP = {"6b": 6, "9b": 9}


def row_label(n) -> str:
    """A row's one label: the step's number, or the sub-step's ("6a", "6b")."""
    return str(n)


#: Each row's one reference, where it is not the step before: each idea against the row it changes (6a against 5, 6b
#: against 6a, 9a against 8, 9b against 9a), step 8 against step 6 (6b), where the budget path starts. Where the reference is not timed at a case (6a at the stress case), the row is against the reference's
#: own (:func:`case_reference`), and the cell names it.
ROW_REFERENCE = {"6a": 5, "6b": "6a", 6: 5, 7: "6b", 8: "6b", "9a": 8, "9b": "9a", 9: 8, 10: "9b"}


def row_reference(n):
    """The row a row of the table of steps divides: :data:`ROW_REFERENCE`, else the step before."""
    return ROW_REFERENCE.get(n, n - 1 if isinstance(n, int) else None)


def case_reference(results, n, cfg: tuple[int, int, int], gpu: str = "nvidia-h200"):
    """The row that row ``n`` divides at ``cfg``: its reference (:func:`row_reference`), or, where that row is not
    timed at ``cfg`` (6a at the stress case), that row's own reference; None where none is timed."""
    ref = row_reference(n)
    while ref in ROW_REFERENCE and row_us(results, ref, cfg, gpu) is None:
        ref = row_reference(ref)
    return ref


def row_us(results, n, cfg: tuple[int, int, int], gpu: str = "nvidia-h200") -> float | None:
    """A row's time at ``cfg`` as the table of steps shows it, µs on the GPU clock: a step's in the chapter's
    benchmark, a sub-step's (6a, 9a) in the lab run that times it (:func:`part_us`); None where it is not timed or not
    on the GPU clock (step 1)."""
    n = ROW_STEP.get(n, n)
    if isinstance(n, str):
        return part_us(n, cfg, gpu=gpu)
    row = grid_row(results, CHAPTER.step(n).series, cfg)
    return None if row is None or row.get("clock") != "gpu" else row["ms"] * 1e3


def row_factor(results, n, cfg: tuple[int, int, int], gpu: str = "nvidia-h200") -> float | None:
    """A row's "× previous" at ``cfg``: its reference's time (:func:`row_reference`) over its own, both as the table
    shows them (:func:`row_us`, to the 0.1 µs it prints), so a reader dividing the table's cells gets the table's
    ratio; None where either is missing."""
    ref = case_reference(results, n, cfg, gpu)
    t, before = row_us(results, n, cfg, gpu), (row_us(results, ref, cfg, gpu) if ref else None)
    return None if t is None or before is None else round(before, 1) / round(t, 1)


def part_anchor_gap(part: str, cases, gpu: str = "nvidia-h200", results=None) -> float | None:
    """How far the lab run of sub-step ``part`` (6a, 9a) times the step the row divides against the chapter's
    benchmark, over ``cases``: the largest relative gap, or None where the run has none of them."""
    if results is None:
        from studylog.plotting import load_results

        results = load_results("ngram", gpu)
    ref = ROW_REFERENCE[part]
    gaps = [abs(lab / main - 1) for cfg in cases
            if (lab := part_us(part, cfg, 1, gpu)) is not None and (main := row_us(results, ref, cfg, gpu))]
    return max(gaps) if gaps else None


def floor_head(results, cfg: tuple[int, int, int]) -> str:
    """The head of a case's "× floor" column: "× latency floor" where the table's floor is an empty kernel."""
    return "× latency floor" if launch_bound(results, cfg) else "× floor"


def _times_floor(t: float | None, floor: float | None) -> str:
    """A "× floor" cell: the time over the floor, each as the table prints it (0.1 µs, 0.01 µs)."""
    if t is None or not floor:
        return "–"
    x = round(t, 1) / round(floor, 2)
    return f"{x:,.0f}×" if x >= 100 else f"{x:.1f}×"


def the_steps_table(results, cases=STEPS_CASES, rows=MAIN_ROWS) -> str:
    """Markdown, the page's table of steps, ``rows`` of it (the main line, 1 to 7, by default; ``BUDGET_ROWS`` at
    ``BUDGET_CASES``, the budget path's own table): a row per step (:func:`row_label`) and its one change (:data:`SHORT_CHANGES`, with why a step
    that pays at no case of ``cases`` is kept, :func:`kept_note`), then the entry point and the floor. Per case of
    ``cases`` two columns: the time in µs on the GPU clock (:func:`row_us`) with, in brackets, its "× previous"
    (:func:`row_factor`: one reference a row, :func:`row_reference`, named where it is not the row above; a tie says
    so), and its time over the table's floor (:func:`table_floor_us`; "× latency floor" where that is an empty
    kernel). Every ratio divides two times the table shows (a row whose reference is not timed at a case divides
    that row's own reference there, named: :func:`case_reference`); the budget path's table starts at 6b with no
    ratio. Step 1 runs on the host end to end (the footnote gives its times; no row divides it); a row not timed at a
    case reads "–" (the legend says why)."""
    head = ["step", "the one change"]
    for cfg in cases:
        head += [_case_head(cfg), floor_head(results, cfg)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    missing = False
    unmeasured = []  # (sub-step, case) its lab run does not time
    gpu = results.path.parent.name if results.path is not None else "nvidia-h200"  # the lab runs of the same card
    floors = [table_floor_us(results, cfg) for cfg in cases]
    why = {"6a": "loses alone; 6b needs it", "9a": "kept: 9b builds on it"}
    for i, n in enumerate(rows):
        start = i == 0 and 1 not in rows  # the budget path's table starts at 6b, the main table's row: no ratio
        factors = [None if start else row_factor(results, n, cfg, gpu) for cfg in cases]
        pays = any(f is not None and round(f, 2) > TIE[1] for f in factors)
        kept = ""
        if start:
            kept = "where the path starts"
        elif n in why:
            if not pays and any(f is not None for f in factors):
                kept = why[n]
                best = part_best(n, gpu)
                if best and round(best[0], 2) > TIE[1] and best[1] not in cases:  # pays off the table's cases
                    kept = (f"kept: {part_us(n, best[1], 1, gpu):,.1f} → {part_us(n, best[1], gpu=gpu):,.1f} µs at "
                            f"{case_name(best[1])}")
        elif isinstance(n, int) and n > 2 and not pays:
            kept = kept_note(results, n, cases[-1])
        cells = [row_label(n), SHORT_CHANGES[n] + (f" ({kept})" if kept else "")]
        above = rows[i - 1] if i else None
        for cfg, f, floor in zip(cases, factors, floors):
            ref = case_reference(results, n, cfg, gpu)
            t = row_us(results, n, cfg, gpu)
            if t is None:
                if n == 1:
                    cells += ["host ¹", "–"]
                    continue
                cells += ["–", "–"]
                if isinstance(n, str):
                    unmeasured.append((n, cfg))
                else:
                    missing = True
                continue
            said = [] if f is None else [f"{f:.2f}×"] + (["tie"] if TIE[0] <= round(f, 2) <= TIE[1] else []) \
                + ([f"vs {ref}"] if ref != above else [])
            cells += [f"{t:,.1f}" + (f" ({', '.join(said)})" if said else ""), _times_floor(t, floor)]
        lines.append("| " + " | ".join(cells) + " |")
    if 1 not in rows:  # the budget path's rows: the entry point and the floor are the main table's
        notes = ["Cells: µs on the GPU clock (× the row it builds on), and the time over the table of steps' floor."]
        return "\n".join(lines) + "\n\n" + " ".join(notes)
    seven, twelve = (CHAPTER.step(f.__name__).number for f in (step07_early_phase2, step12_skip_refused))
    cells = ["`ngram_match`", f"step {twelve} on many long rows under a budget, else {seven}"]
    for cfg, floor in zip(cases, floors):
        entry = entry_row(results, {"batch": cfg[0], "seq_len": cfg[1], "threshold": cfg[2], "corpus": None})
        cells += ["–", "–"] if entry is None else [us(entry["ms"]), _times_floor(entry["ms"] * 1e3, floor)]
    lines.append("| " + " | ".join(cells) + " |")
    cells = ["floor", "a yardstick: the bytes at copy speed, or one empty kernel"]
    for f in floors:
        cells += ["–" if not f else f"{f:,.2f}" + (" (an empty kernel)" if f <= _latency_us(results) else ""), "1×"]
    lines.append("| " + " | ".join(cells) + " |")
    times = [(cfg, grid_row(results, CHAPTER.step(1).series, cfg)) for cfg in cases]
    notes = ["Cells: µs on the GPU clock (× the row it builds on, named where it is not the row above), and the time "
             f"over the floor. `ngram_match`'s row times the entry point itself: the kernels of step {seven} or step "
             f"{twelve} timed again, through its own call. ¹ Step 1 runs on the host, end to end: "
             + ", ".join(f"{us(r['ms'])} µs at {case_name(cfg)}" for cfg, r in times if r) + "."]
    gaps = sorted({n for n, _ in unmeasured})
    if missing or gaps:
        said = (["one thread is too slow there"] if missing else []) + [
            f"{n} not measured at " + and_list([case_name(c) for m, c in unmeasured if m == n]) for n in gaps]
        notes.append("– not timed: " + "; ".join(said) + ".")
    return "\n".join(lines) + "\n\n" + " ".join(notes)


def _latency_us(results) -> float:
    from book.common import latency_floor_ms

    return latency_floor_ms(results) * 1e3


#: Lines of context the page shows around each change of a diff: one, an anchor each side, so a long diff shows the
#: step's own lines rather than the braces and ``#pragma unroll`` around them.
DIFF_CONTEXT = 1


#: Diffs read from other kernels than the two steps' own functions: step 5's search replaces step 3's, which step 4
#: keeps (step 4's own function is phase 2): (old, new) -> ((file, kernel) before, after).
SEARCH_DIFFS = {(4, 5): (("ngram_two_phase.cu", "ngram_search_per_n"), ("ngram_one_pass.cu", "ngram_search_one_pass"))}


def step_diff(old: int, new: int):
    """The diff from step ``old`` to step ``new`` as the page shows it: :data:`DIFF_CONTEXT` lines of context; from
    step 4 to step 5, the search kernels' (:data:`SEARCH_DIFFS`)."""
    if (old, new) in SEARCH_DIFFS:
        from studylog.source import show_diff

        (old_file, old_kernel), (new_file, new_kernel) = SEARCH_DIFFS[old, new]
        return show_diff(old_file, new_file, old_function=old_kernel, new_function=new_kernel, context=DIFF_CONTEXT)
    return CHAPTER.show_diff(old, new, context=DIFF_CONTEXT)


#: The core of a step whose whole diff is long, shown open (the whole diff folded under it): step -> (the first and
#: last line of the core, as text each contains, in the step's diff from the step before).
CORES = {4: ("const int active = p.kind == SLOT_ACTIVE;", "else if (b == first)"),
         6: ("const i64 first_end = (i64)(src ? chunk - prompt_chunks : chunk) * chunk_len;",
             "s_stop = next > last_end || s_best <= floor_key || seen <= floor_key;")}
#: The function a core is cut from, where the step's own function is not where it changes (step 6: the chunk search
#: its kernel calls).
CORE_FUNCTIONS = {6: "search_chunk"}


def step_core(number: int):
    """The core of step ``number``'s diff (:data:`CORES`): its lines from the first marker to the last, one hunk, as
    the page shows it open; the whole diff, :func:`step_diff`, is folded under it."""
    import copy

    whole = step_diff(number - 1, number)
    first, last = CORES[number]
    i = next(k for k, ln in enumerate(whole.lines) if first in ln)
    j = next(k for k, ln in enumerate(whole.lines) if k > i and last in ln)
    core = copy.copy(whole)
    name = CORE_FUNCTIONS.get(number) or CHAPTER.step(number).source_function
    core.lines = whole.lines[:2] + [f"@@ {name}: the core @@"] + whole.lines[i:j + 1]
    return core


def step2_excerpt():
    """Step 2 in a few lines of CUDA, read from the kernel's source: the window search and the kernel's walk over
    slots (``walk_budget``) and n-gram sizes, the rest elided with ``// ...``. The Python launch stays out: the prose
    gives its shape, ``<<<1, 1>>>``."""
    from studylog.source import Code

    lines = CHAPTER.step(2).source.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if "__device__ i64 serial_leftmost" in ln)
    search = lines[start:lines.index("}", start) + 1]
    kernel = next(i for i, ln in enumerate(lines) if "__global__ void ngram_serial" in ln)
    loop = next(i for i, ln in enumerate(lines) if "for (int n = min(max_ngram" in ln)
    indent = lines[loop][:len(lines[loop]) - len(lines[loop].lstrip())]
    body = [ln[len(indent) - 8:] for ln in lines[loop:lines.index(indent + "}", loop) + 1]]
    walk = lines[kernel + 2] + "  // each slot in order"
    out = [*search, "", *lines[kernel:kernel + 2], walk, "        // ...", *body,
           "        // ... the slot's drafts, within the room", "    });", "}"]
    return Code("\n".join(out), "cuda", "step 2, excerpt: the search loop")


def shared_definitions():
    """What the listings use without defining it, read from ``ngram_common.cuh``: the "no match" key, a slot's plan
    (the ``SLOT_*`` kinds and ``SlotPlan``, which ``plan_slot`` fills before any search) and a match as one key
    (``make_key``). The parameter list every kernel takes (``NGRAM_KERNEL_PARAMS``) is one line of it: the batch's
    tensors and sizes, as :mod:`studylog.ngram.kernels` passes them."""
    from studylog.source import Code

    lines = (CHAPTER.step(2).source.parent / "ngram_common.cuh").read_text().splitlines()
    defines = [ln for ln in lines if ln.startswith(("#define NGRAM_MAX", "#define NONE_KEY"))]
    kinds = next(i for i, ln in enumerate(lines) if ln.startswith("// What the batch loop does with a slot"))
    plan = lines.index("};", kinds)
    key = next(i for i, ln in enumerate(lines) if "u64 make_key(" in ln)
    comment = key
    while lines[comment - 1].startswith("//"):
        comment -= 1
    out = [*defines, "// NGRAM_KERNEL_PARAMS: every kernel's one parameter list (the batch's tensors and sizes)", "",
           *lines[kinds:plan + 1], "", *lines[comment:lines.index("}", key) + 1]]
    return Code("\n".join(out), "cuda", "ngram_common.cuh: a slot's plan and a match's key (every step)")


def entry_row(results, where: dict) -> dict | None:
    """The GPU-clock row the headline quotes at ``where``: the entry point ``ngram_match`` (its ``step`` field says
    which step its rule ran), or the last step on a file that does not time the entry point. None where neither is."""
    for series in ("ngram_match", CHAPTER.step(SYNCED_STEP).series):
        rows = [r for r in results.select(series, **where) if r.get("clock") == "gpu"]
        if rows:
            return rows[0]
    return None


#: How much slower than the fastest of steps 6 to 12 the entry point may be at a case before the page names it.
RULE_SPREAD = 1.03


def rule_misses(results) -> tuple[list[tuple], int]:
    """Where the entry point is slower than the fastest of steps 6 to 12 by more than :data:`RULE_SPREAD` on the GPU
    clock, over every case (synthetic and real text) that times the entry point and one of those steps:
    ``[(corpus, batch, seq_len, threshold, fastest step's number, entry ÷ fastest)]``, worst first, and how many cases
    were compared."""
    misses, compared = [], 0
    rivals = [CHAPTER.step(n) for n in range(6, CHAPTER.final.number + 1)]
    for r in results.select("ngram_match"):
        p = r["params"]
        if r.get("clock") != "gpu":
            continue
        timed = [(row["ms"], st.number) for st in rivals for row in results.select(st.series, **p)
                 if row.get("clock") == "gpu" and row["params"].get("corpus") == p.get("corpus")]
        if not timed:
            continue
        compared += 1
        ms, number = min(timed)
        if r["ms"] > RULE_SPREAD * ms:
            misses.append((p.get("corpus"), p["batch"], p["seq_len"], p["threshold"], number, r["ms"] / ms))
    return sorted(misses, key=lambda m: -m[5]), compared


def case_words(case: str) -> str:
    """A headline case as the result table names it: ``32 slots x 512 tokens, budget 128`` as ``32 × 512, budget
    128``."""
    return case.replace(" slots x ", " × ").replace(" tokens", "", 1)


def result_table(results, headline_rows) -> str:
    """The result, as two narrow tables, one clock each: per headline case (:func:`case_words`), end to end on the
    host (a call, then a sync), the CPU path and the last step (the series the benchmark times that way, in every
    row) and their ratio; then at every synthetic grid case, on the GPU clock, the entry point ``ngram_match`` (:func:`entry_row`, as the chapter's
    headline times it, with the step it ran; the last step on a file without it), the rival, step 4 (our corrected
    port of the pull request's revision: its block-scan phase 2, made exact), and the rival's time over the entry
    point's, the ratio of the two columns before it."""
    final = f"step {SYNCED_STEP}"
    ours_name = "`ngram_match`" if results.select("ngram_match") else final
    host = ["**End to end on the host** (a call, then a sync)", "",
            f"| case | CPU loop (µs) | {final}, end to end (µs) | CPU loop ÷ {final} |", "|" + "---|" * 4]
    gpu = ["**On the GPU clock**", "",
           f"| case | {ours_name} (µs) | step 4, our FastDeploy port (µs) | step 4 ÷ {ours_name} |",
           "|" + "---|" * 4]
    for hd in headline_rows:  # every row times step SYNCED_STEP, whichever step the entry point runs there
        host.append("| " + " | ".join([case_words(hd["case"]), us(hd["baseline_ms"]),
                                       us(hd['kernel_ms']), f"{hd['speedup']:,.2f}×"]) + " |")
    grid = [(f"{b} × {s}, " + ("no budget" if t == NO_BUDGET else f"budget {t}"),
             {"batch": b, "seq_len": s, "threshold": t, "corpus": None}) for b, s, t in grid_configs(results)]
    from book.results import NGRAM_UNTUNED  # the results page's few long slots, where the ports are weaker rivals

    weak = []  # the slots of the rows against a weaker rival
    for name, where in grid:
        ours = entry_row(results, where) if where else None
        cells = [name]
        weaker = bool(where) and where["batch"] <= NGRAM_UNTUNED["most_slots"] \
            and where["seq_len"] >= NGRAM_UNTUNED["least_tokens"]
        if ours is None:
            cells.append("–")
        else:  # which step it runs is said once, over the table of steps
            cells.append(us(ours["ms"]))
        rival = [r for r in results.select(CHAPTER.step(4).series, **where) if r.get("clock") == "gpu"] \
            if where else []
        rival_ms = rival[0]["ms"] if rival else None
        cells += [us(rival_ms) if rival_ms else "–",
                  (f"{rival_ms / ours['ms']:,.2f}×" + (" (weaker rival)" if weaker else "")) if ours and rival_ms
                  else "–"]
        weak += [where["batch"]] if weaker else []
        gpu.append("| " + " | ".join(cells) + " |")
    if weak:
        slots = " or ".join(f"{b:,}" for b in sorted(set(weak)))
        gpu += ["", f"Weaker rival: with {slots} long slots step 4 gives a slot one block, not a tuned kernel."]
    return "\n".join(host) + "\n\n" + "\n".join(gpu)


def result_tables(results, headline_rows) -> tuple[str, str | None]:
    """:func:`result_table` as the page shows it: the GPU-clock table (our port of FastDeploy's kernel, the rival the
    result names), then, against the CPU loop, the separate run of ``ngram_match`` as a reader calls it
    (:func:`entry_end_to_end_table`: its own CPU loop, every ratio within that run), as Markdown; None without it.
    The benchmark's own end-to-end rows (step 12 bound once) stay off the page: one CPU-loop time per host."""
    gpu = result_table(results, headline_rows).split("\n\n**On the GPU clock**")[1]
    entry = entry_end_to_end_table(results=results)
    return "**On the GPU clock**" + gpu, (None if entry is None else entry[0] + "\n\n" + entry[1])


#: A separate run that times the public function as a reader calls it (``lab/ngram/entry_end_to_end.py``).
ENTRY_RUN = "entry_end_to_end"


def entry_end_to_end(gpu: str = "nvidia-h200") -> dict[tuple, dict[str, dict]] | None:
    """The separate run's rows (:data:`ENTRY_RUN`) by case ``(batch, prompt length, threshold)`` and variant
    (``cpu_path``, ``ngram_match``, ``matcher``: the step it picks bound once, ``step12``); None without the file."""
    from studylog.plotting import load_lab

    try:
        run = load_lab("ngram", ENTRY_RUN, gpu=gpu)
    except FileNotFoundError:
        return None
    rows: dict[tuple, dict[str, dict]] = {}
    for r in run["rows"]:
        p = r["params"]
        rows.setdefault((p["batch"], p["seq_len"], p["threshold"]), {})[r["variant"]] = r
    return rows


def entry_end_to_end_table(gpu: str = "nvidia-h200", results=None) -> tuple[str, str] | None:
    """(a sentence, a Markdown table): the separate run's times, end to end (a call, then a sync), per headline case: the CPU loop,
    ``ngram_match`` as a reader calls it (the step by shape, its inputs checked, its scratch allocated each call) and
    that step bound once (``NgramMatcher``), with the CPU loop's time over each, as the table prints the times; None
    without the run's file. With ``results`` (the chapter's benchmark), the sentence names both hosts' loop times at
    the run's first case, so a reader does not take them for one loop's two times."""
    rows = entry_end_to_end(gpu)
    if rows is None:
        return None
    intro = ("**End to end against the CPU loop**, a call then a sync (µs, median of five repetitions): `ngram_match` "
             "as a reader calls it, checks and scratch included, and the step it picks bound once to the batch.")
    case = next(iter(rows))
    here = None if results is None else grid_row(results, CHAPTER.step(1).series, case)
    if here is not None:  # one loop, two hosts: each ratio stays within its own table
        intro += (f" This table comes from another host, whose CPU runs the loop in "
                  f"{round(rows[case]['cpu_path']['ms'] * 1e3, 1):,.1f} µs at {case_name(case)} (the table of steps' "
                  f"host: {here['ms'] * 1e3:,.1f} µs); its ratios divide its own times.")
    lines = ["| case | CPU loop | `ngram_match` | CPU loop ÷ `ngram_match` | the step bound once | CPU loop ÷ bound |",
             "|---|---|---|---|---|---|"]
    for case, v in rows.items():
        cpu, entry, bound = (round(v[k]["ms"] * 1e3, 1) for k in ("cpu_path", "ngram_match", "matcher"))  # as shown
        lines.append(f"| {shape_label((None, *case))} | {cpu:,.1f} | {entry:,.1f} | {cpu / entry:,.2f}× | {bound:,.1f} | "
                     f"{cpu / bound:,.2f}× |")
    return intro, "\n".join(lines)


def step07_launches():
    """Step 7's two launches as CUDA launch lines: the kernels' names read from its step function (the search, then
    phase 2, launched with ``early=True``), their block sizes from :mod:`studylog.ngram.kernels`; phase 2 carries
    the launch attribute of a programmatic dependent launch, as ``cuLaunchKernelEx`` sets it."""
    import inspect
    import re

    from studylog.ngram import kernels
    from studylog.source import Code

    search, phase2 = re.findall(r'_kernel\("[^"]+", "([^"]+)"', inspect.getsource(kernels.step07_early_phase2))
    lines = [f"{search}<<<grid, {kernels.THREADS}>>>(args...);  // the search",
             "// phase 2: one block, launched with the attribute",
             "// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 1",
             f"{phase2}<<<1, {kernels.SCAN_THREADS}>>>(args...);"]
    return Code("\n".join(lines), "cuda", "step 7's two launches")
