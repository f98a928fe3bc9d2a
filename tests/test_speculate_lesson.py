"""Chapter 8's page readings (``book.speculate.lesson``) that the page's tables print: the main table's one row per
step, step 2's chain (step 1, 2a, 2b = step 2) from its own run, the result table's second run and how far apart the
runs are, and the totals table's median request, each checked against a reference computed here from the rows."""

from __future__ import annotations

import json
import textwrap
import random
import statistics

import pytest

from book.speculate import lesson
from studylog.paths import REPO_ROOT
from studylog.plotting import Results


def _row(series: str, request: str, ms: float, chunks: list[int], tokens: int) -> dict:
    return {"series": series, "params": {"model": "smollm2", "batch": 1, "workload": "extraction", "request": request},
            "ms": ms, "chunk_lengths": chunks, "tokens": tokens}


def _verify(chunk: int, layer: str, ms: float, used: bool) -> dict:
    return {"series": "verify", "params": {"model": "smollm2", "batch": 1, "chunk": chunk, "layer": layer}, "ms": ms,
            "used": used}


def test_the_result_table_carries_the_second_run_and_flags_runs_far_apart():
    results = lesson.committed()
    second = json.loads((REPO_ROOT / "lab" / "speculate" / "results" / "nvidia-h200" / lesson.SECOND_RUN)
                        .read_text())["measurements"]

    def ratio(rows, batch, workload):
        def med(series):
            return statistics.median(r["ms"] for r in rows if r["series"] == series
                                     and r["params"].get("batch") == batch and r["params"].get("workload") == workload)
        return med("ch7_step03") / med("step03")

    rows = lesson.bound_rows(results)
    assert rows
    for r in rows:
        first, again = ratio(results.rows, r["batch"], r["workload"]), ratio(second, r["batch"], r["workload"])
        assert r["ratio"] == pytest.approx(first) and r["second_ratio"] == pytest.approx(again)
        assert r["runs_apart"] == pytest.approx(max(first, again) / min(first, again) - 1)


def test_the_totals_table_sets_the_median_request_beside_the_totals():
    results = lesson.committed()
    table = lesson.breakdown_table(results)
    for row, series in zip(table, ("ch7_step03", "step01", "step03")):
        ms = [r["ms"] for r in results.rows if r["series"] == series and r["params"].get("batch") == 1
              and r["params"].get("workload") == "extraction"]
        assert row["median"] == pytest.approx(statistics.median(ms) * 1e3)
        assert row["total"] > 0


def _chain_table(chain) -> str:
    """Step 2's chain as the page renders it: the book's one chain renderer, µs per output token, whole µs."""
    from book.common import chain_table

    return chain_table(lesson.step02_chain_rows(chain), [lesson.CHAIN_CASE], str, unit="µs per token", digits=0)


def _check_chain(table: str) -> list[list[str]]:
    """A chain table's rules: each row's label once, step 1 first and step 2 last, every "× previous" the ratio of the
    row above's µs cell over its own (to the cells' rounding), "does not pay" exactly where it is below one."""
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]]
    labels = [r[0] for r in rows]
    assert labels == ["step 1", "2a", "2b = step 2"] and len(set(labels)) == len(labels)
    assert rows[0][3] == "anchor"
    for above, row in zip(rows, rows[1:]):
        us_above, us = (float(r[2].replace(",", "")) for r in (above, row))
        x = float(row[3].split("×")[0])
        assert x == pytest.approx(us_above / us, abs=0.006), row[0]
        assert ("does not pay" in row[3]) == (x < 1.0), row  # the cell's own two digits decide
        assert row[1].startswith("+ ")
    return rows


def test_step_2s_chain_is_cumulative_and_read_from_its_run():
    """The committed run of step 2's chain: step 1, 2a (drafts verified on the nine-launch layer), 2b = step 2, each
    the median request of its decoder and step; the anchors' gap to the chapter's run, computed from the times as
    printed."""
    results = lesson.committed()
    chain = lesson.step02_chain(results)
    _check_chain(_chain_table(chain))
    run = json.loads((REPO_ROOT / lesson.LAB_RESULTS / lesson.SPLIT_RUN).read_text())
    summary = run["summary"]
    assert [r["us"] for r in chain["rows"]] == pytest.approx(
        [summary["tuned"]["step01"] * 1e3, summary["nine"]["step02"] * 1e3, summary["tuned"]["step02"] * 1e3])
    own = {r["step"]: r["ms_per_token"] * 1e3 for r in lesson.steps_table(results)}
    # as the tables print the times, in whole µs
    gaps = [abs(round(chain["rows"][0]["us"]) / round(own["step01_masked_head"]) - 1),
            abs(round(chain["rows"][-1]["us"]) / round(own["step02_ngram_draft"]) - 1)]
    assert chain["gap"] == pytest.approx(max(gaps)) and chain["requests"] == 25


def test_step_2s_chain_from_hand_made_rows_and_a_missing_run(tmp_path, monkeypatch):
    rng = random.Random(2)
    rows = []
    for k in range(5):
        for variant, step, ms in (("tuned", "step01", 0.85), ("nine", "step01", 0.86), ("nine", "step02", 0.5),
                                  ("tuned", "step02", 0.52)):
            rows.append({"request": f"r{k}", "variant": variant, "step": step, "ms_per_token": ms * rng.uniform(0.99, 1.01)})
    (tmp_path / lesson.SPLIT_RUN).write_text(json.dumps({"rows": rows, "same_tokens_in_both_variants": True}))
    monkeypatch.setattr(lesson, "LAB_RESULTS", str(tmp_path))
    chain = lesson.step02_chain(lesson.committed())
    table = _check_chain(_chain_table(chain))
    assert "does not pay" in table[2][3]  # 2b slower than 2a here: the cell says so
    assert chain["rows"][1]["us"] == pytest.approx(statistics.median(
        r["ms_per_token"] for r in rows if r["variant"] == "nine" and r["step"] == "step02") * 1e3)
    (tmp_path / lesson.SPLIT_RUN).unlink()
    with pytest.raises(FileNotFoundError):  # the page has no other source for the chain
        lesson.step02_chain(lesson.committed())


def test_the_main_table_has_one_row_per_step():
    """The page's main table: chapter 07's step 3 and the four steps, no lettered rows (step 2's changes have their
    own chain table); the notebook builds no sub-row."""
    rows = lesson.steps_table(lesson.committed())
    assert [r["step"] for r in rows] == ["chapter 07, step 3", "step01_masked_head", "step02_ngram_draft",
                                         "step03_forced_draft", "step04_gated_draft"]
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells)
    # the reader's labels, "step N: short name", in all three step tables; the library's names stay out of them
    labels = ["chapter 07, step 3", "step 1: every hidden state", "step 2: n-gram drafts", "step 3: forced chains",
              "step 4: the draft gate, not shipped"]
    assert [r["label"] for r in rows] == labels
    assert [d["label"] for d in lesson.drafts_table(lesson.committed())] == labels[2:]
    assert [r["step"] for r in lesson.breakdown_table(lesson.committed())] == [labels[0], labels[1], labels[3]]
    assert '"step": r["label"]' in text and '"step": d["label"]' in text and '"step": r["step"]' not in text
    assert '"step": "2a"' not in text and '"step": "2b"' not in text
    assert "A second run" not in text and "another H200" not in text


def test_the_loops_own_bound_prices_each_requests_forwards_at_the_one_token_forward():
    rng = random.Random(81)
    gemv, cublas = rng.uniform(0.5, 0.6), rng.uniform(0.7, 0.8)
    rows = [_verify(1, "gemv", gemv, True), _verify(1, "cublas", cublas, False), _verify(2, "cublas", 0.9, True)]
    per_request = []
    for k in range(rng.choice([5, 6, 7])):
        forwards, tokens = rng.randint(5, 20), rng.randint(41, 120)
        row = _row("step03", f"r{k}", rng.uniform(0.4, 0.7), [1] * forwards, tokens) | {"forwards": forwards}
        rows.append(row)
        per_request.append(gemv * forwards / tokens)
    bound = lesson.loop_bound(Results(REPO_ROOT / "none.json", {"measurements": rows}))
    measured = statistics.median(r["ms"] for r in rows if r["series"] == "step03")
    assert bound["one_token_us"] == pytest.approx(gemv * 1e3)  # the layer the loop runs, not the other one
    assert bound["bound_us"] == pytest.approx(statistics.median(per_request) * 1e3)
    assert bound["over"] == pytest.approx(measured / statistics.median(per_request))
    assert bound["over"] > 1.0  # at most half a forward per token here, each shorter than any request's step


def test_the_page_and_the_scoreboard_give_the_loop_the_same_bound():
    from book import scoreboard

    row = next((r for r in scoreboard.scoreboard() if r["number"] == 8 and "H200" in r["card"]), None)
    if row is None:
        pytest.skip("no committed H200 run of chapter 8")
    # the scoreboard gives the loop's bound (the page's "our loop's forward-time bound") as a bound, not a floor, in its
    # latency floor's cell
    loop = lesson.loop_bound(lesson.committed())
    bound = loop["bound_us"]
    assert "bound, not a floor" in row["latency_what"] and f"{bound:.1f} µs" in row["latency_what"]
    # the longer of the loop's two bounds binds, on the scoreboard as on the page: the forward-time bound, with the
    # same ratio the page prints; the kernel-count bound, lower, is named beside it on both
    assert row["binding"] == "forward" and row["binding_floor_ms"] * 1e3 == pytest.approx(bound)
    assert row["median_ms"] / row["binding_floor_ms"] == pytest.approx(loop["over"])
    kc = lesson.kernel_count_bound()
    assert kc["binds"] == "forward" and kc["us"] < bound and kc["bound_us"] == pytest.approx(bound)
    source = json.loads((REPO_ROOT / "notebooks/08_speculation_under_a_grammar.ipynb").read_text())
    cell = next("".join(c["source"]) for c in source["cells"] if "kernel_words = " in "".join(c["source"]))
    assert "It is the bound that binds" in cell and "{kernel_words}" in cell


def test_the_capped_requests_are_told_apart_from_the_rest():
    """The requests that run to the output cap, found from hand-made rows at batch 1: their speedups, which of
    their outputs repeat a phrase, how many of the largest speedups they hold, and the medians without them."""
    from studylog.speculate import report

    cap = report.MAX_NEW
    speeds = {"a": (1.0, 1.2, 50), "b": (1.0, 1.5, 60), "c": (1.0, 3.0, cap), "d": (1.0, 1.4, cap), "e": (1.0, 1.3, 70)}
    rows = []
    for name, (ms7, up, tokens) in speeds.items():
        rows.append(_row("ch7_step03", name, ms7, [1], tokens))
        rows.append(_row("step03", name, ms7 / up, [1], tokens))
    notes = ["c (batch 1): {\"name\":\"Kai-Kai-Kai-Kai-Kai-Kai", "d (batch 1): {\"name\":\"A long copy of the text"]
    got = lesson.capped(Results(REPO_ROOT / "none.json", {"measurements": rows, "notes": notes}))
    assert [r["request"] for r in got["rows"]] == ["c", "d"] and got["cap"] == cap and got["requests"] == 5
    assert [r["repeats"] for r in got["rows"]] == [True, False]
    assert got["top"] == 1  # of the two largest speedups (3.0, 1.5) one is capped
    assert got["median_without"] == pytest.approx(1.3) and got["median_all"] == pytest.approx(1.4)
    assert got["ratio_without"] == pytest.approx(1.0 / statistics.median([1 / 1.2, 1 / 1.5, 1 / 1.3]))


def test_the_samples_are_the_first_document_of_each_kind():
    from studylog.speculate import requests

    results = lesson.committed()
    samples = lesson.sample_outputs(results)
    kinds = list(dict.fromkeys(d["kind"] for d in requests.workload()["documents"]))
    firsts = [next(d["name"] for d in requests.workload()["documents"] if d["kind"] == k) for k in kinds]
    assert [s.split(": ", 1)[0] for s in samples] == firsts
    assert all(len(s) <= 40 for s in lesson.sample_outputs(results, width=40))
    # the page prints each sample wrapped to what a code block shows whole; the cut one ends in an ellipsis
    for sample in samples:
        lines = lesson.wrapped(sample, lines=4)
        assert all(len(line) <= lesson.CODE_WIDTH for line in lines)
        assert " ".join(x.strip() for x in lines).replace(" ", "") == sample.replace(" ", "")
    long = "x" * 500
    cut = lesson.wrapped(long, lines=2)
    assert len(cut) == 2 and cut[-1].endswith("…") and all(len(line) <= lesson.CODE_WIDTH for line in cut)
    assert lesson.repeats("Kai-Kai-Kai-Kai-") and not lesson.repeats("Kai-Kai-Kai-")


def test_the_counts_the_page_states_come_from_the_rows():
    """The low-copy set's size is the requests the results hold for it, chapter 7's the entries of its request
    list; the result table's requests per batch and workload are the shipped step's (3) rows timed there."""
    from studylog.decode.requests import INSTRUCTIONS
    from studylog.speculate.requests import LOW_COPY

    rows = [dict(_row("step03", name, 0.5, [1], 10), params={"model": "smollm2", "batch": 1, "workload": "low_copy",
                                                            "request": name}) for name in LOW_COPY[:4]]
    got = lesson.low_copy_counts(Results(REPO_ROOT / "none.json", {"measurements": rows}))
    assert got == {"low_copy": 4, "chapter7": len(INSTRUCTIONS)}
    assert set(LOW_COPY) <= set(INSTRUCTIONS)  # the low-copy set is a part of chapter 7's requests
    results = lesson.committed()
    for r in lesson.bound_rows(results):
        timed = [x for x in results.rows if x["series"] == "step03" and x["params"]["batch"] == r["batch"]
                 and x["params"]["workload"] == r["workload"]]
        assert r["requests"] == len(timed) > 0


def test_the_results_batch_1_figures_are_over_the_requests_that_close_their_json():
    """The result's one request set: at batch 1 every figure of the result table is over the requests that close
    their JSON (all of them only in brackets), recomputed here from the rows; batch 8 keeps whole batches."""
    from studylog.speculate import report

    results = lesson.committed()
    for r in lesson.bound_rows(results):
        if r["batch"] != 1:
            assert r["closed"] is None
            continue
        kept = report.closed_requests(results.rows, r["workload"])
        k = r["closed"]
        assert k["requests"] == len(kept) <= r["requests"]

        def med(series):
            return statistics.median(x["ms"] for x in results.rows if x["series"] == series
                                     and x["params"].get("batch") == 1 and x["params"].get("workload") == r["workload"]
                                     and x["params"]["request"] in kept)

        assert k["ratio"] == pytest.approx(med("ch7_step03") / med("step03"))
        ups = [s for s in lesson.speedups(lesson.closed_rows(results, r["workload"]), 1, r["workload"])]
        assert len(ups) == len(kept) and k["max_speedup"] == pytest.approx(max(ups))
        assert k["min_speedup"] == pytest.approx(min(ups))
        assert lesson.closed_median_ms(results, "step03", r["workload"]) == pytest.approx(med("step03"))


def test_a_batch_row_is_one_kind_of_document_or_one_low_copy_request():
    """At batch 8 the result table counts batches: one per document kind on extraction (its documents, some twice,
    filling the batch) and one per low-copy request, as many as the committed rows time."""
    from studylog.speculate import requests

    mix = lesson.batch_makeup(8)
    kinds = {d["kind"] for d in requests.workload()["documents"]}
    per_kind = min(len(requests.document_names(k)) for k in kinds)
    assert mix == {"batch": 8, "extraction": len(kinds), "documents": per_kind, "repeated": 8 - per_kind,
                   "low_copy": len(requests.LOW_COPY)}
    rows = {(r["batch"], r["workload"]): r["requests"] for r in lesson.bound_rows(lesson.committed())}
    assert rows[(8, "extraction")] == mix["extraction"] and rows[(8, "low_copy")] == mix["low_copy"]


def test_a_request_capped_only_under_drafting_is_told_apart():
    """A request that closes in chapter 07's loop but runs to the cap under drafting: not like for like (in_both
    False), with where its tokens parted (from the checks), which steps capped it, chapter 07's token count, and the
    headline's ratio with it kept; a request capped in chapter 07's loop only makes the page's wording wrong: raises."""
    from studylog.speculate import report

    cap = report.MAX_NEW
    speeds = {"a": (1.0, 1.2, 50, 50), "b": (1.0, 1.5, 60, 60), "c": (1.0, 3.0, cap, cap), "e": (1.0, 2.2, 90, cap)}
    rows = []
    for name, (ms7, up, tokens7, tokens4) in speeds.items():
        rows.append(_row("ch7_step03", name, ms7, [1], tokens7))
        for s in lesson.SERIES:
            rows.append(_row(s, name, ms7 / up, [1], tokens4 if s in ("step03", "step04") else tokens7))
    div = {"sequence": 0, "position": 41, "tokens": [1, 2], "gap": 0.1, "bound": 2.0, "inside": True}
    checks = [{"name": "same tokens as chapter 7's step 3 wherever the rounding bound allows", "passed": True,
               "params": {"batch": 1, "workload": "extraction", "request": "e", "series": "step03"},
               "identical": 0, "sequences": 1, "divergences": [div]}]
    got = lesson.capped(Results(REPO_ROOT / "none.json", {"measurements": rows, "notes": [], "checks": checks}))
    by = {r["request"]: r for r in got["rows"]}
    assert set(by) == {"c", "e"} and by["c"]["in_both"] and not by["e"]["in_both"]
    assert (by["e"]["position"], by["e"]["near_tie"], by["e"]["steps"], by["e"]["ch7_tokens"]) == (
        41, True, ["step03", "step04"], 90)
    assert got["top"] == 1  # only c is capped in both loops; it holds the largest speedup
    assert got["ratio_without"] == pytest.approx(1.0 / statistics.median([1 / 1.2, 1 / 1.5]))
    assert got["ratio_with_drafting_only"] == pytest.approx(1.0 / statistics.median([1 / 1.2, 1 / 1.5, 1 / 2.2]))
    bad = [dict(r, tokens=cap) if r["series"] == "ch7_step03" and r["params"]["request"] == "a" else r for r in rows]
    with pytest.raises(ValueError):
        lesson.capped(Results(REPO_ROOT / "none.json", {"measurements": bad, "notes": [], "checks": checks}))


def test_the_committed_run_parts_event_5_at_a_near_tie_and_caps_it_under_drafting_only():
    """The facts the page states about the capped requests, read from the committed run."""
    got = lesson.capped(lesson.committed())
    both = sorted(r["request"] for r in got["rows"] if r["in_both"])
    only = [r for r in got["rows"] if not r["in_both"]]
    assert both == ["bug_report_2", "bug_report_4", "contact_2", "contact_4"]
    assert [(r["request"], r["position"], r["near_tie"], r["steps"]) for r in only] == [
        ("event_5", 104, True, ["step02", "step03", "step04"])]
    assert only[0]["ch7_tokens"] < got["cap"]


def test_the_forecasts_are_on_the_headlines_requests():
    """The forecast table: the forward ratio and the chunk-length forecast are report.bound on the kept requests'
    rows (and on all of them in brackets), measured against the headline's ratio; the time per token is loop_bound."""
    from studylog.speculate import report

    results = lesson.committed()
    kept = report.closed_requests(results.rows, "extraction")
    fc = {f["forecast"]: f for f in lesson.forecasts(results)}
    rows = [r for r in results.rows if r["params"].get("request") in kept or r["params"].get("batch") != 1
            or r["params"].get("workload") != "extraction"]
    assert fc["forward ratio"]["value"] == pytest.approx(lesson.bound(rows, 1, "extraction")["forwards"])
    assert fc["forward ratio"]["value"] != pytest.approx(fc["forward ratio"]["value_all"])  # the capped ones count
    assert fc["chunk-length forecast"]["value_all"] == pytest.approx(lesson.bound(results.rows, 1, "extraction")["forecast"])
    assert fc["forward ratio"]["measured"] == pytest.approx(report.headline(results)[0]["speedup"])
    assert fc["our loop's forward-time bound"]["value"] == pytest.approx(lesson.loop_bound(results)["bound_us"])
    assert lesson.closed_ratio(results, "step03") > lesson.closed_ratio(results, "step04")  # why the gate is off


def test_the_page_names_the_low_copy_point_and_counts_the_near_ties():
    """The point above the diagonal is named with its workload; the agreement paragraph counts the near ties and
    says nothing about the file's bookkeeping; the result section opens with its answer, the shipped loop's ratio
    with step 3's (the faster loop without the gate) beside it."""
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    assert not any("One point sits above the forward ratio" in t for t in text)
    assert any("l['workload']" in t and "sits above the diagonal" in t for t in text)
    assert not any("the file's note" in t for t in text)
    at = next(i for i, t in enumerate(text) if t.startswith("## The result, against chapter 07"))
    assert 'closed_ratio(results, "step03")' in text[at + 1] and "share a loop" in text[at + 1]


def test_each_statistic_names_its_basis_and_the_files_are_listed_once():
    """Accepted per draft is given on both bases at its first use, where the output cap is defined; the samples sit in
    a labelled fold; step 4's "Tried" fold says what its gate would cost against step 3, computed on both bases, and
    its title carries step 4's ratio; no results file is named in the prose."""
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    first = next(t for t in text if "b1['closed']['mean_accepted']:.2f}** tokens per" in t)
    assert "b1['closed']['mean_accepted']" in first and "**output cap** of {cap['cap']} tokens" in first
    samples = next(c for c in cells if "lesson.sample_outputs(results)" in "".join(c["source"]))
    assert "hide-output" in samples["metadata"]["tags"] and samples["metadata"]["mystnb"]["code_prompt_show"]
    assert not any("wrapped(sample" in t and "loop['output']" in t for t in text)  # the looping one is not folded
    # the gate: one paragraph, its cost against step 3 and both ratios over chapter 07 it cites, its diff folded
    tried = next(t for t in text if "**Tried, not shipped: step 4**" in t)
    assert 'closed_median_ms(results, "step04") / lesson.closed_median_ms(results, "step03")' in tried
    assert "{s4_kept:.2f}× our chapter 07 loop, against step 3's {s3_kept:.2f}×" in " ".join(tried.split())
    assert ":::{{dropdown}}" not in tried and "run-to-run variation" not in tried and "x_previous" not in tried
    gate = next(c for c in cells if "lesson.gate_diff()" in "".join(c["source"]))
    assert "hide-output" in gate["metadata"]["tags"]
    assert not any(t.startswith("## Tried") for t in text)  # not a section
    # the prose names no results file: one short section names the runs in words, while the cells read them
    prose = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    assert not [t for t in prose if "lab/speculate" in t or ".json" in t or "assets/bench" in t]
    where = [t for t in text if t.startswith("## Where the numbers come from")]
    assert len(where) == 1 and "how_we_measure" in where[0] and "H200" in where[0]
    assert not any("computed when the page is built" in t for t in text)  # no boilerplate line
    code = "\n".join(t for c, t in zip(cells, text) if c["cell_type"] == "code")
    for read in ("lesson.committed()", "lesson.step02_chain(", "lesson.prefill_probe()", "decode_lesson.committed()"):
        assert read in code, read


def test_the_chunk_table_keeps_one_clock_a_column_and_the_prose_reads_the_start_up_timing():
    """The folded table of the body per chunk length gives both layers on one clock, the decoder's start-up timing
    (from which it picks a layer), and the benchmark's time of the layer picked in a column of its own; the prose
    quotes the start-up timing at two and four tokens, one decimal at four, as the table prints it."""
    results = lesson.committed()
    startup = lesson.tuned_layers(results, 1)
    assert startup[4]["gemv"] > startup[4]["cublas"] and startup[2]["gemv"] < startup[2]["cublas"]
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    cell = next(t for t in text if "at four" in " ".join(t.split()))
    assert "startup = lesson.tuned_layers(results, 1)" in cell and ":::{{dropdown}} The body's time per chunk" in cell
    assert '"six launches, start-up (µs)": startup_us(d["chunk"], "gemv")' in cell
    assert '"that layer, benchmark (µs)": d[d["used"]]' in cell and "†" not in cell
    assert "{four['gemv']:,.1f} µs** against **{four['cublas']:,.1f} µs" in cell


def test_the_headline_keys_its_brackets_and_the_exceptions_follow_the_result():
    """Where the headline's all-requests ratio is printed (once), the same sentence says the table's brackets hold
    it; the capped requests, the one capped only under drafting and the low-copy point sit in one exceptions list
    after the result (before "Where we lose"), one line each, and not in the workload section."""
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    first = next(i for i, t in enumerate(text) if "{b1['ratio']:.2f}×" in t)
    words = " ".join(text[first].split())
    assert "the loop this chapter ships" in words and "in brackets in the table below" in words
    assert sum("b1['ratio']" in t for t in text) == 1  # the all-requests basis is given once, in that sentence
    at = next(i for i, t in enumerate(text) if t.startswith("## The result, against chapter 07"))
    lose = next(i for i, t in enumerate(text) if t.startswith("## Where we lose"))
    assert first == at + 1
    exc = [i for i, t in enumerate(text) if ":::{{dropdown}} Exceptions" in t]  # one fold, titled
    assert len(exc) == 1 and at < exc[0] < lose
    listed = text[exc[0]]
    for key in ("for r in both", "for o in only", "for l in same_forwards", "ratio_with_drafting_only",
                "sits above the diagonal", "prefill_probe()"):
        assert key in listed, key
    # nowhere else: the workload section and the result's paragraphs no longer carry them
    for i, t in enumerate(text):
        if i != exc[0]:
            assert "ratio_with_drafting_only" not in t and "prefill_probe()" not in t and "for o in only" not in t, i
    # the committed run's exceptions, as the list counts them: four capped in both loops, one only under drafting
    results = lesson.committed()
    cap = lesson.capped(results)
    assert sum(r["in_both"] for r in cap["rows"]) == 4 and sum(not r["in_both"] for r in cap["rows"]) == 1


def test_the_classifier_exception_gives_this_runs_prefills_beside_the_alternating_probe():
    """The exception that reads oddly (one forward in both loops, yet faster) gives the two loops' prefill in this run,
    read from the file's first_step_ms, beside the probe that ran them alternately: the gap the ratio shows is there."""
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    cell = next("".join(c["source"]) for c in cells if "the prefill's run-to-run variation" in "".join(c["source"]))
    assert "first_step_ms" in cell and "in this run; run alternately" in cell
    results = lesson.committed()
    ours, theirs = (next(r["first_step_ms"] for r in results.rows if r["series"] == s
                         and r["params"].get("request") == "classifier" and r["params"].get("batch") == 1)
                    for s in ("step03", "ch7_step03"))
    probe = lesson.prefill_probe()
    assert theirs / ours > 1.2 and abs(probe["ch7_step03"] / probe["step04"] - 1) < 0.1


def test_step_4s_diff_adds_the_gate_itself_and_its_three_uses():
    """Step 4's diff counts its whole change: the gate's class as added lines, and the loop's three uses of it (built,
    asked, told), with no context lines; the page shows it, not the one-line diff of the loop alone."""
    diff = lesson.gate_diff()
    added = "\n".join(diff.added)
    for piece in ("class DraftGate:", "def allows(", "def update(", "gate = DraftGate(", "gate.allows(b, pending[b])",
                  "gate.update(b, verified, accepted)"):
        assert piece in added, piece
    assert 20 <= len(diff.added) <= 40 and len(diff.removed) == 1
    assert not [line for line in diff.lines[2:] if line[:1] not in "+-@"]  # no context lines
    assert all(len(line) <= 101 for line in diff.lines[2:])
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "lesson.gate_diff()" in code and "step_diff(4)" not in code and "listing(speculate.DraftGate)" not in code


def test_each_steps_code_is_a_diff_of_the_librarys_loop_and_listings_show_no_docstring():
    """Steps 2 to 4 each change the loop in one place, shown as a diff of the library's loop with each configuration's
    tests resolved; step 2b's kernel change is the three lines of the token axis; the listings leave the docstrings
    (and their cross-reference roles) out."""
    from studylog import speculate

    want = {2: "r.ids if room[b] > 0", 3: "extend=asks[b] is not None", 4: "gate = DraftGate("}
    for step, added in want.items():
        diff = lesson.step_diff(step)
        assert len(diff.added) <= 2 and len(diff.removed) == 1, step
        assert any(added in line for line in diff.added), step
        assert all(len(line) <= 101 for line in diff.lines[2:]), step
    with pytest.raises(ValueError):
        lesson.step_diff(1)
    axis = lesson.token_axis_diff()
    assert len(axis.added) == 3 and not axis.removed and "program_id(1)" in axis.added[0]
    for obj in (speculate.walk_draft, speculate.DraftGate, speculate.SpeculativeDecoder.verify_call):
        text = lesson.listing(obj).text
        assert '"""' not in text and ":class:" not in text and ":attr:" not in text
        assert all(len(line) <= lesson.CODE_WIDTH for line in text.splitlines())  # shown whole
        compile(textwrap.dedent(text), "listing", "exec")  # the cut lines are still Python


def test_the_opening_claims_a_common_job_and_the_8b_forecast_carries_this_pages_overshoot():
    """The opening says copying text is a common structured-output job, not the commonest (no source counts them),
    and the answer right under it gives both workloads and whose step the gain is; the result's first sentence gives
    the all-requests ratio right beside the headline's, and low-copy's; the gate's ratio is in its "Tried" fold; the
    result says why vLLM's n-gram speculation was not timed; the 8B bound is followed by
    how far this page's own speedup forecasts overshoot the measured speedup, computed from the forecasts; the two
    timings of a four-token forward are each labelled with their clock (the benchmark, the decoder's start-up)."""
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    assert "commonest" not in text[0] and "A common structured-output job" in text[0]
    headline = " ".join(next(t for t in text if "the loop this chapter ships" in t).split())
    # both workloads in its first sentence, with equal weight: low-copy's, the more neutral test, first
    assert "**{s3_kept:.2f}×** as fast on extraction" in headline
    assert ("(**{b1['ratio']:.2f}×** with the {len(cap['rows'])} capped requests, whose gain is mostly repetition; "
            "in brackets in the table below)") in headline
    assert "**{ans_low['ratio']:.2f}×** as fast as our chapter 07 loop (its step 3) on the {n_low} low-copy requests" in headline
    assert headline.index("ans_low") < headline.index("s3_kept:")
    answer = " ".join(text[2].split())  # right under the title and the imports
    assert text[2].startswith("ans_ext, ans_low = ") and "**The answer**, on SmolLM2-135M at batch 1" in answer
    assert "whose values the prompt does not hold (the neutral test)" in answer  # said once, at the headline
    assert "neutral" not in headline
    for key in ("**{ans_ext['ratio']:.2f}×** on *extraction*",
                "**{ans_low['ratio']:.2f}×** as fast as our chapter 07 loop on {n_low} *low-copy*",
                "low_steps['step03_forced_draft']['x_previous']", "by_step['step02_ngram_draft']['x_previous']"):
        assert key in answer, key
    tried = " ".join(next(t for t in text if "Tried, not shipped: step 4" in t).split())
    assert "({s4_kept:.2f}× our chapter 07 loop, against step 3's {s3_kept:.2f}×)" in tried
    assert not any("With step 4's gate switched on" in t for t in text)
    rival = " ".join(next(t for t in text if "We found no library rival that runs" in t).split())
    assert "No serving engine is compared: vLLM's n-gram speculation under a grammar is the natural comparison" in rival
    assert "**No outside peer is run**; every ratio here is over our chapter 07 loop" in rival  # said once
    assert sum("No outside peer is run" in t for t in text) == 1
    assert "torch" not in rival  # no excuse from the environment
    # the 8B bound: in Why it matters (the cell right under its heading), not in Where we lose
    why_at = next(i for i, t in enumerate(text) if t.startswith("## Why it matters"))
    bound = " ".join(text[why_at + 1].split())
    assert "$(a+1)/c$ bounds the speedup" in bound and "**At 8B, unmeasured.**" in bound
    assert "lesson.forecasts(results)" in bound and "overshoot the measured speedup" in bound
    assert "an upper bound, not a forecast" in bound
    assert "**{(a8 + 1) / c8:.1f}×**" not in bound  # the bound is not set in bold beside measured numbers
    lose = next(t for t in text if "**Drafting is host work.**" in t)
    assert "(a+1)/c" not in lose and "c8" not in lose
    why = " ".join(text[why_at].split())
    assert "forecast" not in why
    over = [f["value"] / f["measured"] for f in lesson.forecasts(lesson.committed()) if f["unit"] == "x"]
    assert len(over) >= 2 and all(v > 1 for v in over)
    # one number for the four-token forward: "Why it matters" quotes the benchmark's time of the layers the loop
    # runs (the chunk table's last column), no start-up timing; step 2b compares the two layers on the start-up clock
    opening = " ".join(next(t for t in text if "so each accepted token saves most of a forward" in t).split())
    assert "bench = {d['chunk']: d[d['used']] for d in layers}" in opening and "tuned_layers" not in opening
    assert "as the benchmark times them: step 2b's fold" in opening and "start-up" not in opening
    # how the prefill runs, said where its share first appears: eagerly, the same in both loops, its median time
    assert "lesson.prefill_words(results)" in opening and "in both loops alike" in opening
    assert "largest graph-captured chunk" in opening and "{pre['ms']:.1f} ms" in opening
    assert not any("launches about as many" in t for t in text)
    assert any("by its own start-up timing" in " ".join(t.split()) for t in text)


def test_chapter_07s_loop_has_one_time_in_the_open_text():
    """Chapter 07's loop shows one time in the open text, the median request the ratios use: step 2's chain gives
    only its ratios openly (its times, another run's, in a fold), the table of where a token's time goes (pooled
    totals) is folded, and the loop's other counts (pooled, chapter 07's own requests with why they differ, its
    dense-head step 1) share one fold; the chain's step 1 is this chapter's step 1, not chapter 07's loop, and is
    not among them; the steps table's caption points to that fold and gives no time of chapter 07's."""
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    # step 2's chain is printed once, in the open, with its times (its step 1 is this chapter's, not chapter 07's)
    chain = next(t for t in text if "chain_table(lesson.step02_chain_rows(chain)" in t)
    assert ":::{{dropdown}}" not in chain and "step02_chain_ratio_table" not in "\n".join(text)
    where = next(t for t in text if "lesson.breakdown_table(kept)]" in t)
    assert where.index(":::{dropdown} Where an output token's time goes") < where.index("lesson.breakdown_table(kept)]")
    other = next(t for t in text if "Chapter 07's loop, counted other ways" in t)
    fold = other[other.index(":::{{dropdown}} Chapter 07's loop"):]
    for key in ("pooled", "ch7_own['step3_us']", "ch7_1 * 1e3", "answers spread the prefill over fewer tokens"):
        assert key in fold, key
    assert "chain_anchor" not in "\n".join(text)
    result = " ".join(other[:other.index(":::{{dropdown}} Chapter 07's loop")].split())
    assert "{ch7_3 * 1e3:.0f} µs** for our chapter 07 loop's step 3" in result and "{ch7_1" not in result  # one time
    assert "the statistic of every ratio over chapter 07 here" in result and "{pooled" not in result
    opening = next(t for t in text if "the share drafting can save" in t)
    assert "ch7['total']:,.0f}" not in opening and "prefill" in opening
    # chapter 07's own page's time, where it differs from this page's row, is said with its reason under the steps
    # table: its requests' answers are shorter (checked here from both runs), spreading the prefill over fewer tokens
    caption = " ".join(next(t for t in text if "Batch 1, extraction but for the low-copy column" in t).split())
    caption = caption[caption.index("Batch 1, extraction but for the low-copy column"):]
    assert "ch7_page" not in caption and "µs" not in caption and "a fold in the result" in caption
    from statistics import median

    from book.decode import lesson as decode_lesson
    own = [r["tokens"] for r in decode_lesson.committed().rows if r["series"] == "step03"
           and r["params"].get("model") == "smollm2" and r["params"].get("batch") == 1]
    kept = lesson.kept_results(lesson.committed())
    here = [r["tokens"] for r in kept.rows if r["series"] == "ch7_step03" and r["params"].get("batch") == 1
            and r["params"].get("workload") == "extraction"]
    assert own and here and median(own) < median(here)
    assert sum(t.count("ch7_own['step3_us']") for t in text) == 1  # said once, in the fold


def test_the_low_copy_workload_is_described_by_its_drafts_and_the_gate_by_what_it_paused():
    """The low-copy workload is shown by what its drafts copy beside extraction's (accepted drafts' share of step 2's
    tokens, the grammar's cut, the forced share), read by :func:`lesson.copying`; step 4's low-copy ratio is called
    run-to-run variation only when the gate paused nothing there (:func:`lesson.gate_paused`)."""
    results = lesson.committed()
    kept = lesson.kept_results(results)
    cx, cl = lesson.copying(kept, "extraction"), lesson.copying(results, "low_copy")
    drafts = {d["step"]: d for d in lesson.drafts_table(results, 1, "low_copy")}
    assert cl["cut"] == pytest.approx(drafts["step04_gated_draft"]["cut"] / drafts["step04_gated_draft"]["proposed"])
    assert cl["forced"] > cx["forced"] and cl["cut"] > cx["cut"]  # what the page says differs
    assert 0 < cl["copied"] < 1 and 0 < cx["copied"] < 1
    low = lesson.gate_paused(results, "low_copy")
    assert low["paused"] == 0 or not low["idle"]  # idle: the same forwards and drafting calls, so nothing paused
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    assert any("lesson.copying(kept, \"extraction\")" in t for t in text)
    step4 = next(t for t in text if "lesson.gate_paused(" in t)
    assert 'lesson.gate_paused(results, "low_copy")' in step4 and 'if paused["idle"]' in step4
    assert not any("every kernel of the course" in t for t in text)
    assert "chapters 01, 02 and 03's kernels in chapter 07's loop" in text[0]
    assert not any("the price of what it buys on low-copy" in t for t in text)


def test_the_pages_steps_table_has_the_shipped_steps_in_nine_columns():
    """The steps section carries the title the other chapters use; its table holds chapter 07's step 3 and the shipped
    steps 1 to 3 (step 4, not shipped, has its "Tried" fold) in nine columns, one saying which workload each step
    pays on, the last each step over the loop's forward-time bound: forwards per token and accepted per draft sit in the drafts' fold, beside their counts; the drafts'
    sentence counts the loop the chapter ships."""
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    at = next(i for i, t in enumerate(text) if t.startswith("## The steps"))
    assert text[at].strip() == "## The steps, measured"
    table = text[at + 1]
    assert 'shipped = [r for r in steps1 if r["step"] != "step04_gated_draft"]' in table and "for r in shipped]" in table
    fmt = table[table.index("say(lesson.markdown_table(rows, "):]
    fmt = fmt[:fmt.index("}))") + 1]
    assert fmt.count('": "') == 9  # nine columns
    assert '"pays on": pays.get(r["step"], "–")' in table and '"step03_forced_draft": "low-copy"' in table
    assert '"forwards per token"' not in table and '"accepted per draft"' not in table
    drafts = text[at + 2]
    assert '"forwards per token": forwards[d["label"]]' in drafts
    assert 'last = next(d for d in drafts if d["step"] == "step03_forced_draft")' in drafts


def test_where_we_lose_reconciles_a_step_with_the_time_per_token():
    """A decode step's time over its tokens, plus the prefills over the same tokens, is the pooled time per token the
    breakdown fold prints; "Where we lose" gives all three beside the median request, and says that step 2's output
    can part from chapter 07's at a near tie (chapter 07's steps kept it)."""
    results = lesson.committed()
    kept = lesson.kept_results(results)
    cost = lesson.draft_cost(kept)
    assert cost["decode_step_us"] / cost["tokens_per_step"] == pytest.approx(cost["decode_us_per_token"])
    assert cost["decode_us_per_token"] + cost["prefill_us_per_token"] == pytest.approx(cost["pooled_us_per_token"])
    pooled = next(r for r in lesson.breakdown_table(kept) if r["step"].startswith("step 3"))["total"]
    assert cost["pooled_us_per_token"] == pytest.approx(pooled, rel=0.01)
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    lose = next(t for t in text if "**Drafting is host work.**" in t)
    for key in ("decode_step_us", "tokens_per_step", "decode_us_per_token", "prefill_us_per_token",
                "pooled_us_per_token", "for the median request"):
        assert key in lose, key
    # the sum, a table right after the item that refers to it ("added up below"), before the next item
    item = lose[lose.index("**Drafting is host work.**"):lose.index("**Short answers.**")]
    assert "added up below" in item and "say(token_time)" in item
    assert "No serving engine is compared" not in lose  # said once, in the result
    chain = " ".join(next(t for t in text if "chain_table(lesson.step02_chain_rows(chain)" in t).split())
    assert '"the same output, sooner"' in chain and "near tie" in chain


def test_the_low_copy_point_says_how_far_it_can_move_its_ratio():
    """The request whose gain with the same forwards is its prefill's variation: set at 1.00x, or left out, the
    low-copy ratio moves by no more than the exceptions say (here: not at all, or by 0.01x)."""
    results = lesson.committed()
    m = lesson.at_par(results, "classifier")
    low = next(r for r in lesson.bound_rows(results) if r["batch"] == 1 and r["workload"] == "low_copy")
    assert m["ratio"] == pytest.approx(low["ratio"])
    assert abs(m["at_par"] - m["ratio"]) < 0.02 and abs(m["without"] - m["ratio"]) < 0.02
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    exc = next("".join(c["source"]) for c in cells if ":::{{dropdown}} Exceptions" in "".join(c["source"]))
    assert "lesson.at_par(results, l[\"request\"], l[\"workload\"])" in exc


def test_the_step_tables_mark_ties_and_the_result_counts_outputs_that_part_from_chapter_07s():
    """The course's tie rule (0.97x to 1.03x as printed) marks a step table's ratio "(tie)"; the result table counts,
    per row, the shipped step's outputs that part from chapter 07's step 3 (each at a near tie), over the row's
    requests; step 3's repeat is said without the machines it ran on, and its ratios are per batch and workload,
    not per request."""
    assert [lesson.ratio_cell(x) for x in (0.9649, 0.97, 1.0, 1.03, 1.0351, None)] == [
        "0.96×", "0.97× (tie)", "1.00× (tie)", "1.03× (tie)", "1.04×", "–"]
    results = lesson.committed()
    checks = [c for c in results.data["checks"] if c["name"].startswith("same tokens as chapter 7's step 3")
              and c["params"]["series"] == "step03"]
    kept = lesson.kept_requests(results)
    for batch, workload, basis in ((1, "extraction", kept), (1, "low_copy", None), (8, "extraction", None)):
        mine = [c for c in checks if c["params"]["batch"] == batch and c["params"]["workload"] == workload
                and (basis is None or c["params"]["request"] in basis)]
        d = lesson.differing(results, batch, workload, basis)
        assert d["sequences"] == sum(c["sequences"] for c in mine) > 0
        assert d["differ"] == sum(c["sequences"] - c["identical"] for c in mine)
    assert lesson.differing(results, 1, "extraction", kept)["sequences"] == len(kept)
    cells = json.loads((REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    table = next(t for t in text if "def result_row" in t)
    assert "lesson.differing(" in table and "outputs not chapter 07's (near ties)" in table
    steps = next(t for t in text if "shipped = [r for r in steps1" in t)
    assert steps.count("lesson.ratio_cell(") == 2
    three = " ".join(next(t for t in text if "lesson.step3_over_step2()" in t).split())
    assert "H200" not in three and "on any request" not in three and "In this run and a repeat" in three


def test_the_page_uses_one_forward_count_and_says_only_what_the_data_shows_of_a_forward():
    """One count of forwards per output token on the page: the median request's, in the steps' rows, the drafts' fold
    and the forward-time bound alike (the bound is that count at the one-token forward's time, as the scoreboard's
    note gives it). A one-token forward is set against its weights read once and its kernels at an empty kernel's
    time (the scoreboard's kernel-count bound, per forward), with no claim about the rest. Step 2's chain says what
    its two factors come to in their own run beside the steps table's ratio."""
    from statistics import median

    results = lesson.committed()
    kept = lesson.kept_results(results)
    loop = lesson.loop_bound(results)
    rows = [r for r in kept.rows if r["series"] == "step03" and r["params"].get("batch") == 1
            and r["params"].get("workload") == "extraction"]
    assert loop["forwards"] == pytest.approx(median(r["forwards"] / r["tokens"] for r in rows))
    assert loop["bound_us"] == pytest.approx(loop["forwards"] * loop["one_token_us"])
    step3 = next(r for r in lesson.steps_table(kept, 1, "extraction") if r["step"] == "step03_forced_draft")
    assert step3["forwards_per_token"] == pytest.approx(loop["forwards"])
    bound = next(f for f in lesson.forecasts(results) if f["unit"] == "us")
    assert f"step 3's {loop['forwards']:.2f} forwards per token (the median request's)" in bound["assumes"]
    fa, kc = lesson.forward_anatomy(results), lesson.kernel_count_bound()
    assert fa["us"] == pytest.approx(loop["one_token_us"]) and fa["kernels"] == kc["kernels"]
    assert fa["launches_us"] * loop["forwards"] == pytest.approx(kc["us"], rel=1e-6)
    assert fa["bytes_us"] < fa["launches_us"] < fa["us"]  # neither accounts for the forward's time
    text = ["".join(c["source"]) for c in json.loads(
        (REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]]
    page = " ".join("\n".join(text).split())
    assert "its time is launches" not in page and "limited by kernel launches" not in page
    assert "no run here splits the rest" in page and "lesson.forward_anatomy(results)" in page
    chain = " ".join(next(t for t in text if "chain_table(lesson.step02_chain_rows(chain)" in t).split())
    assert "{anchor['us'] / b['us']:.2f}×" not in chain  # one number for step 2: the steps table's
    assert "it says which change pays, the steps table how much" in chain
    drafts = next(t for t in text if "What the drafts did, counted per step" in t)
    assert "Forwards per token: the median request's." in drafts


def test_the_steps_table_gives_each_step_over_the_loops_forward_time_bound():
    """The steps table's "× bound" column is each step's time over its own forwards per token (the median
    request's) at the one-token forward's GPU time: the shipped step's cell is the result's "× our loop's
    forward-time bound"."""
    results = lesson.committed()
    kept = lesson.kept_results(results)
    loop = lesson.loop_bound(results)
    steps = {r["step"]: r for r in lesson.steps_table(kept, 1, "extraction")}
    s3 = steps["step03_forced_draft"]
    assert s3["ms_per_token"] * 1e3 / (s3["forwards_per_token"] * loop["one_token_us"]) == pytest.approx(loop["over"])
    text = ["".join(c["source"]) for c in json.loads(
        (REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]]
    cell = next(t for t in text if '"× bound": r["ms_per_token"] * 1e3 / (r["forwards_per_token"] * one_us)' in t)
    assert 'lesson.loop_bound(results)["one_token_us"]' in cell and "forward-time bound" in cell


def test_step_3s_low_copy_gain_gives_both_runs_and_its_spread_and_the_draft_column_is_explained():
    """Step 3's gain on the few low-copy requests is given from both committed runs, with the requests' own range
    and the median spread of a request's timed repeats, and worded as not precise; the time breakdown's draft column
    says what step 1's time there is (no drafts: the walk of an empty draft and the step's set-up); the tokens'
    comparisons are one sentence, not the benchmark's bookkeeping."""
    sp = lesson.step3_low_copy_spread()
    runs = {r["run"]: r["ratio"] for r in lesson.step3_over_step2() if r["batch"] == 1 and r["workload"] == "low_copy"}
    assert sp["runs"] == pytest.approx([runs["first"], runs["second"]]) and sp["requests"] == 6
    assert sp["least"] < 1 < min(sp["runs"]) and sp["most"] > max(sp["runs"]) and 0 < sp["repeat_median"] < 0.1
    text = ["".join(c["source"]) for c in json.loads(
        (REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]]
    step3 = " ".join(next(t for t in text if "lesson.step3_low_copy_spread()" in t).split())
    for key in ("sp['runs']", "sp['least']", "sp['most']", "sp['repeat_median']", "not a precise one"):
        assert key in step3, key
    kept = lesson.kept_results(lesson.committed())
    one = next(r for r in lesson.breakdown_table(kept) if r["step"].startswith("step 1"))
    assert one["draft"] > 0  # no drafts, yet time before the forward: the caption says what it is
    fold = " ".join(next(t for t in text if "Where an output token's time goes, per step" in t).split())
    assert "in step 1, with no drafts, the walk of an empty draft and the step's set-up" in fold
    page = "\n".join(text)
    assert "comparisons pass" not in page and "largest_gap_over_bound" not in page and 'agree["all_inside"]' in page


def test_the_drafts_table_accounts_for_every_proposed_token():
    """Every proposed token is cut by the grammar, verified, or neither (past the room, after the output may end, or
    met by a forced token): the page's "neither" column is what is left, never negative, and the table shows it."""
    import json

    from book.speculate import lesson
    from studylog import paths

    kept = lesson.kept_results(lesson.committed())
    for d in lesson.drafts_table(kept):
        assert 0 <= d["proposed"] - d["cut"] - d["verified"] <= d["proposed"], d
    cells = {c.get("id"): "".join(c["source"]) for c in json.loads(
        (paths.REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]}
    assert '"neither": d["proposed"] - d["cut"] - d["verified"]' in cells["5e733b9c"]


def test_the_prefill_runs_eagerly_in_both_loops_and_batch_8s_two_statistics_say_why_they_part():
    """The prefill (a request's first step) is one eager forward, the same code in both loops: every prompt is longer
    than the largest graph-captured chunk. At batch 8 on extraction, the ratio of medians and the median batch's own
    ratio part because the two medians are different batches: the page names them (hand-made rows, then the run)."""
    results = lesson.committed()
    pre = lesson.prefill_words(results)
    assert pre["tokens"][0] > pre["chunk"] and 1 < pre["ms"] < 50
    pair = lesson.median_pairing(results, 8, "extraction")
    b8 = next(r for r in lesson.bound_rows(results) if r["batch"] == 8 and r["workload"] == "extraction")
    assert pair["ratio_of_medians"] == pytest.approx(b8["ratio"])
    assert pair["median_ratio"] == pytest.approx(b8["median_speedup_over_ch7_step03"])
    assert pair["ch7"] != pair["ours"] and pair["ratio_of_medians"] > pair["median_ratio"]
    text = ["".join(c["source"]) for c in json.loads(
        (REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]]
    result = next(t for t in text if "lesson.median_pairing(results" in t)
    for key in ("pair['ch7']", "pair['ours']", "pair['ratio_of_medians']", "pair['median_ratio']"):
        assert key in result, key


def test_drafting_per_call_and_the_breakdowns_draft_column_reconcile():
    """Where we lose gives drafting's cost per drafting call, and says that with the set-up every step pays it is the
    breakdown's draft column: the two add up (to the tokens a step) on the committed run."""
    kept = lesson.kept_results(lesson.committed())
    cost = lesson.draft_cost(kept)
    column = next(r for r in lesson.breakdown_table(kept) if r["step"].startswith("step 3"))["draft"]
    assert (cost["loop_us"] + cost["bookkeeping_us"]) / cost["tokens_per_step"] == pytest.approx(column, rel=0.03)
    text = ["".join(c["source"]) for c in json.loads(
        (REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]]
    lose = " ".join(next(t for t in text if "**Drafting is host work.**" in t).split())
    assert "{cost['loop_us'] + cost['bookkeeping_us']:.0f} µs a step" in lose and "{draft_col:.0f} µs a token" in lose


def test_the_samples_slips_are_flagged_beside_them():
    """``sample_slips``: a number its document does not hold, and a text field repeating a later field's value, said
    once at the first of the pair; right values and outputs cut before they close pass; the page prints the slips
    above the samples (the first invoice's number written as its currency)."""
    good = 'invoice_1: {"invoice_number":"INV-2024-0317","total":418.50,"currency":"EUR"}'
    bad = 'invoice_1: {"invoice_number":"EUR","total":100,"currency":"EUR"}'
    assert lesson.sample_slips([good, 'invoice_1: {"invoice_number":"INV-20']) == []
    assert lesson.sample_slips([bad]) == ['invoice_1\'s invoice_number repeats its currency, "EUR"',
                                          "invoice_1's total, 100, is in no line of its document"]
    slips = lesson.sample_slips(lesson.sample_outputs(lesson.committed()))
    assert any("invoice_number repeats its currency" in s for s in slips)
    text = ["".join(c["source"]) for c in json.loads(
        (REPO_ROOT / "notebooks" / "08_speculation_under_a_grammar.ipynb").read_text())["cells"]]
    cell = next(t for t in text if "lesson.sample_outputs(results)" in t)
    assert cell.index("lesson.sample_slips(samples)") < cell.index("for sample in samples")
