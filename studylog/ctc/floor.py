"""The latency floor of chapter 4's recursion: ``csrc/ctc_chain_floor.cu`` runs only its chain of dependent frames
(no emissions, no rows stored, no maximum), a lower bound of any kernel that runs ``frames`` frames over ``states``."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from studylog import checks
from studylog.ctc.launch import kernels

#: States (positions of the extended target) per thread, as steps 12 and 14 hold them at S <= 128.
CHAIN_GRAIN = 4
#: The one block's 1024 threads hold at most CHAIN_GRAIN x 1024 states.
MAX_CHAIN_STATES = CHAIN_GRAIN * 1024
#: The ``.cu`` file (in ``studylog/ctc/csrc``), its kernel and the kernel's arguments (out, frames, states).
SOURCE, KERNEL, SIGNATURE = "ctc_chain_floor", "ctc_chain_floor", ("ptr", "i32", "i32")


def chain_threads(states: int) -> int:
    """Threads of the block for ``states`` states: whole warps of CHAIN_GRAIN states a thread."""
    return 32 * math.ceil(states / (32 * CHAIN_GRAIN))


def chain_floor(frames: int, states: int, *, device="cuda", out: Tensor | None = None) -> Tensor:
    """Run ``frames`` frames of the recursion over ``states`` (<= :data:`MAX_CHAIN_STATES`) states in one block into
    ``out`` (float32, ``(states,)``); with ``out`` given a call allocates nothing (graph-safe)."""
    frames = checks.check_int("frames", frames, low=1, high=2**31 - 1)
    states = checks.check_int("states", states, low=1, high=MAX_CHAIN_STATES)
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device must be a CUDA device (the floor is a GPU kernel), got {device}")
    out = (torch.empty((states,), dtype=torch.float32, device=device) if out is None
           else checks.check_out("out", out, shape=(states,), dtype=torch.float32, device=device))
    (kernel,) = kernels(SOURCE, [(KERNEL, SIGNATURE)])
    kernel((1,), (chain_threads(states),), out, frames, states)
    return out
