"""Steps 7 and 8 with another L2 policy on the weight rows than the library's ``EVICTION`` ("evict_first"):
the experiment that measured what the hint buys (``""``: no hint, which for step 7 is step 5; ``"evict_last"``).

The kernels are the library's own (``one_wait_kernel``, ``few_ids_kernel``), launched exactly as
``step07_stream`` and ``step08_few_ids`` launch them, with ``EVICTION`` set to ``eviction``. Until commit
69a3b83 this was an ``eviction=`` argument of ``step4b_stream`` and ``step4c_few``; only experiments used it.
"""

from __future__ import annotations

import triton
from torch import Tensor

from studylog.masked_lm_head import FEW_IDS_MAX, AllowedTokens, few_ids_kernel, one_wait_kernel
from studylog.masked_lm_head.formats import Tiles, check_inputs, default_tiles, need_batch1, output

EVICTIONS = ("evict_first", "", "evict_last")


def _check(eviction: str) -> None:
    if eviction not in EVICTIONS:
        raise ValueError(f"eviction must be one of {EVICTIONS}, got {eviction!r}")


def stream(h: Tensor, weight: Tensor, allowed: AllowedTokens, *, eviction: str, out: Tensor | None = None,
           tiles: Tiles | None = None) -> Tensor:
    """``step07_stream`` with the weight rows read under ``eviction``."""
    batch, vocab, hidden = check_inputs(h, weight, allowed, "vd", out)
    need_batch1("step07_stream", batch)
    _check(eviction)
    n_ids = allowed.union_count
    t = tiles or default_tiles(7, 1, n_ids)
    out = output(out, batch, vocab, h.device)
    n_compute = triton.cdiv(n_ids, t.block_v)
    one_wait_kernel[(n_compute + triton.cdiv(vocab, t.fill_block),)](
        h, weight, out, allowed.mask_u8, allowed.kernel_ids, n_ids, vocab, n_compute, weight.stride(0),
        D=hidden, D_POW2=triton.next_power_of_2(hidden), BLOCK_V=t.block_v, FILL_BLOCK=t.fill_block,
        EVICTION=eviction, num_warps=t.num_warps, num_stages=t.num_stages)
    return out


def few_ids(h: Tensor, weight: Tensor, allowed: AllowedTokens, *, eviction: str, out: Tensor | None = None,
            tiles: Tiles | None = None) -> Tensor:
    """``step08_few_ids`` with the weight rows read under ``eviction``."""
    batch, vocab, hidden = check_inputs(h, weight, allowed, "vd", out)
    need_batch1("step08_few_ids", batch)
    _check(eviction)
    if allowed.few_ids is None:
        raise ValueError(f"step08_few_ids takes at most {FEW_IDS_MAX} allowed ids, got {allowed.union_count}")
    t = tiles or default_tiles(8, 1)
    out = output(out, batch, vocab, h.device)
    ids = list(allowed.few_ids) + [-1] * (FEW_IDS_MAX - len(allowed.few_ids))
    few_ids_kernel[(len(allowed.few_ids) + triton.cdiv(vocab, t.fill_block),)](
        h, weight, out, len(allowed.few_ids), *ids, vocab, weight.stride(0),
        D=hidden, D_POW2=triton.next_power_of_2(hidden), FILL_BLOCK=t.fill_block,
        EVICTION=eviction, num_warps=t.num_warps, num_stages=t.num_stages)
    return out
