"""Step 13: the masked LM head in a decode loop a CUDA graph captures once (:class:`MaskedHeadPlan`). What changes
each step lives in device buffers: the bitmask copied in, the union's ids and count built from it on the device for
step 7's and 10's kernels. One graph per **bucket**: the count's path and capacity (a power of two, at least 16)."""

from __future__ import annotations

from importlib.metadata import version
from typing import Sequence

import numpy as np
import torch
import triton
import triton.language as tl
from jaxtyping import Int
from torch import Tensor

from studylog import runtime
from studylog.checks import check_tensor
from studylog.masked_lm_head.compact import gathered_dot
from studylog.masked_lm_head.dense import row_skip_kernel
from studylog.masked_lm_head.dispatch import DispatchRule, choose_path, dense_logits, dispatch_rule, launch_constexprs
from studylog.masked_lm_head.formats import (WEIGHT_DTYPES, AllowedTokens, Hidden, Logits, Weight, bitmask_words,
                                             default_tiles, pack_bitmask, stream_tiles)
from studylog.masked_lm_head.launch import FastKernel

# The union's ids and count from the packed bitmask: each program ORs its words over the batch and takes its
# place in the id list from an atomic counter (zeroed before the launch); no kernel needs the ids sorted.

@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def union_ids_kernel(
    bitmask_ptr, ids_ptr, count_ptr, B, V, W, stride_bm,
    BLOCK_W: tl.constexpr, BLOCK_B: tl.constexpr,
):
    pid = tl.program_id(0)
    words = pid * BLOCK_W + tl.arange(0, BLOCK_W)
    in_w = words < W
    union = tl.zeros((BLOCK_W,), dtype=tl.int32)
    for b0 in range(0, B, BLOCK_B):
        seqs = b0 + tl.arange(0, BLOCK_B)
        tile = tl.load(bitmask_ptr + seqs[:, None] * stride_bm + words[None, :],
                       mask=(seqs[:, None] < B) & in_w[None, :], other=0)
        union = union | tl.reduce(tile, 0, _or)
    bits = tl.arange(0, 32)
    tok = words[:, None] * 32 + bits[None, :]
    flag = (((union[:, None] >> bits[None, :]) & 1) != 0) & (tok < V)
    flag = tl.reshape(flag.to(tl.int32), (BLOCK_W * 32,))
    tok = tl.reshape(tok, (BLOCK_W * 32,))
    base = tl.atomic_add(count_ptr, tl.sum(flag, axis=0))
    tl.store(ids_ptr + base + tl.cumsum(flag, axis=0) - 1, tok, mask=flag != 0)


# Step 7's kernel with the count on the device and the mask as bits. The id buffer holds the grid's whole
# capacity, so the id is loaded unmasked, beside the count: the row load waits for both at once. A program past
# the count (a bucket's spare capacity) returns as soon as the count arrives.

@triton.jit
def stream_count_kernel(
    h_ptr, w_ptr, out_ptr, bitmask_ptr, ids_ptr, count_ptr, V, n_compute, stride_wv,
    D: tl.constexpr, D_POW2: tl.constexpr, BLOCK_V: tl.constexpr, FILL_BLOCK: tl.constexpr,
    EVICTION: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_compute:
        first = pid * BLOCK_V
        slots = first + tl.arange(0, BLOCK_V)
        rows = tl.load(ids_ptr + slots)
        n = tl.load(count_ptr)
        if first < n:
            live = slots < n
            offs_d = tl.arange(0, D_POW2)[None, :]
            in_d = offs_d < D
            h = tl.load(h_ptr + offs_d, mask=in_d, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wv + offs_d,
                        mask=live[:, None] & in_d, other=0.0, eviction_policy=EVICTION).to(tl.float32)
            tl.store(out_ptr + rows, tl.sum(w * h, axis=1), mask=live)
    else:
        offs = (pid - n_compute) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        inside = offs < V
        word = tl.load(bitmask_ptr + offs // 32, mask=inside, other=-1)
        keep = (word >> (offs % 32)) & 1
        tl.store(out_ptr + offs, tl.full((FILL_BLOCK,), float("-inf"), tl.float32), mask=inside & (keep == 0))


# Step 10's kernel with the count on the device and the masks as bits. A program whose block of the union starts
# past the count returns before its loop over D. A fill program takes a block of one sequence's outputs.

@triton.jit
def batched_count_kernel(
    h_ptr, w_ptr, out_ptr, bitmask_ptr, union_ptr, count_ptr, B, V, n_compute,
    stride_hb, stride_wv, stride_ob, stride_bm,
    D: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
    FILL_BLOCK: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < n_compute:
        num_pid_b = tl.cdiv(B, BLOCK_B)
        pid_v = pid // num_pid_b  # neighbouring programs share rows: the second read hits L2
        pid_b = pid % num_pid_b
        slots = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        rows = tl.load(union_ptr + slots)
        n_union = tl.load(count_ptr)
        if pid_v * BLOCK_V < n_union:
            live = slots < n_union
            offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
            in_b = offs_b < B
            acc = gathered_dot(h_ptr, w_ptr, rows, live, offs_b, in_b, stride_hb, stride_wv, D, BLOCK_B, BLOCK_V,
                               BLOCK_D, DOT_DTYPE)
            tile = in_b[:, None] & live[None, :]
            word = tl.load(bitmask_ptr + offs_b[:, None] * stride_bm + rows[None, :] // 32, mask=tile, other=0)
            keep = (word >> (rows[None, :] % 32)) & 1
            tl.store(out_ptr + offs_b[:, None] * stride_ob + rows[None, :], acc, mask=tile & (keep != 0))
    else:
        fill = pid - n_compute
        per_row = tl.cdiv(V, FILL_BLOCK)
        seq = fill // per_row
        tok = (fill - seq * per_row) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
        inside = tok < V
        word = tl.load(bitmask_ptr + seq * stride_bm + tok // 32, mask=inside, other=-1)
        keep = (word >> (tok % 32)) & 1
        tl.store(out_ptr + seq * stride_ob + tok, tl.full((FILL_BLOCK,), float("-inf"), tl.float32),
                 mask=inside & (keep == 0))


# The dense path's mask: -inf wherever a sequence's bit is 0 (xgrammar's apply_token_bitmask_inplace's work).

@triton.jit
def apply_bitmask_kernel(out_ptr, bitmask_ptr, V, W, stride_ob, stride_bm, FILL_BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    per_row = tl.cdiv(V, FILL_BLOCK)
    seq = pid // per_row
    start = (pid - seq * per_row) * FILL_BLOCK
    words = start // 32 + tl.arange(0, FILL_BLOCK // 32)  # each word loaded once, then spread to its 32 tokens
    packed = tl.load(bitmask_ptr + seq * stride_bm + words, mask=words < W, other=-1)
    drop = tl.reshape(((packed[:, None] >> tl.arange(0, 32)[None, :]) & 1) == 0, (FILL_BLOCK,))
    tok = start + tl.arange(0, FILL_BLOCK)
    tl.store(out_ptr + seq * stride_ob + tok, tl.full((FILL_BLOCK,), float("-inf"), tl.float32),
             mask=(tok < V) & drop)


# The bitmask as one byte per token (the mask step 3 reads), for the plan's row-skip dense path.

@triton.jit
def unpack_bitmask_kernel(bitmask_ptr, mask_ptr, V, stride_bm, stride_mask, FILL_BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    per_row = tl.cdiv(V, FILL_BLOCK)
    seq = pid // per_row
    tok = (pid - seq * per_row) * FILL_BLOCK + tl.arange(0, FILL_BLOCK)
    inside = tok < V
    word = tl.load(bitmask_ptr + seq * stride_bm + tok // 32, mask=inside, other=0)
    tl.store(mask_ptr + seq * stride_mask + tok, ((word >> (tok % 32)) & 1).to(tl.uint8), mask=inside)


UNION_BLOCK_W, UNION_BLOCK_B = 32, 16  # union_ids_kernel: bitmask words a program (1,024 tokens), sequences a load
APPLY_BLOCK, APPLY_WARPS = 4096, 32  # apply_bitmask_kernel's outputs a program (unpack_bitmask_kernel's too), warps
MIN_CAPACITY = 16  # the smallest capacity of a compacted bucket


def bucket_for(batch: int, vocab: int, count: int, rule: DispatchRule) -> tuple[str, int]:
    """(path, capacity) for a union of at most ``count`` tokens: ``"stream"`` or ``"batched"`` with a power-of-two
    capacity, else the rule's dense path, ``("row_skip", V)`` or ``("dense", V)`` (cuBLAS, then the bitmask)."""
    n = min(max(int(count), 0), vocab)
    path = choose_path(batch, vocab, n, rule)
    if path in ("few_ids", "stream", "batched"):
        return ("stream" if batch == 1 else "batched"), min(vocab, max(MIN_CAPACITY, 1 << max(n - 1, 0).bit_length()))
    return ("row_skip" if path == "row_skip" else "dense"), vocab


def bucket_launches(bucket: tuple[str, int], h: Tensor, weight: Tensor, out: Tensor, bitmask: Tensor,
                    ids: Tensor | None = None, count: Tensor | None = None,
                    mask: Tensor | None = None) -> list[tuple]:
    """A bucket's launches, the plan's and the operator's: (kernel, grid, arguments, constexprs). Dense: the
    bitmask applied to ``out``'s logits; row skip: unpacked into ``mask`` for step 3's kernel; compacted: the union's
    ``ids`` and ``count`` built for step 7's or 10's kernel. Tensors are contiguous: a row stride is its length."""
    path, capacity = bucket
    batch, vocab, hidden, words = (int(n) for n in (*out.shape, weight.shape[1], bitmask.shape[1]))
    if path == "dense":
        return [(apply_bitmask_kernel, batch * -(-vocab // APPLY_BLOCK), (out, bitmask, vocab, words, vocab, words),
                 {"FILL_BLOCK": APPLY_BLOCK, "num_warps": APPLY_WARPS})]
    if path == "row_skip":
        t = default_tiles(3, batch)
        return [(unpack_bitmask_kernel, batch * -(-vocab // APPLY_BLOCK), (bitmask, mask, vocab, words, vocab),
                 {"FILL_BLOCK": APPLY_BLOCK, "num_warps": 4}),
                (row_skip_kernel, -(-batch // t.block_b) * -(-vocab // t.block_v),
                 (h, weight, out, mask, batch, vocab, hidden, hidden, hidden, vocab, vocab),
                 launch_constexprs("row_skip", t, hidden, weight.dtype))]
    union = (union_ids_kernel, -(-words // UNION_BLOCK_W), (bitmask, ids, count, batch, vocab, words, words),
             {"BLOCK_W": UNION_BLOCK_W, "BLOCK_B": min(UNION_BLOCK_B, triton.next_power_of_2(batch)), "num_warps": 4})
    if path == "stream":
        t = stream_tiles(capacity)
        n_compute = -(-capacity // t.block_v)
        return [union, (stream_count_kernel, n_compute + -(-vocab // t.fill_block),
                        (h, weight, out, bitmask, ids, count, vocab, n_compute, hidden),
                        launch_constexprs("stream", t, hidden, weight.dtype))]
    t = default_tiles(10, batch, capacity)
    n_compute = -(-capacity // t.block_v) * -(-batch // t.block_b)
    return [union, (batched_count_kernel, n_compute + batch * -(-vocab // t.fill_block),
                    (h, weight, out, bitmask, ids, count, batch, vocab, n_compute, hidden, hidden, vocab, words),
                    launch_constexprs("batched", t, hidden, weight.dtype))]


_FAST = {k: FastKernel(k) for k in (union_ids_kernel, row_skip_kernel, unpack_bitmask_kernel, stream_count_kernel,
                                    batched_count_kernel, apply_bitmask_kernel)}


def xgrammar_peer():
    """xgrammar's ``apply_token_bitmask_inplace`` and its version, or None and why it is missing."""
    try:
        import xgrammar

        return xgrammar.apply_token_bitmask_inplace, version("xgrammar")
    except Exception as exc:  # ImportError, or a broken install: the peer is optional
        return None, f"{type(exc).__name__}: {exc}"


class MaskedHeadPlan:
    """A masked LM head for a decode loop in a CUDA graph. ``weight``: ``[V, D]``, bf16 or fp16; ``h``: the
    ``[batch, D]`` buffer the model writes into (else a new one). Each step::

        plan.h.copy_(hidden)                                   # or the model wrote it there
        plan.bitmask.copy_(host_bitmask, non_blocking=True)    # from pinned memory
        logits = plan.step(count)                              # replays the graph of count's bucket

    ``count``: the union's token count, or a bound above it. The dense bucket applies the bitmask with xgrammar's
    GPU kernel where installed (``use_xgrammar``), else :func:`apply_bitmask_kernel`."""

    def __init__(self, weight: Weight, batch: int, *, h: Hidden | None = None, rule: DispatchRule | None = None,
                 use_xgrammar: bool = True):
        check_tensor("weight", weight, dtype=WEIGHT_DTYPES, ndim=2, contiguous=True)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        if runtime.mode() == "gpu" and not weight.is_cuda:
            raise ValueError("the Triton kernels run on the GPU here: move the weight to cuda")
        if runtime.mode() == "interpreter" and weight.is_cuda:
            raise ValueError("Triton runs in its CPU interpreter in this process: keep the weight on the CPU")
        self.weight, self.batch, self.rule, self.use_xgrammar = weight, batch, rule, use_xgrammar
        self.vocab, self.hidden = weight.shape
        dev = weight.device
        h = torch.zeros(batch, self.hidden, dtype=weight.dtype, device=dev) if h is None else h
        self.h = check_tensor("h", h, dtype=weight.dtype, shape=(batch, self.hidden), contiguous=True, like=weight)
        self.bitmask = torch.zeros(batch, bitmask_words(self.vocab), dtype=torch.int32, device=dev)  # caller fills
        self.out = torch.empty(batch, self.vocab, dtype=torch.float32, device=dev)  # the last step's logits
        # the union's ids (room for every token, and a block of slack past it) and their count
        self.ids = torch.zeros(self.vocab + 64, dtype=torch.int32, device=dev)
        self.count = torch.zeros(1, dtype=torch.int32, device=dev)
        self._graphs: dict[tuple[str, int], torch.cuda.CUDAGraph] = {}
        self._launches: dict[tuple[str, int], list[tuple]] = {}
        self._mask: Tensor | None = None  # one byte per token, made for the row-skip path when it is first needed
        self._buckets: dict[int, tuple[str, int]] = {}
        self._set_count: int | None = None  # the union count of the last set_allowed, which step checks

    def bucket(self, count: int) -> tuple[str, int]:  # bucket_for this plan, kept per count
        got = self._buckets.get(count)
        if got is None:
            got = bucket_for(self.batch, self.vocab, count, self.rule or dispatch_rule())
            if len(self._buckets) < 4096:
                self._buckets[count] = got
        return got

    def buckets(self) -> list[tuple[str, int]]:
        """Every bucket a count can fall in, smallest first (the rule's largest compacted count included)."""
        counts = [c for c in (MIN_CAPACITY << i for i in range(self.vocab.bit_length())) if c < self.vocab]
        counts += [self.vocab, (self.rule or dispatch_rule()).limits(self.batch, self.vocab)[0]]
        seen = {self.bucket(count): None for count in sorted(counts)}
        return sorted(seen, key=lambda b: (b[0] in ("dense", "row_skip"), b[1]))

    def launch(self, count: int) -> Logits:
        """Enqueue one step without a graph: what a graph of its bucket holds. Returns :attr:`out`."""
        self._check_count(count)
        self._enqueue(self.bucket(count))
        return self.out

    def _enqueue(self, bucket: tuple[str, int]) -> None:
        launches = self._launches.get(bucket)
        if launches is None:
            launches = self._launches[bucket] = self._plan_launches(bucket)
        if bucket[0] == "dense":
            dense_logits(self.h, self.weight, self.out)
        elif bucket[0] != "row_skip":
            self.count.zero_()
        for kernel, grid, args, constexprs in launches:
            kernel(grid, args, constexprs)

    def _plan_launches(self, bucket: tuple[str, int]) -> list[tuple]:
        """The kernel launches of a bucket, worked out once: (launcher, grid, arguments, constexprs)."""
        if bucket[0] == "dense" and self.use_xgrammar and self.weight.is_cuda:
            # xgrammar's GPU kernel (its CPU one writes past the row's end for 0 bits past V): the same work as the
            # practitioners' path, by their own kernel; else ours does it
            peer = xgrammar_peer()[0]
            if peer is not None:
                return [(lambda grid, args, constexprs: peer(*args), 0, (self.out, self.bitmask), {})]
        if bucket[0] == "row_skip" and self._mask is None:
            self._mask = torch.zeros(self.batch, self.vocab, dtype=torch.uint8, device=self.weight.device)
        return [(_FAST[kernel], grid, args, constexprs) for kernel, grid, args, constexprs in
                bucket_launches(bucket, self.h, self.weight, self.out, self.bitmask, self.ids, self.count, self._mask)]

    def capture(self) -> None:
        """Capture every bucket's graph now rather than on first use."""
        for bucket in self.buckets():
            self._graph(bucket)

    def _graph(self, bucket: tuple[str, int]) -> torch.cuda.CUDAGraph:
        graph = self._graphs.get(bucket)
        if graph is None:  # compiled and warmed up on a side stream, outside the capture
            graph = self._graphs[bucket] = runtime.cuda_graph(lambda: self._enqueue(bucket), warmups=1)[0]
        return graph

    def _check_count(self, count: int) -> None:
        """``count`` must bound the union (an allowed id past a bucket's capacity would be left unwritten); checked
        against the count :meth:`set_allowed` returned, not the device's (no wait for the GPU)."""
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
            raise TypeError(f"count must be an int (the union's token count), got {type(count).__name__}")
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        if self._set_count is not None and count < self._set_count:
            raise ValueError(f"count {count} is below the {self._set_count} tokens of the union that set_allowed "
                             "wrote: the logits of the others would be left unwritten. Pass the count set_allowed "
                             "returned, or a bound above it")

    def step(self, count: int) -> Logits:
        """One decode step for a union of at most ``count`` tokens: replay its bucket's graph (captured on first
        use); in Triton's interpreter, :meth:`launch`. Returns :attr:`out`."""
        if not self.weight.is_cuda:
            return self.launch(count)
        self._check_count(count)
        self._graph(self.bucket(count)).replay()
        return self.out

    def set_allowed(self, ids_per_sequence: Sequence, *, non_blocking: bool = False) -> int:
        """Fill :attr:`bitmask` from one list of allowed ids per sequence; returns the union's count, for
        :meth:`step` (an engine copies the bitmask its grammar library filled instead)."""
        allowed = AllowedTokens.from_ids(ids_per_sequence, self.vocab, device="cpu")
        if allowed.batch != self.batch:
            raise ValueError(f"{allowed.batch} sets given for a plan of batch {self.batch}")
        self.bitmask.copy_(pack_bitmask(allowed.mask), non_blocking=non_blocking)
        self._set_count = allowed.union_count
        return allowed.union_count


def step13_plan(plan: MaskedHeadPlan, bitmask: Int[Tensor, "b w"], count: int) -> Logits:
    """Step 13: one decode step from the grammar's packed bitmask (``[B, ceil(V / 32)]`` int32, best pinned),
    copied into ``plan.bitmask`` without waiting, then ``count``'s bucket's graph replayed. Returns ``plan.out``."""
    plan.bitmask.copy_(bitmask, non_blocking=True)
    return plan.step(count)
