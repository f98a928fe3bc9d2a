"""Show a kernel's source, and the diff between two steps of a kernel: self-contained HTML (inline styles), the
same in JupyterLab and the built book, and plain text in a terminal."""

from __future__ import annotations

import difflib
import html
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

from studylog import cuda

_BOX = ("font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; "
        "line-height: 1.45; background: #f8f8f8; color: #1f2328; border: 1px solid #d0d7de; "
        "border-radius: 6px; padding: 8px 0; overflow-x: auto; margin: 0.5em 0;")
_TITLE = "padding: 0 12px 6px; font-weight: 600; color: #57606a;"


def _unwrap(obj: Any) -> Any:
    """The Python function behind a Triton kernel (JITFunction, InterpretedFunction, Autotuner...)."""
    for _ in range(5):
        obj = getattr(obj, "fn", obj)
    return obj


def _cuda_function(text: str, name: str) -> str:
    """One function (or struct) of a CUDA source, from the line that declares it to its closing brace."""
    m = re.search(r"^[^\n;{}]*\b(?:struct|class)\s+" + re.escape(name) + r"\b[^;{]*(?=\{)", text, flags=re.MULTILINE) \
        or re.search(r"^[^\n;{}]*\b" + re.escape(name) + r"\s*\(", text, flags=re.MULTILINE)
    if not m:
        raise KeyError(f"no function {name!r} in the source")
    start = m.start()
    # with the comment block and template line right above the declaration
    before = text[:start].rstrip("\n").split("\n")
    while before and (before[-1].strip().startswith(("//", "template", "/*", "*"))
                      or before[-1].strip().endswith("*/")):
        start -= len(before.pop()) + 1
    brace = text.index("{", m.end())
    depth = 0
    for i in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[max(start, 0):i + 1].strip("\n") + "\n"
    raise ValueError(f"unbalanced braces in {name!r}")


def source_of(obj: Any, function: str | None = None) -> tuple[str, str]:
    """(source text, language) of a Python/Triton function, a ``.cu`` file (or one ``function`` of it), or code."""
    if isinstance(obj, (str, Path)) and str(obj).endswith((".cu", ".cuh", ".c")):
        path = Path(obj) if Path(obj).is_file() else cuda.source_path(str(obj))
        text = path.read_text()
        return (_cuda_function(text, function) if function else text), "cuda"
    if isinstance(obj, str):
        return obj, "python"
    return textwrap.dedent(inspect.getsource(_unwrap(obj))), "python"


def resolve_constexpr(lines: list[str], knobs: dict[str, Any], *, read_values: bool = False) -> list[str]:
    """CUDA C++ ``lines`` as one instance of a template compiles them, so that the diff between two steps that are
    instances of one kernel is the one change: each ``if constexpr (cond) {...} [else {...}]`` (braces closed at
    their indent) whose knobs all have a value becomes the branch it takes, dedented; a knob set to None keeps its
    blocks. With ``read_values``, a bool knob's other uses in code (not comments or the template line) read as it."""
    out, i = [], 0
    while i < len(lines):
        m = re.fullmatch(r"(\s*)if constexpr \((.+)\) \{\s*(?://.*)?", lines[i])
        names = re.findall(r"[A-Za-z_]\w*", m.group(2)) if m else []
        if not m or not set(names) <= set(knobs):
            line = lines[i]
            if read_values and not line.lstrip().startswith(("template <", "//")):
                code, sep, comment = line.partition("//")  # a knob in a comment keeps its name
                for name, value in knobs.items():
                    if isinstance(value, bool):
                        code = re.sub(rf"\b{name}\b", "true" if value else "false", code)
                line = code + sep + comment
            out.append(line)
            i += 1
            continue
        indent, cond = m.group(1), m.group(2)
        close = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(indent + "}"))
        end = close
        if re.fullmatch(re.escape(indent) + r"\} else \{\s*(?://.*)?", lines[close]):
            end = next(j for j in range(close + 1, len(lines)) if lines[j] == indent + "}")
        if any(knobs[n] is None for n in names):  # undecided: kept, its branches resolved inside
            out += [lines[i], *resolve_constexpr(lines[i + 1:close], knobs, read_values=read_values)]
            if end != close:
                out += [lines[close], *resolve_constexpr(lines[close + 1:end], knobs, read_values=read_values)]
            out.append(lines[end])
        else:
            python = re.sub(r"!(?!=)", " not ", cond.replace("&&", " and ").replace("||", " or "))
            taken = lines[i + 1:close] if eval(python, {}, dict(knobs)) else lines[close + 1:end]
            out += resolve_constexpr([ln[4:] if ln.startswith(indent + "    ") else ln for ln in taken], knobs,
                                     read_values=read_values)
        i = end + 1
    return out


def resolve_python(lines: list[str], knobs: dict[str, Any]) -> list[str]:
    """Python/Triton ``lines`` at ``knobs``, so that two steps that are one kernel at two knob values each list as
    their own: each ``if KNOB:`` (and its ``else:``) on a knob becomes the branch it takes, dedented."""
    out, i = [], 0
    while i < len(lines):
        m = re.fullmatch(r"(\s*)if (\w+):", lines[i])
        if not m or m.group(2) not in knobs:
            out.append(lines[i])
            i += 1
            continue
        indent = m.group(1)

        def past(j: int) -> int:  # the first line after the block that starts at line j
            while j < len(lines) and (not lines[j].strip() or lines[j].startswith(indent + " ")):
                j += 1
            return j

        end = past(i + 1)
        taken, other = lines[i + 1:end], []
        if end < len(lines) and lines[end] == indent + "else:":
            other, end = lines[end + 1:past(end + 1)], past(end + 1)
        while not lines[end - 1].strip():  # blank lines after the blocks stay in the text
            end -= 1
        branch = taken if knobs[m.group(2)] else other
        while branch and not branch[-1].strip():
            branch = branch[:-1]
        out += [line[4:] if line.startswith(indent + "    ") else line for line in resolve_python(branch, knobs)]
        i = end
    return out


#: Sphinx's roles (``:func:`name```, ``:data:`~mod.NAME```) and reST's inline literals in a docstring.
_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:`(~?)([^`<>]+?)(?:\s*<[^`>]+>)?`")
_LITERAL = re.compile(r"``([^`\n]+?)``")


def plain_markup(text: str) -> str:
    """``text`` with reST roles and double back-ticks as plain code in single back-ticks (``:class:`~torch.Tensor```
    -> ```Tensor```); code uses no back-tick, so only docstrings and comments change."""
    text = _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)
    return _LITERAL.sub(r"`\1`", text)


def _hanging(line: str, margin: str = "12px") -> str:
    """Inline style that wraps a long line under its own indentation plus 4 columns."""
    indent = len(line) - len(line.lstrip(" ")) + 4
    return f"padding-left: calc({margin} + {indent}ch); text-indent: -{indent}ch; "


class Code:
    """Highlighted source that renders in notebooks and the book."""

    def __init__(self, text: str, language: str, title: str | None = None):
        self.text, self.language, self.title = text, language, title

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import CudaLexer, PythonLexer

        formatter = HtmlFormatter(noclasses=True, nobackground=True, style="default")
        body = highlight(plain_markup(self.text), CudaLexer() if self.language == "cuda" else PythonLexer(), formatter)
        body = body.replace('<div class="highlight"', '<div class="studylog-code"')
        # one style attribute on <pre> (Pygments writes its own): the box's font size, no wrapping
        body = body.replace('<pre style="', '<pre style="margin: 0 12px; background: transparent; font-size: inherit; '
                            'white-space: pre; ', 1)
        # each line its own block (Pygments closes its spans at every newline), so a wrapped line hangs under its
        # indentation; each block ends with its newline, so the text of the <pre> keeps its lines
        head, _, rest = body.partition("<pre")
        tag, _, code = rest.partition(">")
        code, _, tail = code.rpartition("</pre>")
        lines = code.removesuffix("\n").split("\n")
        code = "".join(f'<span style="display: block; {_hanging(html.unescape(re.sub("<[^>]*>", "", line)), "0px")}">'
                       f'{line}\n</span>' for line in lines)
        body = f"{head}<pre{tag}>{code}</pre>{tail}"
        title = f'<div style="{_TITLE}">{html.escape(self.title)}</div>' if self.title else ""
        return f'<div style="{_BOX}">{title}{body}</div>'


def show_source(obj: Any, function: str | None = None, title: str | None = None) -> Code:
    """Display a kernel's source (Triton/Python function, or ``.cu`` file [+ function name])."""
    return Code(*source_of(obj, function), title)


class Diff:
    """A unified diff between two sources; added lines green, removed lines red."""

    def __init__(self, old: str, new: str, old_name: str, new_name: str, context: int):
        self.old_name, self.new_name = old_name, new_name
        self.lines = list(difflib.unified_diff(
            old.splitlines(), new.splitlines(), fromfile=old_name, tofile=new_name, n=context, lineterm=""))

    @property
    def added(self) -> list[str]:
        return [line[1:] for line in self.lines[2:] if line.startswith("+")]

    @property
    def removed(self) -> list[str]:
        return [line[1:] for line in self.lines[2:] if line.startswith("-")]

    def __str__(self) -> str:
        return "\n".join(self.lines) or f"(no difference between {self.old_name} and {self.new_name})"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        if not self.lines:
            return (f"<p><em>No difference between {html.escape(self.old_name)} and "
                    f"{html.escape(self.new_name)}.</em></p>")
        out = [f'<div style="{_BOX}">',
               f'<div style="{_TITLE}">{html.escape(self.old_name)} → {html.escape(self.new_name)}'
               f' &nbsp;<span style="font-weight: 400;">(+{len(self.added)} / −{len(self.removed)} lines)'
               '</span></div>']
        styles = {"@": "color: #6a737d; background: #eef1f4;", "+": "background: #d7f5dd;",
                  "-": "background: #fbdada;"}
        # the lines are code: one <pre> (what a reader's tools, a screen reader or a copy, take as code), each line
        # a block of its own, so that a wrapped line hangs under its indentation and keeps its colour
        lines = []
        for line in self.lines[2:]:  # a hunk header (@@), an added line, a removed one, or context
            line = plain_markup(line)
            lines.append(f'<span style="display: block; padding: 0 12px; {_hanging(line[1:])}'
                         f'{styles.get(line[:1], "")}">{html.escape(line)}\n</span>')
        out.append('<pre class="studylog-diff" style="margin: 0; padding: 0; border: 0; background: transparent; '
                   'font-family: inherit; font-size: inherit; line-height: inherit; white-space: pre;">'
                   + "".join(lines) + "</pre></div>")
        return "\n".join(out)


def show_diff(old: Any, new: Any, *, old_function: str | None = None, new_function: str | None = None,
              context: int = 3, names: tuple[str, str] | None = None) -> Diff:
    """The diff from one step of a kernel to the next (functions, ``.cu`` files, or strings)."""
    names = names or (_label(old, old_function), _label(new, new_function))
    return Diff(source_of(old, old_function)[0], source_of(new, new_function)[0], *names, context)


def _label(obj: Any, function: str | None) -> str:
    if isinstance(obj, (str, Path)) and str(obj).endswith((".cu", ".cuh", ".c")):
        return f"{Path(obj).name}:{function}" if function else Path(obj).name
    if isinstance(obj, str):
        return "source"
    return getattr(_unwrap(obj), "__name__", "source")
