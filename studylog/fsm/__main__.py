"""Chapter 1's tool: ``python -m studylog.fsm report`` (the SchemaStore survey is ``python -m book.fsm.realworld``)."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Optional

from studylog.fsm.report import run_suite, savings_table, suite_summary
from studylog.fsm.vocabulary import load_vocabulary


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studylog.fsm", description="Chapter 1 (FSM compression) tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="print the suite's savings table")
    rep.add_argument("--samples", type=int, default=8)
    rep.add_argument("--json", type=Path, default=None, help="also write the suite's totals (report.suite_summary) to "
                     "this JSON file (the book's landing page reads assets/data/fsm_suite.json, written this way)")
    args = parser.parse_args(argv)
    results = run_suite(n_samples=args.samples, progress=True)
    print(savings_table(results))
    if args.json is not None:
        record = {"command": "python -m studylog.fsm " + " ".join(sys.argv[1:] if argv is None else argv),
                  "date": datetime.date.today().isoformat(), "samples": args.samples, "seed": 0,
                  "vocabulary": load_vocabulary().name, "summary": suite_summary(results)}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
