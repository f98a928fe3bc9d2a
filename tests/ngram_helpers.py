"""Test-only models of chapter 3's GPU algorithms (beside the ones in :mod:`studylog.ngram.models`)."""

from __future__ import annotations

import torch
from torch import Tensor

from studylog.ngram.formats import NONE_KEY, NgramConfig, NgramInputs
from studylog.ngram.models import SCAN_THREADS, decode_key, slot_plan


def model_budget_scan(inputs: NgramInputs, keys: list[int], draft_tokens: Tensor, seq_lens_this_time: Tensor,
                      config: NgramConfig, *, chunk: int = SCAN_THREADS) -> tuple[Tensor, Tensor]:
    """Phase 2 of steps 4 to 11 in plain Python, chunk by chunk as ``budget_scan_block`` walks the
    batch: an exclusive prefix sum of tentative counts, the first slot where the budget bites,
    and no drafts for any active slot after it."""
    prompt, gen = inputs.prompt_ids.tolist(), inputs.generated_ids.tolist()
    prompt_lens, step_idx = inputs.prompt_lens.tolist(), inputs.step_idx.tolist()
    draft, this_time = draft_tokens.tolist(), seq_lens_this_time.tolist()
    lists = (step_idx, inputs.draft_token_num.tolist(), inputs.max_dec_len.tolist(),
             inputs.seq_lens_encoder.tolist(), inputs.seq_lens_decoder.tolist(), list(this_time))
    batch = inputs.batch
    plans = [slot_plan(b, config, *lists) for b in range(batch)]
    counted_total = sum(p[1] for p in plans)

    def tentative(b: int) -> int:
        kind, _, _, cap = plans[b]
        if kind != "active" or keys[b] == NONE_KEY or cap < 1:
            return 0
        n, source, start = decode_key(keys[b])
        hay_len = step_idx[b] if source else prompt_lens[b]
        return min(cap, hay_len - start - n)

    total_before = active_before = 0
    crossed = False
    for first_slot in range(0, batch, chunk):
        slots = range(first_slot, min(first_slot + chunk, batch))
        drafted_t = {b: tentative(b) for b in slots}
        final_t = {b: plans[b][2] + drafted_t[b] for b in slots}
        sums, rooms, running, active = {}, {}, total_before, active_before
        for b in slots:  # the block's exclusive / inclusive scans
            active += plans[b][0] == "active"
            sums[b] = running + plans[b][2]
            rooms[b] = config.threshold - sums[b] - (counted_total - active)
            running += final_t[b]
        crossing = [b for b in slots if plans[b][0] == "active" and drafted_t[b] > 0
                    and (rooms[b] < 2 or drafted_t[b] > rooms[b])]
        first = crossing[0] if crossing else None
        for b in slots:
            kind, _, base, _ = plans[b]
            drafted = drafted_t[b]
            if crossed or (first is not None and b > first):
                drafted = 0
            elif b == first:
                drafted = rooms[b] if rooms[b] >= 2 else 0
            if kind == "active":
                this_time[b] = base + drafted
                if drafted:
                    n, source, start = decode_key(keys[b])
                    hay = gen[b] if source else prompt[b]
                    draft[b][base: base + drafted] = hay[start + n: start + n + drafted]
            elif kind == "zero":
                this_time[b] = 0
        total_before = running
        active_before = active
        crossed = crossed or first is not None
    return torch.tensor(draft, dtype=torch.int64).reshape(draft_tokens.shape), \
        torch.tensor(this_time, dtype=torch.int32)


def op_arguments(inputs: NgramInputs, draft_tokens: Tensor, seq_lens_this_time: Tensor,
                 config: NgramConfig = NgramConfig()) -> tuple:
    """``torch.ops.studylog.ngram_match``'s arguments from ``NgramInputs``, the state and ``NgramConfig``, in its
    order."""
    return (inputs.prompt_ids, inputs.prompt_lens, inputs.generated_ids, inputs.step_idx, inputs.draft_token_num,
            inputs.max_dec_len, inputs.seq_lens_encoder, inputs.seq_lens_decoder, draft_tokens, seq_lens_this_time,
            config.max_ngram_size, config.min_ngram_size, config.threshold, config.hybrid, config.max_draft_tokens)
