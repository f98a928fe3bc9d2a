"""The scoreboard and the results summary: every chapter's final kernel is on them, their numbers are the committed
JSON's (one row recomputed here from the raw files, by hand), a change to a file changes them, and the pages that
show them type no measured number and speak to readers, not to the people who built the course."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from book import results as summary
from book import scoreboard as sb
from studylog.paths import BENCH_RESULTS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "scoreboard.md", ROOT / "results.md", ROOT / "intro.md"]
#: What a × floor cell may hold beside its ratio: nothing, one yardstick a cell (the run's own empty kernel is in the
#: notes, our median over the call's own work a column of its own).
BESIDE_FLOOR = ""
H200 = BENCH_RESULTS / "nvidia-h200"
H100 = BENCH_RESULTS / "nvidia-h100-80gb-hbm3"


def _raw(card: Path, chapter: str) -> dict:
    return json.loads((card / f"{chapter}.json").read_text())


def _find(data: dict, series: str, **params) -> dict:
    """The one raw measurement of ``series`` at ``params``: written here again, not taken from the module."""
    found = [r for r in data["measurements"]
             if r["series"] == series and all(r["params"].get(k) == v for k, v in params.items())]
    assert len(found) == 1, f"{len(found)} rows of {series} at {params}"
    return found[0]


def _ternary_row(board, card_folder: Path, case: str = "llama") -> dict:
    """Chapter 5's row on a card at 4096 x 14336 (``llama``) or at BitNet's largest shape (``bitnet``)."""
    name = json.loads(next(card_folder.glob("*.json")).read_text())["device"]["name"]
    (row,) = [r for r in board if r["number"] == 5 and r["card"] == name and r.get("ternary_case") == case]
    return row


def _table_rows(text: str) -> list[dict[str, str]]:
    """Every row of every Markdown table of chapters in ``text``, as {column header: cell}, written here again; the
    Notes' small tables of a chapter's rows (first column "row") are not the scoreboard's."""
    out, header = [], None
    for ln in text.splitlines():
        if not ln.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in ln.strip().strip("|").split(" | ")]
        if header is None:
            header = cells
        elif not set(ln) <= set("|-") and header[0] != "row":
            out.append(dict(zip(header, cells)))
    return out


def _board_row(board, number: int, card_folder: Path) -> dict:
    name = json.loads(next(card_folder.glob("*.json")).read_text())["device"]["name"]
    (row,) = [r for r in board if r["number"] == number and r["card"] == name and r["lead"]]
    return row


# ----------------------------------------------------------------------------------------------
# Every chapter is there
# ----------------------------------------------------------------------------------------------

def test_every_chapter_has_an_entry_in_course_order():
    numbers = [e.number for e in sb.ENTRIES]
    assert numbers == list(range(1, len(numbers) + 1)), f"chapters out of order or missing: {numbers}"
    assert numbers[:7] == [1, 2, 3, 4, 5, 6, 7]
    for entry in sb.ENTRIES:
        assert (ROOT / entry.notebook).is_file(), f"chapter {entry.number}'s lesson {entry.notebook} does not exist"
        assert entry.bench is not None or entry.absent, f"chapter {entry.number} has no benchmark and says not why"


def test_every_final_kernel_is_measured_on_every_card_that_has_its_file():
    board = sb.scoreboard()
    for entry in sb.ENTRIES:
        for card in sb.cards():
            row = _board_row(board, entry.number, card)
            if entry.bench is None:
                assert row["missing"] == entry.absent
            elif (card / f"{entry.bench}.json").is_file():
                assert "missing" not in row, f"chapter {entry.number} on {card.name}: {row.get('missing')}"
                assert row["median_ms"] > 0 and row["rival_ms"]
                assert row["byte_floor_ms"]


def test_the_page_table_lists_every_chapter_and_card():
    table = sb.scoreboard_markdown()
    for entry in sb.ENTRIES:
        part = ", part 2" if entry.notebook.startswith("notebooks/05_ternary_2") else ""  # part 1 has a page of its own
        assert f"[{entry.number:02d}. {entry.title}{part}]({entry.notebook})" in table
    for card in sb.cards():
        short = sb.short_card(sb.card_name(card))
        assert f"| {short} |" in table, f"no row for the {short}"
    times, floors = table.split("Each row's three floors")
    floors = floors.split("\n\n")[1]
    body = [ln for ln in times.splitlines() if ln.startswith("| [") or ln.startswith(("|  |", "| *"))]
    board = sb.scoreboard()
    apart = sb.not_comparable(board)
    measured = [r for r in board if "missing" not in r and (r["number"], r["card"]) not in apart and sb.on_page(r)]
    assert len(body) >= len(measured), "each measured row is in the times table"
    # a row's floors are shown unless they are the row above's, or the floor that binds is not measured on its card
    # (a line under the floors table says so: see the next test)
    shown = [r for r in measured if not r.get("floors_as_above") and not r.get("loop_bound") and not (
        r["pct_of_floor"] is None and r["binding"] is None and r.get("latency_missing_why") and not r["no_pct_why"])]
    rows_ = [ln for ln in floors.splitlines() if ln.startswith("| [") or ln.startswith(("|  |", "| *"))]
    assert len(rows_) >= len(shown), "each measured row with a floor is in the floors table"
    # a run whose setup differs from the other card's is out of both tables, with no fold of its numbers
    for number, card in apart:
        short = sb.short_card(card)
        assert not any(f"| {short} |" in ln for ln in body + rows_
                       if ln.startswith(f"| [{number:02d}.")), (number, short)
    assert "An earlier" not in table
    # a card with nothing measured for a chapter has no row of dashes
    assert not re.search(r"\| not measured \|( – \|)+$", table, re.MULTILINE)


def test_the_lead_table_holds_one_row_per_chapter_and_the_others_follow():
    """The first table is one row per chapter (its final kernel at its headline shape on the lead card, against its
    strongest rival; chapter 05's Triton part 1 too), the decode loops in a table of their own (against our loop's
    bounds), and the headline cases on both cards folded in a third; the re-run's p99 answers another question and is
    a folded table of its own, not a column of these."""
    table = sb.scoreboard_markdown()
    lead, rest = table.split("Each row's three floors")[0].split("The headline cases on both cards")
    rest, spread_fold = rest.split("How far one measurement lands above another")
    lead, loops = lead.split("**Decode loops: against our loop's own bound")
    lead_rows = [ln for ln in lead.splitlines() if ln.startswith("| [") or ln.startswith(("|  |", "| *"))]
    # every lead row is on the lead card: the caption says so once, and the table has no card column
    assert f"all measured on the {sb.LEAD_CARD}**" in lead and "| card |" not in lead
    # chapter 03's stress case follows its headline case, in italics, its shape said again
    assert all(ln.startswith("| [") or ln.startswith("| *03. N-gram matching*: stress case, ") for ln in lead_rows)
    numbers = [int(ln[3:5]) if ln.startswith("| [") else 3 for ln in lead_rows]
    board = sb.scoreboard()
    apart = sb.not_comparable(board)
    measured = [r for r in board if "missing" not in r and (r["number"], r["card"]) not in apart and sb.on_page(r)]
    # chapter 07 has two loop rows, one case each: its answer on the real model first, then its 8B cost model
    loop_rows = [ln for ln in loops.splitlines() if ln.startswith(("| [", "| *"))]
    seven = [ln for ln in loop_rows if ln[3:5] == "07"]
    assert len(seven) == 2 and "SmolLM2-135M" in seven[0] and "8B cost model" in seven[1]
    assert "SmolLM2" not in seven[1].split(" | ")[0] and "8B" not in seven[0].split(" | ")[0]
    # one row a chapter, and one for chapter 05's part 1, linked to its own page
    part_one = [ln for ln in lead_rows if ln.startswith(f"| [05. Ternary matmul, part 1]({sb.PART_ONE_NOTEBOOK})")]
    assert len(part_one) == 1 and len(numbers) == len(set(numbers)) + 2
    three = [ln for ln in lead_rows if ln.startswith(("| [03.", "| *03."))]
    assert len(three) == 2 and "headline case, 32 slots of 512 tokens, budget 128" in three[0]
    assert sorted(set(numbers) | {int(ln[3:5]) for ln in loop_rows}) == sorted({r["number"] for r in measured})
    assert sorted({int(ln[3:5]) for ln in loop_rows}) == sorted({r["number"] for r in measured if r.get("loop_bound")})
    others = [ln for ln in rest.splitlines() if ln.startswith("| [") or ln.startswith(("|  |", "| *"))]
    assert len(lead_rows) + len(loop_rows) + len(others) == len(measured)
    # a chapter reads in one line: its time, rival, speedup, the card's floor (a number and its kind) and the ×; then
    # the own-work yardstick, where a run times one, and our median over it
    header = next(ln for ln in lead.splitlines() if ln.startswith("| chapter"))
    for column in ("strongest rival (µs)", "floor, the card's or a chain's (µs)", "× floor"):
        assert f"| {column} |" in header, column
    assert "its own work" not in header and "own work" not in header  # the own-work yardstick: in the notes
    assert "yardstick" not in header
    # the re-run's p99 is a column of its own folded table only, under a plain name; a decode loop has none
    assert "p99" not in header and "p99" not in loops and "p99" not in rest
    assert re.search(r"\| p99 − p50 of \d+ replays \(µs\) \|", spread_fold)
    for ln in lead_rows:
        # the card's floor: a number and its kind, and where the kind needs it a few words after a colon (a chain
        # timed on our own kernel, a one-launch floor); × floor ends the row (own work is in the notes)
        assert re.search(r"\| [\d.,]+, (byte|compute|latency) floor\S*(: [^|]+)? \| \*\*[\d.]+×\*\* \|$", ln), ln
        assert "floor (" not in ln and "not the card's" not in ln  # the floor's chain is in the notes, not the cell
    for ln in loop_rows:
        assert re.search(r"our loop's (byte|kernel-count|forward-time) bound \|", ln), ln
    # a decode loop's rows race our own earlier loop: its column says baseline, not rival
    loop_header = next(ln for ln in loops.splitlines() if ln.startswith("| chapter"))
    assert "| baseline (µs) |" in loop_header and "rival" not in loop_header, loop_header


def test_a_row_whose_binding_floor_is_not_measured_says_so_and_gives_no_percentage():
    """A case whose floor that binds is not timed on its card (chapter 04's small alphabet without the chain of
    frames) says in its row that the latency floor is not measured there, with no percentage of the bytes' floor it
    exceeds a thousandfold; its notes say what is missing."""
    table = sb.scoreboard_markdown()
    times = table.split("Each row's three floors")[0]
    seen = 0
    for r in sb.scoreboard():
        if ("missing" not in r and r["binding"] is None and not r["no_pct_why"] and r.get("latency_missing_why")
                and sb.on_page(r)):
            (line,) = [ln for ln in times.splitlines() if f"| {sb.short_card(r['card'])} | {r['ours']} |" in ln
                       or (ln.startswith(f"| [{r['number']:02d}.") and f"| {r['ours']}" in ln)]  # a lead row
            assert line.endswith("| latency floor, not measured on this card | – |"), line
            assert r["latency_missing_why"] in table
            seen += 1
    # a case the page leaves off (chapter 04's small alphabet) is the results page's: no row here to say it in
    assert seen or all(r.get("latency_floor_ms") is not None for r in sb.scoreboard() if r["number"] == 4
                       and "missing" not in r and sb.on_page(r) and r["binding"] is None)


# ----------------------------------------------------------------------------------------------
# The numbers are the JSON's
# ----------------------------------------------------------------------------------------------

def test_ternary_row_on_the_h200_recomputed_from_the_raw_file():
    data = _raw(H200, "ternary")
    shape = {"shape": "4096x14336", "m": 1}
    mine = [r for s in ("step14", "step17", "step21") for r in data["measurements"]
            if r["series"] == s and r["params"]["shape"] == "4096x14336" and r["params"]["m"] == 1
            and r["clock"] == "gpu"]
    ours = min(mine, key=lambda r: r["ms"])
    cublas, gemlite = _find(data, "cublas_bf16", **shape), _find(data, "gemlite_w2", **shape)
    empty = data["ceilings"]["empty_launch_gpu_ms"]  # the latency floor: the empty kernel of the row's own run
    floor = max(ours["floor_mem_ms"], ours["floor_compute_ms"], empty)

    row = _ternary_row(sb.scoreboard(), H200)
    assert row["ours_long"].startswith(sb.TERNARY_WORDS[ours["series"]]) and row["ours"].startswith("step 21")
    assert row["median_ms"] == ours["spread_ms"][1] == ours["ms"]
    assert row["slowest_ms"] == ours["spread_ms"][2]
    gem_passes = [c["passed"] for c in data["checks"] if c["name"] == "gemlite_w2 within bf16 rounding of float64"
                  and c["params"].get("shape") == "4096x14336" and c["params"].get("m") == 1]
    assert len(gem_passes) == 1
    table = sb.scoreboard_markdown()
    assert f"**{ours['ms'] * 1e3:,.1f}**" in table
    assert f"**{ours['ms'] / floor:.1f}×**" in table
    assert row["byte_floor_ms"] == ours["floor_mem_ms"] and row["latency_floor_ms"] == empty
    assert row["binding_floor_ms"] == floor
    assert row["pct_of_floor"] == pytest.approx(100 * floor / ours["ms"])
    assert row["dense_ratio"] == pytest.approx(cublas["ms"] / ours["ms"])
    assert row["gemlite_fails_check"] == (not gem_passes[0])
    if gem_passes[0] and gemlite["ms"] < cublas["ms"]:  # the fastest rival that passes our check: GemLite
        assert row["rival_ms"] == gemlite["ms"] and row["vs_rival"] == pytest.approx(gemlite["ms"] / ours["ms"])
        assert f"{gemlite['ms'] / ours['ms']:.2f}×" in table
    else:  # cuBLAS bf16 is the rival; where GemLite fails the check it is named beside it, with no ratio
        assert row["rival_ms"] == cublas["ms"] and row["vs_rival"] == pytest.approx(cublas["ms"] / ours["ms"])
        assert f"{cublas['ms'] / ours['ms']:.2f}×" in table
    if not gem_passes[0]:
        assert f"{gemlite['ms'] / ours['ms']:.2f}×" not in table
        assert any(n.startswith("GemLite 2-bit takes") and "fails our float64 check" in n and "no ratio" in n
                   for n in row["rival_notes"])


def test_ternary_headline_row_is_bitnet_where_the_card_has_that_run():
    """Chapter 5 leads, where the card has the BitNet run, with the one-row W2A8 kernel (step 23) against BitNet's own
    kernel at the shape where our lead is smallest, from that run, with the run and its date in the notes."""
    assert sb.TERNARY_W2A8 == ("step23",)
    run = sb.bitnet_run(H200.name)
    if run is None:
        pytest.skip("no BitNet run on the H200")
    peers = [r for r in run["measurements"] if r["series"] == sb.BITNET and r["clock"] == "gpu"]

    def ours_at(peer):
        return min((r for r in run["measurements"] if r["series"] in sb.TERNARY_W2A8 and r["clock"] == "gpu"
                    and r["params"]["shape"] == peer["params"]["shape"] and r["params"]["m"] == 1),
                   key=lambda r: r["ms"])
    peer = min(peers, key=lambda r: r["ms"] / ours_at(r)["ms"])  # where our lead is smallest
    ours = ours_at(peer)
    row = _board_row(sb.scoreboard(), 5, H200)
    assert row["ternary_case"] == "bitnet" and row["rival_check"] == "passes"
    assert row["rival_ms"] == peer["ms"] and row["median_ms"] == ours["ms"]
    assert row["vs_rival"] == pytest.approx(peer["ms"] / ours["ms"])
    # the run is named where it is not the chapter's own
    assert any(n == sb.run_words(run) for n in row["rival_notes"]) == bool(run.get("quick"))
    assert peer["params"]["shape"].replace("x", " × ") in row["ours"]
    # it is the chapter's line in the first table, the one the landing and results pages lead with; cuBLAS is not
    lead = sb.scoreboard_markdown().split("**Decode loops")[0]
    (line,) = [ln for ln in lead.splitlines() if ln.startswith("| [05. Ternary matmul, part 2]")]
    kernel, shape = row["ours"].split("; ")
    assert f"| {kernel} |" in line and f"| {peer['ms'] / ours['ms']:.2f}× |" in line and "cuBLAS" not in line
    # the shape is said once, in the chapter's cell, not again beside the kernel
    assert line.count(shape) == 1


def test_masked_head_headline_is_against_xgrammar_not_dense_then_mask():
    """Chapter 2 leads with the fair comparison: the whole step from the bitmask against xgrammar's path."""
    data = _raw(H200, "masked_lm_head")
    case = {"batch": 1, "kind": "random", "allowed": 1000}
    plan, xgr = _find(data, "step13", **case), _find(data, "xgrammar_bitmask", **case)
    dense = _find(data, "dense_mask", **case)
    step12 = _find(data, "step12", **case)
    (line,) = [h for h in summary.headlines() if h["number"] == 2]
    assert line["ratios"]["H200"] == pytest.approx(xgr["ms"] / plan["ms"])
    assert line["ratios"]["H200"] != pytest.approx(dense["ms"] / step12["ms"], rel=0.05)
    assert f"**{xgr['ms'] / plan['ms']:.2f}×**" in summary.summary_markdown()


def test_ternary_and_multi_item_lead_with_their_strongest_peer():
    """Each leads with its fastest rival at the headline shape among those computing the same product (ternary: the
    W2A8 baselines quantise x, another product) that passes our float64 check in the same run; a faster peer that
    fails it is named beside the row, with no ratio."""
    board = sb.scoreboard()
    for number, chapter, peer in ((5, "ternary", None), (6, "multi_item", "FlashInfer")):
        row = _ternary_row(board, H200) if number == 5 else _board_row(board, number, H200)
        data = _raw(H200, chapter)
        case = {"shape": "4096x14336", "m": 1} if number == 5 else {"shape": "8 prompts, mixed"}
        rivals = [r for r in data["measurements"] if r["role"] in ("peer", "baseline") and r["clock"] == "gpu"
                  and all(r["params"].get(k) == v for k, v in case.items())
                  and r["series"] not in ("read_weights", "torch_int_mm", "torch_int_mm_matmul")
                  # a peer that fails our float64 check in this run is never the rival
                  and not any(c["name"].startswith(f"{r['series']} within") and not c["passed"]
                              and all(c["params"].get(k) == v for k, v in case.items())
                              for c in data.get("checks", []))]
        fastest = min(rivals, key=lambda r: r["ms"])
        # ternary: GemLite or cuBLAS bf16, whichever is faster among those that pass the check in this run
        expected = {peer} if peer else {"gemlite_w2", "cublas_bf16"}
        assert fastest["series"] in expected, f"chapter {number}: the fastest rival is {fastest['series']}"
        assert row.get("rival_series", fastest["series"]) == fastest["series"]
        assert row["rival_ms"] == fastest["ms"]


def test_chapter_one_line_is_its_suite_total():
    """Chapter 1's line is the share of forward passes step 2 (exact token jumps) saves over its suite with the default
    whitespace, from the committed totals (chapter 1's page checks them against the suite it runs)."""
    saved = summary.fsm_suite()["default"]["saved"]["token"]
    passes = summary.fsm_suite()["default"]["passes"]
    assert saved == pytest.approx(1 - passes["token"] / passes["none"])
    (line,) = [h for h in summary.headlines() if h["number"] == 1]
    assert set(line["ratios"].values()) == {saved}
    text = summary.summary_markdown()
    if summary.fsm_peers():  # the strongest peer saves more: ours is not bolded, the line says it is behind
        # the real schemas in the cell (chapter 01's order), the suite's total in the line's first note
        assert f"-entry suite (not the real schemas), step 2, our exact token jumps, saves {saved:.1%} of passes, most of it" in text
        assert "(we lose)" in text
    else:
        assert f"**{saved:.1%}** fewer forward passes" in text


def test_chapter_one_line_without_its_file_says_not_measured(tmp_path):
    assert summary.fsm_suite(tmp_path / "missing.json") is None
    assert summary.fsm_line(None) == (None, sb.NOT_MEASURED, sb.NOT_MEASURED)


def test_no_floor_is_beaten_without_comment():
    """A kernel faster than its floor means a wrong floor (or a wrong time): the scoreboard must not show one."""
    for row in sb.scoreboard():
        if row.get("pct_of_floor") is not None:
            assert row["pct_of_floor"] <= 100, f"chapter {row['number']} on {row['card']} beats its floor"


# ----------------------------------------------------------------------------------------------
# A change to the files changes the page; a gap says "not measured"
# ----------------------------------------------------------------------------------------------

@pytest.fixture
def bench_copy(tmp_path) -> Path:
    root = tmp_path / "bench"
    shutil.copytree(BENCH_RESULTS, root, ignore=shutil.ignore_patterns("*.png"))
    return root


def _rewrite(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_a_slower_rival_raises_the_ratio(bench_copy):
    def slow_cublas(data):  # and GemLite: whichever is the rival
        for r in data["measurements"]:
            if r["series"] in ("cublas_bf16", "gemlite_w2"):
                r["ms"] *= 2
    before = _ternary_row(sb.scoreboard(bench_copy), bench_copy / "nvidia-h200")["vs_rival"]
    _rewrite(bench_copy / "nvidia-h200" / "ternary.json", slow_cublas)
    after = _ternary_row(sb.scoreboard(bench_copy), bench_copy / "nvidia-h200")["vs_rival"]
    assert after == pytest.approx(2 * before)


def test_a_peer_that_passes_the_check_becomes_the_rival(bench_copy):
    """Where GemLite passes the float64 check, it is the rival (it is faster than cuBLAS bf16)."""
    def passing(data):
        for c in data["checks"]:
            if c["name"].startswith("gemlite_w2 within"):
                c["passed"] = True
    _rewrite(bench_copy / "nvidia-h200" / "ternary.json", passing)
    row = _ternary_row(sb.scoreboard(bench_copy), bench_copy / "nvidia-h200")
    gem = _find(json.loads((bench_copy / "nvidia-h200" / "ternary.json").read_text()), "gemlite_w2",
                shape="4096x14336", m=1)
    assert row["rival_series"] == "gemlite_w2" and row["rival_ms"] == gem["ms"]


def test_a_peer_check_is_read_not_assumed(bench_copy):
    """The ternary row says what the run's float64 check of GemLite and of cuBLAS found: failed, passed, or absent."""
    def drop_checks(data):
        data["checks"] = [c for c in data["checks"] if not c["name"].startswith(("gemlite_w2 within", "cublas_bf16 within"))]

    def gemlite_fails(data):
        for c in data["checks"]:
            if c["name"].startswith("gemlite_w2 within") and c["params"].get("shape") == "4096x14336":
                c["passed"] = False
    _rewrite(bench_copy / "nvidia-h200" / "ternary.json", gemlite_fails)
    before = _ternary_row(sb.scoreboard(bench_copy), bench_copy / "nvidia-h200")
    assert before["gemlite_fails_check"] and any("fails our float64 check" in n for n in before["rival_notes"])
    assert before["rival_series"] == "cublas_bf16" and before["rival_check"] == "passes"
    _rewrite(bench_copy / "nvidia-h200" / "ternary.json", drop_checks)
    after = _ternary_row(sb.scoreboard(bench_copy), bench_copy / "nvidia-h200")
    # with no check that passes, no rival is taken as passing: the row says its peer has no check
    assert not after["gemlite_fails_check"] and after["rival_check"] is None
    assert sum(n.endswith("has no float64 check in this run") for n in after["rival_notes"]) == 1


def test_a_missing_series_or_ceiling_reads_not_measured(bench_copy):
    def drop_final(data):
        data["measurements"] = [r for r in data["measurements"] if r["series"] not in ("step13", "step12")]

    def drop_gemlite(data):  # and cuBLAS bf16: no rival is left at the shape
        data["measurements"] = [r for r in data["measurements"] if r["series"] not in ("gemlite_w2", "cublas_bf16")]
    _rewrite(bench_copy / "nvidia-h200" / "masked_lm_head.json", drop_final)
    _rewrite(bench_copy / "nvidia-h200" / "ternary.json", drop_gemlite)
    for path in (bench_copy / "nvidia-h200").glob("*.json"):  # the floor takes the card's fastest: drop them all
        _rewrite(path, lambda d: d.get("ceilings", {}).pop("empty_launch_gpu_ms", None))
    board = sb.scoreboard(bench_copy)
    assert "missing" in _board_row(board, 2, bench_copy / "nvidia-h200")
    assert _board_row(board, 3, bench_copy / "nvidia-h200")["latency_floor_ms"] is None
    assert _ternary_row(board, bench_copy / "nvidia-h200")["vs_rival"] is None
    table = sb.scoreboard_markdown(bench_copy)
    assert f"GemLite 2-bit: {sb.NOT_MEASURED}" in table
    assert "| H200 | this card's run did not time the final kernel |" in table  # the reason in the cell
    assert any("no run on this card recorded an empty kernel's GPU time" in line for line in sb.missing(bench_copy))


def test_the_rerun_p99_stands_in_a_folded_table_of_its_own_with_its_drift_said_once():
    """The chapters' files keep no samples; the tails run does. Its p99 − p50 (read from the raw file) stands in a
    folded table of its own: it answers how far one measurement lands above another, not how much is left. One line
    under it says what it holds and how far that run's medians land from the chapters' (the range, from the raw
    files); no chapter's notes repeat a gap. The page defines the columns once (the short list above the tables)."""
    table = sb.scoreboard_markdown()
    assert "fastest, median and slowest of a few" not in table and "**% of the floor**" not in table
    assert "**Re-run" not in table and "median against the table above" not in table
    page = (ROOT / "scoreboard.md").read_text()
    assert " ".join(page.split()).count("the median of three repetitions") == 1  # How we measure's word for them
    assert "99 in 100 replays of the call" not in page
    # what p99 − p50 is, said by the fold that holds it (How we measure links to the scoreboard's own words)
    assert "how far one measurement lands above another, not one call's tail" in table
    tails = [c for c in sb.cards() if (c / f"{sb.TAILS}.json").is_file()]
    if not tails:
        return
    times = table.split("Each row's three floors")[0]
    fold = times.split("How far one measurement lands above another (p99 − p50)")[1]
    folders = {sb.card_name(c): c for c in tails}
    board = [r for r in sb.scoreboard() if "missing" not in r and sb.on_page(r)]
    shown = _table_rows(fold)
    filled, gaps = 0, []
    for r in board:
        if not r.get("tail_params") or r["card"] not in folders or r.get("loop_bound"):
            continue
        series, params = [c for c in sb.TAIL_SERIES[r["number"]] if c[1] == r["tail_params"]
                          and c[0] == r.get("tail_series", c[0])][0]
        raw = _find(_raw(folders[r["card"]], sb.TAILS), series, **params)  # the raw file, read here
        assert raw["p99_ms"] >= raw["ms"]
        card = sb.short_card(r["card"])
        found = [c for c in shown if re.match(rf"^[\[*]{r['number']:02d}\.", c["chapter: shape"])
                 and c["final kernel"] in (r["ours"], r["ours"].split("; ")[0])
                 and bool(r.get("part_notebook")) == ("part 1" in c["chapter: shape"]) and c.get("card", card) == card
                 and (not r.get("page_headline") or "headline case" in c["chapter: shape"])
                 and (not r.get("page_lead") or "stress case" in c["chapter: shape"])]
        (cells,) = found
        other = sb.ctc_tail_targets(r, raw) if r["number"] == 4 else None
        cell = next(v for k, v in cells.items() if k.startswith("p99 − p50 of "))
        if other is not None and other[0]:  # its repetitions timed other targets: the cell says so, not a number
            assert cell == "– (other targets; notes)"
            continue
        # the re-run's spread alone, p99 over p50 of one run: no p99 stands beside a median it is not from
        assert cell.startswith(f"+{(raw['p99_ms'] - raw['ms']) * 1e3:,.1f} ({raw['p99_ms'] / raw['ms'] - 1:.1%})"), cells
        gaps.append(raw["ms"] / r["median_ms"] - 1)
        filled += 1
    assert filled >= 9  # chapters 02 to 06: two rows for 03, three for 05 and two for 06
    assert "It did not replay" not in fold  # every row of the first table has its p99
    lo, hi = min(gaps), max(gaps)
    assert (f"Its medians land between {abs(lo):.1%} {'below' if lo < 0 else 'above'} and {abs(hi):.1%} "
            f"{'below' if hi < 0 else 'above'} the chapters' own") in fold
    assert "lands" not in table.split("How far one measurement lands above another")[0]  # no gap in a chapter's notes
    assert "lands" not in table.split("Each row's three floors")[1]
    n = _raw(tails[0], sb.TAILS)["measurements"][0].get("samples")
    if n:
        assert f"replays each call's graph {n} times" in fold and f"p99 − p50 of {n} replays" in fold
    assert table.count("how far one measurement lands above another, not one call's tail") == 1
    assert "per-replay means" not in table
    # no other table has a p99 column; a decode loop has none, said once, under the re-run's table
    assert "p99" not in times.split("How far one measurement lands above another")[0].replace("(p99 − p50)", "")
    assert table.count(sb.LOOP_NO_TAIL[1]) == 1 and sb.LOOP_NO_TAIL[1] in fold
    assert "A decode loop has no such re-run" not in page


def test_chapter_seven_headline_is_one_case_and_one_statistic_everywhere():
    """Chapter 7's line: the 8B shape at batch 1 over the nine JSON schemas, the median of the schemas' step 1 times
    per token over the median of their step 3 times (the ratio of the two times printed beside it), the same on the
    scoreboard, the results page and the landing page's cards."""
    data = _raw(H200, "decode")
    case = {"model": "8b", "batch": 1, "whitespace": "compact"}
    names = sb.json_schemas()
    assert len(names) == 9
    step = {s: {r["params"]["schema"]: r["ms"] for r in data["measurements"] if r["series"] == s
                and r["params"]["schema"] in names and all(r["params"].get(k) == v for k, v in case.items())}
            for s in ("step01", "step03")}
    import statistics
    ratio = (statistics.median(step["step01"][n] for n in names)
             / statistics.median(step["step03"][n] for n in names))
    row = _board_row(sb.scoreboard(), 7, H200)
    assert row["vs_rival"] == pytest.approx(ratio)
    assert "9 JSON schemas" in row["shape"]
    (line,) = [h for h in summary.headlines() if h["number"] == 7]
    assert line["ratios"]["H200"] == pytest.approx(ratio)
    # the real model leads; the 8B cost model's ratio follows, called measured on synthetic weights (not a forecast)
    # one ratio a cell for the loop: the 8B cost model's loop ratio is the line's note; only chapter 02's head, a tie
    # on SmolLM2, names its gain on the 8B cost model, in the cell's last clause
    assert all("8B" not in c for c in line["cells"]["H200"].split("; ") if not c.startswith("chapter 02's head")), \
        line["cells"]["H200"]
    assert f"{row['vs_rival']:.2f}×" not in line["cells"]["H200"], line["cells"]["H200"]
    assert any("on the 8B cost model, a synthetic" in n and f", {ratio:.2f}× (measured)" in n
               for n in line["notes"]["H200"])
    # the bold number is what chapters 01 and 02 buy: chapter 01's jumps (chapter 02's head beside it)
    assert line["cells"]["H200"].startswith("on SmolLM2-135M, chapter 01's exact jumps **"), line["cells"]["H200"]
    assert f"{ratio:.2f}×" in line["brief"]["H200"]


def test_chapter_one_line_is_one_statistic():
    """Chapter 1's line is the share of forward passes left out, with no speedup beside it."""
    (line,) = [h for h in summary.headlines() if h["number"] == 1]
    first, *others = line["cells"].values()
    if summary.fsm_peers_real():  # passes saved on the real schemas alone (the suite is the notes'): one metric
        assert first.startswith("on ") and " real schemas: " in first and "suite" not in first, first
        assert first.endswith("of passes saved"), first
        assert "forced" not in first, first
        assert "per output token" not in first, first
    else:
        assert "% of tokens forced" in first and "per output token" not in first  # a forced token spares a forward
    assert all(text.startswith("the same (a count, not a GPU time") for text in others)  # written out once


def test_the_end_to_end_comparison_shows_our_end_to_end_time():
    name = json.loads((H200 / "ngram.json").read_text())["device"]["name"]
    (row,) = [r for r in sb.scoreboard() if r["number"] == 3 and r["card"] == name and r.get("ours_end_to_end_ms")]
    assert not row["lead"] and row["rival"] == "the CPU loop it replaces"
    # the scoreboard keeps to the GPU clock against the card's floors: the end-to-end row is the results page's
    assert not sb.on_page(row)
    shown = sb.scoreboard_markdown()
    assert "end to end (its GPU time" not in shown and " on the GPU; **" not in shown  # one clock in a cell
    # on a card where the chapter ran its public call apart, the results page quotes that run alone (each ratio
    # against its own CPU loop), in the line's note: the benchmark's end-to-end row is on neither page
    assert f"{row['vs_rival']:.2f}×" not in summary.headline_tables_markdown()
    notes = summary.summary_markdown().split("- **03. N-gram matching**")[1].split("\n- **")[0]
    assert f"{row['vs_rival']:.2f}×" not in notes and "in a separate run), `ngram_match` as a reader calls it" in notes


def test_ctc_rows_are_the_final_entry_point_where_a_card_times_it():
    """The H200's file times ctc_loss (the dispatching entry point): its rows are ctc_loss, at both shapes, with the
    step it ran; a card whose file does not time it shows step 14 and, at the small alphabet, step 12."""
    rows_ = [r for r in sb.scoreboard() if r["number"] == 4 and "missing" not in r]
    h200_name = json.loads((H200 / "ctc.json").read_text())["device"]["name"]
    h200 = [r for r in rows_ if r["card"] == h200_name]
    assert len(h200) == 2 and all(r["ours_long"].startswith("the fused CTC kernel, its entry point (running step")
                                  for r in h200)
    others = [r for r in rows_ if r["card"] != h200_name]
    # without the entry point: step 14 at the headline shape, and at the small alphabet the step the entry point
    # runs there (step 12), so both cards time the same kernel
    assert [r["ours_long"] for r in others] == ["the fused CTC kernel (step 14)", "the fused CTC kernel (step 12)"]
    assert h200[1]["ours_long"].endswith("(running step 12)")
    assert len({r["shape"] for r in rows_}) == 2


# ----------------------------------------------------------------------------------------------
# The pages
# ----------------------------------------------------------------------------------------------

#: A measured quantity written into prose (as tests/test_lessons.py defines it).
NUMBER_WITH_UNIT = re.compile(r"(?<![\w.{`$])\d[\d,]*(?:\.\d+)?\s?(?:µs|us|ms|ns|s|x|×|%|GB/s|TB/s|TFLOP/s|TFLOPS|"
                              r"MB|GB|KB|MiB|GiB)(?![\w])")


def prose_text(path: Path) -> str:
    text = path.read_text()
    text = re.sub(r"^---\n.*?\n---\n", "", text, flags=re.DOTALL)  # the notebook's header
    return re.sub(r"```.*?```", " ", text, flags=re.DOTALL)  # code cells and directives


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_pages_type_no_measured_number(path):
    typed = NUMBER_WITH_UNIT.findall(prose_text(path))
    assert not typed, f"{path.name}: numbers typed into prose: {typed}"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_pages_speak_to_readers(path):
    spec = importlib.util.spec_from_file_location("_lessons", ROOT / "tests" / "test_lessons.py")
    lessons = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lessons)
    text = path.read_text() + "\n" + sb.scoreboard_markdown() + "\n" + summary.summary_markdown()
    found = [m.group(0) for pattern, _ in lessons.INSIDER for m in pattern.finditer(text)]
    assert not found, f"{path.name}: {found}"


def test_pages_run_their_tables_and_the_book_lists_the_scoreboard():
    assert 'scoreboard_markdown(folds="dropdown")' in (ROOT / "scoreboard.md").read_text()
    assert "summary_markdown(dropdown=True)" in (ROOT / "results.md").read_text()
    assert "reading_path_markdown()" in (ROOT / "intro.md").read_text()
    toc = (ROOT / "_toc.yml").read_text()
    assert "file: scoreboard" in toc and toc.index("file: results") < toc.index("file: scoreboard")


def test_reading_times_follow_the_prose_then_a_allowance_per_listing_and_table():
    """A page's reading time is its unfolded prose at a reading pace a reader expects, plus a modest allowance per
    listing, diff or table it shows (not per line of code, which made a page of long diffs read as three times
    another); folded blocks are left out. The landing page gives the course's time and a short route's, not how it
    counts them."""
    order = summary.reading_order()
    assert order == sorted(order) and all((ROOT / nb).is_file() for nb in order)
    from book.common import prose_words

    assert 200 <= summary.WORDS_PER_MINUTE <= 250 and summary.LISTING_MINUTES <= 1 and summary.TABLE_MINUTES <= 1
    for notebook in order:
        prose, total = summary.reading_minutes(notebook)
        words = summary.unfolded_prose_words(notebook)
        assert words <= prose_words(ROOT / notebook)  # a folded block's words are left out
        blocks, tables = summary.listing_blocks(notebook), summary.table_count(notebook)
        assert prose - 1 < words / summary.WORDS_PER_MINUTE <= prose
        assert total - 1 < (words / summary.WORDS_PER_MINUTE + blocks * summary.LISTING_MINUTES
                            + tables * summary.TABLE_MINUTES) <= total
        assert summary.folded_minutes(notebook) == math.ceil(summary.listing_blocks(notebook, folded=True)
                                                             * summary.LISTING_MINUTES)
        listed, failed = summary.listing_lines(notebook)
        assert not failed, f"{notebook}: listings the count could not run: {failed}"
    table = summary.reading_path_markdown()
    assert table.count(" min |") == len(order)  # one reading time a page; what it counts is said once, under it
    times = {}
    for notebook in order:
        _, times[notebook] = summary.reading_minutes(notebook)
        assert f" | {summary.rounded_minutes(times[notebook])} min |\n" in table + "\n"  # to 5 minutes
    # no page reads as three times another: the spread is prose and blocks, not lines of code
    assert max(times.values()) <= 2 * min(times.values()), times
    (line,) = [ln for ln in table.splitlines() if ln.startswith("The course reads in ")]
    assert "words a minute" not in table and "With an afternoon, read 00, then 02, then 04" in line
    # the course's time is the column's sum, as a reader adding it up gets it
    total = sum(summary.rounded_minutes(t) for t in times.values())
    assert line.startswith(f"The course reads in {summary.hours(total, exact=True)};"), (line, total)
    assert "held to" not in table  # a rule for the authors, not news for the reader
    for entry in sb.ENTRIES:
        assert f"]({entry.notebook}) | {entry.question} |" in table


def test_listing_blocks_count_what_a_page_shows_without_running_it(tmp_path):
    """A displayed listing, a cell whose last value is a diff and a notebook function that displays one each count
    once; Markdown, tables, figures and an exercise's check are no listing; a shown code cell that prints none counts
    as one; a folded output counts only as folded; the exercises are left out."""
    import json

    def code(src, tags=()):
        return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": src, "outputs": [],
                "execution_count": None}

    cells = [code("def show(n):\n    display(lesson.core_diff(n))\n", ["remove-input"]),
             code("display(lesson.step_core(3))", ["remove-input"]),
             code("show(4)\nsay('Step 4 takes 3 µs.')", ["remove-input"]),
             code("lesson.step_diff(5)", ["remove-input"]),
             code("display(Markdown(lesson.steps_table(r)))", ["remove-input"]),
             code("display(lesson.step_rest(3))", ["remove-input", "hide-output"]),
             code("x = kernel(a)\nx.sum()"),
             code("plt.show()", ["remove-input"]),
             {"cell_type": "markdown", "metadata": {}, "source": "## Exercises\n\n| a | b |\n|---|---|\n| 1 | 2 |"},
             code("exercises.check_one(one)")]
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    assert summary.listing_blocks("nb.ipynb", root=tmp_path) == 4  # step_core, show(4), step_diff, the shown code
    assert summary.listing_blocks("nb.ipynb", root=tmp_path, folded=True) == 1
    assert summary.table_count("nb.ipynb", root=tmp_path) == 2  # the steps table, and the one in the markdown


def test_listing_lines_count_what_a_page_prints_and_run_no_measurement(tmp_path):
    """A notebook of four cells: the count runs its imports and helpers, counts a hidden-input listing and a diff
    through a helper (lines recounted here with difflib; its output folded, counted apart when asked), skips a cell
    whose output is removed, and never runs the
    cell's other work (which would leave a file behind)."""
    import difflib

    marker = tmp_path / "ran"

    def cell(source: str, tags: tuple[str, ...] = ()) -> dict:
        return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": source, "outputs": [],
                "execution_count": None}
    nb = {"cells": [
        cell(f"from pathlib import Path\nfrom studylog.source import show_diff, show_source\n"
             f"Path({str(marker)!r}).write_text('measured')\n"),
        cell("show_source('a = 1\\nb = 2\\nc = 3\\n')", ("remove-input",)),
        cell("def parts(d):\n    return d\n\n\nparts(show_diff('x = 1\\ny = 0\\n', 'x = 2\\ny = 0\\n'))",
             ("remove-input", "hide-output")),
        cell("show_source('q = 1\\n')", ("remove-output",)),
        {"cell_type": "markdown", "metadata": {}, "source": "Some prose."}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "toy.ipynb"
    path.write_text(json.dumps(nb))
    diff = list(difflib.unified_diff(["x = 1", "y = 0"], ["x = 2", "y = 0"], lineterm="",
                                     fromfile="a", tofile="b"))
    assert summary.listing_lines(path, root=tmp_path) == (3 + len(diff), [])
    # the diff's cell folds its output: a reader opens it on demand
    assert summary.listing_lines(path, root=tmp_path, folded=True) == (len(diff), [])
    assert summary.listing_lines(path, root=tmp_path, folded=False) == (3, [])
    assert not marker.exists(), "the count ran a cell's work that prints no listing"


def test_the_latency_floor_is_the_rows_own_runs_empty_kernel_and_the_masked_step_starts_with_its_copy():
    """The single-kernel latency floor is the empty kernel of the run that timed the row (as its byte floor uses
    that run's copy bandwidth); the whole masked step's latency floor is its shortest dependent chain, the bitmask's
    copy from host memory (the tails run's row) then one kernel at the run's own empty kernel, and its own design's
    bound (the same copy, then two kernels, as chapter 02's page prices them) stands beside it."""
    board = sb.scoreboard()
    times = [json.loads(p.read_text()).get("ceilings", {}).get("empty_launch_gpu_ms") for p in H200.glob("*.json")]
    fastest = min(x for x in times if x is not None)
    own = _raw(H200, "masked_lm_head")["ceilings"]["empty_launch_gpu_ms"]
    name = _raw(H200, "masked_lm_head")["device"]["name"]
    (kernel,) = [r for r in board if r["number"] == 2 and r["card"] == name and r["ours"] == "step 12, kernel alone"]
    assert kernel["latency_floor_ms"] == pytest.approx(own) and not kernel["latency_borrowed"]
    (step,) = [r for r in board if r["number"] == 2 and r["card"] == name and r["ours"] == "step 13, whole step"]
    copy = _find(_raw(H200, sb.TAILS), sb.BITMASK_COPY, **sb.MASKED_HEAD_CASE)
    assert step["latency_floor_ms"] == pytest.approx(copy["ms"] + own)  # no design starts before the bitmask lands
    assert step["design_bound_ms"] == pytest.approx(copy["ms"] + 2 * own)  # as chapter 02's page prices it
    card_floor = max(f for f in (step["byte_floor_ms"], step["compute_floor_ms"], copy["ms"] + own) if f is not None)
    assert step["binding_floor_ms"] == pytest.approx(card_floor) and step["pct_of_floor"] == pytest.approx(
        100 * card_floor / step["median_ms"])
    table = sb.scoreboard_markdown()
    (line,) = [c for c in _table_rows(table.split("**Decode loops")[0])
               if c["chapter: shape"].startswith("[02. Masked LM head]")]
    # × floor ends the row; the own-work yardstick and our median over it are in chapter 02's notes
    assert line["× floor"] == f"**{step['median_ms'] / card_floor:.1f}×**" and "own work (µs)" not in line
    two = table.split("Chapter 02, Masked LM head")[1].split("**Chapter ")[0]
    assert "Own work here is the packed bitmask's copy from pinned host memory" in two, two
    assert (f"own work takes {step['design_bound_ms'] * 1e3:.1f} µs; our median is "
            f"{step['median_ms'] / step['design_bound_ms']:.1f}× it") in two.lower(), two
    assert "× the chapter's floor" not in table and "leaves out the copy from host memory" not in table
    # the byte floor's note says what it counts, and that the bitmask's copy from host memory is not in it
    assert "the packed bitmask's copy from host memory is not in it" in table.split("Chapter 02, Masked LM head")[1]
    # the empty kernel's time per card is How we measure's to give: the page links it, not repeats it
    assert f"{fastest * 1e3:.2f} µs on the H200" not in table and "how_we_measure.md#ceilings-and-floors" in table


def test_notes_are_one_fold_by_chapter_with_no_markers_in_the_cells():
    table = sb.scoreboard_markdown()
    assert not re.search(r"\[\d+\]", table), "a numbered footnote marker is left in the tables"
    # one Notes fold: the general notes, then each chapter's under its bold name, in the chapters' order
    assert table.count("<summary>Notes</summary>") == 1
    notes = table.split("<summary>Notes</summary>")[1].split("</details>")[0]
    heads = re.findall(r"^\*\*Chapter (\d+), ", notes, flags=re.M)
    assert heads and heads == sorted(heads, key=int) and len(heads) == len(set(heads))
    # per-card caveats are in the cells (GemLite's check); a run set up differently (the H100's unpadded head) is off
    # the page, and no run's history (when it ran, which code) is in the notes
    assert "not comparable (unpadded head)" not in table and "An earlier" not in table
    assert "minutes" not in table and "version of the course's code" not in table
    # a rival cell holds one rival and its time: a failed float64 check and the other rivals are in the notes; a
    # passed check is the rule the definitions state, not a note
    if any(r.get("gemlite_fails_check") for r in sb.scoreboard()):
        assert "fails our float64 check" in table
    assert "passes our float64 check" not in table
    assert not any("float64 check" in line for line in table.splitlines() if line.startswith("|"))
    # one short paragraph a chapter, read as prose: no bullets and no bold label strings naming rows; a note on every
    # row the chapter shows names none, a row's notes follow one lead-in ("For step 7 on the H200, ..."); no
    # sentence said twice, the own-work yardstick defined once (under the first table), not per chapter
    for section in re.split(r"^\*\*Chapter \d+, ", notes, flags=re.M)[1:]:
        title, _, body = section.partition("** ")
        # one paragraph, then at most one small table of the numbers each row adds (one line a row and card)
        paragraph, _, small = body.strip().partition("\n\n")
        if small:
            lines = small.strip().splitlines()
            assert lines[0].startswith("| row | card | ") and set(lines[1]) <= set("|-"), small
            keys = [tuple(c.strip() for c in ln.strip("|").split(" | ")[:2]) for ln in lines[2:]]
            assert len(keys) >= 2 and len(keys) == len(set(keys)), small  # one row alone would be a sentence
            assert all(ln.startswith("| ") for ln in lines[2:]), small
        assert title.endswith(".") and "\n" not in paragraph and not paragraph.startswith("- "), section
        assert "**" not in paragraph, paragraph  # no bold label strings
        sentences = re.findall(r"[^.]+(?:\.\d[^.]*)*\.", paragraph)
        assert len(sentences) == len(set(sentences)), title
        leads = re.findall(r"(?:^|\. )(For [^,]+(?:, [^,]+)?(?: on the H\d+)?),", paragraph)
        assert len(leads) == len(set(leads)), (title, leads)  # a row's notes after its name once
    own = {r["number"] for r in sb.scoreboard() if r.get("design_bound_ms") and "missing" not in r and sb.on_page(r)}
    assert "yardstick (not a limit)" not in notes and notes.count("Own work here is") == len(own)
    # why a decode loop has no p99 is said once, in the p99 fold, not under each loop's row
    loop_why = "A decode loop has no such re-run"
    assert loop_why not in table
    dropdowns = sb.scoreboard_markdown(folds="dropdown")
    assert "<details>" not in dropdowns and dropdowns.count(":::{dropdown} Notes") == 1
    assert dropdowns.count(":::{dropdown}") <= 4


def test_the_rerun_gap_is_said_in_the_chapters_notes_not_in_its_cell():
    """The separate run's p99 stands in the times tables beside the chapter's median; where that run's own median lands
    more than 3% away, the chapter's notes say so (not the table's cell); a p99 of other targets than the row's is
    left out, a note saying why."""
    board = sb.scoreboard()
    table = sb.scoreboard_markdown()
    assert "the p99 cell divides by its own run's median" not in table
    assert "The re-run's median, " not in table and "off the chapter's)" not in table  # the gap: in the notes
    for r in [b for b in board if b.get("tail_params") and "missing" not in b and sb.on_page(b)]:
        t = sb.tail(H200, r["number"], r["tail_params"], r.get("tail_series")) \
            if r["card"] == sb.card_name(H200) else None
        if t is None:
            continue
        other = sb.ctc_tail_targets(r, t) if r["number"] == 4 else None
        if other is not None and other[0]:  # a p99 of other targets than the row's: left out, the note says why
            assert other[1][0].upper() + other[1][1:] in table and "not a slower call" in other[1]
            continue
        assert f"| +{(t['p99_ms'] - t['ms']) * 1e3:,.1f} ({t['p99_ms'] / t['ms'] - 1:.1%})" in table

def test_a_faster_new_peer_is_named_beside_the_rival(bench_copy):
    """A peer added to a file that beats the rival the row shows is named on the page, not hidden."""
    def add_peer(data):
        gem = next(r for r in data["measurements"] if r["series"] == "gemlite_w2" and r["params"]["m"] == 1
                   and r["params"]["shape"] == "4096x14336")
        data["measurements"].append({**gem, "series": "new_peer", "ms": gem["ms"] / 2})
    _rewrite(bench_copy / "nvidia-h200" / "ternary.json", add_peer)
    row = _ternary_row(sb.scoreboard(bench_copy), bench_copy / "nvidia-h200")
    assert any(n.startswith("new_peer is measured faster") for n in row["rival_notes"])
    assert "new_peer is measured faster" in sb.scoreboard_markdown(bench_copy)


def test_the_binding_floor_is_the_largest_and_a_latency_bound_case_is_judged_by_latency():
    """A kernel whose bytes take a few nanoseconds is measured against its latency floor, not a byte floor it
    exceeds a thousandfold (the CTC small-alphabet row is the case in point)."""
    board = [r for r in sb.scoreboard() if "missing" not in r]
    for r in board:
        floors = [f for f in (r["byte_floor_ms"], r["compute_floor_ms"], r["latency_floor_ms"]) if f is not None]
        if r["number"] == 4 and r["latency_floor_ms"] is None and "A = 28" in r["shape"]:
            continue  # the floor that binds is not measured on that card: no binding floor (below)
        if r["no_pct_why"]:  # no floor covers the call's work: no percentage
            assert r["pct_of_floor"] is None and r["binding"] is None
            continue
        if r["number"] == 8:  # a launch-bound loop: a chain binds, not its bytes; of its two chains, the longer
            forward = _find(_raw(H200, sb.TAILS), sb.FORWARD, model="smollm2", batch=1, chunk=1)
            assert forward["kernels_per_forward"] > 6 * 30  # six launches in each of SmolLM2's 30 layers, and more
            assert r["byte_floor_ms"] < r["latency_floor_ms"] < r["forward_bound_ms"]
            assert r["binding"] == "forward" and "is a bound, not a floor" in r["latency_what"]
            # the same bound, and so the same ratio, as chapter 08's page gives
            from book.speculate import lesson as spec
            loop = spec.loop_bound(spec.committed())
            assert r["binding_floor_ms"] * 1e3 == pytest.approx(loop["bound_us"])
            assert r["median_ms"] / r["binding_floor_ms"] == pytest.approx(loop["over"])
            floors.append(r["forward_bound_ms"])
        if r.get("real_model"):  # chapter 07 on SmolLM2: the forward-time bound from chapter 07's own run binds
            assert r["binding"] == "forward" and r["byte_floor_ms"] < r["forward_bound_ms"]
            floors.append(r["forward_bound_ms"])
        assert r["binding_floor_ms"] == max(floors)
    small = [r for r in board if r["number"] == 4 and "A = 28" in r["shape"]]
    assert small, "the CTC small-alphabet row is on the scoreboard"
    for r in small:
        if r["latency_floor_ms"] is not None:
            assert r["binding"] == "latency" and r["byte_floor_ms"] < r["latency_floor_ms"]
        else:  # an unmeasured chain floor gives no percentage, never the bytes' near-zero one
            assert r["pct_of_floor"] is None and r["latency_missing_why"]


def test_the_results_page_rows_are_named_in_words_and_its_lists_folded():
    from book.plotting import headline_markdown
    from book.site import PLAIN_NAMES, readable_headlines

    ngram = {r["card"]: r for r in sb.scoreboard() if r["number"] == 3 and r.get("ours_end_to_end_ms")
             and "missing" not in r}
    text = readable_headlines(headline_markdown(), ngram)
    rows_ = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| ours")
             and not ln.startswith("|---")]
    assert rows_ and not any(ln.split(" | ")[0].lstrip("| ").strip() in PLAIN_NAMES for ln in rows_)
    assert not [ln for ln in rows_ if re.search(r"\(step\d{2}\)", ln.split(" | ")[0])], "a series id, not words"
    assert text.count("the CPU loop it replaces, end to end") == len(ngram)
    assert not re.search(r"^- ", text, re.MULTILINE), "a list of where the cards differ is not folded"
    assert text.count("<details>") == headline_markdown().count("Where the cards differ")


def test_chapter_3_leads_with_the_fastest_published_gpu_port():
    """The scoreboard leads chapter 3 with the GPU drafter against the faster of our two ports of the pull request's
    GPU kernel (its first version, step 3, and its revision made exact, step 4), recomputed here from the raw file, on
    the same clock; the other port's ratio is in the row's notes; the CPU loop the chapter's question is about stands
    beside it, and the floors show once."""
    for card in (H200, H100):
        data = json.loads((card / "ngram.json").read_text())
        name = data["device"]["name"]
        rows_ = [r for r in sb.scoreboard() if r["number"] == 3 and r["card"] == name]
        ports = {n: next(m for m in data["measurements"] if m["series"] == f"step0{n}" and all(
            m["params"].get(k) == v for k, v in sb.NGRAM_CASE.items())) for n in (3, 4)}
        best = min(ports, key=lambda n: ports[n]["ms"])
        gpu = [r for r in rows_ if r["rival"].endswith(f"(step {best})") and not r.get("page_lead")
               and not r.get("page_headline")]
        assert len(gpu) == 1 and gpu[0]["lead"] and gpu[0]["rival_clock"] == gpu[0]["clock"] == "gpu"
        assert gpu[0]["vs_rival"] == pytest.approx(ports[best]["ms"] / gpu[0]["median_ms"])
        other = 7 - best
        assert any(f"(step {other}): {ports[other]['ms'] / gpu[0]['median_ms']:.2f}×" in n for n in gpu[0]["rival_notes"])
    board = sb.scoreboard_markdown()
    floors = board.split("Each row's three floors")[1].split("</details>")[0]
    # the headline case and the stress case, on each card
    assert floors.count("[03. N-gram matching]") == 1 and len(re.findall(r"N-gram matching.*\| H200 \| step", floors)) == 2


def test_chapter_3s_page_row_is_the_case_the_results_page_leads_with():
    """The scoreboard's chapter 03 row is the chapter's lead case (512 slots of 16,384 tokens, no budget, where every
    active slot searches), the case the landing and results pages lead with (:func:`book.results.ngram_many`): its
    time, rival and byte floor from the raw file, its p99 from the re-run at the same case; the deployed budget's
    ratio is in the notes."""
    from studylog.ngram import NO_BUDGET

    assert sb.NGRAM_NO_BUDGET == NO_BUDGET
    case = tuple(sb.NGRAM_LEAD_CASE[k] for k in ("batch", "seq_len", "threshold"))
    page = sb.scoreboard_markdown(folds="dropdown")
    lead_table = page.split("**Decode loops")[0]
    for card in (H200, H100):
        many = summary.ngram_many(card)
        assert many is not None and many[0] == case
        data = _raw(card, "ngram")
        params = {k: v for k, v in sb.NGRAM_LEAD_CASE.items() if v is not None}
        entry = [m for m in data["measurements"] if m["series"] == "ngram_match" and m["params"] == params]
        ours = entry[0] if entry else _find(data, "step12", **params)
        port = _find(data, "step04", **params)
        (row,) = [r for r in sb.scoreboard() if r["number"] == 3 and r["card"] == data["device"]["name"]
                  and r.get("page_lead")]
        assert sb.on_page(row) and not row["lead"]  # the results page still reads the deployed budget as the lead row
        assert row["median_ms"] == ours["spread_ms"][1] and row["rival_ms"] == port["ms"]
        assert row["vs_rival"] == pytest.approx(port["ms"] / ours["spread_ms"][1])
        assert row["byte_floor_ms"] == ours["floor_ms"] and row["binding"] == "bytes"
        assert f"{many[2]} of them search" in page
    line = next(ln for ln in lead_table.splitlines() if ln.startswith("| *03. N-gram matching*: stress case, "))
    tails = _find(_raw(H200, sb.TAILS), "ngram_match", **{k: v for k, v in sb.NGRAM_LEAD_CASE.items() if v is not None})
    spread = f"+{(tails['p99_ms'] - tails['ms']) * 1e3:.1f} ({tails['p99_ms'] / tails['ms'] - 1:.1%})"
    fold = page.split("How far one measurement lands above another (p99 − p50)")[1]
    spread_line = next(ln for ln in fold.splitlines() if ln.startswith("| *03. N-gram matching*: stress case, "))
    assert "512 slots of 16,384 tokens, no budget" in line and "512 slots of 16,384 tokens, no budget" in spread_line
    assert f"| {spread} |" in spread_line
    assert "‡" not in lead_table  # the re-run timed this case, not only the deployed budget
    assert "Under the deployed budget (128 slots of 32,768 tokens, budget 128)" in page


def test_no_marks_in_the_tables_and_the_notes_folded_under_the_first():
    """No footnote marks: a rival's cell names it in words that read alone, a tighter bound has its own column, and
    the re-run's spread its own fold; under the first table, the rest (the chapters with no row, the floors' kinds,
    FlashInfer's settings, part 1's rival) is folded under Notes."""
    page = sb.scoreboard_markdown(folds="dropdown")
    lead = page.split("**Decode loops")[0]
    table, under, room = lead.split("\n\n")[1:4]
    assert table.startswith("| chapter") and ":::{dropdown} Notes" not in lead
    # the Notes fold comes after both tables, the decode loops' too (its notes cover them)
    loops = page.split("**Decode loops")[1]
    assert loops.split("\n\n")[3].startswith(":::{dropdown} Notes"), loops[:3000]
    # which kernels still have room, from the rows, between the table's words and the notes
    assert room.startswith("Where room is left, by our median over its own work") and "; least in " in room, room
    # each one-launch floor is its own run's empty kernel, so no caveat on the drift between runs
    assert under.startswith("Each row is at the chapter's headline case; where the answer is a range"), under
    assert "cannot be told from the floor" not in page
    for mark in "¹²³⁴‡":
        assert mark not in page, mark
    # the one mark: a latency floor borrowed from the card's other runs, explained where it stands
    borrowed = [r for r in sb.scoreboard() if r.get("latency_borrowed")]
    assert ("†" in page) == bool(borrowed)
    if "†" in page:
        assert "† The run that timed this row timed no empty kernel" in page
    notes = page.split(":::{dropdown} Notes")[1].split("\n:::\n")[0]
    assert "has no row" in notes and "p99" not in notes
    # the words the tables use are defined here, in the Notes' first paragraph (How we measure links to it)
    words = notes.strip().split("\n\n")[0]
    assert words.startswith("Words. ")
    for word in ("**GQA**", "**W2A8**", "**step N**", "**part 1**", "**T, A, N**", "float64 reference",
                 "**not measured**", "**slots, budget**"):
        assert word in words, word


def test_results_lines_say_the_failed_check_the_grid_and_the_bound():
    """Chapter 5's line gives GemLite's failed check as the file records it (error and tolerance); chapter 4's, the
    range over its grid (recomputed here); chapter 7's, its bound beside the ratio on the landing page, and no ratio
    in the headline cell of a card whose run is not comparable."""
    lines = {h["number"]: h for h in summary.headlines()}
    data = _raw(H200, "ternary")
    (check,) = [c for c in data["checks"] if c["name"].startswith("gemlite_w2 within")
                and c["params"].get("shape") == "4096x14336" and c["params"].get("m") == 1]
    cell = " ".join([lines[5]["cells"]["H200"]] + lines[5]["notes"]["H200"])
    if not check["passed"]:  # no ratio against a peer that fails the check in a one-line answer: in a note
        assert "GemLite" not in lines[5]["cells"]["H200"] and "GemLite" not in lines[5]["brief"]["H200"]
        assert (f"its error is {check['relative_error']:.2%} of the product's norm, the tolerance "
                f"{check['tolerance']:.2%}") in cell
    beaten = summary.bitnet_range(H200)
    if beaten is not None:
        assert lines[5]["brief"]["H200"].startswith(f"{beaten[0]:.2f}–{beaten[1]:.2f}× BitNet's kernel (2-bit weights, 8-bit x) at its")
    assert "with its float64 check" not in summary.summary_markdown()
    ctc = _raw(H200, "ctc")
    ratios = []
    for ours in [r for r in ctc["measurements"] if r["series"] == "ctc_loss"]:
        rival = _find(ctc, "torch-best", **ours["params"])
        ratios.append(rival["ms"] / ours["ms"])
    # the range is against the strongest rival at each case: cuDNN, or torch's native path where it reads faster
    (lo, _), (hi, _) = summary.ctc_grid(H200)
    assert lo <= min(ratios) + 1e-9 and hi <= max(ratios) + 1e-9
    assert lines[4]["brief"]["H200"].startswith(f"{lo:.2f}–{hi:.2f}× torch's faster path at each case")
    from book.decode.results import median_bound

    bound = median_bound(_raw(H200, "decode")["measurements"], "8b", 1)
    assert f"Amdahl's law forecasts {bound:.2f}× for the whole loop" in " ".join(lines[7]["notes"]["H200"])
    assert "8B-shaped model" in lines[7]["brief"]["H200"]
    for name, cell in lines[7]["cells"].items():
        if not lines[7]["comparable"][name]:
            assert cell == summary.VOID, f"{name}: a ratio in a not comparable headline"
            assert any("not compared on this card" in n for n in lines[7]["notes"][name])


def test_a_tails_run_on_fewer_copies_than_the_chapter_is_said_in_the_cell_and_the_notes():
    """Where the tails run replayed a chapter's call over fewer copies of its input than the chapter's row rotated
    over (read from the two raw files here), the p99 cell says how many and the chapter's notes say why it matters;
    where either file does not record its copies, or the counts agree, nothing is said."""
    assert sb.tail_copies({"copies": 41}, {"rotated_copies": 1}).startswith("the re-run replays the call over 1 "
                                                                            "copy of its input")
    assert sb.tail_copies({"copies": 3}, {"rotated_copies": 3}) is None
    assert sb.tail_copies({"copies": None}, {"rotated_copies": 1}) is None
    assert sb.tail_copies({"copies": 5}, {}) is None
    if not (H200 / f"{sb.TAILS}.json").is_file():
        pytest.skip("no tails run")
    table = sb.scoreboard_markdown()
    h200 = sb.card_name(H200)
    for row in [r for r in sb.scoreboard() if r["card"] == h200 and r.get("tail_params") and "missing" not in r
                and sb.on_page(r)]:
        # the first case at the row's params, of the row's series where it names one (as sb.tail picks); none at
        # chapter 03's lead case, which the re-run did not time
        picked = [c for c in sb.TAIL_SERIES[row["number"]] if c[1] == row["tail_params"]
                  and c[0] == row.get("tail_series", c[0])]
        if not picked:
            continue
        series, params = picked[0]
        tails_rows = [r for r in _raw(H200, sb.TAILS)["measurements"] if r["series"] == series
                      and all(r["params"].get(k) == v for k, v in params.items())]
        if len(tails_rows) != 1:
            continue
        t = tails_rows[0]
        theirs, mine = t.get("rotated_copies"), row.get("copies")
        cell = f"{t['ms'] * 1e3:,.1f} / {t['p99_ms'] * 1e3:,.1f} ({theirs} cop"
        said = mine is not None and theirs is not None and theirs < mine
        assert (cell in table) == said, (row["ours"], theirs, mine)
        if said:
            assert f"rotates over {mine} copies" in table
    chapter2 = _find(_raw(H200, "masked_lm_head"), "step13", batch=1, kind="random", allowed=1000)
    tails2 = _find(_raw(H200, sb.TAILS), "MaskedHeadPlan", batch=1, kind="random", allowed=1000)
    if chapter2.get("copies", 1) > tails2.get("rotated_copies", chapter2.get("copies", 1)):
        assert "**Chapter 02, Masked LM head" in table and "over 1 copy of its input" in table


def test_the_results_line_says_once_where_one_card_replayed_one_copy(bench_copy):
    """Chapter 2's line says, in the cell of the card whose run recorded no ``copies`` (read from the raw files here),
    that it replayed one copy of the head while the other rotated copies; the clause goes away when both runs
    replay one copy, and moves to the other card when the rotation is on the other side."""
    def one_copy(card: Path) -> bool:
        return not any("copies" in r for r in _raw(card, "masked_lm_head")["measurements"])

    def cells(root: Path) -> dict[str, str]:
        line = next(h for h in summary.headlines(root) if h["number"] == 2)  # a cell with the notes it points to
        return {n: " ".join([cell] + line["notes"][n]) for n, cell in line["cells"].items()}

    said = "replayed one copy of the head"
    folders = [c for c in sb.cards(bench_copy) if (c / "masked_lm_head.json").is_file()]
    flags = {sb.short_card(sb.card_name(c)): one_copy(c) for c in folders}
    got = cells(bench_copy)
    for name, once in flags.items():
        assert (said in got[name]) == (once and not all(flags.values()) and any(flags.values())), (name, got[name])
    assert summary.summary_markdown(bench_copy, card=None).count(said) == (1 if len(set(flags.values())) == 2 else 0)

    def drop_copies(data):
        for r in data["measurements"]:
            for key in ("copies", "read_bytes", "rotation_capped"):
                r.pop(key, None)

    for card in folders:
        _rewrite(card / "masked_lm_head.json", drop_copies)
    assert not any(said in c for c in cells(bench_copy).values())
    # rotation on the H100's side only: the clause is in the H200's cell, naming the H100's rotated copies
    h100 = next((c for c in folders if "H100" in sb.card_name(c)), None)
    if h100 is None:
        return
    _rewrite(h100 / "masked_lm_head.json",
             lambda data: [r.update(copies=2, read_bytes=1, rotation_capped=False) for r in data["measurements"]])
    got = cells(bench_copy)
    assert said in got["H200"] and said not in got["H100"]
    # one byte fits in any L2: the headline itself is not compared, no ratio in its cell
    line = next(h for h in summary.headlines(bench_copy) if h["number"] == 2)
    assert line["cells"]["H200"] == summary.VOID and "not compared on this card" in got["H200"]


def test_headline_cells_are_short_and_their_caveats_listed():
    """A results cell is one number and a few words; its caveats are listed under the table, one item a line, named
    by the line's chapter. Chapter 6
    leads with the grouped-query layout of the model it cites (Llama 3.1 8B, the deployment-fair one) where a card
    measures it, the layout every card measures (32 heads) second (recomputed from the raw file), on the scoreboard too, and chapter 8's cell gives this run's one ratio (recomputed from
    the raw file's medians), no range over machines."""
    text = summary.summary_markdown()
    for h in summary.headlines():
        for name, cell in h["cells"].items():
            for clause in cell.split("; "):  # two figures where the chapter gives two (01, 07, 08): each short
                words = re.sub(r"\([^)]*\)", "", clause).split()
                assert len(words) <= 12, (h["number"], name, cell)
    notes = text.split(summary.NOTES_HEAD)[1].split("</details>")[0]
    assert "<details>" not in notes and notes.count("\n- **") == len(re.findall(r"^- \*\*\d\d\. ", notes, re.M))
    part2 = notes.split("\n- **05. Ternary matmul, part 2 (CUDA C++)**\n")[1].split("\n- **")[0]
    assert "\n  - At 4096 × 14336" in "\n" + part2  # one of its items, whichever comes first
    data = _raw(H200, "multi_item")
    gqa = {"shape": "8 prompts, mixed, 8 KV heads"}
    ratio = _find(data, "FlashInfer", **gqa)["ms"] / _find(data, "step06", **gqa)["ms"]
    mixed = {"shape": "8 prompts, mixed"}
    heads = _find(data, "FlashInfer", **mixed)["ms"] / _find(data, "step05", **mixed)["ms"]
    line = next(h for h in summary.headlines() if h["number"] == 6)
    # one number a cell: the 32-head layout is the line's note
    assert line["cells"]["H200"].startswith(f"**{ratio:.2f}×**") and "32 heads" not in line["cells"]["H200"]
    assert any(n.endswith(f"with 32 query heads each with its own key/value head, {heads:.2f}×") for n in line["notes"]["H200"])
    assert line["brief"]["H200"].startswith(f"{ratio:.2f}× FlashInfer with Llama 3.1 8B's grouped-query heads "
                                            f"(step 6); {heads:.2f}× with 32 heads (step 5)")
    board = [r for r in sb.scoreboard() if r["number"] == 6 and "H200" in r["card"] and "missing" not in r]
    shown = sb.scoreboard_markdown()
    assert shown.index("| step 6, grouped-query") < shown.index("| H200 | step 5, 32 heads") and len(board) == 2
    eight = next(h for h in summary.headlines() if h["number"] == 8)
    row = _board_row(sb.scoreboard(), 8, H200)
    assert eight["brief"]["H200"].startswith(f"{row['vs_rival']:.2f}× our own loop, chapter 07's (no serving engine")
    assert "second" not in text and "first machine" not in text


def test_reading_path_displays_nothing_in_a_kernel():
    """The landing page's cell shows its table only: the listings it counts are not displayed."""
    from IPython.utils.capture import capture_output

    with capture_output() as seen:
        table = summary.reading_path_markdown()
    assert not seen.outputs and not seen.stdout.strip()
    assert table.startswith("| page |")


def test_every_floor_names_its_kind_and_the_page_keeps_no_lab_notes():
    """One floor vocabulary: each percentage's floor names its kind (a byte, compute or latency floor, the latency
    floor's chain where it is one), chapter 8's forecast is called a bound, not a floor; the H100's one-copy run of
    chapter 2 is flagged L2-favoured where its run recorded no copies (read from the raw file); and no lab path,
    open question or per-run list of empty kernels is on the page."""
    table = sb.scoreboard_markdown()
    times, floors = table.split("Each row's three floors")
    floors = floors.split("\n\n")[1]
    for line in times.splitlines():
        if re.search(r"\*\*[\d.]+×\*\* \|", line):
            assert re.search(r"(byte|compute|latency) floor|our loop's (byte|kernel-count|forward-time) bound",
                             line), line
    # a cell holds a number and its kind; the chain of a latency floor is in the row's notes; chapter 02's copy and
    # two launches are a tighter bound of its own design, in a column of their own, not the card's floor
    assert re.search(r"latency floor \|", times) and "latency floor (" not in times and "is a bound, not a floor" in table
    assert re.search(r"\| own work \(µs\) \| × own work \|", times)
    assert "not the card's |" not in times
    assert "Its latency floor is the recursion's 150 dependent frames" in table
    assert "forecast" not in floors and "%" not in floors  # the floors table holds floors only
    for bad in ("lab/", "not known", "The empty kernel in each run", "committed"):
        assert bad not in table, bad
    # chapter 04's rows divide by each case's own chain of frames: no other chain is named as a lower or tighter bound
    assert "lower bound" not in table
    assert all(r.get("design_bound_ms") is None for r in sb.scoreboard() if r["number"] == 4)
    # the H100's run of chapter 2 replayed one copy of the head where the H200's rotated (read from the raw files):
    # its rows are out of the tables, with no fold of their numbers
    one_copy = not any("copies" in r for r in _raw(H100, "masked_lm_head")["measurements"])
    rotated = any("copies" in r for r in _raw(H200, "masked_lm_head")["measurements"])
    rows_ = [ln for ln in table.splitlines() if "| H100 | step 12, kernel alone" in ln]
    assert bool(rows_) == (not (one_copy and rotated))
    assert "An earlier" not in table


def test_folded_tables_say_a_shared_column_once_and_mark_a_not_comparable_card():
    from book.site import compact_tables

    text = "\n".join([":::{dropdown} Chapter 7: X", "", "**Card A**, measured 1 May 2026: wall.", "",
                      "| ours | against | case | speedup |", "|---|---|---|---|",
                      "| a | base | 1b, batch 1, per token | **1.30×** |", "| b | base | 8b, batch 1, per token | **1.10×** |"])
    out = compact_tables(text, {"Chapter 7: X": {"Card A"}})
    assert "Every case: batch 1, per token; against: base; not comparable" in out
    assert "| ours | case | speedup |" in out and "| a | 1b | **1.30×** (not comparable) |" in out
    assert compact_tables(text).count("(not comparable)") == 0


def test_host_bound_rows_name_the_rival_and_the_dense_baseline_where_it_wins_eagerly():
    """Chapter 5's row at 4096 x 14336: called eagerly a call takes the longer of its host and GPU times, so where
    cuBLAS on the dense matrix takes less than our host time, the row says cuBLAS would be faster (recomputed from
    the raw files); where the rival is GemLite the row names it."""
    text = summary.host_bound_markdown()
    for card, name in ((H100, "H100"), (H200, "H200")):
        data = _raw(card, "ternary")
        dense = _find(data, "cublas_bf16", shape="4096x14336", m=1)
        row = next(ln for ln in text.splitlines()
                   if ln.startswith(f"| chapter 05 part 2 (step 21) on the {name} at 4096"))
        ours_host = float(row.split(" | ")[1].split(" / ")[0].replace(",", ""))  # ours: host / GPU
        if max(dense["host_ms"], dense["ms"]) * 1e3 < ours_host:
            assert "cuBLAS bf16" in row and "would be faster" in row, row
        assert "ours stays the faster" not in row  # chapter 5's rows name their rival


# ----------------------------------------------------------------------------------------------
# What a reader needs first, and what is folded
# ----------------------------------------------------------------------------------------------

def test_the_page_is_one_paragraph_then_the_tables_and_how_we_measure_links_to_its_words():
    """Before the first table the page gives one paragraph (what a row sets side by side), which says the Notes
    define the shapes' words; How we measure neither repeats them nor keeps a section that only points here."""
    page = (ROOT / "scoreboard.md").read_text()
    cell = page.index("```{code-cell}")
    head = page[page.index("# How close to the limit"):cell]
    paragraphs = [p for p in head.split("\n\n")[1:] if p.strip()]
    assert len(paragraphs) == 1 and len(head.split()) <= 180, head
    assert "how_we_measure.md" in head and "The Notes under the tables define" in " ".join(head.split())
    assert ":::" not in page
    measure = (ROOT / "how_we_measure.md").read_text()
    # the scoreboard defines its own words where it uses them: no navigation-only section here
    assert "## Words the scoreboard uses" not in measure
    for word in ("**GQA**", "**W2A8**", "**step N**", "**T, A, N**"):
        assert word not in measure, word


def test_a_chapter_measured_differently_on_one_card_is_said_for_a_reader():
    """A run left off the tables (:func:`book.scoreboard.not_comparable`) is said in one line under the first table,
    as what differs on that card and that its numbers do not compare, with no history of the runs."""
    table = sb.scoreboard_markdown()
    times = table.split("Each row's three floors")[0]
    times = re.sub(r"<details><summary>Notes</summary>.*?</details>", "", times, flags=re.S)  # the chapters' notes
    apart = sb.not_comparable(sb.scoreboard())
    for (number, card), why in apart.items():
        entry = next(e for e in sb.ENTRIES if e.number == number)
        short = sb.short_card(card)
        (line,) = [ln for ln in times.splitlines() if f"[{number:02d}. {entry.title}](" in ln
                   and f"no {short} row" in ln]
        # one neutral sentence a card: what that card's benchmarks do, in the present tense, not what happened in a
        # run; where several chapters have no row on it, one sentence names them all, each with its reason
        if line.startswith(f"[{number:02d}. {entry.title}](") and "has no " in line:
            assert f"has no {short} row: the {short}'s benchmark does not time this case the way the " in line, line
            assert line.rstrip().endswith(f"'s does (on the {short} {why}).")
        else:
            assert f"have no {short} row: the {short}'s benchmarks do not time their cases the way the " in line, line
            assert f"chapter {number:02d}: {why}" in line, line
        assert len(why.split()) <= 16, why  # one short clause
        assert not re.search(r"\b(was|were|did|had)\b", why), why
    for said in ("is left out", "its run ", "replayed", "the other card's run", "rotates copies", "row: there",
                 "every call reads the same copy"):
        assert said not in times, said


def test_part_one_rival_other_than_gemlite_is_said_under_the_table():
    """Where chapter 05 part 1's row on a card is against cuBLAS, not GemLite (the rival part 1's page asks about),
    a short line under the first table says so and why: GemLite fails our float64 check at that shape on that card
    (the check read from the raw file). A card whose GemLite passes gets no such line; at the row's case
    (:data:`book.scoreboard.PART_ONE_CASE`) GemLite passes on every card."""
    times = sb.scoreboard_markdown().split("Each row's three floors")[0]
    for card in (H100, H200):
        data = _raw(card, "ternary")
        shape = sb.PART_ONE_CASE
        (check,) = [c for c in data["checks"] if c["name"].startswith("gemlite_w2 within")
                    and all(c["params"].get(k) == v for k, v in shape.items())]
        short = sb.short_card(data["device"]["name"])
        said = [ln for ln in times.splitlines() if ln.lstrip("- ").startswith(
            f"On the {short}, the rival of [05. Ternary matmul, part 1]({sb.PART_ONE_NOTEBOOK})")]
        assert check["passed"]  # the case is picked so: part 1's row is against GemLite, its peer, on every card
        assert not said, said


def test_part_one_of_chapter_five_has_a_row_recomputed_from_the_raw_file():
    """Chapter 05's part 1 (its last Triton step, book.results.PART_ONE_STEP) has a row on each card at
    :data:`book.scoreboard.PART_ONE_CASE`, by the page's one rule the shape of our least lead on the lead card among
    those where GemLite passes our float64 check (Llama 3 8B's gate and up projections, 14336 x 4096), linked to
    its own page, against GemLite where GemLite passes there, else cuBLAS bf16 (the rule of part 1's answer), with
    the same columns, its floors and × floor."""
    from book.results import PART_ONE_STEP, part_one_answer

    series = f"step{PART_ONE_STEP:02d}"
    table = sb.scoreboard_markdown()
    times, floors = table.split("Each row's three floors")
    board = sb.scoreboard()
    for card in (H100, H200):
        data = _raw(card, "ternary")
        shape = sb.PART_ONE_CASE
        assert shape == {"shape": "14336x4096", "m": 1}
        if short_lead := (sb.short_card(data["device"]["name"]) == sb.LEAD_CARD):  # the least lead there, by the rule
            passed = part_one_answer(card)["ratios"]
            assert min(passed, key=passed.get) == shape["shape"], passed
        ours = _find(data, series, **shape)
        (check,) = [c for c in data["checks"] if c["name"].startswith("gemlite_w2 within")
                    and all(c["params"].get(k) == v for k, v in shape.items())]
        rival = _find(data, "gemlite_w2" if check["passed"] else "cublas_bf16", **shape)
        ratio = rival["ms"] / ours["ms"]
        row = _ternary_row(board, card, "part1")
        assert row["vs_rival"] == pytest.approx(ratio) and row["median_ms"] == ours["ms"]
        answer = part_one_answer(card)
        assert check["passed"] and ratio == pytest.approx(answer["ratios"][shape["shape"]])  # part 1's own answer
        short = sb.short_card(data["device"]["name"])
        # on the lead card, a row of the first table, linked to part 1's page, its shape in the chapter's cell; on
        # the other, a row of the folded table of both cards
        found = [c for c in _table_rows(times.split("How far one measurement lands above another")[0])
                 if re.match(rf"^(\[05\. Ternary matmul, part 1\]\({re.escape(sb.PART_ONE_NOTEBOOK)}\)|\*05\. Ternary "
                             r"matmul, part 1\*)", c["chapter: shape"]) and c.get("card", sb.LEAD_CARD) == short]
        (cells,) = found
        assert cells["final kernel"].startswith(f"step {PART_ONE_STEP}, bf16 x")
        assert "14336 × 4096" in cells["final kernel"] + cells["chapter: shape"]
        if short == sb.LEAD_CARD:  # the lead row's shape is short; which layer this is and why, in its notes
            assert short_lead and cells["chapter: shape"].endswith("M = 1, N × K = 14336 × 4096"), cells
            assert ("its shape is an 8B Llama's up projection, where our lead over GemLite is least "
                    "of the shapes where GemLite passes our check") in table
        assert cells["median [slowest repetition], µs"].startswith(f"**{ours['ms'] * 1e3:,.1f}** [")
        assert cells["speedup (rival ÷ ours)"].startswith(f"{ratio:.2f}×")
        # a launch's floor is the empty kernel of this row's own run
        floor = max(ours["floor_mem_ms"], ours["floor_compute_ms"], sb.empty_kernel_ms(data))
        assert re.fullmatch(rf"\*\*{ours['ms'] / floor:.1f}×\*\*{BESIDE_FLOOR}", cells["× floor"]), cells
        assert "rather than the card's fastest" not in table
        (fline,) = [ln for ln in floors.splitlines() if "part 1" in ln and f"| {short} | step {PART_ONE_STEP}, " in ln]
        # the floor that binds, in bold (a launch's floor, under a microsecond, to two places)
        assert any(f"**{floor * 1e3:{f}}**" in fline for f in (",.1f", ".2f")), fline


def test_part_one_reads_before_part_two_and_its_shape_is_said():
    """In every table, chapter 05's part 1 comes before its part 2 (the chapter's order); the Definitions say why part
    1's row is not at the chapter's working shape, which holds only while GemLite fails our check there on the H200
    (the raw file's check)."""
    table = sb.scoreboard_markdown()
    for part in re.split(r"\n(?=\*\*|<details>)", table):  # each table: its caption or its fold starts it
        lines = [ln for ln in part.splitlines() if ln.startswith("| ") and "Ternary matmul, part " in ln]
        parts = [1 if "Ternary matmul, part 1" in ln else 2 for ln in lines]
        assert parts == sorted(parts), lines
    assert sum("Ternary matmul, part 1" in ln for ln in table.splitlines() if ln.startswith("| ")) >= 3
    data = _raw(H200, "ternary")
    (check,) = [c for c in data["checks"] if c["name"].startswith("gemlite_w2 within")
                and all(c["params"].get(k) == v for k, v in sb.TERNARY_CASE.items())]
    page = " ".join((ROOT / "how_we_measure.md").read_text().split())  # the words the scoreboard uses
    said = "at the chapter's working shape GemLite fails the check on the H200"
    assert (said in page) == (not check["passed"])


def test_chapter_five_speedup_cells_name_their_rival():
    """The cards' rivals at 4096 x 14336 can differ (GemLite passes our check on one card only): each such speedup
    cell names the rival it is against, recomputed from the raw file's check."""
    table = sb.scoreboard_markdown().split("Each row's three floors")[0]
    for card in (H100, H200):
        data = _raw(card, "ternary")
        shape = {"shape": "4096x14336", "m": 1}
        (check,) = [c for c in data["checks"] if c["name"].startswith("gemlite_w2 within")
                    and all(c["params"].get(k) == v for k, v in shape.items())]
        rival = _find(data, "gemlite_w2" if check["passed"] else "cublas_bf16", **shape)
        name = "GemLite 2-bit" if check["passed"] else "cuBLAS bf16"
        ours = min((r for s in sb.TERNARY_BF16_X for r in data["measurements"] if r["series"] == s
                    and all(r["params"].get(k) == v for k, v in shape.items()) and r["clock"] == "gpu"),
                   key=lambda r: r["ms"])
        short = sb.short_card(data["device"]["name"])
        (line,) = [ln for ln in table.splitlines() if f"| {short} | step {int(ours['series'][4:])}, bf16 x; " in ln]
        assert f"| {rival['ms'] / ours['ms']:.2f}× vs {name} |" in line, line


def test_chapter_4s_latency_floor_is_the_chain_of_frames_on_every_card_or_none():
    """Chapter 04's latency column holds one quantity on every card: the recursion's chain of frames timed alone,
    or nothing where a card does not time it (an empty kernel would be another floor in the same column)."""
    rows = [r for r in sb.scoreboard() if r["number"] == 4 and "missing" not in r]
    assert rows
    for r in rows:
        if r.get("latency_floor_ms") is None:
            assert "not timed on this card" in r["latency_what"] == r["latency_missing_why"], r["card"]
        else:
            assert "dependent frames alone" in r["latency_what"], r["card"]


def test_the_tails_run_times_chapter_four_on_the_chapters_own_targets():
    """The tails run's chapter 04 rows time the targets the chapter's benchmark draws at each case (its generator
    replayed over the grid), and its headline chain runs over the states of that case's longest target; a tails file
    whose repetitions drew their own targets gets a note and, where their medians spread wide, no p99."""
    from studylog import tails

    assert [len(l) for l in tails.ctc_bench_targets(150, 1, 28)] == [tails.ctc_floor_states() // 2]
    assert tails.ctc_headline_states() == 2 * max(map(len, tails.ctc_bench_targets(150, 8, 5000))) + 1
    data = _raw(H200, sb.TAILS)
    for case in (sb.CTC_CASE, sb.CTC_SMALL_CASE):
        row = _find(data, "ctc_loss", **case)
        if row.get("targets") == "the chapter's":
            assert row["target_lengths"] == [len(l) for l in tails.ctc_bench_targets(case["T"], case["N"], case["A"])]
    chain = [r for r in data["measurements"] if r["series"] == sb.CTC_HEADLINE_CHAIN]
    if chain:
        assert chain[0]["params"] == tails.CTC_HEADLINE_CASE | {"frames": 150, "states": tails.ctc_headline_states()}
    # an older file: three repetitions of their own targets, one twice as slow as the others
    old = {"ms": 0.043, "p99_ms": 0.083, "repetition_medians_ms": [0.043, 0.083, 0.042]}
    drop, why = sb.ctc_tail_targets({"tail_params": sb.CTC_SMALL_CASE}, old)
    assert drop and "not a slower call" in why and "142 labels" in why
    assert sb.ctc_tail_targets({"tail_params": sb.CTC_SMALL_CASE}, old | {"targets": "the chapter's"}) is None


def test_a_byte_floor_that_binds_for_want_of_a_chain_or_at_a_short_call_says_so_in_its_cell():
    """Chapter 04's H100 row binds on its byte floor only because its chain is not timed there: its floor and × floor
    read n/a, the byte floor said beside it. A short ternary row keeps its × floor over the floor that binds (its bytes, or
    one launch), as its column names; a kernel that only reads the same weights in the same run is its tighter bound, in the next two
    columns (recomputed here), and no mark or note repeats it."""
    page = sb.scoreboard_markdown(folds="dropdown")
    shown = _table_rows(page.split("How far one measurement lands above another")[0])
    seen = 0
    for r in sb.scoreboard():
        if "missing" in r or not sb.on_page(r) or not r.get("binding") or r.get("loop_bound"):
            continue
        card = sb.short_card(r["card"])
        cells = next((c for c in shown if c.get("final kernel") in (r["ours"], r["ours"].split("; ")[0])
                      and c.get("card", sb.LEAD_CARD) == card and re.match(rf"^[\[*]{r['number']:02d}\.",
                                                                           c["chapter: shape"])
                      and bool(r.get("part_notebook")) == ("part 1" in c["chapter: shape"])), None)
        if cells is None:
            continue
        if r["binding"] == "bytes" and r.get("latency_missing_why"):  # no distance to a floor that may be higher
            assert cells["× floor"] == "n/a", cells
            assert cells["floor, the card's or a chain's (µs)"].startswith("n/a (chain not timed here; byte floor "), cells
        if r.get("read_only_ms"):
            seen += 1
            read = r["read_only_ms"]
            assert re.fullmatch(rf"\*\*{100 / r['pct_of_floor']:.1f}×\*\*{BESIDE_FLOOR}", cells["× floor"]), cells
            # the floor that binds: its bytes, or at a call this short (part 1's 14336 x 4096) its one launch
            assert cells["floor, the card's or a chain's (µs)"].endswith((", byte floor", ", latency floor")), cells
            if "own work (µs)" in cells:  # the table of both cards: two columns beside × floor
                assert cells["own work (µs)"].startswith(f"{read * 1e3:,.1f}, "), cells
                assert cells["× own work"] == f"{r['median_ms'] / read:.1f}×", cells
            else:  # the lead table: in chapter 05's notes' small table, its time and our median over it
                five = page.split("**Chapter 05, ")[1].split("**Chapter ")[0]
                assert re.search(rf"\| {card} \| .*\| {read * 1e3:,.1f} \| {r['median_ms'] / read:.1f}× \|$", five,
                                 flags=re.M), five
    assert seen >= 4  # chapter 05's rows on the two cards
    assert "(ours: " not in page and "a read-only pass)" not in page
    assert page.count(sb.READ_ONLY_WHAT) == 1  # what the bound is: once, in chapter 05's notes


def test_the_decode_loops_spread_over_requests_is_the_results_pages_note():
    """A decode loop's spread of per-request ratios is a note of the results page, not again in the scoreboard's
    fold (the scoreboard is about the loop's bound)."""
    table = sb.scoreboard_markdown()
    from book import results

    notes = results.summary_markdown().split(results.NOTES_HEAD, 1)[1]
    for r in sb.scoreboard():
        if r.get("loop_bound") and "missing" not in r and r.get("ratio_note", "").startswith("the ratio of the two"):
            said = r["ratio_note"].removeprefix("the ratio of the two median times; ")
            assert said not in table and said[0].upper() + said[1:] not in table, said
            if r["lead"] and sb.short_card(r["card"]) == results.SUMMARY_CARD:  # the results table's card
                assert said[0].upper() + said[1:] in notes, said


def test_chapter_4s_headline_floor_is_the_chapters_own():
    """Chapter 04's rows divide by the floor every table of the chapter uses (book.ctc.lesson.case_floor: the larger of
    the case's bytes and its own chain of frames, timed for every case): at the headline, its own chain, latency."""
    from book.ctc import lesson
    from studylog.plotting import load_results

    results = load_results("ctc", gpu=H200.name, root=H200.parent)
    table = sb.scoreboard_markdown()
    for case in (sb.CTC_CASE, sb.CTC_SMALL_CASE):
        row = next(r for r in sb.scoreboard() if r["number"] == 4 and r["card"] == sb.card_name(H200)
                   and r.get("tail_params") == case)
        floor_us, kind = lesson.case_floor(results, case["A"], case["N"])
        assert row["binding_floor_ms"] * 1e3 == pytest.approx(floor_us)
        assert row["binding"] == {"bytes": "bytes", "chain": "latency", "empty kernel": "latency"}[kind]
        assert row["latency_floor_ms"] * 1e3 == pytest.approx(lesson.case_chain_us(results, case["A"], case["N"]))
    head = next(r for r in sb.scoreboard() if r["number"] == 4 and r["card"] == sb.card_name(H200)
                and r.get("tail_params") == sb.CTC_CASE)
    assert head["binding"] == "latency"  # the headline's own chain is above its bytes
    line = next(ln for ln in table.splitlines() if ln.startswith("| [04. CTC loss]"))
    assert f"| **{head['median_ms'] / head['binding_floor_ms']:.1f}×** |" in line


def test_a_p50_p99_run_off_the_chapters_median_is_said_once_under_its_table():
    """The separate run's median is not the chapter's (the clocks are not locked), so its table gives that run's
    spread alone, p99 over p50; the one line under that folded table says how far its medians land from the
    chapters', and why, with a link to How we measure, and says no more per chapter."""
    page = sb.scoreboard_markdown()
    fold = page.split("How far one measurement lands above another (p99 − p50)")[1].split("</details>")[0]
    line = next(ln for ln in fold.splitlines() if ln.startswith("From a separate run"))
    assert "the clocks are not locked" in line and "profiler" not in line  # both runs time before it starts
    assert re.search(r"between \d+\.\d% (below|above) and \d+\.\d% (below|above) the chapters' own", line), line
    assert "how_we_measure.md#clocks-and-state" in line
    assert "04 on the H200" not in page and "a gap over" not in page


def test_room_left_is_said_from_the_rows_and_the_notes_carry_no_run_bookkeeping():
    """Under the lead table, one paragraph names the kernels with most room and those nearest their mark, each figure
    our median over its own work where a run times it, else over its floor, from the rows; the one-launch floor's
    swing over the card's runs is said beside it; the Notes say no run's history."""
    page = sb.scoreboard_markdown(folds="dropdown")
    room = next(p for p in page.split("\n\n") if p.startswith("Where room is left"))
    rated = []
    for r in sb.scoreboard():
        if r.get("lead") and "missing" not in r and sb.short_card(r["card"]) == sb.LEAD_CARD and sb.on_page(r):
            got = sb._room(r)
            if got:
                rated.append(got[0])
    if len(rated) >= 4:
        assert f"{max(rated):.1f}×" in room.split("; least in ")[0], room
        assert f"{min(rated):.1f}×" in room.split("; least in ")[1], room
    lo, hi, _ = sb.empty_kernel_range()[sb.LEAD_CARD]
    assert "one launch" not in room or f"{lo:.2f} to {hi:.2f} µs" in room, room
    for said in ("predates the chapter's entry point", "timed alone in a separate run", "takes the same bound from its run",
                 "counted in a separate run", "did not replay its"):
        assert said not in page, said


# ----------------------------------------------------------------------------------------------
# Issue 32's reads: what a cell says about its floor, a close lead beside its spread, How we measure's rules
# ----------------------------------------------------------------------------------------------

def test_a_chain_on_our_own_kernel_and_a_one_launch_floor_say_so_in_their_cells():
    """A latency floor timed on our own minimal kernel (chapter 04's frames) is named a yardstick in its cell, and a
    one-launch floor (chapter 03's headline case) says its × mostly tracks launch latency; no other cell says so."""
    page = sb.scoreboard_markdown(folds="dropdown")
    rows = _table_rows(page.split("How far one measurement lands above another")[0])
    by_kernel = {}
    for r in sb.scoreboard():
        if "missing" in r or not sb.on_page(r) or r.get("loop_bound") or r["binding"] != "latency":
            continue
        by_kernel[(r["number"], sb.short_card(r["card"]))] = r
    seen = set()
    for cells in rows:
        floor = cells.get("floor, the card's or a chain's (µs)", "")
        number = int(re.match(r"^[\[*](\d+)\.", cells["chapter: shape"]).group(1))
        if sb.OWN_CHAIN_WORDS in floor:
            seen.add("chain")
            assert number == 4 and floor.endswith(", " + sb.OWN_CHAIN_WORDS), cells
        if sb.ONE_LAUNCH_WORDS in floor:
            seen.add("launch")
            assert number == 3, cells
    if any(sb.own_chain(r) for r in by_kernel.values()):
        assert "chain" in seen
    if any(r.get("latency_what") == sb.ONE_KERNEL for r in by_kernel.values()):
        assert "launch" in seen


def test_a_close_lead_says_beside_its_spread_row_whether_the_repetitions_overlap():
    """A lead above the tie band and under CLOSE_LEAD that the re-run replayed: its p99 − p50 cell says the lead and
    whether our and the rival's repetitions overlap (recomputed here); the Notes do not say it again."""
    page = sb.scoreboard_markdown(folds="dropdown")
    spread = page.split("How far one measurement lands above another (p99 − p50)")[1].split("\n:::")[0]
    notes = page.split(":::{dropdown} Notes")[1].split("\n:::\n")[0]
    said = 0
    for r in sb.scoreboard():
        if ("missing" in r or not sb.on_page(r) or not r.get("rival_spread_ms") or not r.get("vs_rival")
                or not 1 < r["vs_rival"] < sb.CLOSE_LEAD or summary.is_tie(r["vs_rival"])):
            continue
        (rlo, _, rhi), (olo, ohi) = r["rival_spread_ms"], (r["fastest_ms"], r["slowest_ms"])
        words = f"our repetitions took {olo * 1e3:,.1f}–{ohi * 1e3:,.1f} µs, the rival's {rlo * 1e3:,.1f}–{rhi * 1e3:,.1f} µs"
        verdict = "the ranges do not overlap" if ohi < rlo else "the ranges overlap"
        in_spread = [ln for ln in spread.splitlines() if ln.startswith("|") and words in ln]
        if in_spread:
            said += 1
            (ln,) = in_spread
            assert f"the {r['vs_rival']:.2f}× lead: {words}: {verdict}" in ln, ln
            assert words not in notes.replace("Our repetitions", "our repetitions")
        else:  # no re-run row: said in the chapter's notes
            assert words in notes.replace("Our repetitions", "our repetitions") or words.replace("our", "Our", 1) in notes
    assert said >= 1


def test_how_we_measure_says_the_chain_floor_is_our_own_and_the_tie_rule_decides():
    """How we measure says once, plainly, that a chain floor is timed on our own minimal code (a yardstick, not the
    card's limit), that the tie rule, not the repetitions' ranges, decides a close call, and keeps no nesting table."""
    measure = " ".join((ROOT / "how_we_measure.md").read_text().split())
    assert measure.count("is timed on our own minimal code") == 1
    assert "a chain floor is a yardstick from our own design, not a limit of the card" in measure
    assert "is a tie, even where the two sides' ranges do not overlap" in measure
    assert "How the counts nest" not in measure and "| unit | what it is |" not in measure
