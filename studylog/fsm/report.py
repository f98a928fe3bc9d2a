"""The chapter's measurement (``python -m studylog.fsm report``): the suite decoded by the writer model in the three
modes, forward passes counted, and the states visited (lab/fsm/export_masks.py keeps some masks for chapter 2)."""

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
    retokenized: int                # char mode: emitted tokens replaced by retokenization
    visited: dict[int, int] = field(default_factory=dict, repr=False)  # state -> allowed tokens (none mode)


def measure_entry(entry, vocab: TokenVocabulary, whitespace: str = "default", n_samples: int = 8, seed: int = 0,
                  fsm: Optional[ConstrainedFSM] = None, *, ascii_digits: bool = True
                  ) -> tuple[EntryResult, ConstrainedFSM]:
    """Decode ``n_samples`` outputs of an entry by the writer model in each mode (each checked), and count passes."""
    fsm = fsm or ConstrainedFSM(entry.regex(whitespace, ascii_digits=ascii_digits), vocab, name=entry.name)
    rng = random.Random(f"{seed}/{entry.name}/{whitespace}")
    passes = dict.fromkeys(MODES, 0)
    tokens = retok = 0
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
            retok += out.retokenized  # nonzero in char mode alone
            if mode == "none":
                visited.update({s: fsm.n_allowed(s) for s in fsm.walk(out.ids)})
    return EntryResult(entry.name, entry.kind, whitespace, n_samples, tokens, passes, retok, visited), fsm


def run_suite(vocab: Optional[TokenVocabulary] = None, whitespaces: Sequence[str] = ("default", "compact"),
              n_samples: int = 8, seed: int = 0, keep: Optional[Callable[[EntryResult, ConstrainedFSM], None]] = None,
              progress: bool = False, ascii_digits: bool = True) -> list[EntryResult]:
    """Every suite entry measured (JSON ones per whitespace pattern); ``keep(result, fsm)`` sees each automaton while
    it lives (one index in memory at a time)."""
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
    head = " | ".join(f"{ws} whitespace: passes, step 1 / 2 / 3 | saved by step 2 / 3" for ws in wss)
    lines = [f"| entry | {head} |", "|---|" + "---|---|" * len(wss)]

    def row(label: str, name: Optional[str], bold: str = "") -> str:  # name None: every entry
        cells = []
        for ws in wss:
            group = [r for r in results if r.whitespace == ws and name in (None, r.name)]
            n, t, c = (sum(r.passes[m] for r in group) for m in MODES)
            cells += ([f"{n} / {t} / {c}", f"{100 * (1 - t / n):.1f}% / {100 * (1 - c / n):.1f}%"] if group
                      else ["–", "–"])
        return f"| {label} | " + " | ".join(f"{bold}{c}{bold}" for c in cells) + " |"

    names = dict.fromkeys(r.name for r in results)  # an entry measured once per whitespace pattern
    return "\n".join(lines + [row(name, name) for name in names] + [row("**all**", None, "**")])
