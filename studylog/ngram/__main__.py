"""``python -m studylog.ngram corpus [--out PATH] [--check]``: rebuild (or check) chapter 3's corpus of real
token windows (:mod:`studylog.ngram.corpus`; needs ``bpe-openai``)."""

from studylog.ngram.corpus import main

if __name__ == "__main__":
    raise SystemExit(main())
