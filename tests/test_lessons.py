"""Every chapter reads as a lesson: no insider words, numbers in prose that come from data, exercises that a
reader can check on a CPU, and links to the public work each chapter builds on."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CHAPTER_NOTEBOOKS = [p for p in NOTEBOOKS if not p.name.startswith("00_")]
PAGES = [ROOT / name for name in ("README.md", "intro.md", "results.md", "how_we_measure.md", "posts.yml")]

#: Words only someone who built the course knows: project issues, source documents, the loaned machine,
#: commit hashes. A reader meets links to public work instead.
INSIDER = [
    (re.compile(r"\bthe issue(?:'s)?\b|\bthis issue\b|\bissue #\d+\b", re.IGNORECASE), "an issue of the project"),
    (re.compile(r"\bseed(?:'s)? (?:post|document|notebook|PR|pull request|kernel|revision)s?\b|\bthe seed(?:'s)?\b",
                re.IGNORECASE), "the source documents ('seed')"),
    (re.compile(r"\b(?:the|a|project) brief\b", re.IGNORECASE), "the project brief"),
    (re.compile(r"\b(?:machine|GPU|card|H100|H200) (?:was |we were )?lent\b|\blent (?:machine|GPU)\b", re.IGNORECASE),
     "the loaned machine"),
    (re.compile(r"\b0{3}_[0-9a-f]{16}\.txt\b"), "a source document's file name"),
    (re.compile(r"(?<![\w/.#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w/.-])"), "a commit hash"),
]

#: A measured quantity written into prose: a number with a unit of time, speed, size or ratio ("4096 × 14336" is
#: a shape, not a ratio).
NUMBER_WITH_UNIT = re.compile(r"(?<![\w.{`$×])\d[\d,]*(?:\.\d+)?\s?(?:µs|us|ms|ns|s|(?:x|×)(?!\s?\d)|%|GB/s|TB/s|TFLOP/s|TFLOPS|"
                              r"MB|GB|KB|MiB|GiB)(?![\w])")


def _cells(path: Path, kind: str) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == kind]


def _reader_text(path: Path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join(_cells(path, "markdown") + _cells(path, "code"))
    return path.read_text()


@pytest.mark.parametrize("path", NOTEBOOKS + PAGES, ids=lambda p: p.name)
def test_no_insider_words(path):
    text = _reader_text(path)
    found = [f"{what}: {m.group(0)!r}" for pattern, what in INSIDER for m in pattern.finditer(text)]
    assert not found, f"{path.name} speaks to insiders: {found[:8]}"


def _prose_paragraphs(markdown: str) -> list[str]:
    """Paragraphs of a Markdown cell without code, math, glued values and link targets."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.DOTALL)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]*\$", " ", text, flags=re.DOTALL)
    text = re.sub(r"\{glue(?::\w+)?\}`[^`]*`", " ", text)
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_numbers_in_prose_come_from_data(path):
    """A measured number in prose is computed in a cell or glued from the committed JSON (myst-nb ``glue``);
    a number quoted from elsewhere sits in a paragraph that links its source."""
    typed = []
    for cell in _cells(path, "markdown"):
        for paragraph in _prose_paragraphs(cell):
            if re.search(r"\]\(https?://", paragraph):
                continue  # quoted from a linked source
            typed += NUMBER_WITH_UNIT.findall(paragraph)
    assert not typed, f"{path.name}: numbers typed into prose (glue them from data or cite a source): {typed[:10]}"


@pytest.mark.parametrize("path", CHAPTER_NOTEBOOKS, ids=lambda p: p.name)
def test_a_chapter_ends_with_exercises_and_further_reading(path):
    markdown = "\n".join(_cells(path, "markdown"))
    code = "\n".join(_cells(path, "code"))
    assert re.search(r"^#+ .*Exercises", markdown, flags=re.MULTILINE), f"{path.name}: no Exercises section"
    assert re.search(r"^#+ .*Further reading", markdown, flags=re.MULTILINE), f"{path.name}: no Further reading"
    checks = set(re.findall(r"\bexercises\.(check_\w+)\(", code))
    assert len(checks) >= 3, f"{path.name}: exercises need three or more check functions a reader can run, got {checks}"
    reading = markdown[markdown.rfind("Further reading"):]
    assert len(re.findall(r"\]\(https?://", reading)) >= 2, f"{path.name}: further reading needs links"


@pytest.mark.parametrize("path", CHAPTER_NOTEBOOKS, ids=lambda p: p.name)
def test_a_chapter_links_the_public_work_it_builds_on(path):
    links = re.findall(r"\]\((https?://[^)\s]+)\)", "\n".join(_cells(path, "markdown")))
    assert len(set(links)) >= 3, f"{path.name}: cites {len(set(links))} public sources"


def _notebook(tmp_path, cells) -> Path:
    path = tmp_path / "page.ipynb"
    path.write_text(json.dumps({"cells": [{"cell_type": kind, "metadata": {}, "source": src} for kind, src in cells],
                                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_the_word_counter_counts_prose_only(tmp_path):
    from book.common import prose_words

    page = _notebook(tmp_path, [
        ("markdown", "# A title\n\nTwo [linked words](https://example.com/a/b/c) and `code here`, $x + y$.\n\n"
                     "| a | table |\n|---|---|\n| not | prose |\n\n```python\nnot = prose\n```\n"),
        ("code", "import numpy\nsay(f\"Said in {numpy.pi:.2f} words.\")\nprint('not prose')"),
    ])
    # "A title" (2) + "Two linked words and" (4) + "Said in" and "words." (3)
    assert prose_words(page) == 9
    joined = _notebook(tmp_path, [
        ("code", "say(f\"One {1} two\" + \" three four\" + table)\nsay(\"five six\" if ok else \"seven\")"),
    ])
    # a concatenation counts each literal piece (not the table built elsewhere); a choice its longer branch
    assert prose_words(joined) == 6


def test_the_page_counter_counts_what_a_page_shows_outside_code_tables_and_folds():
    from book.common import rendered_words

    html = """<html><nav>Site navigation words</nav><article><h1>A title<a class="headerlink">#</a></h1>
    <p>Two words and <code>code</code>.</p><div class="cell_output"><p>A printed sentence.</p></div>
    <div class="highlight"><pre>not = prose</pre></div><table><tr><td>not prose</td></tr></table>
    <details><summary>folded</summary><p>not read unless opened</p></details>
    <div style="font-family: monospace"><div>- a diff line</div></div><span class="math">x + y</span></article></html>"""
    # "A title" (2) + "Two words and code." (4) + "A printed sentence." (3); no navigation, code block, table, fold,
    # diff or math
    assert rendered_words(html) == 9


@pytest.mark.parametrize("path", NOTEBOOKS + [ROOT / "how_we_measure.md"], ids=lambda p: p.name)
def test_prose_fits_the_budget(path):
    """A page holds at most about 2,500 words of prose (Markdown cells and ``say`` paragraphs)."""
    from book.common import PROSE_BUDGET, prose_words

    words = prose_words(path)
    assert words <= PROSE_BUDGET, f"{path.name}: {words:,} words of prose, over the budget of {PROSE_BUDGET:,}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_glue_placeholder_a_notebook_reader_would_see(path):
    """JupyterLab does not render myst-nb's ``{glue:text}`` roles: a paragraph with measured numbers is a hidden
    code cell that calls ``book.common.say`` with an f-string, which renders in JupyterLab and in the book."""
    raw = [m.group(0) for cell in _cells(path, "markdown") for m in re.finditer(r"\{glue(?::\w+)?\}`[^`]*`", cell)]
    assert not raw, f"{path.name}: glue roles in Markdown a notebook reader sees raw: {raw[:5]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_plumbing_is_hidden(path):
    """A cell that only writes prose (``say``) or stores a value for prose (``glue``) shows its output, not its
    code: tagged ``remove-input`` for the book and folded (``source_hidden``) in JupyterLab."""
    shown = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or not re.search(r"\b(?:say|glue)\(", source):
            continue
        meta = cell.get("metadata", {})
        tags = set(meta.get("tags", []))
        if not tags & {"remove-input", "remove-cell", "hide-input"} or not meta.get("jupyter", {}).get("source_hidden"):
            shown.append(i)
    assert not shown, f"{path.name}: code cells {shown} write prose or glue values but show their code"


def _exercise_code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    start = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                  and re.search(r"^#+ .*Exercises", "".join(c["source"]), flags=re.MULTILINE)), len(cells))
    return "\n".join("".join(c["source"]) for c in cells[start:] if c["cell_type"] == "code")


@pytest.mark.parametrize("path", CHAPTER_NOTEBOOKS, ids=lambda p: p.name)
def test_exercises_do_not_give_their_answers_away(path):
    """The exercise cells leave the function to the reader: no answer imported or run on the page (the answers
    live in ``book/<chapter>/solutions.py``, which only the checks load)."""
    code = _exercise_code(path)
    assert code, f"{path.name}: no exercise cells"
    assert not re.search(r"\bsolutions\b|\breference_\w+\b", code), f"{path.name}: the exercises run their answers"
    defined = set(re.findall(r"^def (\w+)\(", code, flags=re.MULTILINE))
    checked = re.findall(r"\bexercises\.check_\w+\((\w[\w.]*)", code)
    given = [name for name in checked if name not in defined]
    assert not given, f"{path.name}: checks run on functions the page hands over, not the reader's: {given}"


def _prose_lines(path: Path) -> list[str]:
    """The lines of prose a page renders: Markdown cells and ``say`` text, fenced code left out."""
    from book.common import said_texts

    pieces = []
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        pieces += [source] if cell["cell_type"] == "markdown" else said_texts(source) if cell["cell_type"] == "code" else []
    text = re.sub(r"```.*?```", "", "\n".join(pieces), flags=re.DOTALL)
    return text.splitlines()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_accidental_markdown(path):
    """A wrapped line that starts with "+ " becomes a bullet, and a bare ``__name__`` becomes bold: prose writes
    them inside a sentence and code in backticks."""
    lines = _prose_lines(path)
    bullets = [ln for ln in lines if re.match(r"\s*\+ ", ln)]
    assert not bullets, f"{path.name}: lines that Markdown turns into bullets: {bullets[:3]}"
    bold = [m.group(0) for ln in lines for m in re.finditer(r"(?<![`\w])__\w+__(?![`\w])", re.sub(r"`[^`]*`", "", ln))]
    assert not bold, f"{path.name}: names Markdown turns bold: {bold[:3]}"


def test_the_chain_table_computes_each_ratio_from_its_own_cells():
    import random

    from book.common import ChainRow, chain_table

    rng = random.Random(7)
    cases = [1, 16, 256]
    rows = [ChainRow(label, f"change {label}", {c: rng.uniform(5, 50) for c in cases}) for label in ("4", "5a", "5b")]
    rows.append(ChainRow("5", "timed again", dict(rows[-1].us), remeasure=True))
    for grouped in (False, True):
        lines = chain_table(rows, cases, lambda c: f"N = {c}", grouped=grouped).splitlines()
        assert len(lines) == 2 + len(rows)
        for i, line in enumerate(lines[2:]):
            cells = [c.strip() for c in line.strip("|").split("|")]
            times = [float(c.replace(",", "")) for c in (cells[2:5] if grouped else cells[2::2])]
            ratios = cells[5:] if grouped else cells[3::2]
            for c, t, r in zip(cases, times, ratios):
                assert abs(t - rows[i].us[c]) < 0.051
                if i == 0:
                    assert r == "anchor"
                    continue
                x = rows[i - 1].us[c] / rows[i].us[c]
                assert r.startswith(f"{x:.2f}×")
                assert r.endswith("does not pay") == (round(x, 2) < 1 and not rows[i].remeasure)


def test_the_chain_table_refuses_a_row_without_a_case():
    from book.common import ChainRow, chain_table

    rows = [ChainRow("4", "", {1: 1.0}), ChainRow("5a", "x", {2: 1.0})]
    with pytest.raises(ValueError, match="5a"):
        chain_table(rows, [1], str)
    with pytest.raises(ValueError, match="anchor"):
        chain_table(rows[:1], [1], str)
