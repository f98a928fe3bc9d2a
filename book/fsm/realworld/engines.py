"""The three engines of the real-world suite, and the worker process they run in.

Each engine compiles a JSON schema over a :class:`~studylog.fsm.vocabulary.TokenVocabulary` and gives a
:class:`Cursor` per document: compute the mask (the timed operation), list the allowed ids, consume a token.
:func:`walk_documents` samples documents by a seeded random walk of a cursor, checked with ``jsonschema``
(timing its masks on the way); :func:`replay` times one mask per position of given documents. All of it runs
in a worker process (:func:`worker_main`, driven by :class:`Worker`) that the parent kills when a compile runs
past its limit.
"""

from __future__ import annotations

import copy
import functools
import gc
import json
import os
import random
import signal
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from studylog.fsm.vocabulary import TokenVocabulary, load_vocabulary

#: The engines, chapter 1's first.
ENGINES: tuple[str, ...] = ("outlines-core", "xgrammar", "llguidance")
#: The engine whose matcher samples the documents: the first of these that compiled the schema.
WALK_ORDER: tuple[str, ...] = ("llguidance", "xgrammar", "outlines-core")
#: What a sampled document can be: ``valid`` (the engine allowed EOS and jsonschema accepts it),
#: ``invalid`` (EOS allowed, jsonschema rejects it), ``unparsable`` (EOS allowed, not JSON),
#: ``unchecked`` (jsonschema itself failed on the schema), ``incomplete`` (the token budget ran out),
#: ``stuck`` (the engine allowed nothing, not even EOS), ``error`` (the walk failed).
DOC_STATUSES: tuple[str, ...] = ("valid", "invalid", "unparsable", "unchecked", "incomplete", "stuck", "error")


def popcount(words: np.ndarray) -> int:
    """Set bits of a packed int32 bitmask (how many tokens it allows)."""
    return int(np.bitwise_count(np.ascontiguousarray(words).view(np.uint32)).sum())


# --------------------------------------------------------------------------------------------------------
# The engines (they live in the worker process)
# --------------------------------------------------------------------------------------------------------

def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` of an exception (the error text kept for a refusal)."""
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else ""
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


class Cursor:
    """One document's walk through one engine: a mask (timed), the allowed ids, consume a token."""

    def mask(self) -> None:
        """Compute this position's mask: the operation that is timed."""
        raise NotImplementedError

    def count(self) -> int:
        """How many ids the last :meth:`mask` allows (EOS included)."""
        raise NotImplementedError

    def allowed_ids(self) -> np.ndarray:
        """The allowed ids of the last :meth:`mask`, EOS included where the document may end."""
        raise NotImplementedError

    def consume(self, token_id: int) -> Optional[str]:
        """Advance by one token; None when accepted, else why not."""
        raise NotImplementedError


class Engine:
    """One engine over one vocabulary (built once per worker): compiles schemas, gives cursors."""

    name = ""
    package = ""  # its distribution, for the version

    def __init__(self, vocab: TokenVocabulary):
        self.vocab = vocab
        self.words = (vocab.vocab_size + 31) // 32

    @property
    def version(self) -> str:
        import importlib.metadata

        return importlib.metadata.version(self.package)

    def compile(self, schema: dict) -> tuple[Any, dict]:
        """The compiled grammar and a few facts about it (raises when the engine refuses the schema)."""
        raise NotImplementedError

    def cursor(self, grammar: Any) -> Cursor:
        raise NotImplementedError


class _BitmaskCursor(Cursor):
    def __init__(self, words: int, vocab_size: int):
        self.buf = np.zeros(words, dtype=np.int32)
        self.vocab_size = vocab_size

    def allowed_ids(self) -> np.ndarray:
        bits = np.unpackbits(self.buf.view(np.uint8), bitorder="little")[:self.vocab_size]
        return np.flatnonzero(bits)

    def count(self) -> int:
        return popcount(self.buf)


class _OutlinesCursor(Cursor):
    def __init__(self, fsm):
        self.fsm = fsm
        self.state = fsm.initial
        self.last = None

    def mask(self) -> None:
        self.last = self.fsm.allowed(self.state)  # chapter 7's lookup (a torch tensor of ids, kept per state)

    def count(self) -> int:
        return int(self.last.shape[0])

    def allowed_ids(self) -> np.ndarray:
        return self.fsm.allowed_array(self.state)

    def consume(self, token_id: int) -> Optional[str]:
        if token_id == self.fsm.vocab.eos_id:
            return None if self.fsm.is_final(self.state) else "EOS not allowed here"
        nxt = self.fsm.index.get_next_state(self.state, int(token_id))
        if nxt is None:
            return f"token {token_id} not allowed"
        self.state = nxt
        return None


class _OutlinesEngine(Engine):
    """Chapter 1's automaton: outlines' regex of the schema, indexed over the vocabulary (ConstrainedFSM)."""

    name = "outlines-core"
    package = "outlines_core"

    def __init__(self, vocab: TokenVocabulary):
        super().__init__(vocab)
        import outlines.types  # noqa: F401  (imported once here, not inside the first timed compile)
        import outlines_core.json_schema  # noqa: F401

        vocab.outlines_vocabulary()  # built once per vocabulary, as chapter 1 does

    def compile(self, schema: dict) -> tuple[Any, dict]:
        from studylog.fsm.automaton import ConstrainedFSM, regex_from_schema

        t0 = time.perf_counter()
        regex = regex_from_schema(schema, whitespace_pattern="")
        t1 = time.perf_counter()
        fsm = ConstrainedFSM(regex, self.vocab, name="schema")
        return fsm, {"regex_chars": len(regex), "regex_s": t1 - t0, "index_s": fsm.build_seconds,
                     "jumps_s": fsm.precompute_seconds, "states": len(fsm.char_out)}

    def cursor(self, grammar: Any) -> Cursor:
        return _OutlinesCursor(grammar)


class _XGrammarCursor(_BitmaskCursor):
    def __init__(self, xgr, compiled, words: int, vocab_size: int):
        super().__init__(words, vocab_size)
        self.m = xgr.GrammarMatcher(compiled)
        self.row = self.buf.reshape(1, -1)

    def mask(self) -> None:
        self.m.fill_next_token_bitmask(self.row)

    def consume(self, token_id: int) -> Optional[str]:
        return None if self.m.accept_token(int(token_id)) else f"token {token_id} refused"


class _XGrammarEngine(Engine):
    """xgrammar's JSON-schema compiler, compact JSON, one compile thread, no cache (every compile timed)."""

    name = "xgrammar"
    package = "xgrammar"

    def __init__(self, vocab: TokenVocabulary):
        super().__init__(vocab)
        import xgrammar as xgr

        self.xgr = xgr
        encoded = [b if b is not None else b"" for b in vocab.token_bytes]
        self.info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab.vocab_size,
                                      stop_token_ids=[vocab.eos_id])
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.compile({"type": "boolean"})  # warm up, so that the first timed compile is like the others

    def compile(self, schema: dict) -> tuple[Any, dict]:
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
        return compiled, {}

    def cursor(self, grammar: Any) -> Cursor:
        return _XGrammarCursor(self.xgr, grammar, self.words, self.vocab.vocab_size)


class _LLGuidanceCursor(_BitmaskCursor):
    def __init__(self, matcher, words: int, vocab_size: int):
        super().__init__(words, vocab_size)
        self.m = matcher
        self.ptr, self.nbytes = self.buf.ctypes.data, self.buf.nbytes

    def mask(self) -> None:
        self.m.unsafe_compute_mask_ptr(self.ptr, self.nbytes)

    def consume(self, token_id: int) -> Optional[str]:
        if self.m.consume_token(int(token_id)):
            return None
        return f"token {token_id} refused"


class _LLGuidanceEngine(Engine):
    """llguidance: an ``LLTokenizer`` over the token bytes (book.fsm.matchers builds it), a grammar from
    ``LLMatcher.grammar_from_json_schema`` with compact separators and no flexible whitespace."""

    name = "llguidance"
    package = "llguidance"
    OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}

    def __init__(self, vocab: TokenVocabulary):
        super().__init__(vocab)
        from book.fsm.matchers import LLGuidanceLibrary

        lib = LLGuidanceLibrary(vocab)
        self.llg, self.tokenizer = lib.llg, lib.tokenizer
        self.compile({"type": "boolean"})  # warm up

    def compile(self, schema: dict) -> tuple[Any, dict]:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=self.OPTIONS)
        matcher = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher, {}

    def cursor(self, grammar: Any) -> Cursor:
        return _LLGuidanceCursor(grammar.deep_copy(), self.words, self.vocab.vocab_size)


ENGINE_CLASSES = {"outlines-core": _OutlinesEngine, "xgrammar": _XGrammarEngine, "llguidance": _LLGuidanceEngine}
ENGINE_MODULES = {"outlines-core": "outlines_core", "xgrammar": "xgrammar", "llguidance": "llguidance"}


# --------------------------------------------------------------------------------------------------------
# Documents: a seeded random walk, checked with jsonschema
# --------------------------------------------------------------------------------------------------------

_STRUCTURE = b'"{}[],:'


@functools.lru_cache(maxsize=4)
def _token_classes(vocab: TokenVocabulary) -> dict[str, np.ndarray]:
    """Boolean arrays over the ids: ``structural`` holds a JSON structure byte (``"{}[],:``); ``ender``
    closes an object or array (``}`` or ``]``); ``opener`` opens one (``{`` or ``[``); ``closer`` closes
    a string, object or array and opens nothing."""
    size = vocab.vocab_size
    out = {k: np.zeros(size, dtype=bool) for k in ("structural", "ender", "opener", "closer")}
    for i, b in enumerate(vocab.token_bytes):
        if b is None:
            continue
        out["structural"][i] = any(c in b for c in _STRUCTURE)
        out["ender"][i] = b"}" in b or b"]" in b
        out["opener"][i] = b"{" in b or b"[" in b
        out["closer"][i] = (b'"' in b or out["ender"][i]) and not out["opener"][i]
    return out


def _seed(*parts: Any) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


@dataclass
class Document:
    """One sampled document: its token ids and what became of it."""

    ids: list[int] = field(repr=False)
    status: str
    error: str = ""

    @property
    def complete(self) -> bool:
        return self.status in ("valid", "invalid", "unparsable", "unchecked")


def _check_document(data: bytes, schema: dict) -> tuple[str, str]:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return "unparsable", first_line(exc)
    try:
        import warnings

        import jsonschema

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
            errors = cls(schema).iter_errors(doc)
            err = next(errors, None)
    except RecursionError:
        return "unchecked", "RecursionError in jsonschema"
    except Exception as exc:  # jsonschema on a schema it cannot handle (unknown $schema, bad refs...)
        return "unchecked", first_line(exc)
    if err is not None:  # named by the schema's side only: the document's random text stays out of the record
        where = "/".join(map(str, err.absolute_schema_path))
        wanted = json.dumps(err.validator_value, ensure_ascii=False)
        return "invalid", f"fails {where or err.validator} = {wanted[:120]}{'...' if len(wanted) > 120 else ''}"
    return "valid", ""


def walk_documents(engine: Engine, grammar: Any, schema: dict, *, n_docs: int = 3, max_tokens: int = 300,
                   seed: int = 0, name: str = "", eos_prob: float = 0.5, structure_prob: float = 0.5,
                   end_prob: float = 0.15, first: int = 0, timings: Optional[dict] = None) -> list[Document]:
    """``n_docs`` documents of ``grammar`` sampled by a seeded random walk of ``engine``'s matcher (document
    ``k`` is seeded by ``seed``, ``name`` and ``first + k``, whichever engine walks it).

    At each step the mask is computed; where EOS is allowed the walk takes it with probability ``eos_prob``
    (always when nothing else is allowed). Otherwise it draws uniformly among a pool of allowed tokens:
    with probability ``end_prob`` those that close an object or array, with probability ``structure_prob``
    those holding another JSON structure byte (``"``, ``,``, ``:``, ``{``, ``[``: strings and numbers stay
    short, objects get keys), else any (an empty pool falls back to all allowed tokens); the first token never
    closes what it opens (``{}`` is one token of most vocabularies). Past half of
    ``max_tokens`` it prefers tokens that close a string, object or array and open nothing. A walk that
    reaches ``max_tokens`` is ``incomplete``; a complete one is checked with jsonschema (:data:`DOC_STATUSES`).

    ``timings`` (a dict) receives what :func:`replay` returns, measured during the walk itself: the walk is
    the first pass of this grammar over these documents, as cold as a replay through another engine (a
    replay through the walking engine would find its caches warm)."""
    if timings is not None:
        timings.setdefault("mask_us", [])
        for key in ("forced", "tokens"):
            timings.setdefault(key, 0)
    perf = time.perf_counter
    vocab = engine.vocab
    eos = vocab.eos_id
    cls = _token_classes(vocab)
    ender, closer, opener = cls["ender"], cls["closer"], cls["opener"]
    going_on = cls["structural"] & ~ender
    docs = []
    for k in range(first, first + n_docs):
        rng = random.Random(_seed(seed, name, k))
        ids: list[int] = []
        status, error = "incomplete", ""
        gc_was = gc.isenabled()
        gc.disable()
        try:
            cur = engine.cursor(grammar)
            while True:
                t0 = perf()
                cur.mask()
                dt = perf() - t0
                if timings is not None:
                    timings["mask_us"].append(dt * 1e6)
                allowed = cur.allowed_ids()
                eos_ok = bool(allowed.size) and bool((allowed == eos).any())
                others = allowed[allowed != eos]
                if others.size == 0:
                    status = "complete" if eos_ok else "stuck"
                    break
                if len(ids) >= max_tokens:
                    break
                if eos_ok and rng.random() < eos_prob:
                    status = "complete"
                    break
                if not ids and (~ender[others]).any():  # the first token does not close what it opens
                    others = others[~ender[others]]
                pools = []
                if len(ids) >= max_tokens // 2:
                    pools = [others[closer[others]], others[~opener[others]]]
                else:
                    r = rng.random()
                    if r < end_prob:
                        pools = [others[ender[others]]]
                    elif r < end_prob + structure_prob:
                        pools = [others[going_on[others]]]
                pool = next((p for p in pools if p.size), others)
                tok = int(pool[rng.randrange(pool.size)])
                if timings is not None:
                    timings["tokens"] += 1
                    timings["forced"] += allowed.size == 1
                why = cur.consume(tok)
                if why is not None:
                    status, error = "error", f"the walking engine refused a token its own mask allowed: {why}"
                    break
                ids.append(tok)
        except Exception as exc:
            status, error = "error", first_line(exc)
        finally:
            if gc_was:
                gc.enable()
        if status == "complete":
            status, error = _check_document(vocab.decode(ids), schema)
        docs.append(Document(ids, status, error))
    return docs


def replay(engine: Engine, grammar: Any, docs: Sequence[Document]) -> dict[str, Any]:
    """Each document's tokens through ``engine``, one timed mask per position (after the last token too
    when the document is complete: the mask that allows EOS). Returns the mask times (µs), the tokens whose
    mask allowed exactly one id (``forced``) among ``tokens`` positions, and the documents the engine refused
    partway (``refused``: their indices; ``reasons``: where and why; their masks up to the refusal count)."""
    times: list[float] = []
    forced = tokens = 0
    refused: list[int] = []
    reasons: list[str] = []
    perf = time.perf_counter
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for d, doc in enumerate(docs):
            cur = engine.cursor(grammar)
            positions = len(doc.ids) + (1 if doc.complete else 0)
            for pos in range(positions):
                t0 = perf()
                cur.mask()
                times.append((perf() - t0) * 1e6)
                if pos < len(doc.ids):
                    tokens += 1
                    forced += cur.count() == 1
                    why = cur.consume(doc.ids[pos])
                    if why is not None:
                        refused.append(d)
                        reasons.append(f"document {d}, token {pos}: {why}")
                        break
    finally:
        if gc_was:
            gc.enable()
    return {"mask_us": times, "forced": forced, "tokens": tokens, "refused": refused, "reasons": reasons}


# --------------------------------------------------------------------------------------------------------
# The worker process: compiles (killed at the limit), walks and replays
# --------------------------------------------------------------------------------------------------------

def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (a compile inside Rust would otherwise outlive it)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def worker_main(conn, vocab: Any, engine_names: Sequence[str], quiet: bool = False) -> None:
    """Build the engines over the vocabulary, then serve schemas until told to stop (or the pipe closes).

    Per schema: for each engine ``("start", e)`` then ``("compiled", e, compile_s, first_mask_s, info)`` or
    ``("refused", e, error)``; then ``("measuring",)``, ``("docs", walker, docs)``, one ``("masks", e,
    replay)`` or ``("measure-error", e, error)`` per compiled engine, and ``("done",)``."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the parent, which kills us
        _die_with_parent()
        if quiet:  # the engines' own warnings (xgrammar's C++ logs) would cut through the progress bar
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
        if isinstance(vocab, str):
            vocab = load_vocabulary(vocab)
        engines = {n: ENGINE_CLASSES[n](vocab) for n in engine_names}
        versions = {}
        for n, e in engines.items():
            try:
                versions[n] = e.version
            except Exception:  # pragma: no cover - metadata missing
                versions[n] = "?"
        conn.send(("ready", versions))
    except BaseException as exc:
        conn.send(("setup-error", first_line(exc)))
        return
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task[0] == "stop":
            return
        _, name, schema, todo, opts = task
        _serve(conn, engines, name, schema, todo, opts)


def _serve(conn, engines: Mapping[str, Engine], name: str, schema: dict, todo: Sequence[str], opts: dict) -> None:
    grammars: dict[str, Any] = {}
    for e in todo:
        conn.send(("start", e))
        engine = engines[e]
        try:
            t0 = time.perf_counter()
            grammar, info = engine.compile(copy.deepcopy(schema))
            compile_s = time.perf_counter() - t0
            cur = engine.cursor(grammar)
            t0 = time.perf_counter()
            cur.mask()
            first_s = time.perf_counter() - t0
        except BaseException as exc:  # a refusal, whatever the engine raises
            conn.send(("refused", e, first_line(exc)))
            continue
        grammars[e] = grammar
        conn.send(("compiled", e, compile_s, first_s, info))
    conn.send(("measuring",))
    if grammars and opts["n_docs"] > 0:
        walker = next(w for w in WALK_ORDER if w in grammars)
        walk = {"max_tokens": opts["max_tokens"], "seed": opts["seed"], "name": name, "eos_prob": opts["eos_prob"],
                "structure_prob": opts["structure_prob"], "end_prob": opts["end_prob"]}
        walked: dict[str, Any] = {}
        docs = walk_documents(engines[walker], grammars[walker], schema, n_docs=opts["n_docs"], timings=walked, **walk)
        conn.send(("docs", walker, docs))
        for e, grammar in grammars.items():
            try:
                if e == walker:  # timed during the walk
                    rep = {**walked, "refused": [], "reasons": [], "own": []}
                else:
                    rep = replay(engines[e], grammar, docs)
                    own: list[Document] = []
                    for k in rep["refused"]:  # documents of the walker's language that are not of this engine's
                        own += walk_documents(engines[e], grammar, schema, n_docs=1, first=k, timings=rep, **walk)
                    rep["own"] = own
                conn.send(("masks", e, rep))
            except Exception as exc:
                conn.send(("measure-error", e, first_line(exc)))
    conn.send(("done",))


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Worker:
    """The parent's handle on one worker process."""

    def __init__(self, ctx, vocab: Any, engines: Sequence[str], setup_timeout: float, quiet: bool = False):
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, vocab, tuple(engines), quiet), daemon=True,
                                name="studylog-realworld")
        self.proc.start()
        child.close()
        self.conn = parent
        msg = self.recv(time.monotonic() + setup_timeout, mem_limit=None)
        if msg[0] != "ready":
            self.kill()
            detail = msg[1] if len(msg) > 1 else ""
            raise RuntimeError(f"the engine worker could not start ({msg[0]}): {detail}")
        self.versions: dict[str, str] = msg[1]

    def send(self, msg) -> None:
        self.conn.send(msg)

    def recv(self, deadline: float, mem_limit: Optional[int]):
        """The next message, or ``("__timeout__",)``, ``("__died__", exitcode)``, ``("__memory__", rss)``."""
        last_rss = 0.0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return ("__timeout__",)
            try:
                if self.conn.poll(min(0.05, left)):
                    return self.conn.recv()
            except (EOFError, OSError):
                self.proc.join(1.0)
                return ("__died__", self.proc.exitcode)
            if not self.proc.is_alive():
                try:
                    if self.conn.poll(0):
                        return self.conn.recv()
                except (EOFError, OSError):
                    pass
                return ("__died__", self.proc.exitcode)
            now = time.monotonic()
            if mem_limit and now - last_rss > 0.25:
                last_rss = now
                rss = _rss_bytes(self.proc.pid)
                if rss > mem_limit:
                    return ("__memory__", rss)

    def kill(self) -> None:
        if self.proc.is_alive():
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.join(5.0)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(("stop",))
            self.proc.join(5.0)
        except (OSError, BrokenPipeError):
            pass
        self.kill()


def died(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"the engine's process died ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"the engine's process died (exit code {code})"
