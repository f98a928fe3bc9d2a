"""Forward passes on real SchemaStore schemas under each library's jump policy (our exact token jumps and
character jumps, xgrammar's jump-forward string, llguidance's fast-forward tokens): chapter 01's suite
comparison (book.fsm.peers.compare_peers) run on real documents.

The schemas: the realworld run's sample (assets/data/realworld_<vocab>.json) where all three engines compiled.
All three libraries compile the same regex, outlines' compact JSON regex of the schema (no whitespace between
JSON tokens), as on the suite. The documents: N_DOCS a schema from a seeded random walk of our automaton over
that regex (book.fsm.realworld.walk_documents: strings and numbers short, objects given keys), kept where
jsonschema accepts them, then decoded by the writer model in the tokenizer's own split under every policy.
Writes assets/data/fsm_peers_realworld.json (the totals as assets/data/fsm_peers.json keeps them).
Usage, from the repository root: python lab/fsm/real_schema_passes.py [vocab]  (CPU, about 15 minutes)
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from book.fsm import peers
from book.fsm.matchers import peer_versions
from book.fsm.realworld import sample
from book.fsm.realworld.engines import ENGINE_CLASSES, walk_documents
from studylog.fsm.automaton import regex_from_schema
from studylog.fsm.vocabulary import load_vocabulary


N_DOCS = 8


class RealEntry:
    """A suite-entry look-alike for compare_peers: one schema, its regex, its documents in order."""

    def __init__(self, name: str, regex: str, texts: list[str]):
        self.name, self._regex, self.texts, self._next = name, regex, texts, 0

    def regex(self, whitespace: str) -> str:
        return self._regex

    def sample(self, rng, whitespace: str) -> str:
        text = self.texts[self._next % len(self.texts)]
        self._next += 1
        return text


def main(vocab_name: str = "cl100k_base", out: str = "assets/data/fsm_peers_realworld.json") -> None:
    vocab = load_vocabulary(vocab_name)
    run = json.loads(Path(f"assets/data/realworld_{vocab_name}.json").read_text())
    settings = run["settings"]
    compiled = [s["name"] for s in run["schemas"]
                if all(e["outcome"] == "compiled" for e in s["engines"].values())]
    schemas = dict(sample(n=run["schemas_measured"], seed=settings["seed"]))
    walker = ENGINE_CLASSES["outlines-core"](vocab)  # documents of the regex all three compile
    totals = {"none": 0, "policies": {}}
    per_schema = []
    t0 = time.time()
    for name in compiled:
        schema = schemas[name]
        grammar, _ = walker.compile(schema)
        docs = walk_documents(walker, grammar, schema, n_docs=N_DOCS, max_tokens=settings["max_tokens"],
                              seed=settings["seed"], name=name)
        texts = [vocab.decode(d.ids).decode("utf-8") for d in docs if d.status == "valid"]
        if not texts:
            per_schema.append({"schema": name, "documents": 0})
            continue
        regex = regex_from_schema(schema, whitespace_pattern="")
        rec = {"schema": name, "documents": len(texts), "refused": [], "tokens": 0, "none": 0}
        for i, text in enumerate(texts):
            try:
                rows = peers.compare_peers([RealEntry(name, regex, [text])], vocab, n_samples=1, whitespace="compact",
                                          fsms={name: grammar})
            except peers.PeerError as exc:  # a document one library's language lacks: out of the totals
                rec["refused"].append(f"document {i}: {str(exc)[:160]}")
                continue
            peers.tally(rows, totals, rec)
        per_schema.append(rec)
        print(name, rec, f"{time.time() - t0:.0f}s", flush=True)
    for key, slot in totals["policies"].items():
        print(f"{key}: saves {1 - slot['passes'] / totals['none']:.1%} of {totals['none']} passes "
              f"(noncanonical {slot['noncanonical']})")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"command": f"python lab/fsm/real_schema_passes.py {vocab_name}", "commit": commit,
              "date": date.today().isoformat(), "seconds": round(time.time() - t0, 1),
              "versions": peer_versions(), "vocab": vocab_name, "whitespace": "compact",
              "schemas_from": f"assets/data/realworld_{vocab_name}.json (all three engines compiled)",
              "documents": f"{N_DOCS} a schema, seeded random walk of our automaton (seed {settings['seed']}, "
                           f"max {settings['max_tokens']} tokens), kept where jsonschema accepts them",
              "totals": totals, "schemas": per_schema}
    Path(out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
