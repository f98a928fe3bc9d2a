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
    assert "12% apart" in results.caveat(ratio=2.16, again=1.93, card="H200")
    assert results.caveat(ratio=1.56, again=1.64, card="H200") == ""


def test_folded_rows_flag_either_side_from_their_own_cells():
    table = ("**masked_lm_head** — NVIDIA H200, 2026-11-29; clock: gpu\n\n"
             "| ours | against | case | speedup | ours (µs) | theirs (µs) | host per call (µs) |\n|---|---|---|---|---|---|---|\n"
             "| a | b | batch 1 | **2.00×** (spread 14%) | 10.0 (10.0–10.1) | 20.0 (18.0–20.5) | 1.0 |\n"
             "| a | b | batch 1 | **2.00×** | 10.0 (9.0–10.2) | 20.0 (20.0–20.1) | 1.0 |\n")
    out = flag_rows(table).splitlines()
    assert out[4].count("spread") == 1 and "the rival's spread 12%" in out[4]
    assert "our spread 12%" in out[5]


def test_page_has_the_grouped_query_row_and_flags_chapter_8s_second_machine():
    page = headlines_page_markdown()
    rows = _raw_rows("H200", "multi_item")
    gqa = {r["series"]: r["ms"] for r in rows if r["params"].get("shape") == "8 prompts, mixed, 8 KV heads"
           and r["series"] in ("step06", "FlashInfer")}
    if len(gqa) == 2:  # the row the H200's headline stands on, with both times, in the folded table
        line = next(ln for ln in page.splitlines() if "sharing 8 key/value heads" in ln)
        assert f"**{gqa['FlashInfer'] / gqa['step06']:.2f}×**" in line
        assert f"{gqa['step06'] * 1e3:,.1f}" in line and f"{gqa['FlashInfer'] * 1e3:,.1f}" in line
    again = results.repeated(8, "H200", 8)
    if again is not None:
        line = next(ln for ln in page.splitlines() if "batch 8" in ln and "×" in ln and "SmolLM2-135M, extraction" in ln)
        first = float(re.search(r"\*\*([\d.]+)×\*\*", line).group(1))
        gap = max(first, again) / min(first, again) - 1
        assert (f"{again:.2f}× on a second H200" in line) == (gap > results.FLAG_ABOVE)


def test_host_bound_sentence_lists_exactly_the_rows_whose_host_time_exceeds_gpu_time():
    from book.plotting import headline_rows

    text = results.host_bound_markdown()
    for r in results.host_bound():
        assert r["host_ms"] > r["gpu_ms"]
        assert f"chapter {r['number']} on the {r['card']}" in text
    # ternary step 11 against GemLite on either card: its host time per call, from the folded rows, is above its GPU time
    for row in headline_rows():
        if row["chapter"] == "ternary" and "GemLite" in row["baseline"] and row["host_ms"] > row["kernel_ms"]:
            card = row["gpu"].replace("NVIDIA ", "").replace(" 80GB HBM3", "")
            assert f"chapter 5 on the {card}" in text


def test_landing_table_still_renders():
    table = results.reading_path_markdown()
    assert table.count("\n| [") >= 9
