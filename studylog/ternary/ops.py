"""Chapter 5's entry point as a PyTorch operator, ``torch.ops.studylog.ternary_matmul``: the weights as
``PackedTernary``'s ``data, n, k, fmt``, the same dispatch. An opaque ``custom_op``: the CUDA C++ steps launch
through NVRTC, and the Triton steps' autotune pre-hooks and kept split-K workspaces are not what ``wrap_triton``
takes. The codes are not checked per call (a device synchronisation): build the tensor with ``PackedTernary.pack``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from studylog.checks import check_tensor
from studylog.ternary.formats import MMA_X_DTYPES, X_DTYPES, PackedTernary, check_device, check_packed_data
from studylog.ternary import steps


def _packed(data: Tensor, n: int, k: int, fmt: str) -> PackedTernary:
    """A PackedTernary over ``data`` without its constructor's check of every code (a device synchronisation)."""
    w = object.__new__(PackedTernary)
    for name, value in (("data", data), ("n", n), ("k", k), ("fmt", fmt)):
        object.__setattr__(w, name, value)
    return w


def _check(x: Tensor, packed: Tensor, n: int, k: int, fmt: str, scale_tensor: Optional[Tensor]) -> tuple[int, ...]:
    """The output's shape after the metadata checks."""
    check_packed_data(packed, k, fmt, "packed", n=n)
    dtypes = MMA_X_DTYPES if fmt in ("2bit_mma", "2bit_tiles") else X_DTYPES
    check_tensor("x", x, dtype=dtypes, ndim=(1, 2), like=packed, last_dim_contiguous=True)
    if x.shape[-1] != k or (x.ndim == 2 and x.shape[0] < 1):
        raise ValueError(f"x must be (K,) or (M, K) with K = {k} and M >= 1, got shape {tuple(x.shape)}")
    check_device(x, "x")
    if scale_tensor is not None:
        check_tensor("scale_tensor", scale_tensor, dtype=torch.float32, like=x)
        if scale_tensor.numel() != 1 and (tuple(scale_tensor.shape) != (n,) or not scale_tensor.is_contiguous()):
            raise ValueError(f"scale_tensor must hold one scale or a contiguous ({n},) tensor, got shape "
                             f"{tuple(scale_tensor.shape)}")
    return (n,) if x.ndim == 1 else (x.shape[0], n)


def _matmul(x: Tensor, packed: Tensor, n: int, k: int, fmt: str = "2bit", scale: float = 1.0,
            scale_tensor: Optional[Tensor] = None) -> Tensor:
    """float32 ``x @ W.T / scale``, ternary ``W`` given as ``PackedTernary``'s ``data, n, k, fmt``."""
    n, k = int(n), int(k)
    _check(x, packed, n, k, fmt, scale_tensor)
    return steps.ternary_matmul(x, _packed(packed, n, k, fmt), scale if scale_tensor is None else scale_tensor)


ternary_matmul = torch.library.custom_op("studylog::ternary_matmul", _matmul, mutates_args=())
ternary_matmul.__doc__ = _matmul.__doc__


@ternary_matmul.register_fake
def _(x, packed, n, k, fmt="2bit", scale=1.0, scale_tensor=None):
    return x.new_empty(_check(x, packed, int(n), int(k), fmt, scale_tensor), dtype=torch.float32)


__all__ = ["ternary_matmul"]
