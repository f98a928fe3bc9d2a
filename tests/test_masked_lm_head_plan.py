"""Masked LM head (chapter 2), around the kernels: step 12's dispatch and the rule it reads from the committed
results, the packed bitmask and xgrammar's path on the CPU, the capturable MaskedHeadPlan, and the benchmark's
logic at toy size (a stub timer). The helpers and the GPU fixture come from test_masked_lm_head.py."""

import numpy as np
import pytest
import torch

from studylog import masked_lm_head as mlh
from studylog import runtime

from test_masked_lm_head import D, DEV, V, assert_logits, full_head, inputs, poisoned  # noqa: F401 (full_head: a fixture)


# ------------------------------------------------------------------------------------------
# Step 12: dispatch, and the rule it reads from the committed results
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fraction, dense, batch, kind, path", [
    (1.0, "row_skip", 1, "all", "stream"), (1.0, "row_skip", 1, "few", "few_ids"),
    (1.0, "row_skip", 4, "random", "batched"), (0.0, "row_skip", 1, "random", "row_skip"),
    (0.0, "cublas", 4, "random", "cublas"),
])
def test_dispatch_paths(fraction, dense, batch, kind, path, rng):
    rule = mlh.DispatchRule({1: fraction}, {1: dense}, mlh.FEW_IDS_MAX, "test")
    h, weight, allowed = inputs(rng, batch, kind=kind)
    assert mlh.choose_path(batch, V, allowed.union_count, rule) == path
    out = mlh.step12_dispatch(h, weight, allowed, out=poisoned(batch), rule=rule)
    assert_logits(out, h, weight, allowed)


def test_dispatch_thresholds_pick_by_batch():
    rule = mlh.DispatchRule({1: 0.9, 8: 0.5, 64: 0.2}, {1: "row_skip", 8: "row_skip", 64: "cublas"}, 8, "test")
    choose = mlh.choose_path
    assert choose(1, 1000, 900, rule) == "stream" and choose(1, 1000, 901, rule) == "row_skip"
    assert choose(1, 1000, 8, rule) == "few_ids" and choose(1, 1000, 9, rule) == "stream"
    assert choose(8, 1000, 500, rule) == "batched" and choose(63, 1000, 501, rule) == "row_skip"
    assert choose(100, 1000, 200, rule) == "batched" and choose(100, 1000, 201, rule) == "cublas"
    assert choose(100, 1000, 0, rule) == "batched"
    with pytest.raises(ValueError, match="unknown dense path"):
        mlh.DispatchRule({1: 1.0}, {1: "dense"}, 8, "test")
    with pytest.raises(ValueError, match="few_max"):
        mlh.DispatchRule({1: 1.0}, {1: "row_skip"}, mlh.FEW_IDS_MAX + 1, "test")


def _row(series, batch, allowed, union, ms, kind="random"):
    return {"series": series, "role": "kernel", "params": {"batch": batch, "kind": kind, "allowed": allowed,
                                                            "layout": "vd"}, "ms": ms, "union": union}


def test_rule_from_results_follows_its_documented_rule():
    """Batch 1: the compacted kernel wins at unions 1, 3, 100 and loses at 1,000 (and wins again at
    5,000, which does not count); step 8 wins at 1 and loses at 3. Batch 4 never loses, and cuBLAS is
    the cheaper dense path there."""
    from studylog.plotting import Results

    s = {n: mlh.CHAPTER.step(n).series for n in range(14)}
    rows = []
    for allowed, stream, few, dense in ((1, 5.0, 4.0, 9.0), (3, 5.0, 6.0, 9.0), (100, 6.0, None, 9.0),
                                        (1000, 10.0, None, 9.0), (5000, 8.0, None, 9.0)):
        rows += [_row(s[7], 1, allowed, allowed, stream), _row(s[3], 1, allowed, allowed, dense),
                 _row("cublas_fp32_mask", 1, allowed, allowed, dense + 1)]
        if few is not None:
            rows.append(_row(s[8], 1, allowed, allowed, few))
        # steps 5 and 6 are not compacted paths of the dispatch: their (faster) times must not move the rule
        rows += [_row(s[5], 1, allowed, allowed, 0.1), _row(s[6], 1, allowed, allowed, 0.1)]
    for allowed in (10, 10_000):
        # nor step 9's at batch 4 (slower than every dense path)
        rows += [_row(s[10], 4, allowed, 2 * allowed, 1.0), _row(s[3], 4, allowed, 2 * allowed, 3.0),
                 _row(s[9], 4, allowed, 2 * allowed, 50.0),
                 _row("cublas_fp32_mask", 4, allowed, 2 * allowed, 2.0)]
    results = Results(None, {"device": {"name": "stub"}, "date": "2000-01-01T00:00:00", "git_commit": "abc",
                             "measurements": rows})
    rule = mlh.dispatch.rule_from_results(results, vocab=10_000)
    assert rule.compact_max_fraction == {1: 100 / 10_000, 4: 1.0}  # batch 4 never lost, up to a union of 20,000
    assert rule.dense_path == {1: "row_skip", 4: "cublas"} and rule.few_max == 1
    assert "stub" in rule.source


def test_dispatch_rule_reads_the_committed_results():
    from studylog import plotting

    if not plotting.result_files("masked_lm_head"):
        pytest.skip("no committed benchmark results")
    rule = mlh.dispatch_rule()
    results = plotting.load_results("masked_lm_head")
    assert rule == mlh.dispatch.rule_from_results(results) and rule.source.startswith("measured on")
    # at every measured point below its threshold, the compacted path was no slower than the dense paths
    for (batch, _), pts in mlh.dispatch.crossover_points(results.rows).items():
        for q in pts:
            if q["union"] <= rule.compact_max_fraction[batch] * mlh.VOCAB:
                assert q["compact"] <= q["dense"], (batch, q)


def test_dispatch_rule_falls_back_without_results(monkeypatch):
    from studylog import plotting

    def missing(*args, **kwargs):
        raise FileNotFoundError("no results")

    monkeypatch.setattr(plotting, "load_results", missing)
    assert mlh.dispatch_rule.__wrapped__() is mlh.dispatch.FALLBACK_RULE


def test_dispatch_default_output_allocation(rng):
    h, weight, allowed = inputs(rng, 1, kind="few")
    assert_logits(mlh.masked_logits(h, weight, allowed), h, weight, allowed)

# ------------------------------------------------------------------------------------------
# Packed bitmasks, xgrammar's convention and its CPU kernel
# ------------------------------------------------------------------------------------------

def test_pack_bitmask_round_trip_and_layout():
    gen = np.random.default_rng(4)
    mask = torch.from_numpy(gen.random((3, 100)) < 0.3)
    mask[0, 31] = mask[1, 0] = mask[2, 99] = True
    packed = mlh.pack_bitmask(mask)
    assert packed.dtype == torch.int32 and packed.shape == (3, mlh.formats.bitmask_words(100)) == (3, 4)
    assert torch.equal(mlh.formats.unpack_bitmask(packed, 100), mask)
    words = packed.numpy().view(np.uint32)
    assert all(bool(words[b, v // 32] >> (v % 32) & 1) == bool(mask[b, v]) for b in range(3) for v in range(100))
    assert int(words[0, 3]) >> 4 == 0, "bits past V are 0"
    a = mlh.AllowedTokens.from_bitmask(packed, 100)
    assert torch.equal(a.mask, mask) and torch.equal(a.bitmask, packed)
    assert a.union_count == int(mask.any(0).sum())
    with pytest.raises(ValueError, match="words per row"):
        mlh.AllowedTokens.from_bitmask(packed[:, :3], 100)


def test_our_output_equals_xgrammars_bitmask_path_on_the_cpu(rng):
    """The practitioners' path on the same inputs: all logits in fp32, then xgrammar's
    apply_token_bitmask_inplace (its CPU kernel here) on the packed bitmask. It writes -inf where a bit is 0
    and leaves the rest: the same -inf as ours, and finite values within the same bound."""
    xgrammar = pytest.importorskip("xgrammar", reason="xgrammar is an optional peer (pip install xgrammar)")
    for batch, kind in ((1, "few"), (1, "random"), (4, "random"), (2, "empty"), (3, "all")):
        h, weight, allowed = inputs(rng, batch, kind=kind)
        ours = mlh.masked_logits(h, weight, allowed, out=poisoned(batch))
        theirs = torch.mm(h.float(), weight.float().t())
        xgrammar.apply_token_bitmask_inplace(theirs, _padding_bits_set(allowed.bitmask, V))
        assert torch.equal(torch.isneginf(ours), torch.isneginf(theirs)), (batch, kind)
        assert_logits(theirs, h, weight, allowed)
        assert_logits(ours, h, weight, allowed)


# ------------------------------------------------------------------------------------------
# MaskedHeadPlan: the decode loop's form (buffers filled each step, one graph per bucket)
# ------------------------------------------------------------------------------------------

def _plan_sets(kind, batch, gen, vocab=V):
    if kind == "empty":
        return [[] for _ in range(batch)]
    if kind == "all":
        return [np.arange(vocab)] * batch
    if kind == "last":
        return [[vocab - 1]] * batch
    size = {"few": 3, "some": 40}[kind]
    return [gen.choice(vocab, size=size, replace=False) for _ in range(batch)]


@pytest.mark.parametrize("batch", [1, 3])
def test_plan_refills_its_buffers_and_switches_buckets(batch, rng):
    """One plan, several steps with different sets (and bounds above the true count): each step's output
    matches float64, whatever the previous step left in the buffers."""
    gen = np.random.default_rng(rng.seed_value)
    weight = torch.randn(V, D, generator=rng).to(torch.bfloat16).to(DEV)
    plan = mlh.MaskedHeadPlan(weight, batch)
    seen = set()
    for kind, slack in (("some", 0), ("few", 0), ("all", 0), ("empty", 0), ("last", 50), ("few", 150)):
        plan.h.copy_(torch.randn(batch, D, generator=rng).to(torch.bfloat16))
        sets = _plan_sets(kind, batch, gen)
        count = plan.set_allowed(sets)
        plan.out.fill_(float("nan"))
        out = plan.step(count + slack)
        seen.add(plan.bucket(count + slack))
        assert_logits(out, plan.h, weight, mlh.AllowedTokens.from_ids(sets, V, device=DEV))
    assert len(seen) >= 3, seen


@pytest.mark.parametrize("batch", [1, 4])
def test_step13_runs_the_whole_step_from_a_host_bitmask(batch, rng):
    """Step 13 is the plan's decode step from the grammar's packed bitmask: each call copies a new host bitmask in
    (the bits past V left 0, as pack_bitmask leaves them) and gives the float64 logits of those sets, the count a
    bound above the union; its series is the benchmark's plan series."""
    assert mlh.CHAPTER.step(13).function is mlh.step13_plan and mlh.CHAPTER.step(13).series == mlh.report.PLAN
    gen = np.random.default_rng(rng.seed_value)
    weight = torch.randn(V, D, generator=rng).to(torch.bfloat16).to(DEV)
    plan = mlh.MaskedHeadPlan(weight, batch)
    plan.h.copy_(torch.randn(batch, D, generator=rng).to(torch.bfloat16))
    for kind, slack in (("some", 0), ("few", 7), ("all", 0), ("empty", 0)):
        allowed = mlh.AllowedTokens.from_ids(_plan_sets(kind, batch, gen), V, device="cpu")
        plan.out.fill_(float("nan"))
        out = mlh.step13_plan(plan, mlh.pack_bitmask(allowed.mask), allowed.union_count + slack)
        assert out is plan.out
        assert_logits(out, plan.h, weight, mlh.AllowedTokens.from_mask(allowed.mask.to(DEV)))


def test_plan_union_ids_built_on_the_device(rng):
    weight = torch.randn(V, D, generator=rng).to(torch.bfloat16).to(DEV)
    compact = mlh.DispatchRule({1: 1.0, 2: 1.0}, {1: "row_skip", 2: "row_skip"}, 8, "test: always compacted")
    plan = mlh.MaskedHeadPlan(weight, 5, rule=compact)
    gen = np.random.default_rng(3)
    sets = [gen.choice(V, size=int(gen.integers(0, 90)), replace=False) for _ in range(5)]
    count = plan.set_allowed(sets)
    plan.launch(count)
    assert int(plan.count) == count == len(set(np.concatenate(sets).tolist()))
    assert sorted(plan.ids[:count].tolist()) == sorted(set(np.concatenate(sets).tolist()))


def test_plan_takes_the_dense_bitmask_path_where_the_rule_says_compacted_loses(rng):
    """A rule measured where the compacted kernel lost above 20% of V at batch 4: the plan (and step 12)
    take the dense path there (cuBLAS logits + the bitmask applied), and stay compacted below."""
    from studylog.plotting import Results

    s = {n: mlh.CHAPTER.step(n).series for n in range(14)}
    rows = []
    for allowed, union, compact, dense in ((10, 40, 1.0, 5.0), (1000, 20_000, 4.0, 5.0), (10_000, 60_000, 9.0, 5.0)):
        rows += [_row(s[10], 4, allowed, union, compact), _row("cublas_fp32_mask", 4, allowed, union, dense),
                 _row(s[7], 1, allowed, allowed, 1.0), _row("cublas_fp32_mask", 1, allowed, allowed, 5.0)]
    results = Results(None, {"device": {"name": "stub"}, "date": "2000-01-01T00:00:00", "measurements": rows})
    rule = mlh.dispatch.rule_from_results(results, vocab=100_000)
    assert rule.compact_max_fraction[4] == 0.2 and rule.dense_path[4] == "cublas"
    assert mlh.choose_path(4, V, int(0.2 * V), rule) == "batched" and mlh.choose_path(4, V, V, rule) == "cublas"
    weight = torch.randn(V, D, generator=rng).to(torch.bfloat16).to(DEV)
    plan = mlh.MaskedHeadPlan(weight, 4, rule=rule)
    plan.h.copy_(torch.randn(4, D, generator=rng).to(torch.bfloat16))
    for sets, path in (([np.arange(0, V, 2)] * 4, "dense"), ([[1, 5], [], [7], [V - 1]], "batched")):
        count = plan.set_allowed(sets)
        assert plan.bucket(count)[0] == path
        plan.out.fill_(float("nan"))
        assert_logits(plan.step(count), plan.h, weight, mlh.AllowedTokens.from_ids(sets, V, device=DEV))
    row_rule = mlh.DispatchRule({1: 0.2}, {1: "row_skip"}, mlh.FEW_IDS_MAX, "test")
    plan = mlh.MaskedHeadPlan(weight, 3, rule=row_rule)
    plan.h.copy_(torch.randn(3, D, generator=rng).to(torch.bfloat16))
    sets = [np.arange(0, V, 2), [], np.arange(V)]
    count = plan.set_allowed(sets)
    assert plan.bucket(count) == ("row_skip", V)
    plan.out.fill_(float("nan"))
    assert_logits(plan.step(count), plan.h, weight, mlh.AllowedTokens.from_ids(sets, V, device=DEV))


def test_plan_bad_input():
    w = torch.randn(10, 8).to(torch.bfloat16)
    with pytest.raises(TypeError, match="weight must be bfloat16 or float16"):
        mlh.MaskedHeadPlan(w.float(), 1)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        mlh.MaskedHeadPlan(w, 0)
    with pytest.raises(ValueError, match="h must have shape"):
        mlh.MaskedHeadPlan(w, 2, h=torch.zeros(3, 8, dtype=torch.bfloat16))
    plan = mlh.MaskedHeadPlan(w, 2)
    with pytest.raises(ValueError, match="1 sets given for a plan of batch 2"):
        plan.set_allowed([[1]])
    assert plan.buckets()[-1] in (("batched", 10), ("dense", 10), ("row_skip", 10))


def test_fast_launch_key_follows_tritons_specialisation():
    x = torch.zeros(8)
    key_a, values = mlh.launch.specialization((x, 1, 32, 5))
    assert values == [x.data_ptr(), 1, 32, 5]
    assert key_a != mlh.launch.specialization((x, 2, 32, 5))[0], "an int equal to 1 is its own specialisation"
    assert key_a != mlh.launch.specialization((x, 1, 33, 5))[0], "divisibility by 16"
    assert key_a != mlh.launch.specialization((x[1:], 1, 32, 5))[0], "pointer alignment"
    assert key_a != mlh.launch.specialization((x.double(), 1, 32, 5))[0], "dtype"
    assert key_a != mlh.launch.specialization((x, 1, 32, 2**33))[0], "64-bit ints"
    skip = frozenset({1, 2})
    assert mlh.launch.specialization((x, 1, 32, 5), skip)[0] == mlh.launch.specialization((x, 7, 3, 5), skip)[0]


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 4, 64])
def test_plan_captured_once_replayed_over_changing_sets(batch, full_head, rng):
    """The decode loop: every bucket's graph captured once, then each step changes only the buffers (h and
    the bitmask, copied from pinned host memory by step 13, every other step by hand) and replays; every step
    matches float64."""
    weight, _ = full_head
    gen = np.random.default_rng(rng.seed_value)
    plan = mlh.MaskedHeadPlan(weight, batch)
    plan.capture()
    graphs = dict(plan._graphs) if hasattr(plan, "_graphs") else None
    for i, n in enumerate((1, 7, 900, 1000, 20_000, mlh.VOCAB, 0, 300)):
        sets = [gen.choice(mlh.VOCAB, size=n, replace=False) for _ in range(batch)]
        allowed = mlh.AllowedTokens.from_ids(sets, mlh.VOCAB, device="cuda")
        host = mlh.pack_bitmask(allowed.mask.cpu()).pin_memory()
        plan.h.copy_(torch.randn(batch, mlh.HIDDEN, generator=rng).to(torch.bfloat16))
        plan.out.fill_(float("nan"))
        if i % 2:
            out = mlh.step13_plan(plan, host, allowed.union_count)
        else:
            plan.bitmask.copy_(host, non_blocking=True)
            out = plan.step(allowed.union_count)
        torch.cuda.synchronize()
        res = mlh.check_logits(out, plan.h, weight, allowed)
        assert res["passed"], (n, plan.bucket(allowed.union_count), res)
    if graphs is not None:
        assert dict(plan._graphs) == graphs, "no graph was captured after the first ones"


@pytest.mark.gpu
@pytest.mark.parametrize("use_xgrammar", [True, False])
def test_plan_dense_buckets_on_the_gpu(use_xgrammar, full_head, rng):
    """The rule's dense paths in a graph: cuBLAS + the bitmask (xgrammar's GPU kernel when installed, else
    ours) and step 3 on the unpacked bitmask; bits past V left 0, as pack_bitmask leaves them."""
    weight, _ = full_head
    gen = np.random.default_rng(rng.seed_value)
    for dense in ("cublas", "row_skip"):
        rule = mlh.DispatchRule({1: 0.0}, {1: dense}, mlh.FEW_IDS_MAX, "test")
        plan = mlh.MaskedHeadPlan(weight, 5, rule=rule, use_xgrammar=use_xgrammar)
        for n in (3, 70_000, mlh.VOCAB):
            sets = [gen.choice(mlh.VOCAB, size=n, replace=False) for _ in range(5)]
            count = plan.set_allowed(sets)
            assert plan.bucket(count)[0] == ("dense" if dense == "cublas" else "row_skip")
            plan.h.copy_(torch.randn(5, mlh.HIDDEN, generator=rng).to(torch.bfloat16))
            plan.out.fill_(float("nan"))
            out = plan.step(count)
            torch.cuda.synchronize()
            res = mlh.check_logits(out, plan.h, weight, mlh.AllowedTokens.from_ids(sets, mlh.VOCAB, device="cuda"))
            assert res["passed"], (dense, n, res)


@pytest.mark.gpu
def test_fast_launch_matches_the_jit_launch(full_head, rng):
    """The second call of each step takes the compiled launcher directly; it must equal the first (through
    kernel[grid]) bit for bit, across specialisations (1 id, 17 ids, 1,000 ids)."""
    weight, _ = full_head
    h = torch.randn(1, mlh.HIDDEN, generator=rng).to(torch.bfloat16).cuda()
    for ids in ([5], list(range(3, 20)), list(range(0, 128_000, 128))):
        allowed = mlh.AllowedTokens.from_ids([ids], mlh.VOCAB, device="cuda")
        for fn in (mlh.step04_compact, mlh.step05_one_wait, mlh.step06_fill_first, mlh.step07_stream,
                   mlh.step12_dispatch):
            first = fn(h, weight, allowed)
            second = fn(h, weight, allowed)
            torch.cuda.synchronize()
            assert torch.equal(first, second), fn.__name__
            assert mlh.check_logits(second, h, weight, allowed)["passed"]


# ------------------------------------------------------------------------------------------
# The benchmark's logic at toy size (a stub timer: no timing is measured on the CPU)
# ------------------------------------------------------------------------------------------

class StubRun:
    """Just enough of BenchRun to run the sweep: every call runs once, 'times' are placeholders. Its L2 is
    :attr:`l2` bytes (``rotation`` as BenchRun's), so toy calls rotate over several copies; :attr:`seen` keeps,
    per measured row, the weight each call read and each call's output. A host closure runs the first time its
    code is timed (it must run; its later cases make the calls the GPU clock's copies have already made, and
    their output is never read), so that the interpreter's launches go to the checked and rotated calls."""

    quick = False
    empty_launch_ms = 0.004

    @property
    def empty_launch_gpu(self):
        from studylog.bench import Timing

        return Timing.of([0.002], clock="gpu")

    def __init__(self, l2: int = 1000):
        self.l2 = l2
        self.rows, self.checks, self.notes, self.seen = [], [], [], []
        self.host_codes = set()

    def measure(self, *args, **kwargs):
        from studylog.bench import BenchRun

        return BenchRun.measure(self, *args, **kwargs)

    def rotation(self, nbytes):
        return max(1, -(-4 * self.l2 // max(int(nbytes), 1)))

    def gpu_time(self, make_calls, **_):
        from studylog.bench import Timing

        weights, outs = [], []
        for call in make_calls():  # the sweep's calls are partials of a head copy (a tensor, or holding .weight)
            weights.append(getattr(call.args[0], "weight", call.args[0]))
            got = call()
            outs.append(got.clone() if isinstance(got, torch.Tensor) else None)
        self.seen.append((weights, outs))
        return Timing.of([1.0, 1.0, 1.0], clock="gpu")

    def host_time(self, fn, **_):
        from studylog.bench import Timing

        if fn.__code__ not in self.host_codes:
            self.host_codes.add(fn.__code__)
            fn()
        return Timing.of([0.01, 0.01, 0.01], clock="host")

    def floor_ms(self, nbytes):
        return nbytes / 4e9

    def record(self, series, ms, *, params, role="kernel", floor_ms=None, host=None, **extra):
        row = {"series": series, "role": role, "params": dict(params), "ms": ms.median, "clock": ms.clock,
               "spread_ms": ms.spread, **({"floor_ms": floor_ms} if floor_ms is not None else {}), **extra}
        if host is not None:
            row |= {"host_ms": host.median, "host_spread_ms": host.spread}
        self.rows.append(row)
        return row

    def check(self, name, passed, *, params=None, **detail):
        self.checks.append({"name": name, "passed": passed, "params": params or {}, **detail})

    def note(self, text):
        self.notes.append(text)

    def progress(self, iterable, desc, total=None):
        return iterable


def _padding_bits_set(bitmask, vocab):
    """The bitmask with its bits past ``vocab`` set to 1. xgrammar 0.2.8's *CPU* apply_token_bitmask_inplace
    writes -inf for every 0 bit of the last word, past the row's end (into the next row's first logits, and
    past the tensor after the last row); its GPU kernel stops at the vocabulary. Set bits there are ignored
    by both, so the CPU kernel gets them set."""
    tail = vocab % 32
    if tail == 0:
        return bitmask
    out = bitmask.clone()
    out[:, -1] |= torch.tensor(-(1 << tail), dtype=torch.int32)  # bits tail..31
    return out


def _cpu_peer():
    """xgrammar's CPU apply_token_bitmask_inplace (given the padding bits set), or a torch stand-in with the
    same contract."""
    try:
        import xgrammar
    except ImportError:
        return lambda logits, bitmask: logits.masked_fill_(~mlh.formats.unpack_bitmask(bitmask, logits.shape[1]),
                                                           float("-inf"))
    return lambda logits, bitmask: xgrammar.apply_token_bitmask_inplace(
        logits, _padding_bits_set(bitmask, logits.shape[1]))


def test_bench_sweep_runs_and_checks_at_toy_size(tmp_path):
    if runtime.mode() == "gpu":
        pytest.skip("the stub sweep is for the interpreter; the GPU runs the real benchmark")
    from studylog.plotting import Results

    # V = 70 (not a multiple of a bitmask word; 1,000 allowed is the whole vocabulary: the dense dispatch), D = 40;
    # steps 5 to 7 run one program per allowed row, so the interpreter's time goes with the unions. An L2 of 400
    # bytes: the unions of at most 16 rows of 80 bytes (steps 8, 9 and 11, index_select, the plan) rotate over two
    # to five copies, the larger ones and the whole head stay on one.
    vocab, hidden = 70, 40
    run = StubRun(l2=400)
    gen = np.random.default_rng(0)
    sets = mlh.masks.grammar_like_sets(12, vocab, gen, n_classes=20)
    only = [(1, "random", 8), (1, "random", 1000), (1, "grammar", 8), (1, "clustered", 30), (3, "random", 5),
            (3, "grammar", 24)]
    mlh.report.run_sweep(run, vocab=vocab, hidden=hidden, device="cpu", batches=(1, 3), only=only, peer=_cpu_peer(),
                         structured=mlh.masks.StructuredSets(sets, [f"g{i % 4}" for i in range(12)], "synthetic"))
    assert run.checks and all(c["passed"] for c in run.checks), [c for c in run.checks if not c["passed"]]
    series = {r["series"] for r in run.rows}
    assert {s.series for s in mlh.CHAPTER.steps} | set(mlh.CHAPTER.baselines) == series
    assert all(r["clock"] == "gpu" and "spread_ms" in r for r in run.rows)
    assert all("host_ms" in r for r in run.rows if r["role"] != "baseline")
    assert len(run.host_codes) >= 3  # ours, the plan's step 13 and xgrammar's path each ran its host closure
    assert any(n.startswith("crossover batch=1") for n in run.notes)
    assert_rotated(run, head_bytes=vocab * hidden * 2, row_bytes=hidden * 2)
    assert {(r["params"]["batch"], r["params"]["kind"]) for r in run.rows} == {(b, k) for b, k, _ in only}
    for batch, kind, count in only:  # each case records its declared rows, in order
        case = {"batch": batch, "kind": kind, "allowed": count}
        got = [r for r in run.rows if {k: r["params"][k] for k in case} == case]
        few = got[0]["union"] <= mlh.FEW_IDS_MAX
        declared = mlh.report.case_rows(batch, kind, count, "grammar", few)
        assert [(r["series"], r["role"], r["params"]) for r in got] == [(s, role, case | p) for s, role, p in declared]
    for rotated in (mlh.report.PLAN, "reordered_in_sample", "step11", "step08", "step09", "index_select"):
        assert any(r["copies"] > 1 for r in run.rows if r["series"] == rotated), rotated
    results = Results(tmp_path / "x.json", {
        "chapter": "masked_lm_head", "device": {"name": "stub"}, "date": "2000-01-01T00:00:00",
        "versions": {"torch": "-", "triton": "-"}, "schema": 2,
        "ceilings": {"copy_bandwidth_gbs": 1.0, "empty_launch_host_ms": 0.008}, "measurements": run.rows})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from book.masked_lm_head.figures import figures

    figs = figures(results)
    assert {"speedup_b1", "layout", "batched", "practitioners", "host"} == set(figs)
    for fig in figs.values():
        plt.close(fig)
    from book.masked_lm_head import lesson

    report = lesson.target_report(results)
    assert "| target | measured | met |" in report and "host time per call" in report
    assert "| entry point |" in lesson.host_table(results)


def assert_rotated(run, *, head_bytes, row_bytes):
    """Every measured row ran its calls on ``copies`` distinct copies of its head, all equal and giving equal
    outputs: as many as cover four times the stub's L2 with the bytes a call reads, up to the budget."""
    assert len(run.seen) == len(run.rows)
    for row, (weights, outs) in zip(run.rows, run.seen):
        assert len(weights) == row["copies"] and len({w.data_ptr() for w in weights}) == row["copies"], row
        assert all(torch.equal(w, weights[0]) for w in weights), row["series"]
        assert all(o is None or torch.equal(o, outs[0]) for o in outs), row["series"]
        reads_all = row["read_bytes"] == head_bytes
        assert reads_all or row["read_bytes"] == row["union"] * row_bytes, row
        enough = row["copies"] * row["read_bytes"] >= 4 * run.l2
        assert enough != row["rotation_capped"] and (row["copies"] == 1 or not reads_all), row


def test_bench_sweep_caps_the_copies_at_its_budget():
    """With room for three heads, a call that reads a few rows rotates over three copies, and its row says
    that they cover less than four times L2; a call that reads the whole head stays on one."""
    if runtime.mode() == "gpu":
        pytest.skip("the stub sweep is for the interpreter; the GPU runs the real benchmark")
    run = StubRun()
    sets = mlh.masks.grammar_like_sets(12, 150, np.random.default_rng(0), n_classes=20)
    mlh.report.run_sweep(run, vocab=150, hidden=40, device="cpu", batches=(1,), only=[(1, "random", 8)],
                         peer=_cpu_peer(), structured=mlh.masks.StructuredSets(sets, [f"g{i % 4}" for i in range(12)],
                                                                                "synthetic"),
                         copy_budget=3 * 150 * 40 * 2)
    assert run.checks and all(c["passed"] for c in run.checks)
    by_series = {r["series"]: r for r in run.rows}
    assert by_series["step08"]["copies"] == 3 and by_series["step08"]["rotation_capped"]
    assert by_series["dense_mask"]["copies"] == 1 and not by_series["dense_mask"]["rotation_capped"]
    assert_rotated(run, head_bytes=150 * 40 * 2, row_bytes=40 * 2)
    assert any("Rotation:" in n and "3 heads" in n for n in run.notes)


def test_headline_reads_the_new_series_and_the_old_file(tmp_path):
    """On a file of the new bench (fake times) the headline has the plan against xgrammar's path at batch 1,
    64 and 256 first; on the committed file (older, do_bench) it gives the rows that file can, on one clock each."""
    from studylog import plotting
    from studylog.plotting import Results

    rows = []
    for series, role, ms in (("step12", "kernel", 0.01), ("dense_mask", "baseline", 0.2),
                             ("cublas_fp32_mask", "baseline", 0.19), ("index_select", "baseline", 0.05),
                             (mlh.report.PLAN, "kernel", 0.012),
                             (mlh.report.XGRAMMAR, "peer", 0.21)):
        for batch, allowed in ((1, 1000), (1, 10_000), (64, 100), (64, 1000), (256, 1000)):
            params = {"batch": batch, "kind": "random", "allowed": allowed}
            if role == "kernel":
                params["layout"] = "vd"
            rows.append({"series": series, "role": role, "params": params, "ms": ms, "clock": "gpu",
                         "spread_ms": [ms, ms, ms], "host_ms": 0.009})
    fake = Results(tmp_path / "x.json", {"measurements": rows, "ceilings": {"empty_launch_host_ms": 0.008}})
    heads = mlh.headline(fake)
    assert len(heads) == 6 and all(h["clock"] == "gpu" for h in heads)
    # the whole step against xgrammar's path leads, at batches 1, 64 and 256 (1,000 allowed a sequence)
    assert all(h["speedup"] == pytest.approx(0.21 / 0.012) and "xgrammar" in h["baseline"] for h in heads[:3])
    assert [h["case"].split(", ")[1] for h in heads[:3]] == ["batch 1", "batch 64", "batch 256"]
    if plotting.result_files("masked_lm_head"):
        for h in mlh.headline(plotting.load_results("masked_lm_head")):
            assert h["speedup"] > 0 and h["clock"]


#: Series a committed file was measured without: the H100 run predates steps 5, 6 and 9.
NOT_MEASURED = {"nvidia-h200": set(), "nvidia-h100-80gb-hbm3": {"step05", "step06", "step09"}}


@pytest.mark.parametrize("card", sorted(NOT_MEASURED))
def test_declared_rows_are_the_committed_rows(card):
    """The benchmark's table (cases x rows) at the post's size over the real masks declares exactly the rows
    (series, role, params) of a committed file, in its order, but for the series it was measured without."""
    import json

    from studylog.paths import REPO_ROOT

    path = REPO_ROOT / "assets" / "bench" / card / "masked_lm_head.json"
    committed = [(r["series"], r["role"], r["params"]) for r in json.loads(path.read_text())["measurements"]]
    data = mlh.masks.structured_sets(mlh.VOCAB)
    assert data.is_real, "the committed runs measured the real masks"
    declared = [(r["series"], r["role"], r["params"]) for r in mlh.report.declared_rows(mlh.VOCAB, data)
                if r["series"] not in NOT_MEASURED[card]]
    assert declared == committed


def test_bench_cases_stay_short():
    """The full run's case list (what its two-minute budget is counted on) and the quick one."""
    full = mlh.report.cases(mlh.VOCAB, quick=False, third_kind="real")
    quick = mlh.report.cases(mlh.VOCAB, quick=True, third_kind="real")
    assert len(full) <= 36 and len(quick) <= 5
    assert {b for b, _, _ in full} == set(mlh.report.BATCHES) and any(2 <= b <= 7 for b in mlh.report.BATCHES)
    assert (1, "random", 1000) in full and (1, "random", 10_000) in full and (64, "random", 100) in full
    assert (64, "random", 100) in quick and (1, "random", 1000) in quick
