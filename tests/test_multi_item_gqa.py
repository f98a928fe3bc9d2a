"""Chapter 6 with grouped-query attention: ``k`` and ``v`` with fewer heads than ``q`` (Llama 3.1 8B has 32 query
heads and 8 key/value heads). Every step, in Triton's interpreter at small sizes no tile divides, against a float64
reference written here head by head (query head ``h`` reads key/value head ``h // group``), on fresh random inputs.
"""

import math

import pytest
import torch

from studylog import multi_item as mi
from studylog import runtime
from studylog.multi_item.steps import step06_packed_heads

DEV = runtime.device()
STEPS = mi.CHAPTER.steps

# (query heads, key/value heads): groups of 2, 3 and 4 (the benchmark's 32 / 8), and one key/value head for all
LAYOUTS = [(4, 2), (6, 2), (8, 2), (3, 1)]


def gqa_reference(q, k, v, batch, rule=mi.DEFAULT_RULE):
    """Float64 attention, one query head at a time, each reading its group's key/value head; rows that see no
    key are 0."""
    group = q.shape[0] // k.shape[0]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
        rows = slice(start, start + s)
        mask = mi.dense_mask(batch, b, rule).cpu()
        for h in range(q.shape[0]):
            kh, vh = k[h // group, rows].double().cpu(), v[h // group, rows].double().cpu()
            scores = (q[h, rows].double().cpu() @ kh.T) / math.sqrt(q.shape[-1])
            probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
            out[h, rows] = probs @ vh
    return out


def qkv(heads, kv_heads, tokens, head_dim, rng, dtype=torch.float32):
    q = torch.randn(heads, tokens, head_dim, generator=rng).to(DEV, dtype)
    k, v = (torch.randn(kv_heads, tokens, head_dim, generator=rng).to(DEV, dtype) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
@pytest.mark.parametrize("heads, kv_heads", LAYOUTS, ids=str)
def test_every_step_with_fewer_key_value_heads(step, heads, kv_heads, rng):
    prefixes, items = ([37], [[5, 13, 2, 8]]) if step.number < 5 else ([29, 0, 11], [[6, 1, 17], [4, 3], [9]])
    batch = mi.MultiItemBatch.from_item_lens(prefixes, items, device=DEV)
    q, k, v = qkv(heads, kv_heads, batch.total_tokens, 16, rng)
    out = step.function(q, k, v, batch, out=torch.full_like(q, float("nan")))
    assert not torch.isnan(out).any(), f"{step.name} left rows unwritten"
    want = gqa_reference(q, k, v, batch)
    torch.testing.assert_close(out.double().cpu(), want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{step.name}: {m}")
    # the library's reference agrees with the one written here
    torch.testing.assert_close(mi.reference_attention(q, k, v, batch).cpu(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("order", mi.SCHEDULE_ORDERS)
def test_step5_orders_and_unequal_blocks_with_groups(order, rng):
    batch = mi.MultiItemBatch.from_item_lens([21, 5, 0], [[6, 17, 1, 9, 3], [2, 2], [7]], device=DEV)
    q, k, v = qkv(8, 2, batch.total_tokens, 16, rng)
    out, info = mi.step05_batched(q, k, v, batch, order=order, blocks=(32, 16), count_tiles=True,
                                  out=torch.full_like(q, float("nan")), return_info=True)
    torch.testing.assert_close(out.double().cpu(), gqa_reference(q, k, v, batch), rtol=1e-5, atol=1e-5)
    assert info.tile_counts == mi.planned_key_tiles(batch, 32, 16)


def test_grouped_heads_equal_repeated_heads(rng):
    """Grouped keys and values give what the same keys and values copied to every query head give: bit for bit
    in step 5 (the same tiles); through the entry point (step 6 for the groups, step 5 for the copies: other
    tiles, another summation order) to float16 rounding."""
    batch = mi.MultiItemBatch.from_item_lens([13, 30], [[3, 11], [1, 1, 4]], device=DEV)
    q, k, v = qkv(6, 3, batch.total_tokens, 32, rng, torch.float16)
    k2, v2 = k.repeat_interleave(2, 0), v.repeat_interleave(2, 0)
    torch.testing.assert_close(mi.step05_batched(q, k, v, batch), mi.step05_batched(q, k2, v2, batch), rtol=0, atol=0)
    torch.testing.assert_close(mi.multi_item_attention(q, k, v, batch), mi.multi_item_attention(q, k2, v2, batch),
                               rtol=2e-3, atol=2e-3)


def test_bad_head_counts_are_named():
    batch = mi.MultiItemBatch.from_item_lens([5], [[3, 2, 6]], device=DEV)
    q = torch.randn(3, batch.total_tokens, 16, device=DEV)
    k = torch.randn(2, batch.total_tokens, 16, device=DEV)
    with pytest.raises(ValueError, match=r"q's heads \(3\) must be a multiple of k's and v's heads \(2\)"):
        mi.multi_item_attention(q, k, k.clone(), batch)
    with pytest.raises(ValueError, match="one shape"):
        mi.multi_item_attention(q, k, torch.randn(1, batch.total_tokens, 16, device=DEV), batch)


def test_the_plan_with_fewer_key_value_heads(rng):
    """MultiItemPlan over two layouts with 6 query heads and 2 key/value heads: each batch's rows match the float64
    reference, the rows past it are left alone; k and v of the query heads' shape are refused by name."""
    plan = mi.MultiItemPlan(heads=6, kv_heads=2, head_dim=16, dtype=torch.float32, max_tokens=90, max_prompts=3,
                            device=DEV)
    for prefixes, items in (([23, 4], [[5, 1, 12], [3]]), ([0, 31, 9], [[2, 2], [17], [1, 6]])):
        batch = mi.MultiItemBatch.from_item_lens(prefixes, items, device=DEV)
        plan.set_layout(batch)
        q, k, v = qkv(6, 2, 90, 16, rng)
        out = plan.run(q, k, v, torch.full_like(q, float("nan")))
        n = batch.total_tokens
        torch.testing.assert_close(out[:, :n].double().cpu(), gqa_reference(q[:, :n], k[:, :n], v[:, :n], batch),
                                   rtol=1e-5, atol=1e-5)
        assert torch.isnan(out[:, n:]).all()
    with pytest.raises(ValueError, match=r"k must be a float32 tensor of shape \(2, 90, 16\)"):
        plan.run(q, q, v, torch.empty_like(q))
    with pytest.raises(ValueError, match=r"heads \(6\) must be a multiple of kv_heads \(4\)"):
        mi.MultiItemPlan(heads=6, kv_heads=4, head_dim=16, dtype=torch.float32, max_tokens=90, max_prompts=3)


def test_the_operator_with_fewer_key_value_heads(rng):
    batch = mi.MultiItemBatch.from_item_lens([14, 0], [[3, 9, 1], [5, 5]], device=DEV)
    q, k, v = qkv(4, 1, batch.total_tokens, 16, rng)
    schedule, token_pos, programs = mi.ops.layout(batch, q, kv_heads=1)
    out = mi.ops.multi_item_attention(q, k, v, schedule, token_pos, programs)
    torch.testing.assert_close(out.double().cpu(), gqa_reference(q, k, v, batch), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"q's heads \(4\) must be a multiple of k's and v's heads \(3\)"):
        k3 = torch.randn(3, batch.total_tokens, 16, device=DEV)
        mi.ops.multi_item_attention(q, k3, k3.clone(), schedule, token_pos, programs)


# --------------------------------------------------------------------------------------------
# Step 6: the query heads of a group in one tile, rows (token, head in the group)
# --------------------------------------------------------------------------------------------

MIXED = ([21, 5, 0], [[6, 17, 1, 9, 3], [2, 2], [7]])


@pytest.mark.parametrize("blocks", [None, (32, 16), (16, 32)], ids=str)
def test_step6_without_groups_is_step5(blocks, rng):
    """One key/value head per query head: a row per token, the tiles and the arithmetic of step 5, bit for bit."""
    batch = mi.MultiItemBatch.from_item_lens(*MIXED, device=DEV)
    q, k, v = qkv(3, 3, batch.total_tokens, 16, rng)
    want = mi.step05_batched(q, k, v, batch, blocks=blocks)
    got = step06_packed_heads(q, k, v, batch, blocks=blocks, out=torch.full_like(q, float("nan")))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("order", mi.SCHEDULE_ORDERS)
@pytest.mark.parametrize("heads, kv_heads, blocks", [(8, 2, (16, 32)), (6, 2, (32, 16))], ids=str)
def test_step6_orders_unequal_blocks_and_tile_counts(order, heads, kv_heads, blocks, rng):
    """Every program order and unequal blocks (groups of 4 and of 3, whose 16- or 32-row tiles leave a row
    unused); the key tiles counted per token tile are the plan's at BLOCK_M // group tokens."""
    batch = mi.MultiItemBatch.from_item_lens(*MIXED, device=DEV)
    q, k, v = qkv(heads, kv_heads, batch.total_tokens, 16, rng)
    poisoned = torch.full_like(q, float("nan"))
    out, info = step06_packed_heads(q, k, v, batch, order=order, blocks=blocks, count_tiles=True, out=poisoned,
                                    return_info=True)
    assert out is poisoned and not torch.isnan(out).any()
    torch.testing.assert_close(out.double().cpu(), gqa_reference(q, k, v, batch), rtol=1e-5, atol=1e-5)
    tokens = blocks[0] // (heads // kv_heads)
    assert (info.block_m, info.block_n) == blocks
    assert info.tile_counts == mi.planned_key_tiles(batch, tokens, blocks[1])
    assert [len(c) for c in info.tile_counts] == [-(-s // tokens) for s in batch.seq_lens]


@pytest.mark.parametrize("rule", mi.RULES)
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (6, 2), (16, 1)], ids=str)
def test_step6_both_rules_empty_prefixes_and_one_token_items(rule, heads, kv_heads, rng):
    """Prompts with no prefix (under FlashInfer's rule their delimiters see nothing: 0) and one-token items;
    a group of 16 fills a 16-row tile with one token."""
    batch = mi.MultiItemBatch.from_item_lens([0, 3, 0], [[1, 1, 1], [1], [2, 1]], device=DEV)
    q, k, v = qkv(heads, kv_heads, batch.total_tokens, 16, rng)
    out = step06_packed_heads(q, k, v, batch, rule=rule, out=torch.full_like(q, float("nan")))
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.double().cpu(), gqa_reference(q, k, v, batch, rule), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, mi.step05_batched(q, k, v, batch, rule=rule), rtol=1e-6, atol=1e-6)


def test_step6_plans_token_tiles_of_block_m_over_the_group():
    """The table row BLOCK_M selects holds step 5's order over key/value heads at BLOCK_M // group tokens; step
    5's tables are unchanged."""
    batch = mi.MultiItemBatch.from_item_lens(*MIXED, device=DEV)
    table, programs = mi.tiles.schedule_table(batch, 2, "head_groups", (16, 32), 2 * 16 * 4, rows_per_token=3)
    for row, block_m in ((0, 16), (1, 32)):
        want = mi.tiles.work_order(batch, 2, block_m // 3, "head_groups", 2 * 16 * 4)
        assert programs[block_m] == len(want)
        assert torch.equal(table[row, : len(want), :3].cpu().long(), want)
    plain = mi.tiles.schedule_table(batch, 2, "head_groups", (16, 32), 2 * 16 * 4)
    assert torch.equal(plain[0], mi.tiles.schedule_table(batch, 2, "head_groups", (16, 32), 2 * 16 * 4,
                                                         rows_per_token=1)[0])
    with pytest.raises(ValueError, match=r"rows_per_token must be an int from 1 to the smallest tile height \(16\)"):
        mi.tiles.schedule_table(batch, 2, block_ms=(16, 32), rows_per_token=17)


def test_step6_bad_inputs_are_named():
    batch = mi.MultiItemBatch.from_item_lens([5], [[3, 2, 6]], device=DEV)
    q = torch.randn(3, batch.total_tokens, 16, device=DEV)
    k = torch.randn(2, batch.total_tokens, 16, device=DEV)
    with pytest.raises(ValueError, match=r"q's heads \(3\) must be a multiple of k's and v's heads \(2\)"):
        step06_packed_heads(q, k, k.clone(), batch)
    q32, k1 = torch.randn(32, batch.total_tokens, 16, device=DEV), torch.randn(1, batch.total_tokens, 16, device=DEV)
    with pytest.raises(ValueError, match="BLOCK_M must be at least 32, got 16"):
        step06_packed_heads(q32, k1, k1.clone(), batch)
    with pytest.raises(ValueError, match="order must be one of"):
        step06_packed_heads(q, q, q, batch, order="random")
    with pytest.raises(ValueError, match="powers of two"):
        step06_packed_heads(q, q, q, batch, blocks=(24, 16))


@pytest.mark.parametrize("heads, kv_heads", LAYOUTS, ids=str)
def test_the_entry_point_takes_step_6_with_groups(heads, kv_heads, rng):
    """Under grouped-query attention the entry point is step 6 (bit for bit), and it matches the reference."""
    batch = mi.MultiItemBatch.from_item_lens([13, 0], [[4, 1, 7], [2, 5]], device=DEV)
    q, k, v = qkv(heads, kv_heads, batch.total_tokens, 16, rng)
    got = mi.multi_item_attention(q, k, v, batch, out=torch.full_like(q, float("nan")))
    torch.testing.assert_close(got, mi.step06_packed_heads(q, k, v, batch), rtol=0, atol=0)
    torch.testing.assert_close(got.double().cpu(), gqa_reference(q, k, v, batch), rtol=1e-5, atol=1e-5)
