"""The SchemaStore survey's command line: ``python -m book.fsm.realworld --vocab cl100k_base smollm2``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from book.fsm import realworld
from studylog import paths


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m book.fsm.realworld",
                                     description="compile the SchemaStore catalog with outlines-core (chapter 1's "
                                                 "automaton), xgrammar and llguidance; time masks along sampled "
                                                 "documents (MaskBench-style)")
    parser.add_argument("--sample", type=int, default=None, metavar="N",
                        help="a fixed seeded sample of N schemas (the CI sample is 40); default: the whole catalog")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N schemas (after --sample)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds per compile (default 60)")
    parser.add_argument("--vocab", nargs="+", default=["cl100k_base"], metavar="NAME",
                        help="vocabularies, each run apart (default cl100k_base; e.g. cl100k_base smollm2)")
    parser.add_argument("--engines", nargs="+", default=None, metavar="ENGINE",
                        help="engines among outlines-core xgrammar llguidance (default: all three)")
    parser.add_argument("--docs", type=int, default=3, help="documents sampled per schema (default 3)")
    parser.add_argument("--max-tokens", type=int, default=300, help="tokens per document at most (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample and of the walks (default 0)")
    parser.add_argument("--mem-limit", type=float, default=8.0, metavar="GIB",
                        help="resident memory of a compile before it is killed (default 8 GiB)")
    parser.add_argument("--out", default=None, metavar="PATH",
                        help="JSON output; '{vocab}' in it is replaced by the vocabulary's name (default "
                             "assets/data/realworld_{vocab}.json)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

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
