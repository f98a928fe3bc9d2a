"""Chapter 2 as a lesson (CPU): the exercises' checks accept the solutions and reject planted mistakes; the
notebook's glued numbers and tables read both the first (do_bench) results and the one-clock benchmark's series
(from lab/, as the next committed file will hold them), saying 'pending' where a file lacks a series; the figures
keep to three panels, one colour per series and readable text."""

import json
import math
import re

import numpy as np
import pytest
import torch

from book.masked_lm_head import exercises, figures, lesson, solutions
from studylog import masked_lm_head as mlh
from studylog import plotting
from studylog.paths import REPO_ROOT
from studylog.plotting import Results, load_lab

NOTEBOOK = REPO_ROOT / "notebooks" / "02_masked_lm_head.ipynb"


def _notebook_cells() -> list[dict]:
    return json.loads(NOTEBOOK.read_text())["cells"]


# --------------------------------------------------------------------------------------
# Exercises
# --------------------------------------------------------------------------------------

def test_the_checks_accept_the_solutions(capsys):
    assert exercises.check_active_fraction(solutions.active_fraction)
    assert exercises.check_union_ids(solutions.union_from_bitmask)
    assert exercises.check_masked_logits(solutions.masked_logits_rows)
    assert exercises.check_compact_threshold(solutions.compact_threshold)
    assert exercises.check_rows_first(solutions.rows_first)
    assert exercises.check_masked_logits(solutions.fill_then_rows)
    assert capsys.readouterr().out.count("agree") == 6


def test_rows_first_keeps_step_6s_launch_and_changes_only_the_order():
    """The answer to exercise 6 is step 6's kernel with the two branches' program numbers swapped: the text differs,
    it no longer tests n_fill, and it still defines the kernel step06_matcher launches."""
    original = exercises.step06_source()
    mine = solutions.rows_first(original)
    assert mine != original and "pid >= n_fill" in original and "pid >= n_fill" not in mine
    assert f"def {exercises.STEP06_KERNEL}(" in mine and "n_rows = tl.cdiv(n_ids, BLOCK_V)" in mine


def _fill_programs_shifted(source):
    """A planted mistake: rows first, but the fill programs numbered one block too far (the first block unwritten)."""
    return solutions.rows_first(source).replace("allowed_ptr, pid, n_rows, V", "allowed_ptr, pid + 1, n_rows, V")


def test_the_library_passes_the_checks_too(capsys):
    """The chapter's own kernels honour exercise 3's contract; its union count agrees with exercise 2."""
    def head(h, weight, allowed, out):
        return (mlh.step07_stream if h.shape[0] == 1 else mlh.step10_batched)(h, weight, allowed, out=out)

    assert exercises.check_masked_logits(head, cases=8)
    gen = np.random.default_rng(0)
    mask = torch.from_numpy(gen.random((3, 250)) < 0.1)
    packed = mlh.pack_bitmask(mask)
    union = solutions.union_from_bitmask(packed.numpy(), 250)
    assert mlh.AllowedTokens.from_bitmask(packed, 250).union_count == union.size


def _with_replacement(n, vocab, block):
    """A planted mistake: ids drawn with replacement, and every block taken as full."""
    return 1 - (1 - block / vocab) ** n


def _padding_kept(bitmask, vocab):
    """A planted mistake: the bits past the vocabulary are read as tokens."""
    words = np.bitwise_or.reduce(bitmask, axis=0).view(np.uint32)
    return np.flatnonzero(((words[:, None] >> np.arange(32, dtype=np.uint32)) & 1).reshape(-1))


def _bf16_logits(h, weight, allowed, out):
    """A planted mistake: the logits rounded to bf16 before they reach the fp32 output."""
    return out.copy_((h @ weight.t()).float().masked_fill(~allowed.mask, float("-inf")))


def _last_win_anywhere(points, vocab):
    """A planted mistake: the largest winning union, even above a loss."""
    if all(c <= d for _, c, d in points):
        return 1.0
    return max((u for u, c, d in points if c <= d), default=0) / vocab


@pytest.mark.parametrize("check, wrong, says", [
    (exercises.check_active_fraction, _with_replacement, "expected"),
    (exercises.check_active_fraction, lambda n, v, b: "0.5", "got '0.5'"),
    (exercises.check_union_ids, _padding_kept, "bits past vocab set"),
    (exercises.check_union_ids, lambda bm, v: np.arange(v), "ids returned"),
    (exercises.check_masked_logits, _bf16_logits, "outside the fp32 bound"),
    (exercises.check_masked_logits, lambda h, w, a, out: out, "NaN left in out"),
    (exercises.check_masked_logits, lambda h, w, a, out: out[:, :-1], "shape"),
    (exercises.check_compact_threshold, _last_win_anywhere, "points (sorted)"),
    (exercises.check_rows_first, lambda source: source, "unchanged"),
    (exercises.check_rows_first, lambda source: source + "\n# rows first\n", "still test n_fill"),
    (exercises.check_rows_first, _fill_programs_shifted, "differ from step 6's"),
    (exercises.check_rows_first, lambda source: solutions.rows_first(source) + "(", "SyntaxError"),
])
def test_the_checks_reject_a_planted_mistake_and_say_where(check, wrong, says, capsys):
    assert not check(wrong)
    out = capsys.readouterr().out
    assert "wrong:" in out and says in out


def test_exercise_one_is_what_step_one_computes():
    """At the chapter's size (a multiple of the block) the exercise's answer is the notebook's formula."""
    n, vocab, block = 1000, mlh.VOCAB, 64
    log_idle = (math.lgamma(vocab - block + 1) - math.lgamma(vocab - block - n + 1) - math.lgamma(vocab + 1)
                + math.lgamma(vocab - n + 1))
    assert solutions.active_fraction(n, vocab, block) == pytest.approx(1 - math.exp(log_idle), rel=1e-9)


def test_exercise_four_is_the_dispatch_rule():
    """On the one-clock run, the exercise's threshold per batch size is the library's rule."""
    results = _one_clock()
    rule = mlh.dispatch.rule_from_results(results)
    for batch, fraction in rule.compact_max_fraction.items():
        points = [(q["union"], q["compact"], q["dense"])
                  for (b, _), qs in mlh.dispatch.crossover_points(results.rows).items() if b == batch for q in qs]
        assert solutions.compact_threshold(points, mlh.VOCAB) == pytest.approx(fraction)


# --------------------------------------------------------------------------------------
# Glued numbers and tables
# --------------------------------------------------------------------------------------

def _on_card(gpu: str, name: str) -> Results:
    """A lab run, placed at its card's benchmark file: the floor takes the card's fastest empty kernel from there."""
    return Results(plotting.load_results("masked_lm_head", gpu).path, load_lab("masked_lm_head", name, gpu))


def _one_clock() -> Results:
    return _on_card("nvidia-h100-80gb-hbm3", lesson.FIRST_ONE_CLOCK_FILE)


def _first_run() -> Results:
    return _on_card(lesson.CANDIDATES_GPU, lesson.CANDIDATES_FILE)


def test_prose_numbers_on_the_one_clock_series():
    """The H100 run has every series but steps 5, 6 and 9 (it predates them): only the numbers that need one of those
    say 'pending'."""
    numbers = lesson.prose_numbers(_one_clock())
    pending = [k for k, v in numbers.items() if v == lesson.PENDING]
    assert pending and all(any(f"step{n:02d}" in k for n in (5, 6, 9)) for k in pending), pending
    assert numbers["mlh_clock"] == "GPU clock"
    for key in ("mlh_step04_vs_step03", "mlh_step02_vd", "mlh_step10_b64_vs_dense"):
        assert numbers[key].endswith("faster"), (key, numbers[key])
    assert numbers["mlh_step02_dv"].endswith("slower")
    assert numbers["mlh_plan_vs_xgr_b1"].endswith("×") and numbers["mlh_host_ratio"].endswith("×")
    # the points where a series of ours loses, each counted once however many rivals beat it there
    lost, points = lesson.losses(_one_clock().rows), int(numbers["mlh_losses"])
    counts = lesson.loss_counts(_one_clock())
    assert 0 < points <= counts["rows"] and len(lost) == counts["rows"] + counts["ties"]
    assert int(numbers["mlh_losses_step12"]) + int(numbers["mlh_losses_plan"]) == points


def test_prose_numbers_on_the_first_run_say_pending_where_it_lacks_a_series():
    numbers = lesson.prose_numbers(_first_run())
    assert numbers["mlh_clock"] == "do_bench"
    assert numbers["mlh_plan_vs_xgr_b1"] == numbers["mlh_host_dispatch"] == lesson.PENDING
    assert numbers["mlh_step04_vs_step03"].endswith("faster")
    assert lesson.practitioners_table(_first_run()).startswith(lesson.PENDING)


@pytest.mark.parametrize("which", ["one_clock", "first_run"])
def test_tables_are_markdown_tables(which):
    results = _one_clock() if which == "one_clock" else _first_run()
    candidates = load_lab("masked_lm_head", lesson.CANDIDATES_FILE, lesson.CANDIDATES_GPU)
    for table in (lesson.steps_table(results), lesson.batch_table(results), lesson.losses_table(results),
                  lesson.tried_table(results, candidates), lesson.tried_table(results, None)):
        lines = table.splitlines()
        assert lines[0].startswith("| ") and set(lines[1]) <= set("|-"), table[:200]
        assert all(line.count("|") == lines[0].count("|") for line in lines), table
    assert len(lesson._losses(results)) == len(lesson.losses(results.rows))


def test_the_byte_floor_is_rows_and_output():
    results = _one_clock()
    bw = results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9
    assert lesson.byte_floor_ms(results, 2, 10) == pytest.approx((10 * mlh.HIDDEN * 2 + 2 * mlh.VOCAB * 4) / bw * 1e3)


def test_the_committed_file_reads():
    """Whatever results are committed (the first run, or a newer one-clock run), every glued key has a value."""
    if not plotting.result_files("masked_lm_head"):
        pytest.skip("no committed results")
    numbers = lesson.prose_numbers(plotting.load_results("masked_lm_head"))
    assert all(isinstance(v, str) and v for v in numbers.values())


# --------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["one_clock", "first_run"])
def test_figures_three_panels_one_colour_per_series_readable_text(which):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = _one_clock() if which == "one_clock" else _first_run()
    figs = figures.figures(results)
    assert "speedup_b1" in figs  # the book's teaser
    if which == "one_clock":
        assert set(figs) == {"speedup_b1", "layout", "batched", "practitioners", "host"}
    labels = {mlh.CHAPTER.label(s): s for s in figures.SERIES_COLORS} | {v: k for k, v in figures.PLAIN_NAMES.items()}
    for name, fig in figs.items():
        axes = [ax for ax in fig.axes if ax.get_visible() and ax.has_data()]
        assert len(axes) <= 3, name
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
        for legend in legends:
            assert all(t.get_fontsize() >= 9 for t in legend.get_texts()), name
        for ax in axes:
            # a speedup on a log axis says so in its label
            assert ax.get_yscale() == "linear" or "log scale" in ax.get_ylabel() or "speedup" not in ax.get_ylabel(), name
            for line in ax.get_lines():
                series = labels.get(line.get_label())
                if series is not None:
                    assert matplotlib.colors.same_color(line.get_color(), figures.series_color(series)), (name, series)
        plt.close(fig)
    colours = [c for s, c in figures.SERIES_COLORS.items() if s != "floor"]
    assert len(colours) == len(set(colours)), "two series share a colour"


@pytest.mark.parametrize("which", ["one_clock", "first_run"])
def test_the_speedup_figure_divides_by_the_strong_rival_and_its_footnote_is_short(which):
    """The speedup figure divides by the strong rival, index_select + matmul given the ids (the weak rival, cuBLAS's
    dense fp32 logits + masked_fill, is one of its lines): its title names the divisor; each line's points are the
    rival's time over the step's at the same count; its footnote is at most three lines, each short enough not to
    wrap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = _one_clock() if which == "one_clock" else _first_run()
    fig = figures.figures(results)["speedup_b1"]
    title = fig._suptitle.get_text()
    assert title.startswith("Each step's speedup over index_select + matmul given the allowed ids")
    if which == "one_clock":  # the committed run: the step-5 line's points, the rival's time over step 5's, by hand
        committed = plotting.load_results("masked_lm_head")
        rival = {r["params"]["allowed"]: r["ms"] for r in committed.select("index_select", batch=1, kind="random")
                 if r["params"].get("layout", "vd") == "vd"}
        step5 = {r["params"]["allowed"]: r["ms"] for r in committed.select("step05", batch=1, kind="random")
                 if r["params"].get("layout", "vd") == "vd" and r["params"]["allowed"] in rival}
        real = figures.figures(committed)["speedup_b1"]
        drawn = [c for ax in real.axes for c in ax.containers if c.get_label().startswith("step 5:")]
        assert len(drawn) == 1 and len(step5) >= 3
        xs, ys = drawn[0].lines[0].get_data()
        assert list(xs) == sorted(step5) and all(abs(y - rival[x] / step5[x]) < 1e-9 for x, y in zip(xs, ys))
        plt.close(real)
    (foot,) = [t.get_text() for t in fig.texts if t is not fig._suptitle]
    assert len(foot.splitlines()) <= 3 and all(len(line) <= 150 for line in foot.splitlines()), foot
    assert "weak rival" not in foot
    plt.close(fig)


def _ms_at(results, number: int, params: dict) -> dict | None:
    """Step ``number``'s row of the run at ``params`` (our kernels on [V, D]), looked up here, not by the lesson."""
    found = [r for r in results.select(f"step{number:02d}", **params) if r["params"].get("layout", "vd") == "vd"]
    return found[0] if found else None


def _params(number: int) -> dict:
    """The case of step ``number``'s row in the table of steps, by hand: steps 0 to 7 at the main case, each later
    step at its own."""
    return lesson.MAIN_CASE if number <= 7 else lesson.STEP_CASES[number][0]


def _expected_base(number: int):
    """What step ``number``'s row is set against, by hand: in steps 0 to 7 the kept step above it (step 6, tried, and
    step 7 both against step 5), after them the step it builds on at its own case (13: xgrammar's path)."""
    if number <= 7:
        kept = [n for n in range(number) if n not in lesson.TRIED]
        return kept[-1] if kept else None
    return lesson.STEP_CASES[number][1]


def _blocks(results) -> list[str]:
    """The blocks of the table of steps 0 to 7: caption, table, rivals' sentence."""
    blocks = lesson.main_steps_table(results).split("\n\n")
    assert len(blocks) == 3, blocks
    return blocks


def _chain_rows(results) -> list[list[str]]:
    """The cells of the rows of the table of steps 0 to 7, each ``[step, change, µs, × previous, × floor]``: one
    case, named once in the caption."""
    caption, table, _ = _blocks(results)
    assert caption.startswith(f"**Steps 0 to 7 at one case: {lesson._case(lesson.MAIN_CASE)} allowed tokens** (µs, "
                              "GPU clock")
    assert table.splitlines()[0] == lesson.CHAIN_HEADER
    assert lesson.CHAIN_HEADER == "| step | the one change | µs | × previous | × the card's floor |"
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in table.splitlines()[2:]]
    assert all(len(r) == 5 for r in rows), rows
    return rows


def _all_rows(results) -> list[list[str]]:
    """The cells of every row of the two tables of steps, each ``[step, change, case, µs, ×, × floor]`` (the rows of
    steps 0 to 7 with their one case, which their table's caption names, put in)."""
    caption, table = lesson.later_steps_table(results).split("\n\n")
    assert caption.startswith("**Steps 8 to 13, each at the case its idea is about** (µs, GPU clock")
    assert table.splitlines()[0] == lesson.LATER_HEADER
    assert lesson.LATER_HEADER == "| step | the one change | case | µs | × the step it builds on | × its floor |"
    later = [[c.strip() for c in r.split("|")[1:-1]] for r in table.splitlines()[2:]]
    assert all(len(r) == 6 for r in later), later
    case = lesson._case(lesson.MAIN_CASE)
    return [r[:2] + [case] + r[2:] for r in _chain_rows(results)] + later


def _rows(results) -> list[list[str]]:
    """The rows timed at one case (step 12, over every case, left out)."""
    return [r for r in _all_rows(results) if r[0] != "12"]


def _kept(results) -> dict[str, list[str]]:
    """The kept steps' rows timed at one case, by number."""
    return {r[0]: r for r in _rows(results) if int(r[0]) not in lesson.TRIED}


def test_the_steps_are_two_tables_every_step_a_row_with_its_case():
    """Two tables of steps hold every step once, in order, the tried ones marked "tried, not kept" in their change:
    steps 0 to 7 all at the main case (named once, in the caption), steps 8 to 13 each at its own, named in its row;
    each timed row with its time there (read from the run here), a ratio against a named step (all rows but the first
    and step 13's, which starts from the bitmask) and a time over its floor there, one ratio, never under 1. Step 12,
    the entry point, is not timed at one case: its row says so."""
    results = plotting.load_results("masked_lm_head")
    rows = _all_rows(results)
    assert [int(r[0]) for r in _chain_rows(results)] == list(range(8))
    assert [int(r[0]) for r in rows] == sorted(lesson.MAIN_LINE + lesson.TRIED) == list(range(14))
    for r in rows:
        assert r[1].startswith(f"*{lesson.TRIED_MARK}*") == (int(r[0]) in lesson.TRIED), r
    assert lesson.TRIED_MARK == "tried, not kept:"
    for r in _rows(results):
        params = _params(int(r[0]))
        assert r[2] == lesson._case(params), r
        assert r[3].rstrip(lesson.CAPPED) == lesson.table_us(_ms_at(results, int(r[0]), params)["ms"]), r
    assert rows[0][4] == "–" and rows[13][4] == lesson.STEP13_RATIO
    assert all(re.match(r"\d+\.\d\d× ", r[4]) for r in rows[1:13]), rows
    by = {r[0]: r for r in rows}
    assert by["12"][3] == "–" and by["12"][5] == "–" and by["12"][1] == "the entry point: a dispatch by shape"
    assert "loses at" not in by["12"][4] and "Where we lose" not in by["12"][4]
    overs = [float(r[5].split("×")[0]) for r in _rows(results)]
    # one ratio a cell (step 13's over its chain, which binds there)
    assert all(x >= 1.0 for x in overs) and all("(" not in r[5] for r in rows), overs


def test_a_tie_says_so_in_its_row():
    """A ratio from 0.97× to 1.03× as printed is a tie: its row says "tie" and why the step is kept (a tried step: why
    it is not)."""
    results = plotting.load_results("masked_lm_head")
    for r in _all_rows(results)[1:13]:
        x = float(r[4].split("×")[0])
        assert ("tie" in r[4]) == (0.97 <= x <= 1.03), r
        if "(tie" in r[4] and int(r[0]) in lesson.TRIED:
            assert "not kept: " in r[4], r
    said = {r[0]: r[4] for r in _all_rows(results)}
    for n, why in lesson.KEPT_FOR.items():
        if "(tie" in said[str(n)]:
            assert why in said[str(n)], (n, said[str(n)])
    assert lesson.tie_mark(1.03) and lesson.tie_mark(0.97) and not lesson.tie_mark(1.04) and not lesson.tie_mark(0.96)


def test_step_12_is_the_entry_point_over_every_case():
    """Step 12's row gives its worst and best ratio to the fastest kernel it chooses from at each case measured
    (computed here by hand), over every case; its section says what it runs where."""
    results = plotting.load_results("masked_lm_head")
    rows = [r for r in results.select("step12", layout="vd") if r["clock"] == "gpu"]
    ratios = []
    for r in rows:
        p = {k: v for k, v in r["params"].items() if k != "layout"}
        times = [x["ms"] for s in ("step07", "step08", "step10", "step03", "cublas_fp32_mask")
                 for x in results.select(s, layout="vd", **p) if x["clock"] == "gpu"]
        ratios.append(min(times) / r["ms"])
    row = next(r for r in _all_rows(results) if r[0] == "12")
    assert row[2] == f"all {len(rows)} cases"
    assert row[4].startswith(f"{min(ratios):.2f}× to {max(ratios):.2f}× the fastest kernel it chooses from")
    assert ("(tie" in row[4]) == all(0.97 <= round(x, 2) <= 1.03 for x in ratios)


def test_the_kept_and_the_tried_steps_are_every_step_once():
    """The page keeps the steps that paid where their idea applies and marks the others tried, each step once and in
    order; in the committed run every tried step loses to its base or ties it (step 11, which beats step 3, loses to
    step 7 on its own mask, and its row says by how much), and every kept step from 1 to 10 pays at its own case but
    step 7, which ties step 5 there (the dispatch runs it)."""
    results = plotting.load_results("masked_lm_head")
    numbers = [s.number for s in mlh.CHAPTER.steps]
    assert sorted(lesson.MAIN_LINE + lesson.TRIED) == numbers and not set(lesson.MAIN_LINE) & set(lesson.TRIED)
    assert list(lesson.MAIN_LINE) == sorted(lesson.MAIN_LINE) and list(lesson.TRIED) == sorted(lesson.TRIED)
    by = {int(r[0]): r for r in _rows(results) if int(r[0]) in lesson.TRIED}
    assert sorted(by) == list(lesson.TRIED)
    for n in lesson.TRIED:
        factor = lesson.step_factor(results, n)
        base = lesson.STEP_CASES[n][1]
        assert by[n][4].startswith(f"{factor:.2f}× step {base}"), by[n]
        if n != 11:
            assert lesson.paid_words(factor) != "paid", (n, factor)
    params = lesson.STEP_CASES[11][0]
    seven, eleven = (results.select(f"step{n:02d}", layout="vd", **params)[0]["ms"] for n in (7, 11))
    assert seven < eleven and f"step 7 is {eleven / seven:.2f}× as fast" in by[11][4]
    assert lesson.paid_words(lesson.step_factor(results, 7)) != "did not pay"  # within the course's tie at 10,000
    for n in (1, 2, 4, 5, 8, 10):
        assert lesson.paid_words(lesson.step_factor(results, n)) == "paid", n
    assert lesson.paid_words(0.5) == "did not pay" and lesson.paid_words(1.005) == "no gain"
    assert lesson.paid_words(1.2) == "paid"


def _base_problems(results, rows: list[list[str]]) -> list[str]:
    """What breaks the table's rule: a ratio on the first row; a "×" that is not the named base's time at the row's
    case over its own (the base by hand, :func:`_expected_base`), or a base at another case than its own row's
    without its time in brackets."""
    problems = []
    if rows[0][4] != "–":
        problems.append(f"the first row has a ratio: {rows[0][4]}")
    for r in rows[1:]:
        number = int(r[0])
        params, base = _params(number), _expected_base(number)
        mine = _ms_at(results, number, params)["ms"]
        if isinstance(base, str):
            theirs, name = results.select(base, **params)[0]["ms"], lesson.HEADLINE_RIVAL_WORDS[base]
        else:
            theirs, name = _ms_at(results, base, params)["ms"], f"step {base}"
        if not r[4].startswith(f"{theirs / mine:.2f}× {name}"):
            problems.append(f"step {number}: {r[4]}, not {name} over it ({theirs / mine:.2f}×)")
        if (number > 7 or isinstance(base, str)) and f"{name} ({lesson.table_us(theirs)} µs" not in r[4]:
            problems.append(f"step {number}: {r[4]} lacks {name}'s time at its case")
    return problems


def test_every_step_is_compared_with_a_named_base():
    """Steps 0 to 7 are each compared with the kept step above (6 and 7 with 5), each later one but 13 with its base
    at its own case, the base named in the cell and its time given where its own row is at another case;
    a tampered table breaks the rule (the check can fail)."""
    results = plotting.load_results("masked_lm_head")
    rows = [r for r in _rows(results) if r[0] != "13"]  # step 13 starts from the bitmask: no step is its base
    assert _base_problems(results, rows) == []
    assert lesson.chain_base(results, 0) is None and lesson.chain_base(results, 5) == 4
    assert lesson.chain_base(results, 7) == 5
    assert [n for n in lesson.MAIN_LINE if lesson.STEP_CASES[n][0] != lesson.MAIN_CASE] == [7, 8, 10, 12]
    five = next(r for r in rows if r[0] == "5")[4]
    bumped = f"{float(five.split('×')[0]) + 0.1:.2f}×" + five.split("×", 1)[1]
    wrong = [r[:4] + [bumped] + r[5:] if r[0] == "5" else r for r in rows]
    assert _base_problems(results, wrong)
    wrong = [r[:4] + ["1.00×"] + r[5:] if r[0] == "0" else r for r in rows]
    assert _base_problems(results, wrong)
    ten = next(r for r in rows if r[0] == "10")[4]
    wrong = [r[:4] + [ten.replace("step 3", "step 7")] + r[5:] if r[0] == "10" else r for r in rows]
    assert _base_problems(results, wrong)
    wrong = [r[:4] + [ten.split(" (")[0]] + r[5:] if r[0] == "10" else r for r in rows]
    assert _base_problems(results, wrong)


def test_step_13s_row_has_no_ratio_and_the_result_sets_it_against_xgrammar():
    """Step 13 starts from the grammar's packed bitmask (its copy and the union's build included), step 12 from the
    ids: its row says it is the integration, with no ratio (one against step 12 would read as a regression, one
    against a rival is the result's); no table of steps names xgrammar's path or its time; the result's table gives
    the headline's ratio, and the kernel's."""
    results = plotting.load_results("masked_lm_head")
    params, base = lesson.STEP_CASES[13]
    assert base == mlh.report.XGRAMMAR and params == lesson.MAIN_CASE
    ours, theirs = (results.select(s, **params)[0]["ms"] for s in (mlh.report.PLAN, base))
    twelve = results.select("step12", layout="vd", **params)[0]["ms"]
    row = next(r for r in _rows(results) if r[0] == "13")
    assert row[4] == lesson.STEP13_RATIO and "result" in row[4] and "×" not in row[4]
    assert "xgrammar" not in row[1] and f"{twelve / ours:.2f}×" not in row[1] and "µs" not in row[1]
    assert row[1].startswith("the integration: the whole step from the packed bitmask")
    tables = lesson.main_steps_table(results) + lesson.later_steps_table(results)
    assert "xgrammar" not in tables and f"{theirs * 1e3:.1f}" not in tables and f"{theirs / ours:.2f}×" not in tables
    assert not any(r[0].startswith("13") and r[0] != "13" for r in _all_rows(results))
    first = lesson.result_table(results).splitlines()[2].split("|")
    assert first[7].strip() == f"**{lesson.prose_numbers(results)['mlh_plan_vs_xgr_b1']}** faster"
    assert first[4].strip() == f"**{lesson.compiled_gather_words()[0]}** faster"


def test_the_result_table_gives_the_kernel_alone_and_the_whole_step_at_every_headline_point():
    """One row per headline point: step 13 against xgrammar's path at each; step 12 against its strongest rival,
    torch.compile's fused gather, where the committed lab run timed it (batch 1, both times from that run), and no
    kernel cells elsewhere (no weaker rival stands in); each ratio computed here by hand (a tie within TIE, a loss said
    as slower). Those rivals are graph-replayed, not launched eagerly: the header does not call them eager."""
    results = plotting.load_results("masked_lm_head")
    table = lesson.result_table(results)
    header, _, *lines = table.splitlines()
    assert "eager" not in header and "not timed" not in table and "weaker" not in table
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in lines]
    assert [int(r[0]) for r in rows] == [b for b, _, _ in lesson.HEADLINE_POINTS]
    compiled = lesson.compiled_gather_times("compiled_gather")

    def said(theirs, ours):
        x = theirs / ours
        return (f"**{x:.2f}×** faster" if x > 1 + lesson.TIE else "a tie" if lesson.tied(theirs, ours)
                else f"{1 / x:.2f}× slower")

    for r, (batch, kind, allowed) in zip(rows, lesson.HEADLINE_POINTS):
        p = dict(batch=batch, kind=kind, allowed=allowed)
        if batch == 1:
            mine, rival = compiled[allowed]
            assert r[1:4] == [lesson.table_us(mine), lesson.table_us(rival), said(rival, mine)], r
        else:
            assert r[1:4] == ["–", "–", "–"], r
        whole, xgr = (results.select(s, **p)[0]["ms"] for s in (mlh.report.PLAN, mlh.report.XGRAMMAR))
        assert r[4:] == [lesson.table_us(whole), lesson.table_us(xgr), said(xgr, whole)], r
    cell = next(t for c in _notebook_cells() if "lesson.result_table(results)" in (t := "".join(c["source"])))
    assert "at batch 1 only" in cell


def test_the_result_says_what_of_the_whole_steps_lead_any_gather_would_get():
    """The result says that most of the whole step's lead is not computing the other logits, which any gather from the
    same bitmask skips too, and that no such path was timed (no number made up for it)."""
    cell = next("".join(c["source"]) for c in _notebook_cells() if c.get("id") == "cell-40-lead")
    text = " ".join(cell.split())
    assert "any gather from the same bitmask would skip too" in text and "was timed" not in text.replace(
        "No such path (the bitmask's copy, the union's ids, then a gather) was timed", "")
    assert "is not measured" in text and "{mlh.VOCAB - 1000:,}" in text


def test_the_dense_rival_at_batch_1_is_cublas_fp32():
    """Under the table the rivals at the main case are said, the dense one cuBLAS with fp32 output (the chapter's
    contract, steady), and the prose's step 0 ratio is its time over step 0's, computed here by hand."""
    results = plotting.load_results("masked_lm_head")
    said = _blocks(results)[-1]
    params = lesson.MAIN_CASE
    fp32 = results.select("cublas_fp32_mask", layout="vd", **params)[0]["ms"]
    index = results.select("index_select", **params)[0]["ms"]
    assert said.startswith("Rivals at that case: cuBLAS's fp32 logits") and "bf16" not in said
    assert f", {fp32 * 1e3:.1f} µs (" in said and f"`index_select` + matmul, given the ids, {index * 1e3:.1f} µs" in said
    step0 = results.select("step00", layout="vd", **params)[0]["ms"]
    assert lesson.prose_numbers(results)["mlh_step00_vs_fp32"] == f"{fp32 / step0 - 1:.0%} faster"


def test_at_least_is_the_smallest_ratio_and_names_its_point():
    """Step 12 against cuBLAS's dense fp32 logits + masked_fill up to 1,000 allowed at batch 1: 'at least' is the
    smallest ratio of the points measured, and the prose names the point that gives it."""
    results = plotting.load_results("masked_lm_head")
    numbers = lesson.prose_numbers(results)
    ratios = {}
    for r in results.select("step12", batch=1, layout="vd"):
        p = r["params"]
        dense = results.select("cublas_fp32_mask", batch=1, kind=p["kind"], allowed=p["allowed"], layout="vd")
        if p["allowed"] <= 1000 and dense:
            ratios[f"{p['allowed']:,} allowed on {p['kind']} masks"] = dense[0]["ms"] / r["ms"]
    least = min(ratios, key=ratios.get)
    assert numbers["mlh_dispatch_min_vs_fp32"] == f"{ratios[least]:.0f}×"
    assert numbers["mlh_dispatch_min_at"] == least


def test_a_step_ratio_in_the_prose_is_the_tables():
    """The prose quotes a step's speedup and time with the table's digits (one number, not a rounded twin)."""
    results = plotting.load_results("masked_lm_head")
    numbers = lesson.prose_numbers(results)
    kept = _kept(results)
    ratio = {n: r[4].split(" ")[0] for n, r in kept.items()}
    assert numbers["mlh_step04_vs_step03"] == f"{ratio['4']} faster"
    assert numbers["mlh_step04_1000"] == f"{kept['4'][3]} µs"
    assert ratio["8"] == numbers['mlh_step08_vs_step07_1'].removesuffix(' faster') and "step 7 (" in kept["8"][4]
    assert numbers["mlh_step08_1"] == kept["8"][3].replace(lesson.CAPPED, "") + " µs"
    assert ratio["10"] == numbers['mlh_step10_b64_vs_step03'].removesuffix(' faster') and "step 3 (" in kept["10"][4]
    assert numbers["mlh_step10_b64"] == kept["10"][3] + " µs"
    assert kept["7"][3] == lesson.table_us(lesson.batch1_ms(results, "step07", 1000))


def test_close_times_print_apart():
    """Under 10 µs the table of steps prints two decimals, so that step 12 (the kernel alone) and step 13's bound (the
    bitmask's copy, then two kernels), a few hundredths apart, do not read as one number; the bound is said above the
    table in those digits."""
    results = plotting.load_results("masked_lm_head")
    assert lesson.table_us(0.0040406) == "4.04" and lesson.table_us(0.0174) == "17.4"
    twelve = lesson.prose_numbers(results)["mlh_dispatch_1000"].removesuffix(" µs")
    floor = lesson.host_floor_ms(results)
    if floor is not None:
        assert twelve != f"{floor * 1e3:.2f}" and lesson.table_us(floor) == f"{floor * 1e3:.2f}"
    said = next("".join(c["source"]) for c in _notebook_cells() if "lesson.main_steps_table(results)"
                in "".join(c["source"]))
    assert "{lesson.table_us(design)} µs" in said


def test_capped_rows_carry_the_mark_and_no_other_does():
    """In the table of steps and the practitioners' table a time carries the mark exactly where its row says its
    rotation was capped (looked up here from the rows, not from the table), each step at its row's case."""
    results = plotting.load_results("masked_lm_head")
    marked = 0
    for cells in _rows(results):
        capped = bool(_ms_at(results, int(cells[0]), _params(int(cells[0]))).get("rotation_capped"))
        assert (lesson.CAPPED in cells[3]) == capped, cells
        marked += capped
    assert marked, "the committed run marks step 8's one id"
    table = lesson.practitioners_table(results)
    if table.startswith(lesson.PENDING):
        pytest.skip("no practitioners' rows")
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        p = {"batch": int(cells[0]), "kind": cells[1], "allowed": int(cells[2].replace(",", ""))}
        ours = [r for r in results.select(mlh.report.PLAN, **p)][0]
        assert cells[5].endswith(lesson.CAPPED) == bool(ours.get("rotation_capped")), line


def test_the_steps_table_gives_each_row_the_cards_floor():
    """Each row's "× the card's floor" is its time over the card's floor at its case (its union there: the bytes, or
    the empty kernel), the tried steps' included; step 13's is over its chain (the next test)."""
    results = plotting.load_results("masked_lm_head")
    for cells in (r for r in _rows(results) if r[0] != "13"):
        params = _params(int(cells[0]))
        row = _ms_at(results, int(cells[0]), params)
        floor = lesson.floor_ms(results, params["batch"], row.get("union", params["allowed"]))
        assert cells[5].split(" (")[0] == f"{row['ms'] / floor:.1f}×", (cells, row["ms"] / floor)


def test_step13s_floor_is_its_chain_and_is_said_above_the_table():
    """Step 13 starts from the bitmask in host memory. Its floor is the chain no design can shorten, the bitmask's
    copy, timed alone in the card's tails run (read here from the raw file), then one kernel at the card's empty
    kernel: the scoreboard's latency floor for the same row. Our design's bound (two kernels after the copy, the
    scoreboard's own work) is said beside it, above the tables; step 13's row gives its ratio to the chain alone (the
    card's byte floor, which does not bind there, is not on the page)."""
    from book import common
    from book.scoreboard import BITMASK_COPY, scoreboard
    from studylog.plotting import load_results

    results = load_results("masked_lm_head", gpu="nvidia-h200")
    tails = json.loads((results.path.parent / "tails.json").read_text())
    (copy,) = [r for r in tails["measurements"] if r["series"] == BITMASK_COPY]
    chain = copy["ms"] + common.latency_floor_ms(results)
    assert lesson.chain_floor_ms(results) == pytest.approx(chain)
    assert lesson.host_floor_ms(results) == pytest.approx(copy["ms"] + 2 * common.latency_floor_ms(results))
    assert lesson.bitmask_copy_ms(results) == pytest.approx(copy["ms"])
    (row,) = [r for r in scoreboard() if r["number"] == 2 and r["ours"] == "step 13, whole step"
              and r["card"] == results.data["device"]["name"]]
    assert row["latency_floor_ms"] == pytest.approx(chain)  # one floor on both pages
    step = [r for r in results.select("step13", batch=1, kind="random", allowed=1000)][0]
    card = lesson.floor_ms(results, 1, step["union"])
    assert card < chain
    (thirteen,) = [r for r in _rows(results) if r[0] == "13"]
    assert thirteen[5] == f"{step['ms'] / chain:.1f}×, {lesson.CHAIN_WORDS}"
    assert f"{step['ms'] / card:.1f}×" not in lesson.later_steps_table(results)
    assert all("bitmask" not in r[5] and "design" not in r[5] for r in _rows(results) if r[0] != "13")
    said = next("".join(c["source"]) for c in _notebook_cells() if "lesson.main_steps_table(results)"
                in "".join(c["source"]))
    assert "lesson.chain_floor_ms(results)" in said and "its floor is " in said and "**a chain**" in said


def test_the_tried_steps_are_said_once_before_any_heading_skips_them():
    """The opening, before the first step's heading, says once that steps 6, 9 and 11 were tried and not kept (so the
    headings skip them), each by number; no other text says it (no "Missing numbers" line); in the table each tried
    row is marked. Under the table the footnote is the key to the mark alone: the notebook says the key nowhere
    else."""
    results = plotting.load_results("masked_lm_head")
    cells = _notebook_cells()
    texts = ["".join(c["source"]) for c in cells]
    first_step = next(k for k, t in enumerate(texts) if re.match(r"#+ Step \d+", t))
    opening = texts[0]
    tried = f"ideas that did not pay, steps {lesson.counts_words(list(lesson.TRIED))}, appear only as table rows"
    assert tried in opening.replace("\n", " ")
    assert first_step > 0 and lesson.counts_words(list(lesson.TRIED)) == "6, 9 and 11"
    source = "\n".join(texts)
    assert source.count("did not pay, steps") == 1 and "Missing numbers" not in source
    assert "Missing numbers" not in lesson.main_steps_table(results)
    heads = [int(m.group(1) or m.group(2)) for t in texts
             if (m := re.match(r"#+ (?:Step (\d+)|The integration \(step (\d+)\))", t))]
    assert sorted(set(range(14)) - set(heads)) == list(lesson.TRIED)
    note = lesson.steps_note(results)
    key = lesson.page_capped_key(results)
    assert note == ("" if key is None else key) and "were tried" not in note
    assert source.count("lesson.steps_note(results)") == 1 and "page_capped_key" not in source
    assert "follow the package" not in source and "library's numbers" not in source


def test_dense_mask_two_speeds_are_said_and_cublas_fp32_quoted_instead():
    """Where dense + mask's repetitions fall in two clusters, the page says a point's repetitions land on either for
    the same work, and that the batch-1 rows quote cuBLAS with fp32 output (the same read, steady) instead."""
    results = plotting.load_results("masked_lm_head")
    two = lesson.dense_clusters(results)
    cell = next("".join(c["source"]) for c in _notebook_cells() if "lesson.dense_clusters(results)" in "".join(c["source"]))
    assert "for the same work" in cell and "{two['fp32_ms'] * 1e3:.0f} µs" in cell and "quote cuBLAS" in cell
    assert "did not" not in cell
    if two is not None:
        rows = results.select("cublas_fp32_mask", batch=1)
        assert min(r["ms"] for r in rows) <= two["fp32_ms"] <= max(r["ms"] for r in rows)
        assert two["fast_ms"] < two["slow_ms"]


def test_the_page_shows_the_two_steps_tables_unfolded():
    """The page shows each table of steps once, under the steps, unfolded, one after the other (one call each); what
    the tried steps changed is said once, folded, after them, with no table of their own. The tried steps have no
    section, the kept ones each have one, in order: steps 0 to 5 and 7, then steps 8 to 12 in a section of their own,
    *Beyond the chain*, whose first cell is prose (no heading follows a heading at once), then the integration, step
    13, a section of its own."""
    nb = _notebook_cells()
    cells = ["".join(c["source"]) for c in nb]
    source = "\n".join(cells)
    assert source.count("lesson.main_steps_table(results)") == 1
    assert source.count("lesson.later_steps_table(results)") == 1
    assert "steps_shown" not in source and "tried_steps_table" not in source and "tried_note" not in source
    assert "boehm_table" not in source and "one_steps_table" not in source
    heads = [re.match(r"#+ Step (\d+)", c) for c in cells]
    assert [int(h.group(1)) for h in heads if h] == [n for n in lesson.MAIN_LINE if n != 13]
    beyond = next(k for k, c in enumerate(cells) if c.startswith("## Beyond the chain: steps 8 to 12, each at its own"))
    integration = next(k for k, c in enumerate(cells) if c.startswith("## The integration (step 13)"))
    assert [int(h.group(1)) for h in heads[:beyond] if h] == list(lesson.CHAIN)
    assert all(cells[k].startswith("### ") for k, h in enumerate(heads) if h and k > beyond)
    assert cells[beyond].count("\n\n") >= 1 and not cells[beyond + 1].startswith("## ")
    assert any(re.match(r"## Step 3: .*a tie here; kept as the dense path", c) for c in cells)
    assert any(c.startswith("## Step 7: ") and "(a tie; kept for steps 8 and 13)" in c.splitlines()[0] for c in cells)
    table = next(k for k, c in enumerate(cells) if "lesson.main_steps_table(results)" in c)
    assert beyond < integration < table and "hide-output" not in nb[table]["metadata"]["tags"]
    assert "display(Markdown(steps))" in cells[table] and "display(Markdown(later))" in cells[table]
    assert cells[table].index("display(Markdown(steps))") < cells[table].index("display(Markdown(later))")
    for k, c in enumerate(cells):
        if nb[k]["cell_type"] == "markdown" and c.startswith("#") and "\n\n" not in c.strip():
            assert not cells[k + 1].startswith("#"), c
    tried = next(k for k, c in enumerate(cells) if all(f"**Step {n}**" in c for n in lesson.TRIED))
    assert tried > table and "hide-output" in nb[tried]["metadata"]["tags"]
    assert nb[tried]["metadata"]["mystnb"]["code_prompt_show"] == "Show what steps 6, 9 and 11 tried"
    results = plotting.load_results("masked_lm_head")
    assert "<details>" not in lesson.main_steps_table(results) + lesson.later_steps_table(results)


def test_each_ratio_of_the_chain_table_is_the_ratio_of_its_printed_times():
    """In the table of steps 0 to 7 (one case) each "× previous" is the named step's printed time over the row's, to
    the rounding of the printed times; a tampered ratio fails."""
    results = plotting.load_results("masked_lm_head")

    def problems(rows):
        times = {r[0]: float(r[2].rstrip(lesson.CAPPED).replace(",", "")) for r in rows}
        out = []
        for r in rows[1:]:
            m = re.match(r"(\d+\.\d\d)× step (\d+)", r[3])
            if not m or abs(float(m.group(1)) - times[m.group(2)] / times[r[0]]) > 0.01 * float(m.group(1)) + 0.005:
                out.append(r)
        return out

    rows = _chain_rows(results)
    assert problems(rows) == []
    assert problems([r[:3] + ["9.99× step 4"] + r[4:] if r[0] == "5" else r for r in rows])


def test_step_13s_parts_are_traced_in_its_section_not_in_the_table():
    """Step 13's three parts and their traced costs are said in its section (from the committed trace), not packed
    into its row of the table."""
    results = plotting.load_results("masked_lm_head")
    trace = lesson.plan_timeline()
    row = next(r for r in _rows(results) if r[0] == "13")
    if trace is not None:
        part = lesson.plan_parts(trace)
        assert f"{part['copy']:.1f}" not in row[1] and "traced" not in row[1]
    cells = ["".join(c["source"]) for c in _notebook_cells()]
    assert any("{part['copy']:.1f} µs" in c and "lesson.plan_parts" not in c for c in cells)


def test_the_kernel_alone_leads_with_its_strongest_rival_the_compiled_gather():
    """The result names torch.compile's fused gather as the kernel's strongest rival, with step 12's lead computed from
    the committed lab runs (every check passed there), and the eager pair after it."""
    leads = lesson.compiled_gather_leads("compiled_gather")
    data = plotting.load_lab("masked_lm_head", "compiled_gather")
    by = {(r["series"], r["params"]["allowed"]): r["ms"] for r in data["measurements"]}
    for n, lead in leads.items():
        assert lead == pytest.approx(min(by[(s, n)] for s in lesson.COMPILED_RIVALS) / by[("step12", n)])
    lead, words = lesson.compiled_gather_words()
    assert lead == f"{leads[1000]:.2f}×" and "torch.compile" in words and f"{leads[10_000]:.2f}× at 10,000" in words
    for n in leads:  # each lead with its two times beside it, read here from the file
        ours, theirs = by[("step12", n)], min(by[(s, n)] for s in lesson.COMPILED_RIVALS)
        shown = re.search(rf"([\d.]+)× at {n:,}[^(]*\(([\d.]+) against ([\d.]+) µs\)", words)
        assert shown and shown.groups()[1:] == (f"{ours * 1e3:.2f}", f"{theirs * 1e3:.2f}"), (n, words)
        # the lead is the ratio of the two times as printed
        assert shown.group(1) == f"{float(shown.group(3)) / float(shown.group(2)):.2f}", (n, words)
        assert lesson.compiled_gather_times("compiled_gather")[n] == (ours, theirs)
    cells = ["".join(c["source"]) for c in _notebook_cells()]
    cell = next(c for c in cells if "{compiled_words}" in c)
    assert "{compiled_lead} as a kernel, given the ids**" in cell and "lesson.compiled_gather_words()" in cell
    # the index_select pair is graph-replayed: unfused, not "eager" (that word is for host time)
    assert "unfused (two launches)" in cell.lower() and "eagerly is" not in cell
    source = "\n".join(cells)
    assert "What it buys" not in source and source.count("{bound['3B']:.2f}×") == 1  # said once, in Why it matters
    lead = next(c for c in cells if "The lead shrinks with batch" in c)  # the chapter's first numbers say it too
    assert "compiled_gather_words()[0]" in lead and "fused gather" in lead


def test_the_headline_gives_its_range_from_the_run():
    results = plotting.load_results("masked_lm_head")
    numbers = lesson.prose_numbers(results)
    speed = [next(r for r in results.select(mlh.report.XGRAMMAR, batch=b, kind=k, allowed=a))["ms"]
             / next(r for r in results.select(mlh.report.PLAN, batch=b, kind=k, allowed=a))["ms"]
             for b, k, a in lesson.HEADLINE_POINTS]
    assert [b for b, _, _ in lesson.HEADLINE_POINTS] == [1, 64, 256]
    assert numbers["mlh_headline"].startswith(f"{speed[0]:.2f}× at batch 1")
    assert numbers["mlh_headline"].startswith(numbers["mlh_plan_vs_xgr_b1"])
    assert numbers["mlh_headline_points"] == "1,000 allowed tokens per sequence"
    # each batch said once: faster by its ratio, or, within TIE of parity, a tie with both times
    said = numbers["mlh_headline"] + numbers["mlh_headline_rest"]
    for (b, _, _), x in zip(lesson.HEADLINE_POINTS, speed):
        assert said.count(f"at batch {b}") == 1, said
        assert (f"at batch {b} the two tie" in said) == lesson.tied(x, 1), (b, x, said)
        assert lesson.tied(x, 1) or f"{x:.2f}× at batch {b}" in said
    assert "1.00×" not in said


def test_the_headline_prints_the_results_pages_digits():
    """The page's batch-64 ratio has the two decimals the landing and results pages print (book.results computes
    the same ratio), not a one-decimal twin."""
    from book.results import masked_head_batches

    results = plotting.load_results("masked_lm_head")
    said = lesson.prose_numbers(results)["mlh_headline"]
    for batch, ratio in masked_head_batches(results.path.parent).items():
        if not lesson.tied(ratio, 1):
            assert f"{ratio:.2f}× at batch {batch}" in said, said


def test_the_headline_calls_a_near_parity_point_a_tie_and_a_loss_a_loss():
    faster, rest = lesson.headline_words({1: (0.019, 0.201), 64: (0.1456, 0.2798), 256: (0.4742, 0.4731)})
    assert faster == "10.58× at batch 1 and 1.92× at batch 64"
    assert rest == "; at batch 256 the two tie, within 3% (ours 474.2 µs, xgrammar's path 473.1)"
    faster, rest = lesson.headline_words({1: (0.019, 0.201), 256: (0.5, 0.4)})
    assert faster == "10.58× at batch 1" and rest.startswith("; at batch 256 ours is 1.25× slower")


def test_the_whole_step_table_shows_every_headline_point():
    """The unfolded table of the whole step holds each point the headline quotes (batch 64 at its allowed count)."""
    assert set(lesson.HEADLINE_POINTS) <= set(lesson.PRACTITIONER_POINTS)


def test_dense_clusters_need_a_gap():
    def run(times):
        return Results(None, {"device": {"name": "card"}, "date": "2026-01-01", "measurements": [
            {"series": "dense_mask", "ms": sorted(t)[1], "spread_ms": sorted(t), "clock": "gpu",
             "params": {"batch": 1, "kind": "random", "allowed": n}} for n, t in enumerate(times, 1)]})

    assert lesson.dense_clusters(run([(1.0, 1.01, 1.02), (1.0, 1.0, 1.03)])) is None
    two = lesson.dense_clusters(run([(1.0, 1.2, 1.21), (1.0, 1.01, 1.2), (1.0, 1.0, 1.0)]))
    assert two["slow"] == [("random", 1)] and two["points"] == 3
    assert two["fast_ms"] == 1.0 and two["slow_ms"] == pytest.approx(1.2, abs=0.011)


def test_the_capped_key_names_the_cap():
    """The key names the largest capped union of the chapter's run and whom L2 can flatter: neither side where ours and
    `index_select` + matmul both carry the mark (at a capped point every series that reads only the union's rows is
    capped, checked here on the run's rows), ours against the paths that read the whole head (never capped)."""
    assert lesson.capped_key(None) is None
    assert lesson.capped_key({"capped_union": None, "max_copies": 65}) is None
    assert lesson.capped_key({"capped_union": 1, "max_copies": 65}).startswith(f"{lesson.CAPPED} A union of one row")
    assert "at most 1,200 rows" in lesson.capped_key({"capped_union": 1200, "max_copies": 65})
    results = plotting.load_results("masked_lm_head")
    rot = lesson.rotation(results)
    assert rot and rot["capped_union"], "the committed H200 run marks capped rows"
    key = lesson.page_capped_key(results)
    assert key == lesson.capped_key(rot) and f"{rot['max_copies']} copies" in key
    assert (f"at most {rot['capped_union']:,} rows" if rot["capped_union"] > 1 else "one row") in key
    assert "flatter ours against the paths that read the whole head" in key and key.count(". ") == 0
    assert "not a ratio of two such times (step 8's over step 7's)" in key  # step 8's ratio: both sides alike
    points = {tuple(sorted((k, v) for k, v in r["params"].items() if k != "layout"))
              for r in results.rows if r.get("rotation_capped")}
    for r in results.rows:
        p = tuple(sorted((k, v) for k, v in r["params"].items() if k != "layout"))
        if p in points and r.get("clock") == "gpu":
            whole = r["series"] in (mlh.report.XGRAMMAR, "dense_mask", "cublas_fp32_mask") or r["series"].startswith("xgrammar")
            assert bool(r.get("rotation_capped")) != whole, (r["series"], p)


def test_the_floors_parts_add_up_as_printed():
    """The prose prints the 1,000 rows' read and the output's write with the floor's digits, so the two add up to
    the floor it prints (within the last digit's rounding)."""
    numbers = lesson.prose_numbers(plotting.load_results("masked_lm_head"))
    rows, output, floor = (float(numbers[k].removesuffix(" µs"))
                           for k in ("mlh_rows1000_read", "mlh_output_b1", "mlh_floor_b1_1000"))
    assert abs(rows + output - floor) <= 0.011, (rows, output, floor)


def test_step_12s_worst_point_is_given_against_dense_and_against_every_rival():
    """Step 12's worst point against dense + mask is qualified as such, and its worst against any rival of the losses
    table (index_select returns only the union's logits) is given beside it."""
    results = plotting.load_results("masked_lm_head")
    numbers = lesson.prose_numbers(results)
    table = lesson.losses_table(results)
    ratios = [float(r.split("|")[7].strip().rstrip("×")) for r in table.splitlines()[2:]
              if "step 12" in r.split("|")[5]]
    assert numbers["mlh_dispatch_worst_any"].startswith(f"{max(ratios):.2f}× the time of ")
    assert "dense" not in numbers["mlh_dispatch_worst"]  # the page names the rival in the sentence


def test_a_stub_is_reported_as_not_written(capsys):
    def stub(*args):
        raise NotImplementedError

    assert not exercises.check_active_fraction(stub)
    assert "not written yet" in capsys.readouterr().out


# --------------------------------------------------------------------------------------
# How a run replayed the head, read from its rows
# --------------------------------------------------------------------------------------

def _row(allowed, copies=None, capped=False, batch=1, union=None, kind="random"):
    row = {"series": "step05", "role": "kernel", "clock": "gpu", "ms": 0.01,
           "params": {"batch": batch, "kind": kind, "allowed": allowed, "layout": "vd"},
           "union": allowed if union is None else union}
    if copies is not None:
        row |= {"copies": copies, "read_bytes": row["union"] * mlh.HIDDEN * 2, "rotation_capped": capped}
    return row


def _run(rows, l2=50 * 2**20):
    return Results(None, {"device": {"name": "card", "l2_cache_bytes": l2}, "date": "2026-01-01",
                          "measurements": rows})


def test_rotation_is_read_from_the_rows():
    """A run whose rows lack ``copies`` replayed one head; otherwise the capped unions, batch 1's capped counts and
    whether their copies fit in L2 together come from the rows, recomputed here by hand."""
    assert lesson.rotation(_run([_row(1), _row(1000)])) is None
    rows = [_row(1, 65, True), _row(40, 65, True), _row(3, 65, True, kind="real"), _row(9, 65, True, batch=8, union=60),
            _row(1000, 41), _row(40_000, 2)]
    got = lesson.rotation(_run(rows))
    assert got["max_copies"] == 65 and got["capped_union"] == 60 and got["capped_b1"] == [1, 40]
    assert got["capped_fit_l2"] == (60 * mlh.HIDDEN * 2 * 65 <= 50 * 2**20)
    small_l2 = lesson.rotation(_run(rows, l2=60 * mlh.HIDDEN * 2 * 65 - 1))
    assert not small_l2["capped_fit_l2"]
    uncapped = lesson.rotation(_run([_row(1000, 41)]))
    assert uncapped["capped_union"] is None and uncapped["capped_b1"] == [] and not uncapped["capped_fit_l2"]
    assert lesson.counts_words([1, 8, 1000]) == "1, 8 and 1,000" and lesson.counts_words([5]) == "5"


def test_the_committed_runs_say_how_they_replayed():
    """The H100 file predates the rotation (one head); the H200 file rotates, and every row it marks capped is a
    union no larger than the largest capped one."""
    from studylog.plotting import load_results, result_files

    for f in result_files("masked_lm_head"):
        results = load_results("masked_lm_head", gpu=f.parent.name)
        rot = lesson.rotation(results)
        if not any("copies" in r for r in results.rows):
            assert rot is None
            continue
        capped = [r for r in results.rows if r.get("rotation_capped")]
        assert rot["max_copies"] >= max(r["copies"] for r in results.rows)
        assert all(r["union"] <= rot["capped_union"] for r in capped)


# --------------------------------------------------------------------------------------
# Marks, folds and the traced timeline
# --------------------------------------------------------------------------------------


def test_the_floor_is_the_scoreboards_on_every_card():
    """One floor a run on every page: the bytes at the run's copy bandwidth, or the run's own empty kernel (as the
    scoreboard takes it) where that is larger; and the scoreboard's own
    row for step 12's kernel alone gives the same number."""
    from book import scoreboard

    for f in plotting.result_files("masked_lm_head"):
        results = plotting.load_results("masked_lm_head", f.parent.name)
        empty = scoreboard.empty_kernel_ms(results.data)
        bandwidth = results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9
        for batch, union in ((1, 1), (1, 1000), (64, 5000)):
            by_bytes = (union * mlh.HIDDEN * 2 + batch * mlh.VOCAB * 4) / bandwidth * 1e3
            assert lesson.floor_ms(results, batch, union) == pytest.approx(max(by_bytes, empty), rel=1e-12)
        assert lesson.floor_ms(results, 1, 1) == pytest.approx(empty)  # one row: the empty kernel binds
        board = [r for r in scoreboard.scoreboard() if r["number"] == 2 and r["card"] == results.gpu
                 and r.get("ours") == "step 12, kernel alone"]
        if board:
            row = results.select("step12", batch=1, kind="random", allowed=1000, layout="vd")[0]
            assert board[0]["binding_floor_ms"] == pytest.approx(lesson.floor_ms(results, 1, row["union"]), rel=1e-9)


def test_the_practitioners_short_table_keeps_only_its_points_and_the_fold_keeps_every_row():
    results = plotting.load_results("masked_lm_head")
    every = lesson.practitioners_table(results)
    if every.startswith(lesson.PENDING):
        pytest.skip("no practitioners' rows")
    short = lesson.practitioners_table(results, lesson.PRACTITIONER_POINTS)
    kept = {(int(c[0]), c[1], int(c[2].replace(",", ""))) for c in
            ([x.strip() for x in line.split("|")[1:-1]] for line in short.splitlines()[2:])}
    assert kept <= set(lesson.PRACTITIONER_POINTS) and len(kept) >= 6
    assert set(short.splitlines()[2:]) <= set(every.splitlines()[2:])
    html = lesson.folded("every point", every)
    assert html.startswith("<details><summary>every point</summary><table>")
    assert html.count("<tr>") == every.count("\n")  # the header and every row, the rule left out
    assert "11.70×" in lesson.html_table("| a | b |\n|---|---|\n| 1 | 11.70× |")


def _trace(calls=3, replays=2):
    """A timeline file as plan_timeline.py writes it, with hand-picked medians."""
    return {"params": {"allowed": 1000}, "untraced_us_per_call": 18.5,
            "summary": {"start_us": {"copy": 0.0, "count_zero": 6.0, "union_kernel": 7.5, "row_kernel": 10.5},
                        "duration_us": {"copy": 1.5, "count_zero": 1.0, "union_kernel": 2.5, "row_kernel": 4.0},
                        "gap_before_us": {"count_zero": 4.5, "union_kernel": 0.5, "row_kernel": 0.5},
                        "span_us": 14.5, "period_us": 19.0, "calls": calls * replays}}


def test_the_timeline_table_chains_step_13s_three_parts():
    """One row per part of step 13 (the copy, the union built, the bucket's graph), each with its traced time, the
    idle time before it and when it ends; then the wait for the next call. Every cell is the trace's: the benchmark's
    time of the step, another run, is no row of it."""
    table = lesson.plan_timeline_table(_trace())
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in table.splitlines()]
    assert len(rows) == 2 + 3 + 1
    copy, union, kernel, wait = rows[2:]
    assert copy[2:] == ["1.5", "–", "1.5"]
    assert union[2:] == ["3.5", "5.0", "10.0"]  # 1.0 + 2.5 taken; 4.5 + 0.5 idle; 7.5 + 2.5
    assert kernel[2:] == ["4.0", "0.5", "14.5"]
    assert wait[3:] == ["4.5", "19.0"]  # 19.0 - (10.5 + 4.0)
    assert "the step" not in table and "benchmark" not in table


def test_plan_parts_give_each_part_its_own_time():
    """Step 13's parts, each with its median time from the trace, the call's span and period, and the idle rest."""
    parts = lesson.plan_parts(_trace())
    assert {k: parts[k] for k, _ in lesson.TIMELINE_PARTS} == {"copy": 1.5, "count_zero": 1.0, "union_kernel": 2.5,
                                                               "row_kernel": 4.0}
    assert (parts["span"], parts["period"], parts["busy"]) == (14.5, 19.0, 9.0)
    assert parts["idle"] == pytest.approx(10.0)
    trace = lesson.plan_timeline()
    if trace is not None:
        committed = lesson.plan_parts(trace)
        assert all(committed[k] == trace["summary"]["duration_us"][k] for k, _ in lesson.TIMELINE_PARTS)
        assert committed["span"] <= committed["period"]


def _integration() -> tuple[list[dict], int, int]:
    cells = _notebook_cells()
    start = next(k for k, c in enumerate(cells) if "".join(c["source"]).startswith("## The integration (step 13)"))
    end = next(k for k in range(start + 1, len(cells)) if "".join(cells[k]["source"]).startswith("## "))
    return cells, start, end


def test_step_13s_section_names_its_one_idea_and_times_each_part():
    """The integration's section (step 13) says plainly it is no faster kernel but what lets one CUDA graph replay the
    whole step from the bitmask, and there, not in a later section, gives the step's own time (the benchmark's), its
    parts' traced times (the copy, the union, the row kernel) and the idle rest of the period between calls in words,
    the traced call's table folded."""
    cells, start, end = _integration()
    section = ["".join(c["source"]) for c in cells[start:end]]
    opening = " ".join(section[0].split("\n\n")[1].split())
    assert "Step 13 is no faster kernel but the plumbing that lets one CUDA graph replay the whole step" in opening
    code = "\n".join(section[1:])
    assert "A run of its own traced them: the copy" in code
    assert "lesson.plan_parts(trace)" in code
    for key in ("copy", "row_kernel", "idle", "period"):
        assert f"part['{key}']" in code, key
    assert "lesson.plan_timeline_table(trace)" in code and "N['mlh_plan_1000']" in code
    # the step's time and the trace are two runs: the section names each once, and says what the step's time holds
    assert "the benchmark does not time its parts apart" in code and "of the traced run, not the benchmark" in code
    traced = next(c for c in cells[start:end] if "lesson.plan_timeline_table(trace)" in "".join(c["source"]))
    assert "hide-output" in traced["metadata"]["tags"]
    rest = "\n".join("".join(c["source"]) for k, c in enumerate(cells) if not start <= k < end)
    assert "plan_timeline_table" not in rest and "plan_parts" not in rest


def test_timeline_idle_includes_the_wait_for_the_next_call():
    idle = lesson.timeline_idle(_trace())
    assert idle == {"count_zero": 4.5, "union_kernel": 0.5, "row_kernel": 0.5, "next": pytest.approx(4.5)}


def test_the_loss_count_says_which_point_two_rivals_beat():
    """The losses table has a row per rival that beats a point: where it has more rows than points, ``shared`` names
    each point beaten twice (the page says so under its count)."""
    results = plotting.load_results("masked_lm_head")
    lost = lesson.loss_counts(results)
    rows = lesson.losses_table(results).splitlines()[2:]
    assert len(rows) == lost["rows"]
    keys = [tuple(c.strip() for c in r.split("|")[1:4]) + (r.split("|")[5].split(":")[0].strip(),) for r in rows]
    twice = [k for k in dict.fromkeys(keys) if keys.count(k) > 1]
    assert [(str(p["batch"]), p["kind"], f"{p['allowed']:,}") for p in lost["shared"]] == [k[:3] for k in twice]
    assert lost["rows"] - lost["points"] == sum(keys.count(k) - 1 for k in twice)


def test_a_tie_is_one_rule_and_never_a_loss():
    """Two times within TIE of each other are a tie wherever the page compares them: the headline says its tie with
    both times, the losses table and its count leave ties out, and the ties are said with both times."""
    results = plotting.load_results("masked_lm_head")
    lost = lesson.loss_counts(results)
    every = lesson._losses(results)
    tied = [q for q in every if lesson.tied(q["mine"]["ms"], q["rival"]["ms"])]
    assert lost["ties"] == len(tied) == len(lesson.ties(results)) and lost["rows"] == len(every) - len(tied)
    table = lesson.losses_table(results)
    assert all(f"{float(r.split('|')[7].strip().rstrip('×')):.2f}" != "1.00" for r in table.splitlines()[2:]), table
    words = lesson.ties_words(results)
    for q in tied:
        assert f"{q['mine']['ms'] * 1e3:,.1f} µs" in words and f"{q['rival']['ms'] * 1e3:,.1f})" in words
    # the headline's batch 256: a tie, and not in the loss count
    plan = [q for q in every if q["mine"]["series"] == mlh.report.PLAN]
    assert all(lesson.is_tie(q) for q in plan) and mlh.report.PLAN not in lost["by_series"]


def test_no_whole_listing_or_diff_is_folded_and_folds_render_code_as_html():
    """A step's code is shown open (its core), never folded whole: no code cell that shows a diff or a listing is
    tagged ``hide-output`` or ``hide-input``, but the two ties' diffs (steps 3 and 7, each under a one-line section) and
    step 13's union kernel, listed whole (its call and its diff stay open); the HTML folds (every point) write inline code as ``<code>``
    and apostrophes curly, never raw backticks; the losses and ties fold as a Markdown cell's output."""
    for c in _notebook_cells():
        text = "".join(c["source"])
        tags = set(c.get("metadata", {}).get("tags", []))
        if c["cell_type"] == "code" and re.search(r"show_source|step_diff|function_diff|listing\(", text):
            folded = ("dot_rows (step 3)" in text or "step_diff(CHAPTER, 5, 7)" in text
                      or "show_source(union_ids_kernel" in text)
            assert folded or not tags & {"hide-output", "hide-input"}, text
    assert lesson.inline_html("`index_select` + matmul's") == "<code>index_select</code> + matmul’s"
    results = plotting.load_results("masked_lm_head")
    html = lesson.folded("every point", lesson.practitioners_table(results))
    assert "`" not in html and "'" not in html.replace("<", "").replace(">", "")
    cell = next(c for c in _notebook_cells() if "lesson.ties_words(results)" in "".join(c["source"]))
    assert "hide-output" in cell["metadata"]["tags"] and "display(Markdown(lost_table))" in "".join(cell["source"])


def test_where_the_numbers_come_from_names_its_runs_in_words_and_reads_them():
    """The sources are named in words (no repository path on the page), and the cells still read those runs: the
    benchmark, the bitmask's copy (step 13's floor) and the traced call."""
    cells = _notebook_cells()
    i = next(k for k, c in enumerate(cells) if "## Where the numbers come from" in "".join(c["source"]))
    said = "".join(cells[i + 1]["source"])
    assert "benchmark" in said and "traced" in said and "bitmask's copy" in said
    assert not re.search(r"[\w-]+/[\w./-]+\.(json|md|txt)|lab_results|\.path", said)
    source = "".join("".join(c["source"]) for c in cells)
    assert 'load_results("masked_lm_head")' in source and "lesson.plan_timeline()" in source
    assert "lesson.host_floor_ms(results)" in said


def test_where_we_lose_is_said_once_and_names_both_rivals_that_beat_us():
    """The losses are said in their own section only (no summary at the top repeating it): the reason first, then the
    worst point's account, the points one by one only in the fold; its table names both kinds of loss:
    `index_select` + matmul where the union is small, dense + mask where it nears the vocabulary (batch 256, the
    dispatch's cuBLAS path)."""
    results = plotting.load_results("masked_lm_head")
    table = lesson.losses_table(results)
    assert "index_select" in table and "dense + mask" in table
    assert not any("Where we lose, in short" in "".join(c["source"]) for c in _notebook_cells())
    cells = {c["id"]: "".join(c["source"]) for c in _notebook_cells()}
    said = cells["cell-43"]
    assert "loss_lines" not in said and "all for our output" in said
    assert said.index("all for our output") < said.index("At the worst point")
    assert "lesson.losses_table(results)" in said and "display(Markdown(lost_table))" in cells["cell-43-table"]


def test_paths_and_buckets_are_said_as_the_step_whose_kernel_runs():
    """The practitioners' and losses tables name what runs in words (the step whose kernel a path or bucket runs, or
    cuBLAS), not by the code's path names; every path and bucket of the committed run has its words."""
    assert lesson.path_words("stream") == "step 7's kernel"
    assert lesson.path_words("batched 65536") == "step 10's kernel, up to 65,536 rows"
    assert lesson.path_words("dense 128256") == "cuBLAS, then the bitmask" and lesson.path_words("cublas") == "cuBLAS"
    results = plotting.load_results("masked_lm_head")
    names = {r["path"] for r in results.rows if r.get("path")} | {r["bucket"].split()[0] for r in results.rows
                                                                  if r.get("bucket")}
    assert names and names <= set(lesson.PATH_STEPS) | set(lesson.PATH_WORDS)
    said = {lesson.path_words(r["bucket"]) for r in results.rows if r.get("bucket")}
    runs = [[c.strip() for c in line.split("|")[1:-1]][4] for line in lesson.practitioners_table(results).splitlines()[2:]]
    assert runs and set(runs) <= said
    ours = [[c.strip() for c in line.split("|")[1:-1]][4] for line in lesson.losses_table(results).splitlines()[2:]]
    assert ours and all(o.split(" (", 1)[1].split(")")[0] in {lesson.path_words(n) for n in names} for o in ours), ours


def test_step_4_is_shown_as_its_diff_against_step_3():
    """Step 4's section shows its kernel's diff against step 3's (a program owns a slice of the id list, not a tile of
    the vocabulary), within about 40 changed lines, and says why the block skip goes; the whole kernel is not listed."""
    import difflib

    from book.common import without_docstrings
    from studylog import source

    texts = [source.source_of(mlh.CHAPTER.step(n).source, mlh.CHAPTER.step(n).source_function)[0] for n in (3, 4)]
    changed = [ln for ln in difflib.unified_diff(*(without_docstrings(t).splitlines() for t in texts), lineterm="")
               if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    assert 0 < len(changed) <= 40, len(changed)
    assert any("ids_ptr" in ln for ln in changed if ln.startswith("+"))
    cells = _notebook_cells()
    start = next(k for k, c in enumerate(cells) if "".join(c["source"]).startswith("## Step 4"))
    end = next(k for k in range(start + 1, len(cells)) if "".join(cells[k]["source"]).startswith("## "))
    section = ["".join(c["source"]) for c in cells[start:end]]
    assert "Against step 3 a program owns a slice of the id list" in section[0] and "the block skip goes" in section[0]
    last = section[0].replace("\n", " ").strip().rsplit(". ", 1)[1]  # the sentence right before the diff
    assert last.startswith("The diff's one launch holds two kinds of program: *row programs*")
    assert "*fill programs*" in last
    assert last.endswith(":") and "`pid < n_compute`" in last and any("n_compute" in ln for ln in changed)
    code = "\n".join(section[1:])
    assert "step_diff(CHAPTER, 3, 4)" in code and "show_source(4)" not in code and "step4_core" not in code


def test_steps_1_and_2_are_one_kernel_listed_at_each_steps_knob():
    """Steps 1 and 2 launch one kernel at COLUMN_SKIP False and True; each step's listing is that kernel with the
    knob's block resolved, so the 1 -> 2 diff is the one change (the columns a tile skips) and no listing shows
    the knob's test."""
    from studylog.masked_lm_head.dense import block_skip_kernel
    from studylog.source import resolve_python, source_of

    one, two = (mlh.CHAPTER.step(n).source for n in (1, 2))
    assert "if COLUMN_SKIP" not in one + two and "column_wanted" not in one and "column_wanted" in two
    changed = [ln for ln in mlh.CHAPTER.show_diff(1, 2).lines[2:] if ln[:1] in "+-"]
    assert len(changed) == 3 and all("column_wanted" in ln or "None" in ln for ln in changed), changed
    assert "if COLUMN_SKIP:" in source_of(block_skip_kernel)[0]
    lines = ["a", "if K:", "    if J:", "        x", "", "    y", "", "else:", "    z", "", "w"]
    assert resolve_python(lines, {"K": True, "J": False}) == ["a", "", "y", "", "w"]
    assert resolve_python(lines, {"K": False}) == ["a", "z", "", "w"]
    assert resolve_python(lines, {"J": True}) == ["a", "if K:", "    x", "", "    y", "", "else:", "    z", "", "w"]


def test_steps_5_and_7_are_one_kernel_listed_at_each_steps_hint():
    """Steps 5 and 7 launch one kernel, step 5 with no cache hint (EVICTION=""): step 5's listing reads the hint as
    its value, its parameter left out, and step 7's is the kernel, so the 5 -> 7 diff is the hint alone."""
    from studylog.masked_lm_head.compact import one_wait_kernel
    from studylog.source import source_of

    five, seven = (mlh.CHAPTER.step(n).source for n in (5, 7))
    assert "EVICTION" not in five and 'BLOCK_V, "")' in five and seven is one_wait_kernel
    changed = [ln for ln in mlh.CHAPTER.show_diff(5, 7).lines[2:] if ln[:1] in "+-"]
    assert len(changed) == 4 and all("FILL_BLOCK: tl.constexpr," in ln or "one_wait_rows(" in ln for ln in changed)
    assert "EVICTION: tl.constexpr," in source_of(seven)[0]


def test_step_10_is_shown_against_step_3s_product():
    """Step 10 builds on step 3's row-tile product: its listing is its call of step 3's ``dot_rows``, which the page
    shows at step 3, not the tried step 9's function."""
    cells = ["".join(c["source"]) for c in _notebook_cells()]
    start = next(k for k, c in enumerate(cells) if c.startswith("### Step 10"))
    code = cells[start + 1]
    assert 'function_listing(gathered_dot, "gathered_dot (step 10): step 3\'s dot_rows' in code
    assert "gathered_sums" not in code and "step 3's `dot_rows`" in cells[start]


def test_the_timing_exercises_answers_live_in_the_solutions_not_on_the_page():
    """Exercises 4, 6 and 7 time kernels on a GPU: the page prints none of their measured answers (no folded answer,
    no run of the tuning sweep, of steps 5 and 6 side by side or of exercise 7's variant), the solutions module gives
    them, read from the committed runs, and exercise 4 prints no placeholder on a CPU."""
    cells = _notebook_cells()
    ids = [c["id"] for c in cells]
    assert "cell-51-answer" not in ids and "cell-ex6-answer" not in ids
    source = "\n".join("".join(c["source"]) for c in cells)
    for given in ("measured answer", "rows_sweep_us", "fill_all_then_rows", "five_six", "CANDIDATES_FILE"):
        assert given not in source, given
    exercises_at = next(k for k, c in enumerate(cells) if "".join(c["source"]).startswith("## Exercises"))
    after = "\n".join("".join(c["source"]) for c in cells[exercises_at:])
    assert "dropdown" not in after and "say(" not in after
    tuning = load_lab("masked_lm_head", lesson.CANDIDATES_FILE, gpu=lesson.CANDIDATES_GPU)
    said = solutions.tiles_measured()
    for allowed in (1000, 10_000):
        assert all(f"{t:.1f} µs" in said for t in lesson.rows_sweep_us(tuning, allowed).values())
    results = plotting.load_results("masked_lm_head")
    said = solutions.rows_first_measured()
    for n in (5, 6):
        assert lesson.table_us(lesson.batch1_ms(results, f"step0{n}", 1)) in said
    parts = {r["series"]: r["ms"] * 1e3 for r in load_lab("masked_lm_head", "worst_point_parts")["measurements"]}
    said = solutions.fill_then_rows_measured()
    assert f"{parts['step10']:.1f} µs" in said and f"{parts['fill_all_then_rows_variant']:.1f} µs" in said
    sweep = lesson.rows_sweep_us(tuning)
    assert list(sweep) == [1, 2, 4] and all(t > 0 for t in sweep.values())
    assert lesson.rows_sweep_us(None) == {}
    line = exercises.try_rows_per_program(2, allowed_count=4) if not torch.cuda.is_available() else ""
    assert not line or line == "2 rows per program: output ok"


def test_exercise_4_is_a_tile_the_reader_sets_with_a_check(capsys):
    """Exercise 4's cell is one the reader edits: a function from step 7's default tile to the reader's, and the check,
    which runs step 7 with that tile against the contract (and says when the tile is still the default)."""
    import dataclasses

    code = "".join(next(c for c in _notebook_cells() if c["id"] == "cell-51")["source"])
    assert "def my_tiles(default):" in code and "return replace(default, block_v=" in code
    assert "exercises.check_tiles(my_tiles)" in code and "try_rows_per_program" not in code
    if torch.cuda.is_available():
        pytest.skip("the check times on a GPU; here it is checked on the interpreter")
    assert exercises.check_tiles(lambda t: dataclasses.replace(t, block_v=2), allowed_count=4)
    assert "output ok with 2 rows per program" in capsys.readouterr().out
    assert exercises.check_tiles(lambda t: t, allowed_count=4)
    assert "(the default: change a field)" in capsys.readouterr().out


def test_the_integration_is_prose_with_one_short_diff_and_its_trace_folded():
    """Step 13, the integration, is one section: prose, then one listing, the diff from step 7's kernel (at most about
    40 changed lines), open; no other listing (the plan's call, the union's kernel: exercise 2 asks for the union), no
    numbered sub-steps; the traced call's table after it, folded."""
    from book.common import changed_lines

    cells, start, end = _integration()
    text = ["".join(c["source"]) for c in cells[start:end]]
    assert text[0].startswith("## The integration (step 13): from the bitmask, in one CUDA graph")
    assert not any("### " in t for t in text) and not any(re.search(r"13[abc]", t) for t in text)
    listings = [k for k, t in enumerate(text) if re.search(r"show_source|step_diff|function_diff|listing", t)]
    assert len(listings) == 1 and "step_diff(CHAPTER, 7, 13)" in text[listings[0]]
    assert "hide-output" not in cells[start + listings[0]]["metadata"].get("tags", [])
    assert 0 < changed_lines(mlh.CHAPTER.show_diff(7, 13)) <= 40
    assert "union_ids_kernel" not in "\n".join(text) and "step13_plan" not in "\n".join(text)
    table = next(k for k, t in enumerate(text) if "lesson.plan_timeline_table(trace)" in t)
    assert table > listings[0]
    rows = lesson.plan_timeline_table(_trace()).splitlines()[2:5]
    assert [r.split("|")[1].strip() for r in rows] == ["the bitmask to the device", "the union from the bitmask",
                                                         "the bucket's graph"]


def test_a_listing_of_an_early_step_leaves_out_a_later_steps_hook():
    """The library keeps one function for every step; step 0's listing of ``dot_kn`` leaves out step 2's ``wanted``,
    its title saying so, and step 2 shows it as a diff that adds exactly those lines; a hook no longer found raises
    instead of showing it. Step 5's ``one_wait_rows`` is shown whole, as step 5's kernel calls it (its last argument,
    the cache hint step 7 sets), its title saying what that parameter is."""
    from studylog.masked_lm_head.dense import dot_kn

    shown = lesson.listing_without_hooks(dot_kn, "dot_kn", "dot_kn")
    assert "wanted" not in shown.text and "without the wanted mask that step 2 adds" in shown.title
    diff = lesson.hook_diff(dot_kn, "dot_kn")
    added = [ln for ln in diff.lines[2:] if ln.startswith("+")]
    assert added and all("wanted" in ln for ln in added), added
    assert 0 < changed_lines_of(diff) <= 6
    with pytest.raises(ValueError):
        lesson.without_hooks(dot_rows_fn(), "dot_kn")
    assert set(lesson.HOOKS) == {"dot_kn"}
    cells = {c["id"]: "".join(c["source"]) for c in _notebook_cells()}
    assert 'lesson.listing_without_hooks(dot_kn, "dot_kn"' in cells["cell-05"]
    assert 'lesson.hook_diff(dot_kn, "dot_kn")' in cells["cell-11"]
    assert "function_listing(one_wait_rows, " in cells["cell-step05-1"] and "EVICTION" in cells["cell-step05-1"]
    assert "hook_diff" not in cells["cell-step07-1"]


def changed_lines_of(diff) -> int:
    return sum(1 for ln in diff.lines[2:] if ln[:1] in "+-")


def dot_rows_fn():
    from studylog.masked_lm_head.dense import dot_rows

    return dot_rows


def test_the_result_says_chapter_07_runs_the_kernels_eagerly():
    """The result says, with a link, that chapter 07's loop calls the kernels eagerly, not the graph-replayed step 13."""
    cell = next("".join(c["source"]) for c in _notebook_cells() if c.get("id") == "cell-plan-host")
    assert "[Chapter 07](07_constrained_decoding.ipynb)" in cell and "eagerly" in cell
    assert "not the graph-replayed step 13" in cell


def test_what_the_head_buys_a_decode_step_is_said_once():
    """Why it matters gives the Amdahl payoff once: if the head and mask took 1/k of their time (k the whole step's
    batch-1 ratio), the decode step is at most the bound, for both shapes; the result does not say it again."""
    cells = ["".join(c["source"]) for c in _notebook_cells()]
    why = next(c for c in cells if "share = {name: cfg.head_share()" in c)
    result = next(c for c in cells if "lesson.result_table(results)" in c)
    assert "if the head and mask took 1/{k:.2f} of their time" in why
    assert "{bound['3B']:.2f}×" in why and "{bound['8B']:.2f}×" in why
    assert "{bound['3B']:.2f}×" not in result and "took 1/{k:.2f}" not in result
    assert sum("took 1/{k:.2f} of their time" in c for c in cells) == 1
    assert "made {k:.2f}× faster" not in why


def test_the_worst_loss_is_accounted_for_from_the_run():
    """Where we lose splits the worst loss's time into the union's rows and the fp32 output, each at the run's copy
    bandwidth, and the rest (computed here by hand), and sets it beside the same masks at a smaller batch; the page
    says it through lesson.loss_account."""
    results = plotting.load_results("masked_lm_head")
    acc = lesson.loss_account(results)
    lost = [q for q in lesson._losses(results) if not lesson.is_tie(q)]
    worst = max(lost, key=lambda q: q["mine"]["ms"] / q["rival"]["ms"])
    assert acc["q"] == worst
    p, bandwidth = worst["params"], results.data["ceilings"]["copy_bandwidth_gbs"]
    union = worst["mine"]["union"]
    assert acc["rows_us"] == pytest.approx(union * mlh.formats.HIDDEN * 2 / bandwidth / 1e3)
    assert acc["output_us"] == pytest.approx(p["batch"] * mlh.VOCAB * 4 / bandwidth / 1e3)
    assert acc["rows_us"] + acc["output_us"] + acc["rest_us"] == pytest.approx(worst["mine"]["ms"] * 1e3)
    less = acc["smaller"]
    assert less is None or (less["params"]["batch"] < p["batch"] and less["params"]["kind"] == p["kind"]
                            and less["params"]["allowed"] == p["allowed"] and less["path"] == worst["mine"]["path"])
    cell = next("".join(c["source"]) for c in _notebook_cells() if c.get("id") == "cell-43")
    assert "lesson.loss_account(results)" in cell and "µs" in cell


def test_exercise_seven_fills_everything_then_runs_the_row_programs(capsys):
    """Exercise 7's answer is two launches: a plain ``-inf`` fill, then step 10's row programs alone; it honours the
    contract on the interpreter (exercise 3's check), a fill alone does not, and its timing says it needs a GPU here."""
    assert exercises.check_masked_logits(solutions.fill_then_rows)
    assert not exercises.check_masked_logits(lambda h, weight, allowed, out: out.fill_(float("-inf")))
    cells = {c["id"]: "".join(c["source"]) for c in _notebook_cells()}
    assert "fill_then_rows(h, weight, allowed, out)" in cells["cell-ex7"]
    assert "exercises.time_fill_then_rows(fill_then_rows)" in cells["cell-ex7-code"]
    assert "tried in the lab" not in cells["cell-43"] and "exercise 7" in cells["cell-43"]
    if not torch.cuda.is_available():
        capsys.readouterr()
        exercises.time_fill_then_rows(solutions.fill_then_rows)
        assert "timing needs a GPU" in capsys.readouterr().out


def test_each_ratio_of_the_losses_table_is_the_ratio_of_its_printed_times():
    """In the losses table "ours is slower by" is ours over the rival as the two cells print them (two decimals under
    100 µs, :func:`lesson.loss_us`), so a reader dividing the cells finds the ratio; a tampered cell breaks it."""
    results = plotting.load_results("masked_lm_head")

    def problems(lines):
        out = []
        for line in lines:
            cells = [c.strip() for c in line.split("|")[1:-1]]
            ours, rival = (float(re.search(r": ([\d,.]+) µs", c).group(1).replace(",", "")) for c in cells[4:6])
            if cells[6] != f"{ours / rival:.2f}×":
                out.append(line)
        return out

    lines = lesson.losses_table(results).splitlines()[2:]
    assert lines and problems(lines) == []
    assert problems([lines[-1].replace(lesson.loss_us(lesson.loss_account(results)["q"]["rival"]["ms"]), "15.3")])
    assert lesson.loss_us(0.08304590812) == "83.05" and lesson.loss_us(0.4081) == "408.1"


def test_the_worst_loss_names_the_run_its_parts_come_from():
    """The worst loss is said with the benchmark's two times (the losses table's, as printed there) and its parts come
    from a run of their own, named as such, with that run's own whole time: one number per run, each run named."""
    results = plotting.load_results("masked_lm_head")
    cell = next("".join(c["source"]) for c in _notebook_cells() if c.get("id") == "cell-43")
    assert "lesson.loss_us(mine['ms'])" in cell and "lesson.loss_us(r['ms'])" in cell
    assert "A run of its own timed step 10's parts" in cell and "the whole call {split['step10']:.1f} µs there" in cell
    q = lesson.loss_account(results)["q"]
    assert f"{lesson.loss_us(q['mine']['ms'])} µs" in lesson.losses_table(results)
