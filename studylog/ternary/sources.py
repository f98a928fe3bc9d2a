"""What a page shows of a step whose kernel it shares with its neighbours (one CUDA C++ template, or one Triton
kernel, whose compile-time knobs are the steps' changes): the kernel with each knob's branch taken, then the
step's launch (its Python function). ``CHAPTER.show_diff(n - 1, n)`` then shows the one change of step n."""

from __future__ import annotations

import inspect
import textwrap
from typing import Any, Callable, Optional

from studylog.source import resolve_constexpr, resolve_python, source_of


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
    parts = ["\n".join(resolve_python(source_of(k)[0].splitlines(), knobs)) for k in kernels]
    launches = ["# its launch:\n" + textwrap.dedent(inspect.getsource(launch))] if launch else []
    return "\n\n".join(parts + launches)
