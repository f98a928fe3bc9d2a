"""The chapter's headline and byte floor, from the committed JSON (the benchmark itself is :mod:`.report`; the
figures and the lesson's tables are the book's: ``book.masked_lm_head``). Series names come from ``CHAPTER`` (steps
``stepNN``, and the other series it lists).

A results file timed by do_bench (the first run, kept in ``lab/``: no peer, no host time) still gives the headline
rows it holds.
"""

from __future__ import annotations

from studylog.masked_lm_head.report import PLAN, XGRAMMAR
from studylog.masked_lm_head.formats import HIDDEN, VOCAB

__all__ = ["headline", "byte_floor_ms"]


def _chapter():
    from studylog.masked_lm_head import CHAPTER

    return CHAPTER


def _s(number: int) -> str:
    """Step ``number``'s series in the benchmark JSON."""
    return _chapter().step(number).series


def byte_floor_ms(results, batch: int, union: int) -> float:
    """The time to move a call's bytes at the run's copy bandwidth: ``union`` rows of the bf16 ``[V, D]`` weight
    read, the fp32 ``[batch, V]`` output written."""
    bandwidth = results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9
    return (union * HIDDEN * 2 + batch * VOCAB * 4) / bandwidth * 1e3


def headline(results) -> list[dict]:
    """The book's headline rows (``plotting.headline_row``: both times, their spread, host time): step 9
    against torch at batch 1, and the whole step from the bitmask against xgrammar's path at batch 1 and 64
    (random masks). A file without a series (an older run) gives the rows it can."""
    from studylog.plotting import headline_row

    label = _chapter().label
    plan_label = "MaskedHeadPlan (step 9 from the packed bitmask)"
    peer_label = "xgrammar: cuBLAS logits + apply_token_bitmask_inplace"
    cases = [(_s(9), "dense_mask", 1, 1000, "batch 1, 1,000 of 128,256 tokens allowed", None, "torch dense_mask"),
             (_s(9), "index_select", 1, 10_000, "batch 1, 10,000 allowed", None, "torch index_select"),
             (PLAN, XGRAMMAR, 1, 1000, "whole step from the bitmask, batch 1, 1,000 allowed", plan_label, peer_label),
             (PLAN, XGRAMMAR, 64, 100, "whole step from the bitmask, batch 64, 100 allowed per sequence", plan_label,
              peer_label),
             (_s(9), "dense_mask", 64, 100, "batch 64, 100 allowed per sequence (own masks)", None,
              "torch dense_mask")]
    rows = []
    for kernel, baseline, batch, allowed, case, k_label, b_label in cases:
        try:
            rows.append(headline_row(results, kernel, baseline, case, kernel_label=k_label or label(kernel),
                                     baseline_label=b_label, batch=batch, kind="random", allowed=allowed))
        except (KeyError, ValueError):
            continue  # not measured in this file (or on another clock)
    return rows
