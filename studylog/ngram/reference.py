"""The specification of n-gram matching: the rules of the serial CPU operator serving engines ran, line by line
(``n`` from ``max_ngram_size`` down to ``min_ngram_size``; the **leftmost** earlier occurrence; the batch budget
``threshold``). Every step must reproduce :func:`reference_ngram_match` bit for bit."""

from __future__ import annotations

import torch
from jaxtyping import Int32, Int64
from torch import Tensor

from studylog.ngram.formats import NgramConfig, NgramInputs, validate
from studylog.ngram.models import slot_plans


def _leftmost_continuation(hay: list[int], hay_len: int, pattern: list[int], cap: int):
    """(start, drafts) of the leftmost window ``hay[i:i+n] == pattern`` followed by at least one token, or None
    (a window at the very end is skipped, as deployed; ``cap <= 0`` never yields drafts)."""
    n = len(pattern)
    for i in range(hay_len - n + 1):
        end = min(i + n + cap, hay_len)
        if hay[i:i + n] == pattern and i + n < end:
            return i, hay[i + n:end]
    return None


def reference_ngram_match(inputs: NgramInputs, draft_tokens: Int64[Tensor, "batch draft_width"],
                          seq_lens_this_time: Int32[Tensor, " batch"], config: NgramConfig = NgramConfig(),
                          *, trace: list | None = None) -> tuple[Tensor, Tensor]:
    """The specification: new (draft_tokens, seq_lens_this_time) on the CPU, the inputs unchanged. A list passed as
    ``trace`` gets one dict per slot saying what happened and why."""
    validate(inputs, draft_tokens, seq_lens_this_time, config)
    prompt, gen = inputs.prompt_ids.tolist(), inputs.generated_ids.tolist()
    prompt_lens, step_idx = inputs.prompt_lens.tolist(), inputs.step_idx.tolist()
    draft, this_time = draft_tokens.tolist(), seq_lens_this_time.tolist()
    plans = slot_plans(inputs, config, seq_lens_this_time)
    threshold = config.threshold
    unprocessed = sum(counted for _, counted, _, _ in plans)  # slots that still need at least one token this step

    for b, (kind, _, base, cap) in enumerate(plans):
        this_time[b] = base  # prefill and untouched slots keep theirs; an empty slot gets 0
        name = {"keep": "untouched" if config.hybrid else "prefill", "zero": "inactive"}.get(kind, kind)
        note = {"slot": b, "kind": name, "searched": False, "n": None, "source": None, "start": None, "drafted": 0}
        if trace is not None:
            trace.append(note)
        if kind != "active":
            continue
        unprocessed -= 1  # this slot is being served now

        total = sum(this_time[: b + 1])  # tokens of this step so far, this slot's own included
        left = unprocessed  # one token reserved for every counted slot not served yet
        if total + cap + left > threshold:  # the batch budget cuts the cap ...
            cap = min(cap, threshold - total - left)
        note.update(cap=cap, total=total, left=left)
        if total + left >= threshold - 1:  # ... and leaves no drafts at all when fewer than 2 fit
            continue

        note["searched"] = True
        step = step_idx[b]
        for n in range(config.max_ngram_size, config.min_ngram_size - 1, -1):
            if step < n:  # as deployed: the pattern must leave a generated token before it
                continue
            pattern = gen[b][step + 1 - n: step + 1]  # the last n generated tokens
            found, source = _leftmost_continuation(prompt[b], prompt_lens[b], pattern, cap), "prompt"
            if found is None:  # only if the prompt has none: the generated tokens before the newest
                found, source = _leftmost_continuation(gen[b], step, pattern, cap), "generated"
            if found is not None:
                start, tokens = found
                draft[b][base: base + len(tokens)] = tokens
                this_time[b] = base + len(tokens)
                note.update(n=n, source=source, start=start, drafted=len(tokens))
                break
    return torch.tensor(draft, dtype=torch.int64).reshape(draft_tokens.shape), \
        torch.tensor(this_time, dtype=torch.int32)
