"""Check a public function's arguments before a kernel sees them: a ``TypeError`` (wrong kind or dtype) or a
``ValueError`` (wrong shape, device, layout or value) that names the argument. Checks read only metadata (no sync).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import torch
from torch import Tensor


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_tensor(name: str, t: Any, *, dtype: torch.dtype | Sequence[torch.dtype] | None = None,
                 ndim: int | Sequence[int] | None = None, shape: Sequence[int | None] | None = None,
                 like: Tensor | None = None, contiguous: bool = False, last_dim_contiguous: bool = False) -> Tensor:
    """Check ``t`` and return it. ``dtype`` and ``ndim`` take one value or several; ``shape`` each dimension's size
    (``None``: any); ``like`` a tensor that ``t`` must share a device with; ``last_dim_contiguous`` asks only for
    stride 1 along the last dimension."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        dtypes = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if t.dtype not in dtypes:
            want = " or ".join(_dtype_name(d) for d in dtypes)
            raise TypeError(f"{name} must be {want}, got {_dtype_name(t.dtype)}")
    if ndim is not None:
        dims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.ndim not in dims:
            want = " or ".join(f"{d}-D" for d in dims)
            raise ValueError(f"{name} must be {want}, got shape {tuple(t.shape)}")
    if shape is not None:
        if t.ndim != len(shape) or any(s is not None and s != got for s, got in zip(shape, t.shape)):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if like is not None and t.device != like.device:
        raise ValueError(f"{name} is on {t.device}, but the other inputs are on {like.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if last_dim_contiguous and t.ndim and t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name} must be contiguous along its last dimension")
    return t


def describe(t: Any) -> str:
    """What was passed, for an error message: ``a float16 tensor of shape (1, 10) on cpu`` (``, not contiguous``
    where it is not), or the type of anything that is not a tensor."""
    if not isinstance(t, Tensor):
        return f"a {type(t).__name__}"
    text = f"a {_dtype_name(t.dtype)} tensor of shape {tuple(t.shape)} on {t.device}"
    return text if t.is_contiguous() else f"{text}, not contiguous (strides {t.stride()})"


def check_out(name: str, out: Any, *, shape: Sequence[int], dtype: torch.dtype, device: str | torch.device,
              contiguous: bool = True, any_shape: bool = False) -> Tensor:
    """Check a caller's output buffer and return it: a ``dtype`` tensor of ``shape`` (``any_shape``: as many elements)
    on ``device``, contiguous (or with ``contiguous=False``, a unit stride on its last dimension)."""
    if isinstance(out, Tensor) and out.dtype == dtype:
        fits = out.numel() == math.prod(shape) if any_shape else out.shape == tuple(shape)
        want = torch.device(device)
        laid_out = out.is_contiguous() if contiguous else (out.ndim == 0 or out.stride(-1) == 1 or out.shape[-1] <= 1)
        if fits and laid_out and out.device.type == want.type and (want.index is None or out.device == want):
            return out
    shape = tuple(int(s) for s in shape)
    size = f"{' x '.join(map(str, shape))} = {math.prod(shape)} elements (any shape)" if any_shape else f"shape {shape}"
    layout = "contiguous" if contiguous else "with a unit stride on its last dimension"
    message = (f"{name} must be a {_dtype_name(dtype)} tensor of {size}, {layout}, on {torch.device(device)}; "
               f"got {describe(out)}")
    raise (ValueError if isinstance(out, Tensor) and out.dtype == dtype else TypeError)(message)


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high]`` (either bound may be left open); bools are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be in [{'-inf' if low is None else low}, {'inf' if high is None else high}], "
                         f"got {value}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices``."""
    options = list(choices)
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value
