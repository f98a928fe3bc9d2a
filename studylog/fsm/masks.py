"""Real grammar masks for chapter 2 (``assets/data/fsm_masks.npz``): states the suite visits, sampled across the
distribution of allowed-token counts (``python -m studylog.fsm export-masks``)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from studylog.fsm.automaton import ConstrainedFSM
from studylog.fsm.report import EntryResult, run_suite
from studylog.fsm.vocabulary import load_vocabulary

#: The committed masks were exported from outlines' regexes (``\\d`` any Unicode digit), and chapter 2's benchmark
#: read them: the default reproduces that file; ``--ascii-digits`` exports the suite as the chapter compiles it.
COMMITTED_MASKS_ASCII_DIGITS = False


def select_masks(counts: Sequence[tuple[str, int, int]], per_bin: int = 24, max_ids: int = 450_000,
                 seed: int = 0) -> list[tuple[str, int, int]]:
    """Pick masks spanning the distribution of allowed-token counts: up to ``per_bin`` from each power-of-two
    bin of counts, at most ``max_ids`` ids in all (large masks dominate the file), chosen at random."""
    rng = random.Random(seed)
    bins: dict[int, list] = {}
    for item in sorted(set(counts)):
        bins.setdefault(int(np.log2(item[2])), []).append(item)
    chosen = [x for b in sorted(bins) for x in rng.sample(bins[b], min(per_bin, len(bins[b])))]
    chosen.sort(key=lambda x: x[2])
    total, picked = 0, []
    for item in chosen:  # smallest first: the dense end is thinned when the budget runs out
        if total + item[2] > max_ids:
            continue
        picked.append(item)
        total += item[2]
    return picked


def export_masks(path: Optional[Path] = None, n_samples: int = 8,
                 ascii_digits: bool = COMMITTED_MASKS_ASCII_DIGITS) -> Path:
    """Write the masks of the states the suite visits (cl100k_base) in ``studylog.data``'s format, deterministically."""
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

    run_suite(vocab, n_samples=n_samples, keep=keep, ascii_digits=ascii_digits)
    picked = select_masks(all_counts)
    masks = [grabbed[(src, s)] for src, s, _ in picked]
    return data.save_masks(path, masks, [s for _, s, _ in picked], [src for src, _, _ in picked],
                           vocab.vocab_size, vocab.name)
