"""Chapter 5's peers on the same ternary weights: GemLite (optional, ``pip install gemlite``; 2-bit weights, bf16 x,
its BitNet processor's layout; imported by :func:`import_gemlite` only), and torch._int_mm, the W2A8 baseline."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from studylog.checks import check_tensor
from studylog.ternary.formats import as_ternary, quantize_activations

#: GemLite's packing: 2-bit codes, 16 a 32-bit word (its default packing width).
GEMLITE_BITS = 2
GEMLITE_PACKING_BITS = 32
#: cuBLASLt's int8 GEMM (torch._int_mm on CUDA): rows of x above this, K and N multiples of INT_MM_MULTIPLE.
INT_MM_MIN_ROWS = 17
INT_MM_MULTIPLE = 8


def import_gemlite():
    """``gemlite``, or an ImportError saying why not (without a GPU its import fails with another error)."""
    try:
        import gemlite
    except ImportError:
        raise
    except Exception as err:  # noqa: BLE001 (the reason is kept in the message)
        raise ImportError(f"gemlite did not load: {type(err).__name__}: {err}") from err
    return gemlite


def gemlite_ternary(w: Tensor, scale: float) -> Any:
    """A GemLite layer computing bf16 ``x @ w.T / scale`` as its BitNet processor (``A16W158_INT``) builds it: codes
    ``w + 1``, zero 1, a float32 scale a row."""
    if isinstance(scale, (bool, Tensor)) or not math.isfinite(float(scale)) or float(scale) == 0:
        raise ValueError(f"scale must be a finite nonzero number (one per tensor), got {scale!r}")
    ternary = as_ternary(w)
    import_gemlite()
    from gemlite.core import TORCH_TO_DTYPE, GemLiteLinearTriton

    n, k = ternary.shape
    bf16 = TORCH_TO_DTYPE[torch.bfloat16]
    layer = GemLiteLinearTriton(GEMLITE_BITS, group_size=k, in_features=k, out_features=n, input_dtype=bf16,
                                output_dtype=bf16, scaled_activations=False)
    codes = (ternary + 1).to(torch.uint8)
    scales = torch.full((n, 1), 1.0 / float(scale), dtype=torch.float32, device=w.device)
    layer.pack(codes, scales=scales, zeros=1, bias=None)
    layer.W_group_mode = 1  # (code - zero), then the scale after the sum:
    layer.channel_scale_mode = 1  # one scale per output row, weights only
    return layer


def gemlite_weights(layer: Any) -> tuple[Tensor, Tensor, Tensor]:
    """A GemLite layer's (int8 weights (N, K), scales (N,), zero points), decoded from its words (K / 16, N)."""
    per_word = GEMLITE_PACKING_BITS // GEMLITE_BITS
    if (layer.W_nbits, layer.elements_per_sample) != (GEMLITE_BITS, per_word):
        raise ValueError(f"not a {GEMLITE_BITS}-bit layer packed {per_word} a word: W_nbits={layer.W_nbits}, "
                         f"elements_per_sample={layer.elements_per_sample}")
    words = layer.W_q.detach().t().to(torch.int64) & 0xFFFFFFFF  # (N, K / 16)
    shifts = GEMLITE_BITS * torch.arange(per_word, device=words.device)
    codes = (words[:, :, None] >> shifts) & (2**GEMLITE_BITS - 1)  # (N, K / 16, 16): code j of each word
    zeros = layer.zeros.detach().reshape(-1)
    w = codes.reshape(words.shape[0], -1) - zeros.to(torch.int64)
    return w.to(torch.int8), layer.scales.detach().reshape(-1).float(), zeros


def gemlite_matmul_type(m: int) -> str:
    """The kernel GemLite picks for ``m`` rows of x with 2-bit weights (its ``get_matmul_type``)."""
    import_gemlite()
    from gemlite.core import get_matmul_type

    return get_matmul_type(m, GEMLITE_BITS)


def gemlite_best_config(matmul_type: str) -> str:
    """The config GemLite's autotuner chose last for ``matmul_type`` ("" where it cannot be read)."""
    import importlib

    module = {"GEMV": "gemv_kernels", "GEMV_REVSPLITK": "gemv_revsplitK_kernels", "GEMV_SPLITK": "gemv_splitK_kernels",
              "GEMM_SPLITK": "gemm_splitK_kernels", "GEMM": "gemm_kernels"}.get(matmul_type)
    try:
        mod = importlib.import_module(f"gemlite.triton_kernels.{module}")
    except Exception:  # noqa: BLE001
        return ""
    found = [getattr(v, "best_config", None) for k, v in vars(mod).items() if "INT" in k and hasattr(v, "best_config")]
    return str(found[0]) if found and found[0] is not None else ""


def gemlite_autotune_setting(matmul_type: str) -> str:
    """GemLite's autotune setting for ``matmul_type`` ("" where it cannot be read)."""
    try:
        from gemlite.triton_kernels.config import AUTOTUNE
    except Exception:  # noqa: BLE001
        return ""
    return str(getattr(AUTOTUNE, matmul_type, ""))


# torch._int_mm (W8A8 on cuBLASLt), the W2A8 baseline

def int_mm_rows(m: int) -> int:
    """Rows of x that torch._int_mm takes for ``m`` rows: more than 16 (cuBLASLt's int8 GEMM on CUDA)."""
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m must be a positive int, got {m!r}")
    return max(m, INT_MM_MIN_ROWS)


@dataclass
class IntMMPlan:
    """``x @ W.T / scale`` through ``torch._int_mm``: x quantised into a zero buffer of :func:`int_mm_rows` rows
    (allocated once: graph-safe), the int32 GEMM, its first ``m`` rows divided by ``x_scale * scale``."""

    w: Tensor
    scale: float
    m: int

    def __post_init__(self):
        check_tensor("w", self.w, dtype=torch.int8, ndim=2)
        n, k = self.w.shape
        if n % INT_MM_MULTIPLE or k % INT_MM_MULTIPLE:
            raise ValueError(f"torch._int_mm takes K and N multiples of {INT_MM_MULTIPLE}, got N={n}, K={k}")
        self.rows = int_mm_rows(self.m)
        self.xq = torch.zeros(self.rows, k, dtype=torch.int8, device=self.w.device)

    def quantize(self, x: Tensor) -> Tensor:
        """x (m, K) quantised into the buffer's first rows; returns x's scales (m,)."""
        if x.shape != (self.m, self.w.shape[1]):
            raise ValueError(f"x must be ({self.m}, {self.w.shape[1]}), got {tuple(x.shape)}")
        xq, x_scale = quantize_activations(x)
        self.xq[: self.m].copy_(xq)
        return x_scale

    def matmul(self) -> Tensor:
        """The int8 GEMM alone on the buffer as it is: int32 (rows, N)."""
        return torch._int_mm(self.xq, self.w.T)

    def __call__(self, x: Tensor) -> Tensor:
        """The whole W2A8 product of x: float32 (m, N)."""
        x_scale = self.quantize(x)
        acc = self.matmul()[: self.m]
        return acc.float() / (x_scale[:, None] * self.scale)


#: A bf16 output agrees with float64 when its error's norm is at most this of the reference's: a few bf16 roundings
#: (2^-9 each); a wrong layout gives an error near 1.
BF16_NORM_TOLERANCE = 2.0**-6


def relative_norm_error(z: Tensor, ref: Tensor) -> float:
    """``|z - ref|_2 / |ref|_2`` in float64 (infinite where z has a NaN or an infinity)."""
    z = z.double()
    if not bool(torch.isfinite(z).all()):
        return math.inf
    return float((z - ref).norm() / ref.norm().clamp(min=1e-300))
