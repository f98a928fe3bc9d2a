"""Chapter 2's exercises, each with a check that a reader runs on a CPU.

Every ``check_*`` function runs the reader's function on small random inputs against the chapter's answer,
prints what is wrong on the first input where they disagree, and returns ``True`` when every input agrees. The
answers live in :mod:`book.masked_lm_head.solutions`, which the notebook does not import; a check loads them only
to compare.

1. :func:`check_active_fraction`: the share of ``BLOCK``-token blocks a block-skipping kernel (step 1) still
   computes when ``n`` allowed ids are drawn at random.
2. :func:`check_union_ids`: the sorted union of allowed ids of a batch, from the packed int32 bitmask a grammar
   engine fills (what :class:`~studylog.masked_lm_head.MaskedHeadPlan` builds on the device).
3. :func:`check_masked_logits`: a masked LM head of your own (torch, or a Triton kernel run in the
   interpreter) that honours the chapter's contract: fp32 logits for allowed tokens, ``-inf`` elsewhere,
   fp32 accumulation, every element of ``out`` written.
4. :func:`check_compact_threshold`: step 12's threshold from measurements: up to which union a compacted kernel
   is used.
5. :func:`check_rows_first` (the page's exercise 6): step 6's kernel with its row programs first in the grid again
   (a change of the kernel's text, :func:`step06_source`), checked on the interpreter against step 6 bit for bit;
   :func:`step06_matcher` launches it as step 6 is launched, for timing on a GPU (:func:`time_rows_first`).

6. :func:`time_fill_then_rows` (the page's exercise 7): the reader's two-launch step 10 (``-inf`` everywhere, then
   the row programs alone), checked against the contract by :func:`check_masked_logits` and timed on a GPU.

The page's exercise 4 runs step 7 with a tile the reader sets, through :func:`check_tiles` (and
:func:`try_rows_per_program`, the same for a number of rows per program).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from book.common import guarded, report
from studylog.masked_lm_head.formats import AllowedTokens, check_logits, pack_bitmask

__all__ = ["check_active_fraction", "check_union_ids", "check_masked_logits", "check_compact_threshold",
           "step06_source", "step06_matcher", "check_rows_first", "check_tiles", "try_rows_per_program", "time_rows_first",
           "time_fill_then_rows"]


def _solutions():
    from book.masked_lm_head import solutions  # the answers, loaded only to compare with the reader's

    return solutions


# --------------------------------------------------------------------------------------
# 1. How many blocks does a block-skipping kernel still compute?
# --------------------------------------------------------------------------------------

def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)




@guarded
def check_active_fraction(fn: Callable[[int, int, int], float], cases: int = 300) -> bool:
    """``fn(n, vocab, block) -> float``: the expected share of blocks with at least one allowed id. Checked
    against the exact value on vocabularies that are and are not multiples of the block, and against a
    sampled estimate on one case."""
    gen = np.random.default_rng(7)
    for _ in range(cases):
        block = int(gen.choice([4, 16, 64]))
        vocab = int(gen.integers(block, 40 * block))
        n = int(gen.integers(0, vocab + 1))
        want, got = _solutions().active_fraction(n, vocab, block), fn(n, vocab, block)
        if not isinstance(got, (int, float, np.floating)) or not math.isclose(got, want, rel_tol=1e-6,
                                                                               abs_tol=1e-9):
            return report("check_active_fraction", False,
                          f"n={n}, vocab={vocab}, block={block}: expected {want:.6f}, got {got!r}", cases)
    # the formula is what a kernel sees: compare with sampled sets once
    n, vocab, block, draws = 40, 1000, 64, 4000
    blocks = -(-vocab // block)
    sampled = np.mean([np.unique(gen.choice(vocab, n, replace=False) // block).size / blocks for _ in range(draws)])
    got = fn(n, vocab, block)
    if abs(sampled - got) > 0.01:
        return report("check_active_fraction", False, f"n={n}, vocab={vocab}, block={block}: {got:.4f}, but "
                      f"{draws} sampled sets give {sampled:.4f}", cases + 1)
    return report("check_active_fraction", True, None, cases + 1)


# --------------------------------------------------------------------------------------
# 2. The union's ids from a packed bitmask
# --------------------------------------------------------------------------------------



def _random_bitmask(gen: np.random.Generator, batch: int, vocab: int, density: float,
                    padding: bool) -> tuple[np.ndarray, np.ndarray]:
    """(bitmask, mask): a random ``[batch, vocab]`` mask packed, with the bits past ``vocab`` set when
    ``padding`` (a grammar engine may leave them set; the ids they stand for do not exist)."""
    mask = gen.random((batch, vocab)) < density
    packed = pack_bitmask(torch.from_numpy(mask)).numpy().copy()
    if padding and vocab % 32:
        packed[:, -1] |= np.int32(-(1 << (vocab % 32)))
    return packed, mask


@guarded
def check_union_ids(fn: Callable[[np.ndarray, int], np.ndarray], cases: int = 200) -> bool:
    """``fn(bitmask, vocab) -> ids``: ``bitmask`` is an int32 numpy array ``[B, ceil(vocab / 32)]``; return the
    sorted ids (any integer array) that at least one row allows. Inputs include empty and full masks, the sign
    bit of a word (token ``32k + 31``) and bits set past ``vocab``."""
    gen = np.random.default_rng(11)
    for i in range(cases):
        vocab = int(gen.integers(1, 300))
        batch = int(gen.integers(1, 5))
        density = [0.0, 1.0, 0.02, 0.3][i % 4]
        bitmask, mask = _random_bitmask(gen, batch, vocab, density, padding=i % 3 == 0)
        want = np.flatnonzero(mask.any(0))
        got = np.asarray(fn(bitmask.copy(), vocab))
        if got.shape != want.shape or not np.array_equal(got.astype(np.int64), want):
            extra = sorted(set(got.tolist()) - set(want.tolist()))[:5] if got.ndim == 1 else []
            missing = sorted(set(want.tolist()) - set(got.tolist()))[:5] if got.ndim == 1 else []
            return report("check_union_ids", False,
                          f"vocab={vocab}, batch={batch}, {int(mask.any(0).sum())} allowed"
                          f"{', bits past vocab set' if i % 3 == 0 else ''}: {len(got)} ids returned, "
                          f"{len(want)} expected (extra {extra}, missing {missing})", cases)
    return report("check_union_ids", True, None, cases)


# --------------------------------------------------------------------------------------
# 3. A masked LM head of your own
# --------------------------------------------------------------------------------------



@guarded
def check_masked_logits(fn: Callable[[Tensor, Tensor, AllowedTokens, Tensor], Tensor], cases: int = 24) -> bool:
    """``fn(h, weight, allowed, out) -> out``: ``h`` ``[B, D]`` and ``weight`` ``[V, D]`` in bf16, ``allowed`` an
    :class:`~studylog.masked_lm_head.AllowedTokens`, ``out`` an fp32 ``[B, V]`` tensor filled with NaN that the
    function must fill. Checked with the chapter's bound (:func:`~studylog.masked_lm_head.check_logits`) at
    sizes that are not multiples of any block, with empty, full and single-id sets."""
    gen = torch.Generator().manual_seed(5)
    rng = np.random.default_rng(5)
    for i in range(cases):
        batch, vocab, hidden = int(rng.integers(1, 4)), int(rng.integers(20, 300)), int(rng.integers(8, 200))
        kind = ["random", "empty", "all", "one"][i % 4]
        sets = {"random": lambda: rng.choice(vocab, int(rng.integers(1, vocab)), replace=False),
                "empty": lambda: np.array([], dtype=np.int64), "all": lambda: np.arange(vocab),
                "one": lambda: np.array([vocab - 1])}[kind]
        allowed = AllowedTokens.from_ids([sets() for _ in range(batch)], vocab, device="cpu")
        h = torch.randn(batch, hidden, generator=gen).to(torch.bfloat16)
        weight = torch.randn(vocab, hidden, generator=gen).to(torch.bfloat16)
        out = torch.full((batch, vocab), float("nan"))
        got = fn(h, weight, allowed, out)
        if not isinstance(got, Tensor) or got.shape != (batch, vocab) or got.dtype != torch.float32:
            shape = tuple(got.shape) if isinstance(got, Tensor) else type(got).__name__
            return report("check_masked_logits", False, f"expected an fp32 tensor of shape {(batch, vocab)}, got "
                          f"{shape}{', ' + str(got.dtype) if isinstance(got, Tensor) else ''}", cases)
        verdict = check_logits(got, h, weight, allowed)
        if not verdict["passed"]:
            return report("check_masked_logits", False,
                          f"batch {batch}, V={vocab}, D={hidden}, {kind} sets: {verdict['nan']} NaN left in out, "
                          f"{verdict['not_minus_inf']} disallowed logits not -inf, {verdict['over_bound']} allowed "
                          f"logits outside the fp32 bound (largest error {verdict['max_abs_err']:.3g})", cases)
    return report("check_masked_logits", True, None, cases)


# --------------------------------------------------------------------------------------
# 4. Step 12's threshold from measurements
# --------------------------------------------------------------------------------------



@guarded
def check_compact_threshold(fn: Callable[[list[tuple[int, float, float]], int], float], cases: int = 300) -> bool:
    """``fn(points, vocab) -> fraction``: see :func:`compact_threshold`. Points come shuffled; some sweeps never
    lose, some lose at once, some win again after a loss (a noisy point: the threshold stays below it)."""
    gen = np.random.default_rng(3)
    for i in range(cases):
        vocab = int(gen.integers(1000, 200_000))
        unions = sorted({int(u) for u in gen.integers(1, vocab + 1, size=int(gen.integers(1, 9)))})
        dense = gen.uniform(0.1, 0.3, size=len(unions))
        shape = i % 4
        if shape == 0:  # never loses
            compact = dense * gen.uniform(0.1, 1.0, size=len(unions))
        elif shape == 1:  # loses everywhere
            compact = dense * gen.uniform(1.01, 2.0, size=len(unions))
        else:  # a crossover, and sometimes a win again above it
            compact = dense * np.where(np.arange(len(unions)) < gen.integers(0, len(unions) + 1), 0.5, 1.5)
            if shape == 3 and len(unions) > 2:
                compact[-1] = dense[-1] * 0.9
        points = [(u, float(c), float(d)) for u, c, d in zip(unions, compact, dense)]
        order = gen.permutation(len(points))
        shuffled = [points[k] for k in order]
        want, got = _solutions().compact_threshold(points, vocab), fn(list(shuffled), vocab)
        if not isinstance(got, (int, float, np.floating)) or not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
            shown = ", ".join(f"({u}, {c:.3f}, {d:.3f})" for u, c, d in points)
            return report("check_compact_threshold", False,
                          f"vocab={vocab}, points (sorted) [{shown}]: expected {want:.6f}, got {got!r}", cases)
    return report("check_compact_threshold", True, None, cases)


# --------------------------------------------------------------------------------------
# 5. Step 6 with its row programs first again
# --------------------------------------------------------------------------------------

#: The kernel of step 6 that exercise 5 changes (its name in the text the reader returns).
STEP06_KERNEL = "fill_first_kernel"


def step06_source() -> str:
    """The text of step 6's kernel (``@triton.jit`` and the function), as the library defines it."""
    import inspect

    from studylog.masked_lm_head import compact

    return inspect.getsource(getattr(compact, STEP06_KERNEL).fn)


def _kernel_from(source: str):
    """The kernel named :data:`STEP06_KERNEL` defined by ``source`` (a module of its own, written to a temporary
    file: Triton reads a kernel's text from its file)."""
    import hashlib
    import importlib.util
    import tempfile
    from pathlib import Path

    # the jit helpers step 6's kernel calls, as the library defines them
    text = ("import triton\nimport triton.language as tl\n\n"
            "from studylog.masked_lm_head.compact import fill_disallowed, one_wait_rows\n\n\n" + source)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    # one file per distinct source, kept (Triton reads it when it compiles), not a new folder per call
    path = Path(tempfile.gettempdir()) / "studylog_exercises" / f"rows_first_{digest}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"mlh_exercise_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, STEP06_KERNEL)


def step06_matcher(source: str, h: Tensor, weight: Tensor, allowed: AllowedTokens, tiles=None):
    """A call of the kernel in ``source`` with step 6's grid and arguments (those of
    :func:`~studylog.masked_lm_head.step06_fill_first`: as many programs, the fill count ``n_fill`` passed as there,
    the same tiles), writing one output made for it (NaN until a call writes it): call it to run the kernel."""
    import triton

    from studylog.masked_lm_head.formats import stream_tiles

    kernel = _kernel_from(source)
    vocab, hidden = weight.shape
    n_ids = allowed.union_count
    t = tiles or stream_tiles(n_ids)
    fills = triton.cdiv(vocab, t.fill_block)
    grid = (fills + triton.cdiv(n_ids, t.block_v),)
    meta = dict(D=hidden, D_POW2=triton.next_power_of_2(hidden), BLOCK_V=t.block_v, FILL_BLOCK=t.fill_block,
                num_warps=t.num_warps, num_stages=t.num_stages)

    out = torch.full((1, vocab), float("nan"), dtype=torch.float32, device=h.device)

    def run() -> Tensor:
        kernel[grid](h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_ids, vocab, fills, weight.stride(0),
                     **meta)
        return out

    return run


@guarded
def check_rows_first(fn: Callable[[str], str], cases: int = 8) -> bool:
    """``fn(source) -> source``: step 6's kernel text (:func:`step06_source`) with the row programs first: the
    programs below ``tl.cdiv(n_ids, BLOCK_V)`` read rows, the rest write ``-inf``. The launch stays step 6's
    (:func:`step06_matcher`). Checked on the CPU (Triton's interpreter) or a GPU at sizes that are multiples of no
    block, with empty, full, single-id and random sets: the output must equal step 6's bit for bit (the same
    products, summed in the same order)."""
    from studylog.masked_lm_head import step06_fill_first

    original = step06_source()
    text = fn(original)
    if not isinstance(text, str) or text == original:
        return report("check_rows_first", False, "fn returned step 6's source unchanged: return the changed text", 1)
    if text.replace(" ", "").count("pid>=n_fill") or "pid - n_fill" in text:
        return report("check_rows_first", False, "the programs still test n_fill: the fill programs come first", 1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(9)
    rng = np.random.default_rng(9)
    for i in range(cases):
        vocab, hidden = int(rng.integers(20, 150)), int(rng.integers(8, 100))
        kind = ["random", "empty", "all", "one"][i % 4]
        ids = {"random": lambda: rng.choice(vocab, int(rng.integers(1, vocab)), replace=False),
               "empty": lambda: np.array([], dtype=np.int64), "all": lambda: np.arange(vocab),
               "one": lambda: np.array([vocab - 1])}[kind]()
        allowed = AllowedTokens.from_ids([ids], vocab, device=device)
        h = torch.randn(1, hidden, generator=gen).to(torch.bfloat16).to(device)
        weight = torch.randn(vocab, hidden, generator=gen).to(torch.bfloat16).to(device)
        try:
            got = step06_matcher(text, h, weight, allowed)()
        except Exception as exc:  # a syntax error, a renamed kernel, a launch that fails: say which
            return report("check_rows_first", False, f"V={vocab}, D={hidden}, {kind} set: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}", i + 1)
        want = step06_fill_first(h, weight, allowed)
        if not torch.equal(got, want):
            differ = int((got != want).sum())  # a position left unwritten is NaN, which equals nothing
            return report("check_rows_first", False, f"V={vocab}, D={hidden}, {kind} set ({len(ids)} ids): {differ} "
                          "of the outputs differ from step 6's", i + 1)
    return report("check_rows_first", True, None, cases)


# --------------------------------------------------------------------------------------
# The exercises that time a kernel on a GPU (4 and 6): the inputs and the stopwatch, so the page's cells show only
# the change a reader makes
# --------------------------------------------------------------------------------------

def _head(allowed_count: int, seed: int = 0):
    """``(h, weight, allowed)`` at batch 1 with ``allowed_count`` random allowed ids: the chapter's head on a GPU, a
    small one (1,000 × 256, a tenth of it allowed at most) on a CPU, where Triton's interpreter is slow."""
    from studylog import masked_lm_head as mlh

    device = "cuda" if torch.cuda.is_available() else "cpu"
    vocab, hidden = (mlh.VOCAB, mlh.HIDDEN) if device == "cuda" else (1000, 256)
    weight = torch.randn(vocab, hidden, device=device).to(torch.bfloat16)
    h = torch.randn(1, hidden, device=device).to(torch.bfloat16)
    ids = np.sort(np.random.default_rng(seed).choice(vocab, size=min(allowed_count, vocab // 10), replace=False))
    return h, weight, AllowedTokens.from_ids([ids], vocab, device=device)


def try_rows_per_program(rows: int, allowed_count: int = 1000) -> str:
    """Exercise 4: step 7 with ``rows`` rows per program (its tiles' ``block_v``) at ``allowed_count`` allowed ids,
    checked against the contract and, on a GPU, timed (one head replayed, so its rows may come from L2): one line, its
    time left out on a CPU."""
    import dataclasses

    from book.common import gpu_us
    from studylog import masked_lm_head as mlh

    h, weight, allowed = _head(allowed_count)
    tiles = dataclasses.replace(mlh.formats.default_tiles(7, 1), block_v=rows)

    def run():
        return mlh.step07_stream(h, weight, allowed, tiles=tiles)

    ok = check_logits(run(), h, weight, allowed)["passed"]
    timed = f", {gpu_us(run):.1f} µs" if torch.cuda.is_available() else ""  # a CPU run checks the output only
    return f"{rows} row{'s' if rows > 1 else ''} per program: output {'ok' if ok else 'WRONG'}{timed}"


def check_tiles(fn: Callable, allowed_count: int = 1000) -> bool:
    """Exercise 4: step 7 run with the reader's tiles, ``fn(default)`` for step 7's default
    :class:`~studylog.masked_lm_head.formats.Tiles` (e.g. another ``block_v``, rows per program, or ``num_warps``), at
    ``allowed_count`` allowed ids, its output checked against the contract; on a GPU it is also timed beside the
    default. Prints one line; returns whether the output is right."""
    from book.common import gpu_us
    from studylog import masked_lm_head as mlh

    h, weight, allowed = _head(allowed_count)
    default = mlh.formats.stream_tiles(allowed_count)
    tiles = fn(default)

    def run(t):
        return mlh.step07_stream(h, weight, allowed, tiles=t)

    try:
        ok = check_logits(run(tiles), h, weight, allowed)["passed"]
    except Exception as exc:  # a tile the kernel cannot take: say why, no traceback
        print(f"check_tiles: step 7 did not run with {tiles}: {str(exc).splitlines()[0] if str(exc) else exc!r}")
        return False
    said = f"{tiles.block_v} row{'s' if tiles.block_v > 1 else ''} per program, {tiles.num_warps} warps"
    if not ok:
        print(f"check_tiles: wrong output with {said}")
        return False
    same = " (the default: change a field)" if tiles == default else ""
    timed = (f"; {gpu_us(lambda: run(tiles)):.2f} µs, the default {gpu_us(lambda: run(default)):.2f} µs"
             if torch.cuda.is_available() else "; timing needs a GPU")
    print(f"check_tiles: output ok with {said}{same}{timed}")
    return True


def time_rows_first(fn: Callable[[str], str]) -> None:
    """Exercise 6, on a GPU: steps 5 and 6 and the reader's kernel (``fn`` applied to step 6's text, launched as step
    6 is, :func:`step06_matcher`) at 1 and 1,000 allowed ids, one line each; on a CPU it says timing needs a GPU."""
    from book.common import gpu_us
    from studylog import masked_lm_head as mlh

    if not torch.cuda.is_available():
        print("timing needs a GPU: here the kernel ran in Triton's interpreter, which checks correctness only")
        return
    for n in (1, 1000):
        h, weight, allowed = _head(n)
        out = torch.empty(1, weight.shape[0], device="cuda")
        mine = step06_matcher(fn(step06_source()), h, weight, allowed)
        five, six = (gpu_us(lambda f=f: f(h, weight, allowed, out=out))
                     for f in (mlh.step05_one_wait, mlh.step06_fill_first))
        print(f"{n:,} allowed: step 5 {five:.2f} µs, step 6 {six:.2f} µs, yours {gpu_us(mine):.2f} µs")


def time_fill_then_rows(fn: Callable[[Tensor, Tensor, AllowedTokens, Tensor], Tensor]) -> None:
    """Exercise 7, on a GPU: step 10 and the reader's ``fn(h, weight, allowed, out)`` at the page's worst loss shape
    (batch 256, 80 ids a sequence drawn from one 111-token union, the chapter's head), after checking ``fn``'s
    output there; on a CPU it says timing needs a GPU."""
    from book.common import gpu_us
    from studylog import masked_lm_head as mlh

    if not torch.cuda.is_available():
        print("timing needs a GPU: here the kernels ran in Triton's interpreter, which checks correctness only")
        return
    rng = np.random.default_rng(2024)
    pool = rng.choice(mlh.VOCAB, size=111, replace=False)
    allowed = AllowedTokens.from_ids([np.sort(rng.choice(pool, size=80, replace=False)) for _ in range(256)],
                                     mlh.VOCAB, device="cuda")
    weight = (torch.randn(mlh.VOCAB, mlh.HIDDEN, device="cuda") * mlh.HIDDEN ** -0.5).to(torch.bfloat16)
    h = torch.randn(256, mlh.HIDDEN, device="cuda").to(torch.bfloat16)
    out = torch.full((256, mlh.VOCAB), float("nan"), device="cuda")
    if not check_logits(fn(h, weight, allowed, out), h, weight, allowed)["passed"]:
        print("time_fill_then_rows: wrong output at batch 256, not timed")
        return
    ten = gpu_us(lambda: mlh.step10_batched(h, weight, allowed, out=out))
    print(f"batch 256, 80 of a 111-token union: step 10 {ten:.1f} µs, yours {gpu_us(lambda: fn(h, weight, allowed, out)):.1f} µs")
