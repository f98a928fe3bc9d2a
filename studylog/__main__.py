"""Command line: ``python -m studylog info`` and ``python -m studylog bench <chapter|all>``."""

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
    bench.add_argument("chapters", nargs="+", help="chapter names (env, masked_lm_head, ngram, ctc, "
                       "ternary, multi_item) or 'all'")
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
