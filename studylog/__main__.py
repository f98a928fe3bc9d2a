"""Command line: ``python -m studylog info``, ``python -m studylog bench <chapter|all>``,
``python -m studylog bench verify <results-dir>`` and ``python -m studylog plot <chapter|all>``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studylog", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="say how kernels run on this machine")
    bench = sub.add_parser("bench", help="run a chapter's GPU benchmark and write its JSON results")
    from studylog.chapter import CHAPTERS

    bench.add_argument("chapters", nargs="+", help=f"chapter names ({', '.join(CHAPTERS)}) or 'all'; "
                       "or 'verify DIR' to compare a fresh run's results "
                       "(DIR/<gpu>/<chapter>.json) with the committed ones")
    bench.add_argument("--report", type=Path, default=None,
                       help="with verify: also write the report to REPORT.md and REPORT.json")
    bench.add_argument("--tolerance", type=float, default=0.15, help="with verify: how far a number may move")
    bench.add_argument("--out", type=Path, default=None,
                       help="results folder (default: assets/bench); files go to OUT/<gpu-name>/<chapter>.json")
    bench.add_argument("--quick", action="store_true", help="a reduced sweep, for trying the harness out")
    plot = sub.add_parser("plot", help="redraw a chapter's figures from its committed results into assets/figures")
    plot.add_argument("chapters", nargs="+", help="chapter names or 'all'")
    args = parser.parse_args(argv)

    from studylog import runtime

    if args.command == "info":
        print(runtime.describe())
        return 0

    if args.command == "plot":
        from studylog import plotting

        for path in plotting.save_chapter_figures(args.chapters):
            print(path)
        return 0

    from studylog import bench as harness

    if args.chapters[0] == "verify":
        if len(args.chapters) != 2:
            parser.error("bench verify takes one results folder: python -m studylog bench verify DIR")
        import json

        try:
            report = harness.verify(Path(args.chapters[1]), tolerance=args.tolerance)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        text = harness.verify_markdown(report)
        print(text)
        if args.report is not None:
            args.report.parent.mkdir(parents=True, exist_ok=True)
            args.report.with_suffix(".md").write_text(text + "\n")
            args.report.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        broken = [h for f in report["files"] for h in f.get("headlines", []) if h.get("holds") is False]
        empty = [f for f in report["files"] if f.get("rows_compared") == 0]
        return 3 if broken or empty else 0

    command = "python -m studylog " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    try:
        harness.run_chapters(args.chapters, out_dir=args.out or harness.DEFAULT_OUT, command=command,
                             quick=args.quick)
    except harness.NoGPUError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
