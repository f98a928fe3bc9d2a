"""Chapter 3's benchmark (GPU only) and its headline. :func:`bench_cases` declares what is measured: each case (the
synthetic grid's, then real documents', whose rows carry a ``corpus`` parameter) and its rows (series, role, clock,
params); :func:`bench` measures them in order. Step N is series ``stepNN``."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Callable

import torch

from studylog.bench import Timing
from studylog.ngram.batches import branch_stats, corpus_batch, draft_acceptance, haystack_bytes, make_batch
from studylog.ngram.cpu_path import cpu_path_inplace
from studylog.ngram.formats import NgramConfig, NgramInputs, same_state, validate
from studylog.ngram.kernels import (TILE, NgramMatcher, step01_cpu_path, step02_serial, step08_one_pass_fused,
                                    step12_skip_refused, step_for_shape)
from studylog.ngram.reference import reference_ngram_match

NO_BUDGET = 1 << 30  # a threshold the batch never reaches: every active slot drafts
#: (batch, prompt length, threshold). 32x512 and 128x32768 use the deployed default budget.
BENCH_GRID = [(32, 512, 128), (128, 512, NO_BUDGET), (256, 512, NO_BUDGET), (1, 131072, NO_BUDGET),
              (16, 131072, NO_BUDGET), (512, 16384, NO_BUDGET), (128, 32768, 128), (256, 131072, NO_BUDGET)]
QUICK_GRID = [(32, 512, 128), (16, 131072, NO_BUDGET), (128, 32768, 128)]
#: Real documentation prose and Python source (``studylog.ngram.corpus``), and the grid's synthetic batches.
CORPORA = ("text", "code", "synthetic")
#: (batch, prompt length, threshold) of the real-text cases, each run on every corpus.
REAL_SHAPES = [(32, 4096, 128), (32, 4096, NO_BUDGET), (16, 32768, NO_BUDGET)]
QUICK_REAL_SHAPES = [(32, 4096, 128)]
BENCH_DEVICE = "cuda"  # a test runs the bookkeeping on the CPU
REAL_STEPS = (1, 5, 6, 7, 8, 12)
SERIAL_LIMIT_MS = 50.0     # skip the one-thread kernel where it would take longer than this per call
SLOW_CALL_MS = 0.2         # calls longer than this: fewer calls per graph replay (GRAPH_BUDGET_MS of GPU work)
GRAPH_BUDGET_MS = 20.0
SYNCED_BUDGET_MS = 50.0    # end-to-end host timing: about this much wall time per repetition
MAX_COPIES = 512           # rotated copies of a batch at most (small batches would ask for more)
#: Steps 1 to 3 are the deployed path and the public pull request's two GPU ports (recorded as baselines).
FIRST_OWN_STEP = 4
#: The step also timed end to end on the host (the call, then a sync), against the CPU path: the one the entry
#: point runs at the headline's large cases. On real text its rows carry the drafts and the branches taken.
SYNCED_STEP = 12
SYNCED_SERIES = "synced_step12"
ENTRY_SERIES = "ngram_match"  # the step final_step picks per case; the row's ``step`` says which
SYNCED_DESCRIPTION = ("step12_skip_refused's call followed by torch.cuda.synchronize(), wall time per call (host "
                      "clock, end to end): what a loop that waits for the drafts observes, the CPU path's clock")
CLOCK_NOTE = ("Clocks: the GPU steps on the GPU clock (the call replayed in a CUDA graph over rotated copies of the "
              "batch, three repetitions; host_ms: host time per call, back to back, no sync). The CPU path (step01) "
              "cannot be captured: it is timed end to end on the host (clock host_e2e: the call, then "
              f"torch.cuda.synchronize(), wall time per call), as is {SYNCED_SERIES}, step12_skip_refused's call "
              "with the same sync, which the headlines compare with it (its GPU time beside it: kernel_gpu_ms). "
              f"rotated_copies: the copies a GPU row's graph rotates over (four times the L2, at most {MAX_COPIES}: "
              f"less on the smallest batches); calls slower than {SLOW_CALL_MS} ms replay about "
              f"{GRAPH_BUDGET_MS:.0f} ms of work per replay (graph_calls), five replays per repetition.")
END_TO_END = "end to end: the call, then torch.cuda.synchronize(); wall time per call"
NOTES = (CLOCK_NOTE,
         "The CPU path keeps the prompt on the host (copied once, as deployed) and copies the generated tokens, "
         "lengths and draft buffers each call; its loop is the C port of the deployed operator.",
         "Floors: the active slots' haystack bytes read once at this run's copy bandwidth; early exit lets a kernel "
         "read less.",
         "Real text: rows with a 'corpus' parameter: 'text' and 'code' are windows of the Python standard library's "
         "docstrings and source in cl100k tokens (assets/data/ngram_corpus.npz), with the grid's slot plan and no "
         "planted repeats; 'synthetic' is the grid's generator at the same shape. On the step-12 row, 'drafts' "
         "counts the batch's drafts (the same for every step) and those a greedy verifier accepts against the "
         "document's true continuation (random on synthetic batches: chance), and 'branches' the branches the "
         "search takes (studylog.ngram.batches.branch_stats).")


def series_of(step) -> str:
    """The benchmark series of a step function (``stepNN``: its name starts with it)."""
    return step.__name__[:6]


def sweep_series(step) -> str:
    return f"chunk_sweep_{series_of(step)}"


#: Step -> the option its chunk sweep sets, and the values (haystack positions per block come out of each).
CHUNK_SWEEPS = {step08_one_pass_fused: ("chunk_tiles", (1, 2, 4, 8, 16)),
                step12_skip_refused: ("chunk_len", (2048, 4096, 8192, 16384, 32768, 65536))}


def gen_width_for(seq_len: int) -> int:
    """Generated-token buffer of the benchmark: half the prompt, at most 2048."""
    return max(16, min(seq_len // 2, 2048))


def grid_batch(batch: int, seq_len: int, *, device=None):
    """The batch of a grid case (fixed seed; at batch 1 one slot, which scans everything)."""
    return make_batch(batch, seq_len, gen_width_for(seq_len), seed=1000 + batch + seq_len,
                      kinds=["short"] if batch == 1 else None, device=BENCH_DEVICE if device is None else device)


def real_batch(corpus: str, batch: int, seq_len: int, *, device=None):
    """The batch of a real-text case: :func:`corpus_batch`, or for ``"synthetic"`` the grid's :func:`make_batch`
    at the same shape (fixed seeds: the notebook rebuilds them on a CPU)."""
    make = make_batch if corpus == "synthetic" else lambda *a, **k: corpus_batch(corpus, *a, **k)
    return make(batch, seq_len, gen_width_for(seq_len), seed=3000 + batch + seq_len,
                device=BENCH_DEVICE if device is None else device)


@dataclass(frozen=True)
class Row:
    """One row the benchmark records, the step function it times and the options it builds it with (a sweep's)."""

    series: str
    params: dict
    step: Callable
    role: str = "kernel"
    clock: str = "gpu"
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    """One case: its batch (built when measured), its rows in order, whether the CPU path is checked first."""

    params: dict
    batch: Callable[[], tuple]
    rows: tuple[Row, ...]
    reference_check: bool = False


def case_rows(params: dict, steps, sweeps=()) -> tuple[Row, ...]:
    """Each of ``steps`` (step 1 on the host clock only; :data:`SYNCED_STEP` also end to end, right after its GPU
    row, on the same calls), the entry point as the step its rule picks for the case's shapes, then the chunk
    sweeps of ``sweeps``."""
    rows = []
    for step in steps:
        role = "baseline" if step.number < FIRST_OWN_STEP else "kernel"
        rows.append(Row(step.series, params, step.function, role, "host_e2e" if step.number == 1 else "gpu"))
        if step.number == SYNCED_STEP:
            rows.append(Row(SYNCED_SERIES, params, step.function, clock="host_e2e"))
    rows.append(Row(ENTRY_SERIES, params, step_for_shape(params["batch"], params["seq_len"],
                                                         NgramConfig(threshold=params["threshold"]))))
    for step in sweeps:
        option, values = CHUNK_SWEEPS[step]
        rows += [Row(sweep_series(step), params | {"chunk_len": value * (TILE if option == "chunk_tiles" else 1)},
                     step, options={option: value}) for value in values]
    return tuple(rows)


def bench_cases(quick: bool) -> dict[str, list[Case]]:
    """The benchmark's sections and their cases, in the order they run: the synthetic grid (every step; the chunk
    sweeps on the long rows), then the real text (:data:`REAL_STEPS`)."""
    from studylog.ngram import CHAPTER  # the package defines it after importing this module

    sections = {"grid": [], "real text": []}
    for batch, seq_len, threshold in QUICK_GRID if quick else BENCH_GRID:
        params = {"batch": batch, "seq_len": seq_len, "threshold": threshold}
        sweeps = [] if quick else ([step12_skip_refused] if batch * seq_len >= 16 * 131072 else []) + \
            ([step08_one_pass_fused] if (batch, seq_len) in ((16, 131072), (256, 131072)) else [])
        sections["grid"].append(Case(params, partial(grid_batch, batch, seq_len),
                                     case_rows(params, CHAPTER.steps, sweeps), batch * seq_len <= 128 * 512))
    for (batch, seq_len, threshold), corpus in itertools.product(QUICK_REAL_SHAPES if quick else REAL_SHAPES, CORPORA):
        params = {"corpus": corpus, "batch": batch, "seq_len": seq_len, "threshold": threshold}
        sections["real text"].append(Case(params, partial(real_batch, corpus, batch, seq_len),
                                          case_rows(params, [CHAPTER.step(n) for n in REAL_STEPS])))
    return sections


def bench(run) -> None:
    """Every row of every case of :func:`bench_cases`, each result checked bit-identical to the CPU path before
    timing and after the graph replays."""
    speed = {"serial_ms_per_window": 0.0}
    for section, cases in bench_cases(run.quick).items():
        for case in run.progress(cases, section):
            _measure_case(run, case, speed)
            torch.cuda.empty_cache()
    for note in NOTES:
        run.note(note)


def rotated_matchers(run, step, inputs, state0, config, limit, **options):
    """(make_calls, made, copies): matchers of ``step`` over copies of the batch for each repetition, enough to exceed
    four times the L2 (run.rotation), at most ``limit``; ``made`` holds the last repetition's, to check their drafts."""
    copies = max(1, min(run.rotation((inputs.prompt_ids.numel() + inputs.generated_ids.numel()) * 8), limit))
    made = []

    def make_calls() -> list:
        batches = [inputs] + [NgramInputs(**{f.name: getattr(inputs, f.name).clone() for f in fields(inputs)})
                              for _ in range(copies - 1)]
        made[:] = [NgramMatcher(step, c, state0[0].clone(), state0[1].clone(), config=config, check_values=False,
                                **options) for c in batches]
        return list(made)

    return make_calls, made, copies


def _record_synced(run, row: Row, calls, first_ms, **kw):
    """Clock ``host_e2e``: each call (cycling over ``calls``), then torch.cuda.synchronize(); three repetitions."""
    cycle = itertools.cycle(calls)

    def call():
        next(cycle)()
        torch.cuda.synchronize()

    timing = run.host_time(call, calls=max(3, min(200, int(SYNCED_BUDGET_MS / max(first_ms, 1e-3)))), repeats=3)
    run.record(row.series, Timing.of(timing.samples, clock="host_e2e"), params=row.params, role=row.role,
               timing=END_TO_END, **kw)


def _same(matchers, expected) -> bool:
    return all(same_state((m.draft_tokens, m.seq_lens_this_time), expected) for m in matchers)


def _first_call(run, step, inputs, state0, config, expected, params):
    """(matcher, ms): a matcher of ``step`` on copies of the initial state, and its first call's time (a GPU step
    called once before, untimed: its first call compiles and loads its kernels), checked against the CPU path."""
    matcher = NgramMatcher(step, inputs, state0[0].clone(), state0[1].clone(), config=config, check_values=False)
    if step is not step01_cpu_path:
        matcher()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    matcher()
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - t0) * 1e3
    run.check("bit-identical to the CPU path", _same([matcher], expected), params=params | {"step": step.__name__})
    return matcher, first_ms


def _measure_step(run, row: Row, inputs, state0, config, expected, *, floor, extra):
    """One GPU step checked, then timed on the case: (its matchers of the last repetition, its first call's ms)."""
    matcher, first_ms = _first_call(run, row.step, inputs, state0, config, expected, row.params)
    slow = first_ms > SLOW_CALL_MS
    per_replay = max(1, int(GRAPH_BUDGET_MS / first_ms)) if slow else None
    make_calls, made, copies = rotated_matchers(run, row.step, inputs, state0, config, per_replay or MAX_COPIES)
    # a slow call: about GRAPH_BUDGET_MS of work per replay, five replays per repetition, fewer host calls
    policy = dict(min_calls=per_replay, reps=5, host_calls=max(3, min(per_replay, 50)), graph_calls=per_replay) \
        if slow else {}
    measured = run.measure(row.series, make_calls, params=row.params, role=row.role, host=matcher, floor_ms=floor,
                           **policy, **extra, rotated_copies=copies)
    torch.cuda.synchronize()
    run.check("bit-identical after graph replays", _same((made[0], made[-1], matcher), expected),
              params=row.params | {"step": row.step.__name__})
    return measured, made, first_ms


def _measure_case(run, case: Case, speed: dict) -> None:
    """The rows of ``case``, in order. ``speed`` carries the one-thread kernel's slowest time per window so far (to
    skip it where too slow)."""
    params, config = case.params, NgramConfig(threshold=case.params["threshold"])
    inputs, draft0, this0 = case.batch()
    validate(inputs, draft0, this0, config)
    nbytes = haystack_bytes(inputs, this0, config)
    floor = run.floor_ms(nbytes)
    host = inputs.to("cpu")
    expected = (draft0.cpu(), this0.cpu())
    windows = cpu_path_inplace(host, *expected, config)
    if case.reference_check:
        ref = reference_ngram_match(host, draft0.cpu(), this0.cpu(), config)
        run.check("cpu path == python reference", same_state(ref, expected), params=params)
    drafts = draft_acceptance(host, this0.cpu(), *expected, config)
    extra = {"haystack_bytes": nbytes, "windows_compared_by_cpu_loop": windows,
             "drafted_tokens": drafts["drafted_tokens"]}
    state0, made = (draft0, this0), None
    for row in case.rows:
        name = row.step.__name__
        if row.series == SYNCED_SERIES:  # the calls of the GPU row before it, end to end
            _record_synced(run, row, made, first_ms, floor_ms=floor, **extra)
            run.check("bit-identical after the end-to-end calls", _same(made[:3], expected),
                      params=params | {"step": name})
            continue
        made = None  # the last row's matchers (copies of the batch) go before this row makes its own
        if row.clock == "host_e2e":  # the CPU path: not capturable, the host clock only
            matcher, first_ms = _first_call(run, row.step, inputs, state0, config, expected, params)
            _record_synced(run, row, [matcher], first_ms, floor_ms=floor, **extra)
        elif row.options:  # a point of a chunk sweep: one repetition
            make_calls, made, _ = rotated_matchers(run, row.step, inputs, state0, config, MAX_COPIES, **row.options)
            timing = run.gpu_time(make_calls, repeats=1)
            torch.cuda.synchronize()
            if made[0].chunk_len != row.params["chunk_len"]:
                raise RuntimeError(f"{name} {row.options} split at {made[0].chunk_len}, the table says "
                                   f"{row.params['chunk_len']}")
            run.check("bit-identical to the CPU path", _same(made[:1], expected),
                      params=params | {"step": name, "chunk_len": made[0].chunk_len})
            run.record(row.series, timing, params=row.params, floor_ms=floor)
        elif row.step is step02_serial and speed["serial_ms_per_window"] * windows > SERIAL_LIMIT_MS:
            run.note(f"{name} <<<1,1>>> kernel skipped at {params}: it would compare {windows:,} windows on one "
                     f"thread, predicted {speed['serial_ms_per_window'] * windows:,.0f} ms per call from its speed "
                     "on the smaller inputs of this run")
        else:
            row_extra = dict(extra)
            if row.series == ENTRY_SERIES:
                row_extra["step"] = series_of(row.step)
            elif row.step is step12_skip_refused and "corpus" in params:
                row_extra |= {"drafts": drafts, "branches": branch_stats(inputs, this0, config)}
            measured, made, first_ms = _measure_step(run, row, inputs, state0, config, expected, floor=floor,
                                                     extra=row_extra)
            if row.step is step02_serial and windows:
                speed["serial_ms_per_window"] = max(speed["serial_ms_per_window"], measured["ms"] / windows)


#: The headline's cases: the deployed budget at a small and a mid-size batch, the largest batch with no budget.
HEADLINE_CASES = ((32, 512, 128), (128, 32768, 128), (256, 131072, NO_BUDGET))


def gpu_headline(results) -> list[dict]:
    """The headline rows on the GPU clock (the book compares with the CPU path end to end): the entry point (else
    the last step) against step 3, the pull request's two-phase kernel, at :data:`HEADLINE_CASES`."""
    from studylog.ngram import CHAPTER
    from studylog.plotting import headline_row

    final, two_phase = CHAPTER.step(SYNCED_STEP), CHAPTER.step(3)
    ours = ENTRY_SERIES if results.select(ENTRY_SERIES) else final.series
    out = []
    for batch, seq_len, threshold in HEADLINE_CASES:
        where = {"batch": batch, "seq_len": seq_len, "threshold": threshold}
        mine, theirs = results.select(ours, **where), results.select(two_phase.series, **where)
        if not (mine and theirs and mine[0].get("clock") == theirs[0].get("clock") == "gpu"):
            continue
        budget = f", budget {threshold}" if threshold != NO_BUDGET else ", no budget"
        label = f"ngram_match ({mine[0].get('step', final.series)})" if ours == ENTRY_SERIES else final.name
        out.append(headline_row(results, ours, two_phase.series, f"{batch} slots x {seq_len} tokens{budget}",
                                kernel_label=f"n-gram matching, {label}", **where,
                                baseline_label=f"{two_phase.name} (our port of the pull request's first, two-phase "
                                               "kernel)"))
    return out
