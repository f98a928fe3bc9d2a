"""Chapter 1: compressing the automaton of constrained decoding.

A constrained decoder walks an automaton built from a regex (or a JSON schema turned into a regex) over
a tokenizer's vocabulary: ``outlines_core.Index`` maps every state to the tokens allowed there. Each
generated token normally costs one forward pass of the model. This module measures how many passes two
compressions save on a real 100k-token BPE vocabulary (cl100k_base, shipped offline by ``bpe-openai``):

* **token-level jumps**: a state whose only allowed token is forced (a final state also allows EOS, so it
  is never forced); chains of forced states collapse into one jump that appends several tokens;
* **character-level jumps with retokenization** (SGLang's compressed FSM): a state whose next *bytes*
  are forced jumps over the whole forced string; the output text is then re-encoded with the tokenizer,
  which can change tokens already emitted and can leave a split the model would not have produced.

:func:`decode` is the decode loop (greedy, any ``next_logits(token_ids)`` callable), :class:`ConstrainedFSM`
holds an index and its precomputed jump tables, :func:`run_suite` measures the suite of
``studylog.fsm_schemas``, and ``python -m studylog.fsm export-masks`` writes ``assets/data/fsm_masks.npz``.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import re
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Optional, Sequence

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from studylog import runtime  # noqa: F401  (package convention: the runtime is selected first)

Mode = Literal["none", "token", "char"]
MODES: tuple[str, ...] = ("none", "token", "char")
#: Published reference point: share of tokens a grammar forces on JSON schemas (MaskBench, llguidance).
MASKBENCH_FORCED_SHARE = (0.13, 0.15)


# --- vocabulary -------------------------------------------------------------------------------------------

class TokenVocabulary:
    """A tokenizer's vocabulary as the automaton sees it: the bytes of every token id, and an EOS id.

    ``token_bytes[i]`` is None for ids that are not text (special tokens, unused ids); the EOS id must be
    one of them. ``encoder`` (text -> ids, the tokenizer's own canonical split) is needed only by the
    character-level compression, which retokenizes.
    """

    def __init__(self, name: str, token_bytes: Sequence[Optional[bytes]], eos_id: Optional[int],
                 encoder: Optional[Callable[[str], list[int]]] = None):
        size = len(token_bytes)
        if eos_id is None:
            raise ValueError(f"vocabulary {name!r} has no EOS token; constrained decoding needs one to end "
                             "generation in a final state")
        if not isinstance(eos_id, int) or not 0 <= eos_id < size:
            raise ValueError(f"EOS token id {eos_id!r} of vocabulary {name!r} is outside the vocabulary [0, {size})")
        if token_bytes[eos_id] is not None:
            raise ValueError(f"EOS token id {eos_id} of vocabulary {name!r} is also a text token "
                             f"({token_bytes[eos_id]!r}); the EOS id must not carry text")
        self.name = name
        self.token_bytes: tuple[Optional[bytes], ...] = tuple(token_bytes)
        self.eos_id = eos_id
        self.encoder = encoder
        self._by_bytes: dict[bytes, int] = {}
        for i, b in enumerate(self.token_bytes):
            if b is not None:
                if not b:
                    raise ValueError(f"token id {i} of vocabulary {name!r} has empty bytes")
                self._by_bytes.setdefault(b, i)
        self._outlines = None

    @property
    def vocab_size(self) -> int:
        """Number of ids (text tokens, EOS and other special or unused ids)."""
        return len(self.token_bytes)

    @property
    def byte_complete(self) -> bool:
        """True when each of the 256 bytes is a token by itself (every byte-level BPE vocabulary is)."""
        return all(bytes([b]) in self._by_bytes for b in range(256))

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"TokenVocabulary({self.name!r}, {self.vocab_size} ids, eos={self.eos_id})"

    def check_id(self, token_id: int, what: str = "token id") -> int:
        """Return ``token_id`` as an int, or raise naming it when it is outside the vocabulary."""
        if isinstance(token_id, Tensor):
            token_id = token_id.item()
        if not isinstance(token_id, (int, np.integer)) or isinstance(token_id, bool):
            raise TypeError(f"{what} must be an int, got {type(token_id).__name__}")
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"{what} {token_id} is outside the vocabulary [0, {self.vocab_size}) of {self.name!r}")
        return int(token_id)

    def token_id(self, data: bytes) -> int:
        """The id of the token whose bytes are exactly ``data``."""
        try:
            return self._by_bytes[data]
        except KeyError:
            raise KeyError(f"{data!r} is not a token of {self.name!r}") from None

    def decode(self, ids: Sequence[int]) -> bytes:
        """The bytes of a token sequence (EOS and other non-text ids are refused)."""
        out = []
        for i in ids:
            i = self.check_id(i)
            b = self.token_bytes[i]
            if b is None:
                raise ValueError(f"token id {i} of {self.name!r} is not a text token (EOS or special)")
            out.append(b)
        return b"".join(out)

    def show(self, token_id: int) -> str:
        """A short printable form of one token: ``'␣"'`` for the two bytes space and quote, ``<EOS>``."""
        token_id = self.check_id(token_id)
        if token_id == self.eos_id:
            return "<EOS>"
        b = self.token_bytes[token_id]
        if b is None:
            return f"<special {token_id}>"
        return b.decode("utf-8", errors="backslashreplace").replace(" ", "␣").replace("\n", "\\n")

    def encode(self, text: str | bytes) -> list[int]:
        """The tokenizer's canonical ids for ``text`` (what the model saw in training)."""
        if self.encoder is None:
            raise ValueError(f"vocabulary {self.name!r} has no encoder; character-level jumps need one to retokenize")
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return list(self.encoder(text))

    def outlines_vocabulary(self):
        """The same vocabulary as an ``outlines_core.Vocabulary`` (built once)."""
        if self._outlines is None:
            from outlines_core import Vocabulary

            mapping: dict[bytes, list[int]] = {}
            for i, b in enumerate(self.token_bytes):
                if b is not None:
                    mapping.setdefault(b, []).append(i)
            self._outlines = Vocabulary(self.eos_id, mapping)
        return self._outlines


@functools.lru_cache(maxsize=4)
def load_vocabulary(name: str = "cl100k_base") -> TokenVocabulary:
    """A real BPE vocabulary that ships inside ``bpe-openai`` (``cl100k_base`` or ``o200k_base``), offline.

    Its EOS is ``<|endoftext|>``; the other special tokens and unused ids carry no text."""
    import bpe_openai

    try:
        enc = bpe_openai.get_encoding(name)
    except Exception as exc:  # the package raises its own error types for unknown names
        raise ValueError(f"unknown encoding {name!r}; bpe-openai offers {bpe_openai.list_encoding_names()}") from exc
    try:
        eos = enc.eot_token
    except KeyError:
        eos = None
    values = enc.token_byte_values()
    token_bytes = [None if (not b or enc.is_special_token(i)) else b for i, b in enumerate(values)]
    return TokenVocabulary(name, token_bytes, eos, encoder=enc.encode_ordinary)


def make_vocabulary(tokens: Mapping[str | bytes, int], eos_id: Optional[int], name: str = "custom",
                    encoder: Optional[Callable[[str], list[int]]] = None) -> TokenVocabulary:
    """A small vocabulary from ``{token text or bytes: id}`` (tests and toy examples). Ids not listed and
    ``eos_id`` carry no text."""
    if eos_id is None:
        raise ValueError(f"vocabulary {name!r} has no EOS token; pass eos_id")
    size = max([*tokens.values(), eos_id]) + 1
    table: list[Optional[bytes]] = [None] * size
    for tok, i in tokens.items():
        if i < 0:
            raise ValueError(f"token id {i} of {tok!r} is negative")
        if i == eos_id:
            raise ValueError(f"EOS token id {eos_id} is also given to the text token {tok!r}")
        table[i] = tok.encode() if isinstance(tok, str) else bytes(tok)
    return TokenVocabulary(name, table, eos_id, encoder)


@functools.lru_cache(maxsize=1)
def _byte_vocabulary():
    """All 256 single bytes (ids 0-255) and an EOS (256): its index is the character-level automaton."""
    from outlines_core import Vocabulary

    return Vocabulary(256, {bytes([b]): [b] for b in range(256)})


# --- regexes and schemas ------------------------------------------------------------------------------

def regex_from_schema(schema: Any, whitespace_pattern: Optional[str] = None) -> str:
    """The regex outlines builds for a JSON schema (a dict, a JSON string, or a pydantic model class).

    ``whitespace_pattern`` is where optional whitespace may go between JSON tokens (outlines' default,
    None, is ``[ ]?``; ``""`` allows none). Invalid JSON or an unsupported schema raises ValueError."""
    from outlines.types import JsonSchema
    from outlines_core.json_schema import build_regex_from_schema

    if isinstance(schema, type):
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
    try:
        import jsonschema

        jsonschema.validators.validator_for(parsed).check_schema(parsed)
    except ImportError:  # pragma: no cover - outlines depends on jsonschema
        pass
    except jsonschema.SchemaError as exc:
        raise ValueError(f"invalid JSON schema: {exc.message}") from exc
    try:
        return build_regex_from_schema(text, whitespace_pattern)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"invalid or unsupported JSON schema: {str(exc).splitlines()[0]}") from exc


def _build_index(regex: str, vocabulary, vocab_name: str):
    from outlines_core import Index

    try:
        return Index(regex, vocabulary)
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


# --- the automaton and its jump tables ------------------------------------------------------------------

@dataclass(frozen=True)
class Jump:
    """A chain of forced steps from one state: the tokens (token level) or bytes it emits, and where it ends."""

    tokens: tuple[int, ...]
    data: bytes
    end: int


def _chains(step: dict[int, tuple[tuple[int, ...], bytes, int]]) -> dict[int, Jump]:
    """Collapse forced single steps ``state -> (tokens, bytes, next)`` into maximal jumps, in O(states +
    total jump length). A cycle of forced states (no way out, so no accepting path) is cut where it closes."""
    jumps: dict[int, Jump] = {}
    for start in step:
        if start in jumps:
            continue
        path, on_path, cur = [], set(), start
        while cur in step and cur not in jumps and cur not in on_path:
            on_path.add(cur)
            path.append(cur)
            cur = step[cur][2]
        if cur in jumps:
            tokens, data, end = jumps[cur].tokens, jumps[cur].data, jumps[cur].end
        else:
            tokens, data, end = (), b"", cur
        for s in reversed(path):
            t, d, _ = step[s]
            tokens, data = t + tokens, d + data
            jumps[s] = Jump(tokens, data, end)
    return jumps


class ConstrainedFSM:
    """An outlines-core index over a vocabulary, plus the two jump tables of the chapter.

    ``build_seconds`` is outlines-core's index build; ``precompute_seconds`` is everything the compressions
    add (the character-level automaton and both jump tables), both measured with ``time.perf_counter``.
    A jump lookup during decoding is one dict lookup.

    The character-level automaton is the index of the same regex over a vocabulary of the 256 single
    bytes. Both indexes number their states with the ids of the same regex DFA, so a state of one is the
    same state of the other (``tests/test_fsm.py`` checks this on the whole suite).
    """

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
        t0 = time.perf_counter()
        self._precompute()
        self.precompute_seconds = time.perf_counter() - t0
        self._allowed: dict[int, np.ndarray] = {}
        self._count: dict[int, int] = {}

    # -- precompute ---------------------------------------------------------------------------------
    def _precompute(self) -> None:
        self.initial: int = self.index.get_initial_state()
        self.finals: frozenset[int] = frozenset(self.index.get_final_states())
        byte_index = _build_index(self.regex, _byte_vocabulary(), "bytes")
        if byte_index.get_initial_state() != self.initial:
            raise RuntimeError("the byte-level and token-level indexes do not share state ids; "
                               "this outlines-core version numbers states differently")
        #: character-level automaton: state -> {byte: next state}
        self.char_out: dict[int, dict[int, int]] = {
            s: {b: n for b, n in d.items() if b != 256} for s, d in byte_index.get_transitions().items()}
        self.char_finals: frozenset[int] = frozenset(byte_index.get_final_states())

        forced_bytes = {s: next(iter(d.items())) for s, d in self.char_out.items()
                        if len(d) == 1 and s not in self.char_finals}
        self.char_jumps: dict[int, Jump] = _chains({s: ((), bytes([b]), n) for s, (b, n) in forced_bytes.items()})

        # With every byte a token, a state allowing exactly one token must have exactly one allowed next
        # byte: any allowed byte is itself an allowed one-byte token. So only those states need a look.
        candidates = forced_bytes if self.vocab.byte_complete else self.char_out
        step = {}
        for s in candidates:
            if s in self.finals:
                continue
            allowed = self.index.get_allowed_tokens(s)
            if allowed is not None and len(allowed) == 1:
                t = allowed[0]
                step[s] = ((t,), self.vocab.token_bytes[t], self.index.get_next_state(s, t))
        self.token_jumps: dict[int, Jump] = _chains(step)

    # -- queries ---------------------------------------------------------------------------------------
    @property
    def states(self) -> list[int]:
        """States of the character-level automaton (a superset of the token-level states)."""
        return sorted(set(self.char_out) | self.char_finals)

    def is_final(self, state: int) -> bool:
        return state in self.finals

    def allowed(self, state: int) -> Int[Tensor, " n"]:
        """Allowed token ids of a state, sorted, EOS included in final states."""
        return torch.from_numpy(self._allowed_np(state).copy())

    def _allowed_np(self, state: int) -> np.ndarray:
        out = self._allowed.get(state)
        if out is None:
            ids = self.index.get_allowed_tokens(state)
            if ids is None:
                raise ValueError(f"state {state} is not a state of the automaton of {self.name!r}")
            out = np.sort(np.asarray(ids, dtype=np.int64))
            self._allowed[state] = out
            self._count[state] = out.size
        return out

    def n_allowed(self, state: int) -> int:
        """How many tokens a state allows (EOS counts in final states)."""
        n = self._count.get(state)
        if n is None:
            ids = self.index.get_allowed_tokens(state)
            if ids is None:
                raise ValueError(f"state {state} is not a state of the automaton of {self.name!r}")
            n = self._count[state] = len(ids)
        return n

    def only_eos(self, state: int) -> bool:
        """A final state where nothing but EOS is allowed: decoding stops there without a forward pass."""
        return state in self.finals and self.n_allowed(state) == 1

    def next_state(self, state: int, token_id: int) -> Optional[int]:
        """The state after ``token_id``, None when the token is not allowed (EOS ends decoding: None)."""
        token_id = self.vocab.check_id(token_id)
        return self.index.get_next_state(state, token_id)

    def is_allowed(self, state: int, token_id: int) -> bool:
        if token_id == self.vocab.eos_id:
            return state in self.finals
        return self.index.get_next_state(state, token_id) is not None

    def walk(self, ids: Sequence[int], state: Optional[int] = None) -> list[int]:
        """States after each prefix of ``ids`` (``len(ids) + 1`` of them); raises on a disallowed token."""
        states = [self.initial if state is None else state]
        for pos, t in enumerate(ids):
            nxt = self.next_state(states[-1], t)
            if nxt is None:
                raise ValueError(f"token id {t} ({self.vocab.show(t)!r}) at position {pos} is not allowed in "
                                 f"state {states[-1]} of {self.name!r}")
            states.append(nxt)
        return states

    def char_walk(self, text: str | bytes, state: Optional[int] = None) -> Optional[int]:
        """The character-level state after ``text``, None when the automaton rejects it on the way."""
        data = text.encode() if isinstance(text, str) else text
        s = self.initial if state is None else state
        for b in data:
            s = self.char_out.get(s, {}).get(b)
            if s is None:
                return None
        return s

    def matches(self, text: str | bytes) -> bool:
        """True when the automaton accepts ``text`` whole."""
        s = self.char_walk(text)
        return s is not None and s in self.char_finals

    def __repr__(self) -> str:
        return (f"ConstrainedFSM({self.name!r}: {len(self.states)} states, {len(self.token_jumps)} token-forced, "
                f"{len(self.char_jumps)} char-forced, index {self.build_seconds:.2f}s, "
                f"jumps {self.precompute_seconds * 1e3:.1f}ms)")


def compile_fsm(regex: str, vocab: Optional[TokenVocabulary] = None, name: str = "") -> ConstrainedFSM:
    """Index ``regex`` over ``vocab`` (default cl100k_base) and precompute its jump tables."""
    return ConstrainedFSM(regex, vocab if vocab is not None else load_vocabulary(), name)


# --- the decode loop ---------------------------------------------------------------------------------------

NextLogits = Callable[[list[int]], Float[Tensor, " vocab"]]


@dataclass
class Step:
    """One event of a decode: a forward pass that picked ``tokens[0]``, a token jump, a character jump
    (``dropped`` tokens already emitted were replaced by retokenization), or the end."""

    kind: Literal["pass", "token-jump", "char-jump", "eos", "end"]
    tokens: tuple[int, ...] = ()
    data: bytes = b""
    dropped: int = 0


@dataclass
class DecodeResult:
    ids: list[int]
    text: bytes
    forward_passes: int
    finished: bool                 # reached EOS (or a state where only EOS is allowed)
    jumped_tokens: int = 0         # tokens appended without a forward pass (after retokenization in char mode)
    jumped_bytes: int = 0          # bytes emitted by character jumps
    retokenized: int = 0           # tokens already emitted that a retokenization replaced (KV entries to redo)
    skipped_jumps: int = 0         # character jumps not taken because the text ended inside a UTF-8 character
    steps: list[Step] = field(default_factory=list)


def _check_logits(logits: Any, vocab_size: int) -> Tensor:
    if not isinstance(logits, Tensor):
        raise TypeError(f"next_logits must return a torch.Tensor, got {type(logits).__name__}")
    if logits.ndim != 1 or logits.shape[0] != vocab_size:
        raise ValueError(f"next_logits must return logits of shape ({vocab_size},) (the vocabulary size), "
                         f"got {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"next_logits must return floating-point logits, got {logits.dtype}")
    return logits


def _greedy(fsm: ConstrainedFSM, state: int, logits: Tensor) -> int:
    """argmax over the allowed tokens, ties to the lowest id (numpy: no thread pool for one small vector)."""
    values = logits.detach().to("cpu", torch.float32).numpy()
    best = int(np.argmax(values))  # first maximum = lowest id; if it is allowed it wins the masked argmax too
    if fsm.is_allowed(state, best):
        return best
    allowed = fsm._allowed_np(state)
    return int(allowed[np.argmax(values[allowed])])


def decode(next_logits: NextLogits, fsm: ConstrainedFSM, mode: Mode = "none", *, max_tokens: int = 256,
           record_steps: bool = False) -> DecodeResult:
    """Greedy constrained decoding; returns the ids, the text and the number of forward passes.

    ``next_logits(ids)`` is one forward pass: the logits of the token after ``ids`` (shape ``[vocab]``).
    ``mode``: ``"none"`` (one pass per token), ``"token"`` (forced token chains appended without a pass; the
    result is the same tokens as ``"none"``), ``"char"`` (forced strings appended, the text retokenized;
    the result still matches the regex, possibly with other tokens). A pass after a jump feeds the jumped
    tokens to the model together, as a chunked prefill does; it still counts as one pass.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not isinstance(fsm, ConstrainedFSM):
        raise TypeError(f"fsm must be a ConstrainedFSM, got {type(fsm).__name__}")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
    vocab = fsm.vocab
    if mode == "char" and vocab.encoder is None:
        raise ValueError(f"mode='char' retokenizes, and vocabulary {vocab.name!r} has no encoder")

    ids: list[int] = []
    states = [fsm.initial]
    text = bytearray()
    res = DecodeResult(ids, b"", 0, False)

    def log(step: Step) -> None:
        if record_steps:
            res.steps.append(step)

    while len(ids) < max_tokens:
        state = states[-1]
        if fsm.only_eos(state):
            res.finished = True
            log(Step("end"))
            break
        if mode == "token":
            jump = fsm.token_jumps.get(state)
            if jump is not None:
                ids.extend(jump.tokens)
                states.extend(fsm.walk(jump.tokens, state)[1:])
                text += jump.data
                res.jumped_tokens += len(jump.tokens)
                log(Step("token-jump", jump.tokens, jump.data))
                continue
        elif mode == "char":
            jump = fsm.char_jumps.get(state)
            if jump is not None:
                new_text = bytes(text) + jump.data
                try:
                    new_ids = vocab.encode(new_text.decode("utf-8"))
                except UnicodeDecodeError:
                    new_ids = None  # the model stopped inside a multi-byte character: retokenizing is ill-defined
                if new_ids is None:
                    res.skipped_jumps += 1
                else:
                    keep = 0
                    while keep < min(len(ids), len(new_ids)) and ids[keep] == new_ids[keep]:
                        keep += 1
                    new_states = states[:keep + 1] + fsm.walk(new_ids[keep:], states[keep])[1:]
                    if new_states[-1] != jump.end:
                        raise RuntimeError(f"retokenized text ends in state {new_states[-1]}, the jump in {jump.end}")
                    res.retokenized += len(ids) - keep
                    res.jumped_tokens += len(new_ids) - keep
                    res.jumped_bytes += len(jump.data)
                    log(Step("char-jump", tuple(new_ids[keep:]), jump.data, dropped=len(ids) - keep))
                    ids[:] = new_ids
                    states = new_states
                    text = bytearray(new_text)
                    continue
        logits = _check_logits(next_logits(list(ids)), vocab.vocab_size)
        res.forward_passes += 1
        tok = _greedy(fsm, state, logits)
        if tok == vocab.eos_id:
            res.finished = True
            log(Step("eos", (tok,)))
            break
        ids.append(tok)
        states.append(fsm.index.get_next_state(state, tok))
        text += vocab.token_bytes[tok]
        log(Step("pass", (tok,), vocab.token_bytes[tok]))
    res.text = bytes(text)
    return res


# --- two deterministic "models" -----------------------------------------------------------------------------

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


def writer_model(vocab: TokenVocabulary, text: str) -> NextLogits:
    """A model that writes ``text`` the way the tokenizer splits it: it puts all its mass on the next
    canonical token. When a retokenization leaves the output between canonical boundaries, it writes the
    canonical split of the rest of the current canonical token, then continues canonically."""
    target = text.encode()
    canon = vocab.encode(text)
    starts: dict[int, int] = {}
    pos = 0
    for i, t in enumerate(canon):
        starts[pos] = i
        pos += len(vocab.token_bytes[t])
    bounds = sorted(starts) + [len(target)]

    def next_logits(ids: list[int]) -> Float[Tensor, " vocab"]:
        done = vocab.decode(ids)
        if not target.startswith(done):
            raise RuntimeError(f"the output {done!r} left the target text {target!r}")
        n = len(done)
        if n == len(target):
            pick = vocab.eos_id
        elif n in starts:
            pick = canon[starts[n]]
        else:
            nxt = next(b for b in bounds if b > n)
            try:
                pick = vocab.encode(target[n:nxt].decode("utf-8"))[0]
            except UnicodeDecodeError:
                pick = vocab.token_id(target[n:n + 1])
        logits = np.zeros(vocab.vocab_size, dtype=np.float32)
        logits[pick] = 1.0
        return torch.from_numpy(logits)

    return next_logits


# --- the suite ---------------------------------------------------------------------------------------------

@dataclass
class EntryResult:
    """Measurements of one suite entry under one whitespace pattern."""

    name: str
    kind: str
    whitespace: str
    regex_chars: int
    states: int
    build_seconds: float
    precompute_seconds: float
    token_forced_states: int
    char_forced_states: int
    samples: int
    tokens: int                     # canonical tokens of the samples (EOS not counted)
    passes: dict[str, int]          # forward passes per mode
    jumped_tokens: dict[str, int]
    retokenized: int                # char mode: emitted tokens replaced by retokenization
    noncanonical: int               # char mode: samples whose final ids differ from the canonical split
    visited: dict[int, int] = field(default_factory=dict, repr=False)  # state -> allowed tokens (none mode)

    @property
    def source(self) -> str:
        return self.name if self.whitespace == "default" else f"{self.name}[{self.whitespace}]"

    def saved(self, mode: str) -> float:
        """Share of forward passes a mode saves over no compression."""
        return 1.0 - self.passes[mode] / self.passes["none"]


def measure_entry(entry, vocab: TokenVocabulary, whitespace: str = "default", n_samples: int = 8, seed: int = 0,
                  fsm: Optional[ConstrainedFSM] = None) -> tuple[EntryResult, ConstrainedFSM]:
    """Sample ``n_samples`` valid outputs of a suite entry; decode each with the writer model in the three
    modes; check that every mode writes the sample exactly; count passes."""
    regex = entry.regex(whitespace)
    fsm = fsm or ConstrainedFSM(regex, vocab, name=entry.name)
    rng = random.Random(f"{seed}/{entry.name}/{whitespace}")
    passes = dict.fromkeys(MODES, 0)
    jumped = dict.fromkeys(MODES, 0)
    tokens = retok = noncanonical = 0
    visited: dict[int, int] = {}
    for _ in range(n_samples):
        sample = entry.sample(rng, whitespace)
        canon = vocab.encode(sample)
        tokens += len(canon)
        for mode in MODES:
            out = decode(writer_model(vocab, sample), fsm, mode, max_tokens=4 * len(canon) + 8)
            if not out.finished or out.text != sample.encode():
                raise RuntimeError(f"{entry.name} [{whitespace}] {mode}: wrote {out.text!r}, expected {sample!r}")
            passes[mode] += out.forward_passes
            jumped[mode] += out.jumped_tokens
            if mode == "none":
                for s in fsm.walk(out.ids):
                    visited[s] = fsm.n_allowed(s)
            if mode == "char":
                retok += out.retokenized
                noncanonical += out.ids != canon
    result = EntryResult(entry.name, entry.kind, whitespace, len(regex), len(fsm.states), fsm.build_seconds,
                         fsm.precompute_seconds, len(fsm.token_jumps), len(fsm.char_jumps), n_samples, tokens,
                         passes, jumped, retok, noncanonical, visited)
    return result, fsm


def run_suite(vocab: Optional[TokenVocabulary] = None, whitespaces: Sequence[str] = ("default", "compact"),
              n_samples: int = 8, seed: int = 0, keep: Optional[Callable[[EntryResult, ConstrainedFSM], None]] = None,
              progress: bool = False) -> list[EntryResult]:
    """Measure every suite entry (JSON entries once per whitespace pattern, regex entries once).

    ``keep(result, fsm)`` is called while each automaton is alive (for example to copy masks out); the
    automata are then dropped, so memory holds one index at a time."""
    from studylog import fsm_schemas

    vocab = vocab or load_vocabulary()
    jobs = [(e, ws) for ws in whitespaces for e in fsm_schemas.suite() if e.kind == "json" or ws == whitespaces[0]]
    if progress:
        from tqdm.auto import tqdm

        jobs = tqdm(jobs, desc="suite")
    results = []
    for e, ws in jobs:
        res, fsm = measure_entry(e, vocab, ws, n_samples, seed)
        if keep is not None:
            keep(res, fsm)
        results.append(res)
        del fsm
    return results


def savings_table(results: Sequence[EntryResult]) -> str:
    """A Markdown table of the suite: sizes, index build vs precompute time, passes and savings."""
    head = ("| entry | whitespace | states | index build (s) | jump precompute (ms) | tokens | passes: none "
            "| passes: token jumps | passes: char jumps | saved (token) | saved (char) | retokenized tokens |")
    lines = [head, "|" + "---|" * 12]
    for r in results:
        lines.append(f"| {r.name} | {r.whitespace if r.kind == 'json' else '–'} | {r.states} | {r.build_seconds:.2f} "
                     f"| {r.precompute_seconds * 1e3:.1f} | {r.tokens} | {r.passes['none']} | {r.passes['token']} "
                     f"| {r.passes['char']} | {100 * r.saved('token'):.1f}% | {100 * r.saved('char'):.1f}% "
                     f"| {r.retokenized} |")
    for ws in dict.fromkeys(r.whitespace for r in results):
        rows = [r for r in results if r.whitespace == ws]
        none = sum(r.passes["none"] for r in rows)
        lines.append(f"| **all ({ws})** | | | {sum(r.build_seconds for r in rows):.2f} "
                     f"| {sum(r.precompute_seconds for r in rows) * 1e3:.1f} | {sum(r.tokens for r in rows)} | {none} "
                     f"| {sum(r.passes['token'] for r in rows)} | {sum(r.passes['char'] for r in rows)} "
                     f"| {100 * (1 - sum(r.passes['token'] for r in rows) / none):.1f}% "
                     f"| {100 * (1 - sum(r.passes['char'] for r in rows) / none):.1f}% "
                     f"| {sum(r.retokenized for r in rows)} |")
    return "\n".join(lines)


# --- mask export ------------------------------------------------------------------------------------------

def select_masks(counts: Sequence[tuple[str, int, int]], per_bin: int = 24, max_ids: int = 450_000,
                 seed: int = 0) -> list[tuple[str, int, int]]:
    """Pick masks spanning the distribution of allowed-token counts: up to ``per_bin`` from each power-of-two
    bin of counts, at most ``max_ids`` ids in all (large masks dominate the file), chosen at random."""
    rng = random.Random(seed)
    bins: dict[int, list] = {}
    for item in sorted(set(counts)):
        bins.setdefault(int(np.log2(item[2])), []).append(item)
    chosen = []
    for b in sorted(bins):
        pool = bins[b]
        chosen += rng.sample(pool, min(per_bin, len(pool)))
    chosen.sort(key=lambda x: x[2])
    total, picked = 0, []
    for item in chosen:  # smallest first: the dense end is thinned when the budget runs out
        if total + item[2] > max_ids:
            continue
        picked.append(item)
        total += item[2]
    return picked


def export_masks(path: Optional[Path] = None, n_samples: int = 8, seed: int = 0, per_bin: int = 24,
                 max_ids: int = 450_000) -> Path:
    """Write real grammar masks (cl100k_base, states visited by the suite) in ``studylog.data``'s format.

    Deterministic: same suite, same samples, same selection. Command: ``python -m studylog.fsm export-masks``."""
    from studylog import data

    path = Path(path) if path is not None else data.MASKS_FILE
    vocab = load_vocabulary()
    grabbed: dict[tuple[str, int], np.ndarray] = {}
    all_counts: list[tuple[str, int, int]] = []

    def keep(res: EntryResult, fsm: ConstrainedFSM) -> None:
        # the selection needs every count first, so copy out all visited masks up to the largest size kept
        for s, n in res.visited.items():
            all_counts.append((res.source, s, n))
            grabbed[(res.source, s)] = fsm._allowed_np(s).astype(np.int32)

    run_suite(vocab, n_samples=n_samples, seed=seed, keep=keep)
    picked = select_masks(all_counts, per_bin=per_bin, max_ids=max_ids, seed=seed)
    masks = [grabbed[(src, s)] for src, s, _ in picked]
    return data.save_masks(path, masks, [s for _, s, _ in picked], [src for src, _, _ in picked],
                           vocab.vocab_size, vocab.name)


# --- tables for the notebook -------------------------------------------------------------------------------

def _md(text: str) -> str:
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def state_table(fsm: ConstrainedFSM, max_tokens: int = 8) -> str:
    """Markdown: each state (in order of distance from the start), its allowed tokens, forced or not."""
    order, seen, frontier = [], {fsm.initial}, [fsm.initial]
    while frontier:
        nxt = []
        for s in frontier:
            order.append(s)
            for t in fsm.index.get_allowed_tokens(s) or []:
                n = fsm.index.get_next_state(s, t)
                if n is not None and n not in seen:
                    seen.add(n)
                    nxt.append(n)
        frontier = sorted(nxt)
    lines = ["| state | final | allowed | tokens | token jump from here |", "|---|---|---|---|---|"]
    for s in order:
        ids = fsm.allowed(s).tolist()
        shown = ", ".join(_md(fsm.vocab.show(t)) for t in sorted(ids, key=lambda t: fsm.vocab.show(t))[:max_tokens])
        if len(ids) > max_tokens:
            shown += f", … (+{len(ids) - max_tokens})"
        jump = fsm.token_jumps.get(s)
        jump_txt = " ".join(_md(fsm.vocab.show(t)) for t in jump.tokens) + f" → {jump.end}" if jump else ""
        lines.append(f"| {s} | {'yes' if fsm.is_final(s) else ''} | {len(ids)} | {shown} | {jump_txt} |")
    return "\n".join(lines)


def steps_table(result: DecodeResult, vocab: TokenVocabulary) -> str:
    """Markdown: the events of a decode recorded with ``record_steps=True``."""
    lines = ["| # | event | tokens appended | replaced tokens | passes so far |", "|---|---|---|---|---|"]
    passes = 0
    for i, s in enumerate(result.steps):
        passes += s.kind in ("pass", "eos")
        toks = " ".join(_md(vocab.show(t)) for t in s.tokens)
        lines.append(f"| {i} | {s.kind} | {toks} | {s.dropped or ''} | {passes} |")
    return "\n".join(lines)


# --- figures --------------------------------------------------------------------------------------------

def _label(items: list[str], max_items: int) -> str:
    shown = items[:max_items]
    more = len(items) - len(shown)
    return "\n".join(shown) + (f"\n+{more} more" if more > 0 else "")


def automaton_graph(fsm: ConstrainedFSM, level: Literal["token", "char"] = "token", compressed: bool = False,
                    max_edges: int = 5000):
    """The automaton as a ``networkx.DiGraph`` (EOS edges left out; ``final``/``initial`` node flags).

    Edges with the same ends are merged: ``labels`` lists what each writes, ``nbytes`` how many bytes the
    longest writes, ``jump`` whether a forced jump is part of it. Compressed, a forced chain is folded into
    the edge that reaches it: the label ``N[A"]`` means "a pass picks ``N``, then ``A"`` is appended without
    one"."""
    import networkx as nx

    vocab = fsm.vocab
    jumps = fsm.token_jumps if level == "token" else fsm.char_jumps
    if level == "token":
        trans, n_edges = {}, 0
        for s in fsm.states:
            ids = fsm.index.get_allowed_tokens(s) or []
            n_edges += len(ids)
            if n_edges > max_edges:
                raise ValueError(f"{fsm.name!r} has more than {max_edges} token edges; too many to draw")
            trans[s] = {t: fsm.index.get_next_state(s, t) for t in ids if t != vocab.eos_id}
        text = {s: {t: (vocab.show(t), len(vocab.token_bytes[t])) for t in d} for s, d in trans.items()}
    else:
        trans = fsm.char_out
        text = {s: {b: (bytes([b]).decode("latin-1").replace(" ", "␣"), 1) for b in d} for s, d in trans.items()}

    def jump_text(j: Jump) -> str:
        if level == "token":
            return "·".join(vocab.show(t) for t in j.tokens)
        return j.data.decode("utf-8", errors="backslashreplace").replace(" ", "␣")

    g = nx.DiGraph()
    todo, seen = [fsm.initial], {fsm.initial}
    while todo:
        u = todo.pop()
        g.add_node(u, final=u in fsm.finals, initial=u == fsm.initial)
        if compressed and u in jumps:  # only the start state can be forced and still be drawn
            j = jumps[u]
            edges = [(j.end, f"[{jump_text(j)}]", len(j.data), True)]
        else:
            edges = []
            for key, v in trans.get(u, {}).items():
                lab, nb = text[u][key]
                if compressed and v in jumps:
                    j = jumps[v]
                    edges.append((j.end, f"{lab}[{jump_text(j)}]", nb + len(j.data), True))
                else:
                    edges.append((v, lab, nb, False))
        for v, lab, nb, is_jump in edges:
            if g.has_edge(u, v):
                d = g.edges[u, v]
                d["labels"].append(lab)
                d["nbytes"] = max(d["nbytes"], nb)
                d["jump"] = d["jump"] or is_jump
            else:
                g.add_edge(u, v, labels=[lab], nbytes=nb, jump=is_jump)
            if v not in seen:
                seen.add(v)
                todo.append(v)
    for *_, d in g.edges(data=True):
        d["labels"].sort(key=lambda x: (len(x), x))
    return g


def _layout(g, initial: int, by_bytes: bool = True) -> dict[int, tuple[float, float]]:
    """x: the longest distance from the start, in bytes (a token spans as many columns as it has bytes)
    or in edges; y: states of a column ordered by the mean height of their predecessors. Falls back to
    hop counts when the graph has cycles."""
    import networkx as nx

    dag = nx.DiGraph((u, v, d) for u, v, d in g.edges(data=True) if u != v)
    dag.add_nodes_from(g.nodes)
    if nx.is_directed_acyclic_graph(dag):
        x = {n: 0 for n in g.nodes}
        for n in nx.topological_sort(dag):
            for _, v, d in dag.out_edges(n, data=True):
                x[v] = max(x[v], x[n] + (d["nbytes"] if by_bytes else 1))
    else:
        x = dict(nx.single_source_shortest_path_length(dag, initial))
        for n in g.nodes:
            x.setdefault(n, max(x.values()) + 1)
    y: dict[int, float] = {}
    for col in sorted(set(x.values())):
        nodes = [n for n in g.nodes if x[n] == col]
        def key(n):
            ys = [y[p] for p in g.predecessors(n) if p in y]
            return (-(sum(ys) / len(ys)) if ys else 0.0, n)  # highest predecessors first (top)
        nodes.sort(key=key)
        for i, n in enumerate(nodes):
            y[n] = 1.25 * ((len(nodes) - 1) / 2 - i)
    return {n: (float(x[n]), y[n]) for n in g.nodes}


def _passes_near(pos: dict, u: int, v: int, dist: float) -> bool:
    """Whether the segment from u to v passes within ``dist`` of a third state."""
    (x0, y0), (x1, y1) = pos[u], pos[v]
    dx, dy = x1 - x0, y1 - y0
    length2 = dx * dx + dy * dy
    for n, (x, y) in pos.items():
        if n in (u, v) or length2 == 0:
            continue
        t = ((x - x0) * dx + (y - y0) * dy) / length2
        if 0 < t < 1 and (x0 + t * dx - x) ** 2 + (y0 + t * dy - y) ** 2 < dist * dist:
            return True
    return False


def draw_automaton(fsm: ConstrainedFSM, level: Literal["token", "char"] = "token", compressed: bool = False,
                   ax=None, max_labels: int = 4, title: Optional[str] = None):
    """Draw the automaton with matplotlib only (renders offline). States sit at their distance in bytes
    from the start (in edges when compressed); forced jumps are orange; final states have a double ring."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Circle, FancyArrowPatch

    g = automaton_graph(fsm, level, compressed)
    pos = _layout(g, fsm.initial, by_bytes=not compressed)
    if compressed:
        pos = {n: (2.0 * x, y) for n, (x, y) in pos.items()}  # room for the longer labels
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    span_x, span_y = max(xs) - min(xs) + 1, max(ys) - min(ys) + 1
    ax = ax or plt.subplots(figsize=(min(16, 1.6 + 1.45 * span_x), 2.0 + 1.1 * span_y))[1]
    sx = 1.0  # one byte = one unit
    r = 0.22
    order = sorted(g.nodes, key=lambda n: (pos[n][0], -pos[n][1]))
    names = {n: f"q{i}" for i, n in enumerate(order)}
    for n in g.nodes:
        x, y = pos[n]
        ax.add_patch(Circle((x * sx, y), r, fc="#e8eef7", ec="#33414f", lw=1.2, zorder=3))
        if g.nodes[n]["final"]:
            ax.add_patch(Circle((x * sx, y), r * 0.8, fc="none", ec="#33414f", lw=1.0, zorder=4))
        ax.text(x * sx, y, names[n], ha="center", va="center", fontsize=8.5, zorder=5)
    label_ys: list[float] = []
    for k, (u, v, d) in enumerate(g.edges(data=True)):
        (x0, y0), (x1, y1) = pos[u], pos[v]
        color = "#d9730d" if d["jump"] else "#33414f"
        if u == v:
            rad, frac = 0.0, 0.5
            patch = FancyArrowPatch((x0 * sx - 0.1, y0 + r), (x0 * sx + 0.1, y0 + r), connectionstyle="arc3,rad=-2.5",
                                    arrowstyle="-|>", mutation_scale=10, color=color, lw=1.0)
            lx, ly = x0 * sx, y0 + r + 0.35
        else:
            dx, dy = (x1 - x0) * sx, y1 - y0
            rad = 0.0
            if g.has_edge(v, u):
                rad = 0.25
            elif _passes_near(pos, u, v, r * 1.5):  # a straight line would run through another state:
                rad = -0.3 if (y0 + y1) / 2 >= 0 else 0.3  # bend away from the middle (arc3: rad < 0 bends up)
                if dx < 0:
                    rad = -rad
            patch = FancyArrowPatch((x0 * sx, y0), (x1 * sx, y1), connectionstyle=f"arc3,rad={rad}",
                                    arrowstyle="-|>", mutation_scale=11, color=color, lw=1.9 if d["jump"] else 1.1,
                                    shrinkA=r * 72 * 0.9, shrinkB=r * 72 * 0.9)
            if rad:  # the middle of matplotlib's arc3 curve
                lx, ly = x0 * sx + dx / 2 + rad * dy / 2, y0 + dy / 2 - rad * dx / 2
            else:
                frac = 0.5 if abs(dx) <= 1.5 else 0.32 + 0.36 * ((k * 0.618) % 1.0)
                lx, ly = x0 * sx + frac * dx, y0 + frac * dy
        patch.set_zorder(2)
        ax.add_patch(patch)
        label_ys.append(ly)
        ax.text(lx, ly, _label(d["labels"], max_labels), fontsize=7.5, ha="center", va="center", color=color,
                family="monospace", zorder=6,
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec=color, lw=0.5, alpha=0.92))
    x0, y0 = pos[fsm.initial]
    ax.annotate("", xy=(x0 * sx - r, y0), xytext=(x0 * sx - r - 0.45, y0),
                arrowprops=dict(arrowstyle="-|>", lw=1.2, color="#33414f"))
    ax.set_xlim(min(xs) * sx - 0.9, max(xs) * sx + 0.6)
    ax.set_ylim(min(ys + label_ys) - 0.7, max(ys + label_ys) + 0.8)
    ax.set_aspect("equal")
    ax.set_axis_off()
    kind = {"token": "token-level", "char": "character-level"}[level]
    ax.set_title(title or f"{kind} automaton{' (compressed)' if compressed else ''}: {fsm.name}", fontsize=10)
    return ax


def plot_savings(results: Sequence[EntryResult], ax=None, title: Optional[str] = None):
    """Share of forward passes saved per suite entry, token-level vs character-level, both whitespace
    patterns, with the MaskBench reference band."""
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r.name for r in results))
    rows = {(r.name, r.whitespace): r for r in results}
    wss = list(dict.fromkeys(r.whitespace for r in results))
    series = [(ws, mode) for ws in wss for mode in ("token", "char")]
    ax = ax or plt.subplots(figsize=(10, 4.2))[1]
    width = 0.8 / len(series)
    colors = {("default", "token"): "#9ecae1", ("default", "char"): "#3182bd",
              ("compact", "token"): "#fdae6b", ("compact", "char"): "#e6550d"}
    for k, (ws, mode) in enumerate(series):
        xs, ys = [], []
        for i, n in enumerate(names):
            r = rows.get((n, ws))
            if r is None:  # regex entries have no whitespace variants
                continue
            xs.append(i + (k - (len(series) - 1) / 2) * width)
            ys.append(100 * r.saved(mode))
        ax.bar(xs, ys, width, label=f"{mode}-level jumps, {ws} whitespace", color=colors.get((ws, mode)))
    lo, hi = MASKBENCH_FORCED_SHARE
    ax.axhspan(100 * lo, 100 * hi, color="#2ca02c", alpha=0.15, label="MaskBench: 13–15% of tokens forced")
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("forward passes saved (%)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(title or "Forward passes saved by FSM compression (cl100k_base, greedy writer model)", fontsize=10)
    return ax


def plot_mask_counts(counts: Sequence[int], vocab_size: int, ax=None, title: Optional[str] = None):
    """Histogram (log-spaced bins) of allowed tokens per visited state, with the cumulative share."""
    import matplotlib.pyplot as plt

    counts = np.asarray(counts)
    ax = ax or plt.subplots(figsize=(8, 4))[1]
    bins = np.logspace(0, np.log10(vocab_size), 26)
    ax.hist(counts, bins=bins, color="#3182bd", alpha=0.85)
    ax.set_xscale("log")
    ax.set_xlabel(f"allowed tokens in the state (of {vocab_size:,})")
    ax.set_ylabel("visited states")
    ax.grid(True, which="both", alpha=0.3)
    twin = ax.twinx()
    xs = np.sort(counts)
    twin.plot(xs, np.arange(1, len(xs) + 1) / len(xs), color="#e6550d", lw=1.5)
    twin.set_ylabel("cumulative share of states", color="#e6550d")
    twin.set_ylim(0, 1.02)
    ax.set_title(title or "How sparse constrained-decoding masks are", fontsize=10)
    return ax


# --- command line -----------------------------------------------------------------------------------------

def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studylog.fsm", description="Chapter 1 (FSM compression) tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export-masks", help="write assets/data/fsm_masks.npz from the suite's visited states")
    exp.add_argument("--out", type=Path, default=None, help="output file (default: assets/data/fsm_masks.npz)")
    exp.add_argument("--samples", type=int, default=8, help="samples per suite entry (default 8)")
    rep = sub.add_parser("report", help="print the suite's savings table")
    rep.add_argument("--samples", type=int, default=8)
    fig = sub.add_parser("figure", help="draw the suite's savings plot into assets/figures/fsm_savings.png "
                                       "(the chapter's teaser on the blog's landing page)")
    fig.add_argument("--samples", type=int, default=8)
    args = parser.parse_args(argv)
    if args.command == "figure":
        import matplotlib

        matplotlib.use("Agg")
        from studylog.plotting import save_figure

        ax = plot_savings(run_suite(n_samples=args.samples, progress=True))
        print(save_figure(ax.figure, "fsm_savings"))
        return 0
    if args.command == "export-masks":
        from studylog import data

        path = export_masks(args.out, n_samples=args.samples)
        ms = data.load_masks(path)
        counts = ms.counts()
        print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB): {len(ms)} masks over {ms.vocab_size} ids "
              f"({ms.tokenizer}), allowed tokens from {counts.min()} to {counts.max()}")
        return 0
    print(savings_table(run_suite(n_samples=args.samples, progress=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
