"""Chapter 6: multi-item scoring attention, where one prefill scores many candidate items.

A ranking request asks how much one member likes each of N candidate items. Instead of N forward passes
over ``prefix + item_i``, the items are packed into one sequence::

    prefix <d> item_1 <d> item_2 <d> ... item_N <d>

and the attention mask keeps the items from seeing each other. **The rule implemented and tested here**
(FlashInfer's multi-item scoring rule), for a query at index ``q`` and a key at index ``k`` of one prompt with
prefix length ``P``, where ``pos[q]`` is the query's position inside its item (0 at a delimiter)::

    visible(q, k) = k <= q  and  (k < P  or  k >= q - pos[q])

that is:

* a prefix token attends causally to the prefix;
* a delimiter attends to the whole prefix and to itself;
* a token of item ``i`` attends to the whole prefix, to the delimiter that opens item ``i`` and causally
  to the tokens of item ``i`` up to itself; never to another item.

This differs from the shortest statement of the idea ("an item sees the prefix and itself, a delimiter sees
the prefix") in two keys per row, on purpose: every row keeps at least one key (itself) even when the prefix
is empty, and every token of ``<d> item_i`` sees exactly what it would see in a separate causal forward over
``prefix <d> item_i``, so the packed pass and the one-pass-per-item baseline compute the same numbers.

The score of item ``i`` is read at the last token of the item (the token just before the delimiter that
closes it): the log-probabilities of K label tokens ("Yes"/"No"), an ``N x K`` matrix per prompt.

Steps (each its own kernel; the diff between two steps is the lesson):

1. :func:`attention_dense_sdpa`: materialise the boolean mask and call ``scaled_dot_product_attention``.
2. :func:`attn_fwd_dense_mask`: a flash-attention forward (online softmax) reading a dense mask tensor.
3. :func:`attn_fwd_mask_on_the_fly`: the mask computed from the prefix length and item positions.
4. :func:`attn_fwd_tile_skip`: key/value tiles no row of a query tile can see are never loaded, and tiles
   every row sees whole skip the mask arithmetic.
5. :func:`attn_fwd_batched`: prompts of different shapes in one launch, programs in an order planned on the
   host (:func:`schedule_table`: heads in groups whose keys and values fit in L2, heaviest query tiles first
   within a group); :func:`score_items` turns the outputs into one ``N x K`` score matrix per prompt.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Sequence

import torch
import triton
import triton.language as tl
from jaxtyping import Bool, Float, Int
from torch import Tensor

from studylog import runtime

#: multiply scores by log2(e) once, so the softmax can use exp2 (one instruction on the GPU)
LOG2E = 1.4426950408889634

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
STEPS = (1, 2, 3, 4, 5)

# Blocks used in the interpreter: small, so that tiny test sequences still span several tiles.
INTERPRETER_BLOCKS = (16, 16)


# ---------------------------------------------------------------------------------------------
# The batch layout: where the prefix, the delimiters and the items lie, checked once per batch
# ---------------------------------------------------------------------------------------------

def _as_int_list(x: Any, name: str) -> list[int]:
    if isinstance(x, Tensor):
        if x.dtype.is_floating_point or x.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got a {x.dtype} tensor")
        if x.ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
        return [int(v) for v in x.detach().cpu().to(torch.int64).tolist()]
    if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
        raise TypeError(f"{name} must be a sequence of integers, got {type(x).__name__}")
    out = []
    for i, v in enumerate(x):
        if isinstance(v, (bool, float)) or not hasattr(v, "__index__"):
            raise TypeError(f"{name}[{i}] must be an integer, got {v!r}")
        out.append(operator.index(v))
    return out


@dataclass(frozen=True, eq=False)
class MultiItemBatch:
    """The layout of a batch of multi-item prompts, packed one after the other.

    Prompt ``b`` occupies tokens ``cu_seqlens[b] : cu_seqlens[b + 1]`` of the packed sequence: ``prefix_lens[b]``
    prefix tokens, then a delimiter, then each item followed by a delimiter. Build it with
    :meth:`from_item_lens` or, from the seed's (FlashInfer's) inputs, :meth:`from_token_positions`; both check
    everything once, on the host, so the attention calls (one per layer in a model) need no device sync.
    """

    prefix_lens: tuple[int, ...]
    item_lens: tuple[tuple[int, ...], ...]
    #: ``[B + 1]`` int32: where each prompt starts in the packed sequence
    cu_seqlens: Int[Tensor, " b_plus_1"]
    #: ``[B]`` int32
    prefix_lens_t: Int[Tensor, " b"]
    #: ``[B, L]`` int32, the seed's ``token_pos_in_items``: for each token from the prefix's end on, its
    #: position inside its item (0 at delimiters), zero-padded to ``L`` columns
    token_pos: Int[Tensor, "b l"]
    #: ``[B]`` int32: the longest item of each prompt (an upper bound, as the seed passes it)
    max_item_lens_t: Int[Tensor, " b"]
    #: step 5's work schedules, built once per (heads, order) on first use (see :func:`schedule_table`)
    _schedules: dict = field(default_factory=dict, init=False, repr=False)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_item_lens(cls, prefix_lens: Sequence[int], item_lens: Sequence[Sequence[int]],
                       device: torch.device | str | None = None) -> "MultiItemBatch":
        """``prefix_lens[b]`` prefix tokens and items of lengths ``item_lens[b]`` in prompt ``b``."""
        prefix = _as_int_list(prefix_lens, "prefix_lens")
        if isinstance(item_lens, Tensor) or not isinstance(item_lens, Sequence):
            raise TypeError("item_lens must be a list with one list of item lengths per prompt")
        if len(item_lens) != len(prefix):
            raise ValueError(f"mismatched batch metadata: {len(prefix)} prefix_lens but {len(item_lens)} "
                             "lists of item_lens")
        items = [_as_int_list(lens, f"item_lens[{b}]") for b, lens in enumerate(item_lens)]
        for b, p in enumerate(prefix):
            if p < 0:
                raise ValueError(f"prefix_lens[{b}] must be >= 0, got {p}")
            for i, n in enumerate(items[b]):
                if n < 1:
                    raise ValueError(f"item_lens[{b}][{i}] must be >= 1 (an item needs a token to score), got {n}")
        return cls._build(prefix, items, None, device)

    @classmethod
    def from_token_positions(cls, prefix_lens: Any, token_pos_in_items: Any, max_item_lens: Any, *,
                             token_pos_in_items_len: int | None = None, seq_lens: Any = None,
                             device: torch.device | str | None = None) -> "MultiItemBatch":
        """The seed's inputs: per prompt, its prefix length, the position of every token from the prefix's end
        on inside its item (0 at delimiters, e.g. ``[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 0]`` for items of 3, 2
        and 4 tokens) zero-padded to ``token_pos_in_items_len`` and concatenated (or as a ``[B, L]`` tensor),
        and its longest item. ``seq_lens`` (optional) are checked against the positions."""
        prefix = _as_int_list(prefix_lens, "prefix_lens")
        max_items = _as_int_list(max_item_lens, "max_item_lens")
        batch = len(prefix)
        if len(max_items) != batch:
            raise ValueError(f"mismatched batch metadata: {batch} prefix_lens but {len(max_items)} max_item_lens")
        pos = torch.as_tensor(token_pos_in_items) if not isinstance(token_pos_in_items, Tensor) else token_pos_in_items
        if pos.dtype.is_floating_point or pos.dtype == torch.bool:
            raise TypeError(f"token_pos_in_items must hold integers, got {pos.dtype}")
        pos = pos.detach().cpu().to(torch.int64)
        if pos.ndim == 1:
            if token_pos_in_items_len is None:
                if batch != 1:
                    raise ValueError("token_pos_in_items is 1-D for a batch of several prompts: pass "
                                     "token_pos_in_items_len, the padded length of each prompt's row")
                token_pos_in_items_len = pos.numel()
            if token_pos_in_items_len < 1 or pos.numel() != batch * token_pos_in_items_len:
                raise ValueError(f"mismatched batch metadata: token_pos_in_items has {pos.numel()} entries, "
                                 f"not {batch} prompts x token_pos_in_items_len={token_pos_in_items_len}")
            pos = pos.reshape(batch, token_pos_in_items_len)
        elif pos.ndim == 2:
            if pos.shape[0] != batch:
                raise ValueError(f"mismatched batch metadata: token_pos_in_items has {pos.shape[0]} rows for "
                                 f"{batch} prompts")
        else:
            raise ValueError(f"token_pos_in_items must be 1-D or 2-D, got shape {tuple(pos.shape)}")
        seqs = None
        if seq_lens is not None:
            seqs = _as_int_list(seq_lens, "seq_lens")
            if len(seqs) != batch:
                raise ValueError(f"mismatched batch metadata: {batch} prefix_lens but {len(seqs)} seq_lens")
        items: list[list[int]] = []
        for b in range(batch):
            if prefix[b] < 0:
                raise ValueError(f"prefix_lens[{b}] must be >= 0, got {prefix[b]}")
            if seqs is not None and prefix[b] >= seqs[b]:
                raise ValueError(f"prefix_lens[{b}]={prefix[b]} does not fit its sequence (seq_lens[{b}]={seqs[b]}):"
                                 " a prompt holds its prefix and at least the delimiter after it")
            items.append(_items_from_positions(pos[b].tolist(), b, max_items[b]))
            length = prefix[b] + sum(items[b]) + len(items[b]) + 1
            if seqs is not None and length != seqs[b]:
                raise ValueError(f"token_pos_in_items[{b}] does not fit the sequence: prefix {prefix[b]} + "
                                 f"{len(items[b])} items + delimiters make {length} tokens, but "
                                 f"seq_lens[{b}]={seqs[b]}")
        return cls._build(prefix, items, max_items, device)

    @classmethod
    def _build(cls, prefix: list[int], items: list[list[int]], max_items: list[int] | None,
               device: torch.device | str | None) -> "MultiItemBatch":
        device = torch.device(device) if device is not None else runtime.device()
        if not prefix:
            raise ValueError("a batch needs at least one prompt")
        seq_lens = [p + sum(it) + len(it) + 1 for p, it in zip(prefix, items)]
        width = max(s - p for s, p in zip(seq_lens, prefix))
        pos = torch.zeros(len(prefix), width, dtype=torch.int32)
        for b, its in enumerate(items):
            cursor = 1  # column 0 is the delimiter right after the prefix
            for n in its:
                pos[b, cursor:cursor + n] = torch.arange(1, n + 1, dtype=torch.int32)
                cursor += n + 1  # the item, then the delimiter that closes it
        if max_items is None:
            max_items = [max(its, default=0) for its in items]
        cu = [0]
        for s in seq_lens:
            cu.append(cu[-1] + s)
        return cls(
            prefix_lens=tuple(prefix),
            item_lens=tuple(tuple(it) for it in items),
            cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=device),
            prefix_lens_t=torch.tensor(prefix, dtype=torch.int32, device=device),
            token_pos=pos.to(device),
            max_item_lens_t=torch.tensor(max_items, dtype=torch.int32, device=device),
        )

    # -- derived facts (cached: the attention wrappers ask for them on every call) -----------------
    @property
    def device(self) -> torch.device:
        return self.cu_seqlens.device

    @property
    def batch_size(self) -> int:
        return len(self.prefix_lens)

    @cached_property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(p + sum(it) + len(it) + 1 for p, it in zip(self.prefix_lens, self.item_lens))

    @cached_property
    def seq_starts(self) -> tuple[int, ...]:
        starts, total = [], 0
        for s in self.seq_lens:
            starts.append(total)
            total += s
        return tuple(starts)

    @cached_property
    def total_tokens(self) -> int:
        return sum(self.seq_lens)

    @cached_property
    def max_seq_len(self) -> int:
        return max(self.seq_lens)

    @cached_property
    def num_items(self) -> tuple[int, ...]:
        return tuple(len(it) for it in self.item_lens)

    @cached_property
    def host_item_starts(self) -> tuple[tuple[int, ...], ...]:
        """Per prompt, for every token from the prefix's end on, the index (in the prompt) of the delimiter
        that opens its item: ``row - pos[row]``, computed on the host from the item lengths (no device sync)."""
        out = []
        for p, lens in zip(self.prefix_lens, self.item_lens):
            starts, delim = [p], p
            for n in lens:
                starts += [delim] * n + [delim + n + 1]
                delim += n + 1
            out.append(tuple(starts))
        return tuple(out)

    def score_positions(self, prompt: int | None = None) -> list[int]:
        """Indices in the packed sequence of the last token of every item (the token just before the
        delimiter that closes it), where the item's score is read; all prompts, or one."""
        out = []
        prompts = range(self.batch_size) if prompt is None else [prompt]
        for b in prompts:
            cursor = self.seq_starts[b] + self.prefix_lens[b]  # the first delimiter
            for n in self.item_lens[b]:
                out.append(cursor + n)
                cursor += n + 1
        return out

    def describe(self) -> str:
        return (f"{self.batch_size} prompt(s), {self.total_tokens:,} tokens: prefixes {list(self.prefix_lens)}, "
                f"items per prompt {list(self.num_items)}")


def _items_from_positions(row: list[int], b: int, max_item_len: int) -> list[int]:
    """Item lengths from one prompt's (zero-padded) positions; raises on positions that do not fit."""
    name = f"token_pos_in_items[{b}]"
    if not row or row[0] != 0:
        raise ValueError(f"{name} must start with 0, the delimiter right after the prefix; got {row[:4]}")
    if max_item_len < 0:
        raise ValueError(f"max_item_lens[{b}] must be >= 0, got {max_item_len}")
    items, end = [], None
    for j in range(1, len(row)):
        p = row[j]
        if end is not None:
            if p != 0:
                raise ValueError(f"{name}[{j}]={p} comes after the final delimiter (column {end}): two delimiters "
                                 "in a row would make an empty item, and the padding must be zeros")
            continue
        if p == 0:
            if row[j - 1] == 0:  # two delimiters in a row: the first one was the last
                end = j - 1
                continue
            items.append(row[j - 1])
        elif p != row[j - 1] + 1:
            raise ValueError(f"{name}[{j}]={p} does not fit: a position inside an item must follow "
                             f"{row[j - 1]} with {row[j - 1] + 1}, or be 0 at a delimiter")
        elif p > max_item_len:
            raise ValueError(f"{name}[{j}]={p} does not fit: it is past max_item_lens[{b}]={max_item_len}")
    if end is None and row[-1] != 0:
        raise ValueError(f"{name} must end with the delimiter (0) that closes the last item; it ends with "
                         f"{row[-1]} (is token_pos_in_items_len too small?)")
    return items


def dense_mask(batch: MultiItemBatch, prompt: int = 0) -> Bool[Tensor, "s s"]:
    """The boolean ``[S, S]`` mask of one prompt (True: the query of the row may see the key of the column)."""
    s, p = batch.seq_lens[prompt], batch.prefix_lens[prompt]
    idx = torch.arange(s, device=batch.device)
    item_start = idx.clone()  # prefix rows: never used, the causal test decides
    item_start[p:] -= batch.token_pos[prompt, : s - p].to(idx.dtype)
    rows, cols = idx[:, None], idx[None, :]
    return (cols <= rows) & ((cols < p) | (cols >= item_start[:, None]))


# ---------------------------------------------------------------------------------------------
# Step 1: the dense reference
# ---------------------------------------------------------------------------------------------

def attention_dense_sdpa(q: Float[Tensor, "h t d"], k: Float[Tensor, "h t d"], v: Float[Tensor, "h t d"],
                         batch: MultiItemBatch, sm_scale: float, out: Float[Tensor, "h t d"]) -> Float[Tensor, "h t d"]:
    """Step 1: build every prompt's ``[S, S]`` boolean mask and call ``scaled_dot_product_attention``."""
    for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
        rows = slice(start, start + s)
        out[:, rows] = torch.nn.functional.scaled_dot_product_attention(
            q[None, :, rows], k[None, :, rows], v[None, :, rows], attn_mask=dense_mask(batch, b), scale=sm_scale)[0]
    return out


def reference_attention(q: Float[Tensor, "h t d"], k: Float[Tensor, "h t d"], v: Float[Tensor, "h t d"],
                        batch: MultiItemBatch, sm_scale: float | None = None) -> Float[Tensor, "h t d"]:
    """Float64 attention with the dense mask, written out (no fused kernel): what every step is checked against."""
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
        rows = slice(start, start + s)
        scores = (q[:, rows].double() @ k[:, rows].double().transpose(-1, -2)) * sm_scale
        scores = scores.masked_fill(~dense_mask(batch, b), float("-inf"))
        out[:, rows] = torch.softmax(scores, dim=-1) @ v[:, rows].double()
    return out


# ---------------------------------------------------------------------------------------------
# Triton kernels. Layout: q, k, v, out are [heads, tokens, head_dim] with a unit stride on head_dim.
# ---------------------------------------------------------------------------------------------

_GPU_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=3),
]
#: steps 2 and 3 are way stations: tune them over fewer configs (each config is a compile)
_FEW_GPU_CONFIGS = [_GPU_CONFIGS[0], _GPU_CONFIGS[3]]
#: fits in any dtype at head_dim 128 (float32: 32 KiB of q + 2 stages x 32 KiB of k and v)
_SMALL_CONFIG = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2)

#: shared memory we let a config plan for (an H100/H200 SM has 227 KiB); keeps the tuner off configs that
#: cannot fit, e.g. the big ones in float32
_SMEM_BUDGET = 200 * 1024


def _prune_configs(configs, named_args, **kwargs):
    elem = named_args["Q"].element_size()
    head_dim = named_args["HEAD_DIM"] if "HEAD_DIM" in named_args else kwargs["HEAD_DIM"]
    kept = []
    for cfg in configs:
        bm, bn, stages = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_stages
        # q, then the tiles of k and v (and of step 2's mask) the pipeliner keeps in flight: num_stages - 1 each
        smem = (bm * head_dim + (stages - 1) * 2 * bn * head_dim) * elem + (stages - 1) * bm * bn
        if smem <= _SMEM_BUDGET:
            kept.append(cfg)
    return kept or [_SMALL_CONFIG]


def _tuned(configs, key=("HEAD_DIM",)):
    """On the GPU, let Triton pick the tile shape among ``configs`` (per value of the ``key`` arguments, and
    dtype); in the interpreter, the wrapper passes small blocks itself."""
    def wrap(kernel):
        if runtime.mode() != "gpu":
            return kernel
        return triton.autotune(configs=configs, key=list(key),
                               prune_configs_by={"early_config_prune": _prune_configs})(kernel)
    return wrap


def _size_bucket(tokens: int) -> int:
    """The autotuning key of steps 4 and 5 besides the head dim: a 3,000-token prompt and an 18,000-token
    batch want different tiles, and one tuning per power of two of the token count is enough."""
    return max(int(tokens), 1).bit_length()


# -- step 2 -----------------------------------------------------------------------------------

@_tuned(_FEW_GPU_CONFIGS)
@triton.jit
def attn_fwd_dense_mask(
    Q, K, V, Out, Mask,
    stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt, stride_oh, stride_ot,
    seq_len, qk_scale,
    HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    q = tl.load(Q + off_h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + off_h * stride_kh
    v_base = V + off_h * stride_vh
    # running max (finite: a row may see no key in its first tiles), running sum, unnormalised output
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < seq_len
        k = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None], mask=col_ok[None, :], other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        mask_tile = Mask + offs_m[:, None].to(tl.int64) * seq_len + cols[None, :]
        visible = tl.load(mask_tile, mask=row_ok[:, None] & col_ok[None, :], other=0) != 0
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # scale after the max: qk_scale > 0
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one fused multiply-add per score
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    # a row that saw no key (only padding rows past the sequence can) would divide 0 by 0
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + off_h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None])


# -- step 3 -----------------------------------------------------------------------------------

@_tuned(_FEW_GPU_CONFIGS)
@triton.jit
def attn_fwd_mask_on_the_fly(
    Q, K, V, Out, Pos,
    stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt, stride_oh, stride_ot,
    seq_len, prefix_len, qk_scale,
    HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    q = tl.load(Q + off_h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + off_h * stride_kh
    v_base = V + off_h * stride_vh
    # where each row's item starts (its delimiter); prefix rows keep their own index, which the causal test covers
    in_items = row_ok & (offs_m >= prefix_len)
    row_start = offs_m - tl.load(Pos + offs_m - prefix_len, mask=in_items, other=0)
    # running max (finite: a row may see no key in its first tiles), running sum, unnormalised output
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < seq_len
        k = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None], mask=col_ok[None, :], other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        # keys past seq_len pass this test only for rows past seq_len, which are never stored
        keys = cols[None, :]
        visible = (keys <= offs_m[:, None]) & ((keys < prefix_len) | (keys >= row_start[:, None]))
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # scale after the max: qk_scale > 0
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one fused multiply-add per score
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    # a row that saw no key (only padding rows past the sequence can) would divide 0 by 0
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + off_h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None])


# -- step 4 -----------------------------------------------------------------------------------

@triton.jit
def _attend_key_tiles(
    acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start, prefix_len, seq_len, lo, hi, qk_scale,
    MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Step 3's loop body over the key tiles ``[lo, hi)``; ``MASKED=False`` for tiles every row sees whole."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if MASKED:
            col_ok = cols < seq_len
            k = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None], mask=col_ok[None, :], other=0.0)
            v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        else:  # whole prefix tiles: in bounds by construction
            k = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None])
            v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :])
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)
        if MASKED:
            keys = cols[None, :]
            visible = (keys <= offs_m[:, None]) & ((keys < prefix_len) | (keys >= row_start[:, None]))
            qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # scale after the max: qk_scale > 0
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one fused multiply-add per score
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@_tuned(_GPU_CONFIGS, key=("HEAD_DIM", "size_bucket"))
@triton.jit
def attn_fwd_tile_skip(
    Q, K, V, Out, Pos, TileCounts,
    stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt, stride_oh, stride_ot,
    seq_len, prefix_len, qk_scale, size_bucket,
    HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr, COUNT_TILES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_h = tl.program_id(1).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    q = tl.load(Q + off_h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + off_h * stride_kh
    v_base = V + off_h * stride_vh
    # where each row's item starts (its delimiter); prefix rows keep their own index, which the causal test covers
    in_items = row_ok & (offs_m >= prefix_len)
    row_start = offs_m - tl.load(Pos + offs_m - prefix_len, mask=in_items, other=0)
    # running max (finite: a row may see no key in its first tiles), running sum, unnormalised output
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    m_lo = start_m * BLOCK_M
    m_hi = tl.minimum(m_lo + BLOCK_M, seq_len)
    # 1. prefix tiles every row sees whole (keys < P and <= the first row): no mask arithmetic
    full_hi = (tl.minimum(prefix_len, m_lo + 1) // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, 0, full_hi, qk_scale,
                                      False, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    # 2. the rest of the prefix, up to the diagonal
    prefix_hi = tl.cdiv(tl.minimum(prefix_len, m_hi), BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, full_hi, prefix_hi, qk_scale,
                                      True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    # 3. the items, from the delimiter of the first item row's item: the tiles between are never loaded
    first_item_row = tl.maximum(m_lo, prefix_len)
    items_lo = first_item_row - tl.load(Pos + first_item_row - prefix_len)
    items_lo = tl.maximum((items_lo // BLOCK_N) * BLOCK_N, prefix_hi)
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, items_lo, m_hi, qk_scale,
                                      True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    if COUNT_TILES:  # how many key tiles this query tile visited (tests and the tile-skip figure)
        visited = prefix_hi // BLOCK_N + tl.maximum(tl.cdiv(m_hi - items_lo, BLOCK_N), 0)
        tl.store(TileCounts + start_m, visited, mask=off_h == 0)
    # a row that saw no key (only padding rows past the sequence can) would divide 0 by 0
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + off_h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None])


# -- step 5 -----------------------------------------------------------------------------------

@_tuned(_GPU_CONFIGS, key=("HEAD_DIM", "size_bucket"))
@triton.jit
def attn_fwd_batched(
    Q, K, V, Out, Schedule, stride_schedule, Pos, stride_pos, TileCounts, stride_counts,
    stride_qh, stride_qt, stride_kh, stride_kt, stride_vh, stride_vt, stride_oh, stride_ot,
    qk_scale, size_bucket,
    HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr, COUNT_TILES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # One program per (prompt, query tile, head), in the order the host planned (schedule_table): the GPU
    # starts programs roughly in index order, so entry i says what program i computes. The table has one row
    # per tile height (16, 32, 64, 128 rows); each entry carries its prompt's offsets, so one round of loads
    # from a single 32-byte entry is all the lookup a program does, and no program is empty.
    work = Schedule + ((BLOCK_M >= 32) + (BLOCK_M >= 64) + (BLOCK_M >= 128)) * stride_schedule \
        + tl.program_id(0) * 8
    prompt = tl.load(work)
    start_m = tl.load(work + 1)
    off_h = tl.load(work + 2).to(tl.int64)
    seq_begin = tl.load(work + 3)
    seq_len = tl.load(work + 4)
    prefix_len = tl.load(work + 5)
    Q += seq_begin.to(tl.int64) * stride_qt
    K += seq_begin.to(tl.int64) * stride_kt
    V += seq_begin.to(tl.int64) * stride_vt
    Out += seq_begin.to(tl.int64) * stride_ot
    Pos += prompt.to(tl.int64) * stride_pos
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len
    q = tl.load(Q + off_h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    k_base = K + off_h * stride_kh
    v_base = V + off_h * stride_vh
    # where each row's item starts (its delimiter); prefix rows keep their own index, which the causal test covers
    in_items = row_ok & (offs_m >= prefix_len)
    row_start = offs_m - tl.load(Pos + offs_m - prefix_len, mask=in_items, other=0)
    # running max (finite: a row may see no key in its first tiles), running sum, unnormalised output
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    m_lo = start_m * BLOCK_M
    m_hi = tl.minimum(m_lo + BLOCK_M, seq_len)
    # 1. prefix tiles every row sees whole (keys < P and <= the first row): no mask arithmetic
    full_hi = (tl.minimum(prefix_len, m_lo + 1) // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, 0, full_hi, qk_scale,
                                      False, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    # 2. the rest of the prefix, up to the diagonal
    prefix_hi = tl.cdiv(tl.minimum(prefix_len, m_hi), BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, full_hi, prefix_hi, qk_scale,
                                      True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    # 3. the items, from the delimiter of the first item row's item: the tiles between are never loaded
    first_item_row = tl.maximum(m_lo, prefix_len)
    items_lo = first_item_row - tl.load(Pos + first_item_row - prefix_len)
    items_lo = tl.maximum((items_lo // BLOCK_N) * BLOCK_N, prefix_hi)
    acc, l_i, m_i = _attend_key_tiles(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, offs_m, row_start,
                                      prefix_len, seq_len, items_lo, m_hi, qk_scale,
                                      True, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    if COUNT_TILES:  # how many key tiles this query tile visited (tests and the tile-skip figure)
        visited = prefix_hi // BLOCK_N + tl.maximum(tl.cdiv(m_hi - items_lo, BLOCK_N), 0)
        tl.store(TileCounts + prompt * stride_counts + start_m, visited, mask=off_h == 0)
    # a row that saw no key (only padding rows past the sequence can) would divide 0 by 0
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + off_h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :], out.to(Out.dtype.element_ty),
             mask=row_ok[:, None])


KERNELS = {2: attn_fwd_dense_mask, 3: attn_fwd_mask_on_the_fly, 4: attn_fwd_tile_skip, 5: attn_fwd_batched}


# -- step 5's schedule: which program computes what, in which order -----------------------------

#: the program orders step 5 can run in (the benchmark times them all; the first is the default):
#:
#: * ``"head_groups"``: the heads in a few groups, each as large as fits :data:`GROUP_KV_BYTES` of keys and
#:   values of the whole batch; group after group, and within a group every (prompt, query tile, head) with
#:   the most keys first. The programs running at once read one group's keys and values, which stay in L2,
#:   and the last group ends with its lightest tiles, which fill the tail of the launch;
#: * ``"heads_outer"``: the same with groups of one head;
#: * ``"prompts_outer"``: prompt by prompt (most work first), then head by head, then tiles from the
#:   prompt's end: what a launch per prompt of step 4 does, without the gaps between launches;
#: * ``"first_run"``: the order of step 5's first version: tiles counted from each prompt's end, with every
#:   (prompt, head) pair side by side, so the programs running at once read every head of every prompt.
SCHEDULE_ORDERS = ("head_groups", "heads_outer", "prompts_outer", "first_run")
DEFAULT_ORDER = SCHEDULE_ORDERS[0]
#: the tile heights a schedule table has a row for (the kernel picks its row from BLOCK_M)
SCHEDULE_BLOCK_MS = (16, 32, 64, 128)
#: keys and values one head group may span: well under an H200's 60 MB of L2 (an H100 has 50 MB)
GROUP_KV_BYTES = 24 * 2**20


def head_groups(batch: MultiItemBatch, heads: int, kv_bytes_per_token: int) -> list[range]:
    """The heads split into as few groups of near-equal size as keep each group's keys and values (every
    token of the batch, ``kv_bytes_per_token`` per head) within :data:`GROUP_KV_BYTES`; one head at least."""
    size = max(1, min(heads, GROUP_KV_BYTES // max(batch.total_tokens * kv_bytes_per_token, 1)))
    n = -(-heads // size)
    bounds = [round(i * heads / n) for i in range(n + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(n)]


def query_tile_costs(batch: MultiItemBatch, block_m: int) -> list[tuple[int, int, int]]:
    """``(prompt, query tile, keys it visits)`` for every query tile of the batch: the keys of steps 4 and
    5's three ranges counted one by one (at key-tile granularity they round up a little)."""
    out = []
    for b, (s, p) in enumerate(zip(batch.seq_lens, batch.prefix_lens)):
        starts = batch.host_item_starts[b]
        for t, m_lo in enumerate(range(0, s, block_m)):
            m_hi = min(m_lo + block_m, s)
            prefix_keys = min(p, m_hi)
            first_item_row = max(m_lo, p)  # == p (starts[0] == p) for a tile wholly inside the prefix
            out.append((b, t, prefix_keys + max(0, m_hi - max(starts[first_item_row - p], prefix_keys))))
    return out


def work_order(batch: MultiItemBatch, heads: int, block_m: int, order: str = DEFAULT_ORDER,
               kv_bytes_per_token: int = 2 * 128 * 2) -> Int[Tensor, "n 3"]:
    """Step 5's programs in launch order: rows of ``(prompt, query tile, head)``, one per program.
    ``kv_bytes_per_token`` (a key and a value of one head: ``2 * head_dim * element size``) sizes the head
    groups of the ``"head_groups"`` order."""
    if order not in SCHEDULE_ORDERS:
        raise ValueError(f"order must be one of {SCHEDULE_ORDERS}, got {order!r}")
    tiles = query_tile_costs(batch, block_m)
    if order in ("head_groups", "heads_outer"):
        ranked = torch.tensor([(b, t) for b, t, _ in sorted(tiles, key=lambda w: (-w[2], w[0], w[1]))])
        groups = (head_groups(batch, heads, kv_bytes_per_token) if order == "head_groups"
                  else [range(h, h + 1) for h in range(heads)])
        # within a group: tile by tile in that ranking, the group's heads side by side
        return torch.cat([torch.cat([ranked.repeat_interleave(len(g), dim=0),
                                     torch.tensor(list(g)).repeat(len(ranked))[:, None]], dim=1) for g in groups])
    if order == "prompts_outer":
        work = [0] * batch.batch_size
        for b, _, cost in tiles:
            work[b] += cost
        rows = [(b, t, h) for b in sorted(range(batch.batch_size), key=lambda b: -work[b])
                for h in range(heads) for t in reversed(range(-(-batch.seq_lens[b] // block_m)))]
        return torch.tensor(rows)
    n_tiles = [-(-s // block_m) for s in batch.seq_lens]  # "first_run"
    return torch.tensor([(b, n - 1 - r, h) for r in range(max(n_tiles)) for b, n in enumerate(n_tiles) if r < n
                         for h in range(heads)])


def schedule_table(batch: MultiItemBatch, heads: int, order: str = DEFAULT_ORDER,
                   block_ms: Sequence[int] = SCHEDULE_BLOCK_MS,
                   kv_bytes_per_token: int = 2 * 128 * 2) -> tuple[Int[Tensor, "4 n 8"], dict[int, int]]:
    """Step 5's program table on the batch's device, and how many programs each tile height launches.

    Row ``r`` serves ``BLOCK_M = SCHEDULE_BLOCK_MS[r]`` (only the heights in ``block_ms`` are filled); entry
    ``i`` of a row is program ``i``'s ``(prompt, query tile, head, seq_begin, seq_len, prefix_len, 0, 0)``.
    Built on the host once per (batch, heads, order, heights, bytes per token) and cached on the batch, so the attention calls
    of every layer reuse it.
    """
    key = (heads, order, tuple(sorted(set(block_ms))), kv_bytes_per_token)
    if key not in batch._schedules:
        if not key[2] or any(h not in SCHEDULE_BLOCK_MS for h in key[2]):
            raise ValueError(f"block_ms must be among {SCHEDULE_BLOCK_MS}, got {block_ms!r}")
        begins = torch.tensor(batch.seq_starts)
        lens = torch.tensor(batch.seq_lens)
        prefixes = torch.tensor(batch.prefix_lens)
        rows = {}
        for block_m in key[2]:
            w = work_order(batch, heads, block_m, order, kv_bytes_per_token)
            b = w[:, 0]
            rows[block_m] = torch.cat([w, begins[b, None], lens[b, None], prefixes[b, None],
                                       torch.zeros(len(w), 2, dtype=w.dtype)], dim=1)
        width = max(len(r) for r in rows.values())
        table = torch.zeros(len(SCHEDULE_BLOCK_MS), width, 8, dtype=torch.int32)
        for block_m, r in rows.items():
            table[SCHEDULE_BLOCK_MS.index(block_m), : len(r)] = r.to(torch.int32)
        batch._schedules[key] = (table.to(batch.device), {bm: len(r) for bm, r in rows.items()})
    return batch._schedules[key]


# ---------------------------------------------------------------------------------------------
# Python wrappers
# ---------------------------------------------------------------------------------------------

def _check_qkv(q: Any, k: Any, v: Any, batch: MultiItemBatch, out: Any) -> None:
    if not isinstance(batch, MultiItemBatch):
        raise TypeError(f"batch must be a MultiItemBatch, got {type(batch).__name__}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")
        if x.ndim != 3:
            raise ValueError(f"{name} must be [heads, tokens, head_dim], got shape {tuple(x.shape)}")
        if x.device != batch.device:
            raise ValueError(f"{name} is on {x.device} but the batch layout is on {batch.device}")
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim (stride 1 on its last dimension), "
                             f"got strides {x.stride()}")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k and v must have one shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[1] != batch.total_tokens:
        raise ValueError(f"mismatched batch metadata: q has {q.shape[1]} tokens but the batch layout describes "
                         f"{batch.total_tokens} ({batch.describe()})")
    if q.shape[2] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {q.shape[2]}")
    if out is not None:
        if not isinstance(out, Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
            raise ValueError(f"out must be a {q.dtype} tensor of shape {tuple(q.shape)} on {q.device}")
        if out.stride(-1) != 1:
            raise ValueError("out must be contiguous in head_dim (stride 1 on its last dimension)")


def _strides(*tensors: Tensor) -> list[int]:
    return [s for x in tensors for s in (x.stride(0), x.stride(1))]


@dataclass(frozen=True)
class LaunchInfo:
    """What a kernel step ran with: its tile shape (and, on the GPU, warps and pipeline stages), and (when
    asked) the key tiles each query tile visited."""

    step: int
    block_m: int
    block_n: int
    tile_counts: list[list[int]] | None = None
    config: str = ""


def config_name(block_m: int, block_n: int, num_warps: int | None = None, num_stages: int | None = None) -> str:
    name = f"{block_m} x {block_n}"
    return name if num_warps is None else f"{name}, {num_warps} warps, {num_stages} stages"


def _check_blocks(blocks: Any) -> None:
    if blocks is None:
        return
    if (not isinstance(blocks, (tuple, list)) or len(blocks) != 2
            or not all(isinstance(b, int) and 16 <= b <= 128 and not b & (b - 1) for b in blocks)):
        raise ValueError(f"blocks must be (BLOCK_M, BLOCK_N), powers of two from 16 to 128, got {blocks!r}")


def _launch(kernel, grid, args: list, constexprs: dict, blocks: tuple[int, int] | None) -> tuple[int, int, str]:
    """Launch with given blocks (interpreter, or a fixed config on the GPU) or let the autotuner pick."""
    if runtime.mode() == "gpu" and blocks is None:
        kernel[grid](*args, **constexprs)
        best = kernel.best_config
        bm, bn = best.kwargs["BLOCK_M"], best.kwargs["BLOCK_N"]
        return bm, bn, config_name(bm, bn, best.num_warps, best.num_stages)
    block_m, block_n = blocks if blocks is not None else INTERPRETER_BLOCKS
    jit_fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel
    extra = {"num_warps": 8 if block_m >= 128 else 4, "num_stages": 2} if runtime.mode() == "gpu" else {}
    jit_fn[grid](*args, **constexprs, BLOCK_M=block_m, BLOCK_N=block_n, **extra)
    return block_m, block_n, config_name(block_m, block_n, *extra.values())


def run_step(q: Float[Tensor, "h t d"], k: Float[Tensor, "h t d"], v: Float[Tensor, "h t d"], batch: MultiItemBatch,
             *, step: int = 5, sm_scale: float | None = None, out: Float[Tensor, "h t d"] | None = None,
             blocks: tuple[int, int] | None = None, count_tiles: bool = False,
             order: str = DEFAULT_ORDER) -> tuple[Tensor, LaunchInfo]:
    """Run one step; returns the output and a :class:`LaunchInfo`. See :func:`multi_item_attention`;
    ``order`` picks step 5's program order (one of :data:`SCHEDULE_ORDERS`, for experiments)."""
    _check_qkv(q, k, v, batch, out)
    if step not in STEPS:
        raise ValueError(f"step must be one of {STEPS}, got {step!r}")
    _check_blocks(blocks)
    if order not in SCHEDULE_ORDERS:
        raise ValueError(f"order must be one of {SCHEDULE_ORDERS}, got {order!r}")
    if step in (2, 3, 4) and batch.batch_size != 1:
        raise ValueError(f"step {step} handles one prompt, the batch has {batch.batch_size}; use step 5 "
                         "(or call it once per prompt)")
    if count_tiles and step not in (4, 5):
        raise ValueError(f"count_tiles needs step 4 or 5 (they skip tiles), got step {step}")
    if runtime.mode() == "interpreter" and q.dtype == torch.bfloat16 and step > 1:
        raise TypeError("bfloat16 is not supported in interpreter mode: Triton's interpreter multiplies bfloat16 "
                        "tiles as raw integers in tl.dot; use float16 or float32 on the CPU")
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    out = torch.empty_like(q) if out is None else out
    if step == 1:
        return attention_dense_sdpa(q, k, v, batch, sm_scale, out), LaunchInfo(1, 0, 0)

    heads, _, head_dim = q.shape
    qk_scale = sm_scale * LOG2E
    common = {"HEAD_DIM": head_dim, "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32"}
    strides = _strides(q, k, v, out)
    counts = None
    if step in (2, 3, 4):
        seq_len, prefix_len = batch.seq_lens[0], batch.prefix_lens[0]
        grid = lambda meta: (triton.cdiv(seq_len, meta["BLOCK_M"]), heads)  # noqa: E731
        if step == 2:
            mask = dense_mask(batch, 0).view(torch.uint8)  # same bytes as bool, a type Triton loads everywhere
            args = [q, k, v, out, mask, *strides, seq_len, qk_scale]
        elif step == 3:
            args = [q, k, v, out, batch.token_pos[0], *strides, seq_len, prefix_len, qk_scale]
        else:
            counts = torch.full((triton.cdiv(seq_len, 16),), -1, dtype=torch.int32, device=q.device)
            args = [q, k, v, out, batch.token_pos[0], counts, *strides, seq_len, prefix_len, qk_scale,
                    _size_bucket(seq_len)]
            common["COUNT_TILES"] = count_tiles
        block_m, block_n, config = _launch(KERNELS[step], grid, args, common, blocks)
        tile_counts = None
        if count_tiles:
            tile_counts = [counts[: triton.cdiv(seq_len, block_m)].tolist()]
        return out, LaunchInfo(step, block_m, block_n, tile_counts, config)

    # step 5: every prompt in one launch, programs in the order the host planned
    if blocks is not None:
        heights = (blocks[0],)
    elif runtime.mode() == "gpu":  # every tile height the autotuner may pick
        heights = tuple(sorted({cfg.kwargs["BLOCK_M"] for cfg in _GPU_CONFIGS}))
    else:
        heights = (INTERPRETER_BLOCKS[0],)
    table, programs = schedule_table(batch, heads, order, heights, 2 * head_dim * q.element_size())
    max_tiles_16 = triton.cdiv(batch.max_seq_len, 16)
    counts = torch.full((batch.batch_size * max_tiles_16,), -1, dtype=torch.int32, device=q.device)
    grid = lambda meta: (programs[meta["BLOCK_M"]],)  # noqa: E731
    args = [q, k, v, out, table, table.stride(0), batch.token_pos, batch.token_pos.stride(0), counts, max_tiles_16,
            *strides, qk_scale, _size_bucket(batch.total_tokens)]
    common["COUNT_TILES"] = count_tiles
    block_m, block_n, config = _launch(attn_fwd_batched, grid, args, common, blocks)
    tile_counts = None
    if count_tiles:
        rows = counts.view(batch.batch_size, max_tiles_16).tolist()
        tile_counts = [row[: triton.cdiv(s, block_m)] for row, s in zip(rows, batch.seq_lens)]
    return out, LaunchInfo(5, block_m, block_n, tile_counts, config)


def multi_item_attention(q: Float[Tensor, "h t d"], k: Float[Tensor, "h t d"], v: Float[Tensor, "h t d"],
                         batch: MultiItemBatch, *, step: int = 5, sm_scale: float | None = None,
                         out: Float[Tensor, "h t d"] | None = None,
                         blocks: tuple[int, int] | None = None) -> Float[Tensor, "h t d"]:
    """Multi-item scoring attention over a packed batch (``[heads, tokens, head_dim]``, any strides with a
    unit stride on ``head_dim``; a ``[tokens, heads, head_dim]`` tensor transposed works as it is).

    ``step`` picks the implementation (1 to 5; steps 2 to 4 take one prompt). ``blocks=(BLOCK_M, BLOCK_N)``
    fixes the tile shape; by default the GPU autotunes it and the interpreter uses 16 x 16. ``out`` is written
    in place when given (the tests pass a NaN-filled one, so a row the kernel forgets cannot pass).
    """
    return run_step(q, k, v, batch, step=step, sm_scale=sm_scale, out=out, blocks=blocks)[0]


# ---------------------------------------------------------------------------------------------
# Tile accounting: what each kernel visits, what causal attention visits, what is really needed
# ---------------------------------------------------------------------------------------------

#: codes of :func:`tile_map`
TILE_SKIPPED, TILE_WHOLE, TILE_MASKED = 0, 1, 2


def tile_map(batch: MultiItemBatch, block_m: int, block_n: int, prompt: int = 0) -> Int[Tensor, "m_tiles n_tiles"]:
    """What steps 4 and 5 do with each (query tile, key tile) of one prompt: the kernels' three loop ranges,
    in Python. ``TILE_SKIPPED`` (never loaded), ``TILE_WHOLE`` (every row sees every key: no mask arithmetic)
    or ``TILE_MASKED``."""
    s, p = batch.seq_lens[prompt], batch.prefix_lens[prompt]
    pos = batch.token_pos[prompt].tolist()
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    out = torch.full((cdiv(s, block_m), cdiv(s, block_n)), TILE_SKIPPED, dtype=torch.int8)
    for t, m_lo in enumerate(range(0, s, block_m)):
        m_hi = min(m_lo + block_m, s)
        full_hi = min(p, m_lo + 1) // block_n * block_n                     # phase 1: [0, full_hi)
        prefix_hi = cdiv(min(p, m_hi), block_n) * block_n                    # phase 2: [full_hi, prefix_hi)
        first_item_row = max(m_lo, p)
        items_lo = max((first_item_row - pos[first_item_row - p]) // block_n * block_n, prefix_hi)  # phase 3
        out[t, : full_hi // block_n] = TILE_WHOLE
        out[t, full_hi // block_n: prefix_hi // block_n] = TILE_MASKED
        out[t, items_lo // block_n: cdiv(m_hi, block_n)] = TILE_MASKED
    return out


def planned_key_tiles(batch: MultiItemBatch, block_m: int, block_n: int) -> list[list[int]]:
    """For each prompt and query tile, how many key tiles steps 4 and 5 visit (the tests compare it with
    what the kernels count)."""
    return [(tile_map(batch, block_m, block_n, b) != TILE_SKIPPED).sum(dim=1).tolist()
            for b in range(batch.batch_size)]


@dataclass(frozen=True)
class TileStats:
    """Key tiles of one tiling, summed over prompts (per head)."""

    block_m: int
    block_n: int
    total: int        #: every (query tile, key tile) pair: what steps 2 and 3 visit
    causal: int       #: pairs on or below the diagonal: what causal attention visits
    needed: int       #: pairs holding at least one visible (query, key): the least any kernel must visit
    visited: int      #: what steps 4 and 5 visit
    visible_pairs: int  #: visible (query, key) pairs: the useful work
    causal_pairs: int   #: (query, key) pairs of causal attention over the same sequences

    @property
    def skipped_fraction(self) -> float:
        """Fraction of all key tiles steps 4 and 5 never load."""
        return 1.0 - self.visited / self.total

    @property
    def skipped_vs_causal(self) -> float:
        """Fraction of causal attention's key tiles steps 4 and 5 never load."""
        return 1.0 - self.visited / self.causal


def tile_stats(batch: MultiItemBatch, block_m: int, block_n: int) -> TileStats:
    total = causal = needed = visible = causal_pairs = 0
    for b, s in enumerate(batch.seq_lens):
        mask = dense_mask(batch, b).cpu()
        visible += int(mask.sum())
        causal_pairs += s * (s + 1) // 2
        tm, tn = -(-s // block_m), -(-s // block_n)
        padded = torch.zeros(tm * block_m, tn * block_n, dtype=torch.bool)
        padded[:s, :s] = mask
        needed += int(padded.view(tm, block_m, tn, block_n).any(dim=3).any(dim=1).sum())
        total += tm * tn
        causal += sum(-(-min(m_lo + block_m, s) // block_n) for m_lo in range(0, s, block_m))
    visited = sum(map(sum, planned_key_tiles(batch, block_m, block_n)))
    return TileStats(block_m, block_n, total, causal, needed, visited, visible, causal_pairs)


# ---------------------------------------------------------------------------------------------
# Scores: the N x K matrix of label log-probabilities per prompt
# ---------------------------------------------------------------------------------------------

def score_items(hidden: Float[Tensor, "t d_model"], lm_head: Float[Tensor, "vocab d_model"],
                label_ids: Int[Tensor, " k"] | Sequence[int], batch: MultiItemBatch) -> list[Float[Tensor, "n k"]]:
    """Log-probabilities of the label tokens at the last token of every item: one ``[N_b, K]`` matrix per prompt.

    ``hidden`` holds the final hidden states of the packed sequence; only the ``sum(N_b)`` scored rows go
    through the LM head, and the log-softmax over the vocabulary is taken in float32.
    """
    if not isinstance(batch, MultiItemBatch):
        raise TypeError(f"batch must be a MultiItemBatch, got {type(batch).__name__}")
    for name, x in (("hidden", hidden), ("lm_head", lm_head)):
        if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point torch.Tensor")
        if x.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(x.shape)}")
        if x.device != batch.device:
            raise ValueError(f"{name} is on {x.device} but the batch layout is on {batch.device}")
    if hidden.shape[0] != batch.total_tokens:
        raise ValueError(f"mismatched batch metadata: hidden has {hidden.shape[0]} rows but the batch layout "
                         f"describes {batch.total_tokens} tokens")
    if lm_head.shape[1] != hidden.shape[1]:
        raise ValueError(f"lm_head is [vocab, {lm_head.shape[1]}] but hidden has {hidden.shape[1]} features")
    labels = torch.as_tensor(label_ids if not isinstance(label_ids, Tensor) else label_ids.cpu())
    if labels.ndim != 1 or labels.numel() == 0 or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"label_ids must be a non-empty 1-D sequence of token ids, got {label_ids!r}")
    vocab = lm_head.shape[0]
    if int(labels.min()) < 0 or int(labels.max()) >= vocab:
        raise ValueError(f"label_ids must lie in [0, {vocab}), got {labels.tolist()}")
    rows = torch.tensor(batch.score_positions(), dtype=torch.int64, device=hidden.device)
    logits = hidden.index_select(0, rows).float() @ lm_head.float().T
    logprobs = torch.log_softmax(logits, dim=-1)[:, labels.to(hidden.device, torch.int64)]
    return list(logprobs.split(list(batch.num_items)))


# ---------------------------------------------------------------------------------------------
# Benchmark (GPU only): python -m studylog bench multi_item
# ---------------------------------------------------------------------------------------------

#: the issue's shapes: (name, prefix lengths, item lengths per prompt)
def bench_shapes(quick: bool = False) -> list[tuple[str, list[int], list[list[int]]]]:
    shapes = [("prefix 2048, 32 items x 32", [2048], [[32] * 32]),
              ("prefix 512, 128 items x 16", [512], [[16] * 128])]
    gen = torch.Generator().manual_seed(6)  # fixed: the same mixed batch in every run
    prefixes = [1536, 256, 2048, 768, 384, 1024, 128, 640]
    counts = [24, 96, 16, 48, 128, 32, 64, 40]
    items = [torch.randint(8, 41, (n,), generator=gen).tolist() for n in counts]
    shapes.append(("8 prompts, mixed", prefixes, items))
    return shapes[:1] if quick else shapes


BENCH_HEADS, BENCH_HEAD_DIM, BENCH_DTYPE = 32, 128, torch.bfloat16


def _naive_inputs(q: Tensor, k: Tensor, v: Tensor, batch: MultiItemBatch):
    """For the one-pass-per-item baseline: per prompt, ``[N, H, P + 1 + max item, D]`` copies of
    ``prefix <d> item_i`` (right-padded; causal attention never looks at the padding), and for each item the
    packed indices of its ``<d> item_i`` rows."""
    inputs, rows = [], []
    for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
        p, lens = batch.prefix_lens[b], batch.item_lens[b]
        idx = torch.full((len(lens), p + 1 + max(lens)), start + s - 1, dtype=torch.long)
        cursor = start + p  # the delimiter that opens the item
        item_rows = []
        for i, n in enumerate(lens):
            idx[i, :p] = torch.arange(start, start + p)
            idx[i, p:p + n + 1] = torch.arange(cursor, cursor + n + 1)
            item_rows.append(idx[i, p:p + n + 1].clone())
            cursor += n + 1
        idx = idx.to(q.device)
        inputs.append([x[:, idx].transpose(0, 1).contiguous() for x in (q, k, v)])
        rows.append(item_rows)
    return inputs, rows


def _flex_block_mask(batch: MultiItemBatch):
    """FlexAttention's block mask for the same rule over the packed sequence (plus: same prompt only)."""
    from torch.nn.attention.flex_attention import create_block_mask

    dev, T = batch.device, batch.total_tokens
    prompt_of = torch.repeat_interleave(torch.arange(batch.batch_size, dtype=torch.int32, device=dev),
                                        torch.tensor(batch.seq_lens, device=dev))
    prefix_end = (batch.cu_seqlens[:-1] + batch.prefix_lens_t)[prompt_of]
    item_start = torch.arange(T, dtype=torch.int32, device=dev)
    for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
        p = batch.prefix_lens[b]
        item_start[start + p:start + s] -= batch.token_pos[b, : s - p]

    def multi_item_mask(b, h, q_idx, kv_idx):
        same_prompt = prompt_of[q_idx] == prompt_of[kv_idx]
        return same_prompt & (kv_idx <= q_idx) & ((kv_idx < prefix_end[q_idx]) | (kv_idx >= item_start[q_idx]))

    return create_block_mask(multi_item_mask, B=None, H=None, Q_LEN=T, KV_LEN=T, device=dev)


def bench(run) -> None:
    """Steps 2 to 5 against SDPA (dense mask), FlexAttention, one pass per item and causal SDPA."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    dev = runtime.device()
    heads, head_dim, dtype = BENCH_HEADS, BENCH_HEAD_DIM, BENCH_DTYPE
    sm_scale = 1.0 / math.sqrt(head_dim)
    rep = 50 if run.quick else 100

    # the compute ceiling in this run: a large bf16 matmul
    n = 8192 if dev.type == "cuda" else 64
    a = torch.randn(n, n, dtype=dtype, device=dev)
    tflops_ceiling = 2 * n**3 / (run.time(lambda: a @ a) * 1e-3) / 1e12
    del a
    run.note(f"{dtype} matmul {n}^3 in this run: {tflops_ceiling:.0f} TFLOP/s; compute floors divide the FLOPs of "
             "the visible (query, key) pairs by it")

    for name, prefixes, items in run.progress(bench_shapes(run.quick), "shapes"):
        batch = MultiItemBatch.from_item_lens(prefixes, items, device=dev)
        T, single = batch.total_tokens, batch.batch_size == 1
        params = {"shape": name, "prompts": batch.batch_size, "tokens": T}
        gen = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(heads, T, head_dim, dtype=dtype, device=dev, generator=gen) for _ in range(3))
        nbytes = 4 * q.numel() * q.element_size()  # read q, k, v; write out
        useful_flops = 4.0 * tile_stats(batch, 128, 64).visible_pairs * head_dim * heads

        # float32 reference built from the dense mask, prompt by prompt
        ref = torch.empty(heads, T, head_dim, dtype=torch.float32, device=dev)
        attention_dense_sdpa(q.float(), k.float(), v.float(), batch, sm_scale, ref)

        def check(label: str, got: Tensor, want: Tensor = ref) -> None:
            err = (got.float() - want).abs()
            bad = int((err > 1e-2 + 1.6e-2 * want.abs()).sum()) + int(torch.isnan(got).sum())
            run.check(f"{label} matches the float32 dense-mask reference", bad == 0, params=params,
                      max_abs_err=float(err.max()), bad_elements=bad)

        def record(series: str, ms: float, role: str, stats: TileStats | None = None, **extra: Any) -> None:
            if stats is not None:
                extra.update(block_m=stats.block_m, block_n=stats.block_n, tiles_total=stats.total,
                             tiles_causal=stats.causal, tiles_needed=stats.needed, tiles_visited=stats.visited,
                             skipped_fraction=stats.skipped_fraction, skipped_vs_causal=stats.skipped_vs_causal)
            run.record(series, ms, params=params, role=role, floor_ms=run.floor_ms(nbytes),
                       compute_floor_ms=useful_flops / (tflops_ceiling * 1e12) * 1e3,
                       useful_tflops=useful_flops / (ms * 1e-3) / 1e12, **extra)

        # --- our steps (2 to 4 take one prompt) ---
        for step in ([2, 3, 4, 5] if single else [5]):
            kernel = KERNELS[step]
            tunings_before = len(getattr(kernel, "cache", {}))
            out, info = run_step(q, k, v, batch, step=step, sm_scale=sm_scale)  # autotunes on first use
            check(f"step {step}", out)
            extra: dict[str, Any] = {"config": info.config, **({"order": DEFAULT_ORDER} if step == 5 else {})}
            if len(getattr(kernel, "cache", {})) > tunings_before and getattr(kernel, "configs_timings", None):
                extra["autotune_ms"] = {  # what the tuner measured for each config, on this shape
                    config_name(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages):
                        float(t[0] if isinstance(t, (list, tuple)) else t) for c, t in kernel.configs_timings.items()}
            stats = None
            if step in (4, 5):
                _, counted = run_step(q, k, v, batch, step=step, sm_scale=sm_scale, count_tiles=True,
                                      blocks=(info.block_m, info.block_n))
                run.check(f"step {step} visits the key tiles planned", params=params,
                          passed=counted.tile_counts == planned_key_tiles(batch, info.block_m, info.block_n))
                stats = tile_stats(batch, info.block_m, info.block_n)
            ms = run.time(lambda: multi_item_attention(q, k, v, batch, step=step, sm_scale=sm_scale), rep=rep)
            record(f"step {step}", ms, "kernel", stats, **extra)
        # step 5's other program orders: same kernel, same tiles, only the order the GPU starts programs in
        for order in SCHEDULE_ORDERS[1:]:
            got, info = run_step(q, k, v, batch, step=5, sm_scale=sm_scale, order=order)
            check(f"step 5 ({order} order)", got)
            ms = run.time(lambda: run_step(q, k, v, batch, step=5, sm_scale=sm_scale, order=order), rep=rep)
            record(f"step 5 ({order} order)", ms, "kernel", order=order, config=info.config)
            del got
        if not single:  # step 4 once per prompt, to show what one launch saves
            views = []
            for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
                sub = MultiItemBatch.from_item_lens([batch.prefix_lens[b]], [batch.item_lens[b]], device=dev)
                views.append((sub, *(x[:, start:start + s] for x in (q, k, v))))

            def per_prompt():
                return [multi_item_attention(qq, kk, vv, sub, step=4, sm_scale=sm_scale) for sub, qq, kk, vv in views]

            per_prompt()
            record("step 4, a launch per prompt", run.time(per_prompt, rep=rep), "kernel")

        # --- scores: the N x K matrices from step 5's output against the float32 reference's ---
        vocab, labels = 8192, [17, 4242]  # a toy LM head: random weights, logits of order 1
        lm_head = torch.randn(vocab, heads * head_dim, dtype=dtype, device=dev, generator=gen) / 16
        ours = torch.cat(score_items(out.transpose(0, 1).reshape(T, -1), lm_head, labels, batch))
        want = torch.cat(score_items(ref.transpose(0, 1).reshape(T, -1), lm_head.float(), labels, batch))
        err = float((ours - want).abs().max())
        run.check("scores match the float32 reference", err <= 2e-2, params=params, max_abs_err=err,
                  items=int(want.shape[0]), score_range=[float(want.min()), float(want.max())])
        del out, lm_head

        # --- baselines ---
        # SDPA with the dense boolean mask: one prompt, or the batch padded to its longest prompt
        s_max = batch.max_seq_len
        if single:
            qb, kb, vb = q[None], k[None], v[None]
            mask = dense_mask(batch, 0)
        else:
            qb, kb, vb = (torch.zeros(batch.batch_size, heads, s_max, head_dim, dtype=dtype, device=dev)
                          for _ in range(3))
            mask = torch.eye(s_max, dtype=torch.bool, device=dev).repeat(batch.batch_size, 1, 1)  # padding: itself
            for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
                for dst, src in ((qb, q), (kb, k), (vb, v)):
                    dst[b, :, :s] = src[:, start:start + s]
                mask[b, :s, :s] = dense_mask(batch, b)
            mask = mask[:, None]

        def sdpa_dense():
            return F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=sm_scale)

        got = sdpa_dense()
        if single:
            check("SDPA with the dense mask", got[0])
        record("SDPA, dense mask", run.time(sdpa_dense, rep=rep), "baseline")
        del mask, got

        # plain causal SDPA: its tiles are a superset of the ones needed
        def sdpa_causal():
            return F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=sm_scale)

        sdpa_causal()
        record("causal SDPA (superset)", run.time(sdpa_causal, rep=rep), "baseline",
               **({} if single else {"padded_to": s_max}))
        del qb, kb, vb

        # FlexAttention over the packed sequence, compiled, with a block mask built from the same rule
        block_mask = _flex_block_mask(batch)

        def run_flex():
            return flex(q[None], k[None], v[None], block_mask=block_mask, scale=sm_scale)

        check("FlexAttention", run_flex()[0])
        record("FlexAttention", run.time(run_flex, rep=rep), "baseline",
               flex_block_density=float((block_mask.to_dense() != 0).float().mean()))  # blocks it computes
        del block_mask

        # the approach this replaces: a causal pass over prefix <d> item_i for every item, batched over items
        naive_inputs, naive_rows = _naive_inputs(q, k, v, batch)

        def naive():
            return [F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=sm_scale)
                    for qq, kk, vv in naive_inputs]

        outs = naive()
        got = torch.cat([outs[b][i, :, batch.prefix_lens[b]:batch.prefix_lens[b] + rows.numel()]
                         for b, item_rows in enumerate(naive_rows) for i, rows in enumerate(item_rows)], dim=1)
        rows = torch.cat([rows for item_rows in naive_rows for rows in item_rows]).to(dev)
        check("one pass per item (rows of <d> item_i)", got, want=ref[:, rows])
        record("one pass per item (SDPA, batched)", run.time(naive, rep=rep), "baseline",
               passes=sum(batch.num_items))
        del naive_inputs, outs, got, q, k, v, ref
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Figures from the committed results
# ---------------------------------------------------------------------------------------------

APPROACHES = ["SDPA, dense mask", "one pass per item (SDPA, batched)", "FlexAttention", "causal SDPA (superset)",
              "step 2", "step 3", "step 4", "step 4, a launch per prompt", "step 5"]
TARGETS = {"SDPA, dense mask": 4.0, "FlexAttention": 1.3, "causal SDPA (superset)": 1 / 1.3}


def shape_names(results) -> list[str]:
    names: dict[str, None] = {}
    for row in results.rows:
        names.setdefault(row["params"]["shape"], None)
    return list(names)


def target_table(results) -> str:
    """Markdown: step 5 against each baseline on every shape, with the issue's target."""
    lines = ["| shape | step 5 (µs) | baseline | baseline (µs) | speedup | target | met |",
             "|---|---|---|---|---|---|---|"]
    for shape in shape_names(results):
        ours = results.ms("step 5", shape=shape)
        for base, target in TARGETS.items():
            rows = results.select(base, shape=shape)
            if not rows:
                continue
            speedup = rows[0]["ms"] / ours
            want = f">= {target:.2f}x" if target >= 1 else f">= {target:.2f}x (within {1 / target:.1f}x)"
            lines.append(f"| {shape} | {ours * 1e3:.1f} | {base} | {rows[0]['ms'] * 1e3:.1f} | {speedup:.2f}x | "
                         f"{want} | {'yes' if speedup >= target else '**no**'} |")
    return "\n".join(lines)


def figures(results) -> dict[str, Any]:
    """``times``: time per approach and shape; ``tiles``: fraction of key tiles never loaded."""
    import matplotlib.pyplot as plt

    shapes = shape_names(results)
    series = [s for s in APPROACHES if results.select(s)]
    fig_t, ax = plt.subplots(figsize=(10, 4.6))
    width = 0.84 / len(series)
    for j, s in enumerate(series):
        xs, ys = [], []
        for i, shape in enumerate(shapes):
            rows = results.select(s, shape=shape)
            if rows:
                xs.append(i + (j - (len(series) - 1) / 2) * width)
                ys.append(rows[0]["ms"] * 1e3)
        style = {"hatch": "//", "alpha": 0.75} if results.select(s)[0]["role"] == "baseline" else {}
        ax.bar(xs, ys, width=width, label=s, **style)
    for i, shape in enumerate(shapes):
        floors = [r["compute_floor_ms"] for r in results.select(shape=shape) if "compute_floor_ms" in r]
        if floors:
            ax.hlines(floors[0] * 1e3, i - 0.44, i + 0.44, colors="k", linestyles="--", lw=1,
                      label="compute floor (visible pairs at the matmul rate)" if i == 0 else None)
    ax.set_xticks(range(len(shapes)), shapes, fontsize=9)
    ax.set_yscale("log")
    ax.set_ylabel("time (µs, median)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"Multi-item attention, bf16, {BENCH_HEADS} heads x {BENCH_HEAD_DIM}, on {results.gpu}", fontsize=10)

    fig_k, ax = plt.subplots(figsize=(8, 4.2))
    kinds = [("causal attention", lambda r: 1 - r["tiles_causal"] / r["tiles_total"]),
             ("steps 4-5", lambda r: 1 - r["tiles_visited"] / r["tiles_total"]),
             ("best possible at this tiling", lambda r: 1 - r["tiles_needed"] / r["tiles_total"])]
    flex = [r for r in results.select("FlexAttention") if "flex_block_density" in r]
    if flex:
        kinds.append(("FlexAttention (its 128 x 128 blocks)", lambda r: None))
    width = 0.8 / len(kinds)
    for j, (label, skipped) in enumerate(kinds):
        xs, ys = [], []
        for i, shape in enumerate(shapes):
            if label.startswith("FlexAttention"):
                rows = results.select("FlexAttention", shape=shape)
                value = 1 - rows[0]["flex_block_density"] if rows and "flex_block_density" in rows[0] else None
            else:
                rows = [r for r in results.select("step 5", shape=shape) if "tiles_total" in r]
                value = skipped(rows[0]) if rows else None
            if value is not None:
                xs.append(i + (j - (len(kinds) - 1) / 2) * width)
                ys.append(value)
        bars = ax.bar(xs, ys, width=width, label=label)
        ax.bar_label(bars, labels=[f"{y:.0%}" for y in ys], fontsize=7)
    ax.set_xticks(range(len(shapes)), shapes, fontsize=9)
    ax.set_ylim(0, 1.0)
    ax.set_ylabel("fraction of key tiles never loaded")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    block = results.select("step 5")[0]
    ax.set_title(f"Tiles skipped ({block.get('block_m')} x {block.get('block_n')} tiles; steps 2-3 skip none)",
                 fontsize=10)
    return {"times": fig_t, "tiles": fig_k, "schedule": schedule_figure(results)}


def order_series() -> list[str]:
    return ["step 5"] + [f"step 5 ({order} order)" for order in SCHEDULE_ORDERS[1:]]


def schedule_figure(results):
    """Step 5 in each program order against step 4 launched once per prompt, shape by shape."""
    import matplotlib.pyplot as plt

    shapes = shape_names(results)
    labels = {"step 5": f"step 5 ({DEFAULT_ORDER} order, the default)", "step 4, a launch per prompt":
              "step 4, a launch per prompt"}
    series = [s for s in order_series() + ["step 4, a launch per prompt"] if results.select(s)]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.84 / max(len(series), 1)
    for j, s in enumerate(series):
        xs, ys = [], []
        for i, shape in enumerate(shapes):
            rows = results.select(s, shape=shape)
            if rows:
                xs.append(i + (j - (len(series) - 1) / 2) * width)
                ys.append(rows[0]["ms"] * 1e3)
        bars = ax.bar(xs, ys, width=width, label=labels.get(s, s))
        ax.bar_label(bars, labels=[f"{y:.0f}" for y in ys], fontsize=7)
    ax.set_xticks(range(len(shapes)), shapes, fontsize=9)
    ax.set_ylabel("time (µs, median)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"Step 5: the same kernel and tiles, programs started in different orders ({results.gpu})",
                 fontsize=10)
    return fig


def headline(results) -> list[dict]:
    """The book's headline rows: step 5 against FlexAttention on the mixed batch and against SDPA with the
    dense mask and causal SDPA on the many-items prompt (whichever of these shapes the results hold)."""
    rows = []
    for baseline, shape in (("FlexAttention", "8 prompts, mixed"), ("SDPA, dense mask", "prefix 512, 128 items x 16"),
                            ("causal SDPA (superset)", "prefix 512, 128 items x 16")):
        base, ours = results.select(baseline, shape=shape), results.select("step 5", shape=shape)
        if base and ours:
            rows.append({"kernel": "step 5 (Triton, tile skipping, one launch)", "baseline": baseline,
                         "case": f"{shape}, bf16, {BENCH_HEADS} heads x {BENCH_HEAD_DIM}",
                         "speedup": base[0]["ms"] / ours[0]["ms"]})
    return rows


def kv_in_flight(batch: MultiItemBatch, heads: int, head_dim: int, block_m: int, order: str,
                 programs_at_once: int, elem_bytes: int = 2) -> float:
    """Bytes of keys and values that ``programs_at_once`` consecutive programs of step 5 read, averaged over
    the launch: an upper bound per window, taking each (prompt, head) in the window to read its keys up to
    the highest row it computes. Compare it with the L2 cache: above it, the tiles reread keys from DRAM."""
    order_rows = work_order(batch, heads, block_m, order, 2 * head_dim * elem_bytes).tolist()
    windows = []
    for lo in range(0, len(order_rows), programs_at_once):
        reach: dict[tuple[int, int], int] = {}
        for b, t, h in order_rows[lo:lo + programs_at_once]:
            reach[b, h] = max(reach.get((b, h), 0), min((t + 1) * block_m, batch.seq_lens[b]))
        windows.append(sum(reach.values()) * 2 * head_dim * elem_bytes)
    return sum(windows) / len(windows)
