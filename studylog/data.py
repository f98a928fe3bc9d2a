"""Real grammar masks, exported by the FSM chapter (``lab/fsm/export_masks.py``), read by the masked-LM-head chapter:
``assets/data/fsm_masks.npz`` holds ``vocab_size``, ``offsets`` (mask ``i`` is ``ids[offsets[i]:offsets[i+1]]``),
``ids`` (int32, each mask sorted), ``state`` and ``source`` (the FSM state and schema each mask comes from) and
``tokenizer`` (the vocabulary's name).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from studylog.paths import DATA

MASKS_FILE = DATA / "fsm_masks.npz"


@dataclass
class MaskSet:
    vocab_size: int
    offsets: np.ndarray
    ids: np.ndarray
    state: np.ndarray
    source: np.ndarray
    tokenizer: str

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def allowed(self, i: int) -> np.ndarray:
        """Allowed token ids of mask ``i``."""
        return self.ids[self.offsets[i]:self.offsets[i + 1]]

    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)


def save_masks(path: Path, masks: list[np.ndarray], states: list[int], sources: list[str], vocab_size: int,
               tokenizer: str) -> Path:
    """Write masks (each an array of allowed ids) in the format above."""
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


def load_masks(path: Path = MASKS_FILE) -> MaskSet:
    """Read a mask file; raises FileNotFoundError (saying how to make it) when it is missing."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} is missing; make it with `python lab/fsm/export_masks.py`")
    z = np.load(path, allow_pickle=False)
    return MaskSet(int(z["vocab_size"]), z["offsets"], z["ids"], z["state"], z["source"], str(z["tokenizer"]))
