"""The chapter's benchmark (``python -m studylog bench multi_item``, GPU only) and its headline. No timed call
autotunes: each Triton step's tile config is pinned from this GPU's committed results (``config_source``), else
autotuned on the shape first (``STUDYLOG_RETUNE=1``)."""

from __future__ import annotations

import contextlib
import math
import os
from functools import partial
from itertools import accumulate
from typing import Any, Callable

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from studylog import runtime
from studylog.multi_item.config import config_name, config_names
from studylog.multi_item.formats import DEFAULT_RULE, ITEM_KEYS_FROM, RULES, MultiItemBatch, dense_mask, score_items
from studylog.multi_item.peers import (flashinfer_backends, flashinfer_inputs, flashinfer_prefill, flex_mask_mod,
                                       flex_variants)
from studylog.multi_item.plan import MultiItemPlan
from studylog.multi_item.steps import STEPS, attn_fwd_batched, step01_dense_sdpa
from studylog.multi_item.tiles import DEFAULT_ORDER, SCHEDULE_ORDERS, TileStats, planned_key_tiles, tile_stats


STEP04, STEP05, STEP06 = STEPS[3:6]
#: the baselines (PyTorch over the same rule, and the approach the chapter replaces), and the peers (FlexAttention
#: at the best block size of a sweep, FlashInfer's multi-item prefill at its best backend and page size)
SDPA_DENSE, SDPA_CAUSAL = "SDPA, dense mask", "causal SDPA (superset)"
ONE_PASS_PER_ITEM = "one pass per item (SDPA, batched)"
FLEX, FLASHINFER = "FlexAttention", "FlashInfer"
STEP04_PER_PROMPT = f"{STEP04.series}, a launch per prompt"  # what step 5's one launch saves
PLAN = f"{STEP05.series}, MultiItemPlan"  # step 5 with a fixed grid, the layout in device buffers
OTHER_RULE = RULES[1]
STEP05_OTHER_RULE = f"{STEP05.series} ({OTHER_RULE} rule)"  # the other mask rule, same kernel
#: steps 4 and 5 also timed by do_bench, beside the GPU clock (the swing's evidence), and its flush, in the same run
DO_BENCH = {4: f"{STEP04.series} (do_bench)", 5: f"{STEP05.series} (do_bench)"}
FLUSH = "do_bench's L2 flush (256 MB memset)"


def order_series(order: str = DEFAULT_ORDER) -> str:
    return STEP05.series if order == DEFAULT_ORDER else f"{STEP05.series} ({order} order)"


#: every series that is not a step's, and what it is (``CHAPTER.baselines``; its legend label)
BASELINES = {
    **{s: s for s in (SDPA_DENSE, SDPA_CAUSAL, FLEX)}, FLASHINFER: "FlashInfer (its multi-item prefill)",
    ONE_PASS_PER_ITEM: ONE_PASS_PER_ITEM, STEP04_PER_PROMPT: f"{STEP04.name}, a launch per prompt",
    PLAN: f"{STEP05.name} through MultiItemPlan",
    STEP05_OTHER_RULE: f"{STEP05.name}, {OTHER_RULE} rule",
    **{DO_BENCH[n]: f"{s.name}, timed by do_bench" for n, s in ((4, STEP04), (5, STEP05))}, FLUSH: FLUSH,
    **{order_series(o): f"{STEP05.name}, {o} order" for o in SCHEDULE_ORDERS[1:]},
}


def bench_shapes(quick: bool = False) -> list[tuple[str, list[int], list[list[int]]]]:
    """``(name, prefix lengths, item lengths per prompt)``: two prompts of uniform items, a mixed batch of eight."""
    gen = torch.Generator().manual_seed(6)  # fixed: the same mixed batch in every run
    items = [torch.randint(8, 41, (n,), generator=gen).tolist() for n in [24, 96, 16, 48, 128, 32, 64, 40]]
    shapes = [("prefix 2048, 32 items x 32", [2048], [[32] * 32]), ("prefix 512, 128 items x 16", [512], [[16] * 128]),
              ("8 prompts, mixed", [1536, 256, 2048, 768, 384, 1024, 128, 640], items)]
    return [shapes[0], shapes[-1]] if quick else shapes  # quick: a one-prompt shape and the mixed batch


BENCH_HEADS, BENCH_HEAD_DIM, BENCH_DTYPE = 32, 128, torch.bfloat16
GQA_GROUP = 4  # query heads a key/value head serves in the model the chapter cites (Llama 3.1 8B: 32 over 8)
CEILING_MATMUL_N = 8192  # the matmul whose rate is the run's compute ceiling


def gqa_shapes() -> list[tuple[str, list[int], list[list[int]], int]]:
    """The mixed batch with a key/value head per :data:`GQA_GROUP` query heads, ``(name, prefixes, items, kv
    heads)``, in a quick run too (a target's case)."""
    name, prefixes, items = bench_shapes()[-1]
    kv_heads = max(1, BENCH_HEADS // GQA_GROUP)
    return [(f"{name}, {kv_heads} KV heads", prefixes, items, kv_heads)]


def graph_calls_for(ms_per_call: float) -> int:
    """How many calls one graph replay holds: about 8 ms of work, at least 4 calls and at most 60."""
    return int(min(60, max(4, math.ceil(8.0 / max(ms_per_call, 1e-3)))))


def within_bf16(got: Tensor, want: Tensor) -> tuple[int, float]:
    """How many elements of ``got`` miss ``want`` by more than bf16 rounding (NaN included), and the largest miss."""
    err = (got.float() - want).abs()
    return int((~(err <= 1e-2 + 1.6e-2 * want.abs())).sum()), float(err.max())


def pinned_configs(results) -> dict[tuple[str, str], str]:
    """``{(series, shape): config}`` from committed results' rows with a ``config_source``."""
    names = set(config_names())
    return {(r["series"], r["params"]["shape"]): r["config"] for r in results.rows
            if r.get("config_source") and r.get("config") in names and "shape" in r["params"]}


def _naive_inputs(q: Tensor, k: Tensor, v: Tensor, batch: MultiItemBatch, rule: str = DEFAULT_RULE):
    """The one-pass-per-item baseline's inputs: per prompt, right-padded ``[N, H, length, D]`` copies of each
    item's sequence (``prefix item_i``, or ``prefix <d> item_i``), and per item its rows' packed indices."""
    first = ITEM_KEYS_FROM[rule]  # under FlashInfer's rule the delimiter is not part of the item's pass
    inputs, rows = [], []
    for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
        p, lens = batch.prefix_lens[b], batch.item_lens[b]
        if not lens:
            continue
        opens = accumulate((n + 1 for n in lens), initial=start + p)  # the delimiter that opens each item
        item_rows = [torch.arange(d + first, d + n + 1) for d, n in zip(opens, lens)]
        pad = max(map(len, item_rows))  # each item's rows, then the prompt's last token up to the longest
        idx = torch.stack([torch.cat([torch.arange(start, start + p), r, torch.full((pad - len(r),), start + s - 1)])
                           for r in item_rows]).to(q.device)
        inputs.append([x[:, idx].transpose(0, 1).contiguous() for x in (q, k, v)])
        rows.append((b, item_rows))
    return inputs, rows


def _dynamo_limits():
    """Lets torch.compile keep one FlexAttention per (shape, block size) instead of falling back to eager."""
    import torch._dynamo

    config = torch._dynamo.config
    names = ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit")
    return config.patch(**{n: max(getattr(config, n), 64) for n in names if hasattr(config, n)})


def bench(run) -> None:
    """Steps 2 to 6 and step 5's variants against SDPA, one pass per item and the peers, on the GPU clock; every
    output is checked against the float32 reference first."""
    from studylog.bench import gpu_slug
    from studylog.multi_item.peers import flashinfer_module  # looked up when the run starts (a test replaces it)
    from studylog.plotting import load_results

    dev = runtime.device()
    # the compute ceiling in this run: a large bf16 matmul (a long kernel, where do_bench is the GPU's time)
    n = CEILING_MATMUL_N
    a = torch.randn(n, n, dtype=BENCH_DTYPE, device=dev)
    tflops_ceiling = 2 * n**3 / (run.time(lambda: a @ a) * 1e-3) / 1e12
    run.note(f"{BENCH_DTYPE} matmul {n}^3 in this run: {tflops_ceiling:.0f} TFLOP/s; compute floors divide the FLOPs "
             "of the visible (query, key) pairs by it")
    del a
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device=dev)
    run.record(FLUSH, run.gpu_time(lambda: [flush.zero_], min_calls=8, reps=5), params={"what": "ceiling"},
               role="baseline")
    del flush
    run.note("clock: every series is GPU time (CUDA-graph replay, inputs rotated past L2, 3 repetitions); steps 4 "
             "and 5 are also timed by do_bench, beside its 256 MB memset and the host time per call")
    pins = {}
    with contextlib.suppress(FileNotFoundError):  # this GPU's committed results, unless every step re-tunes
        if os.environ.get("STUDYLOG_RETUNE") != "1":
            pins = pinned_configs(load_results("multi_item", gpu=gpu_slug(run.device["name"])))
    run.note("tile configs: " + (f"{len(pins)} (step, shape) configs pinned from this GPU's committed results"
                                 if pins else "autotuned on each shape in this run") +
             " (config_source in each row; STUDYLOG_RETUNE=1 re-tunes)")
    try:
        flashinfer = flashinfer_module()
        run.note(f"FlashInfer: {flashinfer.__name__} {getattr(flashinfer, '__version__', '?')}")
    except ImportError as err:
        flashinfer = None
        run.note(f"FlashInfer not measured: {err}")
    with _dynamo_limits():
        for shape in run.progress(run_shapes(run.quick), "shapes"):
            _bench_shape(run, *shape, tflops_ceiling=tflops_ceiling, pins=pins, flashinfer=flashinfer)
            torch.cuda.empty_cache()


def best_setting(run, peer: str, batch, setups: dict[str, Callable[[], tuple | None]]) -> tuple | None:
    """``setups[name]()`` gives ``(make_calls, ...)``, or ``None`` when the setting fails its check; each setting that
    passes gets one graph timing. The fastest's name, its setup and every timing (``None`` when none passed)."""
    sweep, kept = {}, {}
    for name, setup in setups.items():
        try:
            if (got := setup()) is None:
                continue
            kept[name] = got
            sweep[name] = run.gpu_time(got[0], repeats=1, min_calls=graph_calls_for(1.0), reps=5).median
        except Exception as err:  # a peer's failure costs its rows, not the chapter's run
            run.note(f"{peer} ({name}) on {batch.describe()}: {type(err).__name__}: {err}")
    if not sweep:
        return None
    best = min(sweep, key=sweep.get)
    return best, kept[best], sweep


def bench_flex(run, batch, q, k, v, sm_scale, check, measure, rotated) -> None:
    """FlexAttention at each block size of the sweep, each checked against the float32 reference, the best one
    measured."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    gqa = k.shape[0] != q.shape[0]  # grouped-query attention: FlexAttention's enable_gqa
    total = batch.total_tokens

    def call(qkv, block_mask, options):
        return flex(*(x[None] for x in qkv), block_mask=block_mask, scale=sm_scale, kernel_options=options,
                    enable_gqa=gqa)

    def setup(variant, block, options):
        block_mask = create_block_mask(flex_mask_mod(batch), B=None, H=None, Q_LEN=total, KV_LEN=total,
                                       device=batch.device, BLOCK_SIZE=block)
        if check(f"{FLEX} ({variant})", call((q, k, v), block_mask, options)[0]):
            return rotated(lambda *qkv: lambda: call(qkv, block_mask, options)), block_mask

    best = best_setting(run, FLEX, batch, {v[0]: lambda v=v: setup(*v) for v in flex_variants(run.quick)})
    if best is not None:
        name, (make_calls, block_mask), sweep = best
        measure(FLEX, make_calls, "baseline", block_size=name, sweep_ms=sweep,
                flex_block_density=float((block_mask.to_dense() != 0).float().mean()))  # blocks it computes


def bench_flashinfer(run, module, batch, q, k, v, ours_out, sm_scale, check, measure, rotated, params) -> None:
    """FlashInfer at each (backend, page size), also checked against our output; the best one measured."""
    heads = q.shape[0]
    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=q.device)
    backends = flashinfer_backends(module)  # its default backend, one-token pages, in a quick run
    settings = [(backends[0], 1)] if run.quick else [(b, p) for b in backends for p in (1, 16)]
    settings = {f"{b}, page {p}": (b, p) for b, p in settings}

    def setup(backend, page):
        inputs = flashinfer_inputs(q, k, v, batch, page)
        wrapper = flashinfer_prefill(module, inputs, heads, sm_scale, backend, workspace)
        got = wrapper.run(inputs.q, (inputs.k_cache, inputs.v_cache)).transpose(0, 1)
        ok = check(f"{FLASHINFER} ({backend}, page {page})", got)
        bad, err = within_bf16(got, ours_out.float())
        run.check(f"{FLASHINFER} ({backend}, page {page}) matches {STEP05.name} within bf16 rounding", bad == 0,
                  params=params, max_abs_err=err)
        if not ok:
            return None

        def call(qq, kk, vv):
            x = flashinfer_inputs(qq, kk, vv, batch, page)
            w = flashinfer_prefill(module, x, heads, sm_scale, backend, workspace)
            o = torch.empty_like(x.q)
            return lambda: w.run(x.q, (x.k_cache, x.v_cache), out=o)

        out = torch.empty_like(inputs.q)
        return rotated(call), lambda: wrapper.run(inputs.q, (inputs.k_cache, inputs.v_cache), out=out)

    best = best_setting(run, FLASHINFER, batch, {name: lambda s=s: setup(*s) for name, s in settings.items()})
    if best is not None:
        name, (make_calls, host), sweep = best
        measure(FLASHINFER, make_calls, "peer", host=host, backend=settings[name][0], page_size=settings[name][1],
                sweep_ms=sweep, rule="flashinfer", max_item_len=[int(x) for x in batch.max_item_lens_t.tolist()])


#: step 5's variants on one kernel: (series, its keyword, the value), each checked against its rule's reference
VARIANTS = {**{order_series(o): ("order", o) for o in SCHEDULE_ORDERS[1:]}, STEP05_OTHER_RULE: ("rule", OTHER_RULE)}


def shape_rows(single: bool, gqa: bool, quick: bool) -> list[tuple[str, str, str]]:
    """A shape's rows, ``(series, role, clock)`` in the order measured: steps 2 to 5 on one prompt, else step 5
    (and 6 under grouped-query attention), steps 4 and 5 by do_bench too; step 5's variants and MultiItemPlan (a
    key/value head per query head); step 4 a launch per prompt (several prompts); the baselines and peers. A quick
    run leaves out do_bench, the variants and the one-pass-per-item baseline."""
    rows = []
    for step in STEPS[1:5] if single else (STEP05, STEP06) if gqa else (STEP05,):
        rows.append((step.series, "kernel", "gpu"))
        if step.number in DO_BENCH and not quick:
            rows.append((DO_BENCH[step.number], "kernel", "do_bench"))
    if not quick and not gqa:
        rows += [(series, "kernel", "gpu") for series in (*VARIANTS, PLAN)]
    if not single:
        rows.append((STEP04_PER_PROMPT, "kernel", "gpu"))
    rows += [(SDPA_DENSE, "baseline", "gpu"), (SDPA_CAUSAL, "baseline", "gpu"), (FLEX, "baseline", "gpu")]
    return rows + [(ONE_PASS_PER_ITEM, "baseline", "gpu")] * (not quick) + [(FLASHINFER, "peer", "gpu")]


def run_shapes(quick: bool = False) -> list[tuple[str, list[int], list[list[int]], int]]:
    """The shapes a run measures, ``(name, prefixes, items, kv heads)``."""
    return [(*shape, BENCH_HEADS) for shape in bench_shapes(quick)] + gqa_shapes()


def shape_params(name: str, batch: MultiItemBatch, kv_heads: int) -> dict:
    return {"shape": name, "prompts": batch.batch_size, "tokens": batch.total_tokens,
            **({"heads": BENCH_HEADS, "kv_heads": kv_heads} if kv_heads != BENCH_HEADS else {})}


def declared_rows(quick: bool = False) -> list[dict]:
    """Every row (series, role, clock, params) a run declares: the flush, then each shape's :func:`shape_rows`
    (FlexAttention's and FlashInfer's need a setting that passes its check)."""
    rows = [{"series": FLUSH, "role": "baseline", "clock": "gpu", "params": {"what": "ceiling"}}]
    for name, prefixes, items, kv_heads in run_shapes(quick):
        batch = MultiItemBatch.from_item_lens(prefixes, items, device="cpu")
        rows += [{"series": series, "role": role, "clock": clock, "params": shape_params(name, batch, kv_heads)}
                 for series, role, clock in shape_rows(batch.batch_size == 1, kv_heads != BENCH_HEADS, quick)]
    return rows


def _bench_shape(run, name: str, prefixes: list[int], items: list[list[int]], kv_heads: int, *,
                 tflops_ceiling: float, pins: dict, flashinfer) -> None:
    import torch.nn.functional as F

    dev, quick = runtime.device(), run.quick
    heads, head_dim, dtype = BENCH_HEADS, BENCH_HEAD_DIM, BENCH_DTYPE
    sm_scale = 1.0 / math.sqrt(head_dim)
    batch = MultiItemBatch.from_item_lens(prefixes, items, device=dev)
    T, single = batch.total_tokens, batch.batch_size == 1
    gqa = kv_heads != heads  # grouped-query attention: SDPA's and FlexAttention's enable_gqa
    params = shape_params(name, batch, kv_heads)
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(h, T, head_dim, dtype=dtype, device=dev, generator=gen) for h in (heads, kv_heads, kv_heads))
    nbytes = 2 * (q.numel() + k.numel()) * q.element_size()  # read q, k, v; write out
    useful_flops = 4.0 * tile_stats(batch, 128, 64).visible_pairs * head_dim * heads

    # float32 reference of the default rule, prompt by prompt
    ref = torch.empty(heads, T, head_dim, dtype=torch.float32, device=dev)
    step01_dense_sdpa(q.float(), k.float(), v.float(), batch, sm_scale=sm_scale, out=ref)

    def check(label: str, got: Tensor, want: Tensor = ref) -> bool:
        bad, err = within_bf16(got, want)
        return run.check(f"{label} matches the float32 reference ({DEFAULT_RULE} rule)", bad == 0, params=params,
                         max_abs_err=err, bad_elements=bad)

    def rotated(make_call: Callable) -> Callable[[], list]:
        """``make_call(q, k, v)`` over fresh q, k, v and enough copies of them to exceed L2 together."""
        def calls() -> list:
            qkv = torch.randn((heads + 2 * kv_heads) * T * head_dim, dtype=dtype, device=dev)
            sizes = [heads * T * head_dim, kv_heads * T * head_dim, kv_heads * T * head_dim]
            return [make_call(*(x.view(-1, T, head_dim) for x in c.split(sizes))) for c in run.rotated(qkv)]
        return calls

    def measure(series: str, make_calls: Callable[[], list], role: str, *, host: Callable | None = None,
                stats: TileStats | None = None, **extra: Any) -> dict:
        """The GPU clock (a graph of about 8 ms of calls, three repetitions), the host time of ``host``."""
        probe = make_calls()
        calls = graph_calls_for(run.graph_time(probe, min_calls=len(probe), reps=2))  # a first estimate
        first = [probe]
        timing = run.gpu_time(lambda: first.pop() if first else make_calls(), min_calls=calls, reps=10)
        if stats is not None:
            extra.update(block_m=stats.block_m, block_n=stats.block_n, tiles_total=stats.total,
                         tiles_causal=stats.causal, tiles_needed=stats.needed, tiles_visited=stats.visited,
                         skipped_fraction=stats.skipped_fraction, skipped_vs_causal=stats.skipped_vs_causal)
        return run.record(series, timing, params=params, role=role, floor_ms=run.floor_ms(nbytes),
                          host=run.host_time(host) if host is not None else None, graph_calls=calls,
                          compute_floor_ms=useful_flops / (tflops_ceiling * 1e12) * 1e3,
                          useful_tflops=useful_flops / (timing.median * 1e-3) / 1e12, **extra)

    def ours(function: Callable, **kwargs: Any) -> Callable[[], list]:
        """Calls of one of our steps over rotated inputs, each into its own output."""
        return rotated(lambda qq, kk, vv: partial(function, qq, kk, vv, batch, sm_scale=sm_scale,
                                                  out=torch.empty_like(qq), **kwargs))

    def padded(qq, kk, vv):
        """SDPA's inputs: one prompt as it is, or the batch padded to its longest prompt."""
        if single:
            return qq[None], kk[None], vv[None]
        return [pad_sequence([x[:, a:a + s].transpose(0, 1) for a, s in zip(batch.seq_starts, batch.seq_lens)],
                             batch_first=True).transpose(1, 2).contiguous() for x in (qq, kk, vv)]

    def sdpa_calls(**kwargs):
        return rotated(lambda *qkv: partial(F.scaled_dot_product_attention, *padded(*qkv), scale=sm_scale,
                                            enable_gqa=gqa, **kwargs))

    def passes(inputs):
        """The approach this replaces: a causal pass over each item's own sequence, batched over items."""
        return [F.scaled_dot_product_attention(*x, is_causal=True, scale=sm_scale, enable_gqa=gqa) for x in inputs]

    todo = shape_rows(single, gqa, quick)
    # each step at the config chosen for this shape, step 5 first: a quick run tunes steps 5 and 6 and runs 2 to 4
    # at 5's
    steps = {step.series: step for step in STEPS[1:]}
    chosen: dict[int, tuple[str, str, dict | None]] = {}
    for step in sorted((steps[s] for s, _, _ in todo if s in steps), key=lambda s: s is not STEP05):
        if quick and step not in (STEP05, STEP06) and (step.series, name) not in pins:
            chosen[step.number] = (chosen[5][0], "step 5's (quick run)", None)
        else:
            chosen[step.number] = _choose_config(step, name, pins, q, k, v, batch, sm_scale)
    cfg5, step5_out, mask = chosen[5][0], None, None
    for series, role, clock in todo:
        if role != "kernel" and step5_out is None:  # ours measured: the scores, and the baselines' mask
            # the N x K scores from step 5's output against the float32 reference's
            step5_out = STEP05.function(q, k, v, batch, sm_scale=sm_scale, config=cfg5)
            vocab, labels = 8192, [17, 4242]  # a toy LM head: random weights, logits of order 1
            lm_head = torch.randn(vocab, heads * head_dim, dtype=dtype, device=dev, generator=gen) / 16
            mine = torch.cat(score_items(step5_out.transpose(0, 1).reshape(T, -1), lm_head, labels, batch))
            want = torch.cat(score_items(ref.transpose(0, 1).reshape(T, -1), lm_head.float(), labels, batch))
            err = float((mine - want).abs().max())
            run.check("scores match the float32 reference", err <= 2e-2, params=params, max_abs_err=err,
                      items=int(want.shape[0]), score_range=[float(want.min()), float(want.max())])
            del lm_head
            mask = torch.eye(batch.max_seq_len, dtype=torch.bool, device=dev).repeat(batch.batch_size, 1, 1)  # padding
            for b, s in enumerate(batch.seq_lens):
                mask[b, :s, :s] = dense_mask(batch, b)
            mask = mask[0] if single else mask[:, None]
        if series in steps:
            step = steps[series]
            config, source, tuned = chosen[step.number]
            eager = partial(step.function, q, k, v, batch, sm_scale=sm_scale, config=config)
            out = eager()
            check(step.name, out)
            eager = partial(eager, out=out)  # the public call a user makes, eager, into its output
            stats = None
            if step.number >= 4:  # the steps that skip key tiles: counted, checked against the plan
                _, info = eager(count_tiles=True, return_info=True)
                tokens = info.block_m // (heads // kv_heads if step is STEP06 else 1)  # a query tile's height in tokens
                run.check(f"{step.name} visits the key tiles planned", params=params,
                          passed=info.tile_counts == planned_key_tiles(batch, tokens, info.block_n))
                stats = tile_stats(batch, tokens, info.block_n)
            measure(series, ours(step.function, config=config), role, host=eager if step.number >= 4 else None,
                    stats=stats, config=config, config_source=source, rule=DEFAULT_RULE,
                    **({"autotune_ms": tuned} if tuned else {}), **({"order": DEFAULT_ORDER} if step is STEP05 else {}))
        elif clock == "do_bench":  # the step just measured, by do_bench too, beside the GPU clock (the swing)
            run.record(series, run.time(eager), params=params, role=role, clock=clock, config=config)
        elif series in VARIANTS:  # step 5's kernel and tiles: another program order, or the other mask rule
            kw, want, label = dict([VARIANTS[series]]), ref, BASELINES[series]
            if "rule" in kw:  # checked against its own reference
                want = torch.empty_like(ref)
                step01_dense_sdpa(q.float(), k.float(), v.float(), batch, sm_scale=sm_scale, out=want, **kw)
                label = f"{STEP05.name} under the {OTHER_RULE} rule (against its reference)"
            check(label, STEP05.function(q, k, v, batch, sm_scale=sm_scale, **kw, config=cfg5), want=want)
            measure(series, ours(STEP05.function, **kw, config=cfg5), role, **kw, config=cfg5)
        elif series == PLAN:  # a fixed grid for a capacity, the layout in device buffers
            plan = MultiItemPlan(heads=heads, head_dim=head_dim, dtype=dtype, max_tokens=T,
                                 max_prompts=batch.batch_size, max_width=batch.token_pos.shape[1], config=cfg5,
                                 sm_scale=sm_scale, device=dev)
            plan.set_layout(batch)
            got = torch.empty_like(q)
            check(PLAN, plan.run(q, k, v, got))
            measure(PLAN, rotated(lambda qq, kk, vv: partial(plan.run, qq, kk, vv, torch.empty_like(qq))), role,
                    host=partial(plan.run, q, k, v, got), config=cfg5, programs=plan.programs)
        elif series == STEP04_PER_PROMPT:  # what one launch saves
            def per_prompt_call(qq, kk, vv):
                views = [(MultiItemBatch.from_item_lens([batch.prefix_lens[b]], [batch.item_lens[b]], device=dev),
                          *(x[:, start:start + s] for x in (qq, kk, vv)))
                         for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens))]
                return lambda: [STEP04.function(a, b_, c, sub, sm_scale=sm_scale, config=cfg5)
                                for sub, a, b_, c in views]

            measure(series, rotated(per_prompt_call), role, config=cfg5)
        elif series == SDPA_DENSE:
            if single:
                check("SDPA with the dense mask", F.scaled_dot_product_attention(*padded(q, k, v), attn_mask=mask,
                                                                                  scale=sm_scale, enable_gqa=gqa)[0])
            measure(series, sdpa_calls(attn_mask=mask), role)
        elif series == SDPA_CAUSAL:
            measure(series, sdpa_calls(is_causal=True), role, **({} if single else {"padded_to": batch.max_seq_len}))
        elif series == FLEX:
            bench_flex(run, batch, q, k, v, sm_scale, check, measure, rotated)
        elif series == ONE_PASS_PER_ITEM:
            naive_inputs, naive_rows = _naive_inputs(q, k, v, batch)
            outs = passes(naive_inputs)
            got = torch.cat([outs[j][i, :, batch.prefix_lens[b]:batch.prefix_lens[b] + rows.numel()]
                             for j, (b, item_rows) in enumerate(naive_rows) for i, rows in enumerate(item_rows)], dim=1)
            rows = torch.cat([rows for _, item_rows in naive_rows for rows in item_rows]).to(dev)
            check("one pass per item (rows of each item)", got, want=ref[:, rows])
            del naive_inputs, outs, got
            measure(series, rotated(lambda *qkv: partial(passes, _naive_inputs(*qkv, batch)[0])), role,
                    passes=sum(batch.num_items))
        elif series == FLASHINFER and flashinfer is not None:
            bench_flashinfer(run, flashinfer, batch, q, k, v, step5_out, sm_scale, check, measure, rotated, params)


def _choose_config(step, shape: str, pins: dict, q, k, v, batch, sm_scale) -> tuple[str, str, dict | None]:
    """The tile config a step runs at on this shape: pinned, or autotuned on it (cache cleared first)."""
    pinned = pins.get((step.series, shape))
    if pinned is not None:
        return pinned, "pinned", None
    # the Triton kernel (an Autotuner on the GPU): steps 5 and 6 list theirs as its text at their knob
    kernel = attn_fwd_batched if step in (STEP05, STEP06) else step.source
    if getattr(kernel, "cache", None) is not None:
        kernel.cache.clear()
    _, info = step.function(q, k, v, batch, sm_scale=sm_scale, return_info=True)
    timings = None
    if getattr(kernel, "configs_timings", None):
        timings = {config_name(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages):
                   float(t[0] if isinstance(t, (list, tuple)) else t) for c, t in kernel.configs_timings.items()}
    return info.config, "autotuned", timings


MIXED_SHAPE = "8 prompts, mixed"  # the shape of mixed item lengths (the others have items of one length)
#: the headline rows: (baseline, shape)
HEADLINES = ((FLEX, MIXED_SHAPE), (FLASHINFER, MIXED_SHAPE), (FLASHINFER, "prefix 2048, 32 items x 32"),
             (SDPA_DENSE, "prefix 512, 128 items x 16"), (SDPA_CAUSAL, "prefix 512, 128 items x 16"))


def headline(results) -> list[dict]:
    """The book's headline rows: step 5 against the :data:`HEADLINES` the results hold."""
    from studylog.plotting import headline_row

    rows = []
    for baseline, shape in HEADLINES:
        if len(results.select(baseline, shape=shape)) != 1 or len(results.select(STEP05.series, shape=shape)) != 1:
            continue
        label, row = baseline, results.select(baseline, shape=shape)[0]
        if baseline == FLEX:
            label = f"{FLEX} (best block size: {row['block_size']})"
        elif baseline == FLASHINFER:
            label = f"{FLASHINFER} ({row.get('backend', '?')}, page {row.get('page_size', '?')})"
        case = f"{shape}, bf16, {BENCH_HEADS} heads x {BENCH_HEAD_DIM}"
        rows.append(headline_row(results, STEP05.series, baseline, case,
                                 kernel_label=f"{STEP05.name} (Triton, tile skipping, one launch)",
                                 baseline_label=label, shape=shape))
    return rows
