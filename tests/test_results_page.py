"""The results page's caveats: one flag rule for every ratio, chapter 6's grouped-query headline in its folded table,
and the sentence on calls whose host time exceeds their GPU time, each checked against the raw benchmark files."""

from __future__ import annotations

import json
import re

from book import results
from book.site import flag_rows, headlines_page_markdown
from studylog.paths import BENCH_RESULTS


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
    ratio = _find(rows, "index_select", **case)["ms"] / _find(rows, "step09", **case, layout="vd")["ms"]
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
             / _find(rows, "step12", shape="4096x14336", m=1)["ms"])
    assert any("int8 activations (step 12" in ln and f"**{ratio:.2f}×**" in ln for ln in page.splitlines())
    assert "quantised in every block" not in page


def test_host_bound_sentence_lists_exactly_the_rows_whose_host_time_exceeds_gpu_time():
    from book.plotting import headline_rows

    text = results.host_bound_markdown()
    for r in results.host_bound():
        assert r["host_ms"] > r["gpu_ms"]
        assert f"chapter {r['number']:02d} on the {r['card']}" in text
    # ternary step 11 against GemLite on either card: its host time per call, from the folded rows, is above its GPU time
    for row in headline_rows():
        if row["chapter"] == "ternary" and "GemLite" in row["baseline"] and row["host_ms"] > row["kernel_ms"]:
            card = row["gpu"].replace("NVIDIA ", "").replace(" 80GB HBM3", "")
            assert f"chapter 05 on the {card}" in text


def test_landing_table_still_renders():
    table = results.reading_path_markdown()
    assert table.count("\n| [") >= 9


def test_runs_set_up_differently_are_in_one_fold_of_their_own():
    """A card's run that is not comparable with the other card's (the scoreboard's flags) is out of its chapter's
    fold on the results page, and out of the headline table's cells, in one fold at the end."""
    page = results.headline_tables_markdown()
    moved = results.not_comparable_runs()
    body, _, last = page.rpartition(":::{dropdown} An earlier")
    assert moved and last, "the fold of runs set up differently"
    for number, card in moved:
        chapter = body.split(f":::{{dropdown}} {number:02d}. ")[1].split("\n:::")[0]
        assert f"**{card}**" not in chapter and f"**{number:02d}. " in last and card in last
        assert "(L2-favoured)" not in last and "(not comparable)" not in last
    summary = results.summary_markdown()
    table = summary.split("\nNotes:\n")[0]
    for h in results.headlines():
        for name, text in h["earlier"].items():
            assert h["cells"][name] == results.EARLIER_CELL and text in summary.split("An earlier run")[1]
    assert "Where the cards differ" not in body.split(":::{dropdown} 02. ")[1].split("\n:::")[0]
    assert "05. Ternary matmul, part 1 (Triton)" in table


def test_chapter_4_grid_times_one_kernel_per_case_on_every_card():
    """Each card's range over chapter 4's grid times, at each case, the step its entry point runs there: the entry
    point where the file times it, else the step the entry point's rule picks, read here from the raw file."""
    from studylog.ctc.fused import final_step

    for path in BENCH_RESULTS.glob("*/ctc.json"):
        rows = json.loads(path.read_text())["measurements"]
        entry = any(r["series"] == "ctc_loss" for r in rows)
        ratios = []
        for rival in [r for r in rows if r["series"] == "torch-best" and r["clock"] == "gpu"]:
            p = rival["params"]
            series = "ctc_loss" if entry else f"step{final_step(p['T'], p['N'], p['A']):02d}"
            ours = _find(rows, series, **p)
            ratios.append(rival["ms"] / ours["ms"])
        (lo, _), (hi, _) = results.ctc_grid(path.parent)
        assert (lo, hi) == (min(ratios), max(ratios))


def test_landing_lines_say_the_like_for_like_ratio_and_the_eager_caveats():
    """Chapter 2's landing line leads with the kernel alone against a gather and a matmul; chapter 5's says, where
    BitNet's call costs less host time than ours at every shape (read from the raw rows), that called eagerly BitNet's
    kernel is faster; chapter 4's says its graph replay and how many of its cases are host-bound called eagerly."""
    from book.scoreboard import cards

    lines = {h["number"]: h for h in results.headlines()}
    alone = next(b for b in results.scoreboard() if b["number"] == 2 and "H200" in b["card"] and not b["lead"])
    assert lines[2]["brief"]["H200"].startswith(f"{alone['vs_rival']:.2f}× a gather + matmul, kernel alone")
    h200 = next(c for c in cards() if "h200" in c.name)
    pairs = results.bitnet_rows(h200)
    if pairs and max(p["host_ms"] for *_, p in pairs) < min(o["host_ms"] for _, _, o, _ in pairs):
        assert "called eagerly, one call at a time, BitNet's is faster" in lines[5]["brief"]["H200"]
    slow, of = results.ctc_host_bound(h200)
    assert "graph-replayed" in lines[4]["brief"]["H200"]
    if slow:
        assert f"host-bound at {slow} of the {of} cases" in lines[4]["brief"]["H200"]
