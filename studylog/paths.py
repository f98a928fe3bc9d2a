"""Where things live in the repository: one place, so no module works out a path of its own.

In a checkout (``make install``: ``pip install -e .``) the repository root is the folder above ``studylog/``.
Installed from a wheel there is no repository (:data:`CHECKOUT` is False): the committed files the library reads at
run time (the masked LM head's results, which pick its kernel, and ``data/``) come under ``studylog/_assets/`` in the
layout of ``assets/`` (``setup.py`` copies them). Commands that write the book's files need a checkout.
"""

from __future__ import annotations

from pathlib import Path

#: The package folder (``studylog/``).
PACKAGE = Path(__file__).resolve().parent
#: The repository root in a checkout.
REPO_ROOT = PACKAGE.parent
#: Whether the package runs from a repository checkout (False when installed from a wheel).
CHECKOUT = (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "assets").is_dir()
#: The committed files a wheel carries.
SHIPPED_ASSETS = PACKAGE / "_assets"
#: Assets of the book (in a checkout), or the ones the package carries (installed from a wheel).
ASSETS = REPO_ROOT / "assets" if CHECKOUT else SHIPPED_ASSETS
#: Committed benchmark results: ``BENCH_RESULTS/<gpu-name>/<chapter>.json``.
BENCH_RESULTS = ASSETS / "bench"
#: Figures drawn from the committed results: ``FIGURES/<chapter>_<name>.png``.
FIGURES = ASSETS / "figures"
#: Small data files the chapters read.
DATA = ASSETS / "data"
#: CUDA C++ shared by several chapters.
SHARED_CSRC = PACKAGE / "csrc"
#: Experiments beside the library: ``LAB/<chapter>/`` holds scripts, a README and ``results/<gpu>/``.
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
    """Where a chapter's experiments keep their outputs measured on ``gpu`` (a folder name: ``nvidia-h200``)."""
    return LAB / chapter / "results" / gpu
