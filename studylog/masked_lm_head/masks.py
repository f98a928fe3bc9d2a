"""Allowed sets to measure on: random, clustered, real grammar masks (or a synthetic stand-in), and the
cross-fitting that judges a vocabulary order on grammars it never saw."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from studylog.masked_lm_head.formats import VOCAB
from studylog.masked_lm_head.reorder import VocabOrder, cluster_order


def random_sets(count: int, vocab: int, batch: int, gen: np.random.Generator) -> list[np.ndarray]:
    """``batch`` sets of ``count`` ids drawn uniformly without replacement."""
    return [np.sort(gen.choice(vocab, size=min(count, vocab), replace=False)) for _ in range(batch)]


def clustered_sets(count: int, vocab: int, batch: int, gen: np.random.Generator, run: int = 512) -> list[np.ndarray]:
    """``batch`` sets of ``count`` ids made of contiguous runs of up to ``run`` ids at random places."""
    out = []
    count = min(count, vocab)
    for _ in range(batch):
        n_runs = math.ceil(count / run)
        lengths = np.full(n_runs, count // n_runs)
        lengths[: count - lengths.sum()] += 1
        # place runs left to right with random gaps that use up the free space
        free = vocab - count
        gaps = np.sort(gen.integers(0, free + 1, size=n_runs))
        starts = gaps + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        out.append(np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)]))
    return out


def grammar_like_sets(n_sets: int, vocab: int, gen: np.random.Generator, n_classes: int = 400) -> list[np.ndarray]:
    """Synthetic stand-in for grammar masks: each set is the union of a few random token classes (not
    contiguous in id order, like "digits")."""
    weights = gen.lognormal(0.0, 1.5, size=n_classes)
    labels = gen.choice(n_classes, size=vocab, p=weights / weights.sum())
    members = [np.flatnonzero(labels == c) for c in range(n_classes)]
    out = []
    for _ in range(n_sets):
        chosen = gen.choice(n_classes, size=int(gen.integers(1, 6)), replace=False)
        out.append(np.unique(np.concatenate([members[c] for c in chosen])))
    return out


@dataclass
class StructuredSets:
    """Allowed sets with a structure, each tagged with the grammar it comes from."""

    sets: list[np.ndarray]
    groups: list[str]
    source: str

    @property
    def is_real(self) -> bool:
        return self.source.startswith("real")


def real_sets(vocab: int = VOCAB) -> StructuredSets | None:
    """The FSM chapter's grammar masks (``assets/data/fsm_masks.npz``), or None if missing; a schema and its
    ``[compact]`` variant count as one grammar."""
    from studylog import data

    try:
        masks = data.load_masks()
    except FileNotFoundError:
        return None
    if masks.vocab_size > vocab:
        raise ValueError(f"the masks' vocabulary ({masks.vocab_size}) is larger than V={vocab}")
    sets = [masks.allowed(i).astype(np.int64) for i in range(len(masks))]
    groups = [str(src).removesuffix("[compact]") for src in masks.source]
    return StructuredSets(sets, groups, f"real FSM masks ({masks.tokenizer}, {len(sets)} states)")


def structured_sets(vocab: int = VOCAB) -> StructuredSets:
    """The real masks when the file exists, else synthetic token-class masks (said in ``source``)."""
    real = real_sets(vocab)
    if real is not None:
        return real
    sets = grammar_like_sets(600, vocab, np.random.default_rng(0))
    return StructuredSets(sets, [f"synthetic-{i % 20}" for i in range(len(sets))],
                          "SYNTHETIC token-class masks (the real mask file is missing)")


def cross_fit_orders(data: StructuredSets, vocab: int) -> tuple[list[VocabOrder], list[int]]:
    """Two-fold cross-fitting by grammar: the orders (``orders[k]``, fitted outside fold ``k``, serves fold ``k``)
    and each set's fold."""
    names = sorted(set(data.groups))
    fold_of_group = {name: i % 2 for i, name in enumerate(names)}
    fold = [fold_of_group[g] for g in data.groups]
    orders = [cluster_order([s for s, f in zip(data.sets, fold) if f != k], vocab) for k in (0, 1)]
    return orders, fold

