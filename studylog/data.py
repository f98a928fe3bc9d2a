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


def load_masks(path: Path = MASKS_FILE) -> MaskSet:
    """Read a mask file; raises FileNotFoundError (saying how to make it) when it is missing."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} is missing; make it with `python lab/fsm/export_masks.py`")
    z = np.load(path, allow_pickle=False)
    return MaskSet(int(z["vocab_size"]), z["offsets"], z["ids"], z["state"], z["source"], str(z["tokenizer"]))
