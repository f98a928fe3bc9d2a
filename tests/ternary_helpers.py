"""What chapter 5's test files share: random ternary weights, each step's weight and x formats, the formats' Python
decoders (the inverse of each pack), poisoned outputs and the tolerance check."""

import torch

from studylog import runtime
from studylog import ternary as T
from studylog.ternary.formats import GROUP_WORDS, TILE_ROWS, check_packed_data

DEV = runtime.device()
TOL = T.FP32_TOLERANCE


def ternary(n, k, rng, zeros=1 / 3):
    """Random ternary weights with about ``zeros`` of them 0 (int8)."""
    u = torch.rand(n, k, generator=rng)
    sign = torch.where(torch.rand(n, k, generator=rng) < 0.5, -1, 1)
    return torch.where(u < zeros, 0, sign).to(torch.int8)


def weights_for(kind, w):
    if kind in T.FORMATS:
        return T.PackedTernary.pack(w.to(DEV), kind)
    return {"dense": lambda: w.to(DEV, torch.float32), "int8": lambda: w.to(DEV)}[kind]()


def x_for(step_or_fmt, x):
    """Steps 11 to 25 take bf16 or fp16 x (the tensor cores' types, the pair decode's); the other steps any float
    x."""
    half_only = ("step11_pair_decode", "step12_unmasked", "step13_mma_layout", "step14_workspace", "2bit_mma",
                 "2bit_tiles")
    return x.to(torch.bfloat16) if step_or_fmt in half_only and x.dtype == torch.float32 else x


def poisoned(m, n):
    return torch.full((m, n), float("nan"), device=DEV)


def assert_matches(z, x, w, scale=1.0):
    assert not torch.isnan(z).any(), "the kernel left outputs unwritten (NaN poison survived)"
    ratio = T.error_ratio(z, x, w, scale)
    assert ratio <= TOL, f"max error is {ratio:.2e} of sum |x||w|; tolerance {TOL:.0e}"


def unpack_data(packed, k, fmt):
    """The first ``k`` weights of every row of ``packed`` in ``fmt`` as int8 (2bit_tiles: every row of every tile)."""
    check_packed_data(packed, k, fmt, "packed", n=len(packed) * (TILE_ROWS if fmt == "2bit_tiles" else 1))
    if fmt == "2bit_tiles":  # back to the 2bit_mma words, one row a weight row
        tiles, groups = packed.shape[0], packed.shape[1] // (TILE_ROWS * GROUP_WORDS)
        words = packed.view(tiles, groups, 2, 8, GROUP_WORDS).permute(0, 2, 3, 1, 4)
        return unpack_data(words.reshape(tiles * TILE_ROWS, groups * GROUP_WORDS).contiguous(), k, "2bit_mma")
    n = packed.shape[0]
    if fmt == "base3":
        powers = torch.tensor([1, 3, 9, 27, 81], device=packed.device).view(1, 1, 5, 1)
        codes = (packed.to(torch.int64).view(n, -1, 1, 16) // powers) % 3  # [row, group, digit d, byte t]
    elif fmt == "2bit":
        words = (packed.to(torch.int64) & 0xFFFFFFFF).view(n, -1, 1, 16)  # [row, group, 1, word t]
        codes = (words >> (2 * torch.arange(16, device=packed.device)).view(1, 1, 16, 1)) & 3  # [.., field j, t]
    else:  # 2bit_mma: [row, group, pair p, word t, half h] at bit 16 h + 2 p
        words = (packed.to(torch.int64) & 0xFFFFFFFF).view(n, -1, 1, 16, 1)
        shifts = 16 * torch.arange(2, device=packed.device) + 2 * torch.arange(8, device=packed.device).view(8, 1)
        codes = (words >> shifts.view(1, 1, 8, 1, 2)) & 3
    return (codes.reshape(n, -1)[:, :k] - 1).to(torch.int8)


def unpack(w):
    """A PackedTernary's (N, K) weights as int8."""
    return unpack_data(w.data, w.k, w.fmt)[: w.n]
