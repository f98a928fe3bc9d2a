"""The answers to chapter 5's exercises (both parts). The notebooks do not import this module: read it after
trying. Each function is the plain rule its check in :mod:`book.ternary.exercises` holds an answer to."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from studylog.ternary.triton_steps import gemv_program, k_slice, store_row  # first: selects the interpreter

import triton  # noqa: I001  (after studylog, which sets TRITON_INTERPRET on a CPU)
import triton.language as tl

__all__ = ["MEASURED", "unpack_group", "field_float_bits", "base3_byte", "base3_weights", "absmean",
           "gemv_shifts_kernel", "mma_position", "w2a8_sum", "round_int8", "ring_waits",
           "magic_literal"]


def unpack_group(words: Sequence[int]) -> list[int]:
    """Part 1, exercise 1: the 256 weights (-1, 0, +1) of one group of the ``"2bit"`` format, from its 16
    words (unsigned 32-bit ints). Word t holds weight 16 j + t in bits 2j, 2j + 1, as the code w + 1."""
    out = [0] * 256
    for t, word in enumerate(words):
        for j in range(16):
            out[16 * j + t] = ((word >> (2 * j)) & 3) - 1
    return out


def field_float_bits(word: int, f: int) -> int:
    """Part 1, exercise 2: for field f (0..7) of a 2-bit word, the 32 bits that read as the float32
    ``2^(23 - 2f) + code``: the word's low 16 bits under an exponent with all bits set, ANDed with the
    exponent of ``2^(23 - 2f)`` and the field's two bits (step 4's ``_with_exponent`` and ``_field_to_float``)."""
    low = (word & 0xFFFF) | 0x7F800000
    return low & (((150 - 2 * f) << 23) | (3 << (2 * f)))


def base3_byte(weights: Sequence[int]) -> int:
    """Part 1, exercise 3a: the byte of five weights w_0..w_4, ``sum_d (w_d + 1) 3^d``."""
    return sum((int(w) + 1) * 3**d for d, w in enumerate(weights))


def base3_weights(byte: int) -> list[int]:
    """Part 1, exercise 3b: the five weights of a base-3 byte, digit 0 first."""
    return [(byte // 3**d) % 3 - 1 for d in range(5)]


def absmean(w: Tensor) -> tuple[Tensor, Tensor]:
    """Part 1, exercise 4: ``scale = 1 / mean|W|`` over the whole tensor and
    ``W_t = clamp(round(W * scale), -1, 1)`` as int8."""
    scale = 1.0 / w.float().abs().mean().clamp(min=1e-5)
    return (w.float() * scale).round().clamp(-1, 1).to(torch.int8), scale


@triton.jit
def gemv_shifts_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, N, K, KW, stride_xm, stride_pn, stride_zm, scale_stride,
                       BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr):
    """Part 1, exercise 6: step 5's kernel with the decode of step 4 replaced, a shift and a mask a field and an int
    to float conversion (``((words >> 2f) & 3) - 1``), as step 3 decodes, instead of one AND under a float exponent.
    The rest (tiles, x loaded once for BLOCK_N rows, split K, masks) is step 5's."""
    pid_k, m, rows, row_mask, p_rows, x_row = gemv_program(x_ptr, p_ptr, N, stride_xm, stride_pn, BLOCK_N)
    kw_start, kw_end = k_slice(pid_k, KW, SPLIT_K, BLOCK_KW)
    offs_w = tl.arange(0, BLOCK_KW)
    x_of_word = (offs_w // 16) * 256 + offs_w % 16  # k of field 0 of each word, from the tile start
    acc = tl.zeros([BLOCK_N, BLOCK_KW], dtype=tl.float32)
    for kw0 in range(kw_start, kw_end, BLOCK_KW):
        kw = kw0 + offs_w
        words = tl.load(p_rows + kw[None, :], mask=row_mask[:, None] & (kw < kw_end)[None, :], other=0x55555555)
        offs_k = kw0 * 16 + x_of_word
        for f in tl.static_range(16):
            x = tl.load(x_row + offs_k + 16 * f, mask=offs_k + 16 * f < K, other=0.0).to(tl.float32)
            w = (((words >> (2 * f)) & 3) - 1).to(tl.float32)  # shift, mask, subtract, convert
            acc += w * x[None, :]
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = tl.sum(acc, axis=1) / scale
    store_row(z_ptr, z, m, stride_zm, rows, row_mask, SPLIT_K)


def mma_position(k: int) -> tuple[int, int]:
    """Part 2, exercise 1: (word, lowest bit) of weight k (0..255) of a group in the ``"2bit_mma"`` format:
    weight 32 p + 2 t + h is in word t, bits 16 h + 2 p."""
    p, rest = divmod(k, 32)
    t, h = divmod(rest, 2)
    return t, 16 * h + 2 * p


def w2a8_sum(acc: Sequence[int], x_sum: int) -> int:
    """Part 2, exercise 2: ``sum_k x_k w_k`` from step 22's accumulators. ``acc[p]`` sums ``x_k`` times the
    byte ``code_k << 2p`` over the weights k held at code position p of their byte, with ``code = w + 1``;
    ``x_sum`` is ``sum_k x_k`` over all of them."""
    return acc[0] + (acc[1] >> 2) + (acc[2] >> 4) + (acc[3] >> 6) - x_sum


def round_int8(x: Tensor) -> tuple[Tensor, Tensor]:
    """Part 2, exercise 3: one row of x to int8 with its absmax, ``scale = 127 / max|x|`` and
    ``q = round(x * scale)`` rounded half to even (as torch rounds), clamped to [-128, 127]."""
    scale = 127.0 / x.float().abs().max().clamp(min=1e-5)
    return (x.float() * scale).round().clamp(-128, 127).to(torch.int8), scale


def ring_waits(c: int, stages: int) -> tuple[int, int, Optional[int]]:
    """Part 2, exercise 4: for chunk c of a ring of ``stages`` stages, (the stage it goes into, the phase
    parity a consumer waits for on that stage's "full" mbarrier, the parity the producer waits for on its
    "empty" mbarrier before refilling it, or None when the stage has never been used)."""
    s, lap = c % stages, c // stages
    return s, lap & 1, None if lap == 0 else (lap - 1) & 1


#: Step 21's read of the decode's constant, and the same constant as a literal (bf16 x; fp16's is 0x64006400).
MAGIC_READ = "const u32 magic = *reinterpret_cast<volatile u32 *>(x_ready + 1);"
MAGIC_LITERAL = "const u32 magic = BF16 ? 0x43004300u : 0x64006400u;"


def magic_literal(source: str) -> str:
    """Part 2, exercise 6: step 21 with its decode's constant as a literal. ptxas now knows the value, and the SASS
    gains moves that build it in a register (``IMAD.MOV.U32 Rn, RZ, RZ, 0x43004300``), but a couple, not step 20's 28:
    the LOP3 of ``decode_pair_reg`` is inline PTX that takes the constant as a register operand, so ptxas builds it
    once ahead of the group's LOP3s instead of before each of them, as it does for step 20's C++ expression
    ``src & (mask | magic)``. Most of step 21's saving comes from that three-register LOP3; the read from shared
    memory removes the last move a group, as the value is unknown to ptxas. One move in a main loop of about 200
    instructions a group should not show in a timing (an expectation: this change was compiled, not timed, for the
    chapter)."""
    if source.count(MAGIC_READ) != 1:
        raise ValueError("step 21's read of the constant was not found once")
    return source.replace(MAGIC_READ, MAGIC_LITERAL)


#: Part 1's exercises 5 and 6 and part 2's exercise 5 time a changed kernel on a GPU; what to look for
#: (keyed by part and exercise).
MEASURED = {
    (1, 5): "Step 14 at one row has no reuse of a decoded weight: a smaller tile (BLOCK_N 32) gives more programs, "
       "so more loads in flight across the SMs, and more split K does the same for a short N; the autotuner's "
       "configs for M = 1 split K. At 16 rows each decoded tile feeds 16 rows of x, so a larger tile decodes "
       "fewer times per row and waits on fewer MMAs per weight: the same small tile that helps at M = 1 costs "
       "there. No tile removes the wait on each MMA before the next decode, which is part 2's subject.",
    (1, 6): "Per weight the shift decode is a shift, an AND, a subtraction and an int-to-float conversion, where step "
       "4's is one AND and one subtraction (the float's exponent does the conversion); both are then one FMA. Equal "
       "times on step 5's configs would mean the kernel waits on its loads and the decode hides behind them. The "
       "steps table has the same change the other way round on step 3's tile (step 4 against step 3): there the "
       "AND decode pays, so the decode is on the critical path, the more so where a program has more words in "
       "flight (step 5's wider tiles).",
    (2, 5): "The default (4 warps of one tile, 4 stages of 2 groups, split K to fill the GPU once) was the best of the "
        "H200 sweep at 4096 x 14336 for M = 1 and 16 (lab/ternary/results/nvidia-h200/w2a8_tiles_sweep_tma.json). "
        "Two tiles a warp read x once for both but measured about a quarter slower "
        "(w2a8_tiles_sweep_two_tiles.json). 8 warps a block hold a chunk of 8 tiles a stage, twice the shared "
        "memory of 4, so fewer blocks fit an SM; the latencies the profile shows are hidden only by more warps "
        "resident, which needs a smaller footprint a warp, not a larger block.",
}
