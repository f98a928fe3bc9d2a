"""Chapter 6: multi-item scoring attention, where one prefill scores many candidate items.

The items are packed after a shared prefix, ``prefix <d> item_1 <d> item_2 <d> ... item_N <d>``, and the
mask keeps them from seeing each other (the rule: :mod:`studylog.multi_item.formats`). The attention is
built in five steps (:mod:`studylog.multi_item.steps`), from a dense boolean mask handed to SDPA to a
Triton kernel that computes the mask from the metadata, never loads the key tiles between the prefix and
the current item, and runs a batch of differently shaped prompts in one launch;
:func:`multi_item_attention` is the last step with its defaults.

The mask rule is FlashInfer's by default (``rule="flashinfer"``: an item token does not see its opening
delimiter, a delimiter sees only the prefix); ``rule="delimiter_visible"`` adds those keys.

Modules: ``formats`` (the batch layout, the mask rules, the float64 reference, the input checks, the
scores), ``config`` (tile shapes, autotuning), ``tiles`` (the host's plan: tiles visited, step 5's program
order), ``steps`` (each step's function beside its Triton kernel and launch), ``plan`` (step 5 with its layout in
device buffers, for a CUDA graph replayed over changing batches), ``report`` (benchmark, headline), ``peers``
(FlexAttention and FlashInfer on the same inputs) and ``bench_peers`` (their part of the benchmark). The figures,
the notebook's tables, step 5's targets and the exercises are the book's (``book.multi_item``), not the library's.
"""

from studylog.chapter import Chapter
from studylog.multi_item import report
from studylog.multi_item.config import LaunchInfo, config_name, config_names
from studylog.multi_item.formats import (
    DEFAULT_RULE,
    RULES,
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_DIMS,
    MultiItemBatch,
    dense_mask,
    reference_attention,
    score_items,
)
from studylog.multi_item.plan import MultiItemPlan
from studylog.multi_item.steps import (
    STEPS,
    attend_key_tiles,
    attn_fwd_batched,
    attn_fwd_dense_mask,
    attn_fwd_mask_on_the_fly,
    attn_fwd_tile_skip,
    multi_item_attention,
    step01_dense_sdpa,
    step02_dense_mask,
    step03_mask_on_the_fly,
    step04_tile_skip,
    step05_batched,
)
from studylog.multi_item.tiles import (
    DEFAULT_ORDER,
    GROUP_KV_BYTES,
    SCHEDULE_BLOCK_MS,
    SCHEDULE_ORDERS,
    TILE_MASKED,
    TILE_SKIPPED,
    TILE_WHOLE,
    TileStats,
    head_groups,
    planned_key_tiles,
    query_tile_costs,
    schedule_table,
    tile_map,
    tile_stats,
    work_order,
)
from studylog.multi_item import ops  # the entry point as a torch.library operator (torch.ops.studylog)

CHAPTER = Chapter(
    name="multi_item",
    number=6,
    title="Multi-item scoring attention: one prefill scores many items",
    notebooks=("06_multi_item_attention",),
    steps=STEPS,
    bench=report.bench,
    headline=report.headline,
    baselines=report.BASELINES,
)

#: What a reader imports after the chapter: the entry point, its plan, the steps, the format and its mask rules,
#: the reference and the host's tile plan. Everything else imported above (the Triton kernels that show_source
#: reads, step 5's program order...) stays reachable here and by its module.
__all__ = [
    "CHAPTER", "ops",
    # the steps, and the chapter's entry point (step 5)
    "step01_dense_sdpa", "step02_dense_mask", "step03_mask_on_the_fly", "step04_tile_skip", "step05_batched",
    "multi_item_attention", "MultiItemPlan", "LaunchInfo",
    # the format, the mask rules, the reference, the scores
    "MultiItemBatch", "RULES", "DEFAULT_RULE", "dense_mask", "reference_attention", "score_items",
    "SUPPORTED_DTYPES", "SUPPORTED_HEAD_DIMS",
    # the host's plan: tiles visited, step 5's program order
    "tile_map", "tile_stats", "TileStats", "planned_key_tiles", "SCHEDULE_ORDERS", "DEFAULT_ORDER", "head_groups",
]
