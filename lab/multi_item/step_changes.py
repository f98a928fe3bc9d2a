"""Steps 4 and 5 of chapter 6 taken apart: one change at a time (not run by the tests or the bench).

Step 4's diff changes two things against step 3: the kernel skips the key tiles no row sees, and the autotuner's
set grows from ``FEW_GPU_CONFIGS`` (step 3's two) to ``GPU_CONFIGS`` (ten, keyed also on ``size_bucket``). To
separate them, steps 3 and 4 run at every config of ``GPU_CONFIGS`` (the public ``config=`` argument of the
library's own steps, so no kernel is copied), each timed on the chapter's GPU clock: "step N with set S" is the
fastest config of S for step N, so step 3 with step 4's set and step 4 with step 3's set come out of one sweep.

Step 5's order changes two things against its one launch in tail-first order, 5a (``order="first_run"``): the heads run in groups whose keys and values
fit in L2 (``head_groups``), and within a group the heaviest query tiles start first. The library's
``SCHEDULE_ORDERS`` hold 5a and the default but neither half alone, so :func:`step05_ordered` launches the library's
step 5 kernel (``attn_fwd_batched``, unchanged, at the same config) over a program table built here with two knobs:
``l2_groups`` (the heads in ``head_groups``' groups, or in one group) and ``heaviest_first`` (a group's query tiles
by decreasing work, or 5a's ``r``-th tile from each prompt's end, prompt after prompt). Both on is exactly the
library's ``work_order(..., "head_groups")``, both off exactly ``"first_run"``; ``check`` asserts both. The order
only decides which programs run side by side: every variant must be bit-identical to step 5.

    PYTHONPATH=$PWD python lab/multi_item/step_changes.py check     # CPU (interpreter) or GPU
    PYTHONPATH=$PWD python lab/multi_item/step_changes.py measure   # GPU -> results/<gpu>/step_changes.json
    PYTHONPATH=$PWD python lab/multi_item/step_changes.py measure --chain   # GPU -> results/<gpu>/step05_chain.json

``measure`` uses the benchmark's inputs (``report.bench_shapes``, bf16, 32 heads x 128, q/k/v rotated past L2 as
``report.bench`` rotates them), its graph size (``report.graph_calls_for``) and its check (the float32 reference of
the default rule, the benchmark's tolerance), at the cases the lesson quotes: step 4's gain over step 3 on
``prefix 2048, 32 items x 32``, step 5's order over 5a on ``8 prompts, mixed``. The library's steps 3, 4, 5a and 5
are timed in the same run as anchors, at the config the benchmark runs them at (pinned from this GPU's committed
results, as the benchmark pins it; autotuned by the library otherwise).

``measure --chain`` times step 5's whole chain on the mixed batch in one run, with both of its anchors: step 4
launched once per prompt (as the benchmark's ``report.STEP04_PER_PROMPT``, at step 5's config), the library's step 5
in tail-first order (5a), the head groups alone (5b) and the library's step 5; the order variants as ``measure``
times them. The lesson's chain table reads that file where it is committed.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Callable

import torch
import triton

from studylog import paths, runtime
from studylog import multi_item as mi
from studylog.bench import BenchRun, gpu_slug
from studylog.multi_item import report
from studylog.multi_item.config import FEW_GPU_CONFIGS, GPU_CONFIGS, config_name, find_config, prune_configs, \
    size_bucket, strides
from studylog.multi_item.formats import DEFAULT_RULE, ITEM_KEYS_FROM, MultiItemBatch
from studylog.multi_item.steps import attn_fwd_batched, launch, no_counts, prepare_launch, tile_heights
from studylog.multi_item.tiles import SCHEDULE_BLOCK_MS, head_groups, query_tile_costs, work_order

STEP = {s.number: s for s in mi.CHAPTER.steps}
#: the shapes the lesson quotes step 4's and step 5's gains on
STEP4_SHAPE = "prefix 2048, 32 items x 32"
STEP5B_SHAPE = report.MIXED_SHAPE


def _names(configs) -> list[str]:
    return [config_name(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in configs]


#: the two autotuning sets of the diff, by config name
CONFIG_SETS = {"FEW_GPU_CONFIGS": _names(FEW_GPU_CONFIGS), "GPU_CONFIGS": _names(GPU_CONFIGS)}
#: step 5's program orders as (l2_groups, heaviest_first): 5a, each change alone, both (the default order, step 5);
#: the labels are the keys the committed results carry in ``params["order"]`` (the lesson's 5b is "head groups only")
ORDER_KNOBS = {"5a (first_run)": (False, False), "head groups only": (True, False),
               "heaviest first only": (False, True), "5b (head_groups)": (True, True)}


# ---------------------------------------------------------------------------------------------
# Step 5 with the order's two changes as knobs
# ---------------------------------------------------------------------------------------------

def ordered_work(batch: MultiItemBatch, heads: int, block_m: int, *, l2_groups: bool, heaviest_first: bool,
                 kv_bytes_per_token: int, rule: str = DEFAULT_RULE) -> torch.Tensor:
    """Rows ``(prompt, query tile, head)`` in launch order: the head groups (``head_groups``' groups, or every head
    in one group) one after another; within a group the query tiles ranked (by decreasing work, or 5a's ``r``-th
    tile from each prompt's end, prompt after prompt), each tile's heads of the group side by side."""
    if heaviest_first:
        costs = query_tile_costs(batch, block_m, rule=rule)
        ranked = [(b, t) for b, t, _ in sorted(costs, key=lambda w: (-w[2], w[0], w[1]))]
    else:
        n_tiles = [-(-s // block_m) for s in batch.seq_lens]
        ranked = [(b, n - 1 - r) for r in range(max(n_tiles)) for b, n in enumerate(n_tiles) if r < n]
    groups = head_groups(batch, heads, kv_bytes_per_token) if l2_groups else [range(heads)]
    return torch.tensor([(b, t, h) for g in groups for b, t in ranked for h in g], dtype=torch.int64)


_TABLES: dict[tuple, tuple] = {}


def ordered_table(batch: MultiItemBatch, heads: int, heights: tuple[int, ...], kv_bytes_per_token: int, rule: str,
                  l2_groups: bool, heaviest_first: bool) -> tuple[torch.Tensor, dict[int, int]]:
    """The program table of :func:`ordered_work` in ``schedule_table``'s layout (a row per tile height of
    ``SCHEDULE_BLOCK_MS``, 8 int32 per entry), on the batch's device; built once per batch and knobs, so a call
    under graph capture only launches."""
    key = (id(batch), heads, heights, kv_bytes_per_token, rule, l2_groups, heaviest_first)
    if key in _TABLES and _TABLES[key][0] is batch:
        return _TABLES[key][1:]
    begins, lens, prefixes = (torch.tensor(x) for x in (batch.seq_starts, batch.seq_lens, batch.prefix_lens))
    rows = {}
    for block_m in heights:
        w = ordered_work(batch, heads, block_m, l2_groups=l2_groups, heaviest_first=heaviest_first,
                         kv_bytes_per_token=kv_bytes_per_token, rule=rule)
        b = w[:, 0]
        rows[block_m] = torch.cat([w, begins[b, None], lens[b, None], prefixes[b, None],
                                   torch.zeros(len(w), 2, dtype=w.dtype)], dim=1)
    table = torch.zeros(len(SCHEDULE_BLOCK_MS), max(len(r) for r in rows.values()), 8, dtype=torch.int32)
    for block_m, r in rows.items():
        table[SCHEDULE_BLOCK_MS.index(block_m), : len(r)] = r.to(torch.int32)
    _TABLES[key] = (batch, table.to(batch.device), {bm: len(r) for bm, r in rows.items()})
    return _TABLES[key][1:]


def step05_ordered(q, k, v, batch: MultiItemBatch, *, l2_groups: bool, heaviest_first: bool,
                   sm_scale: float | None = None, out=None, blocks=None, config: str | None = None,
                   rule: str = DEFAULT_RULE):
    """``step05_batched``'s launch of the library's kernel, over the program table of the two knobs."""
    for name, value in (("l2_groups", l2_groups), ("heaviest_first", heaviest_first)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    qk_scale, out, common = prepare_launch("step05_ordered", q, k, v, batch, sm_scale, out, blocks, rule,
                                           one_prompt=False)
    cfg = find_config(config, blocks)
    heads, _, head_dim = q.shape
    kv_bytes = 2 * head_dim * q.element_size() // common["KV_GROUP"]  # as step05_batched sizes its groups
    table, programs = ordered_table(batch, heads, tuple(sorted(set(tile_heights(cfg, blocks)))), kv_bytes, rule,
                                    l2_groups, heaviest_first)
    grid = lambda meta: (programs[meta["BLOCK_M"]],)  # noqa: E731
    args = [q, k, v, out, table, table.stride(0), batch.token_pos, batch.token_pos.stride(0), no_counts(q.device),
            triton.cdiv(batch.max_seq_len, 16), *strides(q, k, v, out), qk_scale, size_bucket(batch.total_tokens)]
    common.update(SKIP_DELIMITER=ITEM_KEYS_FROM[rule], COUNT_TILES=False, PACK_HEADS=False)
    launch(attn_fwd_batched, grid, args, common, blocks, cfg)
    return out


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------

#: (prefix lengths, items per prompt): sizes no tile divides, an empty prefix, one-token items, an empty prompt
CHECK_BATCHES = [([37], [[5, 1, 19, 3, 8]]), ([0], [[1, 1, 2, 7]]),
                 ([17, 0, 40, 5], [[4, 9, 1], [6, 6], [3], []]), ([70, 3], [[33, 2], [1] * 20])]


def _close(got, want, tol: float) -> bool:
    return not torch.isnan(got).any() and bool(torch.allclose(got.double().cpu(), want.cpu(), rtol=tol, atol=tol))


def check(seed: int = 0) -> int:
    """Every variant against the float64 reference (the chapter's tolerance, 1e-5 in float32) and, for the order
    variants, bit-identical to ``step05_batched`` at the same tiles; the two extreme knob settings equal to the
    library's own orders. Returns the number of failures."""
    dev = runtime.device()
    gpu = runtime.mode() == "gpu"
    gen = torch.Generator().manual_seed(seed)
    failures = 0

    def expect(ok: bool, what: str) -> None:
        nonlocal failures
        if not ok:
            failures += 1
            print("FAILED", what)

    # the knobs at their extremes are the library's orders, on the checks' batches and the benchmark's
    layouts = [(str(p), p, i) for p, i in CHECK_BATCHES] + [(n, p, i) for n, p, i in report.bench_shapes()]
    for name, prefixes, items in layouts:
        batch = MultiItemBatch.from_item_lens(prefixes, items, device="cpu")
        for heads, kv_bytes in ((3, 64), (report.BENCH_HEADS, 2 * report.BENCH_HEAD_DIM * 2)):
            for block_m in SCHEDULE_BLOCK_MS:
                for library_order, knobs in (("first_run", (False, False)), ("head_groups", (True, True))):
                    mine = ordered_work(batch, heads, block_m, l2_groups=knobs[0], heaviest_first=knobs[1],
                                        kv_bytes_per_token=kv_bytes)
                    theirs = work_order(batch, heads, block_m, library_order, kv_bytes)
                    expect(torch.equal(mine, theirs), f"{knobs} is not {library_order}: {name}, {heads} heads, "
                                                      f"BLOCK_M {block_m}")
                programs = {tuple(r) for r in work_order(batch, heads, block_m, "first_run", kv_bytes).tolist()}
                for label, (groups, heaviest) in ORDER_KNOBS.items():
                    w = ordered_work(batch, heads, block_m, l2_groups=groups, heaviest_first=heaviest,
                                     kv_bytes_per_token=kv_bytes).tolist()
                    expect(len(w) == len(programs) and set(map(tuple, w)) == programs,
                           f"{label} is not a permutation of step 5's programs: {name}, BLOCK_M {block_m}")
    print(f"orders: the knobs' extremes equal first_run and head_groups, every order a permutation "
          f"({failures} failures)")

    # the kernels: steps 3 and 4 at every tile shape of the two sets, the order variants at two tile shapes
    shapes = sorted({(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in GPU_CONFIGS}) + [(16, 16), (32, 16)]
    for prefixes, items in CHECK_BATCHES:
        batch = MultiItemBatch.from_item_lens(prefixes, items, device=dev)
        for head_dim in (16, 32):
            q, k, v = (torch.randn(3, batch.total_tokens, head_dim, generator=gen).to(dev) for _ in range(3))
            want = mi.reference_attention(q, k, v, batch)
            if batch.batch_size == 1:
                for number in (3, 4):
                    # on the GPU every config of the sets (blocks, warps, stages); the interpreter takes blocks only
                    for kwargs in ([{"config": n} for n in CONFIG_SETS["GPU_CONFIGS"]] if gpu
                                   else [{"blocks": b} for b in shapes]):
                        got = STEP[number].function(q, k, v, batch, out=torch.full_like(q, math.nan), **kwargs)
                        expect(_close(got, want, 1e-5), f"step {number} {kwargs} {prefixes} {items} d={head_dim}")
            for kwargs in ([{"config": n} for n in CONFIG_SETS["FEW_GPU_CONFIGS"]] if gpu
                           else [{"blocks": (16, 16)}, {"blocks": (32, 16)}]):
                library = mi.step05_batched(q, k, v, batch, **kwargs)
                for label, (groups, heaviest) in ORDER_KNOBS.items():
                    got = step05_ordered(q, k, v, batch, l2_groups=groups, heaviest_first=heaviest,
                                         out=torch.full_like(q, math.nan), **kwargs)
                    expect(_close(got, want, 1e-5) and torch.equal(got, library),
                           f"step 5 {label} {kwargs} {prefixes} {items} d={head_dim}")
    print(f"kernels ({runtime.mode()}): {failures} failures in all")
    return failures


# ---------------------------------------------------------------------------------------------
# measure
# ---------------------------------------------------------------------------------------------

def measure(chain: bool = False) -> str:
    """The sweep of steps 3 and 4 over the configs on step 4's shape, the four orders of step 5 on its shape, and the
    library's steps 3, 4, 5a, 5 beside them; every output checked (float32 reference, the benchmark's tolerance)
    before it is timed. ``chain``: the mixed batch only, with step 4 launched per prompt as its first anchor, written
    to ``step05_chain.json`` (step 5's chain in one run)."""
    from studylog.plotting import load_results

    run = BenchRun("multi_item", command=" ".join(sys.argv))
    try:
        pins = report.pinned_configs(load_results("multi_item", gpu=gpu_slug(run.device["name"])))
    except FileNotFoundError:
        pins = {}
    run.note("variant rows: series 'step_changes', the knobs in params; anchors: the library's steps under their "
             "own series, at the config the benchmark runs them at (config_source)")
    shapes = {name: (p, i) for name, p, i in report.bench_shapes()}
    heads, head_dim, dtype = report.BENCH_HEADS, report.BENCH_HEAD_DIM, report.BENCH_DTYPE
    sm_scale = 1.0 / math.sqrt(head_dim)
    summary: dict[str, Any] = {}
    for shape in run.progress([STEP5B_SHAPE] if chain else [STEP4_SHAPE, STEP5B_SHAPE], "shapes"):
        dev = runtime.device()
        batch = MultiItemBatch.from_item_lens(*shapes[shape], device=dev)
        T = batch.total_tokens
        params = {"shape": shape, "prompts": batch.batch_size, "tokens": T}
        gen = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(heads, T, head_dim, dtype=dtype, device=dev, generator=gen) for _ in range(3))
        nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        ref = torch.empty(heads, T, head_dim, dtype=torch.float32, device=dev)
        mi.step01_dense_sdpa(q.float(), k.float(), v.float(), batch, sm_scale=sm_scale, out=ref)

        def checked(label: str, got, knobs: dict) -> bool:
            err = (got.float() - ref).abs()
            bad = int((err > 1e-2 + 1.6e-2 * ref.abs()).sum()) + int(torch.isnan(got).sum())
            return run.check(f"{label} matches the float32 reference ({DEFAULT_RULE} rule)", bad == 0,
                             params=params | knobs, max_abs_err=float(err.max()), bad_elements=bad)

        def timed(series: str, function: Callable, knobs: dict, **extra: Any) -> float:
            """``function(q, k, v, out)`` on the benchmark's clock over fresh rotated inputs (as report.bench)."""
            def make_calls():
                qkv = torch.randn(3 * heads * T * head_dim, dtype=dtype, device=dev)
                calls = []
                for c in run.rotated(qkv):
                    qq, kk, vv = (x.view(heads, T, head_dim) for x in c.split(heads * T * head_dim))
                    o = torch.empty_like(qq)
                    calls.append(lambda qq=qq, kk=kk, vv=vv, o=o: function(qq, kk, vv, o))
                return calls
            probe = make_calls()
            calls = report.graph_calls_for(run.graph_time(probe, min_calls=len(probe), reps=2))
            first = [probe]
            timing = run.gpu_time(lambda: first.pop() if first else make_calls(), min_calls=calls, reps=10)
            run.record(series, timing, params=params | knobs, role="kernel", floor_ms=run.floor_ms(nbytes),
                       graph_calls=calls, **extra)
            print(f"  {shape} | {series} {knobs}: {timing.median * 1e3:,.1f} us", flush=True)
            return timing.median

        if shape == STEP4_SHAPE:
            sweep: dict[int, dict[str, float]] = {3: {}, 4: {}}
            for number in (3, 4):  # the library's steps as the benchmark runs them
                step = STEP[number]
                config, source = pins.get((step.series, shape)), "pinned"
                if config is None:
                    _, info = step.function(q, k, v, batch, sm_scale=sm_scale, return_info=True)
                    config, source = info.config, "autotuned"
                checked(step.name, step.function(q, k, v, batch, sm_scale=sm_scale, config=config), {})
                timed(step.series, lambda qq, kk, vv, o, f=step.function, c=config:
                      f(qq, kk, vv, batch, sm_scale=sm_scale, out=o, config=c), {}, config=config,
                      config_source=source)
            kept = {id(c) for c in prune_configs(GPU_CONFIGS, {"Q": q, "HEAD_DIM": head_dim})}
            for number in (3, 4):
                step = STEP[number]
                for cfg, name in zip(GPU_CONFIGS, CONFIG_SETS["GPU_CONFIGS"]):
                    if id(cfg) not in kept:  # the autotuner prunes it too (shared memory)
                        continue
                    knobs = {"step": number, "config": name,
                             "in_sets": [s for s, names in CONFIG_SETS.items() if name in names]}
                    ok = checked(f"{step.name} at {name}", step.function(q, k, v, batch, sm_scale=sm_scale,
                                                                         config=name), knobs)
                    ms = timed("step_changes", lambda qq, kk, vv, o, f=step.function, c=name:
                               f(qq, kk, vv, batch, sm_scale=sm_scale, out=o, config=c), knobs,
                               change="autotune set")
                    if ok:
                        sweep[number][name] = ms
            for number in (3, 4):
                for set_name, names in CONFIG_SETS.items():
                    times = {n: sweep[number][n] for n in names if n in sweep[number]}
                    if times:
                        best = min(times, key=times.get)
                        summary[f"step {number} with {set_name}"] = {"config": best, "ms": times[best]}
        else:
            cfg5 = pins.get((STEP[5].series, shape))
            source = "pinned"
            if cfg5 is None:
                _, info = mi.step05_batched(q, k, v, batch, sm_scale=sm_scale, return_info=True)
                cfg5, source = info.config, "autotuned"
            if chain:  # the chain's first anchor: step 4 once per prompt, as the benchmark runs it (report.bench)
                subs = [MultiItemBatch.from_item_lens([batch.prefix_lens[b]], [batch.item_lens[b]], device=dev)
                        for b in range(batch.batch_size)]

                def per_prompt(qq, kk, vv, o=None):  # each prompt's own output, as the benchmark's call leaves it
                    return [STEP[4].function(*(x[:, start:start + n] for x in (qq, kk, vv)), sub, sm_scale=sm_scale,
                                             config=cfg5)
                            for sub, start, n in zip(subs, batch.seq_starts, batch.seq_lens)]

                checked(report.STEP04_PER_PROMPT, torch.cat(per_prompt(q, k, v), dim=1), {})
                timed(report.STEP04_PER_PROMPT, per_prompt, {}, config=cfg5, config_source=source)
            for order in ("first_run", "head_groups"):  # the library's 5a and step 5
                series = report.order_series(order)
                checked(series, mi.step05_batched(q, k, v, batch, sm_scale=sm_scale, order=order, config=cfg5), {})
                timed(series, lambda qq, kk, vv, o, order=order:
                      mi.step05_batched(qq, kk, vv, batch, sm_scale=sm_scale, out=o, order=order, config=cfg5),
                      {}, order=order, config=cfg5, config_source=source)
            library = mi.step05_batched(q, k, v, batch, sm_scale=sm_scale, config=cfg5)
            for label, (groups, heaviest) in ORDER_KNOBS.items():
                knobs = {"order": label, "l2_groups": groups, "heaviest_first": heaviest, "config": cfg5}
                got = step05_ordered(q, k, v, batch, l2_groups=groups, heaviest_first=heaviest, sm_scale=sm_scale,
                                     config=cfg5)
                checked(f"step 5, {label}", got, knobs)
                run.check(f"step 5, {label}: bit-identical to step05_batched", torch.equal(got, library),
                          params=params | knobs)
                summary[f"step 5 {label}"] = {"ms": timed(
                    "step_changes", lambda qq, kk, vv, o, g=groups, h=heaviest:
                    step05_ordered(qq, kk, vv, batch, l2_groups=g, heaviest_first=h, sm_scale=sm_scale, out=o,
                                   config=cfg5), knobs, change="program order"), "config": cfg5}
        del q, k, v, ref
        torch.cuda.empty_cache()
    result = run.to_json()
    result["summary"] = summary
    out = paths.lab_results("multi_item", gpu_slug(run.device["name"])) / ("step05_chain.json" if chain
                                                                          else "step_changes.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    bad = [c for c in run.checks if not c["passed"]]
    for name, row in summary.items():
        print(f"{name}: {row['ms'] * 1e3:,.1f} us ({row['config']})")
    print(f"{len(run.rows)} measurements, {len(run.checks)} checks ({len(bad)} failed) -> {out}")
    return str(out)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "check"
    if what == "check":
        sys.exit(1 if check() else 0)
    elif what == "measure":
        measure(chain="--chain" in sys.argv[2:])
    else:
        sys.exit(f"usage: {sys.argv[0]} check|measure [--chain]")
