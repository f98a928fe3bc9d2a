"""The chapter's measurement: the schema suite, decoded by the writer model in the three modes.

This chapter has no GPU benchmark (``CHAPTER.bench`` is None): what it measures is CPU work, forward passes
counted on the suite of :mod:`studylog.fsm.schemas` and the time of the index build and of the jump
precompute (``time.perf_counter``). The notebook runs :func:`run_suite`; ``python -m studylog.fsm report``
prints :func:`savings_table` and ``python -m studylog.fsm figure`` draws :func:`plot_savings` into
``assets/figures/fsm_savings.png`` (the chapter's teaser on the blog's landing page).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from studylog.fsm.automaton import ConstrainedFSM
from studylog.fsm.decoding import MODES, decode, writer_model
from studylog.fsm.vocabulary import TokenVocabulary, load_vocabulary

#: Published reference point: share of tokens a grammar forces on JSON schemas (MaskBench, llguidance).
MASKBENCH_FORCED_SHARE = (0.13, 0.15)


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
                  fsm: Optional[ConstrainedFSM] = None, *, ascii_digits: bool = True
                  ) -> tuple[EntryResult, ConstrainedFSM]:
    """Sample ``n_samples`` valid outputs of a suite entry; decode each with the writer model in the three
    modes; check that every mode writes the sample exactly; count passes. ``ascii_digits`` picks the
    entry's regex (see :meth:`studylog.fsm.schemas.SuiteEntry.regex`)."""
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
    result = EntryResult(entry.name, entry.kind, whitespace, len(regex), len(fsm.states), fsm.build_seconds,
                         fsm.precompute_seconds, len(fsm.token_jumps), len(fsm.char_jumps), n_samples, tokens,
                         passes, jumped, retok, noncanonical, visited)
    return result, fsm


def run_suite(vocab: Optional[TokenVocabulary] = None, whitespaces: Sequence[str] = ("default", "compact"),
              n_samples: int = 8, seed: int = 0, keep: Optional[Callable[[EntryResult, ConstrainedFSM], None]] = None,
              progress: bool = False, ascii_digits: bool = True) -> list[EntryResult]:
    """Measure every suite entry (JSON entries once per whitespace pattern, regex entries once).

    ``keep(result, fsm)`` is called while each automaton is alive (for example to copy masks out); the
    automata are then dropped, so memory holds one index at a time. ``ascii_digits=False`` measures
    outlines' regexes unchanged, where ``\\d`` is any Unicode digit."""
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


# --- figures ---------------------------------------------------------------------------------------------

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


# --- what a wider character class costs -----------------------------------------------------------------

def extra_tokens(wide: ConstrainedFSM, narrow: ConstrainedFSM, ids: Sequence[int]) -> list[np.ndarray]:
    """Walk ``ids`` through two automata of the same vocabulary, ``narrow`` accepting a subset of ``wide``'s
    texts (the same schema with ``[0-9]`` instead of Unicode ``\\d``): for each state on the way, from the
    start to the state after the last token, the ids that ``wide`` allows there and ``narrow`` does not."""
    return [np.setdiff1d(wide.allowed_array(s), narrow.allowed_array(t))
            for s, t in zip(wide.walk(ids), narrow.walk(ids), strict=True)]
