"""The chapter protocol: every chapter declares its steps, benchmark and headline, and a step
has one name everywhere (function, series, legend, notebook)."""

import importlib
import json
import re

import pytest

from studylog import chapter, paths
from studylog.chapter import Chapter, Step

NAMES = list(chapter.CHAPTERS)
LIBRARY_MODULE_LINES = 600  # no module of the library (Python or CUDA) may grow past this: one sitting's read


@pytest.mark.parametrize("name", NAMES)
def test_every_registered_chapter_declares_itself(name):
    declared = chapter.get(name)
    assert isinstance(declared, Chapter) and declared.name == name
    for notebook in declared.notebooks:
        assert (paths.REPO_ROOT / "notebooks" / f"{notebook}.ipynb").is_file(), notebook
    for s in declared.steps:
        assert isinstance(s, Step)
        assert re.fullmatch(r"step\d\d_[a-z0-9_]+", s.name) and s.series == s.name[:6]


@pytest.mark.parametrize("name", NAMES)
def test_a_step_has_one_name_everywhere(name):
    """The public function of step N is called ``stepNN_<slug>`` and is exported by the chapter's package."""
    declared = chapter.get(name)
    package = importlib.import_module(chapter.CHAPTERS[name])
    for s in declared.steps:
        if s.function is None:
            continue
        assert s.function.__name__ == s.name, (s.function.__name__, s.name)
        assert getattr(package, s.name) is s.function, f"{s.name} is not in {package.__name__}'s API"
        assert s.name in getattr(package, "__all__", [s.name]), f"{s.name} missing from __all__"


@pytest.mark.parametrize("name", NAMES)
def test_every_step_shows_its_source_and_its_diff(name):
    declared = chapter.get(name)
    shown = [s for s in declared.steps if s.source is not None]
    for s in shown:
        assert str(declared.show_source(s.number)).strip()
    for old, new in zip(shown, shown[1:]):
        diff = declared.show_diff(old.number, new.number)
        assert diff.lines, f"{old.name} -> {new.name}: no difference"


def test_lookup_by_number_name_and_series():
    s = Step(9, "tma", "TMA copies", "cuda")
    c = Chapter("demo", 9, "Demo", (), (Step(8, "mma", "MMA", "cuda"), s))
    assert c.step(9) is c.step("step09_tma") is c.step("step09") is s is c.final
    assert c.label("step09") == "step09_tma" and c.label("cublas") == "cublas"
    with pytest.raises(KeyError, match="no step 'step07'.*step08_mma, step09_tma"):
        c.step("step07")
    with pytest.raises(ValueError, match="out of order"):
        Chapter("demo", 9, "Demo", (), (s, Step(8, "mma", "MMA", "cuda")))
    with pytest.raises(ValueError, match="the same"):
        Chapter("demo", 9, "Demo", (), (s, s))
    with pytest.raises(ValueError, match="slug"):
        Step(1, "Bad Name", "x", "cuda")
    with pytest.raises(ValueError, match="language"):
        Step(1, "ok", "x", "fortran")
    with pytest.raises(ValueError, match="unknown chapter 'nope'"):
        chapter.get("nope")
    with pytest.raises(ValueError, match="declares no headline"):
        chapter.select(["env"], need="headline")  # the ceilings have no headline
    assert [c.name for c in chapter.select(["env"], need="bench")] == ["env"]


def test_no_library_module_is_too_long_to_read_in_one_sitting():
    long = {str(p.relative_to(paths.REPO_ROOT)): n for p in paths.PACKAGE.rglob("*")
            if p.suffix in (".py", ".cu", ".cuh") and (n := len(p.read_text().splitlines())) > LIBRARY_MODULE_LINES}
    assert not long, f"modules over {LIBRARY_MODULE_LINES} lines: {long}"


@pytest.mark.parametrize("notebook", sorted((paths.REPO_ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebooks_use_only_public_names(notebook):
    """A notebook never reaches into a private name of the package (``T._ms``, ``mi._attend``...)."""
    cells = json.loads(notebook.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    private = sorted(set(re.findall(r"\b[A-Za-z]\w*\.(_[a-z]\w*)\b", code)))
    assert not private, f"{notebook.name} uses private names: {private}"


def test_the_library_holds_no_experiment_tree():
    """Experiments live in lab/, beside the library: no tools/experiments, no assets/experiments."""
    assert not (paths.REPO_ROOT / "tools" / "experiments").exists()
    assert not (paths.ASSETS / "experiments").exists()
    for folder in sorted(p for p in paths.LAB.iterdir() if p.is_dir()) if paths.LAB.is_dir() else []:
        assert (folder / "README.md").is_file(), f"{folder} has no README"
