"""The reader's summary of the course: one line per chapter (the question, the fair headline on each card, a link)
and the reading path (minutes of prose and code per page), computed from the committed benchmark JSON and the notebooks.

The fair headline of a chapter is its final kernel against the strongest rival measured at the same shape: the
scoreboard's comparison (:mod:`book.scoreboard`), so the results page, the landing page, the scoreboard and the
README never disagree. Chapter 01 has no GPU kernel: its line is the share of forward passes its jumps leave out over
its own suite (``assets/data/fsm_suite.json``, written by ``python -m studylog.fsm report --json``; chapter 01's page
checks the file against the suite it runs).
"""

from __future__ import annotations

import ast
import functools
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any, Callable

from book.common import against, and_list, cached_on_files, is_tie, prose_words, read_table, us
from book.masked_lm_head.lesson import COMPILED_RIVALS, compiled_gather_leads
from book.scoreboard import (CTC_CASE, ENTRIES, NGRAM_CASE, NOT_MEASURED, card_name, cards, load, rows, short_card,
                             scoreboard)
from studylog.paths import BENCH_RESULTS, DATA, REPO_ROOT

#: Words of prose a reader gets through in a minute of careful technical reading (listings and tables come on top).
WORDS_PER_MINUTE = 220
#: A reader's minutes for each listing or diff a page shows unfolded (and each code cell it shows that prints none),
#: and for each table: an allowance per block, not per line, so that a long diff a reader skims does not read as a
#: page twice as long.
LISTING_MINUTES = 1.0
TABLE_MINUTES = 0.5

#: Chapter 01's suite totals, the file its landing line reads.
FSM_SUITE = DATA / "fsm_suite.json"


def fsm_suite(path: Path = FSM_SUITE) -> dict[str, Any] | None:
    """Chapter 01's suite totals per whitespace pattern (``studylog.fsm.report.suite_summary``), or None where the
    file is missing."""
    import json

    return json.loads(path.read_text())["summary"] if path.is_file() else None


def fsm_line(summary: dict[str, Any] | None) -> tuple[float | None, str, str]:
    """Chapter 01's line from its suite totals: the share of forward passes the exact step (token jumps, step 2) leaves
    out with outlines' default whitespace, then the retokenizing step's range; the cell's text and a brief one."""
    if summary is None:
        return None, NOT_MEASURED, NOT_MEASURED
    d = summary["default"]["saved"]
    c = summary.get("compact", {}).get("saved")
    chars = sorted(x["char"] for x in (d, c) if x)
    cell = (f"**{d['token']:.1%}** fewer forward passes with token jumps, which keep the tokens"
            + (f" ({c['token']:.1%} on compact JSON)" if c else "")
            + f"; {chars[0]:.1%}" + (f" to {chars[-1]:.1%}" if len(chars) > 1 else "")
            + " if the output may be retokenized (character jumps)")
    return d["token"], cell, f"{d['token']:.1%} fewer forward passes with token jumps, output unchanged"


def fsm_note(summary: dict[str, Any]) -> str:
    """Chapter 01's note under the results table: what its line leaves out, the saving on compact JSON and the
    retokenizing step's range, in one clause."""
    d = summary["default"]["saved"]
    c = summary.get("compact", {}).get("saved")
    return ((f"with compact JSON, token jumps save {c['token']:.1%}, and " if c else "") + "character jumps, which "
            f"may retokenize the output, save {d['char']:.1%} (all {summary['default']['entries']} entries)"
            + (f" and {c['char']:.1%} (compact JSON)" if c else ""))


#: Chapter 01's recorded run of three engines on a SchemaStore sample: the real-schema figure its answer leads with.
FSM_REAL = DATA / "realworld_cl100k_base.json"


def fsm_real(path: Path = FSM_REAL) -> tuple[int, float, float] | None:
    """Chapter 01's real-schema figure as its page computes it (:func:`book.fsm.lesson.common_forced_shares`): how
    many SchemaStore schemas all three engines compile, and the least and the largest share of forced tokens over
    them, by engine (the share of forward passes exact token jumps skip); None where the file is missing."""
    import json

    from book.fsm.lesson import common_forced_shares

    if not Path(path).is_file():
        return None
    n, shares = common_forced_shares(json.loads(Path(path).read_text()))
    return (n, min(shares.values()), max(shares.values())) if n and shares else None


def fsm_suite_kinds() -> dict[str, int]:
    """How many entries of each kind chapter 01's suite holds (``{"json": 9, "regex": 4}``)."""
    from collections import Counter

    from studylog.fsm import schemas

    return dict(Counter(e.kind for e in schemas.suite()))


def fsm_answer(summary: dict[str, Any] | None, real: tuple[int, float, float] | None) -> str:
    """Chapter 01's answer in words, as the chapter gives it: the share of forward passes forced on real schemas
    first (:func:`fsm_real`), then the suite's saving with exact token jumps, most of it from its regexes."""
    out = []
    if real is not None:
        n, lo, hi = real
        out.append(f"{100 * lo:.1f}–{100 * hi:.1f}% of forward passes forced on {n} real SchemaStore schemas, skipped "
                   "with the output unchanged")
    if summary is not None:
        kinds = fsm_suite_kinds()
        out.append(f"{summary['default']['saved']['token']:.1%} on the course's {summary['default']['entries']}-entry "
                   f"suite, most of it from its {kinds.get('regex', 0)} regexes")
    # (the results line drops "the course's": its clauses stay short)
    return "; ".join(out) or NOT_MEASURED


def decode_real(card: Path, model: str = "smollm2") -> dict[str, Any] | None:
    """Chapter 07's answer on ``card``: the loop with chapters 01 and 02 (step 3) against the baseline loop (step 1)
    on the real model, SmolLM2-135M (``model``: or a cost model, "8b"), batch 1
    (:func:`book.decode.lesson.result_rows`: medians of the time per token (µs) over its requests, their ratio, the
    requests' own ratios); None where the file lacks it."""
    from book.decode.lesson import result_rows
    from studylog.plotting import Results

    data = load(card, "decode")
    if data is None:
        return None
    return next((r for r in result_rows(Results(None, data)) if r["model"] == model and r["batch"] == 1), None)


def decode_split(card: Path) -> dict[str, float] | None:
    """Where chapter 07's answer on SmolLM2-135M comes from on ``card``, as the chapter gives it
    (:mod:`book.decode.lesson`): chapter 01's jumps (step 2 over step 1, ``jumps``), the allowed sets precomputed from
    the automaton (3a over step 2, ``sets``), chapter 02's head and argmax (3b with 3c over 3a, ``head``), chapter 02's
    head and argmax on the 8B cost model (step 3 over 3a in the same run, as the chapter's steps table gives it,
    ``head_8b``; None without it), and what a grammar costs
    before its request (the automaton's median compile, ``compile_ms``, against a whole request's decode,
    ``request_ms``), step 1 and 3a's µs a token (``small``), the second H200 run's 3a ratios (``again``) and, on the
    H200, the run that interleaves 3a and step 3 (``interleaved``: :func:`book.decode.lesson.head_interleaved`);
    None where the file lacks any of the real model's parts."""
    from book.decode import lesson
    from studylog.plotting import Results

    data = load(card, "decode")
    if data is None:
        return None
    results = Results(None, data)
    steps, parts, setup = (lesson.real_steps_rows(results, 1), lesson.real_step03_parts(results, 1),
                           lesson.grammar_setup(results))
    if len(steps) < 2 or parts is None or setup is None:
        return None
    rows_8b = lesson.steps_rows(results, "8b", 1, with_3a=True)  # step 3 over 3a: the steps table's, this run
    head_8b = rows_8b[3]["x_previous"] if len(rows_8b) >= 4 else None
    with_3a = lesson.real_steps_rows_3a(results, 1)
    small = (with_3a[0]["us"], with_3a[2]["us"]) if len(with_3a) >= 4 else None  # step 1 and 3a, µs a token
    second = lesson.second_run()  # the SmolLM2 rows sit within run-to-run noise: the second H200 run beside them
    again = None if second is None else lesson.real_steps_rows_3a(second, 1)
    again = {"sets": again[2]["x_previous"], "small": again[0]["us"] / again[2]["us"], "head": again[3]["x_previous"]} \
        if again and len(again) >= 4 else None
    interleaved = lesson.head_interleaved(1) if card is not None and card.name == "nvidia-h200" else None
    return {"jumps": steps[1]["x_previous"], "sets": parts["x_3a"], "head": parts["x_3bc"], "head_8b": head_8b,
            "interleaved": interleaved,
            "compile_ms": setup["automaton_ms"], "request_ms": setup["decode_ms"], "small": small, "again": again}


def decode_split_words(split: dict[str, float], landing: bool = False, bold: bool = False) -> str:
    """:func:`decode_split` in words. ``landing``: what chapters 01 and 02 buy on SmolLM2-135M (chapter 01's jumps,
    the answer, bold where ``bold``; chapter 02's head beside it by chapter 07's one rule,
    :func:`book.decode.lesson.real_verdict`, with its gain on the 8B cost model); otherwise the reuse the cached
    allowed sets (host work, neither chapter's) assume."""
    from book.decode.lesson import real_verdict

    # the head by chapter 07's one rule: its interleaved run, else what the whole runs say together
    head = real_verdict(split["head"], (split.get("again") or {}).get("head"), split.get("interleaved"))
    if landing:  # what each chapter buys, each against the step before; the cached sets (host work) apart
        jumps = f"{split['jumps']:.2f}×"
        return (f"on SmolLM2-135M, chapter 01's exact jumps {f'**{jumps}**' if bold else jumps}; chapter 02's head "
                + ("a tie there" if head["word"] == "tie" else "unresolved there (two runs disagree)"
                   if head["word"] == "runs disagree"
                   else f"{head['x']:.2f}× there (timed in rounds alternating with and without it)"
                   if head["source"] == "interleaved" else f"{head['x']:.2f}× there")
                + ("" if split["head_8b"] is None else f", {split['head_8b']:.2f}× on the 8B cost model (synthetic weights)"))
    again = "" if not split.get("again") else f", {split['again']['sets']:.2f}× in another run"
    return (f"the cached allowed sets ({split['sets']:.2f}×{again}) assume a grammar compiled once and reused (a median "
            f"{split['compile_ms']:.0f} ms to compile, against {split['request_ms']:.0f} ms to decode a request)")


def decode_step_ratio(card: Path | None, step: str, model: str = "smollm2") -> float | None:
    """Chapter 07's step ``step`` against its baseline loop (step 1) on ``card``: the ratio of the two median times
    per output token over the batch-1 requests with compact whitespace, as its steps table gives it; None without
    them."""
    import statistics

    from book.scoreboard import rows

    data = load(card, "decode") if card is not None else None
    if data is None:
        return None
    ms = {s: [r["ms"] for r in rows(data, s, model=model, batch=1, whitespace="compact")] for s in ("step01", step)}
    return statistics.median(ms["step01"]) / statistics.median(ms[step]) if all(ms.values()) else None


def speculate_workloads(card: Path) -> dict[str, dict[str, Any]]:
    """Chapter 08's answer on ``card`` on each workload, as the chapter computes it
    (:func:`book.speculate.lesson.closed_ratio`: chapter 07's loop over ours, the ratio of the median times per
    output token over the batch-1 requests that close their JSON): per workload its ``ratio``, both medians (ms) and
    how many ``requests``; empty where the file lacks them."""
    import statistics

    from book.speculate.lesson import SHIPPED, closed_median_ms
    from studylog.plotting import Results
    from studylog.speculate import report

    data = load(card, "speculate")
    out: dict[str, dict[str, Any]] = {}
    if data is None:
        return out
    res = Results(None, data)
    for workload in report.WORKLOADS:
        try:
            theirs, ours = (closed_median_ms(res, s, workload) for s in ("ch7_step03", SHIPPED))
        except (statistics.StatisticsError, StopIteration, KeyError):
            continue
        out[workload] = {"ratio": theirs / ours, "ms": ours, "rival_ms": theirs,
                         "requests": len(report.closed_requests(res.rows, workload))}
    return out


#: Chapter 08's workloads in words.
WORKLOAD_WORDS = {"extraction": "documents the answer copies from", "low_copy": "low-copy requests"}


#: Chapter 01's peers on the same suite (xgrammar's jump-forward string, llguidance's fast-forward tokens), the totals
#: its landing line sets beside ours: written by :func:`write_fsm_peers`.
FSM_PEERS = DATA / "fsm_peers.json"


def fsm_peer_totals(peer_rows: list[Any]) -> dict[str, Any]:
    """Chapter 01's peer totals (:func:`book.fsm.lesson.policy_totals`, the peer table's last row) as the file keeps
    them: the passes without jumps (``none``) and per ``library/policy`` the passes and the documents written in
    another split than the tokenizer's (``noncanonical``)."""
    from book.fsm.lesson import policy_totals

    return {"none": sum(r.passes["none"] for r in peer_rows if r.library == "ours"),
            "policies": {f"{lib}/{policy}": {"passes": t["passes"], "noncanonical": t["noncanonical"]}
                         for (lib, policy), t in policy_totals(peer_rows).items()}}


def write_fsm_peers(path: Path = FSM_PEERS, n_samples: int = 8) -> dict[str, Any]:
    """Run chapter 01's comparison with xgrammar and llguidance (:func:`book.fsm.peers.compare_peers`, the suite's
    documents, seed 0) and write its totals (:func:`fsm_peer_totals`) to ``path``: the whole suite with default
    whitespace under ``totals``, the JSON schemas with compact whitespace (the chapter's second suite) under
    ``compact``; needs the peers (``pip install -e '.[peers]'``)."""
    import datetime
    import json

    from book.fsm import peers
    from studylog.fsm import schemas

    totals = fsm_peer_totals(peers.compare_peers(n_samples=n_samples, seed=0))
    json_entries = [e for e in schemas.suite() if e.kind == "json"]  # a regex has no whitespace to choose
    compact = fsm_peer_totals(peers.compare_peers(json_entries, whitespace="compact", n_samples=n_samples, seed=0))
    record = {"command": "python -c 'from book.results import write_fsm_peers; write_fsm_peers()'",
              "date": datetime.date.today().isoformat(), "samples": n_samples, "seed": 0,
              "versions": peers.peer_versions(), "totals": totals, "compact": compact}
    Path(path).write_text(json.dumps(record, indent=1) + "\n")
    return record


def fsm_peers(path: Path = FSM_PEERS, whitespace: str = "default") -> dict[str, Any] | None:
    """:func:`write_fsm_peers`'s totals for ``whitespace`` (``default``: the whole suite; ``compact``: the JSON
    schemas), or None where the file (or that suite's totals) is missing."""
    import json

    if whitespace not in ("default", "compact"):
        raise ValueError(f"whitespace must be 'default' or 'compact', not {whitespace!r}")
    if not Path(path).is_file():
        return None
    record = json.loads(Path(path).read_text())
    return record["totals"] if whitespace == "default" else record.get("compact")


#: The peer policy chapter 01 calls the strongest: llguidance's fast-forward tokens.
FSM_PEER = "llguidance/tokens"
#: Chapter 01's comparison run again on the real SchemaStore schemas all three engines compile (compact JSON, on
#: documents walked from our automaton): written by ``lab/fsm/real_schema_passes.py``, its totals laid out as
#: :data:`FSM_PEERS`'s.
FSM_PEERS_REAL = DATA / "fsm_peers_realworld.json"


def fsm_peers_real(path: Path = FSM_PEERS_REAL) -> dict[str, Any] | None:
    """The real schemas' totals, as :func:`fsm_peers` gives the suite's (``none``, and per ``library/policy`` its
    ``passes``), with ``schemas``: how many schemas they cover; None where the file is missing."""
    import json

    if not Path(path).is_file():
        return None
    record = json.loads(Path(path).read_text())
    return record["totals"] | {"schemas": len(record["schemas"])}


def passes_saved(totals: dict[str, Any] | None, policy: str) -> float | None:
    """The share of forward passes ``policy`` (``"ours/tokens"``, :data:`FSM_PEER`, ...) saves in ``totals``
    (:func:`fsm_peers`, :func:`fsm_peers_real`); None where it is not there."""
    if not totals or policy not in totals["policies"]:
        return None
    return 1 - totals["policies"][policy]["passes"] / totals["none"]


def fsm_passes_pair(real_totals: dict[str, Any] | None = None) -> str:
    """Chapter 01's answer cell in one metric, passes saved on the real SchemaStore schemas: llguidance's
    fast-forward tokens against ours (exact token jumps), then the decision; empty without the file (default:
    :func:`fsm_peers_real`). The suite's numbers are in the line's notes (:func:`fsm_suite_notes`)."""
    real_totals = real_totals if real_totals is not None else fsm_peers_real()
    ours_real, theirs_real = (passes_saved(real_totals, p) for p in ("ours/tokens", FSM_PEER))
    if ours_real is None or theirs_real is None:
        return ""
    return (f"on {real_totals['schemas']} real schemas (SchemaStore), llguidance's fast-forward tokens save "
            f"{theirs_real:.1%} of passes, our exact token jumps {ours_real:.1%}; ship theirs")


def fsm_corpora_pair(real_totals: dict[str, Any] | None = None, suite: dict[str, Any] | None = None,
                     peers: dict[str, Any] | None = None) -> str:
    """Chapter 01's results line: passes saved on each corpus, each share with its corpus and policy named (real
    schemas, then the suite); empty without the files (defaults: :func:`fsm_peers_real`, :func:`fsm_peers`)."""
    real_totals = real_totals if real_totals is not None else fsm_peers_real()
    peers = peers if peers is not None else fsm_peers()
    ours_real, theirs_real = (passes_saved(real_totals, p) for p in ("ours/tokens", FSM_PEER))
    theirs_suite = passes_saved(peers, FSM_PEER)
    if ours_real is None or theirs_real is None:
        return ""
    out = f"on {real_totals['schemas']} real schemas: llguidance {theirs_real:.1%}, ours {ours_real:.1%}"
    if suite is not None and theirs_suite is not None:
        out += f"; suite: ours {suite['default']['saved']['token']:.1%}, llguidance {theirs_suite:.1%}"
    return out + " of passes saved"


def fsm_suite_notes(suite: dict[str, Any], peers: dict[str, Any] | None = None,
                    compact: dict[str, Any] | None = None) -> list[str]:
    """Chapter 01's suite on the results page, each policy named: passes saved by step 2 (our exact token jumps)
    against llguidance's fast-forward tokens, then by step 3 (our character jumps, which are xgrammar's string),
    over the whole suite and with compact JSON (defaults: :func:`fsm_peers`, both whitespaces)."""
    peers = peers if peers is not None else fsm_peers()
    compact = compact if compact is not None else fsm_peers(whitespace="compact")
    d, c = suite["default"]["saved"], suite.get("compact", {}).get("saved")
    theirs = passes_saved(peers, FSM_PEER)
    out = [f"on the course's {suite['default']['entries']}-entry suite (not the real schemas), step 2, our exact "
           f"token jumps, saves {d['token']:.1%} "
           f"of passes, most of it from its {fsm_suite_kinds().get('regex', 0)} regexes"
           + (f", against llguidance's fast-forward tokens' {theirs:.1%} (we lose)" if theirs is not None else "")]
    out.append(f"step 3, our character jumps (xgrammar's string, which may retokenize the output), saves "
               f"{d['char']:.1%}" + (f", and {c['char']:.1%} with compact JSON, where step 2 saves {c['token']:.1%}"
                                     + (f" and llguidance {passes_saved(compact, FSM_PEER):.1%}"
                                        if passes_saved(compact, FSM_PEER) is not None else "") if c else ""))
    return out


def peer_bare(words: str) -> str:
    """:func:`fsm_peer_words` as the results line gives it: the peer and its number, its caveat left to a note
    ("llguidance's fast-forward tokens: 22.3%")."""
    return re.sub(r" \([^()]*\)$", "", words).replace(" save ", ": ", 1)


def fsm_peer_words(totals: dict[str, Any] | None) -> str:
    """llguidance's fast-forward tokens on chapter 01's suite, in words: the share of passes they save and whether
    they keep the tokenizer's own split; empty without the file."""
    if not totals or FSM_PEER not in totals["policies"]:
        return ""
    p = totals["policies"][FSM_PEER]
    split = ("its output too in the tokenizer's own tokens" if not p["noncanonical"]
             else f"with {p['noncanonical']} documents in another split than the tokenizer's")
    return f"llguidance's fast-forward tokens save {1 - p['passes'] / totals['none']:.1%} ({split})"


#: A ratio is flagged where either side's repetitions spread (slowest less fastest, over the median) by more than
#: this: the page's one rule, the one How we measure promises.
FLAG_ABOVE = 0.10


def spread(fastest: float | None, median: float | None, slowest: float | None) -> float | None:
    """The spread of a time's repetitions as a share of its median; None where the file gives no range."""
    if fastest is None or slowest is None or not median:
        return None
    return (slowest - fastest) / median


def caveat(ours: float | None = None, theirs: float | None = None) -> str:
    """The flag a ratio carries under :data:`FLAG_ABOVE`'s rule, in parentheses (empty where nothing exceeds it):
    our time's spread and the rival's."""
    said = []
    if ours is not None and ours > FLAG_ABOVE:
        said.append(f"our spread {ours:.0%}")
    if theirs is not None and theirs > FLAG_ABOVE:
        said.append(f"the rival's spread {theirs:.0%}")
    return f" ({'; '.join(said)})" if said else ""


@functools.lru_cache(maxsize=1)
def _committed_headlines() -> tuple[dict[str, Any], ...]:
    """Every chapter's headline rows from the committed files, read once a process (each scoreboard row asks)."""
    from book.plotting import headline_rows

    return tuple(headline_rows())


def _folded_row(board_row: dict[str, Any]) -> dict[str, Any] | None:
    """The folded tables' row (:func:`book.plotting.headline_rows`) that times the same pair as a scoreboard row:
    same card, same two medians; None where none does."""
    for r in _committed_headlines():
        if (r["gpu"] == board_row["card"] and r.get("kernel_ms") is not None and r.get("baseline_ms") is not None
                and math.isclose(r["kernel_ms"], board_row["median_ms"], rel_tol=1e-9)
                and math.isclose(r["baseline_ms"], board_row["rival_ms"], rel_tol=1e-9)):
            return r
    return None


def row_caveat(board_row: dict[str, Any]) -> str:
    """:func:`caveat` for a scoreboard row: our spread from its fastest and slowest runs, the rival's from the
    folded row that times the same pair."""
    ours = spread(board_row.get("fastest_ms"), board_row.get("median_ms"), board_row.get("slowest_ms"))
    folded = _folded_row(board_row)
    theirs = spread(*folded["baseline_spread_ms"]) if folded and folded.get("baseline_spread_ms") else None
    return caveat(ours, theirs)


def host_bound(root: Path = BENCH_RESULTS) -> list[dict[str, Any]]:
    """The headline rows timed on the GPU clock whose host time per call (the Python call's own time, measured
    apart) exceeds that GPU time: number, card (short name), host and GPU time (ms), the shape in words where the
    row is not the chapter's lead (``at``), and the rival (``rival``, its name, and ``rival_host_ms``, ``rival_ms``)
    where its file records the rival's own host time. There the ratio holds only where calls are replayed in a CUDA
    graph or otherwise overlap the host's work. Chapter 05's row at 4096 x 14336 counts beside its BitNet lead, and
    chapter 02's kernel alone beside its whole step."""
    from book.scoreboard import load as load_file
    from book.scoreboard import not_comparable

    folders = {card_name(c): c for c in cards(root)}
    out = []
    board = scoreboard(root)
    apart = not_comparable(board)
    for b in board:
        if "missing" in b or b.get("vs_rival") is None or b["clock"] != "gpu" or b["rival_clock"] != "gpu":
            continue
        if (b["number"], b["card"]) in apart:  # a run set up differently from the other card's: off the page
            continue
        llama = b.get("ternary_case") == "llama"
        alone = b["number"] == 2 and not b["lead"]  # chapter 02's kernel alone, the page's second headline
        if not b["lead"] and not llama and not alone:
            continue
        # our call's host time does not depend on the rival: a folded row of the same call against another
        # baseline (chapter 03's tables time step 3, the scoreboard step 4) serves where no row times this pair
        folded = _folded_row(b) or next((r for r in _committed_headlines() if r["gpu"] == b["card"]
                                         and r.get("kernel_ms") is not None
                                         and math.isclose(r["kernel_ms"], b["median_ms"], rel_tol=1e-9)), None)
        host = folded.get("host_ms") if folded else None
        if host is None and llama:  # the row at 4096 x 14336, read from the chapter's file
            data = load_file(folders[b["card"]], "ternary")
            step = re.search(r"step \d+", b["ours"])
            mine = [r for r in rows(data, f"step{int(step.group(0)[5:]):02d}", shape="4096x14336", m=1)
                    if r["clock"] == "gpu"] if data and step else []
            host = mine[0].get("host_ms") if len(mine) == 1 else None
        if host is None or host <= b["median_ms"]:
            continue
        at = "4096 × 14336" if llama else "its kernel alone" if alone else ""
        if alone:  # the same call of ours stands in a second folded row, against the dense fp32 path: named here
            twin = next((r for r in _committed_headlines() if r["gpu"] == b["card"] and r["chapter"] == "masked_lm_head"
                         and str(r.get("baseline", "")).startswith("cuBLAS fp32") and r.get("kernel_ms")
                         and math.isclose(r["kernel_ms"], b["median_ms"], rel_tol=0.05)), None)
            if twin is not None:
                at += (f": one call of ours in two rows, against index_select ({b['vs_rival']:.2f}×) and against "
                       f"cuBLAS fp32 logits and masked_fill ({twin['speedup']:.2f}×)")
        found = {"number": b["number"], "card": short_card(b["card"]), "host_ms": host, "gpu_ms": b["median_ms"],
                 "step": _step_of(b["ours"]), "shapes": 2 if alone and "two rows" in at else 1,
                 "at": at,
                 "rival_gpu_ms": b.get("rival_ms")}
        if llama and b.get("rival_series"):
            data = load_file(folders[b["card"]], "ternary")
            theirs = [r for r in rows(data, b["rival_series"], shape="4096x14336", m=1) if r["clock"] == "gpu"]
            if len(theirs) == 1 and theirs[0].get("host_ms") is not None:
                found |= {"rival": b["rival"].split(" (")[0].split(" on the")[0], "rival_ms": theirs[0]["ms"],
                          "rival_host_ms": theirs[0]["host_ms"]}
            dense = [r for r in rows(data, "cublas_bf16", shape="4096x14336", m=1) if r["clock"] == "gpu"]
            if b["rival_series"] != "cublas_bf16" and len(dense) == 1 and dense[0].get("host_ms") is not None:
                found["dense"] = (dense[0]["host_ms"], dense[0]["ms"])  # the weaker baseline, called eagerly
        out.append(found)
    return sorted(out + _grid_host_bound(out, root), key=lambda r: (r["number"], r["card"]))  # by chapter, then card


#: The rival's short name in :func:`host_bound`'s rows for the chapters whose folded rows name it at length: the
#: chapter's benchmark and the name.
GRID_HOST_CHAPTERS = {"ngram": "step 3", "ctc": "cuDNN"}


def _grid_host_bound(listed: list[dict[str, Any]], root: Path = BENCH_RESULTS) -> list[dict[str, Any]]:
    """Every other row of the results page's folded tables (:func:`book.plotting.headline_rows`, every chapter and
    card, GPU clock) where our call's host time exceeds its GPU time, with the rival's own host and GPU time from the
    same row. Left out: a row already in ``listed`` (the same chapter, card and GPU time), a run not comparable with
    the other card's (off the page), and chapter 05's step 14 against GemLite at the shapes where GemLite passes our
    check (:func:`host_bound_markdown` gives those as one range). Where several rows time the same call against
    different rivals, the fastest rival's is kept."""
    from book.scoreboard import not_comparable

    numbers = {e.bench: e.number for e in ENTRIES if e.bench}
    apart = {(n, short_card(c)) for n, c in not_comparable(scoreboard(root))}
    part_one = {}
    for folder in cards(root):
        answer = part_one_answer(folder)
        part_one[short_card(card_name(folder))] = [e["ms"] for e in ((answer or {}).get("eager") or {}).values()]
    out: list[dict[str, Any]] = []
    found = [h for h in _committed_headlines() if h["chapter"] in numbers and h.get("clock") == "gpu"
             and h.get("host_ms") is not None and h.get("kernel_ms") is not None and h["host_ms"] > h["kernel_ms"]]
    for h in sorted(found, key=lambda h: h.get("baseline_ms") or math.inf):  # the fastest rival first
        number, card = numbers[h["chapter"]], short_card(h["gpu"])
        if (number, card) in apart:
            continue
        if number == 5 and h["baseline"].startswith("GemLite") and any(
                math.isclose(ms, h["kernel_ms"], rel_tol=1e-6) for ms in part_one.get(card, [])):
            continue
        if any(r["number"] == number and r["card"] == card and math.isclose(r["gpu_ms"], h["kernel_ms"], rel_tol=1e-6)
               for r in listed + out):
            continue
        rival = GRID_HOST_CHAPTERS.get(h["chapter"]) or h["baseline"].split(" (")[0]
        step = re.search(r"step ?0*(\d+)", h["kernel"])
        row = {"number": number, "card": card, "host_ms": h["host_ms"], "gpu_ms": h["kernel_ms"],
               "step": f"step {step.group(1)}" if step else "",
               "at": re.sub(r"(?<=\w) x (?=\w)", " × ", h["case"].split(" (")[0]), "rival_gpu_ms": h["baseline_ms"],
               "order": _committed_headlines().index(h)}
        if h.get("baseline_host_ms") is not None:
            row |= {"rival": rival, "rival_ms": h["baseline_ms"], "rival_host_ms": h["baseline_host_ms"]}
        elif h.get("baseline_ms") is not None:
            row["rival"] = rival
        out.append(row)
    out.sort(key=lambda r: (r["number"], r["card"], r.pop("order")))
    return out


#: A rival's short name in :func:`host_bound`'s rows, as the results page's folds name it, by chapter.
RIVAL_WORDS = {3: {"step 3": "our port of FastDeploy's first kernel (step 3)"}}


#: Called eagerly, ours and the rival within this share of each other are a tie (a host time's spread is wider).
TIE_WITHIN = 0.03

#: The kernel chapters' benchmark runs (chapters 02 to 06): each prices the empty kernel its floors use.
KERNEL_RUNS = ("masked_lm_head", "ngram", "ctc", "ternary", "multi_item")


#: The host-time fold's cell where the rival's file records no host time per call.
NO_HOST = "not measured"


#: The title of the host-time fold: it lists only the comparisons where ours ties or loses called eagerly.
HOST_BOUND_FOLD = "Where ours ties or loses called eagerly"
#: The host-time fold's first words: its scope, the comparisons counted in the lines above it that ours does not win.
HOST_BOUND_TITLE = ("These are the comparisons counted above where, called eagerly, ours ties or loses: each side's "
                    "call takes the longer of its host and GPU times.")


def case_label(number: int, step: str, part: int = 0) -> str:
    """A host-time row's name: its chapter, chapter 05's part, and the step it times (``chapter 05 part 2 (step
    21)``)."""
    return f"chapter {number:02d}" + (f" part {part}" if part else "") + (f" ({step})" if step else "")


def host_bound_by_chapter(root: Path = BENCH_RESULTS) -> dict[tuple[int, int], str]:
    """(chapter, part) -> one clause for the results table's notes, only where a rival would then be the faster:
    called eagerly, who would win and at which shapes (on which card), chapter 05 part 2's plan said with them; a
    verdict resting on a host time whose repetitions disagree (:func:`_host_spread`) is left to the case list."""
    return host_bound_markdown(root, chapters=True)


#: A host time whose fastest repetition is under this share of its median is said with its spread where it
#: decides a row of the host-time fold.
HOST_SPREAD_FLAG = 0.5


def _host_spread(root: Path, r: dict[str, Any]) -> tuple[float, float, float] | None:
    """For a row of :func:`host_bound` from chapter 05's file: our call's host time over the run's repetitions
    (fastest, median, slowest; ``host_spread_ms``) where the fastest is under :data:`HOST_SPREAD_FLAG` of the
    median; None otherwise or where the file does not record it."""
    shape = re.search(r"(\d+) × (\d+)", r.get("at") or "")
    m = re.search(r"M = (\d+)", r.get("at") or "")
    step = re.search(r"\d+", r.get("step") or "")
    if r["number"] != 5 or not shape or not step:
        return None
    folder = _card(root, r["card"])
    data = load(folder, "ternary") if folder else None
    found = [x for x in rows(data, f"step{int(step.group(0)):02d}", shape=f"{shape.group(1)}x{shape.group(2)}",
                             m=int(m.group(1)) if m else 1) if x["clock"] == "gpu"] if data else []
    spread_ms = found[0].get("host_spread_ms") if len(found) == 1 else None
    if not spread_ms or spread_ms[0] >= HOST_SPREAD_FLAG * spread_ms[1]:
        return None
    return tuple(spread_ms)


def host_bound_markdown(root: Path = BENCH_RESULTS, chapters: bool = False, counts: bool = False) -> str:
    """Every comparison of the results page whose host time per call exceeds its GPU time (:func:`host_bound`),
    judged called eagerly, one call at a time (a call takes the longer of its two times): one line a chapter (05: a
    part) that counts them (ours ahead, tied, behind, and the rival that would win), then one fold with only the rows
    where ours ties or loses, each said once; where ours stays the faster the row is counted, not listed. The
    results page shows this under :func:`eager_sentence`; under each line of its table, one sentence where a rival
    would win (``chapters``: :func:`host_bound_by_chapter`). With ``counts``, the counts instead: (all comparisons,
    ours ahead, tied, lost, "in chapters 03 and 05")."""
    found = host_bound(root)
    # one entry per row of comparisons: (chapter, part, card) -> (all, lost, tied), the fold's rows (ties and losses
    # only), and who ties or wins against ours: (kind, rival, how many)
    entries: list[tuple[tuple[int, int, str], tuple[int, int, int], list[str], list[tuple[str, str, int]]]] = []
    # where a rival would be the faster called eagerly, for the results table's notes: (chapter, part) -> clauses
    flips: dict[tuple[int, int], list[tuple[str, str, str, str]]] = {}  # (who, step, shape, card)
    flip_words: dict[tuple[int, int], list[str]] = {}
    plan_words: dict[tuple[int, int], list[str]] = {}  # a lead that holds through a plan only, said in its line

    def row(label: str, ours: str, theirs: str, said: str) -> str:
        return f"| {label} | {ours} | {theirs} | {said} |"

    for r in found:
        if r.get("rival") in RIVAL_WORDS.get(r["number"], {}):  # named as the folds above name it
            r = r | {"rival": RIVAL_WORDS[r["number"]][r["rival"]]}
        eager = "the rival's host time is not recorded"
        if r.get("rival_host_ms") is None and (r.get("rival_gpu_ms") or 0) > r["host_ms"]:
            eager = "ours stays the faster (the rival's GPU time alone is longer)"
        if r.get("rival_host_ms") is not None:
            eager = f"ours stays faster than {r['rival']}"
            if abs(max(r["rival_host_ms"], r["rival_ms"]) / r["host_ms"] - 1) < TIE_WITHIN:
                eager = f"a tie with {r['rival']}"
            elif max(r["rival_host_ms"], r["rival_ms"]) < r["host_ms"]:
                eager = f"{r['rival']} would be faster"
        dense_wins = bool(r.get("dense") and max(r["dense"]) < r["host_ms"])
        loose = _host_spread(root, r) if "would be faster" in eager else None
        if loose is not None and not max(loose[0], r["gpu_ms"]) < max(r["rival_host_ms"], r["rival_ms"]):
            loose = None  # the spread does not decide the verdict: left unsaid
        at = "" if not r["at"] else f", {r['at']}" if r["at"].startswith("its ") else f" at {r['at']}"
        part = 0
        if r["number"] == 5 and r.get("step"):
            part = 1 if int(r["step"].split()[-1]) <= PART_ONE_STEP else 2
        shape = r["at"] if r["at"] and not r["at"].startswith("its ") else ""
        if "would be faster" in eager and loose is None and r.get("rival"):  # a verdict on a host time whose
            # repetitions disagree is left to the fold, with its spread
            flips.setdefault((r["number"], part), []).append((r["rival"], r.get("step", ""), shape, r["card"]))
        if dense_wins:
            flips.setdefault((r["number"], part), []).append(("cuBLAS bf16", r.get("step", ""), shape, r["card"]))
        # comparisons, one rival at one shape on one card: the row's own, and the dense baseline where it wins
        count = (r.get("shapes", 1) + dense_wins, ("would be faster" in eager) + dense_wins,
                 int(eager.startswith("a tie")))
        label = f"{case_label(r['number'], r.get('step', ''), part)} on the {r['card']}{at}"
        ours = f"{us(r['host_ms'])} / {us(r['gpu_ms'])}"
        fold, verdicts = [], []
        if not eager.startswith("ours stays"):
            theirs = (f"{us(r['rival_host_ms'])} / {us(r['rival_ms'])}" if r.get("rival_host_ms") is not None else
                      f"{NO_HOST} / {us(r['rival_gpu_ms'])}" if r.get("rival_gpu_ms") is not None else NO_HOST)
            said = eager
            if loose is not None:  # the verdict rests on our median host time; the fastest repetition's reverses it
                said += f", at our median host time (not at our fastest, {us(loose[0])} µs)"
            fold.append(row(label, ours, theirs, said))
            if r.get("rival") and not eager.startswith("the rival's"):
                verdicts.append(("tie" if eager.startswith("a tie") else "loss", r["rival"], 1))
        if dense_wins:
            fold.append(row(label, ours, f"{us(r['dense'][0])} / {us(r['dense'][1])}",
                            "cuBLAS bf16 on the dense matrix would be faster"))
            verdicts.append(("loss", "cuBLAS bf16", 1))
        entries.append(((r["number"], part, r["card"]), count, fold, verdicts))

    def span(xs: list[float]) -> str:
        return f"{us(min(xs))}–{us(max(xs))}"

    for folder in cards(root):  # chapter 05's headline rows, BitNet's included: its eager call is cheaper
        pairs = bitnet_rows(folder)
        if not pairs:
            continue
        eager = bitnet_eager(folder)
        plan = None if not eager else eager.get("plan")
        name = short_card(card_name(folder))
        on = "" if name == SUMMARY_CARD else f" on the {name}"
        if plan_holds(eager):
            flip_words.setdefault((5, 2), []).append(
                f"ours leads BitNet's kernel{on} only through `W2A8Plan`, which checks once a layer (the "
                f"plain function loses at {eager['slower_eager']} of the {len(eager['rows'])} shapes)")
            plan_words.setdefault((5, 2), []).append(
                f"against BitNet's kernel{on} through `W2A8Plan` only: the plain function would lose at "
                f"{eager['slower_eager']} of its {len(eager['rows'])} shapes")
        elif eager and eager["slower_eager"]:
            flip_words.setdefault((5, 2), []).append(
                f"BitNet's kernel would be faster{on} at {eager['slower_eager']} of its {len(eager['rows'])} shapes")
        lost = 0 if plan_holds(eager) else (eager or {}).get("slower_eager") or 0
        fold = [] if not lost else [
            row(f"{case_label(5, _step_of(label.replace('step', 'step ')), 2)} on the {name} at {shape}",
                f"{us(o['host_ms'])} / {us(o['ms'])}", f"{us(t['host_ms'])} / {us(t['ms'])}",
                "BitNet's kernel would be faster")
            for label, shape, o, t in pairs if max(t["host_ms"], t["ms"]) < max(o["host_ms"], o["ms"])]
        entries.append(((5, 2, name), (len(pairs), lost, 0), fold,
                        [("loss", "BitNet's kernel", lost)] if lost else []))
    port = "our FastDeploy port"  # step 4 of chapter 03: the results page names it, not its step
    for folder in cards(root):  # chapter 03's range against step 4: the shapes where our call waits on the host
        measured = ngram_ratios(folder)
        waits = {cfg: (o, t) for cfg, (o, t) in measured.items()
                 if o.get("host_ms") and o["host_ms"] > o["ms"] and t.get("host_ms") is not None}
        if not waits:
            continue
        name = short_card(card_name(folder))
        behind = [cfg for cfg, (o, t) in waits.items()
                  if max(t["host_ms"], t["ms"]) < max(o["host_ms"], o["ms"]) * (1 - TIE_WITHIN)]
        tied = [cfg for cfg, (o, t) in waits.items()
                if abs(max(t["host_ms"], t["ms"]) / max(o["host_ms"], o["ms"]) - 1) < TIE_WITHIN]
        if behind:  # the line's note, in plain words: the shapes where the port then wins
            on = "" if name == SUMMARY_CARD else f" on the {name}"  # the results table's card goes unsaid
            flip_words.setdefault((3, 0), []).append(
                f"{port} would be faster{on} at {len(behind)} of the {len(measured)} shapes measured ("
                + ", and ".join(ngram_case_words(cfg).replace(" x ", " × ") for cfg in behind)
                + f"), {'one' if len(behind) == 1 else 'all'} among the {len(waits)} where ours waits on the host")
        fold = [row(f"{case_label(3, 'its entry point', 0)} on the {name} at "
                    f"{ngram_case_words(cfg).replace(' x ', ' × ')}",
                    f"{us(waits[cfg][0]['host_ms'])} / {us(waits[cfg][0]['ms'])}",
                    f"{us(waits[cfg][1]['host_ms'])} / {us(waits[cfg][1]['ms'])}",
                    f"a tie with {port}" if cfg in tied else f"{port} would be faster")
                for cfg in waits if cfg in behind or cfg in tied]
        entries.append(((3, 0, name), (len(waits), len(behind), len(tied)), fold,
                        [("tie", port, len(tied))] * bool(tied) + [("loss", port, len(behind))] * bool(behind)))
    for folder in cards(root):  # chapter 05 part 1's answer, step 14 against GemLite where GemLite passes our check
        part_one = part_one_answer(folder)
        eager = (part_one or {}).get("eager") or {}
        if not eager or len(eager) != len(part_one["ratios"]) or all(e["host_ms"] <= e["ms"] for e in eager.values()):
            continue
        name = short_card(card_name(folder))
        beaten = [k for k, e in eager.items() if e["ratio"] < 1]
        if beaten:
            on = "" if name == SUMMARY_CARD else f" on the {name}"
            flip_words.setdefault((5, 1), []).append(f"GemLite would be faster{on} at {len(beaten)} of its "
                                                     f"{len(eager)} shapes")
        fold = [row(f"{case_label(5, f'step {PART_ONE_STEP}', 1)} on the {name} at M = 1, N × K = "
                    + str(k).replace("x", " × "),
                    f"{us(eager[k]['host_ms'])} / {us(eager[k]['ms'])}",
                    f"{us(eager[k]['rival_host_ms'])} / {us(part_one['times'][k]['rival_ms'])}",
                    "GemLite would be faster") for k in beaten]
        entries.append(((5, 1, name), (len(eager), len(beaten), 0), fold,
                        [("loss", "GemLite", len(beaten))] if beaten else []))
    if not entries:
        if chapters:
            return {}
        if counts:
            return None
        return ("Every headline on the GPU clock takes longer on the GPU than its call takes on the host, so its "
                "ratio holds for calls made one after another too.")
    ordered = sorted(entries, key=lambda e: e[0])
    total = sum(e[1][0] for e in ordered)
    losses = sum(e[1][1] for e in ordered)
    ties = sum(e[1][2] for e in ordered)
    lost = sorted({f"{e[0][0]:02d}" for e in ordered if e[1][1]})
    where = ("" if not lost else f" (all in chapter {lost[0]})" if len(lost) == 1
             else f" (in chapters {', '.join(lost[:-1])} and {lost[-1]})")
    if counts:
        return total, total - losses - ties, ties, losses, where.strip(" ()")
    all_cards = {short_card(card_name(c)) for c in cards(root)}
    by_chapter: dict[tuple[int, int], str] = {}
    for key in sorted(set(flips) | set(flip_words)):  # one sentence a chapter (05: a part), only where ours loses
        said = list(flip_words.get(key, []))
        grouped: dict[tuple[str, str, str], list[str]] = {}
        for who, step, shape, card in flips.get(key, []):
            grouped.setdefault((who, step, shape), []).append(card)
        for (who, step, shape), cards_here in grouped.items():
            on = (" on both cards" if set(cards_here) == all_cards and len(all_cards) > 1 else
                  "" if cards_here == [SUMMARY_CARD] else " on the " + " and the ".join(cards_here))
            who = "cuBLAS bf16" if who.startswith("cuBLAS bf16") else who
            said.append(f"{who} would beat {step or 'ours'}" + (f" at {shape}" if shape else "")
                        + ("," if "," in shape and on else "") + on)
        if said:
            by_chapter[key] = "called eagerly, one call at a time, " + ", and ".join(said)
    if chapters:
        return by_chapter
    # one line a chapter (05: a part): its count, and who ties or wins against ours
    titles = {e.number: e.title for e in ENTRIES}
    out: list[str] = []
    for (number, part) in sorted({(e[0][0], e[0][1]) for e in ordered}):
        mine = [e for e in ordered if (e[0][0], e[0][1]) == (number, part)]
        n, lost_here, tied_here = (sum(e[1][i] for e in mine) for i in range(3))
        ahead = n - lost_here - tied_here
        who: dict[tuple[str, str], int] = {}
        for e in mine:
            for kind, rival, k in e[3]:
                who[(kind, rival)] = who.get((kind, rival), 0) + k
        said = ("ours stays ahead in the one comparison" if n == 1 else "ours stays ahead in both comparisons"
                if n == 2 and not ahead < n else f"ours stays ahead in all {n} comparisons" if ahead == n
                else f"ours stays ahead in {ahead} of {n} comparisons")
        said += "".join(f" ({w})" for w in plan_words.get((number, part), []))
        others = [f"ties with {rival} at {k}" for (kind, rival), k in who.items() if kind == "tie"]
        others += [f"loses to {rival} at {k}" for (kind, rival), k in who.items() if kind == "loss"]
        unnamed = (tied_here + lost_here) - sum(who.values())  # a tie or loss whose rival the file does not name
        others += [f"ties or loses at {unnamed}"] if unnamed > 0 else []
        if others:
            said += ", ".join([""] + others[:-1]) + " and " + others[-1]
        name = f"{number:02d}. {titles.get(number, '')}" + (", part 1 (Triton)" if part == 1 else
                                                             ", part 2 (CUDA C++)" if part == 2 else "")
        out.append(f"- **{name}**: {said}.")
    fold = [text for e in ordered for text in e[2]]
    if fold:
        out += ["", f":::{{dropdown}} {HOST_BOUND_FOLD}", "", HOST_BOUND_TITLE, "",
                "| case | ours: host per call / GPU (µs) | the rival: host per call / GPU (µs) | called eagerly, "
                "one call at a time |", "|---|---|---|---|", *fold, ":::"]
    return "\n".join(out)


def ctc_cases(card: Path) -> list[dict[str, Any]]:
    """Chapter 04's grid on one card, one dict per case its file times on the GPU clock against torch's faster call:
    ``ratio`` (torch's time over ours), ``case`` in words, our row (``ours``: ``ms``, ``host_ms``) and its series
    (:func:`studylog.ctc.results.entry_series`: what the entry point runs there); empty where the card has no file."""
    from studylog.ctc.results import entry_series

    data = load(card, "ctc")
    if data is None:
        return []
    out = []
    for rival in rows(data, "torch-best"):
        if rival["clock"] != "gpu":
            continue
        p = rival["params"]
        series = entry_series(data, T=p["T"], N=p["N"], A=p["A"])
        ours = [r for r in rows(data, series, **p) if r["clock"] == "gpu"]
        if len(ours) == 1:
            out.append({"ratio": rival["ms"] / ours[0]["ms"], "case": f"alphabet {p['A']:,}, batch {p['N']}",
                        "ours": ours[0], "series": series})
    return out


def ctc_strongest(card: Path) -> list[dict[str, Any]]:
    """Chapter 04's grid on one card against the strongest rival at each case: :func:`ctc_cases`, each with
    ``best_ratio`` over the faster of cuDNN (graph-replayed) and torch's native path where that reads faster on the
    kernel clock (:func:`ctc_native_cases`), and ``best_rival`` naming it."""
    native = {c["where"]: c["native_ms"] for c in ctc_native_cases(card)}
    out = []
    for c in ctc_cases(card):
        p = c["ours"]["params"]
        theirs = native.get(f"A = {p['A']:,}, N = {p['N']}")
        cudnn = c["ratio"] * c["ours"]["ms"]
        best = (theirs, "torch's native path") if theirs is not None and theirs < cudnn else (cudnn, "cuDNN")
        out.append(c | {"best_ratio": best[0] / c["ours"]["ms"], "best_rival": best[1], "best_ms": best[0]})
    return out


def ctc_grid(card: Path) -> tuple[tuple[float, str], tuple[float, str]] | None:
    """Chapter 04's smallest and largest speedup over the strongest rival at each case on one card (the faster of
    cuDNN and torch's native path, :func:`ctc_strongest`), over every alphabet and batch its file times (the entry
    point, or the step it picks at each case), each with its case in words; None where the file has no such pair."""
    grid = [(c["best_ratio"], c["case"]) for c in ctc_strongest(card)]
    return (min(grid), max(grid)) if grid else None


def ctc_case_words(card: Path) -> str:
    """Why chapter 04's headline case, in a clause: where our lead over the large alphabet's batches is smallest (or,
    where it is not, that it is one case of the grid), on ``card``; the grid's range stands in the line's answer; empty
    without it."""
    cases = ctc_cases(card)
    grid = ctc_grid(card)
    if not cases or grid is None:
        return ""
    big = [c for c in cases if c["case"].startswith(f"alphabet {CTC_CASE['A']:,},")]
    head = next((c for c in big if c["case"] == f"alphabet {CTC_CASE['A']:,}, batch {CTC_CASE['N']}"), None)
    why = ("the large alphabet at the batch where our lead is smallest" if head and head is min(big, key=lambda c: c["ratio"])
           else "one case of the grid")
    return f" ({why}; the grid's range is in the answer)"


def ctc_which(card: Path) -> str:
    """What chapter 04's grid on ``card`` times, in words: the entry point, or the steps it would pick."""
    cases = ctc_cases(card)
    if any(c["series"] == "ctc_loss" for c in cases):
        return "the entry point"
    steps = sorted({int(c["series"][4:]) for c in cases})
    return "the step the entry point picks at each case, " + " or ".join(f"step {n}" for n in steps) + ", timed directly"


def ctc_host_bound(card: Path) -> tuple[int, int]:
    """How many of chapter 04's grid cases on ``card`` take longer on the host per call than on the GPU, of how
    many: there the graph-replayed ratio does not hold for calls made one at a time."""
    cases = [c for c in ctc_cases(card) if c["ours"].get("host_ms") is not None]
    return sum(1 for c in cases if c["ours"]["host_ms"] > c["ours"]["ms"]), len(cases)


def ngram_ratios(card: Path) -> dict[tuple[int, int, int], tuple[dict[str, Any], dict[str, Any]]]:
    """Chapter 03's GPU drafter (its entry point) and step 4, our corrected port of FastDeploy's revised kernel, at
    every synthetic shape the card's file measures both on the GPU clock, as the chapter's own range reads them
    (:func:`book.ngram.lesson.rival_ratios`): shape (batch, prompt length, budget) -> (our row, step 4's row)."""
    import json

    from book.ngram import lesson
    from studylog.plotting import Results

    path = Path(card) / "ngram.json"
    if not path.is_file():
        return {}
    run = Results(path, json.loads(path.read_text()))
    out = {}
    for cfg in lesson.rival_ratios(run):
        out[cfg] = (lesson.entry_row(run, {"batch": cfg[0], "seq_len": cfg[1], "threshold": cfg[2], "corpus": None}),
                    lesson.grid_row(run, lesson.CHAPTER.step(4).series, cfg))
    return out


def ngram_kernel_words(card: Path, folders: dict[str, Path]) -> str:
    """For chapter 03's fold of ``card`` whose run timed no entry point (its rows are step 12's at every shape): which
    kernel it times, and where another card's entry point runs another step at the chapter's lead shape
    (:func:`ngram_many`), so that the two cards' ratios there are not read as one kernel's; empty otherwise."""
    many = ngram_many(card)
    if many is None:
        return ""
    mine, _ = ngram_ratios(card)[many[0]]
    if mine.get("series") == "ngram_match":
        return ""
    step = int(mine["series"].removeprefix("step"))
    b, t, _ = many[0]
    for name, other in folders.items():
        if other == card:
            continue
        theirs = (ngram_ratios(other).get(many[0]) or ({},))[0]
        ran = theirs.get("step") if theirs.get("series") == "ngram_match" else None
        if ran and int(ran.removeprefix("step")) != step:
            short = short_card(name)
            k = int(ran.removeprefix("step"))
            return (f"On this card the drafter was timed as step {step} at every shape; step {k} and the entry point "
                    f"were not measured here. At {b} × {t:,} the {short}'s entry point runs step {k}, so there the two "
                    "cards' ratios are of different kernels, not one kernel on two cards.")
    return ""


def ngram_range(card: Path) -> tuple[float, float, int] | None:
    """Chapter 03's GPU drafter against step 4 on ``card`` over every shape measured (:func:`ngram_ratios`), the
    chapter's own basis: (lowest, highest ratio, how many shapes), the rival's GPU time over ours; None without."""
    found = [theirs["ms"] / ours["ms"] for ours, theirs in ngram_ratios(card).values()]
    return (min(found), max(found), len(found)) if found else None


@functools.lru_cache(maxsize=None)
def ngram_searching(card: Path) -> int | None:
    """How many of the headline case's slots the budget lets search on ``card`` (:func:`book.ngram.lesson.budget_walk`,
    the benchmark's batch rebuilt and walked on the CPU): at a tight budget most slots are refused before any search,
    which a reader of the headline ratio needs to know; None without the card's file."""
    from book.ngram.lesson import budget_walk
    from studylog.plotting import load_results

    if not (Path(card) / "ngram.json").exists():
        return None
    case = (NGRAM_CASE["batch"], NGRAM_CASE["seq_len"], NGRAM_CASE["threshold"])
    return budget_walk(load_results("ngram", Path(card).name, root=Path(card).parent), case)["searched"]


@functools.lru_cache(maxsize=None)
def ngram_many(card: Path) -> tuple[tuple[int, int, int], float, int] | None:
    """Chapter 03's case where the most slots search (:func:`book.ngram.lesson.active_slots` with no budget,
    :func:`book.ngram.lesson.budget_walk` under one, on each shape of :func:`ngram_ratios`, as the chapter counts): (shape, the port's GPU time over ours, how many slots search). It leads the chapter's line,
    because at the headline case the budget lets one slot search, which makes that ratio one search's; None
    without the card's file."""
    from book.ngram.lesson import active_slots, budget_walk
    from studylog.ngram import NO_BUDGET
    from studylog.plotting import load_results

    pairs = ngram_ratios(card)
    if not pairs:
        return None
    run = load_results("ngram", Path(card).name, root=Path(card).parent)
    # with no budget every active slot with a draft cap searches (the chapter's count); under a budget, those the
    # budget does not refuse first
    searched = {cfg: active_slots(run, cfg) if cfg[2] >= NO_BUDGET else budget_walk(run, cfg)["searched"]
                for cfg in pairs}
    cfg = max(pairs, key=lambda c: (searched[c], c))
    ours, theirs = pairs[cfg]
    return cfg, theirs["ms"] / ours["ms"], searched[cfg]


@functools.lru_cache(maxsize=None)
def ngram_deployed(card: Path) -> tuple[tuple[int, int, int], float, int] | None:
    """Chapter 03's largest shape under a budget (the deployed default, :data:`studylog.ngram.report.BENCH_GRID`'s
    budgeted case with the longest prompts) on ``card``: (shape, the port's GPU time over ours, how many slots the
    budget lets search, :func:`book.ngram.lesson.budget_walk`); None without the card's file."""
    from book.ngram.lesson import budget_walk
    from studylog.ngram import NO_BUDGET
    from studylog.plotting import load_results

    pairs = ngram_ratios(card)
    budgeted = [c for c in pairs if c[2] < NO_BUDGET]
    if not budgeted:
        return None
    cfg = max(budgeted, key=lambda c: (c[1], c[0]))
    ours, theirs = pairs[cfg]
    run = load_results("ngram", Path(card).name, root=Path(card).parent)
    return cfg, theirs["ms"] / ours["ms"], budget_walk(run, cfg)["searched"]


def ngram_case_words(cfg: tuple[int, int, int]) -> str:
    """A chapter 03 shape as the folded tables word it: "32 slots x 512 tokens, budget 128"."""
    from studylog.ngram import NO_BUDGET

    budget = "no budget" if cfg[2] >= NO_BUDGET else f"budget {cfg[2]}"
    return f"{cfg[0]} slot{'' if cfg[0] == 1 else 's'} x {cfg[1]} tokens, {budget}"


def ngram_range_table(card: Path) -> list[str]:
    """Under chapter 03's table on ``card``: the rows behind its range (:func:`ngram_range`), the GPU drafter against
    step 4 at every shape measured, with spreads and host time per call; empty without."""
    pairs = ngram_ratios(card)
    if not pairs:
        return []

    def timed(r: dict[str, Any]) -> str:
        lo, _, hi = r["spread_ms"]
        return f"{us(r['ms'])} ({us(lo)}–{us(hi)})"

    many = ngram_many(card)
    b, t, budget = NGRAM_STEP_CASE
    picks = f"{b} × {t:,}, budget {budget} (deployed)" + (f" and {many[0][0]} × {many[0][1]:,} (stress)" if many else "")
    out = ["Every shape measured: the GPU drafter against our corrected port (step 4), on the GPU clock; the headline "
           f"picks {picks}.", "", "| case | speedup | ours (µs) | theirs (µs) | host per call (µs) |",
           "|---|---|---|---|---|"]
    for cfg, (ours, theirs) in sorted(pairs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ratio = f"**{theirs['ms'] / ours['ms']:.2f}×**{caveat(spread(*ours['spread_ms']), spread(*theirs['spread_ms']))}"
        host = us(ours["host_ms"]) if ours.get("host_ms") is not None else "–"
        if cfg[0] <= NGRAM_UNTUNED["most_slots"] and cfg[1] >= NGRAM_UNTUNED["least_tokens"]:
            ratio += " (weaker: the port's one block a slot, not a tuned kernel)"
        out.append(f"| {ngram_case_words(cfg)} | {ratio} | {timed(ours)} | {timed(theirs)} | {host} |")
    return out


#: Chapter 06's case where its kernel loses: causal SDPA, which computes a superset of the mask, at the long prefix.
MULTI_ITEM_LOSS = {"shape": "prefix 2048, 32 items x 32", "ours": "step05", "rival": "causal SDPA (superset)"}


def multi_item_loss(card: Path) -> dict[str, Any] | None:
    """Chapter 06's one loss on ``card`` (:data:`MULTI_ITEM_LOSS`): the case in words, the rival's GPU time over ours
    (``ratio``), both times with their spreads (``ours``, ``rival``: the rows); None where the file lacks the pair or
    ours is not the slower there."""
    data = load(card, "multi_item")
    case = {"shape": MULTI_ITEM_LOSS["shape"]}
    pair = [[r for r in rows(data, s, **case) if r["clock"] == "gpu"] for s in (MULTI_ITEM_LOSS["ours"],
                                                                                MULTI_ITEM_LOSS["rival"])] \
        if data else [[], []]
    if [len(p) for p in pair] != [1, 1] or pair[1][0]["ms"] >= pair[0][0]["ms"]:
        return None
    ours, rival = pair[0][0], pair[1][0]
    return {"case": MULTI_ITEM_LOSS["shape"].replace(" x ", " × "), "ratio": rival["ms"] / ours["ms"],
            "ms": ours["ms"], "rival_ms": rival["ms"], "ours": ours, "rival": rival}


def shared_layers_words(card: Path) -> str:
    """How chapter 07's synthetic 8B model reuses its weights, from its run's ``model 8b`` note on ``card``: "one
    layer's weights reused across all 32 layers" (empty where the note does not say)."""
    data = load(card, "decode") or {}
    note = next((n for n in data.get("notes", []) if n.startswith("model 8b: ")), "")
    layers = re.search(r"'layers': (\d+)", note)
    if "'shared_layers': True" not in note or not layers:
        return "random weights"
    return f"one layer's weights reused across all {layers.group(1)} layers"


def speculate_gated(card: Path) -> float | None:
    """Chapter 08's loop with step 4's gate switched on (its step 4) against chapter 07's loop on ``card``, as the headline
    counts (:func:`studylog.speculate.report.headline`: the ratio of the two medians over the batch-1 extraction
    requests that close their JSON); None where the file lacks them."""
    import statistics

    from book.speculate.lesson import closed_ratio
    from studylog.plotting import Results

    data = load(card, "speculate")
    try:
        return None if data is None else closed_ratio(Results(None, data), "step04")
    except statistics.StatisticsError:  # the file times neither loop on the headline's requests
        return None


def compiled_gather_rows() -> dict[int, dict[str, Any]]:
    """Allowed count -> step 12 (the kernel alone, given the ids) and torch.compile's faster fused gather
    (max-autotune) in the committed lab run on the H200 (``lab/masked_lm_head/compiled_gather.py``, every output
    checked there, :func:`compiled_gather_leads`): ``ours`` and ``theirs`` (each the file's row: ``ms``,
    ``spread_ms``, ``host_ms``), ``ratio``; {} where the run is not committed."""
    from book.common import lab_or_none

    data = lab_or_none("masked_lm_head", "compiled_gather")
    leads = compiled_gather_leads("compiled_gather")
    if data is None or not leads:
        return {}
    by = {(r["series"], r["params"]["allowed"]): r for r in data["measurements"]}
    out = {}
    for n, x in leads.items():
        theirs = min((by[(s, n)] for s in COMPILED_RIVALS if (s, n) in by), key=lambda r: r["ms"])
        out[n] = {"ours": by[("step12", n)], "theirs": theirs, "ratio": x}
    return out


def compiled_gather_table_rows() -> list[str]:
    """Chapter 02's rows against its kernel's strongest rival, torch.compile's fused gather (:func:`compiled_gather_rows`),
    for the results page's fold of every row, and one line under them that says they are the H200's only; [] where the
    run is not committed."""
    found = compiled_gather_rows()
    out = []
    for n, c in sorted(found.items()):
        o, t = c["ours"], c["theirs"]
        out.append(f"| the masked head's kernel alone, allowed ids given (step 12) | torch.compile (max-autotune) of "
                   f"index_select then matmul: one fused gather | batch 1, {n:,} of 128,256 tokens allowed, the kernel "
                   f"alone | **{c['ratio']:.2f}×**{caveat(spread(*o['spread_ms']), spread(*t['spread_ms']))} | "
                   f"{us(o['ms'])} ({us(o['spread_ms'][0])}–{us(o['spread_ms'][2])}) | {us(t['ms'])} "
                   f"({us(t['spread_ms'][0])}–{us(t['spread_ms'][2])}) | {us(o['host_ms'])} |")
    if out:
        out += ["", "The two torch.compile rows, the kernel's strongest rival, were timed on the H200 only, each "
                "beside its own time of step 12."]
    return out


def masked_head_batches(card: Path) -> dict[int, float]:
    """Chapter 02's whole step against xgrammar's path at the larger batches its page gives beside the headline
    (:data:`book.masked_lm_head.lesson.HEADLINE_POINTS`): batch -> xgrammar's GPU time over ours (only the batches
    the card's file times both at)."""
    from book.masked_lm_head.lesson import HEADLINE_POINTS

    data = load(card, "masked_lm_head")
    out = {}
    for batch, kind, allowed in HEADLINE_POINTS[1:]:
        case = {"batch": batch, "kind": kind, "allowed": allowed}
        ours = [r for r in rows(data, "step13", **case) if r["clock"] == "gpu"] if data else []
        theirs = [r for r in rows(data, "xgrammar_bitmask", **case) if r["clock"] == "gpu"] if data else []
        if len(ours) == 1 and len(theirs) == 1:
            out[batch] = theirs[0]["ms"] / ours[0]["ms"]
    return out


def bitnet_eager(card: Path) -> dict[str, Any] | None:
    """Chapter 05's eager-call comparison with BitNet's W2A8 kernel on ``card``, as chapter 05 part 2 computes it
    (:func:`book.ternary.results.bitnet_host`: each call's lower bound called eagerly is the longer of its host and
    GPU times; ``slower_eager`` counts the shapes where ours is the slower); None where the card has no such run."""
    from book.scoreboard import bitnet_run
    from book.ternary import results as ternary
    from studylog.plotting import Results

    data = bitnet_run(Path(card).name)
    return ternary.bitnet_host(Results(None, data)) if data is not None else None


def plan_holds(eager: dict[str, Any] | None) -> bool:
    """Whether, in :func:`bitnet_eager`'s comparison, the plain function loses to BitNet's call at some shape while
    step 23 through its plan (``W2A8Plan``) loses at none: the lead holds eagerly only through the plan."""
    plan = (eager or {}).get("plan")
    return bool(eager and eager["slower_eager"] and plan is not None and not plan["slower_eager"])


def bitnet_eager_words(card: Path) -> str:
    """The eager-call clause of chapter 05's landing line where, called eagerly, BitNet's own call is the faster at some of
    its shapes on ``card`` (:func:`bitnet_eager`): the ratio holds under CUDA-graph replay only. Empty where the
    card's run does not show that."""
    eager = bitnet_eager(card)
    if not eager or not eager["slower_eager"]:
        return ""
    n, of = eager["slower_eager"], len(eager["rows"])
    if plan_holds(eager):  # step 23's plan: checks made once
        return (f"through its plan (`W2A8Plan`) ours stays the faster at all {of} shapes; the plain function, which "
                f"checks and chooses every call, loses at {n}")
    at = "at every one of its" if n == of else f"at {n} of its"
    return f"BitNet's kernel is faster {at} {of} shapes (less host time)"


def decode_bound(card: Path) -> float | None:
    """Chapter 07's bound at its headline case (8B shape, batch 1) on one card: the median over the JSON schemas of
    each request's own bound from chapters 01 and 02 (``book.decode.results.median_bound``); None where not
    measured."""
    from book.decode.results import median_bound

    data = load(card, "decode")
    return None if data is None else median_bound(data["measurements"], "8b", 1)


def synthetic_words(card: Path) -> str:
    """Chapter 07's headline model in words: synthetic (random weights), 8B-shaped, with the size of the cl100k head
    its run on ``card`` records (the file's ``model 8b`` note)."""
    data = load(card, "decode") or {}
    note = next((n for n in data.get("notes", []) if n.startswith("model 8b: ")), "")
    head = re.search(r"'vocab_size': (\d+)", note)
    rows_said = f" of {int(head.group(1)):,} rows" if head else ""
    shared = shared_layers_words(card)
    shared = "" if shared == "random weights" else f", {shared}"
    return f"a synthetic 8B-shaped model (random weights{shared}, a cl100k head{rows_said})"


#: The landing table's rival column: whose code each answer is measured against, a library's, a published kernel or
#: the course's own (where no library runs the same work), by chapter number ("5t": chapter 05's Triton part).
RIVALS = {
    2: ("torch.compile's fused gather (the kernel alone); xgrammar's dense logits, then its mask: the path engines "
        "ship (the whole step)"),
    3: "our own port of FastDeploy's GPU kernel (no library has one)",
    4: "cuDNN (a library, through torch)",
    "5t": "GemLite (a library)",
    5: "BitNet's W2A8 kernel (published)",
    6: "FlashInfer (a library)",
    7: "our own loop with xgrammar's mask (no serving engine measured)",
    8: "chapter 07's loop (no serving engine raced under a grammar)",
}


def ctc_native_cases(card: Path) -> list[dict[str, Any]]:
    """Chapter 04's cases on ``card`` where torch's native CTC path reads faster than cuDNN on the kernel clock (it
    cannot be captured in a graph, and the kernel clock leaves out the gaps between its launches, which favours it):
    per case ``where`` ("A = 28, N = 256"), ``native_ms``, our graph-replayed GPU time there (``ours_ms``, from
    :func:`ctc_cases`; None where the grid lacks the case) and ``ratio`` (native's over ours, or None)."""
    data = load(card, "ctc")
    if data is None:
        return []
    ours = {c["case"]: c["ours"]["ms"] for c in ctc_cases(card)}
    out = []
    for r in rows(data, "torch-best span"):
        if r.get("picked") != "torch-native":
            continue
        p = r["params"]
        mine = ours.get(f"alphabet {p['A']:,}, batch {p['N']}")
        out.append({"where": f"A = {p['A']:,}, N = {p['N']}", "native_ms": r["ms"], "ours_ms": mine,
                    "ratio": r["ms"] / mine if mine else None})
    return out


def ctc_native_words(case: dict[str, Any], times: bool = True) -> str:
    """One of :func:`ctc_native_cases` in a clause: native's kernel-clock time there, and ours against it (with our
    time, unless ``times`` is False: a line that gave it already)."""
    said = f"torch's native path reads {us(case['native_ms'])} µs on the kernel clock, which favours it"
    if not case["ratio"]:
        return said
    return said + (f", {case['ratio']:.2f}× our {us(case['ours_ms'])} µs" if times else f": ours is {case['ratio']:.2f}× faster than it")


def ctc_rival_words(card: Path, native_cases: bool = True) -> str:
    """Chapter 04's rival: cuDNN where the file's ``torch-best`` (GPU clock) picks it at every case, and (unless
    ``native_cases`` is False: the landing's cell names the rival alone, the results page's note gives them) each case
    where torch's native path reads faster on the kernel clock in a clause of its own, set against it
    (:func:`ctc_native_cases`)."""
    data = load(card, "ctc")
    picked = {r.get("picked") for r in rows(data, "torch-best") if r["clock"] == "gpu"} if data else set()
    # torch's native path cannot be captured in a graph: it meets cuDNN only on the kernel clock ("torch-best span")
    native = ctc_native_cases(card)
    if picked == {"torch-cuDNN"} and not native:
        return "cuDNN (a library, through torch), the faster of torch's two CTC paths at every case"
    if picked == {"torch-cuDNN"} and not native_cases:
        return "cuDNN (a library, through torch)"
    if picked == {"torch-cuDNN"}:
        return "cuDNN (a library, through torch); " + "; ".join(f"at {c['where']} {ctc_native_words(c)}"
                                                                  for c in native)
    return "torch's faster CTC path at each case, cuDNN or its native one"


def replayed_one_copy(card: Path, chapter: str) -> bool | None:
    """Whether a card's run of ``chapter`` replayed each call on one copy of its input: True where no row records
    ``copies`` (what a call reads could stay in L2 between calls), False where its rows rotate over copies, None
    where the card has no file."""
    data = load(card, chapter)
    return None if data is None else not any("copies" in r for r in data["measurements"])


#: A chapter whose cards' runs may differ in how they replay a call: what its benchmark rotates copies of, and the
#: calls whose times that changes most.
ROTATED = {2: ("the head", "small allowed sets")}


def one_copy_words(number: int, name: str, rotated: list[str], row: dict[str, Any], l2_bytes: int | None) -> str:
    """The clause a one-copy card's note adds where another card's run rotated copies: which run did what, and that
    the cards' times for calls that read little are not comparable, the headline's included where the rows it reads
    (``row["read_bytes"]`` of a rotated card's headline row) fit in this card's L2 (``l2_bytes``)."""
    what, small = ROTATED.get(number, ("its input", "calls that read little"))
    included = (", this line's included" if row.get("read_bytes") is not None and l2_bytes is not None
                and row["read_bytes"] <= l2_bytes else "")
    return (f"; L2-favoured: the {name}'s run replayed one copy of {what} (the rows a call reads could stay in L2), "
            f"the {' and '.join(rotated)}'s rotated copies, so the cards' times for {small}{included}, are not "
            "comparable")


def _card(root: Path, short: str) -> Path:
    """The card folder whose short name is ``short`` (the last card where none is)."""
    found = cards(root)
    return next((c for c in found if short_card(card_name(c)) == short), found[-1])


def _step_of(label: str) -> str:
    """The step a scoreboard row's kernel ran, from its label (``entry point, step 7`` or ``step 7``)."""
    m = re.search(r"step \d+", label)
    return m.group(0) if m else label


#: Where a cell's number is void (not measured, or not comparable), the cell shows this and a note says why.
VOID = "–"


#: Chapter 05 part 1's last Triton step: the kernel its answer quotes.
PART_ONE_STEP = 14


def part_one_answer(card: Path) -> dict[str, Any] | None:
    """Chapter 05 part 1's answer on ``card``, one row of x: its last Triton step, step 14, against GemLite (the Triton
    peer) at every shape where GemLite passes our float64 check (``ratios``: shape -> GemLite's time over ours), and
    against cuBLAS bf16 at the chapter's headline shape, 4096 x 14336 (``cublas``); ``failed``, the shapes where
    GemLite fails the check, and ``failed_faster``, those of them where it is faster than ours all the same; ``times``,
    per shape GemLite is timed at, ours and GemLite's GPU times and GemLite's float64 error and tolerance; None where
    the file lacks them."""
    from studylog.plotting import Results
    from studylog.ternary.results import CUBLAS, GEMLITE, fastest
    from studylog.ternary.steps import SERIES

    from book.scoreboard import accuracy_check

    data = load(card, "ternary")
    if data is None:
        return None
    run, triton = Results(None, data), [SERIES[PART_ONE_STEP]]
    ratios, failed, failed_faster, eager, times = {}, [], [], {}, {}
    for peer in rows(data, GEMLITE, m=1):
        shape = peer["params"]["shape"]
        check = accuracy_check(data, GEMLITE, {"shape": shape, "m": 1})
        best, _ = fastest(run, triton, shape=shape, m=1)
        if best is not None and peer["clock"] == "gpu":
            times[shape] = {"ms": best["ms"], "rival_ms": peer["ms"],
                            "error": check and check.get("relative_error"), "tolerance": check and check.get("tolerance")}
        if peer["clock"] == "gpu" and check is not None and check["passed"] and best is not None:
            ratios[shape] = peer["ms"] / best["ms"]
            if best.get("host_ms") is not None and peer.get("host_ms") is not None:
                # called eagerly, one call at a time, a call takes the longer of its host and GPU times
                eager[shape] = {"ratio": max(peer["host_ms"], peer["ms"]) / max(best["host_ms"], best["ms"]),
                                "rival_host_ms": peer["host_ms"], "host_ms": best["host_ms"], "ms": best["ms"]}
        elif peer["clock"] == "gpu" and check is not None and not check["passed"]:
            failed.append(shape)
            if best is not None and peer["ms"] < best["ms"]:  # a loss the check keeps out of the range: said
                failed_faster.append(shape)
    case = {"shape": "4096x14336", "m": 1}
    best, _ = fastest(run, triton, **case)
    cublas, _ = fastest(run, [CUBLAS], **case)
    if not ratios or best is None or cublas is None:
        return None
    return {"ratios": ratios, "cublas": cublas["ms"] / best["ms"], "failed": failed, "failed_faster": failed_faster,
            "eager": eager, "times": times}


@cached_on_files
def headlines(root: Path = BENCH_RESULTS) -> list[dict[str, Any]]:
    """One dict per chapter: number, title, notebook, question, what the headline compares, and per card (short
    name) the headline's cell (``cells``: one number and a few words, or :data:`VOID`), the caveats that cell needs
    (``notes``, a list of sentences the results page numbers under its table), its ratio (``ratios``; None where not
    measured or not comparable), the landing page's few words (``brief``) and whether the card's number may stand
    beside the other card's (``comparable``); ``differs`` says, once per chapter, where the cards time different
    steps."""
    board = scoreboard(root)
    suite = fsm_suite()
    real = fsm_real()
    peer = fsm_peer_words(fsm_peers())
    waits = {(r["number"], r["card"]): r for r in host_bound(root) if not r["at"]}  # host time over GPU time
    out = []
    for entry in ENTRIES:
        cells, ratios, brief, notes, comparable = {}, {}, {}, {}, {}
        landing: dict[str, str] = {}  # per card, the landing table's answer: one ratio (or range) and one clause
        eager: dict[str, str] = {}  # per card, what a call made eagerly, one at a time, does (landing's column)
        leads = {}
        for card in cards(root):
            name = short_card(card_name(card))
            notes[name], comparable[name] = [], True
            if entry.number == 1:  # counted on the host, the same on every card: written out once
                ratios[name], text, brief[name] = fsm_line(suite)
                # the real schemas first, the suite (which its regexes inflate) second: the chapter's order
                answer = fsm_answer(suite, real)
                cells[name] = (text if ratios[name] is None else answer.replace(
                    " forced on", " forced (skipped exactly) on", 1).replace(", skipped with the output unchanged", "")
                    .replace(" on the course's ", " on the ", 1))
                if ratios[name] is not None:
                    brief[name] = answer
                    landing[name] = (f"{100 * real[1]:.1f}–{100 * real[2]:.1f}% of tokens forced on {real[0]} real "
                                     "schemas (at most that share of passes skipped)" if real is not None else answer)
                if peer and ratios[name] is not None:  # the strongest peer beside ours, in the line itself: ours
                    # not bolded as a win where the peer saves more
                    cells[name] += "; **behind** " + peer_bare(peer).replace(": ", " on the suite: ", 1)
                    brief[name] += f"; {peer} on the suite"
                if len(cells) > 1 and suite is not None:
                    cells[name] = "the same (a count, not a GPU time)"
                elif suite is not None:
                    notes[name].append(fsm_note(suite))
                    if peer:  # which policy a reader should ship, said beside the loss
                        notes[name].append("llguidance's fast-forward tokens are the policy to ship unless outputs "
                                           "must match decoding without jumps token for token, which ours keeps")
                    if peer and "(" in peer:  # the peer's caveat, said once
                        split = peer.rsplit(" (", 1)[1].rstrip(")")
                        # where llguidance keeps its output too, the landing's cell says so ("output unchanged
                        # too"): no note repeats it; an output it changes is said here
                        if not split.startswith("its output too"):
                            notes[name].append(f"llguidance's output: {split}")
                if real is not None and ratios[name] is not None and suite is not None and len(cells) == 1:
                    # the cell: one number and its corpus; the suite, and the peer that saves more there, in the
                    # line's first note
                    # the named rival first, like for like on the suite, where ours loses; then the real schemas
                    ours = suite["default"]["saved"]["token"]
                    cells[name] = ((f"ours {ours:.1%} of passes against llguidance's "
                                    f"{peer_bare(peer).split(': ', 1)[1]} on the suite (we lose); " if peer else "")
                                   + f"{100 * real[1]:.1f}–{100 * real[2]:.1f}% of tokens forced, real schemas")
                    regexes = fsm_suite_kinds().get("regex", 0)
                    notes[name].insert(0, f"on the {suite['default']['entries']}-entry suite ours forces "
                                          f"{ours:.1%}, most of it from its {regexes} regexes")
                pair = fsm_passes_pair()
                if pair and ratios[name] is not None:
                    # one metric, passes saved, on the suite and on real schemas: the chapter's decision first;
                    # the forced-token share (step 2's rule alone) is the chapter's, not this line's
                    landing[name] = brief[name] = pair
                if pair and ratios[name] is not None and len(cells) == 1:
                    # the cell answers on real schemas; the suite's numbers, each policy named, are the notes'
                    cells[name] = fsm_corpora_pair() or landing[name]  # one document set a line: the suite's
                    # shares, which would reuse a percentage for another policy, are the first notes
                    notes[name] = fsm_suite_notes(suite) + [
                        "keep exact token jumps only where outputs must match decoding without jumps token for "
                        "token, which ours guarantees"]
                continue
            row = next((b for b in board if b["number"] == entry.number and short_card(b["card"]) == name
                        and b["lead"]), None)
            if row is None or "missing" in row or row["vs_rival"] is None:
                ratios[name], cells[name], brief[name] = None, VOID, NOT_MEASURED
                notes[name].append(f"{name}: not measured on this card")
                continue
            leads[name] = row
            ratios[name] = row["vs_rival"]
            brief[name] = f"{row['vs_rival']:.2f}× {entry.rival_short}"
            ours, theirs = row["median_ms"], row["rival_ms"]
            if row["rival_clock"] not in (None, row["clock"]):  # compared end to end, not on the GPU clock
                e2e = row.get("ours_end_to_end_ms")
                cells[name] = f"**{row['vs_rival']:.2f}×**" + (f" ({against(e2e, theirs)} µs, end to end)"
                                                                 if e2e else "")
            elif row["ratio_note"].startswith("the ratio of the two median"):  # several requests: their medians
                cells[name] = f"**{row['vs_rival']:.2f}×** ({against(ours, theirs)} µs, medians)"
                rest = clauses(row["ratio_note"])[1:]  # its first clause is what the cell's "medians" says
                if rest:  # the line's ratio (of medians) said apart from the median of the per-request ratios
                    notes[name].append(f"{name}: the line's ratio divides the two loops' median times, not a median "
                                       "of ratios; " + "; ".join(rest))
            else:
                cells[name] = f"**{row['vs_rival']:.2f}×** ({against(ours, theirs)} µs)"
            cells[name] += row_caveat(row)
            wait = waits.get((entry.number, name))
            landing[name] = f"{row['vs_rival']:.2f}×"
            cpu = None
            if entry.number == 3:  # the CPU loop the kernel replaces: its end-to-end ratio, in a note after the port's
                cpu = next((b for b in board if b["number"] == 3 and short_card(b["card"]) == name and not b["lead"]
                            and b.get("ours_end_to_end_ms") is not None and b.get("vs_rival") is not None), None)
                if cpu is not None:
                    brief[name] = (f"{row['vs_rival']:.2f}× {entry.rival_short} on the GPU; "
                                   f"{cpu['vs_rival']:.2f}× the CPU loop it replaces, end to end")
            if entry.number == 3:  # the chapter's lead case (the most slots searching): one number, one shape; the
                # ratios at the other shapes go to the fold (the rows behind the range)
                spread3 = ngram_range(card)
                many = ngram_many(card)
                pairs3 = ngram_ratios(card)
                if spread3 is not None and many is not None:
                    (b, t, _), x, k = many
                    mine, port = pairs3[many[0]]
                    landing[name] = f"{x:.2f}× at {b} slots of {t:,} tokens"
                    ran = mine.get("step", "").removeprefix("step")
                    cells[name] = (f"**{x:.2f}×** at {b} × {t:,}{f', step {int(ran)}' if ran.isdigit() else ''} "
                                   f"({against(mine['ms'], port['ms'])} µs)"
                                   + caveat(spread(*mine["spread_ms"]), spread(*port["spread_ms"])))
                    try:  # the deployed budget's shape, where a step is priced, leads; the stress shape follows
                        st = ngram_step(Path(card).parent, Path(card).name)
                        landing[name] = (f"{st['vs_port']:.2f}× at {st['batch']} × {st['seq_len']:,}, budget "
                                         f"{NGRAM_STEP_CASE[2]}; {x:.2f}× at {b} × {t:,}, no budget")
                        ran = f", step {st['ours_step']}" if st.get("ours_step") else ""
                        cells[name] = (f"**{st['vs_port']:.2f}×** at {st['batch']} × {st['seq_len']:,}, budget "
                                       f"{NGRAM_STEP_CASE[2]}{ran} ({us(st['ours_us'] / 1e3)} against "
                                       f"{us(st['port_us'] / 1e3)} µs); no budget: " + cells[name])
                    except (KeyError, TypeError, ValueError, FileNotFoundError, StopIteration):
                        pass
                    said = f"{name}: at {b} × {t:,}, {k} of the {b} slots search"
                    deployed = ngram_deployed(card)
                    if deployed is not None and deployed[0] != many[0]:
                        (db, dt, _), _, dk = deployed
                        said += f", against {dk} under the deployed budget, {db} × {dt:,}"
                    # the ratios at every other shape, most of them against the port's untuned one-block-a-slot
                    # grid, are the fold's (the rows behind the range), not the line's: no skimmer takes them for it
                    notes[name].append(said)
                else:
                    case3 = f"{NGRAM_CASE['batch']} slots of {NGRAM_CASE['seq_len']:,} tokens"
                    landing[name] += f" on the GPU, {case3}"
                if cpu is not None:  # another rival, so a sentence of its own, from one run: the chapter's own
                    # separate run of the public call, against its own CPU loop (the benchmark's ran on another host)
                    from book.ngram.lesson import HEADLINE, entry_end_to_end

                    runs = (entry_end_to_end() or {}) if card.name == "nvidia-h200" else {}
                    big, small = runs.get(HEADLINE), runs.get(NGRAM_STEP_CASE)
                    if big is not None:
                        b, t, budget = HEADLINE
                        ratio = lambda v, k: v["cpu_path"]["ms"] / v[k]["ms"]  # noqa: E731
                        notes[name].append(
                            f"{name}: against the CPU loop FastDeploy's kernel replaced, end to end (the call, then a "
                            f"sync, in a separate run), `ngram_match` as a reader calls it is "
                            f"{ratio(big, 'ngram_match'):.2f}× faster at {b} × {t:,}, budget {budget}, and "
                            f"{ratio(big, 'matcher'):.2f}× with its step bound once"
                            + ("" if small is None else f"; at {NGRAM_STEP_CASE[0]} × {NGRAM_STEP_CASE[1]:,}, budget "
                               f"{NGRAM_STEP_CASE[2]} the public call gives {ratio(small, 'ngram_match'):.2f}×"))
                    else:
                        where = cpu["shape"].replace(" slots of ", " × ").replace(" tokens", "")
                        notes[name].append(f"{name}: against the CPU loop FastDeploy's kernel replaced, end to end (the "
                                           f"call, then a sync), ours, bound once, is {cpu['vs_rival']:.2f}× faster at "
                                           f"{where}")
            if entry.number == 8:  # both workloads, as the chapter gives them: copying documents, then low-copy
                served = re.search(r"median of (\d+) requests", row.get("shape") or "")
                # the headline's requests, the ones that close their JSON: how many
                loads = speculate_workloads(card)
                low = loads.get("low_copy")
                # the neutral workload first, as the chapter gives it; then the one written to be copied
                landing[name] = ("per output token on SmolLM2-135M: "
                                 + (f"{low['ratio']:.2f}× on low-copy requests; " if low else "") + landing[name]
                                 + " on extraction (documents written to be copied)")
                if low:  # the notes from the run's ratio are the copying documents': said so
                    notes[name] = [n.replace("the line's ratio divides", "each ratio divides")
                                   + (" (copying documents)" if "each of these" in n else "") for n in notes[name]]
                    # the neutral workload first, as the landing gives it; then the one written to be copied
                    cells[name] = (f"**{low['ratio']:.2f}×** on low-copy requests ({us(low['ms'])} against "
                                   f"{us(low['rival_ms'])} µs); **{row['vs_rival']:.2f}×** copying documents "
                                   f"({against(ours, theirs)} µs){row_caveat(row)}")
                brief[name] = (f"{row['vs_rival']:.2f}× our own loop, chapter 07's (no serving engine measured), "
                               "on SmolLM2-135M")
            if entry.number == 3 and wait is not None and (wait.get("rival_gpu_ms") or 0) > wait["host_ms"]:
                eager[name] = f"ours waits on the host ({us(wait['host_ms'])} µs a call) and stays ahead"
            if entry.number == 6:  # the deployment-fair layout (Llama 3.1 8B's grouped-query heads) leads where a
                # card measured it; 32 heads, the layout every card measures, second (its ratio compares the cards)
                grouped = next((b for b in board if b["number"] == 6 and short_card(b["card"]) == name and not b["lead"]
                                and "missing" not in b and b.get("vs_rival") is not None), None)
                if grouped is not None:
                    cells[name] = (f"**{grouped['vs_rival']:.2f}×** ({us(grouped['median_ms'])} against "
                                   f"{us(grouped['rival_ms'])} µs){row_caveat(grouped)}")
                    notes[name].append(f"{name}: with 32 query heads each with its own key/value head, "
                                       f"{row['vs_rival']:.2f}×{row_caveat(row)}")
                    brief[name] = (f"{grouped['vs_rival']:.2f}× {entry.rival_short} with Llama 3.1 8B's grouped-query "
                                   f"heads (step 6); {row['vs_rival']:.2f}× with 32 heads (step 5)")
                    landing[name] = f"{grouped['vs_rival']:.2f}× with Llama 3.1 8B's grouped-query heads"
                else:
                    cells[name] += ", 32 heads (grouped-query heads not measured on this card)"
                    brief[name] += " (32 heads)"
                    landing[name] += " (32 heads)"
                loss = multi_item_loss(card)
                if loss is not None:  # the one case the chapter's kernel loses: said beside its headline
                    notes[name].append(f"{name}: causal SDPA, a speed reference that computes a superset of the "
                                       "mask (not a rival: its items see each other), is faster at one case, "
                                       f"{loss['case']}: {us(loss['rival_ms'])} against our {us(loss['ms'])} µs")
                # a separate re-run's drift is the scoreboard's to show (its re-run column), not this line's: the
                # ratio keeps both its times from one run
            if entry.number == 2:  # one headline, the whole step; the kernel alone against its rival in a note
                brief[name] += " at batch 1"
                allowed = re.search(r"([\d,]+) of [\d,]+ tokens allowed", row.get("shape") or "")
                landing[name] += " for the head-and-mask step at batch 1" + (
                    f", {allowed.group(1)} tokens allowed" if allowed else "")
                wider = masked_head_batches(card)
                # where the lead ends (a tie at the widest batch) is the results page's note, not the landing's cell
                # what a kernel buys a whole step is each page's to say: the landing gives it for no row, so no row
                # stands alone with it (chapter 06's whole pass, chapter 04's training step)
                if wider:  # a tie within TIE_WITHIN, the course's rule (How we measure)
                    brief[name] += (" (" + ", ".join(f"a tie at {b}" if abs(x - 1) < TIE_WITHIN else f"{x:.2f}× at {b}"
                                                     for b, x in wider.items()) + ")")
                    # the lead narrows as the batch grows: said beside the batch-1 headline, not left to the fold
                    notes[name].append(f"{name}: the same whole step at larger batches, as many tokens allowed "
                                       "per sequence: " + ", ".join(
                                           f"a tie at batch {b} ({x:.2f}×)" if abs(x - 1) < TIE_WITHIN
                                           else f"{x:.2f}× at batch {b}" for b, x in wider.items()))
                alone = next((b for b in board if b["number"] == 2 and short_card(b["card"]) == name and not b["lead"]
                              and "missing" not in b and b.get("vs_rival") is not None), None)
                # the kernel's strongest rival, torch.compile's fused gather, ran in a lab run on the H200 only: the
                # line leads with the kernel against it, then the whole step against the path engines ship
                compiled = compiled_gather_rows() if name == "H200" else {}
                if alone is not None and 1000 in compiled:
                    c = compiled[1000]
                    pair = f"{against(c['ours']['ms'], c['theirs']['ms'])} µs"
                    step = f"{against(ours, theirs)} µs"
                    brief[name] = (f"{c['ratio']:.2f}× torch.compile's fused gather, the kernel alone; "
                                   + brief[name].replace(entry.rival_short, "the path engines ship (xgrammar's), "
                                                         "the whole step", 1))
                    landing[name] = (f"batch 1, {allowed.group(1) if allowed else '1,000'} allowed: the kernel "
                                     f"alone, given the ids, {c['ratio']:.2f}× ({pair}); the whole step from the "
                                     f"bitmask, {row['vs_rival']:.2f}× ({step})")
                    cells[name] = (f"the kernel alone: **{c['ratio']:.2f}×** ({pair}); the whole step: "
                                   f"**{row['vs_rival']:.2f}×** ({step}){row_caveat(row)}")
                    if 10_000 in compiled:
                        c10 = compiled[10_000]
                        notes[name].append(f"{name}: the kernel alone against torch.compile's fused gather at 10,000 "
                                           f"allowed: {c10['ratio']:.2f}× ({us(c10['ours']['ms'])} against "
                                           f"{us(c10['theirs']['ms'])} µs)")
                    notes[name].append(f"{name}: the kernel alone at 1,000 allowed against index_select then "
                                       "matmul, unfused (two launches): "
                                       f"{alone['vs_rival']:.2f}× ({us(alone['median_ms'])} against "
                                       f"{us(alone['rival_ms'])} µs). Ours writes the whole row, masked, while the "
                                       "gathers write only the allowed logits")
                elif alone is not None:  # the kernel against a rival that reads only the allowed rows too: a note
                    brief[name] += (f"; the kernel alone {alone['vs_rival']:.2f}× two torch launches, index_select "
                                    "then matmul")
                    notes[name].append(f"{name}: the kernel alone, given the allowed ids like its rival, is "
                                       f"{alone['vs_rival']:.2f}× faster than two torch launches, index_select then "
                                       "matmul, not a tuned gather kernel "
                                       f"({against(alone['median_ms'], alone['rival_ms'])} µs; it writes the "
                                       "whole row, masked; the gather writes only the allowed logits)")
                # the like-for-like figure and where the lead ends, in the cell beside the headline
            if entry.number == 5:  # BitNet's own kernel, a peer that passes our check, at the shapes it is built for
                beaten = bitnet_range(card)
                llama = next((b for b in board if b["number"] == 5 and short_card(b["card"]) == name
                              and b.get("ternary_case") == "llama"), None)
                at = ""
                if llama is not None and llama.get("gemlite_fails_check"):
                    at = (f"at 4096 × 14336 GemLite fails our float64 check (its error is "
                          f"{llama['gemlite_check_error']:.2%} of the product's norm, the tolerance "
                          f"{llama['gemlite_check_tolerance']:.2%}), so no ratio against it is given")
                elif llama is not None and llama["rival_ms"] is not None:
                    at = (f"at 4096 × 14336, a Llama shape BitNet's kernel is not built for, {llama['vs_rival']:.2f}× "
                          f"{llama['rival']} ({against(llama['median_ms'], llama['rival_ms'])} µs; it "
                          f"{llama.get('rival_check') or 'has no'} our float64 check here)")
                if beaten is not None:
                    lo, hi, shapes = beaten
                    ratios[name] = lo
                    cells[name] = f"**{lo:.2f}–{hi:.2f}×** at its {shapes} shapes"
                    tied = bitnet_tie_words(card)
                    if tied is not None:  # a tie is not the low end of a win, nor bold: only the lead is
                        cells[name] = re.sub(r"(up to )(\d\.\d\d×)", r"\1**\2**", tied[0].replace(
                            " at one shape", f" at {tied[1]}", 1) if tied[1].count(" × ") == 1 else tied[0])
                    brief[name] = (f"{lo:.2f}–{hi:.2f}× BitNet's kernel (2-bit weights, 8-bit x) at its {shapes} "
                                   "decode shapes")
                    landing[name] = (f"over the {shapes} decode shapes BitNet's kernel is built for, {tied[0]}"
                                     if tied is not None else
                                     f"{lo:.2f}–{hi:.2f}× at the {shapes} decode shapes BitNet's kernel is built for")
                    eager[name] = bitnet_eager_words(card)
                    flips = bitnet_eager(card)
                    # through step 23's plan the lead holds eagerly too: the cell needs no caveat
                    planned = plan_holds(flips)
                    # the lead holding eagerly only through the plan is said under the line, in the chapter's one
                    # sentence on calls made eagerly (host_bound_by_chapter)
                    if eager[name] and flips and not planned:  # the answer flips when called eagerly: said in the cell too
                        cells[name] += (f", in a CUDA graph (called eagerly, BitNet's is faster at "
                                        f"{flips['slower_eager']})")
                        n_, of_ = flips["slower_eager"], len(flips["rows"])
                        landing[name] += (", in a CUDA graph; eagerly, BitNet's kernel wins "
                                          + (f"at all {of_}" if n_ == of_ else f"{n_} of {of_}"))
                    if row.get("run_label"):  # the range is the cell's; where its rows come from is not
                        notes[name].append(f"{name}: BitNet's rows are from {row['run_label']}")
                else:
                    ratios[name], cells[name], brief[name] = None, VOID, "BitNet's kernel not measured"
                    notes[name].append(f"{name}: BitNet's kernel is not measured on this card" + (f"; {at}" if at else ""))
                if llama is not None and llama.get("dense_ratio") is not None and llama.get("gemlite_fails_check"):
                    # where GemLite fails the check, cuBLAS is the strongest rival at that shape (the scoreboard's
                    # row); where GemLite passes, cuBLAS is the weaker of the two
                    step = "{} ({})".format(*llama["ours"].split(";")[0].split(", ", 1))  # "step 21 (bf16 x)"
                    notes[name].append(f"{name}: at 4096 × 14336, a Llama shape BitNet's kernel is not built for, "
                                       f"{step} runs {llama['dense_ratio']:.2f}× faster than cuBLAS bf16 on the "
                                       "dense matrix, " + (
                                           "the strongest rival there that passes our float64 check"
                                           if llama.get("gemlite_fails_check") else "a weaker baseline than GemLite"))
                if beaten is not None and at:
                    notes[name].append(f"{name}: " + at.replace("at 4096 × 14336 GemLite", "there GemLite", 1))
            if entry.number == 4:  # the whole grid beside the headline shape, as the results table lists it
                grid = ctc_grid(card)
                if grid is not None:
                    (lo, lo_at), (hi, hi_at) = grid
                    slow, of = ctc_host_bound(card)
                    brief[name] = (f"{lo:.2f}–{hi:.2f}× torch's faster path at each case ({row['vs_rival']:.2f}× "
                                   f"cuDNN at alphabet {CTC_CASE['A']:,}, batch {CTC_CASE['N']})")
                    # the grid's range against the strongest rival at each case, then the headline case within it
                    landing[name] = (f"{lo:.2f}–{hi:.2f}× against torch's faster path at each case "
                                     f"({row['vs_rival']:.2f}× against cuDNN at alphabet {CTC_CASE['A']:,}, batch "
                                     f"{CTC_CASE['N']})")
                    if slow:
                        eager[name] = f"{slow} of the {of} cases wait on the host, by their median host times"
                    # what the eager call does is the line's "called eagerly" note, counted over the page's cases
                    top = max(ctc_strongest(card), key=lambda c: c["best_ratio"])  # the range's top end, its times here
                    tied = [c["case"] for c in ctc_strongest(card) if f"{c['best_ratio']:.2f}" == f"{lo:.2f}"]
                    if len(tied) > 1 and all(t.rsplit(", batch ", 1)[0] == tied[0].rsplit(", batch ", 1)[0]
                                             for t in tied):  # one alphabet, several batches: all named
                        lo_at = (tied[0].rsplit(", batch ", 1)[0] + ", batches "
                                 + " and ".join(t.rsplit(", batch ", 1)[1] for t in tied))
                    # where torch's native path reads faster than cuDNN (kernel clock), that case against it too
                    native = [c for c in ctc_native_cases(card) if c["ratio"]]
                    notes[name].append(f"{name}: over {len(ctc_cases(card))} cases against torch's faster path at each case, "
                                       f"from {lo:.2f}× at {lo_at} to {hi:.2f}× "
                                       f"({us(top['ours']['ms'])} against {top['best_rival']}'s "
                                       f"{us(top['best_ms'])} µs) at {hi_at}"
                                       + (", where torch's native path reads on the kernel clock, which favours it"
                                          if top["best_rival"] != "cuDNN" else ""))
                    for c in native:  # the one kind of case the card tables do not show: torch's native path faster
                        notes[name].append(f"{name}: at {c['where'].replace('A = ', 'alphabet ').replace(', N = ', ', batch ')}"
                                           f", torch's native path reads faster than cuDNN on the kernel clock "
                                           f"({us(c['native_ms'])} µs), and ours is {c['ratio']:.2f}× faster than it")
            if entry.number == 7:  # the real model leads; the 8B cost model is measured on synthetic weights
                synthetic = synthetic_words(card)
                bound = decode_bound(card)
                real7, cost7 = decode_real(card), decode_real(card, "8b")
                cost = row["vs_rival"]
                notes[name] = [n for n in notes[name] if "the line's ratio divides" not in n]
                if real7 is not None:
                    split = decode_split(card)
                    # the landing cell and the line's: what chapters 01 and 02 buy; the loop to use on a small
                    # model (the cached sets too, host work, neither chapter's) is in the line's notes
                    landing[name] = (decode_split_words(split, landing=True) if split else
                                     f"{real7['ratio']:.2f}× per output token on SmolLM2-135M, a real model")
                    cells[name] = ((decode_split_words(split, landing=True, bold=True) if split else
                                    f"**{real7['ratio']:.2f}×** on SmolLM2-135M ({us(real7['step3_us'] / 1e3)} "
                                    f"against {us(real7['step1_us'] / 1e3)} µs, medians over {real7['requests']} "
                                    f"requests)") + row_caveat(row))
                    notes[name].append(f"{name}: on SmolLM2-135M the whole loop (step 3) against step 1's, request "
                                       f"by request, runs from {real7['slowest']:.2f}× to {real7['fastest']:.2f}×")
                    if split and split.get("small"):  # host work, neither chapter's: the line's notes, not its cell
                        base, small = split["small"]
                        notes[name].append(f"{name}: on SmolLM2-135M a small model's loop, step 2 with its allowed "
                                           f"sets cached and no masked head (3a, host work, {split['sets']:.2f}×), runs {base / small:.2f}× step "
                                           f"1's ({against(small / 1e3, base / 1e3)} µs a token, medians over "
                                           f"{real7['requests']} requests"
                                           + (f"; {split['again']['small']:.2f}× in another run)" if split.get("again")
                                              else ")"))
                    if split:
                        notes[name].append(f"{name}: {decode_split_words(split)}")
                else:
                    landing[name] += " on the 8B cost model (measured, synthetic weights), not a real model"
                said = (f"{name}: on the 8B cost model, {synthetic}, {cost:.2f}× (measured)"
                        if real7 is not None else f"{name}: the 8B cost model is {synthetic}")
                per_schema = [c for c in clauses(row["ratio_note"])[1:] if c.startswith("each schema's own")]
                if per_schema:  # the run's own words for the cost model's spread of per-schema ratios
                    said += f"; {per_schema[0]}, on the 8B cost model"
                elif cost7 is not None and cost7["slowest"] is not None:
                    said += (f"; each schema's own ratio runs from {cost7['slowest']:.2f}× to "
                             f"{cost7['fastest']:.2f}×, median {cost7['median_request']:.2f}×, on the 8B cost model")
                if bound is not None:
                    said += (f"; from chapters 01 and 02's savings, each measured alone, Amdahl's law forecasts "
                             f"{bound:.2f}× for the whole loop on the 8B cost model")
                notes[name].append(said)
                brief[name] = ((f"{real7['ratio']:.2f}× on SmolLM2-135M, a real model; " if real7 else "")
                               + f"{cost:.2f}× our own loop with a dense head and xgrammar's mask (no serving engine "
                               f"measured) on the 8B cost model, {synthetic}")
            if row.get("unpadded_head"):  # a run whose dense baseline is slowed: its ratio is not compared
                ratios[name], comparable[name] = None, False
                cells[name] = VOID
                notes[name] = [f"{name}: not compared on this card: the benchmark's run there was set up with a head "
                               "not padded as real models ship it, which slows the dense baseline (the run's setup, "
                               "not the card)"]
                brief[name] = "not compared on this card"
        if entry.bench is not None:  # runs that replayed one copy beside runs that rotated: said once, in a note
            one_copy = {short_card(card_name(c)): (c, replayed_one_copy(c, entry.bench)) for c in cards(root)}
            rotated = [n for n, (_, once) in one_copy.items() if once is False]
            lead = next((b for b in board if b["number"] == entry.number and short_card(b["card"]) in rotated
                         and b["lead"] and "missing" not in b), None)
            once = next((n for n, (_, v) in one_copy.items() if v and ratios.get(n) is not None), None)
            if rotated and lead is not None and once is not None:
                l2 = (load(one_copy[once][0], entry.bench) or {}).get("device", {}).get("l2_cache_bytes")
                words = one_copy_words(entry.number, once, rotated, lead, l2)
                if "this line's included" in words:  # the headline itself is not comparable: no ratio in its cell
                    comparable[once], ratios[once] = False, None
                    notes[once] = [f"{once}: not compared on this card: the benchmark's run there replayed one copy "
                                   f"of {ROTATED.get(entry.number, ('its input',))[0]}, so the rows a call reads could "
                                   "stay in L2 between calls (the run's setup, not the card)"]
                    cells[once] = VOID
                    brief[once] = "not compared on this card"
                else:
                    notes[once].append(f"{once}{words.lstrip(';')}")
        steps = {n: _step_of(r["ours"]) for n, r in leads.items() if ratios.get(n) is not None}
        differs = ""
        if len(set(steps.values())) > 1:  # the cards' headlines time different steps: which
            differs = "the cards time different steps: " + "; ".join(f"the {n} {k}" for n, k in steps.items())
        eager = {n: e for n, e in eager.items() if e and ratios.get(n) is not None}
        # the answer's clock said before its eager clause, unless the answer names a clock per ratio (chapter 03)
        replay = "" if entry.number == 3 else ", under CUDA-graph replay"
        full = {n: a + (f"{replay}; called eagerly, {eager[n]}" if n in eager else "") for n, a in brief.items()}
        what = entry.headline
        if entry.number == 1 and peer:
            what = f"{what}; beside it the strongest peer, llguidance's fast-forward tokens"
        elif entry.number == 7:  # the rival is the course's own loop, and the model is a cost model: both said
            what = ("the loop with chapters 01 and 02 against our own loop, per output token, batch 1, on SmolLM2-135M, "
                    "then on the 8B cost model")
        elif entry.number == 4:  # why this case, and the grid it sits in
            what = f"{what}{ctc_case_words(_card(root, SUMMARY_CARD))}"
        elif entry.number == 8:
            what = what.replace("chapter 07's loop", "our own loop, chapter 07's (no serving engine measured)")
        elif entry.number == 3:
            what = what.replace(f", {NGRAM_CASE['batch']} slots of {NGRAM_CASE['seq_len']:,} tokens",
                                f", at its synthetic shapes (the middle one: {NGRAM_CASE['batch']} slots of "
                                f"{NGRAM_CASE['seq_len']:,} tokens)")
        elif entry.number == 6:
            what = what.replace(" in one call,", " in one call, Llama 3.1 8B's grouped-query heads,")
        out.append({"number": entry.number, "title": entry.title, "notebook": entry.notebook,
                    "question": entry.question, "what": what, "cells": cells, "notes": notes,
                    "ratios": ratios, "brief": full, "answer": {n: landing[n] if n in landing and ratios.get(n) is not None
                                                     else b for n, b in brief.items()},
                    "eager": eager, "comparable": comparable,
                    "differs": differs})
    return out


def part_one_line(root: Path = BENCH_RESULTS) -> dict[str, Any] | None:
    """Chapter 05 part 1's line for the results table, per card (short name): its cell (:func:`part_one_answer`'s
    range against GemLite) and its notes (the shapes it loses at, cuBLAS bf16 at the headline shape); None where no
    card has the answer."""
    cells: dict[str, str] = {}
    notes: dict[str, list[str]] = {}
    passed: dict[str, frozenset] = {}
    for card in cards(root):
        name = short_card(card_name(card))
        answer = part_one_answer(card)
        notes[name] = []
        if answer is not None:
            passed[name] = frozenset(answer["ratios"])
        if answer is None:
            cells[name] = VOID
            notes[name].append(f"{name}: not measured on this card")
            continue
        r = answer["ratios"]
        lost = sorted(k for k, v in r.items() if v < 1)
        bound = next((v["tolerance"] for v in answer["times"].values() if v.get("tolerance") is not None), None)
        check = f"meets our {bound:.2%} error bound" if bound is not None else "passes our check"
        # the range is over the shapes where GemLite's output passes our check: a ratio against an output that
        # fails it is no comparison (chapter 05 part 2 gives none either); the failing shapes are named below
        # every shape where GemLite is faster is named in the cell with its ratio, the ones where it fails our check
        # too (a range over the passing shapes alone would hide a loss the chapter's table shows), each in a clause
        # of its own so that "misses our bound" cannot be read as said of a passing shape; times in the notes
        t = answer["times"]
        words = {k: k.replace("x", " × ") for k in t}
        failing = [k for k in answer["failed_faster"] if k in t]
        cells[name] = f"**{min(r.values()):.2f}–{max(r.values()):.2f}×** at {len(r)} shapes" + "".join(
            f"; {t[k]['rival_ms'] / t[k]['ms']:.2f}× at {words[k]}, where GemLite misses our "
            + (f"{bound:.2%} " if bound is not None else "") + f"error bound on the {name}" for k in failing)
        if lost:
            cells[name] += f" (slower at {' and '.join(words[k] for k in lost)}, where GemLite passes)"
        for k in lost:
            notes[name].append(f"{name}: at {words[k]}, where GemLite passes our check, step {PART_ONE_STEP} takes "
                               f"{us(t[k]['ms'])} µs against GemLite's {us(t[k]['rival_ms'])} µs")
        for k in failing:
            notes[name].append(f"{name}: at {words[k]} GemLite is faster ({us(t[k]['rival_ms'])} against "
                               f"{us(t[k]['ms'])} µs) but misses our bound" + (
                                   f" ({t[k]['error']:.2%} error)" if t[k]["error"] is not None else "")
                               + ": its atomic adds round each partial sum to bf16, so its error grows with K")
        if answer["failed"]:  # the narrower range leaves out the shapes where GemLite fails: named once, a shape
            # the note above names already not again
            rest = [k for k in answer["failed"] if k not in failing]
            if rest:
                left = "all those" if failing else "those"
                if failing and len(failing) + len(rest) == 2:
                    left = "both"
                elsewhere = {k for c in cards(root) if c != card
                             for k in ((part_one_answer(c) or {}).get("ratios") or {})}  # passes on another card
                notes[name].append(f"{name}: GemLite's output {'also ' if failing else ''}fails our float64 check at "
                                   + " and ".join(k.replace("x", " × ") + (f" (on the {name} only)" if k in elsewhere
                                                                          else "") for k in rest)
                                   + f", so the range leaves {left} shapes out")
    if all(c == VOID for c in cells.values()):
        return None
    # the table shows one card: a shape where GemLite fails our check on it but passes and is faster on another card
    # is a loss on both, so the cell says so (the other card's times are in the folds)
    lost_on: dict[str, list[str]] = {}
    for card in cards(root):
        answer = part_one_answer(card)
        if answer is not None:
            for k, v in answer["ratios"].items():
                if v < 1:
                    lost_on.setdefault(k, []).append(short_card(card_name(card)))
    for card in cards(root):
        name = short_card(card_name(card))
        answer = part_one_answer(card)
        if answer is None or cells.get(name, VOID) == VOID:
            continue
        for k in answer["failed_faster"]:
            others = [c for c in lost_on.get(k, []) if c != name]
            said = f"error bound on the {name}"
            if others and said in cells[name]:
                cells[name] = cells[name].replace(
                    said, said + f" (on the {' and '.join(others)} it passes there and is faster too)")
    return {"notebook": "notebooks/05_ternary_1_triton.ipynb", "cells": cells, "notes": notes,
            "question": OTHER_PAGES["notebooks/05_ternary_1_triton.ipynb"].replace(" (part 1 of 2)", ""),
            "what": "our Triton ternary kernel on tensor cores, one row of x, against GemLite, a Triton library"}


def clauses(note: str) -> list[str]:
    """A note cut at its semicolons outside parentheses: the results page gives each clause a bullet of its own."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(note):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == ";" and depth == 0:
            out.append(note[start:i].strip())
            start = i + 1
    out.append(note[start:].strip())
    return [c for c in out if c]


#: The card the one-line summary gives: every chapter is measured on it, with the course's current code.
SUMMARY_CARD = "H200"


#: Per chapter (chapter 05: its part), the file its rivals ran in and the libraries among them, as the file's notes
#: name them (a version or, for BitNet's kernel, a commit); torch's own kernels take torch's version.
RIVAL_LIBRARIES = {1: ("fsm", ("llguidance",)), 2: ("masked_lm_head", ("xgrammar",)), 3: ("ngram", ()),
                   4: ("ctc", ()), (5, 1): ("ternary", ("GemLite",)), (5, 2): ("ternary", ("BitNet", "GemLite")),
                   6: ("multi_item", ("flashinfer",)), 7: ("decode", ("xgrammar",)), 8: ("speculate", ())}
#: What each chapter's rivals take from torch, named beside its version.
TORCH_RIVALS = {2: "cuBLAS, index_select and torch.compile", 4: "cuDNN", (5, 1): "cuBLAS", (5, 2): "cuBLAS", 6: "causal SDPA"}
#: The chapters whose rival is the course's own code: no version to give.
OWN_RIVALS = {3: "our own port of FastDeploy's kernel and our CPU loop (this course's code)",
              7: "our own loop (this course's code)", 8: "our own loop (chapter 07's)"}


def rival_versions(number: int, part: int = 0, root: Path = BENCH_RESULTS, card: str = SUMMARY_CARD) -> str:
    """One sentence: the rivals' versions as the committed run of chapter ``number`` (chapter 05: ``part``) on
    ``card`` records them (:func:`rival_items`)."""
    said, kernels, torch = rival_items(number, part, root, card)
    key = (number, part) if number == 5 else number
    if kernels:
        said.append(f"{kernels} as shipped with torch {torch}" if torch else f"{kernels} from torch")
    if key in OWN_RIVALS:
        said.insert(0, OWN_RIVALS[key])
    if not said:
        return ""
    return "rivals as run: " + (", ".join(said[:-1]) + " and " + said[-1] if len(said) > 1 else said[0])


def rival_items(number: int, part: int = 0, root: Path = BENCH_RESULTS,
                card: str = SUMMARY_CARD) -> tuple[list[str], str, str]:
    """The rivals' versions as the committed run of chapter ``number`` (chapter 05: ``part``) on ``card`` records
    them: the libraries with theirs, from the file's notes (a library's version, BitNet's commit; a library whose
    version the file does not record is left out), then the kernels torch ships that the chapter races and
    torch's version from the file's ``versions`` (empty strings where none)."""
    key = (number, part) if number == 5 else number
    stem, libraries = RIVAL_LIBRARIES[key]
    said: list[str] = []
    if stem == "fsm":
        versions = (json.loads(FSM_PEERS.read_text()) if FSM_PEERS.exists() else {}).get("versions", {})
        said += [f"{lib} {versions[lib]}" if versions.get(lib) else lib for lib in libraries]
    else:
        folder = next((c for c in cards(root) if short_card(card_name(c)) == card), None)
        data = (load(folder, stem) if folder else None) or {}
        notes = " ".join(n for n in data.get("notes", []) if isinstance(n, str))
        for lib in libraries:
            if lib == "BitNet":
                m = re.search(r"microsoft/BitNet\S* .*?\(commit ([^)]*)\)", notes)
                commit = m.group(1).strip() if m else ""
                said.append(f"BitNet's kernel at commit {commit}" if commit and commit != "?" else
                            "BitNet's kernel from microsoft/BitNet")
                continue
            m = re.search(rf"(?i)\b{re.escape(lib)} (\d[\w.+-]*\w)", notes)
            name = {"flashinfer": "FlashInfer"}.get(lib, lib)
            if m:  # only a version the run recorded is listed: none is implied for a run that records none
                said.append(f"{name} {m.group(1)}")
        if key in TORCH_RIVALS:
            return said, TORCH_RIVALS[key], (data.get("versions") or {}).get("torch") or ""
    return said, "", ""


def versions_footnote(root: Path = BENCH_RESULTS, card: str = SUMMARY_CARD) -> str:
    """One footnote under the results table's notes: every rival library's version as the chapters' committed runs
    on ``card`` record it (:func:`rival_items`), each once with the chapters that race it, then the kernels torch
    ships with torch's version, then the chapters whose rival is the course's own code."""
    keys = [(1, 0), (2, 0), (3, 0), (4, 0), (5, 1), (5, 2), (6, 0), (7, 0), (8, 0)]
    libraries: dict[str, list[str]] = {}
    torch: dict[str, tuple[list[str], list[str]]] = {}  # torch's version -> its kernels, the chapters
    own: list[str] = []
    for number, part in keys:
        try:
            said, kernels, version = rival_items(number, part, root, card)
        except (KeyError, OSError, ValueError):
            continue
        label = f"{number:02d}"
        for item in said:
            libraries.setdefault(item, [])
            if label not in libraries[item]:
                libraries[item].append(label)
        if kernels:
            names, chapters = torch.setdefault(version, ([], []))
            names += [k for k in re.split(r", | and ", kernels) if k not in names]
            if label not in chapters:
                chapters.append(label)
        if ((number, part) if number == 5 else number) in OWN_RIVALS and label not in own:
            own.append(label)

    def listed(xs: list[str]) -> str:
        return ", ".join(xs[:-1]) + " and " + xs[-1] if len(xs) > 1 else xs[0]

    parts = [f"{item} ({', '.join(chapters)})" for item, chapters in libraries.items()]
    parts += [f"{listed(names)} as shipped with torch {version} ({', '.join(chapters)})" if version else
              f"{listed(names)} from torch ({', '.join(chapters)})" for version, (names, chapters) in torch.items()]
    if not parts:
        return ""
    out = "Rivals' versions as run, by chapter: " + "; ".join(parts) + "."
    if own:
        out += f" Chapter{'s' if len(own) > 1 else ''} {listed(own)} race the course's own code."
    return out


def case_and_rival(number: int, part: int = 0, root: Path = BENCH_RESULTS) -> str:
    """The results table's second column for chapter ``number`` (chapter 05: ``part`` 1 or 2): the headline's shape,
    then its rival, in a few words; the question stands in the column before it."""
    if number == 4:
        why = ctc_case_words(_card(root, SUMMARY_CARD))
        smallest = " (our smallest lead at this alphabet)" if "where our lead is smallest" in why else ""
        return f"T = 150, A = {CTC_CASE['A']:,}, N = {CTC_CASE['N']}{smallest}; vs cuDNN"
    words = {
        1: "real SchemaStore schemas (the course's suite in the notes), forward passes; vs llguidance's "
           "fast-forward tokens"
           + ("" if fsm_peers_real() else " (on the suite)"),
        2: ("batch 1, 1,000 of 128,256 tokens allowed; vs torch.compile's fused gather (the kernel alone, given the "
            "ids); xgrammar's cuBLAS logits, then its mask: the path engines ship (the whole step, from the bitmask)"),
        3: "its synthetic batches of slots and tokens; vs our corrected port of FastDeploy's kernel, step 4 (no "
           "library has one)",
        5: ("one row of x, GemLite's shapes; vs GemLite" if part == 1 else
            "one row of int8 x, BitNet's shapes; vs BitNet's W2A8 kernel"),
        6: "8 prompts, mixed lengths, Llama 3.1 8B's grouped-query heads; vs FlashInfer",
        7: "SmolLM2-135M, then the 8B cost model, batch 1, per token; vs our own loop (no serving engine measured)",
        8: "SmolLM2-135M, batch 1, per token, low-copy requests, then copying documents; vs our own loop, chapter "
           "07's (no serving engine measured)",
    }
    return words[number]


#: The most notes a results line may carry (each a short clause).
MAX_NOTES = 6
#: The one fold under the results table that holds every line's notes, chapter by chapter.
NOTES_HEAD = "\n<details><summary>More on each line: other cases, the other card, where a rival would win</summary>\n"
#: The same fold as the book's dropdown, on the results page (beside its other folds).
NOTES_DROPDOWN = ":::{dropdown} More on each line: other cases, the other card, where a rival would win"


def summary_markdown(root: Path = BENCH_RESULTS, link: Callable[[str], str] | None = None,
                     card: str | None = SUMMARY_CARD, dropdown: bool = False) -> str:
    """The results page's first table: per chapter (and chapter 05's Triton part, :func:`part_one_line`) the
    question, the fair headline on ``card`` (every card with None: one number and a few words) and a link; under
    it, a list of each line's notes (caveats, the other numbers of a line, and where the cards time
    different code). A card whose run is not comparable with the other card's shows no ratio; its note says why.
    The notes fold is HTML ``<details>`` (which the README renders), or with ``dropdown`` the book's own fold, so that
    it looks like the page's other folds."""
    link = link or (lambda nb: nb)
    found = headlines(root)
    names = [n for n in dict.fromkeys(n for h in found for n in h["cells"]) if card is None or n == card]
    # one card: its column holds the answer, a GPU time's ratio where one is timed (chapter 01's is a count)
    lines = ["| chapter | the question | case | against | "
             + " | ".join(f"answer ({n} where timed)" if card is not None else n for n in names) + " |",
             "|" + "---|" * (4 + len(names))]
    notes: list[str] = []
    part_one = part_one_line(root)
    timed_elsewhere = {n for c in names for n in also_timed(root, c)} if card is not None else set()

    def line(title: str, notebook: str, question: str, what: str, cells: dict[str, str], said: list[str],
             versions: str = "") -> None:
        if card is not None and not notebook.startswith("notebooks/01_") and (
                notebook not in timed_elsewhere or (notebook.startswith("notebooks/06_") and not gqa_elsewhere(root, card))):
            # the folds below hold no other card's number (chapter 01 counts passes: no card's)
            what = what.replace("; vs ", f"; {card} only; vs ", 1)
        case, _, rival = what.partition("; vs ")
        lines.append(f"| [{title}]({link(notebook)}) | {question} | {case} | {rival} | "
                     + " | ".join(cells.get(n, NOT_MEASURED) for n in names) + " |")
        if said:  # one short bullet per clause, under the line's title, all in one list
            notes.append(f"- **{title}**")
            notes.extend(f"  - {c[0].upper() + c[1:]}." for t in said for c in clauses(t))
        # the rivals' versions are one footnote under the notes (versions_footnote), not a bullet a line

    def one_card(h: dict[str, Any]) -> dict[str, Any]:
        """``h`` for the single card shown: a cell that says "the same" as another card's (chapter 01, counted on the
        host) takes that card's words, and the notes lose their card's name."""
        if card is None:
            return h
        cells, notes = dict(h["cells"]), {n: list(t) for n, t in h["notes"].items()}
        first = next(iter(h["cells"]))
        if cells.get(card, "").startswith("the same"):
            cells[card], notes[card] = h["cells"][first], notes[first]
        notes[card] = [t.removeprefix(f"{card}: ") for t in notes.get(card, [])]
        return h | {"cells": cells, "notes": notes}

    found = [one_card(h) for h in found]
    part_one = part_one and one_card(part_one)
    if part_one and card is not None and part_one["cells"].get(card, VOID) != VOID:
        # another card's range and where it loses, in the visible line, not only in the folds
        for c in cards(root):
            other = short_card(card_name(c))
            answer = part_one_answer(c) if other != card else None
            if not answer:
                continue
            r = answer["ratios"]
            lost = [k.replace("x", " × ") for k, v in r.items() if v < 1]
            # in the line's notes, as every H100 number is on this page (a ratio within TIE_WITHIN is a tie)
            lo = min(r.values())
            low_at = [k.replace("x", " × ") for k, v in r.items() if f"{v:.2f}" == f"{lo:.2f}"]
            kind = ("a tie" if is_tie(lo) else "slower") if lo < 1 else ""
            part_one["notes"] = dict(part_one["notes"])
            part_one["notes"][card] = [f"on the {other}, {lo:.2f}–{max(r.values()):.2f}×"
                                       + (f", {kind} ({lo:.2f}×) at {' and '.join(low_at)}" if kind else "")] + list(
                part_one["notes"].get(card, []))
    if card is not None:  # chapter 03 on another card: its headline and stress case, a tie said as one
        for i, h in enumerate(found):
            if h["number"] != 3:
                continue
            for c in cards(root):
                other = short_card(card_name(c))
                pairs, many = (ngram_ratios(c), ngram_many(c)) if other != card else ({}, None)
                if NGRAM_STEP_CASE not in pairs or many is None:
                    continue
                mine, port = pairs[NGRAM_STEP_CASE]
                x = port["ms"] / mine["ms"]
                tie = " (a tie)" if is_tie(x) else ""
                ran = ("" if mine.get("series") == "ngram_match"
                       else f", which timed step {int(mine['series'].removeprefix('step'))} only")
                b, t, budget = NGRAM_STEP_CASE
                said = (f"on the {other}{ran}, {x:.2f}×{tie} at {b} × {t:,}, budget {budget}, and {many[1]:.2f}× in "
                        "the stress case")
                found[i] = h | {"notes": dict(h["notes"]) | {card: [said] + list(h["notes"].get(card, []))}}
    eager_lines = {k: [v] for k, v in host_bound_by_chapter(root).items()}
    for h in found:
        if h["number"] == 5 and part_one is not None:  # part 1 (Triton) first, as the book reads
            line(f"05. {h['title']}, part 1 (Triton)", part_one["notebook"], part_one["question"],
                 case_and_rival(5, 1, root), part_one["cells"],
                 [t for n in names for t in part_one["notes"].get(n, [])] + eager_lines.get((5, 1), []),
                 rival_versions(5, 1, root, card or SUMMARY_CARD))
        title = f"{h['number']:02d}. {h['title']}" + (", part 2 (CUDA C++)" if h["number"] == 5 and part_one else "")
        part = 2 if h["number"] == 5 else 0
        line(title, h["notebook"], h["question"], case_and_rival(h["number"], part, root), h["cells"],
             [t for n in names for t in h["notes"].get(n, [])] + ([h["differs"]] if h["differs"] and len(names) > 1
                                                                 else []) + eager_lines.get((h["number"], part), []),
             rival_versions(h["number"], part, root, card or SUMMARY_CARD))
    if notes:
        if dropdown:
            lines += ["", NOTES_DROPDOWN, ""] + notes + ["", ":::"]
        else:
            lines += [NOTES_HEAD] + notes + ["", "</details>"]
    footnote = versions_footnote(root, card or SUMMARY_CARD)
    if footnote:
        lines += ["", footnote]
    return "\n".join(lines)


def also_timed(root: Path = BENCH_RESULTS, card: str = SUMMARY_CARD) -> list[str]:
    """The pages (notebooks, in the book's order) whose headline has a time on a card other than ``card`` that may
    stand beside it: a ratio measured the same way (chapter 01's count, the same on every card, is no time)."""
    out = []
    for h in headlines(root):
        if h["number"] != 1 and any(n != card and r is not None for n, r in h["ratios"].items()):
            out.append(h["notebook"])
    part_one = part_one_line(root)
    if part_one and any(n != card and c != VOID for n, c in part_one["cells"].items()):
        out.append(part_one["notebook"])
    order = reading_order()
    return sorted(out, key=lambda nb: order.index(nb) if nb in order else len(order))


def gqa_elsewhere(root: Path = BENCH_RESULTS, card: str = SUMMARY_CARD) -> bool:
    """Whether a card other than ``card`` timed chapter 06's headline layout, Llama 3.1 8B's grouped-query heads
    (else it ran only the 32-head case, which is not the chapter's answer)."""
    return any(b["number"] == 6 and short_card(b["card"]) != card and "grouped-query" in b["ours"]
               and "missing" not in b for b in scoreboard(root))


def not_comparable_runs(root: Path = BENCH_RESULTS) -> dict[tuple[int, str], str]:
    """The chapters' runs on a card whose setup differs from the other card's, so that its numbers may not stand
    beside them (:func:`book.scoreboard.not_comparable`): (chapter number, the card's full name) -> why."""
    from book.scoreboard import not_comparable

    return not_comparable(scoreboard(root))


def left_out_words(card: str, why: str, others: list[str]) -> str:
    """The sentence that stands where a chapter's run on ``card`` (full name) is left out of the results page's
    tables because it is set up differently from the other cards' (``why``: :func:`not_comparable_runs`'s clause)."""
    short, rest = short_card(card), " and the ".join(short_card(o) for o in others) or "other card"
    return (f"Only the {rest}'s run is shown here: the {short}'s run of this chapter is set up differently (its "
            f"{why.removeprefix('its ')}), so its times would not stand beside the {rest}'s.")


#: At the top of chapters 07's and 08's folds: why their rows carry no spread, by chapter number.
LOOP_WORDS = {
    7: "These rows time whole decode loops on the wall clock, each a median over the JSON schemas of each schema's "
       "own median, so no spread of repeated runs stands beside it: the range of the schemas' own ratios is in the "
       "notes under the first table. The 1B and 8B cost models are synthetic (random weights in Llama's layer "
       "shapes, one layer's weights read by every layer) with a head of the cl100k vocabulary, chapter 01's, not "
       "Llama's own.",
    8: "These rows time whole decode loops on the wall clock, each a median over requests, so no spread of repeated "
       "runs stands beside it: the range of the requests' own ratios is in the notes under the first table. This "
       "run does not time the host's share apart.",
}

#: At the top of a chapter's fold, what its tables' labels leave to each card, by chapter number.
FOLD_WORDS = {
    6: "FlashInfer's back end and page size are the fastest of those the benchmark tries on each card, so they may "
       "differ between cards. The row against causal SDPA at prefix 2048 is the one case where the kernel loses.",
}


def multi_item_loss_row(card: Path, above: str) -> str:
    """Chapter 06's losing case (:func:`multi_item_loss`) as a row of the fold's table on ``card``, in the layout of
    ``above`` (the table's row against causal SDPA at another case, whose kernel it times): empty where the card has
    no such loss or the kernels differ."""
    loss = multi_item_loss(card)
    cells = [c.strip() for c in above.strip().strip("|").split("|")]
    if loss is None or len(cells) not in (6, 7):
        return ""
    ours, rival = loss["ours"], loss["rival"]

    def timed(r: dict[str, Any]) -> str:
        lo, _, hi = r["spread_ms"]
        return f"{us(r['ms'])} ({us(lo)}–{us(hi)})"

    # the case as the table words its other cases: the shape, then what the row above adds after its shape
    case = cells[-5]
    rest = case.split(", bf16", 1)[1] if ", bf16" in case else ""
    mine = spread(*ours["spread_ms"])
    theirs = spread(*rival["spread_ms"])
    ratio = f"**{loss['ratio']:.2f}×**{caveat(mine, theirs)}"
    host = us(ours["host_ms"]) if ours.get("host_ms") is not None else "–"
    new = [loss["case"] + (f", bf16{rest}" if rest else ""), ratio, timed(ours), timed(rival), host]
    return "| " + " | ".join(cells[:len(cells) - 5] + new) + " |"


def part_one_failed_rows(card: Path, above: str) -> list[str]:
    """Chapter 05 part 1's rows against GemLite at the shapes where GemLite fails our float64 check
    (:func:`part_one_answer`'s ``failed``), in the layout of ``above`` (a step 14 row against GemLite), with no ratio:
    ✗ and the error that fails the check stand in its place; empty without such shapes."""
    from studylog.plotting import Results
    from studylog.ternary.results import GEMLITE, fastest
    from studylog.ternary.steps import SERIES

    answer = part_one_answer(card)
    data = load(card, "ternary")
    cells = [c.strip() for c in above.strip().strip("|").split("|")]
    if not answer or data is None or len(cells) != 7:
        return []

    def timed(r: dict[str, Any]) -> str:
        lo, _, hi = r["spread_ms"]
        return f"{us(r['ms'])} ({us(lo)}–{us(hi)})"

    out = []
    for shape in answer["failed"]:
        peer = [r for r in rows(data, GEMLITE, shape=shape, m=1) if r["clock"] == "gpu"]
        best, _ = fastest(Results(None, data), [SERIES[PART_ONE_STEP]], shape=shape, m=1)
        t = answer["times"].get(shape)
        if len(peer) != 1 or best is None or t is None or t["error"] is None:
            continue
        n, k = shape.split("x")
        # no ratio against an output that fails the check (chapter 05's rule): both times as measured, and ✗
        ratio = (f"✗ GemLite fails our check ({t['error']:.2%} error, bound {t['tolerance']:.2%}): its time as "
                 "measured, no ratio")
        host = us(best["host_ms"]) if best.get("host_ms") is not None else "–"
        out.append("| " + " | ".join([cells[0], cells[1], f"M = 1, N x K = {n} x {k}, bf16 x", ratio, timed(best),
                                      timed(peer[0]), host]) + " |")
    return out


#: Under a chapter 04 table of a card whose file times the steps directly (no row of the entry point itself).
CTC_STEPS_WORDS = "On this card each row times the step the entry point picks at its case."


#: Chapter 03's two ports in the results page's folds, one label per rival (the scoreboard's words for step 4).
NGRAM_PORT_LABELS = {
    "our port of FastDeploy's first GPU n-gram kernel, two-phase (step 3)": "FastDeploy's first kernel, our port (step 3)",
    "our corrected port of FastDeploy's revised GPU n-gram kernel, made exact (step 4)":
        "FastDeploy's revised kernel, our corrected port (step 4)",
}


def headline_tables_markdown(root: Path = BENCH_RESULTS) -> str:
    """The results page's folded tables (:func:`book.site.headlines_page_markdown`), without the tables of a card
    whose run is not comparable with the other card's (:func:`not_comparable_runs`; a sentence at the top of the
    chapter's fold says which and why, :func:`left_out_words`) and without the cards' differences that would compare
    them; under a chapter 04 table whose file times the steps directly, a line that
    says so (:data:`CTC_STEPS_WORDS`)."""
    from book.site import headlines_page_markdown

    moved = not_comparable_runs(root)
    folders = {card_name(c): c for c in cards(root)}
    out: list[str] = []
    chapter, card, title = 0, "", ""
    header: list[str] = []
    weaker: list[tuple[int, str, str, str, dict[str, str]]] = []  # (chapter, card, ours, against, the row's cells)
    source = headlines_page_markdown().splitlines()
    for i, line in enumerate(source):
        m = re.match(r":::\{dropdown\} Chapter (\d+): (.+)", line)
        if m:  # titled as the table above titles its lines: "02. Masked LM head"
            chapter, title, card = int(m.group(1)), m.group(2), ""
            out += [f":::{{dropdown}} {chapter:02d}. {title}", ""]
            for (number, name), why in sorted(moved.items()):  # a card left out is said, not silently missing
                if number == chapter:
                    out += [left_out_words(name, why, [f for f in folders if (number, f) not in moved]), ""]
            bench = next((e.bench for e in ENTRIES if e.number == chapter), None)
            unrun = [short_card(f) for f, c in folders.items() if bench and load(c, bench) is None]
            if unrun:  # a card with no run of the chapter at all
                out += [f"The {' and the '.join(unrun)} {'has' if len(unrun) == 1 else 'have'} no run of this "
                        "chapter.", ""]
            if chapter in LOOP_WORDS:
                out += [LOOP_WORDS[chapter], ""]
            if chapter in FOLD_WORDS:
                out += [FOLD_WORDS[chapter], ""]
            continue
        elif line == ":::":
            chapter, card = 0, ""
        else:
            c = re.match(r"\*\*(NVIDIA [^*]+)\*\*, measured", line)
            if c:
                card = c.group(1)
        if (chapter, card) in moved and not line.startswith("<details>"):
            continue
        if line.startswith("<details><summary>Where the cards differ") and any(
                (chapter, name) in moved for name in folders):
            continue  # a difference from a run that is not comparable says nothing about the cards
        if line.startswith("| ") and i + 1 < len(source) and source[i + 1].startswith("|---"):
            header = [c.strip() for c in line.strip().strip("|").split("|")]
        labelled = weaker_label(chapter, line)
        if "(weaker: " in labelled and line.startswith("| "):  # kept for the last fold, out of the card's table
            cells = dict(zip(header, (c.strip() for c in labelled.strip().strip("|").split("|"))))
            weaker.append((chapter, short_card(card), cells.get("ours", "–"), cells.get("against", "–"), cells))
        else:
            out.append(labelled)
        if chapter == 3 and card in folders and line.startswith("**NVIDIA"):
            words = ngram_kernel_words(folders[card], folders)
            out += ["", words] if words else []
        last = i + 1 == len(source) or not source[i + 1].startswith("|")  # a table's last row
        if chapter == 3 and card in folders and line.startswith("| ") and last:  # the rows behind the range
            extra = ngram_range_table(folders[card])
            range_head = [c.strip() for c in (extra[2] if extra else "").strip().strip("|").split("|")]
            for row in [r for r in extra if "(weaker: " in r]:  # the untuned grid's rows: the last fold's
                cells = dict(zip(range_head, (c.strip() for c in row.strip().strip("|").split("|"))))
                cfg = next(k for k in ngram_ratios(folders[card]) if ngram_case_words(k) == cells["case"])
                mine = ngram_ratios(folders[card])[cfg][0]
                ours = ("the GPU drafter's entry point" + (f" (running step {int(mine['step'][4:])})"
                                                           if str(mine.get("step", "")).startswith("step") else "")
                        if mine.get("series") == "ngram_match" else
                        f"the GPU drafter (step {int(mine['series'][4:])})")
                weaker.append((chapter, short_card(card), ours, NGRAM_PORT_LABELS[NGRAM_PORT], cells))
            extra = [r for r in extra if "(weaker: " not in r]
            out += ["", *extra] if extra else []
        if (chapter == 5 and card in folders and line.startswith("| ") and "Triton" in line.split(" | ")[0]
                and "GemLite" in line and (last or "GemLite" not in source[i + 1])):
            out += part_one_failed_rows(folders[card], line)
        if chapter == 2 and "H200" in card and line.startswith("| ") and last:  # the kernel's strongest rival
            out += compiled_gather_table_rows()
        if chapter == 6 and card in folders and "| causal SDPA (superset) |" in line:
            extra = multi_item_loss_row(folders[card], line)
            out += [extra] if extra else []
        if (line.startswith("Ours: the fused CTC kernel (step") and card in folders
                and ctc_which(folders[card]) != "the entry point"):
            out += ["", CTC_STEPS_WORDS]
    out += weaker_fold(weaker)
    text = re.sub(r"(?:(?<=[\dNK])|(?<=slots)|(?<=slot)|(?<=items)|(?<=heads)) x (?=[\dNK])", " × ",
                  "\n".join(out))  # shapes read 4096 × 14336
    for long, short in NGRAM_PORT_LABELS.items():  # chapter 03's two rivals, one short label each on both cards
        text = text.replace(f"| {long} |", f"| {short} |")
    text = median_batch_rows(bitnet_first(tidy_tables(split_ternary(range_once(text)))), root)
    return "\n".join(re.sub(r"\n{3,}", "\n\n", text).splitlines())


#: Chapter 08's batch-8 rows whose speedup the results page reads as the chapter does: the median batch's own ratio
#: (:func:`book.speculate.lesson.median_pairing`), "the safer reading" than the ratio of the two medians.
MEDIAN_BATCH_WORKLOADS = ("extraction", "low_copy")


def speculate_median_batch(card: Path, workload: str = "extraction", batch: int = 8) -> dict[str, Any] | None:
    """Chapter 08's batch-``batch`` ``workload`` rows on ``card`` read as the chapter reads them: the median batch's
    own ratio (:func:`book.speculate.lesson.median_pairing`'s ``median_ratio``), with that batch's two times per
    output token (``ours_ms``, ``theirs_ms``: chapter 07's step 3 and the shipped step) so that the ratio is of the
    times shown, and how many batches (``n``); where no one batch holds the median (an even count, ``one_batch``
    False) the times are the two medians. None where the card has no such run."""
    from book.speculate import lesson
    from studylog.plotting import load_results
    from studylog.speculate.report import SHIPPED

    try:
        results = load_results("speculate", gpu=Path(card).name, root=Path(card).parent)
    except FileNotFoundError:
        return None
    pair = lesson.median_pairing(results, batch, workload)
    theirs = {r["params"]["request"]: r["ms"] for r in lesson._rows(results, batch, workload, "ch7_step03")}
    ours = {r["params"]["request"]: r["ms"] for r in lesson._rows(results, batch, workload, SHIPPED)}
    at = [n for n in sorted(set(theirs) & set(ours)) if math.isclose(theirs[n] / ours[n], pair["median_ratio"],
                                                                      rel_tol=1e-12)]
    if not theirs or not ours:
        return None
    if not at:  # an even count: the ratio is the mean of the two middle batches' own, so the times are the medians
        names = sorted(set(theirs) & set(ours))
        return {"ratio": pair["median_ratio"], "ours_ms": statistics.median(ours[n] for n in names),
                "theirs_ms": statistics.median(theirs[n] for n in names), "n": pair["n"],
                "ratio_of_medians": pair["ratio_of_medians"], "one_batch": False}
    return {"ratio": pair["median_ratio"], "ours_ms": ours[at[0]], "theirs_ms": theirs[at[0]], "n": pair["n"],
            "ratio_of_medians": pair["ratio_of_medians"], "one_batch": True}


def median_batch_rows(markdown: str, root: Path = BENCH_RESULTS) -> str:
    """Chapter 08's fold with each batch-8 row of :data:`MEDIAN_BATCH_WORKLOADS` read as the chapter reads it
    (:func:`speculate_median_batch`): the median batch's own ratio and that batch's two times, the case saying so."""
    folders = {card_name(c): c for c in cards(root)}
    out, chapter, card = [], 0, ""
    for line in markdown.splitlines():
        m = re.match(r":::\{dropdown\} (\d+)\. ", line)
        chapter = int(m.group(1)) if m else 0 if line == ":::" else chapter
        c = re.match(r"\*\*(NVIDIA [^*]+)\*\*, measured", line)
        card = c.group(1) if c else card
        cells = line.split(" | ")
        hit = next((w for w in MEDIAN_BATCH_WORKLOADS if chapter == 8 and len(cells) >= 4
                    and line.startswith(f"| SmolLM2-135M, {w.replace('_', '-')}, batch 8,")), None)
        found = speculate_median_batch(folders[card], hit) if hit and card in folders else None
        if found:
            which = (f"the median batch's own ratio, of its {found['n']} batches of 8 requests, each timed whole"
                     if found["one_batch"] else f"the median of its {found['n']} batches' own ratios (8 requests "
                     "each, timed whole), beside the median times")
            cells[0] = f"| SmolLM2-135M, {hit.replace('_', '-')}, batch 8, per output token, {which} (the chapter's reading)"
            cells[1:4] = [f"**{found['ratio']:.2f}×**", us(found["ours_ms"]), us(found["theirs_ms"])]
            line = " | ".join(cells) + (" |" if not cells[-1].endswith("|") else "")
        out.append(line)
    return "\n".join(out)


#: Chapter 03's rival in the rows behind its range (:func:`ngram_range_table`): our corrected port, step 4.
NGRAM_PORT = "our corrected port of FastDeploy's revised GPU n-gram kernel, made exact (step 4)"
#: The last fold of the results page's tables, its title and first words.
WEAKER_TITLE = "Weaker baselines"
WEAKER_WORDS = ("Rows against a weaker baseline than each line's rival, kept out of the cards' tables above: their "
                "ratios are larger, and they answer a smaller question.")


def weaker_fold(weaker: list[tuple[int, str, str, str, dict[str, str]]]) -> list[str]:
    """The rows against weaker baselines (:data:`WEAKER`, chapter 03's untuned grid), taken out of the cards' tables,
    as one fold at the end: chapter and card, both sides, the case, why the baseline is weaker, the speedup and both
    times; empty without such rows."""
    if not weaker:
        return []
    rows = []
    for chapter, card, ours, against, cells in weaker:
        ratio, why = re.match(r"(.*?) \(weaker: (.*)\)$", cells["speedup"]).groups()
        rows.append(f"| {chapter:02d}, {card} | {ours} | {against} | {cells.get('case', '–')} | {why} | {ratio} | "
                    f"{cells.get('ours (µs)', '–')} | {cells.get('theirs (µs)', '–')} |")
    return ["", f":::{{dropdown}} {WEAKER_TITLE}", "", WEAKER_WORDS, "",
            "| chapter, card | ours | against | case | why weaker | speedup | ours (µs) | theirs (µs) |",
            "|---|---|---|---|---|---|---|---|", *rows, "", ":::"]


def range_once(markdown: str) -> str:
    """Chapter 03's fold with each row said once on each card: a row of a card's first table that the table of every
    shape measured below it (:func:`ngram_range_table`) repeats (the same case, speedup and both times) is left
    out of the first, and a table left with no row goes, its header with it."""
    lines = markdown.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(":::{dropdown} 03. ")), None)
    if start is None:
        return markdown
    end = next(i for i in range(start + 1, len(lines)) if lines[i] == ":::")

    def key(cells: list[str]) -> tuple[str, ...]:
        return tuple(cells[-5:-1]) if len(cells) >= 7 else tuple(cells[:4])  # case, speedup, ours, theirs

    def cells_of(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    block, out, i = lines[start:end], [], 0
    cards_at = [k for k, ln in enumerate(block) if ln.startswith("**NVIDIA")] + [len(block)]
    keep = [True] * len(block)
    for a, b in zip(cards_at, cards_at[1:]):
        tables = [k for k in range(a, b - 1) if block[k].startswith("| ") and block[k + 1].startswith("|---")]
        for t, nxt in zip(tables, tables[1:]):  # a table, and the one after it on this card
            later = {key(cells_of(ln)) for ln in block[nxt + 2:b] if ln.startswith("| ")}
            rows = [k for k in range(t + 2, nxt) if block[k].startswith("| ")]
            dropped = [k for k in rows if len(cells_of(block[k])) >= 7 and key(cells_of(block[k])) in later]
            for k in dropped:
                keep[k] = False
            if dropped and len(dropped) == len(rows):  # nothing left: the header and its rule go too
                keep[t] = keep[t + 1] = False
    block = [ln for ln, k in zip(block, keep) if k]
    return "\n".join(lines[:start] + block + lines[end:])


def bitnet_first(markdown: str) -> str:
    """Chapter 05 part 2's fold with the rows its headline is read from, against BitNet's own kernel, first: that
    block (its sentence, the line naming both sides and its table) moves to the top of the fold, under its card's
    heading; the cuBLAS, GemLite and ``_int_mm`` rows follow, card by card."""
    lines = markdown.splitlines()
    top = next((i for i, ln in enumerate(lines) if ln.startswith(":::{dropdown} 05.") and "part 2" in ln), None)
    start = next((i for i, ln in enumerate(lines) if top is not None and i > top
                  and ln.startswith("Against BitNet's own W2A8 kernel")), None)
    if start is None:
        return markdown
    end = next((i for i in range(start + 1, len(lines)) if lines[i - 1].startswith("|") and not lines[i].startswith("|")),
               len(lines))
    heading = next((ln for ln in reversed(lines[top:start]) if ln.startswith("**NVIDIA ")), None)
    block = ([heading, ""] if heading else []) + lines[start:end] + [""]
    rest = lines[:start] + lines[end:]
    return "\n".join(rest[:top + 2] + block + rest[top + 2:])


#: The folds' weaker comparisons, labelled as the page's opening promises: (chapter, the rival's cell) -> why weaker.
WEAKER = {(2, "cuBLAS fp32 logits + masked_fill"): "dense fp32 logits, not xgrammar's path",
          (3, "our port of FastDeploy's first GPU n-gram kernel, two-phase (step 3)"): "the port's first version"}
#: Chapter 03's shapes where the port (step 4) runs one block a slot, not a tuned kernel: few slots, long prompts (the
#: chapter's own split, its "1 or 16 long slots").
NGRAM_UNTUNED = {"most_slots": 16, "least_tokens": 131072}


def weaker_label(chapter: int, line: str) -> str:
    """A fold's table row ``line`` of ``chapter`` against a weaker rival (:data:`WEAKER`), its speedup cell (the
    fourth) labelled "(weaker: why)"; any other line as it is."""
    cells = line.split(" | ")
    if not line.startswith("| ") or len(cells) < 5:
        return line
    why = WEAKER.get((chapter, cells[1]))
    if why is None:
        return line
    cells[3] += f" (weaker: {why})"
    return " | ".join(cells)


def _differences(line: str, keep: Callable[[str], bool]) -> str:
    """The "Where the cards differ" fold ``line`` (HTML) with only the rows ``keep`` takes; empty without any."""
    m = re.match(r"(<details><summary>Where the cards differ by more than [^(]*)\(\d+ rows?\)(</summary><table>"
                 r"<thead>.*?</thead><tbody>)(.*)(</tbody></table></details>)$", line)
    if not m:
        return line
    kept = [r for r in re.findall(r"<tr>.*?</tr>", m.group(3)) if keep(r)]
    if not kept:
        return ""
    return f"{m.group(1)}({len(kept)} row{'' if len(kept) == 1 else 's'}){m.group(2)}{''.join(kept)}{m.group(4)}"


def split_ternary(markdown: str) -> str:
    """Chapter 05's fold as two, one per part, as the table above lists them: part 1's rows (its Triton kernel)
    under each card's title in a fold of their own, part 2's (CUDA C++, BitNet's shapes) in the other."""
    lines = markdown.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(":::{dropdown} 05. ")), None)
    if start is None:
        return markdown
    end = next(i for i in range(start + 1, len(lines)) if lines[i] == ":::")
    title = lines[start].split(" ", 1)[1]
    one: list[str] = []
    two: list[str] = []
    card, header, carded = "", [], False
    block = lines[start + 1:end]
    i = 0
    while i < len(block):
        line = block[i]
        if line.startswith("**NVIDIA"):
            card, carded = line, False
            two.append(line)
        elif line.startswith("| ours |") and i + 1 < len(block):
            header = [line, block[i + 1]]
            two += header
            i += 1
        elif line.startswith("| ") and header and "Triton" in line.split(" | ")[0]:
            if not carded:
                one += ["", card, "", *header]
                carded = True
            one.append(line)
        elif line.startswith("<details><summary>Where the cards differ"):
            mine, theirs = (_differences(line, lambda r: "Triton" in r.split("</td>")[0]),
                            _differences(line, lambda r: "Triton" not in r.split("</td>")[0]))
            one += ["", mine] if mine else []
            two += [theirs] if theirs else []
        else:
            if not line.startswith("| "):
                header = header if line.strip() == "" and i + 1 < len(block) and block[i + 1].startswith("| ") \
                    else []
            two.append(line)
        i += 1
    if not one:
        return markdown
    why = ("Why a ratio can move between the two cards: [Two cards, one kernel](how_we_measure.md#two-cards-one-kernel) "
           "(a speedup carries over to another card only where both kernels are bound by the same thing).")
    folds = ([f":::{{dropdown}} {title}, part 1 (Triton)", "", why, *one, "", ":::", "",
              f":::{{dropdown}} {title}, part 2 (CUDA C++)", *two, ":::"])
    return "\n".join(lines[:start] + folds + lines[end + 1:])


#: The host column of a decode loop's table, named for what it holds there (the host's own work per output token).
LOOP_HOST_COLUMN = "host's own work per token (µs)"


def _movable(lines: list[str]) -> dict[tuple[int, int], set[str]]:
    """Per table of a fold, keyed by the fold (the index of its ``:::{dropdown}`` line, 0 outside any) and the table's
    place under its card's title (0 for the first), the "ours" and "against" columns that are the same in every row
    of that table on every card: only those move into a line, so that a fold's tables share one layout on both
    cards."""
    fold, place, seen, varies = 0, 0, {}, {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(":::{dropdown}"):
            fold, place = i, 0
        elif line.startswith("**NVIDIA"):
            place = 0
        if not (line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---")):
            i += 1
            continue
        head, body, i = read_table(lines, i)
        for k, name in enumerate(head):
            if name in ("ours", "against"):
                seen.setdefault((fold, place), set()).add(name)
                if len(body) < 2 or len({c[k] for c in body}) > 1:
                    varies.setdefault((fold, place), set()).add(name)
        place += 1
    return {f: names - varies.get(f, set()) for f, names in seen.items()}


def tidy_tables(markdown: str) -> str:
    """Each folded table read on its own: a column empty in every row ("–") is dropped; an "ours" or "against" column
    that is the same in every row of every table of its fold (:func:`_movable`) moves into one line above each table;
    in one that stays, a cell that repeats the row above reads "as above"; a decode loop's host column (chapter 07's)
    is named for what it holds."""
    lines, out, i = markdown.splitlines(), [], 0
    movable, fold, place = _movable(markdown.splitlines()), 0, 0
    while i < len(lines):
        if lines[i].startswith(":::{dropdown}"):
            fold, place = i, 0
        elif lines[i].startswith("**NVIDIA"):
            place = 0
        line = lines[i]
        if not (line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---")):
            out.append(line)
            i += 1
            continue
        head, body, i = read_table(lines, i)
        keep = [k for k in range(len(head)) if not body or any(c[k] != "–" for c in body)]
        said = []
        for k in list(keep):
            if head[k] in movable.get((fold, place), set()):
                said.append(f"{head[k]}: {body[0][k]}")
                keep.remove(k)
        for k in keep:
            if head[k] in ("ours", "against"):
                for above, c in zip(body[::-1][1:], body[::-1]):
                    if c[k] == above[k]:
                        c[k] = "as above"
        if said:
            words = "; ".join(said)
            while out and not out[-1].strip():
                out.pop()
            if out and out[-1].startswith(("Ours:", "Against:", "Every case:")):  # the line a table already has
                out[-1] = out[-1].rstrip(".") + "; " + words + "."
            else:
                out += ["", words[0].upper() + words[1:] + "."]
            out.append("")
        if "host per call (µs)" in head and out and "the host's own time per output token" in "\n".join(out[-3:]):
            head[head.index("host per call (µs)")] = LOOP_HOST_COLUMN
            for j in range(max(0, len(out) - 3), len(out)):
                out[j] = out[j].replace("host per call: here the host's own time per output token, the part of the "
                                        "step outside every timed GPU part",
                                        "the host's own work per token is the part of the step outside every timed "
                                        "GPU part")
        out.append("| " + " | ".join(head[k] for k in keep) + " |")
        out.append("|" + "---|" * len(keep))
        out += ["| " + " | ".join(c[k] for k in keep) + " |" for c in body]
        place += 1
    return "\n".join(out)


#: A folded block of a page's Markdown: a MyST dropdown or an HTML ``<details>``; a reader opens it on demand.
_FOLDED = re.compile(r"^:::\{dropdown\}.*?^:::[ \t]*$|<details>.*?</details>", re.S | re.M)
#: A Markdown table's rule line (``|---|---|``): one per table.
_TABLE_RULE = re.compile(r"^\s*\|(\s*:?-{3,}:?\s*\|)+\s*$", re.M)


def _tags(cell: dict[str, Any]) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def unfolded_prose_words(notebook: str | Path, root: Path = REPO_ROOT) -> int:
    """Words of prose a page shows unfolded: :func:`book.common.prose_words`' count (Markdown cells and the text of
    ``say`` calls), less what sits in a dropdown or a ``<details>`` block."""
    import json

    from book.common import prose_text, said_texts

    path = Path(root) / notebook
    count = 0
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            text = source
        elif cell["cell_type"] == "code" and not {"remove-output", "remove-cell"} & _tags(cell):
            text = "\n".join(said_texts(source))
        else:
            continue
        count += len(re.findall(r"[^\W_](?:[\w'’.,-]*[^\W_])?", prose_text(_FOLDED.sub(" ", text))))
    return count


def table_count(notebook: str | Path, root: Path = REPO_ROOT) -> int:
    """Tables a page shows unfolded: those written in its Markdown cells, and each ``say``, ``Markdown`` or
    ``display`` call of a cell whose output is shown that draws one (its argument calls a function named for a table,
    or holds a Markdown table's rule line)."""
    import json

    path = Path(root) / notebook
    count = 0
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            count += len(_TABLE_RULE.findall(_FOLDED.sub(" ", source)))
            continue
        if cell["cell_type"] != "code" or {"remove-output", "remove-cell", "hide-output"} & _tags(cell):
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        drawn: set[int] = set()  # each table once, however many wrappers (display(Markdown(...))) it sits in
        # names the cell binds to what a function named for tables returns (steps_first, steps_second = ...tables())
        bound = {t.id for a in ast.walk(tree) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                 and "table" in str(getattr(a.value.func, "id", getattr(a.value.func, "attr", "")))
                 for target in a.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("say", "Markdown", "display")):
                continue
            drawn |= {id(n) for arg in node.args for n in ast.walk(arg)
                      if (isinstance(n, ast.Call) and "table" in str(getattr(n.func, "id", getattr(n.func, "attr", ""))))
                      or (isinstance(n, ast.Name) and n.id in bound)
                      or (isinstance(n, ast.Constant) and isinstance(n.value, str)
                          and _TABLE_RULE.search(_FOLDED.sub(" ", n.value)))}
            # a table the cell builds line by line (its rule line a string in the cell), shown by name or joined
            if (not any(True for arg in node.args for n in ast.walk(arg) if id(n) in drawn) and node.args
                    and re.search(r"-{3}\s*\|", source)
                    and (isinstance(node.args[0], ast.Name) or "join" in ast.unparse(node.args[0]))):
                drawn.add(id(node))
        count += len(drawn)
    return count


#: The calls that print a listing or a diff on a page (``studylog.source``'s, ``book.common.step_diff`` and the chapters'
#: lesson functions that return a diff of a step's core or its device code).
LISTING_CALLS = ("show_source", "show_diff", "step_diff", "core_diff", "device_diff")


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any((isinstance(n, ast.Name) and n.id in names) or (isinstance(n, ast.Attribute) and n.attr in names)
               for n in ast.walk(node))


def listing_lines(notebook: str | Path, root: Path = REPO_ROOT, folded: bool | None = None) -> tuple[int, list[str]]:
    """Lines of the kernel listings and diffs a notebook prints, folded or not, counted without running its
    measurements: its imports, its helper functions and its assignments that call nothing (``CHAPTER = mlh.CHAPTER``,
    a table of names) are run, then
    every statement of a shown code cell that prints a listing, with ``studylog.source``'s two listing functions
    counting the lines of what they return. ``folded``: count only the listings of cells whose output the page
    folds (tag ``hide-output``: a reader opens them on demand), or only the others; None counts both. Returns the
    count and the statements that could not be run this way (none is expected: a test checks)."""
    path = Path(root) / notebook
    shown, hidden, failed = _listing_counts(str(path), path.stat().st_mtime_ns)
    return (shown + hidden if folded is None else hidden if folded else shown), list(failed)


@functools.lru_cache(maxsize=None)
def _listing_counts(path: str, mtime_ns: int) -> tuple[int, int, tuple[str, ...]]:
    """(shown, folded, failed) of :func:`listing_lines` for the notebook at ``path``, counted once per version of
    the file (``mtime_ns``): the landing page and its tests ask for both counts of every page."""
    import json

    from studylog import source

    counted: list[int] = []
    originals = {name: getattr(source, name) for name in ("show_source", "show_diff")}

    def counting(fn):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            counted.append(len(out.lines) if hasattr(out, "lines") else len(out.text.splitlines()))
            return out
        return wrapped

    failed: list[str] = []
    from IPython.utils.capture import capture_output

    # nothing counted is shown: display() is a no-op here, and what a helper displays by itself is captured
    namespace: dict[str, Any] = {"__name__": "listing_lines", "display": lambda *args, **kwargs: None}
    cells = [c for c in json.loads(Path(path).read_text())["cells"] if c["cell_type"] == "code"]
    # a cell's listing is on the page unless its output is removed (its code may be hidden, as most listings' are)
    trees = [(ast.parse("".join(c["source"])), not {"remove-output", "remove-cell"} & set(
        c.get("metadata", {}).get("tags", [])), "hide-output" in c.get("metadata", {}).get("tags", [])) for c in cells]
    counts = {False: 0, True: 0}
    helpers = {node.name for tree, _, _ in trees for node in tree.body
               if isinstance(node, ast.FunctionDef) and _mentions(node, set(LISTING_CALLS))}
    for name, fn in originals.items():
        setattr(source, name, counting(fn))
    try:
        with capture_output():  # stdout, stderr and rich outputs alike
            for tree, shown, folded_here in trees:
                for stmt in tree.body:
                    setup = (isinstance(stmt, (ast.Import, ast.ImportFrom))
                             or isinstance(stmt, ast.FunctionDef)
                             or (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                                 and isinstance(stmt.targets[0], ast.Name)
                                 and not any(isinstance(n, ast.Call) for n in ast.walk(stmt.value))))
                    prints = shown and _mentions(stmt, set(LISTING_CALLS) | helpers)
                    if not (setup or prints):
                        continue
                    before = len(counted)
                    try:
                        exec(compile(ast.Module([stmt], []), path, "exec"), namespace)
                    except Exception as e:  # noqa: BLE001 - reported, and a test fails on it
                        if prints:  # a setup line that fails matters only where a listing then fails too
                            failed.append(f"{ast.unparse(stmt)[:80]}: {e!r}")
                    counts[folded_here] += sum(counted[before:])
    finally:
        for name, fn in originals.items():
            setattr(source, name, fn)
    return counts[False], counts[True], tuple(failed)


#: Calls whose value a cell shows that are no listing: prose, tables, figures, printed lines, an exercise's check.
_NOT_A_LISTING = re.compile(r"^(say|print|Markdown|HTML|display|plt\.\w+|\w+\.check_\w+|\w*figure\w*|\w*table\w*)$")


def _call_name(node: ast.AST) -> str:
    return ast.unparse(node.func) if isinstance(node, ast.Call) else ""


def _shows_listing(node: ast.AST, helpers: set[str]) -> bool:
    """Whether a call shows a listing: ``display`` of something that is no Markdown, HTML or figure, or a call of a
    notebook's own function that does."""
    name = _call_name(node)
    if name == "display" and node.args:
        arg = node.args[0]
        return not re.match(r"^(Markdown|HTML)$", _call_name(arg)) and "fig" not in ast.unparse(arg)
    return name in helpers


def _walk_outside_defs(tree: ast.AST):
    """The nodes of ``tree`` outside its function definitions (a function's body runs where it is called)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield node
        yield from _walk_outside_defs(node)


def listing_blocks(notebook: str | Path, root: Path = REPO_ROOT, folded: bool = False) -> int:
    """How many listings and diffs a page shows, read from its cells without running them: each ``display`` of
    something that is no Markdown, HTML or figure, each call of the notebook's own function that displays one, and
    each cell whose last line's value is a listing (a call that is no prose, table, figure or check), in the cells
    whose output the page shows (``folded``: only those it folds, tag ``hide-output``; else only the others);
    unfolded, with each code cell whose code the page shows and that shows no listing (a reader reads that code as
    one). The exercises, which come on top, are left out."""
    import json

    cells = json.loads((Path(root) / notebook).read_text())["cells"]
    trees: list[tuple[dict[str, Any], ast.AST | None, bool]] = []
    exercises = False
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            for line in source.splitlines():
                if line.startswith("## "):
                    exercises = line.startswith("## Exercises")
            continue
        try:
            tree = ast.parse(source) if cell["cell_type"] == "code" else None
        except SyntaxError:
            tree = None
        trees.append((cell, tree, exercises))
    helpers = {node.name for _, tree, _ in trees if tree is not None for node in tree.body
               if isinstance(node, ast.FunctionDef) and any(_shows_listing(n, set()) for n in ast.walk(node))}
    count = 0
    for cell, tree, in_exercises in trees:
        tags = _tags(cell)
        if tree is None or in_exercises or "remove-cell" in tags or not "".join(cell["source"]).strip():
            continue
        blocks = 0
        if "remove-output" not in tags and ("hide-output" in tags) == folded:
            blocks += sum(1 for n in _walk_outside_defs(tree) if isinstance(n, ast.Call) and _shows_listing(n, helpers))
            last = tree.body[-1] if tree.body else None
            name = _call_name(last.value) if isinstance(last, ast.Expr) else ""
            if name and name not in helpers and not (_NOT_A_LISTING.match(name)
                                                     or _NOT_A_LISTING.match(name.split(".")[-1])):
                blocks += 1
        code_shown = not folded and not {"remove-input", "hide-input"} & tags
        count += blocks or int(code_shown)
    return count


def reading_minutes(notebook: str | Path, root: Path = REPO_ROOT) -> tuple[int, int]:
    """Minutes a page takes to read, rounded up: its unfolded prose (:func:`unfolded_prose_words`) at
    :data:`WORDS_PER_MINUTE`, then that plus :data:`LISTING_MINUTES` for each listing, diff or code cell it shows
    unfolded (:func:`listing_blocks`) and :data:`TABLE_MINUTES` for each table (:func:`table_count`). What is folded
    comes on top (:func:`folded_minutes`); running the code and the exercises take longer."""
    prose = unfolded_prose_words(notebook, root) / WORDS_PER_MINUTE
    blocks = listing_blocks(notebook, root) * LISTING_MINUTES + table_count(notebook, root) * TABLE_MINUTES
    return max(1, math.ceil(prose)), max(1, math.ceil(prose + blocks))


def folded_minutes(notebook: str | Path, root: Path = REPO_ROOT) -> int:
    """Minutes of the listings a page folds (a reader opens them on demand), at :data:`LISTING_MINUTES` each."""
    return math.ceil(listing_blocks(notebook, root, folded=True) * LISTING_MINUTES)


#: What a lesson that is no chapter's headline page is for, by notebook (the reading path's question column).
OTHER_PAGES = {
    "notebooks/00_how_to_read.ipynb": "How fast can this card launch a kernel and copy memory?",
    "notebooks/05_ternary_1_triton.ipynb": "Can a Triton kernel for weights in {-1, 0, +1} keep up with GemLite, "
                                           "a Triton library of low-bit matmuls? (part 1 of 2)",
}


def bitnet_range(card: Path) -> tuple[float, float, int] | None:
    """Chapter 05's one-row W2A8 kernel (step 23) against BitNet's W2A8 kernel on ``card`` (the run the chapter reads):
    (lowest, highest ratio, how many shapes), or None where the card has no such run."""
    from book.scoreboard import bitnet_run
    from book.ternary import results as ternary
    from studylog.plotting import Results

    data = bitnet_run(Path(card).name)
    table = ternary.bitnet_table(Results(None, data)) if data is not None else None
    return (table["worst"], table["best"], len(table["rows"])) if table else None


NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine",
                10: "ten"}


def bitnet_tie_words(card: Path) -> tuple[str, str] | None:
    """Chapter 05 part 2's range over BitNet's shapes said so that a tie (a ratio within :data:`TIE_WITHIN` of 1) is
    not the low end of a win: ("a tie (1.03×) at one shape, faster at the other nine (up to 2.62×)", the shapes of
    the ties, "4800 × 3200"); None where the card has no such run or no shape ties (the plain range then)."""
    from book.scoreboard import bitnet_run
    from book.ternary import results as ternary
    from studylog.plotting import Results

    data = bitnet_run(Path(card).name)
    table = ternary.bitnet_table(Results(None, data)) if data is not None else None
    if not table:
        return None
    ratios = {shape: peer / ours for shape, peer, ours, _, _ in table["rows"]}
    ties = [k for k, x in ratios.items() if abs(x - 1) < TIE_WITHIN]
    won = [x for k, x in ratios.items() if k not in ties and x > 1]
    if not ties or len(won) + len(ties) != len(ratios):
        return None
    n, m = len(ties), len(won)
    tie = (f"a tie ({ratios[ties[0]]:.2f}×) at one shape" if n == 1 else
           f"a tie ({min(ratios[k] for k in ties):.2f}–{max(ratios[k] for k in ties):.2f}×) at "
           f"{NUMBER_WORDS.get(n, n)} shapes")
    return (f"{tie}, faster at the other {NUMBER_WORDS.get(m, m)} (up to {max(won):.2f}×)",
            " and ".join(k.replace("x", " × ") for k in ties))


def bitnet_rows(card: Path) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """Chapter 05's one-row W2A8 kernel (step 23) against BitNet's W2A8 kernel on ``card`` at every shape of
    :func:`book.ternary.results.bitnet_table`, as the folded tables list them: (our step's label, the case, our row,
    BitNet's row), both on the GPU clock with their spreads; empty where the card has no such run."""
    from book.scoreboard import bitnet_run
    from book.ternary import results as ternary
    from studylog.plotting import Results
    from studylog.ternary.results import BITNET
    from studylog.ternary.steps import STEPS

    data = bitnet_run(Path(card).name)
    table = ternary.bitnet_table(Results(None, data)) if data is not None else None
    out = []
    for shape, _, _, series, _ in (table or {}).get("rows", []):
        ours = [r for r in rows(data, series, shape=shape, m=1) if r["clock"] == "gpu"]
        rival = [r for r in rows(data, BITNET, shape=shape, m=1) if r["clock"] == "gpu"]
        if len(ours) == 1 and len(rival) == 1:
            n, k = shape.split("x")
            name = next(s.name for s in STEPS if s.series == series)
            out.append((f"{name} (CUDA C++)", f"M = 1, N x K = {n} x {k}", ours[0], rival[0]))
    return out


def eager_words(eager: dict[str, dict[str, float]], shapes: int) -> str:
    """Part 1's eager clause (:func:`part_one_answer`'s ``eager``: per shape GemLite's eager time over ours,
    ``ratio``, and GemLite's host time per call): where ours stays ahead, one call at a time. Empty without host
    times."""
    if len(eager) != shapes:
        return ""
    slower = sum(1 for e in eager.values() if e["ratio"] < 1)
    hosts = [e["rival_host_ms"] for e in eager.values()]
    said = (f"ours stays ahead at all {shapes} shapes" if not slower
            else f"ours is the slower at {slower} of the {shapes} shapes")
    return f"{said} (GemLite's host time {us(min(hosts))}–{us(max(hosts))} µs a call)"


def other_answers(root: Path = BENCH_RESULTS, card: str = "H200", *, eager: bool = True) -> dict[str, str]:
    """The landing page's one number for the pages that are no chapter's headline, on ``card``: chapter 00's two
    ceilings (the empty kernel and the copy bandwidth of the card's environment run) and part 1 of chapter 05's
    answer (:func:`part_one_answer`): its fastest Triton step against GemLite where GemLite passes our check, a
    loss shown as a loss (cuBLAS bf16, a weaker baseline, stays in the chapter), with its eager-call clause
    (:func:`eager_words`) unless ``eager`` is false (:func:`other_eager` gives it alone)."""
    folder = next((c for c in cards(root) if short_card(card_name(c)) == card), None)
    out: dict[str, str] = {}
    env = load(folder, "env") if folder else None
    c = env.get("ceilings", {}) if env else {}
    if "empty_launch_gpu_ms" in c and "copy_bandwidth_gbs" in c:  # an older card's run may lack the GPU-clock one
        from book.scoreboard import empty_kernel_ms

        # the empty kernel the kernel chapters' floors use, each measured in its chapter's run
        own = [t * 1e3 for run in KERNEL_RUNS if (d := load(folder, run)) and (t := empty_kernel_ms(d)) is not None]
        here = c["empty_launch_gpu_ms"] * 1e3
        low, top = (min(own), max(own)) if own else (here, here)
        span = f"{low:.2f}–{top:.2f}" if f"{low:.2f}" != f"{top:.2f}" else f"{low:.2f}"
        out["notebooks/00_how_to_read.ipynb"] = (f"an empty kernel {span} µs in the chapters' runs; copies at "
                                                 f"{c['copy_bandwidth_gbs'] / 1e3:.2f} TB/s (read + write)")
    part_one = part_one_answer(folder) if folder else None
    if part_one:
        r = part_one["ratios"]
        clause = eager_words(part_one["eager"], len(r)) if eager else ""
        # one range and one clause: the shapes where GemLite fails the check, and its wins there, are the results
        # page's notes
        # a shape where GemLite fails our check yet is faster: counted in brackets, its times on the results page
        faster = [k for k in part_one.get("failed_faster", []) if k in part_one["times"]]
        t = part_one["times"]
        # another card's loss at a shape is the results page's (its fold of that card), not the landing's cell
        said = [f"{t[k]['rival_ms'] / t[k]['ms']:.2f}× at {k.replace('x', ' × ')}, where GemLite misses our error "
                f"bound on the {card}" for k in faster]
        out["notebooks/05_ternary_1_triton.ipynb"] = (
            f"{min(r.values()):.2f}–{max(r.values()):.2f}× at "
            + (f"{len(r)} shapes" if faster or not part_one["failed"] else
               f"the {len(r)} shapes where GemLite passes our check") + (" (" + "; ".join(said) + ")" if said else "")
            + (f"; called eagerly, {clause}" if clause else ""))
    return out


def all_shapes_range(answer: dict[str, Any]) -> str:
    """Part 1's range against GemLite at every shape of :func:`part_one_answer`'s ``answer``, those where GemLite
    fails our check included ("0.98–1.64×")."""
    every = [v["rival_ms"] / v["ms"] for v in answer["times"].values()]
    return f"{min(every):.2f}–{max(every):.2f}×"


def other_eager(root: Path = BENCH_RESULTS, card: str = "H200") -> dict[str, str]:
    """The eager-call clause of the pages :func:`other_answers` covers, where one has it (part 1 of chapter 05)."""
    folder = next((c for c in cards(root) if short_card(card_name(c)) == card), None)
    part_one = part_one_answer(folder) if folder else None
    clause = eager_words(part_one["eager"], len(part_one["ratios"])) if part_one else ""
    return {"notebooks/05_ternary_1_triton.ipynb": clause} if clause else {}


def reading_order(root: Path = REPO_ROOT) -> list[str]:
    """The lessons in the book's order (``_toc.yml``): a chapter added to the book joins the reading path."""
    import yaml

    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text())
    files = [c["file"] for part in toc.get("parts", [toc]) for c in part.get("chapters", [])]
    return [f"{f}.ipynb" for f in files if f.startswith("notebooks/")]


#: A short route through the course for a reader with an afternoon: the conventions, the simplest kernel, then the
#: longest chain of dependent work (notebooks, in reading order).
SHORT_ROUTE = ("notebooks/00_how_to_read.ipynb", "notebooks/02_masked_lm_head.ipynb", "notebooks/04_ctc_loss.ipynb")


def page_titles(root: Path = BENCH_RESULTS) -> dict[str, str]:
    """Each lesson's name as the landing table and the chapter cards give it, by notebook: its number and the
    chapter's short title (``05. Ternary matmul (Triton)`` for a chapter in two parts)."""
    by_number = {e.number: e.title for e in ENTRIES}
    out = {}
    for notebook in reading_order():
        stem = Path(notebook).stem
        title = f"{stem[:2]}. " + by_number.get(int(stem[:2]), "How to read this course")
        if stem.startswith("05_"):
            title += " (Triton)" if "triton" in stem else " (CUDA C++)"
        out[notebook] = title
    return out


#: What a call made eagerly costs, said once under the landing table and above the results table.
EAGER_WORDS = ("Called eagerly, one call at a time from Python, a call takes the longer of its GPU time and its *host "
               "time* (the time the CPU spends issuing it).")


def eager_headlines(root: Path = BENCH_RESULTS, card: str = "H200") -> tuple[list[str], list[str]]:
    """The pages whose headline's calls wait on the host on ``card`` (host time over GPU time), as the landing names
    them ("03", "05 part 2"): those whose answer holds when called eagerly, one call at a time, and those where the
    rival is then the faster."""
    holds: list[str] = []
    changes: list[str] = []
    eager = {h["notebook"]: h["eager"].get(card) for h in headlines(root)} | other_eager(root, card)
    titles = page_titles(root)
    for notebook in reading_order():
        said = eager.get(notebook)
        if not said:
            continue
        chapter = titles[notebook].split(". ")[0] + (" part 2" if "05_ternary_2" in notebook else
                                                     " part 1" if "05_ternary_1" in notebook else "")
        (changes if "faster" in said and "stays" not in said else holds).append(chapter)
    return holds, changes


def host_bound_counts(root: Path = BENCH_RESULTS) -> tuple[int, int, str] | None:
    """The page's comparisons whose call waits on the host (the rows of :func:`host_bound_markdown`'s fold): how many,
    how many of them ours loses called eagerly, and the chapters those losses are in ("in chapters 03 and 05"); None
    where none waits."""
    found = host_bound_markdown(root, counts=True)
    return (found[0], found[3], found[4]) if found else None


def eager_sentence(root: Path = BENCH_RESULTS, card: str = "H200") -> str:
    """For the foot of the results page: what host time is, what it means for a kernel that runs in less time than
    its call takes to issue (how many of the page's comparisons are such, :func:`host_bound_counts`), where the
    losses are said (each chapter's line, :func:`host_bound_by_chapter`), and which headlines change and which hold
    called eagerly, one call at a time (chapter 05 part 2's through its plan, where only the plan holds)."""
    holds, changes = eager_headlines(root, card)
    if not holds and not changes:
        return ""
    out = EAGER_WORDS
    if changes:
        out += (f" Called that way on the {card}, the lead of chapter " + " and ".join(changes)
                + " over its rival is lost, as its line says.")
    if holds:
        eager = _bitnet_eager_card(root, card)
        planned = "05 part 2" in holds and plan_holds(eager)
        out += (" Chapter" + ("s " if len(holds) > 1 else " ") + (", ".join(holds[:-1]) + " and " if len(holds) > 1
                                                                  else "") + holds[-1]
                + f" have calls that take longer to issue than to run; called that way on the {card}, each still "
                "leads its rival")
        if planned:
            n, of = eager["slower_eager"], len(eager["rows"])
            at = f"all {of}" if n == of else f"{n} of its {of}"
            out += (", chapter 05 part 2 only through its plan object, `W2A8Plan`: its plain function, which checks "
                    f"its inputs on every call, loses at {at} shapes.")
        else:
            out += "."
    slim = _ngram_called_vs_loop(card)
    if slim is not None:
        (b, t), ratio = slim
        out += (f" And chapter 03's `ngram_match`, called as a reader calls it and timed end to end, is only "
                f"{ratio:.2f}× the CPU loop it replaces at {b} × {t:,}.")
    if holds:
        out += " Every comparison on this page whose call waits on the host, chapter by chapter:"
    return out


def _bitnet_eager_card(root: Path = BENCH_RESULTS, card: str = "H200") -> dict[str, Any] | None:
    """:func:`bitnet_eager` on the card named ``card`` ("H200"); None where it has no such run."""
    folder = next((c for c in cards(root) if short_card(card_name(c)) == card), None)
    return bitnet_eager(folder) if folder else None


def _ngram_called_vs_loop(card: str = "H200") -> tuple[tuple[int, int], float] | None:
    """Chapter 03's public call as a reader makes it (checks and scratch included), end to end, against the CPU loop
    it replaces, at the case where its margin is smallest: ((batch, prompt length), the loop's time over the call's),
    from the chapter's separate end-to-end run (``book.ngram.lesson.entry_end_to_end``); None without that run."""
    from book.ngram import lesson

    rows = lesson.entry_end_to_end(f"nvidia-{card.lower()}")
    if not rows:
        return None
    # rounded to 0.1 µs first, as the chapter's table prints them, so the ratio is the chapter's
    ratios = {case[:2]: round(v["cpu_path"]["ms"] * 1e3, 1) / round(v["ngram_match"]["ms"] * 1e3, 1)
              for case, v in rows.items() if "cpu_path" in v and "ngram_match" in v}
    return min(ratios.items(), key=lambda kv: kv[1]) if ratios else None


def _bitnet_planned(root: Path = BENCH_RESULTS, card: str = "H200") -> bool:
    """Whether chapter 05 part 2's lead over BitNet's kernel holds called eagerly only through step 23's plan on
    ``card`` (:func:`bitnet_eager`: the plain function slower at some shape, the plan at none)."""
    return plan_holds(_bitnet_eager_card(root, card))


def reading_path_markdown(root: Path = BENCH_RESULTS, link: Callable[[str], str] | None = None,
                          card: str = "H200") -> str:
    """The landing page's table: each page in reading order with its question, one answer (the fair headline on
    ``card`` as one ratio or range and one clause; :func:`other_answers` for the pages that are no headline), whose
    code the answer is measured against (:data:`RIVALS`: a library's, a published kernel or the course's own) and
    its reading time, of the prose and with code and listings. Each cell is one short clause: its caveats are the
    results page's notes and the chapter's. Under it, one sentence says whose answer holds or changes called
    eagerly, no CUDA graph (:func:`eager_headlines`: the chapters the results page's eager paragraph names; a changed
    answer says so in its own cell), and the other card's chapters, and points to the results page; then the whole
    course's time and a short route's (:data:`SHORT_ROUTE`)."""
    link = link or (lambda nb: nb)
    by_notebook = {h["notebook"]: h for h in headlines(root)}
    lines = ["| page | the question | the answer | against | what it buys a whole step | reading time |",
             "|---|---|---|---|---|---|"]
    buys = step_payoffs(root, "nvidia-" + card.lower())
    others = other_answers(root, card, eager=False)
    titles = page_titles(root)
    peer = fsm_peer_words(fsm_peers())
    minutes = {}
    for notebook in reading_order():
        stem = Path(notebook).stem
        h = by_notebook.get(notebook)
        number = h["answer"].get(card, "–") if h else others.get(notebook, "–")
        question = OTHER_PAGES.get(notebook) or (h["question"] if h else "–")
        rival = RIVALS.get("5t" if stem.startswith("05_") and "triton" in stem else int(stem[:2]), "–")
        if stem.startswith("04_"):  # torch's faster path: cuDNN, and where the kernel clock found its native path faster
            rival = ctc_rival_words(_card(root, card), native_cases=False)
        if stem.startswith("05_ternary_2") and _bitnet_planned(root, card):  # eager, only the plan keeps the lead
            number += ", in a CUDA graph or with its per-layer plan"
        if stem.startswith("05_ternary_1"):  # the other card's lowest ratio where it is below 1, in a short note
            other = next((c for c in cards(root) if short_card(card_name(c)) != card), None)
            low = part_one_answer(other) if other else None
            if low and min(low["ratios"].values()) < 1:
                at, x = min(low["ratios"].items(), key=lambda kv: kv[1])
                tie = " (a tie)" if is_tie(x) else ""
                tie = ", a tie" if tie else ""
                number += f" (on the {short_card(card_name(other))}, {x:.2f}× at {at.replace('x', ' × ')}{tie})"
        if stem.startswith("01_"):  # the strongest peer saves more than ours: one like-for-like pair, on the suite
            suite = fsm_suite()
            saved = suite["default"]["saved"] if suite is not None else None
            rival = (peer_bare(peer) + " of passes on the suite"
                     + (f" against our exact jumps' {saved['token']:.1%} (we lose; ours keeps the model's own tokens)"
                        if saved else "") if peer else "decoding every token")
            if peer and fsm_passes_pair():  # the answer gives both pairs in one metric: the rival named alone
                rival = "llguidance's fast-forward tokens (ours keeps the model's own tokens)"
        title = titles[notebook]
        _, minutes[notebook] = reading_minutes(notebook)
        lines.append(f"| [{title}]({link(notebook)}) | {question} | {number} | {rival} | {buys.get(notebook, '–')} | "
                     f"{rounded_minutes(minutes[notebook])} min |")
    # under the table, one sentence: what a call made eagerly does to the answers whose calls wait on the host (the
    # chapters the results page's eager paragraph names), the other card's chapters, and a link; chapter 03's
    # pricing, the plan object and the other card's shapes are the chapters' and the results page's
    holds, changes = eager_headlines(root, card)
    said = []

    def chapters(names: list[str]) -> list[str]:  # "05 part 1" and "05 part 2" said once, as "05"
        out = []
        for n in (x.split(" part ")[0] for x in names):
            if n not in out:
                out.append(n)
        return out

    def listed(xs: list[str]) -> str:
        return ", ".join(xs[:-1]) + (" and " if len(xs) > 1 else "") + xs[-1]

    if changes:
        said.append(f"Called one at a time without a CUDA graph on the {card}, the answer of chapter "
                    + " and ".join(changes) + " changes, as its cell says; the others hold.")
    # where every answer holds called eagerly, the results page says so (05 part 2's plan is in its own cell)
    also = [titles[n].split(". ")[0] for n in also_timed(root, card)]
    board = scoreboard(root)
    llama = [b for b in board if b["number"] == 5 and b.get("ternary_case") == "llama" and "missing" not in b
             and short_card(b["card"]) != card and b.get("vs_rival") is not None]
    if llama:  # part 2's kernel ran on the other card too, at a Llama shape: chapter 05 is named once either way
        also.append("05")
    parts = [titles[n].split(". ")[0] for n in also_timed(root, card) if "05_ternary_1" in n]
    also = sorted(chapters(also))
    named = []  # what the other card ran, where that is not the chapter's headline: said, so no reader assumes it
    for n in also:
        if n == "05" and parts:
            named.append("05 part 1" + (" (with part 2's kernel at a Llama shape)" if llama else ""))
        elif n == "05":
            named.append("05 part 2's kernel at a Llama shape")
        elif n == "06" and not gqa_elsewhere(root, card):
            named.append("06's 32-head case (not its grouped-query headline)")
        else:
            named.append(n)
    if also:
        said.append(f"The H100 also ran {listed(named)}; the [headline results](results.md) give both cards for "
                    "those.")
    elif said:
        said.append("The [headline results](results.md) give each answer's caveats.")
    if said:
        lines += ["", " ".join(said)]
    lines += ["", reading_path_words()]
    return "\n".join(lines)


def rounded_minutes(m: int) -> int:
    """A reading time as the landing page gives it: to the nearest 5 minutes under an hour, else the nearest 10 (a
    count to the minute reads more precise than a reading pace is)."""
    step = 5 if m < 60 else 10
    return max(step, step * round(m / step))


def hours(m: int, exact: bool = False) -> str:
    """Minutes as the landing page writes a reading time, rounded (:func:`rounded_minutes`) unless ``exact`` (a sum of
    times already rounded): "4 h 30 min", or "50 min" under an hour."""
    m = m if exact else rounded_minutes(m)
    return (f"{m // 60} h" + (f" {m % 60} min" if m % 60 else "")) if m >= 60 else f"{m} min"


def exercise_count(notebook: str | Path, root: Path = REPO_ROOT) -> int:
    """How many exercises a page sets: the bold numbered titles ("**1. ...**") under its "## Exercises" heading, and
    one for a heading "## Exercise: ..." (chapter 00's single exercise)."""
    import json

    count, inside = 0, False
    for cell in json.loads((Path(root) / notebook).read_text())["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for line in "".join(cell["source"]).splitlines():
            if line.startswith("## Exercise:"):  # a page with one exercise, under a heading of its own (chapter 00)
                count += 1
            if line.startswith("## "):
                inside = line.startswith("## Exercises")
            elif inside and re.match(r"\*\*\d+\. ", line):
                count += 1
    return count


def reading_path_words(root: Path = REPO_ROOT) -> str:
    """The landing page's reading times in words, under its table: the whole course's, the exercises' count on top, and
    a short route (:data:`SHORT_ROUTE`); how a time is counted (:func:`reading_minutes`) is not the reader's."""
    titles = page_titles()
    order = reading_order(root)
    minutes = {n: reading_minutes(n, root)[1] for n in order}
    exercises = sum(exercise_count(n, root) for n in order)

    def short(n: str) -> str:
        return titles[n].split(". ")[0] + (" part 2" if "05_ternary_2" in n else " part 1" if "05_ternary_1" in n
                                           else "")

    route = [n for n in SHORT_ROUTE if n in minutes]
    # the sums of the times the table shows (each rounded), so that a reader who adds the column gets the same
    shown = {n: rounded_minutes(m) for n, m in minutes.items()}
    out = (f"The course reads in {hours(sum(shown.values()), exact=True)}; "
           + (f"the {exercises} exercises come on top." if exercises else "the exercises come on top.")
           + " With an afternoon, read " + ", then ".join(short(n) for n in route)
            + f" ({hours(sum(shown[n] for n in route), exact=True)}): how a chapter is measured, the simplest kernel, and the "
            "longest chain of dependent work.")
    return out


__all__ = ["LISTING_MINUTES", "TABLE_MINUTES", "OTHER_PAGES", "reading_order", "WORDS_PER_MINUTE", "listing_blocks", "table_count", "unfolded_prose_words",
           "fsm_line", "fsm_suite", "headlines", "part_one_answer", "VOID", "LISTING_CALLS", "listing_lines",
           "ctc_grid", "ctc_strongest", "fsm_corpora_pair", "decode_bound", "bitnet_rows", "FLAG_ABOVE", "caveat", "host_bound", "host_bound_markdown",
           "row_caveat", "spread", "ROTATED", "one_copy_words", "replayed_one_copy",
           "reading_minutes", "folded_minutes", "headline_tables_markdown", "not_comparable_runs",
           "part_one_line", "left_out_words", "CTC_STEPS_WORDS", "ctc_cases", "ctc_which", "ctc_host_bound", "bitnet_eager_words", "plan_holds",
       "reading_path_markdown", "step_payoffs", "ngram_many", "ngram_deployed", "EAGER_WORDS", "eager_headlines", "eager_sentence", "page_titles", "SHORT_ROUTE", "RIVALS", "synthetic_words", "LOOP_WORDS",
           "case_label", "ctc_case_words",
           "fsm_peers", "fsm_peer_words", "fsm_peer_totals", "write_fsm_peers", "FSM_PEERS", "FSM_PEER", "summary_markdown", "other_answers", "other_eager", "eager_words",
           "bitnet_range", "bitnet_eager", "HOST_BOUND_TITLE", "GRID_HOST_CHAPTERS", "clauses",
           "reading_path_words", "exercise_count", "hours", "rounded_minutes", "ctc_rival_words", "fsm_peers_real", "passes_saved", "fsm_passes_pair", "FSM_PEERS_REAL", "ctc_native_cases", "ctc_native_words", "also_timed", "ngram_range", "multi_item_loss",
           "multi_item_loss_row", "MULTI_ITEM_LOSS", "shared_layers_words", "speculate_gated", "peer_bare",
           "fsm_note", "FOLD_WORDS", "rival_items", "versions_footnote", "ngram_step", "NGRAM_MODEL",
           "NGRAM_STEP_CASE"]


#: Llama 3.1 8B (config.json), the model chapter 03 prices a decoding step with: hidden, layers, MLP, KV heads, head
#: size, vocabulary.
NGRAM_MODEL = (4096, 32, 14336, 8, 128, 128256)
#: The batch chapter 03 prices a step at: slots, tokens, budget.
NGRAM_STEP_CASE = (32, 512, 128)



def ngram_step(root: Path = BENCH_RESULTS, card: str = "nvidia-h200") -> dict[str, Any]:
    """Chapter 03's lookup in a Llama 3.1 8B decoding step on ``card``, as its page computes it (the weights and
    every slot's KV cache read once at the copy bandwidth, plus the lookup) at :data:`NGRAM_STEP_CASE`: the step's
    floor (µs), the lookup's share of the step with the CPU loop, the port (step 4) and ours, and the step's speedup
    against the port; and the KV cache at the answer's shape (``lead_kv_bytes``), which no single card holds."""
    from book.ngram import lesson
    from studylog import ngram as ng
    from studylog.plotting import load_results as _load

    res = _load("ngram", card, root=Path(root))
    hidden, layers, mlp, kv_heads, head_dim, vocab = NGRAM_MODEL
    per_layer = hidden * (hidden + 2 * kv_heads * head_dim + hidden) + 3 * hidden * mlp + 2 * hidden
    weight_bytes = 2 * (2 * vocab * hidden + layers * per_layer + hidden)
    kv_per_token = 2 * layers * 2 * kv_heads * head_dim
    batch, seq_len, threshold = NGRAM_STEP_CASE
    step = (weight_bytes + batch * seq_len * kv_per_token) / (res.data["ceilings"]["copy_bandwidth_gbs"] * 1e9) * 1e6
    time = {s: lesson.grid_row(res, s, (batch, seq_len, threshold))["ms"] * 1e3
            for s in (ng.CHAPTER.step(1).series, ng.CHAPTER.step(4).series, "ngram_match")}
    cpu, port, ours = (time[s] for s in (ng.CHAPTER.step(1).series, ng.CHAPTER.step(4).series, "ngram_match"))
    ran = lesson.grid_row(res, "ngram_match", (batch, seq_len, threshold)).get("step", "")
    many = ngram_many(Path(root) / card)
    return {"batch": batch, "seq_len": seq_len, "step_us": step, "cpu": cpu / (step + cpu),
            "port": port / (step + port), "ours": ours / (step + ours), "gain": (step + port) / (step + ours),
            "vs_port": port / ours, "port_us": port, "ours_us": ours, "saved_us": port - ours,
            "ours_step": int(ran.removeprefix("step")) if ran.startswith("step") else None,
            "lead": many[0][:2] if many else None,
            "lead_kv_bytes": many[0][0] * many[0][1] * kv_per_token if many else None}


def step_payoffs(root: Path = BENCH_RESULTS, card: str = "nvidia-h200") -> dict[str, str]:
    """What each chapter's answer buys the step a real system runs, as its own page computes it on ``card`` (notebook
    -> a few words; the landing table's last answer column): a kernel's ratio is not the system's, and a reader who
    skims the table should not read it as one. Each figure repeats its page's own calculation on the same committed
    file: chapter 02's Amdahl bound on a Llama 3.2 3B step's bytes, chapter 03's lookup share of a Llama 3.1 8B step
    with ours and with the port (:func:`ngram_step`), chapter 04's bound on a Conformer-M training step, chapter 05's estimate on a BitNet
    2B4T step's bytes (part 1 against GemLite, part 2 against BitNet's kernel, with the same helper), chapter 06's
    attention share and whole pass against FlashInfer; chapters 01, 07 and 08 already answer for a whole request or
    loop. A page whose file is missing gets no entry."""
    from studylog.plotting import load_results as _load

    def load_results(name: str, gpu: str):
        return _load(name, gpu, root=Path(root))

    out: dict[str, str] = {}

    def attempt(notebook: str, words: Callable[[], str]) -> None:
        try:
            out[notebook] = words()
        except (FileNotFoundError, KeyError, TypeError, ValueError, ZeroDivisionError):
            pass  # a card without the run: the column says nothing rather than a guess

    def masked_head() -> str:
        from studylog import masked_lm_head as mlh
        from studylog.decode import model_config
        from studylog.masked_lm_head.report import PLAN, XGRAMMAR

        res = load_results("masked_lm_head", card)
        at = dict(batch=1, kind="random", allowed=1000)
        k = res.ms(XGRAMMAR, **at) / res.ms(PLAN, **at)
        share = model_config("1b", vocab_size=mlh.VOCAB, hidden=3072, layers=28, heads=24, kv_heads=8,
                             intermediate=8192).head_share()  # chapter 02's Llama 3.2 3B
        out = f"at most {1 / (1 - share + share / k):.2f}× a Llama 3.2 3B decode step at batch 1 (a bound)"
        split = decode_split(Path(root) / card)  # what the head did in chapter 07's measured loop
        if split is not None:  # the head on SmolLM2 by chapter 07's one rule (book.decode.lesson.real_verdict)
            from book.decode.lesson import real_verdict

            head = real_verdict(split["head"], (split.get("again") or {}).get("head"), split.get("interleaved"))
            how = " (in alternating rounds)" if head["source"] == "interleaved" else ""
            out += ("; measured in 07: " + ("a tie" if head["word"] == "tie" else "unresolved (two runs disagree)"
                                            if head["word"] == "runs disagree" else f"{head['x']:.2f}×{how}")
                    + " on SmolLM2" + ("" if split["head_8b"] is None else
                                       f", {split['head_8b']:.2f}× on the 8B cost model"))
        return out

    def ngram() -> str:  # against the answer's rival, the port, at the shape where a step is priced
        s = ngram_step(root, card)
        saved = s["gain"] - 1  # the share of a step ours saves against the port: too small for a ratio to show
        # the ratio and its shape lead the answer's cell: this one says only what it saves of a step
        return (f"saving {'under 0.1%' if saved < 0.001 else f'{saved:.1%}'} of a Llama 3.1 8B step at "
                f"{s['batch']} × {s['seq_len']} (a bound)")

    def ctc_step() -> str:
        from book.ctc import lesson
        from studylog import ctc

        res = load_results("ctc", card)
        env = load_results("env", card)
        rate = max(r["tflops"] for r in env.select("matmul_bfloat16")) * 1e12
        n = lesson.speedup_minima(res)[max(ctc.BENCH_A)][2]
        model = 6 * (30.7e6 + 256 * 5000) * ctc.BENCH_T * n / rate * 1e3  # chapter 04's Conformer-M step, ms
        theirs, ours = (res.ms(s, T=ctc.BENCH_T, A=5000, N=n) for s in ("torch-best", "ctc_loss"))
        # an ideal step (every matmul at the card's peak rate), not a measured one: the cell says so
        return (f"at most {(model + theirs) / (model + ours):.2f}× an ideal Conformer-M training step at peak matmul "
                f"rate, alphabet 5,000, batch {n} (a bound)")

    def ternary(part: int) -> str:
        from book.ternary import lesson
        from book.ternary.results import bitnet_results
        from studylog import ternary as T
        from studylog.ternary.results import BITNET, GEMLITE

        res = load_results("ternary", card)
        if part == 2:
            res = bitnet_results(res)
        view = lesson.amdahl_peer(res, T.CHAPTER.step(14 if part == 1 else 23).series, GEMLITE if part == 1
                                  else BITNET)
        against = "GemLite" if part == 1 else "BitNet's kernel"
        return f"about {view['end_to_end']:.2f}× a BitNet 2B4T decode step at batch 1 against {against} (an estimate)"

    def multi_item() -> str:
        from book.multi_item import lesson
        from studylog.multi_item import report

        res = load_results("multi_item", card)
        linear = lesson.amdahl(res, lesson.layouts(res))[report.MIXED_SHAPE]["linear_ms"]
        t = {s: lesson.ms(res, s, lesson.GQA_SHAPE) for s in (report.FLASHINFER, lesson.STEP[6].series)}
        layers = lesson.MODEL["layers"]
        gain = (linear + layers * t[report.FLASHINFER]) / (linear + layers * t[lesson.STEP[6].series])
        return f"at most {gain:.2f}× the whole scoring pass of Llama 3.1 8B's layers at the answer's case (a bound)"

    attempt("notebooks/02_masked_lm_head.ipynb", masked_head)
    attempt("notebooks/03_ngram_matching.ipynb", ngram)
    attempt("notebooks/04_ctc_loss.ipynb", ctc_step)
    attempt("notebooks/05_ternary_1_triton.ipynb", lambda: ternary(1))
    attempt("notebooks/05_ternary_2_cuda.ipynb", lambda: ternary(2))
    attempt("notebooks/06_multi_item_attention.ipynb", multi_item)
    def fsm() -> str:
        from book.fsm.lesson import amdahl_bound

        shipped = passes_saved(fsm_peers_real(), FSM_PEER)
        if shipped is not None:  # the answer's policy, llguidance's fast-forward tokens, on the real schemas
            # a count on those documents as the tokenizer splits them, not a bound on other workloads
            return (f"at most {amdahl_bound(shipped):.2f}× a request on the {fsm_peers_real()['schemas']} real "
                    "schemas' documents, with llguidance's fast-forward tokens (a bound)")
        real = fsm_real()
        if real is None:
            saved, _, _ = fsm_line(fsm_suite())
            return (f"at most {amdahl_bound(saved):.2f}× a request on the course's suite's documents (a "
                    "bound)")
        lo, hi = (f"{amdahl_bound(x):.2f}" for x in real[1:])
        return (f"at most {lo if lo == hi else f'{lo}–{hi}'}× a request on the real schemas' documents (a "
                "bound)")

    attempt("notebooks/01_fsm_compression.ipynb", fsm)
    for notebook in ("notebooks/07_constrained_decoding.ipynb", "notebooks/08_speculation_under_a_grammar.ipynb"):
        out[notebook] = "the answer itself, a whole decode loop on SmolLM2-135M (measured)"
    return out
