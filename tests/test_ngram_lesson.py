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
        ratios = [c.strip() for c in row.split("|")[1:-1]][4::3]  # the two "× floor" columns
        for cell in ratios:
            if cell != "–":
                assert float(cell.rstrip("×").replace(",", "")) >= 1.0, row


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
