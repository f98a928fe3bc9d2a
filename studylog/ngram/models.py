"""The GPU algorithms in plain Python, to check against the reference on any machine: step 5's one-pass search
(:func:`model_one_pass_keys`) and step 12's skip rule (:func:`model_budget_refused`)."""

from __future__ import annotations

from torch import Tensor

from studylog.ngram.formats import NGRAM_MAX, NONE_KEY, NgramConfig, NgramInputs

#: Threads of the phase-2 scan block (``SCAN_THREADS`` of the launches): the chunk the scan walks.
SCAN_THREADS = 1024


def match_key(n: int, source: int, start: int) -> int:
    """The 64-bit key of a match (``make_key`` in ``ngram_common.cuh``): larger n first, then the prompt (source 0)
    before the generated tokens (1), then the leftmost start."""
    return ((2 * (NGRAM_MAX - n) + source) << 32) | start


def decode_key(key: int) -> tuple[int, int, int]:
    """(n, source, start) of a key."""
    return NGRAM_MAX - (key >> 33), (key >> 32) & 1, key & 0xFFFFFFFF


def slot_plan(b: int, config: NgramConfig, step_idx, draft_token_num, max_dec_len, encoder, decoder, this_time):
    """(kind, counted, base, cap) of slot b, as ``plan_slot`` in ``ngram_common.cuh``: ``kind`` "keep" (prefill, or
    nothing to add), "zero" (an empty slot) or "active"; ``counted``: the budget reserves a token for it (the ngram
    variant counts prefill slots too; the hybrid one, slots with decoder tokens); ``base``: its tokens before any
    draft; ``cap``: the most drafts its request allows."""
    dec_room = max_dec_len[b] - step_idx[b] - 1  # tokens the request may still produce after this one
    if not config.hybrid:
        counted = encoder[b] > 0 or decoder[b] > 0
        cap = min(draft_token_num[b], dec_room)
        if encoder[b] > 0:
            return "keep", counted, this_time[b], cap
        if decoder[b] == 0:
            return "zero", counted, 0, cap
        return "active", counted, 1, cap  # base 1: the token the target model verifies anyway
    ori = this_time[b]  # MTP already placed these tokens; drafts go after them
    room = config.max_draft_tokens - ori + 1
    kind = "keep" if (ori == 0 or room <= 0 or dec_room <= 0) else "active"
    return kind, decoder[b] > 0, ori, min(room, dec_room)


def slot_plans(inputs: NgramInputs, config: NgramConfig, seq_lens_this_time: Tensor) -> list[tuple]:
    """:func:`slot_plan` of every slot."""
    lists = (inputs.step_idx.tolist(), inputs.draft_token_num.tolist(), inputs.max_dec_len.tolist(),
             inputs.seq_lens_encoder.tolist(), inputs.seq_lens_decoder.tolist(), seq_lens_this_time.tolist())
    return [slot_plan(b, config, *lists) for b in range(inputs.batch)]


def searching_slots(inputs: NgramInputs, config: NgramConfig, seq_lens_this_time: Tensor):
    """(slot, step_idx, prompt length) of each slot that searches this step: active, with room for a draft."""
    step_idx, prompt_lens = inputs.step_idx.tolist(), inputs.prompt_lens.tolist()
    for b, (kind, _, _, cap) in enumerate(slot_plans(inputs, config, seq_lens_this_time)):
        if kind == "active" and cap >= 1:
            yield b, step_idx[b], prompt_lens[b]


def pattern_slots(inputs: NgramInputs, config: NgramConfig, seq_lens_this_time: Tensor):
    """(slot, step_idx, top n, haystacks) of each searching slot whose pattern reaches ``min_ngram_size``; the
    haystacks are (row, length) of the prompt, then of the generated tokens."""
    for b, step, prompt_len in searching_slots(inputs, config, seq_lens_this_time):
        top = min(config.max_ngram_size, step)
        if top >= config.min_ngram_size:
            yield b, step, top, ((inputs.prompt_ids[b], prompt_len), (inputs.generated_ids[b], step))


def model_one_pass_keys(inputs: NgramInputs, config: NgramConfig, seq_lens_this_time: Tensor) -> list[int]:
    """Phase 1 of step 5: for every end e of each haystack, the common suffix of ``hay[:e+1]`` and the generated
    tokens (up to the top n) names the best candidate ending there; the smallest key over all ends wins."""
    keys = [NONE_KEY] * inputs.batch
    for b, step, top, haystacks in pattern_slots(inputs, config, seq_lens_this_time):
        gen = inputs.generated_ids[b, :step + 1].tolist()
        for source, (row, hay_len) in enumerate(haystacks):
            hay = row[:hay_len].tolist()
            for end in range(hay_len - 1):  # end <= hay_len - 2: a token follows the window
                length = 0
                while length < top and length <= end and hay[end - length] == gen[step - length]:
                    length += 1
                if length >= config.min_ngram_size:
                    keys[b] = min(keys[b], match_key(length, source, end - length + 1))
    return keys


def model_budget_refused(inputs: NgramInputs, config: NgramConfig, seq_lens_this_time: Tensor) -> list[bool]:
    """Step 12's skip rule (``budget_bound_part``, ``ngram_stream.cu``): an active slot is refused whatever the
    searches find when the smallest running total (each slot so far at its base) plus ``left`` reaches threshold - 1."""
    plans = slot_plans(inputs, config, seq_lens_this_time)
    left = sum(p[1] for p in plans)
    smallest_total = 0
    refused = []
    for kind, _, base, _ in plans:
        smallest_total += base  # an empty slot's base is 0
        left -= kind == "active"
        refused.append(kind == "active" and smallest_total + left >= config.threshold - 1)
    return refused
