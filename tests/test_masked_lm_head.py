"""Masked LM head (chapter 2), the kernels: every step against a float64 reference, on fresh random inputs,
with the output poisoned (NaN) before each launch; the allowed sets, the error bound, bad input, full size on a
GPU, and what the compiler makes of steps 2 and 5. The dispatch, the capturable plan, the practitioners' path and
the benchmark are tested in test_masked_lm_head_plan.py; the variants that were tried and not kept in
lab/masked_lm_head/test_variants.py."""

import numpy as np
import pytest
import torch

from book.masked_lm_head.ptx import ptx_loads, ptx_row_load_groups
from studylog import masked_lm_head as mlh
from studylog import runtime

DEV = runtime.device()
# Small, awkward sizes for the interpreter: V and D are not multiples of any block.
V, D = 203, 77
SMALL = mlh.formats.Tiles(block_b=16, block_v=32, block_d=32, group=2, fill_block=64, num_warps=4, num_stages=2)
SMALL_ROWS = mlh.formats.Tiles(block_b=1, block_v=4, block_d=32, fill_block=64, num_warps=4, num_stages=1)
MASK_KINDS = ["random", "empty", "all", "last", "few"]
#: step number -> its public function, from the chapter's table of steps
STEP = {s.number: s.function for s in mlh.CHAPTER.steps}


def make_sets(kind: str, vocab: int, batch: int, gen: np.random.Generator) -> list[np.ndarray]:
    if kind == "random":
        return [np.flatnonzero(gen.random(vocab) < 0.1) for _ in range(batch)]
    if kind == "empty":
        return [np.array([], dtype=np.int64) for _ in range(batch)]
    if kind == "all":
        return [np.arange(vocab) for _ in range(batch)]
    if kind == "last":  # a single allowed token, at the last id
        return [np.array([vocab - 1]) for _ in range(batch)]
    if kind == "few":  # most blocks have nothing allowed
        return [gen.choice(vocab, size=3, replace=False) for _ in range(batch)]
    raise ValueError(kind)


def inputs(rng, batch, vocab=V, hidden=D, dtype=torch.bfloat16, kind="random"):
    gen = np.random.default_rng(rng.seed_value)
    h = torch.randn(batch, hidden, generator=rng).to(dtype).to(DEV)
    weight = torch.randn(vocab, hidden, generator=rng).to(dtype).to(DEV)
    allowed = mlh.AllowedTokens.from_ids(make_sets(kind, vocab, batch, gen), vocab, device=DEV)
    return h, weight, allowed


def poisoned(batch, vocab=V):
    return torch.full((batch, vocab), float("nan"), dtype=torch.float32, device=DEV)


def assert_logits(out, h, weight_vd, allowed):
    """Allowed entries match float64 within the fp32-accumulation bound, the rest are exactly -inf."""
    assert not torch.isnan(out).any(), "the kernel left poisoned (NaN) outputs unwritten"
    ref = h.double() @ weight_vd.double().t()
    bound = mlh.formats.error_bound(h, weight_vd)
    mask = allowed.mask
    got = out.double()
    assert torch.all(got[~mask] == float("-inf")), "a disallowed token got a finite logit"
    err = (got - ref).abs()
    assert torch.all(err[mask] <= bound[mask]), f"max error {err[mask].max():.3g} over the fp32 bound"
    assert torch.isfinite(got[mask]).all()


# ------------------------------------------------------------------------------------------
# Steps 0-3: both layouts where the step supports them, several batch sizes and mask kinds
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("step, layout", [(0, "vd"), (0, "dv"), (1, "vd"), (1, "dv"), (2, "vd"), (2, "dv"),
                                          (3, "vd")])
def test_matmul_steps_batch1(step, layout, kind, rng):
    h, weight, allowed = inputs(rng, 1, kind=kind)
    w = weight if layout == "vd" else weight.t().contiguous()
    out = STEP[step](h, w, allowed, layout=layout, out=poisoned(1), tiles=SMALL)
    assert_logits(out, h, weight, allowed)


@pytest.mark.parametrize("batch", [5, 33])
@pytest.mark.parametrize("step, layout", [(1, "dv"), (2, "vd"), (3, "vd")])
def test_matmul_steps_batched(step, layout, batch, rng):
    h, weight, allowed = inputs(rng, batch)
    w = weight if layout == "vd" else weight.t().contiguous()
    out = STEP[step](h, w, allowed, layout=layout, out=poisoned(batch), tiles=SMALL)
    assert_logits(out, h, weight, allowed)


@pytest.mark.parametrize("step", [0, 1, 2, 3])
def test_matmul_steps_default_tiles(step, rng):
    h, weight, allowed = inputs(rng, 3, vocab=301, hidden=150)
    out = STEP[step](h, weight, allowed, out=poisoned(3, 301))
    assert_logits(out, h, weight, allowed)


def test_block_skip_leaves_no_block_unwritten_when_everything_is_skipped(rng):
    h, weight, allowed = inputs(rng, 2, kind="empty")
    out = mlh.step01_block_skip(h, weight, allowed, out=poisoned(2), tiles=SMALL)
    assert torch.all(out == float("-inf"))


# ------------------------------------------------------------------------------------------
# Steps 4-8 (compacted ids, batch 1) and steps 9-10 (a batch's union)
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tiles", [SMALL_ROWS, None], ids=["small", "default"])
@pytest.mark.parametrize("kind", MASK_KINDS)
def test_step04_compact(kind, tiles, rng):
    h, weight, allowed = inputs(rng, 1, kind=kind)
    out = mlh.step04_compact(h, weight, allowed, out=poisoned(1), tiles=tiles)
    assert_logits(out, h, weight, allowed)


@pytest.mark.parametrize("tiles", [SMALL_ROWS, None], ids=["small", "default"])
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("step", [5, 6, 7])
def test_one_wait_steps(step, kind, tiles, rng):
    """Steps 5 (one wait per row), 6 (the fill programs first) and 7 (the evict-first hint)."""
    h, weight, allowed = inputs(rng, 1, kind=kind)
    out = STEP[step](h, weight, allowed, out=poisoned(1), tiles=tiles)
    assert_logits(out, h, weight, allowed)


@pytest.mark.parametrize("tiles", [SMALL_ROWS, None], ids=["small", "default"])
def test_steps_5_to_7_differ_in_no_sum(tiles, rng):
    """Steps 6 and 7 change the order of the programs and the L2 policy, not a sum: at the same tiles their logits
    are step 5's bit for bit. Step 4 adds its chunks in another order: not the same bits (the check can fail)."""
    h, weight, allowed = inputs(rng, 1, vocab=211, hidden=300)
    five = mlh.step05_one_wait(h, weight, allowed, out=poisoned(1, 211), tiles=tiles)
    for step in (6, 7):
        assert torch.equal(STEP[step](h, weight, allowed, out=poisoned(1, 211), tiles=tiles), five), step
    chunks = mlh.formats.Tiles(block_b=1, block_v=4, block_d=32, fill_block=64, num_warps=4, num_stages=1)
    assert not torch.equal(mlh.step04_compact(h, weight, allowed, out=poisoned(1, 211), tiles=chunks), five)


@pytest.mark.parametrize("ids", [[], [0], [V - 1], [1, 16, 17, 32], list(range(V - 8, V))],
                         ids=["none", "first", "last", "aligned", "eight"])
@pytest.mark.parametrize("tiles", [SMALL_ROWS, None], ids=["small", "default"])
def test_step08_few_ids(ids, tiles, rng):
    h, weight, _ = inputs(rng, 1)
    allowed = mlh.AllowedTokens.from_ids([ids], V, device=DEV)
    assert allowed.few_ids == tuple(sorted(ids))
    out = mlh.step08_few_ids(h, weight, allowed, out=poisoned(1), tiles=tiles)
    assert_logits(out, h, weight, allowed)


def test_step08_refuses_more_than_its_slots(rng):
    h, weight, _ = inputs(rng, 1)
    allowed = mlh.AllowedTokens.from_ids([np.arange(mlh.FEW_IDS_MAX + 1)], V, device=DEV)
    assert allowed.few_ids is None
    with pytest.raises(ValueError, match=f"at most {mlh.FEW_IDS_MAX} allowed ids"):
        mlh.step08_few_ids(h, weight, allowed)


@pytest.mark.parametrize("step", [5, 6, 7, 8])
def test_batch1_steps_odd_hidden_size(step, rng):
    h, weight, allowed = inputs(rng, 1, vocab=97, hidden=1100, kind="few")  # D padded to 2048 in the tile
    out = STEP[step](h, weight, allowed, out=poisoned(1, 97))
    assert_logits(out, h, weight, allowed)


def test_batch1_steps_refuse_a_batch(rng):
    h, weight, allowed = inputs(rng, 2, kind="few")
    for step in (4, 5, 6, 7, 8):
        with pytest.raises(ValueError, match="one sequence"):
            STEP[step](h, weight, allowed)


def test_step04_odd_hidden_size(rng):
    h, weight, allowed = inputs(rng, 1, vocab=97, hidden=1100)  # two 1024-wide chunks, the second ragged
    out = mlh.step04_compact(h, weight, allowed, out=poisoned(1, 97))
    assert_logits(out, h, weight, allowed)


SMALL_UNION = mlh.formats.Tiles(block_b=16, block_v=16, block_d=32, fill_block=128, num_warps=4, num_stages=2)


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("batch", [1, 5, 33])
@pytest.mark.parametrize("step", [9, 10])
def test_union_steps(step, batch, kind, rng):
    """Step 9 (the union, a reduction per sequence) and step 10 (the union on the tensor cores); at batch 33 the
    last block of sequences holds one, so step 9's loop stops at the sequences that exist."""
    h, weight, allowed = inputs(rng, batch, kind=kind)
    out = STEP[step](h, weight, allowed, out=poisoned(batch), tiles=SMALL_UNION)
    assert_logits(out, h, weight, allowed)


@pytest.mark.parametrize("step", [9, 10])
def test_union_steps_keep_each_sequences_own_mask(step, rng):
    """Sequence 0 allows token 7 only, sequence 1 everything but 7: the union is the whole
    vocabulary, yet each row must see only its own set."""
    h = torch.randn(2, D, generator=rng).to(torch.bfloat16).to(DEV)
    weight = torch.randn(V, D, generator=rng).to(torch.bfloat16).to(DEV)
    allowed = mlh.AllowedTokens.from_ids([[7], [i for i in range(V) if i != 7]], V, device=DEV)
    out = STEP[step](h, weight, allowed, out=poisoned(2), tiles=SMALL_UNION)
    assert_logits(out, h, weight, allowed)
    assert torch.isfinite(out[0, 7]) and out[1, 7] == float("-inf")


@pytest.mark.parametrize("step", [9, 10])
def test_union_steps_default_tiles_fp16(step, rng):
    h, weight, allowed = inputs(rng, 9, vocab=150, hidden=200, dtype=torch.float16)
    out = STEP[step](h, weight, allowed, out=poisoned(9, 150))
    assert_logits(out, h, weight, allowed)


def test_step09_sums_each_row_once_per_sequence(rng):
    """Step 9's logit of a sequence is its own reduction: within the bound for one reduction per logit ("row"),
    and the same bits whether the sequence is alone or in a batch (the other sequences change no sum)."""
    h, weight, allowed = inputs(rng, 5, vocab=V, hidden=130)
    out = mlh.step09_union(h, weight, allowed, out=poisoned(5), tiles=SMALL_UNION)
    assert mlh.check_logits(out, h, weight, allowed, summation="row")["passed"]
    alone = mlh.AllowedTokens.from_mask(allowed.mask[2:3])
    one = mlh.step09_union(h[2:3].contiguous(), weight, alone, out=poisoned(1), tiles=SMALL_UNION)
    seen = alone.mask[0]
    assert torch.equal(one[0][seen], out[2][seen])


# ------------------------------------------------------------------------------------------
# Step 11: reordering
# ------------------------------------------------------------------------------------------

def test_cluster_order_is_a_permutation_that_makes_small_sets_contiguous():
    gen = np.random.default_rng(0)
    sets = mlh.masks.grammar_like_sets(40, 5000, gen, n_classes=60)
    order = mlh.cluster_order(sets, 5000)
    perm = order.perm.numpy()
    assert np.array_equal(np.sort(perm), np.arange(5000))
    smallest = min(sets, key=len)
    pos = np.sort(order.position[smallest])
    assert pos[-1] - pos[0] == len(smallest) - 1, "the smallest set should be one contiguous run"
    before = sum(mlh.reorder.active_blocks(s, 64) for s in sets)
    after = sum(mlh.reorder.active_blocks(s, 64, order) for s in sets)
    assert after < before


def test_active_blocks_counts_distinct_blocks():
    assert mlh.reorder.active_blocks(np.array([0, 1, 63, 64, 200]), 64) == 3
    order = mlh.reorder.VocabOrder(torch.tensor([3, 2, 1, 0], dtype=torch.int32))
    assert list(order.position) == [3, 2, 1, 0]
    assert mlh.reorder.active_blocks(np.array([3]), 2, order) == 1
    assert mlh.reorder.active_blocks(np.array([0, 3]), 2, order) == 2


@pytest.mark.parametrize("kind", ["random", "few", "all", "last"])
@pytest.mark.parametrize("batch", [1, 4])
def test_step11_reordered_writes_original_order(batch, kind, rng):
    h, weight, allowed = inputs(rng, batch, kind=kind)
    gen = np.random.default_rng(rng.seed_value)
    order = mlh.cluster_order(mlh.masks.grammar_like_sets(10, V, gen, n_classes=12), V)
    head = mlh.ReorderedHead.build(weight, mlh.reorder.VocabOrder(order.perm.to(DEV)))
    out = mlh.step11_reordered(h, head, allowed.permuted(head.order), out=poisoned(batch), tiles=SMALL)
    assert_logits(out, h, weight, allowed)


# ------------------------------------------------------------------------------------------
# AllowedTokens and mask generators
# ------------------------------------------------------------------------------------------

def test_allowed_tokens_from_ids_and_mask_agree():
    a = mlh.AllowedTokens.from_ids([[5, 1, 5, 9], []], 12, device="cpu")
    assert a.counts == (3, 0) and a.batch == 2 and a.union_ids.tolist() == [1, 5, 9] and a.few_ids == (1, 5, 9)
    assert mlh.AllowedTokens.from_ids([np.arange(12)], 12, device="cpu").few_ids is None
    assert a.union_ids.dtype == torch.int32
    b = mlh.AllowedTokens.from_mask(a.mask)
    assert torch.equal(b.mask, a.mask) and b.counts == a.counts
    one = mlh.AllowedTokens.from_mask(torch.tensor([False, True, True]))
    assert one.batch == 1 and one.mask[0].nonzero().flatten().tolist() == [1, 2]


def test_mask_generators():
    gen = np.random.default_rng(1)
    for sets in (mlh.masks.random_sets(100, 1000, 3, gen), mlh.masks.clustered_sets(700, 1000, 3, gen, run=128)):
        for s in sets:
            assert len(np.unique(s)) == len(s) and s.min() >= 0 and s.max() < 1000
    assert all(len(s) == 100 for s in mlh.masks.random_sets(100, 1000, 3, gen))
    assert all(len(s) == 700 for s in mlh.masks.clustered_sets(700, 1000, 3, gen, run=128))
    assert len(mlh.masks.clustered_sets(1000, 1000, 1, gen)[0]) == 1000


def test_real_masks_load_when_present():
    real = mlh.masks.real_sets()
    if real is None:
        pytest.skip("assets/data/fsm_masks.npz is not there yet (the FSM chapter exports it)")
    assert real.is_real and len(real.sets) == len(real.groups) > 0
    assert all(s.size == 0 or (s.min() >= 0 and s.max() < mlh.VOCAB) for s in real.sets)
    assert not any(g.endswith("[compact]") for g in real.groups)


def test_cross_fitting_never_fits_on_the_grammar_it_measures():
    gen = np.random.default_rng(3)
    sets = mlh.masks.grammar_like_sets(12, 400, gen, n_classes=15)
    data = mlh.masks.StructuredSets(sets, [f"g{i % 4}" for i in range(12)], "synthetic")
    orders, fold = mlh.masks.cross_fit_orders(data, 400)
    assert sorted(set(fold)) == [0, 1]
    for k in (0, 1):  # refitting on the other fold's sets alone gives the same order
        expected = mlh.cluster_order([s for s, f in zip(sets, fold) if f != k], 400)
        assert torch.equal(orders[k].perm, expected.perm)
    groups_by_fold = [{g for g, f in zip(data.groups, fold) if f == k} for k in (0, 1)]
    assert not groups_by_fold[0] & groups_by_fold[1]


# ------------------------------------------------------------------------------------------
# The error bound: tight enough to fail an output that lost fp32
# ------------------------------------------------------------------------------------------

def test_error_bound_is_fp32_accumulation_and_fails_a_bf16_output(rng):
    """At the benchmark's hidden size: the float64 logits rounded once to fp32 pass (fp32 accumulation can
    do no better); the same logits rounded to bf16 on the way (a kernel that accumulated in fp32 but kept a
    bf16 result, or a bf16 matmul cast up) fail at most allowed tokens, so a check of a few ids catches it."""
    d = mlh.HIDDEN
    assert mlh.formats.accumulation_depth(d) == 2 * (d // 16 + 4) and mlh.formats.accumulation_depth(d) * 7 < d
    assert mlh.formats.accumulation_depth(d, "row") == 2 * 4096 // 128 + 7
    h = torch.randn(1, d, generator=rng).to(torch.bfloat16)
    weight = (torch.randn(2000, d, generator=rng) * 0.02).to(torch.bfloat16)
    allowed = mlh.AllowedTokens.from_ids([np.arange(2000)], 2000, device="cpu")
    exact = h.double() @ weight.double().t()
    assert mlh.check_logits(exact.float(), h, weight, allowed)["passed"]
    rounded = exact.to(torch.bfloat16).float()
    dot = mlh.check_logits(rounded, h, weight, allowed)
    row = mlh.check_logits(rounded, h, weight, allowed, summation="row")
    assert not dot["passed"] and dot["over_bound"] > 0.3 * 2000, dot
    assert row["over_bound"] > 0.7 * 2000, row
    bound = mlh.formats.error_bound(h, weight)
    old = d * 2.0**-24 * (h.double().abs() @ weight.double().abs().t())
    assert torch.all(bound * 7 < old)
    for ids in ([5], [3, 700, 1999], list(range(0, 2000, 250))):  # the few-id paths' sizes
        few = mlh.AllowedTokens.from_ids([ids], 2000, device="cpu")
        out = exact.float().masked_fill(~few.mask, float("-inf"))
        assert mlh.check_logits(out, h, weight, few, summation="row")["passed"]
    eight = mlh.AllowedTokens.from_ids([list(range(0, 2000, 250))], 2000, device="cpu")
    out = rounded.masked_fill(~eight.mask, float("-inf"))
    assert not mlh.check_logits(out, h, weight, eight, summation="row")["passed"]

# ------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------

def _good():
    h = torch.randn(1, 8).to(torch.bfloat16)
    w = torch.randn(10, 8).to(torch.bfloat16)
    return h, w, mlh.AllowedTokens.from_ids([[1, 2]], 10, device="cpu")


@pytest.mark.parametrize("mutate, error, match", [
    (lambda h, w, a: (h, w, mlh.AllowedTokens.from_ids([[1]], 11, device="cpu")), ValueError, "mask length 11"),
    (lambda h, w, a: (h.float(), w, a), TypeError, "h must be bfloat16 or float16"),
    (lambda h, w, a: (h, w.to(torch.int8), a), TypeError, "weight must be bfloat16 or float16"),
    (lambda h, w, a: (h.half(), w, a), TypeError, "same dtype"),
    (lambda h, w, a: (h[0], w, a), ValueError, r"h must be 2-D.*h\[None\]"),
    (lambda h, w, a: (h, w.t().contiguous().t(), a), ValueError, "weight must be contiguous"),
    (lambda h, w, a: (h, torch.randn(10, 9).to(torch.bfloat16), a), ValueError, "hidden size 9"),
    (lambda h, w, a: (h.expand(2, 8).contiguous(), w, a), ValueError, "1 sequences but h has batch 2"),
    (lambda h, w, a: (h, w.to("meta"), a), ValueError, "one device"),
    (lambda h, w, a: (h, w, a.mask), TypeError, "allowed must be an AllowedTokens"),
    (lambda h, w, a: ([1.0], w, a), TypeError, "h must be a torch.Tensor"),
])
def test_bad_input(mutate, error, match):
    if runtime.mode() == "gpu":
        pytest.skip("these inputs are built on the CPU; the GPU run has its own device check")
    h, w, a = mutate(*_good())
    for fn in (mlh.masked_logits, mlh.step01_block_skip, mlh.step03_row_skip, mlh.step09_union, mlh.step10_batched):
        with pytest.raises(error, match=match):
            fn(h, w, a)


@pytest.mark.parametrize("ids, error, match", [
    ([[3, 10]], ValueError, r"token id 10, outside \[0, vocab_size=10\)"),
    ([[-1, 3]], ValueError, "token id -1"),
    ([[1.5]], TypeError, "integer token ids"),
    ([np.array([True, False])], TypeError, "from_mask"),
    ([[[1, 2]]], ValueError, "must be 1-D"),
    (np.array([1, 2]), TypeError, "one id array per sequence"),
    ([], ValueError, "is empty"),
])
def test_bad_ids(ids, error, match):
    with pytest.raises(error, match=match):
        mlh.AllowedTokens.from_ids(ids, 10, device="cpu")


@pytest.mark.parametrize("mask, error, match", [
    (torch.tensor([1, 0, 1]), TypeError, "torch.bool"),
    (torch.zeros(2, 3, 4, dtype=torch.bool), ValueError, r"\[V\] or \[B, V\]"),
    ([True, False], TypeError, "torch.Tensor"),
])
def test_bad_mask(mask, error, match):
    with pytest.raises(error, match=match):
        mlh.AllowedTokens.from_mask(mask)


def test_bad_layout_and_out():
    h, w, a = _good()
    with pytest.raises(ValueError, match="layout must be"):
        mlh.step01_block_skip(h, w, a, layout="vdx")
    with pytest.raises(ValueError, match="needs layout 'vd'"):
        mlh.step03_row_skip(h, w.t().contiguous(), a, layout="dv")
    with pytest.raises(ValueError, match="hidden size 10"):  # a [D, V] weight passed as if it were [V, D]
        mlh.step01_block_skip(h, torch.randn(8, 10).to(torch.bfloat16), a)
    with pytest.raises(TypeError, match=r"out must be a float32 tensor of shape \(1, 10\), contiguous, on cpu; got a "
                                         r"float16 tensor of shape \(1, 10\) on cpu"):
        mlh.step04_compact(h, w, a, out=torch.empty(1, 10, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"got a float32 tensor of shape \(1, 10\) on cpu, not contiguous"):
        mlh.step04_compact(h, w, a, out=torch.empty(1, 20)[:, ::2])
    with pytest.raises(TypeError, match=r"out must be .*; got a ndarray"):
        mlh.step04_compact(h, w, a, out=np.zeros((1, 10), np.float32))
    with pytest.raises(ValueError, match="power of two"):
        mlh.formats.Tiles(block_v=48)


# ------------------------------------------------------------------------------------------
# Full size on the GPU
# ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def full_head():
    weight = (torch.randn(mlh.VOCAB, mlh.HIDDEN, device="cuda") * 0.02).to(torch.bfloat16)
    return weight, weight.t().contiguous()


def _full_sets(kind, batch, gen):
    if kind in ("random_1000", "random_10000"):
        return mlh.masks.random_sets(int(kind.split("_")[1]), mlh.VOCAB, batch, gen)
    if kind == "clustered_5000":
        return mlh.masks.clustered_sets(5000, mlh.VOCAB, batch, gen)
    return make_sets(kind, mlh.VOCAB, batch, gen)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random_1000", "random_10000", "clustered_5000", "random", "empty", "all", "last",
                                  "few"])
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_full_size_every_step(batch, kind, full_head, rng):
    weight, weight_dv = full_head
    gen = np.random.default_rng(rng.seed_value)
    h = torch.randn(batch, mlh.HIDDEN, generator=rng).to(torch.bfloat16).cuda()
    allowed = mlh.AllowedTokens.from_ids(_full_sets(kind, batch, gen), mlh.VOCAB, device="cuda")
    runs = {
        "step00_vd": lambda out: mlh.step00_dense(h, weight, allowed, out=out),
        "step00_dv": lambda out: mlh.step00_dense(h, weight_dv, allowed, layout="dv", out=out),
        "step01_dv": lambda out: mlh.step01_block_skip(h, weight_dv, allowed, layout="dv", out=out),
        "step02_dv": lambda out: mlh.step02_column_skip(h, weight_dv, allowed, layout="dv", out=out),
        "step01_vd": lambda out: mlh.step01_block_skip(h, weight, allowed, out=out),
        "step02_vd": lambda out: mlh.step02_column_skip(h, weight, allowed, out=out),
        "step03": lambda out: mlh.step03_row_skip(h, weight, allowed, out=out),
        "step10": lambda out: mlh.step10_batched(h, weight, allowed, out=out),
        "cublas": lambda out: mlh.cublas_masked(h, weight, allowed, out=out),
        "step12": lambda out: mlh.step12_dispatch(h, weight, allowed, out=out),
        "masked_logits": lambda out: mlh.masked_logits(h, weight, allowed, out=out),
    }
    if batch == 1:
        for step in (4, 5, 6, 7):
            runs[f"step{step:02d}"] = lambda out, step=step: STEP[step](h, weight, allowed, out=out)
        if allowed.few_ids is not None:
            runs["step08"] = lambda out: mlh.step08_few_ids(h, weight, allowed, out=out)
    if batch <= 8 and allowed.union_count <= 20_000:  # step 9 reduces each row once per sequence: milliseconds
        runs["step09"] = lambda out: mlh.step09_union(h, weight, allowed, out=out)
    outs = {}
    for name, fn in runs.items():
        out = outs[name] = fn(torch.full((batch, mlh.VOCAB), float("nan"), device="cuda"))
        torch.cuda.synchronize()
        res = mlh.check_logits(out, h, weight, allowed)
        assert res["passed"], f"{name}: {res}"
    if batch == 1:  # steps 6 and 7 change the grid's order and the L2 policy, no sum: step 5's bits
        assert torch.equal(outs["step06"], outs["step05"]) and torch.equal(outs["step07"], outs["step05"])


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8])
def test_full_size_step11(batch, full_head, rng):
    weight, _ = full_head
    gen = np.random.default_rng(rng.seed_value)
    data = mlh.masks.structured_sets()
    orders, fold = mlh.masks.cross_fit_orders(data, mlh.VOCAB)
    head = mlh.ReorderedHead.build(weight, mlh.reorder.VocabOrder(orders[0].perm.cuda()))
    h = torch.randn(batch, mlh.HIDDEN, generator=rng).to(torch.bfloat16).cuda()
    chosen = gen.choice(len(data.sets), batch)
    allowed = mlh.AllowedTokens.from_ids([data.sets[i] for i in chosen], mlh.VOCAB, device="cuda")
    out = mlh.step11_reordered(h, head, allowed.permuted(head.order),
                               out=torch.full((batch, mlh.VOCAB), float("nan"), device="cuda"))
    torch.cuda.synchronize()
    res = mlh.check_logits(out, h, weight, allowed)
    assert res["passed"], res


@pytest.mark.gpu
def test_gpu_refuses_cpu_tensors():
    h, w, a = _good()
    with pytest.raises(ValueError, match="move h, weight and allowed to cuda"):
        mlh.masked_logits(h, w, a)
    with pytest.raises(ValueError, match="one device"):
        mlh.masked_logits(h.cuda(), w, a)


# ------------------------------------------------------------------------------------------
# What the compiler makes of steps 2 and 5 (sm_90 PTX, compiled offline)
# ------------------------------------------------------------------------------------------

def test_column_mask_on_the_seed_layout_costs_the_vector_loads():
    """Step 2 on [D, V] masks along the contiguous axis, so the weight tile can no longer travel
    as 16-byte async copies; on [V, D] (and in step 3) it still does."""
    loads = ptx_loads([(2, "dv", 1), (2, "vd", 1), (3, "vd", 1)])
    assert loads[(2, "dv", 1)].get("ld 2 B", 0) > 0
    for case in [(2, "vd", 1), (3, "vd", 1)]:
        assert loads[case].get("ld 2 B", 0) == 0 and loads[case].get("cp.async 16 B", 0) > 0, loads[case]


def test_step05_issues_every_row_load_before_the_first_barrier():
    """Step 4 reduces each 1,024-wide chunk (a barrier) before loading the next, so a program
    waits for memory once per chunk; step 5 loads the whole row, then reduces once."""
    groups = ptx_row_load_groups((4, 5), rows=2)
    assert groups[4] == [2, 2, 2], groups  # 3 chunks of D = 3072, one 16-byte load per row each
    assert groups[5] == [8], groups  # D padded to 4096: 4 loads per row, the 4th predicated off
