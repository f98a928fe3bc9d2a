"""Step 12: one function that picks the path from the batch size and the allowed count (thresholds from the
committed results, else :data:`FALLBACK_RULE`; no device round trip), and the entry point :func:`masked_logits`."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import triton

from studylog.masked_lm_head.compact import EVICTION, NO_IDS, batched_union_kernel, few_ids_kernel, one_wait_kernel
from studylog.masked_lm_head.dense import row_skip_kernel
from studylog.masked_lm_head.formats import (FEW_IDS_MAX, FEW_TILES, VOCAB, AllowedTokens, Hidden, Logits, Tiles,
                                             Weight, check_inputs, default_tiles, dot_dtype, output, stream_tiles,
                                             tile_constexprs)
from studylog.masked_lm_head.launch import FastKernel

#: The dense paths: step 3's kernel, or torch's matmul with fp32 output then ``masked_fill``.
DENSE_PATHS = ("row_skip", "cublas")


@dataclass(frozen=True)
class DispatchRule:
    """The thresholds of :func:`choose_path`, per batch size: ``compact_max_fraction``, the largest union (a
    fraction of V) that takes a compacted kernel; ``dense_path``, the path above it (a batch above 1 never takes
    batch 1's entries: with keys {1, 4}, batch 2 takes key 4's). ``few_max``: batch-1 sets this small take step 8."""

    compact_max_fraction: Mapping[int, float]
    dense_path: Mapping[int, str]
    few_max: int
    source: str

    def __post_init__(self):
        if not self.compact_max_fraction or set(self.compact_max_fraction) != set(self.dense_path):
            raise ValueError("compact_max_fraction and dense_path must name the same batch sizes")
        for path in self.dense_path.values():
            if path not in DENSE_PATHS:
                raise ValueError(f"unknown dense path {path!r}; use one of {DENSE_PATHS}")
        if not 0 <= self.few_max <= FEW_IDS_MAX:
            raise ValueError(f"few_max must be in [0, {FEW_IDS_MAX}], got {self.few_max}")
        object.__setattr__(self, "_limits", {})  # (batch, vocab) -> limits(), filled on first use

    def limits(self, batch: int, vocab: int) -> tuple[int, str]:
        """(the largest union count that takes a compacted kernel, the dense path), kept per (batch, vocab)."""
        got = self._limits.get((batch, vocab))
        if got is None:
            got = self._limits[(batch, vocab)] = (int(_for_batch(self.compact_max_fraction, batch) * vocab),
                                                  _for_batch(self.dense_path, batch))
        return got


#: Without committed results: at batch 1 a compacted kernel never reads more than a dense path; above it, step
#: 10's gathered tiles lose as the union nears V, so the switch is at half of it.
FALLBACK_RULE = DispatchRule({1: 1.0, 2: 0.5}, {1: "row_skip", 2: "row_skip"}, FEW_IDS_MAX,
                             "fallback rule (no committed benchmark results)")


def step_series(number: int) -> str:
    """Step ``number``'s series in the benchmark JSON."""
    from studylog.masked_lm_head import CHAPTER

    return CHAPTER.step(number).series


def rows_by_case(rows: list[dict[str, Any]]) -> dict[tuple[int, str, int], dict[str, dict[str, Any]]]:
    """(batch, mask kind, allowed per sequence) -> series -> row, for the rows on ``[V, D]`` with a mask kind."""
    by_case: dict[tuple[int, str, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        p = r["params"]
        if p.get("layout", "vd") == "vd" and "kind" in p:
            by_case.setdefault((p["batch"], p["kind"], p["allowed"]), {})[r["series"]] = r
    return by_case


def crossover_points(rows: list[dict[str, Any]]) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """(batch, mask kind) -> a point per measured allowed count, by union, in ms on ``[V, D]``: ``compact`` (the
    fastest compacted step), ``dense`` (the faster dense path), ``row_skip``, ``cublas``, ``few``, ``stream``."""
    compact_b1, few, batched, row = (step_series(n) for n in (7, 8, 10, 3))
    out: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for (batch, kind, _), series in rows_by_case([r for r in rows if "union" in r]).items():
        compact = [series[s]["ms"] for s in ((compact_b1, few) if batch == 1 else (batched,)) if s in series]
        dense = [series[s]["ms"] for s in (row, "cublas_fp32_mask") if s in series]
        if not compact or not dense:
            continue
        union = next(r["union"] for r in series.values())
        out.setdefault((batch, kind), []).append({
            "union": union, "compact": min(compact), "dense": min(dense),
            "row_skip": series.get(row, {}).get("ms"), "cublas": series.get("cublas_fp32_mask", {}).get("ms"),
            "few": series.get(few, {}).get("ms"), "stream": series.get(compact_b1, {}).get("ms")})
    return {key: sorted(pts, key=lambda q: q["union"]) for key, pts in sorted(out.items())}


def win_range(points: list[tuple[int, bool]]) -> tuple[int | None, int | None]:
    """(largest union won below the first loss, smallest union lost) of (union, won) points."""
    first_loss = min((u for u, won in points if not won), default=None)
    last_win = max((u for u, won in points if won and (first_loss is None or u < first_loss)), default=None)
    return last_win, first_loss


def rule_from_results(results, vocab: int = VOCAB) -> DispatchRule:
    """The thresholds of one benchmark run, per batch size over its mask kinds: a compacted kernel up to the
    largest union where it was no slower than the best dense path with no loss below; the dense path of smaller
    total time; step 8 likewise against step 7 (all its slots if it never lost)."""
    points = crossover_points(results.rows)
    if not points:
        raise ValueError(f"{results.path} holds no points where both a compacted and a dense path were measured")
    fraction: dict[int, float] = {}
    dense: dict[int, str] = {}
    for batch in sorted({b for b, _ in points}):
        pts = [q for (b, _), qs in points.items() if b == batch for q in qs]
        last_win, first_loss = win_range([(q["union"], q["compact"] <= q["dense"]) for q in pts])
        fraction[batch] = min(1.0, (last_win or 0) / vocab)  # never past what was measured to win
        both = [q for q in pts if q["row_skip"] is not None and q["cublas"] is not None]
        faster_row = (sum(q["row_skip"] for q in both) <= sum(q["cublas"] for q in both) if both
                      else any(q["row_skip"] is not None for q in pts))
        dense[batch] = "row_skip" if faster_row else "cublas"
    few = [(q["union"], q["few"] <= q["stream"]) for (b, _), qs in points.items() if b == 1 for q in qs
           if q["few"] is not None and q["stream"] is not None]
    last_win, first_loss = win_range(few)
    few_max = FEW_IDS_MAX if first_loss is None else min(last_win or 0, FEW_IDS_MAX)
    return DispatchRule(fraction, dense, few_max, f"measured on {results.gpu} on {results.date}")


@functools.lru_cache(maxsize=None)
def dispatch_rule() -> DispatchRule:
    """:func:`masked_logits`'s rule: this GPU's committed results, else any GPU's newest, else :data:`FALLBACK_RULE`."""
    from studylog import plotting
    from studylog.bench import gpu_slug

    for gpu in ([gpu_slug(torch.cuda.get_device_name())] if torch.cuda.is_available() else []) + [None]:
        try:
            return rule_from_results(plotting.load_results("masked_lm_head", gpu=gpu))
        except FileNotFoundError:
            continue
    return FALLBACK_RULE


def _for_batch(table: Mapping[int, Any], batch: int) -> Any:
    """The entry at the largest batch size not above ``batch`` (else the smallest); a batch above 1 never takes
    batch 1's while there are others."""
    keys = sorted(k for k in table if (k > 1) == (batch > 1)) or sorted(table)
    below = [k for k in keys if k <= batch]
    return table[below[-1] if below else keys[0]]


def choose_path(batch: int, vocab: int, union_count: int, rule: DispatchRule | None = None) -> str:
    """The path :func:`step12_dispatch` takes: ``"few_ids"`` (step 8), ``"stream"`` (step 7), ``"batched"``
    (step 10), ``"row_skip"`` (step 3) or ``"cublas"``."""
    rule = rule or dispatch_rule()
    max_union, dense = rule.limits(batch, vocab)
    if union_count > max_union:
        return dense
    return "batched" if batch > 1 else "few_ids" if union_count <= rule.few_max else "stream"


def cublas_masked(h: Hidden, weight: Weight, allowed: AllowedTokens, *, out: Logits | None = None) -> Logits:
    """The dense path through torch: ``h @ W.T`` with fp32 output (cuBLAS on the GPU), then ``masked_fill``."""
    batch, vocab, _ = check_inputs(h, weight, allowed, "vd", out)
    out = output(out, batch, vocab, h.device)
    dense_logits(h, weight, out)
    return out.masked_fill_(allowed.disallowed, float("-inf"))


def dense_logits(h: Hidden, weight: Weight, out: Logits) -> None:
    """``out = h @ weight.T`` in fp32, never rounded to bf16: cuBLAS with fp32 output where torch has that ``mm``,
    else (and on the CPU) the operands widened first (exact, slower)."""
    if h.is_cuda and _MM_FP32_OUT:
        torch.mm(h, weight.t(), out_dtype=torch.float32, out=out)
    else:
        torch.mm(h.float(), weight.float().t(), out=out)


_MM_FP32_OUT = hasattr(torch.ops.aten.mm, "dtype_out")  # torch.mm's out_dtype (torch 2.8 on)
# Step 12's host time is its lesson: steps 3, 7, 8 and 10's kernels through their compiled launchers (launch.py).
_ROW_SKIP, _STREAM, _FEW, _BATCHED = (FastKernel(k) for k in (row_skip_kernel, one_wait_kernel, few_ids_kernel,
                                                               batched_union_kernel))


def launch_constexprs(path: str, t: Tiles, hidden: int, dtype: torch.dtype) -> dict:
    """``path``'s kernel's constexprs and launch options as its step passes them, one dict kept per config."""
    key = (path, id(t), hidden, dtype)
    hit = _LAUNCH_CONSTEXPRS.get(key)
    if hit is None or hit[0] is not t:
        launch = {"num_warps": t.num_warps, "num_stages": t.num_stages}
        if path == "row_skip":  # step 3
            c = tile_constexprs(t, dtype)
        elif path == "batched":  # step 10
            c = {"D": hidden, "BLOCK_B": t.block_b, "BLOCK_V": t.block_v, "BLOCK_D": t.block_d,
                 "FILL_BLOCK": t.fill_block, "DOT_DTYPE": dot_dtype(dtype)} | launch
        else:  # steps 7 and 8
            c = {"D": hidden, "D_POW2": triton.next_power_of_2(hidden), "FILL_BLOCK": t.fill_block,
                 "EVICTION": EVICTION} | ({"BLOCK_V": t.block_v} if path == "stream" else {}) | launch
        hit = _LAUNCH_CONSTEXPRS[key] = (t, c)
    return hit[1]


_LAUNCH_CONSTEXPRS: dict[tuple, tuple] = {}


def step12_dispatch(h: Hidden, weight: Weight, allowed: AllowedTokens, *, out: Logits | None = None,
                    rule: DispatchRule | None = None) -> Logits:
    """Step 12: the fastest path for this batch size and allowed count (:func:`choose_path`). A CUDA graph of a
    call replays only the *same* ``allowed`` (path, grid and ids are fixed at capture): see ``MaskedHeadPlan``."""
    batch, vocab, hidden = check_inputs(h, weight, allowed, "vd", out)
    n = allowed.union_count
    path = choose_path(batch, vocab, n, rule)
    out = output(out, batch, vocab, h.device)
    if path == "few_ids":  # step 8
        t, ids = FEW_TILES, allowed.few_ids
        _FEW(len(ids) + -(-vocab // t.fill_block), (h, weight, out, len(ids), *ids, *NO_IDS[len(ids):], vocab,
                                                    weight.stride(0)), launch_constexprs(path, t, hidden, h.dtype))
    elif path == "stream":  # step 7
        t = stream_tiles(n)
        n_compute = -(-n // t.block_v)
        _STREAM(n_compute + -(-vocab // t.fill_block), (h, weight, out, allowed.mask_u8, allowed.kernel_ids, n, vocab,
                                                        n_compute, weight.stride(0)),
                launch_constexprs(path, t, hidden, h.dtype))
    elif path == "batched":  # step 10
        t = default_tiles(10, batch, n)
        n_compute = -(-n // t.block_v) * -(-batch // t.block_b)
        _BATCHED(n_compute + -(-(batch * vocab) // t.fill_block),
                 (h, weight, out, allowed.mask_u8, allowed.kernel_ids, n, batch, vocab, n_compute, h.stride(0),
                  weight.stride(0), out.stride(0), allowed.mask.stride(0)), launch_constexprs(path, t, hidden, h.dtype))
    elif path == "row_skip":  # step 3
        t = default_tiles(3, batch)
        _ROW_SKIP(-(-batch // t.block_b) * -(-vocab // t.block_v),
                  (h, weight, out, allowed.mask_u8, batch, vocab, hidden, h.stride(0), weight.stride(0),
                   out.stride(0), allowed.mask.stride(0)), launch_constexprs(path, t, hidden, h.dtype))
    else:
        dense_logits(h, weight, out)
        out.masked_fill_(allowed.disallowed, float("-inf"))
    return out


def masked_logits(h: Hidden, weight: Weight, allowed: AllowedTokens, *, out: Logits | None = None) -> Logits:
    """Masked LM head by step 12: fp32 logits where ``allowed``, ``-inf`` elsewhere; ``weight`` is
    ``lm_head.weight``, ``[V, D]``, bf16 or fp16. In a CUDA graph, see ``MaskedHeadPlan``."""
    return step12_dispatch(h, weight, allowed, out=out)
