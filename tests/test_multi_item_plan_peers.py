"""Chapter 6: MultiItemPlan (one launch over changing layouts, in a CUDA graph), the peers' inputs
(FlexAttention's mask, FlashInfer's paged layout) and the benchmark's pure-Python parts; the GPU tests capture
the entry points in a graph and compare FlashInfer's own kernel with ours."""

import math

import pytest
import torch
from test_multi_item import (
    DEV,
    MIXED,
    flashinfer_positions,
    float32_reference,
    poisoned,
    random_layouts,
    random_qkv,
    small_inputs,
)

from book.multi_item import figures, lesson
from studylog import multi_item as mi
from studylog import plotting
from studylog.multi_item import peers, report

# --------------------------------------------------------------------------------------------
# MultiItemPlan: one launch (a fixed grid) over changing layouts
# --------------------------------------------------------------------------------------------

PLAN_LAYOUTS = [([17, 0, 40], [[4, 9, 1], [6, 6], [3]]), ([3, 29], [[1] * 7, [2, 30, 1]]), ([60], [[]]),
                ([0, 5, 2, 9], [[1], [], [2, 2], [5]])]


@pytest.mark.parametrize("rule", mi.RULES)
def test_plan_runs_every_layout_within_its_capacity(rule, rng):
    """One plan, its buffers refilled for each layout; the rows of each batch match the float64 reference,
    the rows past the batch are left as they were."""
    heads, head_dim = 2, 16
    plan = mi.MultiItemPlan(heads=heads, head_dim=head_dim, dtype=torch.float32, max_tokens=100, max_prompts=4,
                            max_width=60, rule=rule, device=DEV)
    programs = plan.programs
    for prefixes, items in PLAN_LAYOUTS:
        batch = mi.MultiItemBatch.from_item_lens(prefixes, items, device=DEV)
        plan.set_layout(batch)
        q, k, v = random_qkv(heads, 100, head_dim, rng)
        out = plan.run(q, k, v, poisoned(q))
        n = batch.total_tokens
        torch.testing.assert_close(out[:, :n].double(), mi.reference_attention(q[:, :n], k[:, :n], v[:, :n], batch,
                                                                               rule=rule), rtol=1e-5, atol=1e-5)
        assert torch.isnan(out[:, n:]).all(), "the plan wrote past the batch's tokens"
        assert plan.programs == programs  # the grid never changes


def test_plan_grid_bounds_every_layout_it_accepts(rng):
    """The fixed grid covers the programs of any layout within the capacity (sum of cdiv(S_b, BLOCK_M) <=
    cdiv(T, BLOCK_M) + B - 1), so no layout it accepts loses a program."""
    for _ in range(30):
        prompts = int(torch.randint(1, 6, (), generator=rng))
        layouts = random_layouts(rng, prompts)[-prompts:]
        batch = mi.MultiItemBatch.from_item_lens([p for p, _ in layouts], [i for _, i in layouts], device="cpu")
        for block_m in mi.tiles.SCHEDULE_BLOCK_MS:
            _, programs = mi.tiles.schedule_table(batch, 3, "head_groups", (block_m,))
            bound = 3 * (-(-batch.total_tokens // block_m) + batch.batch_size - 1)
            assert programs[block_m] <= bound


def test_plan_refuses_what_does_not_fit():
    plan = mi.MultiItemPlan(heads=2, head_dim=16, dtype=torch.float32, max_tokens=30, max_prompts=2, device=DEV)
    q, k, v = small_inputs(tokens=30)
    with pytest.raises(RuntimeError, match="set_layout"):
        plan.run(q, k, v, torch.empty_like(q))
    with pytest.raises(ValueError, match="does not fit the plan"):
        plan.set_layout(mi.MultiItemBatch.from_item_lens([20], [[5, 5]], device=DEV))  # 32 tokens
    with pytest.raises(ValueError, match="does not fit the plan"):
        plan.set_layout(mi.MultiItemBatch.from_item_lens([1, 1, 1], [[1], [1], [1]], device=DEV))  # 3 prompts
    plan.set_layout(mi.MultiItemBatch.from_item_lens([5], [[3, 2, 6]], device=DEV))
    with pytest.raises(ValueError, match="q must be"):
        plan.run(q[:, :20], k, v, torch.empty_like(q))
    with pytest.raises(ValueError, match="config must be one of"):
        mi.MultiItemPlan(heads=2, head_dim=16, dtype=torch.float32, max_tokens=30, max_prompts=2, config="64 x 64")
    with pytest.raises(ValueError, match="rule must be one of"):
        mi.MultiItemPlan(heads=2, head_dim=16, dtype=torch.float32, max_tokens=30, max_prompts=2, rule="causal")


def test_named_configs(rng):
    """A step takes a config by name (its blocks in the interpreter; on the GPU also its warps and stages)."""
    batch = mi.MultiItemBatch.from_item_lens([21], [[6, 17, 1]], device=DEV)
    q, k, v = random_qkv(2, batch.total_tokens, 16, rng)
    name = next(n for n in mi.config.config_names() if n.startswith("64 x 32"))
    out, info = mi.step05_batched(q, k, v, batch, config=name, count_tiles=True, return_info=True)
    assert (info.block_m, info.block_n) == (64, 32)
    assert info.tile_counts == mi.planned_key_tiles(batch, 64, 32)
    torch.testing.assert_close(out.double(), mi.reference_attention(q, k, v, batch), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="not both"):
        mi.step04_tile_skip(q, k, v, batch, config=name, blocks=(16, 16))


# --------------------------------------------------------------------------------------------
# The peers' inputs and the benchmark's pure-Python parts
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", mi.RULES)
def test_flex_mask_mod_is_the_rule_prompt_by_prompt(rule):
    from torch.nn.attention.flex_attention import create_mask

    from studylog.multi_item import peers

    batch = mi.MultiItemBatch.from_item_lens(*MIXED, device=DEV)
    got = create_mask(peers.flex_mask_mod(batch, rule), None, None, batch.total_tokens, batch.total_tokens,
                      device=DEV)[0, 0].cpu()
    want = torch.block_diag(*[mi.dense_mask(batch, b, rule).cpu() for b in range(batch.batch_size)])
    assert torch.equal(got, want)


@pytest.mark.parametrize("page_size", [1, 5, 16])
def test_flashinfer_inputs_hold_our_tensors_in_its_layout(page_size, rng):
    """The paged cache, walked the way FlashInfer walks it (kv_indptr, kv_indices, last_page_len), gives back
    each prompt's keys; the multi-item metadata are FlashInfer's, in its dtypes."""
    from studylog.multi_item import peers

    batch = mi.MultiItemBatch.from_item_lens(*MIXED, device=DEV)
    q, k, v = random_qkv(3, batch.total_tokens, 16, rng)
    x = peers.flashinfer_inputs(q, k, v, batch, page_size)
    assert torch.equal(x.q, q.transpose(0, 1))
    for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
        assert x.qo_indptr[b].item() == start and x.qo_indptr[b + 1].item() == start + s
        pages = x.kv_indices[x.kv_indptr[b]:x.kv_indptr[b + 1]].long()
        keys = x.k_cache[pages].reshape(-1, 3, 16)
        length = (len(pages) - 1) * page_size + int(x.last_page_len[b])
        assert length == s
        assert torch.equal(keys[:s], k[:, start:start + s].transpose(0, 1))
        assert torch.equal(x.v_cache[pages].reshape(-1, 3, 16)[:s], v[:, start:start + s].transpose(0, 1))
        row = x.token_pos_in_items[b * x.token_pos_in_items_len:(b + 1) * x.token_pos_in_items_len]
        want = flashinfer_positions(list(batch.item_lens[b]))
        assert row.to(torch.int64).tolist()[: s - batch.prefix_lens[b]] == want
    assert (x.prefix_len.dtype, x.token_pos_in_items.dtype, x.max_item_len.dtype) == (torch.uint32, torch.uint16,
                                                                                       torch.uint16)
    assert x.max_item_len.to(torch.int64).tolist() == [max(i, default=0) for i in batch.item_lens]


@pytest.mark.parametrize("rule", mi.RULES)
def test_one_pass_per_item_inputs_compute_the_item_rows(rule, rng):
    batch = mi.MultiItemBatch.from_item_lens([5, 0, 9], [[3, 1], [2, 2, 1], []], device=DEV)
    q, k, v = random_qkv(2, batch.total_tokens, 16, rng, torch.float64)
    ref = mi.reference_attention(q, k, v, batch, rule=rule)
    inputs, rows = report._naive_inputs(q, k, v, batch, rule)
    assert [b for b, _ in rows] == [0, 1]  # a prompt without items has no pass
    for (qq, kk, vv), (b, item_rows) in zip(inputs, rows):
        out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        for i, r in enumerate(item_rows):
            p = batch.prefix_lens[b]
            torch.testing.assert_close(out[i, :, p:p + len(r)], ref[:, r], rtol=1e-12, atol=1e-12)


def test_pinned_configs_are_read_from_this_benchmarks_results():
    name = mi.config.config_names()[3]
    rows = [{"series": "step05", "params": {"shape": "a"}, "config": name, "config_source": "autotuned"},
            {"series": "step04", "params": {"shape": "a"}, "config": "12 x 12", "config_source": "autotuned"},
            {"series": "step03", "params": {"shape": "b"}, "config": name},
            {"series": report.FLUSH, "params": {"what": "ceiling"}}]
    new = plotting.Results(None, {"schema": 2, "measurements": rows})
    assert report.pinned_configs(new) == {("step05", "a"): name}


def bench_plan(quick: bool, flashinfer: bool) -> dict[str, list[str]]:
    """What the benchmark times on each shape, by kind: ``{"single": [...], "batch": [...], "gqa": [...]}`` series
    for a one-prompt shape, for a batch and for the batch with grouped-query attention (no step 5 variants)."""
    r = report
    extra = [] if quick else [r.order_series(o) for o in mi.SCHEDULE_ORDERS[1:]] + [r.STEP05_OTHER_RULE, r.PLAN]
    base = [r.SDPA_DENSE, r.SDPA_CAUSAL, r.FLEX] + ([] if quick else [r.ONE_PASS_PER_ITEM])
    peers = [r.FLASHINFER] if flashinfer else []
    step5 = [r.STEP05.series]
    single = [s.series for s in mi.STEPS[1:] if s is not r.STEP06]  # step 6 is step 5 without shared heads
    return {"single": single + extra + ([] if quick else [r.DO_BENCH[4], r.DO_BENCH[5]]) + base + peers,
            "batch": step5 + extra + ([] if quick else [r.DO_BENCH[5]]) + [r.STEP04_PER_PROMPT] + base + peers,
            "gqa": step5 + ([] if quick else [r.DO_BENCH[5]]) + [r.STEP06.series, r.STEP04_PER_PROMPT] + base + peers}


def test_graph_calls_and_the_benchmarks_size():
    assert report.graph_calls_for(0.01) == 60 and report.graph_calls_for(0.2) == 40
    assert report.graph_calls_for(5.0) == 4
    shapes = report.bench_shapes()
    plan = bench_plan(quick=False, flashinfer=True)
    singles = sum(mi.MultiItemBatch.from_item_lens(p, i, device="cpu").batch_size == 1 for _, p, i in shapes)
    timed = singles * len(plan["single"]) + (len(shapes) - singles) * len(plan["batch"])
    sweeps = len(shapes) * (len(peers.flex_variants(False)) + 4)  # one graph timing per candidate
    # a series: a probe, 3 captures and 30 replays of ~8 ms (~0.4 s); a sweep candidate: 1 capture, 5 replays
    assert timed * 0.4 + sweeps * 0.15 <= 30
    quick = bench_plan(quick=True, flashinfer=True)
    assert [s[0] for s in report.bench_shapes(quick=True)] == [shapes[0][0], report.MIXED_SHAPE]
    assert len(quick["single"]) <= 8


def _fake_results():
    rows = []
    for shape, ours, flex, fi in (("8 prompts, mixed", 0.6, 0.9, 0.8), ("prefix 2048, 32 items x 32", 0.2, 0.3, 0.19),
                                  ("prefix 512, 128 items x 16", 0.1, 0.15, 0.12)):
        p = {"shape": shape, "prompts": 1, "tokens": 100}
        rows += [{"series": "step05", "role": "kernel", "params": p, "ms": ours, "clock": "gpu",
                  "spread_ms": [ours * 0.98, ours, ours * 1.01], "host_ms": 0.05},
                 {"series": report.FLEX, "role": "baseline", "params": p, "ms": flex, "clock": "gpu",
                  "spread_ms": [flex, flex, flex], "block_size": "64 x 64"},
                 {"series": report.FLASHINFER, "role": "peer", "params": p, "ms": fi, "clock": "gpu",
                  "spread_ms": [fi, fi, fi], "backend": "fa3", "page_size": 1},
                 {"series": report.SDPA_DENSE, "role": "baseline", "params": p, "ms": 5 * ours, "clock": "gpu"}]
    data = {"schema": 2, "measurements": rows, "device": {"name": "GPU"}, "date": "2026-01-01",
            "ceilings": {"empty_launch_host_ms": 0.004}}
    return plotting.Results(None, data)


def test_headline_and_targets_from_a_gpu_clock_file():
    results = _fake_results()
    rows = {(r["baseline"], r["case"].split(",")[0]): r for r in report.headline(results)}
    flex = rows["FlexAttention (best block size: 64 x 64)", "8 prompts"]
    assert flex["clock"] == "gpu" and flex["speedup"] == pytest.approx(1.5) and flex["host_ms"] == 0.05
    assert flex["speedup_range"][0] < 1.5 < flex["speedup_range"][1]
    assert flex["empty_launch_host_ms"] == 0.004
    assert rows["FlashInfer (fa3, page 1)", "prefix 2048"]["speedup"] == pytest.approx(0.95)
    table = lesson.target_table(results)
    assert "| prefix 2048, 32 items x 32 | 200.0 | FlashInfer | 190.0 | 0.95x" in table
    assert ">= 1.20x | yes |" in table and ">= 1.00x | **no** |" in table  # FlashInfer: mixed met, uniform not
    assert lesson.target(report.FLASHINFER, report.MIXED_SHAPE) == 1.2
    results.rows.append({"series": report.FLUSH, "role": "baseline", "params": {"what": "ceiling"}, "ms": 0.07,
                         "clock": "gpu"})
    assert figures.shape_names(results) == ["8 prompts, mixed", "prefix 2048, 32 items x 32",
                                           "prefix 512, 128 items x 16"]
    import matplotlib.pyplot as plt

    figs = figures.figures(results)  # the figures draw from a file of the current benchmark too
    assert set(figs) == {"times", "times_mixed", "tiles"}
    plt.close("all")


@pytest.mark.gpu
def test_gpu_entry_point_replays_in_a_cuda_graph_over_new_inputs():
    """multi_item_attention captured once (after an eager call on the batch), replayed over new q, k, v."""
    batch = mi.MultiItemBatch.from_item_lens([300, 17], [[20] * 12, [1, 40, 3]], device="cuda")
    q, k, v = [torch.randn(8, batch.total_tokens, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    out = torch.empty_like(q)
    mi.multi_item_attention(q, k, v, batch, out=out)  # tunes and plans outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mi.multi_item_attention(q, k, v, batch, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mi.multi_item_attention(q, k, v, batch, out=out)
    for _ in range(2):
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.float(), float32_reference(q, k, v, batch), rtol=1.6e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, "64 x 64, 4 warps, 3 stages"])
def test_gpu_plan_replays_one_graph_over_changing_layouts(config):
    """MultiItemPlan captured once, replayed over new values and new layouts (set between replays)."""
    layouts = [([300, 17], [[20] * 12, [1, 40, 3]]), ([0, 64, 5], [[7] * 30, [1] * 50, []]), ([700], [[33] * 3])]
    heads, head_dim, capacity = 8, 128, 900
    plan = mi.MultiItemPlan(heads=heads, head_dim=head_dim, dtype=torch.bfloat16, max_tokens=capacity,
                            max_prompts=3, config=config, device="cuda")
    q, k, v = [torch.randn(heads, capacity, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    out = torch.empty_like(q)
    plan.set_layout(mi.MultiItemBatch.from_item_lens(*layouts[0], device="cuda"))
    plan.run(q, k, v, out)  # picks the config (when none is given) outside the capture
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.run(q, k, v, out)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        plan.run(q, k, v, out)
    for prefixes, items in layouts:
        batch = mi.MultiItemBatch.from_item_lens(prefixes, items, device="cuda")
        plan.set_layout(batch)
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        n = batch.total_tokens
        torch.testing.assert_close(out[:, :n].float(), float32_reference(q[:, :n], k[:, :n], v[:, :n], batch),
                                   rtol=1.6e-2, atol=1e-2)


@pytest.mark.gpu
def test_gpu_flashinfer_agrees_with_ours_under_its_rule():
    from studylog.multi_item import peers

    try:
        module = peers.flashinfer_module()
    except ImportError as err:
        pytest.skip(str(err))
    batch = mi.MultiItemBatch.from_item_lens([300, 0, 17], [[20] * 12, [3, 1, 9], [1, 40, 3]], device="cuda")
    q, k, v = [torch.randn(8, batch.total_tokens, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    ours = mi.multi_item_attention(q, k, v, batch)
    ref = float32_reference(q, k, v, batch)
    for backend in peers.flashinfer_backends(module):
        for page in (1, 16):
            x = peers.flashinfer_inputs(q, k, v, batch, page)
            wrapper = peers.flashinfer_prefill(module, x, 8, 1 / math.sqrt(128), backend)
            got = wrapper.run(x.q, (x.k_cache, x.v_cache)).transpose(0, 1)
            torch.testing.assert_close(got.float(), ref, rtol=1.6e-2, atol=1e-2, msg=lambda m: f"{backend}: {m}")
            torch.testing.assert_close(got.float(), ours.float(), rtol=1.6e-2, atol=1e-2)


def test_flashinfer_is_optional():
    """Without FlashInfer (or its trimmed build) the benchmark notes it and goes on: the lookup raises
    ImportError naming both."""
    from studylog.multi_item import peers

    try:
        module = peers.flashinfer_module()
    except ImportError as err:
        assert "flashinfer" in str(err) and "flashinfer_mis" in str(err)
    else:
        assert hasattr(module, "BatchPrefillWithPagedKVCacheWrapper")
        assert peers.flashinfer_backends(module)


class FakeRun:
    """BenchRun's interface on the CPU: every call is made once (so the benchmark's control flow, closures and
    checks run; a repetition would remake the same call, whose output no clock reads), every clock reads a
    constant."""

    def __init__(self, quick):
        from studylog.bench import BenchRun, Timing

        self.quick, self.rows, self.checks, self.notes = quick, [], [], []
        self.device = {"name": "fake GPU", "l2_cache_bytes": 1}
        self._record, self._timing = BenchRun.record, Timing

    def time(self, fn, **_):
        fn()
        return 1.0

    def graph_time(self, calls, **_):
        for call in calls:
            call()
        return 0.5

    def gpu_time(self, make_calls, repeats=3, **_):
        for call in make_calls():
            call()
        return self._timing.of([0.9, 1.0, 1.1][:repeats], "gpu")

    def host_time(self, fn, **_):
        fn()
        return self._timing.of([0.01], "host")

    def rotated(self, x):
        return [x]

    def floor_ms(self, nbytes):
        return 0.1

    def record(self, *args, **kwargs):
        return self._record(self, *args, **kwargs)

    def check(self, name, passed, *, params=None, **detail):
        self.checks.append({"name": name, "passed": bool(passed), "params": params or {}, **detail})
        return bool(passed)

    def note(self, text):
        self.notes.append(text)

    def progress(self, iterable, desc, total=None):
        return iterable


class FakeFlashInfer:
    """FlashInfer's wrapper as its inputs define it, in torch: the paged cache walked through kv_indptr,
    kv_indices and last_page_len, and FlashInfer's condition on prefix_len and token_pos_in_items (a row with
    no key writes 0). The benchmark's FlashInfer path runs on it on the CPU."""

    __name__ = "fake_flashinfer"

    @staticmethod
    def backends():
        return ["fa2"]

    class BatchPrefillWithPagedKVCacheWrapper:
        def __init__(self, workspace, layout="NHD", backend="auto"):
            assert layout == "NHD" and backend in ("fa2", "auto")

        def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, heads, kv_heads, head_dim, page_size, *,
                 causal, sm_scale, prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr,
                 **_):
            assert causal and heads % kv_heads == 0
            self.group = heads // kv_heads
            self.args = (qo_indptr.tolist(), kv_indptr.tolist(), kv_indices.tolist(), last_page_len.tolist(),
                         page_size, sm_scale, prefix_len_ptr.to(torch.int64).tolist(),
                         token_pos_in_items_ptr.to(torch.int64).tolist(), token_pos_in_items_len)

        def run(self, q, paged_kv_cache, out=None):
            qo, kv_ptr, kv_idx, last, page, scale, prefix, pos, width = self.args
            k_cache, v_cache = paged_kv_cache
            out = torch.empty_like(q) if out is None else out
            for b in range(len(qo) - 1):
                pages = kv_idx[kv_ptr[b]:kv_ptr[b + 1]]
                n = (len(pages) - 1) * page + last[b]
                kk, vv = (c[pages].reshape(-1, *c.shape[2:])[:n].transpose(0, 1).float()
                          .repeat_interleave(self.group, 0) for c in (k_cache, v_cache))
                qq = q[qo[b]:qo[b + 1]].transpose(0, 1).float()
                p, row = prefix[b], pos[b * width:(b + 1) * width]
                keep = torch.tensor([[kv <= i and (i < p or kv < p or i < kv + row[i - p]) for kv in range(n)]
                                     for i in range(n)])
                probs = torch.softmax((qq @ kk.transpose(1, 2) * scale).masked_fill(~keep, float("-inf")), -1)
                out[qo[b]:qo[b + 1]] = (probs.nan_to_num(0.0) @ vv).transpose(0, 1).to(out.dtype)
            return out


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_the_benchmark_runs_end_to_end_on_a_fake_run(quick, monkeypatch):
    """The whole benchmark on tiny shapes in the interpreter, through a fake BenchRun (FlexAttention eager,
    FlashInfer as :class:`FakeFlashInfer`): every series the plan lists is recorded once per shape, every check
    passes, the pinned configs and the tables read the file."""
    shapes = [("prefix 9, items 3,1,4", [9], [[3, 1, 4]]), ("2 prompts", [5, 0], [[2, 2], [1, 3]])]
    monkeypatch.setattr(report, "bench_shapes", lambda quick=False: shapes[:1] if quick else shapes)
    monkeypatch.setattr(report, "BENCH_HEADS", 2)
    monkeypatch.setattr(report, "BENCH_HEAD_DIM", 16)
    monkeypatch.setattr(report, "BENCH_DTYPE", torch.float32)
    monkeypatch.setattr(report, "CEILING_MATMUL_N", 32)
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)  # FlexAttention runs eagerly on the CPU
    from studylog.multi_item import peers

    monkeypatch.setattr(peers, "flashinfer_module", lambda: FakeFlashInfer)
    name = next(n for n in mi.config.config_names() if n.startswith("64 x 32"))
    monkeypatch.setattr(report, "_choose_config", lambda step, *a: (name, "autotuned", {name: 0.1}))
    run = FakeRun(quick)
    report.bench(run)
    assert run.checks and all(c["passed"] for c in run.checks), [c for c in run.checks if not c["passed"]]
    plan = bench_plan(quick, flashinfer=True)
    gqa = report.gqa_shapes()
    assert [(name, kv) for name, _, _, kv in gqa] == [("2 prompts, 1 KV heads", 1)]
    for shape, prefixes, _ in (shapes[:1] if quick else shapes) + [g[:3] for g in gqa]:
        want = plan["gqa" if shape == gqa[0][0] else "single" if len(prefixes) == 1 else "batch"]
        got = [r["series"] for r in run.rows if r["params"].get("shape") == shape]
        assert sorted(got) == sorted(want), shape
        assert got == [s for s, _, _ in report.shape_rows(len(prefixes) == 1, shape == gqa[0][0], quick)], shape
        flex = next(r for r in run.rows if r["series"] == report.FLEX and r["params"]["shape"] == shape)
        assert set(flex["sweep_ms"]) == {v[0] for v in peers.flex_variants(quick)} and flex["block_size"]
    assert [r["series"] for r in run.rows if "shape" not in r["params"]] == [report.FLUSH]
    fi = [r for r in run.rows if r["series"] == report.FLASHINFER]
    assert all(r["role"] == "peer" and "host_ms" in r and r["backend"] == "fa2" for r in fi)
    assert set(fi[0]["sweep_ms"]) == ({"fa2, page 1"} if quick else {"fa2, page 1", "fa2, page 16"})
    assert any(c["name"].startswith("FlashInfer (fa2, page 16) matches") for c in run.checks) != quick
    results = plotting.Results(None, {"schema": 2, "measurements": run.rows, "device": {"name": "fake"},
                                      "date": "2026-01-01", "ceilings": {"empty_launch_host_ms": 0.004}})
    assert report.pinned_configs(results)[(report.STEP05.series, shapes[0][0])] == name
    assert "| prefix 9, items 3,1,4 |" in lesson.target_table(results)


def test_plan_refuses_buffers_off_its_device_and_a_width_that_is_not_a_capacity():
    """run() checks each buffer against the plan's capacity, dtype and device (the kernel would read a buffer on
    another device through a pointer it cannot use); max_width is a positive int like the other capacities."""
    plan = mi.MultiItemPlan(heads=2, head_dim=16, dtype=torch.float32, max_tokens=30, max_prompts=2, device=DEV)
    plan.set_layout(mi.MultiItemBatch.from_item_lens([5], [[3, 2, 6]], device=DEV))
    q, k, v = small_inputs(tokens=30)
    elsewhere = torch.empty(q.shape, dtype=q.dtype, device="meta")
    with pytest.raises(ValueError, match=r"out must be a float32 tensor of shape \(2, 30, 16\), with a unit stride on "
                                         r"its last dimension, on \w+(:\d)?; got a float32 tensor of shape "
                                         r"\(2, 30, 16\) on meta"):
        plan.run(q, k, v, elsewhere)
    with pytest.raises(TypeError, match=r"k must be .*; got a float16 tensor"):
        plan.run(q, k.half(), v, torch.empty_like(q))
    for bad in (0, -3, 2.5, True):
        with pytest.raises((TypeError, ValueError), match="max_width must be"):
            mi.MultiItemPlan(heads=2, head_dim=16, dtype=torch.float32, max_tokens=30, max_prompts=2, max_width=bad)
