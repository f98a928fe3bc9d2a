"""The tail of each chapter's final kernel at its headline shape: ``python -m studylog bench tails [--out DIR]``.

Each case times the call the chapter's headline row times, built as its benchmark builds it, on the clock of
:meth:`BenchRun.graph_time`; :data:`NOTE` says what a sample is (``p99_ms`` is not the tail of single calls).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from functools import partial
from typing import Any, Callable

import numpy as np
import torch

REPETITIONS, REPLAYS, MIN_CALLS = 3, 100, 60
NOTE = ("Each row: the chapter's final entry point at its headline case; REPETITIONS x REPLAYS samples, each one CUDA "
        "graph replay's time per call over at least 60 back-to-back calls (rotated copies of the large input, a "
        "256 MB memset before each replay); ms = p50_ms = their median, p99_ms their 99th percentile (linear "
        "interpolation): the tail of repeated measurements, not of single calls. The 'ctc_loss' rows time, in every "
        "repetition, the targets chapter 4's benchmark draws at that case (target_lengths). The 'ctc recursion chain "
        "(latency floor)' rows time a kernel that runs only chapter 4's dependent frames at T = 150, A = 28, N = 1 "
        "(one kernel, no inputs: the same call 60 times a graph); the \"headline's longest target\" row, the same "
        "chain over T frames at the states of the longest target chapter 4's benchmark times at T = 150, A = 5000, "
        "N = 8.")


def percentile(samples: list[float], q: float) -> float:
    """The ``q``-th percentile (0 to 100) of ``samples``, linear between the order statistics (numpy's default)."""
    if not samples or not 0 <= q <= 100:
        raise ValueError(f"percentile needs samples and 0 <= q <= 100, got {len(samples)} samples, q = {q}")
    return float(np.percentile(samples, q))


# -- the inputs, as each chapter's benchmark builds them (sizes are arguments, so a CPU test builds small ones) --

def masked_head_inputs(vocab: int, hidden: int, allowed: int, *, seed: int, device="cuda"):
    """Chapter 2: the [V, D] bf16 head, one bf16 hidden state, ``allowed`` random ids as AllowedTokens and their
    packed int32 bitmask on the host."""
    from studylog.masked_lm_head import AllowedTokens, pack_bitmask
    from studylog.masked_lm_head.masks import random_sets

    torch.manual_seed(seed)
    weight = (torch.randn(vocab, hidden, device=device) * 0.02).to(torch.bfloat16)
    h = torch.randn(1, hidden, device=device).to(torch.bfloat16)
    tokens = AllowedTokens.from_ids(random_sets(allowed, vocab, 1, np.random.default_rng(seed)), vocab, device=device)
    return weight, h, tokens, pack_bitmask(tokens.mask.cpu())


def ctc_inputs(T: int, N: int, A: int, *, seed: int, device="cuda"):
    """Chapter 4: float32 activations (T, N, A) and the blog post's random targets, prepared on ``device``."""
    from studylog.ctc.report import prepared_batch, random_targets

    gen = torch.Generator().manual_seed(seed)
    lists = random_targets(T, N, A, gen)
    return torch.randn((T, N, A), generator=gen).to(device), prepared_batch(lists, T, A, device)


def ternary_inputs(n: int, k: int, m: int, *, seed: int, fmt: str = "2bit_tiles", device="cuda"):
    """Chapter 5: bf16 x (m, k), the absmean-quantised randn(n, k) packed as ``fmt``, and its scale."""
    from studylog.ternary import PackedTernary, quantize_absmean

    torch.manual_seed(seed)
    w, scale = quantize_absmean(torch.randn(n, k, device=device))
    return torch.randn(m, k, device=device, dtype=torch.bfloat16), PackedTernary.pack(w, fmt), float(scale)


# -- the calls of one repetition: (graph-safe calls over rotated copies, what the row adds) ---------------

def _masked_head(run, rep: int):
    from studylog.masked_lm_head import HIDDEN, VOCAB, MaskedHeadPlan, dispatch_rule
    from studylog.masked_lm_head.report import HeadCopies

    weight, h, tokens, bitmask = masked_head_inputs(VOCAB, HIDDEN, 1000, seed=rep)
    bitmask, count = bitmask.pin_memory(), tokens.union_count
    plan = MaskedHeadPlan(weight, 1, rule=dispatch_rule())
    plan.h.copy_(h)
    # the rows a call reads, as the chapter's benchmark counts them: every row on the dense bucket, else the allowed
    row_bytes = weight.shape[1] * weight.element_size()
    nbytes = weight.shape[0] * row_bytes if plan.bucket(count)[0] == "dense" else count * row_bytes
    heads = HeadCopies(run)
    n, capped = heads.count(weight, nbytes)
    plans = [plan] + [MaskedHeadPlan(w, 1, h=plan.h, rule=plan.rule) for w in heads.of(weight, n)[1:]]

    def step(p):  # the chapter's step 13 (step13_plan): the bitmask copied in, then the plan's kernels
        p.bitmask.copy_(bitmask, non_blocking=True)
        return p.launch(count)
    return ([lambda p=p: step(p) for p in plans],
            {"bucket": " ".join(map(str, plan.bucket(count))), "read_bytes": nbytes, "rotation_capped": capped})


def _ngram(run, rep: int, *, batch: int, seq_len: int, threshold: int):
    from studylog.ngram import NgramConfig
    from studylog.ngram.kernels import final_step
    from studylog.ngram.report import MAX_COPIES, grid_batch, rotated_matchers, series_of

    inputs, drafts, lengths = grid_batch(batch, seq_len)
    config = NgramConfig(threshold=threshold)
    step = final_step(inputs, config)
    return rotated_matchers(run, step, inputs, (drafts, lengths), config, MAX_COPIES)[0](), {"step": series_of(step)}


def ctc_bench_targets(T: int, N: int, A: int) -> list[np.ndarray]:
    """The targets chapter 4's benchmark times at (T, N, A): its seeded generator replayed over the grid's points
    before this one (targets, then activations), as the benchmark draws them."""
    from studylog.ctc.report import BENCH_SEED, grids, random_targets

    gen = torch.Generator().manual_seed(BENCH_SEED)
    for a, n in grids(False)["main"]:
        lists = random_targets(T, n, a, gen)
        if (a, n) == (A, N):
            return lists
        torch.randn((T, n, a), generator=gen)
    raise ValueError(f"(A, N) = ({A}, {N}) is not a point of chapter 4's benchmark grid")


def _ctc(run, rep: int, *, T: int, N: int, A: int):
    """Chapter 4's entry point at (T, N, A) on the targets its benchmark times there, in every repetition (the time
    depends on their lengths), over as many copies of the activations as its benchmark rotates."""
    from studylog.ctc import ctc_loss
    from studylog.ctc.fused import final_step
    from studylog.ctc.report import copies, prepared_batch

    lists = ctc_bench_targets(T, N, A)
    x = torch.randn((T, N, A), generator=torch.Generator().manual_seed(rep)).to("cuda")
    targets = prepared_batch(lists, T, A, x.device)

    def call(xi):
        loss, grad = torch.empty(xi.shape[1], device=xi.device), torch.empty_like(xi)
        return lambda: ctc_loss(xi, targets, out_loss=loss, out_grad=grad)
    n = copies(run.device.get("l2_cache_bytes") or 64 * 2**20, x.numel() * 4)
    return ([call(torch.randn_like(x)) for _ in range(n)],
            {"step": f"step{final_step(*x.shape, targets.max_positions):02d}", "targets": "the chapter's",
             "target_lengths": [len(l) for l in lists]})


#: Chapter 2's step starts with the bitmask's copy from pinned host memory: the first link of its latency floor.
BITMASK_COPY_SERIES = "bitmask copy from host (latency floor)"


def _bitmask_copy(run, rep: int):
    from studylog.masked_lm_head import HIDDEN, VOCAB

    _, _, _, bitmask = masked_head_inputs(VOCAB, HIDDEN, 1000, seed=rep)
    host, device = bitmask.pin_memory(), torch.empty_like(bitmask, device="cuda")
    return [lambda: device.copy_(host, non_blocking=True)], {"floor": "latency", "bytes": host.numel() * 4}


#: SmolLM2-135M's shape: one forward's kernels are counted on random weights (the count depends only on the shape).
SMOLLM2_SHAPE = {"vocab_size": 49152, "hidden": 576, "layers": 30, "heads": 9, "kv_heads": 3, "intermediate": 1536,
                 "rope_theta": 100000.0, "tie_embeddings": True}
FORWARD_SERIES = "smollm2 forward, one token (kernels counted)"


def _smollm2_decoder():
    from studylog.decode.loop import Decoder
    from studylog.decode.model import CL100K_PADDED, LlamaModel, ModelConfig

    # the decoder pairs a model with the cl100k vocabulary; the body, all that is timed here, does not read the head
    shape = SMOLLM2_SHAPE | {"vocab_size": CL100K_PADDED}
    model = LlamaModel(ModelConfig("smollm2", **shape), device="cuda", dtype=torch.bfloat16, seed=0)
    return Decoder(model, batch=1, max_seq=64)


def _smollm2_forward(run, rep: int):
    """Chapter 08's verifying forward at one token (its kernels are counted after every timing: a process that has
    profiled stays slower)."""
    return [_smollm2_decoder().body_call(1)], {"floor": "latency"}


def count_forward_kernels(run) -> None:
    """Adds ``kernels_per_forward`` to the SmolLM2 forward's row: the kernels one call launches (torch's profiler)."""
    from studylog.decode.report import count_kernels

    if rows := [row for row in run.rows if row["series"] == FORWARD_SERIES]:
        n = sum(count_kernels(_smollm2_decoder().body_call(1)).values())
        for row in rows:
            row.update(kernels_per_forward=n, kernels_per_layer=n / SMOLLM2_SHAPE["layers"])


#: Chapter 4's latency-bound case (small alphabet, one utterance): its benchmark grid's first point.
CTC_FLOOR_CASE = {"T": 150, "N": 1, "A": 28}
#: Chapter 4's headline case (its largest alphabet at batch 8).
CTC_HEADLINE_CASE = {"T": 150, "N": 8, "A": 5000}
CTC_FLOOR_SERIES = "ctc recursion chain (latency floor)"
#: The same chain over T frames at the headline case's longest target: the headline's own latency floor.
CTC_HEADLINE_FLOOR_SERIES = "ctc recursion chain, headline's longest target (latency floor)"


def ctc_headline_states(T: int = 150, N: int = 8, A: int = 5000) -> int:
    """S = 2L + 1 of the longest target chapter 4's benchmark times at (T, N, A): 279 at its headline case."""
    return 2 * max(map(len, ctc_bench_targets(T, N, A))) + 1


def ctc_floor_states(T: int = 150, A: int = 28) -> int:
    """S = 2L + 1 of the one utterance chapter 4's benchmark times at N = 1: 127 at T = 150, A = 28."""
    return ctc_headline_states(T, 1, A)


def _ctc_chain(run, rep: int, *, frames: int, states: int, device="cuda"):
    """The calls of the latency floor: ``chain_floor(frames, states)`` into one output (no input to rotate)."""
    from studylog.ctc.floor import chain_floor, chain_threads

    out = torch.empty((states,), dtype=torch.float32, device=device)
    return ([lambda: chain_floor(frames, states, device=device, out=out)],
            {"floor": "latency", "threads": chain_threads(states)})


def _ternary(run, rep: int, *, entry: str, n: int, k: int, fmt: str = "2bit_tiles"):
    """Chapter 5 at one row of x through ``entry``, on weights packed as ``fmt``."""
    from studylog import ternary

    call = getattr(ternary, entry)
    x, w, scale = ternary_inputs(n, k, 1, seed=rep, fmt=fmt)
    return [lambda wi=wi: call(x, wi, scale) for wi in run.rotated(w)], {}


def _multi_item(run, rep: int, kv_heads: int | None = None, *, device="cuda"):
    """Chapter 6's mixed batch: a key/value head per query head (step 5), or ``kv_heads`` shared (GQA: step 6)."""
    from studylog.bench import gpu_slug
    from studylog.multi_item import MultiItemBatch, multi_item_attention
    from studylog.multi_item.report import BENCH_HEAD_DIM, BENCH_HEADS, bench_shapes, gqa_shapes, pinned_configs
    from studylog.plotting import load_results

    name, prefixes, items = bench_shapes()[-1]
    kv, series = (BENCH_HEADS, "step05") if kv_heads is None else (kv_heads, "step06")
    if kv_heads is not None:
        name = gqa_shapes()[0][0]
    batch = MultiItemBatch.from_item_lens(prefixes, items, device=device)
    sizes = [h * batch.total_tokens * BENCH_HEAD_DIM for h in (BENCH_HEADS, kv, kv)]
    flat = torch.randn(sum(sizes), dtype=torch.bfloat16, device=device)
    try:  # the tile config the chapter's row ran at: pinned from this GPU's committed results
        config = pinned_configs(load_results("multi_item", gpu=gpu_slug(run.device["name"]))).get((series, name))
    except FileNotFoundError:
        config = None  # autotuned by the first call, before the capture
    scale = 1.0 / math.sqrt(BENCH_HEAD_DIM)

    def call(c):
        q, k, v = (part.view(-1, batch.total_tokens, BENCH_HEAD_DIM) for part in c.split(sizes))
        out = torch.empty_like(q)
        return lambda: multi_item_attention(q, k, v, batch, sm_scale=scale, out=out, config=config)
    return [call(c) for c in run.rotated(flat)], {"config": config}


@dataclasses.dataclass(frozen=True)
class Case:
    chapter: str
    series: str  # the final entry point (chapter 2: the plan that runs the whole step from the bitmask)
    params: dict[str, Any]  # the headline case, as the chapter's JSON names it
    calls: Callable[[Any, int], tuple[list[Callable[[], Any]], dict[str, Any]]]
    role: str = "kernel"  # the chapter's entry point; "baseline": a yardstick (a floor) measured beside it


def cases() -> list[Case]:
    from studylog.multi_item import MultiItemBatch
    from studylog.multi_item.report import BENCH_HEADS, bench_shapes, gqa_shapes
    from studylog.ngram.report import NO_BUDGET

    name, prefixes, items = bench_shapes()[-1]
    tokens = MultiItemBatch.from_item_lens(prefixes, items, device="cpu").total_tokens
    T, states = CTC_FLOOR_CASE["T"], ctc_floor_states(CTC_FLOOR_CASE["T"], CTC_FLOOR_CASE["A"])
    headline_states = ctc_headline_states(**CTC_HEADLINE_CASE)
    head = {"batch": 1, "kind": "random", "allowed": 1000, "layout": "vd"}

    def ternary(entry, family, n, k, **fmt):
        return Case("ternary", entry, {"shape": f"{n}x{k}", "family": family, "n": n, "k": k, "m": 1},
                    partial(_ternary, entry=entry, n=n, k=k, **fmt))
    gqa_name, _, _, gqa_kv = gqa_shapes()[0]
    return [
        Case("masked_lm_head", "MaskedHeadPlan", dict(head), _masked_head),
        Case("masked_lm_head", BITMASK_COPY_SERIES, dict(head), _bitmask_copy, role="baseline"),
        # chapter 03's headline case, its stress case (every active slot searches), then its deployed budget
        *(Case("ngram", "ngram_match", case, partial(_ngram, **case))
          for case in ({"batch": 32, "seq_len": 512, "threshold": 128},
                       {"batch": 512, "seq_len": 16384, "threshold": NO_BUDGET},
                       {"batch": 128, "seq_len": 32768, "threshold": 128})),
        Case("ctc", "ctc_loss", dict(CTC_HEADLINE_CASE), partial(_ctc, **CTC_HEADLINE_CASE)),
        *(Case("ctc", CTC_FLOOR_SERIES, CTC_FLOOR_CASE | {"frames": frames, "states": states},
               partial(_ctc_chain, frames=frames, states=states), role="baseline") for frames in (2 * T, T)),
        Case("ctc", "ctc_loss", dict(CTC_FLOOR_CASE), partial(_ctc, **CTC_FLOOR_CASE)),
        Case("ctc", CTC_HEADLINE_FLOOR_SERIES, CTC_HEADLINE_CASE | {"frames": T, "states": headline_states},
             partial(_ctc_chain, frames=T, states=headline_states), role="baseline"),
        ternary("ternary_matmul", "llama", 4096, 14336),
        ternary("step23_w2a8_fused", "bitnet", 4800, 3200),
        ternary("step14_workspace", "llama", 4096, 14336, fmt="2bit_mma"),
        # part 1's last step at its scoreboard row's case (Llama 3 8B's gate and up projections)
        ternary("step14_workspace", "llama", 14336, 4096, fmt="2bit_mma"),
        Case("multi_item", "multi_item_attention", {"shape": name, "prompts": len(prefixes), "tokens": tokens},
             _multi_item),
        Case("multi_item", "multi_item_attention", {"shape": gqa_name, "prompts": len(prefixes), "tokens": tokens,
             "heads": BENCH_HEADS, "kv_heads": gqa_kv}, partial(_multi_item, kv_heads=gqa_kv)),
        Case("speculate", FORWARD_SERIES, {"model": "smollm2", "batch": 1, "chunk": 1}, _smollm2_forward,
             role="baseline"),
    ]


def bench(run) -> None:  # run: studylog.bench.BenchRun
    """Every case: REPETITIONS x REPLAYS samples of its time per call; one row each, with p50 and p99."""
    for case in run.progress(cases(), "cases"):
        samples, medians = [], []
        for rep in range(REPETITIONS):
            calls, extra = case.calls(run, rep)
            times = run.graph_time(calls, min_calls=MIN_CALLS, reps=REPLAYS, samples=True)
            samples += times
            medians.append(statistics.median(times))
            extra["rotated_copies"] = len(calls)
            del calls
            torch.cuda.empty_cache()
        p50 = percentile(samples, 50)
        run.record(case.series, p50, params=case.params, role=case.role, clock="gpu", chapter=case.chapter,
                   p50_ms=p50, p99_ms=percentile(samples, 99), max_ms=max(samples), samples=len(samples),
                   replays_per_repetition=REPLAYS, repetitions=REPETITIONS, min_calls_per_replay=MIN_CALLS,
                   repetition_medians_ms=medians, **extra)
    count_forward_kernels(run)
    run.note(NOTE.replace("REPETITIONS x REPLAYS", f"{REPETITIONS} x {REPLAYS}"))
