"""What a page shows of a step whose kernel it shares with its neighbours (one CUDA C++ template, or one Triton
kernel, whose compile-time knobs are the steps' changes): the kernel with each knob's branch taken, then the
step's launch (its Python function). ``CHAPTER.show_diff(n - 1, n)`` then shows the one change of step n."""

from __future__ import annotations

import inspect
import re
import textwrap
from typing import Any, Callable, Optional

from studylog.source import resolve_constexpr, source_of


def _resolve_python(lines: list[str], knobs: dict[str, bool]) -> list[str]:
    """``lines`` with every ``if KNOB:`` (and its ``else:``) on a knob replaced by the branch it takes, dedented."""
    out, i = [], 0
    while i < len(lines):
        m = re.fullmatch(r"(\s*)if (\w+):", lines[i])
        if not m or m.group(2) not in knobs:
            out.append(lines[i])
            i += 1
            continue
        indent = m.group(1)
        inner = lambda j: j < len(lines) and (not lines[j].strip() or lines[j].startswith(indent + " "))  # noqa: E731
        j = i + 1
        while inner(j):
            j += 1
        body, other, end = lines[i + 1:j], [], j
        if j < len(lines) and lines[j] == indent + "else:":
            end = j + 1
            while inner(end):
                end += 1
            other = lines[j + 1:end]
        taken = body if knobs[m.group(2)] else other
        out += [line[4:] if line.startswith(indent + "    ") else line for line in _resolve_python(taken, knobs)]
        i = end
    return out


def cuda_step_source(file: str, kernel: str, knobs: dict[str, bool], launch: Callable,
                     helpers: tuple[str, ...] = ()) -> str:
    """The text of a CUDA C++ step: ``helpers`` (device functions of ``file`` that only some knob settings call,
    shown where the step calls them), the ``kernel`` of ``file`` at ``knobs``, then its launch as comments."""
    parts = [source_of(file, name)[0] for name in helpers] + [source_of(file, kernel)[0]]
    body = "\n\n".join("\n".join(resolve_constexpr(part.splitlines(), knobs, read_values=True)) for part in parts)
    launch_lines = "\n".join(f"// {line}".rstrip() for line in textwrap.dedent(inspect.getsource(launch)).splitlines())
    return body + "\n\n// its launch (Python):\n" + launch_lines


def triton_step_source(kernels: tuple[Any, ...], knobs: dict[str, bool], launch: Optional[Callable] = None) -> str:
    """The text of a Triton step: ``kernels`` (its kernel and the helpers its knobs reach) at ``knobs``, then its
    launch where one is given."""
    parts = ["\n".join(_resolve_python(source_of(k)[0].splitlines(), knobs)) for k in kernels]
    launches = ["# its launch:\n" + textwrap.dedent(inspect.getsource(launch))] if launch else []
    return "\n\n".join(parts + launches)
