"""The results page's caveats: one flag rule for every ratio, chapter 6's grouped-query headline in its folded table,
and the sentence on calls whose host time exceeds their GPU time, each checked against the raw benchmark files."""

from __future__ import annotations

import itertools
import json
import re

from book import results
from book.common import is_tie, us
from book.masked_lm_head.lesson import compiled_gather_leads
from book.site import flag_rows, headlines_page_markdown
from book.scoreboard import short_card
from studylog import plotting
from studylog.paths import BENCH_RESULTS, REPO_ROOT


def _raw_rows(card_key: str, chapter: str) -> list[dict]:
    (path,) = [p for p in BENCH_RESULTS.glob(f"*/{chapter}.json") if card_key in p.parent.name.upper()]
    return json.loads(path.read_text())["measurements"]


def test_caveat_rule_is_one_threshold():
    assert results.caveat(0.10, 0.10) == ""
    assert results.caveat(0.11) == " (our spread 11%)"
    assert "the rival's spread 13%" in results.caveat(0.01, 0.13)


def test_folded_rows_flag_either_side_from_their_own_cells():
    table = ("**masked_lm_head** — NVIDIA H200, 2026-11-29; clock: gpu\n\n"
             "| ours | against | case | speedup | ours (µs) | theirs (µs) | host per call (µs) |\n|---|---|---|---|---|---|---|\n"
             "| a | b | batch 1 | **2.00×** (spread 14%) | 10.0 (10.0–10.1) | 20.0 (18.0–20.5) | 1.0 |\n"
             "| a | b | batch 1 | **2.00×** | 10.0 (9.0–10.2) | 20.0 (20.0–20.1) | 1.0 |\n")
    out = flag_rows(table).splitlines()
    assert out[4].count("spread") == 1 and "the rival's spread 12%" in out[4]
    assert "our spread 12%" in out[5]


def test_page_has_the_grouped_query_row_and_no_second_machine():
    page = headlines_page_markdown()
    rows = _raw_rows("H200", "multi_item")
    gqa = {r["series"]: r for r in rows if r["params"].get("shape") == "8 prompts, mixed, 8 KV heads"
           and r["series"] in ("step06", "FlashInfer")}
    if len(gqa) == 2:  # the row the H200's headline stands on, with both times and their spreads, in the folded table
        line = next(ln for ln in page.splitlines() if "sharing 8 key/value heads" in ln)
        assert f"**{gqa['FlashInfer']['ms'] / gqa['step06']['ms']:.2f}×**" in line
        lo, _, hi = gqa["FlashInfer"]["spread_ms"]
        assert f"{gqa['FlashInfer']['ms'] * 1e3:,.1f} ({lo * 1e3:,.1f}–{hi * 1e3:,.1f})" in line
        assert f"{gqa['step06']['host_ms'] * 1e3:,.1f} |" in line
    assert "second H200" not in page and "second machine" not in page


def _find(rows: list[dict], series: str, **params) -> dict:
    (row,) = [r for r in rows if r["series"] == series and r["clock"] == "gpu"
              and all(r["params"].get(k) == v for k, v in params.items())]
    return row


def test_every_headline_has_its_row_in_the_folded_tables():
    """The rows the headlines stand on are in the folded tables, recomputed from the raw files: chapter 2's kernel
    alone against index_select at 1,000 allowed tokens, chapter 3's drafter against step 4 (our corrected port of the
    pull request's revision), BitNet's kernel at each of its shapes where a card has that run, and chapter 5's step
    12 at its default place to quantise x (the place its chapter times)."""
    page = headlines_page_markdown()
    case = {"batch": 1, "kind": "random", "allowed": 1000}
    rows = _raw_rows("H200", "masked_lm_head")
    ratio = _find(rows, "index_select", **case)["ms"] / _find(rows, "step12", **case, layout="vd")["ms"]
    line = next(ln for ln in page.splitlines() if "the kernel alone" in ln and "index_select" in ln
                and f"**{ratio:.2f}×**" in ln)
    assert "L2-favoured" not in line
    rows = _raw_rows("H200", "ngram")
    ngram = {"batch": 128, "seq_len": 32768, "threshold": 128}
    ours = next(r for r in rows if r["series"] in ("ngram_match",) and all(
        r["params"].get(k) == v for k, v in ngram.items()) and "corpus" not in r["params"])
    ratio = _find(rows, "step04", **ngram, corpus=None)["ms"] / ours["ms"]
    assert any("corrected port" in ln and f"**{ratio:.2f}×**" in ln for ln in page.splitlines())
    from book.scoreboard import cards

    h200 = next(c for c in cards() if "h200" in c.name)
    for label, shape, mine, peer in results.bitnet_rows(h200):
        assert any(shape in ln and f"**{peer['ms'] / mine['ms']:.2f}×**" in ln for ln in page.splitlines())
    rows = _raw_rows("H200", "ternary")
    ratio = (_find(rows, "torch_int_mm", shape="4096x14336", m=1)["ms"]
             / _find(rows, "step23", shape="4096x14336", m=1)["ms"])
    assert any("int8 activations (step 23" in ln and f"**{ratio:.2f}×**" in ln for ln in page.splitlines())
    assert "quantised in every block" not in page


def test_host_bound_table_lists_every_case_of_the_page_whose_host_time_exceeds_gpu_time():
    """Calls made eagerly: one line a chapter (05: a part) counts every comparison of the page whose host time per
    call exceeds its GPU time (each folded row on the GPU clock, on a card the page shows, is one of
    :func:`host_bound`'s rows or inside part 1's range of GemLite's shapes), and names who ties or wins; the fold
    under the lines lists only the ties and losses, each once, with both sides' times, and nothing where ours stays
    the faster. Each chapter with a loss also says so in one bullet of the results table's notes."""
    from book.plotting import headline_rows
    from book.scoreboard import card_name, cards

    whole = results.host_bound_markdown()
    head, text = whole.split(":::{dropdown} ", 1)
    text = ":::{dropdown} " + text
    title, blank, body = text.split("\n")[:3]
    assert not blank and text.endswith("\n:::")  # the ties and losses folded, title and all
    assert title == f":::{{dropdown}} {results.HOST_BOUND_FOLD}" and body == results.HOST_BOUND_TITLE
    assert text.count(":::{dropdown}") == 1 and text.count("| case |") == 1  # one table
    rows = [ln for ln in text.splitlines() if ln.startswith("| chapter")]
    assert rows and all(re.match(r"\| chapter \d\d( part [12])? \((step \d+|its entry point)\) on the ", ln)
                        for ln in rows), rows
    assert all(" part " in ln for ln in rows if ln.startswith("| chapter 05"))
    # only ties and losses, each said once: no row where ours stays the faster, none repeated
    assert all(ln.split(" | ")[-1].startswith("a tie with ") or " would be faster" in ln.split(" | ")[-1] for ln in rows)
    assert not any("stays" in ln for ln in rows) and len(set(rows)) == len(rows)
    assert [ln.split(" | ")[0][len("| chapter "):][:2] for ln in rows] == sorted(
        ln.split(" | ")[0][len("| chapter "):][:2] for ln in rows)
    # a spread is said only where it decides the verdict, in a few words
    for ln in rows:
        assert "repetitions" not in ln and len(ln.split(" | ")[-1].rstrip(" |").split()) <= 16, ln
    notes = results.summary_markdown().split(results.NOTES_HEAD)[1]
    by_chapter = re.split(r"^- \*\*", notes, flags=re.M)
    losing = sorted({ln[len("| chapter "):][:2] for ln in rows if "would be faster" in ln})
    flips = {f"{k[0]:02d}" for k in results.host_bound_by_chapter()}
    for number in losing:  # each chapter where a rival would then be the faster says so, in its line's notes
        if number in flips:
            assert any(b.startswith(f"{number}.") and "  - Called eagerly, " in b for b in by_chapter), number
    assert sum("  - Called eagerly, " in b for b in by_chapter) == len(results.host_bound_by_chapter())
    # the scope: every folded row that waits on the host is counted, and a tie or a loss among them is listed
    found = results.host_bound()
    apart = {(n, short_card(c)) for n, c in results.not_comparable_runs()}
    numbers = {e.bench: e.number for e in results.ENTRIES if e.bench}
    spans = {short_card(card_name(c)): [e["ms"] for e in ((results.part_one_answer(c) or {}).get("eager")
                                                               or {}).values()] for c in cards()}
    for row in headline_rows():
        if row["clock"] != "gpu" or row.get("host_ms") is None or row["host_ms"] <= row["kernel_ms"]:
            continue
        number, card = numbers[row["chapter"]], short_card(row["gpu"])
        if (number, card) in apart:
            continue
        listed = any(r["number"] == number and r["card"] == card and abs(r["gpu_ms"] - row["kernel_ms"]) < 1e-9
                     and abs(r["host_ms"] - row["host_ms"]) < 1e-9 for r in found)
        in_span = number == 5 and any(abs(ms - row["kernel_ms"]) < 1e-9 for ms in spans.get(card, []))
        assert listed or in_span, (row["chapter"], card, row["case"])
    for r in found:  # each row of host_bound, judged here from its times: in the fold exactly where it ties or loses
        assert r["host_ms"] > r["gpu_ms"] and r["step"].startswith("step ")
        mine = [ln for ln in rows if re.match(rf"\| chapter {r['number']:02d}( part [12])? \({r['step']}\) on the "
                                              rf"{r['card']}", ln) and f"| {us(r['host_ms'])} / {us(r['gpu_ms'])} |" in ln]
        if r.get("rival_host_ms") is None:
            continue
        theirs = max(r["rival_host_ms"], r["rival_ms"])
        tie = abs(theirs / r["host_ms"] - 1) < results.TIE_WITHIN
        dense = bool(r.get("dense") and max(r["dense"]) < r["host_ms"])
        assert len(mine) == (tie or theirs < r["host_ms"]) + dense, (r, mine)
    # the lines: one a chapter (05: a part), their counts adding up to the counts of comparisons
    total, ahead, tied, lost_n, where = results.host_bound_markdown(counts=True)
    assert total == ahead + tied + lost_n
    assert tied == sum(ln.split(" | ")[-1].startswith("a tie with ") for ln in rows)
    assert lost_n == sum(" would be faster" in ln.split(" | ")[-1] for ln in rows)
    lines = head.strip().splitlines()
    assert lines and all(re.match(r"- \*\*\d\d\. [^*]+\*\*: ours stays ahead in ", ln) for ln in lines), lines
    assert len({ln.split("**")[1] for ln in lines}) == len(lines)
    sums = [0, 0, 0, 0]
    for ln in lines:
        n = (1 if "in the one comparison" in ln else 2 if "in both comparisons" in ln else
             int(re.search(r"in (?:all )?(?:\d+ of )?(\d+) comparisons", ln).group(1)))
        up = int(m.group(1)) if (m := re.search(r"ours stays ahead in (\d+) of \d+ comparisons", ln)) else n
        ties_here = sum(int(k) for k in re.findall(r"ties with [^,]+? at (\d+)", ln))
        lost_here = sum(int(k) for k in re.findall(r"loses to [^,]+? at (\d+)", ln))
        assert up + ties_here + lost_here == n, ln
        sums = [a + b for a, b in zip(sums, (n, up, ties_here, lost_here))]
    assert sums == [total, ahead, tied, lost_n], (sums, total, ahead, tied, lost_n)
    lost = {ln.split(" | ")[0][len("| chapter "):][:2] for ln in rows if "would be faster" in ln}
    if len(lost) == 1:
        assert where == f"all in chapter {lost.pop()}", where
    # ternary step 21 at 4096 x 14336 on either card: where cuBLAS bf16 on the dense matrix wins called eagerly, the
    # fold has its row, with the dense baseline's own times
    for r in found:
        if r["number"] == 5 and r.get("dense") and max(r["dense"]) < r["host_ms"]:
            assert any(ln.startswith(f"| chapter 05 part 2 (step 21) on the {r['card']} at 4096 × 14336")
                       and f"| {us(r['dense'][0])} / {us(r['dense'][1])} |" in ln for ln in rows), r


def test_calls_made_eagerly_list_no_row_where_ours_stays_ahead():
    """The eager fold's rule: the lines count a chapter's comparisons, and the fold holds only the rows where ours
    ties or loses; a row where ours stays ahead (chapter 02's one call in two rows, a weaker rival's) is not listed."""
    whole = results.host_bound_markdown()
    fold = whole.split(f":::{{dropdown}} {results.HOST_BOUND_FOLD}", 1)[1] if ":::{dropdown}" in whole else ""
    assert "ours stays" not in fold and "ours stays ahead" in whole.split(":::{dropdown}")[0]
    assert "two rows" not in whole and "(weaker" not in whole  # a row where ours stays ahead is counted, not listed


def test_landing_table_still_renders():
    table = results.reading_path_markdown()
    assert table.count("\n| [") >= 9


def _landing_cells(column: int = 2) -> dict[str, str]:
    """The landing table's cells of one column (2: the answer, 3: whose code it is against), by page name."""
    table = results.reading_path_markdown()
    rows = [ln for ln in table.splitlines() if ln.startswith("| [")]
    return {ln.split("](")[0][3:]: [c.strip() for c in ln.split(" | ")][column] for ln in rows}


def test_landing_answers_are_one_number_each_with_the_eager_caveats_in_short_sentences():
    """Each answer cell of the landing table is one headline number (a ratio or a range), with at most one short range
    in brackets where the chapter has one (chapters 03 and 04), their caveats on the results page; chapter 08 gives
    two, as its page does (copying documents, then low-copy requests); chapter 05 part 2 says its tie apart from its
    wins (a tie is not the low end of a win); where a call made eagerly loses to the rival (chapter 05 part 2), its cell says so
    beside its clock, and under the table short sentences, one claim each, say what host time is, whose answer then
    changes and whose holds, with no footnote mark. The column beside it says whose code each answer is against: the
    course's own for chapters 03, 07 and 08, and llguidance's number on the suite beside ours there (chapter 01's
    answer is the real schemas')."""
    table = results.reading_path_markdown()
    header = table.splitlines()[0]
    assert "called eagerly" not in header and header.count(" | ") == 5 and "| against |" in header
    assert "| what it buys a whole step |" in header
    cells = _landing_cells()
    ratio = re.compile(r"\d[\d.,]*(?:–\d[\d.,]*)?[×%]")
    holds, changes = results.eager_headlines()
    for title, cell in cells.items():
        if title.startswith("00.") or cell == "–":
            continue
        if title.startswith("01.") and results.fsm_passes_pair():  # the decision, then one metric on two corpora
            assert cell == results.fsm_passes_pair(), cell
            continue
        if title[:3] in ("03.", "08."):  # two figures, one clause each, the page's lead first (03: the deployed
            # budget, then the stress case)
            first, second = cell.split("; ")
            assert len(ratio.findall(first)) == 1 and len(ratio.findall(second)) == 1, (title, cell)
            continue
        if title.startswith("07.") and results.decode_split(results._card(results.BENCH_RESULTS, "H200")):
            # the answer, then where it comes from on that model: chapter 01's jumps, the allowed sets (with the
            # reuse they assume), chapter 02's head (a tie there, its gain on the 8B cost model)
            # two figures and no more: chapter 01's exact jumps, then with a cached grammar; the split is the results
            # page's
            split = results.decode_split(results._card(results.BENCH_RESULTS, "H200"))
            # what the chapters buy first (chapter 01's jumps, chapter 02's head beside it), then the cached sets
            # (host work, neither chapter's) and the three together, the shipped loop
            real = results.decode_real(results._card(results.BENCH_RESULTS, "H200"))
            first, second = cell.split("; ")  # what the two chapters buy; the cached sets are the results page's
            assert first == f"on SmolLM2-135M, chapter 01's exact jumps {split['jumps']:.2f}×", cell
            assert second.startswith("chapter 02's head "), cell
            from book.decode.lesson import real_verdict

            # the head by chapter 07's one rule: the interleaved run where it exists, else the whole runs together
            head = real_verdict(split["head"], (split.get("again") or {}).get("head"), split.get("interleaved"))
            if head["word"] == "tie":
                assert second.startswith("chapter 02's head a tie there"), cell
            elif head["word"] == "runs disagree":  # the chapter's verdict over its two runs, not one run's number
                assert "unresolved there (two runs disagree)" in second, cell
            else:
                assert second.startswith(f"chapter 02's head {head['x']:.2f}× there" + (
                    " (timed in rounds alternating with and without it)" if head["source"] == "interleaved" else "")), cell
            if split.get("interleaved") is not None:  # the page's number, whatever the whole runs say
                assert head["source"] == "interleaved" and head["x"] == split["interleaved"]["x"]
            assert split["head_8b"] is None or second.endswith(f", {split['head_8b']:.2f}× on the 8B cost model (synthetic weights)"), cell
            assert real is not None
            continue
        if title.startswith("02.") and results.compiled_gather_rows():
            # the kernel alone against its strongest kernel rival first, both times; then the whole step from the
            # bitmask against the path engines ship, both times
            c = results.compiled_gather_rows()[1000]
            lead = next(b for b in results.scoreboard() if b["number"] == 2 and "H200" in b["card"] and b["lead"])
            first, second = cell.split("; ")
            # two decimals under 10 µs: the ratio of the times shown is the ratio printed
            assert first.endswith(f"the kernel alone, given the ids, {c['ratio']:.2f}× ({us(c['ours']['ms'], 2)} "
                                  f"against {us(c['theirs']['ms'], 2)} µs)"), cell
            assert second == (f"the whole step from the bitmask, {lead['vs_rival']:.2f}× ({us(lead['median_ms'])} "
                              f"against {us(lead['rival_ms'])} µs)"), cell
            assert "strongest" not in cell
            continue
        if "(CUDA C++)" in title and "a tie (" in cell:  # its tie, then its wins: never one range from a tie
            assert re.search(r"a tie \(\d\.\d\d×\) at \w+ shapes?, faster at the other \w+ \(up to \d\.\d\d×\)", cell), cell
            assert not re.search(r"\d–\d", cell), cell
            continue
        head, _, bracket = cell.partition(" (")
        assert len(ratio.findall(head)) == 1 and len(ratio.findall(bracket)) <= 1, (title, cell)
        assert cell.count("(") <= 1 and "called eagerly" not in cell and "†" not in cell, (title, cell)
        assert "decode step at most" not in cell and "whole" not in cell, (title, cell)
        assert "entry point" not in cell and "host time" not in cell and "grid" not in head, (title, cell)
        if title.split(". ")[0] + (" part 2" if "(CUDA C++)" in title else "") in changes:
            assert "in a CUDA graph; eagerly, BitNet's kernel wins " in cell, (title, cell)
        else:
            assert ";" not in cell or title.startswith("00."), (title, cell)
    (two,) = [c for t, c in cells.items() if t.startswith("02.")]
    # the kernel alone is given only where its strongest rival, the compiled gather, has a committed run
    assert ("kernel alone" in two) == bool(compiled_gather_leads("compiled_gather")), two
    rivals = _landing_cells(3)
    for title, rival in rivals.items():
        own = title[:3] in ("03.", "07.")
        assert rival.startswith("our own") == own, (title, rival)
        if title.startswith("07."):
            assert "no serving engine measured" in rival, (title, rival)
        if title.startswith("08."):  # the loop it races, and that no serving engine ran under a grammar
            assert rival == "chapter 07's loop (no serving engine raced under a grammar)", rival
    (one,) = [r for t, r in rivals.items() if t.startswith("01.")]
    peer = results.fsm_peers()
    real = results.fsm_peers_real()
    seven = next(c for t, c in cells.items() if t.startswith("07."))
    # the 8B cost model's figure is the results page's; the landing names it only for chapter 02's head
    assert "SmolLM2-135M" in seven and seven.split("chapter 02's head")[0].count("8B") == 0, seven
    (first,) = [c for t, c in cells.items() if t.startswith("01.")]
    suite = results.fsm_suite()
    if peer and real and suite is not None:  # one metric, passes saved, read from the two committed files: ours
        # against the peer on the suite (we lose), then on real schemas; the forced-token share is not this row's
        saved = {(k, p): 1 - t["policies"][p]["passes"] / t["none"]
                 for k, t in (("suite", peer), ("real", real)) for p in ("ours/tokens", results.FSM_PEER)}
        # the real schemas' numbers, then the decision; the suite's are the results page's notes
        # its corpus first, then the real schemas' numbers and the decision; the suite's are the results page's
        assert first == (f"on {real['schemas']} real schemas (SchemaStore), llguidance's fast-forward tokens save "
                         f"{saved['real', results.FSM_PEER]:.1%} of passes, our exact token jumps "
                         f"{saved['real', 'ours/tokens']:.1%}; ship theirs"), first
        assert "suite" not in first, first
        assert "forced" not in first and one == "llguidance's fast-forward tokens (ours keeps the model's own tokens)"
        (buys,) = [ln.split(" | ")[4] for ln in table.splitlines() if ln.startswith("| [01.")]
        assert buys.startswith(f"at most {1 / (1 - saved['real', results.FSM_PEER]):.2f}× a request on the "
                               f"{real['schemas']} real schemas' documents, with llguidance's "
                               "fast-forward tokens"), buys  # a bound for those documents only
    elif peer and suite is not None:  # the suite's share beside the peer's, where the peer is said to save more
        saved = 1 - peer["policies"][results.FSM_PEER]["passes"] / peer["none"]
        assert one.startswith(f"llguidance's fast-forward tokens: {saved:.1%} of passes on the suite"), one
        assert "real schemas" in first and "suite" not in first, first
        # one like-for-like pair on the suite: the peer against our exact jumps, and that we lose
        assert f"against our exact jumps' {suite['default']['saved']['token']:.1%} (we lose" in one, one
        assert "SmolLM2" not in one and "retokeniz" not in one, one
    eight = next(c for t, c in cells.items() if t.startswith("08."))
    assert eight.index("low-copy") < eight.index("extraction (documents written to be copied)"), eight  # as 08
    assert "†" not in table
    if changes:  # one short sentence with the other card's pages, its details on the results page
        (note,) = [p for p in table.split("\n\n") if "without a CUDA graph" in p]
        assert len(re.findall(r"[.!?](\s|$)", note)) == 2 and "(results.md)" in note, note  # two plain sentences
        for chapter in changes:
            assert chapter in note, chapter
    else:  # answers that all hold called eagerly are the results page's to say; 05 part 2's plan is in its cell
        (note,) = [p for p in table.split("\n\n") if "The H100 also ran " in p]
        assert "without a CUDA graph" not in table, table
        if "05 part 2" in holds and results._bitnet_planned():  # its lead holds eagerly only through its plan
            two = next(c for t, c in cells.items() if t.startswith("05.") and "CUDA" in t)
            assert two.endswith(", in a CUDA graph or with its per-layer plan"), two
        assert "The H100 also ran " in note, note
    # the cells are one short clause each: no caveat paragraph under the table, no bracketed aside in the step column
    assert "prices its step" not in table and "KV cache" not in table
    for title, buys in _landing_cells(4).items():  # every cell of one kind: a figure, its step and shape, its kind
        if buys == "–":
            continue
        if title.startswith("02."):  # beside its bound, what chapter 07's loop measured of its head
            buys, _, measured = buys.partition("; measured in 07: ")
            assert re.fullmatch(r"(a tie|\d\.\d\d× \(in alternating rounds\)) on SmolLM2(, \d\.\d\d× on the 8B cost model)?",
                                measured), measured
        assert buys.count("(") == 1 and buys.count(":") == 0 and len(buys) <= 110, (title, buys)
        assert buys.endswith(("(a bound)", "(an estimate)", "(measured)")), (title, buys)
    part_one = next(c for t, c in cells.items() if "(Triton)" in t)
    from book.scoreboard import card_name, cards

    h200 = next(results.part_one_answer(c) for c in cards(BENCH_RESULTS) if "H200" in card_name(c))
    if h200 and h200["failed_faster"]:  # a shape where GemLite is faster but misses our bound: its ratio is said
        assert "where GemLite misses our error bound" in part_one, part_one
    assert "faster than ours" not in part_one and "at all" not in part_one
    # the question of chapter 05 part 2 is the one its answer answers: a ratio against BitNet's kernel
    two = next(h for h in results.headlines() if h["notebook"].endswith("05_ternary_2_cuda.ipynb"))
    assert two["question"].startswith("How much faster than the BitNet kernel")

def test_more_on_each_line_is_short_bullets():
    """The notes under the results table are one bullet per clause under each line's title: no bullet chains
    clauses with semicolons outside parentheses, and none runs long."""
    below = results.summary_markdown().split(results.NOTES_HEAD, 1)[1].strip()
    notes, _, rest = below.partition("\n\n")  # the bullets, one list in one fold, then one footnote: the rivals'
    # versions
    open_notes = notes.splitlines()
    assert all(n <= results.MAX_NOTES for n in
               [len(list(g)) for k, g in itertools.groupby(open_notes, key=lambda ln: ln.startswith("  - ")) if k])
    folded, _, footnote = rest.rpartition("</details>")
    footnote = footnote.strip()
    notes = open_notes + [ln for ln in folded.splitlines() if ln.startswith(("- **", "  - "))]
    assert notes and all(ln.startswith("- **") or ln.startswith("  - ") for ln in notes), notes
    for ln in notes:
        if ln.startswith("  - "):
            assert results.clauses(ln[4:]) == [ln[4:]], ln
            assert len(ln.split()) <= 45, ln
    # the notes add to the table, they do not repeat it: no bullet gives its line's bold headline number again
    table = results.summary_markdown().split(results.NOTES_HEAD, 1)[0]
    for row in [ln for ln in table.splitlines() if ln.startswith("| [")]:
        title = row.split("](")[0][3:]
        bold = re.findall(r"\*\*([\d.,–]+[×%])\*\*", row.split(" | ")[-1])
        if f"- **{title}**" not in notes:
            continue
        mine = open_notes[open_notes.index(f"- **{title}**") + 1:] if f"- **{title}**" in open_notes else []
        mine = mine[:next((i for i, ln in enumerate(mine) if ln.startswith("- **")), len(mine))]
        assert not [b for b in bold for ln in mine if b in ln], (title, bold, mine)
    # about a bullet or two a line, and one more where a called eagerly a rival would win; the rivals' versions
    # are one footnote under the bullets, not a bullet a line
    assert not [ln for ln in notes if "Rivals as run" in ln or "as shipped with torch" in ln]
    assert footnote == results.versions_footnote() and "\n" not in footnote.strip()
    # (20: chapters 07 and 08 each say their ratio is of two medians, beside the spread of the per-request ratios;
    # chapter 07 says what its 8B cost model is; 22: chapter 01's suite and chapter 05 part 1's other card, moved
    # out of their cells so that a cell is one number; 23: chapter 06's 32-head layout, moved out of its cell too)
    # 24: chapter 03's other card, which timed one step only and ties at the headline case)
    # 25: chapter 07's answer split on SmolLM2-135M: the two parts that pay, then chapter 02's head, a tie there)
    bound = 25 + len(results.host_bound_by_chapter())
    assert len([ln for ln in notes if ln.startswith("  - ")]) <= bound
    # no bullet sends the reader to a list elsewhere on the page
    assert not [ln for ln in notes if "listed in the fold" in ln or "foot of this page" in ln]


def test_runs_set_up_differently_are_left_out_with_no_fold():
    """A card's run that is not comparable with the other card's (the scoreboard's flags) is out of its chapter's
    fold on the results page, with no fold of its own; its headline cell shows no ratio and its note says why; no
    run's history is on the page."""
    page = results.headline_tables_markdown()
    moved = results.not_comparable_runs()
    assert "An earlier" not in page
    for number, card in moved:
        chapter = page.split(f":::{{dropdown}} {number:02d}. ")[1].split("\n:::")[0]
        assert f"**{card}**" not in chapter
    summary = results.summary_markdown()
    assert "An earlier" not in summary and "earlier run" not in summary
    for h in results.headlines():
        for name, ok in h["comparable"].items():
            if not ok:
                assert h["cells"][name] == results.VOID and h["ratios"][name] is None
                assert any(n.startswith(f"{name}: not compared on this card") for n in h["notes"][name])
    assert "Where the cards differ" not in page.split(":::{dropdown} 02. ")[1].split("\n:::")[0]
    assert "05. Ternary matmul, part 1 (Triton)" in summary.split(results.NOTES_HEAD)[0]


def test_chapter_4_tables_time_the_entry_points_step_at_each_case():
    """Each chapter 4 row of the folded tables times, at its case, the step the entry point picks there, so that its
    "smallest speedup" rows are the range's ends in the headline table's notes (recomputed from the raw file)."""
    from studylog.ctc.results import entry_series

    page = headlines_page_markdown()
    chapter = page.split(":::{dropdown} Chapter 4:")[1].split("\n:::")[0]
    for path in BENCH_RESULTS.glob("*/ctc.json"):
        rows = json.loads(path.read_text())["measurements"]
        loaded = plotting.load_results("ctc", gpu=path.parent.name)
        for a in sorted({r["params"]["A"] for r in rows if r["series"] == "torch-best"}):
            ratios = []
            for rival in [r for r in rows if r["series"] == "torch-best" and r["clock"] == "gpu"
                          and r["params"]["A"] == a]:
                p = rival["params"]
                series = entry_series(loaded, T=p["T"], N=p["N"], A=p["A"])
                ratios.append(rival["ms"] / _find(rows, series, **p)["ms"])
            assert f"A = {a}, N = " in chapter and f"**{min(ratios):.2f}×**" in chapter


def test_chapter_4_grid_times_one_kernel_per_case_on_every_card():
    """Each card's range over chapter 4's grid times, at each case, the step its entry point runs there: the entry
    point where the file times it, else the step the entry point's rule picks (entry_series), read here from the raw file."""
    from studylog.ctc.results import entry_series

    for path in BENCH_RESULTS.glob("*/ctc.json"):
        rows = json.loads(path.read_text())["measurements"]
        loaded = plotting.load_results("ctc", gpu=path.parent.name)
        ratios = []
        for rival in [r for r in rows if r["series"] == "torch-best" and r["clock"] == "gpu"]:
            p = rival["params"]
            series = entry_series(loaded, T=p["T"], N=p["N"], A=p["A"])
            ours = _find(rows, series, **p)
            ratios.append(rival["ms"] / ours["ms"])
        # against the strongest rival at each case: cuDNN, or torch's native path where it reads faster
        native = {c["where"]: c["native_ms"] for c in results.ctc_native_cases(path.parent)}
        best = []
        for rival in [r for r in rows if r["series"] == "torch-best" and r["clock"] == "gpu"]:
            p = rival["params"]
            ours = _find(rows, entry_series(loaded, T=p["T"], N=p["N"], A=p["A"]), **p)
            best.append(min(rival["ms"], native.get(f"A = {p['A']:,}, N = {p['N']}", rival["ms"])) / ours["ms"])
        assert len(best) == len(ratios)
        (lo, _), (hi, _) = results.ctc_grid(path.parent)
        assert (lo, hi) == (min(best), max(best))


def test_landing_lines_say_one_headline_and_the_eager_caveats():
    """Chapter 2's landing line leads with the results page's headline, the whole step against xgrammar's path;
    chapter 5's says at how many shapes BitNet's kernel is faster called eagerly (the longer of
    host and GPU time of each call, counted from the raw rows), or that through step 23's plan ours stays ahead; chapter 4's says its graph replay and how many of its cases wait on the
    host called eagerly, with no other card's clause; chapter 7's gives the real model's ratio beside the 8B shape's."""
    from book.scoreboard import cards

    lines = {h["number"]: h for h in results.headlines()}
    lead = next(b for b in results.scoreboard() if b["number"] == 2 and "H200" in b["card"] and b["lead"])
    brief = lines[2]["brief"]["H200"]
    if results.compiled_gather_rows():  # the kernel alone against its strongest rival first, then the whole step
        c = results.compiled_gather_rows()[1000]
        assert brief.startswith(f"{c['ratio']:.2f}× torch.compile's fused gather, the kernel alone; "
                                f"{lead['vs_rival']:.2f}× the path engines ship (xgrammar's), the whole step"), brief
    else:
        assert brief.startswith(f"{lead['vs_rival']:.2f}× xgrammar's path"), brief
    assert "like for like" not in lines[2]["brief"]["H200"]
    h200 = next(c for c in cards() if "h200" in c.name)
    pairs = results.bitnet_rows(h200)
    slower = sum(max(o["host_ms"], o["ms"]) > max(p["host_ms"], p["ms"]) for _, _, o, p in pairs)
    plan = results.bitnet_eager(h200)["plan"]  # step 23 through W2A8Plan, where the run timed it
    if slower and plan is not None and not plan["slower_eager"]:  # eagerly the lead holds through the plan
        assert (f"called eagerly, through its plan (`W2A8Plan`) ours stays the faster at all {len(pairs)} shapes; "
                f"the plain function, which checks and chooses every call, loses at {slower}") in lines[5]["brief"]["H200"]
    elif slower:  # counted from the raw rows, as chapter 05 part 2 counts it: never "faster" at every shape unless so
        at = "at every one of its" if slower == len(pairs) else f"at {slower} of its"
        assert f"called eagerly, BitNet's kernel is faster {at} {len(pairs)} shapes" in lines[5]["brief"]["H200"]
        assert "BitNet's kernel would beat ours at these shapes" not in results.host_bound_markdown()
    slow, of = results.ctc_host_bound(h200)
    assert "under CUDA-graph replay" in lines[4]["brief"]["H200"] and "H100" not in lines[4]["brief"]["H200"]
    if slow:
        assert f"called eagerly, {slow} of the {of} cases wait on the host, by their median host times" in \
            lines[4]["brief"]["H200"]
    real = [r for r in _raw_rows("H200", "decode") if r["params"].get("model") == "smollm2"
            and r["params"].get("batch") == 1 and r["params"].get("whitespace") == "compact"]
    import statistics

    ratio = (statistics.median(r["ms"] for r in real if r["series"] == "step01")
             / statistics.median(r["ms"] for r in real if r["series"] == "step03"))
    assert f"{ratio:.2f}× on SmolLM2-135M" in lines[7]["brief"]["H200"]


def test_part_one_answer_on_every_card_that_has_one():
    """Chapter 05 part 1 has an answer on every card that ran GemLite, and the results page says once why GemLite
    passes our check at different shapes on each card when it does."""
    from book.scoreboard import card_name, cards

    passed = {}
    for folder in cards(BENCH_RESULTS):
        part_one = results.part_one_answer(folder)
        if part_one is not None:
            passed[short_card(card_name(folder))] = frozenset(part_one["ratios"])
    assert passed
    line = results.part_one_line()
    for name, cell in line["cells"].items():  # the line says the bound GemLite is held to, where it misses
        failing = results.part_one_answer(results._card(BENCH_RESULTS, name))["failed_faster"]
        said = [n for n in line["notes"][name] if "atomic adds" in n]
        assert len(said) == len(failing), (name, said)


def test_flashinfer_setting_said_once_on_chapter_six():
    (six,) = [h for h in results.headlines() if h["number"] == 6]
    assert not [n for notes in six["notes"].values() for n in notes if "page size" in n]
    fold = results.headline_tables_markdown().split(":::{dropdown} 06. ")[1].split("\n:::")[0]
    assert fold.count("page size") == 1


def test_the_intro_speaks_of_the_cards_not_of_runs_left_out():
    """The results page's intro says which H100 numbers it shows for a reader, with no invitation into which runs
    were left out and why."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "results.md").read_text()
    intro = " ".join(page.split("```{code-cell}")[0].split())
    for said in ("runs left out", "names the runs", "left out, and why", "was set up"):
        assert said not in intro, said
    assert "H100 numbers for the lines not marked *H200 only* are in the folds below" in intro


def test_landing_answers_are_short_and_part_one_says_where_a_failing_gemlite_is_faster():
    """The landing's answer cells give the ratio and its rival, their qualifiers on the chapter's page: chapter 02's
    no longer carries the allowed count; 07's says in a few words that its model is synthetic, with the head's rows
    read from the file. Chapter 05 part 1's answer says
    at how many of the shapes where GemLite fails our check it is faster than ours all the same, counted from the
    file (GemLite's time below step 14's at a failed shape)."""
    import json

    from book import results as res
    from studylog import paths

    lines = {h["number"]: h for h in res.headlines()}
    assert "allowed a sequence" not in lines[2]["brief"]["H200"]
    card = res._card(paths.BENCH_RESULTS, "H200")
    head = re.search(r"'vocab_size': (\d+)", next(n for n in json.loads((card / "decode.json").read_text())["notes"]
                                                 if n.startswith("model 8b: ")))
    layers = re.search(r"'layers': (\d+)", next(n for n in json.loads((card / "decode.json").read_text())["notes"]
                                                if n.startswith("model 8b: ")))
    assert (f"synthetic 8B-shaped model (random weights, one layer's weights reused across all {layers.group(1)} "
            f"layers, a cl100k head of {int(head.group(1)):,} rows)") in lines[7]["brief"]["H200"]
    for card in res.cards(paths.BENCH_RESULTS):
        answer = res.part_one_answer(card)
        if answer is None:
            continue
        rows = json.loads((card / "ternary.json").read_text())["measurements"]

        def ms(series, shape):
            return next(r["ms"] for r in rows if r["series"] == series and r["clock"] == "gpu"
                        and r["params"].get("shape") == shape and r["params"].get("m") == 1)

        want = [s for s in answer["failed"] if ms("gemlite_w2", s) < ms(f"step{res.PART_ONE_STEP:02d}", s)]
        assert answer["failed_faster"] == want
    h200 = res.part_one_answer(paths.BENCH_RESULTS / "nvidia-h200")
    if h200 and h200["failed_faster"]:  # said on the results page, not in the landing's one clause
        text = res.other_answers()["notebooks/05_ternary_1_triton.ipynb"]
        assert "faster than ours" not in text and "fails" not in text
        text = res.summary_markdown()
        (line,) = [ln for ln in text.splitlines() if "part 1 (Triton)](" in ln]
        notes = text.split("- **05. Ternary matmul, part 1 (Triton)**", 1)[1].split("\n- **", 1)[0]
        for shape in h200["failed_faster"]:  # the line names the shape in a clause of its own, its notes both times
            t = h200["times"][shape]
            # its ratio in a clause of its own, beside the range over the passing shapes
            assert (f"; {t['rival_ms'] / t['ms']:.2f}× at {shape.replace('x', ' × ')}, where GemLite misses our "
                    f"{t['tolerance']:.2%} error bound on the H200") in line, line
            assert (f"At {shape.replace('x', ' × ')} GemLite is faster ({res.us(t['rival_ms'])} against "
                    f"{res.us(t['ms'])} µs) but misses our bound ({t['error']:.2%} error)") in notes, notes
        for shape in [k for k, v in h200["ratios"].items() if v < 1]:  # a loss where GemLite passes says so
            assert f"slower at {shape.replace('x', ' × ')}, where GemLite passes" in line, line
            assert f"At {shape.replace('x', ' × ')}, where GemLite passes our check, step" in notes, notes


def test_reading_time_counts_the_diffs_a_chapter_prints_through_its_lesson():
    """A page whose diffs come from its lesson module (chapter 05 part 2's device_diff, chapter 04's step_core, or a
    notebook function that displays one) has each counted in its reading time, as a page that calls show_diff
    directly does: one allowance per listing, not per line."""
    import json

    from book import results as res

    for notebook in ("notebooks/05_ternary_2_cuda.ipynb", "notebooks/04_ctc_loss.ipynb"):
        cells = json.loads((REPO_ROOT / notebook).read_text())["cells"]
        shown = [c for c in cells if c["cell_type"] == "code" and "hide-output" not in c["metadata"].get("tags", [])]
        displayed = sum("".join(c["source"]).count("display(lesson.") for c in shown)
        blocks = res.listing_blocks(notebook)
        assert blocks >= displayed > 3, (notebook, blocks, displayed)
        prose, total = res.reading_minutes(notebook)
        assert total >= prose + blocks * res.LISTING_MINUTES - 1


def test_host_bound_table_covers_chapters_3_and_4_headline_cases_beyond_the_scoreboard():
    """The results page's host-time table lists every chapter 03 and 04 headline case (not only the scoreboard's) whose
    eager host time exceeds its GPU time, read from the chapter's file, with the rival's own times from the same file."""
    import json

    from book import results as res
    from studylog import paths

    found = res.host_bound()
    data = json.loads((paths.BENCH_RESULTS / "nvidia-h200" / "ngram.json").read_text())["measurements"]
    (entry,) = [r for r in data if r["series"] == "ngram_match" and r["clock"] == "gpu" and "corpus" not in r["params"]
                and (r["params"]["batch"], r["params"]["seq_len"], r["params"]["threshold"]) == (32, 512, 128)]
    if entry["host_ms"] > entry["ms"]:
        (row,) = [r for r in found if r["number"] == 3 and r["card"] == "H200" and "32 slots" in r["at"]]
        assert row["host_ms"] == entry["host_ms"] and row["gpu_ms"] == entry["ms"] and row["rival"] == "step 3"
    ctc = json.loads((paths.BENCH_RESULTS / "nvidia-h200" / "ctc.json").read_text())["measurements"]
    slow = [r for r in ctc if r["series"] == "ctc_loss" and r["clock"] == "gpu" and r["params"].get("A") == 28
            and r.get("host_ms", 0) > r["ms"]]
    headline_n = [h for h in res._committed_headlines() if h["chapter"] == "ctc" and "A = 28" in h["case"]
                  and h["gpu"].startswith("NVIDIA H200")]
    for h in headline_n:
        n = int(re.search(r"N = (\d+)", h["case"]).group(1))
        if any(r["params"]["N"] == n for r in slow):
            assert any(r["number"] == 4 and r["card"] == "H200" and f"N = {n}" in r["at"] for r in found)
    assert len({(r["number"], r["card"], round(r["gpu_ms"], 9)) for r in found}) == len(found)  # none repeated


def test_a_card_left_out_of_a_chapters_fold_is_said_at_its_top():
    """A chapter whose run on one card is set up differently from the other card's has that card's tables left out
    of its fold on the results page; the fold opens with a sentence naming the card and why, and the README keeps the
    table under a line saying it is not compared."""
    import re

    from book.plotting import readme_headlines
    from book.scoreboard import card_name, cards

    moved = results.not_comparable_runs()
    page = results.headline_tables_markdown()
    readme = readme_headlines()
    names = [card_name(c) for c in cards()]
    for (number, card), why in moved.items():
        fold = re.search(rf":::\{{dropdown\}} {number:02d}\. [^\n]+\n\n([^\n]+)", page)
        assert fold, number
        others = [n for n in names if (number, n) not in moved]
        assert fold.group(1) == results.left_out_words(card, why, others)
        assert f"on the {card.replace('NVIDIA ', '').replace(' 80GB HBM3', '')} {why}." in readme


def test_chapter_one_peer_file_is_the_chapters_comparison():
    """The llguidance totals the landing and results lines quote are chapter 01's peer comparison, rerun here on the
    suite (needs the peers: pip install -e '.[peers]')."""
    import pytest

    from book.fsm import matchers

    if any(v is None for v in matchers.peer_versions().values()):
        pytest.skip("xgrammar or llguidance is not installed")
    from book.fsm import peers

    committed = results.fsm_peers()
    assert committed is not None, "assets/data/fsm_peers.json is missing: run write_fsm_peers()"
    assert committed == results.fsm_peer_totals(peers.compare_peers(n_samples=8, seed=0))
    assert committed["none"] == results.fsm_suite()["default"]["passes"]["none"]  # the same documents as the suite


def test_chapter_one_line_sets_the_strongest_peer_beside_ours():
    """Chapter 01's results line and card give llguidance's fast-forward saving beside ours, from the committed file;
    without the file they say nothing of it."""
    peer = results.fsm_peers()
    (one,) = [h for h in results.headlines() if h["number"] == 1]
    words = results.fsm_peer_words(peer)
    first = next(iter(one["cells"].values()))  # a count, written out on the first card, "the same" on the others
    # the cell says first that ours loses to the named peer on the suite, unbolded, then the same metric (passes
    # saved) on the real schemas where that run is committed, else the real schemas' forced share
    theirs = results.peer_bare(words).split(': ', 1)[1]
    if results.fsm_peers_real():
        real = results.fsm_peers_real()
        assert words and "forced" not in first, first
        # the real schemas alone, their corpus named; the suite's shares are the notes' (one document set a line)
        assert first == (f"on {real['schemas']} real schemas: llguidance "
                         f"{results.passes_saved(real, results.FSM_PEER):.1%}, ours "
                         f"{results.passes_saved(real, 'ours/tokens'):.1%} of passes saved"), first
        assert one["brief"]["H200"] == results.fsm_passes_pair()
        assert one["brief"]["H200"].startswith(f"on {real['schemas']} real schemas (SchemaStore), llguidance's "
                                               f"fast-forward tokens save {results.passes_saved(real, results.FSM_PEER):.1%}")
        suite_notes = " ".join(one["notes"]["H100"] + one["notes"]["H200"])
        assert f"against llguidance's fast-forward tokens' {theirs} (we lose)" in suite_notes, suite_notes
        assert "step 2, our exact token jumps" in suite_notes and "step 3, our character jumps (xgrammar's string" in suite_notes
    else:
        behind = f"against llguidance's {theirs} on the suite (we lose); "
        assert words and behind in first and first.endswith("% of tokens forced, real schemas"), first
        assert f"{words} on the suite" in one["brief"]["H200"]
    (line,) = [ln for ln in results.summary_markdown().splitlines() if "01. FSM compression](" in ln]
    notes = results.summary_markdown().split("- **01. FSM compression**")[1].split("\n- **")[0]
    assert "-entry suite (not the real schemas), step 2, our exact token jumps, saves" in notes.splitlines()[1] and "**" not in first
    assert "strongest peer" in one["what"]
    assert results.fsm_peer_words(None) == ""


def test_results_page_says_why_its_headline_case_and_shows_no_plumbing():
    """Chapter 04's line says why its case (the large alphabet's smallest lead, checked against the grid), and its
    answer gives the grid's range; the page's prose names no benchmark-file field; the decode loops' folds say why they show no
    spread; every shape in the page's tables is written with ×."""
    from pathlib import Path

    (four,) = [h for h in results.headlines() if h["number"] == 4]
    card = results._card(BENCH_RESULTS, "H200")
    big = [c for c in results.ctc_cases(card) if c["case"].startswith("alphabet 5,000,")]
    if min(big, key=lambda c: c["ratio"])["case"] == "alphabet 5,000, batch 8":
        assert "the batch where our lead is smallest" in four["what"]
    (lo, _), (hi, _) = results.ctc_grid(card)
    # one number a cell: the grid's range is the line's note
    assert f"{lo:.2f}–{hi:.2f}×" not in four["cells"]["H200"] and any(f"from {lo:.2f}× at " in n and f" to {hi:.2f}× (" in n for n in four["notes"]["H200"])
    page = (Path(__file__).resolve().parents[1] / "results.md").read_text()
    assert "floor_ms" not in page and "when the page is built" not in page
    folds = results.headline_tables_markdown()
    for number, words in results.LOOP_WORDS.items():
        fold = folds.split(f":::{{dropdown}} {number:02d}. ")[1].split("\n:::")[0]
        assert words in fold
    text = folds + results.summary_markdown() + results.host_bound_markdown()
    assert not re.search(r"\d x \d|N x K|slots x|items x|heads x", text)


def test_the_cards_differences_read_as_a_table():
    from book.site import difference_cells

    item = ("the ternary kernel with TMA copies (step 21, CUDA C++) against cuBLAS bf16 (torch x @ W.T, both in a "
            "CUDA graph) (M = 1, N × K = 4096 × 14336, bf16 x): 4.51× on the NVIDIA H100 80GB HBM3, 3.36× on the "
            "NVIDIA H200.")
    assert difference_cells(item) == ("step 21, CUDA C++", "cuBLAS bf16", "M = 1, N × K = 4096 × 14336, bf16 x",
                                      {"H100": "4.51×", "H200": "3.36×"})
    assert difference_cells("no pair here") is None


def test_landing_names_its_pages_as_the_cards_do_and_asks_a_question_on_every_row():
    """The landing table's names are the cards' (page_titles), every row asks a question without an apostrophe (the
    site test finds questions in the page's text, where an apostrophe may turn curly), and the note under it gives
    the whole course's reading time and a short route."""
    table = results.reading_path_markdown()
    titles = results.page_titles()
    for notebook, title in titles.items():
        assert f"| [{title}]({notebook}) |" in table
    questions = [ln.split(" | ")[1] for ln in table.splitlines() if ln.startswith("| [")]
    assert all("?" in q and "'" not in q and "’" not in q for q in questions), questions
    words = results.reading_path_words()
    assert words.startswith("The course reads in ") and "With an afternoon, read 00, then " in words
    assert "words a minute" not in words  # how a time is counted is the authors', not the reader's
    assert table.endswith(words)  # one paragraph under the table: the course's time and a short route
    exercises = sum(results.exercise_count(n) for n in results.reading_order())
    assert exercises and f"the {exercises} exercises come on top" in words


def test_chapter_three_leads_with_its_headline_case_then_its_range():
    """Chapter 03's landing answer leads with the deployed budget's ratio, then the stress case (where the most
    slots search), as its results cell does; the ratios at the other shapes (step 4's GPU time over the entry
    point's, recomputed from the raw file, as ``book.ngram.lesson.rival_ratios`` reads them), most of them against
    the port's untuned grid, are in the fold, which lists the rows behind the range, and not in the line's notes,
    where a skimmer could take them for the headline."""
    rows = _raw_rows("H200", "ngram")
    grid = {}
    for r in rows:
        p = r["params"]
        if r["clock"] == "gpu" and "corpus" not in p and r["series"] in ("step04", "ngram_match") and "batch" in p \
                and p.get("corpus") is None and set(p) == {"batch", "seq_len", "threshold"}:
            grid.setdefault((p["batch"], p["seq_len"], p["threshold"]), {})[r["series"]] = r["ms"]
    ratios = [g["step04"] / g["ngram_match"] for g in grid.values() if len(g) == 2]
    said = f"{min(ratios):.2f}–{max(ratios):.1f}×"
    (cell,) = [c for t, c in _landing_cells().items() if t.startswith("03.")]
    many, x, k = results.ngram_many(BENCH_RESULTS / "nvidia-h200")
    lead = grid[many]["step04"] / grid[many]["ngram_match"]
    deployed = (grid[(32, 512, 128)]["step04"] / grid[(32, 512, 128)]["ngram_match"]) if (32, 512, 128) in grid \
        else None
    if deployed is not None:  # the deployed budget leads, as on the results page; the stress case follows
        assert cell.startswith(f"{deployed:.2f}× at 32 × 512, budget 128; "), cell
    assert cell.endswith(f"; {lead:.2f}× at {many[0]} × {many[1]:,}, no budget"), cell
    (line,) = [ln for ln in results.summary_markdown().splitlines() if "03. N-gram matching](" in ln]
    assert re.search(rf"\*\*{lead:.2f}×\*\* at {many[0]} × {many[1]:,}(, step \d+)? \(", line) and said not in line, line
    notes = results.summary_markdown().split("- **03. N-gram matching**")[1].split("\n- **")[0]
    deployed = grid[(128, 32768, 128)]["step04"] / grid[(128, 32768, 128)]["ngram_match"]
    assert "under the deployed budget, 128 × 32,768" in notes and f"{deployed:.2f}×" not in notes, notes
    assert said not in notes and "one-block-a-slot" not in notes, notes
    assert f"{k} of the {many[0]} slots search" in notes, notes
    page = results.headline_tables_markdown()
    fold = page.split(":::{dropdown} 03. ")[1].split("\n:::")[0]
    weaker = page.split(f":::{{dropdown}} {results.WEAKER_TITLE}")[1].split("\n:::")[0]
    for (b, t, _), g in grid.items():  # the untuned grid's rows in the last fold, labelled; every other in the chapter's
        if len(g) != 2:
            continue
        x = g["step04"] / g["ngram_match"]
        untuned = b <= results.NGRAM_UNTUNED["most_slots"] and t >= results.NGRAM_UNTUNED["least_tokens"]
        assert (f"| **{x:.2f}×**" in fold) != untuned, (b, t, x)
        assert any(f"| **{x:.2f}×** |" in ln and "one block a slot" in ln for ln in weaker.splitlines()) == untuned
    assert f"| **{deployed:.2f}×**" in fold


def test_chapter_six_fold_shows_the_one_case_it_loses():
    """Chapter 06's fold has, on each card that times it, the case where causal SDPA beats the kernel (the ratio
    recomputed from the raw file), and its notes say so."""
    page = results.headline_tables_markdown()
    fold = page.split(":::{dropdown} 06. ")[1].split("\n:::")[0]
    rows = _raw_rows("H200", "multi_item")
    ours, sdpa = (_find(rows, s, shape="prefix 2048, 32 items x 32") for s in ("step05", "causal SDPA (superset)"))
    assert sdpa["ms"] < ours["ms"]
    line = next(ln for ln in fold.splitlines() if ln.startswith("| ") and "prefix 2048, 32 items × 32" in ln
                and f"**{sdpa['ms'] / ours['ms']:.2f}×**" in ln)
    assert f"{ours['ms'] * 1e3:,.1f} (" in line and f"{sdpa['ms'] * 1e3:,.1f} (" in line
    (six,) = [h for h in results.headlines() if h["number"] == 6]
    # framed as the chapter frames it: a speed reference computing a superset, not a rival; its time against ours
    assert any("speed reference" in n and f"{sdpa['ms'] * 1e3:,.1f} against our {ours['ms'] * 1e3:,.1f} µs" in n
               for n in six["notes"]["H200"])


def test_a_folds_tables_share_one_layout_on_every_card():
    """The tables at the same place under each card's title in a fold have the same columns: an "ours" column moved
    into a line on one card is moved on every card."""
    page = results.headline_tables_markdown()
    for fold in page.split(":::{dropdown} ")[1:]:
        fold = fold.split("\n:::")[0]
        heads: dict[int, set[str]] = {}
        for card in fold.split("**NVIDIA")[1:]:
            if "Against BitNet's own W2A8 kernel" in card:  # chapter 05 part 2's headline rows, first, a table apart
                continue
            lines = card.splitlines()
            tables = [ln for ln, nxt in zip(lines, lines[1:] + [""]) if ln.startswith("| ") and nxt.startswith("|---")]
            # counted from the card's last table: a first table whose every row a later one repeats goes
            for k, head in enumerate(reversed(tables)):
                heads.setdefault(k, set()).add(head)
        assert all(len(h) == 1 for h in heads.values()), (fold.splitlines()[0], heads)


def test_lines_without_another_cards_number_say_so():
    """The results table marks a line "H200 only" exactly where no other card's ratio stands in the folds (chapter 01
    counts passes on no card), and the landing names the pages that have one."""
    also = results.also_timed()
    table = results.summary_markdown().split(results.NOTES_HEAD, 1)[0]
    for row in [ln for ln in table.splitlines() if ln.startswith("| [")]:
        notebook = row.split("](")[1].split(")")[0]
        # chapter 06's other card timed its 32-head case only, not the grouped-query headline: H200 only too
        only = notebook not in also or ("/06_" in notebook and not results.gqa_elsewhere())
        assert ("; H200 only |" in row) == (only and "/01_" not in notebook), row
    landing = results.reading_path_markdown()
    ran = landing.split("The H100 also ran ")[1].split(";")[0]
    assert "06" in ran and (results.gqa_elsewhere() or "06's 32-head case" in ran), ran


def test_landing_lines_of_chapters_seven_and_eight_say_the_model_and_the_gate():
    """Chapter 07's answer leads with the real model and calls the 8B run the 8B cost model, measured on synthetic weights (how it is built,
    the chapter's page); chapter 08's answer gives both workloads, copying documents first; chapter 08's loop
    with the gate switched on, from the raw file as the headline counts it, is in its results line's notes, not the landing's
    one-number cell."""
    import statistics

    from studylog.speculate.report import closed_requests

    cells = _landing_cells()
    seven = next(c for t, c in cells.items() if t.startswith("07."))
    # on SmolLM2-135M: what the two chapters buy, chapter 01's exact jumps, then chapter 02's head (a tie there)
    # beside its gain on the 8B cost model; the cached allowed sets (host work, neither chapter's) are the results
    # page's, with the loop to use on a small model
    split = results.decode_split(results._card(BENCH_RESULTS, "H200"))
    assert seven == results.decode_split_words(split, landing=True), seven
    assert seven.startswith("on SmolLM2-135M, chapter 01's exact jumps ") and "(host work, " not in seven, seven
    # the results line's cell is the same answer; the loop for a small model (3a: host work) is in its notes
    h7 = next(h for h in results.headlines() if h["number"] == 7)
    line, notes = h7["cells"]["H200"], h7["notes"]["H200"]
    base, small = split["small"]
    assert line.startswith(results.decode_split_words(split, landing=True, bold=True)) and "host work" not in line, line
    assert any(f"a small model's loop, step 2 with its allowed sets cached and no masked head (3a, host work, {split['sets']:.2f}×), runs "
               f"{base / small:.2f}× step 1's" in n for n in notes), notes
    rows = _raw_rows("H200", "speculate")
    kept = closed_requests(rows, "extraction")

    def med(series):
        return statistics.median(r["ms"] for r in rows if r["series"] == series and r["params"].get("batch") == 1
                                 and r["params"].get("workload") == "extraction" and r["params"]["request"] in kept)

    eight = next(c for t, c in cells.items() if t.startswith("08."))
    gated = f"{med('ch7_step03') / med('step04'):.2f}×"
    assert gated not in eight, eight  # one number a cell: the loop with the gate switched on is the results page's
    assert "the median of" not in eight, eight  # a ratio of two medians: the results page's notes say so
    low = results.speculate_workloads(results._card(BENCH_RESULTS, "H200"))["low_copy"]["ratio"]
    assert "extraction (documents written to be copied)" in eight and f"{low:.2f}× on low-copy requests" in eight, eight
    notes = results.summary_markdown().split("- **08. ")[1]
    # the draft gate the chapter did not ship is the chapter's detail; the low-copy requests are the line's note
    assert gated not in notes and "draft gate" not in notes
    (line,) = [ln for ln in results.summary_markdown().splitlines() if "08. Speculation under a grammar](" in ln]
    assert line.rstrip(" |").rsplit(" | ", 1)[-1].startswith(f"**{low:.2f}×** on low-copy requests ("), line


def test_each_line_gives_its_rivals_versions_from_the_committed_files():
    """Under each line of the results table, the rivals' versions as the chapter's run recorded them: FlashInfer's,
    GemLite's and xgrammar's from the files' notes, torch's for the kernels torch ships; where a file records none, the
    library named alone (BitNet's commit) or left out (chapter 07's xgrammar): only versions a run recorded."""
    notes = results.summary_markdown().split(results.NOTES_HEAD, 1)[1].split("\n\n")[-1]
    assert notes.startswith("Rivals' versions as run, by chapter: ")  # one footnote for every line
    h200 = next(p for p in (results.BENCH_RESULTS).iterdir() if p.name.endswith("h200"))
    for stem, pattern in (("multi_item", r"flashinfer (\S+)"), ("ternary", r"GemLite (\d\S+)"),
                          ("masked_lm_head", r"xgrammar (\d\S+)")):
        said = " ".join(json.loads((h200 / f"{stem}.json").read_text())["notes"])
        version = re.search(pattern, said).group(1)
        assert f" {version}" in notes, (stem, version)
    torch = json.loads((h200 / "ctc.json").read_text())["versions"]["torch"]
    assert f"as shipped with torch {torch} (" in notes and "cuDNN" in notes.split(f"with torch {torch}")[0]
    assert notes.count(f"torch {torch}") == 1  # said once, with the chapters that race torch's kernels
    assert "BitNet's kernel from microsoft/BitNet" in notes or "BitNet's kernel at commit" in notes
    # a version the file lacks is said plainly, never implied by the course's requirement
    assert "as the course requires" not in notes and "≥" not in notes, notes
    for item in notes.split(": ", 1)[1].split(". ")[0].split("; "):
        assert re.search(r"\d", item.split(" (")[0]) or "BitNet" in item, item
    assert "not recorded" not in notes, notes


def test_chapter_four_landing_gives_its_headline_and_the_results_page_the_grids_range():
    """Chapter 04's landing answer: the grid's range against the strongest rival at each case (the faster of cuDNN
    and torch's native path), then in brackets the headline ratio against cuDNN at its case; the rival's cell names
    the rival alone; the results page's note gives the range's two ends, each case named, and the H200's fold
    lists both ends' cases; all from the committed file."""
    card = results._card(BENCH_RESULTS, "H200")
    (lo, lo_at), (hi, hi_at) = results.ctc_grid(card)
    (cell,) = [c for t, c in _landing_cells().items() if t.startswith("04.")]
    assert cell.startswith(f"{lo:.2f}–{hi:.2f}× against torch's faster path at each case (") and " against cuDNN at " in cell, cell
    assert cell.count("(") == 1 and "over" not in cell, cell
    row = next(ln for ln in results.reading_path_markdown().splitlines() if ln.startswith("| [04."))
    assert row.split(" | ")[3] == ("cuDNN (a library, through torch)" if results.ctc_native_cases(card) else
                                   "cuDNN (a library, through torch), the faster of torch's two CTC paths at every case"), row
    summary = results.summary_markdown()
    native = [c for c in results.ctc_native_cases(card) if c["ratio"]]
    # the range is against torch's faster path at each case: the note says so, and names each case where torch's
    # native path reads faster than cuDNN, with its clock and ours against it
    said = f"Over {len(results.ctc_cases(card))} cases against torch's faster path at each case"  # the range's rival
    assert said in summary and f"from {lo:.2f}× at " in summary.split(said, 1)[1].split("\n")[0], summary
    for c in native:
        where = c["where"].replace("A = ", "alphabet ").replace(", N = ", ", batch ")
        assert (f"{where}, torch's native path reads faster than cuDNN on the kernel clock ({c['native_ms'] * 1e3:,.1f} "
                f"µs), and ours is {c['ratio']:.2f}× faster than it") in summary
    top = max(results.ctc_strongest(card), key=lambda c: c["best_ratio"])
    assert f"to {hi:.2f}× ({top['ours']['ms'] * 1e3:,.1f} against {top['best_rival']}'s " in summary
    # the H200's fold lists the range's two ends
    fold = results.headline_tables_markdown().split(":::{dropdown} 04. ")[1].split("\n:::")[0].split("**NVIDIA H200**")[1]
    for at in (lo_at, hi_at):
        a, n = re.match(r"alphabet ([\d,]+), batch(?:es)? (\d+)", at).groups()
        assert f"A = {a.replace(',', '')}, N = " in fold, (at, fold)


def test_calls_made_eagerly_are_a_paragraph_and_one_sentence_a_chapter():
    """The foot of the results page says in a paragraph what a call made eagerly costs and which headlines fail or
    hold called that way (no count of comparisons), then folds the cases with both sides' host and GPU times, so the
    claim can be checked on the page; each chapter where a rival would then win says so in one bullet under its line,
    naming the shapes, with no pointer to a list."""
    sentence = results.eager_sentence()
    assert sentence.startswith(results.EAGER_WORDS)
    assert "|" not in sentence and ":::" not in sentence and "Calls that wait on the host" not in sentence
    assert "of the comparisons on this page" not in sentence  # which headlines, not a count
    holds, changes = results.eager_headlines()
    assert "no headline fails" not in sentence  # a chapter's plain call can lose where its plan holds
    assert ("each still leads its rival" in sentence) == bool(holds), sentence
    assert ("is lost" in sentence) == bool(changes), sentence
    if results.plan_holds(results._bitnet_eager_card()):  # the plain function's losses are said beside the plan
        assert re.search(r"its plain function, which checks its inputs on every call, loses at (all \d+|\d+ of its \d+) "
                         r"shapes", sentence), sentence
    slim = results._ngram_called_vs_loop()
    if slim is not None:  # chapter 03's call as a reader makes it, against the loop it replaces, where that is closest
        assert f"{slim[1]:.2f}× the CPU loop it replaces at {slim[0][0]} × {slim[0][1]:,}" in sentence, sentence
    assert all(h in sentence for h in holds + changes), sentence
    page = (REPO_ROOT / "results.md").read_text()
    # the case-by-case list, folded, follows the paragraph: the rival's host time beside ours where a file has it
    assert "Markdown(eager_sentence() + \"\\n\\n\" + host_bound_markdown())" in page
    assert "the rival: host per call / GPU (µs)" in results.host_bound_markdown()
    flips = results.host_bound_by_chapter()
    for key, said in flips.items():
        assert said.startswith("called eagerly, one call at a time, ") and "(listed" not in said, said
        assert "would be faster in " not in said  # the shapes named, not a count of comparisons
    notes = results.summary_markdown().split(results.NOTES_HEAD, 1)[1]
    for block in re.split(r"^- \*\*", notes, flags=re.M)[1:]:
        assert sum(ln.startswith("  - Called eagerly, ") for ln in block.splitlines()) <= 1, block
    # chapter 05 part 2: the plan and the dense rival in one sentence, each named
    two = flips.get((5, 2), "")
    if "W2A8Plan" in two:
        assert "BitNet's kernel" in two and ("cuBLAS" not in two or "would beat step 21" in two), two
    # chapter 03: the shape where our port would win, in the chapter's words
    three = flips.get((3, 0), "")
    if three:
        # counted over every shape measured (the chapter's count), then the subset where ours waits on the host
        m = re.search(r"our FastDeploy port would be faster at (\d+) of the (\d+) shapes measured \(\d+ slots × .*\), "
                      r"(?:one|all) among the (\d+) where ours waits on the host", three)
        assert m and int(m[1]) <= int(m[3]) <= int(m[2]), three


def test_chapter_three_cell_is_its_number_and_range():
    """Chapter 03's results cell is two numbers, each at its shape with its two times: the budgeted shape where a
    step is priced, then the stress shape with no budget; how many slots search there, and the one the deployed
    budget lets search, are in the notes under the table."""
    (line,) = [ln for ln in results.summary_markdown().splitlines() if "03. N-gram matching](" in ln]
    cell = line.rstrip(" |").rsplit(" | ", 1)[-1]
    # the budgeted shape where a step is priced first, then the stress shape: two numbers, each with its times
    assert "one-block-a-slot" not in cell and "deployed" not in cell and len(cell.split()) <= 28, cell  # each with its step
    assert len(re.findall(r"\d[\d.,]*(?:–\d[\d.,]*)?×", cell)) == 2 and cell.index("budget") < cell.index("no budget: "), cell
    searching = results.ngram_deployed(BENCH_RESULTS / "nvidia-h200")
    if searching is not None and searching[2] < searching[0][0]:
        notes = results.summary_markdown().split("- **03. N-gram matching**")[1].split("\n- **")[0]
        assert f"against {searching[2]} under the deployed budget" in notes, notes


def test_notes_do_not_repeat_the_landing():
    """The notes under the results table add to the landing's cells: where the landing says llguidance keeps its
    output too, no note says it again, and a shape where GemLite fails our check is named in one note only."""
    notes = results.summary_markdown().split(results.NOTES_HEAD, 1)[1]
    landing = results.reading_path_markdown()
    if "output unchanged too" in landing:
        assert "so the two savings are of one kind" not in notes
    part_one = notes.split("- **05. Ternary matmul, part 1 (Triton)**")[1].split("\n- **")[0]
    for shape in re.findall(r"\d+ × \d+", part_one):
        assert sum(shape in ln for ln in part_one.splitlines() if "GemLite" in ln and "fail" in ln or "misses" in ln) <= 1, shape


def test_part_one_cell_names_a_loss_on_the_other_card_at_a_shape_where_gemlite_fails_here():
    """The results table shows one card: where GemLite fails our check at a shape on it but passes there on another
    card and is faster, the cell says the loss holds on both, from the committed files."""
    from book.scoreboard import card_name, cards

    answers = {short_card(card_name(c)): results.part_one_answer(c) for c in cards(BENCH_RESULTS)}
    line = results.part_one_line()
    for name, answer in answers.items():
        if answer is None or line["cells"].get(name, results.VOID) == results.VOID:
            continue
        for k in answer["failed_faster"]:
            others = [o for o, a in answers.items() if o != name and a and a["ratios"].get(k, 2) < 1]
            said = f"on the {' and '.join(others)} it passes there and is faster too"
            assert (said in line["cells"][name]) == bool(others), line["cells"][name]


def test_ctc_rival_words_name_every_case_where_torch_native_is_faster():
    """torch's native CTC path cannot be captured in a graph, so it meets cuDNN only on the kernel clock: the
    landing's rival cell must not call cuDNN the faster path at every case where a kernel-clock row says otherwise."""
    for card in sorted(p for p in BENCH_RESULTS.iterdir() if (p / "ctc.json").is_file()):
        data = json.loads((card / "ctc.json").read_text())
        native = [r["params"] for r in data["measurements"]
                  if r["series"] == "torch-best span" and r.get("picked") == "torch-native"]
        words = results.ctc_rival_words(card)
        if native:
            assert "every case" not in words and "faster" not in words, words  # against cuDNN, not "the faster path"
            for p in native:
                assert f"A = {p['A']:,}, N = {p['N']}" in words, (card.name, words)
            for c in results.ctc_native_cases(card):  # native's time there, and ours against it
                assert f"{c['native_ms'] * 1e3:,.1f} µs on the kernel clock" in words, words
        else:
            assert "native" not in words or "each case" in words


def test_two_times_beside_a_ratio_carry_the_digits_the_ratio_needs():
    """Times under 10 µs get two decimals, so that a reader dividing them finds the ratio printed beside them."""
    from book.common import against

    assert against(0.00404, 0.00470) == "4.04 against 4.70"  # 1.16×, where "4.0 against 4.7" reads 1.18×
    assert against(0.0190, 0.2032) == "19.0 against 203.2"
    assert against(0.0083, 0.0110) == "8.30 against 11.00"
    assert against(None, 0.0110) == "– against 11.0"  # one time alone: its own digits


def test_weaker_baselines_are_one_last_fold_out_of_the_cards_tables():
    """Rows against a weaker baseline are in no card's table: they stand in one last fold, Weaker baselines, each
    with why it is weaker, its ratio the ratio of the two times it shows."""
    page = results.headline_tables_markdown()
    folds = page.split(":::{dropdown} ")[1:]
    assert folds[-1].startswith(results.WEAKER_TITLE) and sum(f.startswith(results.WEAKER_TITLE) for f in folds) == 1
    assert not any("(weaker" in f for f in folds[:-1])
    rows = [ln for ln in folds[-1].splitlines() if ln.startswith("| ") and not ln.startswith("| chapter, card")]
    assert rows
    for ln in rows:
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        ratio, ours, theirs = (float(re.match(r"\**([\d.,]+)", c).group(1).replace(",", "")) for c in cells[5:8])
        assert cells[4] and abs((theirs / ours) / ratio - 1) < 0.02, ln
    page_md = (REPO_ROOT / "results.md").read_text()
    assert f"*{results.WEAKER_TITLE}*" in page_md and "in the folds, labelled" not in page_md


def test_chapter_eight_batch_eight_row_reads_the_median_batch_as_the_chapter_does():
    """Chapter 08's batch-8 rows, both workloads, print the chapter's number, the median batch's own ratio
    (:func:`book.speculate.lesson.median_pairing`), beside that batch's two times, not the ratio of the medians."""
    from book.speculate import lesson
    from studylog.plotting import load_results

    card = results._card(BENCH_RESULTS, "H200")
    fold = results.headline_tables_markdown().split(":::{dropdown} 08. ")[1].split("\n:::")[0]
    assert set(results.MEDIAN_BATCH_WORKLOADS) == {"extraction", "low_copy"}  # one convention for both
    for workload in results.MEDIAN_BATCH_WORKLOADS:
        pair = lesson.median_pairing(load_results("speculate", gpu=card.name), 8, workload)
        rows = [ln for ln in fold.splitlines()
                if ln.startswith(f"| SmolLM2-135M, {workload.replace('_', '-')}, batch 8,")]
        found = results.speculate_median_batch(card, workload)
        if not rows or found is None:  # no such run on this card
            continue
        (row,) = rows
        assert f"**{pair['median_ratio']:.2f}×**" in row and "the chapter's reading" in row, row
        assert f"| {us(found['ours_ms'])} | {us(found['theirs_ms'])} |" in row
        if found["one_batch"]:  # the ratio is of the times shown
            assert "median batch's own ratio" in row, row
            assert abs(found["theirs_ms"] / found["ours_ms"] - pair["median_ratio"]) < 1e-9
        else:  # an even count: the median times beside the median of the batches' ratios, said so
            assert "batches' own ratios" in row and "beside the median times" in row, row
        assert "median over its batches" not in row, row


def test_the_notes_fold_is_a_dropdown_on_the_page_and_details_in_the_readme():
    """On the results page the notes under the headline table fold like the page's other folds (a dropdown); the
    README, which GitHub renders, keeps the HTML fold."""
    page = results.summary_markdown(dropdown=True)
    assert results.NOTES_DROPDOWN in page and "<details>" not in page
    notes = page.split(results.NOTES_DROPDOWN, 1)[1]
    assert "\n:::" in notes and "</details>" not in notes
    assert results.NOTES_HEAD in results.summary_markdown() and results.NOTES_DROPDOWN not in results.summary_markdown()


def test_words_the_tables_use_come_after_the_headline_table():
    """The definitions fold stands below the headline table and above the cards' tables, not before any result."""
    page = (REPO_ROOT / "results.md").read_text()
    words = page.index(":::{dropdown} Words the tables use")
    assert page.index("Markdown(summary_markdown(dropdown=True))") < words < page.index("## Every row, card by card")


def test_decode_loops_notes_give_the_requests_own_ratios_as_a_range_only():
    """Chapter 07's line is a ratio of median times; its note gives the requests' own ratios as a range, with no
    second statistic (a median of ratios) beside the line's; chapter 08's note names its workload."""
    notes = results.summary_markdown().split(results.NOTES_HEAD, 1)[1]
    seven = notes.split("- **07. ")[1].split("\n- **")[0]
    eight = notes.split("- **08. ")[1].split("\n\n")[0]
    request = [ln for ln in seven.splitlines() if "request by request" in ln]
    assert request and not any("median" in ln for ln in request), request
    own = [ln for ln in eight.splitlines() if "own ratio" in ln]
    assert own and all("copying documents" in ln for ln in own), own
