"""Chapter 6: multi-item scoring attention, where one prefill scores many candidate items.

The items are packed after a shared prefix, ``prefix <d> item_1 <d> ... item_N <d>``, and the mask keeps them from
seeing each other (FlashInfer's rule by default, ``rule="delimiter_visible"`` adds the delimiter keys). Five steps
go from a dense mask handed to SDPA to a Triton kernel that computes the mask from the metadata, never loads the
key tiles between the prefix and the current item, and runs a batch of prompts in one launch
(:func:`multi_item_attention`: step 5 with its defaults); step 6, for grouped-query attention, computes the query
heads that share a key/value head in one tile. Modules: ``formats`` (layout, rules, reference,
checks, scores), ``config`` (tile configs), ``tiles`` (the host's plan), ``steps`` and ``packed_heads``, ``plan`` (step 5 for CUDA
graphs over changing layouts), ``ops`` (the torch operator), ``report`` and ``bench_peers`` (benchmark,
headline), ``peers`` (FlexAttention, FlashInfer). Figures, tables and exercises are the book's.
"""

from studylog.chapter import Chapter
from studylog.multi_item import report
from studylog.multi_item.config import LaunchInfo, config_names
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
from studylog.multi_item.packed_heads import attn_fwd_packed_heads
from studylog.multi_item.steps import (
    STEPS,
    attend_key_tiles,
    attend_query_tile,
    attend_visible_tiles,
    attn_fwd_batched,
    attn_fwd_tile_skip,
    item_row_start,
    load_key_tile,
    multi_item_attention,
    query_tile,
    scheduled_tile,
    softmax_start,
    softmax_update,
    store_rows,
    step01_dense_sdpa,
    step02_dense_mask,
    step03_mask_on_the_fly,
    step04_tile_skip,
    step05_batched,
    step06_packed_heads,
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

#: What a reader imports after the chapter (the other names above stay attributes of the package).
__all__ = [
    "CHAPTER", "ops",
    # the steps, and the chapter's entry point (step 5)
    "step01_dense_sdpa", "step02_dense_mask", "step03_mask_on_the_fly", "step04_tile_skip", "step05_batched",
    "step06_packed_heads", "multi_item_attention", "MultiItemPlan",
    # the format, the mask rules, the reference, the scores
    "MultiItemBatch", "RULES", "DEFAULT_RULE", "dense_mask", "reference_attention", "score_items",
    "SUPPORTED_DTYPES", "SUPPORTED_HEAD_DIMS",
    # the host's plan: tiles visited, step 5's program order
    "tile_map", "tile_stats", "TileStats", "planned_key_tiles", "SCHEDULE_ORDERS", "DEFAULT_ORDER", "head_groups",
]
