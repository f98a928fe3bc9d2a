"""The command line (``python -m studylog``): bad arguments are one ``error: ...`` line and exit status 2, never a
traceback; the help is plain text and lists the chapters and their own tools; ``--version``; ``info`` reports what
runs here (versions, the GPU, the kernels' mode and why)."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

import pytest
import torch

import studylog
from studylog import paths
from studylog.__main__ import CHAPTER_TOOLS, PACKAGES, main
from studylog.chapter import CHAPTERS


def _run(argv, capsys) -> tuple[int, str, str]:
    """main(argv) as the shell sees it: (exit status, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own exits (--help, --version, a bad option)
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [
    ["plot", "nope"],
    ["bench", "nope"],
    ["bench", "ctc", "nope"],
    ["bench", "all", "ctc"],
    ["bench", "fsm"],              # a chapter without a benchmark
    ["bench"],
    ["bench", "verify"],
    ["bench", "verify", "a", "b"],
    ["bench", "verify", "/no/such/folder"],
    ["plot"],
    ["plot", "ngram", "--nope"],
    ["frobnicate"],
    [],
], ids=lambda a: " ".join(a) or "nothing")
def test_a_bad_command_line_is_one_error_line_and_status_2(argv, capsys):
    code, out, err = _run(argv, capsys)
    assert code == 2, (code, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err + out


def test_a_bad_chapter_name_says_which_names_exist(capsys):
    code, _, err = _run(["plot", "nope"], capsys)
    assert code == 2 and "'nope'" in err and all(name in err for name in CHAPTERS)


def test_no_traceback_from_the_shell():
    for argv in (["plot", "nope"], ["bench", "nope"]):
        out = subprocess.run([sys.executable, "-m", "studylog", *argv], capture_output=True, text=True, timeout=300)
        assert out.returncode == 2, out
        assert out.stderr.startswith("error: unknown chapter 'nope'") and "Traceback" not in out.stderr, out.stderr


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
    for command in ("info", "bench", "plot"):
        code, sub, _ = _run([command, "--help"], capsys)
        assert code == 0 and "``" not in sub


@pytest.mark.parametrize("module", sorted(CHAPTER_TOOLS))
def test_the_help_names_every_command_of_each_chapter_tool(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
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
    code, _, err = _run(["plot", "env"], capsys)
    assert code == 1 and err.startswith("error: ") and "checkout" in err
