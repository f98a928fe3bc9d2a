"""The automaton of constrained decoding and its two jump tables (:class:`ConstrainedFSM`), and the regex of a JSON
schema (:func:`regex_from_schema`)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from studylog.fsm.vocabulary import TokenVocabulary, byte_vocabulary, load_vocabulary


def ascii_digit_classes(regex: str) -> str:
    """``regex`` with ``\\d`` as ``[0-9]`` (``0-9`` in a class) and ``\\D`` outside a class as ``[^0-9]``: to
    outlines-core ``\\d`` is any Unicode digit, to JSON Schema an ASCII one. ``\\D`` inside a class is refused."""
    if not isinstance(regex, str):
        raise TypeError(f"regex must be a str, got {type(regex).__name__}")
    out, depth = [], 0  # depth: nesting of character classes (Rust's syntax nests them)
    for m in re.finditer(r"\\[\s\S]|\[\^?\]?|[\s\S]", regex):  # an escape, a class's head (a "]" first is literal)
        tok = m.group()
        if tok == "\\d":
            tok = "0-9" if depth else "[0-9]"
        elif tok == "\\D":
            if depth:
                raise ValueError(f"regex has \\D inside a character class at position {m.start()}; "
                                 "ascii_digit_classes cannot rewrite it")
            tok = "[^0-9]"
        elif tok[0] == "[":
            depth += 1
        elif tok == "]" and depth:
            depth -= 1
        out.append(tok)
    return "".join(out)


def schema_json(schema: Any) -> tuple[str, dict]:
    """(JSON text, parsed object) of a schema given as a dict, JSON text, or a class (a pydantic model, dataclass
    or TypedDict, through outlines' ``JsonSchema``). Text that is not JSON, or not an object, raises ValueError."""
    if isinstance(schema, type):
        from outlines.types import JsonSchema

        try:
            text = JsonSchema(schema).schema  # pydantic model, dataclass or TypedDict -> JSON schema text
        except Exception as exc:
            raise ValueError(f"cannot turn {schema.__name__} into a JSON schema: {exc}") from exc
    elif isinstance(schema, dict):
        text = json.dumps(schema)
    elif isinstance(schema, str):
        text = schema
    else:
        raise TypeError(f"schema must be a dict, a JSON string or a pydantic model class, got {type(schema).__name__}")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON schema: not valid JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"invalid JSON schema: expected a JSON object, got {type(parsed).__name__}")
    return text, parsed


def regex_from_schema(schema: Any, whitespace_pattern: Optional[str] = None, *, ascii_digits: bool = True,
                      integer_bounds: bool = False) -> str:
    """The regex outlines builds for a JSON schema (a dict, a JSON string, or a pydantic model class).

    ``whitespace_pattern``: between JSON tokens (None: outlines' ``[ ]?``; ``""``: none). ``ascii_digits`` applies
    :func:`ascii_digit_classes`; ``integer_bounds`` keeps integers' bounds (:mod:`studylog.fsm.ranges`)."""
    import jsonschema
    from outlines_core.json_schema import build_regex_from_schema

    text, parsed = schema_json(schema)
    try:
        jsonschema.validators.validator_for(parsed).check_schema(parsed)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"invalid JSON schema: {exc.message}") from exc
    try:
        if integer_bounds:  # bounded integers become sentinel consts, then their range regexes
            from studylog.fsm.ranges import bound_integers, replace_sentinels

            parsed, mapping = bound_integers(parsed)
            regex = replace_sentinels(build_regex_from_schema(json.dumps(parsed), whitespace_pattern), mapping)
        else:
            regex = build_regex_from_schema(text, whitespace_pattern)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"invalid or unsupported JSON schema: {str(exc).splitlines()[0]}") from exc
    return ascii_digit_classes(regex) if ascii_digits else regex


def end_anchored(regex: str) -> str:
    """``(?:regex)$``: outlines-core's DFA is leftmost-first (Rust's ``regex-automata``), so for ``(a|ab)`` it
    drops the ``ab`` thread once ``a`` matches; anchoring the end drops none and keeps the language."""
    return f"(?:{regex})$"


def _build_index(regex: str, vocabulary, vocab_name: str):
    from outlines_core import Index

    try:
        return Index(end_anchored(regex), vocabulary)
    except ValueError as exc:
        msg = str(exc)
        short = regex if len(regex) <= 80 else regex[:77] + "..."
        if "DFA" in msg or "NFA" in msg or "regex parse" in msg.lower():
            detail = ""
            try:
                re.compile(regex)
            except re.error as py_exc:
                detail = f" (Python's re module says: {py_exc})"
            raise ValueError(f"invalid regex {short!r}: {msg}{detail}") from exc
        if "incompatible" in msg:
            raise ValueError(f"vocabulary {vocab_name!r} cannot write any text matching regex {short!r}: "
                             f"{msg.splitlines()[0]}") from exc
        raise ValueError(f"outlines-core could not index regex {short!r}: {msg}") from exc


@dataclass(frozen=True)
class Jump:
    """A chain of forced steps from one state: the tokens (token level) or bytes it emits, and where it ends."""

    tokens: tuple[int, ...]
    data: bytes
    end: int


def forced_chains(step: dict[int, tuple[tuple[int, ...], bytes, int]]) -> dict[int, Jump]:
    """Forced single steps ``state -> (tokens, bytes, next)`` collapsed into maximal jumps in linear time; a forced
    cycle (no accepting path) is cut where it closes."""
    jumps: dict[int, Jump] = {}
    for start in step:
        if start in jumps:
            continue
        path, on_path, cur = [], set(), start
        while cur in step and cur not in jumps and cur not in on_path:
            on_path.add(cur)
            path.append(cur)
            cur = step[cur][2]
        tail = jumps.get(cur, Jump((), b"", cur))  # a jump starting inside another is its tail
        tokens, data, end = tail.tokens, tail.data, tail.end
        for s in reversed(path):
            t, d, _ = step[s]
            tokens, data = t + tokens, d + data
            jumps[s] = Jump(tokens, data, end)
    return jumps


class ConstrainedFSM:
    """An outlines-core index over a vocabulary and the two jump tables: ``token_jumps`` (step 2: states that allow
    one token; a final state also allows EOS) and ``char_jumps`` (step 3: forced bytes), each timed."""

    def __init__(self, regex: str, vocab: TokenVocabulary, name: str = ""):
        if not isinstance(regex, str):
            raise TypeError(f"regex must be a str, got {type(regex).__name__}")
        if not regex:
            raise ValueError("regex is empty")
        if not isinstance(vocab, TokenVocabulary):
            raise TypeError(f"vocab must be a TokenVocabulary, got {type(vocab).__name__}")
        self.regex, self.vocab, self.name = regex, vocab, name or regex[:40]
        t0 = time.perf_counter()
        self.index = _build_index(regex, vocab.outlines_vocabulary(), vocab.name)
        self.build_seconds = time.perf_counter() - t0
        self._allowed: dict[int, np.ndarray] = {}
        self._count: dict[int, int] = {}
        t0 = time.perf_counter()  # the character-level automaton and both jump tables
        self.initial: int = self.index.get_initial_state()
        self.finals: frozenset[int] = frozenset(self.index.get_final_states())
        byte_index = _build_index(self.regex, byte_vocabulary(), "bytes")
        if byte_index.get_initial_state() != self.initial:  # both number their states as the regex's DFA does
            raise RuntimeError("the byte-level and token-level indexes do not share state ids; "
                               "this outlines-core version numbers states differently")
        #: character-level automaton: state -> {byte: next state}
        self.char_out: dict[int, dict[int, int]] = {
            s: {b: n for b, n in d.items() if b != 256} for s, d in byte_index.get_transitions().items()}
        self.char_finals: frozenset[int] = frozenset(byte_index.get_final_states())

        forced_bytes = {s: next(iter(d.items())) for s, d in self.char_out.items()
                        if len(d) == 1 and s not in self.char_finals}
        self.char_jumps: dict[int, Jump] = forced_chains({s: ((), bytes([b]), n) for s, (b, n) in forced_bytes.items()})

        # With every byte a token, a state allowing exactly one token must have exactly one allowed next
        # byte: any allowed byte is itself an allowed one-byte token. So only those states need a look.
        candidates = forced_bytes if self.vocab.byte_complete else self.char_out
        step = {}
        for s in candidates:
            allowed = None if s in self.finals else self.index.get_allowed_tokens(s)
            if allowed is not None and len(allowed) == 1:
                t = allowed[0]
                step[s] = ((t,), self.vocab.token_bytes[t], self.index.get_next_state(s, t))
        self.token_jumps: dict[int, Jump] = forced_chains(step)
        self.precompute_seconds = time.perf_counter() - t0

    @property
    def states(self) -> list[int]:
        """States of the character-level automaton (a superset of the token-level states)."""
        return sorted(set(self.char_out) | self.char_finals)

    def is_final(self, state: int) -> bool:
        return state in self.finals

    def allowed(self, state: int) -> Int[Tensor, " n"]:
        """Allowed token ids of a state, sorted, EOS included in final states."""
        return torch.from_numpy(self.allowed_array(state).copy())

    def allowed_array(self, state: int) -> np.ndarray:
        """The same ids as :meth:`allowed`, as a cached read-only int64 numpy array (no copy)."""
        if (out := self._allowed.get(state)) is None:
            out = np.sort(np.asarray(self._allowed_ids(state), dtype=np.int64))
            out.flags.writeable = False
            self._allowed[state] = out
            self._count[state] = out.size
        return out

    def n_allowed(self, state: int) -> int:
        """How many tokens a state allows (EOS counts in final states)."""
        if state not in self._count:
            self._count[state] = len(self._allowed_ids(state))
        return self._count[state]

    def _allowed_ids(self, state: int):
        if (ids := self.index.get_allowed_tokens(state)) is None:
            raise ValueError(f"state {state} is not a state of the automaton of {self.name!r}")
        return ids

    def only_eos(self, state: int) -> bool:
        """A final state where nothing but EOS is allowed: decoding stops there without a forward pass."""
        return state in self.finals and self.n_allowed(state) == 1

    def next_state(self, state: int, token_id: int) -> Optional[int]:
        """The state after ``token_id``, None when the token is not allowed (EOS ends decoding: None)."""
        return self.index.get_next_state(state, self.vocab.check_id(token_id))

    def is_allowed(self, state: int, token_id: int) -> bool:
        if token_id == self.vocab.eos_id:
            return state in self.finals
        return self.index.get_next_state(state, token_id) is not None

    def walk(self, ids: Sequence[int], state: Optional[int] = None) -> list[int]:
        """States after each prefix of ``ids`` (``len(ids) + 1`` of them); raises on a disallowed token."""
        states = [self.initial if state is None else state]
        for pos, t in enumerate(ids):
            if (nxt := self.next_state(states[-1], t)) is None:
                raise ValueError(f"token id {t} ({self.vocab.show(t)!r}) at position {pos} is not allowed in "
                                 f"state {states[-1]} of {self.name!r}")
            states.append(nxt)
        return states

    def char_walk(self, text: str | bytes, state: Optional[int] = None) -> Optional[int]:
        """The character-level state after ``text``, None when the automaton rejects it on the way."""
        s = self.initial if state is None else state
        for b in text.encode() if isinstance(text, str) else text:
            if (s := self.char_out.get(s, {}).get(b)) is None:
                return None
        return s

    def matches(self, text: str | bytes) -> bool:
        """True when the automaton accepts ``text`` whole."""
        return self.char_walk(text) in self.char_finals

    def __repr__(self) -> str:
        return (f"ConstrainedFSM({self.name!r}: {len(self.states)} states, {len(self.token_jumps)} token-forced, "
                f"{len(self.char_jumps)} char-forced, index {self.build_seconds:.2f}s, "
                f"jumps {self.precompute_seconds * 1e3:.1f}ms)")


def compile_fsm(regex: str, vocab: Optional[TokenVocabulary] = None, name: str = "") -> ConstrainedFSM:
    """Index ``regex`` over ``vocab`` (default cl100k_base) and precompute its jump tables."""
    return ConstrainedFSM(regex, vocab if vocab is not None else load_vocabulary(), name)
