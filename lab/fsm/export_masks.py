"""Writes assets/data/fsm_masks.npz: grammar masks of states chapter 01's suite visits (cl100k_base), sampled
across the distribution of allowed-token counts, which chapter 02's benchmark reads (``studylog.data``'s format).
Deterministic: it reproduces the committed file byte for byte.
Usage, from the repository root: python lab/fsm/export_masks.py [--out PATH] [--samples N]  (CPU, minutes)
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from studylog import data
from studylog.fsm.automaton import ConstrainedFSM
from studylog.fsm.report import EntryResult, run_suite
from studylog.fsm.vocabulary import load_vocabulary

#: The committed masks were exported from outlines' regexes (``\\d`` any Unicode digit), and chapter 2's benchmark
#: read them: :func:`export_masks` reproduces that file byte for byte.
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


def save_masks(path: Path, masks: list[np.ndarray], states: list[int], sources: list[str], vocab_size: int,
               tokenizer: str) -> Path:
    """Write masks (each an array of allowed ids) in ``studylog.data``'s format."""
    if not (len(masks) == len(states) == len(sources)):
        raise ValueError("masks, states and sources must have the same length")
    ids = [np.unique(np.asarray(m, dtype=np.int64)) for m in masks]
    for m in ids:
        if m.size and (m[0] < 0 or m[-1] >= vocab_size):
            raise ValueError(f"mask holds ids outside [0, {vocab_size})")
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([m.size for m in ids])
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, vocab_size=np.int64(vocab_size), offsets=offsets,
                        ids=np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32),
                        state=np.asarray(states, dtype=np.int64), source=np.asarray(sources, dtype=str),
                        tokenizer=np.asarray(tokenizer))
    return path


def export_masks(path: Optional[Path] = None, n_samples: int = 8) -> Path:
    """Write the masks of states the suite visits (cl100k_base), sampled across the distribution of allowed-token
    counts (:func:`select_masks`), in ``studylog.data``'s format, deterministically."""
    vocab = load_vocabulary()
    grabbed: dict[tuple[str, int], np.ndarray] = {}
    all_counts: list[tuple[str, int, int]] = []

    def keep(res: EntryResult, fsm: ConstrainedFSM) -> None:
        # the selection needs every count first, so copy out all visited masks up to the largest size kept
        source = res.name if res.whitespace == "default" else f"{res.name}[{res.whitespace}]"
        for s, n in res.visited.items():
            all_counts.append((source, s, n))
            grabbed[(source, s)] = fsm.allowed_array(s).astype(np.int32)

    run_suite(vocab, n_samples=n_samples, keep=keep, ascii_digits=COMMITTED_MASKS_ASCII_DIGITS)
    picked = select_masks(all_counts)
    return save_masks(Path(path) if path is not None else data.MASKS_FILE,
                      [grabbed[(src, s)] for src, s, _ in picked], [s for _, s, _ in picked],
                      [src for src, _, _ in picked], vocab.vocab_size, vocab.name)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python lab/fsm/export_masks.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output file (default: assets/data/fsm_masks.npz)")
    parser.add_argument("--samples", type=int, default=8, help="samples per suite entry (default 8)")
    args = parser.parse_args(argv)
    path = export_masks(args.out, n_samples=args.samples)
    ms = data.load_masks(path)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB): {len(ms)} masks over {ms.vocab_size} ids "
          f"({ms.tokenizer}), allowed tokens from {ms.counts().min()} to {ms.counts().max()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
