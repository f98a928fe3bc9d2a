"""The multi-item batch format, the mask rules, the reference and the checks every step shares.

Items are packed after a shared prefix, ``prefix <d> item_1 <d> ... item_N <d>``. For a query ``q`` and a key
``k`` of one prompt with prefix length ``P``, ``pos[q]`` the query's position inside its item (0 at a delimiter):

* ``"flashinfer"`` (:data:`DEFAULT_RULE`, as FlashInfer's ``logits_mask_multi_item_scoring`` applies it)::

      visible(q, k) = k <= q  and  (k < P  or  q < P  or  k > q - pos[q])

  item ``i``'s rows equal a causal forward over ``prefix item_i``; a delimiter sees the prefix only (with an
  empty prefix, no key: its row is 0).
* ``"delimiter_visible"``: ``k >= q - pos[q]`` instead, a causal forward over ``prefix <d> item_i``.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from typing import Any, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from studylog import runtime
from studylog.checks import check_choice, check_out, check_tensor

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)  # powers of two: tl.arange spans the head dim
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
RULES = ("flashinfer", "delimiter_visible")  # see the module's docstring; the first is the default everywhere
DEFAULT_RULE = RULES[0]
#: per rule, where an item row's own keys start from the delimiter opening its item: after it under FlashInfer's
#: rule, at it when the delimiter is visible (the kernels' ``SKIP_DELIMITER``)
ITEM_KEYS_FROM = {"flashinfer": 1, "delimiter_visible": 0}


def check_rule(rule: Any) -> str:
    return check_choice("rule", rule, RULES)


def check_batch(batch: Any) -> None:
    if not isinstance(batch, MultiItemBatch):
        raise TypeError(f"batch must be a MultiItemBatch, got {type(batch).__name__}")


# The batch layout: where the prefix, the delimiters and the items lie, checked once per batch

def _as_int_list(x: Any, name: str) -> list[int]:
    if isinstance(x, Tensor):
        if x.dtype.is_floating_point or x.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got a {x.dtype} tensor")
        x = x.detach().cpu().to(torch.int64).tolist()  # a 2-D tensor fails below: its entries are lists
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
    """A batch of multi-item prompts packed one after the other (prompt ``b``: tokens ``cu_seqlens[b] :
    cu_seqlens[b + 1]``), checked once on the host, so the attention calls (one per layer) need no device sync."""

    prefix_lens: tuple[int, ...]
    item_lens: tuple[tuple[int, ...], ...]
    #: ``[B + 1]`` int32: where each prompt starts in the packed sequence
    cu_seqlens: Int[Tensor, " b_plus_1"]
    #: ``[B]`` int32
    prefix_lens_t: Int[Tensor, " b"]
    #: ``[B, L]`` int32, FlashInfer's ``token_pos_in_items``: for each token from the prefix's end on, its
    #: position inside its item (0 at delimiters), zero-padded to ``L`` columns
    token_pos: Int[Tensor, "b l"]
    #: ``[B]`` int32: the longest item of each prompt (an upper bound, as FlashInfer takes it)
    max_item_lens_t: Int[Tensor, " b"]
    #: step 5's program tables (:func:`studylog.multi_item.tiles.schedule_table`), built on first use
    schedules: dict = field(default_factory=dict, init=False, repr=False, compare=False)

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
        for b, its in enumerate(items):
            if min(its, default=1) < 1:
                raise ValueError(f"item_lens[{b}][{its.index(min(its))}] must be >= 1 (an item needs a token to "
                                 f"score), got {min(its)}")
        return cls._build(prefix, items, None, device)

    @classmethod
    def from_token_positions(cls, prefix_lens: Any, token_pos_in_items: Any, max_item_lens: Any, *,
                             token_pos_in_items_len: int | None = None, seq_lens: Any = None,
                             device: torch.device | str | None = None) -> "MultiItemBatch":
        """FlashInfer's inputs: per prompt, its prefix length, each later token's position in its item (``[0, 1,
        2, 3, 0, 1, 2, 0]`` for items of 3 and 2) zero-padded to ``token_pos_in_items_len`` and concatenated (or
        ``[B, L]``), and its longest item."""
        prefix = _as_int_list(prefix_lens, "prefix_lens")
        max_items = _as_int_list(max_item_lens, "max_item_lens")
        seqs = None if seq_lens is None else _as_int_list(seq_lens, "seq_lens")
        batch = len(prefix)
        for name, given in (("max_item_lens", max_items), ("seq_lens", seqs)):
            if given is not None and len(given) != batch:
                raise ValueError(f"mismatched batch metadata: {batch} prefix_lens but {len(given)} {name}")
        pos = torch.as_tensor(token_pos_in_items)
        if pos.dtype.is_floating_point or pos.dtype == torch.bool:
            raise TypeError(f"token_pos_in_items must hold integers, got {pos.dtype}")
        pos = pos.detach().cpu().to(torch.int64)
        if pos.ndim == 1:
            if token_pos_in_items_len is None and batch != 1:
                raise ValueError("token_pos_in_items is 1-D for a batch of several prompts: pass "
                                 "token_pos_in_items_len, the padded length of each prompt's row")
            width = pos.numel() if token_pos_in_items_len is None else token_pos_in_items_len
            if width < 1 or pos.numel() != batch * width:
                raise ValueError(f"mismatched batch metadata: token_pos_in_items has {pos.numel()} entries, "
                                 f"not {batch} prompts x token_pos_in_items_len={width}")
            pos = pos.reshape(batch, width)
        if pos.ndim != 2 or pos.shape[0] != batch:
            raise ValueError(f"mismatched batch metadata: token_pos_in_items must be 1-D or have a row per prompt "
                             f"({batch}), got shape {tuple(pos.shape)}")
        items: list[list[int]] = []
        for b in range(batch):
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
        if min(prefix) < 0:
            raise ValueError(f"prefix_lens[{prefix.index(min(prefix))}] must be >= 0, got {min(prefix)}")
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
        ints = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
        return cls(prefix_lens=tuple(prefix), item_lens=tuple(tuple(it) for it in items),
                   cu_seqlens=ints([0, *accumulate(seq_lens)]), prefix_lens_t=ints(prefix), token_pos=pos.to(device),
                   max_item_lens_t=ints(max_items))

    # derived facts, cached: the attention wrappers ask for them on every call
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
        return tuple(accumulate(self.seq_lens[:-1], initial=0))

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
        """Per prompt, for every token after the prefix, the delimiter opening its item (``row - pos[row]``)."""
        out = []
        for p, lens in zip(self.prefix_lens, self.item_lens):
            starts, delim = [p], p
            for n in lens:
                starts += [delim] * n + [delim + n + 1]
                delim += n + 1
            out.append(tuple(starts))
        return tuple(out)

    def score_positions(self) -> list[int]:
        """Packed indices of every item's last token, where its score is read."""
        # the delimiter opening an item: the prefix's end plus the items before it, each with its delimiter
        return [start + delim + n for start, p, lens in zip(self.seq_starts, self.prefix_lens, self.item_lens)
                for delim, n in zip(accumulate((n + 1 for n in lens), initial=p), lens)]

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
    # the final delimiter: the first of two zeros in a row (the padding after it), else the row's last column
    end = next((j - 1 for j in range(1, len(row)) if row[j] == row[j - 1] == 0), len(row) - 1)
    if row[end] != 0:
        raise ValueError(f"{name} must end with the delimiter (0) that closes the last item; it ends with "
                         f"{row[end]} (is token_pos_in_items_len too small?)")
    if any(row[end + 1:]):
        j = next(j for j in range(end + 1, len(row)) if row[j] != 0)
        raise ValueError(f"{name}[{j}]={row[j]} comes after the final delimiter (column {end}): two delimiters "
                         "in a row would make an empty item, and the padding must be zeros")
    for j in range(1, end + 1):
        if row[j] not in (0, row[j - 1] + 1):
            raise ValueError(f"{name}[{j}]={row[j]} does not fit: a position inside an item must follow "
                             f"{row[j - 1]} with {row[j - 1] + 1}, or be 0 at a delimiter")
        if row[j] > max_item_len:
            raise ValueError(f"{name}[{j}]={row[j]} does not fit: it is past max_item_lens[{b}]={max_item_len}")
    return [row[j - 1] for j in range(1, end + 1) if row[j] == 0]  # the position before each delimiter


# The mask, the reference, the checks the steps share, the scores

def dense_mask(batch: MultiItemBatch, prompt: int = 0, rule: str = DEFAULT_RULE) -> Bool[Tensor, "s s"]:
    """The boolean ``[S, S]`` mask of one prompt under ``rule`` (True: the row's query sees the column's key)."""
    check_rule(rule)
    s, p = batch.seq_lens[prompt], batch.prefix_lens[prompt]
    idx = torch.arange(s, device=batch.device)
    # where each item row's own keys start: its delimiter (+1 under FlashInfer's rule); prefix rows see
    # only keys < P, which the first test below keeps whatever this holds
    item_start = idx + ITEM_KEYS_FROM[rule]
    item_start[p:] -= batch.token_pos[prompt, : s - p].to(idx.dtype)
    rows, cols = idx[:, None], idx[None, :]
    return (cols <= rows) & ((cols < p) | (cols >= item_start[:, None]))


def reference_attention(q: Float[Tensor, "h t d"], k: Float[Tensor, "h t d"], v: Float[Tensor, "h t d"],
                        batch: MultiItemBatch, sm_scale: float | None = None,
                        rule: str = DEFAULT_RULE) -> Float[Tensor, "h t d"]:
    """Float64 attention with ``rule``'s dense mask, what every step is checked against; a row that sees no key
    is 0, as FlashInfer and our kernels write it."""
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    group = q.shape[0] // k.shape[0]  # grouped-query attention: query head h reads key/value head h // group
    k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
        rows = slice(start, start + s)
        mask = dense_mask(batch, b, rule)
        scores = (q[:, rows].double() @ k[:, rows].double().transpose(-1, -2)) * sm_scale
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        probs = probs.masked_fill(~mask.any(dim=-1)[:, None], 0.0)  # softmax of no key is 0/0: write 0
        out[:, rows] = probs @ v[:, rows].double()
    return out


def check_qkv(q: Any, k: Any, v: Any, batch: Any, out: Any) -> None:
    """``q``, ``k``, ``v`` (and ``out``): one dtype, ``[heads, tokens, head_dim]``, unit stride on ``head_dim``, on
    the batch's device; ``q``'s heads a multiple of ``k``'s."""
    check_batch(batch)
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, dtype=SUPPORTED_DTYPES, like=batch.cu_seqlens)  # on the batch layout's device
        if x.ndim != 3:
            raise ValueError(f"{name} must be [heads, tokens, head_dim], got shape {tuple(x.shape)}")
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim (stride 1 on its last dimension), "
                             f"got strides {x.stride()}")
    check_heads(q, k, v)
    if q.shape[1] != batch.total_tokens:
        raise ValueError(f"mismatched batch metadata: q has {q.shape[1]} tokens but the batch layout describes "
                         f"{batch.total_tokens} ({batch.describe()})")
    if out is not None:
        check_out("out", out, shape=q.shape, dtype=q.dtype, device=q.device, contiguous=False)


def check_interpretable(q: Tensor) -> None:
    """Refuses bfloat16 in Triton's interpreter, which multiplies bfloat16 tiles as raw integers in ``tl.dot``."""
    if runtime.mode() == "interpreter" and q.dtype == torch.bfloat16:
        raise TypeError("bfloat16 is not supported in interpreter mode: Triton's interpreter multiplies bfloat16 "
                        "tiles as raw integers in tl.dot; use float16 or float32 on the CPU")


def check_heads(q: Tensor, k: Tensor, v: Tensor) -> None:
    """``q``, ``k``, ``v`` of one dtype and shape but for the heads (``q``'s a multiple of ``k``'s), at a
    supported head dim."""
    if k.shape != v.shape or k.shape[1:] != q.shape[1:]:
        raise ValueError(f"q, k and v must have one shape (k and v may have fewer heads), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[0] < 1 or q.shape[0] % k.shape[0]:
        raise ValueError(f"q's heads ({q.shape[0]}) must be a multiple of k's and v's heads ({k.shape[0]}): each "
                         "key/value head serves a group of query heads")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[2] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {q.shape[2]}")


def score_items(hidden: Float[Tensor, "t d_model"], lm_head: Float[Tensor, "vocab d_model"],
                label_ids: Int[Tensor, " k"] | Sequence[int], batch: MultiItemBatch) -> list[Float[Tensor, "n k"]]:
    """Log-probabilities of the labels at every item's last token, one ``[N_b, K]`` matrix per prompt; only the
    scored rows go through the LM head, the log-softmax in float32."""
    check_batch(batch)
    for name, x in (("hidden", hidden), ("lm_head", lm_head)):
        check_tensor(name, x, ndim=2, dtype=(torch.float16, torch.bfloat16, torch.float32, torch.float64),
                     like=batch.cu_seqlens)  # on the batch layout's device
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

