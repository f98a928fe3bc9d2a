"""The command lines (``python -m studylog``, and the book's ``python -m book plot``): bad arguments are one
``error: ...`` line and exit status 2, never a traceback; the help is plain text and lists the chapters and their own
tools; ``--version``; ``info`` reports what runs here (versions, the GPU, the kernels' mode and why)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import studylog
from book.__main__ import main as book_main
from book.plotting import FIGURE_CHAPTERS
from studylog import paths
from studylog.__main__ import CHAPTER_TOOLS, PACKAGES, main
from studylog.chapter import CHAPTERS


def _run(argv, capsys, entry=main) -> tuple[int, str, str]:
    """entry(argv) as the shell sees it: (exit status, stdout, stderr)."""
    try:
        code = entry(argv)
    except SystemExit as exc:  # argparse's own exits (--help, --version, a bad option)
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [
    ["bench", "nope"],
    ["bench", "ctc", "nope"],
    ["bench", "all", "ctc"],
    ["bench", "fsm"],              # a chapter without a benchmark
    ["bench"],
    ["bench", "verify"],
    ["bench", "verify", "a", "b"],
    ["bench", "verify", "/no/such/folder"],
    ["plot", "all"],               # figures are the book's: python -m book plot
    ["frobnicate"],
    [],
], ids=lambda a: " ".join(a) or "nothing")
def test_a_bad_command_line_is_one_error_line_and_status_2(argv, capsys):
    code, out, err = _run(argv, capsys)
    assert code == 2, (code, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err + out


def test_a_bad_chapter_name_says_which_names_exist(capsys):
    code, _, err = _run(["bench", "nope"], capsys)
    assert code == 2 and "'nope'" in err and all(name in err for name in CHAPTERS)


#: Run by a fresh interpreter: each command line as ``python -m MODULE ARGS...`` runs it (``runpy`` with
#: ``run_name="__main__"``, so the module's ``if __name__ == "__main__"`` exit is what decides the status), its
#: output captured; an exception that escapes is printed with its traceback and gives status 1, as the shell's
#: ``python -m`` does. One interpreter for every command: each start imports torch.
SHELL_RUNNER = textwrap.dedent('''
    import contextlib, io, json, runpy, sys, traceback

    results = []
    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        sys.argv = [argv[0], *argv[1:]]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if not isinstance(exc.code, (int, type(None))):
                    print(exc.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
                code = 1
        results.append({"argv": argv, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
    print(json.dumps(results))
''')

#: What the shell runs: a bad chapter name for each command line, and each chapter tool's help.
SHELL_COMMANDS = [["studylog", "bench", "nope"], ["book", "plot", "nope"],
                  *[[module, "--help"] for module in sorted(CHAPTER_TOOLS)]]


@pytest.fixture(scope="module")
def shell():
    """``python -m`` of every command of :data:`SHELL_COMMANDS` in one fresh interpreter (away from this process's
    imports and its sys.argv): ``" ".join(argv)`` -> (exit status, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-c", SHELL_RUNNER, json.dumps(SHELL_COMMANDS)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stdout + proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["argv"] for r in results] == SHELL_COMMANDS
    return {" ".join(r["argv"]): (r["code"], r["stdout"], r["stderr"]) for r in results}


def test_no_traceback_from_the_shell(shell):
    for argv in ("studylog bench nope", "book plot nope"):
        code, out, err = shell[argv]
        assert code == 2, (argv, code, out, err)
        assert err.startswith("error: unknown chapter 'nope'") and "Traceback" not in err, err


def test_help_is_plain_text_and_lists_the_chapters_and_their_tools(capsys):
    code, out, _ = _run(["--help"], capsys)
    assert code == 0
    for markup in ("``", ":func:", ":class:", ":mod:", ":data:"):
        assert markup not in out, markup
    for name in CHAPTERS:
        assert name in out
    tools = sorted(f"studylog.{p.parent.name}" for p in paths.PACKAGE.glob("*/__main__.py"))
    assert tools == sorted(CHAPTER_TOOLS), "a chapter's __main__.py is missing from CHAPTER_TOOLS (or the reverse)"
    for module in tools:
        assert f"python -m {module}" in out
    for command in ("info", "bench"):
        code, sub, _ = _run([command, "--help"], capsys)
        assert code == 0 and "``" not in sub


@pytest.mark.parametrize("module", sorted(CHAPTER_TOOLS))
def test_the_help_names_every_command_of_each_chapter_tool(shell, module):
    _, out, err = shell[f"{module} --help"]  # its help, or its one-line usage (status 2)
    text = out + err
    assert "Traceback" not in text, text
    choices = re.search(r"\{([\w,-]+)\}", text)
    commands = choices.group(1).split(",") if choices else [re.search(rf"{module} (\S+)", text).group(1)]
    listed = CHAPTER_TOOLS[module][0]
    assert all(re.search(rf"(^|[ |]){re.escape(c)}($|[ |])", listed) for c in commands), (commands, listed)


def test_version(capsys):
    code, out, _ = _run(["--version"], capsys)
    assert code == 0
    assert out.strip() == f"studylog {studylog.__version__}" == f"studylog {importlib.metadata.version('studylog')}"


def test_info_is_a_doctor(capsys):
    code, out, _ = _run(["info"], capsys)
    assert code == 0
    assert f"python {sys.version.split()[0]}" in out
    for dist in PACKAGES:
        assert f"  {dist} " in out, dist
    assert "NVRTC library" in out and "C compiler" in out
    assert "mode: " in out and "because " in out
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        assert props.name in out and f"compute capability {props.major}.{props.minor}" in out
    else:
        assert "GPU: no GPU" in out and "Interpreter mode" in out
        assert ("CPU-only build" in out) == (torch.version.cuda is None)


def test_info_says_what_is_not_installed(capsys, monkeypatch):
    real = importlib.metadata.version

    def version(dist):
        if dist == "xgrammar":
            raise importlib.metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(importlib.metadata, "version", version)
    code, out, _ = _run(["info"], capsys)
    assert code == 0
    (line,) = [line for line in out.splitlines() if line.strip().startswith("xgrammar")]
    assert "not installed" in line


def test_outside_a_checkout_bench_needs_out_and_plot_refuses(capsys, monkeypatch):
    monkeypatch.setattr(paths, "CHECKOUT", False)
    code, _, err = _run(["bench", "env"], capsys)
    assert code == 2 and "--out" in err and err.count("\n") == 1
    code, _, err = _run(["plot", "env"], capsys, entry=book_main)
    assert code == 1 and err.startswith("error: ") and "checkout" in err


# --------------------------------------------------------------------------------------------------
# python -m book plot
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["plot", "nope"],
    ["plot", "all", "ctc"],
    ["plot"],
    ["plot", "ngram", "--nope"],
    ["frobnicate"],
    [],
], ids=lambda a: " ".join(a) or "nothing")
def test_a_bad_book_command_line_is_one_error_line_and_status_2(argv, capsys):
    code, out, err = _run(argv, capsys, entry=book_main)
    assert code == 2, (code, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err + out


def test_book_plot_names_the_chapters_that_draw_figures(capsys):
    code, _, err = _run(["plot", "nope"], capsys, entry=book_main)
    assert code == 2 and "'nope'" in err and all(name in err for name in FIGURE_CHAPTERS)
    code, out, _ = _run(["plot", "--help"], capsys, entry=book_main)
    assert code == 0 and "``" not in out and all(name in out for name in FIGURE_CHAPTERS)


def test_every_chapter_with_figures_is_plotted_in_the_course_order():
    """``python -m book plot all`` draws every ``book/<chapter>/figures.py``, in the order of the chapters."""
    drawn = {p.parent.name for p in (paths.REPO_ROOT / "book").glob("*/figures.py")}
    assert set(FIGURE_CHAPTERS) == drawn
    assert list(FIGURE_CHAPTERS) == [name for name in CHAPTERS if name in drawn]
