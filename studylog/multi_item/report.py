"""The chapter's benchmark (``python -m studylog bench multi_item``, GPU only), its figures and tables drawn
from the committed JSON, and its headline.

Series: a step's is ``CHAPTER.step(n).series`` (``step05``); the baselines and step 5's other program
orders have the descriptive names of :data:`BASELINES`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from studylog import runtime
from studylog.multi_item.config import config_name
from studylog.multi_item.formats import MultiItemBatch, dense_mask, score_items
from studylog.multi_item.steps import STEPS, step01_dense_sdpa
from studylog.multi_item.tiles import DEFAULT_ORDER, SCHEDULE_ORDERS, TileStats, planned_key_tiles, tile_stats


def _step(number: int):
    return next(s for s in STEPS if s.number == number)


STEP04, STEP05 = _step(4), _step(5)
#: the baselines: PyTorch and FlexAttention over the same rule, and the approach the chapter replaces
SDPA_DENSE = "SDPA, dense mask"
SDPA_CAUSAL = "causal SDPA (superset)"
FLEX = "FlexAttention"
ONE_PASS_PER_ITEM = "one pass per item (SDPA, batched)"
#: step 4 launched once per prompt of a batch (what step 5's one launch saves)
STEP04_PER_PROMPT = f"{STEP04.series}, a launch per prompt"


def order_series(order: str = DEFAULT_ORDER) -> str:
    """The series of step 5 in one program order: the step's own series for the default order."""
    return STEP05.series if order == DEFAULT_ORDER else f"{STEP05.series} ({order} order)"


#: every series that is not a step's, and what it is (``CHAPTER.baselines``; its legend label)
BASELINES = {
    SDPA_DENSE: "SDPA, dense mask",
    SDPA_CAUSAL: "causal SDPA (superset)",
    FLEX: "FlexAttention",
    ONE_PASS_PER_ITEM: "one pass per item (SDPA, batched)",
    STEP04_PER_PROMPT: f"{STEP04.name}, a launch per prompt",
    **{order_series(o): f"{STEP05.name}, {o} order" for o in SCHEDULE_ORDERS[1:]},
}


def _label(series: str) -> str:
    """A series' legend label (``CHAPTER.label``): a step's name, or the baseline's description."""
    from studylog import chapter

    return chapter.get("multi_item").label(series)


# ---------------------------------------------------------------------------------------------
# Benchmark (GPU only): python -m studylog bench multi_item
# ---------------------------------------------------------------------------------------------

def bench_shapes(quick: bool = False) -> list[tuple[str, list[int], list[list[int]]]]:
    """The issue's shapes: ``(name, prefix lengths, item lengths per prompt)``."""
    shapes = [("prefix 2048, 32 items x 32", [2048], [[32] * 32]),
              ("prefix 512, 128 items x 16", [512], [[16] * 128])]
    gen = torch.Generator().manual_seed(6)  # fixed: the same mixed batch in every run
    prefixes = [1536, 256, 2048, 768, 384, 1024, 128, 640]
    counts = [24, 96, 16, 48, 128, 32, 64, 40]
    items = [torch.randint(8, 41, (n,), generator=gen).tolist() for n in counts]
    shapes.append(("8 prompts, mixed", prefixes, items))
    return shapes[:1] if quick else shapes


BENCH_HEADS, BENCH_HEAD_DIM, BENCH_DTYPE = 32, 128, torch.bfloat16


def _naive_inputs(q: Tensor, k: Tensor, v: Tensor, batch: MultiItemBatch):
    """For the one-pass-per-item baseline: per prompt, ``[N, H, P + 1 + max item, D]`` copies of
    ``prefix <d> item_i`` (right-padded; causal attention never looks at the padding), and for each item the
    packed indices of its ``<d> item_i`` rows."""
    inputs, rows = [], []
    for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
        p, lens = batch.prefix_lens[b], batch.item_lens[b]
        idx = torch.full((len(lens), p + 1 + max(lens)), start + s - 1, dtype=torch.long)
        cursor = start + p  # the delimiter that opens the item
        item_rows = []
        for i, n in enumerate(lens):
            idx[i, :p] = torch.arange(start, start + p)
            idx[i, p:p + n + 1] = torch.arange(cursor, cursor + n + 1)
            item_rows.append(idx[i, p:p + n + 1].clone())
            cursor += n + 1
        idx = idx.to(q.device)
        inputs.append([x[:, idx].transpose(0, 1).contiguous() for x in (q, k, v)])
        rows.append(item_rows)
    return inputs, rows


def _flex_block_mask(batch: MultiItemBatch):
    """FlexAttention's block mask for the same rule over the packed sequence (plus: same prompt only)."""
    from torch.nn.attention.flex_attention import create_block_mask

    dev, T = batch.device, batch.total_tokens
    prompt_of = torch.repeat_interleave(torch.arange(batch.batch_size, dtype=torch.int32, device=dev),
                                        torch.tensor(batch.seq_lens, device=dev))
    prefix_end = (batch.cu_seqlens[:-1] + batch.prefix_lens_t)[prompt_of]
    item_start = torch.arange(T, dtype=torch.int32, device=dev)
    for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
        p = batch.prefix_lens[b]
        item_start[start + p:start + s] -= batch.token_pos[b, : s - p]

    def multi_item_mask(b, h, q_idx, kv_idx):
        same_prompt = prompt_of[q_idx] == prompt_of[kv_idx]
        return same_prompt & (kv_idx <= q_idx) & ((kv_idx < prefix_end[q_idx]) | (kv_idx >= item_start[q_idx]))

    return create_block_mask(multi_item_mask, B=None, H=None, Q_LEN=T, KV_LEN=T, device=dev)


def bench(run) -> None:
    """Steps 2 to 5 (step 5 in every program order) against SDPA (dense mask), FlexAttention, one pass per
    item and causal SDPA; every output is checked against the float32 dense-mask reference first."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    dev = runtime.device()
    heads, head_dim, dtype = BENCH_HEADS, BENCH_HEAD_DIM, BENCH_DTYPE
    sm_scale = 1.0 / math.sqrt(head_dim)
    rep = 50 if run.quick else 100

    # the compute ceiling in this run: a large bf16 matmul
    n = 8192 if dev.type == "cuda" else 64
    a = torch.randn(n, n, dtype=dtype, device=dev)
    tflops_ceiling = 2 * n**3 / (run.time(lambda: a @ a) * 1e-3) / 1e12
    del a
    run.note(f"{dtype} matmul {n}^3 in this run: {tflops_ceiling:.0f} TFLOP/s; compute floors divide the FLOPs of "
             "the visible (query, key) pairs by it")

    for name, prefixes, items in run.progress(bench_shapes(run.quick), "shapes"):
        batch = MultiItemBatch.from_item_lens(prefixes, items, device=dev)
        T, single = batch.total_tokens, batch.batch_size == 1
        params = {"shape": name, "prompts": batch.batch_size, "tokens": T}
        gen = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(heads, T, head_dim, dtype=dtype, device=dev, generator=gen) for _ in range(3))
        nbytes = 4 * q.numel() * q.element_size()  # read q, k, v; write out
        useful_flops = 4.0 * tile_stats(batch, 128, 64).visible_pairs * head_dim * heads

        # float32 reference built from the dense mask, prompt by prompt
        ref = torch.empty(heads, T, head_dim, dtype=torch.float32, device=dev)
        step01_dense_sdpa(q.float(), k.float(), v.float(), batch, sm_scale=sm_scale, out=ref)

        def check(label: str, got: Tensor, want: Tensor = ref) -> None:
            err = (got.float() - want).abs()
            bad = int((err > 1e-2 + 1.6e-2 * want.abs()).sum()) + int(torch.isnan(got).sum())
            run.check(f"{label} matches the float32 dense-mask reference", bad == 0, params=params,
                      max_abs_err=float(err.max()), bad_elements=bad)

        def record(series: str, ms: float, role: str, stats: TileStats | None = None, **extra: Any) -> None:
            if stats is not None:
                extra.update(block_m=stats.block_m, block_n=stats.block_n, tiles_total=stats.total,
                             tiles_causal=stats.causal, tiles_needed=stats.needed, tiles_visited=stats.visited,
                             skipped_fraction=stats.skipped_fraction, skipped_vs_causal=stats.skipped_vs_causal)
            run.record(series, ms, params=params, role=role, floor_ms=run.floor_ms(nbytes),
                       compute_floor_ms=useful_flops / (tflops_ceiling * 1e12) * 1e3,
                       useful_tflops=useful_flops / (ms * 1e-3) / 1e12, **extra)

        # --- our steps (2 to 4 take one prompt) ---
        for step in STEPS[1:] if single else STEPS[-1:]:
            kernel = step.source  # the Triton kernel (an Autotuner on the GPU)
            tunings_before = len(getattr(kernel, "cache", {}))
            out, info = step.function(q, k, v, batch, sm_scale=sm_scale, return_info=True)  # tunes on first use
            check(step.name, out)
            extra: dict[str, Any] = {"config": info.config, **({"order": DEFAULT_ORDER} if step is STEP05 else {})}
            if len(getattr(kernel, "cache", {})) > tunings_before and getattr(kernel, "configs_timings", None):
                extra["autotune_ms"] = {  # what the tuner measured for each config, on this shape
                    config_name(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages):
                        float(t[0] if isinstance(t, (list, tuple)) else t) for c, t in kernel.configs_timings.items()}
            stats = None
            if step in (STEP04, STEP05):
                _, counted = step.function(q, k, v, batch, sm_scale=sm_scale, count_tiles=True,
                                           blocks=(info.block_m, info.block_n), return_info=True)
                run.check(f"{step.name} visits the key tiles planned", params=params,
                          passed=counted.tile_counts == planned_key_tiles(batch, info.block_m, info.block_n))
                stats = tile_stats(batch, info.block_m, info.block_n)
            ms = run.time(lambda: step.function(q, k, v, batch, sm_scale=sm_scale), rep=rep)
            record(step.series, ms, "kernel", stats, **extra)
        # step 5's other program orders: same kernel, same tiles, only the order the GPU starts programs in
        for order in SCHEDULE_ORDERS[1:]:
            got, info = STEP05.function(q, k, v, batch, sm_scale=sm_scale, order=order, return_info=True)
            check(_label(order_series(order)), got)
            ms = run.time(lambda: STEP05.function(q, k, v, batch, sm_scale=sm_scale, order=order), rep=rep)
            record(order_series(order), ms, "kernel", order=order, config=info.config)
            del got
        if not single:  # step 4 once per prompt, to show what one launch saves
            views = []
            for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
                sub = MultiItemBatch.from_item_lens([batch.prefix_lens[b]], [batch.item_lens[b]], device=dev)
                views.append((sub, *(x[:, start:start + s] for x in (q, k, v))))

            def per_prompt():
                return [STEP04.function(qq, kk, vv, sub, sm_scale=sm_scale) for sub, qq, kk, vv in views]

            per_prompt()
            record(STEP04_PER_PROMPT, run.time(per_prompt, rep=rep), "kernel")

        # --- scores: the N x K matrices from step 5's output against the float32 reference's ---
        vocab, labels = 8192, [17, 4242]  # a toy LM head: random weights, logits of order 1
        lm_head = torch.randn(vocab, heads * head_dim, dtype=dtype, device=dev, generator=gen) / 16
        ours = torch.cat(score_items(out.transpose(0, 1).reshape(T, -1), lm_head, labels, batch))
        want = torch.cat(score_items(ref.transpose(0, 1).reshape(T, -1), lm_head.float(), labels, batch))
        err = float((ours - want).abs().max())
        run.check("scores match the float32 reference", err <= 2e-2, params=params, max_abs_err=err,
                  items=int(want.shape[0]), score_range=[float(want.min()), float(want.max())])
        del out, lm_head

        # --- baselines ---
        # SDPA with the dense boolean mask: one prompt, or the batch padded to its longest prompt
        s_max = batch.max_seq_len
        if single:
            qb, kb, vb = q[None], k[None], v[None]
            mask = dense_mask(batch, 0)
        else:
            qb, kb, vb = (torch.zeros(batch.batch_size, heads, s_max, head_dim, dtype=dtype, device=dev)
                          for _ in range(3))
            mask = torch.eye(s_max, dtype=torch.bool, device=dev).repeat(batch.batch_size, 1, 1)  # padding: itself
            for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
                for dst, src in ((qb, q), (kb, k), (vb, v)):
                    dst[b, :, :s] = src[:, start:start + s]
                mask[b, :s, :s] = dense_mask(batch, b)
            mask = mask[:, None]

        def sdpa_dense():
            return F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=sm_scale)

        got = sdpa_dense()
        if single:
            check("SDPA with the dense mask", got[0])
        record(SDPA_DENSE, run.time(sdpa_dense, rep=rep), "baseline")
        del mask, got

        # plain causal SDPA: its tiles are a superset of the ones needed
        def sdpa_causal():
            return F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=sm_scale)

        sdpa_causal()
        record(SDPA_CAUSAL, run.time(sdpa_causal, rep=rep), "baseline",
               **({} if single else {"padded_to": s_max}))
        del qb, kb, vb

        # FlexAttention over the packed sequence, compiled, with a block mask built from the same rule
        block_mask = _flex_block_mask(batch)

        def run_flex():
            return flex(q[None], k[None], v[None], block_mask=block_mask, scale=sm_scale)

        check(FLEX, run_flex()[0])
        record(FLEX, run.time(run_flex, rep=rep), "baseline",
               flex_block_density=float((block_mask.to_dense() != 0).float().mean()))  # blocks it computes
        del block_mask

        # the approach this replaces: a causal pass over prefix <d> item_i for every item, batched over items
        naive_inputs, naive_rows = _naive_inputs(q, k, v, batch)

        def naive():
            return [F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=sm_scale)
                    for qq, kk, vv in naive_inputs]

        outs = naive()
        got = torch.cat([outs[b][i, :, batch.prefix_lens[b]:batch.prefix_lens[b] + rows.numel()]
                         for b, item_rows in enumerate(naive_rows) for i, rows in enumerate(item_rows)], dim=1)
        rows = torch.cat([rows for item_rows in naive_rows for rows in item_rows]).to(dev)
        check("one pass per item (rows of <d> item_i)", got, want=ref[:, rows])
        record(ONE_PASS_PER_ITEM, run.time(naive, rep=rep), "baseline",
               passes=sum(batch.num_items))
        del naive_inputs, outs, got, q, k, v, ref
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Figures and tables from the committed results
# ---------------------------------------------------------------------------------------------

def approaches() -> list[str]:
    """The series of the ``times`` figure and the notebook's table, baselines first."""
    return [SDPA_DENSE, ONE_PASS_PER_ITEM, FLEX, SDPA_CAUSAL, *(s.series for s in STEPS[1:4]), STEP04_PER_PROMPT,
            STEP05.series]


#: the issue's targets for step 5: at least 4x faster than SDPA with the dense mask, at least 1.3x faster
#: than FlexAttention, within 1.3x of plain causal SDPA
TARGETS = {SDPA_DENSE: 4.0, FLEX: 1.3, SDPA_CAUSAL: 1 / 1.3}


def shape_names(results) -> list[str]:
    """The benchmark's shapes, in the order the results hold them."""
    names: dict[str, None] = {}
    for row in results.rows:
        names.setdefault(row["params"]["shape"], None)
    return list(names)


def target_table(results) -> str:
    """Markdown: step 5 against each baseline on every shape, with the issue's target."""
    lines = [f"| shape | {STEP05.name} (µs) | baseline | baseline (µs) | speedup | target | met |",
             "|---|---|---|---|---|---|---|"]
    for shape in shape_names(results):
        ours = results.ms(STEP05.series, shape=shape)
        for base, target in TARGETS.items():
            rows = results.select(base, shape=shape)
            if not rows:
                continue
            speedup = rows[0]["ms"] / ours
            want = f">= {target:.2f}x" if target >= 1 else f">= {target:.2f}x (within {1 / target:.1f}x)"
            lines.append(f"| {shape} | {ours * 1e3:.1f} | {base} | {rows[0]['ms'] * 1e3:.1f} | {speedup:.2f}x | "
                         f"{want} | {'yes' if speedup >= target else '**no**'} |")
    return "\n".join(lines)


def figures(results) -> dict[str, Any]:
    """``times``: time per approach and shape; ``tiles``: fraction of key tiles never loaded; ``schedule``:
    step 5 in each program order."""
    import matplotlib.pyplot as plt

    shapes = shape_names(results)
    series = [s for s in approaches() if results.select(s)]
    fig_t, ax = plt.subplots(figsize=(10, 4.6))
    width = 0.84 / len(series)
    for j, s in enumerate(series):
        xs, ys = [], []
        for i, shape in enumerate(shapes):
            rows = results.select(s, shape=shape)
            if rows:
                xs.append(i + (j - (len(series) - 1) / 2) * width)
                ys.append(rows[0]["ms"] * 1e3)
        style = {"hatch": "//", "alpha": 0.75} if results.select(s)[0]["role"] == "baseline" else {}
        ax.bar(xs, ys, width=width, label=_label(s), **style)
    for i, shape in enumerate(shapes):
        floors = [r["compute_floor_ms"] for r in results.select(shape=shape) if "compute_floor_ms" in r]
        if floors:
            ax.hlines(floors[0] * 1e3, i - 0.44, i + 0.44, colors="k", linestyles="--", lw=1,
                      label="compute floor (visible pairs at the matmul rate)" if i == 0 else None)
    ax.set_xticks(range(len(shapes)), shapes, fontsize=9)
    ax.set_yscale("log")
    ax.set_ylabel("time (µs, median)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"Multi-item attention, bf16, {BENCH_HEADS} heads x {BENCH_HEAD_DIM}, on {results.gpu}", fontsize=10)

    fig_k, ax = plt.subplots(figsize=(8, 4.2))
    kinds = [("causal attention", lambda r: 1 - r["tiles_causal"] / r["tiles_total"]),
             (f"{STEP04.name}, {STEP05.name}", lambda r: 1 - r["tiles_visited"] / r["tiles_total"]),
             ("best possible at this tiling", lambda r: 1 - r["tiles_needed"] / r["tiles_total"])]
    flex = [r for r in results.select(FLEX) if "flex_block_density" in r]
    if flex:
        kinds.append((f"{FLEX} (its 128 x 128 blocks)", None))
    width = 0.8 / len(kinds)
    for j, (kind, skipped) in enumerate(kinds):
        xs, ys = [], []
        for i, shape in enumerate(shapes):
            if skipped is None:  # FlexAttention's own block mask
                rows = results.select(FLEX, shape=shape)
                value = 1 - rows[0]["flex_block_density"] if rows and "flex_block_density" in rows[0] else None
            else:
                rows = [r for r in results.select(STEP05.series, shape=shape) if "tiles_total" in r]
                value = skipped(rows[0]) if rows else None
            if value is not None:
                xs.append(i + (j - (len(kinds) - 1) / 2) * width)
                ys.append(value)
        bars = ax.bar(xs, ys, width=width, label=kind)
        ax.bar_label(bars, labels=[f"{y:.0%}" for y in ys], fontsize=7)
    ax.set_xticks(range(len(shapes)), shapes, fontsize=9)
    ax.set_ylim(0, 1.0)
    ax.set_ylabel("fraction of key tiles never loaded")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    block = results.select(STEP05.series)[0]
    ax.set_title(f"Tiles skipped ({block.get('block_m')} x {block.get('block_n')} tiles; "
                 f"{_step(2).name} and {_step(3).name} skip none)", fontsize=10)
    return {"times": fig_t, "tiles": fig_k, "schedule": schedule_figure(results)}


def order_table_series() -> list[str]:
    """Step 5 in every program order (the default first), then step 4 launched once per prompt."""
    return [order_series(o) for o in SCHEDULE_ORDERS] + [STEP04_PER_PROMPT]


def schedule_figure(results):
    """Step 5 in each program order against step 4 launched once per prompt, shape by shape."""
    import matplotlib.pyplot as plt

    shapes = shape_names(results)
    labels = {STEP05.series: f"{STEP05.name}, {DEFAULT_ORDER} order (the default)"}
    series = [s for s in order_table_series() if results.select(s)]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.84 / max(len(series), 1)
    for j, s in enumerate(series):
        xs, ys = [], []
        for i, shape in enumerate(shapes):
            rows = results.select(s, shape=shape)
            if rows:
                xs.append(i + (j - (len(series) - 1) / 2) * width)
                ys.append(rows[0]["ms"] * 1e3)
        bars = ax.bar(xs, ys, width=width, label=labels.get(s, _label(s)))
        ax.bar_label(bars, labels=[f"{y:.0f}" for y in ys], fontsize=7)
    ax.set_xticks(range(len(shapes)), shapes, fontsize=9)
    ax.set_ylabel("time (µs, median)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"{STEP05.name}: the same kernel and tiles, programs started in different orders ({results.gpu})",
                 fontsize=10)
    return fig


def headline(results) -> list[dict]:
    """The book's headline rows: step 5 against FlexAttention on the mixed batch and against SDPA with the
    dense mask and causal SDPA on the many-items prompt (whichever of these shapes the results hold)."""
    rows = []
    for baseline, shape in ((FLEX, "8 prompts, mixed"), (SDPA_DENSE, "prefix 512, 128 items x 16"),
                            (SDPA_CAUSAL, "prefix 512, 128 items x 16")):
        base, ours = results.select(baseline, shape=shape), results.select(STEP05.series, shape=shape)
        if base and ours:
            rows.append({"kernel": f"{STEP05.name} (Triton, tile skipping, one launch)", "baseline": baseline,
                         "case": f"{shape}, bf16, {BENCH_HEADS} heads x {BENCH_HEAD_DIM}",
                         "speedup": base[0]["ms"] / ours[0]["ms"]})
    return rows
