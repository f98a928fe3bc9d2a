"""Where things live in the repository: one place, so no module works out a path of its own.

In a repository checkout (``make install`` installs the package editable, ``pip install -e .``) the
repository root is the folder above ``studylog/``. Benchmark results, figures and data are assets of the
book; ``lab/`` holds the experiments beside the library (scripts, their outputs and frozen variants that
were tried and rejected).

Installed from a wheel (``pip install .``) there is no repository: :data:`CHECKOUT` is False, and the few
committed files the library itself reads at run time come with the package, under ``studylog/_assets/``
in the same layout as ``assets/`` (``setup.py`` copies them into the wheel): the masked LM head's benchmark
results (:func:`studylog.masked_lm_head.masked_logits` picks its kernel from them) and ``data/`` (the FSM
chapter's masks, the n-gram chapter's corpus). Commands that write the book's files (``bench`` without
``--out``, ``plot``) need a checkout.
"""

from __future__ import annotations

from pathlib import Path

#: The package folder (``studylog/``).
PACKAGE = Path(__file__).resolve().parent
#: The repository root (the folder holding ``README.md``, ``notebooks/`` and ``lab/``) in a checkout.
REPO_ROOT = PACKAGE.parent
#: Whether the package runs from a repository checkout (False when installed from a wheel).
CHECKOUT = (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "assets").is_dir()
#: The committed files a wheel carries (the layout of ``assets/``; see the module docstring).
SHIPPED_ASSETS = PACKAGE / "_assets"
#: Assets of the book (in a checkout), or the ones the package carries (installed from a wheel).
ASSETS = REPO_ROOT / "assets" if CHECKOUT else SHIPPED_ASSETS
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


def require_checkout(what: str) -> None:
    """Raise a clear error when ``what`` writes the book's files and the package is not a checkout."""
    if not CHECKOUT:
        raise RuntimeError(f"{what} writes the repository's files (assets/, README.md), and studylog is installed "
                           f"from a wheel here ({PACKAGE}), not run from a checkout: clone the repository and "
                           "`make install` there")


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
