"""Chapter 7's exercises, each with a check that a reader runs on a CPU.

Every ``check_*`` function runs the reader's function on small random inputs against the chapter's answer,
prints what is wrong on the first input where they disagree, and returns ``True`` when every input agrees; a
function that still raises ``NotImplementedError`` gets a note instead of a traceback. The answers live in
:mod:`book.decode.solutions`, which the notebook does not import: only the checks load it.

1. :func:`check_step_speedup`: the Amdahl bound of a decode step from its parts: what the step becomes when
   some parts get faster (or vanish) and the rest stay.
2. :func:`check_bitmask`: a set of allowed token ids packed into xgrammar's int32 bitmask and back, checked
   against the chapter's packing and, where xgrammar is installed, against its
   ``apply_token_bitmask_inplace``.
3. :func:`check_jump_decode`: a decode loop with forced-token jumps, cut at ``max_new_tokens``, that writes
   exactly what the loop without jumps writes, with fewer calls of the model.
4. :func:`check_chunked_forward`: a prompt fed to the model's KV cache in chunks (each padded to a captured
   chunk length, as the decode loop's CUDA graphs need), which must give the hidden state of a forward over
   the whole prompt.
5. :func:`check_gemv_tile`: the six-launch layer's matrix-vector kernel launched with a tile of the reader's
   own, checked against ``x @ weight.T`` (on a CPU under Triton's interpreter) and, on a GPU, timed against the
   library's tile.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from book.common import gpu_us, guarded, report

__all__ = ["check_step_speedup", "check_bitmask", "check_jump_decode", "check_chunked_forward",
           "check_gemv_tile", "toy_grammar"]


# --------------------------------------------------------------------------------------
# 1. The Amdahl bound of a step, from its parts
# --------------------------------------------------------------------------------------

@guarded
def check_step_speedup(fn: Callable[[Mapping[str, float], Mapping[str, float]], float], cases: int = 300) -> bool:
    """``fn(parts, faster) -> float``: ``parts`` maps a part of a step (``"body"``, ``"head"``, ...) to its time
    in ms, ``faster`` maps some of them to how many times faster they get (``math.inf``: removed). Checked on
    random steps, with parts that vanish, parts not named in ``parts`` ignored, and a step that vanishes whole."""
    from book.decode.solutions import step_speedup

    gen = np.random.default_rng(3)
    names = ["body", "mask_wait", "head", "mask_apply", "sampling", "host"]
    for i in range(cases):
        parts = {n: float(gen.exponential(1.0)) for n in names if gen.random() < 0.8} or {"body": 1.0}
        chosen = [n for n in parts if gen.random() < 0.4]
        faster = {n: (math.inf if gen.random() < 0.3 else float(gen.uniform(1.0, 20.0))) for n in chosen}
        if i % 7 == 0:
            faster["not_a_part"] = 3.0  # a name the step does not have changes nothing
        if i == cases - 1:
            faster = {n: math.inf for n in parts}  # everything removed: an unbounded speedup
        want, got = step_speedup(parts, faster), fn(dict(parts), dict(faster))
        if not isinstance(got, (int, float, np.floating)) or not (
                (math.isinf(want) and math.isinf(got) and got > 0) or math.isclose(got, want, rel_tol=1e-9)):
            shown = {k: round(v, 3) for k, v in parts.items()}
            return report("check_step_speedup", False, f"parts={shown}, faster={faster}: expected {want:.6g}, "
                           f"got {got!r}", cases)
    return report("check_step_speedup", True, None, cases)


# --------------------------------------------------------------------------------------
# 2. Allowed ids in xgrammar's bitmask and back
# --------------------------------------------------------------------------------------

def _xgrammar_allows(bitmask: np.ndarray, vocab: int) -> np.ndarray | None:
    """Which ids xgrammar's ``apply_token_bitmask_inplace`` leaves finite under ``bitmask`` (None without
    xgrammar). The logits row is as wide as the bitmask's bits, so no bit lies past it."""
    try:
        import xgrammar as xgr
    except ImportError:
        return None
    width = bitmask.size * 32
    logits = torch.zeros(1, width, dtype=torch.float32)
    xgr.apply_token_bitmask_inplace(logits, torch.from_numpy(np.ascontiguousarray(bitmask)).view(1, -1),
                                    vocab_size=width)
    return np.flatnonzero(torch.isfinite(logits[0]).numpy())


@guarded
def check_bitmask(pack: Callable[[Sequence[int], int], np.ndarray],
                  unpack: Callable[[np.ndarray, int], np.ndarray], cases: int = 200) -> bool:
    """``pack(ids, vocab) -> bitmask`` (int32 numpy ``[ceil(vocab / 32)]``) and ``unpack(bitmask, vocab) ->
    ids`` (sorted). Checked: the packed words equal the chapter's, xgrammar's ``apply_token_bitmask_inplace``
    (where installed) keeps exactly the packed ids, and unpacking gives the ids back, also from a bitmask whose
    bits past ``vocab`` are set (an engine may leave them so). Inputs include empty and full sets and the sign
    bit of a word (token ``32k + 31``)."""
    from book.decode.solutions import pack_bitmask

    gen = np.random.default_rng(5)
    checked_xgr = 0
    for i in range(cases):
        vocab = int(gen.integers(1, 400))
        kind = i % 5
        if kind == 0:
            ids = np.array([], dtype=np.int64)
        elif kind == 1:
            ids = np.arange(vocab)
        elif kind == 2:
            ids = np.array([v for v in range(31, vocab, 32)] or [vocab - 1])  # sign bits
        else:
            ids = np.flatnonzero(gen.random(vocab) < [0.02, 0.3][kind % 2])
        where = f"vocab={vocab}, {len(ids)} allowed"
        got = np.asarray(pack(ids.tolist(), vocab))
        want = pack_bitmask(ids, vocab)
        if got.shape != want.shape or got.dtype != np.int32:
            return report("check_bitmask", False, f"{where}: pack gave {got.dtype} {got.shape}, expected int32 "
                           f"{want.shape}", cases)
        if not np.array_equal(got, want):
            word = int(np.flatnonzero(got != want)[0])
            return report("check_bitmask", False, f"{where}: word {word} is {int(got[word])}, expected "
                           f"{int(want[word])} (tokens {32 * word}..{32 * word + 31})", cases)
        if i % 10 == 0:
            kept = _xgrammar_allows(got, vocab)
            if kept is not None:
                checked_xgr += 1
                if not np.array_equal(kept, ids):
                    return report("check_bitmask", False, f"{where}: xgrammar keeps {len(kept)} ids under this "
                                   "bitmask", cases)
        padded = want.copy()
        if vocab % 32 and i % 3 == 0:
            padded[-1] |= np.int32(-(1 << (vocab % 32)))  # every bit past vocab set
        back = np.asarray(unpack(padded, vocab))
        if back.shape != ids.shape or not np.array_equal(back.astype(np.int64), ids):
            extra = sorted(set(back.tolist()) - set(ids.tolist()))[:5] if back.ndim == 1 else []
            return report("check_bitmask", False, f"{where}{', bits past vocab set' if i % 3 == 0 else ''}: unpack "
                           f"gave {back.size} ids (extra {extra})", cases)
    ok = report("check_bitmask", True, None, cases)
    print(f"  xgrammar's apply_token_bitmask_inplace agreed on {checked_xgr} of them" if checked_xgr
          else "  xgrammar is not installed here: its masking was not compared")
    return ok


# --------------------------------------------------------------------------------------
# 3. Jump forward, cut at max_new_tokens
# --------------------------------------------------------------------------------------

def toy_grammar(seed: int, vocab: int = 12, states: int = 9, eos: int = 0):
    """A random deterministic automaton over token ids (a stand-in for chapter 1's): returns ``allowed(prefix)
    -> sorted list of ids`` (EOS among them where the output may end; only EOS at the end). About half of its
    states allow a single token, so forced chains of several tokens are common."""
    gen = np.random.default_rng(seed)
    table: dict[int, dict[int, int]] = {}
    for s in range(states):
        if s == states - 1:
            table[s] = {eos: s}
            continue
        nxt = lambda: int(gen.integers(s + 1, states))  # noqa: E731 -- forward edges only: every path ends
        if gen.random() < 0.5:
            table[s] = {int(gen.integers(1, vocab)): nxt()}
        else:
            toks = gen.choice(np.arange(1, vocab), size=int(gen.integers(2, 5)), replace=False)
            table[s] = {int(t): nxt() for t in toks}
            if gen.random() < 0.3:
                table[s][eos] = states - 1

    def allowed(prefix: Sequence[int]) -> list[int]:
        s = 0
        for t in prefix:
            s = table[s][t]
        return sorted(table[s])

    return allowed


def _plain_decode(allowed, model, max_new_tokens: int, eos: int) -> list[int]:
    """The loop without jumps: one model call per token, EOS ends it (and is not written)."""
    out: list[int] = []
    while len(out) < max_new_tokens:
        tok = model(tuple(out), allowed(out))
        if tok == eos:
            break
        out.append(tok)
    return out


@guarded
def check_jump_decode(fn: Callable[..., list[int]], cases: int = 120) -> bool:
    """``fn(allowed, model, max_new_tokens, eos) -> tokens``: ``allowed(prefix)`` lists the ids the grammar
    allows after ``prefix`` (a list of ids), ``model(prefix, allowed_ids)`` is one forward: it returns the
    token the model picks (EOS included where allowed). Checked on random automata and every cap from 1 to past
    the output's end: the tokens equal the loop without jumps, the model is never called where a single token
    is allowed, and it is called no more often than the chapter's loop calls it."""
    from book.decode.solutions import jump_decode

    for case in range(cases):
        seed = case // 4
        allowed = toy_grammar(seed)
        gen = np.random.default_rng(1000 + case)
        prefs = gen.permutation(12)

        def model(prefix, options):
            return int(min(options, key=lambda t: (prefs[t] + len(prefix) * 7) % 12))

        full = _plain_decode(allowed, model, 64, 0)
        for cap in range(1, len(full) + 3):
            want = _plain_decode(allowed, model, cap, 0)
            calls: list[tuple] = []

            def counted(prefix, options):
                calls.append((tuple(prefix), tuple(options)))
                return model(prefix, options)

            got = list(fn(allowed, counted, cap, 0))
            where = f"automaton {seed}, max_new_tokens={cap}"
            if got != want:
                return report("check_jump_decode", False, f"{where}: wrote {got}, the loop without jumps writes "
                               f"{want}", cases)
            forced = [c for c in calls if len(c[1]) == 1]
            if forced:
                return report("check_jump_decode", False, f"{where}: the model was called after {list(forced[0][0])}"
                               f", where only {forced[0][1][0]} is allowed", cases)
            ref_calls: list[int] = []
            jump_decode(allowed, lambda p, o: ref_calls.append(1) or model(p, o), cap, 0)
            if len(calls) > len(ref_calls):
                return report("check_jump_decode", False, f"{where}: {len(calls)} model calls, where "
                               f"{len(ref_calls)} are enough", cases)
    return report("check_jump_decode", True, None, cases)


# --------------------------------------------------------------------------------------
# 4. A prompt fed to the KV cache in chunks
# --------------------------------------------------------------------------------------

class _Recorder:
    """The model, with each call's chunk length recorded."""

    def __init__(self, model):
        self.model, self.lengths = model, []

    def new_cache(self, batch: int, positions: int):
        return self.model.new_cache(batch, positions)

    def __call__(self, tokens, start, last, cache):
        self.lengths.append(int(tokens.shape[1]))
        return self.model(tokens, start, last, cache)


@guarded
def check_chunked_forward(fn: Callable[..., Tensor], cases: int = 12) -> bool:
    """``fn(model, tokens, chunks, sizes) -> hidden``: ``model`` is a tiny :class:`~studylog.decode.LlamaModel` in
    float64 (call it as ``model(tokens [B, T], start [B], last [B], cache)``, make a cache with
    ``model.new_cache(batch, positions)``), ``tokens [B, T]`` the prompt, ``chunks`` lengths that add up to
    ``T``, ``sizes`` the chunk lengths the model may be called with. Checked against one forward over the whole
    prompt (the hidden state of its last token), up to the rounding of RMSNorm's fp32 step; every call must use
    a length in ``sizes``."""
    from studylog.decode.model import LlamaModel, model_config

    model = LlamaModel(model_config("tiny", vocab_size=300, layers=2), dtype=torch.float64, seed=4)
    gen = torch.Generator().manual_seed(9)
    rng = np.random.default_rng(9)
    sizes = (1, 2, 4, 8)
    for case in range(cases):
        B, T = int(rng.integers(1, 4)), int(rng.integers(2, 20))
        tokens = torch.randint(0, 300, (B, T), generator=gen)
        chunks, left = [], T
        while left:
            n = int(rng.integers(1, min(left, 8) + 1)) if case % 4 else 1  # every fourth: token by token
            chunks.append(n)
            left -= n
        want = model(tokens, torch.zeros(B, dtype=torch.long), torch.full((B,), T - 1), model.new_cache(B, T))
        rec = _Recorder(model)
        got = fn(rec, tokens.clone(), list(chunks), sizes)
        where = f"B={B}, T={T}, chunks={chunks}"
        bad = [n for n in rec.lengths if n not in sizes]
        if bad:
            return report("check_chunked_forward", False, f"{where}: the model was called with a chunk of {bad[0]} "
                           f"tokens, not one of {sizes}", cases)
        if not isinstance(got, Tensor) or got.shape != want.shape:
            return report("check_chunked_forward", False, f"{where}: returned {getattr(got, 'shape', got)!r}, "
                           f"expected a tensor {tuple(want.shape)}", cases)
        err = (got - want).abs().max().item()
        if not err <= 1e-5:  # RMSNorm normalises in fp32, so float64 sums in another order differ at its rounding
            return report("check_chunked_forward", False, f"{where}: largest difference from the whole-prompt "
                           f"forward {err:.2e}", cases)
    return report("check_chunked_forward", True, None, cases)


# --------------------------------------------------------------------------------------
# 5. Change the kernel: the one-token product with a tile of your own
# --------------------------------------------------------------------------------------

@guarded
def check_gemv_tile(fn: Callable[[Tensor, Tensor], Tensor], cases: int = 6) -> bool:
    """``fn(x, weight) -> out``: ``x [M, K] @ weight.T`` by :func:`studylog.decode.kernels.gemv_kernel` launched
    with a tile of the reader's own. Checked against a float64 product on small shapes (under Triton's
    interpreter on a CPU; ragged edges of the tile included). On a GPU it is then timed against
    :func:`studylog.decode.kernels.gemv` (the library's tile) on the `1b` shape's four one-token products in bf16,
    each replayed from a CUDA graph (:func:`book.common.gpu_us`)."""
    from studylog.decode import kernels
    from studylog.decode.model import model_config

    torch.manual_seed(7)
    shapes = [(1, 33, 40), (1, 8, 130), (2, 17, 64), (1, 100, 257), (3, 5, 16), (1, 64, 1030)][:cases]
    for M, N, K in shapes:
        x, w = torch.randn(M, K), torch.randn(N, K)
        got = fn(x.clone(), w.clone())
        want = (x.double() @ w.double().T).float()
        if not isinstance(got, Tensor) or got.shape != want.shape:
            return report("check_gemv_tile", False, f"x {M}×{K}, weight {N}×{K}: returned "
                           f"{getattr(got, 'shape', got)!r}, expected a tensor {tuple(want.shape)}", len(shapes))
        err = (got.float() - want).abs().max().item()
        if not err <= 1e-4 * (1 + want.abs().max().item()):
            return report("check_gemv_tile", False, f"x {M}×{K}, weight {N}×{K}: largest difference from "
                           f"x @ weight.T {err:.2e}", len(shapes))
    ok = report("check_gemv_tile", True, None, len(shapes))
    if not torch.cuda.is_available():
        gpu_us(lambda: None)  # says that timing needs a GPU
        return ok
    cfg = model_config("1b")
    h, q, kv = cfg.hidden, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    for name, (N, K) in {"q/k/v": (q + 2 * kv, h), "o": (h, q), "gate/up": (2 * cfg.intermediate, h),
                         "down": (h, cfg.intermediate)}.items():
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        yours, library = gpu_us(lambda: fn(x, w)), gpu_us(lambda: kernels.gemv(x, w))
        print(f"  {name:7} {N:>6} × {K:<5}: yours {yours:6.1f} µs, the library's tile {library:6.1f} µs "
              f"({library / yours:.2f}× yours)")
    return ok
