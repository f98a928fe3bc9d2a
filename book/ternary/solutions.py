"""The answers to chapter 5's exercises (both parts). The notebooks do not import this module: read it after
trying. Each function is the plain rule its check in :mod:`book.ternary.exercises` holds an answer to."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

__all__ = ["MEASURED", "unpack_group", "field_float_bits", "base3_byte", "base3_weights", "absmean", "mma_position", "w2a8_sum",
           "round_int8", "ring_waits"]


def unpack_group(words: Sequence[int]) -> list[int]:
    """Exercise 1: the 256 weights (-1, 0, +1) of one group of the ``"2bit"`` format, from its 16
    words (unsigned 32-bit ints). Word t holds weight 16 j + t in bits 2j, 2j + 1, as the code w + 1."""
    out = [0] * 256
    for t, word in enumerate(words):
        for j in range(16):
            out[16 * j + t] = ((word >> (2 * j)) & 3) - 1
    return out


def field_float_bits(word: int, f: int) -> int:
    """Exercise 2: for field f (0..7) of a 2-bit word, the 32 bits that read as the float32
    ``2^(23 - 2f) + code``: the word's low 16 bits under an exponent with all bits set, ANDed with the
    exponent of ``2^(23 - 2f)`` and the field's two bits (step 4's ``_with_exponent`` and ``_field_to_float``)."""
    low = (word & 0xFFFF) | 0x7F800000
    return low & (((150 - 2 * f) << 23) | (3 << (2 * f)))


def base3_byte(weights: Sequence[int]) -> int:
    """Exercise 3a: the byte of five weights w_0..w_4, ``sum_d (w_d + 1) 3^d``."""
    return sum((int(w) + 1) * 3**d for d, w in enumerate(weights))


def base3_weights(byte: int) -> list[int]:
    """Exercise 3b: the five weights of a base-3 byte, digit 0 first."""
    return [(byte // 3**d) % 3 - 1 for d in range(5)]


def absmean(w: Tensor) -> tuple[Tensor, Tensor]:
    """Exercise 4: ``scale = 1 / mean|W|`` over the whole tensor and
    ``W_t = clamp(round(W * scale), -1, 1)`` as int8."""
    scale = 1.0 / w.float().abs().mean().clamp(min=1e-5)
    return (w.float() * scale).round().clamp(-1, 1).to(torch.int8), scale


def mma_position(k: int) -> tuple[int, int]:
    """Exercise 6: (word, lowest bit) of weight k (0..255) of a group in the ``"2bit_mma"`` format:
    weight 32 p + 2 t + h is in word t, bits 16 h + 2 p."""
    p, rest = divmod(k, 32)
    t, h = divmod(rest, 2)
    return t, 16 * h + 2 * p


def w2a8_sum(acc: Sequence[int], x_sum: int) -> int:
    """Exercise 7: ``sum_k x_k w_k`` from step 12's accumulators. ``acc[p]`` sums ``x_k`` times the
    byte ``code_k << 2p`` over the weights k held at code position p of their byte, with ``code = w + 1``;
    ``x_sum`` is ``sum_k x_k`` over all of them."""
    return acc[0] + (acc[1] >> 2) + (acc[2] >> 4) + (acc[3] >> 6) - x_sum


def round_int8(x: Tensor) -> tuple[Tensor, Tensor]:
    """Exercise 8: one row of x to int8 with its absmax, ``scale = 127 / max|x|`` and
    ``q = round(x * scale)`` rounded half to even (as torch rounds), clamped to [-128, 127]."""
    scale = 127.0 / x.float().abs().max().clamp(min=1e-5)
    return (x.float() * scale).round().clamp(-128, 127).to(torch.int8), scale


def ring_waits(c: int, stages: int) -> tuple[int, int, Optional[int]]:
    """Exercise 9: for chunk c of a ring of ``stages`` stages, (the stage it goes into, the phase
    parity a consumer waits for on that stage's "full" mbarrier, the parity the producer waits for on its
    "empty" mbarrier before refilling it, or None when the stage has never been used)."""
    s, lap = c % stages, c // stages
    return s, lap & 1, None if lap == 0 else (lap - 1) & 1


#: Exercises 5 and 10 change a kernel's launch and time it on a GPU; what to look for.
MEASURED = {
    5: "Step 9 at one row has no reuse of a decoded weight: a smaller tile (BLOCK_N 32) gives more programs, so more "
       "loads in flight across the SMs, and more split K does the same for a short N; the autotuner's configs for "
       "M = 1 split K. At 16 rows each decoded tile feeds 16 rows of x, so a larger tile decodes "
       "fewer times per row and waits on fewer MMAs per weight: the same small tile that helps at M = 1 costs "
       "there. No tile removes the wait on each MMA before the next decode, which is part 2's subject.",
    10: "The default (4 warps of one tile, 4 stages of 2 groups, split K to fill the GPU once) was the best of the "
        "H200 sweep at 4096 x 14336 for M = 1 and 16 (lab/ternary/results/nvidia-h200/w2a8_tiles_sweep_tma.json). "
        "Two tiles a warp read x once for both but measured about a quarter slower "
        "(w2a8_tiles_sweep_two_tiles.json). 8 warps a block hold a chunk of 8 tiles a stage, twice the shared "
        "memory of 4, so fewer blocks fit an SM; the latencies the profile shows are hidden only by more warps "
        "resident, which needs a smaller footprint a warp, not a larger block.",
}
