"""Chapter 3's benchmark (GPU only): what is measured and how, and the chapter's headline (:func:`gpu_headline`)
read back from the committed JSON. The book's figures and tables read that JSON through ``book.ngram.results``.

Series names come from the chapter's table of steps (``CHAPTER.steps``): step N is recorded as
``stepNN`` and drawn as ``stepNN_<slug>``. Two more series sweep the split of the fused kernels
(:data:`CHUNK_SWEEPS`), and :data:`SYNCED_SERIES` times the final step as a loop that waits for it sees it.

**Clocks** (every row names its own): the GPU steps are timed by the harness's GPU clock (``run.measure``: the
matcher's call replayed in a CUDA graph over rotated copies of the batch, three independent repetitions) with
their host time per call beside it (back-to-back calls, no sync). Step 1 cannot be captured (it copies to the
host and waits for the GPU), so it is timed on the host clock, end to end (clock ``host_e2e``): the wall time
of the call followed by ``torch.cuda.synchronize()``, per call. A headline must compare one clock, so it
compares that same end-to-end host time for both sides: :data:`SYNCED_SERIES` is the final step's call
followed by the same synchronisation, what a serving loop that waits for the drafts observes; the kernel's GPU
time is kept beside it in the headline.

**Real text**: beside the synthetic grid (:data:`BENCH_GRID`), :data:`REAL_CASES` run the CPU path and
steps 5 to 7 on batches from real documents (:func:`~studylog.ngram.batches.corpus_batch`: the standard
library's docstrings, ``"text"``, and its source, ``"code"``) and on synthetic batches of the same shapes
(``"synthetic"``); those rows carry a ``corpus`` parameter and, on the step-7 row, how many drafts the
batch got and how many the true continuation accepts (``drafts``) and which branches the search took
(``branches``).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import fields

import torch

from studylog.bench import Timing
from studylog.ngram.batches import branch_stats, corpus_batch, draft_acceptance, haystack_bytes, make_batch
from studylog.ngram.cpu_path import cpu_path_inplace
from studylog.ngram.formats import NgramConfig, NgramInputs, same_state, validate
from studylog.ngram.kernels import NgramMatcher, final_step, step02_serial, step06_one_pass_fused, step07_stream
from studylog.ngram.reference import reference_ngram_match

NO_BUDGET = 1 << 30  # a threshold the batch never reaches: every active slot drafts
#: (batch, prompt length, threshold). 32x512 and 128x32768 use the deployed default budget.
BENCH_GRID = [(32, 512, 128), (128, 512, NO_BUDGET), (256, 512, NO_BUDGET), (1, 131072, NO_BUDGET),
              (16, 131072, NO_BUDGET), (512, 16384, NO_BUDGET), (128, 32768, 128), (256, 131072, NO_BUDGET)]
QUICK_GRID = [(32, 512, 128), (16, 131072, NO_BUDGET), (128, 32768, 128)]
#: The corpora of the real-text cases: documentation prose and Python source (``studylog.ngram.corpus``),
#: and the synthetic batches of the grid (uniform ids, planted repeats) at the same shapes.
CORPORA = ("text", "code", "synthetic")
#: (batch, prompt length, threshold) of the real-text cases, each run on every corpus.
REAL_SHAPES = [(32, 4096, 128), (32, 4096, NO_BUDGET), (16, 32768, NO_BUDGET)]
QUICK_REAL_SHAPES = [(32, 4096, 128)]
#: Where the benchmark builds its batches (a test runs the bench's bookkeeping on the CPU).
BENCH_DEVICE = "cuda"
#: Steps the real-text cases run (the CPU path and the chapter's one-pass kernels).
REAL_STEPS = (1, 5, 6, 7)
SERIAL_LIMIT_MS = 50.0     # skip the one-thread kernel where it would take longer than this per call
SLOW_CALL_MS = 0.2         # calls longer than this: fewer calls per graph replay (GRAPH_BUDGET_MS of GPU work)
GRAPH_BUDGET_MS = 20.0
SYNCED_BUDGET_MS = 50.0    # end-to-end host timing: about this much wall time per repetition
MAX_COPIES = 512           # rotated copies of a batch at most (small batches would ask for more)
#: Steps 1 to 3 are the deployed path and the two GPU ports of the public pull request (the CPU path, its
#: one-thread port, its two-phase kernel): the bench records them as baselines. From this step on, the
#: kernels are this chapter's.
FIRST_OWN_STEP = 4
#: The final step's call followed by torch.cuda.synchronize(), wall time per call (clock ``host_e2e``).
SYNCED_SERIES = "synced_step07"
#: The series of the chapter's entry point, ``ngram_match`` (the step :func:`~studylog.ngram.kernels.final_step`
#: picks per case; the row's ``step`` says which).
ENTRY_SERIES = "ngram_match"
SYNCED_DESCRIPTION = ("step07_stream's call followed by torch.cuda.synchronize(), wall time per call (host clock, "
                      "end to end): what a loop that waits for the drafts observes, the CPU path's clock")
CLOCK_NOTE = ("Clocks: the GPU steps are timed on the GPU clock (their call replayed in a CUDA graph over rotated "
              "copies of the batch, three independent repetitions; host_ms beside it is the host time per call, "
              "back to back, no sync). The CPU path (step01) cannot be captured in a graph: it copies the batch to "
              "the host, waits for the GPU and runs its loop there; it is timed on the host clock, end to end "
              "(clock host_e2e: the call followed by torch.cuda.synchronize(), wall time per call). The headlines "
              "compare that same "
              f"end-to-end host time for both sides: {SYNCED_SERIES} is step07_stream's call followed by the same "
              "sync (what a serving loop that waits for the drafts observes); the kernel's GPU time is kept beside "
              "it (kernel_gpu_ms). A GPU row's rotated_copies says over how many copies of the batch its graph "
              f"rotates (enough to exceed four times the L2, at most {MAX_COPIES}: on the smallest batches the "
              "copies cover less); calls slower than "
              f"{SLOW_CALL_MS} ms are replayed about {GRAPH_BUDGET_MS:.0f} ms of work per replay (graph_calls) in "
              "five replays per repetition.")


def _chapter():
    from studylog.ngram import CHAPTER  # the package defines it after importing this module

    return CHAPTER


def series_of(step) -> str:
    """The benchmark series of a step function (``stepNN``)."""
    return next(s.series for s in _chapter().steps if s.function is step)


def sweep_series(step) -> str:
    """The series of a step's chunk sweep: ``chunk_sweep_stepNN`` (a step function's name starts with
    its series, ``stepNN``; the chapter's table of steps is built on that)."""
    return f"chunk_sweep_{step.__name__[:6]}"


#: Step -> the splits its chunk sweep measures (haystack positions per block come out of each).
CHUNK_SWEEPS = {step06_one_pass_fused: ("chunk_tiles", (1, 2, 4, 8, 16)),
                step07_stream: ("chunk_len", (2048, 4096, 8192, 16384, 32768, 65536))}


def gen_width_for(seq_len: int) -> int:
    """Generated-token buffer of the benchmark: half the prompt, at most 2048."""
    return max(16, min(seq_len // 2, 2048))


def real_cases(quick: bool = False) -> list[tuple[str, int, int, int]]:
    """(corpus, batch, prompt length, threshold) of the real-text cases."""
    shapes = QUICK_REAL_SHAPES if quick else REAL_SHAPES
    return [(corpus, *shape) for shape in shapes for corpus in CORPORA]


def real_batch(corpus: str, batch: int, seq_len: int, *, device=None):
    """The batch of a real-text case: :func:`corpus_batch` of ``corpus``, or for ``"synthetic"`` the grid's
    :func:`make_batch` at the same shape (the seeds are fixed, so the notebook can rebuild them on a CPU)."""
    gen_width = gen_width_for(seq_len)
    device = BENCH_DEVICE if device is None else device
    if corpus == "synthetic":
        return make_batch(batch, seq_len, gen_width, seed=3000 + batch + seq_len, device=device)
    return corpus_batch(corpus, batch, seq_len, gen_width, seed=3000 + batch + seq_len, device=device)


def _sweeps_of(cfg) -> list:
    batch, seq_len, _ = cfg
    out = []
    if batch * seq_len >= 16 * 131072:
        out.append(step07_stream)
    if (batch, seq_len) in ((16, 131072), (256, 131072)):
        out.append(step06_one_pass_fused)
    return out


def _copy(inputs: NgramInputs) -> NgramInputs:
    return NgramInputs(**{f.name: getattr(inputs, f.name).clone() for f in fields(inputs)})


def _copies_for(run, inputs: NgramInputs, limit: int) -> int:
    """Rotated copies of a batch: enough that together they exceed four times the L2 (run.rotation), at
    most ``limit``."""
    nbytes = (inputs.prompt_ids.numel() + inputs.generated_ids.numel()) * 8
    return max(1, min(run.rotation(nbytes), limit))


def _synced_timing(run, calls, first_ms: float):
    """End to end on the host (clock ``host_e2e``): each call followed by torch.cuda.synchronize() (cycling over
    ``calls``), wall time per call, three repetitions."""
    cycle = itertools.cycle(calls)

    def call():
        next(cycle)()
        torch.cuda.synchronize()

    n = max(3, min(200, int(SYNCED_BUDGET_MS / max(first_ms, 1e-3))))
    timing = run.host_time(call, calls=n, repeats=3)  # every call synchronises: the wall time is end to end
    return Timing.of(timing.samples, clock="host_e2e")


def _first_call_ms(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def _measure_step(run, step, inputs, state0, config, expected, *, params, role, floor, extra, options=None,
                  series=None, check=True):
    """Check one GPU step on the case, then time it: GPU clock over rotated copies (run.measure, or fewer
    calls per replay when a call is slow) and host time per call of the matcher's eager call. Returns the
    row and the matchers of the last repetition (for the end-to-end timing)."""
    options = options or {}
    draft0, this0 = state0
    state = (draft0.clone(), this0.clone())
    matcher = NgramMatcher(step, inputs, *state, config=config, check_values=False, **options)
    matcher()  # untimed: a step's first call compiles and loads its kernels
    first_ms = _first_call_ms(matcher)
    if check:
        run.check("bit-identical to the CPU path", same_state(state, expected), params=params | {"step": step.__name__})
    slow = first_ms > SLOW_CALL_MS
    per_replay = max(1, int(GRAPH_BUDGET_MS / first_ms)) if slow else None
    copies = _copies_for(run, inputs, per_replay or MAX_COPIES)
    made = []

    def make_calls():
        batch_copies = [inputs] + [_copy(inputs) for _ in range(copies - 1)]
        made[:] = [NgramMatcher(step, c, draft0.clone(), this0.clone(), config=config, check_values=False, **options)
                   for c in batch_copies]
        return list(made)

    name = series or series_of(step)
    extra = extra | {"rotated_copies": copies}
    if not slow:
        row = run.measure(name, make_calls, params=params, role=role, host=matcher, floor_ms=floor, **extra)
    else:
        timing = run.gpu_time(make_calls, min_calls=per_replay, reps=5)
        host = run.host_time(matcher, calls=max(3, min(per_replay, 50)), repeats=3)
        row = run.record(name, timing, params=params, role=role, floor_ms=floor, host=host,
                         graph_calls=per_replay, **extra)
    torch.cuda.synchronize()
    if check:
        replayed = all(same_state((m.draft_tokens, m.seq_lens_this_time), expected) for m in (made[0], made[-1]))
        run.check("bit-identical after graph replays", replayed and same_state(state, expected),
                  params=params | {"step": step.__name__})
    return row, made, first_ms


def _case(run, inputs, draft0, this0, config, params, steps, speed, *, reference_check=False, real=False):
    """One benchmark case: every step of ``steps`` checked and timed, the final step end to end, and the
    drafts (and on real-text cases the branches) recorded. ``speed`` carries the one-thread kernel's
    fastest time per window seen so far (to skip it where it would be too slow)."""
    validate(inputs, draft0, this0, config)
    nbytes = haystack_bytes(inputs, this0, config)
    floor = run.floor_ms(nbytes)
    host = inputs.to("cpu")
    expected = (draft0.cpu(), this0.cpu())
    windows = cpu_path_inplace(host, *expected, config)
    if reference_check:
        ref = reference_ngram_match(host, draft0.cpu(), this0.cpu(), config)
        run.check("cpu path == python reference", same_state(ref, expected), params=params)
    drafts = draft_acceptance(host, this0.cpu(), *expected, config)
    extra = {"haystack_bytes": nbytes, "windows_compared_by_cpu_loop": windows,
             "drafted_tokens": drafts["drafted_tokens"]}
    final = _chapter().final
    for step in steps:
        role = "baseline" if step.number < FIRST_OWN_STEP else "kernel"
        if step.number == 1:
            state = (draft0.clone(), this0.clone())
            matcher = NgramMatcher(step.function, inputs, *state, config=config, check_values=False)
            first_ms = _first_call_ms(matcher)
            run.check("bit-identical to the CPU path", same_state(state, expected), params=params | {"step": step.name})
            run.record(step.series, _synced_timing(run, [matcher], first_ms), params=params, role=role,
                       floor_ms=floor, timing="end to end: the call, then torch.cuda.synchronize(); wall time per call",
                       **extra)
            continue
        if step.function is step02_serial:
            limit_ms = speed["serial_ms_per_window"] * windows
            if limit_ms > SERIAL_LIMIT_MS:
                run.note(f"{step.name} <<<1,1>>> kernel skipped at {params}: it would compare {windows:,} windows "
                         f"on one thread, predicted {limit_ms:,.0f} ms per call from its speed on the smaller "
                         f"inputs of this run")
                continue
        row_extra = dict(extra)
        if step is final and real:
            row_extra["drafts"] = drafts
            row_extra["branches"] = branch_stats(inputs, this0, config)
        row, made, first_ms = _measure_step(run, step.function, inputs, (draft0, this0), config, expected,
                                            params=params, role=role, floor=floor, extra=row_extra)
        if step.function is step02_serial and windows:
            speed["serial_ms_per_window"] = max(speed["serial_ms_per_window"], row["ms"] / windows)
        if step is final:
            run.record(SYNCED_SERIES, _synced_timing(run, made, first_ms), params=params, role="kernel",
                       floor_ms=floor, timing="end to end: the call, then torch.cuda.synchronize(); wall time per call",
                       **extra)
            run.check("bit-identical after the end-to-end calls",
                      all(same_state((m.draft_tokens, m.seq_lens_this_time), expected) for m in made[:3]),
                      params=params | {"step": step.name})
        del made
    # the chapter's entry point as a reader calls it: the step its measured rule picks for these shapes
    picked = final_step(inputs)
    _, made, _ = _measure_step(run, picked, inputs, (draft0, this0), config, expected, params=params, role="kernel",
                               floor=floor, extra=extra | {"step": series_of(picked)}, series=ENTRY_SERIES)
    del made
    return expected, floor


def bench(run) -> None:
    """Every step on the synthetic grid, then the CPU path and steps 5 to 7 on real text and code (and on
    synthetic batches of the same shapes); each result checked bit-identical to the CPU path (itself checked
    against the Python reference where that is fast enough) before timing and after the graph replays."""
    speed = {"serial_ms_per_window": 0.0}
    chapter = _chapter()
    grid = QUICK_GRID if run.quick else BENCH_GRID
    for batch, seq_len, threshold in run.progress(grid, "grid"):
        config = NgramConfig(threshold=threshold)
        kinds = ["short"] if batch == 1 else None  # one slot: the case that scans everything
        inputs, draft0, this0 = make_batch(batch, seq_len, gen_width_for(seq_len), kinds=kinds,
                                           seed=1000 + batch + seq_len, device=BENCH_DEVICE)
        params = {"batch": batch, "seq_len": seq_len, "threshold": threshold}
        expected, floor = _case(run, inputs, draft0, this0, config, params, chapter.steps, speed,
                                reference_check=batch * seq_len <= 128 * 512)
        for step in _sweeps_of((batch, seq_len, threshold)) if not run.quick else ():
            option, values = CHUNK_SWEEPS[step]
            for value in values:
                copies = _copies_for(run, inputs, MAX_COPIES)
                made = []

                def make_calls(step=step, option=option, value=value, copies=copies, made=made):
                    made[:] = [NgramMatcher(step, c, draft0.clone(), this0.clone(), config=config, check_values=False,
                                            **{option: value})
                               for c in [inputs] + [_copy(inputs) for _ in range(copies - 1)]]
                    return list(made)

                timing = run.gpu_time(make_calls, repeats=1)
                torch.cuda.synchronize()
                chunk_len = made[0].chunk_len
                run.check("bit-identical to the CPU path",
                          same_state((made[0].draft_tokens, made[0].seq_lens_this_time), expected),
                          params=params | {"step": step.__name__, "chunk_len": chunk_len})
                run.record(sweep_series(step), timing, params=params | {"chunk_len": chunk_len}, floor_ms=floor)
                del made
        del inputs, draft0, this0
        torch.cuda.empty_cache()
    real_steps = [chapter.step(n) for n in REAL_STEPS]
    for corpus, batch, seq_len, threshold in run.progress(real_cases(run.quick), "real text"):
        config = NgramConfig(threshold=threshold)
        inputs, draft0, this0 = real_batch(corpus, batch, seq_len)
        params = {"corpus": corpus, "batch": batch, "seq_len": seq_len, "threshold": threshold}
        _case(run, inputs, draft0, this0, config, params, real_steps, speed, real=True)
        del inputs, draft0, this0
        torch.cuda.empty_cache()
    run.note(CLOCK_NOTE)
    run.note("The CPU path keeps the prompt on the host (copied once, as the deployed engine did) and copies the "
             "generated tokens, per-slot lengths and draft buffers each call; the loop is the C port of the "
             "deployed operator (csrc/ngram_cpu_path.c).")
    run.note("Floors: haystack bytes of the active slots read once at the copy bandwidth measured in this run; "
             "early exit lets a kernel read less than that.")
    run.note("Real text: rows with a 'corpus' parameter. 'text' and 'code' are windows of the Python standard "
             "library's docstrings and source in cl100k tokens (assets/data/ngram_corpus.npz, built by "
             "python -m studylog.ngram corpus), with the grid's slot plan and no planted repeats; 'synthetic' is "
             "the grid's generator at the same shape. On the step-7 row, 'drafts' counts the drafts the batch got "
             "(identical for every step: each is checked bit-identical to the CPU path) and how many of them the "
             "document's true continuation accepts (the longest prefix equal to the tokens that follow, as a "
             "greedy verifier accepts them; on synthetic batches those tokens are random, so acceptance there is "
             "chance), and 'branches' which branches the search takes (see studylog.ngram.batches.branch_stats).")


#: The cases the headline quotes: the deployed budget at a small and a mid-size batch, and the largest batch with no
#: budget.
HEADLINE_CASES = ((32, 512, 128), (128, 32768, 128), (256, 131072, NO_BUDGET))


def gpu_headline(results) -> list[dict]:
    """The chapter's headline rows, on the GPU clock only (the CPU path's time is host time, which moves with the
    host, so no headline rests on it; the book's ``book.ngram.results.headline`` gives that comparison, end to
    end): the chapter's entry point (or, on a file that does not time it, its last step) against step 3, the
    two-phase design of the pull request the chapter starts from, at :data:`HEADLINE_CASES`. No rows on a file
    measured before the GPU clock."""
    from studylog.plotting import headline_row

    chapter = _chapter()
    final, two_phase = chapter.final, chapter.step(3)
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
                                kernel_label=f"n-gram matching, {label}",
                                baseline_label=f"{two_phase.name} (the two-phase kernel of the original pull request)",
                                **where))
    return out


__all__ = ["BENCH_GRID", "CHUNK_SWEEPS", "CLOCK_NOTE", "CORPORA", "FIRST_OWN_STEP", "HEADLINE_CASES", "NO_BUDGET",
           "QUICK_GRID", "ENTRY_SERIES", "QUICK_REAL_SHAPES", "REAL_SHAPES", "REAL_STEPS", "SYNCED_DESCRIPTION",
           "SYNCED_SERIES", "bench", "gen_width_for", "gpu_headline", "real_batch", "real_cases", "series_of",
           "sweep_series"]
