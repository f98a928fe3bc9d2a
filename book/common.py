"""Small helpers every chapter's lesson and exercises share: formatting a time, a number not measured yet, the
line an exercise check prints, prose with measured numbers in it (:func:`say`), and the page's prose length
(:func:`prose_words`).

**Numbers in prose.** A paragraph that quotes a measured number is a code cell that calls :func:`say` with an
f-string, tagged ``remove-input`` (the book shows only the paragraph) and with ``jupyter.source_hidden`` set
(JupyterLab folds the code): it renders as Markdown in both, so no reader meets a raw ``{glue:text}`` role.
Paragraphs without measured numbers stay Markdown cells.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import json
import os
import re
import sys
from pathlib import Path

#: What a prose number or a table cell reads when the results file does not have it yet.
PENDING = "pending"


@functools.lru_cache(maxsize=256)
def _json_pickle(path: str, mtime_ns: int, size: int) -> bytes:
    import pickle

    return pickle.dumps(json.loads(Path(path).read_text()), protocol=pickle.HIGHEST_PROTOCOL)


def _files_state(roots) -> tuple:
    """(folder, name, mtime, size) of every file under ``roots`` (folders walked, files taken as they are)."""
    state = []
    for root in map(Path, roots):
        if root.is_file():
            st = root.stat()
            state.append((str(root), "", st.st_mtime_ns, st.st_size))
            continue
        for folder, subfolders, names in os.walk(root):
            subfolders[:] = sorted(d for d in subfolders if not d.startswith((".", "_", "__pycache__")))
            for name in sorted(names):
                st = os.stat(os.path.join(folder, name))
                state.append((folder, name, st.st_mtime_ns, st.st_size))
    return tuple(state)


def cached_on_files(fn):
    """``fn`` computed once per state of the files the pages read (the committed results, the lab's outputs, the
    notebooks and pages; and any folder passed as an argument): the results and scoreboard pages call their builders
    many times over the same files. Each call returns a fresh copy of the result (callers may change it)."""
    import pickle

    from studylog.paths import ASSETS, LAB, REPO_ROOT

    cache: dict = {}

    @functools.wraps(fn)
    def cached(*args, **kwargs):
        given = [a for a in (*args, *kwargs.values()) if isinstance(a, Path)]
        roots = [ASSETS, LAB, REPO_ROOT / "notebooks", *sorted(REPO_ROOT.glob("*.md")), *given]
        key, state = (args, tuple(sorted(kwargs.items()))), _files_state(roots)
        if key not in cache or cache[key][0] != state:
            cache[key] = state, pickle.dumps(fn(*args, **kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        return pickle.loads(cache[key][1])
    return cached


def read_json(path: str | Path):
    """A JSON file's contents, parsed once per version of the file: the pages read the same results files thousands
    of times while a book builds or its tests run. Each call returns a fresh copy (callers may change it)."""
    import pickle

    stat = Path(path).stat()
    return pickle.loads(_json_pickle(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size))


def us(ms: float | None, digits: int = 1, missing: str = "–") -> str:
    """A time given in ms, written in µs with thousands separators (``missing`` where there is none)."""
    return missing if ms is None else f"{ms * 1e3:,.{digits}f}"


def against(ours_ms: float | None, theirs_ms: float | None) -> str:
    """``"4.04 against 4.70"``: two times in µs beside their ratio, with two decimals where either is under 10 µs, so
    that the ratio of the times shown is the ratio printed beside them."""
    small = any(t is not None and t < 0.010 for t in (ours_ms, theirs_ms))
    return f"{us(ours_ms, digits=2 if small else 1)} against {us(theirs_ms, digits=2 if small else 1)}"


def is_tie(x: float | None) -> bool:
    """The course's tie rule (How we measure): a speed ratio from 0.97× to 1.03× as printed at two decimals."""
    return x is not None and 0.97 <= round(x, 2) <= 1.03


def param_values(results, name: str) -> list:
    """The values a results file's rows give parameter ``name``, each once, in the order measured."""
    seen: dict = {}
    for row in results.rows:
        if name in row["params"]:
            seen.setdefault(row["params"][name], None)
    return list(seen)


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """``value`` formatted with ``spec`` and ``suffix``, or :data:`PENDING` where there is none."""
    return PENDING if value is None else f"{value:{spec}}{suffix}"


def report(name: str, ok: bool, problem: str | None, cases: int) -> bool:
    """Print an exercise check's verdict (all inputs agree, or the first problem) and return ``ok``."""
    print(f"{name}: {'all ' + str(cases) + ' inputs agree' if ok else 'wrong: ' + str(problem)}")
    return ok


def and_list(items) -> str:
    """Items in words, as a sentence lists them: "a", "a and b", "a, b and c"."""
    items = list(items)
    return ", ".join(items[:-1]) + (" and " if len(items) > 1 else "") + (items[-1] if items else "")


def report_failures(name: str, failures: list[str], cases: int, verbose: bool = True) -> bool:
    """Print an exercise check's verdict over ``cases`` inputs from the list of its failures (the first three shown,
    or :func:`not_written` where the reader's function is still a stub) and return whether there were none."""
    if failures and all("NotImplementedError" in f for f in failures):
        not_written(name)
        return False
    if failures:
        print(f"{name}: {len(failures)} of {cases} cases differ from the chapter's answer; the first ones:")
        for f in failures[:3]:
            print("  -", f)
        return False
    if verbose:
        print(f"{name}: all {cases} cases agree with the chapter's answer")
    return True


def say(text: str) -> None:
    """Show ``text`` (Markdown, usually an f-string with measured numbers) as a paragraph of the page."""
    from IPython.display import Markdown, display

    display(Markdown(text))


@contextlib.contextmanager
def quiet_native_stderr():
    """Silence what native code (a C++ library's logger) writes to the process's stderr, inside the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def prose_text(markdown: str) -> str:
    """The prose of a piece of Markdown: without code, math, tables, directives, HTML and link targets."""
    text = re.sub(r"```.*?```|~~~.*?~~~", " ", markdown, flags=re.DOTALL)
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]*\$", " ", text, flags=re.DOTALL)
    text = re.sub(r"<!--.*?-->|<[^>]+>", " ", text, flags=re.DOTALL)
    text = re.sub(r"\{\w+(?::\w+)?\}`[^`]*`", " ", text)  # MyST roles such as {glue:text}`...`
    text = re.sub(r"`[^`]*`", " ", text)  # inline code
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", text)  # images
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: keep the text
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("|")]  # tables
    return "\n".join(lines)


def said_texts(code: str) -> list[str]:
    """The literal text of every ``say(...)`` call in a code cell (an f-string's text without its fields)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    def text(node) -> list[str]:  # the literal pieces of one argument: strings, f-strings, their concatenations
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.JoinedStr):  # an f-string's fields are no prose
            return [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return text(node.left) + text(node.right)
        if isinstance(node, ast.IfExp):  # one branch is shown: count the longer
            return max(text(node.body), text(node.orelse), key=lambda pieces: len(" ".join(pieces).split()))
        return []  # a name or a call: text built elsewhere (a table, a computed sentence) is not counted here

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "say":
            for arg in node.args:
                out += text(arg)
    return out


def prose_words(path: str | Path) -> int:
    """Words of prose a reader reads on a page: Markdown cells and the text of :func:`say` calls in a notebook
    (or a whole ``.md`` file), without code, math, tables, directives and link targets. Numbers count as words;
    headings count."""
    path = Path(path)
    if path.suffix == ".ipynb":
        pieces = []
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                pieces.append(source)
            elif cell["cell_type"] == "code":
                pieces += said_texts(source)
    else:
        pieces = [path.read_text()]
    return sum(len(re.findall(r"[^\W_](?:[\w'’.,-]*[^\W_])?", prose_text(p))) for p in pieces)


def rendered_words(html: str) -> int:
    """Words of prose a reader reads on a built page (its HTML): the article's text, every paragraph a cell printed
    included, without code, listings and diffs, tables, math and folded blocks. The budget's measure: what the page
    shows, not only what its Markdown cells hold."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    article = soup.find("article") or soup.find("main") or soup
    drop = article.find_all(["pre", "table", "script", "style", "details"])
    drop += article.select("div.highlight, div.cell_input, a.headerlink, span.math, div.math, mjx-container")
    drop += article.find_all(style=re.compile("monospace"))  # the diffs and listings a cell draws
    for tag in drop:
        if not tag.decomposed:
            tag.decompose()
    return len(re.findall(r"[^\W_](?:[\w'’.,-]*[^\W_])?", article.get_text(" ")))


def page_words(page: str | Path) -> int:
    """:func:`rendered_words` of one page of the book: an ``.html`` file as it is, or a notebook or Markdown page
    built alone (Jupyter Book's single-page build, its cells executed) into a temporary folder."""
    import subprocess
    import tempfile

    page = Path(page)
    if page.suffix == ".html":
        return rendered_words(page.read_text())
    import os
    import shutil

    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as out:
        if page.resolve().parent == root:  # a page at the book's root: alone, the build would read the whole checkout
            (Path(out) / "src").mkdir()
            page = Path(shutil.copy(page, Path(out) / "src" / page.name))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        run = subprocess.run(["jupyter-book", "build", str(page.resolve()), "--path-output", out,
                              "--config", str(root / "_config.yml")], capture_output=True, text=True, env=env)
        built = next(Path(out, "_build", "_page").glob(f"*/html/{page.stem}.html"), Path(out, "missing"))
        if run.returncode or not built.is_file():
            raise RuntimeError(f"building {page} alone failed: {(run.stdout + run.stderr)[-2000:]}")
        return rendered_words(built.read_text())


def without_docstrings(text: str) -> str:
    """Python source without its docstrings (a step's diff shows what the code does differently)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    drop: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            drop.update(range(body[0].lineno, body[0].end_lineno + 1))
    return "\n".join(line for i, line in enumerate(text.splitlines(), 1) if i not in drop)


def latency_floor_ms(results) -> float:
    """The run's latency floor, in ms: the empty kernel's GPU time measured in the run of ``results``, as its byte
    floors use that run's copy bandwidth (the scoreboard's rule); else the smallest of any committed run on its card
    (:func:`book.scoreboard.card_empty_kernel_ms`: a run that timed no empty kernel), else 0."""
    from book.scoreboard import card_empty_kernel_ms, empty_kernel_ms

    card = card_empty_kernel_ms(results.path.parent) if getattr(results, "path", None) else None
    return empty_kernel_ms(results.data) or card or 0.0


def floor_ms(results, nbytes: float) -> float:
    """The book's floor of a call, in ms: the larger of its bytes at the run's copy bandwidth (read plus written per
    second) and the card's latency floor (:func:`latency_floor_ms`). The scoreboard's definition, on every page."""
    return max(nbytes / (results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9) * 1e3, latency_floor_ms(results))


def lab_or_none(chapter: str, name: str, gpu: str = "nvidia-h200"):
    """An experiment's committed output (:func:`studylog.plotting.load_lab`), or None where that run is not
    committed: a page shows an experiment's table only where its run exists."""
    from studylog.plotting import load_lab

    try:
        return load_lab(chapter, name, gpu)
    except FileNotFoundError:
        return None


def function_listing(function, title: str):
    """One function's source without its docstring, titled (a ``studylog.source.Code``): a step's core, shown open."""
    from studylog import source

    return source.Code(without_docstrings(source.source_of(function)[0]), "python", title)


def function_diff(old, new, names: tuple[str, str]):
    """The diff from one function to another, without their docstrings (a ``studylog.source.Diff``): a step's core,
    where its kernel's own diff would show only the call."""
    from studylog import source

    text = [without_docstrings(source.source_of(f)[0]) for f in (old, new)]
    return source.show_diff(*text, names=names)


def step_diff(chapter, old, new, *, docstrings: bool = False, context: int = 3):
    """The diff from one step of ``chapter`` to the next, without the functions' docstrings unless asked (a
    ``studylog.source.Diff``: HTML in the book and JupyterLab, text in a terminal)."""
    from studylog import source

    a, b = chapter.step(old), chapter.step(new)
    texts = [source.source_of(s.source, s.source_function)[0] for s in (a, b)]
    if not docstrings:
        texts = [without_docstrings(t) for t in texts]
    return source.show_diff(texts[0], texts[1], context=context, names=(a.name, b.name))


#: What an exercise's check prints after its name when the reader's function is still the page's stub. JupyterLab
#: shows the line; the built site leaves it out (``book.site``: an unsolved check is no news on a page a reader reads).
NOT_WRITTEN = "not written yet: write the function in this cell, then run it again"


def not_written(name: str) -> None:
    """Print the line a check prints for a function that is still the page's stub (:data:`NOT_WRITTEN`)."""
    print(f"{name}: {NOT_WRITTEN}")


def guarded(check):
    """Wrap an exercise's check: a reader's function that still raises ``NotImplementedError`` (the stub the page
    gives) gets a note that it is not written yet, instead of a traceback."""

    @functools.wraps(check)
    def run(fn, *args, **kwargs):
        try:
            return check(fn, *args, **kwargs)
        except NotImplementedError:
            not_written(check.__name__)
            return False

    return run


def gpu_us(fn, rep_ms: int = 100) -> float | None:
    """Median GPU time of ``fn()`` in µs, replayed in a CUDA graph (``triton.testing.do_bench_cudagraph``): the
    exercises' stopwatch for a kernel a reader changed. Without a GPU it says so and returns None (Triton's
    interpreter checks what a kernel computes, not how fast)."""
    import torch

    if not torch.cuda.is_available():
        print("timing needs a GPU: here the kernel ran in Triton's interpreter, which checks correctness only")
        return None
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms)) * 1e3


def diff_parts(diff, max_changed: int = 40) -> list:
    """A long diff cut into parts of at most about ``max_changed`` changed lines each, at hunk boundaries (a hunk
    longer than that is cut at a line), each titled "part i of n": a step that bundles changes is shown piece by
    piece instead of as one long listing."""
    from studylog.source import Diff

    pieces: list[list[str]] = [[]]
    changed = 0
    for line in diff.lines[2:]:
        if line.startswith("@@") and changed >= max_changed // 2:
            pieces.append([])
            changed = 0
        elif changed >= max_changed and not line.startswith("@@"):
            pieces.append(["@@ (continued) @@"])
            changed = 0
        pieces[-1].append(line)
        changed += line[:1] in "+-"
    pieces = [p for p in pieces if any(ln[:1] in "+-" for ln in p)]
    parts = []
    for i, piece in enumerate(pieces, 1):
        part = Diff.__new__(Diff)
        part.old_name = diff.old_name
        part.new_name = f"{diff.new_name} (part {i} of {len(pieces)})" if len(pieces) > 1 else diff.new_name
        part.lines = diff.lines[:2] + piece
        parts.append(part)
    return parts


def listing_parts(code, max_lines: int = 40) -> list:
    """A long listing (a ``studylog.source.Code``) cut into parts of at most about ``max_lines`` lines, at blank
    lines where it can, each titled "part i of n"."""
    from studylog.source import Code

    lines = code.text.splitlines()
    pieces: list[list[str]] = [[]]
    for line in lines:
        full = len(pieces[-1]) >= max_lines or (len(pieces[-1]) >= max_lines * 3 // 4 and not line.strip())
        if full:
            pieces.append([])
        if line.strip() or pieces[-1]:
            pieces[-1].append(line)
    pieces = [p for p in pieces if p]
    title = code.title or ""
    return [Code("\n".join(p), code.language, f"{title} (part {i} of {len(pieces)})" if len(pieces) > 1 else title)
            for i, p in enumerate(pieces, 1)]


def cu_kernel(file: str, name: str) -> str:
    """The text of one ``extern "C" __global__`` function of a ``.cu`` file of the library (``studylog/csrc`` or a
    chapter's ``csrc``), from its signature to its closing brace: no file comment before it."""
    import studylog

    root = Path(studylog.__file__).parent
    path = next(p for p in root.rglob(file) if p.is_file())
    text = path.read_text()
    m = re.search(r'^extern "C" __global__ void ' + re.escape(name) + r"\(.*?^\}", text, flags=re.DOTALL | re.MULTILINE)
    if m is None:
        raise KeyError(f"{file} has no kernel {name!r}")
    return m.group(0)


def changed_lines(diff) -> int:
    """How many lines a diff adds and removes."""
    return len(diff.added) + len(diff.removed)


def read_table(lines: list[str], i: int) -> tuple[list[str], list[list[str]], int]:
    """The Markdown table whose header is ``lines[i]``: its header cells, its rows' cells, the index after it."""
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
    end = i + 2
    while end < len(lines) and lines[end].startswith("| "):
        end += 1
    return cells(lines[i]), [cells(line) for line in lines[i + 2:end]], end


#: The most prose a chapter page may hold, in words (:func:`prose_words`).
PROSE_BUDGET = 2500

__all__ = ["PENDING", "PROSE_BUDGET", "changed_lines", "cu_kernel", "diff_parts", "fmt", "function_diff",
           "function_listing", "gpu_us", "guarded", "listing_parts", "page_words", "prose_text", "prose_words",
           "quiet_native_stderr", "read_table", "rendered_words", "report", "said_texts", "say", "step_diff", "us"]


# Chain tables: a bundled step timed one change at a time

@dataclasses.dataclass(frozen=True)
class ChainRow:
    """One row of a chain table: its label ("5a", "step 5"), the one change it adds over the row above, and its time
    per case (µs, or the unit the table names). ``remeasure`` marks a row that times the same kernel as the row
    above (an anchor timed again): its ratio is shown, but not as a change that pays or does not."""

    label: str
    change: str
    us: dict
    remeasure: bool = False


def chain_factor(before: float, after: float, *, remeasure: bool = False) -> str:
    """A chain row's "× previous" cell: the row above's time over this row's, marked where a change costs time."""
    x = before / after
    return f"{x:.2f}×" + ("" if remeasure or round(x, 2) >= 1 else ", does not pay")


def chain_factors(rows: list[ChainRow]) -> dict[str, dict]:
    """Per row but the first: {case: the row above's time over this row's}."""
    return {b.label: {c: a.us[c] / b.us[c] for c in b.us} for a, b in zip(rows, rows[1:])}


def chain_table(rows: list[ChainRow], cases: list, case_name=str, *, unit: str = "µs", digits: int = 1,
                grouped: bool = False) -> str:
    """Markdown of a chain: row | the one change | per case its time and × previous (the first row, the anchor,
    has none). ``case_name(case)`` heads a case's columns; ``grouped`` puts every case's times first, then every
    case's ratios (for many cases), instead of a time and its ratio side by side."""
    if len(rows) < 2:
        raise ValueError(f"a chain needs an anchor and at least one change, got {len(rows)} row(s)")
    for row in rows:
        missing = [c for c in cases if c not in row.us]
        if missing:
            raise ValueError(f"chain row {row.label!r} has no time at case(s) {missing}")
    times = [f"{case_name(c)}: {unit}" for c in cases]
    ratios = [f"× previous" + (f", {case_name(c)}" if grouped else "") for c in cases]
    head = ["row", "the one change"] + (times + ratios if grouped else [h for p in zip(times, ratios) for h in p])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, row in enumerate(rows):
        t = [f"{row.us[c]:,.{digits}f}" for c in cases]
        f = ["anchor" if i == 0 else chain_factor(rows[i - 1].us[c], row.us[c], remeasure=row.remeasure)
             for c in cases]
        cells = t + f if grouped else [x for p in zip(t, f) for x in p]
        lines.append("| " + " | ".join([row.label, row.change] + cells) + " |")
    return "\n".join(lines)


def chain_note(first: str, last: str, gap: float) -> str:
    """The sentence under a chain table timed in a run of its own: how far its two anchors sit from the steps
    table (the run-to-run spread; "How we measure" says why such a table keeps its own run)."""
    return f"One run of its own: its {first} and {last} sit within {gap_words(gap)} of the steps table."


def gap_words(gap: float) -> str:
    """A relative gap as a percentage; one under 10% keeps a decimal ("0%" would say there is none)."""
    return f"{gap:.1%}" if gap < 0.1 else f"{gap:.0%}"
