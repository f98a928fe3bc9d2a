"""Writes assets/data/ngram_corpus.npz: chapter 3's real token windows (Python's standard library in cl100k tokens).

:data:`WINDOWS` windows of :data:`WINDOW` tokens per kind, evenly spaced over one stream per kind: **code**, the
source of :data:`CORPUS_FILES`; **text**, their docstrings. The library only loads the file
(``studylog.ngram.corpus.load_corpus``, numpy only); building it needs the tokenizer package ``bpe-openai``.
``--check`` compares a fresh build with the committed file instead of writing. Run from the repository root:
``PYTHONPATH=$PWD python lab/ngram/make_corpus.py [--out PATH] [--check]``.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import sysconfig
from pathlib import Path

import numpy as np

from studylog.ngram.corpus import CORPUS_PATH, KINDS, WINDOW, WINDOWS, load_corpus

#: The standard-library modules the corpus reads, sorted: large, stable, with long code and long docstrings.
CORPUS_FILES = (
    "argparse.py", "ast.py", "dataclasses.py", "difflib.py", "doctest.py", "email/message.py", "enum.py",
    "functools.py", "inspect.py", "logging/__init__.py", "pickle.py", "pydoc.py", "shutil.py", "statistics.py",
    "subprocess.py", "tarfile.py", "textwrap.py", "threading.py", "typing.py", "unittest/case.py",
)
TOKENIZER = "cl100k_base"
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def docstrings(source: str) -> str:
    """A module's docstrings (its own, then its classes' and functions' in source order), joined by a blank line."""
    tree = ast.parse(source)
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    nodes = [tree] + sorted(defs, key=lambda n: (n.lineno, n.col_offset))
    return "\n\n".join(d for d in (ast.get_docstring(n, clean=True) for n in nodes) if d)


def window_starts(stream_len: int, windows: int = WINDOWS, window: int = WINDOW) -> list[int]:
    """Evenly spaced starts of ``windows`` windows of ``window`` tokens in a stream, from 0 to its end."""
    if stream_len < window:
        raise ValueError(f"a stream of {stream_len} tokens holds no window of {window}")
    return [i * (stream_len - window) // max(windows - 1, 1) for i in range(windows)]


def build_corpus() -> dict:
    """Tokenize the documents and cut the windows: ``{"text": int32 [WINDOWS, WINDOW], "code": ..., "meta": {...}}``."""
    try:
        import bpe_openai
    except ImportError as exc:
        raise ImportError("building the n-gram corpus needs the tokenizer package bpe-openai "
                          "(pip install bpe-openai); loading the committed corpus does not") from exc
    encoding = bpe_openai.get_encoding(TOKENIZER)
    docs: dict[str, list[str]] = {kind: [] for kind in KINDS}  # one document per file of CORPUS_FILES, in order
    digests = {}
    for name in CORPUS_FILES:
        path = STDLIB / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: the corpus reads {name} of the Python standard library")
        raw = path.read_bytes()
        digests[name] = hashlib.sha256(raw).hexdigest()
        docs["code"].append(raw.decode("utf-8"))
        docs["text"].append(docstrings(docs["code"][-1]))
    out: dict = {}
    meta = {"python": ".".join(map(str, sys.version_info[:3])), "tokenizer": TOKENIZER,
            "bpe_openai": getattr(bpe_openai, "__version__", "unknown"), "files": list(CORPUS_FILES),
            "sha256": digests, "window": WINDOW, "windows": WINDOWS, "stream_tokens": {}, "window_starts": {},
            "how": "python lab/ngram/make_corpus.py"}
    for kind in KINDS:
        stream = [token for doc in docs[kind] for token in encoding.encode(doc)]
        starts = window_starts(len(stream))
        out[kind] = np.array([stream[s:s + WINDOW] for s in starts], dtype=np.int32)
        meta["stream_tokens"][kind] = len(stream)
        meta["window_starts"][kind] = starts
    out["meta"] = meta
    return out


def stdlib_differences(meta: dict) -> list[str]:
    """The corpus files that differ from (or are missing in) this Python's standard library: a rebuild reproduces
    the committed ids only when there are none."""
    return [name for name, digest in meta["sha256"].items()
            if not (STDLIB / name).is_file() or hashlib.sha256((STDLIB / name).read_bytes()).hexdigest() != digest]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lab/ngram/make_corpus.py",
                                     description="Build chapter 3's corpus of real token windows (needs bpe-openai).")
    parser.add_argument("--out", type=Path, default=CORPUS_PATH, help="where to write the .npz")
    parser.add_argument("--check", action="store_true", help="compare a fresh build with the file instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        committed = load_corpus(args.out)
        if differ := stdlib_differences(committed.meta):
            print(f"this Python's standard library differs from the one the corpus was built from "
                  f"(Python {committed.meta['python']}) in {', '.join(differ)}: a rebuild cannot match")
            return 2
        fresh = build_corpus()
        same = all(np.array_equal(fresh[k], committed.tokens[k].numpy()) for k in KINDS)
        print(f"the committed corpus {'matches' if same else 'DIFFERS from'} a fresh build")
        return 0 if same else 1
    path, built = args.out, build_corpus()
    path.parent.mkdir(parents=True, exist_ok=True)  # ids as int32, the metadata as JSON
    np.savez_compressed(path, **{k: built[k] for k in KINDS}, meta=np.array(json.dumps(built["meta"], indent=1)))
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB): {WINDOWS} windows of {WINDOW} tokens per kind, from "
          f"streams of {built['meta']['stream_tokens']} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
