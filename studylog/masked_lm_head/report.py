"""The chapter's figures, headline and the targets' table, all from the committed JSON (the benchmark itself is
:mod:`.benchmark`). Series names come from ``CHAPTER`` (steps ``stepNN``, and the other series it lists).

Results files measured before the GPU clock (do_bench rows, no peer, no host time) still draw: the figures
and the headline use what a file holds and leave out what it does not.
"""

from __future__ import annotations

import textwrap
from typing import Any

from studylog.masked_lm_head.benchmark import IN_SAMPLE, PLAN, XGRAMMAR, XGRAMMAR_BF16, bench, losses, run_sweep, \
    sweep_counts
from studylog.masked_lm_head.formats import VOCAB

__all__ = ["bench", "run_sweep", "sweep_counts", "figures", "headline", "target_report", "host_table", "our_kernels",
           "IN_SAMPLE", "PLAN", "XGRAMMAR", "XGRAMMAR_BF16"]


def _chapter():
    from studylog.masked_lm_head import CHAPTER

    return CHAPTER


def _s(number: int) -> str:
    """Step ``number``'s series in the benchmark JSON."""
    return _chapter().step(number).series


def _kinds(results) -> list[str]:
    seen: dict[str, None] = {}
    for row in results.rows:
        if "kind" in row["params"]:
            seen.setdefault(row["params"]["kind"], None)
    return list(seen)


def _speedup_lines(results, ax, series, where, baseline="dense_mask"):
    """One line per series: baseline time / series time against the allowed count. ``where`` may
    name a layout; baselines have none."""
    plain = {k: v for k, v in where.items() if k != "layout"}
    layout = where.get("layout", "vd")
    base = {r["params"]["allowed"]: r["ms"] for r in results.select(baseline, **plain)}
    for s in series:
        rows = [r for r in results.select(s, **plain) if r["params"].get("layout", "vd") == layout]
        pts = sorted((r["params"]["allowed"], base[r["params"]["allowed"]] / r["ms"])
                     for r in rows if r["params"]["allowed"] in base)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=_chapter().label(s))
    ax.axhline(1.0, color="k", lw=1, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("allowed tokens per sequence")
    ax.set_ylabel(f"speedup over {baseline}")
    ax.grid(True, which="both", alpha=0.3)


def figures(results) -> dict[str, Any]:
    """Speedup against allowed count (one line per step, like the seed's plots), the layout
    comparison, time against the floor, batching and reordering."""
    import matplotlib.pyplot as plt

    from studylog.plotting import plot_times

    label = _chapter().label
    figs: dict[str, Any] = {}
    kinds = [k for k in _kinds(results) if k != "none"]
    caption = results.caption()

    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 4.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        _speedup_lines(results, ax, [_s(n) for n in (1, 2, 3, 4, 5, 6, 9)] + ["index_select"],
                       {"batch": 1, "kind": kind, "layout": "vd"})
        ax.set_title(f"batch 1, {kind} masks, [V, D]", fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle(caption, fontsize=8)
    fig.tight_layout()
    figs["speedup_b1"] = fig

    layout_kinds = [k for k in kinds if results.select(_s(2), batch=1, kind=k, layout="dv")]
    if layout_kinds:
        fig, axes = plt.subplots(1, len(layout_kinds), figsize=(5.2 * len(layout_kinds), 4.2), squeeze=False)
        for ax, kind in zip(axes[0], layout_kinds):
            base = {r["params"]["allowed"]: r["ms"] for r in results.select("dense_mask", batch=1, kind=kind)}
            for s in (_s(1), _s(2)):
                for layout, style in (("dv", "--"), ("vd", "-")):
                    rows = results.select(s, batch=1, kind=kind, layout=layout)
                    pts = sorted((r["params"]["allowed"], base[r["params"]["allowed"]] / r["ms"]) for r in rows)
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3,
                                label=f"{label(s)} [{'D, V' if layout == 'dv' else 'V, D'}]")
            ax.axhline(1.0, color="k", lw=1, ls=":")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("allowed tokens")
            ax.set_ylabel("speedup over dense_mask")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(f"layout: batch 1, {kind} masks", fontsize=10)
            ax.legend(fontsize=7)
        fig.suptitle(caption, fontsize=8)
        fig.tight_layout()
        figs["layout"] = fig

    fig, ax = plt.subplots(figsize=(7, 4.4))
    plot_times(results, "allowed", ["dense_mask", "index_select"] + [_s(n) for n in (3, 4, 5, 9)],
               where={"batch": 1, "kind": "random"}, ax=ax, label=label,
               title="batch 1, random masks: time against the floor max(bytes read and written / bandwidth, launch)")
    ax.legend(fontsize=8)
    ax.title.set_fontsize(8)
    figs["floor_b1"] = fig

    batches = sorted({r["params"]["batch"] for r in results.rows if r["params"].get("batch", 1) > 1})
    if batches:
        batch_kinds = {b: [k for k in kinds if results.select(_s(7), batch=b, kind=k)] for b in batches}
        width = max(len(v) for v in batch_kinds.values()) or 1
        fig, axes = plt.subplots(len(batches), width, figsize=(5.2 * width, 4.0 * len(batches)), squeeze=False)
        batch_series = [_s(1), _s(3), _s(7), "cublas_fp32_mask", _s(9), "index_select", PLAN, XGRAMMAR]
        for i, batch in enumerate(batches):
            for j in range(width):
                ax = axes[i][j]
                if j >= len(batch_kinds[batch]):
                    ax.axis("off")
                    continue
                kind = batch_kinds[batch][j]
                _speedup_lines(results, ax, batch_series, {"batch": batch, "kind": kind, "layout": "vd"})
                ax.set_title(f"batch {batch}, {kind} masks (one per sequence)", fontsize=10)
                ax.legend(fontsize=7)
        fig.suptitle(caption, fontsize=8)
        fig.tight_layout()
        figs["batched"] = fig

    if results.select(XGRAMMAR):
        figs["practitioners"] = _practitioners_figure(results, caption)
    if any("host_ms" in r for r in results.rows):
        figs["host"] = _host_figure(results, caption)

    rows8 = results.select(_s(8), batch=1)
    if rows8:
        kind = rows8[0]["params"]["kind"]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        _speedup_lines(results, ax1, [_s(3), _s(8), IN_SAMPLE, _s(4), _s(5)],
                       {"batch": 1, "kind": kind, "layout": "vd"})
        ax1.set_title(f"reordering: batch 1, {kind} masks", fontsize=10)
        ax1.legend(fontsize=7)
        lines = [("original order", rows8, "active_blocks_original"),
                 ("reordered, fitted on other grammars", rows8, "active_blocks"),
                 ("reordered, fitted on all masks", results.select(IN_SAMPLE, batch=1), "active_blocks")]
        for name, rows, key in lines:
            pts = sorted((r["params"]["allowed"], r[key]) for r in rows)
            if pts:
                ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name)
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        ax2.set_xlabel("allowed tokens")
        ax2.set_ylabel("active 64-token blocks")
        ax2.grid(True, which="both", alpha=0.3)
        ax2.legend(fontsize=7)
        fig.suptitle(caption, fontsize=8)
        fig.tight_layout()
        figs["reorder"] = fig
    return figs


def _practitioners_figure(results, caption: str):
    """Our whole decode step from the packed bitmask (MaskedHeadPlan) against the practitioners' path
    (cuBLAS logits + xgrammar's apply_token_bitmask_inplace), speedup against allowed count, per batch."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.4))
    for batch in sorted({r["params"]["batch"] for r in results.select(XGRAMMAR)}):
        for kind, style in (("random", "-"), ("real", "--"), ("grammar", "--"), ("clustered", ":")):
            base = {r["params"]["allowed"]: r["ms"] for r in results.select(XGRAMMAR, batch=batch, kind=kind)}
            pts = sorted((r["params"]["allowed"], base[r["params"]["allowed"]] / r["ms"])
                         for r in results.select(PLAN, batch=batch, kind=kind) if r["params"]["allowed"] in base)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3,
                        label=f"batch {batch}, {kind} masks")
    ax.axhline(1.0, color="k", lw=1, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("allowed tokens per sequence")
    ax.set_ylabel("speedup of the whole step over xgrammar's path")
    ax.set_title("from the packed bitmask, copy included: MaskedHeadPlan vs cuBLAS + apply_token_bitmask_inplace",
                 fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(textwrap.fill(caption, 110), fontsize=7)
    fig.tight_layout()
    return fig


def _host_figure(results, caption: str):
    """Host time per call of the public entry points at batch 1 (random masks), beside their GPU time and
    the empty Triton launch of the same run."""
    import matplotlib.pyplot as plt

    label = _chapter().label
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for series in [_s(n) for n in (4, 5, 6, 9)] + [PLAN, XGRAMMAR]:
        pts = sorted((r["params"]["allowed"], r["host_ms"] * 1e3)
                     for r in results.select(series, batch=1, kind="random") if "host_ms" in r
                     and r["params"].get("layout", "vd") == "vd")
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=f"{label(series)} (host)")
    gpu = sorted((r["params"]["allowed"], r["ms"] * 1e3) for r in results.select(_s(9), batch=1, kind="random"))
    if gpu:
        ax.plot([p[0] for p in gpu], [p[1] for p in gpu], "k-", lw=1, label=f"{label(_s(9))} (GPU time)")
    empty = results.data.get("ceilings", {}).get("empty_launch_host_ms")
    if empty:
        ax.axhline(empty * 1e3, color="k", ls="--", lw=1, label="empty Triton launch (host)")
        ax.axhline(2 * empty * 1e3, color="k", ls=":", lw=1, label="2x empty launch (target)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("allowed tokens")
    ax.set_ylabel("µs per call")
    ax.set_title("batch 1, random masks: host time per call of each entry point", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(textwrap.fill(caption, 110), fontsize=7)
    fig.tight_layout()
    return fig


def host_table(results) -> str:
    """Host time per call of every public entry point measured at batch 1 (random masks), as Markdown:
    median over the run's counts, the worst count, and the ratio to an empty Triton launch of the same run."""
    label = _chapter().label
    empty = results.data.get("ceilings", {}).get("empty_launch_host_ms")
    lines = ["| entry point | host per call, median (µs) | worst (µs) | × empty launch |", "|---|---|---|---|"]
    for series in results.series():
        rows = [r for r in results.select(series, batch=1) if "host_ms" in r]
        if not rows:
            continue
        values = sorted(r["host_ms"] for r in rows)
        median = values[len(values) // 2]
        ratio = f"{values[-1] / empty:.2f}" if empty else "–"
        lines.append(f"| {label(series)} | {median * 1e3:.1f} | {values[-1] * 1e3:.1f} | {ratio} |")
    if empty:
        lines.append(f"| empty Triton launch | {empty * 1e3:.1f} | | 1 |")
    return "\n".join(lines)


def our_kernels() -> list[str]:
    """Series that count as "our kernel" in the targets: steps 1-9. Left out: step 0 (dense, the
    tutorial's), cublas_fp32_mask (torch's) and reordered_in_sample (its vocabulary order was fitted on
    the very mask it is measured on)."""
    return [s.series for s in _chapter().steps if s.number >= 1]


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


def _best(results, batch: int, kind: str, allowed: int) -> dict | None:
    ours = our_kernels()
    rows = [r for r in results.rows if r["series"] in ours and r["params"].get("layout", "vd") == "vd"
            and r["params"].get("batch") == batch and r["params"].get("kind") == kind
            and r["params"].get("allowed") == allowed]
    return min(rows, key=lambda r: r["ms"]) if rows else None


def _one(results, series: str, **params) -> dict | None:
    rows = [r for r in results.select(series, **params) if r["params"].get("layout", "vd") == "vd"]
    return rows[0] if len(rows) == 1 else None


def target_report(results) -> str:
    """The targets with the ratios measured in one run (the clock each row is on is the file's), as a
    Markdown table, and the points where we lose."""
    label = _chapter().label
    dispatch = _s(9)
    clock = results.rows[0].get("clock", "do_bench") if results.rows else "–"
    lines = [f"Clock: {clock}.", "", "| target | measured | met |", "|---|---|---|"]

    def add(name: str, value: str, ok: bool | None):
        lines.append(f"| {name} | {value} | {'–' if ok is None else ('yes' if ok else '**no**')} |")

    # best kernel within 1.3x of the floor, batch 1, every mask kind and count
    for kind in _kinds(results):
        worst = None
        for r in results.select("dense_mask", batch=1, kind=kind):
            best = _best(results, 1, kind, r["params"]["allowed"])
            if best and "floor_ms" in best:
                ratio = best["ms"] / best["floor_ms"]
                if worst is None or ratio > worst[0]:
                    worst = (ratio, r["params"]["allowed"], label(best["series"]))
        if worst:
            add(f"best kernel ≤ 1.3× the floor, batch 1, {kind} masks, worst count",
                f"{worst[0]:.2f}× at {worst[1]:,} allowed ({worst[2]})", worst[0] <= 1.3)
    # step 9 (the dispatch) >= 10x dense + mask at <= 1,000 allowed, batch 1
    ratios = []
    for r in results.select("dense_mask", batch=1):
        mine = _one(results, dispatch, batch=1, kind=r["params"]["kind"], allowed=r["params"]["allowed"])
        if mine and r["params"]["allowed"] <= 1000:
            ratios.append((r["ms"] / mine["ms"], r["params"]["allowed"], r["params"]["kind"]))
    if ratios:
        low = min(ratios)
        add(f"{label(dispatch)}, ≤ 1,000 allowed, batch 1: ≥ 10× dense + mask (smallest speedup)",
            f"{low[0]:.1f}× ({low[2]}, {low[1]:,} allowed)", low[0] >= 10)
    # >= 2.5x index_select + matmul at 10,000 allowed
    for kind in _kinds(results):
        base, mine = _one(results, "index_select", batch=1, kind=kind, allowed=10_000), \
            _one(results, dispatch, batch=1, kind=kind, allowed=10_000)
        if base and mine:
            ratio = base["ms"] / mine["ms"]
            add(f"{label(dispatch)}, 10,000 allowed ({kind}), batch 1: ≥ 2.5× index_select + matmul",
                f"{ratio:.2f}×", ratio >= 2.5)
    # host time per call <= 2x an empty Triton launch, batch 1
    empty = results.data.get("ceilings", {}).get("empty_launch_host_ms")
    hosts = sorted((r for r in results.select(dispatch, batch=1) if "host_ms" in r), key=lambda r: r["host_ms"])
    if empty and hosts:
        median_h, worst_h = hosts[len(hosts) // 2], hosts[-1]
        add(f"{label(dispatch)} host time per call ≤ 2× an empty Triton launch, batch 1 (median over the counts; "
            "worst count)",
            f"{median_h['host_ms'] / empty:.2f}× ({median_h['host_ms'] * 1e3:.1f} µs against {empty * 1e3:.1f} µs); "
            f"worst {worst_h['host_ms'] / empty:.2f}× ({worst_h['params']['kind']}, "
            f"{worst_h['params']['allowed']:,} allowed)", median_h["host_ms"] <= 2 * empty)
    # the whole step from the bitmask against xgrammar's path
    pairs = []
    for r in results.select(XGRAMMAR):
        p = r["params"]
        mine = _one(results, PLAN, batch=p["batch"], kind=p["kind"], allowed=p["allowed"])
        if mine:
            # the spreads overlap: the two are not told apart by this run's repetitions
            overlap = bool(mine.get("spread_ms") and r.get("spread_ms")
                           and mine["spread_ms"][0] <= r["spread_ms"][2])
            pairs.append((r["ms"] / mine["ms"], p, overlap))
    if pairs:
        b1 = [q for q in pairs if q[1]["batch"] == 1 and q[1]["allowed"] <= 1000]
        if b1:
            low = min(b1, key=lambda q: q[0])
            add("whole step, batch 1, ≤ 1,000 allowed: ≥ 10× xgrammar's path (smallest speedup)",
                f"{low[0]:.1f}× ({low[1]['kind']}, {low[1]['allowed']:,} allowed)", low[0] >= 10)
        b64 = [q for q in pairs if q[1]["batch"] == 64 and q[1]["allowed"] <= 0.001 * VOCAB]
        if b64:
            low = min(b64, key=lambda q: q[0])
            add("whole step, batch 64, ≤ 0.1% of V per row: ≥ 3× xgrammar's path (smallest speedup)",
                f"{low[0]:.1f}× ({low[1]['kind']}, {low[1]['allowed']:,} allowed)", low[0] >= 3)
        worst = min(pairs, key=lambda q: q[0])
        add("whole step never slower than xgrammar's path, any batch and density (worst point; slower means "
            "outside the spread of the three repetitions)",
            f"{worst[0]:.2f}× (batch {worst[1]['batch']}, {worst[1]['kind']}, {worst[1]['allowed']:,} allowed"
            f"{', spreads overlap' if worst[0] < 1 and worst[2] else ''})", worst[0] >= 1.0 or worst[2])
    # dispatch never > 5% slower than dense + mask
    worst_d = None
    for r in results.select(dispatch):
        p = r["params"]
        base = results.select("dense_mask", batch=p["batch"], kind=p["kind"], allowed=p["allowed"])
        if base:
            ratio = r["ms"] / base[0]["ms"]
            if worst_d is None or ratio > worst_d[0]:
                worst_d = (ratio, p)
    if worst_d:
        p = worst_d[1]
        add(f"{label(dispatch)} never > 1.05× dense + mask (worst point)",
            f"{worst_d[0]:.2f}× (batch {p['batch']}, {p['kind']}, {p['allowed']:,} allowed)", worst_d[0] <= 1.05)
    lost = losses(results.rows)
    if lost:
        lines += ["", "Where we lose:", ""] + [f"- {text.removeprefix('we lose: ')}" for text in lost]
    return "\n".join(lines)
