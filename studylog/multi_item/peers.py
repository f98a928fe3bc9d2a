"""The peers on the same inputs and rule, imported lazily: FlexAttention (the rule as a ``mask_mod`` over the packed
sequence) and FlashInfer's multi-item prefill (keys and values in its paged cache), set up as the benchmark
(``report``) runs them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from studylog.multi_item.formats import DEFAULT_RULE, ITEM_KEYS_FROM, MultiItemBatch, check_rule

# FlexAttention

#: FlexAttention's block sizes to try, ``(name, (Q block, KV block), kernel_options)``: a block mask's block must be
#: a multiple of the kernel's tile, so a smaller block fixes the tile to it
FLEX_VARIANTS = (
    ("128 x 128 (default)", (128, 128), {}),
    ("128 x 64", (128, 64), {"BLOCK_M": 128, "BLOCK_N": 64}),
    ("64 x 64", (64, 64), {"BLOCK_M": 64, "BLOCK_N": 64}),
)


def flex_variants(quick: bool):
    """FlexAttention's block sizes to try (the default only in a quick run)."""
    return FLEX_VARIANTS[:1] if quick else FLEX_VARIANTS


def flex_mask_mod(batch: MultiItemBatch, rule: str = DEFAULT_RULE):
    """The rule as FlexAttention's ``mask_mod`` over ``batch``'s packed sequence (a query sees its prompt's keys)."""
    check_rule(rule)
    dev, total = batch.device, batch.total_tokens
    prompt_of = torch.repeat_interleave(torch.arange(batch.batch_size, dtype=torch.int32, device=dev),
                                        torch.tensor(batch.seq_lens, device=dev))
    prefix_end = (batch.cu_seqlens[:-1] + batch.prefix_lens_t)[prompt_of]
    # where each row's own keys start (prefix rows: past themselves, they see keys < prefix_end)
    item_start = torch.arange(total, dtype=torch.int32, device=dev) + ITEM_KEYS_FROM[rule]
    for b, (start, s) in enumerate(zip(batch.seq_starts, batch.seq_lens)):
        p = batch.prefix_lens[b]
        item_start[start + p:start + s] -= batch.token_pos[b, : s - p]

    def multi_item_mask(b, h, q_idx, kv_idx):
        same_prompt = prompt_of[q_idx] == prompt_of[kv_idx]
        return same_prompt & (kv_idx <= q_idx) & ((kv_idx < prefix_end[q_idx]) | (kv_idx >= item_start[q_idx]))

    return multi_item_mask


# FlashInfer

def flashinfer_module():
    """``flashinfer``, or the trimmed build of its multi-item prefill, ``flashinfer_mis`` (same wrapper)."""
    errors = []
    for name in ("flashinfer", "flashinfer_mis"):
        try:
            module = __import__(name)
            getattr(module, "BatchPrefillWithPagedKVCacheWrapper")
            return module
        except Exception as err:  # a package that fails to import (missing pieces, no CUDA) is no peer here
            errors.append(f"{name}: {type(err).__name__}: {err}")
    raise ImportError("FlashInfer is not importable (" + "; ".join(errors) + ")")


def flashinfer_backends(module) -> list[str]:
    """The backends of ``module`` to try, FlashInfer's default first (on Hopper fa3, then fa2; elsewhere fa2)."""
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    names = list(module.backends()) if hasattr(module, "backends") else (["fa3", "fa2"] if hopper else ["fa2"])
    return sorted(names, key=lambda b: b != "fa3") if hopper else names


def flashinfer_inputs(q: Tensor, k: Tensor, v: Tensor, batch: MultiItemBatch, page_size: int = 1) -> SimpleNamespace:
    """Our q, k, v and layout as FlashInfer's paged prefill takes them (NHD), each prompt in pages of its own:
    ``q`` ``[T, H, D]``; ``k_cache``, ``v_cache`` ``[pages, page_size, H_kv, D]``; prompt ``b``'s queries are rows
    ``qo_indptr[b]:qo_indptr[b + 1]``, its pages ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``, ``last_page_len[b]``
    tokens in the last; ``token_pos_in_items`` each prompt's positions zero-padded to ``token_pos_in_items_len``."""
    dev, head_dim = q.device, q.shape[2]
    pages_per_prompt = [-(-s // page_size) for s in batch.seq_lens]
    slot = torch.cat([torch.arange(s, device=dev) + sum(pages_per_prompt[:b]) * page_size
                      for b, s in enumerate(batch.seq_lens)])  # each token's slot in the page pool
    n_pages = sum(pages_per_prompt)

    def paged(x: Tensor) -> Tensor:
        cache = torch.zeros(n_pages * page_size, x.shape[0], head_dim, dtype=x.dtype, device=dev)
        cache[slot] = x.transpose(0, 1)
        return cache.view(n_pages, page_size, x.shape[0], head_dim)

    kv_indptr = torch.tensor([0] + pages_per_prompt, device=dev).cumsum(0).to(torch.int32)
    width = batch.token_pos.shape[1]
    return SimpleNamespace(
        q=q.transpose(0, 1).contiguous(), k_cache=paged(k), v_cache=paged(v),
        qo_indptr=batch.cu_seqlens.to(torch.int32), kv_indptr=kv_indptr,
        kv_indices=torch.arange(n_pages, dtype=torch.int32, device=dev),
        last_page_len=torch.tensor([s - (n - 1) * page_size for s, n in zip(batch.seq_lens, pages_per_prompt)],
                                   dtype=torch.int32, device=dev),
        # the unsigned dtypes FlashInfer reads, converted on the host (CUDA has few kernels for them)
        prefix_len=batch.prefix_lens_t.cpu().to(torch.uint32).to(dev),
        token_pos_in_items=batch.token_pos.reshape(-1).cpu().to(torch.uint16).to(dev), token_pos_in_items_len=width,
        max_item_len=batch.max_item_lens_t.cpu().to(torch.uint16).to(dev), page_size=page_size)


def flashinfer_prefill(module, inputs: SimpleNamespace, heads: int, sm_scale: float, backend: str = "auto",
                       workspace: Tensor | None = None) -> Any:
    """A ``BatchPrefillWithPagedKVCacheWrapper`` planned for the inputs' layout (on the host, once)."""
    if workspace is None:
        workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=inputs.q.device)
    wrapper = module.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
    wrapper.plan(inputs.qo_indptr, inputs.kv_indptr, inputs.kv_indices, inputs.last_page_len, heads,
                 inputs.k_cache.shape[2], inputs.q.shape[-1], inputs.page_size, causal=True, sm_scale=sm_scale,
                 q_data_type=inputs.q.dtype, kv_data_type=inputs.k_cache.dtype, prefix_len_ptr=inputs.prefix_len,
                 token_pos_in_items_ptr=inputs.token_pos_in_items,
                 token_pos_in_items_len=inputs.token_pos_in_items_len, max_item_len_ptr=inputs.max_item_len)
    return wrapper
