"""Exercises of chapter 1, each with a check a reader runs on a CPU.

Each ``check_*`` function takes the reader's function, runs it on small inputs (random automata, small
vocabularies, the real cl100k_base vocabulary where the exercise needs a tokenizer) against the chapter's
own answer, prints what is wrong on the first inputs where the two differ, and returns True when every
case agrees. The chapter's answers live in :mod:`book.fsm.solutions`, which the notebook does not import; a check
loads them only to compare.

1. :func:`check_token_jumps`: the token-level jump table of an automaton (step 2's precompute).
2. :func:`check_replaced_tokens`: what a retokenization costs the KV cache (step 3).
3. :func:`check_ff_tokens`: llguidance's safe fast-forward tokens: a forced string's tokens, with the last
   ones held back where a longer token could span the end of the string.
4. :func:`check_ff_decode`: step 1's loop with llguidance's rule: forced strings appended as their safe
   fast-forward tokens (exercise 3's), nothing retokenized.
"""

from __future__ import annotations

import functools
import random
import zlib
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from book.common import report_failures
from studylog.fsm.automaton import ConstrainedFSM
from studylog.fsm.decoding import NextLogits, decode
from studylog.fsm.vocabulary import TokenVocabulary, load_vocabulary, make_vocabulary

__all__ = ["check_token_jumps", "check_jump_decode", "check_ff_decode", "check_replaced_tokens", "check_ff_tokens",
           "small_vocabulary", "longest_match_encoder", "toy_model",
           "SMALL_REGEXES"]


def longest_match_encoder(table: Mapping[bytes, int]) -> Callable[[str], list[int]]:
    """A tokenizer for a small vocabulary: at each position the longest token that matches (tests and toy
    examples; a real BPE merges by rank instead). Every byte of the text must be a token."""
    longest = max(map(len, table))

    def encode(text: str) -> list[int]:
        data, out, i = text.encode(), [], 0
        while i < len(data):
            for k in range(min(longest, len(data) - i), 0, -1):
                if data[i:i + k] in table:
                    out.append(table[data[i:i + k]])
                    i += k
                    break
            else:
                raise ValueError(f"byte {data[i]:#04x} at position {i} is no token of the vocabulary")
        return out

    return encode


def toy_model(vocab: TokenVocabulary, seed: int = 0, close_bias: float = 0.25) -> NextLogits:
    """A deterministic stand-in for a language model: logits are pseudo-random, a pure function of the
    ids (so two decodes that feed the same ids get the same logits), plus a bias growing with the length
    toward tokens that close strings and objects, so outputs end."""
    closers = [i for i, b in enumerate(vocab.token_bytes) if b is not None and any(c in b for c in b'"}],;')]
    closers = np.asarray(closers + [vocab.eos_id], dtype=np.int64)

    def next_logits(ids: list[int]) -> Float[Tensor, " vocab"]:
        key = zlib.crc32(np.asarray(ids, dtype=np.int64).tobytes())
        logits = np.random.default_rng([seed, key, len(ids)]).standard_normal(vocab.vocab_size, dtype=np.float32)
        logits[closers] += close_bias * len(ids)
        return torch.from_numpy(logits)

    return next_logits


Transitions = Mapping[int, Mapping[int, int]]


def _solutions():
    from book.fsm import solutions  # the answers, loaded only to compare with the reader's

    return solutions


def _call(fn: Callable, *args) -> tuple[Any, Optional[str]]:
    try:
        return fn(*args), None
    except Exception as exc:  # the reader's code: report, do not crash the check
        return None, f"raised {type(exc).__name__}: {exc}"


# --- 1. the token-level jump table ----------------------------------------------------------------------------



def _random_automaton(rng: random.Random) -> tuple[dict[int, dict[int, int]], frozenset[int]]:
    """A random automaton whose forced chains end: edges go forward (to a higher state), and only states with
    two or more tokens may also point back, so no cycle is made of forced states alone."""
    n = rng.randint(2, 14)
    ids = rng.sample(range(10, 400), n)  # state ids are not 0..n-1 in a real index either
    trans: dict[int, dict[int, int]] = {}
    finals = {ids[-1]}
    for i in range(n - 1):
        k = rng.choice([1, 1, 1, 2, 3]) if rng.random() < 0.9 else 0
        targets = [ids[rng.randint(i + 1, n - 1)] for _ in range(k)]
        if k >= 2 and rng.random() < 0.3:
            targets[-1] = ids[rng.randint(0, i)]
        tokens = rng.sample(range(1000), k)
        trans[ids[i]] = dict(zip(tokens, targets))
        if k == 0 or rng.random() < 0.15:
            finals.add(ids[i])
    trans[ids[-1]] = {} if rng.random() < 0.5 else {rng.randrange(1000): ids[rng.randint(0, n - 1)],
                                                     rng.randrange(1000, 2000): ids[-1]}
    return trans, frozenset(finals)


def _jump_table(result: Any) -> dict[int, tuple[tuple[int, ...], int]]:
    """The reader's table in the reference's form: values may be ``(tokens, end)`` or have ``.tokens``/``.end``."""
    if not isinstance(result, Mapping):
        raise TypeError(f"expected a dict {{state: (tokens, end)}}, got {type(result).__name__}")
    out = {}
    for s, v in result.items():
        tokens, end = (v.tokens, v.end) if hasattr(v, "tokens") else v
        out[int(s)] = (tuple(int(t) for t in tokens), int(end))
    return out


def check_token_jumps(fn: Callable[[Transitions, frozenset[int]], Mapping], *, cases: int = 200, seed: int = 0,
                      verbose: bool = True) -> bool:
    """Exercise 1. ``fn(transitions, finals)`` gets an automaton as ``{state: {token: next state}}`` (EOS left
    out) and its final states, and returns ``{state: (tokens, end)}``: for every state that is not final and
    allows exactly one token, the tokens appended without a forward pass from there and the state reached.

    Runs ``cases`` random automata and the automaton of ``("true"|"false"|"NA")`` over a small vocabulary."""
    rng = random.Random(seed)
    inputs = [_random_automaton(rng) for _ in range(cases)]
    fsm = small_fsm('("true"|"false"|"NA")')
    eos = fsm.vocab.eos_id
    inputs.append(({s: {t: n for t, n in out.items() if t != eos} for s, out in fsm.index.get_transitions().items()},
                   fsm.finals))
    failures = []
    for trans, finals in inputs:
        want = _solutions().reference_token_jumps(trans, finals)
        got, err = _call(fn, {s: dict(d) for s, d in trans.items()}, frozenset(finals))
        if err is None:
            try:
                got = _jump_table(got)
            except (TypeError, ValueError) as exc:
                err = str(exc)
        if err is not None:
            failures.append(f"on {trans} (finals {sorted(finals)}): {err}")
            continue
        if got != want:
            wrong = sorted(s for s in set(got) | set(want) if got.get(s) != want.get(s))
            s = wrong[0]
            failures.append(f"on {trans} (finals {sorted(finals)}): state {s}: got {got.get(s)}, "
                            f"expected {want.get(s)} ({len(wrong)} states differ)")
    return report_failures("check_token_jumps", failures, len(inputs), verbose)


# --- step 2's decode loop, and 4. the held-back loop --------------------------------------------------------------

#: Regexes of the jump-decoding exercises, indexed over :func:`small_vocabulary`.
SMALL_REGEXES: tuple[str, ...] = (
    '("true"|"false"|"NA")',
    r'\{"name":"[a-z]{1,6}","age":[0-9]{1,2}\}',
    r'\{"ok":(true|false),"tags":\["[a-z]{1,4}"(,"[a-z]{1,4}"){0,2}\]\}',
    r'[0-9]{3}-[0-9]{3}-[0-9]{4}',
    r'(yes|no|maybe)!',
)


@functools.lru_cache(maxsize=1)
def small_vocabulary() -> TokenVocabulary:
    """Every single byte (ids 0-255), a few dozen merged tokens of JSON and of the words above, and EOS: a
    vocabulary small enough to index a regex in milliseconds. Its encoder takes the longest token first."""
    merged = ['{"', '":', '":"', '","', '"}', '"N', '"f', '"t', 'name', 'age', 'ok', 'tags', 'true', 'false',
              'tr', 'ue', 'fa', 'al', 'lse', 'se', 'NA', 'yes', 'no', 'may', 'be', '!', '12', '00', '-',
              '"]', '["', ',"', '"],', 'ag', 'ta', 'gs']
    tokens: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    for t in merged:
        tokens.setdefault(t.encode(), len(tokens))
    eos = len(tokens)
    return make_vocabulary(tokens, eos, name="small", encoder=longest_match_encoder(tokens))


@functools.lru_cache(maxsize=16)
def small_fsm(regex: str) -> ConstrainedFSM:
    """``regex`` indexed over :func:`small_vocabulary` (cached)."""
    return ConstrainedFSM(regex, small_vocabulary(), name=regex[:24])


def _ids_and_passes(got: Any) -> tuple[list[int] | None, int | None, str | None]:
    """A decode loop's answer (an object with ``ids`` and ``forward_passes``, or that tuple) as ``(ids, passes,
    None)``, or ``(None, None, why)`` when it is neither."""
    try:
        ids, passes = (got.ids, got.forward_passes) if hasattr(got, "ids") else got
        return [int(t) for t in ids], int(passes), None
    except (TypeError, ValueError) as exc:
        return None, None, f"returned {got!r}, not (ids, forward_passes): {exc}"


def check_jump_decode(fn: Callable[..., Any], *, seeds: int = 12, verbose: bool = True) -> bool:
    """Step 2 as an exercise (not on chapter 1's page). ``fn(next_logits, fsm, max_tokens=...)`` is step 2:
    greedy constrained decoding that appends the chain of ``fsm.token_jumps`` where one starts instead of calling
    ``next_logits``. It returns an object with ``ids`` and ``forward_passes`` (a
    :class:`~studylog.fsm.DecodeResult`) or a tuple ``(ids, forward_passes)``. Checked under deterministic toy
    models (several seeds) on the regexes of :data:`SMALL_REGEXES` and several ``max_tokens``: the ids must be step 1's, the passes step 2's."""
    failures, cases = [], 0
    for regex in SMALL_REGEXES:
        fsm = small_fsm(regex)
        for seed in range(seeds):
            model = toy_model(fsm.vocab, seed=seed, close_bias=1.0)
            for cap in (64, 1 + seed % 7):
                cases += 1
                want_ids = decode(model, fsm, "none", max_tokens=cap).ids
                want_passes = decode(model, fsm, "token", max_tokens=cap).forward_passes
                got, err = _call(lambda: fn(model, fsm, max_tokens=cap))
                if err is None:
                    ids, passes, err = _ids_and_passes(got)
                if err is not None:
                    failures.append(f"{regex!r}, model seed {seed}, max_tokens {cap}: {err}")
                elif ids != want_ids:
                    failures.append(f"{regex!r}, model seed {seed}, max_tokens {cap}: ids {ids} differ from "
                                    f"one pass per token's {want_ids}")
                elif passes != want_passes:
                    failures.append(f"{regex!r}, model seed {seed}, max_tokens {cap}: {passes} forward passes, "
                                    f"expected {want_passes} (one pass per token needs "
                                    f"{decode(model, fsm, 'none', max_tokens=cap).forward_passes})")
    return report_failures("check_jump_decode", failures, cases, verbose)


def check_ff_decode(fn: Callable[..., Any], *, seeds: int = 12, verbose: bool = True) -> bool:
    """Exercise 4. ``fn(next_logits, fsm, ff, max_tokens=...)`` is step 1's loop with llguidance's rule: in a
    state with forced bytes (``fsm.char_jumps[state].data``) it appends ``ff(data)`` (the safe fast-forward
    tokens; the check passes the chapter's rule) without a pass, never replacing a token already written, and
    calls the model where nothing is forced or ``ff`` returns no token. It returns an object with ``ids`` and
    ``forward_passes`` or a tuple ``(ids, forward_passes)``. Checked under toy models (several seeds) on
    :data:`SMALL_REGEXES` and several ``max_tokens``: ids and passes must be the chapter's answer's."""
    sol = _solutions()
    failures, cases = [], 0
    for regex in SMALL_REGEXES:
        fsm = small_fsm(regex)
        ff = functools.partial(sol.reference_ff_tokens, vocab=fsm.vocab)
        for seed in range(seeds):
            model = toy_model(fsm.vocab, seed=seed, close_bias=1.0)
            for cap in (64, 1 + seed % 7):
                cases += 1
                want = sol.reference_ff_decode(model, fsm, ff, max_tokens=cap)
                got, err = _call(lambda: fn(model, fsm, ff, max_tokens=cap))
                if err is None:
                    ids, passes, err = _ids_and_passes(got)
                where = f"{regex!r}, model seed {seed}, max_tokens {cap}"
                if err is not None:
                    failures.append(f"{where}: {err}")
                elif ids != want.ids:
                    failures.append(f"{where}: ids {ids}, expected {want.ids}")
                elif passes != want.forward_passes:
                    failures.append(f"{where}: {passes} forward passes, expected {want.forward_passes}")
    return report_failures("check_ff_decode", failures, cases, verbose)


# --- 2. what a retokenization costs ---------------------------------------------------------------------------



def check_replaced_tokens(fn: Callable[[list[int], list[int]], tuple[int, int]], *, cases: int = 300, seed: int = 0,
                          verbose: bool = True) -> bool:
    """Exercise 2. ``fn(emitted, retokenized)`` gets the ids written before a character-level jump and the
    ids of the text after it, re-encoded by the tokenizer, and returns ``(replaced, fed)``: how many emitted
    tokens have to leave the KV cache, and how many tokens the next forward pass takes as its chunk."""
    rng = random.Random(seed)
    inputs = [([34], [34, 609, 794]),  # the jump only appends
              ([5018, 609, 1], [5018, 609, 794, 330]),  # the last emitted token merges with the jump's text
              ([], [90]), ([7, 8], [7, 8]), ([7, 8, 9], [7, 10])]
    for _ in range(cases):
        common = [rng.randrange(50) for _ in range(rng.randint(0, 8))]
        old = common + [rng.randrange(50, 100) for _ in range(rng.randint(0, 4))]
        new = common + [rng.randrange(100, 150) for _ in range(rng.randint(0, 6))]
        inputs.append((old, new))
    failures = []
    for old, new in inputs:
        got, err = _call(fn, list(old), list(new))
        want = _solutions().reference_replaced_tokens(old, new)
        if err is None:
            try:
                got = tuple(int(x) for x in got)
            except (TypeError, ValueError):
                err = f"returned {got!r}, not (replaced, fed)"
        if err is not None:
            failures.append(f"emitted {old}, retokenized {new}: {err}")
        elif got != want:
            failures.append(f"emitted {old}, retokenized {new}: got (replaced, fed) = {got}, expected {want}")
    return report_failures("check_replaced_tokens", failures, len(inputs), verbose)


# --- 3. llguidance's safe fast-forward tokens --------------------------------------------------------------------





#: Forced strings of the chapter's automata (outlines' default whitespace and compact JSON), and strings where
#: a longer token starts inside the second-to-last token (two tokens held back), on cl100k_base.
FF_CASES: tuple[bytes, ...] = (
    b'"', b'name"', b'{"name": "get_weather", "arguments": {"location": "', b'", "unit": "', b'","unit":"',
    b'{"name":"', b'location"', b'arguments":{"', b'-', b'T12:', b'"}', b'"}}', b'false"', b'2024-',
    b'SELECT * FROM ', b' WHERE id = ', b'https://', b'", "priority": "', b'name_of_the_person"',
    b'Exitleanor', b' Noradi', b'Fotoughs', b'imageredit',
)
#: Forced strings on :func:`small_vocabulary`, where no longer token continues some of them (nothing held back).
FF_SMALL_CASES: tuple[bytes, ...] = (b'12', b'yes!', b'00-', b'{"name":"', b'"]', b'tags":["', b'age":')


def check_ff_tokens(fn: Callable[[bytes, TokenVocabulary], Sequence[int]], *, verbose: bool = True) -> bool:
    """Exercise 3. ``fn(forced, vocab)`` gets a forced string (bytes every valid continuation starts with) and
    the vocabulary (``vocab.encode``, ``vocab.decode``, ``vocab.token_bytes``) and returns the tokens that are
    safe to append without a pass: the tokenizer's split of ``forced`` with the last tokens held back when a
    token longer than the rest of ``forced`` starts with that rest (look at most four tokens back). Checked on
    forced strings over cl100k_base and over :func:`small_vocabulary`."""
    cases = [(f, load_vocabulary()) for f in FF_CASES] + [(f, small_vocabulary()) for f in FF_SMALL_CASES]
    failures = []
    for forced, vocab in cases:
        want = _solutions().reference_ff_tokens(forced, vocab)
        got, err = _call(fn, forced, vocab)
        if err is None:
            try:
                got = [int(t) for t in got]
            except (TypeError, ValueError):
                err = f"returned {got!r}, not a list of token ids"
        if err is not None:
            failures.append(f"{forced!r} ({vocab.name}): {err}")
        elif got != want:
            show = lambda ids: [vocab.show(t) for t in ids]  # noqa: E731
            failures.append(f"{forced!r} ({vocab.name}): got {show(got)}, expected {show(want)} "
                            f"(the tokenizer's split: {show(vocab.encode(forced))})")
    return report_failures("check_ff_tokens", failures, len(cases), verbose)
