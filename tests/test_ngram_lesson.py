"""Chapter 3's page: the table of steps reads every step at both cases against a floor it does not beat, and the
real-text figure's axis names one corpus per tick (the shapes once per group), so its labels do not overlap."""

import pytest

from book.ngram import figures, lesson
from studylog import ngram
from studylog.plotting import load_results, result_files

pytestmark = pytest.mark.skipif(not result_files("ngram"), reason="no committed n-gram results")


def test_the_table_of_steps_has_every_step_and_the_entry_point():
    results = load_results("ngram")
    rows = lesson.boehm_table(results).splitlines()[3:]  # head, rule, floor
    assert [r.split("|")[1].strip() for r in rows] == [str(s.number) for s in ngram.CHAPTER.steps] + ["entry point"]
    for row in rows:
        ratios = [c.strip() for c in row.split("|")[1:-1]][5::3]  # the two "× floor" columns
        for cell in ratios:
            if cell != "–":
                assert float(cell.rstrip("×").replace(",", "")) >= 1.0, row


def test_no_ratio_across_clocks():
    """Step 1 is timed end to end on the host, the kernels on the GPU clock: the table says each row's clock and
    compares a row with the previous one, or with the GPU-clock floor, only on the same clock."""
    results = load_results("ngram")
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in lesson.boehm_table(results).splitlines()[3:]]
    by_step = {r[0]: r for r in rows}
    assert by_step["1"][2] == "host, end to end" and all(r[2] == "GPU" for r in rows[1:])
    assert by_step["2"][4] == "–"  # step 2 (GPU) is not divided by step 1 (host)
    for r in rows:  # the floor is a GPU-clock time: only a GPU-clock row is divided by it
        floor_cells = r[5::3]
        assert (r[2] == "GPU") == any(c not in ("–", "") for c in floor_cells), r


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
    assert len(shown) >= 4
    for i in shown:
        assert "hide-output" in cells[i]["metadata"].get("tags", []), i
        above = next(c for c in reversed(cells[:i]) if c["cell_type"] == "markdown")
        assert "folded" in "".join(above["source"]).splitlines()[-1], i
