"""Where things live in the repository: one place, so no module works out a path of its own.

Installed from a wheel there is no repository (:data:`CHECKOUT` is False): the committed files the library reads at
run time come under ``studylog/_assets/`` in the layout of ``assets/`` (``setup.py`` copies them).
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE.parent
#: Whether the package runs from a repository checkout (False when installed from a wheel).
CHECKOUT = (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "assets").is_dir()
#: The committed files a wheel carries.
SHIPPED_ASSETS = PACKAGE / "_assets"
ASSETS = REPO_ROOT / "assets" if CHECKOUT else SHIPPED_ASSETS
#: Committed benchmark results: ``BENCH_RESULTS/<gpu-name>/<chapter>.json``.
BENCH_RESULTS = ASSETS / "bench"
DATA = ASSETS / "data"
SHARED_CSRC = PACKAGE / "csrc"
#: Experiments beside the library: ``LAB/<chapter>/`` holds scripts, a README and ``results/<gpu>/``.
LAB = REPO_ROOT / "lab"


def chapter_csrc(chapter: str) -> Path:
    """A chapter's own CUDA sources: ``studylog/<chapter>/csrc``."""
    return PACKAGE / chapter / "csrc"


def csrc_folders() -> list[Path]:
    """Every folder of CUDA sources in the package: the shared one first, then each chapter's."""
    return [SHARED_CSRC] + sorted(p for p in PACKAGE.glob("*/csrc") if p.is_dir())


def lab_results(chapter: str, gpu: str) -> Path:
    """Where a chapter's experiments keep their outputs measured on ``gpu`` (a folder name: ``nvidia-h200``)."""
    return LAB / chapter / "results" / gpu


def cache_dir() -> Path:
    """Where studylog keeps what it builds or fetches: ``$XDG_CACHE_HOME/studylog``, else ``~/.cache/studylog``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "studylog"
