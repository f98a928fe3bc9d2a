"""What chapter 1's lesson computes and shows from its measurements: the Amdahl view of a decode step (what
skipping a share of the steps buys), how many tokens the visited states allow,
and the tables and figure of the comparison with xgrammar and llguidance (rows of
:func:`book.fsm.peers.compare_peers`)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from book.fsm.figures import SERIES_COLORS
from book.fsm.peers import LIBRARIES, PeerRow

__all__ = ["amdahl_bound", "MODES", "suite_passes",
           "saved_share", "steps_table", "step3_changed_lines", "step3_core",
           "plot_mask_counts", "FORCED_COLUMNS", "peers_table", "policy_totals", "agreement_table", "timing_table", "plot_peers",
           "ENGINE_NAMES", "cpu_name", "common_forced_shares", "real_policy_shares", "forced_counts_table"]


# --- what skipping a decode step buys (the Amdahl view) ------------------------------------------------------

def amdahl_bound(saved_share: float) -> float:
    """End-to-end speedup when a share of the decode steps disappears and the rest cost what they did. An
    optimistic bound: a jump's tokens reach the model inside the next pass, as a chunk, which costs more than a
    one-token pass."""
    if not 0 <= saved_share < 1:
        raise ValueError(f"saved_share must be in [0, 1), got {saved_share}")
    return 1.0 / (1.0 - saved_share)


def common_forced_shares(doc: dict) -> tuple[int, dict[str, float]]:
    """On the SchemaStore sample (``realworld_<vocab>.json``): how many schemas every engine compiled, and each
    engine's share of forced tokens (step 2's rule: the mask allows one token) over those schemas alone, so that the
    engines are set side by side on the same schemas (their summaries cover the schemas each compiled). An engine
    that refuses a walked document follows one of its own, so even there the documents can differ a little."""
    engines = list(doc["summary"])
    common = [s for s in doc["schemas"]
              if all(s["engines"].get(e, {}).get("outcome") == "compiled" for e in engines)]
    shares = {}
    for e in engines:
        tokens = sum(s["engines"][e]["tokens"] for s in common)
        shares[e] = sum(s["engines"][e]["forced"] for s in common) / tokens if tokens else float("nan")
    return len(common), shares


def real_policy_shares(record: dict) -> tuple[int, int, dict[str, float]]:
    """The suite's comparison run on real schemas (``fsm_peers_realworld.json``, written by
    ``lab/fsm/real_schema_passes.py``: the SchemaStore schemas all three engines compile, documents walked at random
    from our automaton and written in the tokenizer's split): how many schemas and documents it counts, and per
    ``library/policy`` the share of the passes without jumps it saves, the steps table's measure on those documents.
    A document one library refused is out of every total."""
    schemas = [s for s in record["schemas"] if s.get("documents")]
    documents = sum(s["documents"] - len(s.get("refused", [])) for s in schemas)
    none = record["totals"]["none"]
    return len(schemas), documents, {key: 1 - p["passes"] / none for key, p in record["totals"]["policies"].items()}

def forced_counts_table(decode_results, real_doc: dict, results, batch: int = 1) -> str:
    """The page's one note on the other counts of forced tokens (Markdown), one row each, with its documents, whose
    tokens it counts and when a token counts: MaskBench's published share (fast-forward tokens), each engine's share
    on its own random walks of the SchemaStore schemas all three compile (step 2's rule, ``real_doc``, the
    ``realworld_<vocab>.json`` record), step 2's passes saved on the suite's regexes, then on its JSON schemas
    (``results``, rows of ``fsm.run_suite``), then SmolLM2-135M's answers at ``batch`` from chapter 7's committed run
    (``decode_results``): passes saved in its tokenizer's split by step 2, then by llguidance's policy (a row of its
    own: one policy a row), and forwards saved in the model's own tokens, the pass on EOS included. Every share but
    MaskBench's is a share of passes skipped."""
    from book.decode import lesson as decode_lesson

    bench = real_doc["maskbench"]
    n_common, shares = common_forced_shares(real_doc)
    engines = ", ".join(f"{ENGINE_NAMES.get(e, e)} {v:.1%}" for e, v in sorted(shares.items(), key=lambda x: x[1]))
    kinds = {kind: len({r.name for r in results if r.kind == kind}) for kind in ("json", "regex")}
    saved = {kind: saved_share(suite_passes(results, kind=kind), 2) for kind in ("json", "regex")}
    compact = saved_share(suite_passes(results, "compact", kind="json"), 2)
    rows = [(f"MaskBench: the valid documents of {bench['schemas'].split(' (')[0]} schemas",
             f"{bench['tokenizer']} tokenizer", "fast-forward tokens append it (tokens forced)",
             f"{bench['forced_share']:.0%} ({bench['forced_share_compact']:.0%} compact); its SchemaStore schemas "
             f"alone {bench['forced_share_schemastore']:.0%}"),
            (f"each engine's own random walks of the {n_common} real schemas, "
             f"{real_doc['settings']['n_docs']} a schema, compact", "any split the engine allows",
             "the mask allows it alone, step 2's rule (tokens forced)", engines),
            (f"the suite's {kinds['regex']} regexes", "cl100k, the tokenizer's split", "step 2 skips its pass",
             f"{saved['regex']:.1%}"),
            (f"the suite's {kinds['json']} JSON schemas", "cl100k, the tokenizer's split", "step 2 skips its pass",
             f"{saved['json']:.1%} ({compact:.1%} compact)")]
    split, rf = decode_lesson.smollm2_split(batch), decode_lesson.real_forced(decode_results, batch)
    if split is not None and rf is not None:
        answers = f"SmolLM2-135M's answers to the suite's {rf['requests']} entries"
        their_split = f"its tokenizer's split of their text: {split['tokens']} tokens"
        rows.append((answers, their_split, "step 2 skips its pass", f"{split['saved']['ours/tokens']:.1%}"))
        rows.append(("the same answers", their_split, "llguidance's policy (fast-forward tokens) skips its pass",
                     f"{split['saved']['llguidance/tokens']:.1%}"))
    if rf is not None:
        rows.append(("the same answers", f"the model's own tokens: {rf['tokens']}",
                     "step 2 skips its forward, the one on EOS included", f"{rf['saved'] / rf['forwards_step1']:.0%}"))
    lines = ["| documents | their tokens | a token counts when | share |", "|---|---|---|---|"]
    return "\n".join(lines + [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows])

# --- the chapter's table of steps ----------------------------------------------------------------------------

#: The decode mode of each step (``studylog.fsm.decode``'s ``mode``).
MODES = {1: "none", 2: "token", 3: "char"}


def run_suite(vocab, compact: Optional[dict] = None) -> tuple[list, dict]:
    """The chapter's suite (``studylog.fsm.run_suite``: both whitespace patterns, eight documents an entry, seed 0)
    and its default-whitespace automata, kept for the comparison with xgrammar and llguidance; the compact ones go
    into ``compact`` where given (by entry name), for the same comparison on the JSON schemas, compact."""
    from studylog import fsm

    automata: dict = {}
    kept = {"default": automata, "compact": compact if compact is not None else {}}
    results = fsm.run_suite(vocab, whitespaces=("default", "compact"), n_samples=8, seed=0,
                            keep=lambda r, f: kept[r.whitespace].setdefault(r.name, f))
    return results, automata


def suite_passes(results, whitespace: str = "default", kind: Optional[str] = None) -> dict[int, int]:
    """Forward passes each step needs over the suite's documents (rows of ``fsm.run_suite``), over its entries of
    one ``kind`` alone (``"json"`` or ``"regex"``) where given."""
    rows = [r for r in results if r.whitespace == whitespace and (kind is None or r.kind == kind)]
    return {step: sum(r.passes[mode] for r in rows) for step, mode in MODES.items()}


def saved_share(passes: dict[int, int], step: int) -> float:
    """The chapter's one measure of a step: the share of step 1's forward passes that ``step`` leaves out."""
    return 1.0 - passes[step] / passes[1]


def steps_table(results, peer: Optional[dict] = None, compact_peer: Optional[dict] = None,
                real: Optional[dict] = None) -> str:
    """Markdown, one row per step: the one change, then for each of the chapter's two suites (every entry with
    outlines' default whitespace; the JSON schemas alone, compact), a column headed by the suite, each cell the
    forward passes and, in parentheses, the share of step 1's passes the step saves (:func:`saved_share`).
    ``peer``, llguidance's fast-forward tokens on the first suite as the committed comparison keeps them
    (``book.results.fsm_peers()``: ``none`` and ``policies["llguidance/tokens"]["passes"]``), adds a row labelled as a
    peer, not a step; ``compact_peer`` (``fsm_peers(whitespace="compact")``) fills its cell for the second suite, ``–``
    without it. ``real``, the same comparison on real SchemaStore schemas (``fsm_peers_realworld.json``, as
    :func:`real_policy_shares` reads it), adds a third column by the same measure: step 1 is its passes without
    jumps, step 2 our exact token jumps, step 3 our character jumps, the peer row llguidance's. A peer count over
    another number of passes without jumps than step 1's is refused (ValueError)."""
    from studylog.fsm import CHAPTER

    counts = {ws: suite_passes(results, ws) for ws in ("default", "compact")}
    # the compact suite holds the JSON schemas only (a regex has no whitespace to choose): each column names its suite
    entries = {ws: len({r.name for r in results if r.whitespace == ws}) for ws in ("default", "compact")}
    head = [f"suite: all {entries['default']} entries", f"suite: {entries['compact']} JSON schemas, compact"]
    real_cells: dict = {}
    if real is not None:
        n_real, _, _ = real_policy_shares(real)
        none = real["totals"]["none"]
        policy = real["totals"]["policies"]
        head.append(f"{n_real} real schemas (SchemaStore), compact")
        for row, passes in ((1, none), (2, policy["ours/tokens"]["passes"]), (3, policy["ours/bytes"]["passes"]),
                            ("peer", policy["llguidance/tokens"]["passes"])):
            real_cells[row] = f"{passes:,} ({100 * (1 - passes / none):.1f}%)"
    lines = ["| step | the one change | " + " | ".join(head) + " |", "|---|---|" + "---|" * len(head)]
    for step in CHAPTER.steps:
        cells = [f"{counts[ws][step.number]:,} ({100 * saved_share(counts[ws], step.number):.1f}%)"
                 for ws in ("default", "compact")] + ([real_cells[step.number]] if real_cells else [])
        lines.append(f"| {step.number} | {step.title} | " + " | ".join(cells) + " |")
    if peer is not None:
        cells = []
        for ws, totals in (("default", peer), ("compact", compact_peer)):
            if totals is None:
                cells.append("–")
                continue
            if totals["none"] != counts[ws][1]:
                raise ValueError(f"the peer's count ({ws} whitespace) is over {totals['none']} passes without jumps, "
                                 f"step 1's over {counts[ws][1]}: not the same suite")
            passes = totals["policies"]["llguidance/tokens"]["passes"]
            cells.append(f"{passes:,} ({100 * (1 - passes / totals['none']):.1f}%)")
        lines.append("| *peer, not a step* | *llguidance's fast-forward tokens (Beside the steps)* | "
                     + " | ".join(cells + ([real_cells["peer"]] if real_cells else [])) + " |")
    return "\n".join(lines)


# --- how many tokens a state allows --------------------------------------------------------------------------

def plot_mask_counts(counts: Sequence[int], vocab_size: int, ax=None, title: Optional[str] = None):
    """Histogram (log-spaced bins) of allowed tokens per visited state, with the cumulative share."""
    import matplotlib.pyplot as plt

    counts = np.asarray(counts)
    ax = ax or plt.subplots(figsize=(8, 4))[1]
    bins = np.logspace(0, np.log10(vocab_size), 26)
    ax.hist(counts, bins=bins, color=SERIES_COLORS["neutral"], alpha=0.6)
    ax.set_xscale("log")
    ax.set_xlabel(f"allowed tokens in the state (of {vocab_size:,})", fontsize=10)
    ax.set_ylabel("visited states", fontsize=10)
    ax.tick_params(labelsize=9)
    ax.grid(True, which="both", alpha=0.3)
    twin = ax.twinx()
    xs = np.sort(counts)
    twin.plot(xs, np.arange(1, len(xs) + 1) / len(xs), color="black", lw=1.5)
    twin.set_ylabel("cumulative share of states (line)", fontsize=10)
    twin.tick_params(labelsize=9)
    twin.set_ylim(0, 1.02)
    ax.set_title(title or "How many tokens a state allows, over the states the suite visits", fontsize=11)
    return ax


# --- beside xgrammar and llguidance: tables and a figure -----------------------------------------------------

def _by_entry(rows: Sequence[PeerRow]) -> dict[str, dict[str, PeerRow]]:
    table: dict[str, dict[str, PeerRow]] = {}
    for r in rows:
        table.setdefault(r.entry, {})[r.library] = r
    return table


#: The columns of :func:`peers_table`: (library, policy, heading).
FORCED_COLUMNS = (("ours", "tokens", "ours: token jumps"), ("ours", "bytes", "ours: char jumps"),
                  ("xgrammar", "bytes", "xgrammar: jump-forward string"),
                  ("llguidance", "tokens", "llguidance: ff tokens"))


def peers_table(rows: Sequence[PeerRow]) -> str:
    """Markdown: per entry, the forward passes without jumps, then per library and policy the passes with its
    jumps and, in parentheses, the share of the passes without jumps it saves (the steps table's measure), then the
    documents each retokenizing or fast-forwarding policy wrote in another split than the tokenizer's (our token
    jumps never do); totals last."""
    table = _by_entry(rows)
    cols = [c for c in FORCED_COLUMNS if any(c[0] in libs for libs in table.values())]
    split_cols = [c for c in cols if c[2] != "ours: token jumps"]
    split_names = " / ".join(h.removeprefix("ours: ").split(":")[0] for *_, h in split_cols)
    lines = ["| entry | passes, no jumps | " + " | ".join(h for *_, h in cols)
             + f" | documents in another split ({split_names}) |",
             "|" + "---|" * (3 + len(cols))]
    total = {"none": 0, **{h: [0, 0, 0, 0] for *_, h in cols}}
    for name, libs in table.items():
        cells = [name, f"{libs['ours'].passes['none']:,}"]
        total["none"] += libs["ours"].passes["none"]
        canon = []
        for lib, policy, h in cols:
            r = libs.get(lib)
            if r is None:
                cells.append("–")
                canon.append("–")
                continue
            cells.append(f"{r.passes[policy]:,} ({100 * r.saved(policy, libs['ours']):.0f}%)")
            canon.append(f"{r.noncanonical[policy]:,}")
            t = total[h]
            t[0] += r.passes[policy]
            t[1] += r.picked[policy]
            t[2] += r.out_tokens[policy]
            t[3] += r.noncanonical[policy]
        lines.append("| " + " | ".join(cells) + " | " + " / ".join(c for c, (*_, h) in zip(canon, cols)
                                                                   if h != "ours: token jumps") + " |")
    cells = ["**all**", f"**{total['none']:,}**"]
    cells += [f"**{total[h][0]:,} ({100 * (1 - total[h][0] / max(total['none'], 1)):.1f}%)**" for *_, h in cols]
    lines.append("| " + " | ".join(cells) + " | **" + " / ".join(f"{total[h][3]:,}" for *_, h in split_cols) + "** |")
    return "\n".join(lines)


def policy_totals(rows: Sequence[PeerRow]) -> dict[tuple[str, str], dict[str, float]]:
    """Per ``(library, policy)`` of :data:`FORCED_COLUMNS`, summed over the entries that library compiled: the
    passes, the share of the passes without jumps it saves, and the documents it wrote in another split than the
    tokenizer's (the totals row of :func:`peers_table`, for prose)."""
    table = _by_entry(rows)
    totals = {}
    for lib, policy, _ in FORCED_COLUMNS:
        entries = [libs for libs in table.values() if lib in libs]
        if not entries:
            continue
        passes = sum(libs[lib].passes[policy] for libs in entries)
        none = sum(libs["ours"].passes["none"] for libs in entries)
        totals[(lib, policy)] = {"passes": passes, "saved": 1 - passes / max(none, 1), "entries": len(entries),
                                 "noncanonical": sum(libs[lib].noncanonical[policy] for libs in entries)}
    return totals


def agreement_table(rows: Sequence[PeerRow]) -> str:
    """Markdown: per entry, the states walked, ours with forced bytes, and per peer the states whose forced
    string or mask differs from ours (masks: all states / states with no forced bytes)."""
    table = _by_entry(rows)
    peers = [p for p in LIBRARIES[1:] if any(p in libs for libs in table.values())]
    head = ("| entry | states | ours: forced strings | ours: one-token masks | "
            + " | ".join(f"{p}: forced strings differ | {p}: masks differ (where nothing is forced)" for p in peers)
            + " |")
    lines = [head, "|" + "---|" * (4 + 2 * len(peers))]
    for name, libs in table.items():
        ours = libs["ours"]
        cells = [name, str(ours.states), str(ours.forced_byte_states), str(ours.single_token_masks)]
        for p in peers:
            r = libs.get(p)
            cells += ["–", "–"] if r is None else [str(r.forced_bytes_differ),
                                                  f"{r.masks_differ} ({r.masks_differ_unforced})"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: How the timing table names each library: the chapter's automaton is outlines-core's index (plus the chapter's
#: jump tables), so its compile is outlines-core's.
ENGINE_NAMES = {"ours": "outlines-core"}


def cpu_name() -> str:
    """This machine's CPU model as the operating system reports it (``/proc/cpuinfo`` on Linux), or the
    platform's processor string; "an unnamed CPU" where neither says."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "an unnamed CPU"


def timing_table(rows: Sequence[PeerRow]) -> str:
    """Markdown: CPU wall time to compile each entry's regex and to fill one mask (median over the walks'
    states; the first mask apart, since llguidance builds its lexer lazily)."""
    table = _by_entry(rows)
    libs_run = [lib for lib in LIBRARIES if any(lib in libs for libs in table.values())]
    names = {lib: ENGINE_NAMES.get(lib, lib) for lib in libs_run}
    head = ("| entry | " + " | ".join(f"{names[lib]}: compile (ms)" for lib in libs_run) + " | "
            + " | ".join(f"{names[lib]}: mask, median (µs)" for lib in libs_run) + " | "
            + " | ".join(f"{names[lib]}: first mask (µs)" for lib in libs_run) + " |")
    lines = [head, "|" + "---|" * (1 + 3 * len(libs_run))]
    for name, libs in table.items():
        cells = [name]
        cells += [f"{1e3 * libs[lib].compile_seconds:.1f}" if lib in libs else "–" for lib in libs_run]
        cells += [f"{libs[lib].mask_median_us:.0f}" if lib in libs else "–" for lib in libs_run]
        cells += [f"{libs[lib].first_mask_us:.0f}" if lib in libs else "–" for lib in libs_run]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_peers(rows: Sequence[PeerRow], ax=None, title: Optional[str] = None):
    """Share of forward passes saved per entry: our two jumps, xgrammar's string, llguidance's ff tokens."""
    import matplotlib.pyplot as plt

    table = _by_entry(rows)
    cols = [c for c in FORCED_COLUMNS if any(c[0] in libs for libs in table.values())]
    names = list(table)
    ax = ax or plt.subplots(figsize=(10, 4.2))[1]
    width = 0.8 / len(cols)
    colors = {"ours: token jumps": SERIES_COLORS["step02_token_jumps"], "ours: char jumps":
              SERIES_COLORS["step03_char_jumps"], "xgrammar: jump-forward string": SERIES_COLORS["xgrammar"],
              "llguidance: ff tokens": SERIES_COLORS["llguidance"]}
    top = 0.0
    for k, (lib, policy, h) in enumerate(cols):
        xs, ys = [], []
        for i, n in enumerate(names):
            r = table[n].get(lib)
            if r is None:
                continue
            xs.append(i + (k - (len(cols) - 1) / 2) * width)
            ys.append(100 * (1 - r.passes[policy] / table[n]["ours"].passes["none"]))
        ax.bar(xs, ys, width, label=h, color=colors.get(h))
        top = max([top, *ys])
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=9)
    ax.set_ylabel("forward passes saved (%)")
    ax.set_ylim(0, 1.3 * top + 5)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=9, loc="upper center", ncol=2)
    ax.set_title(title or "Forward passes saved, same regex, same vocabulary (cl100k_base, greedy writer model)",
                 fontsize=10)
    return ax


#: Lines of a step's jump branch that are bookkeeping, not the jump: the counters a page reports (all but
#: ``retokenized``, the cost the page is about), the cut at ``max_tokens``, the UTF-8 guard and the check that the
#: retokenized text ends where the jump does.
_NOT_THE_JUMP = ("res.jumped_", "res.skipped_jumps", "try:",
                 "except UnicodeDecodeError", "else:", "cut = ", "new_ids = new_ids[:", "appended = ",
                 "if not cut", "raise RuntimeError")


def _jump_branch(step) -> list[str]:
    """The jump branch of a decode step's loop, from ``jump = ...`` to its ``continue``, bookkeeping left out
    (:data:`_NOT_THE_JUMP`) and the lines of a ``try``'s ``else`` moved back to the branch's indent."""
    import inspect

    from book.common import without_docstrings

    lines = without_docstrings(inspect.getsource(step)).splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("jump = "))
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "continue")
    branch = lines[start:end + 1]
    indent = len(branch[1]) - len(branch[1].lstrip()) + 4  # the branch's body, under ``if jump is not None:``
    in_try = any(ln.strip() == "try:" for ln in branch)
    out = []
    for ln in branch:
        if ln.strip().startswith(_NOT_THE_JUMP):
            continue
        depth = len(ln) - len(ln.lstrip())
        if depth > indent and in_try:  # inside the try's else: one level back
            ln = ln[4:]
        out.append(ln.split("  # ")[0].rstrip())
    return out


def step3_changed_lines() -> int:
    """How many lines step 3's whole change to step 2's function changes (removed plus added, docstrings left out):
    the size of what :func:`step3_core` shows the core of."""
    import difflib
    import inspect

    from book.common import without_docstrings
    from studylog.fsm import decoding

    old, new = (without_docstrings(inspect.getsource(s)).splitlines()
                for s in (decoding.step02_token_jumps, decoding.step03_char_jumps))
    return sum(ln[:1] in "+-" and not ln.startswith(("+++", "---"))
               for ln in difflib.unified_diff(old, new, lineterm="", n=0))


def step3_core():
    """Step 3's change to step 2's loop, its core only: the jump branch of each (:func:`_jump_branch`), as a
    ``studylog.source.Diff`` of at most about twenty changed lines, its label giving how many changed lines of the
    whole change (:func:`step3_changed_lines`) it leaves out, so that the header's one count (+ / −) is of the
    lines shown."""
    from studylog.fsm import decoding
    from studylog.source import Diff

    old, new = (_jump_branch(s) for s in (decoding.step02_token_jumps, decoding.step03_char_jumps))
    core = Diff("\n".join(old), "\n".join(new), "step 2, the jump", "step 3, its core", 1)
    rest = step3_changed_lines() - len(core.added) - len(core.removed)
    return Diff("\n".join(old), "\n".join(new), "step 2, the jump",
                f"step 3, its core; {rest} more changed lines not shown", 1)
