"""What both files of chapter 5's tests use: random ternary weights, each step's weight and x formats, poisoned
outputs and the tolerance check."""

import torch

from studylog import runtime
from studylog import ternary as T

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
