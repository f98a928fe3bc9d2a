"""The chapter beside the libraries practitioners use: xgrammar and llguidance on the same regex and vocabulary.

All three libraries get the *same regex* (the suite entry's, as :meth:`~studylog.fsm.schemas.SuiteEntry.regex`
writes it) and the *same vocabulary* (:class:`~studylog.fsm.vocabulary.TokenVocabulary`, cl100k_base built
offline): outlines-core indexes it (ours), xgrammar compiles it with ``GrammarCompiler.compile_regex``,
llguidance with ``LLMatcher.grammar_from_regex``. Both peers also compile JSON schemas directly, but each makes
its own whitespace choices (xgrammar allows any whitespace by default, llguidance none), so a schema compiled
three ways is three languages; one regex is one language.

Each library sits behind a :class:`Library` (built once per vocabulary) whose :meth:`Library.compile` gives a
:class:`Grammar` and whose :meth:`Library.matcher` a :class:`Matcher`: consume and roll back tokens, fill a
packed 32-bit bitmask (bit ``i % 32`` of word ``i // 32`` is token ``i``, as all three write it), and say what
is forced next:

* ``forced_bytes()``: the string every valid continuation starts with (our character-level jump, xgrammar's
  ``find_jump_forward_string``, llguidance's ``compute_ff_bytes``);
* ``forced_tokens()``: tokens appended without a forward pass (our token-level jump, a chain of states that
  allow one token each; llguidance's ``compute_ff_tokens``, the canonical tokenization of the forced bytes
  with the last tokens held back when a longer token could span the end; xgrammar has no token form).

:func:`jump_forward_decode` is one greedy decode loop that any matcher drives, with a ``policy``: ``"none"``
(a pass per token), ``"tokens"`` (append the forced tokens) or ``"bytes"`` (append the forced string and
retokenize the text, as SGLang does with xgrammar's string). Driven by our matcher it gives the ids and pass
counts of :func:`~studylog.fsm.decoding.step01_uncompressed`, :func:`~studylog.fsm.decoding.step02_token_jumps`
and :func:`~studylog.fsm.decoding.step03_char_jumps`.

:func:`compare_peers` runs the suite: the same sampled documents, walked token by token through the three
matchers (the same states: forced strings and masks compared state by state), decoded under each policy
(forward passes, forced tokens), and timed on the CPU (``time.perf_counter``: compile one grammar, fill one
mask). :func:`viable_prefix` is the independent judge of a disagreement: the ``regex`` module's partial match
says whether a text can still be completed into a match of the regex.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import itertools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from studylog.checks import check_choice, check_int
from studylog.fsm.automaton import ConstrainedFSM
from studylog.fsm.decoding import DecodeResult, Event, NextLogits, check_logits, writer_model
from studylog.fsm.vocabulary import TokenVocabulary, load_vocabulary

#: The libraries compared, ours first.
LIBRARIES: tuple[str, ...] = ("ours", "xgrammar", "llguidance")
#: Decode policies of :func:`jump_forward_decode`.
POLICIES: tuple[str, ...] = ("none", "tokens", "bytes")
#: The policies each library offers: ours has both jumps (steps 2 and 3), xgrammar a forced string (SGLang
#: appends it and retokenizes), llguidance its fast-forward tokens.
LIBRARY_POLICIES: dict[str, tuple[str, ...]] = {"ours": ("none", "tokens", "bytes"), "xgrammar": ("bytes",),
                                                "llguidance": ("tokens",)}
#: Distribution names, for ``pip install``: the ``peers`` extra of the package.
PEER_PACKAGES: dict[str, str] = {"xgrammar": "xgrammar", "llguidance": "llguidance"}


class PeerError(RuntimeError):
    """A peer refused a token or a grammar the same automaton accepts."""


def _import_peer(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(f"{name} is an optional peer of chapter 1; install the package's 'peers' extra "
                          f"(pip install -e '.[peers]') or `pip install {PEER_PACKAGES[name]}`") from exc


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
        out[name] = str(version or importlib.metadata.version(PEER_PACKAGES.get(name, name)))
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
    """One library over one vocabulary. ``setup_seconds``: its vocabulary preprocessing (done once)."""

    name = ""

    def __init__(self, vocab: TokenVocabulary):
        if not isinstance(vocab, TokenVocabulary):
            raise TypeError(f"vocab must be a TokenVocabulary, got {type(vocab).__name__}")
        self.vocab = vocab
        t0 = time.perf_counter()
        self._setup()
        self.setup_seconds = time.perf_counter() - t0

    def _setup(self) -> None:
        """Build the library's view of the vocabulary."""

    @property
    def version(self) -> str:
        return peer_versions([self.name])[self.name] or "?"

    def compile(self, regex: str) -> Grammar:
        """Compile ``regex`` (timed)."""
        if not isinstance(regex, str) or not regex:
            raise ValueError("regex must be a non-empty str")
        t0 = time.perf_counter()
        handle = self._compile(regex)
        return Grammar(self.name, regex, time.perf_counter() - t0, handle)

    def _compile(self, regex: str) -> Any:
        raise NotImplementedError

    def compile_schema(self, schema: dict) -> Grammar:
        """Compile a JSON schema with the library's own JSON-schema compiler and its default options (each
        makes its own whitespace choices, so the languages differ; the comparison compiles regexes)."""
        import json

        text = json.dumps(schema)
        t0 = time.perf_counter()
        handle = self._compile_schema(text)
        return Grammar(self.name, f"JSON schema {text}", time.perf_counter() - t0, handle)

    def _compile_schema(self, schema: str) -> Any:
        raise NotImplementedError

    def matcher(self, grammar: Grammar) -> Matcher:
        raise NotImplementedError

    def accepts(self, grammar: Grammar, text: str | bytes) -> bool:
        """True when the grammar accepts ``text`` whole: its canonical tokens are consumed one by one and EOS
        is allowed after them."""
        ids = self.vocab.encode(text)
        m = self.matcher(grammar)
        try:
            for t in ids:
                m.consume(t)
        except PeerError:
            return False
        words = np.zeros(mask_words(self.vocab.vocab_size), dtype=np.int32)
        m.fill_mask(words)
        return bool(unpack_mask(words, self.vocab.vocab_size)[self.vocab.eos_id])


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

    @property
    def version(self) -> str:
        return f"outlines-core {importlib.metadata.version('outlines_core')}"

    def _compile(self, regex: str) -> ConstrainedFSM:
        return ConstrainedFSM(regex, self.vocab)

    def _compile_schema(self, schema: str) -> ConstrainedFSM:
        from studylog.fsm.automaton import regex_from_schema

        return ConstrainedFSM(regex_from_schema(schema), self.vocab)

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

    def _compile_schema(self, schema: str) -> Any:
        return self.compiler.compile_json_schema(schema)

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
        return self._matcher(self.llg.LLMatcher.grammar_from_regex(regex))

    def _compile_schema(self, schema: str) -> Any:
        return self._matcher(self.llg.LLMatcher.grammar_from_json_schema(schema))

    def _matcher(self, grammar: str) -> Any:
        matcher = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
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
                        max_tokens: int = 256, record_events: bool = False) -> DecodeResult:
    """Greedy constrained decoding through any :class:`Matcher`, in the order of the chapter's steps: end
    where the mask allows only EOS; else append what ``policy`` forces; else one forward pass picks the
    masked argmax.

    ``"tokens"`` appends ``matcher.forced_tokens()``; ``"bytes"`` appends ``matcher.forced_bytes()`` and
    re-encodes the whole text (tokens already emitted may change: ``retokenized``; a jump from text that ends
    inside a UTF-8 character is skipped). A jump is cut at ``max_tokens``. The matcher must be fresh.

    ``forward_passes`` counts every pass, the one that picks EOS included; a pass that picks a token is one
    token of the output that a model chose, the rest of ``ids`` no pass chose."""
    check_choice("policy", policy, POLICIES)
    check_int("max_tokens", max_tokens, low=1)
    res = DecodeResult([], b"", 0, False)
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
    """True when ``text`` is the start of some string that fully matches ``regex``, judged by the ``regex``
    module's partial matching (its own engine, Unicode classes as outlines-core's; ``.`` excludes ``\\n``).

    A text that ends inside a UTF-8 character is viable when some completion of that character is; the
    completions are tried one by one (at most ``max_completions``)."""
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
    """Every suite entry (default: the whole suite) in every library, on the same documents.

    The documents are those :func:`~studylog.fsm.report.measure_entry` samples (same ``seed``); each is
    walked along its canonical tokens through all libraries at once (same states: forced strings, masks
    and one timed mask fill per state), then decoded by the writer model under each library's policies
    (:data:`LIBRARY_POLICIES`). A library missing from the environment raises ImportError.

    ``fsms`` maps entry names to automata already built for the same regex over ``vocab`` (for example kept
    from :func:`~studylog.fsm.report.run_suite`); they are used as they are, with the build time they
    recorded as our compile time."""
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
