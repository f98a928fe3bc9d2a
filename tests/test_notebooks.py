import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"])
             if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: code cells {dirty} carry outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_numbered_and_in_the_book(path):
    assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), path.name
    toc = (ROOT / "_toc.yml").read_text()
    assert f"notebooks/{path.stem}" in toc, f"{path.name} is not in _toc.yml"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_sets_no_environment_by_hand(path):
    """Notebooks must not need TRITON_INTERPRET or sys.path hacks: importing studylog is enough."""
    nb = json.loads(path.read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "TRITON_INTERPRET" not in code
    assert "sys.path" not in code


# A code cell shows a figure when its source calls plt.show(, displays a figure or an image (display(fig..., figs[...],
# figures[...], Image(...)), or calls a figure helper named *_figure(. Such a cell must carry alt text in its metadata
# (mystnb.image.alt, which MyST-NB puts on every image the cell outputs); without it the site shows the file's hash.
SHOWS_FIGURE = re.compile(r"plt\.show\(|\bdisplay\(\s*(?:figs?|figures?|Image)\b|\w_figure\(")


def _alt(cell):
    return ((cell.get("metadata", {}).get("mystnb") or {}).get("image") or {}).get("alt", "")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_figure_cell_has_alt_text(path):
    nb = json.loads(path.read_text())
    code = [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]
    figures = {i for i, c in code if SHOWS_FIGURE.search("".join(c["source"]))}
    missing = [i for i in sorted(figures) if not _alt(nb["cells"][i]).strip()]
    assert not missing, f"{path.name}: cells {missing} show a figure without metadata mystnb.image.alt"
    stray = [i for i, c in code if _alt(c) and i not in figures]
    assert not stray, f"{path.name}: cells {stray} carry alt text but show no figure the rule recognises"


def test_figure_rule_matches_figure_cells_only():
    shows = ["plt.show()", 'display(figs["x"]) if "x" in figs else None', 'display(figures["layout"])',
             "display(Image(filename=p))", "speedup_figure(results)", "display(fig)"]
    plain = ["display(Markdown(lesson.boehm_table(results)))", "figures = draw_figures(results)",
             "for fig in figures.values():\n    plt.close(fig)", "say(lesson.steps_table(shown))"]
    assert all(SHOWS_FIGURE.search(s) for s in shows)
    assert not any(SHOWS_FIGURE.search(s) for s in plain)
