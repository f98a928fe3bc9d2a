"""The study log's command line.

  python -m studylog info                      what runs here: versions, the GPU, the kernels' mode and why
  python -m studylog bench CHAPTER... | all    run chapters' GPU benchmarks and write their JSON results
  python -m studylog bench verify DIR          compare a fresh run's results with the committed ones

The figures and the README's results are the book's: python -m book plot CHAPTER... | all.

Errors print one line, "error: ...", and exit with status 2 for a bad command line, 1 for a failure,
3 when bench verify finds a headline that no longer holds.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import sys
from pathlib import Path

#: The chapters' own command lines (``studylog/<chapter>/__main__.py``): module -> (arguments, what it does).
CHAPTER_TOOLS = {
    "studylog.fsm": ("report", "chapter 1: the suite's savings"),
}

#: The packages ``info`` reports: distribution name -> what it is for.
PACKAGES = {
    "torch": "tensors, the CPU reference paths",
    "triton": "the Triton kernels",
    "cuda-bindings": "NVRTC and the driver API: CUDA C++ kernels",
    "nvidia-cuda-nvrtc": "the NVRTC library",
    "outlines-core": "chapter 1's automata",
    "xgrammar": "peer: constrained decoding",
    "llguidance": "peer: constrained decoding",
    "transformers": "peer: reference models",
    "gemlite": "peer: low-bit matmul",
}


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``error: ...``, with exit status 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


class UsageError(Exception):
    """A command line that names something that does not exist or does not fit (exit status 2)."""


def _epilog() -> str:
    from studylog.chapter import CHAPTERS

    width = max(len(f"python -m {m} {a}") for m, (a, _) in CHAPTER_TOOLS.items())
    tools = "\n".join(f"  {f'python -m {m} {a}':<{width}}  {what}" for m, (a, what) in CHAPTER_TOOLS.items())
    return f"chapters, in the course's order:\n  {', '.join(CHAPTERS)}\n\neach chapter's own tools:\n{tools}"


def _parser() -> _Parser:
    from studylog import __version__
    from studylog.chapter import CHAPTERS

    parser = _Parser(prog="python -m studylog", description=__doc__, epilog=_epilog(),
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"studylog {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{info,bench}")
    sub.add_parser("info", help="versions, the GPU, and how kernels run here (and why)",
                   description="Versions of Python and of the packages the kernels use, the GPU and its compute "
                               "capability, and how kernels run on this machine, and why.")
    names = ", ".join(CHAPTERS)
    bench = sub.add_parser("bench", help="run chapters' GPU benchmarks and write their JSON results",
                           description="Run chapters' GPU benchmarks (needs a CUDA GPU), or compare a fresh run's "
                                       "results with the committed ones (verify).")
    bench.add_argument("chapters", nargs="+", metavar="CHAPTER",
                       help=f"chapter names ({names}) or 'all'; or 'verify DIR' to compare a fresh run's results "
                            "(DIR/<gpu>/<chapter>.json) with the committed ones; or 'tails': p50 and p99 of each "
                            "chapter's final kernel at its headline shape")
    bench.add_argument("--report", type=Path, default=None,
                       help="with verify: also write the report to REPORT.md and REPORT.json")
    bench.add_argument("--tolerance", type=float, default=0.15, help="with verify: how far a number may move")
    bench.add_argument("--out", type=Path, default=None,
                       help="results folder (default: assets/bench of the checkout); files go to "
                            "OUT/<gpu-name>/<chapter>.json")
    bench.add_argument("--quick", action="store_true", help="a reduced sweep, for trying the harness out")
    return parser


def _check_chapters(names: list[str]) -> None:
    """Each name: a chapter with a benchmark, another benchmark, or 'all' alone."""
    from studylog import chapter as registry

    if "all" in names and len(names) > 1:
        raise UsageError("'all' takes no other chapter names")
    try:
        registry.select(names, need="bench")
    except ValueError as exc:  # an unknown name, or a chapter without a benchmark
        raise UsageError(str(exc)) from None


# info: what runs here

def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _nvrtc_version() -> str:
    """The NVRTC library's own version, or why it cannot be read."""
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}" if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else f"unusable ({err!r})"
    except ImportError:
        return "not installed (pip install cuda-bindings nvidia-cuda-nvrtc)"
    except Exception as exc:  # the library is looked for when first used
        return f"not found ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"


def info_lines() -> list[str]:
    """What ``python -m studylog info`` prints."""
    import torch

    from studylog import __version__, paths, runtime

    where = f"a checkout ({paths.REPO_ROOT})" if paths.CHECKOUT else f"an installed package ({paths.PACKAGE})"
    lines = [f"studylog {__version__}, from {where}", f"python {platform.python_version()} ({sys.executable})"]
    width = max(map(len, PACKAGES))
    for dist, what in PACKAGES.items():
        version = _version(dist)
        if dist == "torch":
            build = "CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
            version = f"{torch.__version__} ({build})"
        lines.append(f"  {dist:<{width}}  {version:<24} {what}")
    lines.append(f"  {'NVRTC library':<{width}}  {_nvrtc_version():<24} compiles the CUDA C++ sources")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    lines.append(f"  {'C compiler':<{width}}  {cc or 'none (n-gram step 1 needs cc, gcc or clang)'}")
    if runtime.has_gpu():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            lines.append(f"GPU {i}: {p.name}, compute capability {p.major}.{p.minor}, {p.multi_processor_count} SMs")
        major, _ = torch.cuda.get_device_capability(0)
        if major < 8:
            lines.append("  below compute capability 8.0: bf16 kernels and several CUDA C++ steps do not run here")
        elif major < 9:
            lines.append("  below compute capability 9.0: ternary steps 11 to 13 (CUDA C++: cp.async.bulk copies, and "
                         "programmatic dependent launch in 12 and 13) refuse to run here; every other kernel runs "
                         "(the committed results are H100/H200)")
    else:
        lines.append("GPU: no GPU")
    lines += [f"mode: {runtime.describe()}", f"  because {runtime.reason()}"]
    return lines


# the commands

def _bench(args, argv: list[str] | None) -> int:
    from studylog import bench as harness
    from studylog import paths

    if args.chapters[0] == "verify":
        if len(args.chapters) != 2:
            raise UsageError("bench verify takes one results folder: python -m studylog bench verify DIR")
        if not Path(args.chapters[1]).is_dir():
            raise UsageError(f"bench verify: {args.chapters[1]} is not a folder")
        from studylog import verify as verifier

        report = verifier.verify(Path(args.chapters[1]), tolerance=args.tolerance)  # a ValueError: main's error
        text = verifier.verify_markdown(report)
        print(text)
        if args.report is not None:
            args.report.parent.mkdir(parents=True, exist_ok=True)
            args.report.with_suffix(".md").write_text(text + "\n")
            args.report.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        broken = any(h.get("holds") is False for f in report["files"] for h in f.get("headlines", []))
        return 3 if broken or any(f.get("rows_compared") == 0 for f in report["files"]) else 0

    _check_chapters(args.chapters)
    if args.out is None and not paths.CHECKOUT:
        raise UsageError("studylog is installed from a wheel here, with no assets/bench to write to: pass --out DIR")
    command = "python -m studylog " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    try:
        harness.run_chapters(args.chapters, out_dir=args.out or harness.DEFAULT_OUT, command=command, quick=args.quick)
    except harness.NoGPUError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "info":
            print("\n".join(info_lines()))
            return 0
        return _bench(args, argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left (`... | head`): stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
