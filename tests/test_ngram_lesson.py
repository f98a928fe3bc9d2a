"""Chapter 3's page: the table of steps reads every step at both cases against a floor it does not beat, and the
real-text figure's axis names one corpus per tick (the shapes once per group), so its labels do not overlap."""

import pytest

from book.common import chain_factors, chain_table
from book.ngram import figures, lesson
from studylog import ngram
from studylog.plotting import load_results, result_files

pytestmark = pytest.mark.skipif(not result_files("ngram"), reason="no committed n-gram results")


def _step_rows(table: str) -> list[str]:
    """The table of steps' rows (head, rule and floor left out): every numbered step and the entry point."""
    return table.splitlines()[3:]


def test_the_table_of_steps_has_every_step_and_the_entry_point():
    results = load_results("ngram")
    rows = _step_rows(lesson.boehm_table(results))
    assert [r.split("|")[1].strip() for r in rows] == [str(s.number) for s in ngram.CHAPTER.steps] + ["entry point"]
    for row in rows:
        ratios = [c.strip() for c in row.split("|")[1:-1]][4::3]  # the "× floor" columns
        for cell in ratios:
            if cell != "–":
                assert float(cell.rstrip("×").replace(",", "")) >= 1.0, row


def test_no_ratio_across_clocks():
    """Step 1 is timed end to end on the host, the kernels on the GPU clock: step 1's times say so, and a row is
    compared with the previous one, or with the GPU-clock floor, only on the same clock."""
    results = load_results("ngram")
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in _step_rows(lesson.boehm_table(results))]
    by_step = {r[0]: r for r in rows}
    host = [r[0] for r in rows if any(c.endswith("(host, end to end)") for c in r[2::3])]
    assert host == ["1"] and all(c.endswith("(host, end to end)") for c in by_step["1"][2::3] if c != "–")
    assert by_step["2"][3] == "–"  # step 2 (GPU) is not divided by step 1 (host)
    for r in rows:  # the floor is a GPU-clock time: only a GPU-clock row is divided by it
        floor_cells = r[4::3]
        assert (r[0] != "1") == any(c not in ("–", "") for c in floor_cells), r


def test_the_dispatch_table_has_no_self_judging_column():
    assert "the faster" not in lesson.dispatch_table(load_results("ngram"))


def test_the_steps_figure_draws_the_tables_floor():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = load_results("ngram")
    figs = figures.figures(results)
    ax = figs["latency"].axes[0]
    floor = next(c for c in ax.collections if "floor" in str(c.get_label()))
    drawn = sorted({round(float(seg[0][1]), 6) for seg in floor.get_segments()})
    from book.ngram.results import grid_configs

    expected = sorted({round(lesson.floor_us(results, c), 6) for c in grid_configs(results)
                       if lesson.floor_us(results, c) is not None})
    assert drawn == expected
    for fig in figs.values():
        plt.close(fig)


def test_the_real_text_axis_is_readable():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = load_results("ngram")
    figs = figures.figures(results)
    if "real_text" not in figs:
        pytest.skip("the committed file has no real-text cases")
    ax = figs["real_text"].axes[1]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels and all("\n" not in lab and len(lab) <= 10 for lab in labels), labels
    for fig in figs.values():
        plt.close(fig)


def test_every_multi_part_diff_is_folded_under_a_line_naming_its_idea():
    """A step's diff shown in parts sits in one folded output, and the prose just above it names the change."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    shown = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and "".join(c["source"]).startswith("parts(")]
    assert len(shown) >= 3
    for i in shown:
        assert "hide-output" in cells[i]["metadata"].get("tags", []), i
        above = next(c for c in reversed(cells[:i]) if c["cell_type"] == "markdown" or "say(" in "".join(c["source"]))
        assert "folded" in "".join(above["source"]).strip().strip('")').splitlines()[-1], i


def test_the_cores_of_steps_4_and_7_show_open_and_step_7_says_where_its_changes_serve():
    """Steps 4 and 7 show their diff's core unfolded (at most about 40 lines, each side from its step's kernel),
    the whole diff folded; step 7 says once that its changes are for long haystacks and that the entry point runs
    step 6 at the small case, with the numbers computed."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    for step in (4, 7):
        at = [i for i, c in enumerate(cells) if "".join(c["source"]).strip() == f"lesson.core_diff({step})"]
        assert len(at) == 1 and "hide-output" not in cells[at[0]]["metadata"].get("tags", []), step
        assert "".join(cells[at[0] + 1]["source"]).startswith(f"parts({step - 1}, {step})"), step
        d = lesson.core_diff(step)
        assert len(d.lines) <= 45 and d.added and d.removed, step
    text = " ".join("".join("".join(c["source"]) for c in cells).split())
    assert text.count("Step 7 is for long haystacks") == 1
    assert "## Step 7: every warp streams its own tiles, plus three tunings" in text
    assert 'so `ngram_match` runs step {ngram.CHAPTER.step(six_small["step"]).number} there' in text
    results = load_results("ngram")
    entry = lesson.entry_row(results, {"batch": 32, "seq_len": 512, "threshold": 128, "corpus": None})
    assert ngram.CHAPTER.step(entry["step"]).number == 6


def test_the_floor_is_the_scoreboards_on_every_card():
    """One floor a card on every page: the active slots' haystack bytes at the run's copy bandwidth, or the card's
    fastest empty kernel (the smallest of all its committed runs, as the scoreboard takes it) where that is larger."""
    from book import scoreboard
    from book.ngram.results import grid_configs

    for gpu in ("nvidia-h200", "nvidia-h100-80gb-hbm3"):
        results = load_results("ngram", gpu)
        empty_us = scoreboard.card_empty_kernel_ms(results.path.parent) * 1e3
        bandwidth = results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9
        for cfg in grid_configs(results):
            row = lesson.grid_row(results, ngram.CHAPTER.step(1).series, cfg)
            by_bytes = row["haystack_bytes"] / bandwidth * 1e6
            assert lesson.floor_us(results, cfg) == pytest.approx(max(by_bytes, empty_us), rel=1e-12), (gpu, cfg)
        small, large = lesson.BOEHM_CASES[0], lesson.BOEHM_CASES[-1]
        assert lesson.floor_us(results, small) == pytest.approx(empty_us)  # a few bytes: the empty kernel binds
        assert lesson.floor_us(results, large) > 10 * empty_us  # the bytes bind
        floor_row = lesson.boehm_table(results).splitlines()[2]
        assert "| the floor |" in floor_row and f"{empty_us:,.2f}" in floor_row  # defined once, in the prose


def test_the_result_table_times_the_entry_point_as_the_headline_does():
    """The page's GPU-clock column is the series the chapter's headline (and the results page) quotes: the entry
    point, with the step its rule ran; its ratio to step 3 is the headline's."""
    from book.ngram import results as book_results
    from studylog.ngram.report import gpu_headline

    results = load_results("ngram")
    table = lesson.result_table(results, book_results.headline(results))
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[1:-1]] for r in table.splitlines()[2:]}
    for head in gpu_headline(results):
        cells = rows[head["case"]]
        assert head["kernel"].startswith("n-gram matching, ngram_match (step")  # the headline times the entry point
        step = int(head["kernel"].split("(step")[1][:2])
        assert cells[4] == f"{head['kernel_ms'] * 1e3:,.1f} (runs step {step})", cells
        assert cells[6] == f"{head['speedup']:,.2f}×", (cells, head["speedup"])
        # the end-to-end column times step 7: where the entry point runs another step, its cell says so
        assert ("the entry point runs step" in cells[2]) == (step != ngram.CHAPTER.final.number), cells


def test_the_early_exit_share_is_the_share_of_bytes_before_the_first_longest_match():
    """The share the page quotes, against a count made here: each searching slot's haystacks read up to the end of
    the first window equal to its longest pattern with a token after it (prompt, then the generated tokens), else
    whole."""
    from studylog.ngram import NgramConfig, gen_width_for, make_batch
    from studylog.ngram.batches import haystack_bytes
    from studylog.ngram.models import slot_plan

    results = load_results("ngram")
    cfg = (32, 512, 128)
    inputs, _, this_time = make_batch(32, 512, gen_width_for(512), seed=1000 + 32 + 512)
    config = NgramConfig(threshold=128)
    lists = (inputs.step_idx.tolist(), inputs.draft_token_num.tolist(), inputs.max_dec_len.tolist(),
             inputs.seq_lens_encoder.tolist(), inputs.seq_lens_decoder.tolist(), this_time.tolist())
    read = 0
    for b in range(inputs.batch):
        kind, _, _, cap = slot_plan(b, config, *lists)
        step, prompt_len = int(inputs.step_idx[b]), int(inputs.prompt_lens[b])
        top = min(config.max_ngram_size, step)
        if kind != "active" or cap < 1 or top < config.min_ngram_size:
            continue  # a slot that does not search reads nothing
        pattern = inputs.generated_ids[b, step + 1 - top:step + 1].tolist()
        for hay, n in ((inputs.prompt_ids[b].tolist(), prompt_len), (inputs.generated_ids[b].tolist(), step)):
            hit = next((i for i in range(n - top) if hay[i:i + top] == pattern), None)
            read += (n if hit is None else hit + top) * 8
            if hit is not None:
                break
    assert 0 < read < haystack_bytes(inputs, this_time, config)  # some slot stops early, none reads past the floor
    assert lesson.early_exit_share(results, cfg) == pytest.approx(read / haystack_bytes(inputs, this_time, config))


def test_the_table_of_steps_has_the_headline_case_and_one_row_per_numbered_step():
    """The headline's case is a column of the table of steps; the table has one row per numbered step (no lettered
    row), and a bundled step says in its cell how many changes it makes, which its section times one at a time."""
    import re

    from studylog.ngram.report import HEADLINE_CASES

    assert lesson.HEADLINE in HEADLINE_CASES and lesson.HEADLINE in lesson.BOEHM_CASES
    results = load_results("ngram")
    for cases in (lesson.BOEHM_CASES, lesson.BOEHM_CASES[:2], lesson.BOEHM_CASES[2:]):
        table = lesson.boehm_table(results, cases)
        labels = [r.split("|")[1].strip() for r in _step_rows(table)]
        assert not [label for label in labels if re.fullmatch(r"\d+[a-z]", label)], labels
        assert labels == [str(s.number) for s in ngram.CHAPTER.steps] + ["entry point"]
        rows = {r.split("|")[1].strip(): r.split("|")[2] for r in _step_rows(table)}
        for step, words in lesson.BUNDLED.items():
            assert f"({words}: in step {step}'s section)" in rows[str(step)] and "below" not in rows[str(step)]
            assert len(lesson.CHAINS[step][1]) - 1 == {"two changes": 2, "four changes": 4}[words]  # anchor aside
    assert "(headline)" in lesson.boehm_table(results).splitlines()[0]


def _read_chain(step: int, gpu: str) -> dict:
    """Step ``step``'s chain read from its committed file itself: per row label, its µs at each case of the table of
    steps (the anchors from their own series, each lettered link from its variant)."""
    import json

    from studylog import paths

    name, rows = lesson.CHAINS[step]
    measured = json.loads((paths.lab_results("ngram", gpu) / f"{name}.json").read_text())["measurements"]
    out = {}
    for label, _, series, variant in rows:
        out[label] = []
        for cfg in lesson.BOEHM_CASES:
            [row] = [r for r in measured if r["series"] == series and r["clock"] == "gpu"
                     and (r["params"]["batch"], r["params"]["seq_len"], r["params"]["threshold"]) == cfg
                     and r["params"].get("variant") == variant]
            out[label].append(row["ms"] * 1e3)
    return out


def _table(rows) -> str:
    """A chain as the page draws it: the book's one chain-table renderer, the chapter's case names, µs to 0.01."""
    return chain_table(rows, list(lesson.BOEHM_CASES), lesson.case_name, digits=2)


def _check_chain_table(table: str, want: dict, anchors: tuple[str, str]) -> None:
    """A chain table is cumulative: the step before first (an anchor), then one row per link, each label once, the
    step itself last; each row's "× previous" is the row above's µs over its own (from ``want``, the file's), a
    factor under 1.00× says "does not pay", and no cell is "–"."""
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]]
    labels = [r[0] for r in rows]
    assert labels == list(want) and len(set(labels)) == len(labels)
    assert labels[0] == anchors[0] and labels[-1].endswith(anchors[1])
    assert not any(c == "–" for r in rows for c in r)
    for i, r in enumerate(rows):
        times, factors = r[2::2], r[3::2]
        assert times == [f"{t:,.2f}" for t in want[r[0]]], r
        if i == 0:
            assert factors == ["anchor"] * len(lesson.BOEHM_CASES)
            continue
        above = want[labels[i - 1]]
        for cell, a, t in zip(factors, above, want[r[0]]):
            assert cell.split("×")[0] == f"{a / t:.2f}", (r, cell)
            assert cell.endswith(", does not pay") == (round(a / t, 2) < 1), (r, cell)
        # the factor is also the ratio of the table's own µs cells (as printed), within their rounding
        for cell, a, t in zip(factors, rows[i - 1][2::2], times):
            assert float(cell.split("×")[0]) == pytest.approx(float(a.replace(",", "")) / float(t.replace(",", "")),
                                                              abs=0.006)


def test_step_6s_chain_reads_its_run():
    """Step 6's chain: step 5 -> 6a -> 6b = step 6, every number from one run (the library's steps 5 and 6 as its
    anchors), read here from the committed file itself; the anchors lie within a few percent of the table of steps'."""
    results = load_results("ngram")
    gpu = results.path.parent.name
    run = lesson.chain_run(6, gpu)
    if run is None:
        pytest.skip("step 6 was not timed one change at a time on this card")
    rows = lesson.chain_rows(run, 6)
    _check_chain_table(_table(rows), _read_chain(6, gpu), ("step 5", "step 6"))
    assert 0 <= lesson.chain_anchor_gap(results, rows, 6) < 0.05


def test_step_7s_chain_is_committed_and_reads_its_run():
    """Step 7's chain: step 6 -> 7a -> 7b -> 7c -> 7d = step 7, every number from one run (the library's steps 6 and
    7 as its anchors), written by ``lab/ngram/step05_06_changes.py measure --step 7 --chain``. Fails until that run is
    committed for the H200: the page shows no chain table without it."""
    from studylog import paths

    results = load_results("ngram")
    gpu = results.path.parent.name
    assert (paths.lab_results("ngram", gpu) / "step07_chain.json").is_file(), \
        "run lab/ngram/step05_06_changes.py check && ... measure --step 7 --chain on the H200 and commit its JSON"
    rows = lesson.chain_rows(lesson.chain_run(7, gpu), 7)
    _check_chain_table(_table(rows), _read_chain(7, gpu), ("step 6", "step 7"))
    assert 0 <= lesson.chain_anchor_gap(results, rows, 7) < 0.05


def test_a_chain_is_whole_and_cumulative_on_any_run():
    """On a made-up run with the chain file's schema: the table's factors are the row above over the row, a link
    missing at a case raises (no "–" row), and the words for where a change pays follow the rounded factors."""
    from studylog.plotting import Results

    def row(series, ms, cfg, variant=None):
        params = dict(zip(("batch", "seq_len", "threshold"), cfg)) | ({"variant": variant} if variant else {})
        return {"series": series, "params": params, "ms": ms, "clock": "gpu"}

    times = {"step06": 10.0, "7a": 8.0, "7b": 9.0, "7c": 4.5, "step07": 4.5}
    rows = [row(series if variant is None else "step07_chain", times[variant or series] * (i + 1) / 1e3, cfg, variant)
            for i, cfg in enumerate(lesson.BOEHM_CASES) for _, _, series, variant in lesson.CHAINS[7][1]]
    chain = lesson.chain_rows(Results(None, {"measurements": rows}), 7)
    want = {label: [times[variant or series] * (i + 1) for i in range(3)]
            for label, _, series, variant in lesson.CHAINS[7][1]}
    _check_chain_table(_table(chain), want, ("step 6", "step 7"))
    assert [list(x.values()) for x in chain_factors(chain).values()] == [pytest.approx([f] * 3)
                                                                         for f in (1.25, 8 / 9, 2.0, 1.0)]
    with pytest.raises(ValueError):
        lesson.chain_rows(Results(None, {"measurements": rows[:-1]}), 7)
    assert lesson.pays_at([1.2, 1.3, 1.01]) == "pays at every case"
    assert lesson.pays_at([0.9, 0.5, 0.99]) == "does not pay at any case"
    assert lesson.pays_at([0.95, 1.0, 1.2]) == "pays at 256 × 131072; breaks even at 128 × 32768; does not pay at 32 × 512"


def test_the_lab_script_writes_the_chain_the_page_reads():
    """The lab script's step 7 chain: the file, series and variants :data:`lesson.CHAINS` reads."""
    from studylog import paths

    text = (paths.REPO_ROOT / "lab" / "ngram" / "step05_06_changes.py").read_text()
    name, rows = lesson.CHAINS[7]
    assert f'NAME_CHAIN = "{name}"' in text
    links = tuple(variant for _, _, series, variant in rows if variant is not None)
    assert all(series == name for _, _, series, variant in rows if variant is not None)
    assert f"CHAIN7 = {links[:3] + ('7d',)!r}".replace("'", '"') in text


def test_the_inherited_changes_are_read_from_step_7s_variants():
    """The early exit (5b) and the fused phase 2 (6b) in step 7: step 7 without the change over step 7 with it, on the
    GPU clock and in host time per eager call, read here from the committed file itself; the frozen copy of step 7
    times within 2% of the library's step 7 in the same run."""
    import json

    from studylog import paths

    results = load_results("ngram")
    path = paths.lab_results("ngram", results.path.parent.name) / "step07_changes.json"
    if not path.is_file():
        pytest.skip("step 7's inherited changes were not timed on this card")
    measured = json.loads(path.read_text())["measurements"]
    changes = lesson.step07_changes(results.path.parent.name)
    for cfg in lesson.BOEHM_CASES:
        b, s, t = cfg
        at = [r for r in measured if (r["params"]["batch"], r["params"]["seq_len"], r["params"]["threshold"]) == cfg]
        by = {r["params"].get("variant", r["series"]): r for r in at}
        assert abs(by["7"]["ms"] / by["step07"]["ms"] - 1) < 0.02, cfg
        for label, without in (("5b", "7 no exit"), ("6b", "7 unfused")):
            for clock in ("ms", "host_ms"):
                assert lesson.inherited_factor(changes, label, cfg, clock) == \
                    pytest.approx(by[without][clock] / by["7"][clock]), (cfg, label, clock)


def test_the_page_names_its_result_files_once_at_the_end():
    """The prose and table notes say where a number comes from in words; the files themselves are listed once, in
    "Where the numbers come from": the chapter's benchmark and every lab run the page reads."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    at = next(i for i, t in enumerate(text) if t.startswith("## Where the numbers come from"))
    assert text[at + 1].startswith("## Further reading")
    assert not [i for i, t in enumerate(text) if i != at and ("lab/ngram/results" in t or ".json`" in t)]
    for name in ("assets/bench/nvidia-h200/ngram.json", "step05_06_changes.json", "step07_changes.json",
                 "step07_chain.json"):
        assert name in text[at], name


def test_the_page_tells_no_run_history_and_shows_each_chain_under_its_step():
    """No run history in the prose (a separate, further or second run, a date); each bundled step's section shows its
    chain table ("Step N, one change at a time") after the step's heading and before the next step's."""
    import json
    import re

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    page = "\n".join(text)
    assert not re.search(r"(separate|further|second|another) run|20\d\d-\d\d-\d\d|percent or two", page)
    heads = {int(m[1]): i for i, t in enumerate(text) for m in [re.match(r"## Step (\d+)", t)] if m}
    after = sorted(heads.values()) + [len(text)]
    for step in lesson.BUNDLED:
        start = heads[step]
        end = next(i for i in after if i > start)
        assert any(f"Step {step}, one change at a time" in t for t in text[start:end]), step



def test_a_bundled_steps_row_says_what_its_costly_change_buys_and_where_it_loses():
    """Step 6's row gives its fused budget's GPU cost (6b's factors in its chain run, as a range) and the host time it
    saves per eager call (6a's copy over step 6's, the same run); step 7's row says where it is slower than step 6 and
    which step the entry point runs there, read from the benchmark, and only there."""
    results = load_results("ngram")
    notes = lesson.bundle_notes(results)
    cost = list(chain_factors(lesson.chain_rows(lesson.chain_run(6), 6))["6b = step 6"].values())
    changes = lesson.step05_06_changes()
    saved = [(lesson.variant_row(changes, "step05_06_changes", "6a", cfg)["host_ms"]
              - lesson.variant_row(changes, "step05_06_changes", "6", cfg)["host_ms"]) * 1e3 for cfg in lesson.BOEHM_CASES]
    assert f"({min(cost):.2f}–{max(cost):.2f}×)" in notes[6] and f"{min(saved):.0f}–{max(saved):.0f} µs" in notes[6]
    assert max(cost) < 1 and min(saved) > 0  # the committed run: 6b costs GPU time everywhere, and saves host time
    for cases in (lesson.BOEHM_CASES[:2], lesson.BOEHM_CASES[2:]):
        rows = {r.split("|")[1].strip(): r.split("|")[2] for r in _step_rows(lesson.boehm_table(results, cases))}
        assert notes[6] in rows["6"]
        for b, s, t in cases:
            six, seven = (lesson.grid_row(results, ngram.CHAPTER.step(n).series, (b, s, t))["ms"] for n in (6, 7))
            entry = lesson.entry_row(results, {"batch": b, "seq_len": s, "threshold": t, "corpus": None})
            said = f"slower than step 6 at {b} × {s}, where `ngram_match` runs step"
            assert (said in rows["7"]) == (seven > six), (b, s)
            if seven > six:
                assert f"{said} {ngram.CHAPTER.step(entry['step']).number}" in rows["7"]
    assert "slower than step 6 at 32 × 512, where `ngram_match` runs step 6" in notes[7]
    # step 7's row names its idea (7a) and counts the rest of its chain as tunings, as its chain table labels them
    row7 = {r.split("|")[1].strip(): r.split("|")[2] for r in _step_rows(lesson.boehm_table(results))}["7"]
    assert row7.startswith(" every warp streams its own tiles") and "plus three tunings" in row7
    assert [c.startswith("tuning: ") for _, c, _, _ in lesson.CHAINS[7][1][2:]] == [True] * 3


def test_where_we_lose_names_the_dispatch_guess_and_the_real_text_acceptance():
    """"Where we lose" says the entry point's rule is a guess between the measured shapes (its thresholds read from
    the library) and how few drafted tokens real text accepts (computed from the benchmark), after "On real text"."""
    import json

    from studylog import paths

    cells = ["".join(c["source"]) for c in
             json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]]
    lose, real = cells.index("## Where we lose"), next(i for i, t in enumerate(cells) if t.startswith("## On real"))
    assert real < lose
    body = cells[lose + 1]
    assert "a threshold between the measured shapes" in body and "kernels.STREAM_MIN_TOKENS" in body
    assert "{accepted:,} of {drafted:,} drafted tokens" in body
    assert "{accepted:,}" not in "".join(cells[real:lose])  # said once, in Where we lose


def test_the_page_says_rows_and_changes_not_links():
    """The chain's vocabulary on the page is "row" and "change": "link" is the lab's word."""
    import json
    import re

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    page = "\n".join("".join(c["source"]) for c in cells)
    assert not re.search(r"\blinks?\d*\b", page, re.IGNORECASE), re.findall(r".{30}\blinks?\d*\b.{30}", page, re.I)


def test_the_chains_use_the_books_renderer_and_note_and_6b_says_how_far_host_times_drift():
    """Steps 6 and 7's chains: the book's one renderer and its note under each, no sentence of the chapter's own; 6b's
    host times (its chain run) come with how far that run's step 6 sits from the benchmark's, computed."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    text = "".join("".join(c["source"]) for c in cells)
    assert text.count("chain_table(chain") == 2 and text.count("chain_note(") == 2
    assert "A run of its own (its anchors" not in text and "lesson.chain_table" not in text
    assert "how_we_measure.md#a-step-timed-one-change-at-a-time" in text
    assert "two runs of step 6 differ by up to {host_gap:.0%}" in text
    assert not hasattr(lesson, "chain_table")
