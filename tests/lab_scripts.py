"""The lab scripts the tests check (``lab/<chapter>/<name>.py``), imported by path: ``lab/`` is not a package."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from studylog import paths


def load(chapter: str, name: str) -> ModuleType:
    """``lab/<chapter>/<name>.py`` as a module (run from the repository's checkout)."""
    spec = importlib.util.spec_from_file_location(name, paths.REPO_ROOT / "lab" / chapter / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
