"""Chapter 6: multi-item scoring attention.

Interpreter-mode tests run every step at tiny, awkward shapes (sequences under 100 tokens, block 16) against
a float64 reference; the ``gpu`` tests run the benchmark's shapes in bf16 against a float32 reference.
"""

import math

import pytest
import torch

from book.multi_item import figures, lesson
from book.multi_item.exercises import TILE_SKIPPED, TILE_WHOLE, tile_map
from book.multi_item.lesson import bounded_key_tiles, kv_in_flight
from studylog import multi_item as mi
from studylog import plotting, runtime
from studylog.multi_item import report

DEV = runtime.device()
STEPS = mi.CHAPTER.steps
TRITON_STEPS = [s for s in STEPS if s.language == "triton"]
ONE_PROMPT_STEPS = [mi.step02_dense_mask, mi.step03_mask_on_the_fly, mi.step04_tile_skip]

# (prefix length, item lengths): the edge cases, at lengths no tile size divides
SHAPES = {
    "awkward": (37, [5, 13, 2, 8]),       # 70 tokens
    "empty_prefix": (0, [5, 3, 9]),
    "items_of_length_1": (11, [1, 1, 1, 1, 1]),
    "one_item": (20, [7]),
    "item_longer_than_tiles": (9, [40, 3]),
    "many_short_items": (3, [2] * 10),
}


def rule_mask(prefix_len: int, item_lens: list[int], rule: str = "flashinfer") -> torch.Tensor:
    """The rule, written token by token from its statement (shares no code with the package)."""
    n = prefix_len + sum(item_lens) + len(item_lens) + 1
    see_delimiter = rule == "delimiter_visible"
    mask = torch.zeros(n, n, dtype=torch.bool)
    for t in range(prefix_len):  # prefix: causal
        mask[t, : t + 1] = True
    delim = prefix_len
    for length in item_lens + [None]:
        mask[delim, :prefix_len] = True  # a delimiter: the prefix (and itself when delimiters are visible)
        mask[delim, delim] = see_delimiter
        if length is None:
            break
        for t in range(delim + 1, delim + 1 + length):  # an item token: the prefix, its item so far
            mask[t, :prefix_len] = True
            mask[t, delim + 1: t + 1] = True
            mask[t, delim] = see_delimiter  # (and its delimiter when delimiters are visible)
        delim += length + 1
    return mask


def flashinfer_keeps(q: int, kv: int, prefix_len: int, token_pos_in_items: list[int]) -> bool:
    """FlashInfer's condition, copied by hand from ``logits_mask_multi_item_scoring``
    (include/flashinfer/attention/prefill.cuh) for one query and one key of a prompt whose queries are all its
    tokens (``qo_len == kv_len``, so ``idx_in_original_seq == q``), no sliding window, no chunking::

        out_of_boundary = kv_idx > idx_in_original_seq || ...;
        is_prefix = idx_in_original_seq < prefix_len;
        if (out_of_boundary || is_prefix) keep = !out_of_boundary;
        else keep = kv_idx < prefix_len | (idx_in_original_seq < kv_idx + token_pos_in_items[idx - prefix_len]);
    """
    out_of_boundary = kv > q
    is_prefix = q < prefix_len
    if out_of_boundary or is_prefix:
        return not out_of_boundary
    return kv < prefix_len or q < kv + token_pos_in_items[q - prefix_len]


def flashinfer_mask(prefix_len: int, token_pos_in_items: list[int]) -> torch.Tensor:
    """Every (query, key) of one prompt through :func:`flashinfer_keeps`, element by element."""
    n = prefix_len + len(token_pos_in_items)
    return torch.tensor([[flashinfer_keeps(q, kv, prefix_len, token_pos_in_items) for kv in range(n)]
                         for q in range(n)])


def flashinfer_positions(item_lens: list[int]) -> list[int]:
    """FlashInfer's ``token_pos_in_items`` for one prompt, built as its docstring states it: 0 at every
    delimiter, 1, 2, ... inside an item (``[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 0]`` for items of 3, 2, 4)."""
    out = [0]
    for n in item_lens:
        out += list(range(1, n + 1)) + [0]
    return out


def masked_reference(q, k, v, masks, seq_lens):
    """Float64 attention under given per-prompt masks; a row with no key is 0 (FlashInfer writes 0 there)."""
    out, start = torch.zeros(q.shape, dtype=torch.float64), 0
    for mask, s in zip(masks, seq_lens):
        rows = slice(start, start + s)
        scores = (q[:, rows].double().cpu() @ k[:, rows].double().cpu().transpose(-1, -2)) / math.sqrt(q.shape[-1])
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
        out[:, rows] = probs @ v[:, rows].double().cpu()
        start += s
    return out


def random_qkv(heads, tokens, head_dim, rng, dtype=torch.float32):
    return [torch.randn(heads, tokens, head_dim, generator=rng).to(DEV, dtype) for _ in range(3)]


def poisoned(q):
    return torch.full_like(q, float("nan"))


# --------------------------------------------------------------------------------------------
# The layout and the mask
# --------------------------------------------------------------------------------------------

def test_layout_matches_the_seed_example():
    batch = mi.MultiItemBatch.from_item_lens([4], [[3, 2, 4]], device="cpu")
    assert batch.token_pos[0].tolist() == [0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 0]
    assert batch.seq_lens == (4 + 13,)
    assert batch.max_item_lens_t.tolist() == [4]
    # the token before each closing delimiter: the last token of items 1, 2, 3
    assert batch.score_positions() == [4 + 3, 4 + 6, 4 + 11]


def test_layout_from_the_seeds_padded_positions():
    pos = [0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 0] + [0] * 7 + [0, 1, 0] + [0] * 17
    batch = mi.MultiItemBatch.from_token_positions(
        torch.tensor([5, 0], dtype=torch.uint32), torch.tensor(pos, dtype=torch.uint16),
        torch.tensor([4, 1], dtype=torch.uint16), token_pos_in_items_len=20, seq_lens=[18, 3], device="cpu")
    assert batch.item_lens == ((3, 2, 4), (1,))
    assert batch.seq_lens == (18, 3) and batch.seq_starts == (0, 18)
    assert batch.cu_seqlens.tolist() == [0, 18, 21]
    assert batch.score_positions() == [8, 11, 16, 18 + 1]


@pytest.mark.parametrize("rule", mi.RULES)
@pytest.mark.parametrize("prefix_len, item_lens", list(SHAPES.values()) + [(10, []), (0, [1]), (0, [])], ids=str)
def test_dense_mask_is_the_stated_rule(prefix_len, item_lens, rule):
    batch = mi.MultiItemBatch.from_item_lens([prefix_len], [item_lens], device=DEV)
    assert torch.equal(mi.dense_mask(batch, rule=rule).cpu(), rule_mask(prefix_len, item_lens, rule))


def random_layouts(rng, count=40):
    """Random prompts with the edge cases in: no prefix, no item, items of length 1, a single long item."""
    layouts = [(0, []), (0, [1]), (1, [1]), (0, [1, 1, 1]), (5, []), (3, [17]), (0, [2, 1, 3])]
    for _ in range(count):
        prefix = int(torch.randint(0, 30, (), generator=rng))
        items = torch.randint(1, 9, (int(torch.randint(0, 7, (), generator=rng)),), generator=rng)
        items[torch.rand(items.shape, generator=rng) < 0.3] = 1
        layouts.append((prefix, items.tolist()))
    return layouts


def test_default_mask_is_flashinfers_condition_element_by_element(rng):
    """The default rule against the hand-written copy of FlashInfer's kernel condition, on random prompts
    given to the layout the way FlashInfer takes them (prefix length, padded token positions, max item)."""
    assert mi.DEFAULT_RULE == "flashinfer"
    layouts = random_layouts(rng)
    width = max(len(flashinfer_positions(items)) for _, items in layouts) + 3  # FlashInfer's zero padding
    pos = sum((flashinfer_positions(items) + [0] * (width - len(flashinfer_positions(items)))
               for _, items in layouts), [])
    batch = mi.MultiItemBatch.from_token_positions(
        torch.tensor([p for p, _ in layouts], dtype=torch.uint32), torch.tensor(pos, dtype=torch.uint16),
        torch.tensor([max(items, default=0) for _, items in layouts], dtype=torch.uint16),
        token_pos_in_items_len=width, device=DEV)
    for b, (prefix, items) in enumerate(layouts):
        want = flashinfer_mask(prefix, flashinfer_positions(items))
        assert torch.equal(mi.dense_mask(batch, b).cpu(), want), (prefix, items)
        assert torch.equal(mi.dense_mask(batch, b, "flashinfer").cpu(), want)
        # the other rule adds exactly the delimiter keys: an item's opening delimiter, a delimiter itself
        extra = mi.dense_mask(batch, b, "delimiter_visible").cpu() & ~want
        delims = [prefix + i for i, x in enumerate(flashinfer_positions(items)) if x == 0]
        assert extra.any(dim=0).nonzero().flatten().tolist() == (delims[:len(items) + 1] if extra.any() else [])
        assert not (want & ~mi.dense_mask(batch, b, "delimiter_visible").cpu()).any()


@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
def test_every_step_computes_flashinfers_rule(step, rng):
    """Every step by default against attention under the hand-written FlashInfer condition (no code of the
    package's mask): the layouts' edge cases, each prompt alone (steps 1 to 4) or all in one batch (steps 5, 6)."""
    layouts = [(0, [1, 1, 2]), (3, [1]), (6, [1, 4, 1, 1]), (0, []), (2, [9, 1])]
    batches = ([(mi.MultiItemBatch.from_item_lens([p], [items], device=DEV), [(p, items)]) for p, items in layouts]
               if step.number < 5 else
               [(mi.MultiItemBatch.from_item_lens([p for p, _ in layouts], [i for _, i in layouts], device=DEV),
                 layouts)])
    for batch, prompts in batches:
        q, k, v = random_qkv(2, batch.total_tokens, 16, rng)
        want = masked_reference(q, k, v, [flashinfer_mask(p, flashinfer_positions(i)) for p, i in prompts],
                                batch.seq_lens)
        out = step.function(q, k, v, batch, out=poisoned(q))
        torch.testing.assert_close(out.double().cpu(), want, rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{step.name} {prompts}, seed {rng.seed_value}: {m}")


def test_rules_score_differently_on_one_example(rng):
    """Same model, same inputs: the two rules give different outputs on every item row and on the
    delimiters, the same on the prefix."""
    batch = mi.MultiItemBatch.from_item_lens([6], [[3, 1, 2]], device=DEV)
    q, k, v = random_qkv(2, batch.total_tokens, 16, rng, torch.float64)
    a = mi.reference_attention(q, k, v, batch, rule="flashinfer")
    b = mi.reference_attention(q, k, v, batch, rule="delimiter_visible")
    differ = (a - b).abs().amax(dim=(0, 2)) > 1e-9
    assert differ.tolist() == [False] * 6 + [True] * (batch.total_tokens - 6)


@pytest.mark.parametrize("rule", mi.RULES)
def test_each_item_sees_what_a_separate_pass_sees(rule, rng):
    """What each rule equals: under FlashInfer's, the rows of ``item_i`` are causal attention over
    ``prefix item_i``; with visible delimiters, the rows of ``<d> item_i`` over ``prefix <d> item_i``."""
    prefix_len, item_lens = 13, [4, 9, 1, 6]
    batch = mi.MultiItemBatch.from_item_lens([prefix_len], [item_lens], device=DEV)
    q, k, v = random_qkv(2, batch.total_tokens, 16, rng, torch.float64)
    packed = mi.reference_attention(q, k, v, batch, rule=rule)
    delim, first = prefix_len, 1 if rule == "flashinfer" else 0
    for n in item_lens:
        rows = list(range(delim + first, delim + n + 1))
        idx = list(range(prefix_len)) + rows
        alone = torch.nn.functional.scaled_dot_product_attention(q[:, idx], k[:, idx], v[:, idx], is_causal=True)
        torch.testing.assert_close(packed[:, rows], alone[:, prefix_len:], rtol=1e-12, atol=1e-12)
        delim += n + 1


@pytest.mark.parametrize("rule", mi.RULES)
@pytest.mark.parametrize("blocks", [(16, 16), (32, 16), (16, 32), (128, 64)], ids=str)
def test_tile_map_skips_only_invisible_tiles_and_unmasks_only_whole_ones(blocks, rule):
    bm, bn = blocks
    for prefix_len, item_lens in list(SHAPES.values()) + [(300, [20] * 12), (130, [1, 60, 2, 33]), (31, [1] * 40)]:
        batch = mi.MultiItemBatch.from_item_lens([prefix_len], [item_lens], device=DEV)
        mask, tiles = rule_mask(prefix_len, item_lens, rule), tile_map(batch, bm, bn, rule=rule)
        for t in range(tiles.shape[0]):
            for u in range(tiles.shape[1]):
                block = mask[t * bm:(t + 1) * bm, u * bn:(u + 1) * bn]
                if tiles[t, u] == TILE_SKIPPED:
                    assert not block.any(), f"tile {(t, u)} holds visible pairs but is skipped"
                elif tiles[t, u] == TILE_WHOLE:
                    assert block.all() and block.shape[1] == bn, f"tile {(t, u)} is not whole but unmasked"


def test_tile_stats_order():
    batch = mi.MultiItemBatch.from_item_lens([300], [[20] * 12], device=DEV)
    stats = mi.tile_stats(batch, 32, 16)
    assert stats.total > stats.causal > stats.visited >= stats.needed > 0
    assert stats.visible_pairs < stats.causal_pairs
    assert 0 < stats.skipped_vs_causal < stats.skipped_fraction < 1


def flashinfer_key_tile_loop(kv_len: int, prefix_len: int, max_item_len: int, cta_tile_q: int,
                             cta_tile_kv: int) -> list[list[int]]:
    """The key tiles FlashInfer's multi-item prefill visits for each query tile, copied by hand from the loop
    bounds of its paged prefill kernel (include/flashinfer/attention/prefill.cuh) for a prompt whose queries
    are all its tokens (``qo_len == kv_len``), ``group_size`` 1 and no split of the keys (``chunk_start`` 0,
    ``chunk_size`` ``kv_len``)::

        num_iterations_prefix = ceil_div(min(min(chunk_size, sub_if_greater_or_zero(
            kv_len - qo_len + ceil_div(((qo_tile_idx + 1) * CTA_TILE_Q), group_size), chunk_start)),
            sub_if_greater_or_zero(prefix_len, chunk_start)), CTA_TILE_KV);
        num_iterations_mask = max(min(chunk_size, sub_if_greater_or_zero(sub_if_greater_or_zero(
            kv_len - qo_len + ceil_div((qo_tile_idx * CTA_TILE_Q), group_size), max_item_len),
            chunk_start)) / (CTA_TILE_KV), num_iterations_prefix);
        num_iterations = max(num_iterations_mask, ceil_div(min(chunk_size, sub_if_greater_or_zero(
            kv_len - qo_len + ceil_div(((qo_tile_idx + 1) * CTA_TILE_Q), group_size), chunk_start)),
            CTA_TILE_KV));
        for (iter = 0; iter < num_iterations;
             iter = (iter + 1 == num_iterations_prefix) ? num_iterations_mask : (iter + 1))
    """
    def ceil_div(a, b):
        return (a + b - 1) // b

    def sub_if_greater_or_zero(a, b):
        return a - b if a > b else 0

    qo_len, group_size, chunk_start, chunk_size = kv_len, 1, 0, kv_len
    out = []
    for qo_tile_idx in range(ceil_div(qo_len, cta_tile_q)):
        causal_end = min(chunk_size, sub_if_greater_or_zero(
            kv_len - qo_len + ceil_div((qo_tile_idx + 1) * cta_tile_q, group_size), chunk_start))
        num_iterations_prefix = ceil_div(min(causal_end, sub_if_greater_or_zero(prefix_len, chunk_start)),
                                         cta_tile_kv)
        num_iterations_mask = max(min(chunk_size, sub_if_greater_or_zero(sub_if_greater_or_zero(
            kv_len - qo_len + ceil_div(qo_tile_idx * cta_tile_q, group_size), max_item_len), chunk_start))
            // cta_tile_kv, num_iterations_prefix)
        num_iterations = max(num_iterations_mask, ceil_div(causal_end, cta_tile_kv))
        visited, it = [], 0
        while it < num_iterations:
            visited.append(it)
            it = num_iterations_mask if it + 1 == num_iterations_prefix else it + 1
        out.append(visited)
    return out


@pytest.mark.parametrize("blocks", [(16, 16), (32, 16), (16, 32), (64, 64), (128, 64)], ids=str)
def test_flashinfers_bound_visits_what_its_loop_visits_and_never_fewer_tiles_than_the_exact_start(blocks):
    bm, bn = blocks
    cases = list(SHAPES.values()) + [(300, [20] * 12), (130, [1, 60, 2, 33]), (31, [1] * 40), (200, [90, 3]),
                                     (0, [5] * 20)]  # an empty prefix: FlashInfer's loop never jumps
    for prefix_len, item_lens in cases:
        batch = mi.MultiItemBatch.from_item_lens([prefix_len], [item_lens], device=DEV)
        loop = flashinfer_key_tile_loop(batch.seq_lens[0], prefix_len, max(item_lens), bm, bn)
        bounded = bounded_key_tiles(batch, bm, bn)[0]
        assert bounded == [len(v) for v in loop], (prefix_len, item_lens)
        exact = tile_map(batch, bm, bn) != TILE_SKIPPED
        mask = rule_mask(prefix_len, item_lens)
        for t, visited in enumerate(loop):
            # the bound skips no tile that holds a visible pair, and the exact start visits a subset of its tiles
            needed = {u for u in range(exact.shape[1]) if mask[t * bm:(t + 1) * bm, u * bn:(u + 1) * bn].any()}
            assert needed <= set(visited), (prefix_len, item_lens, t)
            assert set(exact[t].nonzero().flatten().tolist()) <= set(visited), (prefix_len, item_lens, t)
    # a batch: prompt by prompt, with each prompt's own longest item
    batch = mi.MultiItemBatch.from_item_lens(*MIXED, device=DEV)
    assert bounded_key_tiles(batch, bm, bn) == [
        [len(v) for v in flashinfer_key_tile_loop(s, p, max(items, default=0), bm, bn)]
        for s, p, items in zip(batch.seq_lens, MIXED[0], MIXED[1])]


# --------------------------------------------------------------------------------------------
# Every step against the float64 reference, in the interpreter at tiny shapes
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
@pytest.mark.parametrize("shape", list(SHAPES), ids=str)
def test_every_step_matches_the_float64_reference(step, shape, rng):
    prefix_len, item_lens = SHAPES[shape]
    batch = mi.MultiItemBatch.from_item_lens([prefix_len], [item_lens], device=DEV)
    head_dim = 32 if shape == "awkward" else 16
    q, k, v = random_qkv(2, batch.total_tokens, head_dim, rng)
    out = step.function(q, k, v, batch, out=poisoned(q))
    assert not torch.isnan(out).any(), f"{step.name} left rows unwritten (seed {rng.seed_value})"
    torch.testing.assert_close(out.double(), mi.reference_attention(q, k, v, batch), rtol=1e-5, atol=1e-5,
                               msg=lambda m: f"{step.name}, seed {rng.seed_value}: {m}")


def test_the_entry_point_is_step_5(rng):
    """The entry point is step 5; the chapter's last step (6) packs grouped-query heads and is tested with them."""
    assert mi.CHAPTER.step(5).function is mi.step05_batched and mi.CHAPTER.final.number == 6
    batch = mi.MultiItemBatch.from_item_lens([7, 2], [[3, 1], [5]], device=DEV)
    q, k, v = random_qkv(2, batch.total_tokens, 16, rng)
    torch.testing.assert_close(mi.multi_item_attention(q, k, v, batch), mi.step05_batched(q, k, v, batch),
                               rtol=0, atol=0)


@pytest.mark.parametrize("step", [mi.step04_tile_skip, mi.step05_batched], ids=lambda f: f.__name__)
@pytest.mark.parametrize("blocks", [(32, 16), (16, 32)], ids=str)
def test_tile_skipping_with_unequal_blocks(step, blocks, rng):
    """Block rows and columns of different sizes move every phase boundary of steps 4 and 5."""
    batch = mi.MultiItemBatch.from_item_lens([21], [[6, 17, 1, 9, 3]], device=DEV)
    q, k, v = random_qkv(3, batch.total_tokens, 16, rng)
    out, info = step(q, k, v, batch, out=poisoned(q), blocks=blocks, count_tiles=True, return_info=True)
    torch.testing.assert_close(out.double(), mi.reference_attention(q, k, v, batch), rtol=1e-5, atol=1e-5)
    assert (info.block_m, info.block_n) == blocks
    assert info.tile_counts == mi.planned_key_tiles(batch, *blocks)


def test_tile_skipping_visits_fewer_tiles_than_causal():
    batch = mi.MultiItemBatch.from_item_lens([40], [[5] * 9], device=DEV)  # 95 tokens
    q, k, v = [torch.ones(1, batch.total_tokens, 16, device=DEV) for _ in range(3)]
    _, info = mi.step04_tile_skip(q, k, v, batch, count_tiles=True, blocks=(16, 16), return_info=True)
    stats = mi.tile_stats(batch, 16, 16)
    assert info.tile_counts == mi.planned_key_tiles(batch, 16, 16)
    assert sum(info.tile_counts[0]) == stats.visited < stats.causal
    # the last query tile (rows 80..94) sees the prefix (tiles 0-2) and its own items (tiles 4-5), not tile 3
    assert info.tile_counts[0][-1] == 5


def test_float16_steps(rng):
    batch = mi.MultiItemBatch.from_item_lens([26], [[3, 11, 1, 7]], device=DEV)
    q, k, v = random_qkv(2, batch.total_tokens, 32, rng, torch.float16)
    ref = mi.reference_attention(q, k, v, batch)
    for step in TRITON_STEPS:
        out = step.function(q, k, v, batch, out=poisoned(q))
        assert out.dtype == torch.float16
        torch.testing.assert_close(out.double(), ref, rtol=2e-3, atol=2e-3, msg=lambda m: f"{step.name}: {m}")


def test_step5_batches_prompts_of_different_shapes(rng):
    prefixes = [17, 0, 40, 5]
    items = [[4, 9, 1], [6, 6], [3], []]
    batch = mi.MultiItemBatch.from_item_lens(prefixes, items, device=DEV)
    heads = 2
    # the model's usual [tokens, heads, head_dim] layout, passed as a transposed view (no copy)
    q, k, v = [torch.randn(batch.total_tokens, heads, 16, generator=rng).to(DEV).transpose(0, 1) for _ in range(3)]
    out, info = mi.step05_batched(q, k, v, batch, out=poisoned(q), count_tiles=True, return_info=True)
    ref = mi.reference_attention(q, k, v, batch)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    assert info.tile_counts == mi.planned_key_tiles(batch, info.block_m, info.block_n)
    # and each prompt alone through step 4 gives the same rows
    for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
        alone = mi.MultiItemBatch.from_item_lens([prefixes[b]], [items[b]], device=DEV)
        rows = slice(start, start + s)
        torch.testing.assert_close(mi.step04_tile_skip(q[:, rows], k[:, rows], v[:, rows], alone),
                                   out[:, rows], rtol=1e-6, atol=1e-6)


MIXED = ([17, 0, 40, 5, 29], [[4, 9, 1], [6, 6], [3], [], [2, 30, 1, 1]])


@pytest.mark.parametrize("order", mi.SCHEDULE_ORDERS)
@pytest.mark.parametrize("block_m", mi.tiles.SCHEDULE_BLOCK_MS)
def test_every_schedule_runs_every_program_once(order, block_m):
    batch = mi.MultiItemBatch.from_item_lens(*MIXED, device="cpu")
    heads = 5
    bytes_per_token = mi.tiles.GROUP_KV_BYTES // (2 * batch.total_tokens)  # two heads fit a group: 3 groups
    rows = [tuple(r) for r in mi.tiles.work_order(batch, heads, block_m, order, bytes_per_token).tolist()]
    want = {(b, t, h) for b, s in enumerate(batch.seq_lens) for t in range(-(-s // block_m)) for h in range(heads)}
    assert len(rows) == len(want) and set(rows) == want
    cost = {(b, t): c for b, t, c in mi.tiles.query_tile_costs(batch, block_m)}
    if order in ("heads_outer", "head_groups"):  # group by group; within a group, most keys first
        groups = ([list(g) for g in mi.head_groups(batch, heads, bytes_per_token)] if order == "head_groups"
                  else [[h] for h in range(heads)])
        assert len(groups) == (3 if order == "head_groups" else heads)
        per_group = sum(-(-s // block_m) for s in batch.seq_lens)
        for i, group in enumerate(groups):
            start = sum(len(g) for g in groups[:i]) * per_group
            chunk = rows[start:start + len(group) * per_group]
            assert {h for _, _, h in chunk} == set(group)
            costs = [cost[b, t] for b, t, _ in chunk]
            assert costs == sorted(costs, reverse=True)
    elif order == "first_run":  # tiles counted from each prompt's end, heads innermost
        from_end = [-(-batch.seq_lens[b] // block_m) - 1 - t for b, t, _ in rows]
        assert from_end == sorted(from_end) and [h for _, _, h in rows[:heads]] == list(range(heads))
    else:  # prompt by prompt, heaviest prompt first, then head by head, then tiles from the end
        prompts = [b for b, _, _ in rows]
        firsts = list(dict.fromkeys(prompts))
        assert prompts == sorted(prompts, key=firsts.index)
        work = [sum(c for (b, _), c in cost.items() if b == p) for p in firsts]
        assert work == sorted(work, reverse=True)


def test_head_groups_fit_the_budget():
    batch = mi.MultiItemBatch.from_item_lens(*MIXED, device="cpu")
    per_head = lambda heads_per_group: mi.tiles.GROUP_KV_BYTES // (heads_per_group * batch.total_tokens)  # noqa: E731
    assert [len(g) for g in mi.head_groups(batch, 32, per_head(32))] == [32]
    assert [len(g) for g in mi.head_groups(batch, 32, per_head(15))] == [11, 10, 11]  # 3 near-equal groups
    assert [list(g) for g in mi.head_groups(batch, 3, 10**9)] == [[0], [1], [2]]  # one head at least
    for size in (1, 3, 7, 16):
        groups = mi.head_groups(batch, 16, per_head(size))
        assert [h for g in groups for h in g] == list(range(16)) and max(map(len, groups)) <= size


@pytest.mark.parametrize("blocks", [(16, 16), (32, 16), (16, 32), (128, 64)], ids=str)
def test_tile_costs_are_the_planned_ranges_counted_key_by_key(blocks):
    """The schedule's cost of a query tile is the number of keys of the kernel's three ranges: the planned
    key tiles at key tiles of one key (tile_map computes them with different code), and the planned key tiles
    are tile_map's tiles that are not skipped."""
    batch = mi.MultiItemBatch.from_item_lens(*MIXED, device="cpu")
    costs = [c for _, _, c in mi.tiles.query_tile_costs(batch, blocks[0])]
    mapped = [(tile_map(batch, blocks[0], 1, b) != TILE_SKIPPED).sum(dim=1).tolist() for b in range(batch.batch_size)]
    assert costs == [n for per_prompt in mapped for n in per_prompt]
    assert mi.planned_key_tiles(batch, *blocks) == [(tile_map(batch, *blocks, b) != TILE_SKIPPED).sum(dim=1).tolist()
                                                    for b in range(batch.batch_size)]
    # and host_item_starts is row - pos[row], the positions the kernels read
    for b, starts in enumerate(batch.host_item_starts):
        p, s = batch.prefix_lens[b], batch.seq_lens[b]
        assert list(starts) == (torch.arange(p, s) - batch.token_pos[b, : s - p].cpu()).tolist()


def test_schedule_table_entries():
    batch = mi.MultiItemBatch.from_item_lens(*MIXED, device=DEV)
    table, programs = mi.tiles.schedule_table(batch, 2, "heads_outer", (32, 128))
    assert mi.tiles.schedule_table(batch, 2, "heads_outer", (128, 32))[0] is table  # cached per batch
    assert set(programs) == {32, 128}
    table = table.cpu()
    for block_m in (16, 32, 64, 128):
        row = table[mi.tiles.SCHEDULE_BLOCK_MS.index(block_m)]
        if block_m not in programs:
            assert not row.any()
            continue
        entries = row[: programs[block_m]]
        assert entries[:, :3].tolist() == mi.tiles.work_order(batch, 2, block_m, "heads_outer").tolist()
        for prompt, _, _, begin, length, prefix, pad0, pad1 in entries.tolist():
            assert (begin, length, prefix, pad0, pad1) == (batch.seq_starts[prompt], batch.seq_lens[prompt],
                                                          batch.prefix_lens[prompt], 0, 0)
        assert not row[programs[block_m]:].any()
    with pytest.raises(ValueError, match="block_ms must be among"):
        mi.tiles.schedule_table(batch, 2, "heads_outer", (48,))


@pytest.mark.parametrize("order", mi.SCHEDULE_ORDERS)
@pytest.mark.parametrize("blocks", [(16, 16), (32, 16)], ids=str)
def test_step5_every_order_matches_the_reference(order, blocks, rng):
    batch = mi.MultiItemBatch.from_item_lens(*MIXED, device=DEV)
    q, k, v = random_qkv(2, batch.total_tokens, 16, rng)
    out, info = mi.step05_batched(q, k, v, batch, out=poisoned(q), blocks=blocks, count_tiles=True, order=order,
                                  return_info=True)
    assert not torch.isnan(out).any(), f"order {order} left rows unwritten (seed {rng.seed_value})"
    torch.testing.assert_close(out.double(), mi.reference_attention(q, k, v, batch), rtol=1e-5, atol=1e-5)
    assert info.tile_counts == mi.planned_key_tiles(batch, *blocks)


def test_grouped_orders_keep_the_keys_in_flight_within_the_budget():
    """The benchmark's mixed batch (18k tokens, 32 heads of 128 in bf16): the first order keeps every head of
    every prompt in flight, far more than L2; grouping heads keeps a group's keys and values."""
    _, prefixes, items = report.bench_shapes()[2]
    batch = mi.MultiItemBatch.from_item_lens(prefixes, items, device="cpu")
    first = kv_in_flight(batch, 32, 128, 64, "first_run", programs_at_once=264)
    assert first > 4 * mi.tiles.GROUP_KV_BYTES
    for order in ("heads_outer", "head_groups", "prompts_outer"):
        assert 0 < kv_in_flight(batch, 32, 128, 64, order, programs_at_once=264) <= mi.tiles.GROUP_KV_BYTES


def test_scores_are_label_log_probs_at_the_last_token_of_each_item(rng):
    batch = mi.MultiItemBatch.from_item_lens([6, 3], [[2, 5, 1], [4, 4]], device=DEV)
    hidden = torch.randn(batch.total_tokens, 24, generator=rng).to(DEV)
    lm_head = torch.randn(50, 24, generator=rng).to(DEV)
    labels = [7, 3, 41]
    scores = mi.score_items(hidden, lm_head, labels, batch)
    assert [tuple(s.shape) for s in scores] == [(3, 3), (2, 3)]
    # by hand: the last token of item i is prefix + sum of (length + 1) of the items before + its length
    for b, (start, p, lens) in enumerate(zip(batch.seq_starts, [6, 3], [[2, 5, 1], [4, 4]])):
        cursor = start + p
        for i, n in enumerate(lens):
            logits = lm_head.double() @ hidden[cursor + n].double()
            want = logits[labels] - torch.logsumexp(logits, 0)
            torch.testing.assert_close(scores[b][i].double(), want, rtol=1e-5, atol=1e-5)
            cursor += n + 1


def test_scores_end_to_end_from_the_attention_output(rng):
    batch = mi.MultiItemBatch.from_item_lens([9, 14], [[3, 7], [1, 1, 5]], device=DEV)
    q, k, v = random_qkv(2, batch.total_tokens, 16, rng)
    lm_head = torch.randn(64, 32, generator=rng).to(DEV)
    hidden = mi.multi_item_attention(q, k, v, batch).transpose(0, 1).reshape(batch.total_tokens, 32)
    ref_hidden = mi.reference_attention(q, k, v, batch).transpose(0, 1).reshape(batch.total_tokens, 32)
    for got, want in zip(mi.score_items(hidden, lm_head, [1, 2], batch),
                         mi.score_items(ref_hidden, lm_head.double(), [1, 2], batch)):
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

SEED_POS = [0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 0]


@pytest.mark.parametrize("kwargs, match", [
    (dict(token_pos_in_items=[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 5, 0], max_item_lens=[4]), "past max_item_lens"),
    (dict(token_pos_in_items=[0, 1, 2, 4, 0], max_item_lens=[4]), "must follow 2 with 3"),
    (dict(token_pos_in_items=[1, 2, 0], max_item_lens=[4]), "must start with 0"),
    (dict(token_pos_in_items=[0, 1, 2, 3], max_item_lens=[4]), "must end with the delimiter"),
    (dict(token_pos_in_items=[0, 1, 0, 0, 1, 0], max_item_lens=[4]), "after the final delimiter"),
    (dict(token_pos_in_items=SEED_POS, max_item_lens=[4], seq_lens=[16]), "does not fit the sequence"),
    (dict(token_pos_in_items=SEED_POS, max_item_lens=[4], seq_lens=[3]), "prefix_lens.0.=5 does not fit"),
    (dict(token_pos_in_items=SEED_POS, max_item_lens=[4, 4]), "mismatched batch metadata"),
    (dict(token_pos_in_items=SEED_POS, max_item_lens=[4], seq_lens=[18, 4]), "mismatched batch metadata"),
    (dict(token_pos_in_items=[1.0, 0.0], max_item_lens=[4]), "must hold integers"),
])
def test_bad_token_positions(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        mi.MultiItemBatch.from_token_positions([5], device="cpu", **kwargs)


def test_bad_batched_positions():
    pos = SEED_POS + [0] * 3
    with pytest.raises(ValueError, match="mismatched batch metadata"):  # 16 entries are not 2 prompts x 10
        mi.MultiItemBatch.from_token_positions([5, 2], pos, [4, 4], token_pos_in_items_len=10, device="cpu")
    with pytest.raises(ValueError, match="pass token_pos_in_items_len"):
        mi.MultiItemBatch.from_token_positions([5, 2], pos, [4, 4], device="cpu")
    with pytest.raises(ValueError, match="token_pos_in_items must be 1-D or have a row per prompt"):
        mi.MultiItemBatch.from_token_positions([5, 2], torch.tensor([pos]), [4, 4], device="cpu")


@pytest.mark.parametrize("prefix_lens, item_lens, match", [
    ([4], [[3, 0, 2]], r"item_lens\[0\]\[1\] must be >= 1"),
    ([-1], [[3]], r"prefix_lens\[0\] must be >= 0"),
    ([4, 5], [[3]], "mismatched batch metadata"),
    ([4], [[2.5]], "must be an integer"),
])
def test_bad_item_lengths(prefix_lens, item_lens, match):
    with pytest.raises((ValueError, TypeError), match=match):
        mi.MultiItemBatch.from_item_lens(prefix_lens, item_lens, device="cpu")


def small_inputs(tokens=20, heads=2, head_dim=16, dtype=torch.float32):
    return [torch.randn(heads, tokens, head_dim, device=DEV, dtype=dtype) for _ in range(3)]


ONE = dict(prefix_lens=[5], item_lens=[[3, 2, 6]])  # 5 + 11 + 4 delimiters = 20 tokens


@pytest.mark.parametrize("change, match", [
    (lambda q, k, v: (q.double(), k, v), "q must be float16 or bfloat16 or float32"),
    (lambda q, k, v: (q, k.to(torch.int32), v), "k must be float16"),
    (lambda q, k, v: (q, k, v.half()), "one dtype"),
    (lambda q, k, v: (q[0], k, v), r"q must be \[heads, tokens, head_dim\]"),
    (lambda q, k, v: (q[:, :19], k[:, :19], v[:, :19]), "mismatched batch metadata: q has 19 tokens"),
    (lambda q, k, v: (q, k[:1], v), "one shape"),
    (lambda q, k, v: (q, k, v.transpose(1, 2).contiguous().transpose(1, 2)), "v must be contiguous in head_dim"),
    (lambda q, k, v: (q[..., ::2], k[..., ::2], v[..., ::2]), "q must be contiguous in head_dim"),
    (lambda q, k, v: ([1.0], k, v), "q must be a torch.Tensor"),
])
def test_bad_attention_inputs(change, match):
    batch = mi.MultiItemBatch.from_item_lens(**ONE, device=DEV)
    q, k, v = change(*small_inputs())
    with pytest.raises((TypeError, ValueError), match=match):
        mi.multi_item_attention(q, k, v, batch)


@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
def test_every_step_checks_its_inputs(step):
    batch = mi.MultiItemBatch.from_item_lens(**ONE, device=DEV)
    q, k, v = small_inputs()
    with pytest.raises(TypeError, match="q must be float16 or bfloat16 or float32"):
        step.function(q.double(), k, v, batch)
    with pytest.raises(ValueError, match="mismatched batch metadata"):
        step.function(q[:, :19], k[:, :19], v[:, :19], batch)
    with pytest.raises(ValueError, match=r"out must be a \w+ tensor of shape .*; got a \w+ tensor of shape \(2, 20, 8\) on "):
        step.function(q, k, v, batch, out=torch.empty(2, 20, 8, device=DEV))
    with pytest.raises(TypeError, match="batch must be a MultiItemBatch"):
        step.function(q, k, v, [5, [3, 2, 6]])


def test_bad_attention_options():
    batch = mi.MultiItemBatch.from_item_lens(**ONE, device=DEV)
    q, k, v = small_inputs()
    with pytest.raises(ValueError, match="head_dim must be one of"):
        mi.multi_item_attention(*small_inputs(head_dim=24), batch)
    with pytest.raises(ValueError, match=r"out must be a \w+ tensor of shape .*; got a \w+ tensor of shape \(2, 20, 8\) on "):
        mi.multi_item_attention(q, k, v, batch, out=torch.empty(2, 20, 8, device=DEV))
    with pytest.raises(ValueError, match="powers of two"):
        mi.multi_item_attention(q, k, v, batch, blocks=(24, 16))
    with pytest.raises(ValueError, match="powers of two from 16 to 128"):
        mi.multi_item_attention(q, k, v, batch, blocks=(256, 64))
    with pytest.raises(ValueError, match="order must be one of"):
        mi.step05_batched(q, k, v, batch, order="random")
    two = mi.MultiItemBatch.from_item_lens([6, 1], [[3, 2, 6], [1]], device=DEV)
    q2, k2, v2 = small_inputs(tokens=two.total_tokens)
    for step in ONE_PROMPT_STEPS:
        with pytest.raises(ValueError, match=f"{step.__name__} handles one prompt, the batch has 2"):
            step(q2, k2, v2, two)
    with pytest.raises(TypeError, match="batch must be a MultiItemBatch"):
        mi.multi_item_attention(q, k, v, [6, [3, 2, 6]])


@pytest.mark.skipif(runtime.mode() != "interpreter", reason="an interpreter limitation")
def test_bfloat16_is_refused_in_the_interpreter():
    batch = mi.MultiItemBatch.from_item_lens(**ONE, device=DEV)
    with pytest.raises(TypeError, match="bfloat16 is not supported in interpreter mode"):
        mi.multi_item_attention(*small_inputs(dtype=torch.bfloat16), batch)


def test_bad_score_inputs():
    batch = mi.MultiItemBatch.from_item_lens(**ONE, device=DEV)
    hidden, lm_head = torch.randn(20, 8, device=DEV), torch.randn(30, 8, device=DEV)
    with pytest.raises(ValueError, match=r"label_ids must lie in \[0, 30\)"):
        mi.score_items(hidden, lm_head, [3, 30], batch)
    with pytest.raises(ValueError, match="label_ids must be a non-empty"):
        mi.score_items(hidden, lm_head, [], batch)
    with pytest.raises(ValueError, match="hidden has 19 rows"):
        mi.score_items(hidden[:19], lm_head, [3], batch)
    with pytest.raises(ValueError, match="lm_head is"):
        mi.score_items(hidden, lm_head[:, :4], [3], batch)


# --------------------------------------------------------------------------------------------
# GPU: the benchmark's shapes, bf16, against a float32 reference
# --------------------------------------------------------------------------------------------

def float32_reference(q, k, v, batch):
    ref = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    return mi.step01_dense_sdpa(q.float(), k.float(), v.float(), batch, sm_scale=1 / math.sqrt(q.shape[-1]), out=ref)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", range(3), ids=["prefix2048_32x32", "prefix512_128x16", "8_mixed_prompts"])
def test_gpu_full_size_bf16(shape):
    name, prefixes, items = report.bench_shapes()[shape]
    batch = mi.MultiItemBatch.from_item_lens(prefixes, items, device="cuda")
    q, k, v = [torch.randn(32, batch.total_tokens, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    ref = float32_reference(q, k, v, batch)
    for step in STEPS if batch.batch_size == 1 else [s for s in STEPS if s.number == 1 or s.number >= 5]:
        out = step.function(q, k, v, batch, out=poisoned(q))
        assert not torch.isnan(out).any(), f"{step.name} left rows unwritten"
        torch.testing.assert_close(out.float(), ref, rtol=1.6e-2, atol=1e-2, msg=lambda m: f"{step.name}: {m}")
        if step.number >= 4:  # step 6 with as many key/value heads as query heads: step 5's tiles
            _, info = step.function(q, k, v, batch, return_info=True)
            _, counted = step.function(q, k, v, batch, count_tiles=True, blocks=(info.block_m, info.block_n),
                                       return_info=True)
            assert counted.tile_counts == mi.planned_key_tiles(batch, info.block_m, info.block_n)
    for order in mi.SCHEDULE_ORDERS[1:]:  # step 5's other program orders write the same numbers
        other = mi.step05_batched(q, k, v, batch, out=poisoned(q), order=order)
        torch.testing.assert_close(other.float(), ref, rtol=1.6e-2, atol=1e-2, msg=lambda m: f"order {order}: {m}")
    lm_head = torch.randn(4096, 32 * 128, device="cuda", dtype=torch.bfloat16) / 16
    hidden = out.transpose(0, 1).reshape(batch.total_tokens, -1)
    for got, want in zip(mi.score_items(hidden, lm_head, [5, 77], batch),
                         mi.score_items(ref.transpose(0, 1).reshape(batch.total_tokens, -1), lm_head.float(),
                                        [5, 77], batch)):
        torch.testing.assert_close(got, want, rtol=0, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, head_dim, blocks", [(torch.float16, 64, None), (torch.float32, 64, (32, 32)),
                                                     (torch.bfloat16, 128, (128, 64)), (torch.bfloat16, 32, (64, 32))])
def test_gpu_other_dtypes_and_tiles(dtype, head_dim, blocks):
    batch = mi.MultiItemBatch.from_item_lens([700, 0, 129], [[33] * 20, [1] * 50, [7, 100, 5]], device="cuda")
    q, k, v = [torch.randn(8, batch.total_tokens, head_dim, device="cuda", dtype=dtype) for _ in range(3)]
    out, info = mi.step05_batched(q, k, v, batch, out=poisoned(q), blocks=blocks, count_tiles=True,
                                  return_info=True)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), float32_reference(q, k, v, batch), rtol=tol, atol=tol)
    assert info.tile_counts == mi.planned_key_tiles(batch, info.block_m, info.block_n)


# --------------------------------------------------------------------------------------------
# The committed results, read under the steps' names
# --------------------------------------------------------------------------------------------

@pytest.mark.skipif(not plotting.result_files("multi_item"), reason="no committed results")
def test_committed_results_are_read_under_the_step_names():
    results = plotting.load_results("multi_item")
    series = set(results.series())
    assert set(figures.approaches()) - {report.FLASHINFER} <= series and {*map(report.order_series, mi.SCHEDULE_ORDERS), report.STEP04_PER_PROMPT} <= series
    for s in series:  # every series is a step's or a declared baseline
        assert s in {st.series for st in STEPS} or s in mi.CHAPTER.baselines, s
    assert mi.CHAPTER.label(report.STEP05.series) == "step05_batched"
    assert "| prefix 512, 128 items x 16 |" in lesson.target_table(results)
    assert {r["kernel"] for r in report.headline(results)} == {"step05_batched (Triton, tile skipping, one launch)"}
    assert all(r["clock"] == results.select(report.STEP05.series)[0].get("clock", "do_bench")
               for r in report.headline(results))



@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0, True, "1"])
def test_a_bad_softmax_scale_is_refused(bad):
    batch = mi.MultiItemBatch.from_item_lens([2], [[1, 1]], device=runtime.device())
    q = torch.randn(2, batch.total_tokens, 16, device=runtime.device())  # [heads, tokens, head dim]
    with pytest.raises(ValueError, match="sm_scale must be a finite positive number"):
        mi.step05_batched(q, q, q, batch, sm_scale=bad)


#: Shapes a committed file was measured without: the H100 run predates the grouped-query shape.
NOT_MEASURED = {"nvidia-h200": set(), "nvidia-h100-80gb-hbm3": {report.gqa_shapes()[0][0]}}


@pytest.mark.parametrize("card", sorted(NOT_MEASURED))
def test_declared_rows_are_the_committed_rows(card):
    """The benchmark's table (shapes x rows) declares exactly the rows (series, role, clock, params) of a committed
    file, in its order, but for the shapes it was measured without."""
    import json

    from studylog.paths import REPO_ROOT

    path = REPO_ROOT / "assets" / "bench" / card / "multi_item.json"
    rows = json.loads(path.read_text())["measurements"]
    committed = [(r["series"], r["role"], r["clock"], r["params"]) for r in rows]
    declared = [(r["series"], r["role"], r["clock"], r["params"]) for r in report.declared_rows()
                if r["params"].get("shape") not in NOT_MEASURED[card]]
    assert declared == committed
    quick = {(r["series"], r["params"].get("shape")) for r in report.declared_rows(quick=True)}
    assert quick < {(r["series"], r["params"].get("shape")) for r in report.declared_rows()}
