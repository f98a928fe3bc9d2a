"""Drafts: chapter 3's n-gram matcher proposes, chapter 1's automaton cuts and extends, a gate switches them off."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from studylog.checks import check_int
from studylog.runtime import cuda_graph, staged
from studylog.ngram import NgramConfig, NgramInputs, NgramMatcher
from studylog.ngram import kernels as ngram_kernels

#: Prompt lookup's usual window: the last 3 tokens, then 2, then 1, matched in the prompt.
DRAFT_NGRAM = NgramConfig(max_ngram_size=3, min_ngram_size=1)


class NgramDrafter:
    """Chapter 3's matcher over ``batch`` sequences of prompts up to ``prompt_width`` tokens and outputs up to
    ``output_width`` tokens, proposing up to ``draft_len`` tokens per call."""

    def __init__(self, batch: int, prompt_width: int, output_width: int, draft_len: int, device):
        for name, v in (("batch", batch), ("prompt_width", prompt_width), ("output_width", output_width),
                        ("draft_len", draft_len)):
            check_int(name, v, low=1)
        self.batch, self.draft_len, self.device = batch, draft_len, torch.device(device)
        # host buffers written with numpy; the int32 lengths live in one [6, B] buffer (one copy per call)
        self._out_host, self._out = staged(batch, output_width, dtype=torch.int64, device=self.device)
        self._lens_host, self._lens = staged(6, batch, dtype=torch.int32, device=self.device)
        self._out_np, self._lens_np = self._out_host.numpy(), self._lens_host.numpy()
        self._prompt = torch.zeros(batch, prompt_width, dtype=torch.int64, device=self.device)
        prompt_lens, step_idx, draft_num, max_dec, encoder, decoder = self._lens
        self.inputs = NgramInputs(self._prompt, prompt_lens, self._out, step_idx, draft_num, max_dec, encoder, decoder)
        self._draft_host, self.draft_tokens = staged(batch, draft_len + 1, dtype=torch.int64, device=self.device)
        self._this_time_host, self.seq_lens_this_time = staged(batch, dtype=torch.int32, device=self.device)
        step = (ngram_kernels.final_step(self.inputs, DRAFT_NGRAM) if self.device.type == "cuda"
                else ngram_kernels.step01_cpu_path)
        self.matcher = NgramMatcher(step, self.inputs, self.draft_tokens, self.seq_lens_this_time,
                                    config=DRAFT_NGRAM, check_values=False)
        self._graph = None
        self.admit([[]] * batch)

    def _round_trip(self) -> None:
        if self._out is not self._out_host:
            self._out.copy_(self._out_host, non_blocking=True)
            self._lens.copy_(self._lens_host, non_blocking=True)
        self.matcher()
        if self._draft_host is not self.draft_tokens:
            self._draft_host.copy_(self.draft_tokens, non_blocking=True)
            self._this_time_host.copy_(self.seq_lens_this_time, non_blocking=True)

    def capture(self) -> None:
        """Capture the round trip in a CUDA graph: one replay instead of five launches and copies."""
        if self.device.type == "cuda" and self._graph is None:
            self._graph, _ = cuda_graph(self._round_trip)

    def admit(self, prompts: Sequence[Sequence[int]]) -> None:
        """A new request's prompts (the haystacks)."""
        if len(prompts) != self.batch:
            raise ValueError(f"prompts holds {len(prompts)} sequences; the drafter has batch {self.batch}")
        width = self._prompt.shape[1]
        host = np.zeros((self.batch, width), dtype=np.int64)
        for b, p in enumerate(prompts):
            if len(p) > width:
                raise ValueError(f"prompt {b} has {len(p)} tokens; the drafter's prompt width is {width}")
            host[b, :len(p)] = p
            self._lens_np[0, b] = len(p)
        self._prompt.copy_(torch.from_numpy(host))
        self._lens_np[3] = 1 << 30  # max_dec_len: no cap of its own, the caller's room is draft_token_num
        self._lens_np[4] = 0  # seq_lens_encoder: no slot is in prefill
        self._written = [0] * self.batch  # output tokens already in the host buffer, per sequence

    def propose(self, outputs: Sequence[Sequence[int] | None], room: Sequence[int]) -> list[list[int]]:
        """Drafts of at most ``room[b]`` tokens from each output so far (None: no draft), waited for (the walk needs
        them on the host). Only the output tokens not written yet are copied (all where the written ones changed)."""
        width = self._out_np.shape[1]
        lens, out, written = self._lens_np, self._out_np, self._written
        for b, ids in enumerate(outputs):
            n = len(ids) if ids is not None else 0
            active = n > 0 and room[b] > 0
            if n > width:
                raise ValueError(f"output {b} has {n} tokens; the drafter's output width is {width}")
            if active:
                w = written[b]
                if w > n or (w and out[b, w - 1] != ids[w - 1]):
                    w = 0
                out[b, w:n] = ids[w:]
                written[b] = n
            lens[1, b] = max(n - 1, 0)  # step_idx: the newest token's index
            lens[2, b] = min(room[b], self.draft_len) if active else 0  # draft_token_num
            lens[5, b] = 1 if active else 0  # seq_lens_decoder: 0 is an empty slot
        if self._graph is not None:
            self._graph.replay()
        else:
            self._round_trip()
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        drafts, counts = self._draft_host.numpy(), self._this_time_host.numpy()
        return [drafts[b, 1:max(int(counts[b]), 1)].tolist() if outputs[b] is not None else []
                for b in range(self.batch)]


@dataclass
class Walked:
    """A draft after the grammar's walk: the tokens to verify, the states before each and after the last, which
    tokens the matcher proposed (the others are forced), and how many proposed tokens the grammar cut."""

    tokens: list[int]
    states: list[int]
    proposed: list[bool]
    cut: int

    @property
    def forced(self) -> int:
        return len(self.tokens) - sum(self.proposed)


def walk_draft(automaton, state: int, draft: Sequence[int], room: int, *, extend: bool, eos: int = -1) -> Walked:
    """Walk ``draft`` through ``automaton`` (chapter 7's automaton of the grammar) from
    ``state``: keep tokens while the grammar allows them, at most ``room`` in all; with ``extend``, add the
    forced chain of every state the walk reaches (proposed tokens that disagree with a forced token are cut).
    The walk stops at a state where only EOS is allowed (nothing can follow it) and before a proposed ``eos``
    (whether the output ends there is the model's choice at that position)."""
    vocab_size = automaton.vocab_size
    if any(not 0 <= t < vocab_size for t in draft):
        raise ValueError(f"draft holds ids outside the vocabulary [0, {vocab_size}): {list(draft)}")
    step = automaton.transition  # the ids were checked once above, not once per transition
    tokens, states, proposed = [], [state], []
    cut = i = 0
    n, s = len(draft), state
    while len(tokens) < room and not automaton.only_eos(s):
        jump = automaton.token_jump(s) if extend else None
        if jump is not None:  # certain tokens: they join the draft, and the proposal goes on if it agrees
            for t in jump.tokens[:room - len(tokens)]:
                if i < n and draft[i] == t:
                    i += 1
                elif i < n:  # the proposal disagrees with the grammar: the rest of it is cut
                    cut, i = n - i, n
                s = step(s, t)
                tokens.append(t)
                states.append(s)
                proposed.append(False)
            continue
        if i >= n or draft[i] == eos:
            break
        nxt = step(s, draft[i])
        if nxt is None:  # the first token the grammar forbids, and everything after it
            cut = n - i
            break
        tokens.append(draft[i])
        states.append(nxt)
        proposed.append(True)
        s, i = nxt, i + 1
    return Walked(tokens, states, proposed, cut)


class DraftGate:
    """Per sequence, whether drafting pays (step 4). A verified draft makes the step's forward several tokens
    long, and at batch 1 on a small model that forward costs more than a one-token one (the six-launch layer
    against the nine-launch layer): a draft must be expected to return ``min_accepted`` tokens. The gate keeps
    a running mean of accepted tokens per verified draft; below ``min_accepted`` the sequence stops drafting
    for ``backoff`` steps, doubled at every failed probe up to ``max_backoff`` and reset by a paying one. A step
    whose chunk holds several tokens anyway (after a jump) drafts for free: the gate lets it through."""

    def __init__(self, batch: int, *, min_accepted: float = 1.0, max_backoff: int = 32):
        check_int("max_backoff", max_backoff, low=1)
        if not min_accepted >= 0:
            raise ValueError(f"min_accepted must be >= 0, got {min_accepted!r}")
        self.min_accepted, self.max_backoff = float(min_accepted), max_backoff
        self.mean = [float(min_accepted)] * batch  # optimistic: a new request drafts
        self.wait = [0] * batch
        self.backoff = [1] * batch

    def allows(self, b: int, pending: int) -> bool:
        if pending > 1:
            return True
        if self.wait[b] > 0:
            self.wait[b] -= 1
            return False
        return True

    def update(self, b: int, verified: int, accepted: int) -> None:
        """After a step that verified ``verified`` proposed tokens of sequence ``b`` and accepted ``accepted``."""
        if verified == 0:
            return
        self.mean[b] = 0.5 * self.mean[b] + 0.5 * accepted
        if self.mean[b] >= self.min_accepted:
            self.backoff[b], self.wait[b] = 1, 0
            return
        self.wait[b] = self.backoff[b]
        self.backoff[b] = min(2 * self.backoff[b], self.max_backoff)


__all__ = ["DRAFT_NGRAM", "DraftGate", "NgramDrafter", "Walked", "walk_draft"]
