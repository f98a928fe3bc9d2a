"""Chapter 2: a masked LM head that computes logits only for the tokens a grammar allows.

Every step has the same contract: fp32 logits ``[B, V]``, the logit where allowed and ``-inf`` elsewhere; bf16 or
fp16 weights and hidden states; fp32 accumulation. Steps 0-3 are in :mod:`.dense`, 4-7 in :mod:`.compact`, 8 in
:mod:`.reorder`, 9 in :mod:`.dispatch`; the allowed sets travel as :class:`AllowedTokens`, built once per FSM state.
"""

from __future__ import annotations

from studylog import runtime  # noqa: F401  (selects GPU or interpreter before kernels are defined)
from studylog.chapter import Chapter, Step
from studylog.masked_lm_head.compact import (batched_union_kernel, compact_rows_kernel, compact_stream_kernel,
                                             few_ids_kernel, step04_compact, step05_stream, step06_few_ids,
                                             step07_batched)
from studylog.masked_lm_head.dense import (block_skip_kernel, column_skip_kernel, dense_matmul_kernel,
                                           row_skip_kernel, step00_dense, step01_block_skip, step02_column_skip,
                                           step03_row_skip)
from studylog.masked_lm_head.dispatch import (FALLBACK_RULE, DispatchRule, choose_path, cublas_masked, dispatch_rule,
                                              masked_logits, step09_dispatch)
from studylog.masked_lm_head.formats import (FEW_IDS_MAX, HIDDEN, VOCAB, AllowedTokens, check_logits, pack_bitmask,
                                             reference_logits)
from studylog.masked_lm_head.plan import MaskedHeadPlan
from studylog.masked_lm_head.reorder import ReorderedHead, cluster_order, reordered_rows_kernel, step08_reordered
from studylog.masked_lm_head.report import bench, headline
from studylog.masked_lm_head import ops  # the entry point as a torch.library operator (torch.ops.studylog)

CHAPTER = Chapter(
    name="masked_lm_head", number=2, notebooks=("02_masked_lm_head",),
    title="Masked LM head: logits only for the tokens a grammar allows",
    steps=(
        Step(0, "dense", "the Triton matmul tutorial's structure, all logits, then masked_fill", "triton",
             step00_dense, dense_matmul_kernel),
        Step(1, "block_skip", "a program whose block of tokens has nothing allowed returns at once", "triton",
             step01_block_skip, block_skip_kernel),
        Step(2, "column_skip", "inside an active block, disallowed columns are not loaded", "triton",
             step02_column_skip, column_skip_kernel),
        Step(3, "row_skip", "the same on the [V, D] layout, where a token is one contiguous row", "triton",
             step03_row_skip, row_skip_kernel),
        Step(4, "compact", "programs walk the list of allowed ids: no empty programs, no wasted rows", "triton",
             step04_compact, compact_rows_kernel),
        Step(5, "stream", "each row read in one burst of loads, fill programs first, an L2 evict-first hint",
             "triton", step05_stream, compact_stream_kernel),
        Step(6, "few_ids", "up to eight ids passed as launch arguments: nothing to look up before the row read",
             "triton", step06_few_ids, few_ids_kernel),
        Step(7, "batched", "B sequences with their own masks, each allowed row read once for all of them",
             "triton", step07_batched, batched_union_kernel),
        Step(8, "reordered", "step 3 on a vocabulary reordered so that tokens allowed together sit together",
             "triton", step08_reordered, reordered_rows_kernel),
        Step(9, "dispatch", "one function that picks the path from the batch size and the allowed count",
             "python", step09_dispatch, choose_path),
    ),
    bench=bench,
    headline=headline,
    baselines={
        "dense_mask": "torch: (h @ W.T).masked_fill_, bf16",
        "index_select": "torch: h @ W.index_select(0, ids).T",
        "cublas_fp32_mask": "cuBLAS, fp32 output, then masked_fill",
        "reordered_in_sample": "step08_reordered, order fitted on every mask",
        "plan_bitmask": "MaskedHeadPlan: step 9 from the packed bitmask (copy, union built on the device)",
        "xgrammar_bitmask": "xgrammar: cuBLAS fp32 logits + apply_token_bitmask_inplace (bitmask copied in)",
        "xgrammar_bitmask_bf16": "xgrammar: cuBLAS bf16 logits + apply_token_bitmask_inplace (bitmask copied in)",
    },
)

__all__ = [
    "CHAPTER", "ops",
    # the steps, the general entry point (the final step) and its capturable form for a decode loop
    "step00_dense", "step01_block_skip", "step02_column_skip", "step03_row_skip", "step04_compact",
    "step05_stream", "step06_few_ids", "step07_batched", "step08_reordered", "step09_dispatch", "masked_logits",
    "MaskedHeadPlan",
    # formats and the reference
    "VOCAB", "HIDDEN", "FEW_IDS_MAX", "AllowedTokens", "pack_bitmask", "reference_logits", "check_logits",
    # step 8's reordered vocabulary, step 9's rule, and the dense peer (torch: cuBLAS, then masked_fill)
    "ReorderedHead", "cluster_order", "DispatchRule", "FALLBACK_RULE", "dispatch_rule", "choose_path", "cublas_masked",
]
