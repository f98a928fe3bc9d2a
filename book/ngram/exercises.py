"""Exercises of chapter 3, each with a check that runs on a CPU in a second or two.

Write the function an exercise asks for, then call its check on it: the check runs it on small random inputs
against the rule it must follow, prints the first input where it goes wrong (and what it returned and what was
expected), and returns ``True`` when every input passed. The answers live in :mod:`book.ngram.solutions`, which
the notebook does not import.

1. :func:`check_match_key`: pack a match ``(n, source, start)`` into one 64-bit key whose smallest value is the
   best match (what lets a block pick its winner with one ``atomicMin``).
2. :func:`check_one_pass`: the best window of one haystack for every ``n`` at once, from the common suffix at
   each end position (step 5's idea).
3. :func:`check_budget_scan`: the batch budget from prefix sums instead of a serial loop (step 4's idea).
4. :func:`check_refused_bound`: which slots the budget refuses whatever the searches find (step 12's skip).
5. :func:`check_no_stop`: change step 12's kernel so that no thread stops early: it reads its whole chunk, with no
   read of the slot's key each tile (NVRTC compiles it on any machine and the PTX must lose that read; on a GPU the
   kernel also runs against the chapter's specification, bit for bit, and :func:`time_no_stop` times it).
6. :func:`check_warp_min`: change step 6's kernel so that each warp folds its lanes' keys with warp-level minimums
   before one lane updates the block's key (NVRTC compiles it and the PTX must show the warp-level instructions,
   on any machine; on a GPU the kernel also runs against the chapter's specification, bit for bit).

Exercises 3 and 4 work on the per-slot facts the kernels compute before any search (``plan_slot``), as lists
with one entry per slot:

* ``kinds``: ``"keep"`` (a prefill slot, or one the hybrid variant leaves alone: it keeps its tokens),
  ``"zero"`` (an empty slot: it gets no tokens), or ``"active"`` (it gets ``base`` tokens and maybe drafts);
* ``counted``: whether the slot counts in ``left``, the slots still waiting for their first token;
* ``bases``: the slot's tokens before any draft (a kept slot's own count, 0 for an empty slot, 1 for an
  active slot of the n-gram variant);
* ``wants``: the drafts an active slot would get with no budget (the match's continuation, up to the cap).

:func:`sequential_budget` is the rule, as the serial loop applies it; :func:`budget_facts` derives the four lists
from a real batch, so the rule can be checked against :func:`~studylog.ngram.reference_ngram_match`.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

from book.common import not_written
from studylog.ngram.formats import NGRAM_MAX, NONE_KEY, NgramConfig, NgramInputs
from studylog.ngram.models import decode_key, model_one_pass_keys, slot_plan
from studylog.ngram.report import NO_BUDGET

# =========================================================================================
# The rules the checks hold an answer to
# =========================================================================================


def sequential_budget(threshold: int, kinds: Sequence[str], counted: Sequence[bool], bases: Sequence[int],
                      wants: Sequence[int]) -> list[int]:
    """The batch budget as the serial loop applies it: each slot's final token count. Walking the slots in
    order, ``total`` is the final counts of the earlier slots plus this slot's base and ``left`` the counted slots
    not served yet (an active slot is served when the loop reaches it; a kept slot never is); an active slot gets
    ``min(want, room)`` drafts where ``room = threshold - total - left``, and none when ``room < 2``."""
    left = sum(bool(c) for c in counted)
    final, done = [], 0
    for kind, base, want in zip(kinds, bases, wants):
        if kind == "keep":
            final.append(base)
        elif kind == "zero":
            final.append(0)
        else:
            left -= 1
            room = threshold - (done + base) - left
            final.append(base + (min(want, room) if room >= 2 else 0))
        done += final[-1]
    return final


def budget_facts(inputs: NgramInputs, seq_lens_this_time, config: NgramConfig = NgramConfig()):
    """``(kinds, counted, bases, wants)`` of a batch: the per-slot plan of the kernels and, for each active
    slot, the drafts its best match would give with no budget. ``sequential_budget(config.threshold, ...)`` of
    them equals the ``seq_lens_this_time`` that :func:`~studylog.ngram.reference_ngram_match` returns."""
    lists = (inputs.step_idx.tolist(), inputs.draft_token_num.tolist(), inputs.max_dec_len.tolist(),
             inputs.seq_lens_encoder.tolist(), inputs.seq_lens_decoder.tolist(), seq_lens_this_time.tolist())
    keys = model_one_pass_keys(inputs, config, seq_lens_this_time)
    prompt_lens, step_idx = inputs.prompt_lens.tolist(), inputs.step_idx.tolist()
    kinds, counted, bases, wants = [], [], [], []
    for b in range(inputs.batch):
        kind, count, base, cap = slot_plan(b, config, *lists)
        want = 0
        if kind == "active" and keys[b] != NONE_KEY and cap >= 1:
            n, source, start = decode_key(keys[b])
            want = min(cap, (step_idx[b] if source else prompt_lens[b]) - start - n)
        kinds.append(kind)
        counted.append(bool(count))
        bases.append(int(base))
        wants.append(int(want))
    return kinds, counted, bases, wants


def best_window(hay: Sequence[int], hay_len: int, gen: Sequence[int], top_n: int, min_n: int = 1):
    """The rule of exercise 2, one ``n`` at a time as the deployed loop searches: for ``n`` from ``top_n`` down to
    ``min_n``, the leftmost ``start`` with ``hay[start:start + n] == gen[-n:]`` and at least one token after the
    window (``start + n < hay_len``); ``(n, start)`` of the first ``n`` that has one, else None."""
    for n in range(top_n, min_n - 1, -1):
        pattern = list(gen[len(gen) - n:])
        for start in range(hay_len - n):
            if list(hay[start:start + n]) == pattern:
                return n, start
    return None


# =========================================================================================
# The library's answers
# =========================================================================================








# =========================================================================================
# The checks
# =========================================================================================


def _call(fn, *args):
    """``fn(*args)``, or the exception it raised, as a string that says so."""
    try:
        return fn(*args), None
    except Exception as exc:  # the reader's function: report, do not crash the check
        return None, f"raised {type(exc).__name__}: {exc}"


def _report(name: str, failures: list[str], tried: int) -> bool:
    if failures and all("NotImplementedError" in f for f in failures):
        not_written(name)
        return False
    if failures:
        print(f"{name}: wrong on {len(failures)} of {tried} inputs; the first:\n  " + "\n  ".join(failures[:1]))
        return False
    print(f"{name}: right on all {tried} inputs")
    return True


def check_match_key(fn: Callable[[int, int, int], int], *, trials: int = 3000, seed: int = 0) -> bool:
    """Exercise 1. ``fn(n, source, start)`` -> an int key, for ``1 <= n <= NGRAM_MAX``, ``source`` 0 (the prompt)
    or 1 (the generated tokens) and ``0 <= start < 2**32``. The key must fit in 64 unsigned bits, stay below
    ``NONE_KEY`` (which means "no match"), and order matches as the rule prefers them: the larger ``n`` first,
    then the prompt before the generated tokens, then the leftmost ``start``."""
    rng = random.Random(seed)
    edges = [(n, s, x) for n in (1, 2, NGRAM_MAX - 1, NGRAM_MAX) for s in (0, 1) for x in (0, 1, 2**31, 2**32 - 1)]
    triples = edges + [(rng.randint(1, NGRAM_MAX), rng.randint(0, 1), rng.choice([rng.randint(0, 64),
                                                                                 rng.randrange(2**32)]))
                       for _ in range(trials)]
    failures = []
    keys = {}
    for t in triples:
        key, error = _call(fn, *t)
        if error:
            failures.append(f"fn{t} {error}")
        elif not isinstance(key, int) or not 0 <= key < NONE_KEY:
            failures.append(f"fn{t} = {key!r}: a key must be an int in [0, 2**64 - 1) (2**64 - 1 means no match)")
        keys[t] = key
    if not failures:
        pairs = list(zip(triples, triples[1:])) + [(a, b) for a in edges for b in edges]
        for a, b in pairs:
            prefer_a = (-a[0], a[1], a[2]) < (-b[0], b[1], b[2])
            if a != b and (keys[a] < keys[b]) != prefer_a:
                better, worse = (a, b) if prefer_a else (b, a)
                failures.append(f"(n, source, start) = {better} is the better match but its key {keys[better]} is not "
                                f"below the key {keys[worse]} of {worse}")
    return _report("check_match_key", failures, len(triples))


def _random_hay(rng: random.Random):
    vocab = rng.choice([2, 3, 5])
    hay_len = rng.randint(0, 40)
    hay = [rng.randrange(vocab) for _ in range(hay_len)] + [-1] * rng.randint(0, 3)  # padding beyond hay_len
    gen = [rng.randrange(vocab) for _ in range(rng.randint(1, 8))]
    top_n = rng.randint(1, min(len(gen), 6))
    min_n = rng.randint(1, top_n)
    return hay, hay_len, gen, top_n, min_n


def check_one_pass(fn: Callable, *, trials: int = 2000, seed: int = 0) -> bool:
    """Exercise 2. ``fn(hay, hay_len, gen, top_n, min_n)`` -> ``(n, start)`` or None: the best window of one
    haystack (``hay[:hay_len]``; entries after it are padding) for the patterns ``gen[-n:]``, ``n`` from
    ``top_n`` down to ``min_n``: the largest ``n`` that occurs with at least one token after it, and its leftmost
    ``start`` (:func:`best_window` is the rule, one ``n`` at a time). Try to read each position once for every
    ``n`` together, as step 5 does."""
    rng = random.Random(seed)
    cases = [([1, 2, 1, 2], 4, [1, 2], 2, 1),  # the window at the very end has no continuation: the earlier one wins
             ([5, 5, 5], 3, [5, 5], 2, 1),      # overlapping windows
             ([7, 1, 2, 3], 4, [9, 2, 3], 3, 1),  # only a shorter n matches
             ([1, 2, 3], 3, [1, 2, 3], 3, 3),     # the whole haystack is the pattern: no token after it
             ([], 0, [1], 1, 1)]
    cases += [_random_hay(rng) for _ in range(trials)]
    failures = []
    for hay, hay_len, gen, top_n, min_n in cases:
        want = best_window(hay, hay_len, gen, top_n, min_n)
        got, error = _call(fn, list(hay), hay_len, list(gen), top_n, min_n)
        got = tuple(got) if got is not None and not error else None
        if error or got != want:
            failures.append(f"hay={hay[:hay_len]} (hay_len={hay_len}), gen={gen}, top_n={top_n}, min_n={min_n}: "
                            f"{error or f'returned {got}'}, expected {want}")
    return _report("check_one_pass", failures, len(cases))


def _random_slots(rng: random.Random, hybrid: bool | None = None):
    hybrid = rng.random() < 0.3 if hybrid is None else hybrid
    batch = rng.randint(1, 24)
    kinds, counted, bases, wants = [], [], [], []
    for _ in range(batch):
        r = rng.random()
        kind = "keep" if r < 0.12 else "zero" if r < 0.22 else "active"
        if hybrid:
            base = 0 if kind == "zero" else rng.randint(1, 4)
            count = kind != "zero" and rng.random() < 0.9
        else:
            base = {"keep": rng.randint(1, 40), "zero": 0, "active": 1}[kind]
            count = kind != "zero"
        kinds.append(kind)
        counted.append(count)
        bases.append(base)
        wants.append(rng.choice([0, rng.randint(1, 8)]) if kind == "active" else 0)
    threshold = rng.choice([0, 1, 2, 3, 5, 8, 12, 20, 40, 80, 1 << 20])
    return threshold, kinds, counted, bases, wants


def _slot_cases(rng, trials):
    cases = [(12, ["active"] * 4, [True] * 4, [1] * 4, [5] * 4),  # the worked example of the chapter: [6, 4, 1, 1]
             (2, ["active"], [True], [1], [5]),                   # room for exactly one draft: none
             (10, ["keep", "active"], [True, True], [5, 1], [0, 5])]  # a prefill slot stays in `left`
    return cases + [_random_slots(rng) for _ in range(trials)]


def check_budget_scan(fn: Callable, *, trials: int = 3000, seed: int = 0) -> bool:
    """Exercise 3. ``fn(threshold, kinds, counted, bases, wants)`` -> the final token count of every slot, as
    :func:`sequential_budget` computes it. Write it without the serial dependency: prefix sums of the tentative
    counts and of the active slots, the first slot where the budget bites, and nothing after it."""
    rng = random.Random(seed)
    cases = _slot_cases(rng, trials)
    failures = []
    for threshold, kinds, counted, bases, wants in cases:
        want = sequential_budget(threshold, kinds, counted, bases, wants)
        got, error = _call(fn, threshold, list(kinds), list(counted), list(bases), list(wants))
        got = None if error else [int(x) for x in got]
        if error or got != want:
            failures.append(f"threshold={threshold}, kinds={kinds}, counted={counted}, bases={bases}, "
                            f"wants={wants}: {error or f'returned {got}'}, expected {want}")
    return _report("check_budget_scan", failures, len(cases))


def check_refused_bound(fn: Callable, *, trials: int = 3000, seed: int = 0) -> bool:
    """Exercise 4. ``fn(threshold, kinds, counted, bases)`` -> for every slot, whether the budget refuses it
    drafts *whatever the searches find* (then its search can be skipped). It must be safe (a refused slot gets no
    drafts for any ``wants``) and as strong as the per-slot facts allow (a slot that gets no drafts even when
    every earlier slot finds nothing must be refused)."""
    rng = random.Random(seed)
    cases = _slot_cases(rng, trials)
    failures = []
    for threshold, kinds, counted, bases, wants in cases:
        got, error = _call(fn, threshold, list(kinds), list(counted), list(bases))
        if error:
            failures.append(f"threshold={threshold}, kinds={kinds}, counted={counted}, bases={bases}: {error}")
            continue
        got = [bool(x) for x in got]
        if len(got) != len(kinds):
            failures.append(f"{len(kinds)} slots, but {len(got)} answers")
            continue
        final = sequential_budget(threshold, kinds, counted, bases, wants)
        where = f"threshold={threshold}, kinds={kinds}, counted={counted}, bases={bases}"
        for i, refused in enumerate(got):
            if refused and kinds[i] != "active":
                failures.append(f"{where}: slot {i} is {kinds[i]!r}, only active slots are searched")
                break
            if refused and final[i] > bases[i]:
                failures.append(f"{where}: slot {i} is refused, but with wants={wants} it gets "
                                f"{final[i] - bases[i]} drafts (unsafe)")
                break
            # the strongest bound: slot i alone wants drafts, every earlier slot finds nothing
            alone = [0] * len(kinds)
            alone[i] = 1 << 20
            if kinds[i] == "active" and not refused and \
                    sequential_budget(threshold, kinds, counted, bases, alone)[i] == bases[i]:
                failures.append(f"{where}: slot {i} gets no drafts even if no earlier slot drafts anything, "
                                f"but it is not refused (too weak)")
                break
    return _report("check_refused_bound", failures, len(cases))


# -----------------------------------------------------------------------------------------
# Exercise 6: change step 6's kernel
# -----------------------------------------------------------------------------------------

#: Step 6's kernel file, its split search (the kernel exercise 6 changes) and its phase 2 (launched after it).
STEP6_FILE, STEP6_KERNEL, STEP6_PHASE2 = "ngram_one_pass.cu", "ngram_one_pass_split", "ngram_budget_scan_reset"
_WARP_OPS = ("redux.sync", "shfl.sync")  # PTX of warp-level reductions: the 32-bit redux, or shuffles


def step6_source() -> str:
    """Step 6's kernel file (``ngram_one_pass.cu``), as text: what exercise 6 starts from."""
    from studylog import cuda

    return cuda.read_source(STEP6_FILE)


def _warp_ops(ptx: str) -> int:
    return sum(ptx.count(op) for op in _WARP_OPS)


def step6_matcher(source: str, inputs: NgramInputs, draft_tokens, seq_lens_this_time,
                  config: NgramConfig = NgramConfig()):
    """Step 6's launches (the grids and arguments of :func:`~studylog.ngram.kernels.step06_one_pass_split`) on the
    buffers, with its kernels compiled from ``source`` instead of the chapter's file: call it to run them in place
    (GPU only)."""
    from studylog import cuda
    from studylog.ngram import SCAN_THREADS, kernels

    m = kernels.NgramMatcher(kernels.step06_one_pass_split, inputs, draft_tokens, seq_lens_this_time, config=config)
    module = cuda.load(source)
    search, phase2 = (module.kernel(name, kernels.SIGNATURE) for name in (STEP6_KERNEL, STEP6_PHASE2))

    def call():
        if m.batch:
            search((m.batch, m.prompt_chunks + m.gen_chunks), (kernels.THREADS,), *m.args)
            phase2((1,), (SCAN_THREADS,), *m.args)
    return call


def check_warp_min(fn: Callable[[str], str], *, trials: int = 40, seed: int = 0) -> bool:
    """Exercise 6. ``fn(source)`` -> step 6's kernel file (``source``, :func:`step6_source`) with one change to
    ``ngram_one_pass_split``: after a tile, each warp folds its lanes' keys into one with warp-level minimums
    (``__reduce_min_sync`` works on 32 bits: a 64-bit key takes two, or shuffles) and one lane per warp updates the
    block's key in shared memory, instead of every lane with a candidate.

    On any machine NVRTC compiles your source and the fused kernel's PTX must hold more warp-level instructions
    (``redux.sync`` or ``shfl.sync``) than step 6's. On a GPU your kernel then runs in step 6's place on
    ``trials`` random batches and must give the specification's drafts and counts bit for bit; without a GPU
    that part is skipped (it says so)."""
    from studylog import cuda

    name = "check_warp_min"
    original = step6_source()
    text, error = _call(fn, original)
    if error:
        return _report(name, [f"fn(step 6's source) {error}"], 1)
    if not isinstance(text, str) or text == original:
        return _report(name, ["fn returned step 6's source unchanged: return the changed text"], 1)
    try:
        mine = cuda.compile_source(text, arch=cuda.DEFAULT_ARCH, name="ngram_one_pass_exercise.cu")
        ptx = mine.ptx_function(STEP6_KERNEL)
    except Exception as exc:  # a compile error or a renamed kernel: show NVRTC's log
        return _report(name, [f"your source does not compile to a kernel {STEP6_KERNEL!r}: {exc}"], 1)
    theirs = cuda.compile_source(original, arch=cuda.DEFAULT_ARCH, name=STEP6_FILE)
    before, after = _warp_ops(theirs.ptx_function(STEP6_KERNEL)), _warp_ops(ptx)
    if after <= before:
        return _report(name, [f"the PTX of {STEP6_KERNEL} has {after} warp-level instructions (redux.sync, shfl.sync), "
                              f"as many as step 6's {before}: no warp-level minimum was added"], 1)
    regs = {k: v.get("registers") for k, v in (("step 6", theirs.ptxas_report().get(STEP6_KERNEL, {})),
                                               ("yours", mine.ptxas_report().get(STEP6_KERNEL, {})))}
    print(f"{name}: compiles for {cuda.DEFAULT_ARCH}; the PTX of {STEP6_KERNEL} has {after} warp-level instructions "
          f"against step 6's {before}; registers per thread: step 6 {regs['step 6']}, yours {regs['yours']}")
    return _against_specification(name, lambda *args: step6_matcher(text, *args), trials, seed)


def _against_specification(name: str, launcher: Callable, trials: int, seed: int) -> bool:
    """A reader's compiled kernel run on a GPU against the specification on ``trials`` random batches:
    ``launcher(inputs, draft, counts, config)`` builds the launch (call it to run it in place); on a CPU it says the
    kernel was only compiled."""
    import torch

    from studylog.ngram import make_batch, reference_ngram_match

    if not torch.cuda.is_available():
        print(f"{name}: no GPU, so your kernel was compiled, not run: on a GPU this check also runs it against the "
              "specification")
        return True
    rng = random.Random(seed)
    failures = []
    for t in range(trials):
        batch, width = rng.choice([(1, 4096), (8, 512), (20, 60), (3, 20000)])
        config = NgramConfig(threshold=rng.choice([5, 30, 128, 1 << 30]))
        inputs, draft, this_time = make_batch(batch, width, 24, vocab=rng.choice([2, 4, 50]), seed=seed + t,
                                              decoys=True, capped_fraction=0.3)
        want_draft, want_counts = reference_ngram_match(inputs, draft.clone(), this_time.clone(), config)
        got_draft, got_counts = draft.cuda(), this_time.cuda()
        try:
            launcher(inputs.to("cuda"), got_draft, got_counts, config)()
        except Exception as exc:
            failures.append(f"batch {batch}x{width}: raised {type(exc).__name__}: {exc}")
            break
        if not (torch.equal(got_counts.cpu(), want_counts) and torch.equal(got_draft.cpu(), want_draft)):
            failures.append(f"batch {batch}x{width}, threshold {config.threshold}, seed {seed + t}: drafts or counts "
                            "differ from the specification's")
    return _report(name, failures, trials)


__all__ = ["step6_source", "step6_matcher", "check_warp_min", "step12_source", "step12_matcher", "check_no_stop",
           "time_no_stop", "sequential_budget", "budget_facts", "best_window", "check_match_key", "check_one_pass", "check_budget_scan",
           "check_refused_bound", "time_my_step6"]


def time_my_step6(fn: Callable[[str], str]) -> None:
    """Exercise 6, on a GPU: step 6 and the reader's kernel file (``fn`` applied to :func:`step6_source`, launched as
    step 6 is, :func:`step6_matcher`) at 16 slots of 131,072 tokens, on uniform ids and on a two-token vocabulary, one
    line each; on a CPU it says timing needs a GPU."""
    import torch

    from book.common import gpu_us
    from studylog import ngram

    if not torch.cuda.is_available():
        print("timing needs a GPU: the check ran the kernel's text, not its speed")
        return
    width = ngram.gen_width_for(131072)
    for vocab in (50_000, 2):
        batch = ngram.make_batch(16, 131072, width, vocab=vocab, seed=1, device="cuda")
        theirs, mine = (step6_matcher(text, *batch) for text in (step6_source(), fn(step6_source())))
        print(f"16 × 131072, vocabulary {vocab:,}: step 6 {gpu_us(theirs):,.1f} µs, yours {gpu_us(mine):,.1f} µs")


#: Step 12's kernel file and the instance of its template that step 12 launches (``VEC`` tokens a load, 1 or 2).
STEP12_FILE = "ngram_stream.cu"


def step12_instance(vec: int) -> str:
    """The name expression of step 12's kernel for ``vec`` tokens a load: ``ngram_stream<4, 2, true, true>``."""
    from studylog.ngram import kernels

    return f"ngram_stream<{kernels.STREAM_LOADS}, {vec}, true, true>"


def step12_source() -> str:
    """Step 12's kernel file (``ngram_stream.cu``), as text: what exercise 5 starts from."""
    from studylog import cuda

    return cuda.read_source(STEP12_FILE)


def _key_reads(ptx: str) -> int:
    """Volatile 64-bit loads in a kernel's PTX: the reads of the slot's key (``load_shared_key``)."""
    return ptx.count("ld.volatile.global.u64")


def step12_matcher(source: str, inputs: NgramInputs, draft_tokens, seq_lens_this_time,
                   config: NgramConfig = NgramConfig()):
    """Step 12's launch (the grid, split and arguments of :func:`~studylog.ngram.kernels.step12_skip_refused`) on the
    buffers, with its kernel compiled from ``source`` instead of the chapter's file: call it to run it in place (GPU
    only)."""
    from studylog import cuda
    from studylog.ngram import kernels

    m = kernels.NgramMatcher(kernels.step12_skip_refused, inputs, draft_tokens, seq_lens_this_time, config=config)
    name = step12_instance(m.vec)
    kernel = cuda.load(source, name_expressions=[name]).kernel(name, kernels.SIGNATURE)

    def call():
        if m.batch:
            kernel(m.grid, (kernels.THREADS,), *m.args)
    return call


def check_no_stop(fn: Callable[[str], str], *, trials: int = 40, seed: int = 0) -> bool:
    """Exercise 5. ``fn(source)`` -> step 12's kernel file (``source``, :func:`step12_source`) without the early stop:
    a thread no longer reads the slot's key with each tile, and leaves its loop only at the end of its chunk (or when
    the budget refuses the slot).

    On any machine NVRTC compiles your source and the PTX of step 12's kernel must hold fewer volatile reads of the
    slot's key than step 12's. On a GPU your kernel then runs in step 12's place on ``trials`` random batches and must
    give the specification's drafts and counts bit for bit; without a GPU that part is skipped (it says so)."""
    from studylog import cuda

    name = "check_no_stop"
    original = step12_source()
    text, error = _call(fn, original)
    if error:
        return _report(name, [f"fn(step 12's source) {error}"], 1)
    if not isinstance(text, str) or text == original:
        return _report(name, ["fn returned step 12's source unchanged: return the changed text"], 1)
    reads = {}
    for label, source in (("step 12", original), ("yours", text)):
        try:
            compiled = cuda.compile_source(source, arch=cuda.DEFAULT_ARCH, name_expressions=[step12_instance(2)],
                                           name=STEP12_FILE if label == "step 12" else "ngram_stream_exercise.cu")
            reads[label] = _key_reads(compiled.ptx_function(step12_instance(2)))
        except Exception as exc:  # a compile error or a renamed kernel: show NVRTC's log
            return _report(name, [f"your source does not compile to {step12_instance(2)}: {exc}"], 1)
    if reads["yours"] >= reads["step 12"]:
        return _report(name, [f"the PTX of {step12_instance(2)} reads the slot's key {reads['yours']} times, as step "
                              f"12's does ({reads['step 12']}): the read each tile is still there"], 1)
    print(f"{name}: compiles for {cuda.DEFAULT_ARCH}; the PTX reads the slot's key at {reads['yours']} places against "
          f"step 12's {reads['step 12']}")
    return _against_specification(name, lambda *args: step12_matcher(text, *args), trials, seed)


def time_no_stop(fn: Callable[[str], str]) -> None:
    """Exercise 5, on a GPU: step 12 and the reader's kernel file (``fn`` applied to :func:`step12_source`, launched as
    step 12 is, :func:`step12_matcher`) at 256 slots of 131,072 tokens with no budget, as the chapter's benchmark
    builds that case, one line; on a CPU it says timing needs a GPU."""
    import torch

    from book.common import gpu_us
    from studylog import ngram

    if not torch.cuda.is_available():
        print("timing needs a GPU: the check compiled the kernel's text, it did not time it")
        return
    batch, seq_len = 256, 131072
    inputs, draft, this_time = ngram.report.grid_batch(batch, seq_len, device="cuda")  # the benchmark's batch
    config = NgramConfig(threshold=NO_BUDGET)  # no budget: every slot scans, as in the lab's timing of the stop
    times = [gpu_us(step12_matcher(text, inputs, draft, this_time, config)) for text in (step12_source(),
                                                                                          fn(step12_source()))]
    print(f"{batch} × {seq_len}, no budget: step 12 {times[0]:,.1f} µs, yours {times[1]:,.1f} µs "
          f"(step 12 is {times[1] / times[0]:.2f}× as fast)")
