"""The chapter beside xgrammar and llguidance on the same regex and vocabulary (:mod:`book.fsm.matchers`).

:func:`jump_forward_decode` is one greedy decode loop any matcher drives, under a ``policy``: ``"none"``,
``"tokens"`` (append the forced tokens) or ``"bytes"`` (append the forced string and retokenize, as SGLang does
with xgrammar's); driven by our matcher it gives the ids and passes of the chapter's three steps.
:func:`compare_peers` walks the suite's documents through the three matchers at once (forced strings and masks
compared state by state, one mask fill timed per state) and decodes them under each policy.
:func:`viable_prefix` judges a disagreement independently (the ``regex`` module's partial match).
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from studylog.checks import check_choice, check_int
from studylog.fsm.automaton import ConstrainedFSM
from studylog.fsm.decoding import NextLogits, check_logits, writer_model
from book.fsm.events import Event, RecordedDecode
from book.fsm.matchers import (LIBRARIES, LIBRARY_POLICIES, POLICIES, Matcher, PeerError, library, mask_words,
                                   peer_versions, unpack_mask)  # noqa: F401  (peer_versions: the lesson reads it here)
from studylog.fsm.vocabulary import TokenVocabulary, load_vocabulary


# --- one decode loop for every library ---------------------------------------------------------------------

def _masked_greedy(logits: np.ndarray, allowed: np.ndarray) -> int:
    best = int(np.argmax(logits))  # ties to the lowest id, as studylog.fsm.greedy
    if allowed[best]:
        return best
    ids = np.flatnonzero(allowed)
    return int(ids[np.argmax(logits[ids])])


def only_eos_mask(vocab: TokenVocabulary) -> np.ndarray:
    """The packed mask that allows EOS alone (a state where decoding ends without a pass)."""
    words = np.zeros(mask_words(vocab.vocab_size), dtype=np.int32)
    words.view(np.uint32)[vocab.eos_id // 32] = np.uint32(1 << (vocab.eos_id % 32))
    return words


def jump_forward_decode(next_logits: NextLogits, matcher: Matcher, vocab: TokenVocabulary, policy: str = "none", *,
                        max_tokens: int = 256, record_events: bool = False) -> RecordedDecode:
    """Greedy constrained decoding through any fresh :class:`Matcher`, in the order of the chapter's steps: end
    where the mask allows only EOS; else append what ``policy`` forces (``"tokens"``: ``forced_tokens()``;
    ``"bytes"``: ``forced_bytes()``, the whole text re-encoded, as step 3); else a forward pass picks the masked
    argmax. A jump is cut at ``max_tokens``; ``forward_passes`` counts the pass that picks EOS too."""
    check_choice("policy", policy, POLICIES)
    check_int("max_tokens", max_tokens, low=1)
    res = RecordedDecode([], b"", 0, False)
    ids, size, eos = res.ids, vocab.vocab_size, vocab.eos_id
    mask = np.zeros(mask_words(size), dtype=np.int32)
    end = only_eos_mask(vocab)
    while len(ids) < max_tokens:
        matcher.fill_mask(mask)
        if np.array_equal(mask, end):
            res.finished = True
            if record_events:
                res.events.append(Event("end"))
            break
        if policy == "tokens":
            forced = matcher.forced_tokens()[:max_tokens - len(ids)]
            if forced:
                for t in forced:
                    matcher.consume(t)
                ids.extend(forced)
                res.jumped_tokens += len(forced)
                if record_events:
                    res.events.append(Event("token-jump", tuple(forced), vocab.decode(forced)))
                continue
        elif policy == "bytes":
            data = matcher.forced_bytes()
            if data:
                text = vocab.decode(ids)
                try:
                    new_ids = vocab.encode((text + data).decode("utf-8"))[:max_tokens]
                except UnicodeDecodeError:
                    new_ids = None
                    res.skipped_jumps += 1
                if new_ids is not None:
                    keep = 0
                    while keep < min(len(ids), len(new_ids)) and ids[keep] == new_ids[keep]:
                        keep += 1
                    matcher.rollback(len(ids) - keep)
                    for t in new_ids[keep:]:
                        matcher.consume(t)
                    appended = max(0, len(vocab.decode(new_ids)) - len(text))
                    res.retokenized += len(ids) - keep
                    res.jumped_tokens += len(new_ids) - keep
                    res.jumped_bytes += appended
                    if record_events:
                        res.events.append(Event("char-jump", tuple(new_ids[keep:]), data[:appended],
                                                dropped=len(ids) - keep))
                    ids[:] = new_ids
                    continue
        logits = check_logits(next_logits(list(ids)), size).detach().to("cpu").float().numpy()
        res.forward_passes += 1
        tok = _masked_greedy(logits, unpack_mask(mask, size))
        if tok == eos:
            res.finished = True
            if record_events:
                res.events.append(Event("eos", (tok,)))
            break
        matcher.consume(tok)
        ids.append(tok)
        if record_events:
            res.events.append(Event("pass", (tok,), vocab.token_bytes[tok]))
    res.text = vocab.decode(ids)
    return res


# --- the independent judge --------------------------------------------------------------------------------

def viable_prefix(regex: str, text: bytes, *, max_completions: int = 1 << 16) -> bool:
    """True when ``text`` starts some string that fully matches ``regex``, by the ``regex`` module's partial
    matching (its own engine; ``.`` excludes ``\\n``). A text that ends inside a UTF-8 character is viable when
    some completion of it is (at most ``max_completions`` tried)."""
    try:
        import regex as regex_module
    except ImportError as exc:
        raise ImportError("viable_prefix needs the `regex` package (in the package's 'test' and 'peers' extras)") from exc
    pattern = regex_module.compile(regex)
    for cut in range(4):
        head, tail = text[:len(text) - cut], text[len(text) - cut:]
        try:
            prefix = head.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not tail:
            return pattern.fullmatch(prefix, partial=True) is not None
        candidates = _utf8_completions(tail, max_completions)
        return any(pattern.fullmatch(prefix + c, partial=True) is not None for c in candidates)
    raise ValueError(f"text is not UTF-8 with at most an incomplete last character: {text[-8:]!r}")


def _utf8_completions(tail: bytes, limit: int) -> list[str]:
    """Every character whose UTF-8 encoding starts with the incomplete ``tail``."""
    lead = tail[0]
    size = 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 0
    if not size or len(tail) >= size:
        raise ValueError(f"{tail!r} does not start a multi-byte UTF-8 character")
    out = []
    for cont in itertools.product(range(0x80, 0xC0), repeat=size - len(tail)):
        try:
            out.append((tail + bytes(cont)).decode("utf-8"))
        except UnicodeDecodeError:  # overlong forms and surrogates
            continue
        if len(out) >= limit:
            break
    return out


# --- the comparison ---------------------------------------------------------------------------------------

@dataclass
class Difference:
    """One state where a peer's answer differs from ours: ``prefix`` is the text so far; for ``"forced
    bytes"`` ``ours``/``theirs`` are the forced strings, for ``"mask"`` the ids only one side allows."""

    entry: str
    library: str
    what: str
    prefix: bytes
    ours: Any
    theirs: Any


@dataclass
class PeerRow:
    """One library on one suite entry: the same documents, walked and decoded."""

    entry: str
    library: str
    compile_seconds: float
    mask_seconds: list[float] = field(repr=False)  # one fill per state of the walks
    states: int = 0                    # states of the canonical walks (each prefix of each document)
    forced_byte_states: int = 0        # states with a non-empty forced string
    forced_bytes_total: int = 0        # their forced bytes, summed
    forced_token_states: int = 0       # states with forced tokens (ours: one allowed token; llguidance: ff tokens)
    single_token_masks: int = 0        # states whose mask allows exactly one token (EOS excluded)
    forced_bytes_differ: int = 0       # states whose forced string differs from ours
    masks_differ: int = 0              # states whose mask differs from ours
    masks_differ_unforced: int = 0     # ... among states with no forced bytes (ours)
    tokens: int = 0                    # canonical tokens of the documents
    passes: dict[str, int] = field(default_factory=dict)       # forward passes per policy
    picked: dict[str, int] = field(default_factory=dict)       # passes that picked a token (not EOS), per policy
    out_tokens: dict[str, int] = field(default_factory=dict)   # tokens written, per policy
    noncanonical: dict[str, int] = field(default_factory=dict)  # documents written in a non-canonical split
    differences: list[Difference] = field(default_factory=list, repr=False)

    @property
    def mask_median_us(self) -> float:
        return 1e6 * statistics.median(self.mask_seconds)

    @property
    def first_mask_us(self) -> float:
        return 1e6 * self.mask_seconds[0]

    def forced_share(self, policy: str) -> float:
        """Share of the written tokens that no forward pass picked (appended by jumps, retokenized included)."""
        return 1.0 - self.picked[policy] / self.out_tokens[policy]

    def saved(self, policy: str, baseline: "PeerRow") -> float:
        """Share of forward passes saved over ``baseline``'s decode without compression."""
        return 1.0 - self.passes[policy] / baseline.passes["none"]


def _walk(lib_matchers: dict[str, Matcher], ids: Sequence[int], vocab: TokenVocabulary, entry: str,
          rows: dict[str, PeerRow], keep_examples: int) -> None:
    """Walk ``ids`` through every library at once; compare each state's forced string and mask with ours."""
    size = vocab.vocab_size
    masks = {name: np.zeros(mask_words(size), dtype=np.int32) for name in lib_matchers}
    for pos in range(len(ids) + 1):
        prefix = vocab.decode(ids[:pos])
        answers = {}
        for name, m in lib_matchers.items():
            t0 = time.perf_counter()
            m.fill_mask(masks[name])
            rows[name].mask_seconds.append(time.perf_counter() - t0)
            answers[name] = (m.forced_bytes(), m.forced_tokens())
        ours_bytes = answers["ours"][0]
        for name, (fbytes, ftokens) in answers.items():
            row = rows[name]
            row.states += 1
            row.forced_byte_states += bool(fbytes)
            row.forced_bytes_total += len(fbytes)
            row.forced_token_states += bool(ftokens)
            words = masks[name]
            eos_bit = (int(words.view(np.uint32)[vocab.eos_id // 32]) >> (vocab.eos_id % 32)) & 1
            row.single_token_masks += int(int(np.bitwise_count(words.view(np.uint32)).sum()) == 1 and not eos_bit)
            if name == "ours":
                continue
            if fbytes != ours_bytes:
                row.forced_bytes_differ += 1
                if len(row.differences) < keep_examples:
                    row.differences.append(Difference(entry, name, "forced bytes", prefix, ours_bytes, fbytes))
            if not np.array_equal(masks[name], masks["ours"]):
                row.masks_differ += 1
                if not ours_bytes:
                    row.masks_differ_unforced += 1
                    if len(row.differences) < keep_examples:
                        ours_allowed, allowed = unpack_mask(masks["ours"], size), unpack_mask(words, size)
                        only_ours = tuple(np.flatnonzero(ours_allowed & ~allowed).tolist())
                        only_theirs = tuple(np.flatnonzero(allowed & ~ours_allowed).tolist())
                        row.differences.append(Difference(entry, name, "mask", prefix, only_ours, only_theirs))
        if pos < len(ids):
            for m in lib_matchers.values():
                m.consume(ids[pos])


def compare_peers(entries=None, vocab: Optional[TokenVocabulary] = None, *, libraries: Sequence[str] = LIBRARIES,
                  whitespace: str = "default", n_samples: int = 8, seed: int = 0, keep_examples: int = 3,
                  fsms: Optional[Mapping[str, ConstrainedFSM]] = None, progress: bool = False) -> list[PeerRow]:
    """Every suite entry (default: the whole suite) in every library, on the documents
    :func:`~studylog.fsm.report.measure_entry` samples: each walked along its canonical tokens through all
    libraries at once, then decoded by the writer model under each library's policies. A missing library raises
    ImportError. ``fsms``: automata already built for the same regexes over ``vocab``, used as they are (their
    build time as our compile time)."""
    import random

    from studylog.fsm import schemas

    check_int("n_samples", n_samples, low=1)
    libraries = list(libraries)
    if "ours" not in libraries:
        raise ValueError("libraries must include 'ours' (the answers are compared with ours)")
    for name in libraries:
        check_choice("libraries", name, LIBRARIES)
    vocab = vocab or load_vocabulary()
    entries = list(entries) if entries is not None else schemas.suite()
    libs = {name: library(name, vocab) for name in libraries}
    jobs = entries
    if progress:
        from tqdm.auto import tqdm

        jobs = tqdm(entries, desc="peers")
    out: list[PeerRow] = []
    for e in jobs:
        regex = e.regex(whitespace)
        grammars = {}
        for name, lib in libs.items():
            prebuilt = (fsms or {}).get(e.name) if name == "ours" else None
            if prebuilt is not None and prebuilt.regex != regex:
                raise ValueError(f"the automaton given for {e.name!r} was built from another regex")
            grammars[name] = lib.adopt(prebuilt) if prebuilt is not None else lib.compile(regex)
        rows = {name: PeerRow(e.name, name, grammars[name].seconds, []) for name in libs}
        rng = random.Random(f"{seed}/{e.name}/{whitespace}")
        for _ in range(n_samples):
            sample = e.sample(rng, whitespace)
            canon = vocab.encode(sample)
            _walk({name: libs[name].matcher(g) for name, g in grammars.items()}, canon, vocab, e.name, rows,
                  keep_examples)
            for name, row in rows.items():
                row.tokens += len(canon)
                for policy in LIBRARY_POLICIES[name]:
                    res = jump_forward_decode(writer_model(vocab, sample), libs[name].matcher(grammars[name]), vocab,
                                              policy, max_tokens=4 * len(canon) + 8, record_events=True)
                    if not res.finished or res.text != sample.encode():
                        raise PeerError(f"{name} ({policy}) on {e.name}: wrote {res.text!r}, expected {sample!r}")
                    row.passes[policy] = row.passes.get(policy, 0) + res.forward_passes
                    row.picked[policy] = row.picked.get(policy, 0) + sum(ev.kind == "pass" for ev in res.events)
                    row.out_tokens[policy] = row.out_tokens.get(policy, 0) + len(res.ids)
                    row.noncanonical[policy] = row.noncanonical.get(policy, 0) + (res.ids != canon)
        out.extend(rows.values())
    return out


def tally(rows: Sequence[PeerRow], totals: dict, record: dict) -> None:
    """Add one document's :func:`compare_peers` rows to a run's ``totals`` (``none``: passes without jumps;
    ``policies``: per library and policy, passes and documents in a split the tokenizer would not write) and to the
    record of its schema or request (``none``, ``tokens`` and passes per library and policy)."""
    by = {r.library: r for r in rows}
    none = by["ours"].passes["none"]
    totals["none"] += none
    record["none"] += none
    record["tokens"] += by["ours"].tokens
    for lib, row in by.items():
        for policy, passes in row.passes.items():
            if policy == "none":
                continue
            key = f"{lib}/{policy}"
            slot = totals["policies"].setdefault(key, {"passes": 0, "noncanonical": 0})
            slot["passes"] += passes
            slot["noncanonical"] += row.noncanonical[policy]
            record[key] = record.get(key, 0) + passes
