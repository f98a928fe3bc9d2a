"""The lesson's tables and numbers, computed from the committed benchmark file and from the batch layouts.

Every function takes the committed :class:`~studylog.plotting.Results` (or ``None`` when the chapter has none)
and returns Markdown or numbers; a number the file does not hold is ``None`` (the notebook prints "pending").
Nothing here times anything.

* :func:`caption`: which GPU, when, with what, on which clock (no commit: the file itself keeps it).
* :func:`layouts`: the benchmark's batches and their tile accounting at step 5's tiling.
* :func:`bounds_table`: the pairs each approach computes, and the floors of each shape (two tables).
* :func:`amdahl`: attention's share of a whole scoring pass of a model, before and after.
* :func:`page_steps_table`: the lesson's one table of steps, one row a step or sub-step (4a to 4c, 5a to 5c) on one
  case, its × over the step named in its "against" cell (:func:`page_rows`); :func:`steps_table`: every step's µs on
  every shape (folded), each shape's compute floor in its heading.
* :func:`step4_part_diffs`, :func:`step4_parts`: step 4's three changes as diffs, each against the one before (4a and
  4b read from ``lab/multi_item/step04_parts.py``), and their times from that script's run;
  :func:`step4_ranges_diff`, :func:`step4_loop_diff`: step 3's loop against step 4's three ranges, and the loop over
  one range against step 3's loop.
* :func:`step6_diffs`: step 6's body against step 5's program (open), and their signatures (folded).
* :func:`step5_chain`: step 5's three changes one at a time (:class:`Chain`, one run), and
  :func:`heaviest_first_alone`, why its tied last change stays; :func:`step4_same_config`:
  whether step 4's larger set of configurations changes nothing on the long-prefix prompt.
* :func:`step_table`: some steps' times against the compute floor, shape by shape.
* :func:`result_table`, :func:`peers_table`, :func:`peer_settings`: the result against the baselines and the
  peers, and a table of which of a peer's settings won on each shape and card.
* :func:`start_bound`, :func:`start_bound_table`: the key tiles of the exact item start against FlashInfer's
  ``max_item_len`` bound.
* :func:`target`, :func:`target_table`: step 5's targets against the baselines, and whether it meets them.
* :func:`tried_table`: what did not help, one line each (details in ``lab/multi_item/README.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from book.common import PENDING, ChainRow, fmt, is_tie, lab_or_none, us
from book.multi_item.figures import approaches, series_label, shape_names, shape_title
from studylog.multi_item import report
from studylog.multi_item.formats import DEFAULT_RULE, MultiItemBatch
from studylog.multi_item.tiles import (DEFAULT_ORDER, SCHEDULE_ORDERS, TileStats, planned_key_tiles, tile_stats,
                                      work_order)

STEP = {s.number: s for s in report.STEPS}
LAB = "`lab/multi_item/README.md`"
#: the benchmark's mixed batch with grouped-query attention (:func:`studylog.multi_item.report.gqa_shapes`)
GQA_SHAPE = f"{report.MIXED_SHAPE}, {report.BENCH_HEADS // report.GQA_GROUP} KV heads"


def caption(results) -> str:
    """``Measured in this chapter's own run on <GPU> on <date> with torch ..., Triton ...; <clock> clock.`` (each
    chapter has its own run, so dates differ between pages)."""
    if results is None:
        return "No committed GPU results for this chapter yet."
    v = results.data["versions"]
    return (f"Measured in this chapter's own run on {results.gpu} on {results.date} with torch {v['torch']} and "
            f"Triton {v['triton']}; {clock(results)} clock.")


def clock(results) -> str:
    """The clock of step 5's rows, as prose names it (the file's "gpu" is the GPU clock)."""
    name = results.select(STEP[5].series)[0].get("clock", "do_bench")
    return {"gpu": "GPU"}.get(name, name)


def ms(results, series: str, shape: str) -> float | None:
    """The median of one series on one shape (ms), or ``None`` when the file has no such row."""
    if results is None:
        return None
    rows = results.select(series, shape=shape)
    return rows[0]["ms"] if len(rows) == 1 else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


@dataclass
class Layout:
    """One benchmark shape: its batch and its tile accounting at step 5's tiling."""

    name: str
    batch: MultiItemBatch
    stats: TileStats


def tiling(results) -> tuple[int, int]:
    """Step 5's tile shape in the committed file (64 by 64 when it records none)."""
    rows = [r for r in results.select(STEP[5].series) if "block_m" in r] if results is not None else []
    return (rows[0]["block_m"], rows[0]["block_n"]) if rows else (64, 64)


def layouts(results) -> dict[str, Layout]:
    """The benchmark's shapes, built on the CPU, with their tiles counted at step 5's tiling."""
    block_m, block_n = tiling(results)
    out = {}
    for name, prefixes, items in report.bench_shapes():
        batch = MultiItemBatch.from_item_lens(prefixes, items, device="cpu")
        out[name] = Layout(name, batch, tile_stats(batch, block_m, block_n))
    return out


def floors(results, shape: str) -> tuple[float | None, float | None]:
    """The memory and compute floors (ms) of a shape, from any row of it in the committed file."""
    rows = [r for r in results.select(shape=shape) if "compute_floor_ms" in r] if results is not None else []
    return (rows[0]["floor_ms"], rows[0]["compute_floor_ms"]) if rows else (None, None)


def _whole_us(ms: float | None) -> str:
    """A time given in ms, in whole µs without separators (``pending`` where there is none)."""
    return fmt(None if ms is None else ms * 1e3, ".0f")


def useful_flops(layout: Layout) -> float:
    """FLOPs of the visible pairs at the benchmark's heads and head dim: two matmuls of ``2 d`` per pair."""
    return 4.0 * layout.stats.visible_pairs * report.BENCH_HEAD_DIM * report.BENCH_HEADS


def matmul_rate(results, lays: dict[str, Layout]) -> float | None:
    """The bf16 matmul rate (FLOP/s) the file's compute floors divide by, recovered from one shape's floor."""
    for name, lay in lays.items():
        floor = floors(results, name)[1]
        if floor:
            return useful_flops(lay) / (floor * 1e-3)
    return None


def card_matmul_rate(results, n: int = report.CEILING_MATMUL_N) -> float | None:
    """The bf16 matmul rate (FLOP/s) at side ``n`` that chapter 00's run of the card's ceilings measured on the card
    of ``results`` (its table shows it); :func:`matmul_rate`, this chapter's own run's rate at the same side,
    differs from it by run-to-run noise. None where that run or that size is not committed."""
    from studylog import plotting

    if results is None:
        return None
    try:
        env = plotting.load_results("env", gpu=results.path.parent.name)
    except FileNotFoundError:
        return None
    for r in env.rows:
        if r.get("series") == "matmul_bfloat16" and r.get("params", {}).get("n") == n and "tflops" in r:
            return r["tflops"] * 1e12
    return None


def bounds_table(results, lays: dict[str, Layout]) -> str:
    """Markdown, two narrow tables: the pairs per shape (dense, causal, visible), then the bytes of q, k, v and the
    output and both floors."""
    pairs = ["| shape | tokens | dense pairs | causal pairs | visible pairs | visible / causal |",
             "|---|---|---|---|---|---|"]
    bounds = ["| shape | q, k, v, out | memory floor (µs) | compute floor (µs) |", "|---|---|---|---|"]
    for name, lay in lays.items():
        dense = sum(s * s for s in lay.batch.seq_lens)
        nbytes = 4 * report.BENCH_HEADS * lay.batch.total_tokens * report.BENCH_HEAD_DIM * 2
        memory, compute = floors(results, name)
        stats = lay.stats
        pairs.append(f"| {shape_title(name)} | {lay.batch.total_tokens:,} | {dense / 1e6:.1f} M | "
                     f"{stats.causal_pairs / 1e6:.1f} M | {stats.visible_pairs / 1e6:.1f} M | "
                     f"{stats.visible_pairs / stats.causal_pairs:.0%} |")
        bounds.append(f"| {shape_title(name)} | {nbytes / 2**20:.0f} MiB | {_whole_us(memory)} | {_whole_us(compute)} |")
    return "\n".join(pairs) + "\n\n" + "\n".join(bounds)


# ---------------------------------------------------------------------------------------------
# The Amdahl view: attention inside a whole scoring pass
# ---------------------------------------------------------------------------------------------

#: Llama 3.1 8B (its config.json): the attention of one layer is the benchmark's (32 query heads of 128)
MODEL = {"name": "Llama 3.1 8B", "hidden": 4096, "layers": 32, "mlp": 14336, "heads": 32, "kv_heads": 8,
         "head_dim": 128, "config": "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json"}


def linear_flops_per_token(model: dict[str, Any] = MODEL) -> float:
    """FLOPs of the projections and the MLP of every layer for one token (two per weight)."""
    h, kv = model["hidden"], model["kv_heads"] * model["head_dim"]
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * model["mlp"]
    return 2.0 * per_layer * model["layers"]


def amdahl(results, lays: dict[str, Layout], model: dict[str, Any] = MODEL) -> dict[str, dict[str, float | None]]:
    """Per shape: the time of a whole pass of ``model``'s layers over the packed batch, with the linear layers
    at the matmul floor of the same run and the attention measured (the benchmark's shape is one layer's
    attention), with SDPA's dense mask and with step 5; and one pass per item, whose linear layers see every
    item's copy of the prefix. Times in ms (``None`` where the file lacks a series). ``pass_gain`` is the pass with
    step 5 against the pass with SDPA's dense mask, ``pass_gain_flashinfer`` against the pass with FlashInfer."""
    rate = matmul_rate(results, lays)
    out = {}
    for name, lay in lays.items():
        tokens = lay.batch.total_tokens
        per_item = sum(p + n for p, lens in zip(lay.batch.prefix_lens, lay.batch.item_lens) for n in lens)
        linear = None if rate is None else linear_flops_per_token(model) * tokens / rate * 1e3
        linear_per_item = None if rate is None else linear_flops_per_token(model) * per_item / rate * 1e3
        att = {s: ms(results, s, name) for s in (report.SDPA_DENSE, STEP[5].series, report.ONE_PASS_PER_ITEM,
                                                 report.FLASHINFER)}
        layers = model["layers"]
        total = {s: None if linear is None or t is None else linear + layers * t for s, t in att.items()}
        naive = (None if linear_per_item is None or att[report.ONE_PASS_PER_ITEM] is None
                 else linear_per_item + layers * att[report.ONE_PASS_PER_ITEM])
        out[name] = {
            "linear_ms": linear,
            "dense_total_ms": total[report.SDPA_DENSE],
            "step05_total_ms": total[STEP[5].series],
            "dense_share": ratio(None if total[report.SDPA_DENSE] is None else layers * att[report.SDPA_DENSE],
                                 total[report.SDPA_DENSE]),
            "step05_share": ratio(None if total[STEP[5].series] is None else layers * att[STEP[5].series],
                                  total[STEP[5].series]),
            "pass_gain": ratio(total[report.SDPA_DENSE], total[STEP[5].series]),
            "pass_gain_flashinfer": ratio(total[report.FLASHINFER], total[STEP[5].series]),
            "per_item_tokens": per_item,
            "tokens": tokens,
            "per_item_total_ms": naive,
            "packing_gain": ratio(naive, total[STEP[5].series]),
        }
    return out


def amdahl_table(view: dict[str, dict[str, float | None]], model: dict[str, Any] = MODEL) -> str:
    lines = [f"| shape | linear layers, {model['layers']} layers (ms) | pass with SDPA, dense mask (ms) | "
             f"attention's share | pass with {STEP[5].name} (ms) | attention's share | pass faster by | "
             "one pass per item (ms) |", "|---|---|---|---|---|---|---|---|"]
    for name, v in view.items():
        lines.append(f"| {name} | {fmt(v['linear_ms'], ',.1f')} | {fmt(v['dense_total_ms'], ',.1f')} | "
                     f"{fmt(v['dense_share'], '.0%')} | {fmt(v['step05_total_ms'], ',.1f')} | "
                     f"{fmt(v['step05_share'], '.0%')} | {fmt(v['pass_gain'], '.2f', '×')} | "
                     f"{fmt(v['per_item_total_ms'], ',.1f')} |")
    return "\n".join(lines)


def margin_words(x: float) -> str:
    """What the page says after a step's speed ratio: a tie, a marginal gain (just past the tie line), or nothing."""
    return ", a tie" if is_tie(x) else ", a marginal gain" if 1.03 < round(x, 2) < 1.10 else ""


def flashinfer_pass_gain(results, lays: dict[str, Layout], model: dict[str, Any] = MODEL) -> float | None:
    """How much faster a whole pass of ``model`` over the mixed batch is with step 6 than with FlashInfer (8 KV
    heads, the model's own layout): the linear layers at the matmul floor, as in :func:`amdahl`, plus every layer's
    measured attention. The first row of :func:`pass_table`, and the frame beside the chapter's result."""
    linear = amdahl(results, lays, model)[MAIN_SHAPES[1]]["linear_ms"]
    g = {s: ms(results, s, GQA_SHAPE) for s in (report.FLASHINFER, STEP[6].series)}
    if linear is None or None in g.values():
        return None
    return ratio(linear + model["layers"] * g[report.FLASHINFER], linear + model["layers"] * g[STEP[6].series])


def pass_table(results, lays: dict[str, Layout], model: dict[str, Any] = MODEL) -> str:
    """Markdown: "Why it matters" against the strongest rival: FlashInfer on the mixed batch with 8 KV heads against
    step 6 (the model's own layout), attention's share of a whole pass of ``model`` with it and with the chapter's
    kernel, and how much faster the whole pass is with ours. SDPA's dense mask (:func:`amdahl`'s ``pass_gain``, a
    rival nobody would ship) and one pass per item (packing's gain rather than the kernel's) are the page's sentences
    under the table."""
    if results is None:
        return PENDING
    view = amdahl(results, lays, model)
    layers, linear = model["layers"], view[MAIN_SHAPES[1]]["linear_ms"]
    g = {s: ms(results, s, GQA_SHAPE) for s in (report.FLASHINFER, STEP[6].series)}

    def share(t: float | None) -> float | None:
        return None if t is None or linear is None else layers * t / (linear + layers * t)

    return "\n".join([
        "| rival | shape (ours) | attention's share of the pass: rival → ours | whole pass faster with ours |",
        "|---|---|---|---|",
        (f"| FlashInfer's multi-item prefill | 8 prompts, mixed, 8 KV heads (step 6) | "
         f"{fmt(share(g[report.FLASHINFER]), '.0%')} → {fmt(share(g[STEP[6].series]), '.0%')} | "
         f"{fmt(flashinfer_pass_gain(results, lays, model), '.2f', '×')} |")])


# ---------------------------------------------------------------------------------------------
# The steps, the result, the peers
# ---------------------------------------------------------------------------------------------

def step_table(results, numbers: list[int]) -> str:
    """Steps ``numbers`` shape by shape: time, the step before it over it, the compute floor and the share
    of it the step reaches."""
    if results is None:
        return PENDING
    lines = ["| shape | step | µs per call | previous step / this one | compute floor (µs) | floor / time |",
             "|---|---|---|---|---|---|"]
    for shape in shape_names(results):
        for n in numbers:
            t = ms(results, STEP[n].series, shape)
            if t is None:
                continue
            before = ms(results, STEP[n - 1].series, shape) if n > 1 else None
            if n == 5 and before is None:
                before = ms(results, report.STEP04_PER_PROMPT, shape)
            floor = floors(results, shape)[1]
            lines.append(f"| {shape} | `{STEP[n].name}` | {t * 1e3:,.1f} | "
                         f"{'–' if before is None else f'{before / t:.2f}×'} | {_whole_us(floor)} | "
                         f"{'–' if floor is None else f'{floor / t:.0%}'} |")
    return "\n".join(lines)


#: The lesson's steps as the fold's table lists them, one row a step or sub-step: (label, the one change, the series
#: per shape; a dict maps a shape to its series, "" every other shape, ``None`` not run there). Step 4's three changes
#: (4a to 4c) are timed one at a time on the one-prompt shapes (:func:`step4_parts`), step 5's (5a to 5c) on the
#: mixed batch with 32 heads (:func:`step5_chain`); 4c and 5c are the library's steps 4 and 5, the benchmark's
#: series on every shape (step 4 launched per prompt on a batch).
def step_rows() -> list[tuple[str, str, dict[str, str | None] | str]]:
    return [
        ("1", "SDPA with the dense mask (a batch padded)", report.SDPA_DENSE),
        ("2", "a Triton flash attention that reads the mask", STEP[2].series),
        ("3", "the mask computed from the metadata", STEP[3].series),
        ("4a", STEP4_PARTS["4a"], {"": None}),
        ("4b", STEP4_PARTS["4b"], {"": None}),
        ("4c", STEP4_PARTS["4c"] + " (a batch: a launch per prompt)",
         {"": STEP[4].series, report.MIXED_SHAPE: report.STEP04_PER_PROMPT, GQA_SHAPE: report.STEP04_PER_PROMPT}),
        ("5a", STEP5_PARTS["5a"], {"": None}),
        ("5b", STEP5_PARTS["5b"], {"": None}),
        ("5c", STEP5_PARTS["5c"], STEP[5].series),
        ("6", "a key/value head's query heads in one tile", STEP[6].series),
    ]


#: step 4's three changes, as the table names them
STEP4_PARTS = {"4a": "step 3's loop stopped at the diagonal",
               "4b": "the key tiles between the prefix and a row's item never loaded",
               "4c": "whole prefix tiles without the mask"}
#: step 5's three changes, as the table names them
STEP5_PARTS = {"5a": "every prompt in one launch, tail first",
               "5b": "the heads in groups whose keys and values fit in L2",
               "5c": "each group's heaviest query tiles first"}

#: The rows of the steps tables that read :func:`step5_chain` on its case, by the chain's labels: one run of its own,
#: so each of 5a, 5b and 5c is timed in the run its "×" divides (5c is that run's step 5; the result table's step 5
#: is the benchmark's). 4c on that case is the benchmark's step 4 launched per prompt.
CHAIN_ROWS = {"5a": "5a", "5b": "5b", "5c": "step 5"}

#: The mixed batch in the multi-head layout as the tables name it, told apart from the grouped-query one (GQA_SHAPE)
MIXED_LABEL = f"{report.MIXED_SHAPE}, {report.BENCH_HEADS} heads"

#: The steps table's default cases: the long-prefix prompt (steps 1 to 5c) and the mixed batch with 32 heads (steps
#: 1, 4 and 5a to 5c). :func:`steps_table` with ``shapes=None`` gives every shape (folded).
MAIN_SHAPES = ("prefix 2048, 32 items x 32", report.MIXED_SHAPE)


#: The page's steps table's cases: the long-prefix prompt (steps 1 to 4c), the mixed batch with 32 heads (step 5's
#: changes) and the headline's case, the mixed batch with 8 KV heads (step 6).
PAGE_SHAPES = (MAIN_SHAPES[0], report.MIXED_SHAPE, GQA_SHAPE)


def _short(shape: str) -> str:
    """A shape as the tables name it: its first words, and its heads on the mixed batch (two layouts of one batch)."""
    if shape == GQA_SHAPE:
        return f"{report.MIXED_SHAPE.split(',')[0]}, {report.BENCH_HEADS // report.GQA_GROUP} KV heads"
    if shape == report.MIXED_SHAPE:
        return f"{shape.split(',')[0]}, {report.BENCH_HEADS} heads"
    return shape.split(",")[0]


def _times_cell(x: float) -> str:
    """A "×" cell: a tie or a loss said."""
    return f"{x:.2f}×" + (" (tie)" if is_tie(x) else ", does not pay" if round(x, 2) < 1 else "")


def page_rows(results) -> list[tuple[str, str, str, float | None, float | None, str]]:
    """The page's steps table as rows ``(label, the one change, case, µs, ×, against)``: each step on one case, its
    × over the step named in "against" on that case (the row above where the case is the same, else named with its
    µs). Steps 1 to 4c on the long-prefix prompt (4a, 4b from :func:`step4_parts`), 5a to 5c on the mixed batch with
    32 heads, all three from :func:`step5_chain` (one run, whose first row, step 4 launched per prompt, is 5a's base,
    named with its µs), 6 on the mixed batch with 8 KV heads over step 5 there."""
    long_ = MAIN_SHAPES[0]
    parts = step4_parts() or {}
    chain = step5_chain()
    t = {"1": ms(results, report.SDPA_DENSE, long_), "2": ms(results, STEP[2].series, long_),
         "3": ms(results, STEP[3].series, long_), "4a": parts.get("4a"), "4b": parts.get("4b"),
         "4c": ms(results, STEP[4].series, long_)}
    if chain is not None:
        t.update({label: chain.times[key] / 1e3 for label, key in CHAIN_ROWS.items()})  # one run: its ratios
    t["6"] = ms(results, STEP[6].series, GQA_SHAPE)
    change = {"1": "SDPA with the dense mask", "2": "a Triton flash attention that reads the mask",
              "3": "the mask computed from the metadata", **STEP4_PARTS, **STEP5_PARTS,
              "6": "a key/value head's query heads in one tile"}
    case = {**{n: long_ for n in ("1", "2", "3", "4a", "4b", "4c")},
            **{n: report.MIXED_SHAPE for n in ("5a", "5b", "5c")}, "6": GQA_SHAPE}
    rows, above = [], None  # above: the last row timed, (label, case, ms)
    for label in change:
        here = t.get(label)
        if here is None:
            rows.append((label, change[label], _short(case[label]), None, None, "–"))
            continue
        if label == "5a" and chain is not None:
            base = chain.times["step 4"] / 1e3
            against = f"step 4 launched per prompt, {base * 1e3:,.1f} µs"
        elif label == "6":
            base = ms(results, STEP[5].series, GQA_SHAPE)
            against = f"5c on this case, {base * 1e3:,.1f} µs"
        elif above is not None and above[1] == case[label]:
            base, against = above[2], (f"step {above[0]}" if above[0].isdigit() else above[0])
        else:
            base, against = None, "–"
        rows.append((label, change[label], _short(case[label]), here * 1e3,
                     None if base is None else base / here, against))
        above = (label, case[label], here)
    return rows


def page_floors(results) -> dict[str, float | None]:
    """The compute floor (µs) of each case of the page's steps table, by the table's name for it."""
    return {_short(s): None if floors(results, s)[1] is None else floors(results, s)[1] * 1e3 for s in PAGE_SHAPES}


def page_steps_table(results) -> str:
    """Markdown: the page's one table of steps (:func:`page_rows`), one row a step or sub-step on one case, with its
    time over its case's compute floor (:func:`page_floors`, said beside the table)."""
    if results is None:
        return PENDING
    lines = ["| step | the one change | case | µs | × | against | × compute floor |", "|---|---|---|---|---|---|---|"]
    floor = page_floors(results)
    for label, change, case, t, x, against in page_rows(results):
        over = "–" if t is None or not floor.get(case) else f"{t / floor[case]:.1f}×"
        lines.append(f"| {label} | {change} | {case} | {'–' if t is None else f'{t:,.1f}'} | "
                     f"{'–' if x is None else _times_cell(x)} | {against} | {over} |")
    return "\n".join(lines)


def steps_kept(results) -> dict[str, float | None]:
    """The ratios behind the note under the steps table, why each step that ties or loses is kept: step 2's and 5c's
    × (ties), 5a's (a loss), and 5c's order alone, without the groups, over tail first
    (:func:`heaviest_first_alone`)."""
    x = {label: x for label, _, _, _, x, _ in page_rows(results)}
    alone = heaviest_first_alone()
    return {"2": x.get("2"), "5a": x.get("5a"), "5c": x.get("5c"),
            "5c alone": None if alone is None else alone[0] / alone[1]}


def steps_table(results, shapes: tuple[str, ...] | None = MAIN_SHAPES, chain: Chain | None = None) -> str:
    """Markdown: every step's and sub-step's time (µs) per shape (``shapes``, or every shape of the file), the
    shape's compute floor (µs) in its heading; no ratios (the page's table, :func:`page_steps_table`, has them).
    Steps 4a and 4b read :func:`step4_parts` on the shapes it timed; on ``chain``'s case (:func:`step5_chain`) the rows
    of :data:`CHAIN_ROWS` (5a to 5c) read that run, the others the benchmark, as the page's table does."""
    if results is None:
        return PENDING
    shapes = [s for s in shape_names(results) if shapes is None or s in shapes]
    head = ["step", "the one change"] + [f"{_short(s)} (floor {_whole_us(floors(results, s)[1])} µs): µs"
                                         for s in shapes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    parts = {s: step4_parts(shape=s) or {} for s in shapes}

    def time(label: str, series, shape: str) -> float | None:
        if chain is not None and shape == chain.case and label in CHAIN_ROWS:
            return chain.times[CHAIN_ROWS[label]] / 1e3
        if label in ("4a", "4b"):
            return parts[shape].get(label)
        name = series if isinstance(series, str) else series.get(shape, series[""])
        return None if name is None else ms(results, name, shape)

    for label, change, series in step_rows():
        cells = [label, change]
        for s in shapes:
            t = time(label, series, s)
            cells.append("–" if t is None else f"{t * 1e3:,.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def headline_link(results) -> tuple[float, float, float] | None:
    """The line under the page's steps table: FlashInfer's and step 6's µs on the headline's case and the ratio
    (:func:`gqa_ratio`), or None where the run lacks either."""
    peer, six = (ms(results, s, GQA_SHAPE) for s in (report.FLASHINFER, STEP[6].series))
    if peer is None or six is None:
        return None
    return peer * 1e3, six * 1e3, peer / six


def _step3_loop() -> str:
    """Step 3's loop over every key tile, as its kernel's source writes it (the ``for`` line and its body)."""
    from studylog import source
    from studylog.multi_item import steps

    lines = source.source_of(steps.attn_fwd_mask_on_the_fly)[0].splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("for start_n in range("))
    end = start + 1
    indent = len(lines[start]) - len(lines[start].lstrip())
    while end < len(lines) and (len(lines[end]) - len(lines[end].lstrip()) > indent or not lines[end].strip()):
        end += 1
    return "\n".join(lines[start:end])


def step4_ranges_diff():
    """Step 4's one idea as a diff: step 3's loop over every key tile against the body of ``attend_visible_tiles``,
    the three ranges that replace it (a ``studylog.source.Diff``; both sides verbatim from the kernels' sources)."""
    from book.common import without_docstrings
    from studylog import source
    from studylog.multi_item import steps

    new = without_docstrings(source.source_of(steps.attend_visible_tiles)[0]).splitlines()
    body = new[next(i for i, line in enumerate(new) if line.startswith("):")) + 1:]
    return source.show_diff(_step3_loop(), "\n".join(body), names=("step 3: one loop over every key tile",
                                                                    "step 4: three ranges (attend_visible_tiles)"))


def step4_loop_diff():
    """The loop over one range, ``attend_key_tiles``, against step 3's loop: the same body, with the mask's load and
    arithmetic left out where ``MASKED`` is False (whole prefix tiles)."""
    from book.common import without_docstrings
    from studylog import source
    from studylog.multi_item import steps

    return source.show_diff(_step3_loop(), without_docstrings(source.source_of(steps.attend_key_tiles)[0]),
                            names=("step 3: one loop over every key tile", "step 4: attend_key_tiles, one range"))


def step6_diffs() -> tuple:
    """Step 6 against step 5's program (``attend_query_tile``, which step 5 runs after its table lookup): the bodies'
    diff, the packing of a group's query heads into one tile (shown open), and the signatures' (folded: the table's
    arguments and the autotuner's decorator, which step 5's kernel already has). Two ``studylog.source.Diff``."""
    from book.common import without_docstrings
    from studylog import source
    from studylog.multi_item import steps

    parts = []
    for f in (steps.attend_query_tile, STEP[6].source):
        lines = without_docstrings(source.source_of(f)[0]).splitlines()
        end = next(i for i, line in enumerate(lines) if line.startswith("):")) + 1
        parts.append(("\n".join(lines[:end]), "\n".join(lines[end:])))
    names = (f"{STEP[5].name}'s program (attend_query_tile)", STEP[6].name)
    return (source.show_diff(parts[0][1], parts[1][1], names=names),
            source.show_diff(parts[0][0], parts[1][0], names=names))


def _lab_body(name: str) -> str:
    """The body of ``name``, a function of ``lab/multi_item/step04_parts.py``, as its source writes it (read, not
    imported: the lab's kernels are not defined by the page), without its docstring."""
    import ast

    from book.common import without_docstrings
    from studylog import paths

    text = (paths.REPO_ROOT / "lab" / "multi_item" / "step04_parts.py").read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = without_docstrings(ast.get_source_segment(text, node)).splitlines()
    return "\n".join(lines[next(i for i, line in enumerate(lines) if line.startswith("):")) + 1:])


def headline_spread(results) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """FlashInfer's and step 6's fastest and slowest repetition on the headline's case, µs (each row's
    ``spread_ms``, the same run as :func:`headline_link`): the noise the 1.12× is read against. None where the run
    lacks either row or its spread."""
    rows = [results.select(s, shape=GQA_SHAPE) for s in (report.FLASHINFER, STEP[6].series)]
    if not all(rows) or not all(r[0].get("spread_ms") for r in rows):
        return None
    (peer_lo, _, peer_hi), (six_lo, _, six_hi) = (r[0]["spread_ms"] for r in rows)
    return (peer_lo * 1e3, peer_hi * 1e3), (six_lo * 1e3, six_hi * 1e3)


def step4_part_diffs() -> dict:
    """Step 4's three changes as diffs (``studylog.source.Diff``), each against the one before: 4a, step 3's loop
    against one range up to the diagonal; 4b, that range against the prefix's and the items'; 4c, those two against
    the library's three (``attend_visible_tiles``, step 4). The parts' bodies are read from the lab script."""
    from book.common import without_docstrings
    from studylog import source
    from studylog.multi_item import steps

    lines = without_docstrings(source.source_of(steps.attend_visible_tiles)[0]).splitlines()
    library = "\n".join(lines[next(i for i, line in enumerate(lines) if line.startswith("):")) + 1:])
    a, b = _lab_body("visible_tiles_4a"), _lab_body("visible_tiles_4b")
    return {"4a": source.show_diff(_step3_loop(), a, names=("step 3: one loop over every key tile",
                                                            "4a: one range, up to the diagonal")),
            "4b": source.show_diff(a, b, names=("4a", "4b: the prefix, then the items")),
            "4c": source.show_diff(b, library, names=("4b", "4c: whole prefix tiles first (step 4)"))}


def step4_parts(gpu: str = "nvidia-h200", shape: str | None = None) -> dict[str, float] | None:
    """4a's and 4b's ms on ``shape`` (the long-prefix prompt by default) from ``step04_parts.json``, one run, and
    the run's own steps 3 and 4 under "step 3", "step 4"; ``None`` where the run is not committed or did not time
    that shape."""
    data = lab_or_none("multi_item", "step04_parts", gpu)
    if data is None:
        return None
    shape = shape or MAIN_SHAPES[0]
    got = {}
    for r in data["measurements"]:
        if r["params"].get("shape") != shape:
            continue
        if r["series"] == "step04 part":
            got[r["params"]["part"]] = r["ms"]
        elif r["series"] in (STEP[3].series, STEP[4].series):
            got[f"step {3 if r['series'] == STEP[3].series else 4}"] = r["ms"]
    return got or None


# ---------------------------------------------------------------------------------------------
# Step 5, one change at a time, and step 4's configurations (lab/multi_item/step_changes.py)
# ---------------------------------------------------------------------------------------------

@dataclass
class Chain:
    """A bundled step's changes one at a time, all from one run: ``rows`` (:class:`~book.common.ChainRow`, timed on
    ``case``) each add one change to the row above; the first is the previous step (the anchor), the last the
    library's step. ``anchors`` maps a row's label to the main benchmark's series it re-times on ``case``. The page
    renders it with :func:`book.common.chain_table`."""
    case: str
    rows: list[ChainRow]
    anchors: dict[str, str]
    #: the case as the table's column names it (its layout where the page has two of one batch); ``case`` if empty
    case_label: str = ""

    def name(self, case: str) -> str:
        """The column's name of ``case`` (for :func:`book.common.chain_table`)."""
        return self.case_label or case

    @property
    def times(self) -> dict[str, float]:
        """µs per row label."""
        return {r.label: r.us[self.case] for r in self.rows}

    def gap(self, results) -> float | None:
        """The largest relative gap between an anchor's time here and the same series in ``results`` (the main
        run), or None where the main run lacks them all."""
        times = self.times
        gaps = [abs(times[label] / (ms(results, series, self.case) * 1e3) - 1) for label, series in self.anchors.items()
                if ms(results, series, self.case) is not None]
        return max(gaps) if gaps else None


def _row(data: dict, series: str, shape: str, **params) -> float:
    """µs of the one row of ``series`` on ``shape`` whose params hold ``params``; a missing row raises."""
    found = [r["ms"] * 1e3 for r in data["measurements"] if r["series"] == series and r["params"]["shape"] == shape
             and all(r["params"].get(k) == v for k, v in params.items())]
    if len(found) != 1:
        raise LookupError(f"{len(found)} rows of {series!r} {params} on {shape!r}")
    return found[0]


def step4_same_config(gpu: str = "nvidia-h200") -> bool | None:
    """Whether step 4's larger set of autotuning configurations picks, on the long-prefix prompt, the configuration
    that is fastest for step 4's kernel within step 3's two (``step_changes.json``, one run): then step 4 differs
    from step 3 by its tile skipping alone, and the page says so in a clause instead of a chain of one change.
    ``None`` where the run is not committed; a run without those rows raises."""
    data = lab_or_none("multi_item", "step_changes", gpu)
    if data is None:
        return None
    shape = MAIN_SHAPES[0]
    few = [(r["ms"], r["params"].get("config")) for r in data["measurements"] if r["series"] == "step_changes"
           and r["params"]["shape"] == shape and r["params"].get("step") == 4
           and "FEW_GPU_CONFIGS" in r["params"].get("in_sets", [])]
    chosen = [r.get("config") for r in data["measurements"] if r["series"] == STEP[4].series
              and r["params"]["shape"] == shape]
    if not few or len(chosen) != 1:
        raise LookupError(f"no row of step 4 at step 3's configurations, or not one of step 4, on {shape!r}")
    best_config = min(few, key=lambda row: row[0])[1]
    return best_config is not None and chosen == [best_config]


def step5_chain(gpu: str = "nvidia-h200") -> Chain | None:
    """Step 4 launched per prompt, step 5 in tail-first order (one launch), with the head groups, and the library's
    step 5 (the heaviest tiles first as well), on the mixed batch: ``step05_chain.json`` (one run with both anchors),
    or, where it is not committed, ``step_changes.json``, which starts at the one launch (no step 4 in it)."""
    data = lab_or_none("multi_item", "step05_chain", gpu) or lab_or_none("multi_item", "step_changes", gpu)
    if data is None:
        return None
    shape, first = report.MIXED_SHAPE, report.order_series("first_run")
    rows, anchors = [], {"5a": first, "step 5": STEP[5].series}
    if any(r["series"] == report.STEP04_PER_PROMPT for r in data["measurements"]):
        rows.append(ChainRow("step 4", "a launch per prompt", {shape: _row(data, report.STEP04_PER_PROMPT, shape)}))
        anchors["step 4"] = report.STEP04_PER_PROMPT
    rows += [ChainRow("5a", ("+ prerequisite: " if rows else "")
                      + "every prompt in one launch, its programs in tail-first order",
                      {shape: _row(data, first, shape)}),
             ChainRow("5b", "+ the heads in groups whose keys and values fit in L2",
                      {shape: _row(data, "step_changes", shape, order="head groups only")}),
             ChainRow("step 5", "+ each group's heaviest query tiles first (a tie, kept)",
                      {shape: _row(data, STEP[5].series, shape)})]
    return Chain(shape, rows, anchors, MIXED_LABEL)


def heaviest_first_alone(gpu: str = "nvidia-h200") -> tuple[float, float] | None:
    """Why step 5 keeps its heaviest-tiles-first order, a tie on top of the head groups: µs of one launch on the
    mixed batch (32 heads) in 5a's tail-first order and in heaviest-first order without the groups, both from the
    run of :func:`step5_chain`; ``None`` where neither file is committed."""
    data = lab_or_none("multi_item", "step05_chain", gpu) or lab_or_none("multi_item", "step_changes", gpu)
    if data is None:
        return None
    shape = report.MIXED_SHAPE
    return (_row(data, "step_changes", shape, order="5a (first_run)"),
            _row(data, "step_changes", shape, order="heaviest first only"))


def entry_series(results, shape: str) -> str:
    """The chapter's kernel on ``shape``: step 6 where the file times it there (key/value heads shared by query
    heads, as the entry point runs them), step 5 elsewhere."""
    return STEP[6].series if ms(results, STEP[6].series, shape) is not None else STEP[5].series


#: The result table's names for our two kernels: a step's number and what it does.
RESULT_LABELS = {STEP[5].series: "step 5: every prompt in one launch", STEP[6].series: "step 6: query heads packed"}


def result_table(results, series_list: list[str] | None = None) -> str:
    """Every approach (or those of ``series_list``) on every shape: µs per call (median) and how much faster the
    chapter's kernel on that shape (:func:`entry_series`, in bold) is than it. Where that kernel is step 6, its own
    cell gives its factor over step 5, and step 5's cell there holds only its time (one ratio per row's meaning)."""
    if results is None:
        return PENDING
    shapes = shape_names(results)
    named = {report.MIXED_SHAPE: MIXED_LABEL}  # the multi-head layout named beside the grouped-query one
    lines = ["| approach | " + " | ".join(f"{named.get(s, s).replace(' x ', ' × ')}: µs (its time ÷ ours)"
                                          for s in shapes) + " |",
             "|---|" + "---|" * len(shapes)]
    for series in series_list or approaches():
        cells = []
        for shape in shapes:
            final = entry_series(results, shape)
            t, mine = ms(results, series, shape), ms(results, final, shape)
            if t is None:
                cells.append("–")
            elif series == final and final == STEP[6].series:  # step 6 against the step it builds on, named
                before = ms(results, STEP[5].series, shape)
                cells.append(f"**{t * 1e3:,.1f}**" + ("" if before is None else f" ({before / t:.2f}× step 5)"))
            elif series == final:
                cells.append(f"**{t * 1e3:,.1f}**")
            elif series == STEP[5].series:  # ours on a shape where step 6 runs: step 6's row gives the ratio
                cells.append(f"{t * 1e3:,.1f}")
            else:
                cells.append(f"{t * 1e3:,.1f} ({t / mine:.2f}×)")
        if set(cells) != {"–"}:
            lines.append(f"| {RESULT_LABELS.get(series, series_label(series))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def peer_settings(peer: str = report.FLASHINFER, root=None) -> str:
    """Markdown: the settings of ``peer`` the benchmark tried (FlashInfer's backends and page sizes), in one line,
    then a table of the fastest on each shape (rows) on each card's committed run (columns); ``–`` where a card's
    run does not have that shape."""
    from pathlib import Path

    from studylog.plotting import DEFAULT_OUT, load_results, result_files

    root = Path(root) if root is not None else DEFAULT_OUT
    tried, best, cards = {}, {}, []  # best: (shape, card) -> the fastest setting
    for f in result_files("multi_item", root):
        card = load_results("multi_item", gpu=f.parent.name, root=root)
        rows = [r for r in card.select(peer) if "sweep_ms" in r]
        if not rows:
            continue
        cards.append(card.gpu)
        for r in rows:
            tried.update(dict.fromkeys(r["sweep_ms"]))
            best[r["params"]["shape"], card.gpu] = min(r["sweep_ms"], key=r["sweep_ms"].get)
    if not cards:
        return PENDING
    shapes = list(dict.fromkeys(shape for shape, _ in best))
    lines = [f"{peer} was timed at {len(tried)} settings on each shape (" + ", ".join(f"`{t}`" for t in tried)
             + "); the results above take the fastest on each shape, which is:", "",
             "| shape | " + " | ".join(cards) + " |", "|---|" + "---|" * len(cards)]
    lines += [f"| {shape_title(shape)} | " + " | ".join(f"`{best[shape, c]}`" if (shape, c) in best else "–"
                                                      for c in cards) + " |" for shape in shapes]
    return "\n".join(lines)


def peers_table(results, peer: str) -> str | None:
    """A peer's sweep (FlexAttention's block sizes, FlashInfer's backends and page sizes) shape by shape, the
    best setting and step 5 beside it; ``None`` when the file has no sweep of that peer."""
    rows = [r for r in results.select(peer) if "sweep_ms" in r] if results is not None else []
    if not rows:
        return None
    candidates = list(dict.fromkeys(c for r in rows for c in r["sweep_ms"]))
    lines = ["| shape | " + " | ".join(candidates) + f" | best | {STEP[5].name} (µs) | {STEP[5].name} faster by |",
             "|---|" + "---|" * (len(candidates) + 3)]
    for r in rows:
        shape = r["params"]["shape"]
        ours = ms(results, STEP[5].series, shape)
        best = r.get("block_size") or f"{r.get('backend')}, page {r.get('page_size')}"
        lines.append(f"| {shape} | " + " | ".join(f"{r['sweep_ms'][c] * 1e3:.1f}" if c in r["sweep_ms"] else "–"
                                                for c in candidates)
                     + f" | {best}: {r['ms'] * 1e3:.1f} | {us(ours, 1, PENDING)} | "
                     + ("–" if ours is None else f"{r['ms'] / ours:.2f}×") + " |")
    return f"**{peer}** (µs per call)\n\n" + "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Step 5's targets
# ---------------------------------------------------------------------------------------------

def target(baseline: str, shape: str) -> float | None:
    """Step 5's target against ``baseline`` on ``shape`` (a speedup): at least 4x SDPA with the dense mask and
    1.3x FlexAttention at its best block size; against FlashInfer, 1.2x on mixed item lengths (our exact item
    start skips more tiles than its longest-item bound) and not slower on uniform ones; within 1.3x of causal
    SDPA, which computes a superset."""
    if baseline == report.FLASHINFER:
        return 1.2 if shape == report.MIXED_SHAPE else 1.0
    return {report.SDPA_DENSE: 4.0, report.FLEX: 1.3, report.SDPA_CAUSAL: 1 / 1.3}.get(baseline)


TARGET_BASELINES = (report.SDPA_DENSE, report.FLEX, report.FLASHINFER, report.SDPA_CAUSAL)


def target_table(results) -> str:
    """Markdown: step 5 against each baseline on every shape, with the target; the clock of each pair and,
    where the rows have spreads, the speedup's range over the repetitions."""
    lines = [f"| shape | {STEP[5].name} (µs) | baseline | baseline (µs) | speedup (range) | clock | target | met |",
             "|---|---|---|---|---|---|---|---|"]
    for shape in shape_names(results):
        mine = results.select(STEP[5].series, shape=shape)
        if len(mine) != 1:
            continue
        for base in TARGET_BASELINES:
            rows = results.select(base, shape=shape)
            if len(rows) != 1:
                continue
            want = target(base, shape)
            speedup = rows[0]["ms"] / mine[0]["ms"]
            spread = ""
            if "spread_ms" in rows[0] and "spread_ms" in mine[0]:
                spread = (f" ({rows[0]['spread_ms'][0] / mine[0]['spread_ms'][2]:.2f}–"
                          f"{rows[0]['spread_ms'][2] / mine[0]['spread_ms'][0]:.2f})")
            text = f">= {want:.2f}x" if want >= 1 else f">= {want:.2f}x (within {1 / want:.1f}x)"
            lines.append(f"| {shape} | {mine[0]['ms'] * 1e3:.1f} | {base} | {rows[0]['ms'] * 1e3:.1f} | "
                         f"{speedup:.2f}x{spread} | {rows[0]['clock']} | {text} | "
                         f"{'yes' if speedup >= want else '**no**'} |")
    return "\n".join(lines)


#: A batch no benchmark runs, counted only: one prompt whose items are mostly short but three are long (documents
#: among titles, say), where FlashInfer's bound by the longest item reaches back past short items' starts.
LONG_ITEMS = ("prefix 512, 16 items, three of 480 tokens (counted, not timed)", [512],
              [[32, 32, 16, 32, 480, 32, 32, 32, 32, 32, 480, 16, 480, 16, 32, 16]])


def start_bound_batches(lays: dict[str, Layout]) -> dict[str, MultiItemBatch]:
    """The benchmark's batches and :data:`LONG_ITEMS`, by name."""
    name, prefixes, items = LONG_ITEMS
    return {n: lay.batch for n, lay in lays.items()} | {name: MultiItemBatch.from_item_lens(prefixes, items)}


def bounded_key_tiles(batch: MultiItemBatch, block_m: int, block_n: int) -> list[list[int]]:
    """For each prompt and query tile, how many key tiles FlashInfer's multi-item prefill visits at
    ``block_m x block_n`` tiles (one query row per head, no split of the keys). It bounds where a query tile's
    items start by the prompt's longest item: no item row at or after ``m_lo`` starts before
    ``m_lo - max_item_len``, so after the prefix's tiles it resumes at that key, rounded down to a tile, where
    steps 4 and 5 resume at the exact start of the tile's first item row. Transcribed from the loop bounds of
    ``include/flashinfer/attention/prefill.cuh`` (``num_iterations_prefix``, ``num_iterations_mask``,
    ``num_iterations`` and the loop's jump from the first to the second); with an empty prefix the loop never
    jumps and visits every key tile up to the diagonal, as there."""
    out = []
    for b, (s, p) in enumerate(zip(batch.seq_lens, batch.prefix_lens)):
        longest = int(batch.max_item_lens_t[b])
        counts = []
        for m_lo in range(0, s, block_m):
            m_hi = min(m_lo + block_m, s)
            prefix_tiles = -(-min(m_hi, p) // block_n)
            resume = max(max(m_lo - longest, 0) // block_n, prefix_tiles)
            end = max(resume, -(-m_hi // block_n))
            counts.append(prefix_tiles + end - resume if prefix_tiles else end)
        out.append(counts)
    return out


def start_bound(batches: dict[str, MultiItemBatch], tilings=((64, 64), (128, 64))) -> dict[tuple, tuple[int, int]]:
    """Key tiles visited per head, ``(shape, block_m, block_n) -> (exact start, FlashInfer's bound)``: steps 4
    and 5 resume after the prefix at the exact start of each query tile's first item
    (:func:`~studylog.multi_item.tiles.planned_key_tiles`), FlashInfer at ``m_lo - max_item_len``
    (:func:`bounded_key_tiles`). Counted on the CPU, at each tiling."""
    out = {}
    for name, batch in batches.items():
        for bm, bn in tilings:
            exact = sum(map(sum, planned_key_tiles(batch, bm, bn)))
            out[name, bm, bn] = exact, sum(map(sum, bounded_key_tiles(batch, bm, bn)))
    return out


def start_bound_table(counts: dict[tuple[str, int, int], tuple[int, int]]) -> str:
    """Markdown of :func:`start_bound`: per shape and tiling, both counts and how many more the bound visits."""
    lines = [("| shape | tiles (rows x keys) | key tiles, exact start (steps 4, 5) | key tiles, `max_item_len` bound "
              "(FlashInfer) | the bound visits more by |"), "|---|---|---|---|---|"]
    for (name, bm, bn), (exact, bounded) in counts.items():
        lines.append(f"| {name} | {bm} x {bn} | {exact:,} | {bounded:,} | {bounded / exact - 1:.1%} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Step 5's program order, and what did not help
# ---------------------------------------------------------------------------------------------

def kv_in_flight(batch: MultiItemBatch, heads: int, head_dim: int, block_m: int, order: str,
                 programs_at_once: int, elem_bytes: int = 2, rule: str = DEFAULT_RULE) -> float:
    """Bytes of keys and values that ``programs_at_once`` consecutive programs of step 5 read, averaged over
    the launch: an upper bound per window, taking each (prompt, head) in the window to read its keys up to
    the highest row it computes. Compare it with the L2 cache: above it, the tiles reread keys from DRAM."""
    order_rows = work_order(batch, heads, block_m, order, 2 * head_dim * elem_bytes, rule).tolist()
    windows = []
    for lo in range(0, len(order_rows), programs_at_once):
        reach: dict[tuple[int, int], int] = {}
        for b, t, h in order_rows[lo:lo + programs_at_once]:
            reach[b, h] = max(reach.get((b, h), 0), min((t + 1) * block_m, batch.seq_lens[b]))
        windows.append(sum(reach.values()) * 2 * head_dim * elem_bytes)
    return sum(windows) / len(windows)


def in_flight(lay: Layout, orders=(DEFAULT_ORDER, "first_run"), programs_at_once: int = 264) -> dict[str, float]:
    """Bytes of keys and values the programs running at once read in each program order (bf16, the
    benchmark's heads, 64-row tiles; two programs per SM of a 132-SM GPU by default)."""
    return {o: kv_in_flight(lay.batch, report.BENCH_HEADS, report.BENCH_HEAD_DIM, 64, o,
                            programs_at_once=programs_at_once) for o in orders}


def _autotuned_best(results, shape: str, keep) -> float | None:
    """The best of the autotuner's timings of step 5 on ``shape`` over the configs ``keep`` accepts."""
    rows = [r for r in results.select(STEP[5].series, shape=shape) if "autotune_ms" in r]
    if not rows:
        return None
    times = [t for c, t in rows[0]["autotune_ms"].items() if keep(c)]
    return min(times) if times else None


def tried_table(results) -> str:
    """What did not help, one line each: the measured effect against step 5 as it is (a positive change is
    slower) on each shape, and where the details are."""
    if results is None:
        return PENDING
    shapes = shape_names(results)
    final = STEP[5].series
    lines = ["| tried | " + " | ".join(shapes) + " | details |", "|---|" + "---|" * len(shapes) + "---|"]

    def change(t, base):
        if t is None or base is None:
            return "–"
        text = f"{t / base - 1:+.0%}"
        return "±0%" if text in ("+0%", "-0%") else text  # a change that rounds to nothing has no sign

    for order in SCHEDULE_ORDERS[1:]:
        what = {"heads_outer": "step 5 with one head per group (`heads_outer`)",
                "prompts_outer": "step 5 prompt after prompt (`prompts_outer`, a launch per prompt without gaps)",
                "first_run": "step 5 in tail-first order, every head of every prompt side by side (step 5a)"}[order]
        cells = [change(ms(results, report.order_series(order), s), ms(results, final, s)) for s in shapes]
        lines.append(f"| {what} | " + " | ".join(cells) + f" | {LAB}, program orders |")
    cells = [change(ms(results, report.STEP04_PER_PROMPT, s), ms(results, final, s)) for s in shapes]
    lines.append(f"| step 4 launched once per prompt | " + " | ".join(cells) + " | step 5 above |")
    for what, keep in (("128-row query tiles (best such config)", lambda c: c.startswith("128 x")),
                       ("128-key tiles (best such config)", lambda c: " x 128," in c)):
        cells = [change(_autotuned_best(results, s, keep), _autotuned_best(results, s, lambda c: True))
                 for s in shapes]
        if set(cells) != {"–"}:
            lines.append(f"| {what}, autotuner's own timings | " + " | ".join(cells) + f" | {LAB}, tile shapes |")
    cells = [change(ms(results, report.DO_BENCH[5], s), ms(results, final, s)) for s in shapes]
    lines.append("| timing step 5 with `do_bench` instead of the GPU clock | " + " | ".join(cells)
                 + f" | {LAB}, the clock |")
    return "\n".join(lines)


def peer_by_card(peer: str = report.FLASHINFER, shape: str = report.MIXED_SHAPE, root=None) -> str:
    """Markdown: step 5 against ``peer`` on ``shape`` in every card's committed run, one row per card, with the
    speedup's range over the repetitions, the target and, where it is missed, by how much."""
    from pathlib import Path

    from studylog.plotting import DEFAULT_OUT, load_results, result_files

    root = Path(root) if root is not None else DEFAULT_OUT
    want = target(peer, shape)
    lines = [f"| card | step 5 (µs) | {peer} (µs) | speedup (range) | target | met |", "|---|---|---|---|---|---|"]
    for f in result_files("multi_item", root):
        card = load_results("multi_item", gpu=f.parent.name, root=root)
        mine, theirs = card.select(report.STEP05.series, shape=shape), card.select(peer, shape=shape)
        if len(mine) != 1 or len(theirs) != 1:
            continue
        a, b = mine[0], theirs[0]
        speedup = b["ms"] / a["ms"]
        spread = (f" ({b['spread_ms'][0] / a['spread_ms'][2]:.2f}–{b['spread_ms'][2] / a['spread_ms'][0]:.2f})"
                  if "spread_ms" in a and "spread_ms" in b else "")
        met = "yes" if speedup >= want else f"**no**, by {want / speedup - 1:.0%}"
        lines.append(f"| {card.gpu} ({card.date}) | {a['ms'] * 1e3:.1f} | {b['ms'] * 1e3:.1f} | "
                     f"{speedup:.2f}×{spread} | ≥ {want:.2f}× | {met} |")
    return "\n".join(lines)


#: FlashInfer's prefill kernels, where the multi-item mask and its ``max_item_len`` loop bound live.
FLASHINFER_PREFILL = ("https://github.com/flashinfer-ai/flashinfer/blob/main/include/flashinfer/attention/"
                      "prefill.cuh")


def gqa_ratio(results) -> float | None:
    """FlashInfer's time over the entry point's step for grouped heads (step 6) on the mixed batch in the
    grouped-query layout (:data:`GQA_SHAPE`), from the same run; None where the run lacks either."""
    from studylog.multi_item import CHAPTER

    return ratio(ms(results, report.FLASHINFER, GQA_SHAPE), ms(results, CHAPTER.step(6).series, GQA_SHAPE))
