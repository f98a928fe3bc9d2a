"""The chapter's measurement (no GPU benchmark): the suite decoded by the writer model in the three modes, forward
passes counted (``python -m studylog.fsm report`` prints :func:`savings_table`)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from studylog.fsm.automaton import ConstrainedFSM
from studylog.fsm.decoding import MODES, decode, writer_model
from studylog.fsm.vocabulary import TokenVocabulary, load_vocabulary


@dataclass
class EntryResult:
    """Measurements of one suite entry under one whitespace pattern."""

    name: str
    kind: str
    whitespace: str
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
                  fsm: Optional[ConstrainedFSM] = None, *, ascii_digits: bool = True
                  ) -> tuple[EntryResult, ConstrainedFSM]:
    """Decode ``n_samples`` outputs of an entry by the writer model in each mode (each checked), and count passes."""
    regex = entry.regex(whitespace, ascii_digits=ascii_digits)
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
    result = EntryResult(entry.name, entry.kind, whitespace, n_samples, tokens, passes, jumped, retok, noncanonical,
                         visited)
    return result, fsm


def run_suite(vocab: Optional[TokenVocabulary] = None, whitespaces: Sequence[str] = ("default", "compact"),
              n_samples: int = 8, seed: int = 0, keep: Optional[Callable[[EntryResult, ConstrainedFSM], None]] = None,
              progress: bool = False, ascii_digits: bool = True) -> list[EntryResult]:
    """Measure every suite entry (JSON entries once per whitespace pattern). ``keep(result, fsm)`` sees each
    automaton while it is alive (memory holds one index at a time)."""
    from studylog.fsm import schemas

    vocab = vocab or load_vocabulary()
    jobs = [(e, ws) for ws in whitespaces for e in schemas.suite() if e.kind == "json" or ws == whitespaces[0]]
    if progress:
        from tqdm.auto import tqdm

        jobs = tqdm(jobs, desc="suite")
    results = []
    for e, ws in jobs:
        res, fsm = measure_entry(e, vocab, ws, n_samples, seed, ascii_digits=ascii_digits)
        if keep is not None:
            keep(res, fsm)
        results.append(res)
        del fsm
    return results


def suite_summary(results: Sequence[EntryResult]) -> dict[str, dict]:
    """Per whitespace pattern, the suite's totals, and the share of passes each mode saves over none."""
    out = {}
    for ws in dict.fromkeys(r.whitespace for r in results):
        rows = [r for r in results if r.whitespace == ws]
        passes = {m: sum(r.passes[m] for r in rows) for m in MODES}
        out[ws] = {"entries": len(rows), "documents": sum(r.samples for r in rows),
                   "tokens": sum(r.tokens for r in rows), "passes": passes,
                   "retokenized": sum(r.retokenized for r in rows),
                   "saved": {m: 1.0 - passes[m] / passes["none"] for m in MODES if m != "none"}}
    return out


def savings_table(results: Sequence[EntryResult]) -> str:
    """A Markdown table: per entry and whitespace, the passes of steps 1/2/3 and the share 2 and 3 save; totals last."""
    wss = list(dict.fromkeys(r.whitespace for r in results))
    head = "| entry | " + " | ".join(f"{ws} whitespace: passes, step 1 / 2 / 3 | saved by step 2 / 3" for ws in wss)
    lines = [head + " |", "|---|" + "---|---|" * len(wss)]

    def cells(group: Sequence[EntryResult]) -> list[str]:
        if not group:
            return ["–", "–"]
        p = {m: sum(r.passes[m] for r in group) for m in MODES}
        return [f"{p['none']} / {p['token']} / {p['char']}",
                f"{100 * (1 - p['token'] / p['none']):.1f}% / {100 * (1 - p['char'] / p['none']):.1f}%"]

    for name in dict.fromkeys(r.name for r in results):  # an entry measured once per whitespace pattern
        out = [name] + [c for ws in wss for c in cells([r for r in results if (r.name, r.whitespace) == (name, ws)])]
        lines.append("| " + " | ".join(out) + " |")
    total = ["**all**"] + [f"**{c}**" for ws in wss for c in cells([r for r in results if r.whitespace == ws])]
    lines.append("| " + " | ".join(total) + " |")
    return "\n".join(lines)

