"""The smallest example of how every chapter is built: a kernel, a next step, a check.

``scale_step0`` and ``scale_step1`` compute ``y = alpha * x``: step 0 assumes the length is a multiple of the block
size, step 1 adds the mask that makes any length correct. Notebook 00 shows their diff.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from jaxtyping import Float
from torch import Tensor

from studylog import runtime  # noqa: F401  (selects GPU or interpreter before kernels are defined)
from studylog.checks import check_tensor


@triton.jit
def scale_step0(x_ptr, y_ptr, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, alpha * x)


@triton.jit
def scale_step1(x_ptr, y_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n  # the last block may run past the end
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, alpha * x, mask=mask)


def scale(x: Float[Tensor, " n"], alpha: float, *, step: int = 1, block: int = 128) -> Float[Tensor, " n"]:
    """``alpha * x`` with the kernel of the given step."""
    check_tensor("x", x, dtype=torch.float32, ndim=1, contiguous=True)
    n = x.numel()
    y = torch.full_like(x, float("nan"))  # poison: any element the kernel skips stays NaN
    grid = (triton.cdiv(n, block),)
    if step == 0:
        if n % block:
            raise ValueError(f"step 0 needs len(x) to be a multiple of block={block}, got {n}; use step 1")
        scale_step0[grid](x, y, alpha, BLOCK=block)
    elif step == 1:
        scale_step1[grid](x, y, alpha, n, BLOCK=block)
    else:
        raise ValueError(f"step must be 0 or 1, got {step}")
    return y
