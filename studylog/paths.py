"""Where things live in the repository: one place, so no module works out a path of its own.

The package is installed editable (``pip install -e .``), so the repository root is the folder above
``studylog/``. Benchmark results, figures and data are assets of the book; ``lab/`` holds the
experiments beside the library (scripts, their outputs and frozen variants that were tried and rejected).
"""

from __future__ import annotations

from pathlib import Path

#: The package folder (``studylog/``).
PACKAGE = Path(__file__).resolve().parent
#: The repository root (the folder holding ``README.md``, ``notebooks/`` and ``lab/``).
REPO_ROOT = PACKAGE.parent
#: Assets of the book.
ASSETS = REPO_ROOT / "assets"
#: Committed benchmark results: ``BENCH_RESULTS/<gpu-name>/<chapter>.json``.
BENCH_RESULTS = ASSETS / "bench"
#: Figures drawn from the committed results: ``FIGURES/<chapter>_<name>.png``.
FIGURES = ASSETS / "figures"
#: Small data files the chapters read.
DATA = ASSETS / "data"
#: CUDA C++ shared by several chapters (headers such as ``bulk_copy.cuh``, the ``read_only`` floor kernel).
SHARED_CSRC = PACKAGE / "csrc"
#: Experiments beside the library: ``LAB/<chapter>/`` holds scripts, a README and ``results/<gpu>/*.json``.
LAB = REPO_ROOT / "lab"


def chapter_csrc(chapter: str) -> Path:
    """A chapter's own CUDA sources: ``studylog/<chapter>/csrc``."""
    return PACKAGE / chapter / "csrc"


def csrc_folders() -> list[Path]:
    """Every folder of CUDA sources in the package: the shared one first, then each chapter's."""
    return [SHARED_CSRC] + sorted(p for p in PACKAGE.glob("*/csrc") if p.is_dir())


def lab_results(chapter: str, gpu: str) -> Path:
    """Where a chapter's experiments keep their outputs measured on ``gpu`` (a folder name such as
    ``nvidia-h200``)."""
    return LAB / chapter / "results" / gpu
