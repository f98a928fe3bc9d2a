"""Chapter 6's lesson helpers and exercises: the checks accept the library's solutions and reject planted
mistakes; the lesson's tables read the committed file, a file of the current benchmark, and no file at all."""

import re

import pytest
import torch

from book.common import ChainRow, chain_note, chain_table, gap_words
from book.multi_item import exercises, lesson, solutions

import triton.language as tl  # noqa: I001  (after studylog, which sets TRITON_INTERPRET on a CPU)
from studylog import plotting
from studylog.multi_item import report

STEP5 = report.STEP05.series


# --------------------------------------------------------------------------------------------
# The exercises' checks
# --------------------------------------------------------------------------------------------

def test_checks_accept_the_solutions(capsys):
    assert exercises.check_visible(solutions.visible)
    assert exercises.check_online_softmax(solutions.online_softmax)
    assert exercises.check_key_tiles(solutions.key_tiles)
    assert exercises.check_max_programs(solutions.max_programs)
    assert exercises.check_tile_shape(solutions.step5_at)
    assert exercises.check_items_lo(solutions.items_lo)
    out = capsys.readouterr().out
    assert out.count("inputs agree") == 6 and "with the max_item_len bound" in out


def test_the_exercises_module_keeps_no_answer():
    for name in ("visible", "online_softmax", "key_tiles", "max_programs", "step5_at", "items_lo"):
        assert not hasattr(exercises, name)


def test_a_stub_is_not_written_yet(capsys):
    def stub(*args):
        raise NotImplementedError

    for check in (exercises.check_visible, exercises.check_online_softmax, exercises.check_key_tiles,
                  exercises.check_max_programs, exercises.check_tile_shape, exercises.check_items_lo):
        assert not check(stub)
    assert capsys.readouterr().out.count("not written yet") == 6


def test_check_tile_shape_rejects_the_autotuners_tile_and_a_wrong_output(capsys):
    from studylog import multi_item as mi
    from studylog.multi_item import steps

    assert not exercises.check_tile_shape(lambda q, k, v, batch, bm, bn: mi.step05_batched(q, k, v, batch))
    assert "pass the tile to the step" in capsys.readouterr().out
    assert not exercises.check_tile_shape(lambda q, k, v, batch, bm, bn: 0.5 * solutions.step5_at(q, k, v, batch,
                                                                                                  bm, bn))
    assert "max difference" in capsys.readouterr().out
    assert steps.launch.__name__ == "launch"  # the check put the launcher back


def test_check_items_lo_rejects_step4s_start_and_a_bound_that_skips_keys(capsys):
    def exact_start(m_lo, prefix_hi, Pos, prefix_len, max_item_len, SKIP_DELIMITER, BLOCK_N):  # step 4, unchanged
        first = tl.maximum(m_lo, prefix_len)
        return tl.maximum(((first + SKIP_DELIMITER - tl.load(Pos + first - prefix_len)) // BLOCK_N) * BLOCK_N,
                          prefix_hi)

    assert not exercises.check_items_lo(exact_start)
    assert "the max_item_len bound visits" in capsys.readouterr().out

    def diagonal_only(m_lo, prefix_hi, Pos, prefix_len, max_item_len, SKIP_DELIMITER, BLOCK_N):
        return tl.maximum((m_lo // BLOCK_N) * BLOCK_N, prefix_hi)  # forgets the rows' earlier item keys

    assert not exercises.check_items_lo(diagonal_only)
    assert "to the float64 reference" in capsys.readouterr().out


def test_check_visible_rejects_the_visible_delimiter(capsys):
    def with_delimiter(q, k, p, pos):  # rule="delimiter_visible": an item also sees its opening delimiter
        return k <= q and (k < p or q < p or k >= q - pos[q - p])

    assert not exercises.check_visible(with_delimiter)
    assert "should not be visible" in capsys.readouterr().out
    assert not exercises.check_visible(lambda q, k, p, pos: k <= q)  # plain causal


def test_check_online_softmax_rejects_an_infinite_start_and_a_missing_rescale(capsys):
    def infinite_start(scores, values, block_n):
        rows = scores.shape[0]
        m = torch.full((rows,), float("-inf"), dtype=torch.float64)
        l = torch.zeros(rows, dtype=torch.float64)
        acc = torch.zeros(rows, values.shape[1], dtype=torch.float64)
        for lo in range(0, scores.shape[1], block_n):
            s = scores[:, lo:lo + block_n]
            m_new = torch.maximum(m, s.max(dim=1).values)
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new[:, None])
            l, acc, m = l * alpha + p.sum(dim=1), acc * alpha[:, None] + p @ values[lo:lo + block_n], m_new
        return acc / l[:, None]

    assert not exercises.check_online_softmax(infinite_start)
    assert "nan" in capsys.readouterr().out

    def no_rescale(scores, values, block_n):
        rows = scores.shape[0]
        m = torch.full((rows,), -1e30, dtype=torch.float64)
        l = torch.zeros(rows, dtype=torch.float64)
        acc = torch.zeros(rows, values.shape[1], dtype=torch.float64)
        for lo in range(0, scores.shape[1], block_n):
            s = scores[:, lo:lo + block_n]
            m = torch.maximum(m, s.max(dim=1).values)  # the old sum and output are not rescaled
            p = torch.exp(s - m[:, None])
            l, acc = l + p.sum(dim=1), acc + p @ values[lo:lo + block_n]
        return torch.where(l[:, None] > 0, acc / l.clamp_min(1e-300)[:, None], torch.zeros_like(acc))

    assert not exercises.check_online_softmax(no_rescale)


def test_check_key_tiles_rejects_unsafe_and_wasteful_plans(capsys):
    def every_causal_tile(p, pos, m_lo, m_hi, block_n):
        return range(-(-m_hi // block_n))

    assert not exercises.check_key_tiles(every_causal_tile)
    assert "but step 4 loads only" in capsys.readouterr().out

    def one_key_late(p, pos, m_lo, m_hi, block_n):  # starts the items one key after the right one
        tiles = set(range(-(-min(p, m_hi) // block_n)))
        if m_hi > p:
            first = max(m_lo, p)
            tiles |= set(range((first + 2 - pos[first - p]) // block_n, -(-m_hi // block_n)))
        return tiles

    assert not exercises.check_key_tiles(one_key_late)
    assert "is skipped but row" in capsys.readouterr().out


def test_check_max_programs_rejects_too_few_and_too_many(capsys):
    assert not exercises.check_max_programs(lambda t, b, bm: -(-t // bm))  # forgets the prompts' partial tiles
    assert "query tiles" in capsys.readouterr().out
    assert not exercises.check_max_programs(lambda t, b, bm: -(-t // bm) + b)  # one too many
    assert not exercises.check_max_programs(lambda t, b, bm: -(-t // bm) + b - 1 if t < 2000 else 0)


def test_max_programs_is_what_the_plan_launches():
    from studylog.multi_item.plan import MultiItemPlan

    plan = MultiItemPlan(heads=3, head_dim=16, dtype=torch.float32, max_tokens=200, max_prompts=5, device="cpu")
    assert plan.programs == 3 * solutions.max_programs(200, 5, plan.block_m)


# --------------------------------------------------------------------------------------------
# The lesson's tables
# --------------------------------------------------------------------------------------------

def _current_file() -> plotting.Results:
    """A small file shaped like the current benchmark's: GPU clock, spreads, the sweeps, do_bench beside."""
    rows = []
    for shape, ours in ((report.bench_shapes()[0][0], 0.2), (report.MIXED_SHAPE, 0.6)):
        p = {"shape": shape, "prompts": 1, "tokens": 100}
        common = {"params": p, "clock": "gpu", "floor_ms": 0.02, "compute_floor_ms": 0.1}
        rows += [{"series": STEP5, "role": "kernel", "ms": ours, "spread_ms": [ours * 0.99, ours, ours * 1.01],
                  "block_m": 64, "block_n": 64, "autotune_ms": {"64 x 64, 4 warps, 3 stages": ours,
                                                                 "128 x 64, 8 warps, 3 stages": ours * 1.1},
                  **common},
                 {"series": report.FLEX, "role": "baseline", "ms": 1.5 * ours, "sweep_ms": {"64": 1.5 * ours,
                                                                                        "128": 1.7 * ours},
                  "block_size": "64", **common},
                 {"series": report.FLASHINFER, "role": "peer", "ms": 0.9 * ours, "backend": "fa3", "page_size": 1,
                  "sweep_ms": {"fa3, page 1": 0.9 * ours}, **common},
                 {"series": report.DO_BENCH[5], "role": "kernel", "ms": 1.25 * ours, **common},
                 {"series": report.order_series("first_run"), "role": "kernel", "ms": 1.4 * ours, **common},
                 {"series": report.SDPA_DENSE, "role": "baseline", "ms": 5 * ours, **common}]
    data = {"schema": 2, "measurements": rows, "device": {"name": "GPU", "sm_count": 132},
            "date": "2026-01-01T00:00:00", "versions": {"torch": "2", "triton": "3"},
            "ceilings": {"copy_bandwidth_gbs": 4000.0}}
    return plotting.Results(None, data)


def test_lesson_tables_of_a_current_file():
    results = _current_file()
    shape = report.bench_shapes()[0][0]
    assert "GPU clock" in lesson.caption(results)
    assert "commit" not in lesson.caption(results)
    tried = lesson.tried_table(results)
    assert "| step 5 in tail-first order, every head of every prompt side by side (step 5a) | +40% |" in tried
    assert "do_bench` instead of the GPU clock | +25% |" in tried
    assert "128-row query tiles (best such config), autotuner's own timings | +10% |" in tried
    flex = lesson.peers_table(results, report.FLEX)
    assert f"| {shape} | 300.0 | 340.0 | 64: 300.0 | 200.0 | 1.50× |" in flex
    assert lesson.peers_table(results, report.FLASHINFER).count("fa3, page 1") == 3
    assert f"| {shape} | `{report.STEP05.name}` | 200.0 |" in lesson.step_table(results, [5])
    assert "**200.0**" in lesson.result_table(results)


def test_the_result_table_compares_each_shape_with_the_kernel_that_runs_it():
    """Where the file times step 6 (shared key/value heads), that shape's ratios are over step 6, not step 5."""
    results = _current_file()
    gqa = lesson.GQA_SHAPE
    p = {"shape": gqa, "prompts": 8, "tokens": 100, "heads": 32, "kv_heads": 8}
    results.data["measurements"] += [
        {"series": STEP5, "role": "kernel", "ms": 0.5, "params": p, "clock": "gpu"},
        {"series": report.STEP06.series, "role": "kernel", "ms": 0.4, "params": p, "clock": "gpu"},
        {"series": report.FLASHINFER, "role": "peer", "ms": 0.6, "params": p, "clock": "gpu"}]
    assert lesson.entry_series(results, gqa) == report.STEP06.series
    assert lesson.entry_series(results, report.MIXED_SHAPE) == STEP5
    table = lesson.result_table(results, [report.FLASHINFER, STEP5, report.STEP06.series]).splitlines()
    flashinfer, step5, step6 = table[2:]
    assert flashinfer.endswith("| 600.0 (1.50×) |") and "| 540.0 (0.90×) |" in flashinfer  # 0.9 x 0.6 on MIXED
    # ours has one ratio per cell's meaning: step 6's own cell gives its factor over step 5, step 5's cell there none
    assert step5.endswith("| 500.0 |") and step6.endswith("| **400.0** (1.25× step 5) |")
    assert step6.count("–") == 2  # step 6 runs on the shared-head shape only


def test_peer_settings_table_names_each_cards_fastest_setting_per_shape(tmp_path):
    import json

    for card, best in (("gpu-a", "fa2, page 1"), ("gpu-b", "fa3, page 16")):
        sweep = {"fa2, page 1": 2.0, "fa3, page 16": 3.0}
        sweep[best] = 1.0
        rows = [{"series": report.FLASHINFER, "ms": 1.0, "params": {"shape": shape}, "sweep_ms": sweep}
                for shape in ("one", "two")]
        (tmp_path / card).mkdir()
        (tmp_path / card / "multi_item.json").write_text(json.dumps(
            {"schema": 2, "measurements": rows, "device": {"name": card.upper()}, "date": "2026-01-01"}))
    text = lesson.peer_settings(root=tmp_path)
    assert "2 settings" in text
    header, rule, *rows = text.splitlines()[2:]
    assert header == "| shape | GPU-A | GPU-B |" and rule == "|---|---|---|"
    assert rows == ["| one | `fa2, page 1` | `fa3, page 16` |", "| two | `fa2, page 1` | `fa3, page 16` |"]


def test_lesson_without_a_file_says_pending():
    assert lesson.step_table(None, [2]) == "pending" and lesson.tried_table(None) == "pending"
    assert lesson.peers_table(None, report.FLEX) is None
    assert lesson.ms(None, STEP5, "x") is None and lesson.ratio(None, 2.0) is None


@pytest.mark.skipif(not plotting.result_files("multi_item"), reason="no committed results")
def test_lesson_on_the_committed_file():
    results = plotting.load_results("multi_item")
    lays = lesson.layouts(results)
    assert list(lays) == [name for name, _, _ in report.bench_shapes()]
    rate = lesson.matmul_rate(results, lays)
    assert 1e14 < rate < 1e16  # a bf16 matmul rate recovered from the file's compute floors
    view = lesson.amdahl(results, lays)
    for v in view.values():
        assert 0 < v["step05_share"] < v["dense_share"] < 1 and v["pass_gain"] > 1 and v["packing_gain"] > 1
    assert "pending" not in lesson.amdahl_table(view)
    table = lesson.pass_table(results, lays)  # "Why it matters": the strongest rival, in the model's own layout
    rows = _rows(table)
    # a dense mask (a rival nobody would ship) and one pass per item (packing's gain) are sentences instead
    assert len(rows) == 1 and "pending" not in table and "SDPA" not in table
    from studylog.paths import REPO_ROOT

    page = (REPO_ROOT / "notebooks" / "06_multi_item_attention.ipynb").read_text()  # packing's gain: the whole pass
    assert "makes the whole pass" in page and "(attention alone: {per_item_att:.2f}×)" in page
    assert "Against a dense mask, a rival nobody would ship" in page and "{1 - 1 / dense_gain:.0%} off" in page
    assert rows[0][3] == f"{lesson.flashinfer_pass_gain(results, lays):.2f}×"
    assert "one causal pass per item" not in table
    assert lesson.pass_table(None, lays) == "pending"
    pairs, bounds = lesson.bounds_table(results, lays).split("\n\n")  # two narrow tables, a row a shape each
    assert pairs.count("\n") == bounds.count("\n") == 1 + len(lays) and " x " not in pairs + bounds
    assert "pending" not in lesson.tried_table(results)
    flight = lesson.in_flight(lays[report.MIXED_SHAPE])
    assert flight["first_run"] > results.data["device"]["l2_cache_bytes"] > flight["head_groups"]


def test_the_start_bound_table_counts_both_starts_at_each_tiling():
    from studylog.multi_item import MultiItemBatch

    short = MultiItemBatch.from_item_lens([40], [[5, 3, 7, 2, 6]])  # items shorter than a 16-key tile
    name, prefixes, items = lesson.LONG_ITEMS
    batches = {"short": short, "long": MultiItemBatch.from_item_lens(prefixes, items)}
    counts = lesson.start_bound(batches, tilings=((16, 16), (64, 64)))
    assert set(counts) == {(n, bm, bn) for n in batches for bm, bn in ((16, 16), (64, 64))}
    for exact, bounded in counts.values():
        assert 0 < exact <= bounded
    # a few long items among short ones: the bound reaches back past the short items' starts
    assert counts["long", 64, 64][1] > 1.1 * counts["long", 64, 64][0]
    table = lesson.start_bound_table(counts)
    assert table.count("\n") == 1 + len(counts) and "| long | 64 x 64 |" in table
    assert name in lesson.start_bound_batches({})


def _rows(table: str) -> list[list[str]]:
    """A Markdown table's body rows as lists of cells (its header and rule dropped)."""
    return [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]]


def test_the_steps_table_of_a_current_file_and_of_none():
    """The fold's table: every step and sub-step a row, one µs column per shape (its compute floor in its heading),
    no ratios (the page's table has them, each over a named step)."""
    results = _current_file()
    table = lesson.steps_table(results)
    shape = report.bench_shapes()[0][0].split(",")[0]
    assert table.splitlines()[0] == (f"| step | the one change | {shape} (floor 100 µs): µs | "
                                     f"8 prompts, 32 heads (floor 100 µs): µs |")
    assert [r[0] for r in _rows(table)] == ["1", "2", "3", "4a", "4b", "4c", "5a", "5b", "5c", "6"]
    assert "| 1 | SDPA with the dense mask (a batch padded) | 1,000.0 | 3,000.0 |" in table
    assert "| 5c | each group's heaviest query tiles first | 200.0 | 600.0 |" in table
    assert "×" not in table
    assert lesson.steps_table(results, None).splitlines()[0].count(": µs") == 2
    assert lesson.steps_table(None) == "pending" and lesson.page_steps_table(None) == "pending"


@pytest.mark.skipif(not plotting.result_files("multi_item"), reason="no committed results")
def test_the_steps_table_on_the_committed_file_has_one_row_a_step():
    results = plotting.load_results("multi_item")
    for shapes in (lesson.MAIN_SHAPES, None):
        rows = _rows(lesson.steps_table(results, shapes))
        assert [r[0] for r in rows] == ["1", "2", "3", "4a", "4b", "4c", "5a", "5b", "5c", "6"]
        assert "pending" not in str(rows)
    table = lesson.steps_table(results)
    rows = {r[0]: r for r in _rows(table)}
    long_, mixed = lesson.MAIN_SHAPES
    assert table.splitlines()[0].count(": µs") == 2 and "×" not in table
    assert mixed == report.MIXED_SHAPE and "8 prompts, 32 heads (floor" in table.splitlines()[0]
    # without the chain, 5a and 5b are blank on the batch and 4c is step 4 launched per prompt
    t4 = lesson.ms(results, report.STEP04_PER_PROMPT, mixed) * 1e3
    assert rows["4c"][3] == f"{t4:,.1f}" and rows["5a"][3] == rows["5b"][3] == "–"
    assert rows["5c"][2] == f"{lesson.ms(results, STEP5, long_) * 1e3:,.1f}"
    assert rows["4c"][2] == f"{lesson.ms(results, report.STEP04.series, long_) * 1e3:,.1f}"
    parts = lesson.step4_parts()
    if parts is not None:  # 4a and 4b from their own run, on the one-prompt shapes
        assert [rows[n][2] for n in ("4a", "4b")] == [f"{parts[n] * 1e3:,.1f}" for n in ("4a", "4b")]
    # step 6 runs on the grouped-query batch only, not in these columns
    assert set(rows["6"][2:]) == {"–"}
    assert rows["5b"][1] == "the heads in groups whose keys and values fit in L2"
    assert "tie" not in table and "kept" not in table  # a step's change only; why a tie stays is the page's


def _table(chain: lesson.Chain) -> str:
    """The chain as the page renders it (the book's one chain renderer)."""
    return chain_table(chain.rows, [chain.case], chain.name)


def _check_chain(chain: lesson.Chain, number: int) -> None:
    """A chain table is cumulative: the anchor first, lettered rows of step ``number`` each once, step ``number``
    last; each × previous is the ratio of the µs cells above and here, a loss says so (a row timing the same kernel
    again does not)."""
    rows = _rows(_table(chain))
    labels = [r[0] for r in rows]
    assert len(set(labels)) == len(labels) and labels[-1] == f"step {number}"
    assert rows[0][3] == "anchor" and labels[0] in (f"step {number - 1}", f"{number}a")
    for letter, label in zip("abcdefg", [lab for lab in labels[:-1] if lab[0].isdigit()]):
        assert label == f"{number}{letter}"
    for above, row, kept in zip(rows, rows[1:], chain.rows[1:]):
        x = float(above[2].replace(",", "")) / float(row[2].replace(",", ""))
        assert row[3].startswith(f"{x:.2f}×")
        assert ("does not pay" in row[3]) == (round(x, 2) < 1 and not kept.remeasure)
        assert row[1].startswith("+ ") and "–" not in row


def test_a_chain_table_is_cumulative_and_names_a_loss():
    rows = [("step 4", "a launch per prompt", 680.0), ("5a", "+ one launch", 814.0), ("5b", "+ groups", 640.0),
            ("step 5", "+ heaviest first", 632.0)]
    chain = lesson.Chain("a case", [ChainRow(label, change, {"a case": t}) for label, change, t in rows],
                         {"step 4": report.STEP04_PER_PROMPT})
    _check_chain(chain, 5)
    assert "| 5a | + one launch | 814.0 | 0.84×, does not pay |" in _table(chain)
    broken = lesson.Chain("a case", [ChainRow(label, change, {"a case": t})
                                     for label, change, t in (("5a", "x", 800.0), ("5a", "+ y", 700.0),
                                                              ("step 5", "+ z", 600.0))], {})
    with pytest.raises(AssertionError):
        _check_chain(broken, 5)


@pytest.mark.skipif(lesson.step4_same_config() is None, reason="no committed step_changes.json")
def test_step_4_is_one_change_on_the_committed_run():
    """Step 4's larger set of configurations picks, on the long-prefix prompt, the one step 4's kernel runs fastest at
    within step 3's two: the same kernel at the same configuration, so the page gives step 4 no chain (one change)."""
    results = plotting.load_results("multi_item")
    assert lesson.step4_same_config() is True
    cell = {r[0]: r for r in _rows(lesson.steps_table(results))}["4c"][1]
    assert cell.startswith("whole prefix tiles without the mask") and "changes" not in cell and "tuner" not in cell


def test_step_4s_configuration_check_reads_the_tuners_pick(monkeypatch):
    shape = lesson.MAIN_SHAPES[0]
    few = lambda ms, config: {"series": "step_changes", "ms": ms, "config": None,  # noqa: E731
                              "params": {"shape": shape, "step": 4, "config": config, "in_sets": ["FEW_GPU_CONFIGS"]}}
    data = {"measurements": [few(0.2, "64 x 64"), few(0.3, "128 x 64"),
                             {"series": lesson.STEP[4].series, "config": "64 x 64", "params": {"shape": shape}}]}
    monkeypatch.setattr(lesson, "lab_or_none", lambda chapter, name, gpu="nvidia-h200": data)
    assert lesson.step4_same_config() is True
    data["measurements"][-1]["config"] = "128 x 128"  # the larger set picks another tile: no longer one change
    assert lesson.step4_same_config() is False
    data["measurements"].pop()
    with pytest.raises(LookupError):
        lesson.step4_same_config()


@pytest.mark.skipif(lesson.step5_chain() is None, reason="no committed step 5 chain")
def test_step_5s_chain_on_the_committed_run_starts_at_step_4():
    chain = lesson.step5_chain()
    _check_chain(chain, 5)
    # the page quotes 5a against step 4 from this run: step 4 launched per prompt is its first anchor
    assert [r.label for r in chain.rows] == ["step 4", "5a", "5b", "step 5"]
    # the chain runs the mixed batch with 32 heads, as the main table: the column says which layout
    assert _table(chain).splitlines()[0].startswith(f"| row | the one change | {lesson.MIXED_LABEL}: µs |")
    assert "32 heads" in lesson.MIXED_LABEL
    results = plotting.load_results("multi_item")
    times = chain.times
    want = max(abs(times[label] / (lesson.ms(results, series, chain.case) * 1e3) - 1)
               for label, series in chain.anchors.items())
    assert chain.gap(results) == pytest.approx(want)
    assert f"within {gap_words(want)} of the steps table" in chain_note("step 4", "step 5", chain.gap(results))
    assert chain.rows[1].change.startswith("+ prerequisite: ")  # 5a exists for the orders after it


def test_step_5s_chain_reads_step_4s_anchor_where_the_run_has_it(monkeypatch):
    shape = report.MIXED_SHAPE
    row = lambda series, us, **p: {"series": series, "ms": us / 1e3, "params": {"shape": shape, **p}}  # noqa: E731
    data = {"measurements": [row(report.STEP04_PER_PROMPT, 680.0), row(report.order_series("first_run"), 814.0),
                             row("step_changes", 640.0, order="head groups only"), row(STEP5, 632.0)]}
    monkeypatch.setattr(lesson, "lab_or_none", lambda chapter, name, gpu="nvidia-h200": data)
    chain = lesson.step5_chain()
    _check_chain(chain, 5)
    assert [r.label for r in chain.rows] == ["step 4", "5a", "5b", "step 5"]
    assert set(chain.anchors) == {"step 4", "5a", "step 5"}
    data["measurements"].pop(0)  # a run without step 4: the chain starts at the one launch
    assert [r.label for r in lesson.step5_chain().rows] == ["5a", "5b", "step 5"]


def test_the_page_quotes_5a_from_its_chain_and_names_each_batchs_layout():
    """5a has one value on the page (the chain's run); the figure has no 5a bar (the main run's), and every mention of
    the mixed batch in the prose says its layout; the figure's title is true of every panel."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "06_multi_item_attention.ipynb").read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells)
    assert "chained['5a']" in code and "order_series(\"first_run\")" not in code
    for c in cells:
        text = " ".join("".join(c["source"]).split())
        for m in re.finditer(r"the mixed batch(.{0,40})", text):
            assert re.match(r"(,| with| in)? ?(32 heads|8 KV heads|in the model's own layout|\S* on an)", m.group(1)) \
                or "layout" in text[max(0, m.start() - 200):m.start()], m.group(0)


@pytest.mark.skipif(not plotting.result_files("multi_item"), reason="no committed results")
def test_times_figure_has_a_panel_per_shape_holding_only_the_approaches_run_there():
    import matplotlib.pyplot as plt

    from book.multi_item.figures import _times_label, shape_title, times_figure

    results = plotting.load_results("multi_item")
    fig = times_figure(results)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    shapes = [name for name, _, _ in report.bench_shapes()] + [lesson.GQA_SHAPE]
    shapes = [s for s in shapes if results.select(shape=s)]
    assert [ax.get_title() for ax in panels] == [shape_title(s) for s in shapes]
    for ax, shape in zip(panels, shapes):
        labels = [t.get_text() for t in ax.get_yticklabels()]
        run_here = {_times_label(r["series"]) for r in results.select(shape=shape)}
        assert labels and set(labels) <= run_here, (shape, set(labels) - run_here)
        assert not any("_" in label for label in labels), labels  # steps in words, not function names
        assert not any("not run" in t.get_text() for t in ax.texts)
    plt.close(fig)


def test_the_page_names_orders_not_their_history_and_folds_no_code():
    """Step 5a's order is named by what it does (tail first), never as a first version; step 2 shows its kernel and
    its online-softmax update, and no step's core (a listing or a diff) is folded: only step 4's secondary diffs sit
    in a fold, under its core shown open; the prose stays within the book's length."""
    import json

    from book.common import prose_words
    from studylog import paths

    page = paths.REPO_ROOT / "notebooks" / "06_multi_item_attention.ipynb"
    cells = json.loads(page.read_text())["cells"]
    text = " ".join(" ".join("".join(c["source"]) for c in cells).split())
    import re

    for words in ("first version", "(?<!tail-)first order", "first run", "first_run`"):
        assert not re.search(words, text.lower()), words
    assert "tail-first order" in text and "tail-first" in _table(lesson.step5_chain())
    for words in ("separate run", "a further run"):  # no run history
        assert words not in text.lower(), words
    # step 4's other diffs (the loop over one range, the kernel's call) are folded: 4a's core, its one range, is
    # open right above them; 4b and 4c each show theirs open
    ids = [c["id"] for c in cells]
    assert ids.index("ch06-22-fold") == ids.index("ch06-22") + 2
    assert 'parts(part_diffs["4a"])' in "".join(cells[ids.index("ch06-22")]["source"])
    assert 'parts(part_diffs["4b"])' in "".join(cells[ids.index("ch06-22-4b")]["source"])
    assert 'parts(part_diffs["4c"])' in "".join(cells[ids.index("ch06-22-4c")]["source"])
    # step 6's core, its body, is open; its signature (the table's arguments, as step 5's kernel) folded under it
    assert ids.index("054a701b-fold") == ids.index("054a701b") + 1
    assert "parts(body)" in "".join(cells[ids.index("054a701b")]["source"])
    for c in cells:
        code = "".join(c["source"])
        if c["cell_type"] == "code" and c["id"] not in ("ch06-22-fold", "054a701b-fold") and re.search(
                r"show_source|show_diff|function_diff|function_listing|without_docstring|_diff\(", code):
            assert not set(c["metadata"].get("tags", [])) & {"hide-output", "hide-input"}, code
    assert "softmax_update" in "".join(next(c for c in cells if "show_source(2)" in "".join(c["source"]))["source"])
    assert "listing(mi.CHAPTER.show_source(2))" in "".join(
        next(c for c in cells if "show_source(2)" in "".join(c["source"]))["source"])
    assert prose_words(page) <= 2500


@pytest.mark.skipif(not plotting.result_files("multi_item"), reason="no committed results")
def test_the_matmul_rate_is_named_this_runs_beside_chapter_00s():
    """The compute floors' matmul rate is this run's own (recovered from a floor), and the sentence that prints it says
    so and prints chapter 00's rate at the same side beside it, so the two pages do not seem to disagree."""
    import json

    from studylog import paths

    results = plotting.load_results("multi_item")
    rate = lesson.matmul_rate(results, lesson.layouts(results))
    card = lesson.card_matmul_rate(results)
    env = plotting.load_results("env", gpu=results.path.parent.name)
    row = next(r for r in env.rows if r["series"] == "matmul_bfloat16" and r["params"]["n"] == report.CEILING_MATMUL_N)
    assert card == pytest.approx(row["tflops"] * 1e12)
    assert f"{rate / 1e12:,.0f}" != f"{card / 1e12:,.0f}"  # two runs, two numbers: the page must say whose is whose
    cells = json.loads((paths.REPO_ROOT / "notebooks" / "06_multi_item_attention.ipynb").read_text())["cells"]
    cell = next("".join(c["source"]) for c in cells if "lesson.matmul_rate(results, lays)" in "".join(c["source"]))
    flat = " ".join(cell.split())
    assert "this run's own bf16 matmul rate" in flat and "lesson.card_matmul_rate(results)" in flat
    assert "chapter 00's run measured {card / 1e12:,.0f} TFLOP/s at that side" in flat


@pytest.mark.skipif(not plotting.result_files("multi_item"), reason="no committed results")
def test_the_page_steps_table_gives_each_step_one_case_and_names_its_base():
    """The page's one steps table: each step or sub-step a row on one case (steps 1 to 4c on the long-prefix prompt,
    5a to 5c on the mixed batch with 32 heads from :func:`step5_chain`, 6 on the headline's case); its × is the
    time of the step named in "against" over its own, the row above where the case is the same (named), else named
    with its µs; a tie or a loss says so; the change cell holds only the change. 5a to 5c are the chain's times (one
    run), so 5c's × is 5b's µs over its own, both shown. Every row's "× compute floor" is its µs over its case's compute floor, which the line under the table
    gives. The line under it gives FlashInfer on the headline's case and the ratio, and why step 6 is the headline's
    kernel; no bookkeeping."""
    results = plotting.load_results("multi_item")
    table = lesson.page_steps_table(results)
    assert table.splitlines()[0] == "| step | the one change | case | µs | × | against | × compute floor |"
    rows = {r[0]: r for r in _rows(table)}
    assert list(rows) == ["1", "2", "3", "4a", "4b", "4c", "5a", "5b", "5c", "6"]
    cases = {n: rows[n][2] for n in rows}
    assert {cases[n] for n in ("1", "2", "3", "4a", "4b", "4c")} == {"prefix 2048"}
    assert {cases[n] for n in ("5a", "5b", "5c")} == {"8 prompts, 32 heads"} and cases["6"] == "8 prompts, 8 KV heads"
    us_ = {n: None if rows[n][3] == "–" else float(rows[n][3].replace(",", "")) for n in rows}
    long_ = lesson.MAIN_SHAPES[0]
    for n, series in (("1", report.SDPA_DENSE), ("2", lesson.STEP[2].series), ("3", lesson.STEP[3].series),
                      ("4c", report.STEP04.series)):
        assert us_[n] == pytest.approx(lesson.ms(results, series, long_) * 1e3, abs=0.05)
    chain = lesson.step5_chain()
    times = chain.times
    assert [rows[n][3] for n in ("5a", "5b", "5c")] == [f"{times[k]:,.1f}" for k in ("5a", "5b", "step 5")]
    assert rows["5c"][5] == "5b"  # the row above, the same run: its × is the ratio of the two cells shown
    floors = {lesson._short(s): lesson.floors(results, s)[1] * 1e3 for s in lesson.PAGE_SHAPES}
    for n in rows:
        assert rows[n][6] == f"{float(rows[n][3].replace(',', '')) / floors[rows[n][2]]:.1f}×", n
    assert rows["5a"][5] == f"step 4 launched per prompt, {times['step 4']:,.1f} µs"
    g5 = lesson.ms(results, STEP5, lesson.GQA_SHAPE) * 1e3
    assert rows["6"][5] == f"5c on this case, {g5:,.1f} µs"
    assert rows["6"][3] == f"{lesson.ms(results, report.STEP06.series, lesson.GQA_SHAPE) * 1e3:,.1f}"
    # every × is the named base's µs over the row's, as printed (a reader can divide the cells)
    base = {"5a": times["step 4"], "6": g5}
    for n in rows:
        if rows[n][4] == "–":
            continue
        against = rows[n][5]
        b = base.get(n) or us_[against.removeprefix("step ")]
        if n not in base:
            assert against in (f"step {list(rows)[list(rows).index(n) - 1]}", list(rows)[list(rows).index(n) - 1]) \
                or us_[list(rows)[list(rows).index(n) - 1]] is None
        x = b / us_[n]
        assert rows[n][4].startswith(f"{x:.2f}×")
        assert ("(tie)" in rows[n][4]) == lesson.is_tie(x)
        assert ("does not pay" in rows[n][4]) == (round(x, 2) < 1 and not lesson.is_tie(x))
    assert rows["2"][4] == "0.99× (tie)" and rows["5a"][4].endswith(", does not pay") and "(tie)" in rows["5c"][4]
    for n in rows:  # the change only: no tie, no reason, no case in it
        assert not any(w in rows[n][1] for w in ("tie", "kept", "prerequisite", "(")), rows[n][1]
    parts = lesson.step4_parts()
    if parts is not None:
        assert [rows[n][3] for n in ("4a", "4b")] == [f"{parts[n] * 1e3:,.1f}" for n in ("4a", "4b")]
        assert rows["4a"][5] == "step 3" and rows["4b"][5] == "4a" and rows["4c"][5] == "4b"
    peer, six, x = lesson.headline_link(results)
    assert x == pytest.approx(lesson.gqa_ratio(results))
    import json

    from studylog.paths import REPO_ROOT

    cells = json.loads((REPO_ROOT / "notebooks" / "06_multi_item_attention.ipynb").read_text())["cells"]
    under = " ".join("".join(next(c for c in cells if c["id"] == "ch06-34")["source"]).split())
    assert "lesson.page_steps_table(results)" in under and "lesson.headline_link(results)" in under
    assert "8 KV heads, Llama 3.1 8B's own layout" in under and "in that layout it is the kernel to use" in under
    # the 1.12× is read against the noise: both rows' fastest and slowest repetitions, from the same rows
    (peer_lo, peer_hi), (six_lo, six_hi) = lesson.headline_spread(results)
    rows_ = [results.select(s, shape=lesson.GQA_SHAPE)[0] for s in (report.FLASHINFER, report.STEP06.series)]
    assert (peer_lo, peer_hi) == pytest.approx((rows_[0]["spread_ms"][0] * 1e3, rows_[0]["spread_ms"][2] * 1e3))
    assert (six_lo, six_hi) == pytest.approx((rows_[1]["spread_ms"][0] * 1e3, rows_[1]["spread_ms"][2] * 1e3))
    assert six_lo <= six <= six_hi and peer_lo <= peer <= peer_hi
    assert "lesson.headline_spread(results)" in under and "the two ranges do not overlap" in under
    assert "assert peer_lo > six_hi" in under
    for word in ("within", "gap", "timed together", "run"):
        assert word not in under, word


def test_step_4s_diff_is_step_3s_loop_against_the_three_ranges():
    """Step 4's one idea is shown as a diff within the book's 40 changed lines: step 3's loop, verbatim, against the
    three ranges of attend_visible_tiles; the loop over one range is a diff against the same loop."""
    from studylog import source
    from studylog.multi_item import steps

    ranges, loop = lesson.step4_ranges_diff(), lesson.step4_loop_diff()
    step3 = source.source_of(steps.attn_fwd_mask_on_the_fly)[0]
    assert all(line in step3 for line in ranges.removed) and ranges.removed[0].lstrip().startswith("for start_n")
    assert len(ranges.removed) == 7 and set(loop.removed) < set(ranges.removed)  # the same loop on both
    assert sum("attend_key_tiles(" in line for line in ranges.added) == 3  # the one loop, three ranges
    assert all(line in source.source_of(steps.attend_visible_tiles)[0] for line in ranges.added)
    for diff in (ranges, loop):
        assert len(diff.added) + len(diff.removed) <= 40


def test_the_runs_line_sits_where_the_numbers_come_from_and_step_1_quotes_the_tables_case():
    """The run's date and versions (:func:`lesson.caption`) are in the fold of "Where the numbers come from", not under
    the steps table; the steps section has the title the other chapters use; step 1 quotes the mixed batch at 8 KV
    heads, the case the steps table gives; step 4's three changes have a heading each (4a, 4b, 4c)."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "06_multi_item_attention.ipynb").read_text())["cells"]
    ids = [c["id"] for c in cells]
    text = {c["id"]: "".join(c["source"]) for c in cells}
    with_caption = [i for i, t in text.items() if "lesson.caption(results)" in t]
    assert with_caption == ["ch06-where-runs"]
    assert ids.index("ch06-where-runs") == ids.index("9047bcbd") + 1
    assert text["9047bcbd"].startswith("## Where the numbers come from")
    assert text["ch06-where-runs"].startswith('say(":::{dropdown} The runs\\n" + lesson.caption(results)')
    assert text["ch06-33"].startswith("## The steps, measured\n")
    assert "us(report.SDPA_DENSE, lesson.GQA_SHAPE)" in text["ch06-14"] and "8 KV heads" in text["ch06-14"]
    assert "32 heads" not in text["ch06-14"]
    headings = [t.splitlines()[0].split(":")[0] for c, t in zip(cells, text.values()) if c["cell_type"] == "markdown"
                and t.startswith("## Step 4")]
    assert headings == ["## Step 4a", "## Step 4b", "## Step 4c"]


def test_step_5_quotes_its_tables_run_and_keeps_heaviest_first_as_a_tie():
    """Step 5's opening ratio is the steps table's (the run that timed step 4 per prompt and 5a to 5c back to back,
    the mixed batch with 32 heads); its three changes have a
    heading each (5a, 5b, 5c) and a row each in the one steps table (no table of their own); the text under 5c says
    that order is a tie kept for what it does without the groups; the line under the steps table gives 5c's time
    in one place, the line over the table (5a to 5c from the run that timed them back to back, the result table's
    step 5 the benchmark's), and the line under it no bookkeeping words."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "06_multi_item_attention.ipynb").read_text())["cells"]
    text = {c["id"]: "".join(c["source"]) for c in cells}
    opening = " ".join(text["1f024a39"].split())
    assert "lesson.step5_chain()" in opening and "on the mixed batch with 32 heads" in opening
    assert 'chain.times["step 4"] / chain.times[lesson.CHAIN_ROWS["5c"]]' in opening
    headings = [t.splitlines()[0] for c, t in zip(cells, text.values()) if c["cell_type"] == "markdown"
                and t.startswith("## Step 5")]
    assert [h.split(":")[0] for h in headings] == ["## Step 5a", "## Step 5b", "## Step 5c"]
    assert "a tie, kept\nbecause" in text["ch06-29-chain"] and "chain_table(" not in "".join(text.values())
    assert "gap" not in text["ch06-34"] and "gap_words" not in text["ch06-where-runs"]
    under = " ".join(text["ch06-34"].split())
    assert "chained['step 5']" not in under and "{t5" not in under  # 5c's times: said once, over the table
    over = " ".join(text["ch06-33"].split())
    assert "5c's µs is that run's step 5; the result table's is the benchmark's" in over and "back to back" in over
    assert "Step 4 is 4c and step 5 is 5c" in over
    assert "lesson.page_floors(results)" in text["ch06-34"]
    assert "prerequisite" in text["5f955607"] + text["ch06-26"] or "5b needs it" in text["ch06-26"]
    assert not any("these runs" in t for t in text.values())
    chain = lesson.step5_chain()
    if chain is not None:
        assert "(a tie, kept)" in chain.rows[-1].change
        tail_first, heaviest = lesson.heaviest_first_alone()  # the reason it is kept: it pays without the groups
        assert heaviest < tail_first and lesson.is_tie(chain.times["5b"] / chain.times["step 5"])


def test_the_result_frames_step_6_with_the_whole_pass_and_calls_its_step_marginal():
    """The result gives, beside step 6's lead over FlashInfer, the whole scoring pass's gain from Why it matters's
    table (a tie says so); step 6's 1.04× over step 5 is called marginal, by the course's tie rule."""
    results = plotting.load_results("multi_item")
    lays = lesson.layouts(results)
    gain = lesson.flashinfer_pass_gain(results, lays)
    first = _rows(lesson.pass_table(results, lays))[0]
    assert first[-1] == f"{gain:.2f}×"
    assert lesson.is_tie(1.03) and lesson.is_tie(0.97) and not lesson.is_tie(1.04) and not lesson.is_tie(None)
    assert lesson.margin_words(1.04) == ", a marginal gain" and lesson.margin_words(1.01) == ", a tie"
    assert lesson.margin_words(1.25) == ""
    from studylog.paths import REPO_ROOT

    page = (REPO_ROOT / "notebooks" / "06_multi_item_attention.ipynb").read_text()
    assert "lesson.flashinfer_pass_gain(results, lays)" in page and "lesson.margin_words(g5 / g6)" in page


def test_exercise_5s_table_counts_the_tiles_of_every_benchmark_batch(capsys):
    """Exercise 5's cell calls one function of the exercises: no benchmark plumbing on the page."""
    import json

    from studylog import paths

    exercises.tile_shapes(solutions.step5_at, tiles=((64, 64),))
    lines = [line for line in capsys.readouterr().out.splitlines() if "key tiles per head" in line]
    assert len(lines) == len(report.bench_shapes()) and all("64 × 64" in line for line in lines)
    cells = json.loads((paths.REPO_ROOT / "notebooks" / "06_multi_item_attention.ipynb").read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "exercises.tile_shapes(step5_at)" in code and "bench_shapes" not in code


@pytest.mark.skipif(lesson.step4_parts() is None, reason="no committed step04_parts.json")
def test_step_4s_parts_sit_between_the_benchmarks_steps_3_and_4():
    """4a and 4b come from their own run and sit in the steps table between the benchmark's steps 3 and 4: that run's
    own steps 3 and 4 are within 3% of the benchmark's on both one-prompt shapes, and on each the parts fall between
    them, 4a slower than 4b; each part's diff stays within the book's 40 changed lines."""
    results = plotting.load_results("multi_item")
    for shape in (lesson.MAIN_SHAPES[0], report.bench_shapes()[1][0]):
        parts = lesson.step4_parts(shape=shape)
        for n in (3, 4):
            assert parts[f"step {n}"] == pytest.approx(lesson.ms(results, lesson.STEP[n].series, shape), rel=0.03)
        assert parts["step 3"] > parts["4a"] > parts["4b"] > parts["step 4"]
    diffs = lesson.step4_part_diffs()
    assert list(diffs) == ["4a", "4b", "4c"]
    for diff in diffs.values():
        assert 0 < len(diff.added) + len(diff.removed) <= 40
    assert diffs["4a"].removed[0].lstrip().startswith("for start_n")  # step 3's loop, as its kernel writes it
    assert sum("attend_key_tiles(" in line for line in diffs["4c"].added + diffs["4c"].removed) >= 1


def test_the_grouped_heads_lead_says_whether_the_repetitions_overlap():
    """The 1.12× lead on Llama 3.1 8B's layout is said with both sides' repetition ranges and whether they overlap,
    computed from the committed rows (the committed run's ranges do not overlap: checked here by hand)."""
    import json as _json
    from pathlib import Path as _Path

    from studylog import plotting as _plotting
    from studylog.multi_item import CHAPTER as _CHAPTER
    from studylog.multi_item import report as _report

    results = _plotting.load_results("multi_item")
    ours, theirs = (results.select(s, shape=lesson.GQA_SHAPE)[0]["spread_ms"]
                    for s in (_CHAPTER.step(6).series, _report.FLASHINFER))
    assert ours[2] < theirs[0]  # step 6's slowest repetition beats FlashInfer's fastest
    cells = _json.loads((_Path(__file__).parents[1] / "notebooks" / "06_multi_item_attention.ipynb").read_text())["cells"]
    cell = next("".join(c["source"]) for c in cells if "gqa = lesson.gqa_ratio(results)" in "".join(c["source"]))
    assert "the ranges do not overlap" in cell and "8 KV heads{spread}" in cell


def test_steps_5_and_6_are_one_kernel_listed_at_each_steps_knob():
    """Steps 5 and 6 launch one kernel at PACK_HEADS False and True; each step's listing is its branch, so neither
    shows the knob's test, and only step 6's packs a group's heads into one tile."""
    from studylog.multi_item import CHAPTER, steps
    from studylog.source import source_of

    five, six = (CHAPTER.step(n).source for n in (5, 6))
    assert "if PACK_HEADS" not in five + six and "if PACK_HEADS:" in source_of(steps.attn_fwd_batched)[0]
    assert "attend_query_tile(" in five and "attend_query_tile(" not in six
    assert "off_kv * KV_GROUP" in six and "off_kv" not in five
