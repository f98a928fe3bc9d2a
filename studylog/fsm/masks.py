"""Real grammar masks for the masked-LM-head chapter: ``assets/data/fsm_masks.npz``.

``python -m studylog.fsm export-masks`` runs the suite, collects every visited state and keeps a sample that
spans the distribution of allowed-token counts, in the format of :mod:`studylog.data`.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from studylog.fsm.automaton import ConstrainedFSM
from studylog.fsm.report import EntryResult, run_suite
from studylog.fsm.vocabulary import load_vocabulary

#: The digit class of the committed ``assets/data/fsm_masks.npz``: outlines' regexes, where ``\\d`` is any Unicode
#: digit (the suite writes ``[0-9]``); chapter 2's committed benchmark read that file. ``export_masks`` keeps this
#: default so that the command reproduces the committed file; ``ascii_digits=True`` (``--ascii-digits``) exports
#: the masks of the suite as the chapter compiles it.
COMMITTED_MASKS_ASCII_DIGITS = False


def select_masks(counts: Sequence[tuple[str, int, int]], per_bin: int = 24, max_ids: int = 450_000,
                 seed: int = 0) -> list[tuple[str, int, int]]:
    """Pick masks spanning the distribution of allowed-token counts: up to ``per_bin`` from each power-of-two
    bin of counts, at most ``max_ids`` ids in all (large masks dominate the file), chosen at random."""
    rng = random.Random(seed)
    bins: dict[int, list] = {}
    for item in sorted(set(counts)):
        bins.setdefault(int(np.log2(item[2])), []).append(item)
    chosen = []
    for b in sorted(bins):
        pool = bins[b]
        chosen += rng.sample(pool, min(per_bin, len(pool)))
    chosen.sort(key=lambda x: x[2])
    total, picked = 0, []
    for item in chosen:  # smallest first: the dense end is thinned when the budget runs out
        if total + item[2] > max_ids:
            continue
        picked.append(item)
        total += item[2]
    return picked


def export_masks(path: Optional[Path] = None, n_samples: int = 8, seed: int = 0, per_bin: int = 24,
                 max_ids: int = 450_000, ascii_digits: bool = COMMITTED_MASKS_ASCII_DIGITS) -> Path:
    """Write real grammar masks (cl100k_base, states visited by the suite) in ``studylog.data``'s format.

    Deterministic: same suite, same samples, same selection. Command: ``python -m studylog.fsm export-masks``.
    ``ascii_digits`` picks the suite's regexes (see :data:`COMMITTED_MASKS_ASCII_DIGITS` for the default)."""
    from studylog import data

    path = Path(path) if path is not None else data.MASKS_FILE
    vocab = load_vocabulary()
    grabbed: dict[tuple[str, int], np.ndarray] = {}
    all_counts: list[tuple[str, int, int]] = []

    def keep(res: EntryResult, fsm: ConstrainedFSM) -> None:
        # the selection needs every count first, so copy out all visited masks up to the largest size kept
        for s, n in res.visited.items():
            all_counts.append((res.source, s, n))
            grabbed[(res.source, s)] = fsm.allowed_array(s).astype(np.int32)

    run_suite(vocab, n_samples=n_samples, seed=seed, keep=keep, ascii_digits=ascii_digits)
    picked = select_masks(all_counts, per_bin=per_bin, max_ids=max_ids, seed=seed)
    masks = [grabbed[(src, s)] for src, s, _ in picked]
    return data.save_masks(path, masks, [s for _, s, _ in picked], [src for src, _, _ in picked],
                           vocab.vocab_size, vocab.name)
