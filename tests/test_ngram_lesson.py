"""Chapter 3's page: the table of steps reads every step at both cases against a floor it does not beat, and the
real-text figure's axis names one corpus per tick (the shapes once per group), so its labels do not overlap."""

import re

import pytest

from book.ngram import figures, lesson
from studylog import ngram
from studylog.plotting import load_results, result_files

pytestmark = pytest.mark.skipif(not result_files("ngram"), reason="no committed n-gram results")


def _cells(table: str) -> list[list[str]]:
    """The table's rows as cells (the head first, the rule left out; the footnotes under it left out)."""
    rows = [ln for ln in table.split("\n\n")[0].splitlines() if ln.startswith("|")]
    return [[c.strip() for c in r.split("|")[1:-1]] for i, r in enumerate(rows) if i != 1]


#: The table of steps' rows: the main line in number order, step 6's two ideas split in two (6a, a stop added to
#: step 5, then 6b, the split: the library's step 6), then the entry point and the floor. The budget path has its own
#: table, from 6b (where it starts) to 12, step 9's two ideas split likewise (9a, step 8 without its barriers, then
#: 9b, longer chunks: step 9).
ORDER = [str(n) for n in range(1, 6)] + ["6a", "6b", "7", "`ngram_match`", "floor"]
BUDGET_ORDER = ["6b", "8", "9a", "9b", "10", "11", "12"]


def _both(results, cases=None) -> str:
    """The page's one table of steps."""
    return lesson.the_steps_table(results, cases or lesson.STEPS_CASES)


#: A library step's row: step 6 is 6b, step 9 is 9b.
def _label(n) -> str:
    return {6: "6b", 9: "9b"}.get(n, str(n))


def _num(text: str) -> float:
    return float(text.replace(",", "").rstrip("×"))


def test_the_table_of_steps_and_the_budget_paths_own_table():
    """The page's table of steps: a row per idea of the main line (6a then 6b, the library's step 6) to step 7, the
    entry point and the floor; the budget path's table (``BUDGET_ROWS`` at ``BUDGET_CASES``, the long rows under the
    budget, where it pays) starts at 6b with no ratio, then 8 (against 6b) to 12 (9a then 9b). Two columns per case,
    32 × 512 first, then the long rows, both under the deployed budget (short heads: the case, "µs (× prev.)"): the
    time with its "× previous", and its "× floor" ("× latency floor" where the floor is an empty kernel). Each cell's
    time is the file's (a sub-step's, its separate run's); its ratio is over one reference a row, a row of the same
    table (6a over 5, 6b over 6a, 7 over 6b, 9a over 8, 9b over 9a, 10 over 9b), named where it is not the row above,
    a tie saying so; step 1 is on the host (its footnote gives its times) and divides nothing; the entry point's row
    gives its time alone (which step it runs is said once, over the table, and in its row's change: its rule). No run
    bookkeeping under either table: the page's runs fold names the sub-steps' run."""
    results = load_results("ngram")
    assert [r[0] for r in _cells(lesson.the_steps_table(results))[1:]] == ORDER
    assert lesson.BUDGET_CASES == (lesson.HEADLINE,)
    budget = lesson.the_steps_table(results, lesson.BUDGET_CASES, lesson.BUDGET_ROWS)
    path = _cells(budget)
    assert [r[0] for r in path[1:]] == BUDGET_ORDER
    floor_head = lesson.floor_head(results, lesson.HEADLINE)
    assert path[0] == ["step", "the one change", "128 × 32,768 µs (× prev.)", floor_head]
    assert "(" not in path[1][2] and "where the path starts" in path[1][1]  # 6b: the start, no ratio
    main = {r[0]: r for r in _cells(lesson.the_steps_table(results))}
    assert path[1][2] == main["6b"][4].split(" (")[0]  # the main table's 6b at the long rows, its time
    assert "(" in path[2][2] and ", vs" not in path[2][2]  # step 8 against 6b, the row above it here
    by_path = {r[0]: r for r in path}
    assert "kept for host time" in by_path["8"][1]  # slower on the GPU clock: the row says why it stays
    for words in ("separate run", "within"):  # run bookkeeping stays in the page's runs fold
        assert words not in budget and words not in lesson.the_steps_table(results), words
    table = _both(results)
    head, *rows = _cells(table)
    by = {r[0]: r for r in rows}
    assert [r[0] for r in rows] == ORDER
    assert lesson.STEPS_CASES == ((32, 512, 128), lesson.HEADLINE)
    assert head[:2] == ["step", "the one change"] and head[2] == "32 × 512 µs (× prev.)"
    assert head[4] == "128 × 32,768 µs (× prev.)"
    for i, cfg in enumerate(lesson.STEPS_CASES):
        assert head[3 + 2 * i] == ("× latency floor" if lesson.launch_bound(results, cfg) else "× floor"), cfg
    assert by["1"][2::2] == ["host ¹"] * 2 and by["1"][3::2] == ["–"] * 2
    notes = table.split("\n\n")[1]
    for cfg in lesson.STEPS_CASES:
        ms = lesson.grid_row(results, ngram.CHAPTER.step(1).series, cfg)["ms"]
        assert f"{ms * 1e3:,.1f} µs at {cfg[0]} × {cfg[1]}" in notes, cfg
    assert all("(" not in c for c in by["2"][2:])  # never a GPU time over a host time
    refs = {"6a": "5", "6b": "6a", "7": "6b", "8": "6b", "9a": "8", "9b": "9a", "10": "9b"}
    for i, cfg in enumerate(lesson.STEPS_CASES):
        col = 2 + 2 * i
        for part in ("6a",):  # the sub-step: its lab run's time, or "–" where it has not the case
            t = lesson.part_us(part, cfg)
            if t is None:
                assert by[part][col] == "–" and f"{part} not measured" in notes, (part, cfg)
                continue
            assert by[part][col].startswith(f"{t:,.1f} ("), (part, cfg)
        for n in range(3, 8):
            row = lesson.grid_row(results, ngram.CHAPTER.step(n).series, cfg)
            cell = by[_label(n)][col]
            if row is None:
                assert cell == "–" and "– not timed" in notes
                continue
            assert cell.startswith(f"{row['ms'] * 1e3:,.1f}")
        entry = lesson.entry_row(results, {"batch": cfg[0], "seq_len": cfg[1], "threshold": cfg[2], "corpus": None})
        assert by["`ngram_match`"][col] == f"{entry['ms'] * 1e3:,.1f}"  # its time alone: no "(runs N)" a cell
        floor = lesson.table_floor_us(results, cfg)
        assert by["floor"][col].startswith(f"{floor:,.2f}")
        assert ("empty kernel" in by["floor"][col]) == lesson.launch_bound(results, cfg)
        # every ratio divides two times the table shows, in the same column: one reference a row
        tables = [(rows, col)] + ([(path[1:], 2)] if cfg == lesson.HEADLINE else [])  # each table on its own
        for table_rows, c in tables:
            shown_in = {r[0]: r for r in table_rows}
            for k, (label, *cells) in enumerate(table_rows):
                m = re.fullmatch(r"([\d,.]+) \(([\d.]+)×(, tie)?(, vs (\d+[ab]?))?\)", cells[c - 1])
                if label in ("`ngram_match`", "floor") or not m:
                    continue
                above = table_rows[k - 1][0]
                want = refs.get(label, above)
                if shown_in.get(want, [None] * 9)[c] == "–":  # its reference not timed here: the one before it
                    want = refs[want]
                ref = m[5] or above
                assert ref == want and (m[5] is not None) == (want != above), (label, cfg, cells[c - 1])
                shown = _num(shown_in[ref][c].split(" ")[0]) / _num(m[1])  # a row of the same table
                assert m[2] == f"{shown:.2f}", (label, cfg, cells[c - 1])
                assert (m[3] is not None) == (lesson.TIE[0] <= round(shown, 2) <= lesson.TIE[1]), (label, cfg)
        # every "× floor" is the row's time over the floor row's, both as shown
        floor_shown = _num(by["floor"][col].split(" ")[0])
        for label, *cells in [(label, *cells[col - 1:col + 1]) for label, *cells in rows] + (
                [(r[0], *r[2:4]) for r in path[1:]] if cfg == lesson.HEADLINE else []):  # the budget path's: same floor
            time, times = cells[0], cells[1]
            if label == "floor" or time in ("–", "host ¹"):
                continue
            x = _num(time.split(" ")[0]) / floor_shown
            assert times == (f"{x:,.0f}×" if x >= 100 else f"{x:.1f}×"), (label, cfg, times)
    for words in ("lab run", "open table", "(runs "):  # the lab's words stay off the page's tables
        assert words not in table, words
    assert by["`ngram_match`"][1] == "step 12 on many long rows under a budget, else 7"  # the rule, once


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

    expected = sorted({round(lesson.table_floor_us(results, c), 6) for c in grid_configs(results)
                       if lesson.table_floor_us(results, c) is not None})  # the table's: under a budget, what searches
    assert drawn == expected
    # the times panel draws the steps that make the chapter's argument beside the entry point, not all twelve (the
    # table has them all); the second panel, each path's last step against step 6, read from the file
    labels = ax.get_legend_handles_labels()[1]
    shown = [n for n in range(1, ngram.CHAPTER.final.number + 1) if any(t.startswith(f"step {n}: ") for t in labels)]
    assert shown == list(figures.FIGURE_STEPS) and any(t.startswith("ngram_match") for t in labels)
    every = [t.get_text() for t in figs["latency"].legends[0].get_texts()]
    assert not any("_" in t.split(" (")[0].split(":")[0] for t in every if t.startswith("step")), every
    paths = figs["latency"].axes[1]
    for line, number in zip(paths.get_lines(), figures.PATH_ENDS):
        assert line.get_label().startswith(f"step {number}: ")
        six = [lesson.grid_row(results, ngram.CHAPTER.step(6).series, c) for c in grid_configs(results)]
        end = [lesson.grid_row(results, ngram.CHAPTER.step(number).series, c) for c in grid_configs(results)]
        assert list(line.get_ydata()) == pytest.approx([a["ms"] / b["ms"] for a, b in zip(six, end)])
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


def test_the_shared_definitions_hold_what_the_listings_lean_on():
    """What the listings use without defining it (a slot's plan, a match's key, "no match") is one short listing,
    read from the source; the parameter list is one line of it, not its macro."""
    text = str(lesson.shared_definitions())
    for name in ("struct SlotPlan", "#define SLOT_ACTIVE", "u64 make_key(", "#define NONE_KEY", "#define NGRAM_MAX",
                 "NGRAM_KERNEL_PARAMS"):
        assert name in text, name
    assert "#define NGRAM_KERNEL_PARAMS" not in text and "plan_slot(int b" not in text
    assert text.rstrip().endswith("}") and len(text.splitlines()) <= 30


#: The page's folded listings, in page order: what a reader may skip (the shared definitions, step 2's and 3's
#: loops), the whole diffs of steps 5 and 6 (each shows the helper or core it adds instead), and the budget path's
#: diffs, steps 8 to 12, in one fold (the path is one paragraph). Step 4's whole diff is not on the page: its core is,
#: with the whole change's size.
FOLDED = ["display(lesson.shared_definitions())  # ngram_common.cuh, which every step's kernel includes",
          "display(lesson.step2_excerpt())",
          'show_source("ngram_common.cuh", "walk_budget")  # the batch loop, shared with step 3\'s phase 2',
          'show_source("ngram_two_phase.cu", "ngram_search_per_n")',
          "lesson.step_diff(4, 5)", "lesson.step_diff(5, 6)",
          'for d in (lesson.step_diff(6, 8), lesson.step9_diff("9a"), lesson.step9_diff("9b"), lesson.step_diff(9, 10),\n'
          '          lesson.step_diff(10, 11), lesson.step_diff(11, 12)):\n    display(d)']


def test_the_folded_listings_are_the_loops_and_the_long_or_small_diffs():
    """The page folds what a reader can skip (:data:`FOLDED`); every fold's button says what it holds, no folded
    output holds the specification, and no Markdown says "folded"."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    assert not any(t.startswith("parts(") for t in text)
    folded = [t for c, t in zip(cells, text) if c["cell_type"] == "code"
              and "hide-output" in c["metadata"].get("tags", [])]
    assert folded == FOLDED
    for c in cells:
        if "hide-output" in c["metadata"].get("tags", []):
            assert c["metadata"]["mystnb"]["code_prompt_show"].startswith("Show "), c["metadata"]
    assert not any("reference_ngram_match" in t for t in folded)
    assert not any("folded" in t for c, t in zip(cells, text) if c["cell_type"] == "markdown")


#: The helper each of steps 5 and 6 adds, shown open (its whole diff folded under it): step -> (file, function).
HELPERS = {5: ("ngram_one_pass.cu", "scan_tile"), 6: ("ngram_common.cuh", "tile_floor_key")}


def test_step_4_shows_its_core_and_steps_5_and_6_the_helper_each_adds_and_fold_the_whole_diff():
    """Step 4 shows, open, the core of its diff (at most 40 changed lines: the sums, the room and the first slot
    where the budget bites) and, after it, the whole change's size (its whole diff is not on the page again); steps 5
    and 6 show, open, the one helper each adds, whole (no listing cut mid-block, at most 40 lines); step 6 then its
    core (a block's chunk and the slot's global key, at most 40 changed lines), open; each with the step's whole diff
    folded right under it and its number after with the size of what the open listings leave out. Step 6 is one
    section: its first idea alone (6a, the stop on one block a slot) is one sentence with its loss, not a section or
    a listing. Each helper is new at its step (absent from the step before's kernel source) and used by the step's
    kernel; the entry point runs step 7 at the headline case."""
    import json

    from studylog import paths
    from studylog.source import source_of

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    text = ["".join(c["source"]).strip() for c in cells]
    csrc = ngram.CHAPTER.step(2).source.parent
    i = text.index("lesson.step_core(4)")
    assert "hide-output" not in cells[i]["metadata"].get("tags", []) and "lesson.step_diff(3, 4)" not in text
    assert "the rest of the change (+{len(whole.added) - len(core.added)}/−{len(whole.removed) - len(core.removed)} " \
        "lines) walks the batch" in " ".join(text[i + 1].split())  # what the lines past the core do, in a phrase
    core, whole = lesson.step_core(4), lesson.step_diff(3, 4)
    assert len(core.added) + len(core.removed) <= 40 < len(whole.added) + len(whole.removed)
    assert set(core.added) <= set(whole.added) and "block_inclusive_scan(" in "".join(core.added)
    assert not any(t.startswith("## Step 6a") or t.startswith("## Step 6b") for t in text)
    assert "lesson.step6a_diff()" not in text
    for step, (file, function) in HELPERS.items():
        i = text.index(f'show_source("{file}", "{function}")')
        assert "hide-output" not in cells[i]["metadata"].get("tags", [])
        if step == 6:  # one section: the bound, then 6b's core, open, then the whole diff folded
            assert text[i - 1].startswith("## Step 6: ")
            assert text[i + 1].startswith("lesson.step_core(6)") and "hide-output" not in cells[i + 1]["metadata"]["tags"]
            core, whole = lesson.step_core(6), lesson.step_diff(5, 6)
            assert len(core.added) + len(core.removed) <= 40 < len(whole.added) + len(whole.removed)
            assert set(core.added) <= set(whole.added) and "atomicMin(match_keys + b" in "".join(core.added)
            assert "The rest of its diff (+{len(whole.added) - len(core.added)}" in text[i + 3]
            assert 'lesson.row_factor(results, "6a", H)' in text[i + 3]  # 6a: one sentence, its loss
            i += 1
        assert text[i + 1] == f"lesson.step_diff({step - 1}, {step})"
        assert "hide-output" in cells[i + 1]["metadata"]["tags"] and "say(f" in text[i + 2]
        if step == 5:  # the helper open; the kernel's diff folded, its size said
            assert "The rest of step 5 is its kernel's diff (+{len(whole.added)}" in text[i + 2]
        body = source_of(csrc / file, function)[0]
        assert body.rstrip().endswith("}") and len(body.splitlines()) <= 40, function
        assert f"{function}(" in "".join(lesson.step_diff(step - 1, step).added), function
    results = load_results("ngram")
    entry = lesson.entry_row(results, {"batch": 32, "seq_len": 512, "threshold": 128, "corpus": None})
    assert ngram.CHAPTER.step(entry["step"]).number == 7


def test_every_step_has_its_section_with_its_diff_and_its_number():
    """One heading a step on the main line, in number order: "## Step N: <the one idea>" (1 to 7; step 6's first
    idea, which loses alone, is one sentence of its section and one row of the table). The budget path (8 to 12) is
    one short section after the table of steps: one paragraph, what the path buys in all at its case (the table's
    one row), what each step changes, step 8's GPU-clock loss and the host time it buys, and what steps 10 to 12 gain
    there (step 12, the most), then the steps' diffs in one fold, in step order; no table of its own. Each main-line
    section from step 3 on shows its step's diff, core or helper (open or folded) and says a computed number; step 7
    says where it pays (:func:`lesson.path_words`). An open diff changes at most 40 lines; a longer one is folded."""
    import json
    import re

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    sections = [(m[2], i, m[1]) for i, t in enumerate(text) if cells[i]["cell_type"] == "markdown"
                for m in [re.match(r"(#+) Steps? (\d+[ab]?)\b", t)] if m]
    assert [n for n, _, _ in sections] == ["1", "2", "3", "4", "5", "6", "7"]  # reading order is step order
    sections = [(int(n.rstrip("ab")), i, h) for n, i, h in sections]
    assert all(h == "##" for _, _, h in sections)
    assert not any(re.match(r"#+ Steps \d", t) or t.startswith("### ") for t in text)
    at = {n: i for n, i, _ in sections}
    path_heads = [i for i, t in enumerate(text) if t.startswith("## The budget path: steps 8 to 12")]
    measured = next(i for i, t in enumerate(text) if t.startswith("## The steps, measured"))
    assert len(path_heads) == 1 and at[7] < measured < path_heads[0]
    result = next(i for i, t in enumerate(text) if t.startswith("## The result"))
    ends = [i for _, i, _ in sections[1:]] + [measured]
    for (n, start, _), end in zip(sections, ends):
        if n < 3:
            continue
        body = text[start:end]
        assert any("say(f" in t and "{" in t for t in body), n
        assert any(re.search(rf"step_(diff\(\d+, |core\(){n}\)", t) for t in body), n
        if n == 7:
            assert any(f"lesson.path_words(results, {n})" in t for t in body), n
        for c, t in zip(cells[start:end], body):
            m = re.fullmatch(r"lesson\.step_diff\((\d+), (\d+)\)", t.strip())
            if m and "hide-output" not in c["metadata"].get("tags", []):
                d = lesson.step_diff(int(m[1]), int(m[2]))
                assert len(d.added) + len(d.removed) <= 40, (n, t)
    path = text[path_heads[0] + 1:result]
    # one paragraph, then every step's diff in one fold
    assert len(path) == 2 and "budget_path_table" not in path[0] and "say(f" in path[0]
    assert [path[1].strip()] == FOLDED[-1:] and "hide-output" in cells[path_heads[0] + 2]["metadata"]["tags"]
    results = load_results("ngram")
    factors = {n: lesson.row_factor(results, n, lesson.HEADLINE) for n in lesson.BUDGET_ROWS[1:]}  # 6b: the start
    assert max(factors, key=factors.get) == 12  # "the most of the five there": the paragraph names it last
    assert "us(n, *H)" in path[0] and "(6, 12)" in path[0]  # what the path buys in all
    assert "lesson.row_factor(results, n, H) for n in (10, 11, 12)" in path[0]
    assert all(factors[n] > lesson.TIE[1] for n in (10, 11, 12)) and factors[8] < lesson.TIE[0]
    for words in ("Step 8 runs", "Step 9 drops", "10 loads 16 bytes", "11 hints L2", "12 stops the blocks",
                  "slower on the GPU clock"):
        assert words in path[0], words
    for old, new in ((6, 8), (9, 10), (10, 11), (11, 12)):  # the fold's diffs, a step each, none over 40 lines
        d = lesson.step_diff(old, new)
        assert 0 < len(d.added) + len(d.removed) <= 40, (old, new)
    for part in ("9a", "9b"):
        d = lesson.step9_diff(part)
        assert len(d.added) + len(d.removed) <= 40, part


def test_the_floor_is_the_scoreboards_on_every_card():
    """One floor a run on every page: the active slots' haystack bytes at the run's copy bandwidth, or the run's
    own empty kernel (as the scoreboard takes it) where that is larger."""
    from book import scoreboard
    from book.ngram.results import grid_configs

    for gpu in ("nvidia-h200", "nvidia-h100-80gb-hbm3"):
        results = load_results("ngram", gpu)
        empty_us = scoreboard.empty_kernel_ms(results.data) * 1e3
        bandwidth = results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9
        for cfg in grid_configs(results):
            row = lesson.grid_row(results, ngram.CHAPTER.step(1).series, cfg)
            by_bytes = row["haystack_bytes"] / bandwidth * 1e6
            assert lesson.floor_us(results, cfg) == pytest.approx(max(by_bytes, empty_us), rel=1e-12), (gpu, cfg)
        small, large = lesson.BOEHM_CASES[0], lesson.BOEHM_CASES[-1]
        assert lesson.floor_us(results, small) == pytest.approx(empty_us)  # a few bytes: the empty kernel binds
        assert lesson.floor_us(results, large) > 10 * empty_us  # the bytes bind
        floor = next(r for r in _cells(lesson.the_steps_table(results, (small,))) if r[0] == "floor")
        assert floor[2] == f"{empty_us:,.2f} (an empty kernel)"  # the table's floor row, at the small case


def test_the_result_table_times_the_entry_point_as_the_headline_does():
    """The result is two narrow tables, one clock each: end to end on the host (the CPU loop and step 12, a call and
    a sync, in every row), then the GPU clock, whose column is the series the chapter's headline (and the results
    page) quotes: the entry point, with the step its rule ran, then the rival, step 4, and its time over the entry
    point's, the headline's ratio, which divides the two columns before it."""
    from book.ngram import results as book_results
    from studylog.ngram.report import gpu_headline

    results = load_results("ngram")
    table = lesson.result_table(results, book_results.headline(results))
    host_part, gpu_part = table.split("**On the GPU clock**")
    assert host_part.startswith("**End to end on the host**")

    def rows(part):
        return {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[1:-1]] for r in part.splitlines()[2:]
                if r.startswith("|") and not r.startswith("|---")}

    host_head = next(r for r in host_part.splitlines() if r.startswith("| case"))
    gpu_head = next(r for r in gpu_part.splitlines() if r.startswith("| case"))
    assert "step 12, end to end" in host_head and "ngram_match" not in host_head and "entry point" not in host_head
    assert "CPU loop" not in gpu_head and "step 3" not in gpu_head  # one rival, on the GPU clock
    assert gpu_head.split("|")[3].strip() == "step 4, our FastDeploy port (µs)"
    host_rows, gpu_rows = rows(host_part), rows(gpu_part)
    from book.ngram.results import grid_configs

    assert len(gpu_rows) == 1 + len(grid_configs(results))  # the head, and every shape measured on the GPU clock
    from book.results import NGRAM_UNTUNED

    for b, t, _ in grid_configs(results):  # the results page's weaker comparisons, labelled as it labels them
        weak = b <= NGRAM_UNTUNED["most_slots"] and t >= NGRAM_UNTUNED["least_tokens"]
        cells = next(c for k, c in gpu_rows.items() if k.startswith(f"{b} × {t}, "))
        assert cells[3].endswith("× (weaker rival)") == weak, cells
        # the ratio divides the two columns before it, to the rounding of the times shown (0.1 µs)
        ratio, rival, ours = _num(cells[3].split(" ")[0]), _num(cells[2]), _num(cells[1].split(" ")[0])
        assert (rival - 0.05) / (ours + 0.05) - 0.005 <= ratio <= (rival + 0.05) / (ours - 0.05) + 0.005, cells
    assert ("Weaker rival: with 1 or 16 long slots" in gpu_part) == any(
        b <= NGRAM_UNTUNED["most_slots"] and t >= NGRAM_UNTUNED["least_tokens"] for b, t, _ in grid_configs(results))
    for head in gpu_headline(results):
        cells = gpu_rows[lesson.case_words(head["case"])]
        assert head["kernel"].startswith("n-gram matching, ngram_match (step")  # the headline times the entry point
        step = int(head["kernel"].split("(step")[1][:2])
        assert cells[1] == f"{head['kernel_ms'] * 1e3:,.1f}" and step in (7, 12), cells  # its time alone
        # the ratio is the chapter's rival's, step 4 (the results page's answer divides the same)
        cfg = next(c for c in grid_configs(results) if cells[0].startswith(f"{c[0]} × {c[1]}, "))
        assert cells[3] == f"{lesson.rival_ratios(results)[cfg]:,.2f}×", cells
        # the end-to-end column times step 12 in every row, whichever step the entry point runs
        host = host_rows[lesson.case_words(head["case"])]
        assert host[2][0].isdigit() and f"step {ngram.report.SYNCED_STEP}, end to end" in host_head, host


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
    """The quoted case is a column of the table of steps; the tables have one row per idea: steps 6 and 9 are each
    two lettered rows (6a, timed apart, then 6b, the library's step 6; 9a and 9b likewise), each naming its one change
    in a few words, and each "× previous" of a step timed in the chapter's benchmark whose reference is too is the
    row it builds on over it, read here from the committed file itself as the table prints the times; a factor from
    0.97× to 1.03× says "tie"."""
    import re

    from studylog.ngram.report import HEADLINE_CASES

    assert lesson.HEADLINE in HEADLINE_CASES and lesson.HEADLINE in lesson.BOEHM_CASES
    assert lesson.builds_on(7) == lesson.builds_on(8) == 6 and lesson.builds_on(12) == 11
    results = load_results("ngram")
    for cases in (lesson.STEPS_CASES, lesson.BOEHM_CASES[:2], lesson.BOEHM_CASES[2:]):
        table, path = _both(results, cases), lesson.the_steps_table(results, cases, lesson.BUDGET_ROWS)
        labels, path_labels = [r[0] for r in _cells(table)[1:]], [r[0] for r in _cells(path)[1:]]
        assert [label for label in labels + path_labels if re.fullmatch(r"\d+[a-z]", label)] == \
            ["6a", "6b", "6b", "9a", "9b"], labels + path_labels
        assert labels == ORDER and path_labels == BUDGET_ORDER  # one label a row
        rows = {r[0]: r for r in _cells(path)[1:] + _cells(table)[1:]}  # 6b: the main table's row
        for part in ("6a", "9a"):
            assert rows[part][1].startswith(lesson.SHORT_CHANGES[part])
        for step in ngram.CHAPTER.steps:
            assert rows[_label(step.number)][1].startswith(lesson.SHORT_CHANGES[step.number]), step
            assert len(lesson.SHORT_CHANGES[step.number].split()) <= 6, step
            if step.number < 3:
                continue
            if step.number in (6, 7, 8, 9, 10):  # against 6a, 6b, 9a, 9b: the test above checks their ratios
                continue
            for cell, cfg in zip(rows[_label(step.number)][2::2], cases):
                before = _file_ms(results, lesson.builds_on(step.number), cfg)
                this = _file_ms(results, step.number, cfg)
                want = f"{this * 1e3:,.1f}"
                if before is not None:
                    f = round(before * 1e3, 1) / round(this * 1e3, 1)  # the times as the table prints them
                    notes = [f"{f:.2f}×"]
                    if 0.97 <= round(f, 2) <= 1.03:
                        notes.append("tie")
                    if lesson.builds_on(step.number) != step.number - 1:
                        notes.append(f"vs {lesson.builds_on(step.number)}")
                    want += f" ({', '.join(notes)})"
                assert cell == want, (step.number, cfg, cell)


def _file_ms(results, number: int, cfg) -> float | None:
    """Step ``number``'s GPU-clock time at grid case ``cfg``, read from the committed file's rows directly; None where
    the benchmark skipped it (step 2, the one-thread kernel, on the long rows)."""
    import json

    rows = [r for r in json.loads(results.path.read_text())["measurements"]
            if r["series"] == f"step{number:02d}" and "corpus" not in r["params"]
            and (r["params"]["batch"], r["params"]["seq_len"], r["params"]["threshold"]) == cfg]
    assert len(rows) == 1 or (number == 2 and not rows), (number, cfg)
    return rows[0]["ms"] if rows else None


def test_where_a_step_pays_in_words():
    """Each step on a path says where it pays against the step before it on that path, as the table rounds: a tie
    (0.97× to 1.03×) is no gain. It names only the cases that are the columns of the page's one table of steps."""
    import re

    results = load_results("ngram")
    for number in range(7, 13):
        words = lesson.path_words(results, number)
        pays = [round(f, 2) > 1.03 for f in (lesson.row_factor(results, number, c) for c in lesson.STEPS_CASES)]
        if all(pays) or not any(pays):
            assert words == ("pays at every case" if all(pays) else "pays at no case"), words
            continue
        yes, no = words.removeprefix("pays at ").split(", not at ")
        assert len(pays) == len(lesson.STEPS_CASES)
        for (b, s, _), ok in zip(lesson.STEPS_CASES, pays):
            assert f"{b} × {s}" in (yes if ok else no), (number, words)
        named = {m for m in re.findall(r"\d+ × \d+", words)}
        assert named <= {f"{b} × {s}" for b, s, _ in lesson.STEPS_CASES}, (number, words)


def test_the_early_exit_is_read_from_its_lab_runs():
    """The early exit added to step 5 (5b) and taken back from step 12: the run's variant without it over the
    variant with it, on the GPU clock and in host time per eager call, read here from the committed files
    themselves; each frozen copy times within 2% of the library's step in the same run."""
    import json

    from studylog import paths

    gpu = load_results("ngram").path.parent.name
    for name, (series, without, with_) in lesson.EXIT_RUNS.items():
        path = paths.lab_results("ngram", gpu) / f"{name}.json"
        if not path.is_file():
            pytest.skip(f"{name} was not run on this card")
        measured = json.loads(path.read_text())["measurements"]
        run = lesson.lab_run(name, gpu)
        anchor = {"step05_changes": "step05", "step12_changes": "step12"}[name]
        # the variant divided by is the one with the exit, by the run's own knob
        knobs = {r["params"]["variant"]: r["params"].get("early_exit") for r in measured if "variant" in r["params"]}
        assert knobs[without] is False and knobs[with_] is True, name
        for cfg in lesson.BOEHM_CASES:
            at = [r for r in measured if (r["params"]["batch"], r["params"]["seq_len"], r["params"]["threshold"]) == cfg]
            by = {r["params"].get("variant", r["series"]): r for r in at}
            frozen = "5" if name == "step05_changes" else "12"
            assert abs(by[frozen]["ms"] / by[anchor]["ms"] - 1) < 0.02, (name, cfg)
            for clock in ("ms", "host_ms"):
                assert lesson.exit_factor(run, name, cfg, clock) == pytest.approx(by[without][clock] / by[with_][clock])
    assert lesson.exit_factor(None, "step05_changes", lesson.BOEHM_CASES[0]) is None


def test_the_lab_script_writes_the_runs_the_page_reads():
    """``lab/ngram/step05_12_changes.py`` writes each file of :data:`lesson.EXIT_RUNS` under its series, with both
    variants the page divides."""
    import importlib.util

    from studylog import paths

    spec = importlib.util.spec_from_file_location("step05_12_changes",
                                                  paths.REPO_ROOT / "lab" / "ngram" / "step05_12_changes.py")
    lab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab)
    written = {name: variants for variants, _, name in lab.RUNS.values()}
    for name, (series, without, with_) in lesson.EXIT_RUNS.items():
        assert series == name and {without, with_} <= set(written[name]), name


def test_step_8_says_what_its_one_launch_buys():
    """Step 8 loses on the GPU clock at every case of the table and saves host time per eager call: its section says
    both, computed (the committed run: one launch costs GPU time, saves host time)."""
    import json

    from studylog import paths

    results = load_results("ngram")
    cost = lesson.step_factors(results, 8)
    host6, host8 = ([lesson.host_us(results, n, cfg) for cfg in lesson.BOEHM_CASES] for n in (6, 8))
    assert max(cost) < 1 and max(host8) < min(host6)
    assert lesson.path_words(results, 8).startswith("pays at no case")
    cells = ["".join(c["source"]) for c in
             json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]]
    at = next(i for i, t in enumerate(cells) if t.startswith("## The budget path: steps 8 to 12"))
    assert "lesson.host_us(results, n, H)" in cells[at + 1] and "slower on the GPU clock" in cells[at + 1]
    assert "{host[8]:,.1f} µs of host time an eager call, not {host[6]:,.1f}" in " ".join(cells[at + 1].split())
    assert "kept for host time" in lesson.kept_note(results, 8, lesson.HEADLINE)  # the table's row says it too


def test_the_page_names_its_runs_in_words_and_its_cells_read_them():
    """"Where the numbers come from" names the runs in words (no repository path or file name anywhere in the
    page's text); the cells read the chapter's benchmark and the two lab runs it names (6a beside step 5, and
    ``ngram_match`` end to end beside the CPU path on another host), which are committed."""
    import json
    import re

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    at = next(i for i, t in enumerate(text) if t.startswith("## Where the numbers come from"))
    assert text[at + 1].startswith("## Further reading")
    for i, t in enumerate(text):
        if cells[i]["cell_type"] == "markdown":
            assert not re.search(r"\w\.json`|assets/bench|lab/ngram|/results/", t), i
    assert all(w in " ".join(text[at].split()) for w in ("benchmark", "empty kernel", "6a beside step 5",
                                                         "end to end beside the CPU path, on another host"))
    code = "\n".join(t for c, t in zip(cells, text) if c["cell_type"] == "code")
    assert 'load_results("ngram")' in code and 'lesson.row_factor(results, "6a", H)' in code
    assert "lesson.entry_end_to_end()" in code and "lesson.result_tables(results, heads)" in code
    assert "step9_times(" not in code and "budget_path_table(" not in code  # runs the page no longer reads
    assert lesson.lab_run("step05_changes") is not None and lesson.entry_end_to_end() is not None
    assert (paths.REPO_ROOT / "assets" / "bench" / "nvidia-h200" / "ngram.json").is_file()


def test_the_page_tells_no_run_history_and_shows_no_table_beside_the_steps_table():
    """No run history in the prose (a further or second run, a date; "separate runs" name where a number comes from),
    and no lettered names but the sub-steps (6a, 6b, 9a, 9b). Step 6's two ideas are said in their sections, each with
    the table's number (``lesson.row_factor``: 6a's time from its separate run), in step 6's one section; no chain
    table sits beside the table of steps."""
    import json
    import re

    from studylog import paths

    cells = ["".join(c["source"]) for c in
             json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]]
    page = "\n".join(cells)
    assert not re.search(r"(further|second|another) run|20\d\d-\d\d-\d\d|percent or two|lab run", page)
    assert "one change at a time" not in page and set(re.findall(r"\b\d[a-d]\b", page)) <= {"6a", "6b", "9a", "9b"}
    assert not re.search(r"their run has no|[Tt]imed apart from the table", page)  # bookkeeping stays off the page
    assert "answers: `book/ngram/solutions.py`" in page  # the answers' path, as every page gives it
    assert "`plan_slot`" in next(t for t in cells if t.startswith("## The operation"))  # defined where it is named
    assert not any("chain_table(" in t or "step6_chain()" in t for t in cells)
    at = next(i for i, t in enumerate(cells) if t.startswith("## Step 6:"))
    said = next(t for t in cells[at:] if "say(f" in t)
    for part in ("6a", "6b"):
        assert f'lesson.row_factor(results, "{part}", H)' in said, part


def test_step_6s_chain_is_the_lab_runs_own_rows():
    """Step 6's chain: step 5, the stop added to it (the variant with the early exit, not kept alone), then step 6
    (the split, the stop kept), each row's times the lab run's own at the table of steps' cases; its anchors re-time
    the library's steps 5 and 6 within 3% of the chapter's benchmark."""
    import json

    from studylog import paths

    results = load_results("ngram")
    gpu = results.path.parent.name
    path = paths.lab_results("ngram", gpu) / "step05_changes.json"
    if not path.is_file():
        pytest.skip("step05_changes was not run on this card")
    rows = lesson.step6_chain(gpu)
    assert [r.label for r in rows] == ["step 5", "+ stop", "step 6"]
    measured = json.loads(path.read_text())["measurements"]
    for row, (_, _, variant, _) in zip(rows, lesson.STEP6_CHAIN):
        for cfg in lesson.BOEHM_CASES:
            at = [r for r in measured if r["params"].get("variant") == variant
                  and (r["params"]["batch"], r["params"]["seq_len"], r["params"]["threshold"]) == cfg]
            assert len(at) == 1 and row.us[cfg] == pytest.approx(at[0]["ms"] * 1e3), (variant, cfg)
    knobs = {r["params"]["variant"]: r["params"] for r in measured if "variant" in r["params"]}
    assert knobs["5"]["early_exit"] is False and knobs["5b"]["early_exit"] is True and "chunk_len" in knobs["6"]
    assert lesson.chain_gap(results, rows) < 0.03


def test_where_we_lose_names_the_rules_misses_and_the_real_text_acceptance():
    """"Where we lose" names the cases the entry point's rule misses, if any (:func:`lesson.rule_misses`), after
    "On real text", and points back to it for how much slower real text runs; how few drafted tokens real text
    accepts and how far real text moves the synthetic times are said once, under the real-text figure ("Why it
    matters" uses the accepted tokens a slot and step); the rule itself (its thresholds read from the library) is
    said over the table of steps, where the page names the main line."""
    import json

    from studylog import paths

    cells = ["".join(c["source"]) for c in
             json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]]
    lose, real = cells.index("## Where we lose"), next(i for i, t in enumerate(cells) if t.startswith("## On real"))
    assert real < lose
    body = cells[lose + 1]
    assert "The rule between steps 7 and 12 misses" in body and "kernels.STREAM_MIN_TOKENS" not in body
    above = cells[next(i for i, t in enumerate(cells) if t.startswith("## The steps, measured")) + 1]
    assert "The main line, both cases under the deployed budget of 128 (the budget path, steps 8 to 12, has its own " \
        "table below)" in " ".join(above.split()) and "budget_path" not in above
    path = cells[next(i for i, t in enumerate(cells) if t.startswith("## The budget path")) + 1]
    assert "lesson.the_steps_table(results, lesson.BUDGET_CASES, lesson.BUDGET_ROWS)" in path  # its own table
    assert "kernels.STREAM_MIN" not in "".join(cells)  # the rule's thresholds are the library's, not the page's
    page = "".join(cells)
    assert "accepted" not in body and "{accepted:,}" not in page
    why = next(i for i, t in enumerate(cells) if t.startswith("## Why it matters"))
    assert page.count("of drafted tokens are accepted") == 1 and "of drafted tokens are accepted" in cells[real + 1]
    assert "drafts add {per_slot:.2f} accepted tokens a slot and step" in " ".join(cells[why + 1].split())
    assert "Over the {len(real)} runs on real text and code" in " ".join(cells[why + 1].split())  # which runs
    # how far real text moves the times: said under the figure for the kernel it is measured on (step 12) and for
    # the one the entry point runs at the headline case (step 7), pointed to from here
    assert page.count("lesson.real_text_slower(results") == 3 and "(#on-real-text)" in body
    assert "lesson.real_text_slower(results, 7)" in cells[real + 1] and "Step 12 takes" in cells[real + 1]


def test_the_page_says_rows_and_changes_not_links():
    """The chain's vocabulary on the page is "row" and "change": "link" is the lab's word."""
    import json
    import re

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    page = "\n".join("".join(c["source"]) for c in cells)
    assert not re.search(r"\blinks?\d*\b", page, re.IGNORECASE), re.findall(r".{30}\blinks?\d*\b.{30}", page, re.I)


def _context_runs(diff) -> list[int]:
    """The lengths of the runs of unchanged lines a diff shows between its hunk headers and changed lines."""
    runs, run = [], 0
    for line in diff.lines[2:]:
        if line[:1] in ("+", "-") or line.startswith("@@"):
            runs.append(run)
            run = 0
        else:
            run += 1
    return [r for r in runs + [run] if r]


def test_every_diff_on_the_page_shows_one_line_of_context():
    """Each step's diff shows its own lines and one line of context each side (:data:`lesson.DIFF_CONTEXT`), not the
    braces and ``#pragma unroll`` around them: every diff on the page goes through it, and no run of unchanged lines
    in a shown diff is longer than the context of the two changes it separates."""
    import json

    from book.common import diff_parts
    from studylog import paths
    from studylog.source import show_diff

    assert lesson.DIFF_CONTEXT == 1
    cells = ["".join(c["source"]) for c in
             json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]]
    code = "\n".join(cells)
    assert "CHAPTER.show_diff(" not in code  # the steps' diffs go through lesson.step_diff
    for cell in cells:
        if "show_diff(" in cell:
            assert "context=lesson.DIFF_CONTEXT" in cell, cell
    shown = [lesson.step_diff(old, new) for old, new in ((2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (6, 8), (8, 9),
                                                         (9, 10), (10, 11), (11, 12))]
    shown += [show_diff("ngram_two_phase.cu", "ngram_one_pass.cu", old_function="ngram_search_per_n",
                        new_function="ngram_search_one_pass", context=lesson.DIFF_CONTEXT)]
    for d in shown + [p for d in shown for p in diff_parts(d)]:
        assert max(_context_runs(d), default=0) <= 2 * lesson.DIFF_CONTEXT, d.new_name
        assert not any("notebook" in ln for ln in d.lines), d.new_name  # no comment that speaks of the page
    # three lines of context (the default) would show runs of up to six unchanged lines
    assert max(r for old, new in ((8, 9), (11, 12))
               for r in _context_runs(ngram.CHAPTER.show_diff(old, new))) > 2 * lesson.DIFF_CONTEXT


def test_where_we_lose_gives_the_eager_host_time_and_the_rules_clock():
    """"Where we lose" leads with the public call as a reader calls it, at the deployed budget's shape (32 × 512):
    its time end to end in the separate run (the table above it) and its ratio to that run's CPU loop, which barely
    beats it (under 1.10×: the bullet's title); then what the call waits on (its values checked on the host, its
    scratch allocated: the library's ``validate`` copies the lengths to the host), the same step bound once (that
    run's ``matcher``, far faster), and, from the benchmark, that bound call's host time against its GPU time
    (:func:`lesson.eager_host` at that shape, read here from the file itself: the host's is the larger). The dispatch
    rule picks the step faster on the GPU clock at the long rows under a budget."""
    import inspect
    import json

    from studylog import paths
    from studylog.ngram import NgramConfig, formats
    from studylog.ngram.kernels import step12_skip_refused, step_for_shape

    cells = ["".join(c["source"]) for c in
             json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]]
    body = " ".join(cells[cells.index("## Where we lose") + 1].split())  # as the paragraph reads, unwrapped
    for text in ("eager = lesson.eager_host(results, P)", "run = (lesson.entry_end_to_end() or {}).get(P)",
                 "Called as a reader calls it, `ngram_match` barely beats the CPU loop at {P[0]} × {P[1]}",
                 "{called['ngram_match']:.1f} µs a call end to end",
                 "{called['cpu_path'] / called['ngram_match']:.2f}×", "copies its slots' lengths to the host",
                 "allocates its", "the same step takes {called['matcher']:.1f} µs",
                 "{eager['entry_host']:.1f} µs of host time", "{eager['entry_gpu']:.1f} µs on the GPU clock"):
        assert text in body, text
    assert ".cpu()" in inspect.getsource(formats.validate)  # the checks copy to the host: a sync
    P = (32, 512, 128)
    run = lesson.entry_end_to_end()[P]
    shown = {k: round(v["ms"] * 1e3, 1) for k, v in run.items()}
    assert 1 < shown["cpu_path"] / shown["ngram_match"] < 1.10  # "barely beats"
    assert shown["matcher"] < 0.5 * shown["ngram_match"]  # the checks and scratch are most of the call
    results = load_results("ngram")
    rows = json.loads(results.path.read_text())["measurements"]

    def host(series, cfg):
        at = [r for r in rows if r["series"] == series and "corpus" not in r["params"] and r.get("clock") == "gpu"
              and (r["params"]["batch"], r["params"]["seq_len"], r["params"]["threshold"]) == cfg]
        return at[0]

    eager = lesson.eager_host(results, P)
    entry = host("ngram_match", P)
    assert eager["entry_host"] == pytest.approx(entry["host_ms"] * 1e3)
    assert eager["entry_gpu"] == pytest.approx(entry["ms"] * 1e3)
    assert eager["entry_host"] > eager["entry_gpu"]  # "still mostly the host's"
    # the rule is chosen on the GPU clock: at the long rows under a budget it runs step 12, the faster there
    assert step_for_shape(*lesson.HEADLINE[:2], NgramConfig(threshold=lesson.HEADLINE[2])) is step12_skip_refused
    assert host("step12", lesson.HEADLINE)["ms"] < host("step08", lesson.HEADLINE)["ms"]


def test_rule_misses_are_every_case_where_a_step_beats_the_entry_point_by_over_3_percent():
    """The page's count of cases where one of steps 6 to 12 beats the entry point by more than 3% on the GPU clock
    covers every case (synthetic and real text) that times the entry point, and each ratio is the file's own."""
    from studylog.plotting import load_results

    results = load_results("ngram", gpu="nvidia-h200")
    misses, compared = lesson.rule_misses(results)
    raw = {}
    for r in results.rows:
        p = r["params"]
        if r.get("clock") == "gpu" and (r["series"] == "ngram_match" or r["series"] in
                                        {f"step{n:02d}" for n in range(6, 13)}):
            key = (p.get("corpus"), p["batch"], p["seq_len"], p["threshold"])
            raw.setdefault(key, {})[r["series"]] = r["ms"]
    cases = {k: v for k, v in raw.items() if "ngram_match" in v and len(v) > 1}
    assert compared == len(cases) >= 17
    want = []
    for k, v in cases.items():
        steps = {s: ms for s, ms in v.items() if s != "ngram_match"}
        fastest = min(steps, key=steps.get)
        if v["ngram_match"] > 1.03 * steps[fastest]:
            want.append(k + (int(fastest[4:]), v["ngram_match"] / steps[fastest]))
    assert misses == sorted(want, key=lambda m: -m[5])
    assert len(misses) <= 1 and all(m[5] < 1.04 for m in misses)  # the committed run: at most one, by under 4%


def test_the_page_shows_one_table_of_steps():
    """The page shows one table of steps (:func:`lesson.the_steps_table`), once, under "The steps, measured", with
    no fold of every case beside it; every step but step 2 (one thread, too slow on long rows: "–") is timed at the
    stress case."""
    import json
    import re

    from studylog import paths

    results = load_results("ngram")
    for number in range(2, 13):
        assert (_file_ms(results, number, lesson.RESULT_CASE) is None) == (number == 2), number
    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    at = [i for i, t in enumerate(text) if "lesson.the_steps_table(results)" in t]
    assert len(at) == 1 and text[at[0] - 1].startswith("## The steps, measured")
    assert not any(re.search(r"steps_tables\(|(?<!the_)steps_table\(|every_case", t) for t in text)


def test_why_it_matters_weighs_the_lookup_against_acceptance():
    """The lookup's share of a decoding step is read against the acceptance measured on real text: the page's own
    drafts (accepted of drafted, per active slot) bound the gain, and the share is taken out of it."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    why = "".join(next(c for c in cells if c.get("id") == "cell-03")["source"])
    assert '"accepted_tokens"' in why and '"active_slots"' in why and "What acceptance does to the payoff" in why
    # the shares are said once: one open table, a row a lookup (the CPU path, the port, ours), with the bound
    table = why[why.index("rows = ["):]
    for row in ('("CPU path (step 1)", a["cpu"]', '("our FastDeploy port (step 4)", a["port"]',
                '("ours (`ngram_match`), GPU clock", a["gpu"]'):
        assert row in table, row
    # and ours as a reader calls it, from the end-to-end run "Where we lose" quotes, so the two sections agree
    assert "lesson.entry_end_to_end()" in table and "ours as a reader calls it ({as_called:.1f} µs" in table
    assert "as_called / (step_us + as_called)" in table
    assert "net(share)" in table and "fold_table" not in why
    prose = why[:why.index("rows = [")]
    assert "a['cpu']" not in prose and "a['gpu']" not in prose and "a['port']" not in prose
    lead = "".join(next(c for c in cells if c.get("id") == "cell-01")["source"])
    assert "price['cpu']" not in lead and "price['port']" not in lead  # the lead gives no share either


def test_the_result_leads_with_the_deployed_budget_then_the_stress_case():
    """The rival is named in the result's first sentence: no library runs the operator on the GPU, so it is our
    corrected port of FastDeploy's revision (step 4). The answer leads with the deployed budget's shape where a step
    is priced (32 × 512, budget 128), its ratio and the time it saves a decoding step, then the stress case, the
    shape where the most slots search (512 × 16384, no budget, every active slot); then, in the same paragraph, why
    the table's larger ratios are larger, without repeating them: long rows under the budget, with how many of its
    128 slots the budget lets search (:func:`lesson.budget_walk`, as the results page counts them) while step 4
    searches every active slot, and the few long slots, one block each in step 4 ("Why it matters" gives the payoff
    speculation caps). The page's opening names the entry point once and says the same order: the port already
    removes the CPU cost, ours saves under 0.1% of a step there, and the stress case's ratio."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    code = "".join(next(c for c in cells if c.get("id") == "cell-34")["source"])
    first = code[code.index('say(f"""'):code.index("gpu_table, end_to_end")]
    opening = first.split("\n", 1)[1]
    assert opening.startswith("No library runs this operator on the GPU")
    lead = " ".join(opening.split())  # one paragraph: the deployed budget, the stress case, then the other shapes
    assert "the rival is step 4, our corrected port of FastDeploy's revision" in lead
    assert lead.index("ratios[P]") < lead.index("a['port_us']") < lead.index("ratios[many]")  # deployed, then stress
    assert "lesson.active_slots(results, many)" in lead
    assert lead.index("ratios[many]") < lead.index("walk['searched']") < lead.index("16 long slots, each one block")
    assert "lesson.active_slots(results, lesson.HEADLINE)" in lead
    assert "many = (512, 16384, NO_BUDGET)" in code and "walk = lesson.budget_walk(results, lesson.HEADLINE)" in code
    assert "ratios[lesson.HEADLINE]" not in lead and "min(short)" not in lead  # the table's ratios, not said again
    top = "".join(next(c for c in cells if c.get("id") == "cell-01")["source"])
    said = top[top.index('say(f"""'):]
    assert "already removes most of the CPU path's cost" in said and "under 0.1%" in said
    assert said.index("lead[P]") < said.index("lead[L]") and "stress case" in said
    assert "our entry point, `ngram_match`," in said  # named once, where the page first gives it
    assert "per_slot" not in code  # the payoff speculation caps is said once, in "Why it matters"
    assert "would not fit" not in opening  # the saving priced where the step is priced
    assert "display(Markdown(gpu_table))" in code and "display(Markdown(end_to_end))" in code  # then the CPU loop
    results = load_results("ngram")
    from studylog.ngram import NO_BUDGET

    many = (512, 16384, NO_BUDGET)
    ratios = lesson.rival_ratios(results)
    # the lead shape has the most slots searching of the shapes measured with no budget short of the largest
    assert many in ratios and lesson.active_slots(results, many) > 0.8 * many[0]
    walk = lesson.budget_walk(results, lesson.HEADLINE)
    assert walk["searched"] < lesson.active_slots(results, lesson.HEADLINE) <= lesson.HEADLINE[0]
    from book import results as book_results

    card = results.path.parent
    assert book_results.ngram_searching(card) == walk["searched"]  # the results page counts them the same way


def test_the_budgeted_floor_says_what_it_counts():
    """Where the budget lets fewer slots search than are active and their bytes would set the floor (the headline
    case), the table divides by the floor of what the operator must read: the haystacks of the slots the budget lets
    search, read once, or an empty kernel where larger (there: one slot, under an empty kernel), and the "× floor"
    head says so; at the other cases it is the book's floor. Where that floor is an empty kernel's, the budget path's
    open table has no "× floor" column: its caption says once that every row is launch-bound. "Why it matters"
    prices the step against the GPU rival (step 4) as well as the CPU path."""
    import json

    from studylog import paths

    results = load_results("ngram")
    from book.common import floor_ms, latency_floor_ms
    from studylog.ngram.batches import haystack_bytes
    from studylog.ngram.models import searching_slots

    walk = lesson.budget_walk(results, lesson.HEADLINE)
    assert walk["searched"] == 1 < lesson.active_slots(results, lesson.HEADLINE)
    inputs, this_time, config = lesson._bench_batch(results, lesson.HEADLINE)
    one = [(step + prompt_len) * 8 for b, step, prompt_len in searching_slots(inputs, config, this_time)
           if b == next(t for t in _trace(inputs, this_time, config) if t["searched"])["slot"]]
    assert walk["bytes"] == one[0] < haystack_bytes(inputs, this_time, config)
    empty = latency_floor_ms(results) * 1e3
    assert lesson.table_floor_us(results, lesson.HEADLINE) == pytest.approx(floor_ms(results, one[0]) * 1e3) == empty
    assert lesson.floor_us(results, lesson.HEADLINE) > 5 * empty  # the book's floor counts every active slot
    label = "is an empty kernel's time: the budget lets only 1 slot search, and reading its haystack takes less"
    assert lesson.floor_words(results, lesson.HEADLINE) == label
    floor = next(r for r in _cells(lesson.the_steps_table(results)) if r[0] == "floor")
    assert floor[2 + 2 * lesson.STEPS_CASES.index(lesson.HEADLINE)] == f"{empty:,.2f} (an empty kernel)"
    for cfg in lesson.TABLE_CASES:
        if cfg != lesson.HEADLINE:
            assert lesson.table_floor_us(results, cfg) == lesson.floor_us(results, cfg), cfg
    assert lesson.launch_bound(results, lesson.HEADLINE) and not lesson.launch_bound(results, lesson.RESULT_CASE)
    cells = ["".join(c["source"]) for c in
             json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]]
    why = next(i for i, t in enumerate(cells) if t.startswith("## Why it matters"))
    assert "us(4, batch, seq_len, threshold)" in cells[why + 1] and "port_us" in cells[why + 1]


def _trace(inputs, this_time, config) -> list[dict]:
    """The specification's trace of one batch: a dict per slot (which searched, where it matched)."""
    import torch

    draft = torch.zeros((inputs.batch, config.max_draft_tokens + 1), dtype=torch.int64)
    trace: list = []
    ngram.reference_ngram_match(inputs, draft, this_time, config, trace=trace)
    return trace


def test_each_step_gives_one_number_at_its_paths_case():
    """Steps 3 to 7 give their number at the headline case, the table's first column (32 × 512, budget 128: index 0
    of :data:`lesson.TABLE_CASES` and of :data:`lesson.STEPS_CASES`); step 1 at the stress case
    (:data:`lesson.RESULT_CASE`); the budget path's (8 to 12) at the long rows under the budget
    (:data:`lesson.HEADLINE`, index 1): step 2, not timed at the stress case, gives its time there; steps 3 to 7
    their factor at their case with their time; 6a, in step 6's section, its loss at the long rows; the budget
    path's paragraph what it buys in all there and what steps 10 to 12 gain there, no other case; no paragraph points
    to "the table" for a second number."""
    import json
    import re

    from studylog import paths

    assert lesson.BOEHM_CASES[1] == lesson.HEADLINE and lesson.TABLE_CASES[2] == lesson.RESULT_CASE
    cells = {c.get("id"): "".join(c["source"]) for c in
             json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]}
    assert "L, H, P = lesson.RESULT_CASE, lesson.HEADLINE, (32, 512, 128)" in cells["cell-01"]
    assert "us(2, *H)" in cells["cell-12"]
    assert lesson.TABLE_CASES[0] == lesson.STEPS_CASES[0] == (32, 512, 128)
    assert "row_factor(results, 3, H)" in cells["cell-16"]  # and at step 2's case
    for cid, step in (("cell-16", 3), ("cell-19", 4), ("cell-s5-say", 5), ("cell-s6-say", '"6b"'),
                      ("cell-s7-say", 7)):
        said = cells[cid]
        number = 6 if step == '"6b"' else step
        assert f"row_factor(results, {step}, P)" in said and f"us({number}, *P)" in said, step
        assert f"us({number}, *L)" not in said and "step_factors(" not in said, step
    assert 'lesson.row_factor(results, "6a", H)' in cells["cell-s6-say"]  # 6a: its loss where the split pays
    path = cells["cell-s8-say"]  # the budget path: what it buys at its case, the table's one row
    assert "budget_path_table(" not in path and "six / twelve" in path
    for cid in ("cell-09", "cell-12", "cell-16", "cell-19", "cell-s5-say", "cell-s6-say", "cell-s7-say",
                "cell-s8-say"):
        said = cells[cid]
        assert "× in the table" not in said, cid
        assert not re.search(r"us\(\d+, \d", said), cid  # a case by name, never typed
    assert not re.search(r"step_factors\(|row_factor\(results, \w+, [LP]\)|\*[LP]\)", path)  # only the path's case


def test_the_operation_works_the_budget_on_four_slots_and_the_excerpts_name_their_variables():
    """"The operation" shows the budget on a small batch, walked by the specification (its trace), in a hidden
    cell: every slot keeps its wants until the first slot where the budget bites (slot 2, as step 4 says), which gets
    its room; `sum` is the exclusive prefix sum of `T` plus the base up to there; the counts are the serial rule's
    (exercise 3's). Steps 4 and 6 say in the line above it what their listing is; the result says how far real
    text moves the times, from the file."""
    import json

    from book.ngram import exercises
    from studylog import paths

    wants, threshold = lesson.BUDGET_EXAMPLE
    rows = lesson.budget_example()
    first = next(r["slot"] for r in rows if r["drafted"] < r["wants"])
    assert first == 2 and 2 <= rows[first]["room"] == rows[first]["drafted"]
    assert all(r["drafted"] == 0 for r in rows[first + 1:])
    assert all(r["before"] + 1 == r["sum"] and r["room"] == threshold - r["sum"] - r["left"] for r in rows[:first + 1])
    n = len(wants)
    assert [1 + r["drafted"] for r in rows] == exercises.sequential_budget(threshold, ["active"] * n, [True] * n,
                                                                           [1] * n, list(wants))
    assert "(the budget bites)" in lesson.budget_example_table().splitlines()[2 + first]
    cells = {c.get("id"): c for c in
             json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]}
    ex = cells["cell-budget-example"]
    assert "lesson.budget_example_table()" in "".join(ex["source"]) and "remove-input" in ex["metadata"]["tags"]
    assert ex["metadata"]["jupyter"]["source_hidden"]
    step4, step6 = "".join(cells["cell-17"]["source"]), "".join(cells["cell-s6-md"]["source"])
    assert "slots 0 to 2 in [the table](#the-operation)" in step4
    assert "Its core, for a block of slots" in step4 and "the bound below" in step6  # the listing under each
    result = "".join(cells["cell-34"]["source"])
    assert "max(lesson.real_text_slower(results))" in result and "(#on-real-text)" in result


def test_the_page_prints_no_exercises_measured_answer():
    """Exercise 5 asks what step 12's stop is worth: no cell of the page computes it (the lab run's variant without
    the stop over step 12, :func:`lesson.exit_factor`); its measured answer lives in the solutions, which the
    notebook does not import."""
    import json

    from book.ngram import solutions
    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "exit_factor(" not in code and "solutions" not in code and "no exit" not in code
    case = (256, 131072, ngram.NO_BUDGET)
    run = lesson.lab_run("step12_changes")
    if run is None:
        pytest.skip("step12_changes was not run on this card")
    assert solutions.no_stop_measured(case) == lesson.exit_factor(run, "step12_changes", case) > 1


def test_the_end_to_end_table_is_one_run_with_its_own_cpu_loop():
    """End to end, the page shows one run: the separate run of ``ngram_match`` as a reader calls it, open under the
    GPU-clock table, with its own CPU loop and the step bound once, every ratio within it; its caption says it ran on
    another host and names both hosts' loop times at its first case, so one loop never reads as two times. The
    benchmark's own end-to-end rows (step 12 bound once, beside the benchmark host's CPU loop) are not on the page:
    one CPU loop per run, the benchmark's in the table of steps' footnote."""
    from book.ngram import results as book_results

    results = load_results("ngram")
    gpu, end_to_end = lesson.result_tables(results, book_results.headline(results))
    assert gpu.startswith("**On the GPU clock**") and "CPU loop" not in gpu and "(runs " not in gpu
    assert end_to_end is not None and "<details>" not in end_to_end
    intro, table = lesson.entry_end_to_end_table(results=results)
    assert end_to_end == intro + "\n\n" + table
    case, v = next(iter(lesson.entry_end_to_end().items()))
    here = lesson.grid_row(results, ngram.CHAPTER.step(1).series, case)["ms"] * 1e3
    said = (f"This table comes from another host, whose CPU runs the loop in {v['cpu_path']['ms'] * 1e3:,.1f} µs at "
            f"{case[0]} × {case[1]} (the table of steps' host: {here:,.1f} µs); its ratios divide its own times.")
    assert said in intro
    assert "another host" not in lesson.entry_end_to_end_table()[0]  # without the benchmark, no host comparison
    assert "step 12, end to end" not in end_to_end and "`NgramMatcher`" not in end_to_end  # no class name in prose
    head = table.splitlines()[0]
    assert head.startswith("| case | CPU loop | `ngram_match` |") and "the step bound once" in head
    # the benchmark's CPU loop (the footnote) is not this run's: the page says which is which, never both as one
    footnote = lesson.the_steps_table(results).split("\n\n")[1]
    for (b, s_, t), v in lesson.entry_end_to_end().items():
        cpu = v["cpu_path"]["ms"] * 1e3
        assert f"{cpu:,.1f}" not in footnote


def test_the_entry_points_own_run_divides_its_columns():
    """The separate run of ``ngram_match`` as a reader calls it: one row a headline case, each ratio the CPU loop's
    time over the column beside it, as the table prints them (to the rounding of the ratio)."""
    from book.ngram import lesson

    entry = lesson.entry_end_to_end_table()
    assert entry is not None, "lab/ngram/results/nvidia-h200/entry_end_to_end.json is committed"
    intro, table = entry
    assert "as a reader calls it" in intro
    rows = [ln.split(" | ") for ln in table.splitlines()[2:]]
    assert len(rows) == 3
    for cells in rows:
        cpu, entry_us, ratio, bound, ratio_bound = (float(c.strip(" |×").replace(",", "")) for c in cells[1:])
        for num, den, shown in ((cpu, entry_us, ratio), (cpu, bound, ratio_bound)):
            assert f"{num / den:,.2f}" == f"{shown:,.2f}", cells  # the ratio of the times as shown
