"""Chapter 1's automaton where outlines-core cannot build it (it refuses or runs for minutes on many real JSON
schemas): the same interface, read from xgrammar's matcher, states discovered as decoding reaches them. A state is
a token path from the start (0: the empty path): xgrammar does not say where its grammar is, so two paths to the
same place are two states.

Beside the library, not part of it: the chapter's grammars are all chapter 1's (``studylog.decode.Grammar``).
:func:`from_regex`, :func:`from_schema` and :func:`from_suite` build a ``Grammar`` on this automaton
(``engine="xgrammar"``), or on chapter 1's where outlines-core builds it (``engine="auto"``); the decode loop runs
either alike. Public API only; the tests load this file (``tests/lab_scripts.load("decode", "fallback")``)."""

from __future__ import annotations

import functools
import json
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from studylog.checks import check_choice
from studylog.decode import pieces
from studylog.decode.grammar import (Grammar, ascii_regex, byte_tokens, continues_utf8, packed_bits, schema_regex,
                                     suite_regex, xgrammar_compiler)
from studylog.fsm import ConstrainedFSM, Jump
from studylog.fsm.schemas import WHITESPACE

#: Matchers kept, each at a state (past it, a sequence's matcher is walked again from the start).
MATCHERS = 64
#: Allowed-id arrays kept (an evicted one is computed again).
SETS = 256
#: A forced chain is cut at this many tokens (a cycle of forced states has no end, and states are paths).
MAX_CHAIN = 1024
_BIT = np.arange(32, dtype=np.int64)


def _tail(data: bytes) -> bytes:
    """The bytes of the character begun and not finished at the end of ``data`` (valid UTF-8 or its start)."""
    for k in range(1, min(3, len(data)) + 1):
        c = data[-k]
        if c < 0x80:
            return b""
        if c >= 0xC0:  # a lead byte of a 2-, 3- or 4-byte character
            return data[-k:] if k < (2 if c < 0xE0 else 3 if c < 0xF0 else 4) else b""
    return b""  # three continuation bytes end a 4-byte character


def _ids(row: np.ndarray, V: int) -> np.ndarray:
    """The set bits of a bitmask row (int32 words, bit ``v % 32`` of word ``v // 32``) as sorted int64 ids."""
    words = np.flatnonzero(row)
    bits = np.unpackbits(row.view(np.uint8).reshape(-1, 4)[words], axis=1, bitorder="little").astype(bool)
    ids = (words[:, None] * 32 + _BIT)[bits]
    return ids[ids < V]


def _has(bits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return ((bits[ids >> 3] >> (ids & 7)) & 1).astype(bool)


def _holds(ids: np.ndarray, token: int) -> bool:
    i = int(np.searchsorted(ids, token))
    return i < len(ids) and int(ids[i]) == token


@functools.lru_cache(maxsize=4)
def _split(vocab: pieces.TokenVocabulary) -> tuple[list[int], list[int]]:
    """The tokens of whole characters, and the others (the only ones that may follow part of a character)."""
    whole, odd = [], []
    for i, b in enumerate(vocab.token_bytes):
        if b:
            try:
                b.decode("utf-8")
                whole.append(i)
            except UnicodeDecodeError:
                odd.append(i)
    return whole, odd


@functools.lru_cache(maxsize=1024)
def _after(vocab: pieces.TokenVocabulary, pending: bytes) -> tuple[np.ndarray, np.ndarray, dict[int, bytes]]:
    """After the unfinished character ``pending``, as bitmask rows: EOS and the tokens that keep the text valid
    UTF-8; those that end inside a character again; and the character each of those leaves."""
    (whole, odd), tb = _split(vocab), vocab.token_bytes
    ok, tails = [vocab.eos_id] + (whole if not pending else []), {}
    for t in odd:  # after a part, only a token that starts with a continuation byte may be valid
        if (not pending or 0x80 <= tb[t][0] <= 0xBF) and continues_utf8(pending + tb[t], len(tb[t])):
            ok.append(t)
            if _tail(pending + tb[t]):
                tails[t] = _tail(pending + tb[t])
    return packed_bits(ok, vocab.vocab_size), packed_bits(list(tails), vocab.vocab_size), tails


@functools.lru_cache(maxsize=1024)
def _witness(vocab: pieces.TokenVocabulary, pending: bytes) -> int:
    """A one-byte token that keeps ``pending`` valid UTF-8 (-1 where the vocabulary has none)."""
    singles = byte_tokens(vocab)
    return next((singles[c] for c in range(0x80, 0xC0) if c in singles and continues_utf8(pending + bytes([c]), 1)), -1)


class MatcherAutomaton:
    """:class:`~studylog.decode.pieces.Automaton`'s interface over one xgrammar ``CompiledGrammar``: xgrammar's
    bitmask less the tokens that leave the text invalid UTF-8 and the dead ends of its byte-level matching (chapter
    1's set where both engines compile a grammar). No ``char_jump``."""

    def __init__(self, compiled: Any, vocab: pieces.TokenVocabulary, name: str = ""):
        import xgrammar as xgr

        self._xgr, self.compiled, self.vocab, self.name = xgr, compiled, vocab, name
        self.initial = 0
        self.build_seconds = self.precompute_seconds = 0.0  # nothing is built ahead
        self._parent, self._token, self._pending = [-1], [-1], [b""]
        self._child: dict[tuple[int, int], int] = {}
        self._info: dict[int, tuple[int, int, bool]] = {}  # state -> (allowed count, forced token or -1, final)
        self._sets: OrderedDict[int, np.ndarray] = OrderedDict()
        self._jumps: dict[int, Any] = {}
        self._at: OrderedDict[int, Any] = OrderedDict()  # state -> the matcher positioned there
        self._mask = xgr.allocate_token_bitmask(1, vocab.vocab_size)
        self._probe = xgr.allocate_token_bitmask(1, vocab.vocab_size)
        self._probe_bytes = self._probe[0].numpy().view(np.uint8)  # the same memory
        self.n_token_forced = 0  # forced states among those whose allowed set has been computed
        self.vocab_size = vocab.vocab_size
        #: pieces.Automaton's unchecked transition; here the matcher's walk is the work, so it is :meth:`next`
        self.transition = self.next

    @property
    def n_states(self) -> int:  # discovered so far
        return len(self._parent)

    def token_states(self) -> list[int]:
        return list(range(self.n_states))

    def _check(self, state: int) -> int:
        if isinstance(state, bool) or not isinstance(state, (int, np.integer)) or not 0 <= state < self.n_states:
            raise ValueError(f"state {state!r} is not a state of the automaton of {self.name!r} "
                             f"({self.n_states} discovered)")
        return int(state)

    def _reach(self, state: int):
        """A matcher at ``state``, moved down from its nearest ancestor that has one (never from a sibling: a matcher
        stays with the sequence it follows)."""
        path, cur = [], state
        while cur not in self._at and cur != 0:
            path.append(self._token[cur])
            cur = self._parent[cur]
        m = self._at.pop(cur, None)
        if m is None:
            m = self._xgr.GrammarMatcher(self.compiled, max_rollback_tokens=-1)
        for t in reversed(path):
            if not m.accept_token(t):
                raise RuntimeError(f"grammar {self.name!r}: xgrammar refuses token {t} on a path it allowed")
        return m

    def _put(self, state: int, m) -> None:
        self._at[state] = m
        if len(self._at) > MATCHERS:
            self._at.popitem(last=False)

    def allowed_ids(self, state: int) -> np.ndarray:
        """The sorted allowed token ids of a state (EOS included where xgrammar may stop), read-only."""
        state = self._check(state)
        ids = self._sets.get(state)
        if ids is not None:
            self._sets.move_to_end(state)
            return ids
        ok, mid, tails = _after(self.vocab, self._pending[state])
        m = self._reach(state)
        m.fill_next_token_bitmask(self._mask)
        ids = _ids(self._mask[0].numpy(), self.vocab.vocab_size)
        ids = ids[_has(ok, ids)]
        dead = []
        for t in ids[_has(mid, ids)].tolist():
            # a token ending inside a character is alive where some token may follow it (one token deep, as
            # Grammar.check_agreement looks); the matcher is back at ``state`` after each
            if not m.accept_token(t):  # its mask allows what its matcher refuses
                dead.append(t)
                continue
            w = _witness(self.vocab, tails[t])  # a byte that may follow: usually enough, and far cheaper than a mask
            if w >= 0 and m.accept_token(w):
                m.rollback(1)
            else:
                m.fill_next_token_bitmask(self._probe)
                if not np.count_nonzero(self._probe_bytes & _after(self.vocab, tails[t])[0]):
                    dead.append(t)
            m.rollback(1)
        self._put(state, m)
        ids = np.setdiff1d(ids, dead) if dead else ids
        ids.flags.writeable = False
        self._sets[state] = ids
        if len(self._sets) > SETS:
            self._sets.popitem(last=False)
        if state not in self._info:
            final = _holds(ids, self.vocab.eos_id)
            forced = int(ids[0]) if len(ids) == 1 and not final else -1
            self._info[state] = (len(ids), forced, final)
            self.n_token_forced += forced >= 0
        return ids

    def _state_info(self, state: int) -> tuple[int, int, bool]:
        if state not in self._info:
            self.allowed_ids(state)
        return self._info[state]

    def next(self, state: int, token: int) -> int | None:
        """The state after ``token``; None when it is not allowed (EOS ends decoding: None, as chapter 1's)."""
        state, token = self._check(state), int(token)
        if not 0 <= token < self.vocab.vocab_size:
            raise ValueError(f"token id {token} is outside the vocabulary [0, {self.vocab.vocab_size})")
        child = self._child.get((state, token))
        if child is not None or token == self.vocab.eos_id or not _holds(self.allowed_ids(state), token):
            return child
        m = self._reach(state)
        if not m.accept_token(token):
            raise RuntimeError(f"grammar {self.name!r}: xgrammar refuses token {token}, which its mask allowed")
        child = self._child[(state, token)] = len(self._parent)
        self._parent.append(state)
        self._token.append(token)
        self._pending.append(_tail(self._pending[state] + self.vocab.token_bytes[token]))
        self._put(child, m)
        return child

    #: chapter 1's walk (the states after each prefix of ``ids`` from ``state``) over :meth:`next`
    next_state = next
    walk = ConstrainedFSM.walk

    def only_eos(self, state: int) -> bool:
        n, _, final = self._state_info(self._check(state))
        return final and n == 1

    def token_jump(self, state: int):
        """The forced-token chain from ``state`` (chapter 1's ``Jump``), or None."""
        state = self._check(state)
        path, toks, cur = [], [], state
        while len(toks) < MAX_CHAIN:
            if cur in self._jumps:  # the rest of the chain is known
                rest = self._jumps[cur]
                if rest is not None:
                    toks, cur = toks + list(rest.tokens), rest.end
                break
            forced = self._state_info(cur)[1]
            if forced < 0:
                self._jumps[cur] = None
                break
            path.append(cur)
            toks.append(forced)
            cur = self.next(cur, forced)
        tb = self.vocab.token_bytes
        for i, s in enumerate(path):
            self._jumps[s] = Jump(tuple(toks[i:]), b"".join(tb[t] for t in toks[i:]), cur)
        return self._jumps.get(state)

    def char_jump(self, state: int):
        """None: forced-byte jumps need the character-level automaton enumerated."""
        self._check(state)


#: Who builds the automaton steps 2 and 3 read: chapter 1's (outlines-core), xgrammar's matcher, or the first
#: where outlines-core refuses.
ENGINES = ("outlines-core", "xgrammar", "auto")
#: xgrammar's JSON-schema options nearest chapter 1's whitespace patterns: ``"compact"`` is the same language;
#: for outlines' ``[ ]?`` the nearest is at most one character of ``[ \n\r\t]`` at the same places.
JSON_WHITESPACE: dict[str, dict[str, Any]] = {"default": {"any_whitespace": True, "max_whitespace_cnt": 1},
                                              "compact": {"any_whitespace": False, "separators": (",", ":")}}


#: States whose allowed sets a grammar on the matcher's automaton keeps: there every token makes a new state, and a
#: set can hold the whole vocabulary (chapter 1's grammars keep all theirs).
LAZY_KEPT = 256


class FallbackGrammar(Grammar):
    """A ``Grammar`` whose automaton is xgrammar's matcher's (:class:`MatcherAutomaton`), with why chapter 1's was not
    built (``fallback_reason``); it keeps the allowed sets and bits of the last :data:`LAZY_KEPT` states only. (Not a
    dataclass of its own: the tests load this file outside ``sys.modules``, where dataclasses cannot resolve it.)"""

    engine = "xgrammar"
    fallback_reason = ""

    def check_agreement(self) -> int:
        raise ValueError(f"grammar {self.name!r} has no automaton of chapter 1 (engine {self.engine!r}): its "
                         "steps all read xgrammar, and there is no second engine to compare")

    def allowed(self, states, device):
        out = super().allowed(states, device)
        _forget(self._allowed)
        return out

    def state_words(self, state):
        out = super().state_words(state)
        _forget(self._bits)
        return out


def _forget(kept: dict) -> None:
    """Drop the oldest entries past :data:`LAZY_KEPT`."""
    while len(kept) > LAZY_KEPT:
        del kept[next(iter(kept))]


def on_xgrammar(name: str, regex: str, vocab: pieces.TokenVocabulary, compiled: Any, seconds: dict[str, float],
                reason: str) -> Grammar:
    """A ``Grammar`` of xgrammar's ``compiled`` whose automaton is its matcher's (``regex`` ``""``: a schema)."""
    grammar = FallbackGrammar(name, regex, vocab, compiled, MatcherAutomaton(compiled, vocab, name), seconds)
    grammar.fallback_reason = reason
    return grammar


def from_regex(regex: str, vocab: pieces.TokenVocabulary | None = None, name: str = "", check: bool = True,
               engine: str = "auto") -> Grammar:
    """``Grammar.from_regex`` with the automaton of steps 2 and 3 built by ``engine``."""
    check_choice("engine", engine, ENGINES)
    seconds, refused = {}, ""
    if engine != "xgrammar":
        t0 = time.perf_counter()
        try:
            return Grammar.from_regex(regex, vocab, name, check)
        except ValueError as exc:
            if engine == "outlines-core" or "automaton of chapter 1 cannot be built" not in str(exc):
                raise
            seconds["automaton_refused"], refused = time.perf_counter() - t0, f"outlines-core: {exc.__cause__}"
    # xgrammar alone: its own errors, unwrapped (Grammar.from_regex names the grammar in them)
    vocab = vocab if vocab is not None else pieces.load_vocabulary("cl100k_base")
    ascii_form, t0 = ascii_regex(regex), time.perf_counter()
    compiled = xgrammar_compiler(vocab).compile_regex(ascii_form)
    seconds = {"xgrammar": time.perf_counter() - t0, **seconds}
    return on_xgrammar(name or regex[:40], ascii_form, vocab, compiled, seconds, refused)


def schema_grammar(schema: Any, vocab: pieces.TokenVocabulary, whitespace: str):
    """xgrammar's ``CompiledGrammar`` of a JSON schema, with :data:`JSON_WHITESPACE`."""
    if isinstance(schema, dict):
        schema = json.dumps(schema)
    try:
        return xgrammar_compiler(vocab).compile_json_schema(schema, **JSON_WHITESPACE[whitespace])
    except Exception as exc:  # xgrammar raises its own error types
        raise ValueError(f"xgrammar cannot compile the schema: {str(exc).strip().splitlines()[-1]}") from exc


def from_schema(schema: Any, vocab: pieces.TokenVocabulary | None = None, name: str = "",
                whitespace: str = "default", check: bool = True, engine: str = "auto") -> Grammar:
    """A JSON schema through outlines' regex of it; where outlines writes none, ``engine`` ``"auto"`` or
    ``"xgrammar"`` compiles the schema with xgrammar directly."""
    check_choice("engine", engine, ENGINES)
    check_choice("whitespace", whitespace, sorted(WHITESPACE))
    label = name or (schema.get("title") if isinstance(schema, dict) else None) or "schema"
    try:
        regex = schema_regex(schema, whitespace)
    except ValueError as exc:
        if engine == "outlines-core":
            raise ValueError(f"schema {label!r}: {exc} (engine='auto' tries xgrammar)") from exc
        vocab = vocab if vocab is not None else pieces.load_vocabulary("cl100k_base")
        t0 = time.perf_counter()
        try:
            compiled = schema_grammar(schema, vocab, whitespace)
        except ValueError as xexc:
            raise ValueError(f"schema {label!r} compiles with neither engine: outlines: {exc}; {xexc}") from xexc
        return on_xgrammar(name or "schema", "", vocab, compiled, {"xgrammar": time.perf_counter() - t0},
                           f"outlines: {exc}")
    return from_regex(regex, vocab, name or "schema", check, engine)


def from_suite(name: str, vocab: pieces.TokenVocabulary | None = None, whitespace: str = "default",
               engine: str = "auto") -> Grammar:
    """A grammar of chapter 1's suite, by name (compiled once per process and engine)."""
    check_choice("engine", engine, ENGINES)
    vocab = vocab if vocab is not None else pieces.load_vocabulary("cl100k_base")
    if engine == "xgrammar":
        return _suite_on_xgrammar(name, vocab, whitespace)
    return Grammar.from_suite(name, vocab, whitespace)  # outlines-core builds every suite entry


@functools.lru_cache(maxsize=32)
def _suite_on_xgrammar(name: str, vocab: pieces.TokenVocabulary, whitespace: str) -> Grammar:
    return from_regex(suite_regex(name, whitespace), vocab, name, engine="xgrammar")
