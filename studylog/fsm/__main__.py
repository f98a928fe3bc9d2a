"""Chapter 1's tools: ``python -m studylog.fsm export-masks | report | realworld``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from studylog.fsm.masks import export_masks
from studylog.fsm.report import run_suite, savings_table


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studylog.fsm", description="Chapter 1 (FSM compression) tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export-masks", help="write assets/data/fsm_masks.npz from the suite's visited states")
    exp.add_argument("--out", type=Path, default=None, help="output file (default: assets/data/fsm_masks.npz)")
    exp.add_argument("--samples", type=int, default=8, help="samples per suite entry (default 8)")
    exp.add_argument("--ascii-digits", action="store_true",
                     help="write \\d as [0-9] in the suite's regexes, as the chapter compiles them (the default "
                          "reproduces the committed file, exported with outlines' Unicode \\d)")
    rep = sub.add_parser("report", help="print the suite's savings table")
    rep.add_argument("--samples", type=int, default=8)
    rw = sub.add_parser("realworld", help="compile the SchemaStore catalog with outlines-core (chapter 1's "
                                          "automaton), xgrammar and llguidance; time masks along sampled "
                                          "documents (MaskBench-style)")
    rw.add_argument("--sample", type=int, default=None, metavar="N",
                    help="a fixed seeded sample of N schemas (the CI sample is 40); default: the whole catalog")
    rw.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N schemas (after --sample)")
    rw.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds per compile (default 60)")
    rw.add_argument("--vocab", nargs="+", default=["cl100k_base"], metavar="NAME",
                    help="vocabularies, each run apart (default cl100k_base; e.g. cl100k_base smollm2)")
    rw.add_argument("--engines", nargs="+", default=None, metavar="ENGINE",
                    help="engines among outlines-core xgrammar llguidance (default: all three)")
    rw.add_argument("--docs", type=int, default=3, help="documents sampled per schema (default 3)")
    rw.add_argument("--max-tokens", type=int, default=300, help="tokens per document at most (default 300)")
    rw.add_argument("--seed", type=int, default=0, help="seed of the sample and of the walks (default 0)")
    rw.add_argument("--mem-limit", type=float, default=8.0, metavar="GIB",
                    help="resident memory of a compile before it is killed (default 8 GiB)")
    rw.add_argument("--out", default=None, metavar="PATH",
                    help="JSON output; '{vocab}' in it is replaced by the vocabulary's name (default "
                         "assets/data/realworld_{vocab}.json)")
    rw.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.command == "realworld":
        return _realworld(args)
    if args.command == "export-masks":
        from studylog import data

        path = export_masks(args.out, n_samples=args.samples, ascii_digits=args.ascii_digits)
        ms = data.load_masks(path)
        counts = ms.counts()
        print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB): {len(ms)} masks over {ms.vocab_size} ids "
              f"({ms.tokenizer}), allowed tokens from {counts.min()} to {counts.max()}")
        return 0
    print(savings_table(run_suite(n_samples=args.samples, progress=True)))
    return 0


def _realworld(args) -> int:
    from studylog import paths
    from studylog.fsm import realworld

    def fail(msg: str) -> int:
        print(f"error: {msg}", file=sys.stderr)
        return 2

    engines = tuple(args.engines) if args.engines else realworld.ENGINES
    unknown = [e for e in engines if e not in realworld.ENGINES]
    if unknown:
        return fail(f"--engines: unknown engine {unknown[0]!r}; choose among {' '.join(realworld.ENGINES)}")
    if not args.timeout > 0:
        return fail(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    for flag, value in (("--sample", args.sample), ("--limit", args.limit), ("--max-tokens", args.max_tokens)):
        if value is not None and value < 1:
            return fail(f"{flag} must be at least 1, got {value}")
    if args.docs < 0:
        return fail(f"--docs must be at least 0, got {args.docs}")
    if not args.mem_limit > 0:
        return fail(f"--mem-limit must be a positive number of GiB, got {args.mem_limit:g}")
    out = args.out or str(paths.REPO_ROOT / realworld.DEFAULT_OUT)
    if len(args.vocab) > 1 and "{vocab}" not in out:
        return fail(f"--out {out!r} is one file for {len(args.vocab)} vocabularies; put '{{vocab}}' in it")
    try:
        vocabs = [realworld.resolve_vocabulary(name) for name in args.vocab]
        if args.sample is not None:
            items = realworld.sample(args.sample, seed=args.seed)
            selection = f"sample(n={args.sample}, seed={args.seed}) of the SchemaStore catalog"
        else:
            items = realworld.catalog()
            selection = f"the SchemaStore catalog ({len(items)} schemas)"
        if args.limit is not None:
            items = items[:args.limit]
            selection += f", first {len(items)}"
    except (ValueError, TypeError, ImportError, FileNotFoundError, RuntimeError) as exc:
        return fail(str(exc).replace("n must", "--sample must", 1) if str(exc).startswith("n must") else str(exc))
    for vocab in vocabs:
        path = Path(out.replace("{vocab}", vocab.name))
        try:
            doc = realworld.run(items, vocab.name, engines=engines, timeout=args.timeout, out=path,
                                selection=selection, progress=not args.no_progress, n_docs=args.docs,
                                max_tokens=args.max_tokens, seed=args.seed, mem_limit_gib=args.mem_limit)
        except KeyboardInterrupt:
            return fail("interrupted (the partial results written every 10 schemas are in " + str(path) + ")")
        except (ValueError, TypeError, ImportError, RuntimeError, OSError) as exc:
            return fail(str(exc))
        print(f"\n{vocab.name}: {len(items)} schemas in {doc['seconds']:.0f} s -> {path}\n")
        print(realworld.results_table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
