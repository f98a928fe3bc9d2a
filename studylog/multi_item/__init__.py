"""Chapter 6: multi-item scoring attention, one prefill scoring many items packed after a shared prefix
(``prefix <d> item_1 <d> ... item_N <d>``). Modules: ``formats`` (layout, rules, reference, checks, scores),
``config`` (tile configs), ``tiles`` (the host's plan), ``steps``, ``plan`` (step 5 for CUDA graphs over changing
layouts), ``ops`` (the torch operator), ``report`` and ``peers`` (benchmark, headline, peers)."""

from studylog.chapter import Chapter
from studylog.multi_item import report
from studylog.multi_item.formats import (DEFAULT_RULE, RULES, SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS, MultiItemBatch,
                                         dense_mask, reference_attention, score_items)
from studylog.multi_item.plan import MultiItemPlan
from studylog.multi_item.steps import (STEPS, multi_item_attention, step01_dense_sdpa, step02_dense_mask,
                                       step03_mask_on_the_fly, step04_tile_skip, step05_batched, step06_packed_heads)
from studylog.multi_item.tiles import (DEFAULT_ORDER, SCHEDULE_ORDERS, TileStats, head_groups, planned_key_tiles,
                                       tile_stats)
from studylog.multi_item import ops  # the entry point as a torch.library operator (torch.ops.studylog)

CHAPTER = Chapter(name="multi_item", number=6, title="Multi-item scoring attention: one prefill scores many items",
                  notebooks=("06_multi_item_attention",), steps=STEPS, bench=report.bench, headline=report.headline,
                  baselines=report.BASELINES)

__all__ = [
    # the steps, and the chapter's entry point (step 5) with its form for CUDA graphs over changing layouts
    "CHAPTER", "ops", *(step.function.__name__ for step in STEPS), "multi_item_attention", "MultiItemPlan",
    # the format, the mask rules, the reference, the scores
    "MultiItemBatch", "RULES", "DEFAULT_RULE", "dense_mask", "reference_attention", "score_items",
    "SUPPORTED_DTYPES", "SUPPORTED_HEAD_DIMS",
    # the host's plan: tiles visited, step 5's program order
    "tile_stats", "TileStats", "planned_key_tiles", "SCHEDULE_ORDERS", "DEFAULT_ORDER", "head_groups",
]
