"""Three constrained-decoding libraries behind one interface: ours, xgrammar and llguidance.

All three get the same regex (the suite entry's) and the same :class:`~studylog.fsm.vocabulary.TokenVocabulary`:
outlines-core indexes it (ours), xgrammar compiles it with ``GrammarCompiler.compile_regex``, llguidance with
``LLMatcher.grammar_from_regex``. (Each peer's own JSON-schema compiler makes its own whitespace choices, so a
schema compiled three ways is three languages; one regex is one language.)

A :class:`Library` (built once per vocabulary) compiles a :class:`Grammar`; its :class:`Matcher` consumes and
rolls back tokens, fills a packed 32-bit bitmask (bit ``i % 32`` of word ``i // 32`` is token ``i``) and says
what is forced next: ``forced_bytes()`` (our character-level jump, xgrammar's ``find_jump_forward_string``,
llguidance's ``compute_ff_bytes``) and ``forced_tokens()`` (our token-level jump; llguidance's
``compute_ff_tokens``; xgrammar has none). The decode loop and the comparison are in :mod:`book.fsm.peers`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from studylog.checks import check_choice
from studylog.fsm.automaton import ConstrainedFSM
from studylog.fsm.vocabulary import TokenVocabulary, load_vocabulary

#: The libraries compared, ours first.
LIBRARIES: tuple[str, ...] = ("ours", "xgrammar", "llguidance")
#: Decode policies of :func:`jump_forward_decode`.
POLICIES: tuple[str, ...] = ("none", "tokens", "bytes")
#: The policies each library offers: ours has both jumps (steps 2 and 3), xgrammar a forced string (SGLang
#: appends it and retokenizes), llguidance its fast-forward tokens.
LIBRARY_POLICIES: dict[str, tuple[str, ...]] = {"ours": ("none", "tokens", "bytes"), "xgrammar": ("bytes",),
                                                "llguidance": ("tokens",)}


class PeerError(RuntimeError):
    """A peer refused a token or a grammar the same automaton accepts."""


def _import_peer(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(f"{name} is an optional peer of chapter 1; install the package's 'peers' extra "
                          f"(pip install -e '.[peers]') or `pip install {name}`") from exc


def peer_versions(names: Sequence[str] = ("xgrammar", "llguidance")) -> dict[str, Optional[str]]:
    """Installed version of each peer (its ``__version__``, else its distribution's), None when missing."""
    out: dict[str, Optional[str]] = {}
    for name in names:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            out[name] = None
            continue
        version = getattr(mod, "__version__", None)
        out[name] = str(version or importlib.metadata.version(name))
    return out


def mask_words(vocab_size: int) -> int:
    """int32 words of a packed bitmask over ``vocab_size`` ids."""
    return (vocab_size + 31) // 32


def unpack_mask(words: np.ndarray, vocab_size: int) -> np.ndarray:
    """The allowed ids of a packed bitmask as a bool array of ``vocab_size``."""
    return np.unpackbits(np.ascontiguousarray(words).view(np.uint8), bitorder="little")[:vocab_size].astype(bool)


# --- matchers ---------------------------------------------------------------------------------------------

def check_mask_out(out: Any, vocab_size: int) -> None:
    """``out`` must be a writable, contiguous int32 numpy array of :func:`mask_words` words: a matcher writes the
    mask through its pointer, so any other array would get a wrong mask without an error."""
    words = mask_words(vocab_size)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array of {words} int32 words, got {type(out).__name__}")
    if out.dtype != np.int32 or out.size != words or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writable, contiguous int32 array of {words} words (vocabulary of "
                         f"{vocab_size} ids); got {out.dtype} of shape {out.shape}"
                         + ("" if out.flags.c_contiguous else ", not contiguous")
                         + ("" if out.flags.writeable else ", read-only"))


def check_rollback(n: Any) -> int:
    """``n`` for a rollback: an int >= 0."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"rollback takes a number of tokens >= 0, got {n!r}")
    return int(n)


class Matcher:
    """One decode's state in one library: consume or roll back tokens, fill a mask, say what is forced."""

    def consume(self, token_id: int) -> None:  # raises PeerError when the token is refused
        raise NotImplementedError

    def rollback(self, n: int) -> None:
        raise NotImplementedError

    def fill_mask(self, out: np.ndarray) -> None:
        """Write the allowed ids (EOS included where the text may end) into ``out``, int32 words."""
        raise NotImplementedError

    def forced_bytes(self) -> bytes:
        raise NotImplementedError

    def forced_tokens(self) -> tuple[int, ...]:
        return ()


@dataclass
class Grammar:
    """A regex compiled by one library over one vocabulary; ``seconds`` is the compile's CPU wall time."""

    library: str
    regex: str
    seconds: float
    handle: Any = field(repr=False)


class Library:
    """One library over one vocabulary (its view of the vocabulary built once, by ``_setup``)."""

    name = ""

    def __init__(self, vocab: TokenVocabulary):
        if not isinstance(vocab, TokenVocabulary):
            raise TypeError(f"vocab must be a TokenVocabulary, got {type(vocab).__name__}")
        self.vocab = vocab
        self._setup()

    def _setup(self) -> None:
        """Build the library's view of the vocabulary."""

    def compile(self, regex: str) -> Grammar:
        """Compile ``regex`` (timed)."""
        if not isinstance(regex, str) or not regex:
            raise ValueError("regex must be a non-empty str")
        t0 = time.perf_counter()
        handle = self._compile(regex)
        return Grammar(self.name, regex, time.perf_counter() - t0, handle)

    def _compile(self, regex: str) -> Any:
        raise NotImplementedError

    def matcher(self, grammar: Grammar) -> Matcher:
        raise NotImplementedError


class _OursMatcher(Matcher):
    def __init__(self, fsm: ConstrainedFSM):
        from outlines_core import Guide

        self.fsm = fsm
        self.states = [fsm.initial]
        self.guide = Guide(fsm.index, max_rollback=1 << 20)

    def consume(self, token_id: int) -> None:
        nxt = self.fsm.next_state(self.states[-1], token_id)
        if nxt is None:
            raise PeerError(f"ours refused token {token_id} ({self.fsm.vocab.show(token_id)!r})")
        self.guide.advance(token_id, return_tokens=False)
        self.states.append(nxt)

    def rollback(self, n: int) -> None:
        n = check_rollback(n)
        if n > len(self.states) - 1:
            raise ValueError(f"cannot roll back {n} tokens: {len(self.states) - 1} were consumed")
        if n:
            self.guide.rollback_state(n)
            del self.states[-n:]

    def fill_mask(self, out: np.ndarray) -> None:
        check_mask_out(out, self.fsm.vocab.vocab_size)
        self.guide.write_mask_into(out.ctypes.data, out.size, 4)

    def forced_bytes(self) -> bytes:
        jump = self.fsm.char_jumps.get(self.states[-1])
        return jump.data if jump is not None else b""

    def forced_tokens(self) -> tuple[int, ...]:
        jump = self.fsm.token_jumps.get(self.states[-1])
        return jump.tokens if jump is not None else ()


class OursLibrary(Library):
    """Ours: an outlines-core index and the chapter's jump tables (:class:`ConstrainedFSM`); masks through
    ``outlines_core.Guide.write_mask_into``. Its compile is the index build plus the jump precompute."""

    name = "ours"

    def _setup(self) -> None:
        self.vocab.outlines_vocabulary()

    def _compile(self, regex: str) -> ConstrainedFSM:
        return ConstrainedFSM(regex, self.vocab)

    def adopt(self, fsm: ConstrainedFSM) -> Grammar:
        """An automaton built earlier over the same vocabulary, as a :class:`Grammar` whose time is the one it
        recorded (index build plus jump precompute)."""
        if not isinstance(fsm, ConstrainedFSM):
            raise TypeError(f"fsm must be a ConstrainedFSM, got {type(fsm).__name__}")
        if fsm.vocab is not self.vocab:
            raise ValueError(f"the automaton {fsm.name!r} is over another vocabulary ({fsm.vocab.name!r})")
        return Grammar(self.name, fsm.regex, fsm.build_seconds + fsm.precompute_seconds, fsm)

    def matcher(self, grammar: Grammar) -> Matcher:
        return _OursMatcher(grammar.handle)


class _XGrammarMatcher(Matcher):
    def __init__(self, xgr, compiled, vocab_size: int):
        self.m = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size

    def consume(self, token_id: int) -> None:
        if not self.m.accept_token(int(token_id)):
            raise PeerError(f"xgrammar refused token {token_id}")

    def rollback(self, n: int) -> None:
        if check_rollback(n):
            self.m.rollback(n)

    def fill_mask(self, out: np.ndarray) -> None:
        check_mask_out(out, self.vocab_size)
        self.m.fill_next_token_bitmask(out.reshape(1, -1))

    def forced_bytes(self) -> bytes:
        return self.m.find_jump_forward_string().encode("utf-8")


class XGrammarLibrary(Library):
    """xgrammar: ``TokenizerInfo`` over the raw token bytes (ids without text are empty, which xgrammar
    treats as special tokens, never allowed), EOS as the stop token; ``GrammarCompiler(cache_enabled=False)``
    so that every compile is measured, with the library's default thread count."""

    name = "xgrammar"

    def _setup(self) -> None:
        self.xgr = _import_peer("xgrammar")
        encoded = [b if b is not None else b"" for b in self.vocab.token_bytes]
        self.info = self.xgr.TokenizerInfo(encoded, self.xgr.VocabType.RAW, vocab_size=self.vocab.vocab_size,
                                           stop_token_ids=[self.vocab.eos_id])
        self.compiler = self.xgr.GrammarCompiler(self.info, cache_enabled=False)

    def _compile(self, regex: str) -> Any:
        return self.compiler.compile_regex(regex)

    def matcher(self, grammar: Grammar) -> Matcher:
        return _XGrammarMatcher(self.xgr, grammar.handle, self.vocab.vocab_size)


class _LLGuidanceMatcher(Matcher):
    def __init__(self, matcher, vocab_size: int):
        self.m = matcher
        self.vocab_size = vocab_size

    def _check(self, what: str) -> None:
        if self.m.is_error():
            raise PeerError(f"llguidance {what}: {self.m.get_error()}")

    def consume(self, token_id: int) -> None:
        if not self.m.consume_token(int(token_id)):
            self._check(f"refused token {token_id}")
            raise PeerError(f"llguidance refused token {token_id}")

    def rollback(self, n: int) -> None:
        if check_rollback(n) and not self.m.rollback(n):
            self._check(f"could not roll back {n} tokens")

    def fill_mask(self, out: np.ndarray) -> None:
        check_mask_out(out, self.vocab_size)
        self.m.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    def forced_bytes(self) -> bytes:
        return bytes(self.m.compute_ff_bytes())

    def forced_tokens(self) -> tuple[int, ...]:
        return tuple(self.m.compute_ff_tokens())


class LLGuidanceLibrary(Library):
    """llguidance: an ``LLTokenizer`` over the token bytes, with the vocabulary's own encoder as its tokenizer
    (it tokenizes forced bytes into fast-forward tokens) and the ids without text as special tokens; a grammar
    is ``LLMatcher.grammar_from_regex(regex)``, compiled by the ``LLMatcher`` constructor. llguidance builds
    its lexer lazily, so part of its work moves from the compile into the first masks."""

    name = "llguidance"

    def _setup(self) -> None:
        self.llg = _import_peer("llguidance")
        vocab = self.vocab
        special = [i for i, b in enumerate(vocab.token_bytes) if b is None]

        class _Wrapper(self.llg.TokenizerWrapper):
            def __init__(self):  # the base class wraps a guidance tokenizer; ours is the vocabulary itself
                self.eos_token_id = vocab.eos_id
                self.bos_token_id = None
                self.tokens = [b if b is not None else b"<|special %d|>" % i for i, b in enumerate(vocab.token_bytes)]
                self.special_token_ids = special
                self.is_tokenizer_wrapper = True

            def __call__(self, text):
                return vocab.encode(text)

        if vocab.encoder is None:
            raise ValueError(f"llguidance tokenizes forced bytes, and vocabulary {vocab.name!r} has no encoder")
        self.tokenizer = self.llg.LLTokenizer(_Wrapper(), n_vocab=vocab.vocab_size)

    def _compile(self, regex: str) -> Any:
        matcher = self.llg.LLMatcher(self.tokenizer, self.llg.LLMatcher.grammar_from_regex(regex), log_level=0)
        if matcher.is_error():
            raise PeerError(f"llguidance could not compile the grammar: {matcher.get_error()}")
        return matcher

    def matcher(self, grammar: Grammar) -> Matcher:
        return _LLGuidanceMatcher(grammar.handle.deep_copy(), self.vocab.vocab_size)


_LIBRARY_CLASSES = {"ours": OursLibrary, "xgrammar": XGrammarLibrary, "llguidance": LLGuidanceLibrary}


def library(name: str, vocab: Optional[TokenVocabulary] = None) -> Library:
    """The library ``name`` (``"ours"``, ``"xgrammar"``, ``"llguidance"``) over ``vocab`` (default cl100k_base).
    A missing peer raises ImportError naming the ``peers`` extra."""
    check_choice("name", name, LIBRARIES)
    return _LIBRARY_CLASSES[name](vocab if vocab is not None else load_vocabulary())
