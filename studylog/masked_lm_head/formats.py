"""What every step shares: the allowed sets, tile sizes, input checks, and the float64 reference with its bound."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
import triton
import triton.language as tl
from jaxtyping import Bool, Float, Int
from torch import Tensor

from studylog import runtime
from studylog.checks import check_out, check_tensor

_ON_GPU = runtime.mode() == "gpu"  # else Triton's interpreter, on CPU tensors

if TYPE_CHECKING:
    from studylog.masked_lm_head.reorder import VocabOrder

#: The post's head: a 3072-wide hidden state and a 128k vocabulary (Llama 3's 128256 tokens).
VOCAB, HIDDEN = 128_256, 3072
WEIGHT_DTYPES = (torch.bfloat16, torch.float16)
#: Allowed sets up to this size also keep their ids on the host, for step 8's launch-argument slots.
FEW_IDS_MAX = 8
#: The weight layouts: ``"vd"`` is ``[V, D]`` (PyTorch's ``lm_head.weight``), ``"dv"`` the post's ``[D, V]``.
LAYOUTS = ("vd", "dv")
Hidden, Weight, Logits = Float[Tensor, "b d"], Float[Tensor, "v d"], Float[Tensor, "b v"]  # a step's h, weight, output


@dataclass(frozen=True, eq=False)
class AllowedTokens:
    """Which tokens each sequence may produce next: ``union_ids``, the sorted int32 ids some sequence allows;
    ``few_ids``, the same as host ints when at most :data:`FEW_IDS_MAX`. Built once per FSM state: the constructors
    check every id, so the steps need no device round trip."""

    vocab_size: int
    mask: Bool[Tensor, "b v"]
    union_ids: Int[Tensor, " u"]
    counts: tuple[int, ...]
    few_ids: tuple[int, ...] | None = None

    @property
    def batch(self) -> int:
        return self.mask.shape[0]

    @property
    def union_count(self) -> int:
        return self.union_ids.numel()

    @property
    def device(self) -> torch.device:
        return self.mask.device

    @cached_property
    def mask_u8(self) -> Int[Tensor, "b v"]:  # the mask as bytes (a view): what the kernels load
        return self.mask.view(torch.uint8)

    @cached_property
    def kernel_ids(self) -> Int[Tensor, " u"]:
        """``union_ids``, never empty (some Triton launchers refuse a null pointer); read up to ``union_count``."""
        return self.union_ids if self.union_count else torch.zeros(1, dtype=torch.int32, device=self.device)

    @cached_property
    def disallowed(self) -> Bool[Tensor, "b v"]:  # for torch's masked_fill (the baselines and the cuBLAS path)
        return ~self.mask

    @classmethod
    def from_ids(cls, ids_per_sequence: Sequence[Any], vocab_size: int,
                 device: torch.device | str | None = None) -> "AllowedTokens":
        """From one list of allowed ids per sequence, e.g. ``[ids]`` for batch 1 (duplicates merged)."""
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size <= 0:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        if isinstance(ids_per_sequence, (Tensor, np.ndarray)) or not isinstance(ids_per_sequence, Sequence):
            raise TypeError("ids_per_sequence must be a list with one id array per sequence, e.g. [ids] for batch 1")
        if len(ids_per_sequence) == 0:
            raise ValueError("ids_per_sequence is empty: give one id array per sequence (an empty array allows none)")
        device = torch.device(device) if device is not None else runtime.device()
        mask = torch.zeros(len(ids_per_sequence), int(vocab_size), dtype=torch.bool)
        for b, ids in enumerate(ids_per_sequence):
            arr = ids.detach().cpu().numpy() if isinstance(ids, Tensor) else np.asarray(ids)
            if arr.size == 0:
                continue
            if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
                raise TypeError(f"ids_per_sequence[{b}] must hold integer token ids, got dtype {arr.dtype} "
                                "(for a boolean mask use AllowedTokens.from_mask)")
            if arr.ndim != 1:
                raise ValueError(f"ids_per_sequence[{b}] must be 1-D, got shape {arr.shape}")
            bad = arr[(arr < 0) | (arr >= vocab_size)]
            if bad.size:
                raise ValueError(f"ids_per_sequence[{b}] holds token id {bad[0]}, outside [0, vocab_size={vocab_size})")
            mask[b, torch.from_numpy(arr.astype(np.int64))] = True
        return cls._build(mask.to(device))

    @classmethod
    def from_mask(cls, mask: Bool[Tensor, "*b v"]) -> "AllowedTokens":
        """From a boolean mask ``[V]`` (batch 1) or ``[B, V]`` (True = allowed)."""
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be torch.bool (True = allowed), got {mask.dtype}")
        if mask.ndim not in (1, 2) or mask.shape[-1] == 0 or (mask.ndim == 2 and mask.shape[0] == 0):
            raise ValueError(f"mask must have shape [V] or [B, V] with B, V > 0, got {tuple(mask.shape)}")
        return cls._build(mask.reshape(-1, mask.shape[-1]).contiguous())

    @classmethod
    def _build(cls, mask: Tensor) -> "AllowedTokens":
        counts = tuple(int(c) for c in mask.sum(dim=1).tolist())
        union = mask.any(dim=0).nonzero().flatten().to(torch.int32)
        few = tuple(int(i) for i in union.tolist()) if union.numel() <= FEW_IDS_MAX else None
        return cls(vocab_size=mask.shape[1], mask=mask, union_ids=union, counts=counts, few_ids=few)

    @classmethod
    def from_bitmask(cls, bitmask: Int[Tensor, "*b w"], vocab_size: int) -> "AllowedTokens":
        """From a packed int32 bitmask ``[W]`` or ``[B, W]`` (:func:`pack_bitmask`); bits past V are ignored."""
        check_tensor("bitmask", bitmask, dtype=torch.int32, ndim=(1, 2))
        if bitmask.shape[-1] != bitmask_words(vocab_size):
            raise ValueError(f"bitmask must have ceil(vocab_size / 32) = {bitmask_words(vocab_size)} words per "
                             f"row, got {bitmask.shape[-1]}")
        return cls.from_mask(unpack_bitmask(bitmask.reshape(-1, bitmask.shape[-1]), vocab_size))

    @cached_property
    def bitmask(self) -> Int[Tensor, "b w"]:
        """The sets as a packed int32 bitmask ``[B, ceil(V / 32)]`` (:func:`pack_bitmask`)."""
        return pack_bitmask(self.mask)

    def permuted(self, order: "VocabOrder") -> "AllowedTokens":
        """The same sets in a reordered vocabulary (position ``j`` holds token ``order.perm[j]``)."""
        if order.vocab_size != self.vocab_size:
            raise ValueError(f"order is for vocab_size={order.vocab_size}, the sets for {self.vocab_size}")
        return AllowedTokens._build(self.mask[:, order.perm.to(self.device, torch.int64)].contiguous())


def bitmask_words(vocab_size: int) -> int:
    """Words of a packed bitmask row: ``ceil(V / 32)`` (xgrammar's ``get_bitmask_shape``)."""
    return -(-int(vocab_size) // 32)


def pack_bitmask(mask: Bool[Tensor, "b v"]) -> Int[Tensor, "b w"]:
    """The packed int32 bitmask grammar engines fill: token ``v`` is bit ``v % 32`` of word ``v // 32``, 1 =
    allowed; the bits past ``V`` are 0."""
    batch, vocab = mask.shape
    words = bitmask_words(vocab)
    padded = torch.zeros(batch, words * 32, dtype=torch.int64, device=mask.device)
    padded[:, :vocab] = mask
    packed = (padded.view(batch, words, 32) << torch.arange(32, device=mask.device)).sum(-1)
    return (packed - (packed >= 2**31).to(torch.int64) * 2**32).to(torch.int32)  # two's complement


def unpack_bitmask(bitmask: Int[Tensor, "b w"], vocab_size: int) -> Bool[Tensor, "b v"]:
    """The boolean mask ``[B, V]`` of a packed int32 bitmask (the inverse of :func:`pack_bitmask`)."""
    bits = (bitmask.to(torch.int64).unsqueeze(-1) >> torch.arange(32, device=bitmask.device)) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()


@dataclass(frozen=True)
class Tiles:
    """Block sizes (powers of two) and launch options: ``block_b`` sequences (16 or more for ``tl.dot``),
    ``block_v`` tokens, ``block_d`` hidden features, ``fill_block`` a fill program's outputs."""

    block_b: int = 16
    block_v: int = 64
    block_d: int = 128
    group: int = 8
    fill_block: int = 2048
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        for name in ("block_b", "block_v", "block_d", "group", "fill_block"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"Tiles.{name} must be a power of two, got {value}")


def batch_tile(batch: int) -> int:
    """Sequences per program of the ``tl.dot`` kernels: the batch rounded up to a power of two, 16 to 64."""
    return min(64, max(16, triton.next_power_of_2(batch)))


def default_tiles(step: int, batch: int, allowed_rows: int = 0) -> Tiles:
    """Step ``step``'s tiles unless told otherwise (H100/H200 sweeps: ``lab/masked_lm_head/README.md``)."""
    return _tiles_for(step, batch_tile(batch), 0 if allowed_rows <= 2048 else 1 if allowed_rows <= 16384 else 2)


@functools.lru_cache(maxsize=None)
def _tiles_for(step: int, block_b: int, rows_class: int) -> Tiles:
    if step == 4:  # one to four whole rows per program: few rows keep every SM busy when little is allowed
        return Tiles(block_b=1, block_v=(1, 2, 4)[rows_class], block_d=1024, fill_block=4096, num_warps=4, num_stages=1)
    if step in (5, 6, 7):
        return _STREAM_TILES[rows_class == 2]
    if step == 8:
        return FEW_TILES
    if step in (9, 10):
        if rows_class == 0:  # few rows: many small programs with wide chunks, so no program walks D in tiny steps
            return Tiles(block_b=block_b, block_v=16, block_d=256, fill_block=4096, num_warps=4, num_stages=3)
        return Tiles(block_b=block_b, block_v=64, block_d=128 if block_b <= 16 else 64, fill_block=4096,
                     num_warps=4, num_stages=4)
    if block_b <= 16:
        return Tiles(block_b=block_b, block_v=64, block_d=128, num_warps=4, num_stages=4)
    return Tiles(block_b=block_b, block_v=128, block_d=64, num_warps=4, num_stages=4)


def stream_tiles(allowed_rows: int) -> Tiles:
    """Steps 5 to 7's tiles: one row per program up to 16,384 rows, two above."""
    return _STREAM_TILES[allowed_rows > 16384]


_STREAM_TILES = (Tiles(block_b=1, block_v=1, fill_block=4096, num_warps=4, num_stages=1),
                 Tiles(block_b=1, block_v=2, fill_block=4096, num_warps=4, num_stages=1))
FEW_TILES = Tiles(block_b=1, block_v=1, fill_block=1024, num_warps=4, num_stages=1)  # step 8: smaller fills


def dot_dtype(dtype: torch.dtype):
    """Operand type of ``tl.dot``: the weights' own on the GPU; fp32 in the interpreter, which multiplies bf16
    operands as raw 16-bit integers (widening is exact)."""
    if runtime.mode() == "interpreter":
        return tl.float32
    return tl.bfloat16 if dtype == torch.bfloat16 else tl.float16


def tile_constexprs(t: Tiles, dtype: torch.dtype) -> dict:
    """The constexprs and launch options of the grouped-tile kernels (steps 0-3 and 11)."""
    return {"BLOCK_M": t.block_b, "BLOCK_N": t.block_v, "BLOCK_K": t.block_d, "GROUP_M": t.group,
            "DOT_DTYPE": dot_dtype(dtype), "num_warps": t.num_warps, "num_stages": t.num_stages}


# Input checks (no device synchronisation: ids were checked when AllowedTokens was built)

def check_inputs(h: Any, weight: Any, allowed: Any, layout: str, out: Any) -> tuple[int, int, int]:
    """(B, V, D) of valid arguments: the common case in one expression (host time), anything else through the
    checks one by one, so that the error names the argument."""
    try:
        hs, ws = h.shape, weight.shape
        dev = h.get_device()
        if (type(allowed) is AllowedTokens and len(hs) == 2 and len(ws) == 2 and h.dtype is weight.dtype
                and h.dtype in WEIGHT_DTYPES and h.is_contiguous() and weight.is_contiguous()
                and dev == weight.get_device() == allowed.mask.get_device() and (dev >= 0) == _ON_GPU
                and (dev >= 0 or (h.is_cpu and weight.is_cpu and allowed.mask.is_cpu))):
            batch, hidden = hs
            vocab, d_weight = ws if layout == "vd" else (ws[1], ws[0]) if layout == "dv" else (-1, -1)
            if (d_weight == hidden and allowed.vocab_size == vocab and allowed.mask.shape[0] == batch
                    and batch > 0 and hidden > 0 and vocab > 0
                    and (out is None or (type(out) is Tensor and out.dtype is torch.float32
                                         and out.shape == (batch, vocab) and out.is_contiguous()
                                         and out.get_device() == dev and (dev >= 0 or out.is_cpu)))):
                return batch, vocab, hidden
    except (AttributeError, TypeError, ValueError):
        pass
    return _check_inputs_detailed(h, weight, allowed, layout, out)


def _check_inputs_detailed(h: Any, weight: Any, allowed: Any, layout: str, out: Any) -> tuple[int, int, int]:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'vd' (weight [V, D], PyTorch's lm_head.weight) or 'dv' (weight [D, V]), "
                         f"got {layout!r}")
    for name, t in (("h", h), ("weight", weight)):
        check_tensor(name, t, dtype=WEIGHT_DTYPES)
        if t.ndim != 2:
            hint = " (use h[None] for a single sequence)" if name == "h" else ""
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}{hint}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (call .contiguous())")
    if h.dtype != weight.dtype:
        raise TypeError(f"h and weight must have the same dtype, got h {h.dtype} and weight {weight.dtype}")
    if not isinstance(allowed, AllowedTokens):
        raise TypeError(f"allowed must be an AllowedTokens (AllowedTokens.from_ids / from_mask), "
                        f"got {type(allowed).__name__}")
    if h.device != weight.device or allowed.device != h.device:
        raise ValueError(f"h, weight and allowed must be on one device, got h on {h.device}, weight on "
                         f"{weight.device}, allowed on {allowed.device}")
    if h.device.type != "cuda" and runtime.mode() == "gpu":
        raise ValueError(f"the Triton kernels run on the GPU here: move h, weight and allowed to cuda "
                         f"(h is on {h.device})")
    if h.device.type == "cuda" and runtime.mode() == "interpreter":
        raise ValueError("Triton runs in its CPU interpreter in this process: keep h, weight and allowed on the CPU")
    batch, hidden = h.shape
    vocab, d_weight = weight.shape if layout == "vd" else weight.shape[::-1]
    if d_weight != hidden:
        raise ValueError(f"weight has hidden size {d_weight} in layout {layout!r} (shape {tuple(weight.shape)}) "
                         f"but h has {hidden}")
    if allowed.vocab_size != vocab:
        raise ValueError(f"mask length {allowed.vocab_size} does not match the weight's vocabulary {vocab}")
    if allowed.batch != batch:
        raise ValueError(f"allowed holds {allowed.batch} sequences but h has batch {batch}")
    if batch == 0 or hidden == 0 or vocab == 0:
        raise ValueError(f"empty input: B={batch}, V={vocab}, D={hidden}")
    if out is not None:
        check_out("out", out, shape=(batch, vocab), dtype=torch.float32, device=h.device)
    return batch, vocab, hidden


def output(out: Tensor | None, batch: int, vocab: int, device) -> Tensor:
    """``out``, or a new fp32 ``[batch, vocab]``."""
    return torch.empty(batch, vocab, dtype=torch.float32, device=device) if out is None else out


def need_layout(step: str, layout: str) -> None:
    if layout != "vd":
        raise ValueError(f"{step} reads the weight as rows and needs layout 'vd' ([V, D]), got {layout!r}")


def need_batch1(step: str, batch: int) -> None:
    if batch != 1:
        raise ValueError(f"{step} handles one sequence; h has batch {batch} (use step10_batched or masked_logits)")


def reference_logits(h: Tensor, weight: Tensor, allowed: AllowedTokens, layout: str = "vd") -> Tensor:
    """float64 logits, ``-inf`` where not allowed."""
    w = weight.double() if layout == "vd" else weight.double().t()
    logits = h.double() @ w.t()
    return logits.masked_fill(~allowed.mask.to(logits.device), float("-inf"))


def accumulation_depth(hidden: int, summation: str = "dot") -> int:
    """The depth ``k`` of :func:`error_bound`: the most fp32 additions one product ``h_i w_i`` goes through into a
    logit. ``"dot"``: ``tl.dot`` (and cuBLAS) adds 16 products at a time, ``ceil(D / 16)`` in a chain plus at most 4
    levels inside an instruction, and tensor cores may truncate when they align the addends (``2u``):
    ``k = 2 (ceil(D / 16) + 4)``. ``"row"`` (one program reduces a row: steps 4-9, the plan's batch-1 kernel): 128
    threads reduce at most two rows padded to ``D' = next_power_of_2(D)``, a chain of ``2 D' / 128`` each, then a
    tree of 7 levels: ``k = 2 D' / 128 + 7``."""
    if summation == "row":
        return 2 * -(-triton.next_power_of_2(int(hidden)) // 128) + 7
    if summation != "dot":
        raise ValueError(f"summation must be 'dot' or 'row', got {summation!r}")
    return 2 * (-(-int(hidden) // 16) + 4)


def fp32_gamma(hidden: int, summation: str = "dot") -> float:
    """``gamma_k = k u / (1 - k u)`` for ``k`` = :func:`accumulation_depth` and fp32's unit roundoff ``u = 2^-24``."""
    ku = accumulation_depth(hidden, summation) * 2.0**-24
    return ku / (1 - ku)


def error_bound(h: Tensor, weight: Tensor, layout: str = "vd", *, summation: str = "dot") -> Tensor:
    """``gamma_k * sum_i |h_i w_i|`` bounds every logit's fp32-accumulation error (Higham, *Accuracy and Stability
    of Numerical Algorithms*, §4.2; bf16/fp16 products are exact in fp32); a slack keeps exact zeros comparable."""
    w = weight.double() if layout == "vd" else weight.double().t()
    scale = h.double().abs() @ w.abs().t()
    return fp32_gamma(h.shape[1], summation) * scale + 1e-30


def check_logits(out: Tensor, h: Tensor, weight: Tensor, allowed: AllowedTokens, layout: str = "vd", *,
                 summation: str = "dot") -> dict:
    """Against the float64 reference: allowed entries within :func:`error_bound`, others exactly ``-inf``, no NaN."""
    return compare_logits(out, reference_logits(h, weight, allowed, layout),
                          error_bound(h, weight, layout, summation=summation), allowed.mask.to(out.device))


def compare_logits(out: Tensor, ref: Tensor, bound: Tensor, mask: Tensor) -> dict:
    """:func:`check_logits`'s verdict from a precomputed reference and bound."""
    got = out.double()
    err = (got - ref).abs()[mask]
    res = {"nan": int(torch.isnan(got).sum()), "not_minus_inf": int((got[~mask] != float("-inf")).sum()),
           "over_bound": int((err > bound[mask]).sum())}
    return {"passed": not any(res.values()), **res, "max_abs_err": float(err.max()) if err.numel() else 0.0,
            "max_err_over_bound": float((err / bound[mask]).max()) if err.numel() else 0.0}
