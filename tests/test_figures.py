"""Every chapter's figures, as ``python -m book plot`` saves them: their smallest text stays readable once the book
scales them to its page, and they name steps in words ("step 2: token jumps"), never by their function's name."""

import re

import pytest

from book.plotting import FIGURE_CHAPTERS, chapter_figures, plain_steps, smallest_text_px, step_words
from studylog import chapter

#: The smallest text a reader should meet on the page (px at the page's width, :data:`book.plotting.PAGE_PX`).
MIN_PX = 10


@pytest.fixture(scope="module", params=FIGURE_CHAPTERS)
def drawn(request):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = chapter_figures(request.param)
    yield request.param, figs
    for fig in figs.values():
        plt.close(fig)


def test_text_is_readable_at_the_pages_width(drawn):
    name, figs = drawn
    small = {f"{name}_{n}": round(smallest_text_px(fig), 1) for n, fig in figs.items()}
    assert all(px >= MIN_PX for px in small.values()), small


def test_steps_are_named_in_words(drawn):
    from matplotlib.text import Text

    name, figs = drawn
    for n, fig in figs.items():
        texts = [t.get_text() for t in fig.findobj(Text) if t.get_visible()]
        named = [t for t in texts if re.search(r"\bstep\d{2}_", t)]
        assert not named, (f"{name}_{n}", named)


def test_step_words_and_plain_steps():
    fsm = chapter.get("fsm")
    assert step_words(fsm.step(2)) == "step 2: token jumps"
    assert step_words(chapter.get("ngram").step(1)) == "step 1: CPU path"
    assert plain_steps("step04_tile_skip, a launch per prompt") == "step 4, a launch per prompt"
