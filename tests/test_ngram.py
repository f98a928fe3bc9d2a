"""Chapter 3: n-gram matching. The Python reference against hand-worked cases; the C CPU path and
the Python models of the GPU algorithms against the reference on fresh random batches; every
CUDA kernel bit-identical to the reference on the GPU (``gpu`` marker); the committed results read
under today's series names."""

import inspect
import random
import re

import pytest
import torch

from book.ngram import figures, lesson
from studylog import cuda, ngram, runtime
from studylog.ngram import NgramConfig, NgramInputs

from ngram_helpers import model_budget_scan

STEPS = [s.function for s in ngram.CHAPTER.steps]  # every step, in order
SPLIT_STEPS = STEPS[5:]  # steps 6 to 12: each slot split over blocks, the keys reset for the next call
#: The steps split by chunk_tiles (fused_chunk_len); the others of SPLIT_STEPS by chunk_len
TILED_STEPS = (ngram.step06_one_pass_split, ngram.step08_one_pass_fused, ngram.step07_early_phase2)
WIDE_STEPS = (ngram.step10_wide_loads, ngram.step11_evict_first, ngram.step12_skip_refused)  # take vec=2
I32, I64 = torch.int32, torch.int64
POISON = -7  # draft_tokens entries nobody may write keep this value


def batch_of(prompts, gens, steps, *, enc=None, dec=None, dtn=None, max_dec=None, this_time=None,
             draft_width=8, prompt_width=None, gen_width=None):
    """A batch from Python lists (rows padded with junk ids that must never be read)."""
    b = len(prompts)
    pw = prompt_width or max(1, max(len(p) for p in prompts))
    gw = gen_width or max(len(g) for g in gens)
    prompt = torch.full((b, pw), 10_000, dtype=I64)
    gen = torch.full((b, gw), 20_000, dtype=I64)
    for i, (p, g) in enumerate(zip(prompts, gens)):
        if p:
            prompt[i, :len(p)] = torch.tensor(p, dtype=I64)
        gen[i, :len(g)] = torch.tensor(g, dtype=I64)
    t = lambda v, d: torch.tensor(v if v is not None else [d] * b, dtype=I32)  # noqa: E731
    inputs = NgramInputs(prompt, t([len(p) for p in prompts], 0), gen, t(steps, 0), t(dtn, draft_width - 1),
                         t(max_dec, 1 << 20), t(enc, 0), t(dec, 100))
    draft = torch.full((b, draft_width), POISON, dtype=I64)
    return inputs, draft, t(this_time, 0)


def run_ref(inputs, draft, this_time, config=NgramConfig(), trace=None):
    return ngram.reference_ngram_match(inputs, draft, this_time, config, trace=trace)


# -----------------------------------------------------------------------------------------
# The reference, by hand
# -----------------------------------------------------------------------------------------

def test_no_match_keeps_one_token_and_writes_nothing():
    inputs, draft, this_time = batch_of([[1, 2, 3, 4]], [[5, 6, 7, 8]], [3], this_time=[9])
    out_draft, out_len = run_ref(inputs, draft, this_time)
    assert out_len.tolist() == [1]
    assert torch.equal(out_draft, draft)


def test_match_at_the_very_end_has_no_continuation_and_is_skipped():
    # pattern [1, 2] (gen[1:3]) sits only at the end of the prompt: nothing follows it, so no draft.
    inputs, draft, this_time = batch_of([[7, 8, 1, 2]], [[4, 1, 2]], [2])
    out_draft, out_len = run_ref(inputs, draft, this_time, NgramConfig(max_ngram_size=2))
    assert out_len.tolist() == [1] and torch.equal(out_draft, draft)
    # the same pattern earlier in the prompt: the leftmost occurrence with a continuation wins
    inputs, draft, this_time = batch_of([[7, 1, 2, 8, 1, 2, 9]], [[4, 1, 2]], [2])
    trace = []
    out_draft, out_len = run_ref(inputs, draft, this_time, NgramConfig(max_ngram_size=2), trace)
    assert out_len.tolist() == [1 + 4]
    assert out_draft[0, 1:5].tolist() == [8, 1, 2, 9]
    assert (trace[0]["n"], trace[0]["source"], trace[0]["start"]) == (2, "prompt", 1)


def test_an_end_match_without_continuation_does_not_hide_a_later_n():
    # n=2 matches only at the prompt's end; n=1 ([2]) matches earlier with a continuation
    inputs, draft, this_time = batch_of([[2, 5, 1, 2]], [[9, 1, 2]], [2])
    trace = []
    _, out_len = run_ref(inputs, draft, this_time, NgramConfig(max_ngram_size=2), trace)
    assert (trace[0]["n"], trace[0]["source"], trace[0]["start"]) == (1, "prompt", 0)
    assert out_len.tolist() == [1 + 3]


def test_prompt_is_preferred_over_generated_tokens():
    # [3, 4] occurs in the generated tokens (position 0) and late in the prompt: the prompt wins
    inputs, draft, this_time = batch_of([[9, 9, 9, 3, 4, 50, 51]], [[3, 4, 60, 61, 3, 4]], [5])
    trace = []
    out_draft, _ = run_ref(inputs, draft, this_time, NgramConfig(max_ngram_size=2), trace)
    assert trace[0]["source"] == "prompt" and out_draft[0, 1:3].tolist() == [50, 51]
    # but a longer n found only in the generated tokens beats a shorter one in the prompt
    inputs, draft, this_time = batch_of([[9, 4, 50, 51]], [[3, 4, 60, 61, 3, 4]], [5])
    trace = []
    out_draft, out_len = run_ref(inputs, draft, this_time, NgramConfig(max_ngram_size=2), trace)
    assert (trace[0]["n"], trace[0]["source"], trace[0]["start"]) == (2, "generated", 0)
    # the generated haystack stops before the newest token: drafts are gen[2:5] = [60, 61, 3]
    assert out_draft[0, 1:4].tolist() == [60, 61, 3] and out_len.tolist() == [4]


def test_cap_comes_from_max_dec_len():
    prompt = [[1, 2, 3, 4, 5, 6, 7, 8]]
    gen = [[0, 1, 2]]
    inputs, draft, this_time = batch_of(prompt, gen, [2], dtn=[5], max_dec=[2 + 1 + 2])  # room for 2 more
    out_draft, out_len = run_ref(inputs, draft, this_time)
    assert out_len.tolist() == [3] and out_draft[0, 1:3].tolist() == [3, 4]
    assert (out_draft[0, 3:] == POISON).all()
    inputs, draft, this_time = batch_of(prompt, gen, [2], dtn=[5], max_dec=[3])  # the request is done
    out_draft, out_len = run_ref(inputs, draft, this_time)
    assert out_len.tolist() == [1] and torch.equal(out_draft, draft)


def test_budget_runs_out_in_the_middle_of_the_batch():
    # four slots that would each draft 5; threshold 12: worked by hand in the notebook
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    inputs, draft, this_time = batch_of([prompt] * 4, [[0, 1, 2]] * 4, [2] * 4, dtn=[5] * 4)
    _, out_len = run_ref(inputs, draft, this_time, NgramConfig(threshold=12))
    assert out_len.tolist() == [6, 4, 1, 1]
    _, out_len = run_ref(inputs, draft, this_time, NgramConfig(threshold=10))
    assert out_len.tolist() == [6, 1, 1, 1]  # slot 1 would get one draft: the rule wants room for two


def test_prefill_and_inactive_slots():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    inputs, draft, this_time = batch_of([prompt] * 3, [[0, 1, 2]] * 3, [2] * 3, enc=[37, 0, 0], dec=[0, 0, 5],
                                        this_time=[37, 4, 2], dtn=[5] * 3)
    out_draft, out_len = run_ref(inputs, draft, this_time, NgramConfig(threshold=1000))
    assert out_len.tolist() == [37, 0, 6]  # prefill untouched, inactive zeroed, active drafts 5
    assert (out_draft[:2] == POISON).all()
    # the prefill slot's 37 tokens count against the budget, and it stays "unprocessed" for the slots after it
    _, out_len = run_ref(inputs, draft, this_time, NgramConfig(threshold=44))
    # slot 2: total = 37 + 0 + 1 = 38, left = 1 (the prefill slot) -> room 44 - 38 - 1 = 5
    assert out_len.tolist() == [37, 0, 6]
    _, out_len = run_ref(inputs, draft, this_time, NgramConfig(threshold=43))
    assert out_len.tolist() == [37, 0, 5]


def test_pattern_needs_a_token_before_it():
    # step_idx = 1: n = 2 and 3 are skipped (deployed rule: step_idx >= n); n = 1 still searches
    inputs, draft, this_time = batch_of([[5, 6, 7, 8]], [[5, 6]], [1])
    trace = []
    _, out_len = run_ref(inputs, draft, this_time, NgramConfig(max_ngram_size=3), trace)
    assert trace[0]["n"] == 1 and out_len.tolist() == [1 + 2]


def test_hybrid_writes_after_existing_tokens_and_respects_min_ngram():
    prompt = [[1, 2, 3, 4, 5, 6, 7, 8, 9]]
    gen = [[0, 2, 3]]
    inputs, draft, this_time = batch_of(prompt, gen, [2], this_time=[3], dec=[5])
    cfg = NgramConfig.hybrid_variant(max_ngram_size=3, min_ngram_size=2, max_draft_tokens=6)
    out_draft, out_len = run_ref(inputs, draft, this_time, cfg)
    # cap = 6 - 3 + 1 = 4 drafts after the 3 MTP tokens: prompt[3:7]
    assert out_len.tolist() == [7] and out_draft[0, 3:7].tolist() == [4, 5, 6, 7]
    assert (out_draft[0, :3] == POISON).all()
    # with min_ngram_size = 3 the 2-gram is not enough
    out_draft, out_len = run_ref(inputs, draft, this_time, NgramConfig.hybrid_variant(3, 3, max_draft_tokens=6))
    assert out_len.tolist() == [3] and torch.equal(out_draft, draft)
    # a slot with no MTP tokens is left alone (hybrid has no "inactive -> 0" rule)
    inputs, draft, this_time = batch_of(prompt, gen, [2], this_time=[0], dec=[0])
    assert run_ref(inputs, draft, this_time, cfg)[1].tolist() == [0]


def test_hybrid_threshold_is_its_own():
    assert NgramConfig.hybrid_variant().threshold == ngram.formats.HYBRID_DEFAULT_THRESHOLD != NgramConfig().threshold


def test_ids_differing_only_in_high_bits_do_not_match():
    big = 1 << 40
    # position 0 equals the pattern in its low 32 bits only; a 32-bit comparison would draft 99
    inputs, draft, this_time = batch_of([[big + (1 << 32) + 2, 99, big + 2, 77]], [[0, big + 2]], [1])
    trace = []
    out_draft, _ = run_ref(inputs, draft, this_time, trace=trace)
    assert trace[0]["start"] == 2 and out_draft[0, 1].item() == 77


# -----------------------------------------------------------------------------------------
# Properties on fresh random batches
# -----------------------------------------------------------------------------------------

def random_case(seed: int, *, max_batch: int = 12, max_width: int = 48):
    r = random.Random(seed)
    b = r.randint(1, max_batch)
    pw, gw, dw = r.randint(1, max_width), r.randint(1, max_width // 2 + 2), r.randint(2, 9)
    hybrid = r.random() < 0.3
    kinds = [r.choice(ngram.batches.SLOT_KINDS) for _ in range(b)]
    inputs, draft, this_time = ngram.make_batch(
        b, pw, gw, kinds=kinds, draft_width=dw, vocab=r.choice([2, 3, 5, 50]), id_base=r.choice([0, 1 << 40]),
        decoys=r.random() < 0.5, capped_fraction=0.3, hybrid=hybrid, seed=seed)
    max_n = r.randint(1, 4)
    config = NgramConfig(max_n, r.randint(1, max_n), r.choice([0, 1, 2, 3, 5, 8, 13, 21, 40, 1 << 30]), hybrid,
                         r.randint(dw // 2, dw - 1) if hybrid else 10)
    return inputs, draft, this_time, config


@pytest.fixture
def seeds(rng):
    return [rng.seed_value * 1000 + i for i in range(120)]


def test_cpu_path_matches_reference(seeds):
    for seed in seeds:
        inputs, draft, this_time, config = random_case(seed)
        expected = run_ref(inputs, draft, this_time, config)
        d, t = draft.clone(), this_time.clone()
        ngram.cpu_path.cpu_path_inplace(inputs, d, t, config)
        assert torch.equal(d, expected[0]) and torch.equal(t, expected[1]), (seed, config)


def test_reference_outputs_obey_the_rules(seeds):
    for seed in seeds:
        inputs, draft, this_time, config = random_case(seed)
        trace = []
        out_draft, out_len = run_ref(inputs, draft, this_time, config, trace)
        for b, note in enumerate(trace):
            if note["kind"] in ("prefill", "untouched"):
                assert out_len[b] == this_time[b] and torch.equal(out_draft[b], draft[b])
            elif note["kind"] == "inactive":
                assert out_len[b] == 0 and torch.equal(out_draft[b], draft[b])
            else:
                base = 1 if not config.hybrid else int(this_time[b])
                k = note["drafted"]
                assert out_len[b] == base + k
                assert torch.equal(out_draft[b, :base], draft[b, :base])
                assert torch.equal(out_draft[b, base + k:], draft[b, base + k:])
                if k:  # the drafts follow a real occurrence of the last n generated tokens
                    n, start, step = note["n"], note["start"], int(inputs.step_idx[b])
                    hay = inputs.prompt_ids[b] if note["source"] == "prompt" else inputs.generated_ids[b]
                    assert torch.equal(hay[start:start + n], inputs.generated_ids[b, step + 1 - n:step + 1])
                    assert torch.equal(out_draft[b, base:base + k], hay[start + n:start + n + k])
                    assert config.min_ngram_size <= n <= min(config.max_ngram_size, step)


def test_one_pass_keys_match_the_per_n_search(seeds):
    """Phase 1 of step 5 (one suffix comparison per end position) finds the reference's match."""
    for seed in seeds:
        inputs, draft, this_time, config = random_case(seed)
        free = NgramConfig(config.max_ngram_size, config.min_ngram_size, 1 << 30, config.hybrid,
                           config.max_draft_tokens)  # no budget: every active slot searches
        trace = []
        run_ref(inputs, draft, this_time, free, trace)
        keys = ngram.model_one_pass_keys(inputs, free, this_time)
        for b, note in enumerate(trace):
            expected = ngram.formats.NONE_KEY if note["n"] is None else \
                ngram.match_key(note["n"], note["source"] == "generated", note["start"])
            assert keys[b] == expected, (seed, b, note)


def test_budget_scan_matches_the_sequential_rule(seeds):
    """Phase 2 of steps 4 to 11 from prefix sums, walked in chunks of any size, is exact."""
    for seed in seeds[:60]:
        inputs, draft, this_time, config = random_case(seed, max_batch=30)
        expected = run_ref(inputs, draft, this_time, config)
        keys = ngram.model_one_pass_keys(inputs, config, this_time)
        for chunk in (1, 3, 32, 1024):
            got = model_budget_scan(inputs, keys, draft, this_time, config, chunk=chunk)
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), (seed, chunk)


def test_budget_skip_is_exact(seeds):
    """Step 8 skips the search of slots the bound refuses: the reference never searches them either,
    and phase 2 on keys with those slots emptied still gives the reference's answer."""
    skipped = 0
    for seed in seeds:
        inputs, draft, this_time, config = random_case(seed, max_batch=30)
        trace = []
        expected = run_ref(inputs, draft, this_time, config, trace)
        refused = ngram.model_budget_refused(inputs, config, this_time)
        assert all(not note["searched"] for note, r in zip(trace, refused) if r), seed
        keys = ngram.model_one_pass_keys(inputs, config, this_time)
        keys = [ngram.formats.NONE_KEY if r else k for k, r in zip(keys, refused)]
        skipped += sum(refused)
        for chunk in (1, 7, 1024):
            got = model_budget_scan(inputs, keys, draft, this_time, config, chunk=chunk)
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), (seed, chunk)
    assert skipped > 0  # the random budgets do refuse slots, so the test exercises the skip


def test_budget_skip_bound_by_hand():
    # threshold 12, four active slots: the bound is 1 + 3 = 4, 2 + 2, 3 + 1, 4 + 0: nobody is refused ...
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    inputs, draft, this_time = batch_of([prompt] * 4, [[0, 1, 2]] * 4, [2] * 4, dtn=[5] * 4)
    assert ngram.model_budget_refused(inputs, NgramConfig(threshold=12), this_time) == [False] * 4
    # ... although the reference refuses slots 2 and 3 (slot 0's drafts used the room): the bound is
    # a lower bound, and phase 2 does the rest
    trace = []
    run_ref(inputs, draft, this_time, NgramConfig(threshold=12), trace)
    assert [n["searched"] for n in trace] == [True, True, False, False]
    # a prefill slot of 37 tokens first: the bound is 37 + 1 + 2 = 40 for slot 1 and 39 + 1 for slot 2
    # (each active slot adds its base and leaves `left`), so thresholds up to 41 refuse both before any
    # search, and 42 refuses neither (the reference then drafts 2 for slot 1 and refuses slot 2)
    inputs, draft, this_time = batch_of([prompt] * 3, [[0, 1, 2]] * 3, [2] * 3, enc=[37, 0, 0], this_time=[37, 0, 0])
    assert ngram.model_budget_refused(inputs, NgramConfig(threshold=41), this_time) == [False, True, True]
    assert ngram.model_budget_refused(inputs, NgramConfig(threshold=42), this_time) == [False, False, False]
    assert run_ref(inputs, draft, this_time, NgramConfig(threshold=42))[1].tolist() == [37, 3, 1]


def test_early_exit_bytes_by_hand():
    # slot 0: [1, 2] first at prompt position 1 -> reads 3 tokens; slot 1: only in the generated tokens
    # (whole prompt of 4, then 2 tokens); slot 2: nowhere (prompt 3 + generated 2); slot 3: prefill (nothing)
    inputs, draft, this_time = batch_of([[7, 1, 2, 8, 1, 2], [5, 5, 5, 5], [9, 9, 9], [1, 2, 3]],
                                        [[1, 2, 3, 1, 2], [1, 2, 6, 1, 2], [4, 6, 3, 1, 2], [1, 2, 3, 1, 2]],
                                        [4, 4, 4, 4], enc=[0, 0, 0, 5])
    config = NgramConfig(max_ngram_size=2, threshold=1 << 30)
    assert ngram.batches.early_exit_bytes(inputs, this_time, config) == 8 * (3 + (4 + 2) + (3 + 4))
    assert ngram.batches.haystack_bytes(inputs, this_time, config) == 8 * ((6 + 4) + (4 + 4) + (3 + 4))


def test_published_blockscan_rule_departs_from_the_sequential_one():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    # (a) a budget of exactly 2: the sequential rule refuses a single draft, the published one grants it
    inputs, draft, this_time = batch_of([prompt], [[0, 1, 2]], [2], dtn=[5])
    config = NgramConfig(threshold=2)
    keys = ngram.model_one_pass_keys(inputs, config, this_time)
    assert run_ref(inputs, draft, this_time, config)[1].tolist() == [1]
    assert lesson.published_blockscan_counts(inputs, keys, this_time, config).tolist() == [2]
    # (b) a prefill slot before: the sequential rule still reserves its token, the published one does not
    inputs, draft, this_time = batch_of([prompt] * 2, [[0, 1, 2]] * 2, [2] * 2, enc=[5, 0], this_time=[5, 0],
                                        dtn=[5] * 2)
    config = NgramConfig(threshold=10)
    keys = ngram.model_one_pass_keys(inputs, config, this_time)
    assert run_ref(inputs, draft, this_time, config)[1].tolist() == [5, 4]
    assert lesson.published_blockscan_counts(inputs, keys, this_time, config).tolist() == [5, 5]
    # the exact scan agrees with the sequential rule on both
    assert model_budget_scan(inputs, keys, draft, this_time, config)[1].tolist() == [5, 4]


def test_make_batch_kinds_do_what_they_say():
    kinds = ["early", "late", "generated", "short", "never", "prefill", "inactive"]
    inputs, draft, this_time = ngram.make_batch(7, 400, 64, kinds=kinds, capped_fraction=0.0, seed=3)
    inputs.draft_token_num.fill_(10)
    trace = []
    run_ref(inputs, draft, this_time, NgramConfig(threshold=1 << 30), trace)
    early, late, gen, short, never, prefill, inactive = trace
    assert early["n"] == 3 and early["source"] == "prompt" and early["start"] < int(inputs.prompt_lens[0]) // 10
    assert late["n"] == 3 and late["source"] == "prompt" and late["start"] >= int(inputs.prompt_lens[1]) * 9 // 10 - 3
    assert gen["n"] == 3 and gen["source"] == "generated"
    assert short["n"] == 1
    assert never["n"] is None and never["searched"]
    assert prefill["kind"] == "prefill" and inactive["kind"] == "inactive"
    assert (draft == -1).all() and draft.dtype == I64 and this_time.dtype == I32


def test_cpu_step_through_the_matcher_on_cpu_tensors(rng):
    inputs, draft, this_time, config = random_case(rng.seed_value)
    expected = run_ref(inputs, draft, this_time, config)
    out = ngram.step01_cpu_path(inputs, draft, this_time, config=config)
    assert torch.equal(out[0], expected[0]) and torch.equal(out[1], expected[1])
    assert out[0] is draft and out[1] is this_time  # in place, as the deployed operator


def test_fused_chunks_fit_the_grid():
    for tile in (512, 2048, 4096):
        assert ngram.kernels.stream_chunk_len(1, 512, 256, tile) == 2 * tile
        assert ngram.kernels.stream_chunk_len(256, 131072, 2048, tile) == 8 * tile
        assert ngram.kernels.stream_chunk_len(256, 131072, 2048, tile, chunk_len=3000) % tile == 0
        cl = ngram.kernels.stream_chunk_len(1, 2**31 - 1, 16, tile)
        assert -(-(2**31 - 1) // cl) + 1 <= 65535
    assert ngram.kernels.fused_chunk_len(1, 512, 256) == ngram.kernels.TILE
    assert ngram.kernels.fused_chunk_len(256, 131072, 2048) % ngram.kernels.TILE == 0
    assert ngram.kernels.fused_chunk_len(256, 131072, 2048) <= 8 * ngram.kernels.TILE
    cl = ngram.kernels.fused_chunk_len(1, 2**31 - 1, 16, chunk_tiles=1)
    assert -(-(2**31 - 1) // cl) + 1 <= 65535


# -----------------------------------------------------------------------------------------
# Bad input
# -----------------------------------------------------------------------------------------

def _good():
    return batch_of([[1, 2, 3, 4]] * 2, [[1, 2, 3]] * 2, [2, 2])


@pytest.mark.parametrize("mutate, error, match", [
    (lambda i, d, t: (i.__setattr__("prompt_lens", i.prompt_lens[:1]), None), ValueError,
     "prompt_lens has batch size 1"),
    (lambda i, d, t: (i.__setattr__("step_idx", i.step_idx.long()), None), TypeError, "step_idx must be int32"),
    (lambda i, d, t: (i.__setattr__("prompt_ids", i.prompt_ids.int()), None), TypeError, "prompt_ids must be int64"),
    (lambda i, d, t: (i.__setattr__("generated_ids", i.generated_ids.float()), None), TypeError, "generated_ids"),
    (lambda i, d, t: (i.__setattr__("seq_lens_decoder", torch.tensor([1, -1], dtype=I32)), None), ValueError,
     "seq_lens_decoder has negative values"),
    (lambda i, d, t: (i.__setattr__("prompt_lens", torch.tensor([-2, 1], dtype=I32)), None), ValueError,
     "prompt_lens has negative values"),
    (lambda i, d, t: (i.__setattr__("prompt_lens", torch.tensor([5, 1], dtype=I32)), None), ValueError,
     "prompt_lens exceeds"),
    (lambda i, d, t: (i.__setattr__("step_idx", torch.tensor([3, 1], dtype=I32)), None), ValueError,
     "step_idx must index"),
    (lambda i, d, t: (i.__setattr__("draft_token_num", torch.tensor([8, 1], dtype=I32)), None), ValueError,
     "draft_token_num must be <"),
    (lambda i, d, t: (i.__setattr__("prompt_ids", i.prompt_ids.t().contiguous().t()), None), ValueError, "contiguous"),
    (lambda i, d, t: (i.__setattr__("max_dec_len", [1, 2]), None), TypeError, "max_dec_len must be a torch.Tensor"),
])
def test_bad_inputs_are_named(mutate, error, match):
    inputs, draft, this_time = _good()
    mutate(inputs, draft, this_time)
    with pytest.raises(error, match=match):
        run_ref(inputs, draft, this_time)
    with pytest.raises(error, match=match):
        ngram.step01_cpu_path(inputs, draft, this_time)


def test_bad_state_and_config_are_named():
    inputs, draft, this_time = _good()
    with pytest.raises(ValueError, match="seq_lens_this_time has batch size 3"):
        run_ref(inputs, draft, torch.zeros(3, dtype=I32))
    with pytest.raises(TypeError, match="draft_tokens must be int64"):
        run_ref(inputs, draft.int(), this_time)
    with pytest.raises(ValueError, match="seq_lens_this_time has negative values"):
        run_ref(inputs, draft, torch.tensor([0, -3], dtype=I32))
    for bad in (0, -1, ngram.NGRAM_MAX + 1):
        with pytest.raises(ValueError, match="max_ngram_size"):
            run_ref(inputs, draft, this_time, NgramConfig(max_ngram_size=bad))
    with pytest.raises(ValueError, match="min_ngram_size"):
        run_ref(inputs, draft, this_time, NgramConfig(max_ngram_size=2, min_ngram_size=3))
    with pytest.raises(ValueError, match="max_draft_tokens=8 does not fit"):
        run_ref(inputs, draft, this_time, NgramConfig.hybrid_variant(max_draft_tokens=8))
    with pytest.raises(ValueError, match="step must be one of the chapter's step functions"):
        ngram.NgramMatcher(ngram.reference_ngram_match, inputs, draft, this_time)
    with pytest.raises(ValueError, match=r"step05_one_pass takes no option \['chunk_len'\]"):
        ngram.NgramMatcher(ngram.step05_one_pass, inputs, draft, this_time, chunk_len=4096)
    with pytest.raises(ValueError, match=r"step01_cpu_path takes no option \['vec'\]"):
        ngram.NgramMatcher(ngram.step01_cpu_path, inputs, draft, this_time, vec=2)


@pytest.mark.skipif(runtime.has_gpu(), reason="checks the message on a machine without a GPU")
def test_gpu_steps_say_they_need_a_gpu():
    inputs, draft, this_time = _good()
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        ngram.step06_one_pass_split(inputs, draft, this_time)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        ngram.ngram_match(inputs, draft, this_time)  # the chapter's final kernel


# -----------------------------------------------------------------------------------------
# The CUDA sources (compiled on the CPU with NVRTC)
# -----------------------------------------------------------------------------------------

def test_kernels_compile_without_spills_and_use_64bit_atomics():
    for source, kernels in (("ngram_serial", ["ngram_serial"]),
                            ("ngram_two_phase", ["ngram_search_per_n", "ngram_budget_serial", "ngram_budget_scan"]),
                            ("ngram_one_pass", ["ngram_search_one_pass", "ngram_one_pass_split",
                                                "ngram_budget_scan_reset", "ngram_one_pass_fused",
                                                "ngram_one_pass_split_early", "ngram_budget_scan_early"])):
        compiled = cuda.compile_source(source)
        report = compiled.ptxas_report()
        assert set(kernels) <= set(report), report
        assert all(r["spill_stores"] == 0 and r["spill_loads"] == 0 for r in report.values()), report
    two_phase = cuda.compile_source("ngram_two_phase")
    assert "atom.shared.min.u64" in two_phase.ptx_function("ngram_search_per_n")
    one_pass = cuda.compile_source("ngram_one_pass")
    for name in ("ngram_one_pass_split", "ngram_one_pass_fused"):
        assert "atom.global.min.u64" in one_pass.ptx_function(name)
    # step 6 ends at its search (phase 2 is a second launch); step 8's last block runs phase 2 after a fence
    assert "membar.gl" not in one_pass.ptx_function("ngram_one_pass_split")
    assert "membar.gl" in one_pass.ptx_function("ngram_one_pass_fused")
    # step 7: the search lets phase 2 launch as it starts; phase 2 waits for the whole search before reading keys
    early, scan = one_pass.ptx_function("ngram_one_pass_split_early"), one_pass.ptx_function("ngram_budget_scan_early")
    assert "griddepcontrol.launch_dependents" in early and "griddepcontrol" not in one_pass.ptx_function(
        "ngram_one_pass_split")
    assert scan.index("griddepcontrol.wait") < scan.index("ld.global")
    # steps 9 to 12: the instances of ngram_stream, one per step and load width
    shipped = list(ngram.kernels.STREAM_INSTANCES)
    assert shipped == [f"ngram_stream<4, {vec}, {ef}, {skip}>" for ef, skip in
                       (("false", "false"), ("true", "false"), ("true", "true")) for vec in (2, 1)]
    stream = cuda.compile_source("ngram_stream", name_expressions=shipped)
    report = stream.ptxas_report()
    # 16-byte evict-first loads without the skip (step 11's wide instance) keep 48 registers and spill one 4-byte
    # value, reloaded in the tile loop (an L1 hit): that instance as measured; any other report is a change
    known = {"ngram_stream<4, 2, true, false>": (4, 4)}
    ptx = {}
    for name in shipped:
        r = report[stream.lowered_names[name]]
        assert (r["spill_stores"], r["spill_loads"]) == known.get(name, (0, 0)), (name, r)
        ptx[name] = body = stream.ptx_function(stream.lowered_names[name])
        # no barrier in the scan loop: one before the search where refused slots are skipped, then the ticket's two
        # and phase 2's; a thread publishes its own candidates to the slot's global key
        assert "atom.global.min.u64" in body and "membar.gl" in body
        vec, evict_first, skip = name[len("ngram_stream<4, "):-1].split(", ")
        plain_wide = "ld.global.nc.v2.u64" in body or "ld.global.nc.v2.s64" in body
        assert plain_wide == (vec == "2" and evict_first == "false")
        assert ("L2::cache_hint" in body and "createpolicy" in body) == (evict_first == "true")
        assert ("cache_hint.v2.s64" in body) == (vec == "2" and evict_first == "true")
        assert ("atom.shared.add.u64" in body) == (skip == "true")  # the lazy bound's shared sum
    # every kernel a step function launches exists (the step's launches are literal in its body; an instance's load
    # width is its matcher's: both widths are compiled)
    for step in STEPS[1:]:
        launched = re.findall(r'_kernel\("(\w+)", f?"([^"]+)"', inspect.getsource(step))
        assert launched, step.__name__
        for source, name in launched:
            names = [name.replace("{m.vec}", str(vec)) for vec in (1, 2)] if "{m.vec}" in name else [name]
            for name in names:
                if source == "ngram_stream":
                    assert name in shipped, (step.__name__, name)
                else:
                    assert name in cuda.compile_source(source).ptxas_report(), (step.__name__, name)


def test_steps_8_to_11_show_the_code_their_instance_compiles():
    """Each of steps 9 to 12 shows ngram_stream.cu's functions with every ``if constexpr`` on a knob resolved
    (``kernels.stream_source``): that text, compiled alone, gives its instances' PTX (names aside), and each step's
    text differs from the one before by its knob's lines only."""
    steps = {s.number: s for s in ngram.CHAPTER.steps}
    knobs = {9: ("1", "false", "false"), 10: ("VEC", "false", "false"), 11: ("VEC", "true", "false"),
             12: ("VEC", "true", "true")}
    library = cuda.compile_source("ngram_stream", name_expressions=list(ngram.kernels.STREAM_INSTANCES))
    for number, (vec, evict_first, skip) in knobs.items():
        text = steps[number].source
        assert isinstance(text, str) and "__global__ void __launch_bounds__(256) ngram_stream(" in text
        assert ("if constexpr (VEC == 2)" in text) == (vec == "VEC")
        assert "if constexpr (EVICT_FIRST)" not in text and "if constexpr (SKIP_REFUSED)" not in text
        assert ("createpolicy" in text) == (evict_first == "true") and ("s_refused = 1" in text) == (skip == "true")
        source = '#include "ngram_common.cuh"\n#define LAZY_COUNT_SHIFT 40\n' + text
        widths = ("1",) if vec == "1" else ("2", "1")
        names = [f"ngram_stream<4, {w}, {evict_first}, {skip}>" for w in widths]
        shown = cuda.compile_source(source, name_expressions=names, name=f"step{number}_shown.cu")
        for name in names:
            a, b = (_plain_ptx(c, name) for c in (shown, library))
            assert a == b, (number, name)
    for old, new in ((9, 10), (10, 11), (11, 12)):
        diff = ngram.CHAPTER.show_diff(old, new)
        assert diff.lines and len(diff.added) + len(diff.removed) <= 40, (old, new, str(diff))
    assert set(ngram.CHAPTER.show_diff(9, 10).added) >= {"    if constexpr (VEC == 2) {"}
    assert "if (*(volatile int *)&s_refused) break;" in "\n".join(ngram.CHAPTER.show_diff(11, 12).added)
    # steps 6, 7 and 8 show their shared search (search_chunk) with their own kernels: each diff is the change
    assert [ln.strip() for ln in ngram.CHAPTER.show_diff(6, 8).added if ln.strip()] == [
        "extern \"C\" __global__ void ngram_one_pass_fused(NGRAM_KERNEL_PARAMS) {", "__shared__ int s_last;",
        "// The last block to finish runs phase 2 (all keys are final once every block has counted).",
        "last_block_budget(s_last, NGRAM_KERNEL_ARGS);"]
    added = [ln.strip() for ln in ngram.CHAPTER.show_diff(6, 7).added]
    assert "asm volatile(\"griddepcontrol.launch_dependents;\");  // phase 2 may be scheduled now" in added
    assert len(added) + len(ngram.CHAPTER.show_diff(6, 7).removed) <= 40


def _plain_ptx(compiled, name):
    """An entry's PTX with its own and its shared variables' names aside (mangled names differ by source)."""
    body = compiled.ptx_function(name).replace(compiled.lowered_names[name], "<kernel>")
    body = re.sub(r"_ZZ\w*E\d+([A-Za-z_]\w*)", r"<local \1>", body)
    lines = [ln for ln in body.splitlines() if not re.match(r"\s*(\.shared\b|// demoted variable|\.(file|loc)\b)", ln)]
    return [re.sub(r"\$L__BB\d+_", "$L__BB_", ln) for ln in lines]


# -----------------------------------------------------------------------------------------
# On the GPU: every kernel bit-identical to the reference
# -----------------------------------------------------------------------------------------

def _check_all_steps(inputs, draft, this_time, config, expected, steps=STEPS):
    for step in steps:
        d, t = draft.clone(), this_time.clone()
        matcher = ngram.NgramMatcher(step, inputs, d, t, config=config)
        matcher()
        torch.cuda.synchronize()
        assert torch.equal(d.cpu(), expected[0]) and torch.equal(t.cpu(), expected[1]), (step.__name__, config)
        d.copy_(draft), t.copy_(this_time)  # same state again (the hybrid variant reads what it wrote)
        matcher()  # a second launch: same answer, so the fused kernel left its scratch clean
        torch.cuda.synchronize()
        assert torch.equal(d.cpu(), expected[0]) and torch.equal(t.cpu(), expected[1]), (step.__name__, "second call")
        if step in SPLIT_STEPS:
            assert bool((matcher.match_keys == -1).all()) and int(matcher.blocks_done) == 0


@pytest.mark.gpu
def test_every_kernel_matches_the_reference_on_random_batches(seeds):
    for seed in seeds[:80]:
        inputs, draft, this_time, config = random_case(seed, max_batch=40, max_width=300)
        expected = run_ref(inputs, draft, this_time, config)
        _check_all_steps(inputs.to("cuda"), draft.cuda(), this_time.cuda(), config, expected)


@pytest.mark.gpu
def test_every_kernel_on_edge_batches():
    cases = [
        batch_of([[1, 2, 3, 4]], [[9, 1, 2]], [2]),                                    # end match only
        batch_of([[]], [[5]], [0], prompt_width=1),                                      # empty prompt, step 0
        batch_of([[1, 2, 3]] * 3, [[1, 2, 3]] * 3, [2] * 3, enc=[4, 4, 4], this_time=[4, 4, 4]),  # all prefill
        batch_of([[1, 2, 3]] * 3, [[1, 2, 3]] * 3, [2] * 3, dec=[0, 0, 0], this_time=[1, 2, 3]),  # all inactive
    ]
    for inputs, draft, this_time in cases:
        for config in (NgramConfig(), NgramConfig(threshold=0), NgramConfig.hybrid_variant(max_draft_tokens=5)):
            expected = run_ref(inputs, draft, this_time, config)
            _check_all_steps(inputs.to("cuda"), draft.cuda(), this_time.cuda(), config, expected)


@pytest.mark.gpu
def test_scan_phase_walks_batches_larger_than_its_block():
    """B > 1024 slots: the scan carries its sums across chunks; a tight budget bites in a later chunk."""
    for threshold in (1 << 30, 6000, 3000, 900):
        inputs, draft, this_time = ngram.make_batch(2500, 64, 32, vocab=4, seed=threshold)
        config = NgramConfig(threshold=threshold)
        expected = (draft.clone(), this_time.clone())
        ngram.cpu_path.cpu_path_inplace(inputs, *expected, config)
        _check_all_steps(inputs.to("cuda"), draft.cuda(), this_time.cuda(), config, expected,
                         steps=STEPS[2:])


@pytest.mark.gpu
@pytest.mark.parametrize("batch, seq_len, threshold", [(32, 512, 128), (1, 131072, 1 << 30), (16, 131072, 1 << 30),
                                                       (512, 16384, 1 << 30), (128, 32768, 128)])
def test_full_size_bench_inputs(batch, seq_len, threshold):
    kinds = ["short"] if batch == 1 else None
    inputs, draft, this_time = ngram.make_batch(batch, seq_len, ngram.gen_width_for(seq_len), kinds=kinds,
                                                decoys=True, id_base=1 << 40, seed=seq_len + batch, device="cuda")
    config = NgramConfig(threshold=threshold)
    expected = (draft.cpu(), this_time.cpu())
    ngram.cpu_path.cpu_path_inplace(inputs.to("cpu"), *expected, config)
    steps = [s for s in STEPS if s is not ngram.step02_serial or batch * seq_len <= 16 * 131072]
    _check_all_steps(inputs, draft, this_time, config, expected, steps=steps)
    for step in TILED_STEPS:
        for tiles in (1, 3, 16):  # any split of the haystacks gives the same answer
            d, t = draft.clone(), this_time.clone()
            ngram.NgramMatcher(step, inputs, d, t, config=config, chunk_tiles=tiles)()
            assert torch.equal(d.cpu(), expected[0]) and torch.equal(t.cpu(), expected[1]), (step.__name__, tiles)
    _check_stream(inputs, draft, this_time, config, expected, chunk_lens=(None, 2048, 6144, 65536))


def _check_stream(inputs, draft, this_time, config, expected, chunk_lens=(None,)):
    """Steps 9 to 12 at both load widths (8- and 16-byte loads, where the rows allow 16), at several splits."""
    wide = ngram.kernels.stream_vec(inputs.prompt_ids, inputs.generated_ids) == 2
    runs = [(step, None) for step in ngram.kernels.STREAM_STEPS if step not in WIDE_STEPS] + \
        [(step, vec) for step in WIDE_STEPS for vec in ((1, 2) if wide else (1,))]
    for step, vec in runs:
        for chunk_len in chunk_lens:
            d, t = draft.clone(), this_time.clone()
            m = ngram.NgramMatcher(step, inputs, d, t, config=config, chunk_len=chunk_len,
                                   **({} if vec is None else {"vec": vec}))
            m()
            torch.cuda.synchronize()
            assert m.vec == (vec or 1), (step.__name__, m.vec)
            what = (step.__name__, vec, m.chunk_len, config)
            assert torch.equal(d.cpu(), expected[0]) and torch.equal(t.cpu(), expected[1]), what
            assert bool((m.match_keys == -1).all()) and int(m.blocks_done) == 0, what


@pytest.mark.gpu
def test_stream_load_widths_and_splits_on_random_batches(seeds):
    for seed in seeds[:40]:
        inputs, draft, this_time, config = random_case(seed, max_batch=40, max_width=300)
        expected = run_ref(inputs, draft, this_time, config)
        _check_stream(inputs.to("cuda"), draft.cuda(), this_time.cuda(), config, expected, chunk_lens=(None, 2))


@pytest.mark.gpu
def test_stream_takes_rows_that_are_not_16_byte_aligned():
    inputs, draft, this_time = ngram.make_batch(24, 1001, 200, vocab=5, seed=11)
    config = NgramConfig(threshold=1 << 30)
    expected = run_ref(inputs, draft, this_time, config)
    gpu = inputs.to("cuda")
    gpu.prompt_ids = torch.cat([torch.zeros(1, dtype=I64, device="cuda"), gpu.prompt_ids.flatten()])[1:].view(24, 1001)
    assert gpu.prompt_ids.data_ptr() % 16 == 8 and ngram.kernels.stream_vec(gpu.prompt_ids, gpu.generated_ids) == 1
    _check_all_steps(gpu, draft.cuda(), this_time.cuda(), config, expected, steps=ngram.kernels.STREAM_STEPS)
    for step in WIDE_STEPS:
        assert ngram.NgramMatcher(step, gpu, draft.cuda(), this_time.cuda()).vec == 1
        with pytest.raises(ValueError, match="vec must be"):
            ngram.NgramMatcher(step, gpu, draft.cuda(), this_time.cuda(), vec=2)


@pytest.mark.gpu
def test_stream_budget_skip_at_scale():
    """The deployed budget over many long slots: most slots are skipped, the answer is unchanged."""
    for threshold in (128, 300, 1500):
        inputs, draft, this_time = ngram.make_batch(128, 4096, 512, seed=threshold, device="cuda")
        config = NgramConfig(threshold=threshold)
        expected = (draft.cpu(), this_time.cpu())
        ngram.cpu_path.cpu_path_inplace(inputs.to("cpu"), *expected, config)
        assert any(ngram.model_budget_refused(inputs.to("cpu"), config, this_time.cpu()))
        _check_stream(inputs, draft, this_time, config, expected)


@pytest.mark.gpu
def test_kernels_run_on_the_current_stream():
    inputs, draft, this_time = ngram.make_batch(64, 4096, 512, seed=5, device="cuda")
    expected = (draft.cpu(), this_time.cpu())
    ngram.cpu_path.cpu_path_inplace(inputs.to("cpu"), *expected, NgramConfig())
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        ngram.ngram_match(inputs, draft, this_time)
        snapshot = (draft.clone(), this_time.clone())  # same stream: sees the kernel's result
    stream.synchronize()
    assert torch.equal(snapshot[0].cpu(), expected[0]) and torch.equal(snapshot[1].cpu(), expected[1])


@pytest.mark.gpu
def test_gpu_steps_refuse_cpu_tensors():
    inputs, draft, this_time = _good()
    with pytest.raises(ValueError, match="runs on the GPU"):
        ngram.step03_two_phase(inputs, draft, this_time)


# -----------------------------------------------------------------------------------------
# Reporting code (figures, table, verdicts) on a synthetic results file: no numbers are claimed
# -----------------------------------------------------------------------------------------

def _synthetic_results(kernel_us: float):
    from studylog.plotting import Results

    rows = []
    for batch, seq_len, threshold in ngram.report.BENCH_GRID:
        params = {"batch": batch, "seq_len": seq_len, "threshold": threshold}
        floor_ms = batch * seq_len * 8 / 4e12 * 1e3
        for k, step in enumerate(ngram.CHAPTER.steps):
            us = 1000.0 if k == 0 else kernel_us * (len(ngram.CHAPTER.steps) - k)
            rows.append({"series": step.series, "role": "kernel", "params": params, "ms": us / 1e3,
                         "floor_ms": floor_ms})
    data = {"chapter": "ngram", "device": {"name": "Test GPU"}, "versions": {"torch": "x", "triton": "y"},
            "date": "2000-01-01T00:00:00", "git_commit": "abc", "ceilings": {"copy_bandwidth_gbs": 4000.0},
            "measurements": rows, "checks": [{"name": "bit-identical", "passed": True, "params": {}}], "notes": []}
    return Results(path=None, data=data)


@pytest.mark.parametrize("kernel_us, verdict", [(2.0, "met"), (500.0, "missed")])
def test_reporting_code_runs_and_judges(kernel_us, verdict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = _synthetic_results(kernel_us)
    figs = figures.figures(results)
    assert {"latency", "vs_floor"} <= set(figs)
    for fig in figs.values():
        plt.close(fig)
    table = lesson.summary_table(results)
    assert table.count("\n") == len(ngram.report.BENCH_GRID) + 1
    verdicts = lesson.target_verdicts(results)
    assert "1 of 1 checks passed" in verdicts
    assert f"10x faster than the CPU path at batch >= 32: {verdict}" in verdicts
    assert f"32x512 under 15 µs: {verdict}" in verdicts


# --- as a library: a config is checked when made, the CPU loop checks what it is given, a matcher's options and
# --- what it is bound to

def test_a_config_is_checked_when_it_is_made():
    with pytest.raises(ValueError, match="min_ngram_size=4 is larger than max_ngram_size=2"):
        NgramConfig(max_ngram_size=2, min_ngram_size=4)
    with pytest.raises(ValueError, match="min_ngram_size=4 is larger than max_ngram_size=3"):
        NgramConfig.hybrid_variant(min_ngram_size=4)
    for bad in (0, ngram.NGRAM_MAX + 1):
        with pytest.raises(ValueError, match="max_ngram_size must be in"):
            NgramConfig(max_ngram_size=bad)
    with pytest.raises(ValueError, match="min_ngram_size must be in"):
        NgramConfig(min_ngram_size=0)
    with pytest.raises(TypeError, match="threshold must be an int"):
        NgramConfig(threshold=1.5)


def test_the_cpu_loop_checks_what_it_is_given():
    """cpu_path_inplace is public: a length past a buffer, or a wrong dtype, is an error naming it, never a read
    out of bounds by the C loop."""
    inputs, draft, this_time = _good()
    inputs.step_idx = torch.tensor([3, 1], dtype=I32)  # generated_ids has 3 columns
    with pytest.raises(ValueError, match="step_idx must index"):
        ngram.cpu_path.cpu_path_inplace(inputs, draft, this_time, NgramConfig())
    inputs, draft, this_time = _good()
    with pytest.raises(TypeError, match="draft_tokens must be int64"):
        ngram.cpu_path.cpu_path_inplace(inputs, draft.int(), this_time, NgramConfig())


def test_a_matchers_block_sizes_are_positive():
    inputs, draft, this_time = _good()
    for step in SPLIT_STEPS:
        option = "chunk_tiles" if step in TILED_STEPS else "chunk_len"
        for bad in (0, -4):
            with pytest.raises(ValueError, match=f"{option} must be in"):
                ngram.NgramMatcher(step, inputs, draft, this_time, **{option: bad})
    with pytest.raises(ValueError, match=r"step09_stream takes no option \['vec'\]"):
        ngram.NgramMatcher(ngram.step09_stream, inputs, draft, this_time, vec=2)  # 8-byte loads only


@pytest.mark.gpu
def test_step_one_sees_new_prompts_written_into_its_buffers():
    """Step 1 copies the prompt to the host once, as the deployed path did at a request's admission: prompts
    written into the same buffers later (a new request) are copied again, never matched against the old ones."""
    inputs, draft, this_time = ngram.make_batch(6, 200, 40, seed=5, device="cuda")
    other, _, _ = ngram.make_batch(6, 200, 40, seed=6, device="cuda")
    matcher = ngram.NgramMatcher(ngram.step01_cpu_path, inputs, draft, this_time)
    d0, t0 = draft.clone(), this_time.clone()
    matcher()
    for new_prompt in ("copy", "rebind"):
        draft.copy_(d0)
        this_time.copy_(t0)
        if new_prompt == "copy":
            inputs.prompt_ids.copy_(other.prompt_ids)
            inputs.prompt_lens.copy_(other.prompt_lens)
        else:
            inputs.prompt_ids, inputs.prompt_lens = other.prompt_ids.clone(), other.prompt_lens.clone()
        matcher()
        want = ngram.reference_ngram_match(inputs.to("cpu"), d0.cpu(), t0.cpu())
        assert ngram.same_state(want, (draft, this_time)), new_prompt


@pytest.mark.gpu
def test_a_gpu_matcher_refuses_a_check_of_tensors_it_does_not_read():
    inputs, draft, this_time = ngram.make_batch(4, 100, 30, seed=2, device="cuda")
    matcher = ngram.NgramMatcher(ngram.step12_skip_refused, inputs, draft, this_time)
    matcher.check()
    inputs.step_idx = inputs.step_idx.clone()
    with pytest.raises(ValueError, match="inputs.step_idx was rebound"):
        matcher.check()


def test_the_final_step_is_never_slower_than_steps_6_to_12_on_a_measured_case():
    """ngram_match's rule (kernels.step_for_shape, shapes and budget) against every committed GPU file: at each case, synthetic grid
    and real text, where the step it picks and another of steps 6 to 12 were timed, the picked step is the fastest
    or within 3% of it (the target: never slower than any step). A file that predates a step (the H100's has no step
    6, 7 or 9 to 11) checks what it times."""
    import json

    from studylog import paths
    from studylog.ngram import CHAPTER
    from studylog.ngram.kernels import step_for_shape

    rivals = {f"step{n:02d}" for n in range(6, 13)}
    files = sorted(paths.BENCH_RESULTS.glob("*/ngram.json"))
    assert files, "no committed ngram results"
    checked, picked_seen = 0, set()
    for f in files:
        cases: dict = {}
        for r in json.loads(f.read_text())["measurements"]:
            if r["series"] in rivals and r.get("clock", "gpu") == "gpu":
                p = r["params"]
                case = (p["batch"], p["seq_len"], p.get("threshold"), p.get("corpus"))
                cases.setdefault(case, {})[r["series"]] = r["ms"]
        for (batch, seq_len, threshold, _), ms in cases.items():
            picked = CHAPTER.step(step_for_shape(batch, seq_len, NgramConfig(threshold=threshold)).__name__).series
            if picked not in ms or len(ms) < 2:
                continue
            assert ms[picked] <= 1.03 * min(ms.values()), (f.parent.name, batch, seq_len, ms, picked)
            checked += 1
            picked_seen.add(picked)
    assert checked >= 8 and picked_seen == {"step12", "step07"}, (checked, picked_seen)
