"""Chapter 5: ternary (-1/0/+1) matmul in Triton.

``z = x @ W.T / scale`` with every weight in {-1, 0, +1}, as in BitNet b1.58. ``W`` is stored like an
``nn.Linear`` weight, ``(N, K)``: N outputs, K inputs, one output's weights in one row. ``x`` is
``(M, K)`` (or a vector ``(K,)``); ``z`` is float32.

The steps, each a kernel next to the previous one so that the diff is the lesson:

1. :func:`sign_v1_kernel`: the seed's idea made correct. Dense float weights, sign selection
   instead of a multiply, masks on every edge, autotuned block sizes, float32 out.
2. :func:`int8_v2_kernel`: the same kernel reading int8 weights (half the bytes of bf16).
3. 2-bit packing, 16 weights per int32 word (:func:`pack_2bit`). :func:`packed2_v3_kernel` decodes
   with shifts and masks; :func:`gemv_2bit_kernel` makes M=1 fast: wide tiles, many programs
   (split-K when there are few rows), and a decode of two instructions per weight.
4. :func:`dot_2bit_kernel`: batched activations (M > 1); decoded weights feed ``tl.dot``.
5. 1.6-bit packing, 5 weights per byte in base 3 (:func:`pack_base3`); a 256-entry table turns a
   byte into five 2-bit fields, then the same decode (:func:`gemv_base3_kernel`, :func:`dot_base3_kernel`).
6. BitNet's scales (:func:`quantize_absmean`, per tensor or per output channel) and int8
   activations (:func:`quantize_activations`, :func:`w2a8_dot_kernel`).
7. A 2-bit layout for the tensor cores (:func:`pack_2bit_mma`) and :func:`mma_2bit_kernel`, one kernel
   for every M: a word's two 16-bit halves decode together into two bf16 (or fp16) weights with one
   AND and one packed fused multiply-add, already in the register layout of the MMA's A operand;
   split-K partial sums meet in a self-cleaning workspace (no memset launch).

Packed layouts. Both are a small transpose, so that one decode step over a tile of words yields
weights whose activations are *contiguous* in memory (one vector load of x serves a whole field):

* **2-bit**: each row's K weights are cut into groups of 256, stored as 16 int32 words. Word ``t``
  of a group holds weights ``16 j + t`` (j = 0..15) in bits ``2j, 2j+1``, as the code ``w + 1``.
* **base 3**: groups of 80 weights stored as 16 bytes. Byte ``t`` of a group holds weights
  ``16 d + t`` (d = 0..4) as the number ``sum_d (w + 1) 3^d`` (0..242).

* **2-bit, MMA order** (step 7): groups of 256 weights in 16 int32 words again, but word ``t`` holds
  weights ``32 p + 2 t + h`` (p = 0..7, h = 0, 1) in bits ``16 h + 2 p``: the low half holds an even
  weight and the high half the next one. Field p of both halves of words 0..15 is then the 32
  consecutive weights ``32 p .. 32 p + 31``, pair by pair, which is how the MMA wants its A operand.

Padding (K up to a whole group) holds zero weights, so rows are a whole number of 64- or 16-byte
groups: every row starts aligned and loads stay vectorised.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Union

import torch
import triton
import triton.language as tl
from jaxtyping import Float, Int8, Int32, Int64, Shaped, UInt8
from torch import Tensor

from studylog import cuda, runtime

# ----------------------------------------------------------------------------------------------
# Packed formats
# ----------------------------------------------------------------------------------------------

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


def _as_ternary(w: Any, name: str = "w") -> Tensor:
    """``w`` as int64 after checking that it is a 2-D tensor of -1, 0 and +1 only."""
    if not isinstance(w, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
    if w.dtype == torch.bool or w.is_complex():
        raise TypeError(f"{name} must hold integers or floats equal to -1, 0 or +1, got dtype {w.dtype}")
    if w.ndim != 2 or w.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 2-D (N, K) tensor, got shape {tuple(w.shape)}")
    bad = ~((w == -1) | (w == 0) | (w == 1))  # NaN compares unequal to everything: bad too
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} must be ternary (-1, 0, +1); found {w[idx].item()!r} at index {idx}")
    return w.to(torch.int64)


def _as_int32_bits(v: Tensor) -> Tensor:
    """int64 values in [0, 2^32) -> int32 holding the same 32 bits."""
    return torch.where(v >= 2**31, v - 2**32, v).to(torch.int32)


def pack_2bit(w: Shaped[Tensor, "n k"]) -> Int32[Tensor, "n kw"]:
    """Pack ternary ``w`` (N, K) into int32 words, 16 weights a word (layout in the module doc)."""
    codes = _as_ternary(w) + 1
    n, k = codes.shape
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    padded = torch.ones(n, groups * GROUP_WEIGHTS_2BIT, dtype=torch.int64, device=codes.device)
    padded[:, :k] = codes
    fields = padded.view(n, groups, 16, 16)  # [row, group, field j, word t]: weight 16 j + t
    shifts = (2 * torch.arange(16, device=codes.device)).view(1, 1, 16, 1)
    words = (fields << shifts).sum(dim=2)  # the fields do not overlap, so the sum is an OR
    return _as_int32_bits(words).reshape(n, groups * GROUP_WORDS).contiguous()


def unpack_2bit(packed: Int32[Tensor, "n kw"], k: int) -> Int8[Tensor, "n k"]:
    """Inverse of :func:`pack_2bit`: the first ``k`` weights of every row, as int8."""
    _check_packed_data(packed, k, "2bit", "packed")
    n = packed.shape[0]
    words = (packed.to(torch.int64) & 0xFFFFFFFF).view(n, -1, 1, 16)  # [row, group, 1, word t]
    shifts = (2 * torch.arange(16, device=packed.device)).view(1, 1, 16, 1)
    codes = (words >> shifts) & 3  # [row, group, field j, word t]
    return (codes.reshape(n, -1)[:, :k] - 1).to(torch.int8)


def _mma_shifts(device) -> Tensor:
    """[pair p, half h] -> bit position 16 h + 2 p of the 2-bit MMA order."""
    return 16 * torch.arange(2, device=device).view(1, 2) + 2 * torch.arange(8, device=device).view(8, 1)


def pack_2bit_mma(w: Shaped[Tensor, "n k"]) -> Int32[Tensor, "n kw"]:
    """Pack ternary ``w`` (N, K) into int32 words in MMA order: in each group of 256 weights, word t
    holds weight ``32 p + 2 t + h`` in bits ``16 h + 2 p`` (p = 0..7, h = 0, 1), as the code w + 1."""
    codes = _as_ternary(w) + 1
    n, k = codes.shape
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    padded = torch.ones(n, groups * GROUP_WEIGHTS_2BIT, dtype=torch.int64, device=codes.device)
    padded[:, :k] = codes
    fields = padded.view(n, groups, 8, 16, 2)  # [row, group, pair p, word t, half h]: weight 32 p + 2 t + h
    words = (fields << _mma_shifts(codes.device).view(1, 1, 8, 1, 2)).sum(dim=(2, 4))  # disjoint: a sum is an OR
    return _as_int32_bits(words).reshape(n, groups * GROUP_WORDS).contiguous()


def unpack_2bit_mma(packed: Int32[Tensor, "n kw"], k: int) -> Int8[Tensor, "n k"]:
    """Inverse of :func:`pack_2bit_mma`: the first ``k`` weights of every row, as int8."""
    _check_packed_data(packed, k, "2bit_mma", "packed")
    n = packed.shape[0]
    words = (packed.to(torch.int64) & 0xFFFFFFFF).view(n, -1, 1, 16, 1)  # [row, group, 1, word t, 1]
    codes = (words >> _mma_shifts(packed.device).view(1, 1, 8, 1, 2)) & 3  # [row, group, pair p, word t, half h]
    return (codes.reshape(n, -1)[:, :k] - 1).to(torch.int8)


def pack_2bit_tiles(w: Shaped[Tensor, "n k"]) -> Int32[Tensor, "tiles kt"]:
    """Step 8's layout: the words of :func:`pack_2bit_mma`, reordered so that what one warp loads
    for one group is 1 KiB of consecutive memory. Rows are cut into tiles of 16 (the last one padded
    with zero weights); tile i is row i of the result, its groups one after another, and a group holds
    [half h][row g][word 4 t + i] for the tile's row 8 h + g: lane 4 g + t of a warp reads words
    4 t .. 4 t + 3 of rows g and 8 + g with two 16-byte loads, 512 consecutive bytes each."""
    words = pack_2bit_mma(w)
    n, kw = words.shape
    tiles = triton.cdiv(n, TILE_ROWS)
    padded = torch.full((tiles * TILE_ROWS, kw), ZERO_WORD, dtype=torch.int64, device=words.device)
    padded[:n] = words
    groups = kw // GROUP_WORDS
    # [tile, half h, row g, group, word] -> [tile, group, half h, row g, word]
    tiled = padded.view(tiles, 2, 8, groups, GROUP_WORDS).permute(0, 3, 1, 2, 4)
    return _as_int32_bits(tiled.reshape(tiles, -1)).contiguous()


def unpack_2bit_tiles(packed: Int32[Tensor, "tiles kt"], k: int) -> Int8[Tensor, "n k"]:
    """Inverse of :func:`pack_2bit_tiles`: every row of every tile (padding rows too), as int8."""
    _check_packed_data(packed, k, "2bit_tiles", "packed")
    tiles, groups = packed.shape[0], packed.shape[1] // (TILE_ROWS * GROUP_WORDS)
    words = packed.view(tiles, groups, 2, 8, GROUP_WORDS).permute(0, 2, 3, 1, 4)
    return unpack_2bit_mma(words.reshape(tiles * TILE_ROWS, groups * GROUP_WORDS).contiguous(), k)


def pack_base3(w: Shaped[Tensor, "n k"]) -> UInt8[Tensor, "n kb"]:
    """Pack ternary ``w`` (N, K) into bytes, 5 weights a byte in base 3 (1.6 bits a weight)."""
    digits = _as_ternary(w) + 1
    n, k = digits.shape
    groups = triton.cdiv(k, GROUP_WEIGHTS_BASE3)
    padded = torch.ones(n, groups * GROUP_WEIGHTS_BASE3, dtype=torch.int64, device=digits.device)
    padded[:, :k] = digits
    d = padded.view(n, groups, 5, 16)  # [row, group, digit d, byte t]: weight 16 d + t
    powers = torch.tensor([1, 3, 9, 27, 81], dtype=torch.int64, device=digits.device).view(1, 1, 5, 1)
    return (d * powers).sum(dim=2).to(torch.uint8).reshape(n, groups * GROUP_BYTES).contiguous()


def unpack_base3(packed: UInt8[Tensor, "n kb"], k: int) -> Int8[Tensor, "n k"]:
    """Inverse of :func:`pack_base3` (by division; the kernels use a table instead)."""
    _check_packed_data(packed, k, "base3", "packed")
    n = packed.shape[0]
    v = packed.to(torch.int64).view(n, -1, 1, 16)
    powers = torch.tensor([1, 3, 9, 27, 81], dtype=torch.int64, device=packed.device).view(1, 1, 5, 1)
    digits = (v // powers) % 3  # [row, group, digit d, byte t]
    return (digits.reshape(n, -1)[:, :k] - 1).to(torch.int8)


def base3_table_values() -> list[int]:
    """The kernels' decode table: entry ``v`` holds the 5 base-3 digits of ``v`` as 2-bit fields
    (digit d in bits 2d, 2d+1, like the 2-bit format's fields) under the float exponent bits that
    :func:`_field_to_float` expects. Entries 243..255 are not base-3 bytes and decode to zeros."""
    out = []
    for v in range(256):
        u = v if v < 243 else ZERO_BYTE
        fields = sum(((u // 3**d) % 3) << (2 * d) for d in range(5))
        out.append(_as_int32_bits(torch.tensor(0x7F800000 | fields)).item())
    return out


@functools.lru_cache(maxsize=8)
def base3_table(device: str) -> Int32[Tensor, " 256"]:
    return torch.tensor(base3_table_values(), dtype=torch.int32, device=device)


def _check_packed_data(data: Any, k: int, fmt: str, name: str, n: Optional[int] = None) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if not isinstance(data, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(data).__name__}")
    want = torch.int32 if fmt in INT32_FORMATS else torch.uint8
    if data.dtype != want:
        raise TypeError(f"{name} must be {want} for the {fmt} format, got {data.dtype}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if data.ndim != 2:
        raise ValueError(f"{name} must be 2-D (N, packed columns), got shape {tuple(data.shape)}")
    cols = packed_cols(k, fmt)
    rows = n if n is None or fmt != "2bit_tiles" else triton.cdiv(n, TILE_ROWS)  # 2bit_tiles: one row a tile
    if data.shape[1] != cols or (rows is not None and data.shape[0] != rows):
        raise ValueError(f"{name} has shape {tuple(data.shape)}, but N={n if n is not None else 'any'}, "
                         f"K={k} in the {fmt} format need ({rows if rows is not None else 'N'}, {cols})")
    if not data.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


@dataclass(frozen=True)
class PackedTernary:
    """A packed ternary matrix of logical shape (n, k), checked once when it is built: dtype,
    shape against (n, k), and that every code is a valid one (2-bit code 3 and bytes above 242
    would otherwise decode to a wrong weight without any error)."""

    data: Tensor
    n: int
    k: int
    fmt: str = "2bit"

    def __post_init__(self):
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be a positive int, got {self.n!r}")
        _check_packed_data(self.data, self.k, self.fmt, "data", n=self.n)
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
        if fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
        data = {"2bit": pack_2bit, "base3": pack_base3, "2bit_mma": pack_2bit_mma, "2bit_tiles": pack_2bit_tiles}[fmt](w)
        return cls(data, int(w.shape[0]), int(w.shape[1]), fmt)

    def unpack(self) -> Int8[Tensor, "n k"]:
        unpack = {"2bit": unpack_2bit, "base3": unpack_base3, "2bit_mma": unpack_2bit_mma,
                  "2bit_tiles": unpack_2bit_tiles}[self.fmt]
        return unpack(self.data, self.k)[: self.n]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


# ----------------------------------------------------------------------------------------------
# Step 6 helpers: BitNet b1.58 quantisation
# ----------------------------------------------------------------------------------------------

def quantize_absmean(w: Float[Tensor, "n k"], *, per_channel: bool = False, eps: float = 1e-5
                     ) -> tuple[Int8[Tensor, "n k"], Float[Tensor, "..."]]:
    """BitNet b1.58 weights: ``scale = 1 / mean|W|`` (over the tensor, or over each output row
    when ``per_channel``) and ``W_t = clamp(round(W * scale), -1, 1)``. Then ``W ~= W_t / scale``,
    so ``x @ W.T ~= x @ W_t.T / scale``: the product every kernel here computes."""
    if not isinstance(w, Tensor) or not w.is_floating_point():
        raise TypeError(f"w must be a floating-point torch.Tensor, got {getattr(w, 'dtype', type(w).__name__)}")
    if w.ndim != 2:
        raise ValueError(f"w must be 2-D (N, K), got shape {tuple(w.shape)}")
    w32 = w.float()
    mean_abs = w32.abs().mean(dim=1) if per_channel else w32.abs().mean()
    scale = 1.0 / mean_abs.clamp(min=eps)
    ternary = (w32 * (scale[:, None] if per_channel else scale)).round().clamp(-1, 1)
    return ternary.to(torch.int8), scale


def quantize_activations(x: Float[Tensor, "m k"], eps: float = 1e-5) -> tuple[Int8[Tensor, "m k"], Float[Tensor, " m"]]:
    """BitNet's per-token absmax int8 activations: ``scale = 127 / max|x_row|``,
    ``x_q = clamp(round(x * scale), -128, 127)``, so that ``x ~= x_q / scale``."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point torch.Tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (M, K), got shape {tuple(x.shape)}")
    x32 = x.float()
    scale = 127.0 / x32.abs().amax(dim=1).clamp(min=eps)
    xq = (x32 * scale[:, None]).round().clamp(-128, 127).to(torch.int8)
    return xq.contiguous(), scale.contiguous()


# ----------------------------------------------------------------------------------------------
# Reference and tolerance
# ----------------------------------------------------------------------------------------------

#: Largest accepted |z - reference| as a fraction of sum_k |x_k w_nk| / |scale_n|: about 32 float32
#: rounding steps of the magnitude sum. One wrong weight moves z by 2 |x_k|, far above this for
#: every size used here (the tests check that the tolerance does catch one flipped weight).
FP32_TOLERANCE = 4e-6


def _as_scale64(scale: Union[float, Tensor], device) -> Tensor:
    return (scale.double() if isinstance(scale, Tensor) else torch.tensor(float(scale), dtype=torch.float64)).to(device)


def reference(x: Tensor, w: Tensor, scale: Union[float, Tensor] = 1.0) -> Tensor:
    """``x @ w.T / scale`` in float64 (x: (K,) or (M, K); w: (N, K); scale: number or (N,))."""
    return (x.double() @ w.double().T) / _as_scale64(scale, x.device)


def error_ratio(z: Tensor, x: Tensor, w: Tensor, scale: Union[float, Tensor] = 1.0) -> float:
    """``max |z - reference| / (sum_k |x_k||w_nk| / |scale_n|)``; a NaN anywhere counts as infinite."""
    s = _as_scale64(scale, x.device)
    ref = (x.double() @ w.double().T) / s
    magnitude = (x.double().abs() @ w.double().abs().T) / s.abs()
    return _ratio(z, ref, magnitude)


def _ratio(z: Tensor, ref: Tensor, magnitude: Tensor) -> float:
    err = (z.double() - ref).abs()
    ratio = torch.where(err == 0, torch.zeros_like(err), err / magnitude.clamp(min=1e-300))
    ratio = torch.nan_to_num(ratio, nan=math.inf)
    return float(ratio.max()) if ratio.numel() else 0.0


# ----------------------------------------------------------------------------------------------
# The seed, kept only to show its bugs (notebook and tests). Guarded: not part of the API.
# ----------------------------------------------------------------------------------------------

@triton.jit
def _seed_kernel(x_ptr, w_ptr, z_ptr, scale, M, N, stride_xm, stride_wm, stride_wn,
                 BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, X_ALONG_N: tl.constexpr):
    # The seed's kernel as it was: x is (1, M), W is (M, N), z = x W / scale stored as float16.
    # X_ALONG_N=True is the earlier version whose output stayed in the seed's last cell: it
    # broadcasts x along N instead of M, which compiles only because the seed's blocks are square.
    pid = tl.program_id(axis=0)
    offs_m = tl.arange(0, BLOCK_SIZE_M)
    offs_n = (pid * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    x_ptrs = x_ptr + offs_m
    w_ptrs = w_ptr + (offs_m[:, None] * stride_wm + offs_n[None, :] * stride_wn)
    accumulator = tl.zeros((BLOCK_SIZE_N,), dtype=tl.float32)
    for m in range(0, tl.cdiv(M, BLOCK_SIZE_M)):
        if X_ALONG_N:
            x = tl.load(x_ptrs, mask=offs_m < M - m * BLOCK_SIZE_M, other=0.0)[None, :]
        else:
            x = tl.load(x_ptrs, mask=offs_m < M - m * BLOCK_SIZE_M, other=0.0)[:, None]
        w = tl.load(w_ptrs, mask=offs_m[:, None] < M - m * BLOCK_SIZE_M, other=0.0)
        elements_to_sum = tl.where(w > 0, x, tl.where(w < 0, -x, tl.zeros_like(x)))
        accumulator = accumulator + tl.sum(elements_to_sum, axis=0)
        x_ptrs += BLOCK_SIZE_M * stride_xm
        w_ptrs += BLOCK_SIZE_M * stride_wm
    accumulator = accumulator / scale
    z = accumulator.to(tl.float16)
    offs_z = pid * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    tl.store(z_ptr + offs_z, z, mask=offs_z < N)


def ternary_seed(x: Tensor, w: Tensor, scale: float, *, x_along_n: bool = False,
                 i_know_this_is_the_buggy_seed: bool = False) -> Tensor:
    """Run the seed's kernel (W is (K, N) here; 2x2 blocks; float16 out). Wrong on purpose: only
    the notebook and the tests call it, to show which check catches which bug."""
    if not i_know_this_is_the_buggy_seed:
        raise RuntimeError("ternary_seed reproduces the seed's bugs; use ternary_matmul, or pass "
                           "i_know_this_is_the_buggy_seed=True to look at the bugs on purpose")
    k, n = w.shape
    z = torch.full((n,), float("nan"), dtype=torch.float16, device=x.device)
    _seed_kernel[(triton.cdiv(n, 2),)](x, w, z, scale, k, n, x.stride(0), w.stride(0), w.stride(1),
                                       BLOCK_SIZE_M=2, BLOCK_SIZE_N=2, X_ALONG_N=x_along_n)
    return z


# ----------------------------------------------------------------------------------------------
# Autotuning: few configs on the GPU. The interpreter cannot time, so it keeps the first one;
# the tests run every config explicitly (the ``config=`` argument of the wrappers).
# ----------------------------------------------------------------------------------------------

def _zero_output(nargs):
    """pre_hook of split-K configs: their programs add partial sums into z with atomics."""
    nargs["z_ptr"].zero_()


def _cfg(num_warps: int = 4, num_stages: int = 3, zero_output: bool = True, **meta) -> triton.Config:
    hook = _zero_output if zero_output and meta.get("SPLIT_K", 1) > 1 else None
    return triton.Config(meta, num_warps=num_warps, num_stages=num_stages, pre_hook=hook)


def _autotune(configs: list, key: list[str]):
    chosen = configs if runtime.mode() == "gpu" else configs[:1]
    return triton.autotune(configs=chosen, key=key)


def config_dict(config: triton.Config) -> dict:
    """A triton.Config as the ``config=`` argument of the wrappers."""
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


# Dense steps: many rows a program is fine, the kernels are memory-bound on 1-2 bytes a weight.
V1_CONFIGS = [_cfg(BLOCK_N=16, BLOCK_K=256), _cfg(BLOCK_N=64, BLOCK_K=64)]
V3_CONFIGS = [_cfg(BLOCK_N=16), _cfg(BLOCK_N=4)]
# M=1 kernels: 8 rows a program, all in each thread (x is loaded once for the 8), and 4 words (or
# 4 bytes) a thread along K; BLOCK_KW = 128 x num_warps keeps every warp on different words.
GEMV_CONFIGS = [
    _cfg(BLOCK_N=8, BLOCK_KW=512, SPLIT_K=1, num_warps=4),
    _cfg(BLOCK_N=8, BLOCK_KW=256, SPLIT_K=1, num_warps=2),
    _cfg(BLOCK_N=8, BLOCK_KW=128, SPLIT_K=4, num_warps=1),
]
GEMV3_CONFIGS = [
    _cfg(BLOCK_N=8, BLOCK_KB=512, SPLIT_K=1, num_warps=4),
    _cfg(BLOCK_N=8, BLOCK_KB=256, SPLIT_K=1, num_warps=2),
    _cfg(BLOCK_N=8, BLOCK_KB=128, SPLIT_K=4, num_warps=1),
]
# tl.dot kernels. Few rows of x (BLOCK_M <= 32): pipelined loads; many: no pipelining, or the
# 16 x-tiles a step would not fit in shared memory.
# With N = 4096 and 64 rows a program there are only 64 programs for 132 SMs: split K.
DOT_CONFIGS_FEW = [
    _cfg(BLOCK_N=64, BLOCK_KW=64, SPLIT_K=1, num_stages=2),
    _cfg(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=4, num_stages=2),
    _cfg(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=8, num_stages=2),
]
DOT_CONFIGS_MANY = [
    _cfg(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=1, num_stages=1),
    _cfg(BLOCK_N=128, BLOCK_KW=32, SPLIT_K=1, num_stages=1, num_warps=8),
]
DOT3_CONFIGS_FEW = [
    _cfg(BLOCK_N=64, BLOCK_KB=64, SPLIT_K=1, num_stages=2),
    _cfg(BLOCK_N=64, BLOCK_KB=64, SPLIT_K=4, num_stages=2),
    _cfg(BLOCK_N=64, BLOCK_KB=64, SPLIT_K=8, num_stages=2),
]
DOT3_CONFIGS_MANY = [
    _cfg(BLOCK_N=64, BLOCK_KB=64, SPLIT_K=1, num_stages=1),
    _cfg(BLOCK_N=128, BLOCK_KB=64, SPLIT_K=1, num_stages=1, num_warps=8),
]
W2A8_CONFIGS_FEW = [
    _cfg(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=1, num_stages=2),
    _cfg(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=4, num_stages=2),
]
W2A8_CONFIGS_MANY = [  # int8 MMA steps over 32 k: BLOCK_KW >= 32
    _cfg(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=1, num_stages=1),
    _cfg(BLOCK_N=128, BLOCK_KW=32, SPLIT_K=1, num_stages=1, num_warps=8),
]
def _mma_cfg(**kw) -> triton.Config:
    return _cfg(zero_output=False, **kw)  # step 7 reduces split-K itself: z needs no zeroing


# Step 7. BLOCK_N = 64 rows and 4 warps: one warpgroup, Hopper's wgmma (64 x BLOCK_M x 16, the weights
# from registers). Each dot waits for its wgmma before the next decode (Triton 3.6), so the SM hides
# that wait with other programs: small tiles (BLOCK_KW = 16: 69 registers, 32 KB of shared memory)
# let 7 programs share an SM. K is split so that N = 4096 still makes 256-512 programs; the workspace
# reduction makes a split cost a few atomics, not a launch.
MMA_CONFIGS_FEW = [
    _mma_cfg(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=2, num_stages=3),
    _mma_cfg(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=4, num_stages=3),
    _mma_cfg(BLOCK_N=64, BLOCK_KW=32, SPLIT_K=8, num_stages=2),
    _mma_cfg(BLOCK_N=64, BLOCK_KW=16, SPLIT_K=1, num_stages=3),
    _mma_cfg(BLOCK_N=64, BLOCK_KW=16, SPLIT_K=4, num_stages=3),
    _mma_cfg(BLOCK_N=64, BLOCK_KW=16, SPLIT_K=8, num_stages=3),
    _mma_cfg(BLOCK_N=128, BLOCK_KW=32, SPLIT_K=8, num_stages=3, num_warps=8),
]
# Many rows: the rows of x a program covers are tuned too (a 64-row block decodes the weights twice
# for M = 128, but takes half the shared memory of a 128-row one).
MMA_CONFIGS_MANY = [
    _mma_cfg(BLOCK_N=64, BLOCK_KW=16, SPLIT_K=2, BLOCK_M=128, num_stages=2),
    _mma_cfg(BLOCK_N=64, BLOCK_KW=16, SPLIT_K=2, BLOCK_M=64, num_stages=3),
    _mma_cfg(BLOCK_N=64, BLOCK_KW=16, SPLIT_K=4, BLOCK_M=64, num_stages=3),
    _mma_cfg(BLOCK_N=128, BLOCK_KW=16, SPLIT_K=2, BLOCK_M=64, num_stages=3, num_warps=8),
]


# ----------------------------------------------------------------------------------------------
# Step 1: the seed's idea, made correct
# ----------------------------------------------------------------------------------------------

@triton.jit
def sign_v1_kernel(x_ptr, w_ptr, z_ptr, scale_ptr, N, K, stride_xm, stride_wn, stride_zm, scale_stride,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # One program: BLOCK_N outputs for one row of x. W is (N, K), dense, values -1, 0, +1.
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N  # a mask, not a modulo: rows past N are neither read nor written
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    x_row = x_ptr + m.to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)  # reduced over K once, after the loop
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_row + offs_k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        w = tl.load(w_rows + offs_k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w = w.to(tl.float32)  # any float type: the sign test is exact (and right in the interpreter)
        acc += tl.where(w > 0, x, tl.where(w < 0, -x, 0.0))  # sign selection: no multiply
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = tl.sum(acc, axis=1) / scale
    tl.store(z_ptr + m.to(tl.int64) * stride_zm + rows, z, mask=row_mask)  # float32 out


# ----------------------------------------------------------------------------------------------
# Step 2: int8 weights
# ----------------------------------------------------------------------------------------------

@triton.jit
def int8_v2_kernel(x_ptr, w_ptr, z_ptr, scale_ptr, N, K, stride_xm, stride_wn, stride_zm, scale_stride,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # One program: BLOCK_N outputs for one row of x. W is (N, K), int8, values -1, 0, +1.
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N  # a mask, not a modulo: rows past N are neither read nor written
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    x_row = x_ptr + m.to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)  # reduced over K once, after the loop
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_row + offs_k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        w = tl.load(w_rows + offs_k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0)
        acc += tl.where(w > 0, x, tl.where(w < 0, -x, 0.0))  # sign selection: no multiply
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = tl.sum(acc, axis=1) / scale
    tl.store(z_ptr + m.to(tl.int64) * stride_zm + rows, z, mask=row_mask)  # float32 out


sign_v1 = _autotune(V1_CONFIGS, key=["N", "K"])(sign_v1_kernel)
int8_v2 = _autotune(V1_CONFIGS, key=["N", "K"])(int8_v2_kernel)


# ----------------------------------------------------------------------------------------------
# Step 3: 2-bit packing. First the direct decode, then a kernel built for M=1.
# ----------------------------------------------------------------------------------------------

@triton.jit
def packed2_v3_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, N, K, KW, stride_xm, stride_pn, stride_zm, scale_stride,
                      BLOCK_N: tl.constexpr):
    # One program: BLOCK_N outputs for one row of x, one group (16 words, 256 weights) a step.
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    p_rows = p_ptr + rows.to(tl.int64)[:, None] * stride_pn
    x_row = x_ptr + m.to(tl.int64) * stride_xm
    word = tl.arange(0, 16)  # word t of a group
    field = tl.arange(0, 16)  # field j of a word: bits 2j, 2j+1, the code of weight 16 j + t
    acc = tl.zeros([BLOCK_N, 16, 16], dtype=tl.float32)
    for g in range(0, KW // 16):
        words = tl.load(p_rows + g * 16 + word[None, :], mask=row_mask[:, None], other=0x55555555)
        codes = (words[:, None, :] >> (2 * field)[None, :, None]) & 3  # [n, j, t], code = weight + 1
        offs_k = g * 256 + field[:, None] * 16 + word[None, :]  # [j, t]: the group's 256 k, in order
        x = tl.load(x_row + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)[None, :, :]
        acc += tl.where(codes == 2, x, tl.where(codes == 0, -x, 0.0))  # sign selection: no multiply
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = tl.sum(tl.sum(acc, axis=2), axis=1) / scale
    tl.store(z_ptr + m.to(tl.int64) * stride_zm + rows, z, mask=row_mask)


packed2_v3 = _autotune(V3_CONFIGS, key=["N", "K"])(packed2_v3_kernel)


@triton.jit
def _with_exponent(words):
    # The low 16 bits of every word (fields 0..7) under an all-ones float exponent: sign and bits
    # 16..22 cleared, bits 23..30 set. Once a word, so that each field then costs one AND.
    return (words & 0xFFFF) | 0x7F800000


@triton.jit
def _field_to_float(src, f: tl.constexpr):
    # Field f (bits 2f, 2f+1; f < 8) of words prepared by _with_exponent, as the weight -1.0, 0.0 or
    # +1.0 in two instructions, with no shift and no int->float conversion. One AND keeps the field
    # and the exponent of 2^(23-2f), where the field's lowest bit weighs exactly 1: the float is
    # 2^(23-2f) + code. Subtracting 2^(23-2f) + 1 leaves code - 1, the weight.
    bits = src & (((150 - 2 * f) << 23) | (3 << (2 * f)))
    return bits.to(tl.float32, bitcast=True) - (2.0 ** (23 - 2 * f) + 1.0)


@triton.jit
def gemv_2bit_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, N, K, KW, stride_xm, stride_pn, stride_zm, scale_stride,
                     BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr):
    # One program: BLOCK_N outputs for one row of x, over one of SPLIT_K slices of K.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    p_rows = p_ptr + rows.to(tl.int64)[:, None] * stride_pn
    x_row = x_ptr + m.to(tl.int64) * stride_xm
    words_per_split = tl.cdiv(tl.cdiv(KW, SPLIT_K), BLOCK_KW) * BLOCK_KW
    kw_start = pid_k * words_per_split
    kw_end = tl.minimum(kw_start + words_per_split, KW)
    offs_w = tl.arange(0, BLOCK_KW)
    x_of_word = (offs_w // 16) * 256 + offs_w % 16  # k of field 0 of each word, from the tile start
    acc = tl.zeros([BLOCK_N, BLOCK_KW], dtype=tl.float32)
    for kw0 in range(kw_start, kw_end, BLOCK_KW):
        kw = kw0 + offs_w
        # A wide tile of packed words, BLOCK_N x BLOCK_KW int32 of 16 weights each.
        words = tl.load(p_rows + kw[None, :], mask=row_mask[:, None] & (kw < kw_end)[None, :], other=0x55555555)
        offs_k = kw0 * 16 + x_of_word
        low = _with_exponent(words)  # fields 0..7
        for f in tl.static_range(8):
            x = tl.load(x_row + offs_k + 16 * f, mask=offs_k + 16 * f < K, other=0.0).to(tl.float32)
            acc += _field_to_float(low, f) * x[None, :]  # one x load serves the BLOCK_N rows
        high = _with_exponent(words >> 16)  # fields 8..15, moved down: one shift a word
        for f in tl.static_range(8):
            x = tl.load(x_row + offs_k + 16 * (f + 8), mask=offs_k + 16 * (f + 8) < K, other=0.0).to(tl.float32)
            acc += _field_to_float(high, f) * x[None, :]
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = tl.sum(acc, axis=1) / scale
    z_ptrs = z_ptr + m.to(tl.int64) * stride_zm + rows
    if SPLIT_K == 1:
        tl.store(z_ptrs, z, mask=row_mask)
    else:  # z was zeroed; the slices of K add up in it
        tl.atomic_add(z_ptrs, z, mask=row_mask, sem="relaxed")


gemv_2bit = _autotune(GEMV_CONFIGS, key=["N", "K"])(gemv_2bit_kernel)


# ----------------------------------------------------------------------------------------------
# Step 4: batched activations, decoded weights into tl.dot
# ----------------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["M"])
def dot_2bit_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, M, N, K, KW, stride_xm, stride_pn, stride_zm, scale_stride,
                    BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # One program: a BLOCK_N x BLOCK_M tile of z transposed, over one of SPLIT_K slices of K. The
    # weights are the MMA's wide side (BLOCK_N >= 64 rows), the few rows of x its narrow side.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    cols = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    col_mask = cols < M
    p_rows = p_ptr + rows.to(tl.int64)[:, None] * stride_pn
    x_cols = x_ptr + cols.to(tl.int64)[None, :] * stride_xm
    words_per_split = tl.cdiv(tl.cdiv(KW, SPLIT_K), BLOCK_KW) * BLOCK_KW
    kw_start = pid_k * words_per_split
    kw_end = tl.minimum(kw_start + words_per_split, KW)
    offs_w = tl.arange(0, BLOCK_KW)
    x_of_word = (offs_w // 16) * 256 + offs_w % 16
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for kw0 in range(kw_start, kw_end, BLOCK_KW):
        kw = kw0 + offs_w
        words = tl.load(p_rows + kw[None, :], mask=row_mask[:, None] & (kw < kw_end)[None, :], other=0x55555555)
        offs_k = kw0 * 16 + x_of_word
        low = _with_exponent(words)
        high = _with_exponent(words >> 16)
        for f in tl.static_range(8):
            k_f = offs_k + 16 * f
            xt = tl.load(x_cols + k_f[:, None], mask=(k_f < K)[:, None] & col_mask[None, :], other=0.0).to(DOT_DTYPE)
            acc = tl.dot(_field_to_float(low, f).to(DOT_DTYPE), xt, acc, input_precision=DOT_PRECISION)
        for f in tl.static_range(8):
            k_f = offs_k + 16 * (f + 8)
            xt = tl.load(x_cols + k_f[:, None], mask=(k_f < K)[:, None] & col_mask[None, :], other=0.0).to(DOT_DTYPE)
            acc = tl.dot(_field_to_float(high, f).to(DOT_DTYPE), xt, acc, input_precision=DOT_PRECISION)
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = acc / scale[:, None]
    z_ptrs = z_ptr + cols.to(tl.int64)[None, :] * stride_zm + rows[:, None]
    if SPLIT_K == 1:
        tl.store(z_ptrs, z, mask=row_mask[:, None] & col_mask[None, :])
    else:
        tl.atomic_add(z_ptrs, z, mask=row_mask[:, None] & col_mask[None, :], sem="relaxed")


dot_2bit_few = _autotune(DOT_CONFIGS_FEW, key=["N", "K", "BLOCK_M"])(dot_2bit_kernel)
dot_2bit_many = _autotune(DOT_CONFIGS_MANY, key=["N", "K", "BLOCK_M"])(dot_2bit_kernel)


# ----------------------------------------------------------------------------------------------
# Step 5: 1.6-bit packing, 5 weights a byte in base 3
# ----------------------------------------------------------------------------------------------

@triton.jit
def gemv_base3_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, table_ptr, N, K, KB, stride_xm, stride_pn, stride_zm,
                      scale_stride, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, SPLIT_K: tl.constexpr):
    # One program: BLOCK_N outputs for one row of x, over one of SPLIT_K slices of K.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    p_rows = p_ptr + rows.to(tl.int64)[:, None] * stride_pn
    x_row = x_ptr + m.to(tl.int64) * stride_xm
    bytes_per_split = tl.cdiv(tl.cdiv(KB, SPLIT_K), BLOCK_KB) * BLOCK_KB
    kb_start = pid_k * bytes_per_split
    kb_end = tl.minimum(kb_start + bytes_per_split, KB)
    offs_b = tl.arange(0, BLOCK_KB)
    x_of_byte = (offs_b // 16) * 80 + offs_b % 16  # k of digit 0 of each byte, from the tile start
    acc = tl.zeros([BLOCK_N, BLOCK_KB], dtype=tl.float32)
    for kb0 in range(kb_start, kb_end, BLOCK_KB):
        kb = tl.max_contiguous(kb0 + offs_b, 4)  # 4 bytes a thread, like the 4 x values they meet
        # A wide tile of packed bytes, BLOCK_N x BLOCK_KB of 5 weights each (121: five zeros).
        v = tl.load(p_rows + kb[None, :], mask=row_mask[:, None] & (kb < kb_end)[None, :], other=121)
        # One table lookup a byte gives its 5 digits as 2-bit fields under the float exponent,
        # ready for the same two-instruction decode as the 2-bit format. (The 1 KB table stays in L1.)
        fields = tl.load(table_ptr + v.to(tl.int32))
        offs_k = kb0 * 5 + x_of_byte
        for d in tl.static_range(5):
            x = tl.load(x_row + offs_k + 16 * d, mask=offs_k + 16 * d < K, other=0.0).to(tl.float32)
            acc += _field_to_float(fields, d) * x[None, :]
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = tl.sum(acc, axis=1) / scale
    z_ptrs = z_ptr + m.to(tl.int64) * stride_zm + rows
    if SPLIT_K == 1:
        tl.store(z_ptrs, z, mask=row_mask)
    else:
        tl.atomic_add(z_ptrs, z, mask=row_mask, sem="relaxed")


@triton.jit(do_not_specialize=["M"])
def dot_base3_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, table_ptr, M, N, K, KB, stride_xm, stride_pn, stride_zm,
                     scale_stride, BLOCK_N: tl.constexpr, BLOCK_KB: tl.constexpr, SPLIT_K: tl.constexpr,
                     BLOCK_M: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # One program: a BLOCK_N x BLOCK_M tile of z transposed, over one of SPLIT_K slices of K.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    cols = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    col_mask = cols < M
    p_rows = p_ptr + rows.to(tl.int64)[:, None] * stride_pn
    x_cols = x_ptr + cols.to(tl.int64)[None, :] * stride_xm
    bytes_per_split = tl.cdiv(tl.cdiv(KB, SPLIT_K), BLOCK_KB) * BLOCK_KB
    kb_start = pid_k * bytes_per_split
    kb_end = tl.minimum(kb_start + bytes_per_split, KB)
    offs_b = tl.arange(0, BLOCK_KB)
    x_of_byte = (offs_b // 16) * 80 + offs_b % 16
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for kb0 in range(kb_start, kb_end, BLOCK_KB):
        kb = kb0 + offs_b
        v = tl.load(p_rows + kb[None, :], mask=row_mask[:, None] & (kb < kb_end)[None, :], other=121)
        fields = tl.load(table_ptr + v.to(tl.int32))
        offs_k = kb0 * 5 + x_of_byte
        for d in tl.static_range(5):
            k_d = offs_k + 16 * d
            xt = tl.load(x_cols + k_d[:, None], mask=(k_d < K)[:, None] & col_mask[None, :], other=0.0).to(DOT_DTYPE)
            acc = tl.dot(_field_to_float(fields, d).to(DOT_DTYPE), xt, acc, input_precision=DOT_PRECISION)
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    z = acc / scale[:, None]
    z_ptrs = z_ptr + cols.to(tl.int64)[None, :] * stride_zm + rows[:, None]
    if SPLIT_K == 1:
        tl.store(z_ptrs, z, mask=row_mask[:, None] & col_mask[None, :])
    else:
        tl.atomic_add(z_ptrs, z, mask=row_mask[:, None] & col_mask[None, :], sem="relaxed")


gemv_base3 = _autotune(GEMV3_CONFIGS, key=["N", "K"])(gemv_base3_kernel)
dot_base3_few = _autotune(DOT3_CONFIGS_FEW, key=["N", "K", "BLOCK_M"])(dot_base3_kernel)
dot_base3_many = _autotune(DOT3_CONFIGS_MANY, key=["N", "K", "BLOCK_M"])(dot_base3_kernel)


# ----------------------------------------------------------------------------------------------
# Step 6: int8 activations (W2A8): int8 x int8 -> int32 on the tensor cores, scales at the end
# ----------------------------------------------------------------------------------------------

@triton.jit
def _field_to_int8(words, f: tl.constexpr):
    return (((words >> (2 * f)) & 3) - 1).to(tl.int8)


@triton.jit(do_not_specialize=["M"])
def w2a8_dot_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, x_scale_ptr, M, N, K, KW, stride_xm, stride_pn, stride_zm,
                    scale_stride, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr,
                    BLOCK_M: tl.constexpr):
    # One program: a BLOCK_N x BLOCK_M tile of z transposed, over one of SPLIT_K slices of K.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    cols = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    col_mask = cols < M
    p_rows = p_ptr + rows.to(tl.int64)[:, None] * stride_pn
    x_cols = x_ptr + cols.to(tl.int64)[None, :] * stride_xm
    words_per_split = tl.cdiv(tl.cdiv(KW, SPLIT_K), BLOCK_KW) * BLOCK_KW
    kw_start = pid_k * words_per_split
    kw_end = tl.minimum(kw_start + words_per_split, KW)
    offs_w = tl.arange(0, BLOCK_KW)
    x_of_word = (offs_w // 16) * 256 + offs_w % 16
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.int32)  # exact: |sum| <= 128 K < 2^31
    for kw0 in range(kw_start, kw_end, BLOCK_KW):
        kw = kw0 + offs_w
        words = tl.load(p_rows + kw[None, :], mask=row_mask[:, None] & (kw < kw_end)[None, :], other=0x55555555)
        offs_k = kw0 * 16 + x_of_word
        for f in tl.static_range(16):
            k_f = offs_k + 16 * f
            xt = tl.load(x_cols + k_f[:, None], mask=(k_f < K)[:, None] & col_mask[None, :], other=0)
            acc = tl.dot(_field_to_int8(words, f), xt, acc, out_dtype=tl.int32)  # triton 3.6 needs it spelled out
    scale = tl.load(scale_ptr + rows * scale_stride, mask=row_mask, other=1.0)
    x_scale = tl.load(x_scale_ptr + cols, mask=col_mask, other=1.0)
    z = acc.to(tl.float32) / (scale[:, None] * x_scale[None, :])
    z_ptrs = z_ptr + cols.to(tl.int64)[None, :] * stride_zm + rows[:, None]
    if SPLIT_K == 1:
        tl.store(z_ptrs, z, mask=row_mask[:, None] & col_mask[None, :])
    else:
        tl.atomic_add(z_ptrs, z, mask=row_mask[:, None] & col_mask[None, :], sem="relaxed")


w2a8_dot_few = _autotune(W2A8_CONFIGS_FEW, key=["N", "K", "BLOCK_M"])(w2a8_dot_kernel)
w2a8_dot_many = _autotune(W2A8_CONFIGS_MANY, key=["N", "K", "BLOCK_M"])(w2a8_dot_kernel)


# ----------------------------------------------------------------------------------------------
# Step 7: a layout for the tensor cores. Two weights a 32-bit op, decoded straight into the MMA's
# A operand; one kernel for every M; split-K without a memset.
# ----------------------------------------------------------------------------------------------

#: Exponent bits OR-ed into both 16-bit halves of a word before the decode (see _pair_weights):
#: bf16 0.5 (exponent 126: bits 8..13 set, bit 7 clear) and fp16 1.0 (exponent 15: bits 10..13).
#: (The kernels spell them out: Triton kernels read only constexpr globals.)
BF16_HALF_BITS = 0x3F003F00
FP16_ONE_BITS = 0x3C003C00


@triton.jit
def _with_pair_exponent(words, q: tl.constexpr, MAGIC: tl.constexpr):
    # Byte q of each 16-bit half (pairs 4q..4q+3) moved to the bottom of the half, under the exponent
    # bits of the decode. The other byte's bits stay: every decode AND clears them.
    if MAGIC == tl.float16:
        return (words >> (8 * q)) | 0x3C003C00
    else:
        return (words >> (8 * q)) | 0x3F003F00


@triton.jit
def _pair_weights(src, f: tl.constexpr, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr):
    # Field f (bits 2f, 2f+1; f < 4) of both halves of words prepared by _with_pair_exponent, as two
    # weights (-1, 0, +1) in a [..., 2] tensor of DOT_DTYPE. One AND keeps the two fields and the
    # exponent bits: in bf16 each half then reads 0.5 + code * 2^(2f-8) exactly (for f = 3 the code's
    # high bit is the exponent's lowest, and 0.5, 0.75, 1.0 are still 0.5 + code / 4); in fp16,
    # 1 + code * 2^(2f-10). One fused multiply-add on the pair (HFMA2) turns that into code - 1.
    if MAGIC == tl.float16:
        bits = src & ((0x00030003 << (2 * f)) | 0x3C003C00)
    else:
        bits = src & ((0x00030003 << (2 * f)) | 0x3F003F00)
    lo = bits.to(tl.int16).to(MAGIC, bitcast=True).to(DOT_DTYPE)
    hi = (bits >> 16).to(tl.int16).to(MAGIC, bitcast=True).to(DOT_DTYPE)
    if MAGIC == tl.float16:
        lo = lo * (2.0 ** (10 - 2 * f)) - (2.0 ** (10 - 2 * f) + 1.0)
        hi = hi * (2.0 ** (10 - 2 * f)) - (2.0 ** (10 - 2 * f) + 1.0)
    else:
        lo = lo * (2.0 ** (8 - 2 * f)) - (2.0 ** (7 - 2 * f) + 1.0)
        hi = hi * (2.0 ** (8 - 2 * f)) - (2.0 ** (7 - 2 * f) + 1.0)
    return tl.join(lo, hi)


@triton.jit
def _mma_step(acc, words, x_cols, kw0, K, col_mask, r_k, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
              MASK_K: tl.constexpr, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # One tile of BLOCK_KW words a row: 8 dots, one per pair p, each over the tile's 2 * BLOCK_KW
    # weights of that pair. Their activations are runs of 32 consecutive k (r_k), loaded as is.
    for q in tl.static_range(2):
        src = _with_pair_exponent(words, q, MAGIC)
        for f in tl.static_range(4):
            a = tl.reshape(_pair_weights(src, f, MAGIC, DOT_DTYPE), (BLOCK_N, 2 * BLOCK_KW))
            k = kw0 * 16 + r_k + 32 * (4 * q + f)
            if MASK_K:
                xt = tl.load(x_cols + k[:, None], mask=(k < K)[:, None] & col_mask[None, :], other=0.0)
            else:
                xt = tl.load(x_cols + k[:, None], mask=col_mask[None, :], other=0.0)
            acc = tl.dot(a, xt.to(DOT_DTYPE), acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit(do_not_specialize=["M"])
def mma_2bit_kernel(x_ptr, p_ptr, z_ptr, scale_ptr, ws_ptr, count_ptr, M, N, K, KW, stride_xm, stride_pn, stride_zm,
                    scale_stride, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, SPLIT_K: tl.constexpr,
                    BLOCK_M: tl.constexpr, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # One program: a BLOCK_N x BLOCK_M tile of z transposed, over one of SPLIT_K slices of K, in tiles
    # of BLOCK_KW words a row (whole groups: the activations of a pair are runs of 32 k).
    tl.static_assert(BLOCK_KW % 16 == 0)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    rows_in = tl.minimum(rows, N - 1)  # rows past N read row N-1 (no mask, no select) and are not stored
    cols = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    col_mask = cols < M
    p_rows = p_ptr + rows_in.to(tl.int64)[:, None] * stride_pn
    x_cols = x_ptr + cols.to(tl.int64)[None, :] * stride_xm
    words_per_split = tl.cdiv(tl.cdiv(KW, SPLIT_K), BLOCK_KW) * BLOCK_KW
    kw_start = pid_k * words_per_split
    kw_end = tl.minimum(kw_start + words_per_split, KW)
    # Tiles whose k all lie below K need no mask on x: every tile but the last one or two.
    full_end = tl.minimum(kw_end, (K // (16 * BLOCK_KW)) * BLOCK_KW)
    offs_w = tl.arange(0, BLOCK_KW)
    r = tl.arange(0, 2 * BLOCK_KW)
    r_k = (r // 32) * 256 + r % 32  # column r of a pair's dot: word r // 2, half r % 2
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for kw0 in range(kw_start, full_end, BLOCK_KW):
        words = tl.load(p_rows + (kw0 + offs_w)[None, :])
        acc = _mma_step(acc, words, x_cols, kw0, K, col_mask, r_k, BLOCK_N, BLOCK_KW, False, MAGIC, DOT_DTYPE,
                        DOT_PRECISION)
    for kw0 in range(tl.maximum(kw_start, full_end), kw_end, BLOCK_KW):
        kw = kw0 + offs_w
        words = tl.load(p_rows + kw[None, :], mask=(kw < kw_end)[None, :], other=0x55555555)
        acc = _mma_step(acc, words, x_cols, kw0, K, col_mask, r_k, BLOCK_N, BLOCK_KW, True, MAGIC, DOT_DTYPE,
                        DOT_PRECISION)
    scale = tl.load(scale_ptr + rows_in * scale_stride)
    z = acc / scale[:, None]
    out_mask = row_mask[:, None] & col_mask[None, :]
    z_offs = cols.to(tl.int64)[None, :] * stride_zm + rows[:, None]
    if SPLIT_K == 1:
        tl.store(z_ptr + z_offs, z, mask=out_mask)
    else:
        # The slices add into a workspace that is all zeros between launches; the last slice of a tile
        # to arrive (a counter per tile) swaps the sums out for zeros and stores them. No memset, and
        # z is written once, by a plain store.
        ws_offs = cols.to(tl.int64)[None, :] * N + rows[:, None]
        tl.atomic_add(ws_ptr + ws_offs, z, mask=out_mask, sem="relaxed")
        tl.debug_barrier()  # every thread's partial sums are in before the tile's counter moves
        tile = pid_m * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            # (exchanged as int32 bits: the interpreter has no float exchange)
            bits = tl.atomic_xchg(ws_ptr.to(tl.pointer_type(tl.int32)) + ws_offs, 0, mask=out_mask, sem="relaxed")
            tl.store(z_ptr + z_offs, bits.to(tl.float32, bitcast=True), mask=out_mask)
            tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed")


mma_2bit_few = _autotune(MMA_CONFIGS_FEW, key=["N", "K", "BLOCK_M"])(mma_2bit_kernel)
mma_2bit_many = _autotune(MMA_CONFIGS_MANY, key=["N", "K", "M"])(mma_2bit_kernel)  # BLOCK_M is tuned too


# ----------------------------------------------------------------------------------------------
# Python wrappers: check, allocate, launch. Nothing here waits for the GPU (no .item(), no
# host copies), so a timed call measures the kernels and nothing else.
# ----------------------------------------------------------------------------------------------

X_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
Scale = Union[float, Tensor]


def _check_device(t: Tensor, name: str, like: Optional[Tensor] = None) -> None:
    want = runtime.device().type
    if t.device.type != want:
        raise ValueError(f"{name} must be on {want} (kernels run in {runtime.mode()} mode), got {t.device}")
    if like is not None and t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but x is on {like.device}")


def _check_x(x: Any, k: Optional[int], dtypes: tuple = X_DTYPES, name: str = "x") -> tuple[Tensor, bool]:
    """``x`` as a 2-D (M, K) tensor, and whether it came as a vector."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise TypeError(f"{name} must be one of {[str(d) for d in dtypes]}, got {x.dtype}")
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
    _check_device(x2, name)
    return x2, vector


@functools.lru_cache(maxsize=64)
def _scalar_tensor(value: float, device: str) -> Tensor:
    return torch.tensor([value], dtype=torch.float32, device=device)


def _check_scale(scale: Any, n: int, like: Tensor) -> tuple[Tensor, int]:
    """(float32 tensor, stride): stride 0 for one scale, 1 for one per output channel. Tensor values
    are not inspected (that would wait for the GPU); a Python number must be finite and nonzero."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float, Tensor)):
        raise TypeError(f"scale must be a number or a float32 tensor of shape ({n},), got {type(scale).__name__}")
    if not isinstance(scale, Tensor):
        if not math.isfinite(scale) or scale == 0:
            raise ValueError(f"scale must be finite and nonzero, got {scale}")
        return _scalar_tensor(float(scale), str(like.device)), 0
    if scale.dtype != torch.float32:
        raise TypeError(f"scale must be float32, got {scale.dtype}")
    _check_device(scale, "scale", like)
    if scale.numel() == 1:
        return scale.reshape(1), 0
    if scale.shape != (n,) or not scale.is_contiguous():
        raise ValueError(f"scale must be a number, a one-element tensor or a contiguous ({n},) tensor, "
                         f"got shape {tuple(scale.shape)}")
    return scale, 1


def _prepare_out(out: Optional[Tensor], m: int, n: int, like: Tensor) -> Tensor:
    if out is None:
        return torch.empty((m, n), dtype=torch.float32, device=like.device)
    if not isinstance(out, Tensor) or out.dtype != torch.float32:
        raise TypeError(f"out must be a float32 torch.Tensor, got {getattr(out, 'dtype', type(out).__name__)}")
    if out.numel() != m * n or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 tensor of {m}x{n} elements, got shape {tuple(out.shape)}")
    _check_device(out, "out", like)
    return out.view(m, n)


def _check_dense(w: Any, dtypes: tuple, k: int, like: Tensor) -> Tensor:
    if not isinstance(w, Tensor):
        raise TypeError(f"w must be a torch.Tensor, got {type(w).__name__}")
    if w.dtype not in dtypes:
        raise TypeError(f"w must be one of {[str(d) for d in dtypes]}, got {w.dtype}")
    if w.ndim != 2:
        raise ValueError(f"w must be 2-D (N, K), got shape {tuple(w.shape)}")
    if w.shape[1] != k:
        raise ValueError(f"x has K={k} but w has K={w.shape[1]}")
    if w.stride(1) != 1:
        raise ValueError("w must be contiguous along its last dimension (K)")
    _check_device(w, "w", like)
    return w


def _check_packed(w: Any, fmt: str, k: int, like: Tensor) -> PackedTernary:
    if not isinstance(w, PackedTernary):
        raise TypeError(f"w must be a PackedTernary (see PackedTernary.pack), got {type(w).__name__}")
    if w.fmt != fmt:
        raise ValueError(f"this kernel reads the {fmt} format, got a PackedTernary in {w.fmt}")
    if w.k != k:
        raise ValueError(f"x has K={k} but w has K={w.k}")
    _check_device(w.data, "w", like)
    return w


def _launch(kernel, grid: Callable, args: tuple, config: Optional[dict], meta: dict, zero_output: bool = True) -> None:
    """The autotuned kernel, or one explicit config (the tests run every config this way)."""
    if config is None:
        kernel[grid](*args, **meta)
        return
    config = dict(config)
    num_warps, num_stages = config.pop("num_warps", 4), config.pop("num_stages", 3)
    if zero_output and config.get("SPLIT_K", 1) > 1:
        args[2].zero_()  # z: the slices of K add into it
    kernel.fn[grid](*args, **meta, **config, num_warps=num_warps, num_stages=num_stages)


def _x_k(w: Any) -> Optional[int]:
    if isinstance(w, PackedTernary):
        return w.k
    return w.shape[1] if isinstance(w, Tensor) and w.ndim == 2 else None


def _rowwise(kernel, x: Any, w: Any, scale: Scale, out: Optional[Tensor], config: Optional[dict],
             dense_dtypes: Optional[tuple] = None, fmt: Optional[str] = None, split: bool = False):
    """Launch a kernel with one program column per row of x (steps 1-3 and the M=1 kernels)."""
    x2, vector = _check_x(x, _x_k(w))
    m, k = x2.shape
    if dense_dtypes is not None:
        w = _check_dense(w, dense_dtypes, k, x2)
        n, data, extra = w.shape[0], w, ()
    else:
        w = _check_packed(w, fmt, k, x2)
        n, data = w.n, w.data
        extra = (data.shape[1],)
    s, s_stride = _check_scale(scale, n, x2)
    z = _prepare_out(out, m, n, x2)
    table = (base3_table(str(x2.device)),) if fmt == "base3" else ()
    args = (x2, data, z, s, *table, n, k, *extra, x2.stride(0), data.stride(0), z.stride(0), s_stride)
    if split:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"], m)  # noqa: E731
    else:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), m)  # noqa: E731
    _launch(kernel, grid, args, config, {})
    return z[0] if vector else z


def matmul_sign_v1(x: Float[Tensor, "*m k"], w: Float[Tensor, "n k"], scale: Scale = 1.0, *,
                   out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 1: dense float weights, each -1, 0 or +1 (not checked here; the packers check)."""
    return _rowwise(sign_v1, x, w, scale, out, config, dense_dtypes=X_DTYPES)


def matmul_int8_v2(x: Float[Tensor, "*m k"], w: Int8[Tensor, "n k"], scale: Scale = 1.0, *,
                   out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 2: int8 weights."""
    return _rowwise(int8_v2, x, w, scale, out, config, dense_dtypes=(torch.int8,))


def matmul_2bit_v3(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                   out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 3: 2-bit weights decoded with shifts and masks."""
    return _rowwise(packed2_v3, x, w, scale, out, config, fmt="2bit")


def gemv_2bit_matmul(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                     out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 3, built for M=1: 2-bit weights, wide tiles, the two-instruction decode, split-K.
    (Any M works; each row of x re-reads the weights.)"""
    return _rowwise(gemv_2bit, x, w, scale, out, config, fmt="2bit", split=True)


def gemv_base3_matmul(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                      out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 5, built for M=1: base-3 (1.6-bit) weights."""
    return _rowwise(gemv_base3, x, w, scale, out, config, fmt="base3", split=True)


def block_m_for(m: int) -> int:
    """Rows of x a tl.dot program covers: at least 16 (the MMA's smallest), at most 128."""
    return min(128, max(16, triton.next_power_of_2(m)))


_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _dot_types(x_dtype: torch.dtype) -> tuple:
    """(operand dtype, input_precision) of the tl.dot kernels. Weights are exact in any of them.
    float32 x: "ieee", not TF32, which would round x. The interpreter of Triton 3.9 computes bf16
    tl.dot wrongly, so there bf16 operands are widened to float32 (exactly; only on the CPU)."""
    if x_dtype == torch.float32 or (x_dtype == torch.bfloat16 and runtime.mode() == "interpreter"):
        return tl.float32, "ieee"
    return _TL_DTYPES[x_dtype], "tf32"  # the precision argument only matters for float32 operands


def _dotwise(kernels: tuple, x: Any, w: Any, scale: Scale, out: Optional[Tensor], config: Optional[dict],
             fmt: str, x_dtypes: tuple = X_DTYPES, x_scale: Optional[Tensor] = None, x_name: str = "x"):
    """Launch a tl.dot kernel: the program grid is (N blocks, K slices, M blocks)."""
    x2, vector = _check_x(x, _x_k(w), dtypes=x_dtypes, name=x_name)
    m, k = x2.shape
    w = _check_packed(w, fmt, k, x2)
    s, s_stride = _check_scale(scale, w.n, x2)
    z = _prepare_out(out, m, w.n, x2)
    block_m = block_m_for(m)
    meta = {"BLOCK_M": block_m}
    if x_scale is None:
        meta["DOT_DTYPE"], meta["DOT_PRECISION"] = _dot_types(x2.dtype)
        head = (x2, w.data, z, s) + ((base3_table(str(x2.device)),) if fmt == "base3" else ())
    else:
        head = (x2, w.data, z, s, x_scale)
    args = head + (m, w.n, k, w.data.shape[1], x2.stride(0), w.data.stride(0), z.stride(0), s_stride)
    grid = lambda meta: (triton.cdiv(w.n, meta["BLOCK_N"]), meta["SPLIT_K"], triton.cdiv(m, block_m))  # noqa: E731
    kernel = kernels[0] if block_m <= 32 else kernels[1]
    _launch(kernel, grid, args, config, meta)
    return z[0] if vector else z


def dot_2bit_matmul(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                    out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 4: 2-bit weights decoded in registers and multiplied with ``tl.dot`` (for M > 1)."""
    return _dotwise((dot_2bit_few, dot_2bit_many), x, w, scale, out, config, "2bit")


def dot_base3_matmul(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                     out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 5: base-3 (1.6-bit) weights with ``tl.dot`` (for M > 1)."""
    return _dotwise((dot_base3_few, dot_base3_many), x, w, scale, out, config, "base3")


def w2a8_matmul(xq: Int8[Tensor, "*m k"], x_scale: Float[Tensor, " m"], w: PackedTernary, scale: Scale = 1.0, *,
                out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 6: ``z = (xq @ W.T) / (x_scale[:, None] * scale)`` with int8 activations (from
    :func:`quantize_activations`), 2-bit weights and exact int32 sums on the tensor cores."""
    m = xq.shape[0] if isinstance(xq, Tensor) and xq.ndim == 2 else 1
    if not isinstance(x_scale, Tensor) or x_scale.dtype != torch.float32:
        got = getattr(x_scale, "dtype", type(x_scale).__name__)
        raise TypeError(f"x_scale must be a float32 torch.Tensor, got {got}")
    if x_scale.shape != (m,) or not x_scale.is_contiguous():
        raise ValueError(f"x_scale must be a contiguous ({m},) tensor, one scale per row of xq; "
                         f"got shape {tuple(x_scale.shape)}")
    _check_device(x_scale, "x_scale")
    return _dotwise((w2a8_dot_few, w2a8_dot_many), xq, w, scale, out, config, "2bit", x_dtypes=(torch.int8,),
                    x_scale=x_scale, x_name="xq")


class _SplitWorkspace:
    """Split-K scratch on one device (steps 7 and 8 each have their own): float32 partial sums (step 7
    keeps them all zeros between launches) and one arrival counter per output tile (zeros too). The
    last slice of a tile to arrive restores them, so the workspace is allocated and zeroed once, not
    every call. Launches that share it must not overlap: one stream at a time, like a cuBLAS workspace."""

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


SPLIT_WORKSPACE = _SplitWorkspace()


MMA_X_DTYPES = (torch.bfloat16, torch.float16)


def _mma_types(x_dtype: torch.dtype) -> tuple:
    """(MAGIC, DOT_DTYPE, DOT_PRECISION) of step 7: the 16-bit float the weights are decoded in (x's
    type), the operand type of tl.dot and its precision. On the GPU the operands are x's type, on the
    tensor cores, exact for weights of -1, 0, +1. The interpreter computes the decode and the dot in
    float32 (its bf16 arithmetic is wrong), from the same bits."""
    magic = _TL_DTYPES[x_dtype]
    if runtime.mode() == "interpreter":
        return magic, tl.float32, "ieee"
    return magic, magic, "tf32"  # the precision argument only matters for float32 operands


def mma_block_m(m: int) -> int:
    """Rows of x a step-7 program covers for M <= 32: 16 or 32 (above, the configs choose 64 or 128)."""
    return min(128, max(16, triton.next_power_of_2(m)))


def mma_2bit_matmul(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                    out: Optional[Tensor] = None, config: Optional[dict] = None) -> Float[Tensor, "*m n"]:
    """Step 7: weights in the MMA-order 2-bit format (``PackedTernary.pack(w, "2bit_mma")``), decoded
    two at a time into the tensor cores' operand; one kernel for M = 1 and for batches. x is bf16 or
    fp16, the types the tensor cores multiply exactly (float32 x: :func:`dot_2bit_matmul`)."""
    x2, vector = _check_x(x, _x_k(w), dtypes=MMA_X_DTYPES)
    m, k = x2.shape
    w = _check_packed(w, "2bit_mma", k, x2)
    s, s_stride = _check_scale(scale, w.n, x2)
    z = _prepare_out(out, m, w.n, x2)
    sums, counts = SPLIT_WORKSPACE.get(x2.device, m, w.n)
    few = mma_block_m(m) <= 32
    magic, dot_dtype, precision = _mma_types(x2.dtype)
    meta = {"MAGIC": magic, "DOT_DTYPE": dot_dtype, "DOT_PRECISION": precision}
    if (config is None and few) or (config is not None and "BLOCK_M" not in config):
        meta["BLOCK_M"] = mma_block_m(m)  # (the many-rows configs choose their own)
    args = (x2, w.data, z, s, sums, counts, m, w.n, k, w.data.shape[1], x2.stride(0), w.data.stride(0),
            z.stride(0), s_stride)

    def grid(meta):
        return triton.cdiv(w.n, meta["BLOCK_N"]), meta["SPLIT_K"], triton.cdiv(m, meta["BLOCK_M"])

    kernel = mma_2bit_few if few else mma_2bit_many
    _launch(kernel, grid, args, config, meta, zero_output=False)
    return z[0] if vector else z


# ----------------------------------------------------------------------------------------------
# Step 8: the same layout and decode in CUDA C++ (studylog/csrc/ternary_mma.cu), on mma.sync
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CudaMmaConfig:
    """A launch of step 8: ``row_tiles`` tiles of 16 weight rows a warp, ``warps`` a block, ``stages``
    groups of 256 weights a row in flight per thread, and K cut into ``slices`` (grid.y; more when
    a slice of x would not fit in shared memory)."""

    row_tiles: int = 2
    stages: int = 2
    warps: int = 8
    slices: int = 1

    def __post_init__(self):
        if self.row_tiles not in (1, 2) or self.stages != 2:
            raise ValueError(f"row_tiles must be 1 or 2 and stages 2 (the compiled instances), "
                             f"got {self.row_tiles}, {self.stages}")
        if self.warps not in (1, 2, 4, 8) or isinstance(self.slices, bool) or not isinstance(self.slices, int) \
                or self.slices < 1:
            raise ValueError(f"warps must be 1, 2, 4 or 8 and slices a positive int, got {self.warps}, {self.slices}")

    @property
    def rows(self) -> int:
        """Weight rows a block covers."""
        return 16 * self.row_tiles * self.warps


def _cuda_mma_instance(bf16: bool, col_tiles: int, row_tiles: int, stages: int) -> str:
    return f"ternary_mma<{'true' if bf16 else 'false'}, {col_tiles}, {row_tiles}, {stages}>"


#: The instances step 8 launches: bf16 and fp16 x, 8 or 16 rows of x a block, 1 or 2 row tiles a warp,
#: 2 groups in flight. (On the H200, 4 in flight was never faster: more registers, fewer warps.)
CUDA_MMA_INSTANCES = tuple(_cuda_mma_instance(b, mt, rt, 2) for b in (True, False) for mt in (1, 2) for rt in (1, 2))
CUDA_MMA_SIGNATURE = ["ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "i32", "i32", "i32", "i32", "i32", "i32", "i32"]
cuda.declare_instances("ternary_mma", CUDA_MMA_INSTANCES)


@functools.lru_cache(maxsize=None)
def _cuda_mma_kernel(name: str, device_index: int, instances: tuple) -> "cuda.CudaKernel":
    # Looked up once: compiling, loading and finding a kernel cost far more than the launch itself
    # (tens of microseconds, which would show up in the timings of a 5-microsecond kernel).
    module = cuda.load("ternary_mma", name_expressions=instances, device=device_index)
    return module.kernel(name, CUDA_MMA_SIGNATURE)


def cuda_mma_config(m: int, n: int, k: int, sms: Optional[int] = None) -> CudaMmaConfig:
    """Step 8's launch for an (M, N, K) problem, from a sweep on the H200 (the notebook shows it).
    One row of x: blocks of 8 warps x 2 row tiles (256 rows of W), and K cut until there are about
    two blocks per SM (at most 8 slices on 132 SMs: 4096 rows make 16 row blocks, 8 slices). More
    rows of x: one row tile a warp (the MMAs double, registers too), and K cut as far as the copy of
    x in shared memory needs."""
    sms = sms or runtime.sm_count()
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    if m <= 8:
        row_blocks = triton.cdiv(n, 256)
        slices = round(2 * sms / max(row_blocks, 32))  # about 2 blocks a SM; 8 slices at most on 132 SMs
        return CudaMmaConfig(row_tiles=2, stages=2, warps=8, slices=max(1, min(groups, slices)))
    return CudaMmaConfig(row_tiles=1, stages=2, warps=8, slices=1)


#: Shared memory a block of step 8 may take for its copy of x (the most without opting in).
CUDA_MMA_SMEM_LIMIT = 48 * 1024


def cuda_mma_smem_bytes(x_rows: int, groups_per_slice: int) -> int:
    """Shared memory of a step-8 block: x_rows rows of x over one slice of K, 64 bytes of padding a row."""
    return x_rows * (groups_per_slice * 32 + 4) * 16


def cuda_mma_max_groups_per_slice(x_rows: int) -> int:
    """The longest slice of K (in groups of 256) whose copy of x fits CUDA_MMA_SMEM_LIMIT."""
    return max(1, (CUDA_MMA_SMEM_LIMIT // (16 * x_rows) - 4) // 32)


CUDA_WORKSPACE = _SplitWorkspace()  # not step 7's: its sums must stay zeros, these need not


def _cuda_call_args(x: Any, w: Any, scale: Any, out: Optional[Tensor], config: Any, config_type: type,
                    what: str) -> tuple:
    """Checks shared by steps 8 and 9 (on the CPU too, before the GPU is asked for), then x in rows
    that start on 16-byte boundaries: (x2, vector, w, scale tensor, its stride, z)."""
    x2, vector = _check_x(x, _x_k(w), dtypes=MMA_X_DTYPES)
    m, k = x2.shape
    w = _check_packed(w, "2bit_tiles", k, x2)
    if w.data.data_ptr() % 16:
        raise ValueError("w.data must start on a 16-byte boundary (the kernel loads 16 bytes at a time)")
    s, s_stride = _check_scale(scale, w.n, x2)
    z = _prepare_out(out, m, w.n, x2)
    if config is not None and type(config) is not config_type:  # (a W2A8Config is a BulkConfig too)
        raise TypeError(f"config must be a {config_type.__name__}, got {type(config).__name__}")
    runtime.require_gpu(what)
    return _aligned_rows(x2), vector, w, s, s_stride, z


def _aligned_rows(x2: Tensor) -> Tensor:
    """x2, or a zero-padded copy whose rows start on 16-byte boundaries: the kernels load x 16 bytes
    at a time."""
    if x2.data_ptr() % 16 == 0 and (x2.stride(0) * x2.element_size()) % 16 == 0:
        return x2
    m, k = x2.shape
    padded = torch.zeros(m, triton.cdiv(k, 8) * 8, dtype=x2.dtype, device=x2.device)
    padded[:, :k] = x2
    return padded


def cuda_mma_matmul(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                    out: Optional[Tensor] = None, config: Optional[CudaMmaConfig] = None) -> Float[Tensor, "*m n"]:
    """Step 8: step 7's words and decode in CUDA C++ on ``mma.sync`` (GPU only), weights in the
    ``2bit_tiles`` format (``PackedTernary.pack(w, "2bit_tiles")``). Built for few rows
    of x (M <= 16 a block; larger M runs, re-decoding the weights once per 16 rows of x)."""
    x2, vector, w, s, s_stride, z = _cuda_call_args(x, w, scale, out, config, CudaMmaConfig,
                                                    "step 8 (CUDA C++ ternary_mma)")
    m, k = x2.shape
    cfg = config or cuda_mma_config(m, w.n, k)
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    col_tiles = 1 if m <= 8 else 2
    per_slice = min(triton.cdiv(groups, cfg.slices), cuda_mma_max_groups_per_slice(min(m, 8 * col_tiles)))
    slices = triton.cdiv(groups, per_slice)  # (more slices than asked when x's slice would not fit)
    grid = (triton.cdiv(w.n, cfg.rows), slices, triton.cdiv(m, 8 * col_tiles))
    sums, counts = CUDA_WORKSPACE.get(x2.device, slices * m, w.n) if slices > 1 else (None, None)
    name = _cuda_mma_instance(x2.dtype == torch.bfloat16, col_tiles, cfg.row_tiles, cfg.stages)
    kernel = _cuda_mma_kernel(name, x2.device.index or 0, CUDA_MMA_INSTANCES)
    kernel(grid, (32 * cfg.warps,), x2, w.data, z, s, sums, counts, m, w.n, k, groups, x2.stride(0), s_stride,
           per_slice, shared_mem=cuda_mma_smem_bytes(min(m, 8 * col_tiles), per_slice))
    return z[0] if vector else z


# ----------------------------------------------------------------------------------------------
# Step 9: step 8's decode and MMAs, the weights brought into shared memory by the TMA
# (studylog/csrc/ternary_bulk.cu)
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BulkConfig:
    """A launch of step 9: a block owns ``row_tiles`` tiles of 16 weight rows and its ``warps``
    consumer warps (plus one producer warp) split the block's K among themselves; the producer keeps
    ``stages`` stages of ``chunk`` groups (1 KiB each) per warp and tile in flight. ``slices`` cuts
    K across blocks too (grid.y; more when a block's x would not fit in shared memory)."""

    row_tiles: int = 1
    warps: int = 8
    stages: int = 4
    chunk: int = 1
    slices: int = 1

    def __post_init__(self):
        if (self.row_tiles, self.stages, self.chunk) not in self.compiled_shapes():
            raise ValueError(f"(row_tiles, stages, chunk) must be one of the compiled {self.compiled_shapes()}, "
                             f"got {(self.row_tiles, self.stages, self.chunk)}")
        if self.warps not in (1, 2, 4, 8, 16) or isinstance(self.slices, bool) or not isinstance(self.slices, int) \
                or self.slices < 1:
            raise ValueError(f"warps must be 1, 2, 4, 8 or 16 and slices a positive int, got {self.warps}, "
                             f"{self.slices}")

    @staticmethod
    def compiled_shapes() -> tuple:
        return BULK_SHAPES

    @property
    def rows(self) -> int:
        """Weight rows a block covers."""
        return 16 * self.row_tiles

    @property
    def stage_bytes(self) -> int:
        """Bytes of weights one stage holds."""
        return 1024 * self.warps * self.row_tiles * self.chunk


#: (row_tiles, stages, chunk) of the compiled step-9 instances (with CHUNK = 4 or 8, or RT = 2 and
#: CHUNK = 4, ptxas spills; 8 stages were never faster than 4 on the H200, but 8 of CHUNK 1 are kept
#: for the sweep in the notebook).
BULK_SHAPES = ((1, 4, 1), (1, 8, 1), (1, 4, 2), (1, 8, 2), (2, 4, 1), (2, 4, 2))


def _bulk_instance(bf16: bool, col_tiles: int, row_tiles: int, stages: int, chunk: int) -> str:
    return f"ternary_bulk<{'true' if bf16 else 'false'}, {col_tiles}, {row_tiles}, {stages}, {chunk}>"


BULK_INSTANCES = tuple(_bulk_instance(b, mt, *shape) for b in (True, False) for mt in (1, 2) for shape in BULK_SHAPES)
cuda.declare_instances("ternary_bulk", BULK_INSTANCES)

#: Dynamic shared memory of a step-9 block: its mbarriers, the stages and x (the H100/H200 allow 227 KiB
#: a block, static shared memory included; finish_split has a little).
BULK_SMEM_LIMIT = 224 * 1024
BULK_BARRIER_BYTES = 512  # RING_BARRIER_BYTES in ternary_ring.cuh


def bulk_smem_bytes(cfg: BulkConfig, x_rows: int, groups_per_slice: int) -> int:
    return BULK_BARRIER_BYTES + cfg.stages * cfg.stage_bytes + cuda_mma_smem_bytes(x_rows, groups_per_slice)


def bulk_max_groups_per_slice(cfg: BulkConfig, x_rows: int) -> int:
    """The longest slice of K (in groups of 256) whose copy of x fits beside the stages."""
    room = BULK_SMEM_LIMIT - BULK_BARRIER_BYTES - cfg.stages * cfg.stage_bytes
    return max(1, (room // (16 * x_rows) - 4) // 32)


@functools.lru_cache(maxsize=None)
def _bulk_kernel(name: str, device_index: int, instances: tuple, options: tuple = ()) -> "cuda.CudaKernel":
    module = cuda.load("ternary_bulk", name_expressions=instances, device=device_index, options=options)
    kernel = module.kernel(name, CUDA_MMA_SIGNATURE)
    kernel.set_max_dynamic_shared_memory(BULK_SMEM_LIMIT)
    return kernel


def bulk_config(m: int, n: int, k: int, sms: Optional[int] = None) -> BulkConfig:
    """Step 9's launch for an (M, N, K) problem, from a sweep on the H200 (4096 x 14336, 8192 x 28672,
    14336 x 4096, M = 1 and 16): 4 stages of 1 group a warp and tile. One tile of 16 rows a block,
    with 8 warps for a long K and 4 for K <= 8192; two tiles and 4 warps a block when there are more
    than two tiles an SM and K is long (8192 x 28672: fewer blocks, each copying x once for two
    tiles). Above 8 rows of x, two tiles and 8 warps."""
    sms = sms or runtime.sm_count()
    tiles = triton.cdiv(n, 16)
    if m > 8:
        return BulkConfig(row_tiles=2, warps=8, stages=4, chunk=1, slices=1)
    if tiles > 2 * sms and k > 8192:
        return BulkConfig(row_tiles=2, warps=4, stages=4, chunk=1, slices=1)
    return BulkConfig(row_tiles=1, warps=8 if k > 8192 else 4, stages=4, chunk=1, slices=1)


def bulk_matmul(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                out: Optional[Tensor] = None, config: Optional[BulkConfig] = None) -> Float[Tensor, "*m n"]:
    """Step 9: step 8 with the weights copied into shared memory by the TMA (``cp.async.bulk``, a
    producer warp and mbarriers; Hopper GPUs and later), weights in the ``2bit_tiles`` format."""
    x2, vector, w, s, s_stride, z = _cuda_call_args(x, w, scale, out, config, BulkConfig,
                                                    "step 9 (CUDA C++ ternary_bulk)")
    m, k = x2.shape
    if torch.cuda.get_device_capability(x2.device)[0] < 9:
        raise RuntimeError("step 9 uses the Tensor Memory Accelerator (cp.async.bulk): it needs a Hopper GPU "
                           f"or later (compute capability 9.0+), not {torch.cuda.get_device_name(x2.device)}")
    cfg = config or bulk_config(m, w.n, k)
    _launch_bulk(_pad_k_to_8(x2), w, s, s_stride, z, cfg, probe=0)
    return z[0] if vector else z


def _pad_k_to_8(x2: Tensor) -> Tensor:
    """The copy engine moves x in 16-byte pieces: rows padded with zeros to a multiple of 8."""
    m, k = x2.shape
    if k % 8 == 0:
        return x2
    padded = torch.zeros(m, triton.cdiv(k, 8) * 8, dtype=x2.dtype, device=x2.device)
    padded[:, :k] = x2
    return padded


#: What each BULK_PROBE build of step 9 keeps (the benchmark times them to show what limits it).
BULK_PROBES = {1: "copies only", 2: "arithmetic only", 3: "launch only"}


def bulk_probe(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale, probe: int, *,
               config: Optional[BulkConfig] = None) -> Callable[[], Tensor]:
    """A step-9 launch with parts left out (``BULK_PROBES``), as a function to time: 1 keeps the
    copies and drops the arithmetic, 2 the reverse (on whatever shared memory holds), 3 returns at
    once. Its output means nothing; the time says what the full kernel pays for each part."""
    if probe not in BULK_PROBES:
        raise ValueError(f"probe must be one of {sorted(BULK_PROBES)} ({BULK_PROBES}), got {probe!r}")
    x2, _, w, s, s_stride, z = _cuda_call_args(x, w, scale, None, config, BulkConfig, "a step-9 probe")
    cfg = config or bulk_config(x2.shape[0], w.n, x2.shape[1])
    x2 = _pad_k_to_8(x2)
    return lambda: _launch_bulk(x2, w, s, s_stride, z, cfg, probe=probe)


def _launch_bulk(x2: Tensor, w: PackedTernary, s: Tensor, s_stride: int, z: Tensor, cfg: BulkConfig,
                 probe: int) -> Tensor:
    """Launch step 9 on checked arguments; ``probe`` > 0 launches one of the .cu's BULK_PROBE builds."""
    m, k = x2.shape
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    col_tiles = 1 if m <= 8 else 2
    x_rows = min(m, 8 * col_tiles)
    if BULK_BARRIER_BYTES + cfg.stages * cfg.stage_bytes + cuda_mma_smem_bytes(x_rows, 1) > BULK_SMEM_LIMIT:
        raise ValueError(f"{cfg}: its stages ({cfg.stages} x {cfg.stage_bytes} bytes) leave no room for x in "
                         f"{BULK_SMEM_LIMIT} bytes of shared memory")
    if cfg.warps > 8 and cfg.row_tiles * col_tiles > 1:
        raise ValueError(f"{cfg}: more than 8 warps a block only with one tile of W and 8 rows of x or fewer "
                         f"(the kernel's launch bounds); this call has {cfg.row_tiles} row tiles and M = {m}")
    per_slice = min(triton.cdiv(groups, cfg.slices), bulk_max_groups_per_slice(cfg, x_rows))
    slices = triton.cdiv(groups, per_slice)
    grid = (triton.cdiv(w.n, cfg.rows), slices, triton.cdiv(m, 8 * col_tiles))
    sums, counts = CUDA_WORKSPACE.get(x2.device, slices * m, w.n) if slices > 1 else (None, None)
    name = _bulk_instance(x2.dtype == torch.bfloat16, col_tiles, cfg.row_tiles, cfg.stages, cfg.chunk)
    options = (f"-DBULK_PROBE={probe}",) if probe else ()
    kernel = _bulk_kernel(name, x2.device.index or 0, (name,) if probe else BULK_INSTANCES, options)
    kernel(grid, (32 * (cfg.warps + 1),), x2, w.data, z, s, sums, counts, m, w.n, k, groups, x2.stride(0),
           s_stride, per_slice, shared_mem=bulk_smem_bytes(cfg, x_rows, per_slice))
    return z



# ----------------------------------------------------------------------------------------------
# Step 10: W2A8 in CUDA C++ (studylog/csrc/ternary_w2a8.cu): x quantised to int8 by a small kernel,
# then step 9's plumbing with the int8 MMA, one AND per 4 weights
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class W2A8Config(BulkConfig):
    """A launch of step 10: as :class:`BulkConfig` (step 9's blocks, warps, stages and slices), from
    step 10's compiled shapes. ``cluster`` (quantize="cluster" only): blocks a thread block cluster,
    which share the quantisation of x."""

    cluster: int = 1

    def __post_init__(self):
        super().__post_init__()
        if self.cluster not in (1, 2, 4, 8):
            raise ValueError(f"cluster must be 1, 2, 4 or 8 blocks, got {self.cluster!r}")

    @staticmethod
    def compiled_shapes() -> tuple:
        return W2A8_SHAPES + tuple(s for s in W2A8_STAGED_SHAPES if s not in W2A8_SHAPES)


#: (row_tiles, stages, chunk) of the compiled step-10 instances.
W2A8_SHAPES = ((1, 4, 1), (2, 4, 1), (4, 4, 1), (1, 4, 2), (2, 4, 2), (1, 8, 1))
#: (row_tiles, stages, chunk) of the compiled "staged" instances: deeper rings where shared memory allows
#: (two blocks an SM of 1 tile and 8 stages, or of 2 tiles and 3 stages, with 8 warps and K = 14336 / 28672;
#: one block an SM of 2 tiles and 8 stages, or of 4 tiles and 5).
W2A8_STAGED_SHAPES = ((1, 4, 1), (1, 8, 1), (2, 3, 1), (2, 4, 1), (4, 4, 1), (2, 8, 1), (4, 5, 1))


#: Where step 10 quantises x (QUANT in ternary_w2a8.cu): in every block of the matmul (the default where
#: it fits: up to 8 rows of x, all of K in shared memory), from global memory or ("staged") from a copy
#: the copy engine brought into shared memory ahead of the weights; once, in the first block of the
#: matmul; in a thread block cluster; or in a kernel of its own before it (quantize_x, the matmul launched
#: early; the default elsewhere).
W2A8_QUANTIZE = {"first block": 2, "every block": 1, "separate": 0, "cluster": 3, "staged": 4, "per warp": 5}
#: (row_tiles, stages, chunk) of the compiled "per warp" instances (one row of x, staged; each warp quantises
#: the groups it takes): the staged launches w2a8_config picks.
W2A8_PER_WARP_SHAPES = ((1, 4, 1), (2, 4, 1), (4, 4, 1))
#: (row_tiles, stages, chunk) of the compiled "cluster" instances.
W2A8_CLUSTER_SHAPES = ((1, 4, 1), (2, 4, 1))
#: Blocks a cluster shares x's quantisation among (quantize="cluster"; fewer where they do not divide the
#: blocks).
W2A8_CLUSTER = 4


def _w2a8_instance(quant: int, bf16: bool, col_tiles: int, row_tiles: int, stages: int, chunk: int) -> str:
    b = lambda v: "true" if v else "false"
    return f"ternary_w2a8<{quant}, {b(bf16)}, {col_tiles}, {row_tiles}, {stages}, {chunk}>"


W2A8_QUANTIZE_INSTANCES = ("quantize_x<true>", "quantize_x<false>")
#: After quantize_x: 8 or 16 rows of x a block (16 only with 1 or 2 row tiles: 4 spill), x's type no
#: longer matters. Quantised in the matmul: 8 rows of x a block, bf16 or fp16.
W2A8_INSTANCES = tuple(_w2a8_instance(0, True, mt, *shape) for mt in (1, 2) for shape in W2A8_SHAPES
                       if mt == 1 or shape[0] <= 2) + \
    tuple(_w2a8_instance(q, bf16, 1, *shape) for q in (1, 2) for bf16 in (True, False) for shape in W2A8_SHAPES) + \
    tuple(_w2a8_instance(3, bf16, 1, *shape) for bf16 in (True, False) for shape in W2A8_CLUSTER_SHAPES) + \
    tuple(_w2a8_instance(4, bf16, 1, *shape) for bf16 in (True, False) for shape in W2A8_STAGED_SHAPES) + \
    tuple(_w2a8_instance(5, bf16, 1, *shape) for bf16 in (True, False) for shape in W2A8_PER_WARP_SHAPES)
cuda.declare_instances("ternary_w2a8", W2A8_QUANTIZE_INSTANCES + W2A8_INSTANCES)
W2A8_SIGNATURE = ["ptr"] * 10 + ["i32"] * 8
W2A8_QUANTIZE_SIGNATURE = ["ptr"] * 4 + ["i32"] * 3
#: The longest K step 10 takes: its int32 sums and their float32 conversion stay exact below it
#: (|sum_k x_k w_k| <= 128 K <= 2^24).
W2A8_MAX_K = 1 << 17


def w2a8_x_order(k: int, device=None) -> Int64[Tensor, " kp"]:
    """The order in which step 10 keeps a row of quantised x: byte ``b`` of a row (K padded to a
    multiple of 256) holds ``x[order[b]]``. In each group of 256, byte ``64 p + 16 t + 4 i + j``
    is the activation that meets code ``p`` of byte ``j`` of word ``4 t + i`` of a weight row in the
    int8 MMA (the order comment in ternary_w2a8.cu): B register ``i`` of the lanes ``4 g + t``."""
    b = torch.arange(triton.cdiv(k, GROUP_WEIGHTS_2BIT) * GROUP_WEIGHTS_2BIT, device=device)
    within = b % 256
    p, t, i, j = within >> 6, (within >> 4) & 3, (within >> 2) & 3, within & 3
    return b - within + 32 * p + 2 * (4 * t + i) + 128 * (j & 1) + (j >> 1)


def w2a8_smem_bytes(cfg: Union[BulkConfig, "W2A8TilesConfig"], x_rows: int, groups_per_slice: int,
                    staged: bool = False, per_warp: bool = False) -> int:
    """Dynamic shared memory of a step-10 or step-11 block: mbarriers, stages and its int8 x (``staged``:
    room for its rows of 16-bit x, 512 bytes a group, which the int8 bytes then overwrite; ``per_warp``: one
    row of 16-bit x, then its int8 bytes, 256 a group)."""
    if per_warp:
        x_bytes = groups_per_slice * (512 + 256)
    else:
        x_bytes = x_rows * groups_per_slice * 512 if staged else x_rows * (groups_per_slice * 256 + 64)
    return BULK_BARRIER_BYTES + cfg.stages * cfg.stage_bytes + x_bytes


#: "staged" quantises a row with every activation in registers (8 units of 16 a consumer thread) before it
#: writes a byte over the row it read: groups of 256 a row, at most, per consumer warp.
W2A8_STAGED_GROUPS_PER_WARP = 16


def w2a8_max_groups_per_slice(cfg: Union[BulkConfig, "W2A8TilesConfig"], x_rows: int) -> int:
    """The longest slice of K (in groups of 256) whose int8 x fits beside the stages."""
    room = BULK_SMEM_LIMIT - BULK_BARRIER_BYTES - cfg.stages * cfg.stage_bytes
    return max(1, (room // x_rows - 64) // 256)


@functools.lru_cache(maxsize=None)
def _w2a8_kernels(device_index: int, options: tuple = ()) -> tuple:
    module = cuda.load("ternary_w2a8", name_expressions=W2A8_QUANTIZE_INSTANCES + W2A8_INSTANCES + W2A8_TILES_INSTANCES,
                       device=device_index, options=options)
    quantize = {bf16: module.kernel(f"quantize_x<{'true' if bf16 else 'false'}>", W2A8_QUANTIZE_SIGNATURE)
                for bf16 in (True, False)}
    kernels = {}
    for name in W2A8_INSTANCES + W2A8_TILES_INSTANCES:
        kernels[name] = module.kernel(name, W2A8_TILES_SIGNATURE if name in W2A8_TILES_INSTANCES else W2A8_SIGNATURE)
        kernels[name].set_max_dynamic_shared_memory(BULK_SMEM_LIMIT)
    return quantize, kernels


#: Shared memory of one SM of the H100/H200 (blocks on an SM share it; each block also takes 1 KiB).
SM_SMEM_BYTES = 228 * 1024


def w2a8_config(m: int, n: int, k: int, sms: Optional[int] = None, quantize: Optional[str] = None) -> W2A8Config:
    """Step 10's launch for an (M, N, K) problem, from sweeps on the H200 (the seven bench shapes at
    M = 1): 4 stages of 1 group a warp and tile. Quantising x in every block (the default up to 8 rows
    of x): one tile a block and 8 warps while there are at most two tiles an SM (every block then
    shares in reading x), else two tiles a block and 8 warps for a long K (4 for K <= 8192). After
    quantize_x: the fewest tiles a block that let every block run at once (one wave), 8 warps for a
    long K (4 for K <= 8192); above 8 rows of x, 2 tiles and 8 warps."""
    sms = sms or runtime.sm_count()
    long_k = k > 8192
    if m > 8:
        return W2A8Config(row_tiles=2, warps=8, stages=4, chunk=1, slices=1)
    tiles, groups = triton.cdiv(n, 16), triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    quantize = quantize or w2a8_default_quantize(m, n, k, sms)
    if quantize in ("staged", "per warp"):
        # every block's launch, but one block an SM with the fewest row tiles a block that give at least 3/4
        # of the SMs a block where there is one (the H100 sweep's fastest at 4096 x 14336 and 8192 x 28672;
        # deeper rings were no faster)
        every = w2a8_config(m, n, k, sms, quantize="every block")
        for rt in (1, 2, 4):
            cfg = replace(every, row_tiles=rt)
            if 3 * sms <= 4 * triton.cdiv(tiles, rt) <= 4 * sms and \
                    w2a8_smem_bytes(cfg, m, groups, staged=True) <= BULK_SMEM_LIMIT:
                return cfg
        return every
    if quantize in ("every block", "cluster"):
        few = tiles <= 2 * sms
        rt = 1 if few else 2
        blocks = triton.cdiv(tiles, rt)
        cluster = next(c for c in (W2A8_CLUSTER, 2, 1) if blocks % c == 0) if quantize == "cluster" else 1
        return W2A8Config(row_tiles=rt, warps=8 if few or long_k else 4, stages=4, chunk=1, slices=1,
                          cluster=cluster)
    warps = 8 if long_k else 4
    for rt in (1, 2, 4):
        cfg = W2A8Config(row_tiles=rt, warps=warps, stages=4, chunk=1, slices=1)
        if w2a8_smem_bytes(cfg, m, groups) <= BULK_SMEM_LIMIT and \
                triton.cdiv(tiles, rt) <= sms * w2a8_blocks_per_sm(cfg, m, groups):
            return cfg
    return W2A8Config(row_tiles=4, warps=warps, stages=4, chunk=1, slices=1)


def w2a8_blocks_per_sm(cfg: W2A8Config, x_rows: int, groups_per_slice: int) -> int:
    """Step-10 blocks one SM holds at once: by shared memory (each block also takes 1 KiB) and by
    registers (ptxas gives the kernels of 8 rows of x at most 96 a thread with one or two row tiles, 136
    with four: the launch bounds ask for two blocks an SM below four tiles; a test checks it)."""
    smem = SM_SMEM_BYTES // (w2a8_smem_bytes(cfg, x_rows, groups_per_slice) + 1024)
    registers = 65536 // ((96 if cfg.row_tiles <= 2 else 136) * 32 * (cfg.warps + 1))
    return min(smem, registers)


def w2a8_quantize(x: Float[Tensor, "*m k"]) -> tuple[Int8[Tensor, "m kp"], Float[Tensor, " m"], Int32[Tensor, " m"]]:
    """Step 10's quantisation kernel (quantize="separate") on (M, K) or (K,) bf16/fp16 x: (xq, x_scale,
    row_sum). xq is int8, (M, K padded to 256) in :func:`w2a8_x_order`; x_scale and xq are what
    :func:`quantize_activations` gives (bit for bit); row_sum is sum_k xq[m, k] (int32)."""
    x2, _ = _check_x(x, None, dtypes=MMA_X_DTYPES)
    runtime.require_gpu("step 10's quantisation (CUDA C++ quantize_x)")
    return _quantize_x(_aligned_rows(x2))


def _quantize_x(x2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """quantize_x on checked x (2-D, rows on 16-byte boundaries): the launch inside a step-10 call."""
    m, k = x2.shape
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    xq = torch.empty(m, groups * GROUP_WEIGHTS_2BIT, dtype=torch.int8, device=x2.device)
    x_scale = torch.empty(m, dtype=torch.float32, device=x2.device)
    row_sum = torch.empty(m, dtype=torch.int32, device=x2.device)
    quantize, _ = _w2a8_kernels(x2.device.index or 0)
    quantize[x2.dtype == torch.bfloat16]((m,), (1024,), x2, xq, x_scale, row_sum, k, x2.stride(0), groups)
    return xq, x_scale, row_sum


def w2a8_bulk_matmul(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                     out: Optional[Tensor] = None, config: Optional[W2A8Config] = None,
                     quantize: Optional[str] = None) -> Float[Tensor, "*m n"]:
    """Step 10 (W2A8, Hopper GPUs and later): ``z = (x_q @ W.T) / (x_scale[:, None] * scale)`` with
    ``x_q, x_scale = quantize_activations(x)`` computed on the GPU, then exact int32 sums of 2-bit
    weights (``2bit_tiles``) and int8 x on the tensor cores, fed by the TMA as in step 9. The product
    of BitNet b1.58's int8 activations: it differs from ``x @ W.T / scale`` by the activations'
    rounding (about 0.4% of |x| a row), not by the arithmetic.

    ``quantize`` (one of ``W2A8_QUANTIZE``; None: the fastest in the sweeps that applies, see
    :func:`w2a8_default_quantize`): "staged" (one launch; the copy engine brings every block's rows of x
    into its shared memory ahead of the weights, and the block quantises them there; up to 8 rows of x
    whose 16-bit rows fit beside the stages, K <= 4096 x warps; the default for one row of x), "every block"
    (one launch, every block quantises x itself from global memory; up to 8 rows of x whose whole K fits in
    shared memory; the default for 2 to 8), "cluster" (as "every block", but the blocks of a thread block cluster
    of ``config.cluster`` share the work: each quantises its part of x into the shared memory of all; a
    cluster launch, also of one block; slower than "every block" on the H200, notebook 05),
    "first block" (one launch; the first block quantises x for all while
    the others stream weights; up to 8 rows of x), or "separate" (quantize_x, then the matmul launched
    early; two launches from the host, back to back, and on a slow host the GPU waits for the second;
    the default elsewhere)."""
    return _w2a8_call(x, w, scale, out, config, probe=0, quantize=quantize)()


#: What each W2A8_PROBE build of step 10 keeps.
W2A8_PROBES = BULK_PROBES


def w2a8_bulk_probe(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale, probe: int, *,
                    config: Optional[W2A8Config] = None) -> Callable[[], Tensor]:
    """As :func:`bulk_probe`, for step 10's default launch (the quantisation of x is kept in full)."""
    if probe not in W2A8_PROBES:
        raise ValueError(f"probe must be one of {sorted(W2A8_PROBES)} ({W2A8_PROBES}), got {probe!r}")
    return _w2a8_call(x, w, scale, None, config, probe=probe)


def w2a8_default_quantize(m: int, n: int, k: int, sms: Optional[int] = None, staged: bool = True) -> str:
    """Where step 10 quantises x by default: for one row of x, in every block from a copy the copy
    engine stages ahead of the weights ("staged", where it fits; faster than "every block" at the Llama
    shapes of the sweeps, notebook 05); else (or with ``staged=False``) in every block where its launch fits
    shared memory (up to 8 rows of x), else in quantize_x."""
    if staged and m == 1 and _w2a8_plan_takes(m, n, k, "staged", sms=sms):
        return "staged"
    return "every block" if _w2a8_plan_takes(m, n, k, "every block", sms=sms) else "separate"


class _W2A8Workspace:
    """Per device: the int8 x, scales and row sums that the first block of step 10 writes for the
    others, and the flags it raises, one per 8 rows of x, with a new value (epoch) every call. Shared by
    the calls on a device, as CUDA_WORKSPACE is: calls on different streams at once would race."""

    def __init__(self):
        self._buffers: dict[tuple, tuple] = {}
        self._flags: dict[torch.device, Tensor] = {}
        self._epoch = 0

    def get(self, device: torch.device, m: int, groups: int, blocks: int) -> tuple:
        key = (device, m, groups)
        if key not in self._buffers:
            self._buffers[key] = (torch.zeros(m, groups * GROUP_WEIGHTS_2BIT, dtype=torch.int8, device=device),
                                  torch.zeros(m, dtype=torch.float32, device=device),
                                  torch.zeros(m, dtype=torch.int32, device=device))
        flags = self._flags.get(device)
        if flags is None or flags.numel() < blocks:
            flags = self._flags[device] = torch.zeros(max(blocks, 64), dtype=torch.int32, device=device)
        return self._buffers[key] + (flags,)

    def next_epoch(self) -> int:
        self._epoch = self._epoch % (2**31 - 1) + 1  # never 0, the flags' first value
        return self._epoch


W2A8_WORKSPACE = _W2A8Workspace()


@functools.lru_cache(maxsize=256)
def _w2a8_plan(m: int, n: int, k: int, bf16: bool, config: Optional[W2A8Config], quantize: Optional[str],
               sms: int) -> tuple:
    """Step 10's launch for one shape, checked once and kept (a call then only launches): (QUANT, config,
    groups a K slice, grid, instance name, dynamic shared memory)."""
    asked = quantize
    if quantize is None:
        quantize = w2a8_default_quantize(m, n, k, sms)
        if quantize == "staged" and config is not None and not _w2a8_plan_takes(m, n, k, "staged", config, sms):
            quantize = w2a8_default_quantize(m, n, k, sms, staged=False)  # the default, less staged
    quant = W2A8_QUANTIZE[quantize]
    if config is not None and config.cluster > 1 and quantize != "cluster":
        raise ValueError(f"{config}: a cluster of blocks shares only quantize='cluster', not {quantize!r}")
    if quant and m > 8:
        raise ValueError(f"quantize={quantize!r} quantises x in the matmul, at most 8 rows of x; M = {m}: "
                         f"use 'separate'")
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    col_tiles = 1 if m <= 8 else 2
    x_rows = min(m, 8 * col_tiles)
    cfg = config or w2a8_config(m, n, k, sms, quantize=quantize)
    if w2a8_smem_bytes(cfg, x_rows, 1) > BULK_SMEM_LIMIT:
        raise ValueError(f"{cfg}: its stages ({cfg.stages} x {cfg.stage_bytes} bytes) leave no room for x in "
                         f"{BULK_SMEM_LIMIT} bytes of shared memory")
    if cfg.warps > 8:
        raise ValueError(f"{cfg}: step 10 runs at most 8 consumer warps a block (its launch bounds)")
    fused, staged, per_warp = quant in (1, 3, 4, 5), quant in (4, 5), quant == 5
    if per_warp and m != 1:
        raise ValueError(f"quantize='per warp' takes one row of x, got M = {m}: use 'staged'")
    smem_x = w2a8_smem_bytes(cfg, x_rows, groups, staged, per_warp)
    if fused and smem_x > BULK_SMEM_LIMIT:
        what = f"quantize={quantize!r} needs all of K in shared memory, as 16-bit x," if staged else \
            "quantising in every block needs all of K in shared memory"
        raise ValueError(f"{cfg}: {what} beside the stages; M = {m}, K = {k} needs {smem_x} bytes, more than "
                         f"{BULK_SMEM_LIMIT}")
    if quant == 4 and groups > W2A8_STAGED_GROUPS_PER_WARP * cfg.warps:
        raise ValueError(f"{cfg}: quantize='staged' holds a row of x in its consumers' registers: K <= "
                         f"{W2A8_STAGED_GROUPS_PER_WARP * GROUP_WEIGHTS_2BIT * cfg.warps} with {cfg.warps} "
                         f"warps, got K = {k}")
    per_slice = groups if fused else min(triton.cdiv(groups, cfg.slices), w2a8_max_groups_per_slice(cfg, x_rows))
    grid = (triton.cdiv(n, cfg.rows), triton.cdiv(groups, per_slice), triton.cdiv(m, 8 * col_tiles))
    # (after quantize_x the matmul never sees x's type: one instance serves bf16 and fp16)
    name = _w2a8_instance(quant, bf16 or quant == 0, col_tiles, cfg.row_tiles, cfg.stages, cfg.chunk)
    for q, shapes in ((3, W2A8_CLUSTER_SHAPES), (4, W2A8_STAGED_SHAPES), (5, W2A8_PER_WARP_SHAPES)):
        if quant == q and (cfg.row_tiles, cfg.stages, cfg.chunk) not in shapes:
            raise ValueError(f"{cfg}: quantize={quantize!r} is compiled for (row_tiles, stages, chunk) in "
                             f"{shapes} only")
    if grid[0] % cfg.cluster:
        raise ValueError(f"{cfg}: a cluster of {cfg.cluster} blocks must divide the {grid[0]} blocks of weight rows")
    if name not in W2A8_INSTANCES:
        default = "" if asked else " (no quantize given: the default for this config)"
        raise ValueError(f"{cfg}: step 10 has no compiled instance for it with quantize={quantize!r}{default} and "
                         f"M = {m} ({name}); compiled: {W2A8_INSTANCES}")
    return quant, cfg, per_slice, grid, name, w2a8_smem_bytes(cfg, x_rows, per_slice, staged, per_warp)


def _w2a8_plan_takes(m: int, n: int, k: int, quantize: str, config: Optional[W2A8Config] = None,
                     sms: Optional[int] = None) -> bool:
    """Whether step 10 takes the problem with x quantised at ``quantize`` (bf16 x), with ``config`` (None: its
    own launch)."""
    try:
        _w2a8_plan(m, n, k, True, config, quantize, sms or runtime.sm_count())
        return True
    except ValueError:
        return False


def _w2a8_call(x: Any, w: Any, scale: Any, out: Optional[Tensor], config: Any, probe: int,
               early: bool = True, quantize: Optional[str] = None) -> Callable[[], Tensor]:
    """Checks of step 10 and its plan (_w2a8_plan); returns the call as a function. ``early=False`` launches the
    matmul of "separate" only once quantize_x has finished (to measure what the early launch saves)."""
    x2, vector, w, s, s_stride, z = _cuda_call_args(x, w, scale, out, config, W2A8Config,
                                                    "step 10 (CUDA C++ ternary_w2a8)")
    m, k = x2.shape
    if quantize is not None and quantize not in W2A8_QUANTIZE:
        raise ValueError(f"quantize must be one of {list(W2A8_QUANTIZE)} or None, got {quantize!r}")
    if k > W2A8_MAX_K:
        raise ValueError(f"step 10 takes K <= {W2A8_MAX_K} (its int32 sums stay exact below it), got K={k}")
    if torch.cuda.get_device_capability(x2.device)[0] < 9:
        raise RuntimeError("step 10 uses the Tensor Memory Accelerator (cp.async.bulk): it needs a Hopper GPU "
                           f"or later (compute capability 9.0+), not {torch.cuda.get_device_name(x2.device)}")
    quant, cfg, per_slice, grid, name, smem = _w2a8_plan(m, w.n, k, x2.dtype == torch.bfloat16, config, quantize,
                                                          runtime.sm_count())
    groups, slices = triton.cdiv(k, GROUP_WEIGHTS_2BIT), grid[1]
    sums, counts = CUDA_WORKSPACE.get(x2.device, slices * m, w.n) if slices > 1 else (None, None)
    partials = sums.view(torch.int32) if sums is not None else None
    kernel = _w2a8_kernels(x2.device.index or 0, (f"-DW2A8_PROBE={probe}",) if probe else ())[1][name]
    block = (32 * (cfg.warps + 1),)

    def call() -> Tensor:
        if quant == 0:
            xq, x_scale, row_sum = _quantize_x(x2)
            # launched early (programmatic dependent launch): its weights stream in while x is quantised
            kernel(grid, block, xq, None, w.data, z, s, x_scale, row_sum, partials, counts, None, m, w.n, k, groups,
                   x2.stride(0), s_stride, per_slice, 0, shared_mem=smem, early=early)
        elif quant in (1, 3, 4, 5):
            kernel(grid, block, None, x2, w.data, z, s, None, None, None, None, None, m, w.n, k, groups,
                   x2.stride(0), s_stride, per_slice, 0, shared_mem=smem, cluster=cfg.cluster if quant == 3 else None)
        else:
            xq, x_scale, row_sum, flags = W2A8_WORKSPACE.get(x2.device, m, groups, grid[2])
            kernel(grid, block, xq, x2, w.data, z, s, x_scale, row_sum, partials, counts, flags, m, w.n, k, groups,
                   x2.stride(0), s_stride, per_slice, W2A8_WORKSPACE.next_epoch(), shared_mem=smem)
        return z[0] if vector else z
    return call


# ----------------------------------------------------------------------------------------------
# Step 11: W2A8 for several rows of x, one tile of weights a warp (ternary_w2a8_tiles in
# studylog/csrc/ternary_w2a8.cu): a block covers 16 x warps weight rows over a slice of K
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class W2A8TilesConfig:
    """A launch of step 11: ``warps`` consumer warps (plus a producer), each owning ``tiles`` tiles of 16
    weight rows, so a block covers ``16 * warps * tiles`` rows; ``stages`` stages of ``chunk`` groups
    (1 KiB each) a tile in flight; ``slices`` cuts K across blocks (grid.y; more where a block's x would
    not fit)."""

    warps: int = 4
    tiles: int = 1
    stages: int = 4
    chunk: int = 2
    slices: int = 1

    def __post_init__(self):
        if self.warps not in (4, 8):
            raise ValueError(f"warps must be 4 or 8 (the compiled instances), got {self.warps!r}")
        if (self.tiles, self.stages, self.chunk) not in W2A8_TILES_SHAPES:
            raise ValueError(f"(tiles, stages, chunk) must be one of the compiled {W2A8_TILES_SHAPES}, got "
                             f"{(self.tiles, self.stages, self.chunk)}")
        if isinstance(self.slices, bool) or not isinstance(self.slices, int) or self.slices < 1:
            raise ValueError(f"slices must be a positive int, got {self.slices!r}")

    @property
    def rows(self) -> int:
        """Weight rows a block covers."""
        return 16 * self.warps * self.tiles

    @property
    def stage_bytes(self) -> int:
        """Bytes of weights one stage holds."""
        return 1024 * self.warps * self.tiles * self.chunk


#: (tiles a warp, stages, chunk) of the compiled step-11 instances, the preferred first.
W2A8_TILES_SHAPES = ((1, 4, 2), (1, 2, 8), (1, 4, 4), (2, 4, 2))  # (2 tiles of 16 rows of x in 4 KiB stages spill)


def _w2a8_tiles_instance(col_tiles: int, warps: int, tiles: int, stages: int, chunk: int) -> str:
    return f"ternary_w2a8_tiles<{col_tiles}, {warps}, {tiles}, {stages}, {chunk}>"


#: 8 or 16 rows of x a block (grid.z: more), 4 or 8 warps, each compiled shape.
W2A8_TILES_INSTANCES = tuple(_w2a8_tiles_instance(mt, warps, *shape) for mt in (1, 2) for warps in (4, 8)
                             for shape in W2A8_TILES_SHAPES)
cuda.declare_instances("ternary_w2a8", W2A8_TILES_INSTANCES)
W2A8_TILES_SIGNATURE = ["ptr"] * 8 + ["i32"] * 5


def w2a8_tiles_config(m: int, n: int, k: int, sms: Optional[int] = None) -> W2A8TilesConfig:
    """Step 11's launch for an (M, N, K) problem: 4 warps of one tile each (the H200 sweep's best at
    4096 x 14336, M = 1 and 16: two tiles a warp were slower), and of the compiled shapes the first (in
    W2A8_TILES_SHAPES' order) that needs the fewest waves of blocks: for each, the slices of K that fill
    the GPU once, or more where a block's x would not fit beside its stages."""
    sms = sms or runtime.sm_count()
    groups, x_rows = triton.cdiv(k, GROUP_WEIGHTS_2BIT), min(m, 16)
    best = None
    for tiles, stages, chunk in W2A8_TILES_SHAPES:
        cfg = W2A8TilesConfig(4, tiles, stages, chunk, 1)
        column_blocks = triton.cdiv(n, cfg.rows) * triton.cdiv(m, 16 if m > 8 else 8)
        slices = max(triton.cdiv(groups, w2a8_max_groups_per_slice(cfg, x_rows)),
                     min(groups, max(1, sms // column_blocks)))
        per_slice = triton.cdiv(groups, slices)
        blocks = column_blocks * triton.cdiv(groups, per_slice)
        per_sm = SM_SMEM_BYTES // (w2a8_smem_bytes(cfg, x_rows, per_slice) + 1024)
        waves = triton.cdiv(blocks, sms * max(per_sm, 1))
        if best is None or waves < best[0]:
            best = (waves, replace(cfg, slices=slices))
    return best[1]


@functools.lru_cache(maxsize=256)
def _w2a8_tiles_plan(m: int, n: int, k: int, config: Optional[W2A8TilesConfig], sms: int) -> tuple:
    """Step 11's launch for one shape, checked once: (config, groups a K slice, grid, instance, shared memory)."""
    cfg = config or w2a8_tiles_config(m, n, k, sms)
    groups = triton.cdiv(k, GROUP_WEIGHTS_2BIT)
    col_tiles = 1 if m <= 8 else 2
    x_rows = min(m, 8 * col_tiles)
    # (more slices than asked where x would not fit; every compiled shape leaves room for 23 groups of 16 rows)
    per_slice = min(triton.cdiv(groups, cfg.slices), w2a8_max_groups_per_slice(cfg, x_rows))
    grid = (triton.cdiv(n, cfg.rows), triton.cdiv(groups, per_slice), triton.cdiv(m, 8 * col_tiles))
    name = _w2a8_tiles_instance(col_tiles, cfg.warps, cfg.tiles, cfg.stages, cfg.chunk)
    return cfg, per_slice, grid, name, w2a8_smem_bytes(cfg, x_rows, per_slice)


def w2a8_tiles_matmul(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                      out: Optional[Tensor] = None, config: Optional[W2A8TilesConfig] = None) -> Float[Tensor, "*m n"]:
    """Step 11 (W2A8, Hopper GPUs and later), the product of step 10 (``x`` quantised as
    :func:`quantize_activations` does, exact int32 sums, ``2bit_tiles`` weights) for several rows of x:
    quantize_x, then the matmul launched early, whose warps each own a tile of 16 weight rows over a
    slice of K (see ternary_w2a8.cu). Built for 2 to 16 rows of x (more run in blocks of 16 rows)."""
    x2, vector, w, s, s_stride, z = _cuda_call_args(x, w, scale, out, config, W2A8TilesConfig,
                                                    "step 11 (CUDA C++ ternary_w2a8_tiles)")
    m, k = x2.shape
    if k > W2A8_MAX_K:
        raise ValueError(f"step 11 takes K <= {W2A8_MAX_K} (its int32 sums stay exact below it), got K={k}")
    if torch.cuda.get_device_capability(x2.device)[0] < 9:
        raise RuntimeError("step 11 uses the Tensor Memory Accelerator (cp.async.bulk): it needs a Hopper GPU "
                           f"or later (compute capability 9.0+), not {torch.cuda.get_device_name(x2.device)}")
    cfg, per_slice, grid, name, smem = _w2a8_tiles_plan(m, w.n, k, config, runtime.sm_count())
    groups, slices = triton.cdiv(k, GROUP_WEIGHTS_2BIT), grid[1]
    sums, counts = CUDA_WORKSPACE.get(x2.device, slices * m, w.n) if slices > 1 else (None, None)
    partials = sums.view(torch.int32) if sums is not None else None
    kernel = _w2a8_kernels(x2.device.index or 0)[1][name]
    xq, x_scale, row_sum = _quantize_x(x2)
    # launched early (programmatic dependent launch): its weights stream in while x is quantised
    kernel(grid, (32 * (cfg.warps + 1),), xq, w.data, z, s, x_scale, row_sum, partials, counts, m, w.n, groups,
           s_stride, per_slice, shared_mem=smem, early=True)
    return z[0] if vector else z


def ternary_matmul(x: Float[Tensor, "*m k"], w: PackedTernary, scale: Scale = 1.0, *,
                   out: Optional[Tensor] = None) -> Float[Tensor, "*m n"]:
    """``x @ W.T / scale`` for packed ternary ``W``: for the 2bit_tiles format, step 9 (CUDA C++ on the
    TMA) up to 8 rows of x on Hopper GPUs and later, step 8 otherwise (on the H200 it beats step 9 at
    M = 16); step 7 for the MMA-order format (bf16 or fp16 x); for the others, the M=1 kernel for
    one row of x and tl.dot above."""
    if isinstance(w, PackedTernary) and w.fmt == "2bit_tiles":
        few = isinstance(x, Tensor) and (x.ndim == 1 or (x.ndim == 2 and x.shape[0] <= 8))
        if few and x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9:
            return bulk_matmul(x, w, scale, out=out)
        return cuda_mma_matmul(x, w, scale, out=out)
    if isinstance(w, PackedTernary) and w.fmt == "2bit_mma":
        return mma_2bit_matmul(x, w, scale, out=out)
    one_row = isinstance(x, Tensor) and (x.ndim == 1 or (x.ndim == 2 and x.shape[0] == 1))
    if isinstance(w, PackedTernary) and w.fmt == "base3":
        return (gemv_base3_matmul if one_row else dot_base3_matmul)(x, w, scale, out=out)
    return (gemv_2bit_matmul if one_row else dot_2bit_matmul)(x, w, scale, out=out)


#: Every step's wrapper, the weights it reads, and its configs (the tests run each one).
STEPS: dict[str, tuple[Callable, str, list]] = {
    "v1_sign": (matmul_sign_v1, "dense", V1_CONFIGS),
    "v2_int8": (matmul_int8_v2, "int8", V1_CONFIGS),
    "v3_2bit": (matmul_2bit_v3, "2bit", V3_CONFIGS),
    "gemv_2bit": (gemv_2bit_matmul, "2bit", GEMV_CONFIGS),
    "dot_2bit": (dot_2bit_matmul, "2bit", DOT_CONFIGS_FEW + DOT_CONFIGS_MANY),
    "gemv_base3": (gemv_base3_matmul, "base3", GEMV3_CONFIGS),
    "dot_base3": (dot_base3_matmul, "base3", DOT3_CONFIGS_FEW + DOT3_CONFIGS_MANY),
    "mma_2bit": (mma_2bit_matmul, "2bit_mma", MMA_CONFIGS_FEW + MMA_CONFIGS_MANY),
}
W2A8_CONFIGS = W2A8_CONFIGS_FEW + W2A8_CONFIGS_MANY


# ----------------------------------------------------------------------------------------------
# Benchmark (GPU only): python -m studylog bench ternary
# ----------------------------------------------------------------------------------------------

#: (family, N, K): BitNet b1.58 2B4T-style and Llama-style projections, as the issue lists them.
BENCH_SHAPES = [
    ("bitnet", 2560, 2560), ("bitnet", 13824, 2560), ("bitnet", 2560, 6912), ("bitnet", 20480, 3200),
    ("llama", 4096, 14336), ("llama", 14336, 4096), ("llama", 8192, 28672),
]
BENCH_MS = (1, 16, 128)
QUICK_SHAPES = [("llama", 4096, 14336), ("llama", 8192, 28672), ("llama", 14336, 4096)]
QUICK_MS = (1, 16, 128)
#: Series timed at M=1 (every step), and at M > 1 (the tl.dot kernels).
M1_SERIES = ["v1_sign_bf16", "v2_int8", "v3_2bit", "gemv_2bit", "gemv_base3", "dot_2bit", "dot_base3", "w2a8",
             "mma_2bit", "cuda_mma", "bulk", "w2a8_bulk", "w2a8_tiles"]
BATCH_SERIES = ["dot_2bit", "dot_base3", "w2a8", "mma_2bit", "cuda_mma", "bulk", "w2a8_bulk", "w2a8_tiles"]
#: A --quick run: steps 7 to 11 only.
QUICK_SERIES = ["mma_2bit", "cuda_mma", "bulk", "w2a8_bulk", "w2a8_tiles"]
#: Also timed by kernel time (the profiler), beside do_bench: our last steps and the baseline.
KERNEL_TIME_SERIES = ("cublas_bf16", "mma_2bit", "cuda_mma", "bulk", "w2a8_bulk", "w2a8_bulk_every", "w2a8_bulk_staged",
                      "w2a8_bulk_per_warp", "w2a8_bulk_first", "w2a8_bulk_2k", "w2a8_bulk_cluster", "w2a8_tiles", "read_weights")
#: Step 10's other places to quantise x, each a series of its own at M = 1 where it is not the default.
W2A8_PLACE_SERIES = (("w2a8_bulk_every", "every block"), ("w2a8_bulk_staged", "staged"),
                     ("w2a8_bulk_per_warp", "per warp"), ("w2a8_bulk_first", "first block"),
                     ("w2a8_bulk_2k", "separate"), ("w2a8_bulk_cluster", "cluster"))


def _autotuner_for(series: str, m: int):
    few = block_m_for(m) <= 32
    return {
        "v1_sign_bf16": sign_v1, "v2_int8": int8_v2, "v3_2bit": packed2_v3, "gemv_2bit": gemv_2bit,
        "gemv_base3": gemv_base3, "dot_2bit": dot_2bit_few if few else dot_2bit_many,
        "dot_base3": dot_base3_few if few else dot_base3_many, "w2a8": w2a8_dot_few if few else w2a8_dot_many,
        "mma_2bit": mma_2bit_few if mma_block_m(m) <= 32 else mma_2bit_many,
    }.get(series)


def _peak_matmul(run, dtype) -> tuple[float, float]:
    """(median ms, rate in T(FL)OP/s) of a dense 8192^3 matmul measured in this run (bf16: cuBLAS;
    int8: torch._int_mm)."""
    n = 8192
    if dtype == torch.int8:
        a = torch.randint(-127, 128, (n, n), dtype=torch.int8, device="cuda")
        b = torch.randint(-127, 128, (n, n), dtype=torch.int8, device="cuda").T.contiguous().T
        ms = run.time(lambda: torch._int_mm(a, b))
    else:
        a = torch.randn(n, n, dtype=dtype, device="cuda")
        b = torch.randn(n, n, dtype=dtype, device="cuda")
        ms = run.time(lambda: a @ b)
    return ms, 2 * n**3 / (ms * 1e-3) / 1e12


def bench(run) -> None:
    """cuBLAS bf16 against every step, per shape and M; correctness checked on the same inputs."""
    shapes, ms_list = (QUICK_SHAPES, QUICK_MS) if run.quick else (BENCH_SHAPES, BENCH_MS)
    (bf16_ms, bf16_rate), (int8_ms, int8_rate) = _peak_matmul(run, torch.bfloat16), _peak_matmul(run, torch.int8)
    peak = {"bf16": bf16_rate, "int8": int8_rate}
    run.record("peak_bf16_matmul", bf16_ms, params={"n": 8192}, role="baseline", tflops=bf16_rate)
    run.record("peak_int8_matmul", int8_ms, params={"n": 8192}, role="baseline", tops=int8_rate)
    run.note("Weights: quantize_absmean(randn(N, K)), one scale per tensor; x: randn(M, K) in bf16. Baseline: "
             "cuBLAS bf16 x @ W.T on the same ternary matrix stored densely (bf16 out, no scale). Ours: float32 out, "
             "divided by the scale. w2a8 times the matmul alone, x already quantised to int8.")
    run.note("floor_ms = max(bytes moved / copy bandwidth of this run, 2MNK / measured matmul peak of the MMA the "
             "kernel uses); bytes = weights + x + z.")
    run.note("mma_2bit (step 7): the same 2 bits a weight in MMA order (PackedTernary.pack(w, '2bit_mma')); its "
             "split-K slices add into a workspace that the last slice of each tile empties, so no memset is timed.")
    run.note("cuda_mma (step 8): CUDA C++ (studylog/csrc/ternary_mma.cu) on mma.sync, weights in the 2bit_tiles format "
             "(step 7's words, a warp's 16 rows x 256 weights in 1 KiB of consecutive memory), launch from "
             "cuda_mma_config; the last K slice of each tile sums the slices' partial sums, so no memset is timed.")
    run.note("bulk (step 9): CUDA C++ (studylog/csrc/ternary_bulk.cu), step 8's arithmetic with weights and x copied "
             "into shared memory by the TMA (cp.async.bulk, mbarriers, a producer warp), the K of a block shared by "
             "its warps and summed in shared memory; launch from bulk_config. bulk_probe_* are builds of it with "
             "parts left out (copies only, arithmetic only, launch only), timed to show what limits it.")
    run.note("kernel_ms: the same call timed by the profiler (CUPTI kernel start to end, L2 flushed before each "
             "repetition), without do_bench's launch and event overhead (ceilings.empty_launch_ms). Targets are "
             "judged on each of ms (do_bench), kernel_ms and graph_ms, each ours against cuBLAS by the same clock.")
    run.note("w2a8_bulk (step 10): CUDA C++ (studylog/csrc/ternary_w2a8.cu), timed from bf16 x: a first kernel "
             "quantises x as quantize_activations does (int8, per-row absmax) into the int8 MMA's order, then step 9's "
             "plumbing feeds mma.sync m16n8k32 (u8 codes x s8 x, int32 sums), one AND per 4 weights, same 2bit_tiles "
             "weights. Checked against float64 of the quantised x (ref_q), the product W2A8 defines. "
             "By default every block of the matmul quantises x itself: at M = 1 from a copy of x that the copy engine "
             "brings into shared memory ahead of the weights (quantize='staged', where it fits), else from global "
             "memory (quantize='every block', where M <= 8 and K fit), else a kernel of its own does it first "
             "('separate'). At M = 1 also, each where it is not the default: w2a8_bulk_every ('every block'), "
             "w2a8_bulk_staged ('staged'), w2a8_bulk_per_warp ('per warp': staged, but each warp quantises the "
             "groups it takes, in its loop), w2a8_bulk_first (the first "
             "block quantises x once and publishes it to the others by a flag) and w2a8_bulk_2k ('separate': "
             "quantize_x, then the matmul launched early by a programmatic dependent launch), and where x fits, "
             "w2a8_bulk_cluster ('cluster': the blocks of a thread block cluster share the quantisation, each "
             "writing its part into all their shared memories). "
             "w2a8_probe_* as bulk_probe_*, for the default. "
             "w2a8_tiles (step 11): the same W2A8 product, quantize_x then a matmul launched early whose warps each "
             "own a tile of 16 weight rows over a slice of K (x in shared memory for that slice only); launch from "
             "w2a8_tiles_config.")
    run.note("graph_ms: the call replayed in a CUDA graph (BenchRun.graph_time): no host in the loop, each call "
             "reading its own copy of the weights from DRAM (copies rotated, together 4x the L2), x in L2 as the "
             "kernel before it would leave it; timed with events around the replay, per call.")
    torch.manual_seed(0)
    for family, n, k in run.progress(shapes, "shapes"):
        _bench_shape(run, family, n, k, ms_list, peak)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _bench_shape(run, family: str, n: int, k: int, ms_list, peak: dict) -> None:
    dev = runtime.device()
    w_t, scale_t = quantize_absmean(torch.randn(n, k, device=dev))
    scale = float(scale_t)  # one number: no per-call tensor
    w_bf16 = w_t.to(torch.bfloat16)
    p2, p3 = PackedTernary.pack(w_t, "2bit"), PackedTernary.pack(w_t, "base3")
    pm = PackedTernary.pack(w_t, "2bit_mma")
    pt = PackedTernary.pack(w_t, "2bit_tiles")
    w64 = w_t.double()
    copies: dict[int, list] = {}

    def rotated(weights) -> list:
        """The weights and copies of them (BenchRun.rotated), made once a shape for the series that share them."""
        if id(weights) not in copies:
            copies[id(weights)] = run.rotated(weights)
        return copies[id(weights)]

    for m in ms_list:
        params = {"shape": f"{n}x{k}", "family": family, "n": n, "k": k, "m": m}
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        xq, x_scale = quantize_activations(x)
        x64, xq64 = x.double(), xq.double()
        ref = (x64 @ w64.T) / scale
        magnitude = (x64.abs() @ w64.abs().T) / abs(scale)
        ref_q = (xq64 @ w64.T) / (x_scale.double()[:, None] * scale)
        magnitude_q = (xq64.abs() @ w64.abs().T) / (x_scale.double()[:, None] * abs(scale))
        flops = 2 * m * n * k
        x_bytes, z_bytes = m * k * 2, m * n * 4

        # the calls also timed in a CUDA graph, up to 16 rows of x (BenchRun.graph_time): (their weights, the
        # call on a copy of them). Not "first block": its per-call flag value would be frozen into the graph.
        graphed = {
            "cublas_bf16": (w_bf16, lambda w: x @ w.T),
            "mma_2bit": (pm, lambda w: mma_2bit_matmul(x, w, scale)),
            "cuda_mma": (pt, lambda w: cuda_mma_matmul(x, w, scale)),
            "bulk": (pt, lambda w: bulk_matmul(x, w, scale)),
            "w2a8_bulk": (pt, lambda w: w2a8_bulk_matmul(x, w, scale)),
            "w2a8_tiles": (pt, lambda w: w2a8_tiles_matmul(x, w, scale)),
            **{series: (pt, lambda w, q=where: w2a8_bulk_matmul(x, w, scale, quantize=q))
               for series, where in W2A8_PLACE_SERIES if where != "first block"},
        }

        def timings(series, fn) -> dict:
            """kernel_ms and graph_ms where the series has them (up to 16 rows of x)."""
            out = {}
            if series in KERNEL_TIME_SERIES and m <= 16:
                out["kernel_ms"] = run.kernel_time(fn)
            if series in graphed and m <= 16:
                weights, call = graphed[series]
                out["graph_ms"] = run.graph_time([functools.partial(call, w) for w in rotated(weights)])
            return out

        def record(series, fn, weight_bytes, mma, reference, mag, role="kernel", out_bytes=z_bytes,
                   in_bytes=x_bytes, check=True, config_text=""):
            z = fn()  # the first call autotunes
            if check:
                ratio = _ratio(z.float(), reference, mag)
                run.check(f"{series} equals float64 reference", ratio <= FP32_TOLERANCE, params=params,
                          error_ratio=ratio, tolerance=FP32_TOLERANCE)
            ms = run.time(fn)
            kernel = timings(series, fn)
            nbytes = weight_bytes + in_bytes + out_bytes
            mem = run.floor_ms(nbytes)
            compute = flops / (peak[mma] * 1e12) * 1e3 if mma else 0.0
            best = str(getattr(_autotuner_for(series, m), "best_config", "")) or config_text
            run.record(series, ms, params=params, role=role, floor_ms=max(mem, compute), floor_mem_ms=mem,
                       floor_compute_ms=compute, weight_bytes=weight_bytes, bytes=nbytes,
                       gbs=nbytes / (ms * 1e-3) / 1e9, config=best, **kernel)

        record("cublas_bf16", lambda: x @ w_bf16.T, n * k * 2, "bf16", ref, magnitude, role="baseline",
               out_bytes=m * n * 2, check=False)
        exact = ref * scale
        z_bf16 = (x @ w_bf16.T).double()
        # a sanity check that the baseline computes the same product (cuBLAS may reduce in bf16)
        run.check("cublas_bf16 within bf16 rounding of float64", bool(
            ((z_bf16 - exact).abs() <= 2**-7 * exact.abs() + 2**-10 * magnitude * abs(scale)).all()), params=params)
        runs = {
            "v1_sign_bf16": (lambda: matmul_sign_v1(x, w_bf16, scale), n * k * 2, None),
            "v2_int8": (lambda: matmul_int8_v2(x, w_t, scale), n * k, None),
            "v3_2bit": (lambda: matmul_2bit_v3(x, p2, scale), p2.nbytes, None),
            "gemv_2bit": (lambda: gemv_2bit_matmul(x, p2, scale), p2.nbytes, None),
            "gemv_base3": (lambda: gemv_base3_matmul(x, p3, scale), p3.nbytes, None),
            "dot_2bit": (lambda: dot_2bit_matmul(x, p2, scale), p2.nbytes, "bf16"),
            "dot_base3": (lambda: dot_base3_matmul(x, p3, scale), p3.nbytes, "bf16"),
            "mma_2bit": (lambda: mma_2bit_matmul(x, pm, scale), pm.nbytes, "bf16"),
            "cuda_mma": (lambda: cuda_mma_matmul(x, pt, scale), pt.nbytes, "bf16", str(cuda_mma_config(m, n, k))),
            "bulk": (lambda: bulk_matmul(x, pt, scale), pt.nbytes, "bf16", str(bulk_config(m, n, k))),
        }
        names = M1_SERIES if m == 1 else BATCH_SERIES
        if run.quick:
            names = [s for s in names if s in QUICK_SERIES]
            # every step-7 config on its own too: which split of K, which tile, wins where
            configs = MMA_CONFIGS_FEW if mma_block_m(m) <= 32 else MMA_CONFIGS_MANY
            for i, config in enumerate(configs):
                runs[f"mma_2bit_cfg{i}"] = (lambda c=config_dict(config): mma_2bit_matmul(x, pm, scale, config=c),
                                           pm.nbytes, "bf16", str(config))
                names = names + [f"mma_2bit_cfg{i}"]
        for name in names:
            if name == "w2a8":
                record(name, lambda: w2a8_matmul(xq, x_scale, p2, scale), p2.nbytes, "int8", ref_q, magnitude_q,
                       in_bytes=m * k + m * 4)
            elif name == "w2a8_tiles":
                record(name, lambda: w2a8_tiles_matmul(x, pt, scale), pt.nbytes, "int8", ref_q, magnitude_q,
                       config_text=str(w2a8_tiles_config(m, n, k)))
            elif name == "w2a8_bulk":
                default = w2a8_default_quantize(m, n, k)
                record(name, lambda: w2a8_bulk_matmul(x, pt, scale), pt.nbytes, "int8", ref_q, magnitude_q,
                       config_text=f"{w2a8_config(m, n, k, quantize=default)}, quantize={default!r}")
                if m == 1:  # the other places to quantise x
                    for series, where in W2A8_PLACE_SERIES:
                        if where == default or not _w2a8_plan_takes(m, n, k, where):
                            continue  # the default's own series, or x's row does not fit beside the stages
                        record(series, lambda q=where: w2a8_bulk_matmul(x, pt, scale, quantize=q), pt.nbytes, "int8",
                               ref_q, magnitude_q, config_text=f"{w2a8_config(m, n, k, quantize=where)}")
            else:
                fn, weight_bytes, mma, *text = runs[name]
                record(name, fn, weight_bytes, mma, ref, magnitude, config_text="".join(text))
        if m == 1:
            # the floor a real kernel meets: one that only reads the 2-bit weights, launch and latency included
            from studylog.bench import read_only
            read = read_only(pt.data)
            graphed["read_weights"] = (pt, lambda w: read_only(w.data)())
            run.record("read_weights", run.time(read), params=params, role="baseline", **timings("read_weights", read),
                       weight_bytes=pt.nbytes, floor_ms=run.floor_ms(pt.nbytes))
        if m == 1 and family == "llama":
            # what limits steps 9 and 10: the same launch with parts left out (its outputs mean nothing)
            for series, make_probe, config in (("bulk", bulk_probe, bulk_config(m, n, k)),
                                               ("w2a8_bulk", w2a8_bulk_probe, w2a8_config(m, n, k))):
                if series not in names:
                    continue
                for probe, what in BULK_PROBES.items():
                    fn = make_probe(x, pt, scale, probe)
                    fn()
                    run.record(f"{series.replace('_bulk', '')}_probe_{probe}", run.time(fn), params=params,
                               kernel_ms=run.kernel_time(fn), probe=what, config=str(config))


# ----------------------------------------------------------------------------------------------
# Figures and target checks, from a results file (python -m studylog plot ternary; the notebook)
# ----------------------------------------------------------------------------------------------

SERIES_LABELS = {
    "cublas_bf16": "cuBLAS bf16", "v1_sign_bf16": "1: sign, bf16 W", "v2_int8": "2: int8 W", "v3_2bit": "3: 2-bit",
    "gemv_2bit": "3: 2-bit, M=1 kernel", "dot_2bit": "4: 2-bit, tl.dot", "gemv_base3": "5: 1.6-bit, M=1 kernel",
    "dot_base3": "5: 1.6-bit, tl.dot", "w2a8": "6: W2A8, tl.dot", "mma_2bit": "7: 2-bit pairs, MMA",
    "cuda_mma": "8: CUDA C++ mma.sync", "bulk": "9: CUDA C++, TMA copies",
    "bulk_probe_1": "9, copies only", "bulk_probe_2": "9, arithmetic only", "bulk_probe_3": "9, launch only",
    "w2a8_bulk": "10: W2A8, CUDA C++ int8 MMA",
    "w2a8_bulk_every": "10: W2A8, x read in every block",
    "w2a8_bulk_staged": "10: W2A8, x staged by the copy engine",
    "w2a8_bulk_per_warp": "10: W2A8, x staged, quantised a warp's groups at a time",
    "w2a8_bulk_first": "10: W2A8, x quantised by the first block",
    "w2a8_bulk_2k": "10: W2A8, quantize_x + early launch",
    "w2a8_bulk_cluster": "10: W2A8, x quantised once a cluster",
    "w2a8_tiles": "11: W2A8, a tile a warp, K in slices",
    "w2a8_probe_1": "10, copies only", "w2a8_probe_2": "10, arithmetic only", "w2a8_probe_3": "10, launch only",
    "read_weights": "only reading the 2-bit weights",
}


def _shapes_in(results) -> list[str]:
    seen: dict[str, None] = {}
    for row in results.rows:
        if "shape" in row["params"]:
            seen.setdefault(row["params"]["shape"], None)
    return list(seen)


def _ms(results, series: str, **params) -> Optional[float]:
    rows = results.select(series, **params)
    return rows[0]["ms"] if rows else None


def speedup_table(results, m: int) -> str:
    """Markdown: time per series (µs) and speedup over cuBLAS bf16, one line per shape."""
    series = [s for s in (M1_SERIES if m == 1 else BATCH_SERIES) if results.select(s, m=m)]
    head = ["shape", "cuBLAS bf16 (µs)"] + [f"{SERIES_LABELS[s]} (µs, x)" for s in series] + ["2-bit floor (µs)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape in _shapes_in(results):
        base = _ms(results, "cublas_bf16", shape=shape, m=m)
        if base is None:
            continue
        cells = [shape, f"{base * 1e3:.1f}"]
        for s in series:
            t = _ms(results, s, shape=shape, m=m)
            cells.append("–" if t is None else f"{t * 1e3:.1f} ({base / t:.1f}x)")
        floor = results.select("gemv_2bit" if m == 1 else "dot_2bit", shape=shape, m=m)
        cells.append(f"{floor[0]['floor_ms'] * 1e3:.1f}" if floor else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The three clocks of a results file: do_bench (``ms``), the profiler's kernel time and CUDA-graph replay.
TIMERS = {"ms": "do_bench", "kernel_ms": "kernel time", "graph_ms": "CUDA graph"}
#: Every series of ours a target may be met by.
TARGET_SERIES = ["gemv_2bit", "gemv_base3", "dot_2bit", "dot_base3", "w2a8", "mma_2bit", "cuda_mma", "bulk", "w2a8_bulk",
                 "w2a8_bulk_every", "w2a8_bulk_staged", "w2a8_bulk_per_warp", "w2a8_bulk_first", "w2a8_bulk_2k", "w2a8_bulk_cluster",
                 "w2a8_tiles"]


def target_checks(results) -> list[dict[str, Any]]:
    """The issue's targets, each judged on every clock the run recorded (``TIMERS``): the best of our
    series by that clock against cuBLAS by the same clock. Each: {"target", "met": {clock: True, False
    or None where not measured}, "detail": the numbers behind it}."""
    out = []

    def best(shape, m, clock):
        found = [(r, s) for s in TARGET_SERIES for r in results.select(s, shape=shape, m=m) if clock in r]
        return min(found, key=lambda t: t[0][clock]) if found else (None, None)

    for shape, m, want in (("4096x14336", 1, 4.0), ("8192x28672", 1, 6.0), ("4096x14336", 16, 3.0)):
        base_rows = results.select("cublas_bf16", shape=shape, m=m)
        met, parts = {}, []
        for clock, label in TIMERS.items():
            row, s = best(shape, m, clock)
            if not base_rows or clock not in base_rows[0] or row is None:
                met[clock] = None
                continue
            base = base_rows[0][clock]
            met[clock] = base / row[clock] >= want
            parts.append(f"{label}: {SERIES_LABELS[s]} {row[clock] * 1e3:.1f} vs {base * 1e3:.1f} µs, "
                         f"{base / row[clock]:.2f}x")
        out.append({"target": f"M={m}, {shape}: >= {want:.0f}x faster than cuBLAS bf16", "met": met,
                    "detail": "; ".join(parts) or "not measured"})
    for shape in ("4096x14336", "8192x28672"):
        met, parts = {}, []
        for clock, label in TIMERS.items():
            row, s = best(shape, 1, clock)
            if row is None:
                met[clock] = None
                continue
            met[clock] = row[clock] <= 2.0 * row["floor_ms"]
            parts.append(f"{label}: {SERIES_LABELS[s]} {row[clock] * 1e3:.1f} µs, {row[clock] / row['floor_ms']:.2f}x "
                         f"the floor ({row['floor_ms'] * 1e3:.1f} µs)")
        read = results.select("read_weights", shape=shape, m=1)
        if read:
            parts.append("a kernel that only reads the weights: " + ", ".join(
                f"{read[0][c] * 1e3:.1f} µs by {label}" for c, label in TIMERS.items() if c in read[0]))
        out.append({"target": f"M=1, {shape}: within 2x of the 2-bit floor", "met": met,
                    "detail": "; ".join(parts) or "not measured"})
    checks = results.data.get("checks", [])
    bad = [c for c in checks if not c["passed"]]
    passed = not bad and bool(checks)
    out.append({"target": "results equal a float64 reference within float32 tolerance",
                "met": {clock: passed for clock in TIMERS}, "detail": f"{len(checks) - len(bad)} of {len(checks)} checks passed"})
    return out


#: The kernels that take the activations as they come (bf16), for the headline.
FLOAT_X_SERIES = ["gemv_2bit", "gemv_base3", "dot_2bit", "dot_base3", "mma_2bit", "cuda_mma", "bulk"]


def headline(results) -> list[dict]:
    """The book's headline rows: the chapter's fastest bf16-activation kernel against cuBLAS bf16 on the
    issue's three target cases (M = 1 and 16 at 4096 x 14336, M = 1 at 8192 x 28672), by CUDA-graph replay
    where the run recorded it (do_bench's time of a Python-launched kernel follows the host's speed: the
    same step-10 kernel read 11.9 and 40.3 µs in two H200 runs of one day, 8.5 µs both times in a graph),
    else by do_bench."""
    rows = []
    for shape, m in (("4096x14336", 1), ("4096x14336", 16), ("8192x28672", 1)):
        base_rows = results.select("cublas_bf16", shape=shape, m=m)
        if not base_rows:
            continue
        clock = "graph_ms" if "graph_ms" in base_rows[0] else "ms"
        found = [(r[0], s) for s in FLOAT_X_SERIES if (r := results.select(s, shape=shape, m=m)) and clock in r[0]]
        if not found:
            continue
        row, series = min(found, key=lambda t: t[0][clock])
        n, k = shape.split("x")
        language = "CUDA C++" if series in ("cuda_mma", "bulk") else "Triton"
        how = ", both in a CUDA graph" if clock == "graph_ms" else ""
        rows.append({"kernel": f"step {SERIES_LABELS[series]} ({language})",
                     "baseline": f"cuBLAS bf16 (torch x @ W.T{how})",
                     "case": f"M = {m}, N x K = {n} x {k}, bf16 x", "speedup": base_rows[0][clock] / row[clock]})
    return rows


def step10_timeline_figure(timeline: dict):
    """Step 10's blocks over time, from ``tools/experiments/w2a8_timeline.py``'s output: for each case the
    median (over blocks) of when a block has read x, has quantised it, has taken its last weights and has
    ended, from the first block's start (the last of the script's repetitions), and when the last block ended."""
    import matplotlib.pyplot as plt

    cases = timeline.get("cases", timeline)
    phases = (("reading x", "start", "x_read"), ("quantising x (and, in a cluster, sharing it)", "x_read", "x_ready"),
              ("the weights", "x_ready", "loop_end"), ("the sums", "loop_end", "end"))
    colors = ("tab:orange", "tab:red", "tab:blue", "tab:gray")
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(cases) + 1.6))
    labels = []
    for i, (name, case) in enumerate(cases.items()):
        run = case["runs"][-1]
        for j, ((label, begin, end), color) in enumerate(zip(phases, colors)):
            lo, hi = run[begin][1], run[end][1]
            ax.barh(i, hi - lo, left=lo, color=color, label=label if i == 0 else None)
        ax.plot(run["end"][2], i, "k|", markersize=16, mew=2, label="the last block ends" if i == 0 else None)
        shape, place = name.split(" probe")[0].split(" ", 1)
        size = int(name.rsplit("cluster", 1)[1])
        where = f"cluster of {size}" if place == "cluster" else place
        labels.append(f"{shape}, {where}\n{case['kernel_us']:.1f} µs kernel time")
    ax.set_yticks(range(len(cases)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("µs since the first block started (medians over the blocks)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("Step 10 at M = 1: where a block's time goes (in-kernel timestamps, H200)", fontsize=9)
    fig.tight_layout()
    return fig


def figures(results) -> dict:
    """speedup: over cuBLAS bf16 per shape and M. floor: M=1 time against each format's floor.
    steps: M=1 time of every step on the Llama shapes."""
    import matplotlib.pyplot as plt
    import numpy as np

    shapes = _shapes_in(results)
    ms_present = sorted({r["params"]["m"] for r in results.rows if "m" in r["params"]})
    figs = {}

    def speedup_figure(panels, clock, label, width_each):
        """One panel per M: for each series, cuBLAS bf16's time over its own by `clock`, per shape; the
        issue's targets as red dashes. panels: (M, series, title) each; a series keeps its colour."""
        colours = {}
        cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        fig, axes = plt.subplots(1, len(panels), figsize=(width_each * len(panels), 4.2), squeeze=False)
        for ax, (m, series, title) in zip(axes[0], panels):
            bar = 0.8 / max(1, len(series))
            for i, s in enumerate(series):
                vals = []
                for shape in shapes:
                    base, mine = results.select("cublas_bf16", shape=shape, m=m), results.select(s, shape=shape, m=m)
                    ok = base and mine and clock in base[0] and clock in mine[0]
                    vals.append(base[0][clock] / mine[0][clock] if ok else np.nan)
                colour = colours.setdefault(s, cycle[len(colours) % len(cycle)])
                ax.bar(np.arange(len(shapes)) + (i - (len(series) - 1) / 2) * bar, vals, bar, label=SERIES_LABELS[s],
                       color=colour)
            ax.axhline(1.0, color="k", lw=1)
            for want, shape in {1: ((4.0, "4096x14336"), (6.0, "8192x28672")), 16: ((3.0, "4096x14336"),)}.get(m, ()):
                if shape in shapes:
                    j = shapes.index(shape)
                    ax.plot([j - 0.45, j + 0.45], [want, want], "r--", lw=1.2)
            ax.set_xticks(range(len(shapes)), shapes, rotation=35, ha="right", fontsize=8)
            ax.set_ylabel(f"speedup over cuBLAS bf16 ({label})")
            ax.set_title(title, fontsize=10)
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(results.caption(), fontsize=8)
        fig.tight_layout()
        return fig

    m1 = ["gemv_2bit", "gemv_base3", "dot_2bit", "w2a8", "mma_2bit", "cuda_mma", "bulk", "w2a8_bulk", "w2a8_tiles"]
    figs["speedup"] = speedup_figure(
        [(m, [s for s in (m1 if m == 1 else BATCH_SERIES) if results.select(s, m=m)],
          f"M = {m}" + ("  (red: the issue's targets)" if m in (1, 16) else "")) for m in ms_present],
        "ms", "do_bench", 5.2)
    graphed = ("mma_2bit", "cuda_mma", "bulk", "w2a8_bulk", "w2a8_bulk_every", "w2a8_bulk_2k", "w2a8_tiles")
    graph_panels = [(m, [s for s in graphed if any("graph_ms" in r for r in results.select(s, m=m))],
                     f"M = {m}, each replayed in a CUDA graph (red: the issue's targets)")
                    for m in ms_present if any("graph_ms" in r for r in results.select("cublas_bf16", m=m))]
    if graph_panels:
        figs["speedup_graph"] = speedup_figure(graph_panels, "graph_ms", "CUDA graph", 5.6)

    fig, ax = plt.subplots(figsize=(6.4, 5))
    lo, hi = math.inf, 0.0
    for s, marker in (("cublas_bf16", "s"), ("gemv_2bit", "o"), ("gemv_base3", "^"), ("dot_2bit", "v"),
                      ("mma_2bit", "*"), ("cuda_mma", "P"), ("bulk", "X"), ("w2a8_bulk", "D"), ("w2a8_tiles", "h"),
                      ("read_weights", "_")):
        rows = results.select(s, m=1)
        if not rows:
            continue
        xs = [r["floor_ms"] * 1e3 for r in rows]
        ys = [r["ms"] * 1e3 for r in rows]
        lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
        ax.scatter(xs, ys, marker=marker, label=f"{SERIES_LABELS[s]} (vs its own format's floor)")
    if hi > 0:
        line = np.array([lo / 1.5, hi * 1.5])
        ax.plot(line, line, "k-", lw=1, label="time = floor")
        ax.plot(line, 2 * line, "k--", lw=1, label="time = 2 x floor")
        env = results.data["ceilings"].get("empty_launch_ms")
        if env:
            ax.axhline(env * 1e3, color="gray", ls=":", lw=1, label="empty Triton kernel")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bandwidth floor (µs): bytes / measured copy bandwidth")
    ax.set_ylabel("measured time (µs, median)")
    ax.set_title(f"M = 1: time against the floor\n{results.caption()}", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    figs["floor"] = fig

    llama = [s for s in shapes if results.select("cublas_bf16", shape=s, family="llama", m=1)]
    if llama:
        steps = [s for s in ["cublas_bf16"] + M1_SERIES if results.select(s, m=1)]
        fig, ax = plt.subplots(figsize=(8.5, 4.2))
        width = 0.8 / len(llama)
        for i, shape in enumerate(llama):
            vals = [(_ms(results, s, shape=shape, m=1) or np.nan) * 1e3 for s in steps]
            ax.bar(np.arange(len(steps)) + (i - (len(llama) - 1) / 2) * width, vals, width, label=shape)
        ax.set_xticks(range(len(steps)), [SERIES_LABELS[s] for s in steps], rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("time (µs, median)")
        ax.set_title(f"M = 1, step by step\n{results.caption()}", fontsize=8)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        figs["steps"] = fig
    return figs
