"""Batches (:func:`make_batch`: planted repeats; :func:`corpus_batch`: real documents), and what the benchmark
records of them: bytes read, branches taken, drafts accepted."""

from __future__ import annotations

import torch
from torch import Tensor

from studylog.ngram.formats import NONE_KEY, NgramConfig, NgramInputs
from studylog.ngram.models import (decode_key, model_budget_refused, model_one_pass_keys, pattern_slots,
                                   searching_slots, slot_plans)

#: Where a slot's match is planted: early / late in the prompt, in the generated tokens, a 1-gram only, none, or
#: not a decoding slot.
SLOT_KINDS = ("early", "late", "generated", "short", "never", "prefill", "inactive")
#: The benchmark's mix (20 slots, cycled): most slots decode; matches land early, late or never.
BENCH_MIX = ("early",) * 6 + ("late",) * 4 + ("generated",) * 3 + ("short",) * 3 + ("never",) * 2 + \
    ("prefill", "inactive")


def _draws(seed: int):
    """A CPU generator and ``rand(lo, hi)``, an int drawn from it, both ends inclusive."""
    rng = torch.Generator().manual_seed(seed)
    return rng, lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=rng)) if hi > lo else lo


def _bench_kinds(batch: int, rng: torch.Generator) -> list[str]:
    """The benchmark mix, shuffled and cycled over ``batch`` slots."""
    order = torch.randperm(len(BENCH_MIX), generator=rng).tolist()
    return [BENCH_MIX[order[b % len(BENCH_MIX)]] for b in range(batch)]


def make_batch(batch: int, prompt_width: int, gen_width: int, *, kinds: list[str] | None = None,
               draft_width: int = 11, vocab: int = 50_000, id_base: int = 0, decoys: bool = False,
               capped_fraction: float = 0.1, hybrid: bool = False, seed: int = 0,
               device: torch.device | str = "cpu") -> tuple[NgramInputs, Tensor, Tensor]:
    """A batch with planted repeats, and its initial (draft_tokens, seq_lens_this_time). Tokens are uniform over
    ``vocab`` ids from ``id_base`` (3-gram matches only where planted). Per slot kind (``kinds``, else the benchmark
    mix shuffled) the last 3 generated tokens are copied early or late into the prompt, or earlier into the
    generated tokens; "short" plants only the newest token; "never" gives fresh ids. ``decoys`` adds copies that
    differ only in bit 33 (a kernel comparing 32 bits would take them)."""
    if prompt_width < 1 or gen_width < 1 or draft_width < 2:
        raise ValueError("prompt_width and gen_width must be >= 1 and draft_width >= 2")
    device = torch.device(device)
    rng, rand = _draws(seed)
    dev_rng = torch.Generator(device=device).manual_seed(seed)
    kinds = _bench_kinds(batch, rng) if kinds is None else kinds
    if len(kinds) != batch or any(k not in SLOT_KINDS for k in kinds):
        raise ValueError(f"kinds must list {batch} of {SLOT_KINDS}")

    prompt = torch.randint(0, vocab, (batch, prompt_width), generator=dev_rng, device=device) + id_base
    gen = torch.randint(0, vocab, (batch, gen_width), generator=dev_rng, device=device) + id_base
    prompt_lens = [rand(max(1, prompt_width // 2), prompt_width) for _ in range(batch)]
    step_idx = [rand(max(0, gen_width // 2 - 1), gen_width - 1) for _ in range(batch)]

    def put(t: Tensor, cells: list[tuple[int, int, int]]) -> None:  # (row, column, id) cells, one index_put
        if cells:
            rows, cols, ids = (torch.tensor(x, device=device) for x in zip(*cells))
            t[rows, cols] = ids

    # "never": fresh ids (>= vocab) at the end of the generated tokens.
    put(gen, [(b, step_idx[b] - k, id_base + vocab + 3 * b + k) for b, kind in enumerate(kinds) if kind == "never"
              for k in range(min(3, step_idx[b] + 1))])
    idx = torch.tensor([[max(0, s - 2 + k) for k in range(3)] for s in step_idx], device=device).reshape(batch, 3)
    patterns = torch.gather(gen, 1, idx).tolist()  # the last 3 generated tokens (one sync)

    in_prompt, in_gen, decoy = [], [], []  # cells to write
    for b, kind in enumerate(kinds):
        plen, step, pat = prompt_lens[b], step_idx[b], patterns[b]
        if kind in ("early", "late") and plen >= 4 and step >= 2:
            lo, hi = (0, max(0, plen // 10 - 1)) if kind == "early" else (max(0, plen * 9 // 10 - 3), plen - 4)
            at = rand(lo, min(hi, plen - 4))
            in_prompt += [(b, at + k, t) for k, t in enumerate(pat)]
        elif kind == "generated" and step >= 6:
            at = rand(0, step - 6)  # ends before the pattern itself, with a token after it
            in_gen += [(b, at + k, t) for k, t in enumerate(pat)]
        elif kind == "short" and plen >= 2:
            in_prompt.append((b, rand(0, plen - 2), pat[2]))
        if decoys and kind not in ("prefill", "inactive") and plen >= 4:
            for _ in range(2):
                at = rand(0, plen - 4)
                decoy += [(b, at + k, t ^ (1 << 33)) for k, t in enumerate(pat)]
    # Decoys first, planted copies last: repeated indices in one index_put have no defined winner.
    put(prompt, decoy)
    put(prompt, in_prompt)
    put(gen, in_gen)

    return _assemble(kinds, prompt, gen, prompt_lens, step_idx, draft_width, rand, rng, capped_fraction, hybrid)


def corpus_batch(kind: str, batch: int, prompt_width: int, gen_width: int, *, draft_width: int = 11, seed: int = 0,
                 device: torch.device | str = "cpu") -> tuple[NgramInputs, Tensor, Tensor]:
    """A batch of real token streams (``kind``: ``"text"`` or ``"code"``) with the benchmark's slot mix: slot ``b``'s
    prompt is a corpus stream's first ``prompt_lens[b]`` tokens, its generated tokens the ones after. The
    ``draft_width - 1`` tokens past ``step_idx`` (never read by the kernels) are the true continuation that
    :func:`draft_acceptance` compares the drafts with."""
    from studylog.ngram.corpus import load_corpus

    if gen_width < draft_width + 1 or prompt_width < 1 or draft_width < 2:
        raise ValueError("corpus_batch needs prompt_width >= 1, draft_width >= 2 and gen_width > draft_width")
    corpus = load_corpus()
    if kind not in corpus.tokens:
        raise ValueError(f"kind must be one of {sorted(corpus.tokens)}, got {kind!r}")
    rng, rand = _draws(seed)
    kinds = _bench_kinds(batch, rng)
    count, window = corpus.tokens[kind].shape
    prompt = torch.empty((batch, prompt_width), dtype=torch.int64)
    gen = torch.empty((batch, gen_width), dtype=torch.int64)
    prompt_lens, step_idx = [], []
    for b in range(batch):
        plen = rand(max(1, prompt_width // 2), prompt_width)
        stream = corpus.stream(kind, rand(0, count - 1), max(prompt_width, plen + gen_width), rand(0, window - 1))
        prompt[b] = stream[:prompt_width]
        gen[b] = stream[plen:plen + gen_width]
        prompt_lens.append(plen)
        step_idx.append(rand(max(0, gen_width // 2 - 1), gen_width - draft_width))
    return _assemble(kinds, prompt.to(device), gen.to(device), prompt_lens, step_idx, draft_width, rand, rng)


def _assemble(kinds, prompt, gen, prompt_lens, step_idx, draft_width, rand, rng, capped_fraction=0.1, hybrid=False):
    """The batch's inputs and initial state, each slot's lengths drawn by its kind."""
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
        return torch.tensor(values, dtype=torch.int32, device=prompt.device)

    inputs = NgramInputs(prompt, i32(prompt_lens), gen, i32(step_idx), i32(dtn), i32(max_dec), i32(encoder),
                         i32(decoder))
    draft = torch.full((prompt.shape[0], draft_width), -1, dtype=torch.int64, device=prompt.device)  # never a token
    return inputs, draft, i32(this_time)


def haystack_bytes(inputs: NgramInputs, seq_lens_this_time: Tensor, config: NgramConfig) -> int:
    """Bytes of every haystack a searching slot must read once (the one-pass floor's numerator)."""
    return sum((prompt_len + step) * 8 for _, step, prompt_len in searching_slots(inputs, config, seq_lens_this_time))


def early_exit_bytes(inputs: NgramInputs, seq_lens_this_time: Tensor, config: NgramConfig) -> int:
    """Bytes a perfect early exit reads (budget ignored): each haystack up to the end of its first top-n window
    with a token after it, else all of it (only a top-n match lets the scan stop)."""
    total = 0
    for b, step, top, haystacks in pattern_slots(inputs, config, seq_lens_this_time):
        pattern = inputs.generated_ids[b, step + 1 - top: step + 1]
        for hay, hay_len in haystacks:
            hits = (hay[:hay_len - 1].unfold(0, top, 1) == pattern).all(1).nonzero() if hay_len - 1 >= top else []
            if len(hits):
                total += (int(hits[0, 0]) + top) * 8
                break
            total += hay_len * 8
    return total


def branch_stats(inputs: NgramInputs, seq_lens_this_time: Tensor, config: NgramConfig) -> dict:
    """Which branches of the search a batch takes (budget ignored but for step 12's skip rule): only a top-n match
    lets a scan stop early, the inner comparison loop runs where the newest token hits, and ``early_exit_fraction``
    is what a perfect early exit reads over the floor's bytes."""
    keys = model_one_pass_keys(inputs, config, seq_lens_this_time)  # a fraction of a second at the benchmark's sizes
    refused = model_budget_refused(inputs, config, seq_lens_this_time)
    searching = top = shorter = none = refused_n = 0
    hits = positions = 0
    for b, step, n_top, haystacks in pattern_slots(inputs, config, seq_lens_this_time):
        searching += 1
        refused_n += refused[b]
        if keys[b] == NONE_KEY:
            none += 1
        elif decode_key(keys[b])[0] == n_top:
            top += 1
        else:
            shorter += 1
        newest = inputs.generated_ids[b, step]
        for hay, hay_len in haystacks:
            if hay_len >= 2:
                hits += int((hay[:hay_len - 1] == newest).sum())
                positions += hay_len - 1
    floor = haystack_bytes(inputs, seq_lens_this_time, config)
    return {"searching_slots": searching, "refused_slots": refused_n, "top_n_matches": top, "shorter_matches": shorter,
            "no_match": none, "newest_token_hits_per_1k": 1000 * hits / positions if positions else 0.0,
            "early_exit_fraction": early_exit_bytes(inputs, seq_lens_this_time, config) / floor if floor else 0.0}


def draft_acceptance(inputs: NgramInputs, before: Tensor, draft_tokens: Tensor, seq_lens_this_time: Tensor,
                     config: NgramConfig) -> dict:
    """How many drafts a batch got (``before``: ``seq_lens_this_time`` before the call) and how many a greedy
    verifier accepts: the longest prefix equal to ``generated_ids[b, step_idx[b] + 1:]`` (the document's
    continuation on a :func:`corpus_batch`, random on a :func:`make_batch`); past the buffer's end, rejected."""
    step_idx, after = inputs.step_idx.tolist(), seq_lens_this_time.tolist()
    drafts, gen = draft_tokens.cpu(), inputs.generated_ids
    slots = []  # (drafted, accepted) of each active slot
    for b, (kind, _, base, _) in enumerate(slot_plans(inputs, config, before)):
        if kind == "active":
            drafted = max(after[b] - base, 0)
            truth = gen[b, step_idx[b] + 1: step_idx[b] + 1 + drafted].cpu()
            wrong = (drafts[b, base: base + len(truth)] != truth).nonzero()
            slots.append((drafted, int(wrong[0, 0]) if len(wrong) else len(truth)))
    return {"active_slots": len(slots), "slots_with_drafts": sum(d > 0 for d, _ in slots),
            "drafted_tokens": sum(d for d, _ in slots), "accepted_tokens": sum(a for _, a in slots),
            "slots_with_accepted": sum(a > 0 for _, a in slots)}
