"""The chapter's benchmark (``python -m studylog bench masked_lm_head``) and its headline: every series on the GPU
clock, xgrammar's path as a peer, each call replayed on copies of the head (:class:`HeadCopies`) so rows come from
DRAM."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from studylog.masked_lm_head.dispatch import (choose_path, crossover_points, cublas_masked, dense_logits, dispatch_rule,
                                              step_series, win_range)
from studylog.masked_lm_head.formats import (FEW_IDS_MAX, HIDDEN, VOCAB, AllowedTokens, compare_logits, default_tiles,
                                             fp32_gamma, pack_bitmask)
from studylog.masked_lm_head.masks import StructuredSets, clustered_sets, cross_fit_orders, random_sets, structured_sets
from studylog.masked_lm_head.plan import MaskedHeadPlan, step13_plan, xgrammar_peer
from studylog.masked_lm_head.reorder import ReorderedHead, VocabOrder, active_blocks, cluster_order, step11_reordered

IN_SAMPLE = "reordered_in_sample"  # step 11 with an order fitted on every mask, the measured one too (best case)
PLAN = "step13"  # step 13's series: the whole step from the packed bitmask (copy in, union on the device, kernels)
#: The practitioners' path: the bitmask copied in, cuBLAS fp32 logits, xgrammar's apply_token_bitmask_inplace; the
#: same with bf16 logits (its cheapest form; not our output contract).
XGRAMMAR, XGRAMMAR_BF16 = "xgrammar_bitmask", "xgrammar_bitmask_bf16"
BF16_CASES = ((1, 1000), (64, 100), (256, 100))  # (batch, allowed) of random masks with an XGRAMMAR_BF16 row
BATCHES = (1, 4, 8, 64, 256)  # the full run's batches: 4 is in the dispatch's branch for batches 2-7
ROW_STEPS = (4, 5, 6, 7, 8, 9)  # a logit is one program's reduction of a row (error_bound's "row" summation)
#: Step 9 above batch 1 (random masks) up to this batch and this many allowed tokens in all: it reduces each union
#: row once per sequence (batch 64 with 1,000 allowed each: milliseconds a call).
UNION_MAX_BATCH, UNION_MAX_ALLOWED = 64, 64_000
COPY_BUDGET = 48 * 2**30  # the most bytes of a head's copies (itself counted) to rotate among: room on an 80 GB card


def head_bytes(head: Tensor | ReorderedHead) -> int:
    weight = head.weight if isinstance(head, ReorderedHead) else head
    return weight.numel() * weight.element_size()


class HeadCopies:
    """Copies of a head for the GPU clock's rotation, so a call's rows come from DRAM, not the previous call's L2:
    enough that their read bytes exceed four times L2, at most ``budget`` bytes; kept until another head."""

    def __init__(self, run, budget: int = COPY_BUDGET):
        self.run, self.budget = run, budget
        self.head: Tensor | ReorderedHead | None = None
        self.clones: list = []

    def count(self, head: Tensor | ReorderedHead, nbytes: int) -> tuple[int, bool]:
        """(copies, capped): the copies a call reading ``nbytes`` rotates among; whether the budget cut them."""
        wanted = self.run.rotation(nbytes)
        most = max(1, self.budget // head_bytes(head))
        return min(wanted, most), wanted > most

    def of(self, head: Tensor | ReorderedHead, copies: int) -> list:
        """``head`` and ``copies - 1`` clones of it (of its weight, for a :class:`ReorderedHead`)."""
        if self.head is not head:
            self.release()
            self.head = head
        while len(self.clones) < copies - 1:
            self.clones.append(head.clone() if isinstance(head, Tensor)
                               else dataclasses.replace(head, weight=head.weight.clone()))
        return [head] + self.clones[:copies - 1]

    def release(self) -> None:
        self.head, self.clones = None, []


def cases(vocab: int, *, quick: bool, third_kind: str, batches: Sequence[int] = BATCHES) -> list[tuple[int, str, int]]:
    """(batch, mask kind, allowed per sequence) of a run: batch 1 sweeps random masks from 1 to V and a few counts
    of the other kinds; larger batches take counts around the batched targets."""
    cap = lambda counts: sorted({min(c, vocab) for c in counts})  # noqa: E731

    if quick:
        out = [(1, "random", c) for c in cap([1, 1000, 10_000])]
        return out + [(b, "random", 100) for b in batches if b == 64]
    plan = {1: {"random": [1, 8, 100, 1000, 10_000, 40_000, vocab], "clustered": [100, 1000, 10_000],
                third_kind: [8, 100, 1000, 10_000]},
            4: {"random": [10, 1000, 10_000]},
            8: {"random": [10, 1000, 10_000], third_kind: [1000]},
            64: {"random": [10, 100, 1000, 10_000], third_kind: [100, 1000]},
            256: {"random": [10, 100, 1000], third_kind: [100]}}
    return [(b, kind, c) for b in batches for kind, counts in plan.get(b, {"random": [10, 1000]}).items()
            for c in cap(counts)]


def case_rows(batch: int, kind: str, count: int, third_kind: str, few: bool) -> list[tuple[str, str, dict]]:
    """The rows of a case, in the order measured: (series, role, params besides the case's). Torch's paths, the
    steps on the ``[V, D]`` weight (``few``: the union fits step 8's slots), steps 1 and 2 on the post's ``[D, V]``
    too at batch 1's random targets, step 11 with both orders (third kind, batch 1), then the whole step against
    xgrammar's path."""
    random, target = kind == "random", count in (1000, 10_000)
    if batch > 1:
        union = random and batch <= UNION_MAX_BATCH and batch * count <= UNION_MAX_ALLOWED
        steps = ((3, random and target), (9, union), (10, True), (12, True))
    else:
        steps = ((0, random and target), (1, kind != third_kind), (2, random and count >= 100), (3, True),
                 (4, random), (5, random), (6, random), (7, True), (8, few), (12, True))
    vd = {"layout": "vd"}
    rows = [("dense_mask", "baseline", {}), ("index_select", "baseline", {}), ("cublas_fp32_mask", "kernel", vd)]
    rows += [(step_series(n), "kernel", vd) for n, on in steps if on]
    rows += [(step_series(n), "kernel", {"layout": "dv"}) for n in (1, 2) if batch == 1 and random and target]
    if (kind, batch) == (third_kind, 1):
        rows += [(step_series(11), "kernel", vd), (IN_SAMPLE, "kernel", vd)]
    rows += [(PLAN, "kernel", vd), (XGRAMMAR, "peer", {})]
    return rows + [(XGRAMMAR_BF16, "peer", {})] * (random and (batch, count) in BF16_CASES)


def declared_rows(vocab: int, data: StructuredSets, *, quick: bool = False,
                  batches: Sequence[int] = BATCHES) -> list[dict]:
    """Every row (series, role, params) a run over these sets declares: a case of the third kind with no set near
    its count is not run; xgrammar's rows need xgrammar."""
    third_kind = "real" if data.is_real else "grammar"
    out = []
    for batch, kind, count in cases(vocab, quick=quick, third_kind=third_kind, batches=batches):
        union = min(count, vocab)  # random and clustered sets hold exactly that many ids
        if kind == third_kind:
            picked = _pick_structured(data.sets, count, batch, np.random.default_rng(0))
            if picked is None:
                continue
            union = data.sets[picked[0]].size  # what step 8 depends on, at batch 1
        params = {"batch": batch, "kind": kind, "allowed": count}
        out += [{"series": series, "role": role, "params": params | more}
                for series, role, more in case_rows(batch, kind, count, third_kind, union <= FEW_IDS_MAX)]
    return out


def _pick_structured(sets: list[np.ndarray], target: int, batch: int, gen: np.random.Generator) -> list[int] | None:
    """Indices of ``batch`` sets whose size is within a factor 2 of ``target`` (None if none is)."""
    sizes = np.array([s.size for s in sets])
    near = np.flatnonzero((sizes >= target / 2) & (sizes <= target * 2) & (sizes > 0))
    if near.size == 0:
        return None
    if batch == 1:
        return [int(near[np.argmin(np.abs(np.log(sizes[near] / target)))])]
    return [int(i) for i in gen.choice(near, size=batch, replace=True)]


def bench(run) -> None:  # run: studylog.bench.BenchRun
    """The chapter's sweep at the size of the post's head (V = 128,256, D = 3,072, bf16), batches :data:`BATCHES`."""
    run_sweep(run, vocab=VOCAB, hidden=HIDDEN, device="cuda", batches=BATCHES)


def run_sweep(run, *, vocab: int, hidden: int, device: str, batches: Sequence[int],
              structured: StructuredSets | None = None, only: Sequence[tuple[int, str, int]] | None = None,
              peer: Callable | None = None, copy_budget: int = COPY_BUDGET) -> None:
    """The benchmark, sizes as arguments (a CPU test runs it at toy sizes); ``only`` replaces :func:`cases`,
    ``peer`` xgrammar's ``apply_token_bitmask_inplace``."""
    from studylog.masked_lm_head import CHAPTER

    S = {n: step_series(n) for n in range(14)}
    STEP_OF = {S[n]: n for n in range(13)}  # the steps measured as such (step 11 and 13 have rows of their own)
    dtype = torch.bfloat16
    dev = torch.device(device)
    gen = np.random.default_rng(1234)
    torch.manual_seed(1234)
    weight = (torch.randn(vocab, hidden, device=dev) * 0.02).to(dtype)  # PyTorch layout [V, D]
    weight_dv = weight.t().contiguous()  # the post's layout [D, V]
    row_bytes = hidden * weight.element_size()
    whole = head_bytes(weight)
    copies = HeadCopies(run, copy_budget)

    data = structured if structured is not None else structured_sets(vocab)
    third_kind = "real" if data.is_real else "grammar"
    orders, fold = cross_fit_orders(data, vocab)
    in_sample = cluster_order(data.sets, vocab)
    rule = dispatch_rule()
    apply_bitmask, peer_version = (peer, "given") if peer is not None else xgrammar_peer()

    run.note(f"weights: V={vocab}, D={hidden}, {dtype}; third mask kind {third_kind!r}: {data.source}, "
             f"{len(set(data.groups))} grammars. {S[11]} uses a vocabulary order fitted on the other half of the "
             "grammars (two-fold cross-fitting, a schema and its [compact] variant together); "
             f"{IN_SAMPLE} is {S[11]} with an order fitted on every mask, the measured mask included.")
    run.note("Clock: every series is GPU time (CUDA-graph replay, three repetitions, min/median/max kept); "
             "host_ms is the public entry point's host time per call, back to back, out preallocated. The steps "
             f"take AllowedTokens precomputed per FSM state; {PLAN} and {XGRAMMAR} time the whole step from the packed "
             f"int32 bitmask in pinned host memory ({PLAN} on the GPU clock: the copy, then plan.launch, captured in "
             "the benchmark's graph; its host_ms: step13_plan, the copy, then the plan's graph replayed).")
    run.note("Rotation: each GPU-clock row replays its call on exact clones of the head in turn (the output checked "
             "on the first), enough that the bytes one call reads times the copies exceed four times L2 "
             "(BenchRun.rotation). A call reads the union's rows (union x D x 2 bytes, a lower bound for any path) "
             f"or, for a path that computes every logit ({S[0]}, dense_mask, cublas_fp32_mask, the xgrammar paths, "
             f"{S[12]} and {PLAN} on a dense path), the whole head. At most {copy_budget / 2**30:g} GiB of copies "
             f"({max(1, copy_budget // whole)} heads); where that binds, rotation_capped is true (some rows may come "
             f"from L2). Rows keep copies and read_bytes. {PLAN} rotates over one MaskedHeadPlan per copy (h shared), "
             f"{S[11]} over copies of its reordered head, the [D, V] rows over that layout; host_ms uses one copy.")
    run.note("Baselines get their cheapest form: dense_mask = (h @ W.T).masked_fill_(~mask, -inf) in bf16 "
             "(our kernels write fp32); index_select = h @ W.index_select(0, union_ids).T, without scattering "
             "into a [B, V] output; cublas_fp32_mask = torch.mm with fp32 output, then masked_fill. "
             "floor_ms = max((allowed-row bytes + the [B, V] fp32 output's bytes) / copy bandwidth, empty launch).")
    run.note(f"Practitioners' path ({XGRAMMAR}, vLLM's and SGLang's with xgrammar): the bitmask [B, ceil(V/32)] "
             "int32 copied from pinned memory (non_blocking), all logits by cuBLAS (fp32, our contract), then "
             "xgrammar.apply_token_bitmask_inplace (its GPU backend) writes -inf where a bit is 0. "
             f"{XGRAMMAR_BF16}: the same with bf16 logits (not our contract). {PLAN}: the same copy, then "
             "MaskedHeadPlan builds the union's ids and count on the device and runs the bucket's kernels.")
    if apply_bitmask is None:
        run.note(f"xgrammar is not installed here ({peer_version}): {XGRAMMAR} not measured.")
    else:
        run.note(f"xgrammar {peer_version}")
    run.note(f"{S[12]} dispatches by the rule {rule.source}: compacted up to {dict(rule.compact_max_fraction)} "
             f"of V by batch, dense path {dict(rule.dense_path)}, {S[8]} up to {rule.few_max} ids.")
    run.note(f"{S[9]} (each union row reduced against each sequence in turn) is measured above batch 1 on random masks "
             f"up to batch {UNION_MAX_BATCH} and {UNION_MAX_ALLOWED:,} allowed tokens in all (batch x allowed per "
             f"sequence), beside {S[10]}.")

    w64 = weight.double()

    # check and ours read the case being measured: its h, allowed, and float64 logits ref and sum |h_i w_i| scale
    def check(series: str, out: Tensor, params: dict, summation: str) -> None:
        """Against float64, within the fp32 bound of the path's summation."""
        if dev.type == "cuda":
            torch.cuda.synchronize()
        res = compare_logits(out, ref, fp32_gamma(hidden, summation) * scale + 1e-30, allowed.mask)
        run.check(series, res.pop("passed"), params=params | {"series": series}, summation=summation, **res)

    def measure(series: str, fn: Callable[[Any], Any], head, nbytes: int, params: dict, *, floor: float | None = None,
                long: bool = False, prepare: Callable[[list], list] | None = None, **kw):
        """GPU time of ``fn(copy)`` over the head's copies (``prepare`` maps them to ``fn``'s argument; ``long``: a
        call of 100 µs or more), and ``host``'s host time when given."""
        n, capped = copies.count(head, nbytes)

        def make_calls():
            held = copies.of(head, n)
            return [functools.partial(fn, c) for c in (prepare(held) if prepare else held)]

        run.measure(series, make_calls, params=params, floor_ms=floor, min_calls=20 if long else 60,
                    reps=10 if long else 15, copies=n, read_bytes=int(nbytes), rotation_capped=capped, **kw)

    def ours(series: str, fn: Callable[[Any, Tensor | None], Tensor], head, nbytes: int, params: dict,
             summation: str = "dot", **kw) -> None:
        """One of our steps, ``fn(head, out)``: checked on a poisoned output, then timed over the head's copies."""
        check(series, fn(head, torch.full((batch, vocab), float("nan"), device=dev)), params, summation)
        out = torch.empty(batch, vocab, device=dev)
        measure(series, lambda w: fn(w, out), head, nbytes, params, host=lambda: fn(head, out), **kw)

    todo = list(only) if only is not None else cases(vocab, quick=run.quick, third_kind=third_kind, batches=batches)
    for batch in sorted({b for b, _, _ in todo}):
        h = torch.randn(batch, hidden, device=dev).to(dtype)
        ref, scale = h.double() @ w64.t(), h.double().abs() @ w64.abs().t()
        plan = MaskedHeadPlan(weight, batch, rule=rule)
        plan.h.copy_(h)
        logits = torch.empty(batch, vocab, device=dev)
        logits_bf16 = torch.empty(batch, vocab, device=dev, dtype=dtype)
        peer_bitmask = torch.zeros_like(plan.bitmask)

        def plans(heads: list[Tensor]) -> list[MaskedHeadPlan]:
            """One plan per copy of the head, the batch's plan first; each has its own buffers, h is shared."""
            return [plan] + [MaskedHeadPlan(w, batch, h=plan.h, rule=rule) for w in heads[1:]]

        for _, kind, count in run.progress([c for c in todo if c[0] == batch], f"batch {batch}"):
            picked = None
            if kind == "random":
                sets = random_sets(count, vocab, batch, gen)
            elif kind == "clustered":
                sets = clustered_sets(count, vocab, batch, gen)
            else:
                picked = _pick_structured(data.sets, count, batch, gen)
                if picked is None:
                    continue
                sets = [data.sets[i] for i in picked]
            allowed = AllowedTokens.from_ids(sets, vocab, device=dev)
            host_bitmask = pack_bitmask(allowed.mask.cpu())
            if dev.type == "cuda":
                host_bitmask = host_bitmask.pin_memory()
            n_union = allowed.union_count
            union_bytes = n_union * row_bytes  # the [V, D] rows a call that reads only allowed rows reads
            params = {"batch": batch, "kind": kind, "allowed": count}
            extra = {"allowed_actual": float(np.mean(allowed.counts)), "union": n_union}
            # the bytes, or an empty kernel's GPU time (both on the GPU clock, as the rows are)
            floor = max(run.floor_ms(n_union * row_bytes + batch * vocab * 4), run.empty_launch_gpu.median)

            # the whole step from the packed bitmask: ours (step 13, the plan) and the practitioners' path. On the GPU
            # clock, what the plan's graph of the bucket holds, captured in the benchmark's graph (a graph is not
            # replayed inside another's capture); on the host clock, step13_plan itself, which replays that graph
            def plan_step(p: MaskedHeadPlan) -> Tensor:
                p.bitmask.copy_(host_bitmask, non_blocking=True)
                return p.launch(n_union)

            def xgrammar_step(w: Tensor, out: Tensor = logits) -> Tensor:
                peer_bitmask.copy_(host_bitmask, non_blocking=True)
                if out.dtype == torch.float32:
                    dense_logits(h, w, out)
                else:
                    torch.matmul(h, w.t(), out=out)
                apply_bitmask(out, peer_bitmask)
                return out

            disallowed, union = allowed.disallowed, allowed.union_ids
            for series, role, more in case_rows(batch, kind, count, third_kind, allowed.few_ids is not None):
                row = params | more
                n = STEP_OF.get(series)
                if series == "dense_mask":
                    measure(series, lambda w: torch.matmul(h, w.t()).masked_fill_(disallowed, float("-inf")), weight,
                            whole, row, role=role, long=True, **extra)
                elif series == "index_select":
                    measure(series, lambda w: torch.matmul(h, w.index_select(0, union).t()), weight, union_bytes, row,
                            role=role, long=n_union > 20_000, **extra)
                elif series == "cublas_fp32_mask":
                    ours(series, lambda w, out: cublas_masked(h, w, allowed, out=out), weight, whole, row, floor=floor,
                         long=True, **extra)
                elif series in (S[11], IN_SAMPLE):  # step 11: the same set on a reordered vocabulary, built here
                    block = default_tiles(11, batch).block_v
                    # the order fitted on the other fold's grammars, or on every mask
                    order = orders[1 - fold[picked[0]]] if series == S[11] else in_sample
                    on_device = VocabOrder(order.perm.to(dev))
                    permuted = allowed.permuted(on_device)
                    ours(series, lambda head, out: step11_reordered(h, head, permuted, out=out),
                         ReorderedHead.build(weight, on_device), union_bytes, row, floor=floor, long=True,
                         **extra, grammar=data.groups[picked[0]], active_blocks=active_blocks(sets[0], block, order),
                         active_blocks_original=active_blocks(sets[0], block))
                elif n is not None:  # a step (step 0 has no floor: it computes every logit)
                    step = CHAPTER.step(n).function
                    kw = {"floor": floor} if n else {}
                    nbytes = union_bytes if n else whole
                    if n == 12:
                        path = choose_path(batch, vocab, n_union, rule)
                        kw |= {"summation": "row" if path in ("few_ids", "stream") else "dot", "path": path}
                        nbytes = whole if path == "cublas" else union_bytes  # cuBLAS computes every logit
                    elif n in ROW_STEPS:
                        kw["summation"] = "row"
                    on_dv = {"layout": "dv"} if row["layout"] == "dv" else {}  # steps 8 and 12 take no layout
                    ours(series, lambda w, out: step(h, w, allowed, out=out, **on_dv), weight_dv if on_dv else weight,
                         nbytes, row, long=n <= 3 or n == 9, **kw, **extra)
                elif series == PLAN:
                    plan.out.fill_(float("nan"))
                    bucket = plan.bucket(n_union)
                    check(PLAN, plan_step(plan), row, "row" if bucket[0] == "stream" else "dot")
                    measure(PLAN, plan_step, weight, whole if bucket[0] == "dense" else union_bytes, row, prepare=plans,
                            floor=floor, long=bucket[0] == "dense", bucket=f"{bucket[0]} {bucket[1]}",
                            host=lambda: step13_plan(plan, host_bitmask, n_union), **extra)
                elif apply_bitmask is None:  # xgrammar's rows
                    continue
                elif series == XGRAMMAR:
                    logits.fill_(float("nan"))
                    check(XGRAMMAR, xgrammar_step(weight), row, "dot")
                    run.check(f"{XGRAMMAR} and {PLAN} agree", _same_masked(logits, plan.out), params=row)
                    measure(XGRAMMAR, xgrammar_step, weight, whole, row, role=role, long=True,
                            host=lambda: xgrammar_step(weight), **extra)
                else:
                    measure(series, lambda w: xgrammar_step(w, logits_bf16), weight, whole, row, role=role, long=True,
                            host=lambda: xgrammar_step(weight, logits_bf16), **extra)
            copies.release()  # the next case needs its own number of copies

    # where the compacted kernels stop winning: what the next dispatch rule is read from (dispatch.py)
    for (batch, kind), pts in crossover_points(run.rows).items():
        won, first_loss = win_range([(q["union"], q["compact"] <= q["dense"]) for q in pts])
        run.note(f"crossover batch={batch} kind={kind}: the compacted kernel is fastest up to union={won} and "
                 f"slower than the best dense path from union={first_loss} (V={vocab})")


def _same_masked(a: Tensor, b: Tensor) -> bool:
    """Both outputs ``-inf`` at the same places and finite elsewhere."""
    inf = torch.isneginf(a)
    return bool(torch.equal(inf, torch.isneginf(b)) and torch.isfinite(a[~inf]).all() and torch.isfinite(b[~inf]).all())


def headline(results) -> list[dict]:
    """The book's headline rows the file holds: step 13 (the whole step) against xgrammar's path, step 12 (the
    kernel, allowed ids given) against torch."""
    from studylog.masked_lm_head import CHAPTER
    from studylog.plotting import headline_row

    label = CHAPTER.label
    plan_label = "MaskedHeadPlan (step 13: the whole step from the packed bitmask)"
    peer_label = "xgrammar: cuBLAS logits + apply_token_bitmask_inplace"
    s12 = step_series(12)
    # the whole step against xgrammar's path first (the headline, at each batch the landing page gives), then the
    # kernel alone against torch's paths
    points = [(PLAN, XGRAMMAR, b, 1000, f"whole step from the bitmask, batch {b}, 1,000 allowed"
               + (" per sequence" if b > 1 else ""), plan_label, peer_label) for b in (1, 64, 256)]
    points += [(s12, "index_select", 1, 10_000, "batch 1, 10,000 allowed", None, "torch index_select"),
               (s12, "cublas_fp32_mask", 1, 1000, "batch 1, 1,000 of 128,256 tokens allowed", None,
                "cuBLAS fp32 logits + masked_fill"),  # steady, where bf16 dense + mask runs at two speeds
               (s12, "dense_mask", 64, 100, "batch 64, 100 allowed per sequence (each row its own allowed set)", None,
                "torch dense_mask")]
    rows = []
    for kernel, baseline, batch, allowed, case, k_label, b_label in points:
        try:
            rows.append(headline_row(results, kernel, baseline, case, kernel_label=k_label or label(kernel),
                                     baseline_label=b_label, batch=batch, kind="random", allowed=allowed))
        except (KeyError, ValueError):
            continue  # not measured in this file (or on another clock)
    return rows
