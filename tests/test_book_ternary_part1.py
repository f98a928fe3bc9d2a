"""Chapter 05 part 1's own numbers (book/ternary/part1.py): step 14 against GemLite at every shape of GemLite's
float64 check, the failing shapes included with their ratio and the other card's verdict, and step 14's eager host
time; and the page's use of them (the headline gives the ratio where GemLite fails but is faster)."""

import json

import pytest

from book.ternary import lesson as L
from book.ternary import part1 as P
from studylog import paths
from studylog.ternary.results import GEMLITE, on_gpu_clock
from studylog.ternary.steps import SERIES

PAGE = paths.REPO_ROOT / "notebooks" / "05_ternary_1_triton.ipynb"


@pytest.fixture(scope="module")
def results():
    res = L.load()
    if res is None or L.gemlite_check(res) is None:
        pytest.skip("no committed benchmark with GemLite's check")
    return res


def test_gemlite_split_covers_every_checked_shape_once(results):
    gem = L.gemlite_check(results)
    split = P.gemlite_split(results, L.cards().get("H100"))
    assert sorted(split["passing"]) == sorted(gem["passed_at"])
    assert [f["shape"] for f in split["failed"]] == gem["failed"]
    assert not set(split["passing"]) & set(gem["failed"])


def test_gemlite_split_ratios_are_gemlites_time_over_step_14s(results):
    split = P.gemlite_split(results)
    for shape, r in split["passing"].items():
        assert r == pytest.approx(L.us(results, GEMLITE, shape) / L.us(results, SERIES[14], shape), rel=1e-12)
    assert split["lowest"] == min(split["passing"].values()) and split["highest"] == max(split["passing"].values())
    for f in split["failed"]:
        g, o = L.us(results, GEMLITE, f["shape"]), L.us(results, SERIES[14], f["shape"])
        assert (f["gemlite_us"], f["ours_us"]) == (g, o)
        assert f["ratio"] == pytest.approx(g / o, rel=1e-12)
        assert f["faster"] == (g < o) == (f["ratio"] < 1)  # a loss where GemLite fails is still marked a loss
        check = L.gemlite_check(results, f["shape"])
        assert not check["passed"] and f["error"] == check["error"] > f["tolerance"] == check["tolerance"]
        assert f["passes_elsewhere"] is None  # no other card given


def test_gemlite_split_reads_the_other_cards_verdict(results):
    h100 = L.cards().get("H100")
    if h100 is None:
        pytest.skip("no committed H100 file")
    for f in P.gemlite_split(results, h100)["failed"]:
        there = L.gemlite_check(h100, f["shape"])
        assert f["passes_elsewhere"] == (None if there is None else there["passed"])


def test_gemlite_split_without_a_file_is_none():
    assert P.gemlite_split(None) is None
    assert P.host_range(None) is None


def test_host_range_spans_every_shape_at_one_row(results):
    rows = [r for r in on_gpu_clock(results).select(SERIES[14], m=1) if r.get("host_ms") is not None]
    if not rows:
        pytest.skip("no host times in the committed file")
    host = P.host_range(results)
    assert host["host_lo"] == min(r["host_ms"] for r in rows) * 1e3
    assert host["host_hi"] == max(r["host_ms"] for r in rows) * 1e3
    assert host["gpu_lo"] == min(r["ms"] for r in rows) * 1e3 and host["gpu_hi"] == max(r["ms"] for r in rows) * 1e3
    assert host["bound"] == all(r["host_ms"] > r["ms"] for r in rows)


def test_the_page_leads_with_gemlite_and_states_the_loss_in_its_headline():
    """"Why it matters" gives GemLite's layer sum before cuBLAS's; the result's headline gives the ratio where
    GemLite is faster but fails the check; "Where we lose" gives step 14's host time; the note on 20480 x 3200 sits
    with the result table, where that shape appears."""
    cells = {c["id"]: "".join(c["source"]) for c in json.loads(PAGE.read_text())["cells"]}
    why = cells["ff5c35bc"]
    assert why.index("part1.gemlite_split(") < why.index("Against cuBLAS bf16")
    assert why.index("Against the strongest peer") < why.index("Against cuBLAS bf16")
    result = cells["38fdca9c"]
    assert "f['ratio']" in result and 'if f["faster"]' in result and "20480 × 3200 is no 2B4T layer" in result
    assert result.index("lesson.gemlite_table(results)") < result.index("20480 × 3200")
    assert "20480 × 3200" not in cells["d6a506a7"]
    assert "part1.host_range(results)" in cells["446885d6"]
