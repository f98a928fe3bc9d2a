"""``python -m studylog.ngram corpus [--out PATH] [--check]``: rebuild (or check) chapter 3's corpus of real
token windows (:mod:`studylog.ngram.corpus`; needs ``bpe-openai``)."""

import sys

from studylog.ngram.corpus import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "corpus":
        print("usage: python -m studylog.ngram corpus [--out PATH] [--check]", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(args[1:]))
