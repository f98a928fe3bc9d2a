"""Chapter 3: n-gram matching for speculative decoding, from a CPU loop to one GPU launch.

Every decoding step, each active slot of a batch looks up its last ``n`` generated tokens
(``n`` from ``max_ngram_size`` down to ``min_ngram_size``) in its prompt, then in its earlier
generated tokens, and proposes the tokens that followed the **leftmost** earlier occurrence as
draft tokens for the target model to verify. A batch-wide token budget (``threshold``) limits
how many drafts the whole batch gets. The rules come from the serial CPU operator that serving
engines ran; :func:`reference_ngram_match` writes them down line by line and is the
specification every step must reproduce bit for bit.

Steps (each a kernel next to the previous one; ``step=`` picks it):

1. ``"cpu"``: the deployed path: copy to the host, run the serial loop (``csrc/ngram_cpu_path.c``),
   copy the drafts back.
2. ``"serial"``: the same loop as a one-thread GPU kernel (``csrc/ngram_serial.cu``).
3. ``"two_phase"``: phase 1 searches every slot in parallel (one block per slot, one ``n`` at a
   time, leftmost match by 64-bit ``atomicMin``); phase 2 applies the budget on one thread.
4. ``"two_phase_scan"``: phase 2 from block-wide prefix sums, exact (``csrc/ngram_common.cuh``).
5. ``"one_pass"``: one pass per haystack for every ``n`` at once, with early exit;
   ``"one_pass_fused"``: the same split over many blocks per slot, phase 2 run by the last block
   to finish, so the whole step is a single launch (``csrc/ngram_one_pass.cu``).
6. ``"stream"``: the fused kernel without barriers in its loop, with wider loads, and skipping
   slots the budget refuses whatever the searches find (``csrc/ngram_stream.cu``).

Dtypes are explicit: token ids are int64, every per-slot length is int32.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int32, Int64
from torch import Tensor

from studylog import runtime  # noqa: F401  (first: selects GPU or interpreter)
from studylog import cuda
from studylog.cuda import CSRC

#: Largest n the kernels accept (``NGRAM_MAX`` in ``ngram_common.cuh``).
NGRAM_MAX = 32
#: "No match" as a key: larger than every real key.
NONE_KEY = (1 << 64) - 1
#: The steps, in the order the chapter builds them.
STEPS = ("cpu", "serial", "two_phase", "two_phase_scan", "one_pass", "one_pass_fused", "stream")
#: Steps run on the GPU (everything but the CPU path).
GPU_STEPS = STEPS[1:]
#: The deployed default budget of the n-gram proposer, and the hybrid (MTP + n-gram) one.
DEFAULT_THRESHOLD = 128
HYBRID_DEFAULT_THRESHOLD = 1024

THREADS = 256          # threads per search block
SCAN_THREADS = 1024    # threads of the phase-2 scan kernel
ITEMS = 4              # end positions per thread per tile (ITEMS in ngram_one_pass.cu)
TILE = THREADS * ITEMS

#: How step 6 loads haystack tokens (``CACHE`` in ``ngram_stream.cu``).
STREAM_CACHE = {"ldg": 0, "ldcs": 1, "evict_first": 2}
#: How step 6 skips slots the budget refuses (``BUDGET_SKIP``): not at all; the block decides
#: before searching (two barriers); or the warps search at once and stop when the bound says so.
STREAM_SKIP = {"off": 0, "eager": 1, "lazy": 2}


@dataclass(frozen=True)
class StreamVariant:
    """The knobs of step 6 (``ngram_stream<LOADS, VEC, BUDGET_SKIP, CACHE>``): loads in flight per
    thread per tile; how slots the budget refuses skip the search (``STREAM_SKIP``); the loads' L2
    policy (``STREAM_CACHE``). ``VEC`` (tokens per load) follows the rows' alignment
    (:func:`stream_vec`)."""

    loads: int = 4
    budget_skip: str = "lazy"
    cache: str = "evict_first"

    def instance(self, vec: int) -> str:
        """The C++ name of this variant's kernel for ``vec`` tokens per load."""
        return f"ngram_stream<{self.loads}, {vec}, {STREAM_SKIP[self.budget_skip]}, {STREAM_CACHE[self.cache]}>"

    def params(self) -> dict:
        return {"loads": self.loads, "budget_skip": self.budget_skip, "cache": self.cache}


#: The chapter's step 6.
STREAM_DEFAULT = StreamVariant()
#: The variants the benchmark measures side by side (each differs from the default in one knob).
STREAM_VARIANTS = (STREAM_DEFAULT, StreamVariant(loads=2), StreamVariant(loads=8), StreamVariant(budget_skip="off"),
                   StreamVariant(budget_skip="eager"), StreamVariant(cache="ldg"), StreamVariant(cache="ldcs"))


# =========================================================================================
# Inputs and configuration
# =========================================================================================

@dataclass
class NgramInputs:
    """What the matcher reads. ``B`` slots; the output state (``draft_tokens``,
    ``seq_lens_this_time``) is passed separately because the kernels update it in place.

    * ``prompt_ids[b, :prompt_lens[b]]``: slot ``b``'s prompt.
    * ``generated_ids[b, :step_idx[b] + 1]``: its generated tokens; the newest is at ``step_idx[b]``
      (the deployed convention), so the pattern of size ``n`` is ``generated_ids[b, step+1-n : step+1]``.
    * ``draft_token_num[b]``: drafts wanted (ngram variant); ``max_dec_len[b]``: the request's length
      limit, which caps the drafts at ``max_dec_len - step_idx - 1``.
    * ``seq_lens_encoder[b] > 0``: the slot is in prefill; ``seq_lens_decoder[b] == 0``: empty slot.
    """

    prompt_ids: Int64[Tensor, "batch prompt_width"]
    prompt_lens: Int32[Tensor, " batch"]
    generated_ids: Int64[Tensor, "batch gen_width"]
    step_idx: Int32[Tensor, " batch"]
    draft_token_num: Int32[Tensor, " batch"]
    max_dec_len: Int32[Tensor, " batch"]
    seq_lens_encoder: Int32[Tensor, " batch"]
    seq_lens_decoder: Int32[Tensor, " batch"]

    def to(self, device: torch.device | str) -> "NgramInputs":
        return NgramInputs(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    @property
    def batch(self) -> int:
        return int(self.prompt_ids.shape[0])


@dataclass(frozen=True)
class NgramConfig:
    """The operator's parameters.

    ``hybrid=False`` is the n-gram proposer: active slots restart at one token, drafts go to
    ``draft_tokens[b, 1:]``, the cap is ``draft_token_num[b]``. ``hybrid=True`` is the variant run
    after MTP drafting: a slot keeps its ``seq_lens_this_time`` tokens and drafts go after them,
    capped by ``max_draft_tokens - seq_lens_this_time + 1``; ``seq_lens_encoder`` is ignored.
    Both are the same kernels with a flag (see the notebook).
    """

    max_ngram_size: int = 3
    min_ngram_size: int = 1
    threshold: int = DEFAULT_THRESHOLD
    hybrid: bool = False
    max_draft_tokens: int = 10

    @classmethod
    def hybrid_variant(cls, max_ngram_size: int = 3, min_ngram_size: int = 1,
                       threshold: int = HYBRID_DEFAULT_THRESHOLD, max_draft_tokens: int = 10) -> "NgramConfig":
        return cls(max_ngram_size, min_ngram_size, threshold, True, max_draft_tokens)


# =========================================================================================
# Validation (in the wrapper, before any launch)
# =========================================================================================

_ID_FIELDS = ("prompt_ids", "generated_ids")
_LEN_FIELDS = ("prompt_lens", "step_idx", "draft_token_num", "max_dec_len", "seq_lens_encoder", "seq_lens_decoder")
_INT32_MAX = 2**31 - 1


def _check_tensor(name: str, t: Any, dtype: torch.dtype, ndim: int) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        want, got = str(dtype).removeprefix("torch."), str(t.dtype).removeprefix("torch.")
        raise TypeError(f"{name} must be {want}, got {got}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _check_config(config: NgramConfig) -> None:
    if not isinstance(config, NgramConfig):
        raise TypeError(f"config must be an NgramConfig, got {type(config).__name__}")
    if not (isinstance(config.max_ngram_size, int) and 1 <= config.max_ngram_size <= NGRAM_MAX):
        raise ValueError(f"max_ngram_size must be an int in [1, {NGRAM_MAX}], got {config.max_ngram_size!r}")
    if not (isinstance(config.min_ngram_size, int) and 1 <= config.min_ngram_size <= config.max_ngram_size):
        raise ValueError(f"min_ngram_size must be an int in [1, max_ngram_size={config.max_ngram_size}], "
                         f"got {config.min_ngram_size!r}")
    if not (isinstance(config.threshold, int) and -(2**31) <= config.threshold <= _INT32_MAX):
        raise ValueError(f"threshold must be an int32, got {config.threshold!r}")
    if not (isinstance(config.max_draft_tokens, int) and 0 <= config.max_draft_tokens < _INT32_MAX):
        raise ValueError(f"max_draft_tokens must be a non-negative int, got {config.max_draft_tokens!r}")


def validate(inputs: NgramInputs, draft_tokens: Tensor, seq_lens_this_time: Tensor, config: NgramConfig,
             *, check_values: bool = True) -> None:
    """Raise a clear error naming the argument for any input the kernels cannot take.

    Shapes, dtypes, devices and contiguity are checked always; ``check_values`` also reads the
    per-slot lengths (a device sync on the GPU) to check their ranges.
    """
    if not isinstance(inputs, NgramInputs):
        raise TypeError(f"inputs must be an NgramInputs, got {type(inputs).__name__}")
    _check_config(config)
    for name in _ID_FIELDS:
        _check_tensor(name, getattr(inputs, name), torch.int64, 2)
    for name in _LEN_FIELDS:
        _check_tensor(name, getattr(inputs, name), torch.int32, 1)
    _check_tensor("draft_tokens", draft_tokens, torch.int64, 2)
    _check_tensor("seq_lens_this_time", seq_lens_this_time, torch.int32, 1)
    batch = inputs.prompt_ids.shape[0]
    named = [(n, getattr(inputs, n)) for n in _ID_FIELDS + _LEN_FIELDS]
    named += [("draft_tokens", draft_tokens), ("seq_lens_this_time", seq_lens_this_time)]
    for name, t in named:
        if t.shape[0] != batch:
            raise ValueError(f"{name} has batch size {t.shape[0]} but prompt_ids has {batch}")
    device = inputs.prompt_ids.device
    for name, t in named:
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but prompt_ids is on {device}")
    prompt_width, gen_width = inputs.prompt_ids.shape[1], inputs.generated_ids.shape[1]
    draft_width = draft_tokens.shape[1]
    if prompt_width >= 2**31 or gen_width >= 2**31:
        raise ValueError("prompt_ids and generated_ids must have fewer than 2**31 columns")
    if batch and gen_width < 1:
        raise ValueError("generated_ids must have at least one column (the newest token)")
    if batch and draft_width < 1:
        raise ValueError("draft_tokens must have at least one column (the slot's own token)")
    if config.hybrid and batch and config.max_draft_tokens >= draft_width:
        raise ValueError(f"max_draft_tokens={config.max_draft_tokens} does not fit draft_tokens "
                         f"with {draft_width} columns (needs max_draft_tokens < columns)")
    if not check_values or batch == 0:
        return

    def first_bad(name: str, values: Tensor, bad: Tensor, what: str) -> None:
        if bool(bad.any()):
            slot = int(bad.nonzero()[0, 0])
            raise ValueError(f"{name} {what} (slot {slot} has {int(values[slot])})")

    for name in _LEN_FIELDS:
        values = getattr(inputs, name)
        first_bad(name, values, values < 0, "has negative values")
    first_bad("seq_lens_this_time", seq_lens_this_time, seq_lens_this_time < 0, "has negative values")
    first_bad("prompt_lens", inputs.prompt_lens, inputs.prompt_lens > prompt_width,
              f"exceeds prompt_ids' width {prompt_width}")
    first_bad("step_idx", inputs.step_idx, inputs.step_idx >= gen_width,
              f"must index generated_ids' columns (< {gen_width}): the newest token is generated_ids[b, step_idx]")
    if not config.hybrid:
        first_bad("draft_token_num", inputs.draft_token_num, inputs.draft_token_num >= draft_width,
                  f"must be < draft_tokens' width {draft_width} (drafts go to columns 1..draft_token_num)")


# =========================================================================================
# The reference: the deployed rules, line by line
# =========================================================================================

def _leftmost_continuation(hay: list[int], hay_len: int, pattern: list[int], cap: int):
    """(start of the leftmost window ``hay[i:i+n] == pattern`` followed by at least one draft
    token, the draft tokens), or None. A window at the very end has no continuation: the search
    goes on to the next window, as the deployed loop does. ``cap <= 0`` never yields drafts."""
    n = len(pattern)
    for i in range(hay_len - n + 1):
        if hay[i:i + n] == pattern:
            start = i + n
            end = min(start + cap, hay_len)
            if start >= end:
                continue
            return i, hay[start:end]
    return None


def reference_ngram_match(inputs: NgramInputs, draft_tokens: Int64[Tensor, "batch draft_width"],
                          seq_lens_this_time: Int32[Tensor, " batch"], config: NgramConfig = NgramConfig(),
                          *, trace: list | None = None) -> tuple[Tensor, Tensor]:
    """The specification: returns new (draft_tokens, seq_lens_this_time) on the CPU; the inputs are
    not modified. Pass a list as ``trace`` to get one dict per slot saying what happened and why."""
    validate(inputs, draft_tokens, seq_lens_this_time, config)
    prompt, gen = inputs.prompt_ids.tolist(), inputs.generated_ids.tolist()
    prompt_lens, step_idx = inputs.prompt_lens.tolist(), inputs.step_idx.tolist()
    draft_token_num, max_dec_len = inputs.draft_token_num.tolist(), inputs.max_dec_len.tolist()
    encoder, decoder = inputs.seq_lens_encoder.tolist(), inputs.seq_lens_decoder.tolist()
    draft = draft_tokens.tolist()
    this_time = seq_lens_this_time.tolist()
    batch, threshold = len(this_time), config.threshold

    # Slots that still need at least one token this step. The budget reserves one token for each
    # of them that the loop has not reached yet. (The ngram variant counts prefill slots too and
    # never takes them off the count; the hybrid variant counts slots with decoder tokens.)
    if config.hybrid:
        unprocessed = sum(1 for b in range(batch) if decoder[b] > 0)
    else:
        unprocessed = sum(1 for b in range(batch) if encoder[b] > 0 or decoder[b] > 0)

    for b in range(batch):
        note = {"slot": b, "kind": None, "searched": False, "n": None, "source": None, "start": None, "drafted": 0}
        if trace is not None:
            trace.append(note)
        dec_room = max_dec_len[b] - step_idx[b] - 1  # tokens the request may still produce after this one
        if not config.hybrid:
            cap = min(draft_token_num[b], dec_room)
            if encoder[b] > 0:  # prefill: no drafts, the slot is left as it is
                note["kind"] = "prefill"
                continue
            if decoder[b] == 0:  # an empty slot
                note["kind"] = "inactive"
                this_time[b] = 0
                continue
            this_time[b] = 1  # the token the target model verifies anyway
            base = 1  # drafts go after it
        else:
            base = this_time[b]  # MTP already placed `base` tokens; drafts go after them
            room = config.max_draft_tokens - base + 1
            if base == 0 or room <= 0 or dec_room <= 0:
                note["kind"] = "untouched"
                continue
            cap = min(room, dec_room)
        note["kind"] = "active"
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


# =========================================================================================
# Python models of the GPU algorithms (what the kernels compute, checked against the reference)
# =========================================================================================

def match_key(n: int, source: int, start: int) -> int:
    """The 64-bit key of a match (``make_key`` in ``ngram_common.cuh``): larger n first, then the
    prompt (source 0) before the generated tokens (1), then the leftmost start."""
    return ((2 * (NGRAM_MAX - n) + source) << 32) | start


def decode_key(key: int) -> tuple[int, int, int]:
    """(n, source, start) of a key."""
    return NGRAM_MAX - (key >> 33), (key >> 32) & 1, key & 0xFFFFFFFF


def _slot_plan(b: int, config: NgramConfig, step_idx, draft_token_num, max_dec_len, encoder, decoder, this_time):
    """(kind, counted, base, cap) of slot b, as ``plan_slot`` in ``ngram_common.cuh``."""
    dec_room = max_dec_len[b] - step_idx[b] - 1
    if not config.hybrid:
        counted = encoder[b] > 0 or decoder[b] > 0
        cap = min(draft_token_num[b], dec_room)
        if encoder[b] > 0:
            return "keep", counted, this_time[b], cap
        if decoder[b] == 0:
            return "zero", counted, 0, cap
        return "active", counted, 1, cap
    ori = this_time[b]
    room = config.max_draft_tokens - ori + 1
    kind = "keep" if (ori == 0 or room <= 0 or dec_room <= 0) else "active"
    return kind, decoder[b] > 0, ori, min(room, dec_room)


def model_one_pass_keys(inputs: NgramInputs, config: NgramConfig,
                        seq_lens_this_time: Tensor | None = None) -> list[int]:
    """Phase 1 of step 5 in plain Python: for every end position e of each haystack, the length
    of the common suffix of ``hay[:e+1]`` and the generated tokens (up to the top n) names the best
    candidate ending there; the smallest key over all ends is the slot's match."""
    prompt, gen = inputs.prompt_ids.tolist(), inputs.generated_ids.tolist()
    prompt_lens, step_idx = inputs.prompt_lens.tolist(), inputs.step_idx.tolist()
    this_time = seq_lens_this_time.tolist() if seq_lens_this_time is not None else [0] * inputs.batch
    lists = (step_idx, inputs.draft_token_num.tolist(), inputs.max_dec_len.tolist(),
             inputs.seq_lens_encoder.tolist(), inputs.seq_lens_decoder.tolist(), this_time)
    keys = []
    for b in range(inputs.batch):
        kind, _, _, cap = _slot_plan(b, config, *lists)
        step = step_idx[b]
        top = min(config.max_ngram_size, step)
        best = NONE_KEY
        if kind == "active" and cap >= 1 and top >= config.min_ngram_size:
            for source, hay, hay_len in ((0, prompt[b], prompt_lens[b]), (1, gen[b], step)):
                for end in range(hay_len - 1):  # end <= hay_len - 2: a token follows the window
                    length = 0
                    while length < top and length <= end and hay[end - length] == gen[b][step - length]:
                        length += 1
                    if length >= config.min_ngram_size:
                        best = min(best, match_key(length, source, end - length + 1))
        keys.append(best)
    return keys


def model_budget_scan(inputs: NgramInputs, keys: list[int], draft_tokens: Tensor, seq_lens_this_time: Tensor,
                      config: NgramConfig, *, chunk: int = SCAN_THREADS) -> tuple[Tensor, Tensor]:
    """Phase 2 of steps 4 and 5 in plain Python, chunk by chunk as ``budget_scan_block`` walks the
    batch: an exclusive prefix sum of tentative counts, the first slot where the budget bites,
    and no drafts for any active slot after it."""
    prompt, gen = inputs.prompt_ids.tolist(), inputs.generated_ids.tolist()
    prompt_lens, step_idx = inputs.prompt_lens.tolist(), inputs.step_idx.tolist()
    draft, this_time = draft_tokens.tolist(), seq_lens_this_time.tolist()
    lists = (step_idx, inputs.draft_token_num.tolist(), inputs.max_dec_len.tolist(),
             inputs.seq_lens_encoder.tolist(), inputs.seq_lens_decoder.tolist(), list(this_time))
    batch = inputs.batch
    plans = [_slot_plan(b, config, *lists) for b in range(batch)]
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


def model_budget_refused(inputs: NgramInputs, config: NgramConfig, seq_lens_this_time: Tensor) -> list[bool]:
    """Step 6's skip rule in plain Python (``budget_bound_part`` in ``ngram_stream.cu``): an active
    slot is refused whatever the searches find when the smallest possible running total (every
    earlier slot at its base, no drafts) plus ``left`` already reaches ``threshold - 1``."""
    lists = (inputs.step_idx.tolist(), inputs.draft_token_num.tolist(), inputs.max_dec_len.tolist(),
             inputs.seq_lens_encoder.tolist(), inputs.seq_lens_decoder.tolist(), seq_lens_this_time.tolist())
    plans = [_slot_plan(b, config, *lists) for b in range(inputs.batch)]
    left = sum(p[1] for p in plans)
    smallest_total = 0
    refused = []
    for kind, _, base, _ in plans:
        smallest_total += base  # an empty slot's base is 0
        left -= kind == "active"
        refused.append(kind == "active" and smallest_total + left >= config.threshold - 1)
    return refused


def published_blockscan_counts(inputs: NgramInputs, keys: list[int], seq_lens_this_time: Tensor,
                               config: NgramConfig) -> Tensor:
    """seq_lens_this_time as the published BlockScan phase 2 (ngram variant) computes it: the
    budget of slot b is ``threshold - (tentative counts before b) - (active slots after b)``, and a
    budget <= 1 means no drafts. Kept to show where it departs from the sequential rule."""
    if config.hybrid:
        raise ValueError("published_blockscan_counts models the ngram variant only")
    this_time = seq_lens_this_time.tolist()
    lists = (inputs.step_idx.tolist(), inputs.draft_token_num.tolist(), inputs.max_dec_len.tolist(),
             inputs.seq_lens_encoder.tolist(), inputs.seq_lens_decoder.tolist(), list(this_time))
    prompt_lens, step_idx = inputs.prompt_lens.tolist(), inputs.step_idx.tolist()
    batch = inputs.batch
    tentative, is_active = [], []
    for b in range(batch):
        kind, _, base, cap = _slot_plan(b, config, *lists)
        if kind == "keep":  # prefill: its own count, and it counts as active
            tentative.append(base)
            is_active.append(1)
            continue
        drafted = 0
        if kind == "active" and keys[b] != NONE_KEY and cap >= 1:
            n, source, start = decode_key(keys[b])
            drafted = min(cap, (step_idx[b] if source else prompt_lens[b]) - start - n)
        tentative.append(base + drafted if kind == "active" else 0)
        is_active.append(1 if tentative[-1] > 0 else 0)
    out = list(this_time)
    token_prefix = active_prefix = 0
    total_active = sum(is_active)
    for b in range(batch):
        token_prefix += tentative[b]
        active_prefix += is_active[b]
        if inputs.seq_lens_encoder[b] > 0:
            continue
        if tentative[b] == 0:
            out[b] = 0
            continue
        budget = config.threshold - (token_prefix - tentative[b]) - (total_active - active_prefix)
        out[b] = 1 if budget <= 1 else min(tentative[b], budget)
    return torch.tensor(out, dtype=torch.int32)


# =========================================================================================
# Step 1: the CPU path (C, compiled at first use)
# =========================================================================================

CPU_SOURCE = CSRC / "ngram_cpu_path.c"


def _cache_dir() -> Path:
    for root in (os.environ.get("XDG_CACHE_HOME"), str(Path.home() / ".cache"), tempfile.gettempdir()):
        if not root:
            continue
        folder = Path(root) / "studylog"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return folder
        except OSError:
            continue
    raise RuntimeError("no writable cache folder for the compiled CPU path")


@functools.lru_cache(maxsize=None)
def cpu_library() -> ctypes.CDLL:
    """The CPU path as a shared library, compiled with the system C compiler once per source."""
    text = CPU_SOURCE.read_bytes()
    target = _cache_dir() / f"ngram_cpu_path_{hashlib.sha256(text).hexdigest()[:16]}.so"
    if not target.exists():
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if compiler is None:
            raise RuntimeError("the CPU path (step 1) needs a C compiler (cc, gcc or clang), and none is on PATH")
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        out = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(CPU_SOURCE)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"compiling {CPU_SOURCE.name} failed:\n{out.stderr}")
        os.replace(tmp, target)  # atomic: parallel test workers never load a half-written file
    lib = ctypes.CDLL(str(target))
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ngram_match_cpu.argtypes = [p, p, i64, p, p, i64, p, p, p, p, p, p, i64, i64, i32, i32, i64, i32, i32]
    lib.ngram_match_cpu.restype = i64
    return lib


def cpu_path_inplace(inputs: NgramInputs, draft_tokens: Tensor, seq_lens_this_time: Tensor,
                     config: NgramConfig) -> int:
    """Run the C loop on CPU tensors, in place; returns the number of windows it compared."""
    ts = [inputs.prompt_ids, inputs.prompt_lens, inputs.generated_ids, inputs.step_idx, inputs.draft_token_num,
          inputs.max_dec_len, inputs.seq_lens_encoder, inputs.seq_lens_decoder, seq_lens_this_time, draft_tokens]
    if any(t.device.type != "cpu" for t in ts):
        raise ValueError("cpu_path_inplace takes CPU tensors; NgramMatcher(step='cpu') does the copies")
    ptr = [t.data_ptr() for t in ts]
    return int(cpu_library().ngram_match_cpu(
        ptr[0], ptr[1], inputs.prompt_ids.shape[1], ptr[2], ptr[3], inputs.generated_ids.shape[1],
        ptr[4], ptr[5], ptr[6], ptr[7], ptr[8], ptr[9], draft_tokens.shape[1], inputs.batch,
        config.max_ngram_size, config.min_ngram_size, config.threshold, int(config.hybrid), config.max_draft_tokens))


# =========================================================================================
# Steps 2-5: the CUDA kernels
# =========================================================================================

#: Argument kinds of NGRAM_KERNEL_PARAMS (ngram_common.cuh), in order.
SIGNATURE = ["ptr", "ptr", "i64", "ptr", "ptr", "i64", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "i64",
             "ptr", "ptr", "i32", "i32", "i32", "i32", "i32", "i32", "i32", "i32"]

#: step -> [(source file, kernel)], launched in order.
KERNELS = {
    "serial": [("ngram_serial", "ngram_serial")],
    "two_phase": [("ngram_two_phase", "ngram_search_per_n"), ("ngram_two_phase", "ngram_budget_serial")],
    "two_phase_scan": [("ngram_two_phase", "ngram_search_per_n"), ("ngram_two_phase", "ngram_budget_scan")],
    "one_pass": [("ngram_one_pass", "ngram_search_one_pass"), ("ngram_two_phase", "ngram_budget_scan")],
    "one_pass_fused": [("ngram_one_pass", "ngram_one_pass_fused")],
}


def fused_chunk_len(batch: int, prompt_width: int, gen_width: int, *, chunk_tiles: int | None = None) -> int:
    """Haystack positions per block of the fused kernel: enough blocks to fill the GPU about
    eight blocks per SM, at most 8 tiles of TILE positions per block (``chunk_tiles`` overrides)."""
    if chunk_tiles is None:
        tiles = batch * (-(-prompt_width // TILE) + -(-gen_width // TILE))
        chunk_tiles = max(1, min(8, tiles // (8 * runtime.sm_count())))
    chunk_len = chunk_tiles * TILE
    while -(-prompt_width // chunk_len) + -(-gen_width // chunk_len) > 65535:  # gridDim.y limit
        chunk_len *= 2
    return chunk_len


#: Every instance compiled for step 6 (one NVRTC compile serves them all).
STREAM_INSTANCES = tuple(v.instance(vec) for v in STREAM_VARIANTS for vec in (2, 1))
cuda.declare_instances("ngram_stream", STREAM_INSTANCES)


def stream_vec(*haystacks: Tensor) -> int:
    """2 (16-byte loads) when every row of every haystack starts 16 bytes aligned, else 1."""
    return 2 if all(t.data_ptr() % 16 == 0 and t.shape[1] % 2 == 0 for t in haystacks) else 1


def stream_chunk_len(batch: int, prompt_width: int, gen_width: int, tile: int, *,
                     chunk_len: int | None = None) -> int:
    """Haystack positions per block of step 6: a whole number of tiles (``tile`` positions each),
    about four blocks per SM when the haystacks are long, 2 to 8 tiles per block (``chunk_len``
    overrides, rounded up to whole tiles). The range comes from the benchmark's chunk sweep."""
    if chunk_len is None:
        tiles = batch * (-(-prompt_width // tile) + -(-gen_width // tile))
        chunk_len = max(2, min(8, tiles // (4 * runtime.sm_count()))) * tile
    chunk_len = -(-chunk_len // tile) * tile
    while -(-prompt_width // chunk_len) + -(-gen_width // chunk_len) > 65535:  # gridDim.y limit
        chunk_len *= 2
    return chunk_len


def _require_cuda(step: str, device: torch.device) -> None:
    runtime.require_gpu(f"the {step!r} n-gram kernels")
    if device.type != "cuda":
        raise ValueError(f"step {step!r} runs on the GPU; prompt_ids is on {device}")


class NgramMatcher:
    """One step of the chapter bound to its buffers: validates once, then ``matcher()`` runs the
    step in place on ``draft_tokens`` and ``seq_lens_this_time`` (nothing is checked per call, so
    the benchmark times only the work). Scratch buffers belong to the matcher; the fused kernel
    leaves its scratch clean after every launch."""

    def __init__(self, inputs: NgramInputs, draft_tokens: Tensor, seq_lens_this_time: Tensor, *,
                 step: str = "stream", config: NgramConfig = NgramConfig(), check_values: bool = True,
                 chunk_tiles: int | None = None, chunk_len: int | None = None,
                 variant: StreamVariant = STREAM_DEFAULT, vec: int | None = None):
        if step not in STEPS:
            raise ValueError(f"step must be one of {STEPS}, got {step!r}")
        validate(inputs, draft_tokens, seq_lens_this_time, config, check_values=check_values)
        self.inputs, self.draft_tokens, self.seq_lens_this_time = inputs, draft_tokens, seq_lens_this_time
        self.step, self.config = step, config
        self.batch = inputs.batch
        device = inputs.prompt_ids.device
        if step == "cpu":
            # As deployed: the prompt lives on the host from admission on; the rest is copied per step.
            self._host_prompt = inputs.prompt_ids.cpu()
            self._host_prompt_lens = inputs.prompt_lens.cpu()
            return
        _require_cuda(step, device)
        from studylog import cuda

        prompt_width, gen_width = inputs.prompt_ids.shape[1], inputs.generated_ids.shape[1]
        if step == "stream":
            auto_vec = stream_vec(inputs.prompt_ids, inputs.generated_ids)
            if vec not in (None, 1, 2) or (vec == 2 and auto_vec == 1):
                raise ValueError(f"vec must be None, 1, or 2 with 16-byte aligned rows of even width, got {vec!r}")
            self.vec = vec or auto_vec
            name = variant.instance(self.vec)
            if name not in STREAM_INSTANCES:
                raise ValueError(f"no compiled instance {name}; the variants are {STREAM_VARIANTS}")
            self.kernels = [cuda.load("ngram_stream", name_expressions=STREAM_INSTANCES).kernel(name, SIGNATURE)]
            self.chunk_len = stream_chunk_len(self.batch, prompt_width, gen_width, THREADS * variant.loads * self.vec,
                                              chunk_len=chunk_len)
        else:
            self.kernels = [cuda.load(src).kernel(name, SIGNATURE) for src, name in KERNELS[step]]
            self.chunk_len = fused_chunk_len(self.batch, prompt_width, gen_width, chunk_tiles=chunk_tiles)
        self.prompt_chunks = -(-prompt_width // self.chunk_len)
        self.gen_chunks = -(-gen_width // self.chunk_len)
        self.match_keys = torch.full((max(self.batch, 1),), -1, dtype=torch.int64, device=device)  # all NONE_KEY
        self.blocks_done = torch.zeros(1, dtype=torch.int32, device=device)
        c = config
        self.args = (inputs.prompt_ids, inputs.prompt_lens, prompt_width, inputs.generated_ids, inputs.step_idx,
                     gen_width, inputs.draft_token_num, inputs.max_dec_len, inputs.seq_lens_encoder,
                     inputs.seq_lens_decoder, seq_lens_this_time, draft_tokens, draft_tokens.shape[1],
                     self.match_keys, self.blocks_done, self.batch, c.max_ngram_size, c.min_ngram_size,
                     c.threshold, int(c.hybrid), c.max_draft_tokens, self.prompt_chunks, self.chunk_len)
        b = self.batch
        self.launches = {
            "serial": [((1,), (1,))],
            "two_phase": [((b,), (THREADS,)), ((1,), (1,))],
            "two_phase_scan": [((b,), (THREADS,)), ((1,), (SCAN_THREADS,))],
            "one_pass": [((b,), (THREADS,)), ((1,), (SCAN_THREADS,))],
            "one_pass_fused": [((b, self.prompt_chunks + self.gen_chunks), (THREADS,))],
            "stream": [((b, self.prompt_chunks + self.gen_chunks), (THREADS,))],
        }[step]

    def __call__(self) -> None:
        if self.batch == 0:
            return
        if self.step == "cpu":
            self._run_cpu_path()
            return
        for kernel, (grid, block) in zip(self.kernels, self.launches):
            kernel(grid, block, *self.args)

    def _run_cpu_path(self) -> None:
        i, draft, this_time = self.inputs, self.draft_tokens, self.seq_lens_this_time
        if i.prompt_ids.device.type == "cpu":
            cpu_path_inplace(i, draft, this_time, self.config)
            return
        # Each .cpu() waits for the GPU: the copies are where the deployed path lost its time.
        host = NgramInputs(self._host_prompt, self._host_prompt_lens, i.generated_ids.cpu(), i.step_idx.cpu(),
                           i.draft_token_num.cpu(), i.max_dec_len.cpu(), i.seq_lens_encoder.cpu(),
                           i.seq_lens_decoder.cpu())
        host_draft, host_this_time = draft.cpu(), this_time.cpu()
        cpu_path_inplace(host, host_draft, host_this_time, self.config)
        draft.copy_(host_draft)
        this_time.copy_(host_this_time)


def ngram_match(inputs: NgramInputs, draft_tokens: Int64[Tensor, "batch draft_width"],
                seq_lens_this_time: Int32[Tensor, " batch"], *, step: str = "stream",
                config: NgramConfig = NgramConfig()) -> tuple[Tensor, Tensor]:
    """Propose draft tokens in place (as the deployed operator does) with the kernel of ``step``;
    returns ``(draft_tokens, seq_lens_this_time)``. Inputs are validated first."""
    NgramMatcher(inputs, draft_tokens, seq_lens_this_time, step=step, config=config)()
    return draft_tokens, seq_lens_this_time


# =========================================================================================
# Realistic batches
# =========================================================================================

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
        kind, _, _, cap = _slot_plan(b, config, *lists)
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
        kind, _, _, cap = _slot_plan(b, config, *lists)
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


# =========================================================================================
# Benchmark (GPU only) and figures
# =========================================================================================

NO_BUDGET = 1 << 30  # a threshold the batch never reaches: every active slot drafts
#: (batch, prompt length, threshold). 32x512 and 128x32768 use the deployed default budget.
BENCH_GRID = [(32, 512, 128), (128, 512, NO_BUDGET), (256, 512, NO_BUDGET), (1, 131072, NO_BUDGET),
              (16, 131072, NO_BUDGET), (512, 16384, NO_BUDGET), (128, 32768, 128), (256, 131072, NO_BUDGET)]
QUICK_GRID = [(32, 512, 128), (16, 131072, NO_BUDGET), (128, 32768, 128)]
SERIAL_LIMIT_MS = 5000.0  # skip the one-thread kernel where it would take longer than this per call
SLOW_MS = 50.0            # slower than this on the first call: time a few calls instead of do_bench


def gen_width_for(seq_len: int) -> int:
    """Generated-token buffer of the benchmark: half the prompt, at most 2048."""
    return max(16, min(seq_len // 2, 2048))


def _same(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor]) -> bool:
    return bool(torch.equal(a[0].cpu(), b[0].cpu()) and torch.equal(a[1].cpu(), b[1].cpu()))


def _time_slow(fn, reps: int = 3) -> float:
    """Median of a few event-timed calls (for calls far longer than do_bench's budget)."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def bench(run) -> None:
    """Every step on the grid; each result checked bit-identical to the CPU path (itself checked
    against the Python reference where that is fast enough) before and after timing."""
    grid = QUICK_GRID if run.quick else BENCH_GRID
    serial_ms_per_window = 0.0
    for batch, seq_len, threshold in run.progress(grid, "grid"):
        config = NgramConfig(threshold=threshold)
        kinds = ["short"] if batch == 1 else None  # one slot: the case that scans everything
        inputs, draft0, this0 = make_batch(batch, seq_len, gen_width_for(seq_len), kinds=kinds,
                                           seed=1000 + batch + seq_len, device="cuda")
        params = {"batch": batch, "seq_len": seq_len, "threshold": threshold}
        validate(inputs, draft0, this0, config)
        nbytes = haystack_bytes(inputs, this0, config)
        floor = run.floor_ms(nbytes)
        host = inputs.to("cpu")
        expected = (draft0.cpu(), this0.cpu())
        windows = cpu_path_inplace(host, *expected, config)
        if batch * seq_len <= 128 * 512:
            ref = reference_ngram_match(host, draft0.cpu(), this0.cpu(), config)
            run.check("cpu path == python reference", _same(ref, expected), params=params)
        drafted = int((expected[1] - 1).clamp(min=0)[inputs.seq_lens_encoder.cpu() == 0].sum())
        for step in STEPS:
            role = "baseline" if step in ("cpu", "serial", "two_phase") else "kernel"
            if step == "serial" and serial_ms_per_window and windows * serial_ms_per_window > SERIAL_LIMIT_MS:
                run.note(f"serial <<<1,1>>> kernel skipped at {batch}x{seq_len}: it would compare {windows:,} "
                         f"windows on one thread, predicted {windows * serial_ms_per_window / 1e3:.0f} s per call "
                         f"from its speed on the smaller inputs of this run")
                continue
            state = (draft0.clone(), this0.clone())
            matcher = NgramMatcher(inputs, *state, step=step, config=config, check_values=False)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            matcher()
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - t0) * 1e3
            check_params = params | {"step": step}
            run.check("bit-identical to the CPU path", _same(state, expected), params=check_params)
            if first_ms > SLOW_MS:
                ms, how = _time_slow(matcher), "median of 3 event-timed calls"
            else:
                ms, how = run.time(matcher), "do_bench median"
            run.check("bit-identical after repeated calls", _same(state, expected), params=check_params)
            if step == "serial" and windows:
                serial_ms_per_window = max(serial_ms_per_window, ms / windows)
            run.record(step, ms, params=params, role=role, floor_ms=floor, haystack_bytes=nbytes,
                       windows_compared_by_cpu_loop=windows, drafted_tokens=drafted, timing=how)
        same_chunks = stream_chunk_len(batch, seq_len, gen_width_for(seq_len), THREADS * STREAM_DEFAULT.loads * 2)
        for stream_variant in STREAM_VARIANTS:  # step 6's candidates, measured side by side, same chunks
            for vec in (2, 1) if stream_variant == STREAM_DEFAULT else (2,):
                state = (draft0.clone(), this0.clone())
                matcher = NgramMatcher(inputs, *state, step="stream", config=config, check_values=False,
                                       variant=stream_variant, vec=vec, chunk_len=same_chunks)
                matcher()
                variant = stream_variant.params() | {"vec": vec, "chunk_len": matcher.chunk_len}
                run.check("bit-identical to the CPU path", _same(state, expected),
                          params=params | {"step": "stream"} | variant)
                run.record("stream_variants", run.time(matcher), params=params | variant, floor_ms=floor)
        if batch * seq_len >= 16 * 131072 and not run.quick:
            for chunk_len in (2048, 4096, 8192, 16384, 32768, 65536):
                state = (draft0.clone(), this0.clone())
                matcher = NgramMatcher(inputs, *state, step="stream", config=config, check_values=False,
                                       chunk_len=chunk_len)
                matcher()
                run.check("bit-identical to the CPU path", _same(state, expected),
                          params=params | {"step": "stream", "chunk_len": matcher.chunk_len})
                run.record("stream_chunks", run.time(matcher), params=params | {"chunk_len": matcher.chunk_len},
                           floor_ms=floor)
        if (batch, seq_len) in ((16, 131072), (256, 131072)) and not run.quick:
            for tiles in (1, 2, 4, 8, 16):
                state = (draft0.clone(), this0.clone())
                matcher = NgramMatcher(inputs, *state, step="one_pass_fused", config=config, check_values=False,
                                       chunk_tiles=tiles)
                matcher()
                run.check("bit-identical to the CPU path", _same(state, expected),
                          params=params | {"step": "one_pass_fused", "chunk_len": matcher.chunk_len})
                run.record("one_pass_fused_chunks", run.time(matcher), params=params | {"chunk_len": matcher.chunk_len},
                           floor_ms=floor)
        del inputs, host, draft0, this0
        torch.cuda.empty_cache()
    run.note("The CPU path keeps the prompt on the host (copied once, as the deployed engine did) and copies the "
             "generated tokens, per-slot lengths and draft buffers each call; the loop is the C port of the "
             "deployed operator (csrc/ngram_cpu_path.c).")
    run.note("Floors: haystack bytes of the active slots read once at the copy bandwidth measured in this run; "
             "early exit lets a kernel read less than that.")


SERIES_STYLE = {
    "cpu": ("CPU path (copies + C loop)", "#7f7f7f", "s"),
    "serial": ("<<<1,1>>> kernel", "#bcbd22", "v"),
    "two_phase": ("two-phase, serial phase 2", "#1f77b4", "o"),
    "two_phase_scan": ("two-phase, scan phase 2", "#2ca02c", "o"),
    "one_pass": ("one pass, early exit", "#ff7f0e", "D"),
    "one_pass_fused": ("one pass, split + fused (1 launch)", "#d62728", "D"),
    "stream": ("fused, streamed + budget skip", "#9467bd", "*"),
}
#: The steps that are this chapter's kernels (the others are baselines).
KERNEL_STEPS = ("two_phase_scan", "one_pass", "one_pass_fused", "stream")


def _configs(results) -> list[tuple[int, int, int]]:
    seen: dict[tuple, None] = {}
    for row in results.rows:
        if row["series"] in SERIES_STYLE:
            p = row["params"]
            seen.setdefault((p["batch"], p["seq_len"], p["threshold"]), None)
    return list(seen)


def _label(cfg: tuple[int, int, int]) -> str:
    b, s, t = cfg
    return f"{b}x{s}" + (f"\nthr {t}" if t != NO_BUDGET else "")


def figures(results) -> dict:
    """Latency of every step across the grid; kernel time over the one-pass floor; chunk sweep."""
    import matplotlib.pyplot as plt

    configs = _configs(results)
    xs = list(range(len(configs)))
    figs = {}

    fig, ax = plt.subplots(figsize=(10, 4.6))
    for series, (label, color, marker) in SERIES_STYLE.items():
        pts = [(i, results.select(series, batch=c[0], seq_len=c[1], threshold=c[2])) for i, c in enumerate(configs)]
        pts = [(i, rows[0]["ms"] * 1e3) for i, rows in pts if rows]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=label, lw=1.2, ms=5)
    floors = []
    for i, c in enumerate(configs):
        rows = [r for r in results.select(batch=c[0], seq_len=c[1], threshold=c[2]) if "floor_ms" in r]
        if rows:
            floors.append((i, rows[0]["floor_ms"] * 1e3))
    if floors:
        ax.plot([p[0] for p in floors], [p[1] for p in floors], "k--", lw=1, label="floor: haystacks read once")
    ax.set_xticks(xs, [_label(c) for c in configs], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("time per call (µs, median)")
    ax.set_xlabel("batch x prompt length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title(f"n-gram matching, every step, on {results.gpu}", fontsize=10)
    fig.text(0.5, 0.005, results.caption(), ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    figs["latency"] = fig

    fig, ax = plt.subplots(figsize=(10, 4.2))
    kernel_series = [s for s in KERNEL_STEPS if results.select(s)]
    width = 0.8 / len(kernel_series)
    for k, series in enumerate(kernel_series):
        label, color, _ = SERIES_STYLE[series]
        vals = []
        for c in configs:
            rows = results.select(series, batch=c[0], seq_len=c[1], threshold=c[2])
            vals.append(rows[0]["ms"] / rows[0]["floor_ms"] if rows and rows[0].get("floor_ms") else float("nan"))
        ax.bar([x + (k - (len(kernel_series) - 1) / 2) * width for x in xs], vals, width, color=color, label=label)
    ax.axhline(1.0, color="k", lw=1)
    ax.axhline(1.5, color="k", lw=1, ls=":", label="1.5x floor (target at 256x131072)")
    ax.set_xticks(xs, [_label(c) for c in configs], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("time / one-pass floor")
    ax.grid(True, which="both", axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("how far each kernel is from reading every haystack once", fontsize=10)
    fig.text(0.5, 0.005, results.caption(), ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    figs["vs_floor"] = fig

    sweeps = [(s, results.select(s)) for s in ("one_pass_fused_chunks", "stream_chunks")]
    if any(rows for _, rows in sweeps):
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        for series, sweep in sweeps:
            kernel = "5b fused" if series == "one_pass_fused_chunks" else "6 stream"
            for cfg in sorted({(r["params"]["batch"], r["params"]["seq_len"], r["params"]["threshold"]) for r in sweep}):
                rows = sorted((r for r in sweep if (r["params"]["batch"], r["params"]["seq_len"],
                                                    r["params"]["threshold"]) == cfg),
                              key=lambda r: r["params"]["chunk_len"])
                ax.plot([r["params"]["chunk_len"] for r in rows], [r["ms"] / r["floor_ms"] for r in rows],
                        marker="o" if series == "stream_chunks" else "x",
                        ls="-" if series == "stream_chunks" else ":",
                        label=f"{kernel}, {_label(cfg).replace(chr(10), ' ')}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("haystack positions per block (chunk_len)")
        ax.set_ylabel("time / floor")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.set_title("fused kernels: how finely to split each slot", fontsize=10)
        fig.text(0.5, 0.005, results.caption(), ha="center", fontsize=7)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        figs["chunks"] = fig
    return figs


def summary_table(results) -> str:
    """Markdown: µs per step, the best kernel's speedup over the CPU path, and its distance to the floor."""
    head = ["config", "threshold"] + [s for s in STEPS] + ["best kernel vs CPU", "best / floor"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in _configs(results):
        cells = [f"{c[0]}x{c[1]}", "none" if c[2] == NO_BUDGET else str(c[2])]
        ms = {}
        for s in STEPS:
            rows = results.select(s, batch=c[0], seq_len=c[1], threshold=c[2])
            if rows:
                ms[s] = rows[0]["ms"]
            cells.append(f"{ms[s] * 1e3:,.1f}" if s in ms else "skipped")
        kernels = {s: v for s, v in ms.items() if s in KERNEL_STEPS}
        if kernels and "cpu" in ms:
            best = min(kernels.values())
            floor = results.select(next(iter(kernels)), batch=c[0], seq_len=c[1], threshold=c[2])[0]["floor_ms"]
            cells += [f"{ms['cpu'] / best:,.0f}x", f"{best / floor:.2f}" if floor else "–"]
        else:
            cells += ["–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_VARIANT_KNOBS = ("loads", "vec", "budget_skip", "cache")


def variant_label(params: dict) -> str:
    """How a measured step-6 variant differs from the chapter's default (``"default"`` if not at all)."""
    default = STREAM_DEFAULT.params() | {"vec": 2}
    words = {"loads": lambda v: f"{v} loads/thread", "vec": lambda v: f"{v * 8}-byte loads",
             "budget_skip": lambda v: "no budget skip" if v == "off" else f"{v} budget skip",
             "cache": lambda v: f"{v} loads"}
    diffs = [words[k](params[k]) for k in _VARIANT_KNOBS if params.get(k, default[k]) != default[k]]
    return ", ".join(diffs) or "default"


def variants_table(results) -> str:
    """Markdown: µs per call of each step-6 variant (each differs from the default in one knob)."""
    rows = results.select("stream_variants")
    if not rows:
        return "No step-6 variants in these results."
    variants = list(dict.fromkeys(tuple(r["params"].get(k) for k in _VARIANT_KNOBS) for r in rows))
    head = ["config", "threshold"] + [variant_label(dict(zip(_VARIANT_KNOBS, v))) for v in variants]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in _configs(results):
        cells = [f"{c[0]}x{c[1]}", "none" if c[2] == NO_BUDGET else str(c[2])]
        for v in variants:
            got = results.select("stream_variants", batch=c[0], seq_len=c[1], threshold=c[2],
                                 **dict(zip(_VARIANT_KNOBS, v)))
            cells.append(f"{got[0]['ms'] * 1e3:,.1f}" if got else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The cases the book's headline page quotes: the deployed budget at the small and the issue's
#: mid-size batch, and the largest batch with no budget.
HEADLINE_CASES = ((32, 512, 128), (128, 32768, 128), (256, 131072, NO_BUDGET))


def headline(results) -> list[dict]:
    """For each headline case, the fastest of the chapter's kernels against the CPU path it replaces
    (the kernel's name says which step won), from the committed results."""
    out = []
    for batch, seq_len, threshold in HEADLINE_CASES:
        cpu = results.select("cpu", batch=batch, seq_len=seq_len, threshold=threshold)
        kernels = [r for s in KERNEL_STEPS for r in results.select(s, batch=batch, seq_len=seq_len, threshold=threshold)]
        if cpu and kernels:
            best = min(kernels, key=lambda r: r["ms"])
            budget = f", budget {threshold}" if threshold != NO_BUDGET else ", no budget"
            out.append({"kernel": f"n-gram matching, {SERIES_STYLE[best['series']][0]}",
                        "baseline": "CPU path (copies + C loop)", "case": f"{batch} slots x {seq_len} tokens{budget}",
                        "speedup": cpu[0]["ms"] / best["ms"]})
    return out


PUBLISHED_US = {(32, 512): 19.0, (256, 131072): 151.0}  # the seed's two-phase kernel, H100/H20 class


def target_verdicts(results) -> str:
    """The issue's targets, each with the measured number that meets or misses it (Markdown list)."""
    kernels = KERNEL_STEPS
    checks = results.data.get("checks", [])
    failed = [c for c in checks if not c["passed"]]
    lines = [f"- bit-identical on every benchmark input: {len(checks) - len(failed)} of {len(checks)} checks passed"
             + (" (failures: " + "; ".join(f"{c['name']} {c['params']}" for c in failed[:5]) + ")" if failed else "")]

    def best(c):
        rows = [r for s in kernels for r in results.select(s, batch=c[0], seq_len=c[1], threshold=c[2])]
        return min(rows, key=lambda r: r["ms"]) if rows else None

    speedups = []
    for c in _configs(results):
        cpu, top = results.select("cpu", batch=c[0], seq_len=c[1], threshold=c[2]), best(c)
        if c[0] >= 32 and cpu and top:
            speedups.append((cpu[0]["ms"] / top["ms"], c, top["series"]))
    if speedups:
        worst = min(speedups)
        verdict = "met" if worst[0] >= 10 else "missed"
        lines.append(f"- at least 10x faster than the CPU path at batch >= 32: {verdict}; the smallest speedup is "
                     f"{worst[0]:,.0f}x ({worst[1][0]}x{worst[1][1]}, {worst[2]})")
    for (b, s), target, what in (((256, 131072), None, "floor"), ((32, 512), 15.0, "15 µs")):
        cfg = next((c for c in _configs(results) if c[:2] == (b, s)), None)
        top = best(cfg) if cfg else None
        if top is None:
            continue
        us = top["ms"] * 1e3
        published = f"; the seed's kernel: {PUBLISHED_US[(b, s)]:.0f} µs on an H100/H20-class GPU"
        if target is None:
            ratio = top["ms"] / top["floor_ms"]
            verdict = "met" if ratio <= 1.5 else "missed"
            lines.append(f"- {b}x{s} within 1.5x of the one-pass floor: {verdict}; {top['series']} takes {us:.1f} µs, "
                         f"{ratio:.2f}x the floor of {top['floor_ms'] * 1e3:.1f} µs{published}")
        else:
            verdict = "met" if us < target else "missed"
            lines.append(f"- {b}x{s} under {what}: {verdict}; {top['series']} takes {us:.1f} µs{published}")
    return "\n".join(lines)


__all__ = ["NgramInputs", "NgramConfig", "NgramMatcher", "ngram_match", "reference_ngram_match", "validate",
           "make_batch", "cpu_path_inplace", "model_one_pass_keys", "model_budget_scan",
           "published_blockscan_counts", "model_budget_refused", "early_exit_bytes", "haystack_bytes", "match_key", "decode_key", "STEPS", "bench",
           "figures", "summary_table", "variants_table", "target_verdicts", "headline"]
