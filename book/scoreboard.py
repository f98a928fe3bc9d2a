"""The scoreboard: how close each chapter's final kernel is to its limit, read from the committed benchmark JSON.

One row per chapter and card (``assets/bench/<card>/<chapter>.json``): the chapter's final kernel at its headline
shape, its time over the run's repetitions, the strongest rival measured at the same shape, and its floors:

* the **byte floor**: the bytes the call must move at the copy bandwidth measured in the same run (the row's
  ``floor_ms``, or ``floor_mem_ms`` where the file splits memory from compute);
* the **compute floor**: the useful FLOPs at the run's measured matmul rate, where the file records one;
* the **latency floor**: the GPU-clock time of the shortest chain of dependent work the call cannot avoid: for a
  one-launch kernel the empty kernel replayed in a CUDA graph by the run that timed the row
  (``ceilings.empty_launch_gpu_ms``; where that run timed none, the card's fastest, :func:`card_empty_kernel_ms`,
  and the row is marked); for chapter 04's recursion the
  timed chain of its T dependent frames; for a decode step its forward's kernels, one after another.

The case's **floor** is the largest of these, a yardstick from a simple model (a kernel passes it only by moving
fewer bytes than counted or by being served from L2); "× floor" is our median over that floor (1.0× would be at
the floor; ``pct_of_floor`` keeps it turned over, as a percentage). Each row names its floor's kind; a decode loop's
floors (chapters 07 and 08) count our own loop's forwards and kernels, so its cells call them our loop's bounds.
Where the call's own work sets a tighter bound that a run times (chapter 02's bitmask copy from host memory then two
launches; chapter 05's read of the packed weights alone), the row keeps it apart from the card's floors
(``design_bound_ms``), in a column of its own. A row whose floor that binds is not measured on its card gets no ratio. Where a file lacks a number the scoreboard needs, the cell says "not measured" and
:func:`missing` says why; nothing is filled in by hand.

The module reads the JSON files directly (no chapter code is imported), so the page and its test do not depend on
how the library is laid out. A chapter is one :class:`Entry` in :data:`ENTRIES`: a new chapter (chapter 08, say)
appends one with its ``measure`` function, and appears on the scoreboard, the results page, the landing page's reading
path (which follows ``_toc.yml``) and the README.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from book.common import against, cached_on_files, is_tie, read_json, us
from studylog.paths import BENCH_RESULTS

#: What a cell reads where the committed files do not hold the number.
NOT_MEASURED = "not measured"

# ----------------------------------------------------------------------------------------------
# Reading the files
# ----------------------------------------------------------------------------------------------

def cards(root: Path = BENCH_RESULTS) -> list[Path]:
    """The card folders under ``root`` that hold benchmark files, in name order."""
    return sorted(p for p in Path(root).iterdir() if p.is_dir() and any(p.glob("*.json")))


def load(card: Path, chapter: str) -> dict[str, Any] | None:
    """A chapter's benchmark file on one card, as JSON (None when the card has none)."""
    path = Path(card) / f"{chapter}.json"
    return read_json(path) if path.is_file() else None


def rows(data: dict[str, Any], series: str, **params: Any) -> list[dict[str, Any]]:
    """The measurements of ``series`` whose parameters include ``params`` (a value of None: the key is absent)."""
    out = []
    for row in data["measurements"]:
        if row["series"] != series:
            continue
        if all(row["params"].get(k) == v for k, v in params.items()):
            out.append(row)
    return out


def one(data: dict[str, Any], series: str, **params: Any) -> dict[str, Any] | None:
    """The single measurement of ``series`` at ``params``; None when there is none; an error when several match."""
    found = rows(data, series, **params)
    if len(found) > 1:
        raise ValueError(f"{len(found)} rows of {series!r} match {params}")
    return found[0] if found else None


def empty_kernel_ms(data: dict[str, Any]) -> float | None:
    """An empty kernel's GPU time in this run (graph-replayed), or None where the file predates it."""
    return data.get("ceilings", {}).get("empty_launch_gpu_ms")


#: A lead below this (rival over ours) is read against both sides' spreads: the scoreboard says whether they overlap.
CLOSE_LEAD = 1.2


def spread(row: dict[str, Any]) -> tuple[float, float, float]:
    """(fastest, median, slowest) of a row's repetitions; a row without a spread is its one time three times."""
    lo, med, hi = row.get("spread_ms") or (row["ms"], row["ms"], row["ms"])
    return lo, med, hi


# ----------------------------------------------------------------------------------------------
# One chapter's row
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """A chapter on the scoreboard: where its lesson is, the question it answers, and how to read its final kernel,
    its rival and its floors out of one card's file (``measure(data) -> row`` or a list of rows, the headline first;
    None when the file lacks the series).
    ``bench`` is the benchmark file's stem (None: the chapter has no GPU benchmark, and ``absent`` says why)."""

    number: int
    title: str
    notebook: str
    question: str
    bench: str | None
    measure: Callable[[dict[str, Any]], dict[str, Any] | list[dict[str, Any]] | None] | None = None
    absent: str = ""
    #: What the headline compares, in words (the results page), and the rival in a few words (the landing page).
    headline: str = ""
    rival_short: str = "its rival"


def _row(ours_label: str, shape: str, clock: str, ours: dict[str, Any], rival_label: str,
         rival: dict[str, Any] | None, *, byte_floor_ms: float | None, latency_floor_ms: float | None,
         latency_what: str, compute_floor_ms: float | None = None, ratio: float | None = None,
         ratio_note: str = "", notes: tuple[str, ...] = (), rival_notes: tuple[str, ...] = (),
         floor_notes: tuple[str, ...] = (), gaps: tuple[str, ...] = (), short: str = "",
         no_pct_why: str = "") -> dict[str, Any]:
    """A scoreboard row from our measurement and the rival's (``ratio`` overrides rival median / our median, for a
    comparison made on another clock). ``short`` names the kernel in the tables (``ours_label`` goes to the notes);
    ``no_pct_why``: no floor is measured for all of the call's work, so no percentage is given, and why."""
    lo, med, hi = spread(ours)
    row = {"ours": short or ours_label, "ours_long": ours_label, "no_pct_why": no_pct_why, "shape": shape, "clock": clock, "fastest_ms": lo, "median_ms": med, "slowest_ms": hi,
           "rival": rival_label, "rival_ms": rival["ms"] if rival else None,
           "rival_spread_ms": spread(rival) if rival and rival.get("spread_ms") else None,
           "rival_clock": rival.get("clock") if rival else None,
           "byte_floor_ms": byte_floor_ms, "compute_floor_ms": compute_floor_ms,
           "latency_floor_ms": latency_floor_ms, "latency_what": latency_what, "ratio_note": ratio_note,
           "notes": list(notes), "rival_notes": list(rival_notes), "floor_notes": list(floor_notes),
           "gaps": list(gaps), "config": ours.get("config"), "graph_calls": ours.get("graph_calls"),
           "copies": ours.get("copies"), "read_bytes": ours.get("read_bytes")}
    row["vs_rival"] = ratio if ratio is not None else (rival["ms"] / med if rival else None)
    floors = {"bytes": byte_floor_ms, "compute": compute_floor_ms, "latency": latency_floor_ms}
    known = {k: v for k, v in floors.items() if v is not None}
    if known and not no_pct_why:
        row["binding"] = max(known, key=known.get)
        row["binding_floor_ms"] = known[row["binding"]]
        row["pct_of_floor"] = 100 * row["binding_floor_ms"] / med
    else:
        row["binding"], row["binding_floor_ms"], row["pct_of_floor"] = None, None, None
    return row


def faster_rivals(data: dict[str, Any], ours: dict[str, Any], rival: dict[str, Any] | None, params: dict[str, Any],
                  skip: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Sentences naming every other peer or baseline measured at ``params`` on our clock that is faster than the
    rival the row shows (none when the chosen rival is the fastest): a new peer in a file is never hidden."""
    others = [r for r in data["measurements"] if r["role"] in ("peer", "baseline") and r["series"] not in skip
              and r.get("clock") == ours.get("clock") and all(r["params"].get(k) == v for k, v in params.items())
              and (rival is None or (r["series"] != rival["series"] and r["ms"] < rival["ms"]))]
    return tuple(f"{r['series']} is measured faster at this shape: {us(r['ms'])} µs" for r in others)


def _step_words(series: str) -> str:
    """``step07`` as a reader says it: ``step 7``."""
    m = re.match(r"step0*(\d+)", series)
    return f"step {m.group(1)}" if m else series


def _entry_label(what: str, series: str, ours: dict[str, Any]) -> str:
    """A final kernel named in words: ``what (step 7)``, or, where the row times the chapter's entry point that
    picks a step by a measured rule, ``what, its entry point (running step 7)``."""
    if ours.get("step"):
        return f"{what}, its entry point (running {_step_words(ours['step'])})"
    return f"{what} ({_step_words(series)})"


def _entry_short(series: str, ours: dict[str, Any]) -> str:
    """The final kernel in a table cell: the step it ran (``step 7``), the same words on every card whether the run
    timed the step or the entry point that picks it (the chapter's notes say which)."""
    return _step_words(ours["step"]) if ours.get("step") else _step_words(series)


#: The ternary steps that take bf16 x, in words.
TERNARY_WORDS = {"step14": "the ternary kernel on tensor cores, Triton", "step17": "the ternary CUDA kernel",
                 "step21": "the ternary kernel with TMA copies"}


#: The latency floor of a single kernel: the empty kernel timed by the row's own run.
ONE_KERNEL = "one empty kernel, graph-replayed"


@functools.lru_cache(maxsize=256)
def _file_facts(path: str, mtime_ns: int, size: int) -> tuple[str, float | None]:
    """A benchmark file's card name and empty-kernel time, parsed once per version of the file (the pages ask for
    them hundreds of times; a file rewritten on disk has a new key)."""
    data = json.loads(Path(path).read_text())
    return data["device"]["name"], empty_kernel_ms(data)


def file_facts(path: Path) -> tuple[str, float | None]:
    """:func:`_file_facts` of the file as it is on disk now."""
    st = Path(path).stat()
    return _file_facts(str(path), st.st_mtime_ns, st.st_size)


def card_empty_kernel_ms(card: Path) -> float | None:
    """The smallest empty-kernel GPU time of all the card's runs (None where none timed one): one latency floor per
    card, the least a one-launch kernel was seen to take there."""
    times = [file_facts(p)[1] for p in sorted(Path(card).glob("*.json"))]
    known = [t for t in times if t is not None]
    return min(known) if known else None


def chapter_run_words(stem: str) -> str:
    """A benchmark file named for a reader: ``decode`` -> ``chapter 07's``, ``tails`` -> ``the tails'``."""
    from studylog.chapter import get

    try:
        return f"chapter {get(stem).number:02d}'s"
    except (KeyError, ValueError, ImportError):
        return f"the {stem}'"


def empty_kernel_range(root: Path = BENCH_RESULTS) -> dict[str, tuple[float, float, str]]:
    """Each card's (short name) fastest and slowest graph-replayed empty kernel over all its runs, in µs, and which
    runs gave the fastest ("" where every run agrees): the one-launch latency floor is the fastest, since a floor is
    the least a call can take; the slowest says how far the card's state moves it."""
    out = {}
    for card in cards(root):
        runs = [(t * 1e3, p.stem) for p in sorted(Path(card).glob("*.json"))
                if (t := empty_kernel_ms(read_json(p))) is not None]
        if not runs:
            continue
        lo, hi = min(t for t, _ in runs), max(t for t, _ in runs)
        least = [chapter_run_words(stem) for t, stem in runs if f"{t:.2f}" == f"{lo:.2f}"]
        where = f"{' and '.join(least)} run{'s' if len(least) > 1 else ''}" if len(least) < len(runs) else ""
        out[short_card(card_name(card))] = (lo, hi, where)
    return out


#: The runs whose smallest cases one launch bounds (chapters 02, 03 and 05).
LAUNCH_BOUND_RUNS = ("masked_lm_head", "ngram", "ternary")


def ngram_row_words(root: Path = BENCH_RESULTS) -> str:
    """Chapter 03's two rows, its headline case then its stress shape, and its least lead, over the shapes the lead
    card measured, at short prompts; empty without the file."""
    from book.results import ngram_many, ngram_ratios

    folder = next((c for c in cards(root) if short_card(card_name(c)) == LEAD_CARD), None)
    pairs = ngram_ratios(folder) if folder is not None else {}
    many = ngram_many(folder) if folder is not None else None
    if not pairs or many is None:
        return ""
    (b, t, _), x, _ = many
    (lb, lt, _), (ours, theirs) = min(pairs.items(), key=lambda kv: kv[1][1]["ms"] / kv[1][0]["ms"])
    return (f" Chapter 03 has two rows: its headline case, then its stress case, {b} × {t:,} with no budget, where "
            f"most slots search; its least lead, {theirs['ms'] / ours['ms']:.2f}× at {lb} × {lt:,}, is where prompts "
            "are short and little is searched.")


def launch_floor_blur(root: Path = BENCH_RESULTS) -> float | None:
    """How far a one-launch "× card's floor" can sit above 1 from the empty kernel's drift alone: on the card whose
    empty kernel moves most between runs, the slowest empty kernel of the runs of :data:`LAUNCH_BOUND_RUNS` over the
    card's fastest (a kernel there as fast as its own run's empty kernel reads this × its floor), as How we measure's
    "Clocks and state" computes it; None without the runs."""
    spans = empty_kernel_range(root)
    if not spans:
        return None
    card, (lo, _, _) = max(spans.items(), key=lambda kv: kv[1][1] / kv[1][0])
    folder = next((c for c in cards(root) if short_card(card_name(c)) == card), None)
    own = [t for name in LAUNCH_BOUND_RUNS if folder is not None and (data := load(folder, name)) is not None
           and (t := data.get("ceilings", {}).get("empty_launch_gpu_ms")) is not None]
    return max(own) * 1e3 / lo if own and lo else None


def _floor_empty_ms(data: dict[str, Any]) -> float | None:
    """The empty kernel a latency floor counts: the run's own (the run that timed the row, as its byte floor uses
    that run's copy bandwidth), else, where that run timed none, the card's smallest (set by :func:`scoreboard`;
    the row is then marked, :data:`BORROWED_MARK`)."""
    own = empty_kernel_ms(data)
    return own if own is not None else data.get("card_empty_kernel_ms")


#: The mark on a latency floor priced at the card's fastest empty kernel because the row's own run timed none.
BORROWED_MARK = "†"


def _one_kernel(data: dict[str, Any]) -> tuple[float | None, str]:
    return _floor_empty_ms(data), ONE_KERNEL


#: Chapter 02's headline: the whole masked step from the packed bitmask, batch 1, 1,000 of 128,256 tokens allowed.
MASKED_HEAD_CASE = {"batch": 1, "kind": "random", "allowed": 1000}


def _masked_head_bytes(data: dict[str, Any], row: dict[str, Any]) -> float | None:
    """Chapter 02's byte floor at ``row``: its file's ``floor_ms`` is the larger of the bytes at the copy bandwidth
    and that run's own empty kernel (the chapter's floor); where the empty kernel is the larger, the bytes' floor is
    not in the file (None), and the scoreboard's latency column holds the card's fastest empty kernel instead."""
    floor = row.get("floor_ms")
    return None if floor is None or floor == empty_kernel_ms(data) else floor


def _masked_lm_head(data):
    """Two rows: the whole step from the grammar's packed bitmask against xgrammar's path (the chapter's headline),
    and step 12's kernel alone, from the allowed ids, against torch's index_select of the allowed rows."""
    out = []
    plan = one(data, "step13", **MASKED_HEAD_CASE)
    latency, what = _one_kernel(data)
    copy = one(data.get("tails_run") or {"measurements": []}, BITMASK_COPY, **MASKED_HEAD_CASE)
    # the own-work yardstick's launches at the run's empty kernel, as every row's floor and chapter 02's page price them
    floor = bitmask_chain_ms(data.get("tails_run"), _floor_empty_ms(data))
    # the whole step's shortest dependent chain: the bitmask's copy from host memory, then at least one kernel
    chain = bitmask_chain_ms(data.get("tails_run"), _floor_empty_ms(data), kernels=1)
    if plan is not None:
        # the card's floors are those of any call (its bytes, its shortest chain); the step's own design, a copy from host
        # memory then two dependent kernels, sets a tighter bound, given beside them, not in their place
        bound = ({"design_bound_ms": floor, "design_bound_words": f"our design's bound: the bitmask's copy + {BITMASK_CHAIN_KERNELS} launches",
                  "design_bound_what": f"the packed bitmask's copy from pinned host memory ({copy['bytes']:,} bytes), "
                                       f"timed alone in a separate run, then {BITMASK_CHAIN_KERNELS} dependent kernels "
                                       "at an empty kernel's time each: a bound on our step's design, not the card's"}
                 if floor is not None else {})
        gaps = () if floor is not None else ("a bound of the whole step from the bitmask: its copy from host memory "
                                             "is not timed on this card",)
        out.append(_row("the whole masked step from the packed bitmask (step 13)",
                        "batch 1, 1,000 of 128,256 tokens allowed", plan["clock"], plan,
                        "xgrammar (cuBLAS logits, then its mask kernel)",
                        one(data, "xgrammar_bitmask", **MASKED_HEAD_CASE), byte_floor_ms=_masked_head_bytes(data, plan),
                        latency_floor_ms=latency if chain is None else chain,
                        latency_what=what if chain is None else (
                            "the bitmask's copy from host memory, timed alone in a separate run, then one empty "
                            "kernel: no design can start before the bitmask arrives"),
                        short="step 13, whole step", gaps=gaps,
                        floor_notes=("byte floor: the allowed rows of the head read and the fp32 logits written, "
                                     "at the card's copy bandwidth; the packed bitmask's copy from host memory is "
                                     "not in it",))
                   | {"tail_params": MASKED_HEAD_CASE} | bound)
    kernel = one(data, "step12", **MASKED_HEAD_CASE, layout="vd")
    if kernel is not None:
        out.append(_row("the masked head's kernel alone, allowed ids given (step 12)",
                        "batch 1, 1,000 of 128,256 tokens allowed", kernel["clock"], kernel,
                        "torch index_select, then a matmul",
                        one(data, "index_select", **MASKED_HEAD_CASE), byte_floor_ms=_masked_head_bytes(data, kernel),
                        latency_floor_ms=latency, latency_what=what, short="step 12, kernel alone",
                        rival_notes=("index_select returns only the allowed logits; step 12 writes the whole [B, V] "
                                     "output, masked",)))
    once = replayed_one_copy(data)
    return [r | {"one_copy": once} for r in out] or None


#: The kernels chapter 02's whole step launches after the bitmask's copy, each needing the one before (the union's
#: ids, then the rows they name).
BITMASK_CHAIN_KERNELS = 2


def bitmask_chain_ms(tails: dict[str, Any] | None, empty_ms: float | None,
                     kernels: int = BITMASK_CHAIN_KERNELS) -> float | None:
    """A dependent chain of chapter 02's whole step at batch 1, in ms: the packed bitmask's copy from pinned host
    memory, timed alone in the card's tails run ``tails``, then ``kernels`` dependent kernels at the card's empty
    kernel ``empty_ms`` (our design's two: its own-work yardstick; one: any design's, the step's latency floor); None
    where either is not measured."""
    copy = one(tails, BITMASK_COPY, **MASKED_HEAD_CASE) if tails else None
    return None if copy is None or empty_ms is None else copy["ms"] + kernels * empty_ms


def replayed_one_copy(data: dict[str, Any]) -> bool:
    """Whether a run replayed each call on one copy of its input: no row records ``copies`` (what a call reads could
    then stay in L2 between calls, and a small read is served from L2)."""
    return not any("copies" in r for r in data["measurements"])


#: Chapter 03's deployed-budget case: 128 draft slots of 32,768 tokens, a budget of 128 drafted tokens (its steps
#: table's case, and the case its re-run times); the budget lets few of its slots search.
NGRAM_CASE = {"batch": 128, "seq_len": 32768, "threshold": 128, "corpus": None}
#: The budget the benchmark records for "no budget" (``studylog.ngram.NO_BUDGET``; a test checks they agree).
NGRAM_NO_BUDGET = 1 << 30
#: Chapter 03's lead case, the one its result, the landing and the results pages lead with: 512 slots of 16,384
#: tokens and no budget, where every active slot searches (``book.results.ngram_many``; a test checks they agree).
NGRAM_LEAD_CASE = {"batch": 512, "seq_len": 16384, "threshold": NGRAM_NO_BUDGET, "corpus": None}
#: Chapter 03's headline, the case its answer leads with: 32 slots of 512 tokens under the deployed budget of 128.
NGRAM_HEADLINE_CASE = {"batch": 32, "seq_len": 512, "threshold": 128, "corpus": None}


def _ngram(data):
    series = "ngram_match" if rows(data, "ngram_match") else "step12"
    ours = one(data, series, **NGRAM_CASE)
    if ours is None:
        return None
    cpu, synced = one(data, "step01", **NGRAM_CASE), one(data, "synced_step12", **NGRAM_CASE)
    ratio = cpu["ms"] / synced["ms"] if cpu and synced else None
    latency, what = _one_kernel(data)
    label = _entry_label("the GPU drafter", series, ours)
    row = _row(label, "128 slots of 32,768 tokens, budget 128", ours["clock"], ours,
               "the CPU loop it replaces", cpu, byte_floor_ms=ours.get("floor_ms"),
               latency_floor_ms=latency, latency_what=what, ratio=ratio, short=_entry_short(series, ours),
               ratio_note="end to end on the host (the call, then a sync) on both sides")
    row["ours_end_to_end_ms"] = synced["ms"] if synced else None
    row["ours_end_to_end_slowest_ms"] = (synced.get("spread_ms") or [None] * 3)[-1] if synced else None
    row["ours_end_to_end_spread_ms"] = synced.get("spread_ms") if synced else None
    row["rival_spread_ms"] = cpu.get("spread_ms") if cpu else None
    # the strongest rival is the faster of our ports of the pull request's GPU kernel on the GPU clock like ours:
    # its first version (step 3) or its revision's block-wide prefix sums, made exact (step 4); it leads, the
    # other stands in the notes, and the CPU loop the chapter's question is about stands beside it
    ports = {3: "our port of FastDeploy's first GPU n-gram kernel, two-phase (step 3)",
             4: "our corrected port of FastDeploy's revised GPU n-gram kernel, made exact (step 4)"}
    found = {n: one(data, f"step0{n}", **NGRAM_CASE) for n in ports}
    found = {n: r for n, r in found.items() if r is not None and r["clock"] == ours["clock"]}
    if not found:
        return [row]
    best = min(found, key=lambda n: found[n]["ms"])
    deployed_best = best  # the deployed budget's rival, named where its ratio is given beside the lead case's
    others = tuple(f"against {ports[n]}: {found[n]['ms'] / ours['ms']:.2f}×" for n in found if n != best)
    gpu_row = _row(label, "128 slots of 32,768 tokens, budget 128", ours["clock"], ours, ports[best], found[best],
                   byte_floor_ms=ours.get("floor_ms"), latency_floor_ms=latency, latency_what=what,
                   short=_entry_short(series, ours), rival_notes=others,
                   floor_notes=(f"byte floor: the haystacks of the slots that search at this step (those with room "
                                f"for a draft; the others are in prefill or empty), "
                                f"{ours['haystack_bytes'] / 1e6:.1f} MB of the "
                                f"{NGRAM_CASE['batch'] * NGRAM_CASE['seq_len'] * 8 / 1e6:.1f} MB the batch has room "
                                f"for ({NGRAM_CASE['batch']} slots × {NGRAM_CASE['seq_len']:,} tokens × 8 bytes), read "
                                "once at the card's copy bandwidth",)
                   if ours.get("haystack_bytes") else ())
    out = [gpu_row | {"tail_params": NGRAM_CASE, "deployed_budget": True}, row | {"floors_as_above": True}]
    # the chapter's headline case, the entry point against the faster port at 32 slots of 512 tokens, budget 128: the
    # page's first row for the chapter, its stress case after it
    head = one(data, series, **NGRAM_HEADLINE_CASE)
    found = {n: one(data, f"step0{n}", **NGRAM_HEADLINE_CASE) for n in ports}
    found = {n: r for n, r in found.items() if r is not None and head is not None and r["clock"] == head["clock"]}
    if found:
        best = min(found, key=lambda n: found[n]["ms"])
        out.append(_row(_entry_label("the GPU drafter", series, head),
                        f"{NGRAM_HEADLINE_CASE['batch']} slots of {NGRAM_HEADLINE_CASE['seq_len']:,} tokens, budget "
                        f"{NGRAM_HEADLINE_CASE['threshold']}", head["clock"], head, ports[best], found[best],
                        byte_floor_ms=head.get("floor_ms"), latency_floor_ms=latency, latency_what=what,
                        short=_entry_short(series, head))
                   | {"tail_params": NGRAM_HEADLINE_CASE, "page_headline": True})
    # the page's row: the chapter's lead case, where every active slot searches (the rows above stay first, as the
    # results page reads them: the deployed budget's ratio and the end-to-end one)
    lead = one(data, series, **NGRAM_LEAD_CASE)
    found = {n: one(data, f"step0{n}", **NGRAM_LEAD_CASE) for n in ports}
    found = {n: r for n, r in found.items() if r is not None and lead is not None and r["clock"] == lead["clock"]}
    if found:
        best = min(found, key=lambda n: found[n]["ms"])
        slots, length = NGRAM_LEAD_CASE["batch"], NGRAM_LEAD_CASE["seq_len"]
        deployed = (f"under the deployed budget ({NGRAM_CASE['batch']} slots of {NGRAM_CASE['seq_len']:,} tokens, "
                    f"budget {NGRAM_CASE['threshold']}), {gpu_row['vs_rival']:.2f}× against step {deployed_best} "
                    f"({against(gpu_row['median_ms'], gpu_row['rival_ms'])} µs); there the budget lets few slots search, so the chapter's table "
                    "gives that case its latency floor, not the active slots' bytes")
        out.append(_row(_entry_label("the GPU drafter", series, lead), f"{slots} slots of {length:,} tokens, no budget",
                        lead["clock"], lead, ports[best], found[best], byte_floor_ms=lead.get("floor_ms"),
                        latency_floor_ms=latency, latency_what=what, short=_entry_short(series, lead),
                        rival_notes=(
                            # a run without the entry point's series times the chain's last step itself
                            ("this card's benchmark predates the chapter's entry point, which picks a step by shape: "
                             "it times step 12, the chain's last step",)
                            if series == "step12" else ()),
                        floor_notes=(f"byte floor: the haystacks of the active slots, every one of which searches with "
                                     f"no budget, {lead['haystack_bytes'] / 1e6:.1f} MB of the "
                                     f"{slots * length * 8 / 1e6:.1f} MB the batch has room for, read once at the "
                                     "card's copy bandwidth",) if lead.get("haystack_bytes") else ())
                   | {"tail_params": NGRAM_LEAD_CASE, "page_lead": True,
                      # the numbers each card adds, a column each in the chapter's notes table (with their sentence
                      # where the chapter has one row), and why the deployed budget's case has another floor, once
                      "rival_facts": tuple((f"vs step {n}, {slots} × {length:,}, no budget", f"{found[n]['ms'] / lead['ms']:.2f}×",
                                            f"against {ports[n]} at {slots} × {length:,}, no budget: "
                                            f"{found[n]['ms'] / lead['ms']:.2f}×") for n in found if n != best)
                      + ((f"vs step {deployed_best}, {NGRAM_CASE['batch']} × {NGRAM_CASE['seq_len']:,}, budget "
                          f"{NGRAM_CASE['threshold']} (µs)",
                          f"{gpu_row['vs_rival']:.2f}× ({against(gpu_row['median_ms'], gpu_row['rival_ms'])})",
                          deployed),),
                      "rival_facts_why": (f"under the deployed budget ({NGRAM_CASE['batch']} slots of "
                                          f"{NGRAM_CASE['seq_len']:,} tokens, budget {NGRAM_CASE['threshold']}) few "
                                          "slots search, so the chapter's table gives that case its latency floor, "
                                          "not the active slots' bytes")})
    return out


#: Chapter 04's headline: T = 150 frames, an alphabet of 5,000, a batch of 8 utterances.
CTC_CASE = {"T": 150, "A": 5000, "N": 8}
#: Its latency-bound case: the small alphabet (characters), one utterance.
CTC_SMALL_CASE = {"T": 150, "A": 28, "N": 1}


#: The tails run's kernel that does only the recursion's chain of frames (``studylog.ctc.floor.chain_floor``).
CTC_CHAIN = "ctc recursion chain (latency floor)"
#: The tails run's same chain at the headline case's longest target (the lab run below times it at every case).
CTC_HEADLINE_CHAIN = "ctc recursion chain, headline's longest target (latency floor)"
#: The lab run's chain at each case's own longest target (lab/ctc/case_chains.py): each case's latency floor.
CTC_CASE_CHAIN = "ctc recursion chain, the case's longest target"
#: The tails run's floors for chapters 02 and 08 (studylog.tails names them): the bitmask's copy from host memory,
#: and SmolLM2's one-token forward with its kernels counted.
BITMASK_COPY = "bitmask copy from host (latency floor)"
FORWARD = "smollm2 forward, one token (kernels counted)"


def _ctc_case_chains(card_folder: str | None) -> dict | None:
    """The lab run that times each case's own chain of frames on the card (``lab/ctc/results/<card>/case_chains.json``),
    or None where the card has none."""
    from studylog.plotting import load_lab

    try:
        return load_lab("ctc", "case_chains", card_folder) if card_folder else None
    except FileNotFoundError:
        return None


def _ctc(data):
    """Two rows of the chapter's final entry point, ``ctc_loss`` (it picks step 12, 13 or 14 by a measured rule),
    on every card whose file times it, else of the step it runs at each case: the headline shape (an alphabet of
    5,000, bound by its bytes), then the small alphabet at batch 1, where the recursion's chain of frames, not the
    bytes, sets the pace. Each case's latency floor is its own chain: a kernel that does only the recursion's T
    dependent frames (steps 10 to 14 run the forward and backward chains side by side) over the states of the case's
    longest target, timed for every case by a lab run (:func:`_ctc_case_chains`), where the card has one; the floor
    the row divides by is the larger of it and the bytes, as in every table of the chapter."""
    from studylog.ctc.results import entry_series

    # a run without the entry point is shown, at each case, at the step the entry point runs there, so that every
    # card times the same kernel
    # each case's own chain (T frames over its longest target's states), timed for every case by a lab run: the
    # chapter's latency floor, one rule for every case (book.ctc.lesson.case_floor): the larger of it and the bytes
    case_chains = _ctc_case_chains(data.get("card_folder"))
    out = []
    for case, shape in ((CTC_CASE, "T = 150, A = 5,000, N = 8"), (CTC_SMALL_CASE, "T = 150, A = 28, N = 1")):
        chain = one(case_chains, CTC_CASE_CHAIN, **case) if case_chains else None
        chain = chain if chain is not None and chain["params"].get("frames") == case["T"] else None
        used = entry_series(data, **case)
        ours = one(data, used, **case)
        if ours is None:
            continue
        rival = one(data, "torch-best", **case)
        latency, what = _one_kernel(data)
        gaps, floor_notes = (), ()
        if chain is not None:
            latency = chain["ms"]
            what = (f"the recursion's {chain['params']['frames']} dependent frames alone over the "
                    f"{chain['params']['states']} states of the case's longest target (a log-sum-exp and a warp "
                    "shuffle each), graph-replayed")
        else:  # the chain of frames is the chapter's latency floor on every card that times it: an empty kernel
            latency = None  # would put another quantity in the same column
            what = "the recursion's chain of frames alone is not timed on this card"
            if case is CTC_SMALL_CASE:  # there it is the floor that binds
                gaps = ("the latency floor of the recursion at the small alphabet (the chain of frames alone)",)
        label = f"torch {rival.get('picked', 'best').replace('torch-', '')}" if rival else "torch"
        row = _row(_entry_label("the fused CTC kernel", used, ours), shape, ours["clock"], ours, label, rival,
                   byte_floor_ms=ours.get("floor_ms"), latency_floor_ms=latency, latency_what=what,
                   rival_notes=faster_rivals(data, ours, rival, case, skip=("torch-cuDNN",)), gaps=gaps,
                   floor_notes=floor_notes,
                   short=_entry_short(used, ours) + ("" if case is CTC_CASE else "; A = 28, N = 1"))
        row["tail_params"] = case
        if latency is None:
            row["latency_missing_why"] = what
            if case is CTC_SMALL_CASE:  # the floor that binds here is not measured: no percentage
                row |= {"binding": None, "binding_floor_ms": None, "pct_of_floor": None}
        out.append(row)
    return out or None


#: Chapter 05's bf16-x case: one row of bf16 x times a 4096 x 14336 ternary matrix (a Llama 3 8B MLP projection).
TERNARY_CASE = {"shape": "4096x14336", "m": 1}
#: The chapter's kernels that take bf16 x, the product GemLite computes (the W2A8 steps quantise x first).
TERNARY_BF16_X = ("step14", "step17", "step21")


def accuracy_check(data: dict[str, Any], series: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The float64 check of ``series`` at ``params`` in this run (``passed`` says how it went), or None where the run
    has none."""
    return next((c for c in data.get("checks", []) if c["name"].startswith(f"{series} within")
                 and all(c["params"].get(k) == v for k, v in params.items())), None)


def _check_words(check: dict[str, Any] | None) -> str:
    if check is None:
        return "has no float64 check in this run"
    if check["passed"]:
        return "passes our float64 check in this run"
    return (f"fails our float64 check in this run ({check['relative_error']:.2%} of the product's norm against "
            f"{check['tolerance']:.2%}, bf16 rounding)")


def _ternary(data):
    """Chapter 05's rows, the headline first: where the card has the chapter's BitNet run, its one-row W2A8 kernel
    (step 23) against BitNet's own W2A8 kernel at the one of that kernel's shapes where our lead is smallest
    (:func:`_ternary_bitnet`);
    then its fastest bf16-x step at 4096 x 14336 against the fastest rival that passes our float64 check in the same
    run (:func:`_ternary_llama`)."""
    llama = _ternary_llama(data)
    if llama is None:
        return None
    bitnet = _ternary_bitnet(data)
    part_one = _ternary_part_one(data)
    out = ([bitnet] if bitnet is not None else []) + [llama] + ([part_one] if part_one is not None else [])
    # a call this short reaches no byte floor: a kernel that only reads the same packed weights, timed in the same
    # run, is the tighter bound beside the card's floor (the floor stays the card's)
    return [r | ({"design_bound_ms": r["read_only_ms"], "design_bound_words": "a read of the weights alone",
                  "design_bound_what": READ_ONLY_WHAT} if r.get("read_only_ms") else {}) for r in out]


#: What a ternary row's tighter bound is, in the chapter's notes.
READ_ONLY_WHAT = ("a kernel that only reads the same packed weights, timed in the same run; at this size the launch "
                  "and the start of the read outweigh the bytes, so no kernel reaches the byte floor")


#: Chapter 05 part 1 (Triton), a page of its own: its row on the scoreboard links there.
PART_ONE_NOTEBOOK = "notebooks/05_ternary_1_triton.ipynb"
#: Part 1's row's case, by the page's one rule for a chapter whose answer is a range over shapes: the shape of our
#: least lead on the lead card among those where the rival passes our check. Part 1's answer is against GemLite, the
#: Triton peer, at the shapes where GemLite passes our float64 check (its autotuner's pick, and with it its check at a
#: shape, can change from run to run); of those, our lead on the H200 is least at 14336 x 4096 (an 8B Llama's up
#: projection), where GemLite passes on both cards. A test checks the rule against the committed files.
PART_ONE_CASE = {"shape": "14336x4096", "m": 1}
#: The column of chapter 05's notes table for cuBLAS on the same matrix stored densely (µs).
DENSE_COLUMN = "cuBLAS bf16, matrix stored densely (µs)"
#: Part 1's layer at :data:`PART_ONE_CASE`, in its shape cell.
PART_ONE_LAYER = "an 8B Llama's up projection"  # the chapter's own name for it


def _ternary_part_one(data):
    """Chapter 05 part 1's row: its last Triton step (:data:`book.results.PART_ONE_STEP`) at :data:`PART_ONE_CASE`,
    against the strongest rival there that passes our float64 check in this run (GemLite, part 1's peer, where it
    passes, else cuBLAS bf16), as :func:`_ternary_llama` picks it; None where the file lacks it. Its p99 is the tails
    run's row of the same step at the same case."""
    from book.results import PART_ONE_STEP

    series = f"step{PART_ONE_STEP:02d}"
    row = _ternary_llama(data, steps=(series,), case=PART_ONE_CASE,
                         ours_label=f"part 1's last kernel, on tensor cores in Triton ({_step_words(series)})")
    if row is None:
        return None
    return row | {"ternary_case": "part1", "part_notebook": PART_ONE_NOTEBOOK, "tail_series": "step14_workspace"}


#: Our W2A8 kernel set against BitNet's (x quantised inside the call): step 23 alone, the one-row kernel. BitNet's
#: kernel runs one row of x only, and a deployer calls one kernel, not the faster of two picked per shape.
TERNARY_W2A8 = ("step23",)
#: BitNet's kernel's series (its float64 check's name too).
BITNET = "bitnet_w2a8"


def bitnet_run(card_folder: str) -> dict[str, Any] | None:
    """The card's ternary run that times BitNet's W2A8 kernel beside ours, as JSON
    (:func:`book.ternary.results.bitnet_results`: the chapter's own file, else the lab's quick run), or None."""
    from book.ternary.results import bitnet_results
    from studylog.plotting import Results

    path = BENCH_RESULTS / card_folder / "ternary.json"
    own = load(path.parent, "ternary") if card_folder else None
    run = bitnet_results(Results(path, own)) if own is not None else None
    return None if run is None else run.data


def run_label(run: dict[str, Any]) -> str:
    """The BitNet run in a few words, for a label (empty where it is the chapter's own run)."""
    if not run.get("quick"):
        return ""
    day = dt.date.fromisoformat(run["date"][:10])
    return f"the chapter's BitNet run on this card, {day.day} {day:%B %Y}"


def run_words(run: dict[str, Any]) -> str:
    """The provenance of a BitNet ratio, said once per page: the run and its date."""
    if not run.get("quick"):
        return "BitNet's kernel is timed in the chapter's own benchmark run, beside ours, so each ratio is from one run"
    day = dt.date.fromisoformat(run["date"][:10])
    return (f"BitNet's kernel is timed in another run of the chapter's benchmark on the same card, on "
            f"{day.day} {day:%B %Y} (its quick mode: BitNet's ten shapes and the chapter's targets, ours re-timed "
            "in that run, so each ratio is from one run)")


def _ternary_bitnet(data):
    run = bitnet_run(data.get("card_folder", "")) if data.get("card_folder") else None
    if run is None:
        return None
    peers = [r for r in rows(run, BITNET, m=1) if r["clock"] == "gpu"]
    if not peers:
        return None
    pairs = []  # (BitNet's row, our W2A8 row) at each of its shapes
    for peer in peers:
        mine = [r for s in TERNARY_W2A8 for r in rows(run, s, shape=peer["params"]["shape"], m=1) if r["clock"] == "gpu"]
        if mine:
            pairs.append((peer, min(mine, key=lambda r: r["ms"])))
    if not pairs:
        return None
    rival, ours = min(pairs, key=lambda p: p[0]["ms"] / p[1]["ms"])  # the shape where our lead is smallest
    case = {"shape": rival["params"]["shape"], "m": 1}
    n, k = case["shape"].split("x")
    check = accuracy_check(run, BITNET, case)
    latency, what = _one_kernel(data)
    # a read of the packed weights alone, timed in the same run: the yardstick a kernel this short gets beside its
    # byte floor, which the launch and the pipeline's fill outweigh at this size
    read = [r for r in rows(run, "read_weights", shape=case["shape"], m=1) if r["clock"] == "gpu"]
    read_note = (f"a kernel that only reads the packed weights takes {us(read[0]['ms'])} µs in the same run",) \
        if len(read) == 1 else ()
    # where BitNet's run is the chapter's own, its provenance needs no words; a run of its own is named
    provenance = (run_words(run),) if run.get("quick") else ()
    return {"ternary_case": "bitnet", "tail_params": case, "run_words": run_words(run), "run_label": run_label(run),
            "read_only_ms": read[0]["ms"] if len(read) == 1 else None,
            "rival_check": (
        None if check is None else ("passes" if check["passed"] else "misses"))} | _row(
        f"the one-row W2A8 kernel ({_step_words(ours['series'])}; x quantised to int8 inside the call)",
        f"M = 1, N × K = {n} × {k} (of BitNet's shapes, where our lead is smallest)",
        ours["clock"], ours, "BitNet's W2A8 kernel (x already int8)", rival,
        byte_floor_ms=ours.get("floor_mem_ms", ours.get("floor_ms")), compute_floor_ms=ours.get("floor_compute_ms"),
        latency_floor_ms=latency, latency_what=what, short=f"{_step_words(ours['series'])}, W2A8; {n} × {k}",
        rival_notes=provenance, floor_notes=read_note)  # the shape cell says why this shape; the results page gives all ten


def _ternary_llama(data, steps: tuple[str, ...] = TERNARY_BF16_X, ours_label: str = "",
                   case: dict[str, Any] = TERNARY_CASE):
    mine = [r for s in steps for r in rows(data, s, **case) if r["clock"] == "gpu"]
    if not mine:
        return None
    ours = min(mine, key=lambda r: r["ms"])
    # The rival is the fastest peer or baseline that passes our float64 check in this run: GemLite's 2-bit kernel
    # where it passes, else cuBLAS bf16. A faster peer that fails the check is named beside the row, with no ratio.
    gemlite, cublas = one(data, "gemlite_w2", **case), one(data, "cublas_bf16", **case)
    checks = {s: accuracy_check(data, s, case) for s in ("gemlite_w2", "cublas_bf16")}
    passing = [(s, r) for s, r in (("gemlite_w2", gemlite), ("cublas_bf16", cublas))
               if r is not None and checks[s] is not None and checks[s]["passed"]]
    series, rival = min(passing, key=lambda p: p[1]["ms"]) if passing else ("gemlite_w2", gemlite)
    label = {"gemlite_w2": "GemLite 2-bit", "cublas_bf16": "cuBLAS bf16 (the matrix stored densely)"}[series]
    gem_failed = checks["gemlite_w2"] is not None and not checks["gemlite_w2"]["passed"]
    if series == "cublas_bf16" and gem_failed and gemlite is not None:  # the strongest rival that passes the check
        label = "cuBLAS bf16 on the matrix stored densely"
    read = one(data, "read_weights", **case)
    latency, what = _one_kernel(data)
    notes = ()
    if read is not None:
        notes = (f"a kernel that only reads the packed weights takes {us(read['ms'])} µs in the same run",)
    bitnet = one(data, BITNET, **case)
    from studylog.ternary.bitnet import BITNET_SHAPES

    built_for = tuple(int(x) for x in case["shape"].split("x")) in BITNET_SHAPES
    peer_notes = ((["BitNet's W2A8 kernel runs only its own ten shapes, not this one"] if not built_for else
                   ["BitNet's W2A8 kernel is not measured in this card's run"]) if bitnet is None else
                  [f"BitNet's W2A8 kernel, part 2's rival, takes x already in int8, not bf16: {us(bitnet['ms'])} µs "
                   "here, another product, so no ratio"])
    gem_check = checks["gemlite_w2"]
    if gemlite is not None and series != "gemlite_w2":  # slower here, or failing the check (then said)
        peer_notes.append(f"GemLite 2-bit takes {us(gemlite['ms'])} µs" + (
            f" here, slower than {label}" if gem_check is not None and gem_check["passed"] else
            " and " + _check_words(gem_check) + ", so no ratio against it is given"))
    if cublas is not None and series != "cublas_bf16" and not (checks["cublas_bf16"] or {}).get("passed"):
        # its time and ratio are in the notes (rival_also); a failed or missing check is said beside them
        peer_notes.append("cuBLAS bf16 on the same matrix stored densely " + _check_words(checks["cublas_bf16"]))
    check = checks.get(series)
    extra = {"ternary_case": "llama", "tail_params": case, "rival_series": series,
             # named beside the ratio: the cards' rivals at this shape can differ (GemLite passes on one card only)
             "rival_name": {"gemlite_w2": "GemLite 2-bit", "cublas_bf16": "cuBLAS bf16"}[series],
             "rival_check": None if check is None else ("passes" if check["passed"] else "misses"),
             "gemlite_fails_check": gem_check is not None and not gem_check["passed"],
             "gemlite_check_error": None if gem_check is None else gem_check["relative_error"],
             "gemlite_check_tolerance": None if gem_check is None else gem_check["tolerance"],
             "gemlite_ms": gemlite["ms"] if gemlite is not None else None,
             "read_only_ms": read["ms"] if read is not None else None,
             "dense_ratio": cublas["ms"] / spread(ours)[1] if cublas is not None else None,
             "dense_ms": cublas["ms"] if cublas is not None else None,
             # GemLite and cuBLAS stand in the same cell on every card, whichever is the rival: one pair each card
             "rival_also": (f"cuBLAS bf16 on the matrix stored densely takes {us(cublas['ms'])} µs; ours is "
                            f"{cublas['ms'] / spread(ours)[1]:.2f}× faster"
                            if series == "gemlite_w2" and cublas is not None else
                            f"GemLite 2-bit: {us(gemlite['ms'])}, faster than cuBLAS but it fails our float64 check "
                            "(no ratio)"
                            if series == "cublas_bf16" and gem_failed and gemlite is not None else None)}
    return extra | _row(ours_label or f"{TERNARY_WORDS.get(ours['series'], 'the ternary kernel')} ({_step_words(ours['series'])})",
                "one row of bf16 x (M = 1); the weight shape N × K in the kernel column", ours["clock"], ours,
                label, rival, byte_floor_ms=ours.get("floor_mem_ms", ours.get("floor_ms")),
                compute_floor_ms=ours.get("floor_compute_ms"), latency_floor_ms=latency, latency_what=what,
                short=f"{_step_words(ours['series'])}, bf16 x; {case['shape'].replace('x', ' × ')}", floor_notes=notes,
                rival_notes=tuple(peer_notes) + faster_rivals(
                    # the int8 baselines compute another product (x quantised to int8), not a rival of bf16 x; a
                    # peer that fails the check is named above
                    data, ours, rival, case, skip=("read_weights", "torch_int_mm", "torch_int_mm_matmul",
                                                           "gemlite_w2", BITNET)))


#: Chapter 06's headline: eight prompts of mixed prefix and item lengths in one batch.
MULTI_ITEM_CASE = {"shape": "8 prompts, mixed"}
#: The same batch in the grouped-query layout of Llama 3.1 8B.
MULTI_ITEM_GQA_CASE = {"shape": "8 prompts, mixed, 8 KV heads"}


def _multi_item(data):
    ours = one(data, "step05", **MULTI_ITEM_CASE)
    if ours is None:
        return None
    rival = one(data, "FlashInfer", **MULTI_ITEM_CASE)
    latency, what = _one_kernel(data)
    label = f"FlashInfer ({rival.get('backend', '?')}, page {rival.get('page_size', '?')})" if rival else "FlashInfer"
    out = [_row("the batched attention kernel (step 5)", "8 prompts, mixed lengths, heads of 128 (the layout in the "
                "kernel column)", ours["clock"], ours,
                label, rival, byte_floor_ms=ours.get("floor_ms"), compute_floor_ms=ours.get("compute_floor_ms"),
                latency_floor_ms=latency, latency_what=what, short="step 5, 32 heads",
                rival_notes=faster_rivals(data, ours, rival, MULTI_ITEM_CASE)) | {"tail_params": MULTI_ITEM_CASE}]
    grouped = one(data, "step06", **MULTI_ITEM_GQA_CASE)
    if grouped is not None:  # the layout of the model the chapter cites, where the entry point runs step 6
        rival = one(data, "FlashInfer", **MULTI_ITEM_GQA_CASE)
        label = f"FlashInfer ({rival.get('backend', '?')}, page {rival.get('page_size', '?')})" if rival else "FlashInfer"
        # the layout of the model the chapter cites leads its card's rows (the page's sort); the 32-head row stays the
        # row every card measures
        out.append({"grouped_query": True, "tail_params": MULTI_ITEM_GQA_CASE} | _row(
                        "the entry point on grouped heads (step 6)", "8 prompts, mixed lengths, 32 query heads sharing "
                        "8 key/value heads (Llama 3.1 8B)", grouped["clock"], grouped, label, rival,
                        byte_floor_ms=grouped.get("floor_ms"), compute_floor_ms=grouped.get("compute_floor_ms"),
                        latency_floor_ms=latency, latency_what=what, short="step 6, grouped-query (GQA)",
                        rival_notes=faster_rivals(data, grouped, rival, MULTI_ITEM_GQA_CASE)))
    return out


#: Chapter 07's headline: the 8B-shaped cost model at batch 1, per output token, over the JSON schemas of chapter 01's
#: suite (one request each; the suite's regexes are left out, as the chapter's own table leaves them out).
DECODE_CASE = {"model": "8b", "batch": 1, "whitespace": "compact"}


def json_schemas() -> set[str]:
    """The names of the JSON schemas in chapter 01's suite (the chapter 07 headline's requests)."""
    from studylog.fsm.schemas import suite

    return {e.name for e in suite() if e.kind == "json"}


def _per_request(ratios: list[float], what: str) -> str:
    """The note beside a ratio of two median times: the spread of the requests' own ratios."""
    if not ratios:
        return ""
    return (f"the ratio of the two median times; each {what}'s own ratio runs from {min(ratios):.2f}× to "
            f"{max(ratios):.2f}×, median {statistics.median(ratios):.2f}×")


#: Why a whole decode loop's row has no p99: the cell's short reason, and the sentence under the tables saying it in full.
LOOP_NO_TAIL = ("– (a wall-clock loop)",
                "A decode loop has none: its step is timed request by request on the wall clock, host work included, "
                "with no such replay (the slowest repetition beside its median gives its spread)")


def _decode(data):
    names = json_schemas()
    ours = [r for r in rows(data, "step03", **DECODE_CASE) if r["params"]["schema"] in names]
    body = one(data, "body", model="8b", batch=1, chunk=1)
    if not ours:
        return None
    by_schema = {r["params"]["schema"]: r for r in rows(data, "step01", **DECODE_CASE)}
    pairs = [(r, by_schema.get(r["params"]["schema"])) for r in ours]
    empty = _floor_empty_ms(data)
    byte, latency = [], []
    for r, _ in pairs:
        share = r["forwards"] / r["tokens"]  # forward passes per output token (jump-forward makes it < 1)
        if body is not None:
            byte.append(body["floor_ms"] * share)
            if empty is not None and body.get("kernels_per_forward"):
                latency.append(body["kernels_per_forward"] * empty * share)
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    summary = {"ms": med([r["ms"] for r, _ in pairs]), "clock": ours[0]["clock"],
               "spread_ms": [med([spread(r)[i] for r, _ in pairs]) for i in range(3)]}
    rival = [b for _, b in pairs if b is not None]
    rival_row = {"ms": med([b["ms"] for b in rival]), "clock": rival[0]["clock"]} if rival else None
    kernels = body.get("kernels_per_forward") if body else None
    gaps: tuple[str, ...] = ()
    notes = ["wall clock: the whole step, host included, per output token; the median and the slowest repetition are "
             "medians over the JSON schemas of each request's median and slowest repetition",
             "our loop's bounds: the body's weights read once per forward, and its kernels' chain, per output "
             "token; the 8B cost model's 32 layers reuse one layer's weights, far larger than L2, so each layer's read is "
             "counted and comes from memory"]
    head = next((n.split("'vocab_size': ", 1)[1].split(",", 1)[0] for n in data.get("notes", [])
                 if n.startswith("model 8b: ") and "'vocab_size': " in n), None)
    if head is not None and int(head) % 128:  # the run's head was not padded: its cuBLAS baseline is slower
        notes.append(f"this card's run has a head of {int(head):,} rows, not padded to a multiple of 128 as real models "
                     "ship it; that slows the dense baseline (chapter 07 measures how much), so this ratio is higher "
                     "than a padded head gives and not comparable with the other card's")
    hf = rows(data, "hf_generate", model="smollm2", batch=1)
    mine = {r["params"]["schema"]: r for r in rows(data, "step03", model="smollm2", batch=1, whitespace="compact")}
    both = [(h, mine[h["params"]["schema"]]) for h in hf if h["params"]["schema"] in mine]
    hf_note = ()
    if both:  # a SmolLM2-135M figure: the real model's row carries it
        hf_note = (f"Hugging Face generate with xgrammar's logits processor, the library path, is measured only on "
                     f"SmolLM2-135M at batch 1: {us(med([h['ms'] for h, _ in both]))} µs per output token against "
                     f"our {us(med([m['ms'] for _, m in both]))} µs on the same {len(both)} requests; it runs every "
                     f"operation eagerly, without CUDA graphs, so the loop of step 1 is the stronger rival",)
    else:
        notes.append("no library decode loop (Hugging Face generate with xgrammar) is measured on this card")
        gaps = ("no library decode loop is measured on this card (Hugging Face generate with xgrammar's logits "
                "processor, measured on the H200 on SmolLM2 only)",)
    unpadded = {"unpadded_head": head is not None and int(head) % 128 != 0}
    # the same two loops on a real model (SmolLM2-135M, its real requests): the ratio of the two median times
    dense = {r["params"]["schema"]: r for r in rows(data, "step01", model="smollm2", batch=1, whitespace="compact")}
    real = [(dense[k], m) for k, m in mine.items() if k in dense]
    unpadded |= {"real_ratio": med([b["ms"] for b, _ in real]) / med([m["ms"] for _, m in real]) if real else None,
                 "real_requests": len(real)}
    if real:
        notes.append("a model the size of those served, on synthetic weights; the chapter's answer, on the real "
                     "SmolLM2-135M, is the row above")
    cost = unpadded | {"no_tail_why": LOOP_NO_TAIL, "loop_bound": True} | _row("the loop with chapters 01 and 02 (step 3)",
                           f"the 8B cost model (measured, synthetic weights), batch 1, per output token (median of {len(pairs)} JSON "
                           "schemas)",
                           ours[0]["clock"], summary, "the same loop, dense head and mask (step 1)", rival_row,
                           byte_floor_ms=med(byte), latency_floor_ms=med(latency),
                           latency_what=(f"{kernels} dependent kernels a forward, each at least an empty kernel"
                                         if kernels else "not measured"),
                           ratio_note=_per_request([b["ms"] / r["ms"] for r, b in pairs if b is not None], "schema"),
                           notes=tuple(notes), gaps=gaps, short="step 3, whole loop, 8B cost model")
    smol = _decode_real(data, real, hf_note)
    # the 8B cost model's row stays the chapter's lead row (the results page reads it); the scoreboard's loops table
    # shows the real model's row first
    return [cost, smol] if smol is not None else cost


def _decode_real(data, real, extra: tuple[str, ...] = ()):
    """Chapter 07's answer on the real model, SmolLM2-135M, at batch 1: the same two loops over its requests, bound
    by our loop's forwards, each at the GPU time of SmolLM2's one-token forward without its head, as chapter 07's
    own run times it (the bound chapter 08's row takes from its own run)."""
    body = one(data, "body", model="smollm2", batch=1, chunk=1)
    if not real:
        return None
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    summary = {"ms": med([m["ms"] for _, m in real]), "clock": real[0][1]["clock"],
               "spread_ms": [med([spread(m)[i] for _, m in real]) for i in range(3)]}
    rival_row = {"ms": med([b["ms"] for b, _ in real]), "clock": real[0][0]["clock"]}
    share = med([m["forwards"] / m["tokens"] for _, m in real])
    byte = med([body["floor_ms"] * m["forwards"] / m["tokens"] for _, m in real]) if body else None
    forecast = med([body["ms"] * m["forwards"] / m["tokens"] for _, m in real]) if body else None
    why = ("not measured: chapter 07's run counts a forward's kernels on its cost models only"
           + (f"; the forward-time bound binds: {share:.2f} forwards per output token, each at SmolLM2-135M's "
              f"one-token forward without its head, {body['ms'] * 1e3:.1f} µs of GPU time in chapter 07's own run "
              "(chapter 08's row takes the same bound from its run); a bound, not a floor: it leaves out the head, "
              "the mask and the host's work, which the wall clock includes" if forecast is not None else ""))
    row = {"latency_missing_why": why, "no_tail_why": LOOP_NO_TAIL, "loop_bound": True, "real_model": True} | _row(
        "the loop with chapters 01 and 02 (step 3)",
        f"SmolLM2-135M, batch 1, per output token (median of {len(real)} requests)", summary["clock"], summary,
        "the same loop, dense head and mask (step 1)", rival_row, byte_floor_ms=byte, latency_floor_ms=None,
        latency_what="not measured",
        ratio_note=_per_request([b["ms"] / m["ms"] for b, m in real], "request"),
        notes=("wall clock: the whole step, host included, per output token; the median and the slowest repetition "
               "are medians over the requests of each request's median and slowest repetition",
               "byte bound: SmolLM2-135M's body read once per forward, per output token") + tuple(extra),
        short="step 3, whole loop, SmolLM2-135M")
    if forecast is None:
        return row | {"binding": None, "binding_floor_ms": None, "pct_of_floor": None}
    return row | _forward_binds(forecast, share, body["ms"], summary["ms"], 0.0, byte)


#: Chapter 08's headline: SmolLM2-135M at batch 1 on the extraction requests, per output token.
SPECULATE_CASE = {"model": "smollm2", "batch": 1, "workload": "extraction"}


def _speculate(data):
    from studylog.speculate.report import SHIPPED, closed_requests

    # the requests that ran to the output cap looped; the headline leaves them out (speculate.report.headline)
    kept = closed_requests(data["measurements"], SPECULATE_CASE["workload"])
    ours = [r for r in rows(data, SHIPPED, **SPECULATE_CASE) if r["params"]["request"] in kept]
    if not ours:
        return None
    by_request = {r["params"]["request"]: r for r in rows(data, "ch7_step03", **SPECULATE_CASE)}
    pairs = [(r, by_request.get(r["params"]["request"])) for r in ours]
    one_token = [r for r in rows(data, "verify", model="smollm2", batch=1, chunk=1) if r.get("used")]
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    summary = {"ms": med([r["ms"] for r, _ in pairs]), "clock": ours[0]["clock"],
               "spread_ms": [med([spread(r)[i] for r, _ in pairs]) for i in range(3)]}
    rival = [b for _, b in pairs if b is not None]
    rival_row = {"ms": med([b["ms"] for b in rival]), "clock": rival[0]["clock"]} if rival else None
    forecast = med([one_token[0]["ms"] * r["forwards"] / r["tokens"] for r, _ in pairs]) if one_token else None
    # the byte floor: SmolLM2's body read once per forward, at the forwards each output token takes; its bytes are
    # those chapter 07's run on the same card priced (its body row at one token), priced again at this run's copy
    # bandwidth. The latency floor, the chain of the forward's kernels, binds a loop this small, and no run counted
    # those kernels: so no percentage (the small alphabet of chapter 04 on a card without its chain is the same case)
    decode = data.get("decode_run")
    body = one(decode, "body", model="smollm2", batch=1, chunk=1) if decode else None
    byte = None
    if body is not None and body.get("floor_ms"):
        nbytes = body["floor_ms"] * decode["ceilings"]["copy_bandwidth_gbs"] * 1e6
        byte = med([nbytes / (data["ceilings"]["copy_bandwidth_gbs"] * 1e6) * r["forwards"] / r["tokens"]
                    for r, _ in pairs])
    share = med([r["forwards"] / r["tokens"] for r, _ in pairs])
    # the forward-time bound: the shipped step's forwards per output token, each at this loop's one-token forward's GPU time,
    # the bound chapter 08's page gives; it binds where it is longer than the kernel count's chain (it is, by far)
    bound = (f"the forward-time bound, the longer one, binds, and it is the one chapter 08's page gives: {share:.2f} "
             f"forwards per output token (step 3's median request's), each at a one-token forward's GPU time "
             f"({one_token[0]['ms'] * 1e3:.1f} µs), {us(forecast)} µs a token. Each is a bound, not a floor: neither "
             "counts the drafting or the host's work in a step, which the wall clock includes"
             if forecast is not None else "")
    forward = one(data.get("tails_run") or {"measurements": []}, FORWARD, model="smollm2", batch=1, chunk=1)
    empty = _floor_empty_ms(data)
    latency = None
    if forward is not None and forward.get("kernels_per_forward") and empty is not None:
        kernels = forward["kernels_per_forward"]
        latency = med([kernels * empty * r["forwards"] / r["tokens"] for r, _ in pairs])
        why = (f"{kernels} dependent kernels a forward (counted in a separate run), each at least an empty "
               f"kernel, at step 3's forwards per output token: {us(latency)} µs a token"
               + (f". {bound[0].upper() + bound[1:]}" if bound else ""))
    else:
        why = "not measured: no run counted the kernels of SmolLM2's forward" + (f"; {bound}" if bound else "")
    words = ({"floor_words": f"{share:.2f} forwards a token × {kernels} kernels × {empty * 1e3:.2f} µs"}
             if latency is not None else {})
    return ({"latency_missing_why": why} if latency is None else words) | {"no_tail_why": LOOP_NO_TAIL,
                                                                           "loop_bound": True} | _row(
                "the loop with grammar-cut drafts (step 3)", f"SmolLM2-135M, batch 1, per output token (median of {len(pairs)} "
                "requests that close their JSON)", ours[0]["clock"], summary, f"chapter 07's loop (its step 3) on the same {len(pairs)} requests",
                rival_row,
                byte_floor_ms=byte, latency_floor_ms=latency, latency_what=why, short="step 3, whole loop",
                ratio_note=_per_request([b["ms"] / r["ms"] for r, b in pairs if b is not None], "request")
                .replace("each request's own", f"each of these {len(pairs)} requests' own"),
                notes=("wall clock: the whole step, host included, per output token",
                       "byte bound: SmolLM2-135M's body read once per forward (chapter 07's run prices its bytes), "
                       "per output token")) | (
        # without the launches' chain no percentage of a smaller bound is given; with it, the larger of the two
        # latency bounds binds: the forward-time bound, which the chapter's page uses too
        {"binding": None, "binding_floor_ms": None, "pct_of_floor": None} if latency is None else
        _forward_binds(forecast, share, one_token[0]["ms"] if one_token else None, summary["ms"], latency, byte))


def _forward_binds(forecast: float | None, share: float, one_ms: float | None, median_ms: float, latency: float,
                   byte: float | None) -> dict[str, Any]:
    """Chapter 08's row where its forward-time bound (``forecast``) is the largest of its bounds: it binds, and the
    × floor cell is the chapter's own "× our loop's forward-time bound"; else nothing changes."""
    if forecast is None or forecast <= max(latency, byte or 0.0):
        return {}
    return {"forward_bound_ms": forecast, "binding": "forward", "binding_floor_ms": forecast,
            "pct_of_floor": 100 * forecast / median_ms,
            "forward_words": f"{share:.2f} forwards a token × {one_ms * 1e3:.1f} µs a forward"}


#: The chapters on the scoreboard, in the course's order; a new chapter appends its entry.
ENTRIES: tuple[Entry, ...] = (
    Entry(1, "FSM compression", "notebooks/01_fsm_compression.ipynb",
          "How many forward passes can a grammar spare the model?", None,
          absent="no GPU kernel: the compression runs on the host, over the grammar's automaton; what it saves, forward "
                 "passes, is counted over the chapter's suite and real schemas and given on the results page",
          headline="forward passes saved by jumping over forced tokens, against decoding every token"),
    Entry(2, "Masked LM head", "notebooks/02_masked_lm_head.ipynb",
          "If the grammar allows a thousand tokens, why compute all 128,256 logits?", "masked_lm_head",
          _masked_lm_head,
          headline="the head-and-mask step against xgrammar's path (cuBLAS logits, then its mask), batch 1, 1,000 "
                   "tokens allowed",
          rival_short="xgrammar's path"),
    Entry(3, "N-gram matching", "notebooks/03_ngram_matching.ipynb",
          "How fast can the n-gram drafter of speculative decoding run on the GPU?",
          "ngram", _ngram,
          headline="the GPU drafter against our corrected port of FastDeploy's GPU kernel, 128 slots of 32,768 "
                   "tokens",
          rival_short="our corrected port of FastDeploy's GPU kernel"),
    Entry(4, "CTC loss", "notebooks/04_ctc_loss.ipynb",
          "How much faster than cuDNN can a CTC loss and its gradient run?", "ctc", _ctc,
          headline="loss and gradient against cuDNN, 150 frames, alphabet 5,000, batch 8",
          rival_short="cuDNN"),
    Entry(5, "Ternary matmul", "notebooks/05_ternary_2_cuda.ipynb",
          "How much faster than the BitNet kernel can a CUDA kernel multiply weights in {-1, 0, +1} at decode?",
          "ternary",
          _ternary, headline="our CUDA C++ ternary kernel with int8 activations, one row of x, against BitNet's W2A8 "
                            "kernel at the shapes it is built for",
          rival_short="BitNet's own W2A8 kernel"),
    Entry(6, "Multi-item attention", "notebooks/06_multi_item_attention.ipynb",
          "How do you score many items against one prompt in one attention call?", "multi_item", _multi_item,
          headline="eight prompts of mixed lengths in one call, against FlashInfer", rival_short="FlashInfer"),
    Entry(7, "Constrained decoding end to end", "notebooks/07_constrained_decoding.ipynb",
          "What do chapters 01 and 02 buy a whole decode loop?", "decode", _decode,
          headline="the loop with chapters 01 and 02 against a dense head and a mask, per output token, batch 1, on "
                   "SmolLM2-135M, then on the 8B cost model (one layer's weights in all 32 layers)",
          rival_short="a dense head and a mask"),
    Entry(8, "Speculation under a grammar", "notebooks/08_speculation_under_a_grammar.ipynb",
          "Can a grammar and prompt-lookup drafts share one decode loop?", "speculate", _speculate,
          headline="grammar-cut drafts against chapter 07's loop, per output token, SmolLM2-135M, batch 1",
          rival_short="chapter 07's loop"),
)


def card_name(card: Path) -> str:
    """The GPU's name as its files record it (the folder name where none does)."""
    for f in sorted(Path(card).glob("*.json")):
        return file_facts(f)[0]
    return Path(card).name


@cached_on_files
def scoreboard(root: Path = BENCH_RESULTS) -> list[dict[str, Any]]:
    """Every scoreboard row: for each entry and each card, the measured rows (the first, ``lead``, is the chapter's
    headline; a chapter may add rows for the same kernel from another angle), or one that says why there is none."""
    return [row for entry in ENTRIES for row in entry_rows(entry, root)]


def entry_rows(entry: Entry, root: Path = BENCH_RESULTS) -> list[dict[str, Any]]:
    """One chapter's scoreboard rows (:func:`scoreboard`'s, for ``entry`` alone): a chapter's page reads its own row
    without computing every chapter's."""
    out = []
    for card in cards(root):
        base = {"number": entry.number, "title": entry.title, "notebook": entry.notebook, "card": card_name(card)}
        data = load(card, entry.bench) if entry.bench else None
        if data is not None:  # the card's tails run beside it: some floors are timed there
            data = data | {"tails_run": load(card, TAILS), "card_empty_kernel_ms": card_empty_kernel_ms(card),
                           "card_folder": Path(card).name,
                           # chapter 08's byte floor prices SmolLM2's body as chapter 07's run on the card did
                           "decode_run": load(card, "decode") if entry.bench == "speculate" else None}
        measured = entry.measure(data) if data is not None and entry.measure else None
        if measured is None:
            why = entry.absent or ("not measured on this card" if data is None
                                   else "this card's run did not time the final kernel")
            out.append(base | {"missing": why, "lead": True})
            continue
        for i, row in enumerate(measured if isinstance(measured, list) else [measured]):
            row = base | {"date": data["date"][:10], "lead": i == 0, "run_date": data["date"],
                          "run_code": data.get("git_commit"), "empty_kernel_ms": empty_kernel_ms(data),
                          # no empty kernel in the row's own run: its latency floor is the card's fastest, marked
                          "latency_borrowed": empty_kernel_ms(data) is None
                          and data.get("card_empty_kernel_ms") is not None} | row
            out.append(row)
    return out


def missing(root: Path = BENCH_RESULTS) -> list[str]:
    """What the committed files do not hold that the scoreboard asks for, one sentence per gap with the cards it
    concerns (the page's list)."""
    gaps: dict[tuple[int, str], list[str]] = {}
    for r in scoreboard(root):
        said = []
        if "missing" in r:
            said.append(r["missing"])
        else:
            said += r["gaps"]
            if r["latency_floor_ms"] is None and not r.get("latency_missing_why"):
                said.append("the latency floor: no run on this card recorded an empty kernel's GPU time")
            if r["rival_ms"] is None:
                said.append(f"the rival ({r['rival']}) at this shape")
        for text in said:
            cards_of = gaps.setdefault((r["number"], text), [])
            if short_card(r["card"]) not in cards_of:
                cards_of.append(short_card(r["card"]))
    out = []
    for (number, text), on in gaps.items():
        title = next(e.title for e in ENTRIES if e.number == number)
        out.append(f"{title} ({' and '.join(on)}): {text}.")
    return out


# ----------------------------------------------------------------------------------------------
# The tails run: a 99th percentile where a card has one
# ----------------------------------------------------------------------------------------------

#: The file of the tails run (``python -m studylog bench tails``) in a card's folder.
TAILS = "tails"
#: Each chapter's cases in the tails run: (series, params) for each row the run times, the chapter's lead first. A
#: scoreboard row names its case (``tail_params``); its p99 is the entry with the same params.
TAIL_SERIES: dict[int, tuple[tuple[str, dict[str, Any]], ...]] = {
    2: (("MaskedHeadPlan", MASKED_HEAD_CASE),),
    3: (("ngram_match", NGRAM_LEAD_CASE), ("ngram_match", NGRAM_HEADLINE_CASE), ("ngram_match", NGRAM_CASE)),
    4: (("ctc_loss", CTC_CASE), ("ctc_loss", CTC_SMALL_CASE)),
    # step 23 at BitNet's shape where our lead is smallest (the row's case, found from the BitNet run), then bf16 x,
    # then part 1's last step at 4096 x 14336 and at its own row's case, PART_ONE_CASE
    5: (("step23_w2a8_fused", {"shape": "4800x3200", "m": 1}), ("ternary_matmul", TERNARY_CASE),
        ("step14_workspace", TERNARY_CASE), ("step14_workspace", PART_ONE_CASE)),
    6: (("multi_item_attention", MULTI_ITEM_GQA_CASE), ("multi_item_attention", MULTI_ITEM_CASE)),
}
#: What the re-run's table holds, said once under it (the counts come from the tails run's rows).
TAIL_NOTE = ("p99 ÷ median: the call is timed {samples} times, each time as the mean call time of one CUDA-graph "
             "replay of at least {calls} calls; the median and the 99th percentile of those per-replay means, both "
             "from that run: how far one measurement lands from another, not how slow a single call can be (How we "
             "measure gives the details)")


def tail(card: Path, number: int, params: dict[str, Any] | None = None,
         series: str | None = None) -> dict[str, Any] | None:
    """The tails run's row for chapter ``number`` on ``card`` at ``params`` (a row's ``tail_params``; None: the
    chapter's first case) and, where given, ``series`` (a row's ``tail_series``), with ``ms`` its median and
    ``p99_ms``; None where the run or the case is not there."""
    data = load(card, TAILS)
    if data is None or number not in TAIL_SERIES:
        return None
    cases = TAIL_SERIES[number]
    picked = [c for c in cases if (params is None or c[1] == params) and (series is None or c[0] == series)][:1]
    if not picked:
        return None
    series, case = picked[0]
    found = rows(data, series, **case)
    return found[0] if len(found) == 1 else None


# ----------------------------------------------------------------------------------------------
# The page's table
# ----------------------------------------------------------------------------------------------

def _floor(ms: float | None, missing: str = NOT_MEASURED) -> str:
    """A floor in µs: one decimal, two below a microsecond (0.04, not 0.0)."""
    return us(ms, digits=2 if ms is not None and ms < 1e-3 else 1, missing=missing)


def short_card(name: str) -> str:
    """A card's name as the tables write it: ``NVIDIA H100 80GB HBM3`` -> ``H100``."""
    return name.replace("NVIDIA ", "").replace(" 80GB HBM3", "")


#: A p99 this many times its median is said in the row's notes: its re-measurements spread, not only its tail.
WIDE_TAIL = 1.5


def _copies(n: int) -> str:
    return f"{n} cop{'y' if n == 1 else 'ies'}"


def tail_copies(row: dict[str, Any], t: dict[str, Any]) -> str | None:
    """A sentence where the tails run replayed the call over fewer copies of its input than the chapter's row rotated
    over (the tails row's ``rotated_copies`` against the chapter row's ``copies``), so the p99 and the median beside
    it may read from L2 what the chapter's median reads from device memory; None where either file does not record
    its copies or the tails run has as many."""
    mine, theirs = row.get("copies"), t.get("rotated_copies")
    if mine is None or theirs is None or theirs >= mine:
        return None
    return (f"the re-run replays the call over {_copies(theirs)} of its input, where the chapter's median rotates "
            f"over {_copies(mine)}: the rows a call reads may stay in L2 in the re-run and come from device memory in "
            "the chapter's, so the re-run's median and p99 are not measured as the chapter's median is")


def ctc_tail_targets(row: dict[str, Any], t: dict[str, Any]) -> tuple[bool, str] | None:
    """Chapter 04's p99 run where its repetitions drew targets of their own (seeded by the repetition), not those the
    chapter's benchmark times at the row's case: (whether to leave the p99 out, the note saying why). The time of a
    call follows its longest target, so where the repetitions' medians spread wider than :data:`WIDE_TAIL` the p99 is
    the spread of the targets, not of the call's replays, and is left out. None where the run timed the chapter's
    targets."""
    import torch

    from studylog.ctc.report import random_targets
    from studylog.tails import ctc_bench_targets

    if t.get("targets") == "the chapter's" or not t.get("repetition_medians_ms"):
        return None
    T, N, A = (row["tail_params"][k] for k in ("T", "N", "A"))
    mine = max(map(len, ctc_bench_targets(T, N, A)))
    theirs = [max(map(len, random_targets(T, N, A, torch.Generator().manual_seed(rep))))
              for rep in range(len(t["repetition_medians_ms"]))]
    medians = t["repetition_medians_ms"]
    longest = "longest target" if N > 1 else "target"
    drawn = (f"the p99 run's {len(theirs)} repetitions each drew targets of their own, not this row's (its {longest} "
             f"{mine} labels): theirs run to {', '.join(map(str, theirs[:-1]))} and {theirs[-1]} labels")
    if max(medians) <= WIDE_TAIL * min(medians):
        return False, (f"{drawn}; their medians lie within {max(medians) / min(medians) - 1:.0%} of each other, so "
                       "the p99 stands for this shape")
    slow = max(range(len(medians)), key=medians.__getitem__)
    rest = " and ".join(us(m) for i, m in enumerate(medians) if i != slow)
    return True, (f"{drawn}, and the repetition of {theirs[slow]} labels ran at {us(medians[slow])} µs against {rest} "
                  f"µs: that run's p99 ({us(t['p99_ms'])} µs, {t['p99_ms'] / t['ms']:.2f}× its median) measures a "
                  "longer target, not a slower call, so no p99 is given for this row")


def _ctc_small_case_words(root: Path) -> str | None:
    """Why chapter 04's small alphabet is shown at one utterance here, and where the results page's table (the
    smallest speedup over the batch grid, each case timing the step the entry point runs there) lands instead, per
    card."""
    from book.results import ctc_cases

    at = []
    for card in cards(root):
        grid = [c for c in ctc_cases(card) if c["ours"]["params"]["A"] == CTC_SMALL_CASE["A"]
                and c["ours"]["params"]["T"] == CTC_SMALL_CASE["T"]]
        if grid:
            c = min(grid, key=lambda c: c["ratio"])
            which = ("the entry point" if c["series"] == "ctc_loss"
                     else f"step {int(c['series'][4:])}, the step the entry point picks there")
            at.append(f"N = {c['ours']['params']['N']} on the {short_card(card_name(card))} ({c['ratio']:.2f}×, "
                      f"{which})")
    if not at:
        return None
    return ("the small alphabet is shown at one utterance (N = 1), the case whose chain of frames is timed alone as "
            "its latency floor; the results page's table gives the smallest speedup over the batches of the grid "
            "instead: " + "; ".join(at))


def not_comparable(board: list[dict[str, Any]]) -> dict[tuple[int, str], str]:
    """The runs of a chapter on one card whose setup differs from another card's, so that their numbers may not stand
    beside that card's: (chapter number, the card's full name) -> why, one clause for a reader (what differs on that
    card, and what it does to the numbers), in the present tense: how that card's benchmark times the case, not what
    happened in a run. A benchmark that reads one copy of the head where another card's rotates copies; one whose
    head is not padded as real models ship it."""
    rotated = {b["number"] for b in board if b.get("one_copy") is False}
    out = {}
    for b in board:
        if b.get("one_copy") and b["number"] in rotated:
            out[(b["number"], b["card"])] = ("calls can reread the head's rows from L2, not cold from memory as "
                                             "in decoding")
        elif b.get("unpadded_head"):
            out[(b["number"], b["card"])] = ("its head is not padded to 128-row multiples as real models' are, "
                                             "slowing the dense rival")
    return out


def part_one_rival_words(board: list[dict[str, Any]], link: Callable[[str], str] | None = None) -> list[str]:
    """One line per card whose chapter 05 part 1 row is against another rival than GemLite (the Triton library part
    1's page asks about) because GemLite fails our float64 check at the row's shape on that card."""
    link = link or (lambda nb: nb)
    out = []
    for b in board:
        if b.get("ternary_case") != "part1" or "missing" in b or not b.get("gemlite_fails_check"):
            continue
        if b.get("rival_series") == "gemlite_w2":
            continue
        shape = b["ours"].split("; ")[-1]
        out.append(f"On the {short_card(b['card'])}, the rival of [05. {b['title']}, part 1]"
                   f"({link(b.get('part_notebook', PART_ONE_NOTEBOOK))}) is {b.get('rival_name') or b['rival']}, not "
                   f"GemLite: GemLite fails our float64 check at {shape} on that card.")
    return out


def floor_kind(r: dict[str, Any], short: bool = False) -> str:
    """The kind of a row's floor, in a few words: a byte or compute floor, or a latency floor and its chain (``short``:
    the kind alone, the chain being said in the row's notes)."""
    if r.get("binding") == "bytes":
        return "byte floor"
    if r.get("binding") == "compute":
        return "compute floor"
    if r.get("binding") == "forward":
        return "forward-time bound" if short else f"forward-time bound ({r['forward_words']})"
    what = r.get("latency_what") or ""
    if short:
        return "latency floor"
    if r.get("floor_words"):  # a chain the row names in a few words
        return f"latency floor ({r['floor_words']})"
    if what == ONE_KERNEL:
        return "latency floor (one empty kernel)"
    m = re.match(r"the recursion's (\d+) dependent frames", what)
    if m:
        return f"latency floor (a chain of {m.group(1)} frames)"
    m = re.match(r"(\d+) dependent kernels", what)
    if m:
        return f"latency floor (a chain of {m.group(1)} kernels a forward)"
    return "latency floor"


def _sentence(text: str) -> str:
    """A note as a sentence: a capital first letter, unless it starts with a name from code (``index_select``)."""
    return text[0].upper() + text[1:] if re.match(r"[a-z]+\b(?!_)", text) else text


#: A note's "Kind: what" start, turned into a clause of a sentence (the notes read as prose, not a log of labels).
_CLAUSES = [
    (r"^(latency|byte|compute) floor: (.*?) is not timed on this card(\.?)$", r"its \1 floor, \2, is not timed on this card\3"),
    (r"^(latency|byte|compute) floor: ", r"its \1 floor is "),
    (r"^(kernel-count|byte|forward-time) bound: ", r"its \1 bound is "),
    (r"^wall clock: ", "it is timed on the wall clock: "),
]

#: Words a note may start with that keep their capital (names).
_NAMES = ("Llama", "Hugging", "Python", "Triton", "GemLite", "BitNet", "FlashInfer", "H100", "H200", "SmolLM2")


def _prose(text: str) -> str:
    """A note's text as a clause: its "Kind: what" start (:data:`_CLAUSES`) said in words."""
    for pattern, repl in _CLAUSES:
        text, n = re.subn(pattern, repl, text, flags=re.IGNORECASE)
        if n:
            break
    return text


def _common_start(parts: list[list[str]]) -> int:
    """How many leading comma-separated parts every label shares."""
    n = 0
    while all(len(p) > n + 1 for p in parts) and len({p[n] for p in parts}) == 1:
        n += 1
    return n


def _lower_first(text: str) -> str:
    """``text`` to follow a lead-in ("For step 7 on the H200, ..."): its first word lowered unless it is a name."""
    if text.startswith(_NAMES) or not re.match(r"[A-Z][a-z]", text):
        return text
    return text[0].lower() + text[1:]


#: The card of the scoreboard's lead table: every chapter is measured on it, with the course's current code.
LEAD_CARD = "H200"


def _kernel_label(r: dict[str, Any]) -> str:
    """The row a note belongs to, as its kernel cell names it (part 1's row and an end-to-end row say so)."""
    label = r["ours"].split("; ")[0] + (", end to end" if r.get("ours_end_to_end_ms") is not None else "")
    return f"part 1's {label}" if r.get("part_notebook") else label


#: A decode loop's floors count the forwards and kernels of our own loop (chapters 07 and 08): their cells name them
#: our loop's bounds, and the ratio cell says it is over such a bound, not over what the card allows any loop.
LOOP_BOUND_NOTE = ("Chapters 07 and 08 time a whole decode loop: their floors count the forward passes and kernels of "
                   "our own loop, so they are our loop's bounds, not the card's floors (a loop with fewer forwards or "
                   "kernels has lower ones), and their ratio says how close the loop runs to its own bound, not how "
                   "much a better loop could gain. The measured time per token includes the prompt's prefill, "
                   "amortised over the answer; the bound does not.")


#: Rivals whose full name would fill a cell: (the full name's start, the name in the cell). The cell's name says
#: enough to be read alone (no mark, no line under the table); the chapter's page gives the full one.
RIVAL_SHORT = (("our corrected port of FastDeploy's", "FastDeploy's revised kernel, our corrected port (step 4)"),
               ("BitNet's W2A8 kernel", "BitNet's W2A8 kernel (x already int8)"),
               ("the same loop, dense head and mask", "step 1's loop (dense head and mask)"),
               ("chapter 07's loop (", "chapter 07's loop (its step 3)"),
               ("xgrammar (cuBLAS logits, then its mask kernel)",
                "the path engines ship, xgrammar's (cuBLAS logits, then its mask kernel)"))


#: Chapter 02's kernel alone against torch.compile's fused gathers, a lab run on the H200 (read here as JSON).
COMPILED_GATHER_FILE = BENCH_RESULTS.parent.parent / "lab" / "masked_lm_head" / "results" / "nvidia-h200" / "compiled_gather.json"


def compiled_gather_pair(allowed: int) -> tuple[float, float] | None:
    """(step 12's ms, the faster torch.compile gather's ms) at ``allowed`` in :data:`COMPILED_GATHER_FILE`, where
    every check passed; None where the file or the case is missing."""
    if not COMPILED_GATHER_FILE.is_file():
        return None
    data = json.loads(COMPILED_GATHER_FILE.read_text())
    if not all(c["passed"] for c in data.get("checks", [])):
        return None
    by = {(r["series"], r["params"].get("allowed")): r["ms"] for r in data["measurements"]}
    theirs = [by[(s, allowed)] for s in ("index_select_compiled", "gather_dot_compiled") if (s, allowed) in by]
    return (by[("step12", allowed)], min(theirs)) if ("step12", allowed) in by and theirs else None


def short_rival(label: str) -> str | None:
    """The name a rival's cell shows where its full name is long, else None."""
    return next((short for start, short in RIVAL_SHORT if label.startswith(start)), None)


def on_page(r: dict[str, Any]) -> bool:
    """A measured row the scoreboard shows: each chapter's headline case on each card (chapter 05's bf16 kernels and
    chapter 06's 32 heads too, the one case both cards ran) and the decode loops; an end-to-end row, a second kernel of
    one card (chapter 02's kernel alone) or another case (chapter 04's small alphabet) stays off, the results page
    giving it."""
    if r.get("loop_bound") or r.get("part_notebook"):  # chapter 05 part 1's row: its case has no p99 run
        return True
    if r.get("deployed_budget"):  # chapter 03's deployed budget: its lead case stands on the page, this in its notes
        return False
    if r.get("page_headline"):  # chapter 03's headline case (no p99 run times it), before its stress case
        return True
    return (r.get("ours_end_to_end_ms") is None and r.get("tail_params") is not None
            and r["tail_params"] != CTC_SMALL_CASE)


def _floor_cells(r: dict[str, Any]) -> tuple[str, str]:
    """A row's floor that binds (its time and kind) and how far our median is above it (× floor), as two cells; a
    decode loop's floor is our loop's bound, said in both cells. The card's floor only: a tighter bound the call's
    own design sets is a column of its own (:func:`_bound_cells`)."""
    if r.get("floors_as_above"):  # an end-to-end time is not held against the GPU's floors
        return "– (end to end; the GPU row's floors)", "–"
    if r["no_pct_why"]:  # no floor covers all of the call's work: a percentage of a partial one would mislead
        return "–", f"– ({r['no_pct_why']})"
    if r["binding"]:
        times = 100 / r["pct_of_floor"]
        if r["binding"] == "bytes" and r.get("latency_missing_why") and not r.get("loop_bound"):
            # the chain of dependent work is not timed on this card: the byte floor binds only for want of it, so
            # the true floor may be higher and a distance over the byte floor would overstate the room: n/a
            return f"n/a (chain not timed here; byte floor {_floor(r['binding_floor_ms'])})", "n/a"
        if r.get("loop_bound"):
            kind = (floor_kind(r, short=True).replace("byte floor", "byte bound")
                    .replace("latency floor", "kernel-count bound"))
            return f"{_floor(r['binding_floor_ms'])}, our loop's {kind}", f"**{times:.1f}×**"
        mark = BORROWED_MARK if r["binding"] == "latency" and r.get("latency_borrowed") else ""
        return f"{_floor(r['binding_floor_ms'])}{mark}, {_binding_words(r)}", f"**{times:.1f}×**"
    if r.get("latency_missing_why"):  # the floor that binds is not timed on this card: no percentage
        return f"latency floor, {NOT_MEASURED} on this card", "–"
    return NOT_MEASURED, NOT_MEASURED


#: The words the tables use that their own headers and the opening paragraph do not define: the Notes fold's first
#: paragraph (How we measure links here rather than repeating them).
WORDS = ("Words. **step N** is the chapter's step N; where a run timed the chapter's entry point (its public function, "
         "which picks a step by the case's shape), N is the step it ran. **part 1** is chapter 05's Triton part. The "
         "rival's **check**: a float64 reference within a stated tolerance in chapters 02 to 05, a float32 reference "
         "in chapter 06, the same tokens, up to near ties, in chapters 07 and 08; a faster implementation that fails "
         "it is named in the chapter's notes, with no ratio. **slots, budget** (chapter 03): the sequences the drafter "
         "serves at once, each a haystack of that many tokens, and the cap on drafted tokens over the batch. **T, A, "
         "N** (chapter 04): the frames, the size of the alphabet, the batch. **W2A8** (chapter 05): 2-bit weights, "
         "8-bit activations; **N × K**: the weight matrix's rows and columns, with one row of activations (M = 1). "
         "**GQA** (grouped-query attention): several query heads share one key/value head. **not measured**: a run "
         "did not measure what the cell needs, and no number is estimated in its place.")


#: A latency floor that is a chain our own minimal kernel times (chapter 04's frames): a yardstick, as own work is.
OWN_CHAIN_WORDS = "latency floor: a chain timed on our own minimal kernel, a yardstick"
#: A latency floor of one launch: the × over it mostly tracks how long a launch takes.
ONE_LAUNCH_WORDS = "latency floor: one launch, so the × mostly tracks launch latency"


def own_chain(r: dict[str, Any]) -> bool:
    """Whether a row's latency floor is a chain timed on our own minimal kernel (chapter 04's recursion)."""
    return bool(re.match(r"the recursion's \d+ dependent frames", r.get("latency_what") or ""))


def _binding_words(r: dict[str, Any]) -> str:
    """The kind of a row's binding floor in its cell: a chain our own kernel times and a one-launch floor say so."""
    if r.get("binding") == "latency" and own_chain(r):
        return OWN_CHAIN_WORDS
    if r.get("binding") == "latency" and r.get("latency_what") == ONE_KERNEL and not r.get("floor_words"):
        return ONE_LAUNCH_WORDS
    return floor_kind(r, short=True)


def _bound_cells(r: dict[str, Any]) -> tuple[str, str]:
    """A row's tighter bound, where one is measured (chapter 02's copy and two launches, chapter 05's read of the
    weights alone): its time and what it is in a few words, and our median over it; dashes where there is none."""
    ms = r.get("design_bound_ms")
    if ms is None or r.get("floors_as_above"):
        return "–", "–"
    return f"{_floor(ms)}, {r['design_bound_words']}", f"{r['median_ms'] / ms:.1f}×"


#: Run bookkeeping a note may carry, cut before the reader sees it: (pattern, replacement); a note left empty is
#: dropped. The kernel cell names the step an entry point ran, so a note saying only that goes.
_BOOKKEEPING = [
    (r"^timed through the chapter's entry point, which runs step \w+ at this shape\.?$", ""),
    (r"\s*This card's benchmark predates the chapter's entry point[^.]*\.", ""),
    (r", timed alone in a separate run,", ", timed alone,"),
    (r" \(chapter 08's row takes the same bound from its run\)", ""),
    (r" \(counted in a separate run\)", ""),
    (r" \(chapter 07's run prices its bytes\)", ""),
    (r" in chapter 07's own run", ""),
    (r"not measured: chapter 07's run counts a forward's kernels on its cost models only", "not measured on this model"),
]


def _plain(text: str) -> str:
    """``text`` without the run bookkeeping in :data:`_BOOKKEEPING`."""
    for pattern, repl in _BOOKKEEPING:
        text = re.sub(pattern, repl, text, flags=re.IGNORECASE)
    return text.strip()


def _room(r: dict[str, Any]) -> tuple[float, str] | None:
    """How much room a lead row leaves: our median over its own-work yardstick where a run times one (the nearer
    mark), else over the card's floor; with that in a few words. None where neither is given."""
    if r.get("floors_as_above") or r.get("loop_bound"):
        return None
    if r.get("design_bound_ms"):
        x = r["median_ms"] / r["design_bound_ms"]
        return x, f"{x:.1f}× its own work, {_floor(r['design_bound_ms'])} µs"
    if r["binding"] and not r["no_pct_why"] and r.get("pct_of_floor"):
        x = 100 / r["pct_of_floor"]
        kind = {"latency": "one launch" if r["number"] != 4 else "its chain of frames", "bytes": "its bytes",
                "compute": "its compute"}.get(r["binding"], r["binding"])
        return x, f"{x:.1f}× its floor, {kind}"
    return None


def room_words(first_rows: list[tuple[dict[str, Any], dict[str, str]]], root: Path = BENCH_RESULTS) -> str:
    """The paragraph under the lead table: which kernels have most room and which are near their mark, by our
    median over the own-work yardstick where a run times one, else over the floor; and, where a one-launch row's
    floor is an empty kernel, how far that kernel moves from run to run on the card."""
    def label(r: dict[str, Any]) -> str:
        if r.get("part_notebook"):
            return "chapter 05 part 1"
        if r["notebook"].startswith("notebooks/05_ternary_2"):
            return "chapter 05 part 2"
        if r["number"] == 3:
            return "chapter 03's " + ("headline case" if r.get("page_headline") else "stress case")
        return f"chapter {r['number']:02d}"

    rated = sorted(((x, words, label(r), r) for r, _ in first_rows if (got := _room(r)) for x, words in [got]),
                   key=lambda t: -t[0])
    if len(rated) < 4:
        return ""
    k = 3 if len(rated) >= 6 else 2
    most, least = rated[:k], rated[-k:][::-1]

    def listed(xs: list[tuple[float, str, str, dict[str, Any]]]) -> str:
        said = [f"{lab} ({words})" for _, words, lab, _ in xs]
        return ", ".join(said[:-1]) + " and " + said[-1]

    out = (f"Where room is left, by our median over its own work where a run times it, else over its floor: most in "
           f"{listed(most)}; least in {listed(least)}.")
    # a row ranked by its own work that its floor alone would rank higher: said, so one yardstick does not hide it
    for _, _, lab, r in rated:
        if r.get("design_bound_ms") and r["binding"] and r.get("pct_of_floor") and 100 / r["pct_of_floor"] > most[0][0]:
            out += (f" By its floor alone {lab} would lead ({100 / r['pct_of_floor']:.1f}×), but its floor leaves out "
                    "work the call must do, which its own work counts.")
    one_launch = [r for _, _, _, r in rated if r["binding"] == "latency" and r["number"] != 4]
    lo, hi, _ = empty_kernel_range(root).get(LEAD_CARD, (None, None, ""))
    if one_launch and lo and hi:
        r = one_launch[0]
        out += (f" A one-launch floor is an empty kernel, which on the {LEAD_CARD} takes {lo:.2f} to {hi:.2f} µs "
                f"from run to run: against the fastest, {label(r)} would read {r['median_ms'] * 1e3 / lo:.1f}× its "
                "floor" + (", so either way it has the most room." if r is rated[0][3] else
                           ", so its figure holds to within that swing."))
    return out


def scoreboard_markdown(root: Path = BENCH_RESULTS, link: Callable[[str], str] | None = None,
                        folds: str = "html") -> str:
    """The scoreboard as Markdown tables: first one row per chapter (its final kernel at its headline shape on
    :data:`LEAD_CARD`, and chapter 05's part 1: our time, the strongest rival, the card's floor that binds and how
    close our median is to it, then the tighter bound the call's own work sets where a run times one, and our median
    over it), then the decode loops against our loop's bounds, then every other row (the other card, the chapters'
    other cases) with a line for a chapter or card that has no row, saying why; then the re-run's p99 − p50, a
    question of its own, in a table of its own; then each row's three floors, and each chapter's notes folded under
    its title, each note naming the row it belongs to. ``link(notebook)`` gives a chapter's link
    target (default: the notebook's path); ``folds``: ``"html"`` (``<details>``, for the README) or ``"dropdown"``
    (MyST dropdowns, the book's own folds)."""
    from html import escape

    link = link or (lambda nb: nb)
    every = scoreboard(root)
    apart = not_comparable(every)
    # a run set up differently from the other card's is not compared with it: it stays off the page
    board = [r for r in every if (r["number"], r["card"]) not in apart]
    first = {}
    for i, r in enumerate(board):
        first.setdefault((r["number"], r["card"]), i)
    # each card's rows of a chapter in the chapter's order (its headline first: chapter 05's BitNet row), except that
    # chapter 06 leads with the grouped-query layout (Llama 3.1 8B's) where its card measured it
    board.sort(key=lambda r: (first[(r["number"], r["card"])], not r.get("grouped_query")))
    measured_cards = {n: [b["card"] for b in board if b["number"] == n and b["lead"] and "missing" not in b]
                      for n in {b["number"] for b in board}}
    # chapter -> note -> the rows it belongs to: (kernel cell, card; None where it holds on every card)
    notes: dict[int, dict[str, list[tuple[str, str | None]]]] = {}

    def note(r: dict[str, Any], text: str, every_card: bool = False) -> None:
        """A note under chapter ``r``'s fold, naming ``r``'s kernel and, unless it holds on every card, its card;
        without how the runs were made (:func:`_plain`), and not at all where that is all it says."""
        text = _plain(text)
        if not text:
            return
        on = notes.setdefault(r["number"], {}).setdefault(text.rstrip(".") + ".", [])
        key = (_kernel_label(r), None if every_card else r["card"])
        if key not in on:
            on.append(key)

    # chapter -> (kernel cell, card) -> column -> value: numbers a note would repeat row by row, as a small table
    facts: dict[int, dict[tuple[str, str], dict[str, str]]] = {}
    fact_words: dict[int, list[tuple[dict[str, Any], str]]] = {}  # the same, as sentences, for a chapter of one row

    def fact(r: dict[str, Any], column: str, value: str, words: str = "") -> None:
        facts.setdefault(r["number"], {}).setdefault((_kernel_label(r), short_card(r["card"])), {})[column] = value
        if words:
            fact_words.setdefault(r["number"], []).append((r, words))

    def chapter_link(r: dict[str, Any]) -> str:
        # chapter 05's rows are part 2's, but for part 1's, which link part 1's own page
        if r.get("part_notebook"):
            return f"[{r['number']:02d}. {r['title']}, part 1]({link(r['part_notebook'])})"
        part = ", part 2" if r["notebook"].startswith("notebooks/05_ternary_2") else ""
        return f"[{r['number']:02d}. {r['title']}{part}]({link(r['notebook'])})"

    def shape_words(r: dict[str, Any]) -> str:
        """A row's shape as the chapter cell gives it; chapter 03's headline says how many of its slots the budget
        lets search, so its ratio is read as that many searches (:func:`book.results.ngram_searching`)."""
        shape = r.get("shape") or ""
        if r.get("page_headline"):  # chapter 03's headline case, its answer's, before its stress case
            return f"headline case, {shape}"
        if r["number"] == 3 and shape.endswith(f"budget {NGRAM_CASE['threshold']}"):
            from book.results import ngram_searching

            searching = ngram_searching(folders[r["card"]])
            if searching is not None and searching < NGRAM_CASE["batch"]:
                shape += f" (it lets {searching} slot{'' if searching == 1 else 's'} search)"
        elif r.get("page_lead"):  # chapter 03's lead case: how many of its slots search, as the results page says
            from book.results import ngram_many

            many = ngram_many(folders[r["card"]])
            if many is not None and many[0] == (NGRAM_LEAD_CASE["batch"], NGRAM_LEAD_CASE["seq_len"],
                                                NGRAM_LEAD_CASE["threshold"]):
                shape += f" ({many[2]} of them search)"
            shape = f"stress case, {shape}"
        return shape

    folders = {card_name(c): c for c in cards(root)}
    lead_card = next((card_name(c) for c in cards(root) if short_card(card_name(c)) == LEAD_CARD), None)
    leads: dict[int, dict[str, Any]] = {}  # per chapter, its first measured row on the lead card (else on another)
    for r in board:
        if "missing" not in r and on_page(r) and (r["number"] not in leads or
                                   (leads[r["number"]]["card"] != lead_card and r["card"] == lead_card)):
            leads[r["number"]] = r
    # chapter 05's Triton part, a page of its own, has its row on the lead card too
    lead_ids = {id(r) for r in leads.values()} | {id(r) for r in board if (r.get("part_notebook") or r.get("page_lead"))
                                                 and "missing" not in r and r["card"] == lead_card and on_page(r)}
    # chapter 05's part 1 reads before its part 2, in every table: a stable sort that keeps each chapter's cards and
    # rows in their order otherwise
    chapter_at = {}
    for i, r in enumerate(board):
        chapter_at.setdefault(r["number"], i)
    board.sort(key=lambda r: (chapter_at[r["number"]], not r.get("part_notebook")))

    cells: list[tuple[dict[str, Any], dict[str, str]]] = []  # each row of the two times tables, its cells by column
    floors: list[tuple[dict[str, Any], str]] = []  # each row of the floors table, its cells after the chapter's
    under_lead: list[str] = []
    under: list[str] = []
    shown: set[int] = set()
    tail_cells: list[tuple[dict[str, Any], dict[str, str]]] = []  # the re-run's rows: its median and p99
    unbound: list[str] = []  # each decode loop's bounds that do not bind, said once in the notes
    off: list[tuple[dict[str, Any], float]] = []  # rows whose p50 / p99 run lands off the chapter's median
    page_keys: dict[int, list[tuple[str, str]]] = {}  # chapter -> its rows on the page: (kernel label, card)

    for r in board:
        card = short_card(r["card"])
        if "missing" in r:
            if r["missing"] == "not measured on this card":
                continue  # a card with nothing measured for this chapter: no row of dashes
            same = [b for b in board if b["number"] == r["number"]]
            one_reason = all(b.get("missing") == r["missing"] for b in same)
            if one_reason and r["number"] in shown:
                continue
            shown.add(r["number"])
            if one_reason:  # a chapter no card can time (no GPU kernel): a line under the table, not a row of dashes
                head, _, rest = r["missing"].partition(": ")
                under_lead.append(f"{chapter_link(r)} has no row ({head})" + (f": {rest}." if rest else "."))
                continue
            cells.append((r, {"card": card, "kernel": r["missing"]}))
            if r["number"] != 1:  # chapter 01 has no GPU kernel, so no floor: its one line above says so
                floors.append((r, f" | {card} | – | – | – | – |"))
            continue
        shown.add(r["number"])
        if not on_page(r):
            continue
        ours = r["ours"]
        m = re.search(r"its entry point \(running (step \d+)\)", r["ours_long"])
        if m and r.get("ours_end_to_end_ms") is None:  # the cell's step is the one the entry point picked
            note(r, f"timed through the chapter's entry point, which runs {m.group(1)} at this shape")
        if r["clock"] != "gpu":  # the clock in a few words in the cell, the details in the chapter's notes
            first_note = r["notes"][0] if r["notes"] else f"{r['clock']} clock"
            ours += f", {first_note.split(':')[0]}"
            if ":" in first_note:
                note(r, first_note, every_card=True)
        rival = f"{short_rival(r['rival']) or r['rival']}: {us(r['rival_ms'], missing=NOT_MEASURED)}"
        if r.get("rival_check") == "misses":  # the rival's check is said where it fails; passing is the rule
            note(r, f"{r['rival']} misses our float64 check")
        also = r.get("rival_also")
        if also and also.startswith("cuBLAS bf16 on the matrix stored densely") and r.get("dense_ms"):
            fact(r, DENSE_COLUMN, us(r["dense_ms"]), also)  # a column in the chapter's small table, not a sentence
            fact(r, "ours faster than it", f"{r['dense_ratio']:.2f}×")
        elif also and not any(n.startswith(also.split(":")[0] + " ") for n in r["rival_notes"]):  # said there already
            note(r, also)
        if r["rival_clock"] not in (None, r["clock"]):
            rival += " (end to end, as our time in this row)"
            note(r, f"against {r['rival']}: it is timed {r['ratio_note'] or 'on another clock'}; the ratio compares "
                    "our call timed the same way, not our GPU time", every_card=True)
        for column, value, words in r.get("rival_facts", ()):
            fact(r, column, value, words)
        if r.get("rival_facts_why"):
            note(r, r["rival_facts_why"], every_card=True)
        for extra in r["rival_notes"]:
            note(r, extra)
        for extra in r["notes"][2:]:
            note(r, extra)
        vs = f"{r['vs_rival']:.2f}×" if r["vs_rival"] is not None else NOT_MEASURED
        if r.get("rival_name") and r["vs_rival"] is not None:  # the rival in the ratio's own cell
            vs += f" vs {r['rival_name']}"
        if r["number"] == 7 and r["vs_rival"] is not None and "SmolLM2" in r["ours"]:
            # what the loop's ratio is made of: chapter 01's jumps, the cached sets (host work), chapter 02's head
            from book.results import decode_split

            split = decode_split(folders[r["card"]])
            if split:  # the two runs split 3a and the head differently: only their product is resolved
                vs += (f": {split['jumps']:.2f}× jumps, {split['sets'] * split['head']:.2f}× the cached sets and "
                       "the head together")
        if r["ratio_note"] and r["rival_clock"] == r["clock"] and not r.get("loop_bound"):
            # less what the speedup cell's words already say; a decode loop's spread over its requests is the
            # results page's note (this page is about its bound)
            said = r["ratio_note"].removeprefix("the ratio of the two median times; ")
            note(r, said[0].upper() + said[1:])
        median, slowest = r["median_ms"], r["slowest_ms"]
        if r.get("ours_end_to_end_ms") is not None:  # the ratio compares end-to-end times: one clock in the row
            ours += f", end to end (its GPU time: the {card}'s {r['ours']} row)"
            median, slowest = r["ours_end_to_end_ms"], r.get("ours_end_to_end_slowest_ms")
        overlap = None  # a lead about the size of a spread: whether the two sides' repetitions overlap
        if r.get("rival_spread_ms") and r.get("vs_rival") and 1 < r["vs_rival"] < CLOSE_LEAD and not is_tie(r["vs_rival"]):
            # (a tie by the course's rule stays a tie: drift between runs exceeds one run's spread)
            (rlo, _, rhi), (olo, ohi) = r["rival_spread_ms"], (r["fastest_ms"], r["slowest_ms"])
            overlap = (f"our repetitions took {us(olo)}–{us(ohi)} µs, the rival's {us(rlo)}–{us(rhi)} µs: "
                       + ("the ranges do not overlap" if ohi < rlo else "the ranges overlap, so the lead is within "
                          "the spread of the runs"))
        t = tail(folders[r["card"]], r["number"], r["tail_params"], r.get("tail_series")) \
            if r.get("tail_params") else None
        other = ctc_tail_targets(r, t) if t is not None and r["number"] == 4 else None
        if other is not None:  # the p99 run timed other targets than the row's: its spread is theirs
            note(r, other[1])
        if t is not None:  # the re-run's own median and p99, in a table of their own: no row mixes two runs
            # the re-run's own median and p99, a pair from one run: no p99 stands beside a median it is not from
            # the spread alone, p99 over p50 of the one run: its median is not the chapter's (the clocks are not
            # locked), so no p99 from it stands beside the chapter's median to be read against it
            p99 = (f"+{us(t['p99_ms'] - t['ms'])} ({t['p99_ms'] / t['ms'] - 1:.1%})"
                   + (f" ({_copies(t['rotated_copies'])})" if tail_copies(r, t) else ""))
            if other is not None and other[0]:
                p99 = "– (other targets; notes)"
            elif t["p99_ms"] > WIDE_TAIL * t["ms"]:  # a spread this wide is worth a line: the median alone misleads
                note(r, f"its re-measurements spread widely: p99 {us(t['p99_ms'])} µs against a median of "
                        f"{us(t['ms'])} µs in the same run (the slowest {us(t['max_ms'])} µs); why is not measured")
            fewer = tail_copies(r, t)
            if fewer:  # said in the cell in a few words, in the chapter's notes in full
                note(r, fewer)
            gap = t["ms"] / r["median_ms"] - 1 if r.get("median_ms") else None  # the re-run against the chapter's
            if gap is not None and not p99.startswith("–"):
                off.append((r, gap))  # the range of these gaps is said once, under the re-run's own table
                if overlap:  # the spread beside a close lead: whether the repetitions overlap, in the same cell
                    p99 += f"; the {r['vs_rival']:.2f}× lead: {overlap}"
                    overlap = None
            tail_cells.append((r, {"p99": p99}))
        if overlap:  # no re-run row to set it beside: in the chapter's notes
            note(r, overlap)
        binding, pct = _floor_cells(r)
        bound, over_bound = _bound_cells(r)
        if r["no_pct_why"]:  # a row of the same chapter and card that has a percentage, named beside the dash
            alone = next((b for b in board if b["number"] == r["number"] and b["card"] == r["card"]
                          and b is not r and b.get("pct_of_floor") is not None), None)
            if alone is not None:
                pct = pct[:-1] + f"; {alone['ours']}: {100 / alone['pct_of_floor']:.1f}×)"
        page_keys.setdefault(r["number"], []).append((_kernel_label(r), r["card"]))
        cells.append((r, {"card": card, "kernel": ours, "median": f"**{us(median)}** [{us(slowest)}]",
                          "rival": rival, "vs": vs, "binding": binding, "pct": pct, "bound": bound,
                          "over_bound": over_bound}))
        if r.get("floors_as_above"):
            continue
        if r["latency_floor_ms"] is None and not r["no_pct_why"] and r.get("latency_missing_why"):
            note(r, f"{'kernel-count bound' if r.get('loop_bound') else 'latency floor'}: {r['latency_missing_why']}")
        elif r["latency_what"] != ONE_KERNEL and r["latency_floor_ms"] is not None:
            note(r, f"{'kernel-count bound' if r.get('loop_bound') else 'latency floor'}: "
                    f"{r['latency_what']}" + (", timed on our own minimal kernel: a yardstick for our design, as "
                                               "own work is, not the card's limit" if own_chain(r) else ""),
                 every_card=True)  # chapter 08's latency floor is its loop's bound
        elif r["latency_floor_ms"] is None and not r["no_pct_why"]:
            note(r, "latency floor: no run on this card timed an empty kernel")
        for extra in r["notes"][1:2]:
            note(r, extra, every_card=True)
        if r.get("design_bound_ms") is not None:  # the own-work yardstick: what it is, once a chapter
            note(r, f"own work here is {r['design_bound_what']}", every_card=True)
            if id(r) in lead_ids:  # the lead table has no own-work columns: its time and ours over it, here
                fact(r, "own work (µs)", _floor(r["design_bound_ms"]),
                     f"its own work takes {_floor(r['design_bound_ms'])} µs; our median is "
                     f"{r['median_ms'] / r['design_bound_ms']:.1f}× it")
                fact(r, "our median ÷ own work", f"{r['median_ms'] / r['design_bound_ms']:.1f}×")
        for extra in r["floor_notes"]:
            if r.get("design_bound_ms") is not None and extra.startswith("a kernel that only reads"):
                continue  # its time is the row's tighter bound, in the table
            note(r, extra)

        def mark(kind: str, ms: float | None, missing: str) -> str:
            text = _floor(ms, missing=missing)
            return f"**{text}**" if r["binding"] == kind else text  # the floor that binds, in bold

        latency = "–" if r["no_pct_why"] else mark("latency", r["latency_floor_ms"], f"{NOT_MEASURED} on this card")
        if r.get("latency_borrowed") and r["latency_floor_ms"] is not None and latency != "–":
            latency += BORROWED_MARK
        if r.get("forward_bound_ms") is not None:  # chapter 08: both of its loop's chain bounds, the larger in bold
            latency = (f"{mark('forward', r['forward_bound_ms'], NOT_MEASURED)} (forward-time bound, the one that "
                       f"binds); {latency} (kernel-count bound)")
        kernel = r["ours"] + (", headline case" if r.get("page_headline") else ", stress case" if r.get("page_lead")
                              else "")  # chapter 03's two cases, told apart
        if r.get("loop_bound"):  # a decode loop's bounds are our loop's, not the card's: under the loops' table
            bounds = [(what, ms) for what, kind, ms in (
                ("byte bound", "bytes", r["byte_floor_ms"]), ("kernel-count bound", "latency", r["latency_floor_ms"]),
                ("forward-time bound", "forward", r.get("forward_bound_ms"))) if ms is not None and kind != r["binding"]]
            if bounds:  # the bounds that do not bind: one note for every loop row, said once
                model = (", " + r["ours"].split(", ")[-1]) if r["number"] == 7 else ""
                unbound.append(f"chapter {r['number']:02d}{model}: " + " and ".join(
                    f"its {what} ({_floor(ms)} µs)" for what, ms in bounds))
            continue
        floors.append((r, f" | {card} | {kernel} | {mark('bytes', r['byte_floor_ms'], NOT_MEASURED)} | "
                          f"{mark('compute', r['compute_floor_ms'], '–')} | {latency} |"))
    llama = [b for b in board if b.get("ternary_case") == "llama" and b.get("gemlite_check_error") is not None]
    if len({b["gemlite_fails_check"] for b in llama}) > 1:  # GemLite passes on one card and fails on the other
        errors = ", ".join(f"{b['gemlite_check_error']:.2%} on the {short_card(b['card'])}" for b in llama)
        note(llama[0], f"GemLite's error at 4096 × 14336 against float64 is {errors}, against a tolerance of "
                       f"{llama[0]['gemlite_check_tolerance']:.2%}, on the same inputs; GemLite's autotuner picks its "
                       "own launch on each card, the likely reason its rounding differs, so it passes our check on "
                       "one card and not on the other", every_card=True)
    small = _ctc_small_case_words(root) if any(r.get("tail_params") == CTC_SMALL_CASE and on_page(r)
                                               for r in board) else None
    if small:
        r4 = next((b for b in board if b["number"] == 4 and "missing" not in b
                   and b.get("shape", "").endswith("N = 1")), None)
        if r4 is not None:
            note(r4, small, every_card=True)

    no_row: dict[tuple[str, str], list[tuple[dict[str, Any], str]]] = {}  # (card, other cards) -> chapters, why
    for (number, card), why in sorted(apart.items()):  # said per chapter and card, not as a catch-all
        r = next(b for b in every if b["number"] == number)
        others = " and the ".join(short_card(b["card"]) for b in board if b["number"] == number and b["lead"]
                                  and "missing" not in b)
        no_row.setdefault((short_card(card), others or "other card"), []).append((r, why))
    for (card_, others), found in no_row.items():  # one sentence a card: its chapters, each with its reason
        if len(found) == 1:
            r, why = found[0]
            under.append(f"{chapter_link(r)} has no {card_} row: the {card_}'s benchmark does not time this case the "
                         f"way the {others}'s does (on the {card_} {why}).")
        else:
            under.append(" and ".join(chapter_link(r) for r, _ in found) + f" have no {card_} row: the {card_}'s "
                         f"benchmarks do not time their cases the way the {others}'s do (on the {card_}, "
                         + "; ".join(f"chapter {r['number']:02d}: {why}" for r, why in found) + ").")
    part_one_words = part_one_rival_words(board, link)

    def again(r: dict[str, Any]) -> str:
        """A chapter's later rows in a table: its title in italics, no link, so that a row read alone keeps it."""
        return "*" + re.sub(r"\[(.+?)\]\(.*?\)", r"\1", chapter_link(r)) + "*"

    def table(title: str, picked: list[tuple[dict[str, Any], dict[str, str]]], columns: list[tuple[str, str]],
              lines_under: list[str]) -> list[str]:
        """A times table: the chapter (its link and the shape of its first row here, once; its title alone, in
        italics, on the rows after it), then ``columns``; a long rival's name is shortened to one that reads alone."""
        out = [title, "", "| chapter: shape | " + " | ".join(h for _, h in columns) + " |",
               "|" + "---|" * (len(columns) + 1)]
        named: set[tuple[int, bool]] = set()
        for r, c in picked:
            key = (r["number"], bool(r.get("part_notebook")))  # chapter 05's part 1 has a page, and a link, its own
            shape = c.get("shape") or (shape_words(r) if r.get("shape") else "")
            # a decode loop's later row is another model: its shape is said again
            chapter = (again(r) + (f": {shape}" if shape and (r.get("loop_bound") or r.get("page_lead")) else "")
                       if key in named
                       else chapter_link(r) + (f": {shape}" if shape else ""))
            named.add(key)
            row = [c.get(key_, "–") for key_, _ in columns]
            out.append(f"| {chapter} | " + " | ".join(row) + " |")
        return out + ([""] + [u + "  " for u in lines_under] if lines_under else [])

    def fold(title: str, body: list[str]) -> list[str]:
        """A table folded under its title: a MyST dropdown in the book, ``<details>`` in the README."""
        if folds == "dropdown":
            return [f":::{{dropdown}} {title}", ""] + body + ["", ":::"]
        return [f"<details><summary>{escape(title, quote=False)}</summary>", ""] + body + ["", "</details>"]

    # chapter 07's real model first: the chapter's answer, then its 8B cost model (a stable sort)
    loops = sorted([rc for rc in cells if rc[0].get("loop_bound")],
                   key=lambda rc: (rc[0]["number"], not rc[0].get("real_model")))
    first_rows = [rc for rc in cells if id(rc[0]) in lead_ids and not rc[0].get("loop_bound")]
    rest = [rc for rc in cells if id(rc[0]) not in lead_ids and not rc[0].get("loop_bound")]
    one_card = all(r["card"] == lead_card for r, _ in first_rows + loops)
    # the card's floor, then beside it the call's own-work yardstick where a run times one (a yardstick, not a limit)
    common = [("kernel", "final kernel"), ("median", "median [slowest repetition], µs"),
              ("rival", "strongest rival (µs)"), ("vs", "speedup (rival ÷ ours)"),
              ("binding", "floor, the card's or a chain's (µs)"), ("pct", "× floor"),
              ("bound", "own work (µs)"), ("over_bound", "× own work")]
    # the lead table: the card's floor and our median over it; the own-work yardstick in the notes and the room
    # paragraph (the fold of both cards keeps its two columns)
    lead_common = [(k, h) for k, h in common if k not in ("bound", "over_bound")]
    lead_columns = lead_common if one_card else [("card", "card")] + lead_common
    for r, c in first_rows:  # the lead table's chapter cell names the shape: the kernel cell does not repeat it
        kernel, _, shape = c["kernel"].partition("; ")
        if shape and shape in (r.get("shape") or ""):
            c["kernel"] = kernel
        elif shape and r.get("part_notebook"):  # part 1's row: its weight shape in the chapter cell, as part 2's,
            # with its layer and, where GemLite is its rival, why this shape (the chapter's own fails GemLite's check)
            why = (", where our lead over GemLite is least of the shapes where GemLite passes our check"
                   if r.get("rival_series") == "gemlite_w2" else "")
            c["kernel"], c["shape"] = kernel, f"M = 1, N × K = {shape}"
            working_fails = any(b.get("ternary_case") == "llama" and not b.get("part_notebook")
                                and b.get("gemlite_fails_check") and short_card(b["card"]) == LEAD_CARD for b in board)
            note(r, f"its shape is {PART_ONE_LAYER}{why}" + (f"; at the chapter's working shape, an 8B Llama's down "
                    f"projection, GemLite fails the check on the {LEAD_CARD}" if why and working_fails else ""),
                 every_card=True)
    on = f", all measured on the {LEAD_CARD}" if one_card else ""
    under_lead.insert(0, WORDS)
    two = next((b for b in board if b["number"] == 2 and b["lead"] and "missing" not in b and on_page(b)
                and short_card(b["card"]) == LEAD_CARD), None)
    if two is not None:  # the whole step's rival is the path engines ship; the kernel's strongest rival, said beside it
        c = compiled_gather_pair(1000)
        if c is not None:
            note(two, "the whole step's rival is the path engines ship, the only one that starts from the bitmask; "
                      f"the kernel alone, given the ids, leads its strongest rival, torch.compile's fused gather, "
                      f"{c[1] / c[0]:.2f}× ({against(c[0], c[1])} µs; the results page)")
    if unbound:
        under_lead.append("Our loops' other bounds are lower and do not bind: " + "; ".join(unbound) + ".")
    flash = {}  # chapter 06's rival as each card ran it: its fastest back end and page size there
    for r in board:
        m = re.match(r"FlashInfer \((\w+), page (\d+)\)", r.get("rival") or "")
        if r["number"] == 6 and m and "missing" not in r:
            flash.setdefault(short_card(r["card"]), f"{m.group(1)} with pages of {m.group(2)}")
    if flash:
        cards_said = sorted(flash, key=lambda c: c != LEAD_CARD)
        under_lead.append("FlashInfer runs with the back end and page size fastest on each card of those its benchmark "
                          "tries: " + ", ".join(f"{flash[c]} on the {c}" for c in cards_said) + ".")
    # part 1's rival where GemLite fails our check: said beside the table that shows the row
    under_lead += [u for u in part_one_words if any(r.get("part_notebook") and short_card(r["card"]) in u
                                                    for r, _ in first_rows)]
    under += [u for u in part_one_words if u not in under_lead]
    # a row whose own run timed no empty kernel: its latency floor is the card's fastest, marked, said under its table
    caveat = ([f"{BORROWED_MARK} The run that timed this row timed no empty kernel: its latency floor is the card's "
               "fastest of its other runs."] if any(r.get("latency_borrowed") and r["binding"] == "latency"
                                                     for r, _ in first_rows) else [])
    rule = ("Each row is at the chapter's headline case; where the answer is a range over shapes (chapter 05), at the "
            f"shape of our least lead on the {LEAD_CARD} among those where the rival passes our check (the other "
            "card's row at the same shape). The floor is the card's (bytes, compute or one launch: an empty kernel "
            "in the run that timed the row) or a chain of dependent work the call cannot shorten (chapters 02 and "
            "04, their notes say which; [How we measure]"
            f"({link('how_we_measure.md')}#ceilings-and-floors) says how each is priced).")
    rule += ngram_row_words(root)
    # the own-work yardstick is two columns of the table (its time and our median over it); what it is, in a clause
    own_line = (["Own work (chapters 02 and 05): the work the call itself must do, timed where a run times it, a "
                 "yardstick for our design, not a limit; the notes say what it is and give its time."]
                if any(c.get("over_bound", "–") != "–" for _, c in first_rows) else [])
    times = table(f"**Each chapter's final kernel at its headline shape against its strongest rival{on}**",
                  first_rows, lead_columns, [rule] + own_line + caveat)
    room = room_words(first_rows, root)
    if room:  # which kernels still have room, from the rows' own × columns
        times += ["", room]
    if loops:
        # their rows race our own earlier loop, not a rival: the column says baseline
        loop_columns = [(k, h.replace("floor, the card's or a chain's (µs)", "our loop's bound that binds (µs)")
                         .replace("× floor", "× our loop's bound").replace("strongest rival", "baseline")
                         .replace("rival ÷ ours", "baseline ÷ ours"))
                        for k, h in common if k not in ("bound", "over_bound")]
        times += [""] + table(f"**Decode loops: against our loop's own bound{on}**", loops,
                              loop_columns if one_card else [("card", "card")] + loop_columns, [LOOP_BOUND_NOTE])
    notes_at = len(times)  # the one Notes fold, after both tables (it covers the loops too), goes here once said
    if rest and any(r.get("latency_borrowed") and r["binding"] == "latency" for r, _ in rest):
        under.append(f"{BORROWED_MARK} The run that timed this row timed no empty kernel: its latency floor is the "
                     "card's fastest of its other runs.")
    if rest:
        times += [""] + fold("The headline cases on both cards, H100 and H200",
                             table("", rest, [("card", "card")] + common, under)[2:])
    samples = [t for t in (tail(folders[r["card"]], r["number"], r["tail_params"], r.get("tail_series"))
                           for r, _ in tail_cells) if t]
    if tail_cells and samples:  # the spread of repeated measurements: another question than the distance to the
        # floor, so a table of its own, folded; the re-run's medians against the chapters' said once, as a range
        tail_on = sorted({short_card(r["card"]) for r, _ in tail_cells})
        several = len(tail_on) > 1
        spread_columns = ([("card", "card")] if several else []) + [
            ("kernel", "final kernel"), ("p99", f"p99 − p50 of {samples[0]['samples']} replays (µs)")]
        picked = [(r, {"card": short_card(r["card"]), "kernel": c["kernel"], "shape": c.get("shape", ""),
                       "p99": p99["p99"]})
                  for r, p99 in tail_cells for r2, c in cells if r2 is r]
        gaps = [g for _, g in off]
        drift = ""
        if gaps:
            lo, hi = min(gaps), max(gaps)

            def side(g: float) -> str:
                return f"{abs(g):.1%} {'below' if g < 0 else 'above'}"

            drift = (f" Its medians land between {side(lo)} and {side(hi)} the chapters' own, as runs do when the "
                     f"clocks are not locked ([How we measure]({link('how_we_measure.md')}#clocks-and-state)), so "
                     "only the spread is given; the speedups and the × columns use the chapters' medians.")
        line = (f"From a separate run on the {' and the '.join(tail_on)} that replays each call's graph "
                f"{samples[0]['samples']} times: how far one measurement lands above another, not one call's tail, "
                f"and not how close the call runs to its floor.{drift} {LOOP_NO_TAIL[1]}.")
        unrun = [r for r, _ in first_rows if short_card(r["card"]) in tail_on
                 and not any(r2 is r for r2, _ in tail_cells)]
        missing = (["part 1 of chapter 05"] if any(r.get("part_notebook") for r in unrun) else []) + (
            ["chapter 03's headline case"] if any(r.get("page_headline") for r in unrun) else [])
        if missing:  # a row of the first table this run did not replay: said in a clause, not left out silently
            line += f" It did not replay {' or '.join(missing)}."
        times += [""] + fold("How far one measurement lands above another (p99 − p50)",
                             table("", picked, spread_columns, [line])[2:])
    floor_lines = ["| chapter | card | kernel | byte floor (µs) | compute floor (µs) | latency floor (µs) |",
                   "|" + "---|" * 6]
    named: set[tuple[int, bool]] = set()
    for r, rest_cells in floors:
        key = (r["number"], bool(r.get("part_notebook")))  # chapter 05's two parts, each linked once
        floor_lines.append(f"| {again(r) if key in named else chapter_link(r)}{rest_cells}")
        named.add(key)
    if any(BORROWED_MARK in cells_ for _, cells_ in floors):
        floor_lines += ["", f"{BORROWED_MARK} The run that timed this row timed no empty kernel: its latency floor is "
                            "the card's fastest of its other runs."]
    floor_lines = fold("Each row's three floors (the one that binds, the largest, in bold)", floor_lines)

    for number, table in list(facts.items()):  # a table of one row would be heavier than its sentence
        if len(table) == 1:
            for r, words in fact_words.get(number, []):
                note(r, words)
            del facts[number]
    chapter_notes: list[str] = []
    for entry in ENTRIES:  # one paragraph a chapter: a note on every row it shows names none, others name theirs
        said = notes.get(entry.number, {})
        table = facts.get(entry.number)
        if not said and not table:
            continue
        shown_rows = list(dict.fromkeys(page_keys.get(entry.number, [])))
        one_card_only = len(measured_cards.get(entry.number, [])) < 2
        every = {short_card(c) for c in measured_cards.get(entry.number, [])}
        labels = list(dict.fromkeys(k for k, _ in shown_rows))
        shared = _common_start([lb.split(", ") for lb in labels]) if len(labels) > 1 else 0

        def row_name(label: str) -> str:
            """A row in a lead-in: the part of its kernel label the chapter's other rows do not share."""
            rest = ", ".join(label.split(", ")[shared:])
            return f"the {rest} row" if shared and rest else label

        said_by: dict[str, list[str]] = {}  # lead-in -> its sentences ("" for a note on every row)
        on_card: dict[str, list[str]] = {}  # lead-in -> the cards it names, where it names any
        for text, on_rows in said.items():
            plain = _prose(_plain(text))
            if not plain:
                continue
            covers = all(any(k == kk and (c in (None, cc) or one_card_only) for k, c in on_rows)
                         for kk, cc in shown_rows)
            if covers or not shown_rows:
                said_by.setdefault("", []).append(_sentence(plain))
                continue
            kernels = list(dict.fromkeys(k for k, _ in on_rows))
            cards_on = {short_card(c) for _, c in on_rows if c is not None}
            where = ([] if one_card_only or any(c is None for _, c in on_rows) or cards_on >= every
                     else sorted(cards_on))
            every_kernel = set(labels) <= set(kernels)
            lead = ("On the " + " and the ".join(where) if every_kernel and where else
                    "For " + " and ".join(row_name(k) for k in kernels)
                    + (" on the " + " and the ".join(where) if where else ""))
            if where:
                plain = plain.replace(" on this card", " there")
            said_by.setdefault(lead, []).append(plain)
            if where:
                on_card[lead] = where
        if said_by:
            # the notes on every row, then those on a row on every card, the lead card's, the other card's
            order = sorted(said_by, key=lambda lead: (0 if not lead else 1 if lead not in on_card else
                                                      2 if on_card[lead] == [LEAD_CARD] else 3))
            parts = []
            for lead in order:
                first, *more = said_by[lead]
                parts.append((f"{lead}, {_lower_first(first)}" if lead else _sentence(first))
                             + "".join(" " + _sentence(m) for m in more))
            chapter_notes += ["", f"**Chapter {entry.number:02d}, {entry.title}.** " + " ".join(
                p if p.endswith(".") else p + "." for p in parts)]
        if table:  # the numbers each row adds, one row each, in the order of the tables above
            columns = list(dict.fromkeys(c for v in table.values() for c in v))
            if not said_by:
                chapter_notes += ["", f"**Chapter {entry.number:02d}, {entry.title}.**"]
            chapter_notes += ["", "| row | card | " + " | ".join(columns) + " |",
                              "|---|---|" + "---|" * len(columns)]
            chapter_notes += [f"| {label} | {card} | " + " | ".join(v.get(c, "–") for c in columns) + " |"
                              for (label, card), v in sorted(table.items(), key=lambda kv: kv[0][1] != LEAD_CARD)]
    body = "\n\n".join(under_lead).split("\n") + chapter_notes  # one paragraph a note, then one a chapter
    if body:
        times[notes_at:notes_at] = [""] + fold("Notes", body)
    return "\n".join(times + [""] + floor_lines).rstrip() + "\n"


__all__ = ["BITMASK_CHAIN_KERNELS", "on_page", "ENTRIES", "Entry", "bitmask_chain_ms", "LEAD_CARD", "LOOP_NO_TAIL", "NOT_MEASURED", "PART_ONE_CASE", "PART_ONE_NOTEBOOK", "TAIL_NOTE", "TAIL_SERIES", "TAILS",
           "card_empty_kernel_ms", "chapter_run_words", "empty_kernel_range", "card_name", "entry_rows", "cards", "faster_rivals", "floor_kind", "not_comparable",
           "part_one_rival_words", "replayed_one_copy", "READ_ONLY_WHAT",
           "accuracy_check", "bitnet_run", "run_label", "run_words", "load", "missing", "one", "rows", "scoreboard", "scoreboard_markdown",
           "spread", "tail", "tail_copies"]
