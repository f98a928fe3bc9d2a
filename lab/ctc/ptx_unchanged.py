"""Does an edit of the CUDA C++ of chapters 3 and 4 change the code NVRTC makes of it?

Compiles every kernel the library launches from ``studylog/ctc/csrc`` and ``studylog/ngram/csrc`` (every
template instance the chapters launch or declare, and every ``.cu`` file's ``extern "C"`` kernels, the latency
floor's among them), and lab/ngram's frozen stream variants (they include
``ngram_common.cuh``; notebook 03 compiles them), twice with the library's compiler options: the sources of a
git revision (``--base``, HEAD by default) and those of the working tree. For each kernel it compares the PTX
(``.file``/``.loc`` lines left out: they name the source, not the code; branch labels ``$L__BB<i>_<j>`` without
the kernel's index ``i`` in its module, which moves when a kernel is added before it) and, when ``nvdisasm`` is found (Triton's
wheel ships one), the SASS, the machine code that runs (branch labels renumbered per kernel); for each source,
the whole PTX module as well. Identical PTX from the same NVRTC gives identical SASS, so the SASS column is a
second look; it also tells an edit that only reorders a few PTX instructions (ptxas schedules them back) from
one that changes the machine code.

    .venv/bin/python lab/ctc/ptx_unchanged.py [--base REV] [--arch sm_90] [--only ctc|ngram] [--source STEM ...]

Prints one line per kernel and exits with status 1 when anything differs: the kernels of a source, a kernel's
PTX or SASS, or a module's PTX. Needs no GPU: NVRTC compiles for any ``sm_XX``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from book.ctc.compiled import nvdisasm_path, sass
from studylog import cuda, paths
from studylog.ctc import fused, warpctc
from studylog.ngram import kernels as ngram_kernels

#: The lab's frozen stream variants that notebook 03 compiles: (loads, vec, budget skip, cache) template values.
LAB_VARIANTS = paths.LAB / "ngram" / "variants" / "ngram_stream_variants.cu"
LAB_INSTANCES = tuple(f"ngram_stream<{loads}, {vec}, {skip}, {cache}>"
                      for loads, skip, cache in ((2, 2, 2), (4, 1, 2), (4, 2, 2), (4, 2, 1), (4, 2, 0), (4, 0, 2),
                                                 (8, 2, 2))
                      for vec in (2, 1))


def ctc_sources() -> dict[str, list[str]]:
    """Source stem -> the name expressions of every template instance chapter 4 launches from it."""
    names: dict[str, list[str]] = {warpctc.SOFTMAX_SOURCE: []}
    for step in range(1, 7):
        grains = [None] if step <= 3 else list(warpctc.GRAIN_SIZES)
        for grain in grains:
            for blocked in ((False,) if step <= 3 else (False, True)):
                for name in warpctc.kernel_names(step, grain, blocked):
                    names.setdefault(warpctc.SOURCES[step], []).append(name if "<" in name else "")
    for step in range(7, 15):
        grains = {7: fused.THREAD_GRAINS, 8: fused.THREAD_GRAINS, 14: fused.BLOCK_GRAINS}.get(step, fused.WARP_GRAINS)
        options = fused.RECURSION_OPTIONS if step in (12, 13) else (None,)
        for v in grains:
            for option in options:
                for name in fused.fused_kernel_names(step, v, option):
                    names.setdefault(fused.source_of(name), []).append(name if "<" in name else "")
    for stem, declared in cuda.INSTANCES.items():  # the instances the modules declare (step 7's parts among them)
        if stem in names:
            names[stem] += declared
    for path in sorted(paths.chapter_csrc("ctc").glob("*.cu")):  # every other source: its extern "C" kernels
        names.setdefault(path.stem, [])
    return {stem: [n for n in dict.fromkeys(found) if n] for stem, found in names.items()}


def ngram_sources() -> dict[str, list[str]]:
    """Source stem -> the name expressions chapter 3 launches from it."""
    folder = paths.chapter_csrc("ngram")
    launched = {"ngram_stream": ngram_kernels.STREAM_INSTANCES}
    return {p.stem: list(dict.fromkeys(launched.get(p.stem, ()) + cuda.INSTANCES.get(p.stem, ())))
            for p in sorted(folder.glob("*.cu"))}


@contextlib.contextmanager
def headers_from(root: Path):
    """Compile with the ``csrc`` folders (the headers) found under ``root`` in the package's layout."""
    saved = cuda.csrc_folders
    cuda.csrc_folders = lambda: [root / f.relative_to(paths.REPO_ROOT) for f in saved()]
    try:
        yield
    finally:
        cuda.csrc_folders = saved


def checkout(rev: str) -> Path:
    """The package and lab/ngram's variants as they are at ``rev``, extracted once per commit beside the
    compile cache (a fixed folder, so that NVRTC's cache serves the next run), or into a temporary folder
    that the caller removes when there is no cache."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=paths.REPO_ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    cache = cuda.compile_cache_dir()
    into = Path(tempfile.mkdtemp()) if cache is None else cache.parent / "base-sources" / sha
    if not (into / "studylog").is_dir():
        archive = subprocess.run(["git", "archive", sha, "studylog", "lab/ngram/variants"], cwd=paths.REPO_ROOT,
                                 check=True, capture_output=True).stdout
        into.parent.mkdir(parents=True, exist_ok=True)
        partial = into.with_name(f"{into.name}.{os.getpid()}.tmp")
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(partial, filter="data")
        partial.replace(into)
    return into


def code_only(ptx: str) -> str:
    lines = "\n".join(line for line in ptx.splitlines() if not re.match(r"\s*\.(file|loc)\b", line))
    return re.sub(r"\$L__BB\d+_", "$L__BB_", lines)


def code_of(sass_lines: list[str]) -> list[str]:
    """One kernel's SASS with its branch labels numbered from 0 in the order they appear: nvdisasm numbers
    them across the whole cubin, so an edit of one kernel renumbers the labels of the kernels after it."""
    numbers: dict[str, str] = {}
    return [re.sub(r"\.L_x_\d+", lambda m: numbers.setdefault(m[0], f".L_{len(numbers)}"), line)
            for line in sass_lines]


def entries(compiled: cuda.CompiledSource) -> list[str]:
    return re.findall(r"\.entry\s+(\w+)", compiled.ptx)


def compare(label: str, old: cuda.CompiledSource, new: cuda.CompiledSource, names: list[str], with_sass: bool) -> bool:
    """Print one line per kernel of one source; whether everything is the same."""
    readable = {new.lowered_names.get(n, n): n for n in names}
    old_sass, new_sass = (sass(old), sass(new)) if with_sass else ({}, {})
    same_all = entries(old) == entries(new)
    if not same_all:
        print(f"{label}: the kernels differ: {entries(old)} -> {entries(new)}")
    for entry in entries(new):
        if entry not in entries(old):
            continue
        ptx_same = code_only(old.ptx_function(entry)) == code_only(new.ptx_function(entry))
        sass_same = code_of(old_sass.get(entry, [])) == code_of(new_sass[entry]) if with_sass else None
        same_all &= ptx_same and sass_same is not False
        sass_word = "" if sass_same is None else f"  SASS {'same' if sass_same else 'DIFFERS'}"
        print(f"{label:34s} {readable.get(entry, entry):58s} PTX {'same' if ptx_same else 'DIFFERS'}{sass_word}")
    module_same = code_only(old.ptx) == code_only(new.ptx)
    print(f"{label:34s} {'(the whole module)':58s} PTX {'same' if module_same else 'DIFFERS'}")
    return same_all and module_same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the git revision to compare with (default HEAD)")
    parser.add_argument("--arch", default=cuda.DEFAULT_ARCH, help="an sm_XX target (default %(default)s)")
    parser.add_argument("--only", choices=("ctc", "ngram"), help="one chapter's sources (default both)")
    parser.add_argument("--source", nargs="+", metavar="STEM", help="only these sources (file names without .cu)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"sm_\d+a?", args.arch):
        parser.error(f"--arch must be an sm_XX target (SASS needs a cubin), got {args.arch!r}")
    jobs = []
    if args.only in (None, "ctc"):
        jobs += [(paths.chapter_csrc("ctc") / f"{stem}.cu", names) for stem, names in ctc_sources().items()]
    if args.only in (None, "ngram"):
        jobs += [(paths.chapter_csrc("ngram") / f"{stem}.cu", names) for stem, names in ngram_sources().items()]
        jobs.append((LAB_VARIANTS, list(LAB_INSTANCES)))
    if args.source:
        unknown = set(args.source) - {path.stem for path, _ in jobs}
        if unknown:
            parser.error(f"--source: no such source {sorted(unknown)}; choose from {[p.stem for p, _ in jobs]}")
        jobs = [(path, names) for path, names in jobs if path.stem in args.source]
    with_sass = nvdisasm_path() is not None
    if not with_sass:
        print("nvdisasm not found: PTX only")
    same = True
    base = checkout(args.base)
    try:
        for path, names in jobs:
            relative = path.relative_to(paths.REPO_ROOT)
            with headers_from(base):
                old = cuda.compile_source((base / relative).read_text(), arch=args.arch, name_expressions=names,
                                          name=path.name)
            new = cuda.compile_source(path.read_text(), arch=args.arch, name_expressions=names, name=path.name)
            same &= compare(str(relative.name), old, new, names, with_sass)
    finally:
        if cuda.compile_cache_dir() is None:
            shutil.rmtree(base)
    what = "PTX and SASS" if with_sass else "PTX"
    print(f"{f'every kernel the same {what}' if same else 'SOMETHING DIFFERS'} ({args.base} -> working tree, {args.arch})")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
