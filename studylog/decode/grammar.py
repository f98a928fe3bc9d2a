"""The constraint of a request, compiled twice: by xgrammar (the practitioners' baseline) and by chapter 1, from the
**same regex** (:func:`ascii_regex`), so both allow the same tokens in every state (:meth:`Grammar.check_agreement`)."""

from __future__ import annotations

import codecs
import functools
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from studylog.checks import check_choice
from studylog.decode import pieces
from studylog.fsm import regex_from_schema
from studylog.fsm.schemas import WHITESPACE, entry as suite_entry, suite

_CLASSES = {"d": ("[0-9]", "0-9"), "s": ("[ \\t\\n\\r\\f\\v]", " \\t\\n\\r\\f\\v"), "w": ("[0-9A-Za-z_]", "0-9A-Za-z_")}


def ascii_regex(regex: str) -> str:
    """``regex`` as both libraries read it alike: ``\\d``, ``\\s`` and ``\\w`` as ASCII classes (Unicode to
    outlines-core), ``.`` as ``[^\\n]`` (xgrammar's also matches a newline), ``\\ `` as a space. ``\\D``, ``\\S``,
    ``\\W`` are refused: their ASCII complement is not a plain class inside another class."""
    out, i, in_class = [], 0, False
    while i < len(regex):
        c = regex[i]
        if c == "\\" and i + 1 < len(regex):
            n = regex[i + 1]
            if n in "DSW":
                raise ValueError(f"regex uses \\{n} at position {i}; write the ASCII class it means instead")
            out.append(_CLASSES[n][1 if in_class else 0] if n in _CLASSES else " " if n == " " else regex[i:i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            head = re.match(r"\[\^?\]?", regex[i:]).group()  # a ']' first in a class is a literal
            out.append(head)
            in_class, i = True, i + len(head)
            continue
        in_class = in_class and c != "]"
        out.append("[^\\n]" if c == "." and not in_class else c)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=2)
def xgrammar_compiler(vocab: pieces.TokenVocabulary):
    """xgrammar's grammar compiler for a vocabulary; ids without text are empty strings, which it never allows."""
    import xgrammar as xgr

    encoded = [b if b is not None else b"" for b in vocab.token_bytes]
    info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab.vocab_size, stop_token_ids=[vocab.eos_id])
    return xgr.GrammarCompiler(info, max_threads=2)


def schema_regex(schema: Any, whitespace: str = "default") -> str:
    """A JSON schema's regex (a dict, JSON text or a pydantic model), integer bounds kept (outlines-core drops them)."""
    check_choice("whitespace", whitespace, sorted(WHITESPACE))
    try:
        return regex_from_schema(schema, whitespace_pattern=WHITESPACE[whitespace], integer_bounds=True)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"the schema does not compile to a grammar: {exc}") from exc


#: The second byte a lead byte allows where it is not 0x80-0xBF (Unicode's table of well-formed UTF-8).
_SECOND_BYTE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def packed_bits(ids: Sequence[int], V: int) -> np.ndarray:
    """Token ids as a bitmask row in xgrammar's layout, as bytes (bit ``v % 8`` of byte ``v // 8``, whole 32-bit
    words)."""
    row = np.zeros((V + 31) // 32 * 32, dtype=bool)
    row[np.asarray(ids, dtype=np.int64)] = True
    return np.packbits(row, bitorder="little")


@functools.lru_cache(maxsize=4)
def byte_tokens(vocab: pieces.TokenVocabulary) -> dict[int, int]:
    """byte -> the id of the token that is that byte alone, for the bytes that have one."""
    out = {}
    for b in range(256):
        try:
            out[b] = vocab.token_id(bytes([b]))
        except KeyError:
            pass
    return out


def utf8_prefix(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8 or the start of it (the cut tail's second byte is checked here: Python's
    incremental decoder passes ``b"\xed\xa0"``, a surrogate's start)."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError:
        return False
    start = len(data) - 1
    while start > 0 and len(data) - start < 4 and 0x80 <= data[start] <= 0xBF:
        start -= 1
    tail = data[start:]
    if len(tail) >= 2 and tail[0] in _SECOND_BYTE:
        lo, hi = _SECOND_BYTE[tail[0]]
        return lo <= tail[1] <= hi
    return True


def continues_utf8(text: bytes | bytearray, new: int) -> bool:
    """Whether the last ``new`` bytes of ``text`` keep it valid UTF-8 (or its start), the bytes before being so."""
    start = len(text) - new
    if start > 0:
        start -= 1
        back = 0
        while start > 0 and back < 3 and 0x80 <= text[start] <= 0xBF:
            start -= 1
            back += 1
    return utf8_prefix(bytes(text[start:]))


@dataclass
class Grammar:
    """One constraint, compiled for the decode loop: xgrammar's compiled grammar (a :meth:`matcher` per sequence) and
    chapter 1's ``automaton`` (lab/decode/fallback.py's subclass puts one read from xgrammar's matcher there)."""

    name: str
    regex: str
    vocab: pieces.TokenVocabulary
    xgrammar: Any
    automaton: pieces.Automaton
    compile_seconds: dict[str, float]
    #: States where xgrammar also allows tokens that break UTF-8 or lead to a dead end (set by check_agreement).
    utf8_only_states: int = 0
    _allowed: dict[int, Any] = field(default_factory=dict, repr=False)
    _bits: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def from_regex(cls, regex: str, vocab: pieces.TokenVocabulary | None = None, name: str = "",
                   check: bool = True) -> "Grammar":
        """Compile ``regex`` with xgrammar, and chapter 1's automaton of it for steps 2 and 3; ``check`` refuses a
        grammar where the two allow different tokens."""
        if not isinstance(regex, str) or not regex:
            raise ValueError(f"regex must be a non-empty str, got {regex!r}")
        vocab = vocab if vocab is not None else pieces.load_vocabulary("cl100k_base")
        name = name or regex[:40]
        regex = ascii_regex(regex)
        t0 = time.perf_counter()
        try:
            compiled = xgrammar_compiler(vocab).compile_regex(regex)
        except Exception as exc:  # xgrammar raises its own error types
            raise ValueError(f"grammar {name!r}: xgrammar cannot compile its regex: {exc}") from exc
        seconds = {"xgrammar": time.perf_counter() - t0}
        try:
            automaton = pieces.Automaton(regex, vocab, name)
        except ValueError as exc:
            raise ValueError(f"grammar {name!r}: the automaton of chapter 1 cannot be built: {exc}") from exc
        seconds.update(automaton_index=automaton.build_seconds, automaton_jumps=automaton.precompute_seconds)
        grammar = cls(name, regex, vocab, compiled, automaton, seconds)
        if check:
            t0 = time.perf_counter()
            grammar.check_agreement()
            seconds["agreement"] = time.perf_counter() - t0
        return grammar

    @classmethod
    def from_schema(cls, schema: Any, vocab: pieces.TokenVocabulary | None = None, name: str = "",
                    whitespace: str = "default", check: bool = True) -> "Grammar":
        """A JSON schema through outlines' regex of it."""
        check_choice("whitespace", whitespace, sorted(WHITESPACE))
        label = name or (schema.get("title") if isinstance(schema, dict) else None) or "schema"
        try:
            regex = schema_regex(schema, whitespace)
        except ValueError as exc:
            raise ValueError(f"schema {label!r}: {exc}") from exc
        return cls.from_regex(regex, vocab, name or "schema", check)

    @classmethod
    def from_suite(cls, name: str, vocab: pieces.TokenVocabulary | None = None,
                   whitespace: str = "default") -> "Grammar":
        """A grammar of chapter 1's suite, by name (compiled once per process)."""
        return _suite_grammar(name, vocab if vocab is not None else pieces.load_vocabulary("cl100k_base"), whitespace)

    def matcher(self):
        """A fresh xgrammar matcher (one per sequence), able to roll back."""
        import xgrammar as xgr

        return xgr.GrammarMatcher(self.xgrammar, max_rollback_tokens=-1)

    def check_agreement(self) -> int:
        """Check that xgrammar and the automaton allow the same tokens (EOS included) in every reachable state: the
        number of states compared, or ValueError at the first that differs. A depth-first walk of the automaton
        drives one matcher along; its edges are the single-byte tokens (which reach every state) and the tokens
        holding a byte that is none."""
        import xgrammar as xgr

        auto, vocab = self.automaton, self.vocab
        matcher = self.matcher()
        bitmask = xgr.allocate_token_bitmask(1, vocab.vocab_size)
        byte_ids = byte_tokens(vocab)
        # tokens holding a byte that is no token by itself: the only ones a walk over single bytes cannot follow
        odd = [i for i, b in enumerate(vocab.token_bytes) if b and any(c not in byte_ids for c in b)]

        def edges(state: int):
            singles = [byte_ids[b] for b in sorted(auto.fsm.char_out.get(state, {})) if b in byte_ids]
            return singles + [t for t in odd if auto.next(state, t) is not None]

        def compare(state: int, path: list[int]) -> None:
            matcher.fill_next_token_bitmask(bitmask)
            got = bitmask[0].numpy().view(np.uint8)
            want = self.state_words(state)
            if not np.array_equal(got, want):
                bits = np.unpackbits(got, bitorder="little")[:vocab.vocab_size].astype(bool)
                mine = np.unpackbits(want, bitorder="little")[:vocab.vocab_size].astype(bool)
                text = b"".join(vocab.token_bytes[t] for t in path)
                extra = np.flatnonzero(bits & ~mine)
                if not (mine & ~bits).any() and all(not utf8_prefix(text + vocab.token_bytes[t]) or dead_end(t)
                                                    for t in extra):
                    # xgrammar works on bytes: it lets a character be left invalid (a surrogate after 0xED) or
                    # allows a dead end (" \xe0" before a digit), which the automaton does not; a model that picks
                    # such a token stops the loop with an error (never other tokens), so the grammar is kept.
                    self.utf8_only_states += 1
                    return
                only_x = [vocab.show(int(t)) for t in extra[:5]]
                only_a = [vocab.show(int(t)) for t in np.flatnonzero(mine & ~bits)[:5]]
                raise ValueError(
                    f"grammar {self.name!r}: xgrammar and the automaton of chapter 1 allow different tokens after "
                    f"{text!r} (automaton state {state}): only xgrammar allows {only_x}, only the automaton allows "
                    f"{only_a}. The steps would write different tokens; the grammar is refused")

        probe = xgr.allocate_token_bitmask(1, vocab.vocab_size)

        def dead_end(t: int) -> bool:
            """xgrammar allows ``t`` here and nothing after it (its matcher can neither go on nor end)."""
            if not matcher.accept_token(int(t)):
                return True
            matcher.fill_next_token_bitmask(probe)
            stuck = not probe.any().item() and not matcher.is_terminated()
            matcher.rollback(1)
            return stuck

        self.utf8_only_states = 0
        path: list[int] = []
        compare(auto.initial, path)
        seen = {auto.initial}
        stack = [(auto.initial, iter(edges(auto.initial)))]
        while stack:
            state, todo = stack[-1]
            for t in todo:
                nxt = auto.next(state, t)
                if nxt is None or nxt in seen:
                    continue
                seen.add(nxt)
                if not matcher.accept_token(t):
                    text = b"".join(vocab.token_bytes[p] for p in path)
                    raise ValueError(f"grammar {self.name!r}: after {text!r} the automaton of chapter 1 allows "
                                     f"{vocab.show(t)!r} and xgrammar refuses it; the grammar is refused")
                path.append(t)
                compare(nxt, path)
                stack.append((nxt, iter(edges(nxt))))
                break
            else:
                stack.pop()
                if path:
                    matcher.rollback(1)
                    path.pop()
        return len(seen)

    def allowed(self, states: Sequence[int], device) -> Any:
        """Chapter 2's ``AllowedTokens`` of a batch in ``states``, from the sets and packed bits kept per state."""
        sets = [self._state_allowed(s, device) for s in states]
        if len(states) == 1 and states[0] is not None:
            return sets[0]
        mask = torch.cat([a.mask for a in sets])
        bits = np.bitwise_or.reduce(np.stack([self.state_words(s) for s in states]), axis=0)
        union = np.flatnonzero(np.unpackbits(bits, bitorder="little"))
        return pieces.allowed_batch(mask, union, tuple(a.counts[0] for a in sets))

    def _state_allowed(self, state: int | None, device):
        """Chapter 2's allowed set of one state (None: a finished sequence, which allows nothing)."""
        a = self._allowed.get(state)
        if a is None or a.device != torch.device(device):
            ids = self.automaton.allowed_ids(state) if state is not None else np.zeros(0, dtype=np.int64)
            a = self._allowed[state] = pieces.AllowedTokens.from_ids([ids], self.vocab.vocab_size, device=device)
        return a

    def state_words(self, state: int | None) -> np.ndarray:
        """A state's allowed tokens as :func:`packed_bits`: xgrammar's bitmask row on a little-endian host."""
        b = self._bits.get(state)
        if b is None:
            ids = self.automaton.allowed_ids(state) if state is not None else []
            b = self._bits[state] = packed_bits(ids, self.vocab.vocab_size)
        return b


def suite_regex(name: str, whitespace: str = "default") -> str:
    """A suite entry's regex, a JSON entry's with its integer bounds (so that every finished output is valid)."""
    entry = suite_entry(name)
    return schema_regex(entry.schema, whitespace) if entry.kind == "json" else entry.regex(whitespace)


@functools.lru_cache(maxsize=32)
def _suite_grammar(name: str, vocab: pieces.TokenVocabulary, whitespace: str) -> Grammar:
    return Grammar.from_regex(suite_regex(name, whitespace), vocab, name)


def suite_names(kind: str | None = None) -> list[str]:
    """Names of chapter 1's suite entries (``kind``: ``"json"``, ``"regex"`` or None for all)."""
    return [e.name for e in suite() if kind is None or e.kind == kind]


def suite_sample(name: str, seed: int = 0, whitespace: str = "default") -> str:
    """A valid output of a suite entry, drawn with ``seed``."""
    return suite_entry(name).sample(random.Random(f"decode/{name}/{seed}"), whitespace)

