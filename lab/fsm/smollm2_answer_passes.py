"""Forward passes on SmolLM2-135M-Instruct's own answers under each library's jump policy: chapter 01's suite
comparison (book.fsm.peers.compare_peers) run on the answers chapter 07's real model wrote.

Chapter 01 recommends a jump policy from documents walked at random through real schemas' automata in cl100k_base;
chapter 07 measures our exact token jumps on a real model, whose answers are short, copy the prompt and end where the
format forces them to. This script counts, on those answers, the passes each policy saves: our exact token jumps
and character jumps, xgrammar's jump-forward string, llguidance's fast-forward tokens. The answers: the `text` of
every request in lab/decode/real_model/h200_requests.json (chapter 07's real-model run, batch 1 and 4), each under
its suite entry's regex as chapter 07 compiles it (compact whitespace; a JSON entry's regex with its integer bounds),
in SmolLM2's vocabulary, each decoded by the writer model in the tokenizer's own split (the model's own ids may
split a few pieces otherwise). Writes assets/data/fsm_peers_smollm2.json.
Usage, from the repository root: python lab/fsm/smollm2_answer_passes.py   (CPU, a few minutes; needs the GGUF)
"""
from __future__ import annotations

import json
import subprocess
import time
from datetime import date
from pathlib import Path

from book.fsm import peers
from book.fsm.matchers import peer_versions
from studylog.decode.grammar import schema_regex
from studylog.fsm.schemas import entry as suite_entry
from studylog.fsm.vocabulary import load_vocabulary

ANSWERS = Path("lab/decode/real_model/h200_requests.json")
OUT = Path("assets/data/fsm_peers_smollm2.json")


class Answer:
    """A suite-entry look-alike for compare_peers: one regex, one text."""

    def __init__(self, name: str, regex: str, text: str):
        self.name, self._regex, self.text = name, regex, text

    def regex(self, whitespace: str) -> str:
        return self._regex

    def sample(self, rng, whitespace: str) -> str:
        return self.text


def main() -> None:
    vocab = load_vocabulary("smollm2")
    requests = json.loads(ANSWERS.read_text())["requests"]
    totals = {"none": 0, "tokens": 0, "answers": 0, "policies": {}}
    per_request, refused = [], []
    t0 = time.time()
    for key, req in requests.items():
        name = key.split("/")[0]
        entry = suite_entry(name)
        regex = schema_regex(entry.schema, "compact") if entry.kind == "json" else entry.regex("compact")
        rec = {"request": key, "answers": 0, "tokens": 0, "none": 0}
        for i, text in enumerate(req["text"]):
            try:
                rows = peers.compare_peers([Answer(name, regex, text)], vocab, n_samples=1, whitespace="compact")
            except peers.PeerError as exc:  # an answer one library's language lacks: out of the totals
                refused.append(f"{key} answer {i}: {str(exc)[:160]}")
                continue
            rec["answers"] += 1
            peers.tally(rows, totals, rec)
        totals["answers"] += rec["answers"]
        totals["tokens"] += rec["tokens"]
        per_request.append(rec)
        print(key, rec, f"{time.time() - t0:.0f}s", flush=True)
    for k, slot in totals["policies"].items():
        print(f"{k}: saves {1 - slot['passes'] / totals['none']:.1%} of {totals['none']} passes "
              f"(noncanonical {slot['noncanonical']})")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"command": "python lab/fsm/smollm2_answer_passes.py", "commit": commit, "date": date.today().isoformat(),
              "seconds": round(time.time() - t0, 1), "versions": peer_versions(), "vocab": "smollm2",
              "whitespace": "compact", "answers_from": str(ANSWERS), "refused": refused, "totals": totals,
              "requests": per_request}
    OUT.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
