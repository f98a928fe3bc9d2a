"""The chapter protocol and the one registry that finds chapters.

A chapter is a package ``studylog/<name>/`` whose ``__init__`` defines ``CHAPTER``, a :class:`Chapter`: its steps in
the lesson's order, its benchmark (``bench(run)``) and headline (``headline(results)``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from studylog.bench import BenchRun
    from studylog.plotting import Results
    from studylog.source import Code, Diff

LANGUAGES = ("python", "triton", "cuda", "c", "torch")


@dataclass(frozen=True)
class Step:
    number: int
    slug: str
    title: str
    language: str
    function: Callable[..., Any] | None = None
    source: Any = None  # what show_source/show_diff read: a Triton/Python function, or a .cu file's path
    source_function: str | None = None  # with a .cu source: the one kernel (or function) of it that this step is

    def __post_init__(self):
        if not isinstance(self.number, int) or self.number < 0:
            raise ValueError(f"a step's number must be a non-negative int, got {self.number!r}")
        if not self.slug or not self.slug.replace("_", "").isalnum() or not self.slug.islower():
            raise ValueError(f"a step's slug must be lower-case letters, digits and '_', got {self.slug!r}")
        if self.language not in LANGUAGES:
            raise ValueError(f"a step's language must be one of {LANGUAGES}, got {self.language!r}")

    @property
    def name(self) -> str:
        """``step09_tma``: the public function's name, and the legend label."""
        return f"step{self.number:02d}_{self.slug}"

    @property
    def series(self) -> str:
        """``step09``: the step's series in the benchmark JSON."""
        return f"step{self.number:02d}"


@dataclass(frozen=True)
class Chapter:
    name: str
    number: int
    title: str
    notebooks: tuple[str, ...]
    steps: tuple[Step, ...]
    bench: Callable[["BenchRun"], None] | None = None
    headline: Callable[["Results"], list[dict]] | None = None
    #: Series that are not steps (baselines, floors, peers): series name -> what it is.
    baselines: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        numbers = [s.number for s in self.steps]
        if len(set(numbers)) != len(numbers):
            raise ValueError(f"chapter {self.name!r} numbers two steps the same: {numbers}")
        if numbers != sorted(numbers):
            raise ValueError(f"chapter {self.name!r} lists its steps out of order: {numbers}")
        if clash := set(self.baselines) & {s.series for s in self.steps}:
            raise ValueError(f"chapter {self.name!r} uses step series as baseline names: {sorted(clash)}")

    def step(self, key: int | str) -> Step:
        """A step by number (``9``), name (``"step09_tma"``) or series (``"step09"``)."""
        for s in self.steps:
            if key == s.number or key == s.name or key == s.series:
                return s
        known = ", ".join(s.name for s in self.steps)
        raise KeyError(f"chapter {self.name!r} has no step {key!r}; its steps are {known}")

    @property
    def final(self) -> Step:
        """The last step: the chapter's result."""
        return self.steps[-1]

    def label(self, series: str) -> str:
        """The legend label of a benchmark series: a step's name, or a baseline's description."""
        return next((s.name for s in self.steps if s.series == series), self.baselines.get(series, series))

    def show_source(self, key: int | str, title: str | None = None) -> "Code":
        """The source of one step (its kernel, or its function of a ``.cu`` file)."""
        from studylog import source

        s = self.step(key)
        return source.show_source(s.source, s.source_function, title=title or f"{s.name}: {s.title}")

    def show_diff(self, old: int | str, new: int | str, *, context: int = 3) -> "Diff":
        """The diff from one step's source to another's: the lesson of the step."""
        from studylog import source

        a, b = self.step(old), self.step(new)
        return source.show_diff(a.source, b.source, old_function=a.source_function,
                                new_function=b.source_function, context=context, names=(a.name, b.name))


#: chapter name -> the package (or module) that defines ``CHAPTER``. The order is the course's.
CHAPTERS: dict[str, str] = {
    "env": "studylog.env",
    "fsm": "studylog.fsm",
    "masked_lm_head": "studylog.masked_lm_head",
    "ngram": "studylog.ngram",
    "ctc": "studylog.ctc",
    "ternary": "studylog.ternary",
    "multi_item": "studylog.multi_item",
    "decode": "studylog.decode",
    "speculate": "studylog.speculate",
}


#: Benchmarks that are not chapters: name -> the module that defines ``bench(run)`` (``all`` runs only chapters).
BENCHMARKS: dict[str, str] = {
    "tails": "studylog.tails",  # p50 and p99 of each chapter's final kernel at its headline shape
}


def get(name: str) -> Chapter:
    if name not in CHAPTERS:
        raise ValueError(f"unknown chapter {name!r}; choose from {', '.join(CHAPTERS)}")
    chapter = importlib.import_module(CHAPTERS[name]).CHAPTER
    if chapter.name != name:
        raise RuntimeError(f"{CHAPTERS[name]}.CHAPTER is named {chapter.name!r}, registered as {name!r}")
    return chapter


def select(names: list[str] | tuple[str, ...], *, need: str | None = None) -> list[Chapter]:
    """Chapters named on a command line (``["all"]``: every one that declares ``need``; a named one without it is an
    error). A name of :data:`BENCHMARKS` gives what the harness reads of a chapter: its name and bench."""
    if list(names) == ["all"]:
        return [c for c in map(get, CHAPTERS) if need is None or getattr(c, need) is not None]
    out = []
    for name in names:
        if name in BENCHMARKS:
            chapter = SimpleNamespace(name=name, bench=importlib.import_module(BENCHMARKS[name]).bench, headline=None)
        else:
            chapter = get(name)
        if need is not None and getattr(chapter, need) is None:
            raise ValueError(f"chapter {name!r} declares no {need}")
        out.append(chapter)
    return out

