"""Real token sequences for chapter 3 (random ids say little about which branches run on real prompts): Python's
standard library in cl100k tokens. The committed corpus (:data:`CORPUS_PATH`, read without a tokenizer) holds
:data:`WINDOWS` windows of :data:`WINDOW` tokens per kind, evenly spaced over one stream per kind: **code**, the
source of twenty standard-library modules; **text**, their docstrings. ``lab/ngram/make_corpus.py`` builds (or
checks) it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from studylog.paths import DATA

KINDS = ("text", "code")
WINDOW = 4096  # tokens per window
WINDOWS = 16  # windows per kind
CORPUS_PATH = DATA / "ngram_corpus.npz"


@dataclass(frozen=True)
class Corpus:
    """The committed windows: ``tokens[kind]`` is an int64 tensor [windows, window] of cl100k ids."""

    tokens: dict[str, Tensor]
    meta: dict

    def stream(self, kind: str, first_window: int, length: int, offset: int = 0) -> Tensor:
        """``length`` tokens of ``kind`` from ``offset`` into window ``first_window``, on through the following
        windows (cyclically, never reaching the first again)."""
        windows = self.tokens[kind]
        count, window = windows.shape
        needed = -(-(offset + length) // window)
        if needed > count:
            raise ValueError(f"{length} tokens from offset {offset} need {needed} windows of {window}; "
                             f"the corpus has {count} of {kind}")
        order = [(first_window + j) % count for j in range(needed)]
        return windows[order].reshape(-1)[offset:offset + length]


def load_corpus(path: Path = CORPUS_PATH) -> Corpus:
    """The committed corpus (numpy only; no tokenizer needed)."""
    with np.load(Path(path), allow_pickle=False) as f:
        meta = json.loads(str(f["meta"]))
        tokens = {kind: torch.from_numpy(f[kind].astype(np.int64)) for kind in KINDS}
    return Corpus(tokens, meta)
