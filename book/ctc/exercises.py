"""Chapter 4's exercises, each with a check that a reader runs on a CPU.

Every ``check_*`` function runs the reader's function on small random inputs against the chapter's
float64 reference (or its model), prints what is wrong on the first input where it disagrees, and returns
``True`` when every input agrees. The answers live in :mod:`book.ctc.solutions`, which the notebook does not
import.

1. :func:`check_min_frames`: the fewest frames a target needs (a blank between repeated labels).
2. :func:`check_forward`: the loss of one utterance by the log-space alpha recursion.
3. :func:`check_gradient`: the gradient with respect to the activations (softmax included), from alpha
   and beta.
4. :func:`check_bank_ways`: the shared-memory bank model of step 4's two layouts (the odd-grain advice).
5. :func:`check_dispatcher`: a rule that picks step 13 or step 14 from a batch's shape, judged against the
   committed measurements of both (and, on a GPU, timed by the reader).
6. :func:`check_unrolled`: a change to step 12's kernel (its frame update no longer unrolled), compiled with NVRTC
   on any machine and read in ptxas' report and the PTX; run against the reference on a GPU.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import Tensor

from book.common import guarded, report
from book.ctc.lesson import bank_ways
from studylog.ctc.reference import reference_ctc
from studylog.ctc.targets import BLANK, min_frames
from studylog.ctc.warpctc import GRAIN_SIZES

__all__ = ["check_min_frames", "check_forward", "check_gradient", "check_bank_ways", "check_dispatcher",
           "check_unrolled", "step12_source", "step12_with", "extended", "logsumexp", "random_batch", "time_step"]

#: Inputs per check; small shapes, so that a reader's plain-Python loop is quick.
CASES = 40


def _random_target(gen: torch.Generator, A: int, max_len: int) -> list[int]:
    """A label list (labels 1..A-1), often with repeats (A small), sometimes empty."""
    length = int(torch.randint(0, max_len + 1, (1,), generator=gen))
    return torch.randint(1, A, (length,), generator=gen).tolist()


def _cases(seed: int, cases: int):
    """(activations (T, A) float64, target) pairs: repeats, empty targets, targets too long for T."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(cases):
        T = int(torch.randint(1, 13, (1,), generator=gen))
        A = int(torch.randint(2, 6, (1,), generator=gen))
        yield torch.randn(T, A, generator=gen, dtype=torch.float64) * 2, _random_target(gen, A, T)


def _reference(x: Tensor, target: Sequence[int]) -> tuple[float, Tensor]:
    T = x.shape[0]
    labels = torch.tensor([list(target) or [1]])
    loss, grad = reference_ctc(x[:, None], labels, [T], [len(target)])
    return float(loss[0]), grad[:, 0]


# --------------------------------------------------------------------------------------
# 1. How many frames does a target need?
# --------------------------------------------------------------------------------------



@guarded
def check_min_frames(fn: Callable[[list[int]], int], cases: int = 200) -> bool:
    """``fn(labels) -> int``: the fewest frames in which CTC can emit ``labels`` (a list of labels >= 1)."""
    gen = torch.Generator().manual_seed(1)
    for _ in range(cases):
        labels = _random_target(gen, int(torch.randint(2, 5, (1,), generator=gen)), 8)
        want, got = min_frames(labels), fn(list(labels))
        if got != want:
            return report("check_min_frames", False, f"labels {labels}: expected {want}, got {got}", cases)
    return report("check_min_frames", True, None, cases)


# --------------------------------------------------------------------------------------
# 2. The forward recursion in log space
# --------------------------------------------------------------------------------------

def extended(target: Sequence[int]) -> list[int]:
    """The blank-interleaved target the recursion runs over: ``blank l1 blank l2 ... blank``."""
    ext = [BLANK]
    for label in target:
        ext += [label, BLANK]
    return ext


def logsumexp(values: Sequence[float]) -> float:
    """``log(sum(exp(values)))`` without overflow; ``-inf`` when every value is."""
    top = max(values)
    return top if top == -math.inf else top + math.log(sum(math.exp(v - top) for v in values))






@guarded
def check_forward(fn: Callable[[Tensor, list[int]], float], cases: int = CASES) -> bool:
    """``fn(log_probs, target) -> float``: the loss ``-log P`` of one utterance; ``log_probs`` is ``(T, A)``
    float64 (already log-softmaxed), ``target`` a list of labels >= 1 (0 is the blank). A target that
    cannot fit must give ``inf``."""
    for x, target in _cases(2, cases):
        want, _ = _reference(x, target)
        got = float(fn(x.log_softmax(1), list(target)))
        close = got == want if math.isinf(want) else abs(got - want) <= 1e-9 * max(1.0, abs(want))
        bad = not close  # NaN is never close
        if bad:
            return report("check_forward", False, f"T = {x.shape[0]}, A = {x.shape[1]}, target {target}: "
                           f"expected {want:.10g}, got {got:.10g}", cases)
    return report("check_forward", True, None, cases)


# --------------------------------------------------------------------------------------
# 3. The gradient
# --------------------------------------------------------------------------------------



@guarded
def check_gradient(fn: Callable[[Tensor, list[int]], Tensor], cases: int = CASES) -> bool:
    """``fn(activations, target) -> Tensor``: the gradient of ``-log P`` with respect to the ``(T, A)``
    float64 activations (softmax included), for targets that fit their frames."""
    for x, target in _cases(3, cases):
        while target and min_frames(target) > x.shape[0]:
            target = target[:-1]
        _, want = _reference(x, target)
        got = torch.as_tensor(fn(x.clone(), list(target)), dtype=torch.float64)
        if got.shape != want.shape:
            return report("check_gradient", False, f"expected shape {tuple(want.shape)}, got {tuple(got.shape)}",
                           cases)
        err = float((got - want).abs().max())
        if not err <= 1e-9:
            t, k = divmod(int((got - want).abs().nan_to_num(math.inf).argmax()), x.shape[1])
            return report("check_gradient", False, f"T = {x.shape[0]}, A = {x.shape[1]}, target {target}: largest "
                           f"|difference| {err:.2e} at frame {t}, class {k} (expected {float(want[t, k]):.6f}, "
                           f"got {float(got[t, k]):.6f})", cases)
    return report("check_gradient", True, None, cases)


# --------------------------------------------------------------------------------------
# 4. Bank conflicts of the two layouts
# --------------------------------------------------------------------------------------



@guarded
def check_bank_ways(fn: Callable[[int, bool], int]) -> bool:
    """``fn(grain, blocked) -> int``: the ways of the worst bank conflict of one warp's access (see
    :func:`bank_conflict_ways`), for grains 1 to 8 and 128 threads per block, in both layouts."""
    cases = [(grain, blocked) for blocked in (False, True) for grain in GRAIN_SIZES]
    for grain, blocked in cases:
        want, got = bank_ways(grain, blocked=blocked), fn(grain, blocked)
        if got != want:
            layout = "blocked" if blocked else "strided"
            return report("check_bank_ways", False, f"grain {grain}, {layout} layout: expected {want}-way, "
                           f"got {got}-way", len(cases))
    return report("check_bank_ways", True, None, len(cases))


# --------------------------------------------------------------------------------------
# 5. A dispatcher between step 13 and step 14
# --------------------------------------------------------------------------------------

@guarded
def check_dispatcher(fn: Callable[[int, int, int], int], results=None, tolerance: float = 0.03) -> bool:
    """``fn(A, N, positions) -> 13 or 14``: which step to run for ``N`` utterances over ``A`` classes whose longest
    extended target has ``positions`` = 2L + 1 positions. Judged on the committed benchmark file (or
    ``results``): at every measured shape, the chosen step's time must be within ``tolerance`` of the faster of
    steps 13 and 14. Prints the worst point."""
    from studylog.plotting import load_results

    results = results or load_results("ctc")
    points, worst = 0, (1.0, None)
    for row in results.select("step14"):
        p = row["params"]
        thirteen = results.select("step13", **p)
        if not thirteen or "max_positions" not in row:
            continue
        times = {13: thirteen[0]["ms"], 14: row["ms"]}
        choice = fn(p["A"], p["N"], row["max_positions"])
        if choice not in times:
            return report("check_dispatcher", False, f"A = {p['A']}, N = {p['N']}: returned {choice!r}, not 13 or 14",
                          points + 1)
        points += 1
        over = times[choice] / min(times.values())
        if over > worst[0]:
            worst = (over, f"A = {p['A']}, N = {p['N']}, {row['max_positions']} positions: step {choice} takes "
                           f"{times[choice] * 1e3:.1f} µs, step {27 - choice} {times[27 - choice] * 1e3:.1f} µs")
    if worst[0] > 1 + tolerance:
        return report("check_dispatcher", False, f"{worst[0]:.2f}x the faster step at {worst[1]}", points)
    print(f"check_dispatcher: within {100 * (worst[0] - 1):.1f}% of the faster step at all {points} measured shapes")
    return True


def random_batch(T: int, N: int, A: int, seed: int = 0):
    """``(x, batch)`` on the GPU: ``(T, N, A)`` random activations and N random targets as the benchmark draws them
    (:func:`studylog.ctc.random_targets`), packed for the kernels: what exercises 5 and 6 time a step on."""
    from studylog.tails import ctc_inputs

    return ctc_inputs(T, N, A, seed=seed)


def time_step(step, x, batch) -> float | None:
    """GPU time in µs (:func:`book.common.gpu_us`) of one call of a step of the chapter (its number) or of a
    function ``fn(x, batch)`` (yours, from :func:`step12_with`) on ``(x, batch)`` from :func:`random_batch`."""
    from book.common import gpu_us
    from studylog.ctc import CHAPTER

    fn = CHAPTER.step(step).function if isinstance(step, int) else step
    return gpu_us(lambda: fn(x, batch))


# --------------------------------------------------------------------------------------
# 6. Change a kernel: what full unrolling buys a register array
# --------------------------------------------------------------------------------------

#: Step 12's recursion file (a file stem in ``studylog/ctc/csrc``; step 11's too, with another template flag).
STEP12_FILE = "ctc_step11_12_branch_free"


def step12_source() -> str:
    """Step 12's recursion file (``ctc_step11_12_branch_free.cu``), as text: what exercise 6 starts from."""
    from studylog import cuda

    return cuda.read_source(STEP12_FILE)


def _step12_instance() -> str:
    """The recursion instance the benchmark runs at T = 150 (its positions per lane, the default options)."""
    from studylog.ctc import BENCH_T
    from studylog.ctc.fused import recursion_name, warp_grain

    return recursion_name(warp_grain(2 * BENCH_T + 1))


def _compiled_facts(text: str, name: str) -> dict:
    """NVRTC's output for ``name`` in ``text``: ptxas' registers, stack and spills, and the PTX's local-memory
    accesses (``ld.local``/``st.local``: an array the compiler could not keep in registers)."""
    from studylog import cuda

    compiled = cuda.compile_source(text, arch=cuda.DEFAULT_ARCH, name=f"{STEP12_FILE}.cu", name_expressions=[name])
    ptx = compiled.ptx_function(name)
    facts = dict(compiled.ptxas_report().get(compiled.lowered_names[name], {}))
    facts["local accesses"] = ptx.count("ld.local") + ptx.count("st.local")
    return facts


def step12_with(source: str):
    """``fn(x, batch) -> (loss, grad)``: step 12 (:func:`studylog.ctc.fused.step12_flush_to_zero`) with its recursion
    compiled from ``source`` instead of the chapter's file (GPU only; the first and last passes are step 12's)."""
    from studylog import cuda
    from studylog.ctc import fused

    def run(x, batch):
        fused.step12_flush_to_zero(x, batch)  # loads step 12's three kernels for this shape
        v, _ = fused.launch_shape(12, batch.max_positions)
        name = fused.recursion_name(v)
        kernel = cuda.load(source, name_expressions=(name,)).kernel(name, fused.SIGNATURES["ctc_branchless_recursion"])
        keys = [k for k in fused.LAUNCHES if k[:2] == (12, v)]
        saved = {k: fused.LAUNCHES[k] for k in keys}
        try:
            for k in keys:
                first, _, last = saved[k]
                fused.LAUNCHES[k] = (first, kernel, last)
            return fused.step12_flush_to_zero(x, batch)
        finally:
            fused.LAUNCHES.update(saved)
    return run


@guarded
def check_unrolled(fn: Callable[[str], str]) -> bool:
    """Exercise 6. ``fn(source)`` -> step 12's recursion file (:func:`step12_source`) with the forward direction's
    frame update (the loop ``for (int i = V - 1; i >= 0; --i)``) no longer unrolled (``#pragma unroll 1``).

    On any machine NVRTC compiles both files for the benchmark's instance and the check prints ptxas' report
    (registers, stack frame, spills) and the PTX's local-memory accesses side by side: yours must put the
    lane's positions in local memory, where step 12 keeps them in registers. On a GPU your kernel then runs on
    random batches against the float64 reference; without one that part is skipped (it says so)."""
    name = _step12_instance()
    original = step12_source()
    text = fn(original)
    if not isinstance(text, str) or text == original:
        return report("check_unrolled", False, "fn returned step 12's source unchanged: return the changed text", 1)
    try:
        mine = _compiled_facts(text, name)
    except Exception as exc:  # the compile log says where
        return report("check_unrolled", False, f"your source does not compile to {name}: {exc}", 1)
    theirs = _compiled_facts(original, name)
    keys = {"registers": "registers", "stack_bytes": "stack (bytes)", "spill_stores": "spill stores",
            "spill_loads": "spill loads", "local accesses": "local accesses"}
    print(f"{name}, compiled with NVRTC for sm_90:")
    for key, words in keys.items():
        print(f"  {words:>15}: step 12 {theirs.get(key, '?')}, yours {mine.get(key, '?')}")
    if mine["local accesses"] <= theirs["local accesses"] and mine.get("stack_bytes", 0) <= theirs.get("stack_bytes", 0):
        return report("check_unrolled", False, "your kernel uses no more local memory than step 12's: the frame "
                      "update's loop still unrolls (or the change is elsewhere)", 1)
    if not torch.cuda.is_available():
        print("check_unrolled: your change is in the machine code; no GPU, so your kernel was compiled, not run "
              "(on a GPU this check also runs it against the float64 reference)")
        return True
    from studylog.ctc import prepare_targets, random_targets, padded
    from studylog.ctc.reference import wrong_utterances

    run = step12_with(text)
    gen = torch.Generator().manual_seed(0)
    cases = 0
    for T, N, A in ((40, 3, 11), (150, 4, 28), (150, 2, 300)):
        lists = random_targets(T, N, A, gen)
        x = torch.randn(T, N, A, generator=gen)
        lengths = [len(t) for t in lists]
        ref_loss, ref_grad = reference_ctc(x.double(), padded(lists), [T] * N, lengths)
        batch = prepare_targets(padded(lists), [T] * N, lengths, num_classes=A, max_time=T, device="cuda")
        loss, grad = run(x.cuda(), batch)
        wrong = wrong_utterances(loss, grad, ref_loss, ref_grad)
        cases += N
        if bool(wrong.any()):
            return report("check_unrolled", False, f"T = {T}, N = {N}, A = {A}: utterances "
                          f"{wrong.nonzero().flatten().tolist()} differ from the float64 reference", cases)
    return report("check_unrolled", True, None, cases)
