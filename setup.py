"""The build's one step beyond pyproject.toml: the committed files the library reads at run time go into
the wheel.

A wheel holds the package folder only, but a few entry points read files the repository keeps under
``assets/``: :func:`studylog.masked_lm_head.masked_logits` picks its kernel from the committed benchmark
results of its chapter, and the n-gram and masked-head chapters read ``assets/data/`` (the real corpus, the
FSM chapter's masks). ``build_py`` copies them into the wheel as ``studylog/_assets/`` (the layout of
``assets/``), where :mod:`studylog.paths` finds them when the package is not a checkout. An editable install
(``make install``) reads ``assets/`` itself, so nothing is copied then. A build that finds none of them
stops: a wheel without them would run ``masked_logits`` on its fallback rule without saying so.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: What the wheel carries, as globs under assets/ (studylog/paths.py's docstring says why each).
SHIPPED_ASSETS = ("bench/*/masked_lm_head.json", "data/*")


class BuildPyWithAssets(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "studylog" / "_assets"
        for pattern in SHIPPED_ASSETS:
            files = sorted(p for p in (ROOT / "assets").glob(pattern) if p.is_file())
            if not files:
                raise SystemExit(f"setup.py: no assets/{pattern} in {ROOT}; the wheel needs them "
                                 "(build from a checkout or from the sdist, which carries them)")
            for src in files:
                dst = target / src.relative_to(ROOT / "assets")
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)


setup(cmdclass={"build_py": BuildPyWithAssets})
