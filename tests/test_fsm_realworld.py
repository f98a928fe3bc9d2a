"""Chapter 1 on real schemas (book.fsm.realworld): the SchemaStore catalog, the three engines, the stats.

Fast on a CPU: a handful of small schemas, a short time limit, one worker process per test that measures.
"""

import json
import time

import numpy as np
import pytest

for _name in ("outlines_core", "outlines", "bpe_openai", "schemastore", "requests_cache", "jsonschema"):
    pytest.importorskip(_name)

from book.fsm import realworld as rw  # noqa: E402
from book.fsm.realworld import __main__ as cli  # noqa: E402

#: Small schemas every engine should compile quickly (additionalProperties false: one language for all three).
SMALL = [
    ("flag", {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}),
    ("person", {"type": "object", "additionalProperties": False, "required": ["name", "age"],
                "properties": {"name": {"type": "string", "maxLength": 12},
                               "age": {"type": "integer", "minimum": 0, "maximum": 120},
                               "role": {"enum": ["admin", "user", "guest"]}}}),
    ("tags", {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "maxItems": 4}),
]
#: A pattern whose DFA has about 2^14 states: outlines-core (a DFA over the whole vocabulary) runs for a
#: long time; llguidance (a lazy lexer) compiles it at once.
LOOPING = ("loop", {"type": "object", "additionalProperties": False, "required": ["code"],
                    "properties": {"code": {"type": "string", "pattern": "^(a|b)*a(a|b){14}$"}}})


def _have(*modules):
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


needs_peers = pytest.mark.skipif(not _have("xgrammar", "llguidance"),
                                 reason="xgrammar and llguidance are optional peers (the package's 'peers' extra)")


# --- the catalog --------------------------------------------------------------------------------------------

def test_catalog_reads_the_wheel():
    items = rw.catalog()
    assert len(items) >= 400
    names = [n for n, _ in items]
    assert len(set(names)) == len(names)
    assert names == [e.name for e in rw.catalog_entries()]
    assert all(isinstance(s, dict) for _, s in items)
    assert [n for n, _ in rw.catalog()] == names  # deterministic
    items[0][1]["mutated"] = True
    assert "mutated" not in rw.catalog()[0][1]  # fresh copies


def test_catalog_bundles_external_refs():
    entries = rw.catalog_entries()
    bundled = [e for e in entries if e.embedded]
    assert bundled, "some SchemaStore schemas refer to others that the cache holds"
    for e in bundled:
        refs = json.dumps(e.schema)
        assert "#/definitions/__schemastore_" in refs
    # the unresolved ones are listed, and every other ref is local
    for e in entries:
        assert list(e.unresolved) == rw.unresolved_refs(e.schema)


def test_bundle_and_unresolved_refs_on_a_small_schema():
    schema = {"properties": {"a": {"$ref": "#/definitions/x"}, "b": {"$ref": "https://example.invalid/s.json#/y"},
                             "c": {"enum": [{"$ref": "data, not a schema"}]}},
              "definitions": {"x": {"type": "string"}}}
    out = rw.bundle("https://example.invalid/host.json", schema)
    assert out["properties"]["a"]["$ref"] == "#/definitions/x"
    assert rw.unresolved_refs(out) == ["https://example.invalid/s.json#/y"]
    host = "https://example.invalid/host.json"
    self_ref = rw.bundle(host, {"$ref": f"{host}#/definitions/x", "definitions": {"x": {}}})
    assert self_ref["$ref"] == "#/definitions/x"
    with pytest.raises(TypeError, match="schema"):
        rw.bundle("u", [])


def test_sample_is_fixed():
    a, b = rw.sample(5, seed=0), rw.sample(5, seed=0)
    assert [n for n, _ in a] == [n for n, _ in b]
    assert len(a) == 5
    names = [n for n, _ in rw.catalog()]
    assert [n for n, _ in a] == sorted((n for n, _ in a), key=names.index)
    assert [n for n, _ in rw.sample(5, seed=1)] != [n for n, _ in a]
    with pytest.raises(ValueError, match="n must"):
        rw.sample(0)
    with pytest.raises(ValueError, match="n must"):
        rw.sample(10**6)


# --- statistics --------------------------------------------------------------------------------------------

def test_summarize_matches_numpy():
    rng = np.random.default_rng(0)
    for values in (np.arange(1, 1001, dtype=float), rng.lognormal(3, 1, 5000), np.array([7.0])):
        s = rw.summarize(values)
        assert s["n"] == values.size
        for q in (50, 99, 99.9):
            assert s[f"p{q:g}"] == pytest.approx(np.percentile(values, q))
        assert s["max"] == values.max() and s["mean"] == pytest.approx(values.mean())
    s = rw.summarize(range(1, 1001))
    assert s["p50"] == 500.5 and s["p99"] == pytest.approx(990.01) and s["max"] == 1000
    empty = rw.summarize([])
    assert empty["n"] == 0 and empty["p50"] is None and empty["max"] is None
    with pytest.raises(ValueError, match="NaN"):
        rw.summarize([1.0, float("nan")])
    with pytest.raises(ValueError, match="percentiles"):
        rw.summarize([1.0], percentiles=(101,))


def test_share_and_popcount():
    assert rw.share(13, 100) == 0.13 and rw.share(0, 0) is None
    with pytest.raises(ValueError):
        rw.share(-1, 3)
    words = np.zeros(4, dtype=np.int32)
    words.view(np.uint32)[:] = [0, 1, 0xFFFFFFFF, 0x80000000]
    assert rw.popcount(words) == 34


def test_summarize_engine_on_known_records():
    def rec(outcome, compile_s=None, masks=(), forced=0, tokens=0):
        return rw.EngineRecord(outcome, compile_s=compile_s, first_mask_s=0.0 if compile_s else None,
                               mask_us=list(masks), forced=forced, tokens=tokens)

    results = []
    for i, r in enumerate([rec("compiled", 0.001, [1, 2, 3], 1, 2), rec("compiled", 0.003, [10, 20], 0, 2),
                           rec("refused"), rec("timeout")]):
        sr = rw.SchemaResult(f"s{i}", 10)
        sr.engines["llguidance"] = r
        results.append(sr)
    s = rw.summarize_engine(results, "llguidance")
    assert (s["schemas"], s["compiled"], s["refused"], s["timeout"]) == (4, 2, 1, 1)
    assert s["compiled_share"] == 0.5 and s["timeout_share"] == 0.25
    assert s["compile_ms"]["p50"] == pytest.approx(2.0) and s["compile_ms"]["max"] == pytest.approx(3.0)
    assert s["mask_us"]["p50"] == pytest.approx(np.percentile([1, 2, 3, 10, 20], 50))
    assert s["mask_us"]["max"] == 20 and s["masks"] == 5
    assert s["forced_share"] == 0.25 and s["tokens"] == 4


def test_maskbench_figures_are_the_published_ones():
    old = rw.MASKBENCH["runs"]["2025-01"]["mask_us"]["llguidance"]
    assert (old["p50"], old["p99"], old["p99.9"]) == (36, 460, 1453)
    assert rw.MASKBENCH["forced_share"] == 0.13
    assert rw.MASKBENCH_LLGUIDANCE_MASK_US["p99.9"] == 1453
    assert "guidance-ai/jsonschemabench" in rw.MASKBENCH["runs"]["2025-01"]["url"]


# --- bad input -----------------------------------------------------------------------------------------------

def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="engines.*'nope'"):
        next(rw.measure(SMALL[:1], engines=("nope",)))
    with pytest.raises(ValueError, match="engines"):
        next(rw.measure(SMALL[:1], engines=()))
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            next(rw.measure(SMALL[:1], timeout=bad))
    with pytest.raises(ValueError, match="vocab.*no-such-vocabulary"):
        next(rw.measure(SMALL[:1], "no-such-vocabulary"))
    with pytest.raises(TypeError, match="schemas"):
        next(rw.measure([("x", "not a dict")], engines=("outlines-core",)))
    with pytest.raises(ValueError, match="n_docs"):
        next(rw.measure(SMALL[:1], n_docs=-1))
    with pytest.raises(ValueError, match="mp_context"):
        next(rw.measure(SMALL[:1], mp_context="threads"))


def test_cli_errors_are_one_line(capsys):
    for argv, flag in ((["--engines", "nope"], "--engines"), (["--timeout", "0"], "--timeout"),
                       (["--vocab", "no-such-vocabulary", "--limit", "1"], "vocab"),
                       (["--sample", "0"], "--sample"),
                       (["--vocab", "cl100k_base", "o200k_base", "--out", "/tmp/x.json"], "--out")):
        assert cli.main(list(argv)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and flag in err[0], err
        assert "Traceback" not in err[0]


# --- measuring -------------------------------------------------------------------------------------------------

@needs_peers
def test_measure_small_schemas_all_engines():
    results = list(rw.measure(SMALL, "cl100k_base", timeout=30.0, n_docs=2, max_tokens=60))
    assert [r.name for r in results] == [n for n, _ in SMALL]
    for r in results:
        assert set(r.engines) == set(rw.ENGINES)
        assert all(rec.outcome in rw.OUTCOMES for rec in r.engines.values())
        assert all(rec.outcome == "compiled" for rec in r.engines.values()), {e: x.error for e, x in r.engines.items()}
        assert r.walker == "llguidance"
        assert len(r.documents) == 2
        for e, rec in r.engines.items():
            assert rec.compile_s > 0 and rec.first_mask_s >= 0
            assert rec.tokens > 0 and len(rec.mask_us) >= rec.tokens and all(t > 0 for t in rec.mask_us)
            assert 0 <= rec.forced <= rec.tokens
    # every document the engines said was complete validates with jsonschema
    import jsonschema

    schemas = dict(SMALL)
    vocab = rw.resolve_vocabulary("cl100k_base")
    checked = 0
    for r in results:
        for d in r.documents + [d for rec in r.engines.values() for d in rec.own_documents]:
            assert d.status in rw.DOC_STATUSES
            if d.complete:
                assert d.status == "valid", d.error
                jsonschema.validate(json.loads(vocab.decode(d.ids)), schemas[r.name])
                checked += 1
    assert checked >= 4
    doc = {"vocab": "cl100k_base", "summary": {e: rw.summarize_engine(results, e) for e in rw.ENGINES},
           "documents": rw.summarize_documents(results)}
    table = rw.results_table(doc)
    assert "MaskBench" in table and "| llguidance | cl100k_base | 3 | 100% |" in table


@needs_peers
def test_a_looping_compile_is_killed_at_the_limit():
    """outlines-core runs on the looping pattern past a 1 s limit: its worker is killed, a new one starts,
    and llguidance still compiles the same schema; an unresolved ref is refused by every engine."""
    unresolved = ("remote", {"$ref": "https://example.invalid/other.json"})
    t0 = time.monotonic()
    results = list(rw.measure([LOOPING, unresolved, SMALL[0]], "cl100k_base",
                              engines=("outlines-core", "llguidance"), timeout=1.0, n_docs=1, max_tokens=40))
    elapsed = time.monotonic() - t0
    loop, remote, flag = results
    assert loop.engines["outlines-core"].outcome == "timeout"
    assert "1 s" in loop.engines["outlines-core"].error
    assert loop.engines["llguidance"].outcome == "compiled"
    assert loop.walker == "llguidance" and loop.documents[0].status in ("valid", "incomplete")
    assert {rec.outcome for rec in remote.engines.values()} == {"refused"}
    assert all("unresolved $ref" in rec.error for rec in remote.engines.values())
    assert flag.engines["outlines-core"].outcome == "compiled"  # the restarted worker works
    assert elapsed < 45, f"killed at the limit, but the whole run took {elapsed:.0f} s"


@needs_peers
def test_refusals_keep_the_first_line_and_run_writes_json(tmp_path):
    # llguidance refuses keywords it does not implement; both refuse an invalid pattern
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    bad_pattern = {"type": "string", "pattern": "("}
    out = tmp_path / "realworld.json"
    doc = rw.run([("unique", schema), ("bad", bad_pattern)], "cl100k_base", engines=("outlines-core", "llguidance"),
                 timeout=20.0, out=out, n_docs=1, max_tokens=30)
    results = doc["_results"]
    assert results[0].engines["llguidance"].outcome == "refused"
    assert "uniqueItems" in results[0].engines["llguidance"].error
    for rec in results[1].engines.values():
        assert rec.outcome == "refused" and rec.error and "\n" not in rec.error
    written = json.loads(out.read_text())
    assert written["partial"] is False and written["vocab"] == "cl100k_base"
    assert set(written["summary"]) == {"outlines-core", "llguidance"}
    s = written["summary"]["llguidance"]
    assert (s["schemas"], s["compiled"], s["refused"], s["timeout"]) == (2, 0, 2, 0)
    assert s["mask_us"]["p50"] is None and s["forced_share"] is None
    assert written["maskbench"]["runs"]["2025-01"]["mask_us"]["llguidance"]["p50"] == 36
    assert [r["name"] for r in written["schemas"]] == ["unique", "bad"]
    assert "| llguidance | cl100k_base | 2 | 0% | 100% | 0% |" in rw.results_table(written)
