"""Chapter 2: a masked LM head that computes logits only for the tokens a grammar allows.

In constrained decoding the next token must belong to an allowed set (from an FSM state). The
usual path computes every logit, ``h @ W.T`` over the whole vocabulary, then overwrites the
disallowed ones with ``-inf``. At batch 1 that is a GEMV over a ``[V, D]`` bf16 weight: it reads
all of ``W`` (788 MB for V=128256, D=3072) to keep, perhaps, a thousand of its rows.

Every step below has the same output contract: fp32 logits ``[B, V]``, the logit for allowed
tokens and ``-inf`` for the others; weights and hidden states in bf16 or fp16; fp32 accumulation.

* step 0 ``dense_matmul_kernel``: the Triton matmul tutorial's structure, all logits, then torch's
  ``masked_fill``;
* step 1 ``block_skip_kernel``: a program whose vocabulary block holds no allowed token writes
  ``-inf`` and returns; active blocks mask their output;
* step 2 ``column_skip_kernel``: disallowed columns of an active block are not loaded;
* step 3 ``row_skip_kernel``: the same idea written for ``[V, D]``, where a token is a contiguous
  row, so skipping it saves whole cache lines and leaves the loads vectorised;
* step 4 ``compact_rows_kernel``: programs work only on the list of allowed ids (batch 1);
* step 4b ``compact_stream_kernel``: step 4 with each row read in one burst of loads, the fill
  programs first and an L2 evict-first hint on the rows (a candidate with a persistent grid,
  ``compact_persistent_kernel``, is measured next to it);
* step 4c ``few_ids_kernel``: up to eight ids passed as launch arguments, so the row read is the
  only memory access any program waits for;
* step 5 ``batched_union_kernel``: B sequences with their own masks in one launch; each row of
  the union of their allowed sets is read once and multiplied with all B hidden states;
* step 6 ``reordered_rows_kernel``: step 3 on a vocabulary reordered so that tokens allowed
  together sit together (fewer active blocks), writing logits back in the original order;
* step 7 ``masked_logits``: one function that picks the path from the allowed count.

The allowed sets travel as :class:`AllowedTokens`, built (and validated) once per FSM state, so
the per-step wrappers never synchronise with the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Sequence

import numpy as np
import torch
import triton
import triton.language as tl
from jaxtyping import Bool, Float, Int
from torch import Tensor

from studylog import runtime  # noqa: F401  (selects GPU or interpreter before kernels are defined)

#: The seed's head: a 3072-wide hidden state and a 128k vocabulary (Llama 3's 128256 tokens).
VOCAB = 128_256
HIDDEN = 3072
WEIGHT_DTYPES = (torch.bfloat16, torch.float16)
#: Allowed sets up to this size also keep their ids on the host: step 4c passes them to the
#: kernel as launch arguments (it has this many id slots).
FEW_IDS_MAX = 8

# --------------------------------------------------------------------------------------------
# Dispatch thresholds (step 7). Data-driven: `bench` times every path at every density and writes
# the measured crossovers into the JSON notes; copy them here after a GPU run.
# --------------------------------------------------------------------------------------------

#: Batch size -> the largest fraction of the vocabulary (rows of the union of the batch's allowed
#: sets) for which the compacted kernels (step 4b/4c at batch 1, step 5 above) are used. Batches
#: use the entry of the largest key not above them. From the H200 run of 2026-11-21: at batch 1
#: step 4b was never slower than the dense paths, even with every token allowed; at batch 8 step 5
#: still won at a union of 48% of V (random masks); at batch 64 it lost from 41% (clustered masks).
COMPACT_MAX_FRACTION: dict[int, float] = {1: 1.0, 8: 0.5, 64: 0.35}
#: Batch 1 sets of at most this many ids take step 4c (ids as launch arguments) instead of step 4b.
FEW_PATH_MAX = 8
#: Batch size -> the dense path used above that fraction: ``"row_skip"`` (step 3, our Triton
#: kernel, fused masking) or ``"cublas"`` (torch matmul with fp32 output, then masked_fill).
DENSE_PATH: dict[int, str] = {1: "row_skip", 8: "row_skip", 64: "row_skip"}


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
    ``-inf`` (steps 4 and 5).
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


def _batch_tile(batch: int) -> int:
    return min(64, max(16, triton.next_power_of_2(batch)))


def default_tiles(step: int, batch: int, allowed_rows: int = 0) -> Tiles:
    """The tile sizes each step uses unless told otherwise (chosen for an H100/H200; the bench
    records a small sweep around them)."""
    block_b = _batch_tile(batch)
    if step == 4:
        # One to four whole rows per program: few rows keep every SM busy when little is allowed.
        rows = 1 if allowed_rows <= 2048 else 2 if allowed_rows <= 16384 else 4
        return Tiles(block_b=1, block_v=rows, block_d=1024, fill_block=4096, num_warps=4, num_stages=1)
    if step == 5:
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
    """Tile sizes of step 4b (and the persistent candidate). 4b's tile sweep on the H200: one row per
    program and 4 warps was fastest at 1,000 and 10,000 rows; at 40,000 one and two rows tied."""
    return Tiles(block_b=1, block_v=1 if allowed_rows <= 16384 else 2, fill_block=4096, num_warps=4, num_stages=1)


def few_tiles() -> Tiles:
    """Step 4c's launch: one row per program, and fill programs of 1,024 outputs (more, smaller
    fill programs than step 4b's were faster on the H200 at 1-8 allowed ids)."""
    return Tiles(block_b=1, block_v=1, fill_block=1024, num_warps=4, num_stages=1)


def _dot_dtype(dtype: torch.dtype):
    """Operand type of ``tl.dot``. On the GPU the weights' own type (tensor cores, fp32
    accumulation). Triton 3.9's interpreter multiplies bf16 operands as raw 16-bit integers, so
    there the operands are widened to fp32 first (exact: bf16 and fp16 fit in fp32)."""
    if runtime.mode() == "interpreter":
        return tl.float32
    return tl.bfloat16 if dtype == torch.bfloat16 else tl.float16


# --------------------------------------------------------------------------------------------
# Step 0: dense, the Triton matmul tutorial's structure (C[M, N] = A[M, K] @ B[K, N])
# Here A = h [B, D] and "B" is the head seen as [D, V]: its strides say which layout it has.
# --------------------------------------------------------------------------------------------

@triton.jit
def dense_matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc, mask=c_mask)


# --------------------------------------------------------------------------------------------
# Step 1: block-level skip (the seed's 3.1)
# --------------------------------------------------------------------------------------------

@triton.jit
def block_skip_kernel(
    a_ptr, b_ptr, c_ptr, allowed_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_allowed_m,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    allowed = tl.load(allowed_ptr + offs_m[:, None] * stride_allowed_m + offs_n[None, :], mask=c_mask, other=0)
    if tl.sum(allowed.to(tl.int32)) == 0:  # nothing allowed in this block: no loads, no math
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, tl.full((BLOCK_M, BLOCK_N), float("-inf"), tl.float32), mask=c_mask)
        return
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    # reload the mask tile (an L1/L2 hit) rather than hold it in registers through the loop
    allowed = tl.load(allowed_ptr + offs_m[:, None] * stride_allowed_m + offs_n[None, :], mask=c_mask, other=0)
    tl.store(c_ptrs, tl.where(allowed != 0, acc, float("-inf")), mask=c_mask)


# --------------------------------------------------------------------------------------------
# Step 2: column-level skip (the seed's 3.2): disallowed columns are not loaded
# --------------------------------------------------------------------------------------------

@triton.jit
def column_skip_kernel(
    a_ptr, b_ptr, c_ptr, allowed_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_allowed_m,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    allowed = tl.load(allowed_ptr + offs_m[:, None] * stride_allowed_m + offs_n[None, :], mask=c_mask, other=0)
    if tl.sum(allowed.to(tl.int32)) == 0:  # nothing allowed in this block: no loads, no math
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, tl.full((BLOCK_M, BLOCK_N), float("-inf"), tl.float32), mask=c_mask)
        return
    column_wanted = tl.max(allowed.to(tl.int32), axis=0) != 0  # some sequence of the tile allows it
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N) & column_wanted[None, :],
                    other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    # reload the mask tile (an L1/L2 hit) rather than hold it in registers through the loop
    allowed = tl.load(allowed_ptr + offs_m[:, None] * stride_allowed_m + offs_n[None, :], mask=c_mask, other=0)
    tl.store(c_ptrs, tl.where(allowed != 0, acc, float("-inf")), mask=c_mask)


# --------------------------------------------------------------------------------------------
# Step 3: the [V, D] layout written as rows: a token is one contiguous row of the weight
# --------------------------------------------------------------------------------------------

@triton.jit
def row_skip_kernel(
    a_ptr, b_ptr, c_ptr, allowed_ptr, M, N, K,
    stride_am, stride_bn, stride_cm, stride_allowed_m,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    allowed = tl.load(allowed_ptr + offs_m[:, None] * stride_allowed_m + offs_n[None, :], mask=c_mask, other=0)
    if tl.sum(allowed.to(tl.int32)) == 0:  # nothing allowed in this block: no loads, no math
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, tl.full((BLOCK_M, BLOCK_N), float("-inf"), tl.float32), mask=c_mask)
        return
    row_wanted = tl.max(allowed.to(tl.int32), axis=0) != 0  # some sequence of the tile allows this token
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_n[:, None].to(tl.int64) * stride_bn + offs_k[None, :]  # [BLOCK_N, BLOCK_K]: rows

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_n[:, None] < N) & row_wanted[:, None] & (offs_k[None, :] < k_left),
                    other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), tl.trans(b.to(DOT_DTYPE)), acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    # reload the mask tile (an L1/L2 hit) rather than hold it in registers through the loop
    allowed = tl.load(allowed_ptr + offs_m[:, None] * stride_allowed_m + offs_n[None, :], mask=c_mask, other=0)
    tl.store(c_ptrs, tl.where(allowed != 0, acc, float("-inf")), mask=c_mask)


# --------------------------------------------------------------------------------------------
# Step 4: compacted ids, batch 1. Programs [0, n_compute) each take BLOCK_V allowed ids and read
# their whole rows; the programs after them write -inf over the disallowed part of the output.
# --------------------------------------------------------------------------------------------

@triton.jit
def compact_rows_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, ids_ptr, n_ids, V, n_compute, stride_wv,
    D: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, FILL_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_compute:
        slots = pid * BLOCK_V + tl.arange(0, BLOCK_V)
        live = slots < n_ids
        rows = tl.load(ids_ptr + slots, mask=live, other=0)
        row_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wv
        acc = tl.zeros((BLOCK_V,), dtype=tl.float32)
        for k in tl.static_range(0, D, BLOCK_D):  # unrolled; but each tl.sum ends in a barrier (step 4b)
            offs_d = k + tl.arange(0, BLOCK_D)
            in_d = offs_d < D
            h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
            w = tl.load(row_ptrs + offs_d[None, :], mask=live[:, None] & in_d[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(w * h[None, :], axis=1)
        tl.store(out_ptr + rows, acc, mask=live)
    else:
        offs = (pid - n_compute) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        inside = offs < V
        keep = tl.load(allowed_ptr + offs, mask=inside, other=1)
        tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=inside & (keep == 0))


# --------------------------------------------------------------------------------------------
# Step 4b: step 4 made to stream. Three changes, all about waiting:
# * the whole row is one tile ([BLOCK_V, D rounded up to a power of two], the padding masked off,
#   so it costs registers, not bytes): all of a row's loads are issued back to back and reduced
#   once. In step 4 each chunk's tl.sum ends in a barrier, and the next chunk's loads come after
#   it, so a program waited for memory once per chunk;
# * the fill programs come first in the grid: dispatched last, their mask-load -> store chain
#   was the tail of the launch;
# * the weight rows are read with an L2 evict-first policy: they are used once, so they recycle
#   their own L2 lines rather than evict lines that other data (often dirty) occupies.
# --------------------------------------------------------------------------------------------

@triton.jit
def compact_stream_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, ids_ptr, n_ids, V, n_fill, stride_wv,
    D: tl.constexpr, D_POW2: tl.constexpr, BLOCK_V: tl.constexpr, FILL_BLOCK: tl.constexpr,
    EVICTION: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid >= n_fill:
        offs_d = tl.arange(0, D_POW2)[None, :]
        in_d = offs_d < D
        # h as a [1, D] tile: already in the rows' layout (a 1-D h would be converted through
        # shared memory, with barriers that hold back the row loads until h has arrived)
        h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
        slots = (pid - n_fill) * BLOCK_V + tl.arange(0, BLOCK_V)
        live = slots < n_ids
        rows = tl.load(ids_ptr + slots, mask=live, other=0)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wv + offs_d,
                    mask=live[:, None] & in_d, other=0.0, eviction_policy=EVICTION).to(tl.float32)
        tl.store(out_ptr + rows, tl.sum(w * h, axis=1), mask=live)
    else:
        offs = pid * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        inside = offs < V
        keep = tl.load(allowed_ptr + offs, mask=inside, other=1)
        tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=inside & (keep == 0))


# --------------------------------------------------------------------------------------------
# A candidate the bench measures next to step 4b: a persistent grid. A fixed number of programs
# loop over the blocks of ids; each issues the next block's row loads (and the ids of the block
# after it) before it reduces the current one, so a program always has a block of rows in flight
# and h is loaded once per program instead of once per block.
# --------------------------------------------------------------------------------------------

@triton.jit
def compact_persistent_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, ids_ptr, n_ids, V, n_fill, n_programs, stride_wv,
    D: tl.constexpr, D_POW2: tl.constexpr, BLOCK_V: tl.constexpr, FILL_BLOCK: tl.constexpr,
    EVICTION: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid >= n_fill:
        p = pid - n_fill
        stride_slots = n_programs * BLOCK_V  # slots a program advances per iteration
        offs_d = tl.arange(0, D_POW2)[None, :]  # whole rows, h as a [1, D] tile, as in step 4b
        in_d = offs_d < D
        h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
        slots = p * BLOCK_V + tl.arange(0, BLOCK_V)
        live = slots < n_ids
        rows = tl.load(ids_ptr + slots, mask=live, other=0)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wv + offs_d,
                    mask=live[:, None] & in_d, other=0.0, eviction_policy=EVICTION)
        next_slots = slots + stride_slots
        next_live = next_slots < n_ids
        next_rows = tl.load(ids_ptr + next_slots, mask=next_live, other=0)
        for _ in range(tl.cdiv(n_ids - p * BLOCK_V, stride_slots)):
            # in flight while this block is reduced: the next block's rows and the ids after it
            w_next = tl.load(w_ptr + next_rows[:, None].to(tl.int64) * stride_wv + offs_d,
                             mask=next_live[:, None] & in_d, other=0.0, eviction_policy=EVICTION)
            after_slots = next_slots + stride_slots
            after_live = after_slots < n_ids
            after_rows = tl.load(ids_ptr + after_slots, mask=after_live, other=0)
            acc = tl.sum(w.to(tl.float32) * h, axis=1)
            tl.store(out_ptr + rows, acc, mask=live)
            rows, live, w = next_rows, next_live, w_next
            next_slots, next_live, next_rows = after_slots, after_live, after_rows
    else:
        offs = pid * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        inside = offs < V
        keep = tl.load(allowed_ptr + offs, mask=inside, other=1)
        tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=inside & (keep == 0))


# --------------------------------------------------------------------------------------------
# Step 4c: a handful of ids (a grammar state that forces one token, or allows a few) travel as
# launch arguments. A row program knows its row without loading an id, and a fill program knows
# which outputs to leave alone without loading the mask: the row read is the only memory access
# any program waits for. Unused slots hold -1, which no output position equals. The ids must not
# be specialised on (Triton would compile a variant for every id equal to 1 or divisible by 16).
# --------------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["n_ids", "id0", "id1", "id2", "id3", "id4", "id5", "id6", "id7"])
def few_ids_kernel(
    h_ptr, w_ptr, out_ptr, n_ids, id0, id1, id2, id3, id4, id5, id6, id7, V, stride_wv,
    D: tl.constexpr, D_POW2: tl.constexpr, FILL_BLOCK: tl.constexpr, EVICTION: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_ids:  # row programs first: their row read is the critical path
        row = tl.where(pid == 0, id0, tl.where(pid == 1, id1, tl.where(pid == 2, id2, tl.where(
            pid == 3, id3, tl.where(pid == 4, id4, tl.where(pid == 5, id5, tl.where(pid == 6, id6, id7)))))))
        offs_d = tl.arange(0, D_POW2)  # the whole row at once, as in step 4b
        in_d = offs_d < D
        h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + row.to(tl.int64) * stride_wv + offs_d, mask=in_d, other=0.0,
                    eviction_policy=EVICTION).to(tl.float32)
        tl.store(out_ptr + row, tl.sum(w * h, axis=0))
    else:
        offs = (pid - n_ids) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        keep = ((offs == id0) | (offs == id1) | (offs == id2) | (offs == id3) | (offs == id4) | (offs == id5)
                | (offs == id6) | (offs == id7))
        tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=(offs < V) & ~keep)

# --------------------------------------------------------------------------------------------
# Step 5: batched, each sequence its own mask. Programs take BLOCK_V ids of the union of the
# allowed sets, read those rows once and multiply them with BLOCK_B hidden states (tl.dot); a
# logit is stored only where that sequence allows that token. Fill programs write the -inf.
# --------------------------------------------------------------------------------------------

@triton.jit
def batched_union_kernel(
    h_ptr, w_ptr, out_ptr, allowed_ptr, union_ptr, n_union, B, V, n_compute,
    stride_hb, stride_wv, stride_ob, stride_allowed_b,
    D: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
    FILL_BLOCK: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_compute:
        num_pid_b = tl.cdiv(B, BLOCK_B)
        pid_v = pid // num_pid_b  # neighbouring programs share rows: the second read hits L2
        pid_b = pid % num_pid_b
        slots = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        live = slots < n_union
        rows = tl.load(union_ptr + slots, mask=live, other=0)
        offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
        in_b = offs_b < B
        offs_d = tl.arange(0, BLOCK_D)
        h_ptrs = h_ptr + offs_b[:, None] * stride_hb + offs_d[None, :]
        w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wv + offs_d[None, :]
        acc = tl.zeros((BLOCK_B, BLOCK_V), dtype=tl.float32)
        for k in range(0, tl.cdiv(D, BLOCK_D)):
            d_left = D - k * BLOCK_D
            h = tl.load(h_ptrs, mask=in_b[:, None] & (offs_d[None, :] < d_left), other=0.0)
            w = tl.load(w_ptrs, mask=live[:, None] & (offs_d[None, :] < d_left), other=0.0)
            acc = tl.dot(h.to(DOT_DTYPE), tl.trans(w.to(DOT_DTYPE)), acc)
            h_ptrs += BLOCK_D
            w_ptrs += BLOCK_D
        tile = in_b[:, None] & live[None, :]
        allowed = tl.load(allowed_ptr + offs_b[:, None] * stride_allowed_b + rows[None, :], mask=tile, other=0)
        tl.store(out_ptr + offs_b[:, None] * stride_ob + rows[None, :], acc, mask=tile & (allowed != 0))
    else:
        offs = (pid - n_compute) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)  # over the flat [B, V] output
        inside = offs < B * V
        seq = offs // V
        tok = offs - seq * V
        keep = tl.load(allowed_ptr + seq * stride_allowed_b + tok, mask=inside, other=1)
        tl.store(out_ptr + seq * stride_ob + tok, tl.full((FILL_BLOCK,), float("-inf"), tl.float32),
                 mask=inside & (keep == 0))


# --------------------------------------------------------------------------------------------
# Step 6: step 3 on a reordered vocabulary. Row j of the weight is token perm[j]; the masks are
# in the same order; the logits go back to their tokens' original positions.
# --------------------------------------------------------------------------------------------

@triton.jit
def reordered_rows_kernel(
    a_ptr, b_ptr, c_ptr, allowed_ptr, perm_ptr, M, N, K,
    stride_am, stride_bn, stride_cm, stride_allowed_m,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    allowed = tl.load(allowed_ptr + offs_m[:, None] * stride_allowed_m + offs_n[None, :], mask=c_mask, other=0)
    if tl.sum(allowed.to(tl.int32)) == 0:  # nothing allowed in this block: no loads, no math
        tokens = tl.load(perm_ptr + offs_n, mask=offs_n < N, other=0)  # original id of each reordered row
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + tokens[None, :]
        tl.store(c_ptrs, tl.full((BLOCK_M, BLOCK_N), float("-inf"), tl.float32), mask=c_mask)
        return
    row_wanted = tl.max(allowed.to(tl.int32), axis=0) != 0  # some sequence of the tile allows this token
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_n[:, None].to(tl.int64) * stride_bn + offs_k[None, :]  # [BLOCK_N, BLOCK_K]: rows

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_n[:, None] < N) & row_wanted[:, None] & (offs_k[None, :] < k_left),
                    other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), tl.trans(b.to(DOT_DTYPE)), acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    tokens = tl.load(perm_ptr + offs_n, mask=offs_n < N, other=0)  # original id of each reordered row
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + tokens[None, :]
    # reload the mask tile (an L1/L2 hit) rather than hold it in registers through the loop
    allowed = tl.load(allowed_ptr + offs_m[:, None] * stride_allowed_m + offs_n[None, :], mask=c_mask, other=0)
    tl.store(c_ptrs, tl.where(allowed != 0, acc, float("-inf")), mask=c_mask)


# --------------------------------------------------------------------------------------------
# Input checks (no device synchronisation: ids were checked when AllowedTokens was built)
# --------------------------------------------------------------------------------------------

LAYOUTS = ("vd", "dv")


def _check_inputs(h: Any, weight: Any, allowed: Any, layout: str, out: Any) -> tuple[int, int, int]:
    """Validate and return (B, V, D)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'vd' (weight [V, D], PyTorch's lm_head.weight) or 'dv' (weight [D, V]), "
                         f"got {layout!r}")
    for name, t in (("h", h), ("weight", weight)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in WEIGHT_DTYPES:
            raise TypeError(f"{name} must be bfloat16 or float16, got {t.dtype}")
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


def _output(out: Tensor | None, batch: int, vocab: int, device) -> Tensor:
    return torch.empty(batch, vocab, dtype=torch.float32, device=device) if out is None else out


def _need_layout(step: str, layout: str) -> None:
    if layout != "vd":
        raise ValueError(f"{step} reads the weight as rows and needs layout 'vd' ([V, D]), got {layout!r}")


# --------------------------------------------------------------------------------------------
# Step wrappers
# --------------------------------------------------------------------------------------------

def _matmul_strides(weight: Tensor, layout: str) -> tuple[int, int]:
    """(stride along D, stride along V) of the weight, i.e. of the [D, V] matrix 'B' in C = A @ B."""
    return (weight.stride(1), weight.stride(0)) if layout == "vd" else (weight.stride(0), weight.stride(1))


def step0_dense(h: Float[Tensor, "b d"], weight: Float[Tensor, "v d"] | Float[Tensor, "d v"],
                allowed: AllowedTokens, *, layout: str = "vd", out: Float[Tensor, "b v"] | None = None,
                tiles: Tiles | None = None) -> Float[Tensor, "b v"]:
    """Step 0: every logit (tutorial matmul), then torch's ``masked_fill`` writes the ``-inf``."""
    batch, vocab, hidden = _check_inputs(h, weight, allowed, layout, out)
    t = tiles or default_tiles(0, batch)
    out = _output(out, batch, vocab, h.device)
    s_bk, s_bn = _matmul_strides(weight, layout)
    grid = (triton.cdiv(batch, t.block_b) * triton.cdiv(vocab, t.block_v),)
    dense_matmul_kernel[grid](
        h, weight, out, batch, vocab, hidden, h.stride(0), h.stride(1), s_bk, s_bn, out.stride(0), out.stride(1),
        BLOCK_M=t.block_b, BLOCK_N=t.block_v, BLOCK_K=t.block_d, GROUP_M=t.group, DOT_DTYPE=_dot_dtype(h.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages)
    return out.masked_fill_(allowed.disallowed, float("-inf"))


def _masked_matmul(kernel, h, weight, allowed, layout, out, tiles):
    batch, vocab, hidden = _check_inputs(h, weight, allowed, layout, out)
    t = tiles or default_tiles(1, batch)
    out = _output(out, batch, vocab, h.device)
    s_bk, s_bn = _matmul_strides(weight, layout)
    grid = (triton.cdiv(batch, t.block_b) * triton.cdiv(vocab, t.block_v),)
    kernel[grid](
        h, weight, out, allowed.mask_u8, batch, vocab, hidden, h.stride(0), h.stride(1), s_bk, s_bn,
        out.stride(0), out.stride(1), allowed.mask.stride(0),
        BLOCK_M=t.block_b, BLOCK_N=t.block_v, BLOCK_K=t.block_d, GROUP_M=t.group, DOT_DTYPE=_dot_dtype(h.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages)
    return out


def step1_block_skip(h: Float[Tensor, "b d"], weight: Float[Tensor, "v d"] | Float[Tensor, "d v"],
                     allowed: AllowedTokens, *, layout: str = "vd", out: Float[Tensor, "b v"] | None = None,
                     tiles: Tiles | None = None) -> Float[Tensor, "b v"]:
    """Step 1: blocks without an allowed token are skipped; active blocks mask their output."""
    return _masked_matmul(block_skip_kernel, h, weight, allowed, layout, out, tiles)


def step2_column_skip(h: Float[Tensor, "b d"], weight: Float[Tensor, "v d"] | Float[Tensor, "d v"],
                      allowed: AllowedTokens, *, layout: str = "vd", out: Float[Tensor, "b v"] | None = None,
                      tiles: Tiles | None = None) -> Float[Tensor, "b v"]:
    """Step 2: step 1, and inside an active block the disallowed columns are not loaded."""
    return _masked_matmul(column_skip_kernel, h, weight, allowed, layout, out, tiles)


def step3_row_skip(h: Float[Tensor, "b d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                   layout: str = "vd", out: Float[Tensor, "b v"] | None = None,
                   tiles: Tiles | None = None) -> Float[Tensor, "b v"]:
    """Step 3: block skip + row skip on the ``[V, D]`` layout (a disallowed token = a row not read)."""
    _need_layout("step 3", layout)
    batch, vocab, hidden = _check_inputs(h, weight, allowed, layout, out)
    t = tiles or default_tiles(3, batch)
    out = _output(out, batch, vocab, h.device)
    grid = (triton.cdiv(batch, t.block_b) * triton.cdiv(vocab, t.block_v),)
    row_skip_kernel[grid](
        h, weight, out, allowed.mask_u8, batch, vocab, hidden,
        h.stride(0), weight.stride(0), out.stride(0), allowed.mask.stride(0),
        BLOCK_M=t.block_b, BLOCK_N=t.block_v, BLOCK_K=t.block_d, GROUP_M=t.group, DOT_DTYPE=_dot_dtype(h.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages)
    return out


def step4_compact(h: Float[Tensor, "1 d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                  layout: str = "vd", out: Float[Tensor, "1 v"] | None = None,
                  tiles: Tiles | None = None) -> Float[Tensor, "1 v"]:
    """Step 4 (batch 1): programs run only over the allowed ids, reading whole rows; the rest of
    the grid writes ``-inf`` over the disallowed outputs, in the same launch."""
    _need_layout("step 4", layout)
    batch, vocab, hidden = _check_inputs(h, weight, allowed, layout, out)
    if batch != 1:
        raise ValueError(f"step 4 handles one sequence; h has batch {batch} (use step 5 or masked_logits)")
    n_ids = allowed.union_count
    t = tiles or default_tiles(4, 1, n_ids)
    out = _output(out, batch, vocab, h.device)
    n_compute = triton.cdiv(n_ids, t.block_v)
    grid = (n_compute + triton.cdiv(vocab, t.fill_block),)
    compact_rows_kernel[grid](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_ids, vocab, n_compute, weight.stride(0),
        D=hidden, BLOCK_V=t.block_v, BLOCK_D=min(t.block_d, triton.next_power_of_2(hidden)),
        FILL_BLOCK=t.fill_block, num_warps=t.num_warps, num_stages=t.num_stages)
    return out


EVICTIONS = ("evict_first", "", "evict_last")


def _check_batch1(step: str, batch: int, eviction: str) -> None:
    if batch != 1:
        raise ValueError(f"{step} handles one sequence; h has batch {batch} (use step 5 or masked_logits)")
    if eviction not in EVICTIONS:
        raise ValueError(f"eviction must be one of {EVICTIONS}, got {eviction!r}")


def step4b_stream(h: Float[Tensor, "1 d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                  layout: str = "vd", out: Float[Tensor, "1 v"] | None = None, tiles: Tiles | None = None,
                  eviction: str = "evict_first") -> Float[Tensor, "1 v"]:
    """Step 4b (batch 1): step 4 with the fill programs first in the grid and the weight rows read
    with an L2 ``eviction`` policy (``"evict_first"``: they are read once; ``""`` for none)."""
    _need_layout("step 4b", layout)
    batch, vocab, hidden = _check_inputs(h, weight, allowed, layout, out)
    _check_batch1("step 4b", batch, eviction)
    n_ids = allowed.union_count
    t = tiles or stream_tiles(n_ids)
    out = _output(out, batch, vocab, h.device)
    n_fill = triton.cdiv(vocab, t.fill_block)
    grid = (n_fill + triton.cdiv(n_ids, t.block_v),)
    compact_stream_kernel[grid](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_ids, vocab, n_fill, weight.stride(0),
        D=hidden, D_POW2=triton.next_power_of_2(hidden), BLOCK_V=t.block_v, FILL_BLOCK=t.fill_block,
        EVICTION=eviction, num_warps=t.num_warps, num_stages=t.num_stages)
    return out


def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (2 in the interpreter, so loops run more than once)."""
    if device.type != "cuda":
        return 2
    if device not in _SM_COUNTS:
        _SM_COUNTS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNTS[device]


_SM_COUNTS: dict[torch.device, int] = {}


def step4_persistent(h: Float[Tensor, "1 d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                     out: Float[Tensor, "1 v"] | None = None, tiles: Tiles | None = None,
                     programs_per_sm: int = 4, eviction: str = "evict_first") -> Float[Tensor, "1 v"]:
    """A candidate for step 4b (batch 1): at most ``programs_per_sm`` programs per SM loop over the
    blocks of ids, prefetching the next block's rows while they reduce the current one."""
    batch, vocab, hidden = _check_inputs(h, weight, allowed, "vd", out)
    _check_batch1("the persistent kernel", batch, eviction)
    if programs_per_sm < 1:
        raise ValueError(f"programs_per_sm must be at least 1, got {programs_per_sm}")
    n_ids = allowed.union_count
    t = tiles or stream_tiles(n_ids)
    out = _output(out, batch, vocab, h.device)
    n_fill = triton.cdiv(vocab, t.fill_block)
    n_programs = min(triton.cdiv(n_ids, t.block_v), _sm_count(h.device) * programs_per_sm)
    compact_persistent_kernel[(n_fill + n_programs,)](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_ids, vocab, n_fill, max(n_programs, 1),
        weight.stride(0), D=hidden, D_POW2=triton.next_power_of_2(hidden), BLOCK_V=t.block_v,
        FILL_BLOCK=t.fill_block, EVICTION=eviction, num_warps=t.num_warps, num_stages=t.num_stages)
    return out


def step4c_few(h: Float[Tensor, "1 d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
               out: Float[Tensor, "1 v"] | None = None, tiles: Tiles | None = None,
               eviction: str = "evict_first") -> Float[Tensor, "1 v"]:
    """Step 4c (batch 1, at most :data:`FEW_IDS_MAX` allowed ids): the ids are launch arguments,
    so no program loads an id or the mask."""
    batch, vocab, hidden = _check_inputs(h, weight, allowed, "vd", out)
    _check_batch1("step 4c", batch, eviction)
    if allowed.few_ids is None:
        raise ValueError(f"step 4c takes at most {FEW_IDS_MAX} allowed ids, got {allowed.union_count} "
                         "(use step 4b or masked_logits)")
    t = tiles or few_tiles()
    out = _output(out, batch, vocab, h.device)
    ids = list(allowed.few_ids) + [-1] * (FEW_IDS_MAX - len(allowed.few_ids))
    grid = (len(allowed.few_ids) + triton.cdiv(vocab, t.fill_block),)
    few_ids_kernel[grid](
        h, weight, out, len(allowed.few_ids), *ids, vocab, weight.stride(0),
        D=hidden, D_POW2=triton.next_power_of_2(hidden), FILL_BLOCK=t.fill_block,
        EVICTION=eviction, num_warps=t.num_warps, num_stages=t.num_stages)
    return out


def step5_batched(h: Float[Tensor, "b d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                  layout: str = "vd", out: Float[Tensor, "b v"] | None = None,
                  tiles: Tiles | None = None) -> Float[Tensor, "b v"]:
    """Step 5: any batch, each sequence its own allowed set; every row of the union is read once."""
    _need_layout("step 5", layout)
    batch, vocab, hidden = _check_inputs(h, weight, allowed, layout, out)
    n_union = allowed.union_count
    t = tiles or default_tiles(5, batch, n_union)
    out = _output(out, batch, vocab, h.device)
    n_compute = triton.cdiv(n_union, t.block_v) * triton.cdiv(batch, t.block_b)
    grid = (n_compute + triton.cdiv(batch * vocab, t.fill_block),)
    batched_union_kernel[grid](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_union, batch, vocab, n_compute,
        h.stride(0), weight.stride(0), out.stride(0), allowed.mask.stride(0),
        D=hidden, BLOCK_B=t.block_b, BLOCK_V=t.block_v, BLOCK_D=t.block_d, FILL_BLOCK=t.fill_block,
        DOT_DTYPE=_dot_dtype(h.dtype), num_warps=t.num_warps, num_stages=t.num_stages)
    return out


# --------------------------------------------------------------------------------------------
# Step 6: vocabulary reordering
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class VocabOrder:
    """A vocabulary permutation: reordered position ``j`` holds original token ``perm[j]``."""

    perm: Int[Tensor, " v"]
    vocab_size: int = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "vocab_size", self.perm.numel())

    @classmethod
    def identity(cls, vocab_size: int) -> "VocabOrder":
        return cls(torch.arange(vocab_size, dtype=torch.int32))

    @cached_property
    def position(self) -> np.ndarray:
        """``position[token]``: where an original token sits in the reordered vocabulary."""
        pos = np.empty(self.vocab_size, dtype=np.int64)
        pos[self.perm.cpu().numpy()] = np.arange(self.vocab_size)
        return pos


def cluster_order(train_sets: Sequence[np.ndarray], vocab_size: int) -> VocabOrder:
    """Reorder the vocabulary so that tokens allowed by the same sets are neighbours.

    Each token gets a signature: which of the training sets allow it. Sorting the tokens by that
    signature, smallest sets as the leading keys, makes each small set one contiguous run and the
    larger sets runs of runs; tokens no training set allows go last. The sort is stable, so ties
    keep their id order.
    """
    sets = [np.unique(np.asarray(s, dtype=np.int64)) for s in train_sets]
    sets = [s for s in sets if s.size]
    if not sets:
        return VocabOrder.identity(vocab_size)
    for s in sets:
        if s[0] < 0 or s[-1] >= vocab_size:
            raise ValueError(f"a training set holds ids outside [0, vocab_size={vocab_size})")
    sets.sort(key=len)
    outside = np.ones((len(sets), vocab_size), dtype=bool)  # False where allowed, so allowed sorts first
    for i, s in enumerate(sets):
        outside[i, s] = False
    packed = np.packbits(outside, axis=0)  # 8 sets per byte, first set in the high bit
    perm = np.lexsort(packed[::-1])  # np.lexsort's last key is the primary one
    return VocabOrder(torch.from_numpy(perm.astype(np.int32)))


def active_blocks(ids: np.ndarray, block: int, order: VocabOrder | None = None) -> int:
    """How many vocabulary blocks of ``block`` tokens hold at least one of ``ids`` (in ``order``)."""
    ids = np.asarray(ids, dtype=np.int64)
    pos = ids if order is None else order.position[ids]
    return int(np.unique(pos // block).size)


@dataclass(frozen=True, eq=False)
class ReorderedHead:
    """A head whose rows are stored in a :class:`VocabOrder` (built once, offline)."""

    weight: Float[Tensor, "v d"]
    order: VocabOrder

    @classmethod
    def build(cls, weight: Float[Tensor, "v d"], order: VocabOrder) -> "ReorderedHead":
        if weight.ndim != 2 or weight.shape[0] != order.vocab_size:
            raise ValueError(f"weight must be [V, D] with V = {order.vocab_size}, got {tuple(weight.shape)}")
        perm = order.perm.to(weight.device)
        return cls(weight.index_select(0, perm).contiguous(), VocabOrder(perm.to(torch.int32)))


def step6_reordered(h: Float[Tensor, "b d"], head: ReorderedHead, allowed_reordered: AllowedTokens, *,
                    out: Float[Tensor, "b v"] | None = None, tiles: Tiles | None = None) -> Float[Tensor, "b v"]:
    """Step 6: step 3 on a reordered vocabulary. ``allowed_reordered`` is
    ``allowed.permuted(head.order)`` (computed once per FSM state); logits come out in the original
    token order."""
    if not isinstance(head, ReorderedHead):
        raise TypeError(f"head must be a ReorderedHead, got {type(head).__name__}")
    batch, vocab, hidden = _check_inputs(h, head.weight, allowed_reordered, "vd", out)
    if head.order.perm.device != h.device:
        raise ValueError(f"head.order is on {head.order.perm.device}, h on {h.device}")
    t = tiles or default_tiles(6, batch)
    out = _output(out, batch, vocab, h.device)
    grid = (triton.cdiv(batch, t.block_b) * triton.cdiv(vocab, t.block_v),)
    reordered_rows_kernel[grid](
        h, head.weight, out, allowed_reordered.mask_u8, head.order.perm, batch, vocab, hidden,
        h.stride(0), head.weight.stride(0), out.stride(0), allowed_reordered.mask.stride(0),
        BLOCK_M=t.block_b, BLOCK_N=t.block_v, BLOCK_K=t.block_d, GROUP_M=t.group, DOT_DTYPE=_dot_dtype(h.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages)
    return out


# --------------------------------------------------------------------------------------------
# Step 7: dispatch
# --------------------------------------------------------------------------------------------

def _for_batch(table: dict[int, Any], batch: int) -> Any:
    keys = [k for k in sorted(table) if k <= batch]
    return table[keys[-1] if keys else min(table)]


def cublas_masked(h: Float[Tensor, "b d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                  out: Float[Tensor, "b v"] | None = None) -> Float[Tensor, "b v"]:
    """The dense path through torch: ``h @ W.T`` with fp32 output (cuBLAS on the GPU), then
    ``masked_fill``. Used by :func:`masked_logits` when :data:`DENSE_PATH` says ``"cublas"``."""
    global _MM_OUT_DTYPE
    batch, vocab, _ = _check_inputs(h, weight, allowed, "vd", out)
    out = _output(out, batch, vocab, h.device)
    if h.device.type != "cuda":  # CPU torch has no bf16 -> fp32 mm; widen first (exact), accumulate in fp32
        torch.mm(h.float(), weight.float().t(), out=out)
    elif _MM_OUT_DTYPE is not False:
        try:
            torch.mm(h, weight.t(), out_dtype=torch.float32, out=out)
            _MM_OUT_DTYPE = True
        except (RuntimeError, TypeError):
            if _MM_OUT_DTYPE:  # it worked before: this is a real error
                raise
            _MM_OUT_DTYPE = False  # this torch has no fp32-output mm: round through bf16 below
    if h.device.type == "cuda" and _MM_OUT_DTYPE is False:
        out.copy_(torch.mm(h, weight.t()))
    return out.masked_fill_(allowed.disallowed, float("-inf"))


#: Whether this torch's CUDA ``torch.mm`` takes ``out_dtype`` (found on first use).
_MM_OUT_DTYPE: bool | None = None


def choose_path(batch: int, vocab: int, union_count: int) -> str:
    """The path :func:`masked_logits` takes: ``"few"`` (step 4c), ``"compact"`` (step 4b),
    ``"batched"`` (step 5), ``"row_skip"`` (step 3) or ``"cublas"``."""
    if union_count <= _for_batch(COMPACT_MAX_FRACTION, batch) * vocab:
        if batch > 1:
            return "batched"
        return "few" if union_count <= min(FEW_PATH_MAX, FEW_IDS_MAX) else "compact"
    return _for_batch(DENSE_PATH, batch)


def masked_logits(h: Float[Tensor, "b d"], weight: Float[Tensor, "v d"], allowed: AllowedTokens, *,
                  out: Float[Tensor, "b v"] | None = None) -> Float[Tensor, "b v"]:
    """Masked LM head: fp32 logits where ``allowed``, ``-inf`` elsewhere, by the fastest path for
    this batch size and allowed count (see :data:`COMPACT_MAX_FRACTION` and :data:`DENSE_PATH`).

    ``weight`` is PyTorch's ``lm_head.weight``, ``[V, D]``, bf16 or fp16.
    """
    batch, vocab, _ = _check_inputs(h, weight, allowed, "vd", out)
    path = choose_path(batch, vocab, allowed.union_count)
    if path == "few":
        return step4c_few(h, weight, allowed, out=out)
    if path == "compact":
        return step4b_stream(h, weight, allowed, out=out)
    if path == "batched":
        return step5_batched(h, weight, allowed, out=out)
    if path == "row_skip":
        return step3_row_skip(h, weight, allowed, out=out)
    if path == "cublas":
        return cublas_masked(h, weight, allowed, out=out)
    raise ValueError(f"unknown dense path {path!r} in DENSE_PATH; use 'row_skip' or 'cublas'")


STEPS = {
    0: step0_dense,
    1: step1_block_skip,
    2: step2_column_skip,
    3: step3_row_skip,
    4: step4_compact,
    5: step5_batched,
}
#: Batch-1 steps (one sequence), by name.
BATCH1_STEPS = {"4": step4_compact, "4b": step4b_stream, "4c": step4c_few}


# --------------------------------------------------------------------------------------------
# What the compiler makes of a step's loads (sm_90 PTX, compiled offline: no GPU needed)
# --------------------------------------------------------------------------------------------

def ptx_loads(cases: Sequence[tuple[int, str, int]]) -> dict[tuple[int, str, int], dict[str, int]]:
    """For each ``(step, layout, batch)`` (steps 0-3), compile the step's kernel for sm_90 with the
    bench's tile sizes and count the global-memory loads in its PTX by width: ``"cp.async 16 B"``
    are asynchronous 16-byte copies into shared memory (what a streaming matmul wants), ``"ld 2 B"``
    single bf16 loads. No GPU is needed.

    The compile runs in a fresh Python process: Triton builds its own library functions
    (``tl.cdiv``...) for the interpreter when it is imported in interpreter mode, and those cannot
    be compiled afterwards in the same process.
    """
    import json
    import os
    import subprocess
    import sys

    for step, layout, batch in cases:
        if step not in (0, 1, 2, 3) or layout not in LAYOUTS or batch < 1:
            raise ValueError(f"bad case {(step, layout, batch)}: step 0-3, layout 'vd'/'dv', batch >= 1")
        if step == 3:
            _need_layout("step 3", layout)
    code = ("import json, sys, triton\n"  # triton first: its library functions must be compilable
            "from studylog.masked_lm_head import _ptx_loads_here\n"
            "cases = [tuple(c) for c in json.loads(sys.argv[1])]\n"
            "print(json.dumps([_ptx_loads_here(*c) for c in cases]))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([list(c) for c in cases])], env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"offline compile failed:\n{proc.stderr[-3000:]}")
    return {tuple(c): counts for c, counts in zip(cases, json.loads(proc.stdout.strip().splitlines()[-1]))}


def ptx_row_load_groups(steps: Sequence[str] = ("4", "4b"), rows: int = 2) -> dict[str, list[int]]:
    """For batch-1 steps ``"4"`` and ``"4b"``, compiled for sm_90 with ``rows`` rows per program
    and D = 3072: the weight-row load instructions of a program, grouped by the barriers between
    them. ``[2, 2, 2]`` means two loads, a barrier, two more, a barrier, two more: the program waits
    for memory three times in a row. ``[8]``: every row load is issued before the first barrier.
    Compiled offline in a fresh process (see :func:`ptx_loads`); no GPU is needed."""
    import json
    import os
    import subprocess
    import sys

    for step in steps:
        if step not in ("4", "4b"):
            raise ValueError(f"step must be '4' or '4b', got {step!r}")
    if rows < 1 or rows & (rows - 1):
        raise ValueError(f"rows must be a power of two, got {rows}")
    code = ("import json, sys, triton\n"
            "from studylog.masked_lm_head import _ptx_row_load_groups_here\n"
            "print(json.dumps({s: _ptx_row_load_groups_here(s, int(sys.argv[2])) for s in json.loads(sys.argv[1])}))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(list(steps)), str(rows)], env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"offline compile failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ptx_row_load_groups_here(step: str, rows: int) -> list[int]:
    import inspect
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    kernel = {"4": compact_rows_kernel, "4b": compact_stream_kernel}[step]
    raw = getattr(kernel, "fn", kernel)
    fn = JITFunction(raw)
    # the source lines of the statement that loads the weight rows ("w = tl.load(...)", 1-2 lines)
    lines, first = inspect.getsourcelines(raw)
    start = next(i for i, text in enumerate(lines) if text.strip().startswith("w = tl.load("))
    w_lines = {first + start, first + start + 1}
    constexprs = {"D": HIDDEN, "BLOCK_V": rows, "FILL_BLOCK": 4096}
    constexprs |= {"BLOCK_D": 1024} if step == "4" else {"D_POW2": triton.next_power_of_2(HIDDEN),
                                                         "EVICTION": "evict_first"}
    types = dict(h_ptr="*bf16", w_ptr="*bf16", out_ptr="*fp32", allowed_ptr="*u8", ids_ptr="*i32", n_ids="i32",
                 V="i32", n_compute="i32", n_fill="i32", stride_wv="i32")
    signature = {name: ("constexpr" if name in constexprs else types[name]) for name in fn.arg_names}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in fn.arg_names
             if name not in constexprs and name not in ("n_ids", "n_compute", "n_fill")}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 1})
    ptx = compiled.asm["ptx"]
    source_file = {m.group(1) for m in re.finditer(r'\.file\s+(\d+)\s+"[^"]*masked_lm_head\.py"', ptx)}
    groups: list[int] = []
    current, line_now = 0, None
    for text in ptx.splitlines():
        text = text.strip()
        loc = re.match(r"\.loc\s+(\d+)\s+(\d+)", text)
        if loc:
            line_now = int(loc.group(2)) if loc.group(1) in source_file else None
        elif text.startswith("bar.sync") and current:
            groups.append(current)
            current = 0
        elif re.search(r"ld\.global\S*\.v\d", text) and line_now in w_lines:
            current += 1
    if current:
        groups.append(current)
    return groups


def _ptx_loads_here(step: int, layout: str, batch: int) -> dict[str, int]:
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    kernel = {0: dense_matmul_kernel, 1: block_skip_kernel, 2: column_skip_kernel, 3: row_skip_kernel}[step]
    fn = JITFunction(getattr(kernel, "fn", kernel))
    t = default_tiles(step, batch)
    types = dict(a_ptr="*bf16", b_ptr="*bf16", c_ptr="*fp32", allowed_ptr="*u8", M="i32", N="i32", K="i32",
                 stride_am="i32", stride_ak="i32", stride_bk="i32", stride_bn="i32", stride_cm="i32",
                 stride_cn="i32", stride_allowed_m="i32")
    constexprs = dict(BLOCK_M=t.block_b, BLOCK_N=t.block_v, BLOCK_K=t.block_d, GROUP_M=t.group,
                      DOT_DTYPE=tl.bfloat16)
    # Triton's launcher turns integer arguments equal to 1 into constants, and marks pointers and
    # integers divisible by 16 as such (all of ours but the batch size): do the same here
    unit = ("stride_ak", "stride_cn", "stride_bk" if layout == "vd" else "stride_bn")
    constexprs |= {name: 1 for name in unit if name in fn.arg_names}
    signature = {name: ("constexpr" if name in constexprs else types[name]) for name in fn.arg_names}
    aligned = [name for name in fn.arg_names if name not in constexprs and name != "M"]
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": t.num_warps, "num_stages": t.num_stages})
    ptx = compiled.asm["ptx"]
    counts: dict[str, int] = {}
    copy = r"cp\.async\.c[ag]\.shared\.global(?:\.[\w:]+)* \[[^\]]+\], \[[^\]]+\], (0x[0-9a-f]+|\d+)"
    for m in re.finditer(copy, ptx):
        key = f"cp.async {int(m.group(1), 0)} B"
        counts[key] = counts.get(key, 0) + 1
    for m in re.finditer(r"ld\.global(?:\.\w+)*?(?:\.v(\d))?\.b(\d+)\s", ptx):
        key = f"ld {int(m.group(1) or 1) * int(m.group(2)) // 8} B"
        counts[key] = counts.get(key, 0) + 1
    return counts


# --------------------------------------------------------------------------------------------
# Reference and masks
# --------------------------------------------------------------------------------------------

def reference_logits(h: Float[Tensor, "b d"], weight: Tensor, allowed: AllowedTokens,
                     layout: str = "vd") -> Float[Tensor, "b v"]:
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


def random_sets(count: int, vocab: int, batch: int, gen: np.random.Generator) -> list[np.ndarray]:
    """``batch`` sets of ``count`` ids drawn uniformly without replacement."""
    return [np.sort(gen.choice(vocab, size=min(count, vocab), replace=False)) for _ in range(batch)]


def clustered_sets(count: int, vocab: int, batch: int, gen: np.random.Generator, run: int = 512) -> list[np.ndarray]:
    """``batch`` sets of ``count`` ids made of contiguous runs of up to ``run`` ids at random places."""
    out = []
    count = min(count, vocab)
    for _ in range(batch):
        n_runs = math.ceil(count / run)
        lengths = np.full(n_runs, count // n_runs)
        lengths[: count - lengths.sum()] += 1
        # place runs left to right with random gaps that use up the free space
        free = vocab - count
        gaps = np.sort(gen.integers(0, free + 1, size=n_runs))
        starts = gaps + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        out.append(np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)]))
    return out


def grammar_like_sets(n_sets: int, vocab: int, gen: np.random.Generator, n_classes: int = 400) -> list[np.ndarray]:
    """Synthetic stand-in for grammar masks: the vocabulary is split into random token classes
    (not contiguous in id order, like "digits" or "tokens starting with a quote"), and each set is
    the union of a few classes. Used when the real masks file is missing."""
    weights = gen.lognormal(0.0, 1.5, size=n_classes)
    labels = gen.choice(n_classes, size=vocab, p=weights / weights.sum())
    members = [np.flatnonzero(labels == c) for c in range(n_classes)]
    out = []
    for _ in range(n_sets):
        chosen = gen.choice(n_classes, size=int(gen.integers(1, 6)), replace=False)
        out.append(np.unique(np.concatenate([members[c] for c in chosen])))
    return out


@dataclass
class StructuredSets:
    """Allowed sets with a structure (real grammar masks, or the synthetic stand-in), each tagged
    with the grammar it comes from, so a vocabulary order can be judged on grammars it never saw."""

    sets: list[np.ndarray]
    groups: list[str]
    source: str

    @property
    def is_real(self) -> bool:
        return self.source.startswith("real")


def real_sets(vocab: int = VOCAB) -> StructuredSets | None:
    """The FSM chapter's real grammar masks (``assets/data/fsm_masks.npz``), or None if missing.
    A schema and its ``[compact]`` variant count as one grammar."""
    from studylog import data

    try:
        masks = data.load_masks()
    except FileNotFoundError:
        return None
    if masks.vocab_size > vocab:
        raise ValueError(f"the masks' vocabulary ({masks.vocab_size}) is larger than V={vocab}")
    sets = [masks.allowed(i).astype(np.int64) for i in range(len(masks))]
    groups = [str(src).removesuffix("[compact]") for src in masks.source]
    return StructuredSets(sets, groups, f"real FSM masks ({masks.tokenizer}, {len(sets)} states)")


def structured_sets(vocab: int = VOCAB, seed: int = 0) -> StructuredSets:
    """The real masks when the file exists, else synthetic token-class masks (said in ``source``)."""
    real = real_sets(vocab)
    if real is not None:
        return real
    sets = grammar_like_sets(600, vocab, np.random.default_rng(seed))
    return StructuredSets(sets, [f"synthetic-{i % 20}" for i in range(len(sets))],
                          "SYNTHETIC token-class masks (the real mask file is missing)")


def cross_fit_orders(data: StructuredSets, vocab: int) -> tuple[list[VocabOrder], list[int]]:
    """Two-fold cross-fitting by grammar: grammars alternate between folds (sorted by name); the
    order used for a set is fitted on the *other* fold's sets. Returns the two orders and each
    set's fold."""
    names = sorted(set(data.groups))
    fold_of_group = {name: i % 2 for i, name in enumerate(names)}
    fold = [fold_of_group[g] for g in data.groups]
    orders = [cluster_order([s for s, f in zip(data.sets, fold) if f != k], vocab) for k in (0, 1)]
    return orders, fold


# --------------------------------------------------------------------------------------------
# Benchmark (GPU only): python -m studylog bench masked_lm_head
# --------------------------------------------------------------------------------------------

def sweep_counts(vocab: int, points: int = 12, quick: bool = False) -> list[int]:
    """Allowed counts on a log scale from 1 to ``vocab``, plus the targets' 1,000 and 10,000."""
    if quick:
        return [1, 1000, 10_000, vocab]
    grid = {int(round(x)) for x in np.logspace(0, math.log10(vocab), points)}
    return sorted(grid | {1000, 10_000, vocab})


def _pick_structured(sets: list[np.ndarray], target: int, batch: int, gen: np.random.Generator) -> list[int] | None:
    """Indices of ``batch`` sets whose size is within a factor 2 of ``target`` (None if none is)."""
    sizes = np.array([s.size for s in sets])
    near = np.flatnonzero((sizes >= target / 2) & (sizes <= target * 2) & (sizes > 0))
    if near.size == 0:
        return None
    if batch == 1:
        return [int(near[np.argmin(np.abs(np.log(sizes[near] / target)))])]
    return [int(i) for i in gen.choice(near, size=batch, replace=True)]


def bench(run) -> None:  # run: studylog.bench.BenchRun
    """Steps 0-7 and the torch baselines over allowed counts 1..V, three mask kinds, batch 1/8/64."""
    run_sweep(run, vocab=VOCAB, hidden=HIDDEN, device="cuda", batches=(1, 8, 64), tile_sweep=True)


def run_sweep(run, *, vocab: int, hidden: int, device: str, batches: Sequence[int], tile_sweep: bool,
              structured: StructuredSets | None = None, counts: Sequence[int] | None = None) -> None:
    """The benchmark body, with the sizes as arguments (a CPU test runs it at toy sizes with a stub
    timer, to catch mistakes before GPU time is spent)."""
    dtype = torch.bfloat16
    dev = torch.device(device)
    gen = np.random.default_rng(1234)
    torch.manual_seed(1234)
    weight = (torch.randn(vocab, hidden, device=dev) * 0.02).to(dtype)  # PyTorch layout [V, D]
    weight_dv = weight.t().contiguous()  # the seed's layout [D, V]
    row_bytes = hidden * weight.element_size()
    times = {"warmup": 5, "rep": 30}

    data = structured if structured is not None else structured_sets(vocab)
    third_kind = "real" if data.is_real else "grammar"
    orders, fold = cross_fit_orders(data, vocab)
    in_sample = cluster_order(data.sets, vocab)
    heads = [ReorderedHead.build(weight, VocabOrder(o.perm.to(dev))) for o in orders]
    head_in_sample = ReorderedHead.build(weight, VocabOrder(in_sample.perm.to(dev)))
    run.note(f"weights: V={vocab}, D={hidden}, {dtype}; third mask kind {third_kind!r}: {data.source}, "
             f"{len(set(data.groups))} grammars. step6_reordered uses a vocabulary order fitted on the other half of "
             "the grammars (two-fold cross-fitting, a schema and its [compact] variant together); "
             "step6_in_sample uses an order fitted on every mask, the measured mask included.")
    run.note("Baselines get their cheapest form: dense_mask = (h @ W.T).masked_fill_(~mask, -inf) in bf16 "
             "(our kernels write fp32); index_select = h @ W.index_select(0, union_ids).T, without scattering "
             "into a [B, V] output. Our kernels take the allowed ids and mask precomputed per FSM state "
             "(AllowedTokens); floor_ms = max(allowed-row bytes / copy bandwidth, empty launch).")

    picked: list[int] = []  # indices into data.sets of the structured sets in use

    def sets_for(kind: str, count: int, batch: int) -> list[np.ndarray] | None:
        if kind == "random":
            return random_sets(count, vocab, batch, gen)
        if kind == "clustered":
            return clustered_sets(count, vocab, batch, gen)
        chosen = _pick_structured(data.sets, count, batch, gen)
        picked[:] = chosen or []
        return None if chosen is None else [data.sets[i] for i in chosen]

    reference: dict[int, tuple[Tensor, Tensor]] = {}  # batch -> (float64 logits, error bound)

    def set_reference(h: Tensor) -> None:
        reference.clear()
        w64 = weight.double()
        reference[h.shape[0]] = (h.double() @ w64.t(),
                                 hidden * 2.0**-24 * (h.double().abs() @ w64.abs().t()) + 1e-30)
        del w64

    def check(series: str, fn, h: Tensor, allowed: AllowedTokens, params: dict) -> None:
        out = fn(torch.full((h.shape[0], vocab), float("nan"), device=dev))  # poisoned
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ref, bound = reference[h.shape[0]]
        mask = allowed.mask
        got = out.double()
        err = (got - ref).abs()[mask]
        res = {"nan": int(torch.isnan(got).sum()), "not_minus_inf": int((got[~mask] != float("-inf")).sum()),
               "over_bound": int((err > bound[mask]).sum())}
        run.check(series, all(v == 0 for v in res.values()), params=params | {"series": series},
                  max_abs_err=float(err.max()) if err.numel() else 0.0, **res)

    def measure(series: str, fn, params: dict, *, role: str = "kernel", floor: float | None = None,
                checked: tuple | None = None, **extra) -> float:
        """Time ``fn`` (ours take ``out``; they are first checked on a poisoned output)."""
        if checked is not None:
            check(series, fn, *checked, params)
            ms = run.time(lambda: fn(None), **times)
        else:
            ms = run.time(fn, **times)
        run.record(series, ms, params=params, role=role, floor_ms=floor, **extra)
        return ms

    if counts is not None:
        counts = batch_counts = list(counts)
    else:
        counts = [c for c in sweep_counts(vocab, quick=run.quick) if c <= vocab]
        batch_counts = counts if run.quick else sorted(c for c in {1, 10, 100, 1000, 3000, 10_000, 30_000, vocab}
                                                       if c <= vocab)
    kinds = ["random"] if run.quick else ["random", "clustered", third_kind]
    crossover: dict[tuple[int, str], list[tuple[int, float, float]]] = {}

    for batch in batches:
        h = torch.randn(batch, hidden, device=dev).to(dtype)
        set_reference(h)
        cases = [(kind, count) for kind in kinds for count in (counts if batch == 1 else batch_counts)]
        for kind, count in run.progress(cases, f"batch {batch}"):
            sets = sets_for(kind, count, batch)
            if sets is None:
                continue
            allowed = AllowedTokens.from_ids(sets, vocab, device=dev)
            params = {"batch": batch, "kind": kind, "allowed": count}
            extra = {"allowed_actual": float(np.mean(allowed.counts)), "union": allowed.union_count}
            floor = max(run.floor_ms(allowed.union_count * row_bytes), run.empty_launch_ms)
            disallowed, union = allowed.disallowed, allowed.union_ids
            mine = (h, allowed)
            t_dense = measure("dense_mask", lambda: torch.matmul(h, weight.t()).masked_fill_(disallowed, float("-inf")),
                              params, role="baseline", **extra)
            measure("index_select", lambda: torch.matmul(h, weight.index_select(0, union).t()), params,
                    role="baseline", **extra)
            vd = params | {"layout": "vd"}
            if kind == "random" and batch == 1:
                measure("step0_dense", lambda out: step0_dense(h, weight, allowed, out=out), vd, checked=mine, **extra)
            measure("step1_block_skip", lambda out: step1_block_skip(h, weight, allowed, out=out), vd, floor=floor,
                    checked=mine, **extra)
            if batch == 1:
                measure("step2_column_skip", lambda out: step2_column_skip(h, weight, allowed, out=out), vd,
                        floor=floor, checked=mine, **extra)
            t_row = measure("step3_row_skip", lambda out: step3_row_skip(h, weight, allowed, out=out), vd,
                            floor=floor, checked=mine, **extra)
            if batch == 1:
                measure("step4_compact", lambda out: step4_compact(h, weight, allowed, out=out), vd, floor=floor,
                        checked=mine, **extra)
                t_compact = measure("step4b_stream", lambda out: step4b_stream(h, weight, allowed, out=out), vd,
                                    floor=floor, checked=mine, **extra)
                if allowed.few_ids is not None:
                    t_compact = min(t_compact, measure("step4c_few", lambda out: step4c_few(h, weight, allowed, out=out),
                                                       vd, floor=floor, checked=mine, **extra))
            else:
                t_compact = measure("step5_batched", lambda out: step5_batched(h, weight, allowed, out=out), vd,
                                    floor=floor, checked=mine, **extra)
            t_cublas = measure("cublas_fp32_mask", lambda out: cublas_masked(h, weight, allowed, out=out), vd,
                               floor=floor, checked=mine, **extra)
            measure("step7_dispatch", lambda out: masked_logits(h, weight, allowed, out=out), vd, floor=floor,
                    checked=mine, path=choose_path(batch, vocab, allowed.union_count), **extra)
            crossover.setdefault((batch, kind), []).append((allowed.union_count, t_compact, min(t_row, t_cublas)))
            if batch == 1 and kind != third_kind:  # the seed's [D, V] layout, for the steps whose loads it changes
                dv = params | {"layout": "dv"}
                if kind == "random":
                    measure("step0_dense", lambda out: step0_dense(h, weight_dv, allowed, layout="dv", out=out), dv,
                            checked=mine, **extra)
                measure("step1_block_skip",
                        lambda out: step1_block_skip(h, weight_dv, allowed, layout="dv", out=out), dv, floor=floor,
                        checked=mine, **extra)
                measure("step2_column_skip",
                        lambda out: step2_column_skip(h, weight_dv, allowed, layout="dv", out=out), dv, floor=floor,
                        checked=mine, **extra)
            if kind == third_kind and batch == 1:  # step 6: the same set on a reordered vocabulary
                block = default_tiles(6, batch).block_v
                held_out = orders[1 - fold[picked[0]]]  # fitted on the other fold's grammars
                head = heads[1 - fold[picked[0]]]
                allowed6 = allowed.permuted(head.order)
                measure("step6_reordered", lambda out: step6_reordered(h, head, allowed6, out=out), vd,
                        floor=floor, checked=mine, **extra, grammar=data.groups[picked[0]],
                        active_blocks=active_blocks(sets[0], block, held_out),
                        active_blocks_original=active_blocks(sets[0], block))
                allowed6i = allowed.permuted(head_in_sample.order)
                measure("step6_in_sample", lambda out: step6_reordered(h, head_in_sample, allowed6i, out=out), vd,
                        floor=floor, checked=mine, **extra, grammar=data.groups[picked[0]],
                        active_blocks=active_blocks(sets[0], block, in_sample),
                        active_blocks_original=active_blocks(sets[0], block))

    if tile_sweep:  # around the defaults, at the points the targets name: to tune default_tiles
        h1 = torch.randn(1, hidden, device=dev).to(dtype)
        set_reference(h1)
        # batch 1 candidates, each measured on the same set as step 4 and step 4b (series "cand_*")
        for count in [1, 3, 8, 100, 1000, 3000, 10_000, 44_026]:
            for kind in ("random", "clustered") if count == 10_000 else ("random",):
                sets = (random_sets if kind == "random" else clustered_sets)(count, vocab, 1, gen)
                allowed = AllowedTokens.from_ids(sets, vocab, device=dev)
                p = {"batch": 1, "kind": kind, "allowed": count}
                floor = max(run.floor_ms(allowed.union_count * row_bytes), run.empty_launch_ms)
                mine = (h1, allowed)
                cands = {"cand_step4_compact": lambda out: step4_compact(h1, weight, allowed, out=out),
                         "cand_step4b_stream": lambda out: step4b_stream(h1, weight, allowed, out=out),
                         "cand_step4b_no_hint": lambda out: step4b_stream(h1, weight, allowed, out=out, eviction="")}
                if allowed.few_ids is not None:
                    cands["cand_step4c_few"] = lambda out: step4c_few(h1, weight, allowed, out=out)
                    cands["cand_step4c_no_hint"] = lambda out: step4c_few(h1, weight, allowed, out=out, eviction="")
                for series, fn in cands.items():
                    measure(series, fn, p, floor=floor, checked=mine)
                if allowed.few_ids is not None:  # step 4c's launch shape: fewer warps, smaller fill chunks
                    for warps, fill in ((1, 1024), (2, 1024), (2, 2048), (4, 1024), (4, 2048), (8, 8192)):
                        t = Tiles(block_b=1, block_v=1, fill_block=fill, num_warps=warps, num_stages=1)
                        measure("cand_step4c_tiles", lambda out, t=t: step4c_few(h1, weight, allowed, out=out, tiles=t),
                                p | {"num_warps": warps, "fill_block": fill}, floor=floor, checked=mine)
                measure("cand_index_select", lambda: torch.matmul(h1, weight.index_select(0, allowed.union_ids).t()),
                        p, role="baseline")
                for rows, warps, per_sm in ((1, 4, 4), (2, 4, 4), (2, 4, 8)):
                    t = Tiles(block_b=1, block_v=rows, fill_block=4096, num_warps=warps, num_stages=1)
                    measure("cand_persistent",
                            lambda out, t=t, k=per_sm: step4_persistent(h1, weight, allowed, out=out, tiles=t,
                                                                        programs_per_sm=k),
                            p | {"rows": rows, "num_warps": warps, "programs_per_sm": per_sm}, floor=floor,
                            checked=mine)
        for count in ([1000, 10_000] if run.quick else [1000, 10_000, 40_000]):
            allowed = AllowedTokens.from_ids(random_sets(count, vocab, 1, gen), vocab, device=dev)
            for rows in (1, 2, 4):
                for warps in (2, 4, 8):
                    t = Tiles(block_b=1, block_v=rows, fill_block=4096, num_warps=warps, num_stages=1)
                    measure("step4b_tiles", lambda out, t=t: step4b_stream(h1, weight, allowed, out=out, tiles=t),
                            {"batch": 1, "kind": "random", "allowed": count, "rows": rows, "num_warps": warps},
                            floor=run.floor_ms(count * row_bytes), checked=(h1, allowed))
        for count in ([10_000] if run.quick else [1000, 10_000, 40_000]):
            allowed = AllowedTokens.from_ids(random_sets(count, vocab, 1, gen), vocab, device=dev)
            for rows in (1, 2, 4, 8):
                for warps in (4, 8):
                    t = Tiles(block_b=1, block_v=rows, block_d=1024, fill_block=4096, num_warps=warps, num_stages=1)
                    measure("step4_tiles", lambda out, t=t: step4_compact(h1, weight, allowed, out=out, tiles=t),
                            {"batch": 1, "kind": "random", "allowed": count, "rows": rows, "num_warps": warps},
                            floor=run.floor_ms(count * row_bytes), checked=(h1, allowed))
        for batch, count in ((8, 10), (64, 128)):  # step 5 at a small union and at 0.1% of V per sequence
            hb = torch.randn(batch, hidden, device=dev).to(dtype)
            set_reference(hb)
            allowed = AllowedTokens.from_ids(random_sets(count, vocab, batch, gen), vocab, device=dev)
            for block_v, block_d, stages in ((16, 256, 3), (16, 128, 4), (32, 128, 4), (64, 64, 4)):
                t = Tiles(block_b=_batch_tile(batch), block_v=block_v, block_d=block_d, fill_block=4096,
                          num_warps=4, num_stages=stages)
                measure("step5_tiles", lambda out, t=t: step5_batched(hb, weight, allowed, out=out, tiles=t),
                        {"batch": batch, "kind": "random", "allowed": count, "block_v": block_v, "block_d": block_d,
                         "num_stages": stages}, floor=run.floor_ms(allowed.union_count * row_bytes),
                        checked=(hb, allowed), union=allowed.union_count)
        set_reference(h1)
        allowed = AllowedTokens.from_ids([np.arange(vocab)], vocab, device=dev)
        for block_v, block_d, stages in ((64, 128, 4), (32, 256, 3), (128, 64, 4), (64, 256, 3)):
            t = Tiles(block_b=16, block_v=block_v, block_d=block_d, num_warps=4, num_stages=stages)
            measure("step3_tiles", lambda out, t=t: step3_row_skip(h1, weight, allowed, out=out, tiles=t),
                    {"batch": 1, "kind": "random", "allowed": vocab, "block_v": block_v, "block_d": block_d,
                     "num_stages": stages}, floor=run.floor_ms(vocab * row_bytes), checked=(h1, allowed))

    # where the compacted kernel stops winning: copy these into COMPACT_MAX_FRACTION / DENSE_PATH
    for (batch, kind), pts in sorted(crossover.items()):
        pts.sort()
        first_loss = min((u for u, t_c, t_d in pts if t_c > t_d), default=None)
        last_win = max((u for u, t_c, t_d in pts if t_c <= t_d and (first_loss is None or u < first_loss)),
                       default=None)
        run.note(f"crossover batch={batch} kind={kind}: the compacted kernel is fastest up to union={last_win} and "
                 f"slower than the best dense path from union={first_loss} (V={vocab}); now "
                 f"COMPACT_MAX_FRACTION={_for_batch(COMPACT_MAX_FRACTION, batch)}, "
                 f"DENSE_PATH={_for_batch(DENSE_PATH, batch)!r}")


# --------------------------------------------------------------------------------------------
# Figures and the targets' table (from the committed JSON)
# --------------------------------------------------------------------------------------------

B1_SERIES = ["step1_block_skip", "step2_column_skip", "step3_row_skip", "step4_compact", "step4b_stream",
             "step4c_few", "step7_dispatch", "index_select"]
#: The batch-1 candidates, measured on the same allowed set at each count (random masks).
CANDIDATE_SERIES = ["cand_step4_compact", "cand_step4b_no_hint", "cand_step4b_stream", "cand_step4c_few",
                    "cand_persistent", "cand_index_select"]
BATCH_SERIES = ["step1_block_skip", "step3_row_skip", "step5_batched", "cublas_fp32_mask", "step7_dispatch",
                "index_select"]


def _kinds(results) -> list[str]:
    seen: dict[str, None] = {}
    for row in results.rows:
        if "kind" in row["params"]:
            seen.setdefault(row["params"]["kind"], None)
    return list(seen)


def _speedup_lines(results, ax, series, where, baseline="dense_mask"):
    """One line per series: baseline time / series time against the allowed count. ``where`` may
    name a layout; baselines have none."""
    plain = {k: v for k, v in where.items() if k != "layout"}
    layout = where.get("layout", "vd")
    base = {r["params"]["allowed"]: r["ms"] for r in results.select(baseline, **plain)}
    for s in series:
        rows = [r for r in results.select(s, **plain) if r["params"].get("layout", "vd") == layout]
        pts = sorted((r["params"]["allowed"], base[r["params"]["allowed"]] / r["ms"])
                     for r in rows if r["params"]["allowed"] in base)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=s)
    ax.axhline(1.0, color="k", lw=1, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("allowed tokens per sequence")
    ax.set_ylabel(f"speedup over {baseline}")
    ax.grid(True, which="both", alpha=0.3)


def figures(results) -> dict[str, Any]:
    """Speedup against allowed count (one line per step, like the seed's plots), the layout
    comparison, time against the floor, batching and reordering."""
    import matplotlib.pyplot as plt

    figs: dict[str, Any] = {}
    kinds = [k for k in _kinds(results) if k != "none"]
    caption = results.caption()

    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 4.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        _speedup_lines(results, ax, B1_SERIES, {"batch": 1, "kind": kind, "layout": "vd"})
        ax.set_title(f"batch 1, {kind} masks, [V, D]", fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle(caption, fontsize=8)
    fig.tight_layout()
    figs["speedup_b1"] = fig

    layout_kinds = [k for k in kinds if results.select("step2_column_skip", batch=1, kind=k, layout="dv")]
    if layout_kinds:
        fig, axes = plt.subplots(1, len(layout_kinds), figsize=(5.2 * len(layout_kinds), 4.2), squeeze=False)
        for ax, kind in zip(axes[0], layout_kinds):
            base = {r["params"]["allowed"]: r["ms"] for r in results.select("dense_mask", batch=1, kind=kind)}
            for s in ("step1_block_skip", "step2_column_skip"):
                for layout, style in (("dv", "--"), ("vd", "-")):
                    rows = results.select(s, batch=1, kind=kind, layout=layout)
                    pts = sorted((r["params"]["allowed"], base[r["params"]["allowed"]] / r["ms"]) for r in rows)
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3,
                                label=f"{s} [{'D, V' if layout == 'dv' else 'V, D'}]")
            ax.axhline(1.0, color="k", lw=1, ls=":")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("allowed tokens")
            ax.set_ylabel("speedup over dense_mask")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(f"layout: batch 1, {kind} masks", fontsize=10)
            ax.legend(fontsize=7)
        fig.suptitle(caption, fontsize=8)
        fig.tight_layout()
        figs["layout"] = fig

    from studylog.plotting import plot_times

    fig, ax = plt.subplots(figsize=(7, 4.4))
    plot_times(results, "allowed", ["dense_mask", "index_select", "step3_row_skip", "step4_compact",
                                    "step4b_stream", "step7_dispatch"], where={"batch": 1, "kind": "random"}, ax=ax,
               title="batch 1, random masks: time against the floor max(bytes of allowed rows / bandwidth, launch)")
    ax.title.set_fontsize(8)
    figs["floor_b1"] = fig

    cand = candidate_rows(results)
    if cand:
        fig, ax = plt.subplots(figsize=(7.5, 4.6))
        counts = sorted(cand)
        for series in CANDIDATE_SERIES:
            pts = [(c, cand[c][series]["ms"] * 1e3) for c in counts if series in cand[c]]
            if pts:
                label = "cand_persistent (best of its shapes)" if series == "cand_persistent" else series
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=label,
                        ls=":" if series == "cand_index_select" else "-")
        floors = [(c, cand[c]["cand_step4b_stream"]["floor_ms"] * 1e3) for c in counts
                  if "cand_step4b_stream" in cand[c]]
        ax.plot([p[0] for p in floors], [p[1] for p in floors], "k--", lw=1,
                label="floor: max(row bytes / bandwidth, empty launch)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("allowed tokens (batch 1, random masks; every series on the same set)")
        ax.set_ylabel("time (µs, median)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title("step 4 and its candidates\n" + caption, fontsize=8)
        fig.tight_layout()
        figs["step4_variants"] = fig

    batches = sorted({r["params"]["batch"] for r in results.rows if r["params"].get("batch", 1) > 1})
    if batches:
        fig, axes = plt.subplots(len(batches), len(kinds), figsize=(5.2 * len(kinds), 4.0 * len(batches)),
                                 squeeze=False)
        for i, batch in enumerate(batches):
            for ax, kind in zip(axes[i], kinds):
                _speedup_lines(results, ax, BATCH_SERIES, {"batch": batch, "kind": kind, "layout": "vd"})
                ax.set_title(f"batch {batch}, {kind} masks (one per sequence)", fontsize=10)
                ax.legend(fontsize=7)
        fig.suptitle(caption, fontsize=8)
        fig.tight_layout()
        figs["batched"] = fig

    rows6 = results.select("step6_reordered", batch=1)
    if rows6:
        kind = rows6[0]["params"]["kind"]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        _speedup_lines(results, ax1, ["step3_row_skip", "step6_reordered", "step6_in_sample", "step4_compact",
                                      "step4b_stream"],
                       {"batch": 1, "kind": kind, "layout": "vd"})
        ax1.set_title(f"reordering: batch 1, {kind} masks", fontsize=10)
        ax1.legend(fontsize=7)
        lines = [("original order", rows6, "active_blocks_original"),
                 ("reordered, fitted on other grammars", rows6, "active_blocks"),
                 ("reordered, fitted on all masks", results.select("step6_in_sample", batch=1), "active_blocks")]
        for label, rows, key in lines:
            pts = sorted((r["params"]["allowed"], r[key]) for r in rows)
            if pts:
                ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=label)
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        ax2.set_xlabel("allowed tokens")
        ax2.set_ylabel("active 64-token blocks")
        ax2.grid(True, which="both", alpha=0.3)
        ax2.legend(fontsize=7)
        fig.suptitle(caption, fontsize=8)
        fig.tight_layout()
        figs["reorder"] = fig
    return figs


#: Series that count as "our kernel" in the targets. Left out: cublas_fp32_mask (torch's), and
#: step6_in_sample (its vocabulary order was fitted on the very mask it is measured on).
OUR_KERNELS = ["step1_block_skip", "step2_column_skip", "step3_row_skip", "step4_compact", "step4b_stream",
               "step4c_few", "step5_batched", "step6_reordered", "step7_dispatch"]


def candidate_rows(results) -> dict[int, dict[str, dict]]:
    """allowed count -> candidate series -> its row (random masks, batch 1); for the persistent
    candidate, its fastest shape."""
    out: dict[int, dict[str, dict]] = {}
    for r in results.rows:
        p = r["params"]
        if r["series"] in CANDIDATE_SERIES and p.get("kind") == "random" and p.get("batch") == 1:
            best = out.setdefault(p["allowed"], {}).get(r["series"])
            if best is None or r["ms"] < best["ms"]:
                out[p["allowed"]][r["series"]] = r
    return out


def candidate_table(results) -> str:
    """Markdown: the batch-1 candidates at each count, µs, on the same set per count."""
    cand = candidate_rows(results)
    head = ["allowed"] + [s.removeprefix("cand_") for s in CANDIDATE_SERIES] + ["floor", "4b / floor",
                                                                               "index_select / 4b"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for count in sorted(cand):
        row = cand[count]
        cells = [f"{count:,}"]
        for s in CANDIDATE_SERIES:
            if s not in row:
                cells.append("–")
            elif s == "cand_persistent":
                p = row[s]["params"]
                cells.append(f"{row[s]['ms'] * 1e3:.1f} ({p['rows']} rows, {p['num_warps']} warps, "
                             f"{p['programs_per_sm']}/SM)")
            else:
                cells.append(f"{row[s]['ms'] * 1e3:.1f}")
        b = row.get("cand_step4b_stream")
        cells.append(f"{b['floor_ms'] * 1e3:.1f}" if b else "–")
        cells.append(f"{b['ms'] / b['floor_ms']:.2f}×" if b else "–")
        cells.append(f"{row['cand_index_select']['ms'] / b['ms']:.2f}×" if b and "cand_index_select" in row else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def headline(results) -> list[dict]:
    """The book's headline rows: speedups over torch at the issue's target points (random masks)."""
    rows = []
    cases = [("step7_dispatch", "dense_mask", 1, 1000, "batch 1, 1,000 of 128,256 tokens allowed"),
             ("step4b_stream", "index_select", 1, 10_000, "batch 1, 10,000 allowed"),
             ("step7_dispatch", "dense_mask", 64, 100, "batch 64, 100 allowed per sequence (own masks)")]
    for kernel, baseline, batch, allowed, case in cases:
        mine = results.select(kernel, batch=batch, kind="random", allowed=allowed, layout="vd")
        base = results.select(baseline, batch=batch, kind="random", allowed=allowed)
        if mine and base:
            rows.append({"kernel": kernel, "baseline": f"torch {baseline}", "case": case,
                         "speedup": base[0]["ms"] / mine[0]["ms"]})
    return rows


def _best(results, batch: int, kind: str, allowed: int) -> dict | None:
    rows = [r for r in results.rows if r["series"] in OUR_KERNELS and r["params"].get("layout", "vd") == "vd"
            and r["params"].get("batch") == batch and r["params"].get("kind") == kind
            and r["params"].get("allowed") == allowed]
    return min(rows, key=lambda r: r["ms"]) if rows else None


def target_report(results) -> str:
    """The issue's targets with the ratios measured in one run, as a Markdown table."""
    lines = ["| target | measured | met |", "|---|---|---|"]

    def add(name: str, value: str, ok: bool | None):
        lines.append(f"| {name} | {value} | {'–' if ok is None else ('yes' if ok else '**no**')} |")

    # 1. best kernel within 1.3x of max(floor, launch), batch 1, every mask kind and count
    for kind in _kinds(results):
        worst = None
        for r in results.select("dense_mask", batch=1, kind=kind):
            best = _best(results, 1, kind, r["params"]["allowed"])
            if best and "floor_ms" in best:
                ratio = best["ms"] / best["floor_ms"]
                if worst is None or ratio > worst[0]:
                    worst = (ratio, r["params"]["allowed"], best["series"])
        if worst:
            add(f"best kernel ≤ 1.3× max(allowed-row bytes / bandwidth, launch), batch 1, {kind} masks, worst count",
                f"{worst[0]:.2f}× at {worst[1]:,} allowed ({worst[2]})", worst[0] <= 1.3)
    # 2. <= 1000 allowed, batch 1: >= 10x faster than dense + mask
    ratios = []
    for kind in _kinds(results):
        for r in results.select("dense_mask", batch=1, kind=kind):
            if r["params"]["allowed"] <= 1000:
                best = _best(results, 1, kind, r["params"]["allowed"])
                if best:
                    ratios.append((r["ms"] / best["ms"], r["params"]["allowed"], kind))
    if ratios:
        low = min(ratios)
        add("≤ 1,000 allowed, batch 1: ≥ 10× faster than dense + mask (smallest speedup)",
            f"{low[0]:.1f}× ({low[2]}, {low[1]:,} allowed)", low[0] >= 10)
    # 3. 10,000 allowed: >= 2.5x faster than index_select + matmul
    for kind in _kinds(results):
        base = results.select("index_select", batch=1, kind=kind, allowed=10_000)
        best = _best(results, 1, kind, 10_000)
        if base and best:
            ratio = base[0]["ms"] / best["ms"]
            add(f"10,000 allowed ({kind}), batch 1: ≥ 2.5× faster than index_select + matmul",
                f"{ratio:.2f}× ({best['series']})", ratio >= 2.5)
    # 4. dispatch never > 5% slower than dense + mask
    worst_d = None
    for r in results.select("step7_dispatch"):
        p = r["params"]
        base = results.select("dense_mask", batch=p["batch"], kind=p["kind"], allowed=p["allowed"])
        if base:
            ratio = r["ms"] / base[0]["ms"]
            if worst_d is None or ratio > worst_d[0]:
                worst_d = (ratio, p)
    if worst_d:
        p = worst_d[1]
        add("dispatch never > 1.05× dense + mask (worst point)",
            f"{worst_d[0]:.2f}× (batch {p['batch']}, {p['kind']}, {p['allowed']:,} allowed)", worst_d[0] <= 1.05)
    # 5. batch 64, each row <= 0.1% of V: >= 3x faster than dense + mask; never slower at any density
    small, any_slower = [], []
    for r in results.select("dense_mask", batch=64):
        p = r["params"]
        best = _best(results, 64, p["kind"], p["allowed"])
        disp = results.select("step7_dispatch", batch=64, kind=p["kind"], allowed=p["allowed"])
        if best and p["allowed"] <= 0.001 * VOCAB:
            small.append((r["ms"] / best["ms"], p["allowed"], p["kind"]))
        if disp:
            any_slower.append((disp[0]["ms"] / r["ms"], p["allowed"], p["kind"]))
    if small:
        low = min(small)
        add("batch 64, ≤ 0.1% of V per row: ≥ 3× faster than dense + mask (smallest speedup)",
            f"{low[0]:.1f}× ({low[2]}, {low[1]:,} allowed)", low[0] >= 3)
    if any_slower:
        worst_b = max(any_slower)
        add("batch 64: dispatch never slower than dense + mask (worst point)",
            f"{worst_b[0]:.2f}× ({worst_b[2]}, {worst_b[1]:,} allowed)", worst_b[0] <= 1.0)
    return "\n".join(lines)
