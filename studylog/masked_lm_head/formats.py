"""What every step of the masked LM head shares: the allowed sets (:class:`AllowedTokens`), tile sizes
(:class:`Tiles` and each step's defaults), the input checks, and the float64 reference the tests and the
benchmark compare with.

Every step has the same output contract: fp32 logits ``[B, V]``, the logit for allowed tokens and ``-inf``
for the others; weights and hidden states in bf16 or fp16; fp32 accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
import triton
import triton.language as tl
from jaxtyping import Bool, Int
from torch import Tensor

from studylog import runtime
from studylog.checks import check_tensor

if TYPE_CHECKING:
    from studylog.masked_lm_head.reorder import VocabOrder

#: The seed's head: a 3072-wide hidden state and a 128k vocabulary (Llama 3's 128256 tokens).
VOCAB = 128_256
HIDDEN = 3072
WEIGHT_DTYPES = (torch.bfloat16, torch.float16)
#: Allowed sets up to this size also keep their ids on the host: step 6 (``step06_few_ids``) passes them
#: to the kernel as launch arguments (it has this many id slots).
FEW_IDS_MAX = 8
#: The weight layouts: ``"vd"`` is ``[V, D]`` (PyTorch's ``lm_head.weight``), ``"dv"`` the seed's ``[D, V]``.
LAYOUTS = ("vd", "dv")


# --------------------------------------------------------------------------------------------
# Allowed-token sets
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class AllowedTokens:
    """Which tokens each sequence of a batch may produce next, in the forms the kernels read.

    ``mask[b, v]`` is True when sequence ``b`` may produce token ``v``; ``union_ids`` holds, sorted,
    the ids at least one sequence allows (int32, on the mask's device); ``counts[b]`` is how many
    tokens sequence ``b`` allows; ``few_ids`` is ``union_ids`` as host integers when there are at
    most :data:`FEW_IDS_MAX` of them (else None). Build it once per FSM state with :meth:`from_ids`
    or :meth:`from_mask`: they check every id, so the kernels' wrappers need no device round trip.
    """

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
    def mask_u8(self) -> Int[Tensor, "b v"]:
        """The mask as bytes (a view, no copy): what the kernels load."""
        return self.mask.view(torch.uint8)

    @cached_property
    def kernel_ids(self) -> Int[Tensor, " u"]:
        """``union_ids`` as the kernels get it: never empty (an empty tensor has a null pointer,
        which some Triton launchers refuse); the kernels read only the first ``union_count``."""
        if self.union_count:
            return self.union_ids
        return torch.zeros(1, dtype=torch.int32, device=self.device)

    @cached_property
    def disallowed(self) -> Bool[Tensor, "b v"]:
        """``~mask``, kept for torch's ``masked_fill`` (the baselines and the cuBLAS path)."""
        return ~self.mask

    def ids(self, b: int = 0) -> Int[Tensor, " n"]:
        """Sorted allowed ids of sequence ``b`` (int64)."""
        return self.mask[b].nonzero().flatten()

    @classmethod
    def from_ids(cls, ids_per_sequence: Sequence[Any], vocab_size: int,
                 device: torch.device | str | None = None) -> "AllowedTokens":
        """From one list of allowed ids per sequence, e.g. ``[ids]`` for batch 1.

        Duplicates are merged; ids must be integers in ``[0, vocab_size)``.
        """
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
            low, high = int(arr.min()), int(arr.max())
            if low < 0 or high >= vocab_size:
                bad = low if low < 0 else high
                raise ValueError(f"ids_per_sequence[{b}] holds token id {bad}, outside [0, vocab_size={vocab_size})")
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

    def permuted(self, order: "VocabOrder") -> "AllowedTokens":
        """The same sets in a reordered vocabulary (position ``j`` holds token ``order.perm[j]``)."""
        if order.vocab_size != self.vocab_size:
            raise ValueError(f"order is for vocab_size={order.vocab_size}, the sets for {self.vocab_size}")
        return AllowedTokens._build(self.mask[:, order.perm.to(self.device, torch.int64)].contiguous())


# --------------------------------------------------------------------------------------------
# Tile sizes
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tiles:
    """Block sizes and launch options of one kernel call (powers of two).

    ``block_b``: sequences per program (at least 16 wherever ``tl.dot`` is used); ``block_v``:
    vocabulary rows (tokens) per program; ``block_d``: hidden-dimension chunk per step of the inner
    loop; ``group``: the tutorial's grouped ordering; ``fill_block``: outputs a fill program sets to
    ``-inf`` (steps 4 to 7).
    """

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
    """The tile sizes step ``step`` uses unless told otherwise (chosen for an H100/H200: the tile sweeps
    behind them are in ``lab/masked_lm_head/README.md``). Steps 0-3 and 8 are tiled matmuls; step 4 reads
    whole rows in chunks; steps 5 and 6 read a whole row at once; step 7 is a gathered matmul."""
    block_b = batch_tile(batch)
    if step == 4:
        # One to four whole rows per program: few rows keep every SM busy when little is allowed.
        rows = 1 if allowed_rows <= 2048 else 2 if allowed_rows <= 16384 else 4
        return Tiles(block_b=1, block_v=rows, block_d=1024, fill_block=4096, num_warps=4, num_stages=1)
    if step == 5:
        return stream_tiles(allowed_rows)
    if step == 6:
        return few_tiles()
    if step == 7:
        if allowed_rows <= 2048:
            # few rows: many small programs with wide chunks, so no program walks D in tiny steps
            return Tiles(block_b=block_b, block_v=16, block_d=256, fill_block=4096, num_warps=4, num_stages=3)
        if block_b <= 16:
            return Tiles(block_b=block_b, block_v=64, block_d=128, fill_block=4096, num_warps=4, num_stages=4)
        return Tiles(block_b=block_b, block_v=64, block_d=64, fill_block=4096, num_warps=4, num_stages=4)
    if block_b <= 16:
        return Tiles(block_b=block_b, block_v=64, block_d=128, num_warps=4, num_stages=4)
    return Tiles(block_b=block_b, block_v=128, block_d=64, num_warps=4, num_stages=4)


def stream_tiles(allowed_rows: int) -> Tiles:
    """Tile sizes of step 5 (``step05_stream``): one row per program up to 16,384 rows, two above, 4 warps
    (from its tile sweep, series ``step4b_tiles`` of the run copied into ``lab/masked_lm_head/results``)."""
    return Tiles(block_b=1, block_v=1 if allowed_rows <= 16384 else 2, fill_block=4096, num_warps=4, num_stages=1)


def few_tiles() -> Tiles:
    """Step 6's launch (``step06_few_ids``): one row per program, and fill programs of 1,024 outputs, more
    and smaller than step 5's (from its launch-shape sweep, series ``cand_step4c_tiles`` of the same run)."""
    return Tiles(block_b=1, block_v=1, fill_block=1024, num_warps=4, num_stages=1)


def dot_dtype(dtype: torch.dtype):
    """Operand type of ``tl.dot``. On the GPU the weights' own type (tensor cores, fp32
    accumulation). Triton 3.9's interpreter multiplies bf16 operands as raw 16-bit integers, so
    there the operands are widened to fp32 first (exact: bf16 and fp16 fit in fp32)."""
    if runtime.mode() == "interpreter":
        return tl.float32
    return tl.bfloat16 if dtype == torch.bfloat16 else tl.float16


# --------------------------------------------------------------------------------------------
# Input checks (no device synchronisation: ids were checked when AllowedTokens was built)
# --------------------------------------------------------------------------------------------

def check_inputs(h: Any, weight: Any, allowed: Any, layout: str, out: Any) -> tuple[int, int, int]:
    """Validate a step's arguments and return (B, V, D)."""
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
        if not isinstance(out, Tensor) or out.dtype != torch.float32 or tuple(out.shape) != (batch, vocab):
            raise ValueError(f"out must be a float32 tensor of shape {(batch, vocab)}")
        if not out.is_contiguous() or out.device != h.device:
            raise ValueError(f"out must be contiguous and on {h.device}")
    return batch, vocab, hidden


def output(out: Tensor | None, batch: int, vocab: int, device) -> Tensor:
    """``out``, or a new fp32 ``[batch, vocab]`` output."""
    return torch.empty(batch, vocab, dtype=torch.float32, device=device) if out is None else out


def need_layout(step: str, layout: str) -> None:
    """Refuse a layout other than ``[V, D]`` for a step that reads the weight as rows."""
    if layout != "vd":
        raise ValueError(f"{step} reads the weight as rows and needs layout 'vd' ([V, D]), got {layout!r}")


def need_batch1(step: str, batch: int) -> None:
    """Refuse a batch for a step that handles one sequence."""
    if batch != 1:
        raise ValueError(f"{step} handles one sequence; h has batch {batch} (use step07_batched or masked_logits)")


# --------------------------------------------------------------------------------------------
# The float64 reference
# --------------------------------------------------------------------------------------------

def reference_logits(h: Tensor, weight: Tensor, allowed: AllowedTokens, layout: str = "vd") -> Tensor:
    """float64 logits, ``-inf`` where not allowed (independent of the kernels)."""
    w = weight.double() if layout == "vd" else weight.double().t()
    logits = h.double() @ w.t()
    return logits.masked_fill(~allowed.mask.to(logits.device), float("-inf"))


def error_bound(h: Tensor, weight: Tensor, allowed: AllowedTokens, layout: str = "vd") -> Tensor:
    """A bound on fp32-accumulation error: ``D * 2**-24 * sum_i |h_i w_i|`` (products of bf16/fp16
    values are exact in fp32, so only the additions round), plus a tiny absolute slack."""
    w = weight.double() if layout == "vd" else weight.double().t()
    scale = h.double().abs() @ w.abs().t()
    return h.shape[1] * 2.0**-24 * scale + 1e-30


def check_logits(out: Tensor, h: Tensor, weight: Tensor, allowed: AllowedTokens, layout: str = "vd") -> dict:
    """Compare kernel logits with the float64 reference: allowed entries within
    :func:`error_bound`, every other entry exactly ``-inf``, no NaN (poison) left."""
    ref = reference_logits(h, weight, allowed, layout)
    bound = error_bound(h, weight, allowed, layout)
    got = out.double()
    mask = allowed.mask.to(got.device)
    nan = int(torch.isnan(got).sum())
    wrong_inf = int((got[~mask] != float("-inf")).sum())
    err = (got - ref).abs()[mask]
    over = int((err > bound[mask]).sum())
    return {"passed": nan == 0 and wrong_inf == 0 and over == 0, "nan": nan, "not_minus_inf": wrong_inf,
            "over_bound": over, "max_abs_err": float(err.max()) if err.numel() else 0.0}
