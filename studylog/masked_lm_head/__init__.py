"""Chapter 2: a masked LM head that computes logits only for the tokens a grammar allows. Every step returns fp32
logits ``[B, V]``, ``-inf`` where not allowed, from bf16 or fp16 weights (fp32 accumulation). Steps 0-3 are in
:mod:`.dense`, 4-10 :mod:`.compact`, 11 :mod:`.reorder`, 12 :mod:`.dispatch`, 13 :mod:`.plan`; the allowed sets
travel as :class:`AllowedTokens`, built once per FSM state."""

from __future__ import annotations

import re

from studylog import runtime  # noqa: F401  (selects GPU or interpreter before kernels are defined)
from studylog.chapter import Chapter, Step
from studylog.masked_lm_head.compact import (batched_union_kernel, compact_rows_kernel, few_ids_kernel, fill_first_kernel,
                                             one_wait_kernel, step04_compact, step05_one_wait, step06_fill_first,
                                             step07_stream, step08_few_ids, step09_union, step10_batched,
                                             union_sums_kernel)
from studylog.masked_lm_head.dense import (block_skip_kernel, dense_matmul_kernel, row_skip_kernel, step00_dense,
                                           step01_block_skip, step02_column_skip, step03_row_skip)
from studylog.masked_lm_head.dispatch import (FALLBACK_RULE, DispatchRule, choose_path, cublas_masked, dispatch_rule,
                                              masked_logits, step12_dispatch)
from studylog.masked_lm_head.formats import (FEW_IDS_MAX, HIDDEN, VOCAB, AllowedTokens, check_logits, pack_bitmask,
                                             reference_logits)
from studylog.masked_lm_head.plan import MaskedHeadPlan, step13_plan, stream_count_kernel
from studylog.masked_lm_head.reorder import ReorderedHead, cluster_order, reordered_rows_kernel, step11_reordered
from studylog.masked_lm_head.report import bench, headline
from studylog.masked_lm_head import ops  # the entry point as a torch.library operator (torch.ops.studylog)
from studylog.source import resolve_python, source_of


def _at(kernel, **knobs) -> str:
    """The text of ``kernel`` as one step launches it: each ``if KNOB:`` block resolved at the step's value; a string
    knob (a cache hint) is read as its value, its parameter left out."""
    lines = resolve_python(source_of(kernel)[0].splitlines(), knobs)
    for name, value in knobs.items():
        if isinstance(value, str):
            lines = [re.sub(rf"\b{name}\b", f'"{value}"', line.replace(f" {name}: tl.constexpr,", ""))
                     for line in lines]
    return "\n".join(lines) + "\n"


#: Each step's function (``stepNN_<slug>``): what its page shows (its kernel; step 12: its rule) and what it changes.
_STEPS = {
    step00_dense: (dense_matmul_kernel, "the Triton matmul tutorial's structure, all logits, then masked_fill"),
    step01_block_skip: (_at(block_skip_kernel, COLUMN_SKIP=False),
                        "a program whose block of tokens has nothing allowed returns at once"),
    step02_column_skip: (_at(block_skip_kernel, COLUMN_SKIP=True),
                         "inside an active block, disallowed columns are not loaded"),
    step03_row_skip: (row_skip_kernel, "the same on the [V, D] layout, where a token is one contiguous row"),
    step04_compact: (compact_rows_kernel, "programs walk the list of allowed ids: no empty programs, no wasted rows"),
    step05_one_wait: (_at(one_wait_kernel, EVICTION=""),
                      "each row loaded as one tile and reduced once: one wait for memory per row"),
    step06_fill_first: (fill_first_kernel,
                        "the fill programs first in the grid, so their -inf stores do not trail the launch"),
    step07_stream: (one_wait_kernel, "the weight rows read with an L2 evict-first hint: each row is read once"),
    step08_few_ids: (few_ids_kernel,
                     "up to eight ids passed as launch arguments: nothing to look up before the row read"),
    step09_union: (union_sums_kernel,
                   "B sequences with their own masks: each row of the batch's union read once for all of them"),
    step10_batched: (batched_union_kernel,
                     "the union's rows multiplied with every sequence's hidden state on the tensor cores"),
    step11_reordered: (reordered_rows_kernel,
                       "step 3 on a vocabulary reordered so that tokens allowed together sit together"),
    step12_dispatch: (choose_path, "one function that picks the path from the batch size and the allowed count"),
    step13_plan: (stream_count_kernel, "the whole step from the grammar's packed bitmask: the union built on the "
                                       "device, the step replayed as one CUDA graph"),
}


def _step(function, shown, title: str) -> Step:
    number, slug = function.__name__.removeprefix("step").split("_", 1)
    return Step(int(number), slug, title, "python" if function is step12_dispatch else "triton", function, shown)


CHAPTER = Chapter(
    name="masked_lm_head", number=2, notebooks=("02_masked_lm_head",),
    title="Masked LM head: logits only for the tokens a grammar allows",
    steps=tuple(_step(function, *shown_title) for function, shown_title in _STEPS.items()),
    bench=bench,
    headline=headline,
    baselines={
        "dense_mask": "torch: (h @ W.T).masked_fill_, bf16",
        "index_select": "torch: h @ W.index_select(0, ids).T",
        "cublas_fp32_mask": "cuBLAS, fp32 output, then masked_fill",
        "reordered_in_sample": "step11_reordered, order fitted on every mask",
        "xgrammar_bitmask": "xgrammar: cuBLAS fp32 logits + apply_token_bitmask_inplace (bitmask copied in)",
        "xgrammar_bitmask_bf16": "xgrammar: cuBLAS bf16 logits + apply_token_bitmask_inplace (bitmask copied in)",
    },
)

__all__ = [
    "CHAPTER", "ops", *(function.__name__ for function in _STEPS), "masked_logits", "MaskedHeadPlan",
    "VOCAB", "HIDDEN", "FEW_IDS_MAX", "AllowedTokens", "pack_bitmask", "reference_logits", "check_logits",
    "ReorderedHead", "cluster_order", "DispatchRule", "FALLBACK_RULE", "dispatch_rule", "choose_path", "cublas_masked",
]
