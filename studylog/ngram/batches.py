"""Realistic batches for the tests, the notebook and the benchmark, and what they cost to search.

:func:`make_batch` draws token streams with planted repeats; :func:`haystack_bytes` is the numerator
of the one-pass floor (every searching slot reads its haystacks once); :func:`early_exit_bytes` is
what a perfect early exit would read.
"""

from __future__ import annotations

import torch
from torch import Tensor

from studylog.ngram.formats import NgramConfig, NgramInputs
from studylog.ngram.models import slot_plan

#: How a slot's match is placed: early / late in the prompt, only in the generated tokens, only
#: a short (1-gram) match, none at all, or not a decoding slot.
SLOT_KINDS = ("early", "late", "generated", "short", "never", "prefill", "inactive")
#: The benchmark's mix (20 slots, cycled): most slots decode; matches land early, late or never.
BENCH_MIX = ("early",) * 6 + ("late",) * 4 + ("generated",) * 3 + ("short",) * 3 + ("never",) * 2 + \
    ("prefill", "inactive")


def make_batch(batch: int, prompt_width: int, gen_width: int, *, kinds: list[str] | None = None,
               draft_width: int = 11, vocab: int = 50_000, id_base: int = 0, decoys: bool = False,
               capped_fraction: float = 0.1, hybrid: bool = False, seed: int = 0,
               device: torch.device | str = "cpu") -> tuple[NgramInputs, Tensor, Tensor]:
    """A batch of token streams with planted repeats, and its initial (draft_tokens, seq_lens_this_time).

    Tokens are uniform over ``vocab`` ids starting at ``id_base`` (so 1-gram matches are common
    in long prompts and 3-gram ones only where planted). Per slot kind (``kinds``, else the
    benchmark mix shuffled): the last 3 generated tokens are copied early or late into the
    prompt, or earlier into the generated tokens; "short" plants only the newest token; "never"
    gives the slot fresh ids found nowhere else. ``decoys`` adds copies of the pattern that differ
    only in bit 33 (a kernel comparing 32 bits would take them). Bulk tokens are drawn on
    ``device``; per-slot choices come from a CPU generator seeded with ``seed``.
    """
    if prompt_width < 1 or gen_width < 1 or draft_width < 2:
        raise ValueError("prompt_width and gen_width must be >= 1 and draft_width >= 2")
    device = torch.device(device)
    rng = torch.Generator().manual_seed(seed)
    dev_rng = torch.Generator(device=device).manual_seed(seed)

    def rand(lo: int, hi: int) -> int:  # inclusive
        return int(torch.randint(lo, hi + 1, (1,), generator=rng)) if hi > lo else lo

    if kinds is None:
        order = torch.randperm(len(BENCH_MIX), generator=rng).tolist()
        kinds = [BENCH_MIX[order[b % len(BENCH_MIX)]] for b in range(batch)]
    if len(kinds) != batch or any(k not in SLOT_KINDS for k in kinds):
        raise ValueError(f"kinds must list {batch} of {SLOT_KINDS}")

    prompt = torch.randint(0, vocab, (batch, prompt_width), generator=dev_rng, device=device) + id_base
    gen = torch.randint(0, vocab, (batch, gen_width), generator=dev_rng, device=device) + id_base
    prompt_lens = [rand(max(1, prompt_width // 2), prompt_width) for _ in range(batch)]
    step_idx = [rand(max(0, gen_width // 2 - 1), gen_width - 1) for _ in range(batch)]

    # "never": fresh ids (>= vocab) at the end of the generated tokens.
    rows, cols, vals = [], [], []
    for b, kind in enumerate(kinds):
        if kind == "never":
            for k in range(min(3, step_idx[b] + 1)):
                rows.append(b), cols.append(step_idx[b] - k), vals.append(id_base + vocab + 3 * b + k)
    if rows:
        gen[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = torch.tensor(vals, device=device)
    idx = torch.tensor([[max(0, s - 2 + k) for k in range(3)] for s in step_idx], device=device).reshape(batch, 3)
    patterns = torch.gather(gen, 1, idx).tolist()  # the last 3 generated tokens (one sync)

    p_rows, p_cols, p_vals, g_rows, g_cols, g_vals = [], [], [], [], [], []
    d_rows, d_cols, d_vals = [], [], []
    for b, kind in enumerate(kinds):
        plen, step, pat = prompt_lens[b], step_idx[b], patterns[b]
        if kind in ("early", "late") and plen >= 4 and step >= 2:
            lo, hi = (0, max(0, plen // 10 - 1)) if kind == "early" else (max(0, plen * 9 // 10 - 3), plen - 4)
            at = rand(lo, min(hi, plen - 4))
            p_rows += [b] * 3
            p_cols += [at, at + 1, at + 2]
            p_vals += pat
        elif kind == "generated" and step >= 6:
            at = rand(0, step - 6)  # ends before the pattern itself, with a token after it
            g_rows += [b] * 3
            g_cols += [at, at + 1, at + 2]
            g_vals += pat
        elif kind == "short" and plen >= 2:
            p_rows.append(b), p_cols.append(rand(0, plen - 2)), p_vals.append(pat[2])
        if decoys and kind not in ("prefill", "inactive") and plen >= 4:
            for _ in range(2):
                at = rand(0, plen - 4)
                d_rows += [b] * 3
                d_cols += [at, at + 1, at + 2]
                d_vals += [t ^ (1 << 33) for t in pat]
    # Decoys first, planted copies last: repeated indices in one index_put have no defined winner.
    writes = ((prompt, d_rows, d_cols, d_vals), (prompt, p_rows, p_cols, p_vals), (gen, g_rows, g_cols, g_vals))
    for t, r, c, v in writes:
        if r:
            t[torch.tensor(r, device=device), torch.tensor(c, device=device)] = torch.tensor(v, device=device)

    encoder, decoder, this_time, dtn, max_dec = [], [], [], [], []
    for b, kind in enumerate(kinds):
        step = step_idx[b]
        if kind == "prefill":
            chunk = rand(1, 512)
            encoder.append(chunk), decoder.append(rand(0, 1) * rand(1, 4096)), this_time.append(chunk)
        elif kind == "inactive":
            encoder.append(0), decoder.append(0), this_time.append(rand(0, 3))
        else:
            encoder.append(0), decoder.append(prompt_lens[b] + step + 1)
            this_time.append(rand(1, 3) if hybrid and rand(0, 9) else (0 if hybrid else rand(0, draft_width)))
        dtn.append(draft_width - 1 if rand(0, 3) else rand(0, draft_width - 1))
        capped = float(torch.rand((), generator=rng)) < capped_fraction
        max_dec.append(step + 1 + (rand(0, 3) if capped else rand(16, 4096)))

    def i32(values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    inputs = NgramInputs(prompt, i32(prompt_lens), gen, i32(step_idx), i32(dtn), i32(max_dec), i32(encoder),
                         i32(decoder))
    draft = torch.full((batch, draft_width), -1, dtype=torch.int64, device=device)  # poison: -1 is never a token
    return inputs, draft, i32(this_time)


def haystack_bytes(inputs: NgramInputs, seq_lens_this_time: Tensor, config: NgramConfig) -> int:
    """Bytes of every haystack a searching slot must read once: prompt and generated tokens of the
    active slots (the one-pass floor's numerator)."""
    lists = (inputs.step_idx.tolist(), inputs.draft_token_num.tolist(), inputs.max_dec_len.tolist(),
             inputs.seq_lens_encoder.tolist(), inputs.seq_lens_decoder.tolist(), seq_lens_this_time.tolist())
    prompt_lens = inputs.prompt_lens.tolist()
    total = 0
    for b in range(inputs.batch):
        kind, _, _, cap = slot_plan(b, config, *lists)
        if kind == "active" and cap >= 1:
            total += (prompt_lens[b] + lists[0][b]) * 8
    return total


def early_exit_bytes(inputs: NgramInputs, seq_lens_this_time: Tensor, config: NgramConfig) -> int:
    """Bytes a perfect early exit reads (budget ignored): a searching slot reads its prompt up to
    the end of the first window of the top n with a token after it; without one, the whole prompt,
    then its generated tokens the same way. (Only a top-n match lets the scan stop: a shorter one
    can still be beaten further on.) Compare with :func:`haystack_bytes`, the floor's numerator."""
    lists = (inputs.step_idx.tolist(), inputs.draft_token_num.tolist(), inputs.max_dec_len.tolist(),
             inputs.seq_lens_encoder.tolist(), inputs.seq_lens_decoder.tolist(), seq_lens_this_time.tolist())
    prompt_lens = inputs.prompt_lens.tolist()
    total = 0
    for b in range(inputs.batch):
        kind, _, _, cap = slot_plan(b, config, *lists)
        step = lists[0][b]
        top = min(config.max_ngram_size, step)
        if kind != "active" or cap < 1 or top < config.min_ngram_size:
            continue
        pattern = inputs.generated_ids[b, step + 1 - top: step + 1]
        for hay, hay_len in ((inputs.prompt_ids[b], prompt_lens[b]), (inputs.generated_ids[b], step)):
            windows = hay[: max(hay_len - 1, 0)].unfold(0, top, 1) if hay_len - 1 >= top else None
            hits = (windows == pattern).all(1).nonzero() if windows is not None else torch.empty(0)
            if len(hits):
                total += (int(hits[0, 0]) + top) * 8
                break
            total += hay_len * 8
    return total


__all__ = ["SLOT_KINDS", "BENCH_MIX", "make_batch", "haystack_bytes", "early_exit_bytes"]
