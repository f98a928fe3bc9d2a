"""Chapter 5's packed ternary layouts, BitNet's quantisation, the float64 reference and tolerance, and the
checks every step's wrapper runs. Each layout is a small transpose, so that one vector load of x serves a field:

* ``"2bit"`` (steps 3 to 12): groups of 256 weights in 16 int32 words; word ``t`` holds weights ``16 j + t``
  (j = 0..15) in bits ``2j, 2j+1``, as the code ``w + 1``.
* ``"base3"`` (steps 7 and 8): groups of 80 weights in 16 bytes; byte ``t`` holds weights ``16 d + t``
  (d = 0..4) as ``sum_d (w + 1) 3^d`` (0..242).
* ``"2bit_mma"`` (steps 13 and 14): word ``t`` holds weights ``32 p + 2 t + h`` (p = 0..7, h = 0, 1) in bits
  ``16 h + 2 p``, so field p of both halves is the 32 consecutive weights ``32 p ..``: the MMA's A operand.
* ``"2bit_tiles"`` (steps 15 to 25): the MMA-order words of 16 rows reordered so that what one warp loads for
  one group is 1 KiB of consecutive memory (:func:`pack_2bit_tiles`).

Padding (K up to a whole group) holds zero weights, so every row starts aligned and loads stay vectorised.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
import triton
from jaxtyping import Float, Int8, Int32, Shaped, UInt8
from torch import Tensor

from studylog import runtime
from studylog.checks import check_choice, check_int, check_out, check_tensor

GROUP_WORDS = 16  #: int32 words in a 2-bit group
GROUP_WEIGHTS_2BIT = 256  #: weights in a 2-bit group (16 words x 16 fields)
GROUP_BYTES = 16  #: bytes in a base-3 group
GROUP_WEIGHTS_BASE3 = 80  #: weights in a base-3 group (16 bytes x 5 digits)
ZERO_WORD = 0x55555555  #: a 2-bit word of 16 zero weights (every code is 01)
ZERO_BYTE = 121  #: a base-3 byte of 5 zero weights (1 + 3 + 9 + 27 + 81)
FORMATS = ("2bit", "base3", "2bit_mma", "2bit_tiles")
INT32_FORMATS = ("2bit", "2bit_mma", "2bit_tiles")
TILE_ROWS = 16  #: rows of W in one tile of the 2bit_tiles format (the MMA's M)


def packed_cols(k: int, fmt: str) -> int:
    """Row length of the packed tensor for ``k`` weights: int32 words (2bit) or bytes (base3)."""
    if fmt == "2bit_tiles":
        return TILE_ROWS * GROUP_WORDS * triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    if fmt in INT32_FORMATS:
        return GROUP_WORDS * triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    if fmt == "base3":
        return GROUP_BYTES * triton.cdiv(k, GROUP_WEIGHTS_BASE3)
    raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")


def check_ternary_values(name: str, w: Tensor) -> None:
    """Raise a ValueError naming ``name`` unless every value of ``w`` is -1, 0 or +1 (waits for the GPU)."""
    bad = (w != 0) & (w.abs() != 1)  # NaN compares unequal to everything: bad too
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} must be ternary (-1, 0, +1); found {w[idx].item()!r} at index {idx}")


def as_ternary(w: Any, name: str = "w") -> Tensor:
    """``w`` as int64 after checking that it is a 2-D tensor of -1, 0 and +1 only."""
    if not isinstance(w, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
    if w.dtype == torch.bool or w.is_complex():
        raise TypeError(f"{name} must hold integers or floats equal to -1, 0 or +1, got dtype {w.dtype}")
    if w.ndim != 2 or w.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 2-D (N, K) tensor, got shape {tuple(w.shape)}")
    check_ternary_values(name, w)
    return w.to(torch.int64)


def _padded_codes(w: Any, group: int) -> tuple[Tensor, int]:
    """(codes ``w + 1`` as int64, rows padded with code 1 to whole groups of ``group``, groups a row)."""
    codes = as_ternary(w) + 1
    n, k = codes.shape
    groups = triton.cdiv(k, group)
    padded = torch.ones(n, groups * group, dtype=torch.int64, device=codes.device)
    padded[:, :k] = codes
    return padded, groups


def _as_int32_bits(v: Tensor) -> Tensor:
    """int64 values in [0, 2^32) -> int32 holding the same 32 bits."""
    return torch.where(v >= 2**31, v - 2**32, v).to(torch.int32)


def pack_2bit(w: Shaped[Tensor, "n k"]) -> Int32[Tensor, "n kw"]:
    """Pack ternary ``w`` (N, K) into int32 words, 16 weights a word (layout in the module doc)."""
    padded, groups = _padded_codes(w, GROUP_WEIGHTS_2BIT)
    n = padded.shape[0]
    fields = padded.view(n, groups, 16, 16)  # [row, group, field j, word t]: weight 16 j + t
    shifts = (2 * torch.arange(16, device=padded.device)).view(1, 1, 16, 1)
    words = (fields << shifts).sum(dim=2)  # the fields do not overlap, so the sum is an OR
    return _as_int32_bits(words).reshape(n, groups * GROUP_WORDS).contiguous()


def pack_2bit_mma(w: Shaped[Tensor, "n k"]) -> Int32[Tensor, "n kw"]:
    """Pack ternary ``w`` (N, K) into int32 words in MMA order (layout in the module doc)."""
    padded, groups = _padded_codes(w, GROUP_WEIGHTS_2BIT)
    n = padded.shape[0]
    fields = padded.view(n, groups, 8, 16, 2)  # [row, group, pair p, word t, half h]: weight 32 p + 2 t + h
    shifts = 16 * torch.arange(2, device=padded.device) + 2 * torch.arange(8, device=padded.device).view(8, 1)
    words = (fields << shifts.view(1, 1, 8, 1, 2)).sum(dim=(2, 4))  # disjoint: a sum is an OR
    return _as_int32_bits(words).reshape(n, groups * GROUP_WORDS).contiguous()


def pack_2bit_tiles(w: Shaped[Tensor, "n k"]) -> Int32[Tensor, "tiles kt"]:
    """The words of :func:`pack_2bit_mma` in tiles of 16 rows (zero-padded), one row a tile, a group as [half h][row
    g][word] of the tile's row 8 h + g: lane 4 g + t reads words 4 t .. 4 t + 3 of rows g and 8 + g in two loads."""
    words = pack_2bit_mma(w)
    n, kw = words.shape
    tiles = triton.cdiv(n, TILE_ROWS)
    padded = torch.full((tiles * TILE_ROWS, kw), ZERO_WORD, dtype=torch.int64, device=words.device)
    padded[:n] = words
    groups = kw // GROUP_WORDS
    # [tile, half h, row g, group, word] -> [tile, group, half h, row g, word]
    tiled = padded.view(tiles, 2, 8, groups, GROUP_WORDS).permute(0, 3, 1, 2, 4)
    return _as_int32_bits(tiled.reshape(tiles, -1)).contiguous()


def pack_base3(w: Shaped[Tensor, "n k"]) -> UInt8[Tensor, "n kb"]:
    """Pack ternary ``w`` (N, K) into bytes, 5 weights a byte in base 3 (1.6 bits a weight)."""
    padded, groups = _padded_codes(w, GROUP_WEIGHTS_BASE3)
    n = padded.shape[0]
    d = padded.view(n, groups, 5, 16)  # [row, group, digit d, byte t]: weight 16 d + t
    powers = torch.tensor([1, 3, 9, 27, 81], dtype=torch.int64, device=padded.device).view(1, 1, 5, 1)
    return (d * powers).sum(dim=2).to(torch.uint8).reshape(n, groups * GROUP_BYTES).contiguous()


PACKERS = {"2bit": pack_2bit, "base3": pack_base3, "2bit_mma": pack_2bit_mma, "2bit_tiles": pack_2bit_tiles}


def base3_table_values() -> list[int]:
    """The kernels' decode table: entry ``v`` holds the 5 base-3 digits of ``v`` as 2-bit fields (digit d in
    bits 2d, 2d+1) under the float exponent bits of the 2-bit decode; entries 243..255 decode to zeros."""
    codes = [v if v < 243 else ZERO_BYTE for v in range(256)]
    fields = torch.tensor([sum(((u // 3**d) % 3) << (2 * d) for d in range(5)) for u in codes])
    return _as_int32_bits(fields | 0x7F800000).tolist()


@functools.lru_cache(maxsize=8)
def base3_table(device: str) -> Int32[Tensor, " 256"]:
    return torch.tensor(base3_table_values(), dtype=torch.int32, device=device)


def check_packed_data(data: Any, k: int, fmt: str, name: str, n: int) -> None:
    """``data`` as the packed tensor of an (``n``, ``k``) matrix in ``fmt``: dtype, shape, contiguous (not its codes:
    that would wait for the GPU)."""
    check_choice("fmt", fmt, FORMATS)
    check_int("n", n, low=1)
    if not isinstance(data, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(data).__name__}")
    want = torch.int32 if fmt in INT32_FORMATS else torch.uint8
    if data.dtype != want:
        raise TypeError(f"{name} must be {want} for the {fmt} format, got {data.dtype}")
    check_int("k", k, low=1)
    if data.ndim != 2:
        raise ValueError(f"{name} must be 2-D (N, packed columns), got shape {tuple(data.shape)}")
    cols = packed_cols(k, fmt)
    rows = triton.cdiv(n, TILE_ROWS) if fmt == "2bit_tiles" else n  # 2bit_tiles: one row a tile
    if data.shape != (rows, cols):
        raise ValueError(f"{name} has shape {tuple(data.shape)}, but N={n}, K={k} in the {fmt} format need "
                         f"({rows}, {cols})")
    if not data.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


@dataclass(frozen=True)
class PackedTernary:
    """A packed ternary matrix of logical shape (n, k), checked once when built: dtype, shape, and every code
    (2-bit code 3 and bytes above 242 would decode to a wrong weight silently)."""

    data: Tensor
    n: int
    k: int
    fmt: str = "2bit"

    def __post_init__(self):
        check_packed_data(self.data, self.k, self.fmt, "data", n=self.n)
        if self.fmt in INT32_FORMATS:
            words = self.data.to(torch.int64) & 0xFFFFFFFF
            invalid = ((words & 0x55555555) & ((words >> 1) & 0x55555555)) != 0  # a field 0b11
        else:
            invalid = self.data > 242
        if bool(invalid.any()):
            raise ValueError(f"data holds codes that are not ternary weights in the {self.fmt} format "
                             f"(first at {tuple(int(i) for i in invalid.nonzero()[0])})")

    @classmethod
    def pack(cls, w: Shaped[Tensor, "n k"], fmt: str = "2bit") -> "PackedTernary":
        return cls(PACKERS[check_choice("fmt", fmt, FORMATS)](w), int(w.shape[0]), int(w.shape[1]), fmt)

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


# BitNet b1.58 quantisation

def quantize_absmean(w: Float[Tensor, "n k"], *, per_channel: bool = False, eps: float = 1e-5
                     ) -> tuple[Int8[Tensor, "n k"], Float[Tensor, "..."]]:
    """BitNet b1.58 weights: ``scale = 1 / mean|W|`` (per row when ``per_channel``), ``W_t = clamp(round(W * scale),
    -1, 1)``, so ``x @ W.T ~= x @ W_t.T / scale``; ``w`` must be finite."""
    if not isinstance(w, Tensor) or not w.is_floating_point():
        raise TypeError(f"w must be a floating-point torch.Tensor, got {getattr(w, 'dtype', type(w).__name__)}")
    check_tensor("w", w, ndim=2)
    w32 = w.float()
    finite = torch.isfinite(w32)
    if not bool(finite.all()):  # a NaN or an infinity would make every code 0 and the scale NaN
        bad = (~finite).nonzero()
        row, col = (int(i) for i in bad[0])
        raise ValueError(f"w must hold finite weights to quantize: {bad.shape[0]} of its {w.numel()} values are NaN or "
                         f"infinite (the first at w[{row}, {col}] = {w32[row, col].item()})")
    mean_abs = w32.abs().mean(dim=1) if per_channel else w32.abs().mean()
    scale = 1.0 / mean_abs.clamp(min=eps)
    ternary = (w32 * (scale[:, None] if per_channel else scale)).round().clamp(-1, 1)
    return ternary.to(torch.int8), scale


def quantize_activations(x: Float[Tensor, "m k"], eps: float = 1e-5) -> tuple[Int8[Tensor, "m k"], Float[Tensor, " m"]]:
    """BitNet's per-token absmax int8 activations: ``scale = 127 / max|x_row|``,
    ``x_q = clamp(round(x * scale), -128, 127)``, so that ``x ~= x_q / scale``."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point torch.Tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    check_tensor("x", x, ndim=2)
    x32 = x.float()
    scale = 127.0 / x32.abs().amax(dim=1).clamp(min=eps)
    xq = (x32 * scale[:, None]).round().clamp(-128, 127).to(torch.int8)
    return xq.contiguous(), scale.contiguous()


# Reference and tolerance

#: Largest accepted |z - reference| as a fraction of sum_k |x_k w_nk| / |scale_n|: about 32 float32
#: rounding steps. One wrong weight moves z by 2 |x_k|, far above it (a test checks it is caught).
FP32_TOLERANCE = 4e-6


def as_scale64(scale: Union[float, Tensor], device) -> Tensor:
    """``scale`` (a number, or a tensor of one or N scales) as float64 on ``device``, for the references."""
    return (scale.double() if isinstance(scale, Tensor) else torch.tensor(float(scale), dtype=torch.float64)).to(device)


def reference(x: Tensor, w: Tensor, scale: Union[float, Tensor] = 1.0) -> Tensor:
    """``x @ w.T / scale`` in float64 (x: (K,) or (M, K); w: (N, K); scale: number or (N,))."""
    return (x.double() @ w.double().T) / as_scale64(scale, x.device)


def error_ratio(z: Tensor, x: Tensor, w: Tensor, scale: Union[float, Tensor] = 1.0) -> float:
    """``max |z - reference| / (sum_k |x_k||w_nk| / |scale_n|)``; a NaN anywhere counts as infinite."""
    magnitude = (x.double().abs() @ w.double().abs().T) / as_scale64(scale, x.device).abs()
    return error_ratio_from(z, reference(x, w, scale), magnitude)


def error_ratio_from(z: Tensor, ref: Tensor, magnitude: Tensor) -> float:
    """:func:`error_ratio` from the reference and the magnitude already computed (0 where z equals ref)."""
    err = (z.double() - ref).abs()
    ratio = torch.where(err == 0, torch.zeros_like(err), err / magnitude.clamp(min=1e-300))
    ratio = torch.nan_to_num(ratio, nan=math.inf)
    return float(ratio.max()) if ratio.numel() else 0.0


# Checks shared by every step's wrapper. None waits for the GPU (check_ternary_values excepted), so a timed
# call measures the kernels and nothing else.

X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
Scale = Union[float, Tensor]
#: x's types from step 11 on (steps 11 to 21 decode the weights into x's type for the MMA).
MMA_X_DTYPES = (torch.bfloat16, torch.float16)


def check_device(t: Tensor, name: str, like: Optional[Tensor] = None) -> None:
    """``t`` on the device kernels run on (the GPU, or the CPU in interpreter mode), and on ``like``'s."""
    want = runtime.device().type
    if t.device.type != want:
        raise ValueError(f"{name} must be on {want} (kernels run in {runtime.mode()} mode), got {t.device}")
    if like is not None and t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but x is on {like.device}")


def check_x(x: Any, k: Optional[int], dtypes: tuple = X_DTYPES, name: str = "x") -> tuple[Tensor, bool]:
    """``x`` as a 2-D (M, K) tensor, and whether it came as a vector."""
    if not isinstance(x, Tensor) or x.dtype not in dtypes:
        got = getattr(x, "dtype", type(x).__name__)
        raise TypeError(f"{name} must be one of {[str(d) for d in dtypes]}, got {got}")
    if x.ndim not in (1, 2):
        raise ValueError(f"{name} must be 1-D (K,) or 2-D (M, K), got shape {tuple(x.shape)}")
    vector = x.ndim == 1
    x2 = x[None, :] if vector else x
    if x2.shape[0] < 1:
        raise ValueError(f"{name} must have at least one row, got shape {tuple(x.shape)}")
    if k is not None and x2.shape[1] != k:
        raise ValueError(f"{name} has K={x2.shape[1]} but the weights have K={k}")
    if x2.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous along its last dimension (K)")
    check_device(x2, name)
    return x2, vector


@functools.lru_cache(maxsize=64)
def _scalar_tensor(value: float, device: str) -> Tensor:
    return torch.tensor([value], dtype=torch.float32, device=device)


def check_scale(scale: Any, n: int, like: Tensor) -> tuple[Tensor, int]:
    """(float32 tensor, stride 0 for one scale or 1 for one per output channel). A number must be finite and
    nonzero; tensor values are not read (that would wait for the GPU)."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float, Tensor)):
        raise TypeError(f"scale must be a number or a float32 tensor of shape ({n},), got {type(scale).__name__}")
    if not isinstance(scale, Tensor):
        if not math.isfinite(scale) or scale == 0:
            raise ValueError(f"scale must be finite and nonzero, got {scale}")
        return _scalar_tensor(float(scale), str(like.device)), 0
    if scale.dtype != torch.float32:
        raise TypeError(f"scale must be float32, got {scale.dtype}")
    check_device(scale, "scale", like)
    if scale.numel() == 1:
        return scale.reshape(1), 0
    if scale.shape != (n,) or not scale.is_contiguous():
        raise ValueError(f"scale must be a number, a one-element tensor or a contiguous ({n},) tensor, "
                         f"got shape {tuple(scale.shape)}")
    return scale, 1


def prepare_out(out: Optional[Tensor], m: int, n: int, like: Tensor) -> Tensor:
    """The float32 (M, N) output: ``out`` checked (any shape of M x N elements, viewed as (M, N)), or a new one."""
    if out is None:
        return torch.empty((m, n), dtype=torch.float32, device=like.device)
    return check_out("out", out, shape=(m, n), dtype=torch.float32, device=like.device, any_shape=True).view(m, n)


def check_dense(w: Any, dtypes: tuple, k: int, like: Tensor) -> Tensor:
    """Dense weights (steps 1 and 2): a 2-D (N, K) tensor of one of ``dtypes``, contiguous along K, beside x."""
    if not isinstance(w, Tensor) or w.dtype not in dtypes:
        raise TypeError(f"w must be one of {[str(d) for d in dtypes]}, got {getattr(w, 'dtype', type(w).__name__)}")
    check_tensor("w", w, ndim=2)
    if w.shape[1] != k:
        raise ValueError(f"x has K={k} but w has K={w.shape[1]}")
    if w.stride(1) != 1:
        raise ValueError("w must be contiguous along its last dimension (K)")
    check_device(w, "w", like)
    return w


def check_packed(w: Any, fmt: str, k: int, like: Tensor) -> PackedTernary:
    """Packed weights: a PackedTernary in the format ``fmt`` that a kernel reads, of K = ``k``, beside x."""
    if not isinstance(w, PackedTernary):
        raise TypeError(f"w must be a PackedTernary (see PackedTernary.pack), got {type(w).__name__}")
    if w.fmt != fmt:
        raise ValueError(f"this kernel reads the {fmt} format, got a PackedTernary in {w.fmt}")
    if w.k != k:
        raise ValueError(f"x has K={k} but w has K={w.k}")
    check_device(w.data, "w", like)
    return w


def check_packed_call(x: Any, w: Any, scale: Any, out: Optional[Tensor], fmt: str, dtypes: tuple = X_DTYPES,
                      x_name: str = "x") -> tuple[Tensor, bool, PackedTernary, Tensor, int, Tensor]:
    """The checks of a step on packed weights: ``(x2, vector, w, scale tensor, its stride, z)``."""
    x2, vector = check_x(x, weights_k(w), dtypes=dtypes, name=x_name)
    w = check_packed(w, fmt, x2.shape[1], x2)
    s, s_stride = check_scale(scale, w.n, x2)
    return x2, vector, w, s, s_stride, prepare_out(out, x2.shape[0], w.n, x2)


def weights_k(w: Any) -> Optional[int]:
    """The K of weights given as a PackedTernary or a 2-D tensor (None otherwise: their own check says why)."""
    if isinstance(w, PackedTernary):
        return w.k
    return w.shape[1] if isinstance(w, Tensor) and w.ndim == 2 else None


class SplitWorkspace:
    """Split-K scratch on one device: float32 partial sums (step 14 keeps them zeros) and a counter per output tile
    that the last slice of a tile restores to zero. Launches that share it must not overlap (one stream)."""

    def __init__(self):
        self.sums: dict[str, Tensor] = {}
        self.counts: dict[str, Tensor] = {}

    def get(self, device: torch.device, m: int, n: int) -> tuple[Tensor, Tensor]:
        key = str(device)
        tiles = triton.cdiv(n, 16) * triton.cdiv(m, 8)  # the most tiles any config makes (of 16 x 8 and up)
        if key not in self.sums or self.sums[key].numel() < m * n:
            self.sums[key] = torch.zeros(max(m * n, 1 << 16), dtype=torch.float32, device=device)
        if key not in self.counts or self.counts[key].numel() < tiles:
            self.counts[key] = torch.zeros(max(tiles, 1 << 10), dtype=torch.int32, device=device)
        return self.sums[key], self.counts[key]

