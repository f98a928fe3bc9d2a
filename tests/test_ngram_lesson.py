"""Chapter 3's page: the table of steps reads every step at both cases against a floor it does not beat, and the
real-text figure's axis names one corpus per tick (the shapes once per group), so its labels do not overlap."""

import pytest

from book.ngram import figures, lesson
from studylog import ngram
from studylog.plotting import load_results, result_files

pytestmark = pytest.mark.skipif(not result_files("ngram"), reason="no committed n-gram results")


def _step_rows(table: str) -> list[str]:
    """The table of steps' rows of whole steps and the entry point (head, rule and floor left out, and the sub-rows
    of bundled steps: 5a, 7b...)."""
    return [r for r in table.splitlines()[3:] if not r.split("|")[1].strip()[-1:].isalpha()
            or r.split("|")[1].strip() == "entry point"]


def test_the_table_of_steps_has_every_step_and_the_entry_point():
    results = load_results("ngram")
    rows = _step_rows(lesson.boehm_table(results))
    assert [r.split("|")[1].strip() for r in rows] == [str(s.number) for s in ngram.CHAPTER.steps] + ["entry point"]
    for row in rows:
        ratios = [c.strip() for c in row.split("|")[1:-1]][4::3]  # the "× floor" columns
        for cell in ratios:
            if cell != "–":
                assert float(cell.rstrip("×").replace(",", "")) >= 1.0, row


def test_no_ratio_across_clocks():
    """Step 1 is timed end to end on the host, the kernels on the GPU clock: step 1's times say so, and a row is
    compared with the previous one, or with the GPU-clock floor, only on the same clock."""
    results = load_results("ngram")
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in _step_rows(lesson.boehm_table(results))]
    by_step = {r[0]: r for r in rows}
    host = [r[0] for r in rows if any(c.endswith("(host, end to end)") for c in r[2::3])]
    assert host == ["1"] and all(c.endswith("(host, end to end)") for c in by_step["1"][2::3] if c != "–")
    assert by_step["2"][3] == "–"  # step 2 (GPU) is not divided by step 1 (host)
    for r in rows:  # the floor is a GPU-clock time: only a GPU-clock row is divided by it
        floor_cells = r[4::3]
        assert (r[0] != "1") == any(c not in ("–", "") for c in floor_cells), r


def test_the_dispatch_table_has_no_self_judging_column():
    assert "the faster" not in lesson.dispatch_table(load_results("ngram"))


def test_the_steps_figure_draws_the_tables_floor():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = load_results("ngram")
    figs = figures.figures(results)
    ax = figs["latency"].axes[0]
    floor = next(c for c in ax.collections if "floor" in str(c.get_label()))
    drawn = sorted({round(float(seg[0][1]), 6) for seg in floor.get_segments()})
    from book.ngram.results import grid_configs

    expected = sorted({round(lesson.floor_us(results, c), 6) for c in grid_configs(results)
                       if lesson.floor_us(results, c) is not None})
    assert drawn == expected
    for fig in figs.values():
        plt.close(fig)


def test_the_real_text_axis_is_readable():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = load_results("ngram")
    figs = figures.figures(results)
    if "real_text" not in figs:
        pytest.skip("the committed file has no real-text cases")
    ax = figs["real_text"].axes[1]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels and all("\n" not in lab and len(lab) <= 10 for lab in labels), labels
    for fig in figs.values():
        plt.close(fig)


def test_every_multi_part_diff_is_folded_under_a_line_naming_its_idea():
    """A step's diff shown in parts sits in one folded output, and the prose just above it names the change."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    shown = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and "".join(c["source"]).startswith("parts(")]
    assert len(shown) >= 3
    for i in shown:
        assert "hide-output" in cells[i]["metadata"].get("tags", []), i
        above = next(c for c in reversed(cells[:i]) if c["cell_type"] == "markdown")
        assert "folded" in "".join(above["source"]).splitlines()[-1], i


def test_the_floor_is_the_scoreboards_on_every_card():
    """One floor a card on every page: the active slots' haystack bytes at the run's copy bandwidth, or the card's
    fastest empty kernel (the smallest of all its committed runs, as the scoreboard takes it) where that is larger."""
    from book import scoreboard
    from book.ngram.results import grid_configs

    for gpu in ("nvidia-h200", "nvidia-h100-80gb-hbm3"):
        results = load_results("ngram", gpu)
        empty_us = scoreboard.card_empty_kernel_ms(results.path.parent) * 1e3
        bandwidth = results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9
        for cfg in grid_configs(results):
            row = lesson.grid_row(results, ngram.CHAPTER.step(1).series, cfg)
            by_bytes = row["haystack_bytes"] / bandwidth * 1e6
            assert lesson.floor_us(results, cfg) == pytest.approx(max(by_bytes, empty_us), rel=1e-12), (gpu, cfg)
        small, large = lesson.BOEHM_CASES[0], lesson.BOEHM_CASES[-1]
        assert lesson.floor_us(results, small) == pytest.approx(empty_us)  # a few bytes: the empty kernel binds
        assert lesson.floor_us(results, large) > 10 * empty_us  # the bytes bind
        floor_row = lesson.boehm_table(results).splitlines()[2]
        assert "empty kernel where larger" in floor_row and f"{empty_us:,.2f}" in floor_row


def test_the_result_table_times_the_entry_point_as_the_headline_does():
    """The page's GPU-clock column is the series the chapter's headline (and the results page) quotes: the entry
    point, with the step its rule ran; its ratio to step 3 is the headline's."""
    from book.ngram import results as book_results
    from studylog.ngram.report import gpu_headline

    results = load_results("ngram")
    table = lesson.result_table(results, book_results.headline(results))
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[1:-1]] for r in table.splitlines()[2:]}
    for head in gpu_headline(results):
        cells = rows[head["case"]]
        assert head["kernel"].startswith("n-gram matching, ngram_match (step")  # the headline times the entry point
        step = int(head["kernel"].split("(step")[1][:2])
        assert cells[4] == f"{head['kernel_ms'] * 1e3:,.1f} (runs step {step})", cells
        assert cells[6] == f"{head['speedup']:,.2f}×", (cells, head["speedup"])
        # the end-to-end column times step 7: where the entry point runs another step, its cell says so
        assert ("the entry point runs step" in cells[2]) == (step != ngram.CHAPTER.final.number), cells


def test_the_early_exit_share_is_the_share_of_bytes_before_the_first_longest_match():
    """The share the page quotes, against a count made here: each searching slot's haystacks read up to the end of
    the first window equal to its longest pattern with a token after it (prompt, then the generated tokens), else
    whole."""
    from studylog.ngram import NgramConfig, gen_width_for, make_batch
    from studylog.ngram.batches import haystack_bytes
    from studylog.ngram.models import slot_plan

    results = load_results("ngram")
    cfg = (32, 512, 128)
    inputs, _, this_time = make_batch(32, 512, gen_width_for(512), seed=1000 + 32 + 512)
    config = NgramConfig(threshold=128)
    lists = (inputs.step_idx.tolist(), inputs.draft_token_num.tolist(), inputs.max_dec_len.tolist(),
             inputs.seq_lens_encoder.tolist(), inputs.seq_lens_decoder.tolist(), this_time.tolist())
    read = 0
    for b in range(inputs.batch):
        kind, _, _, cap = slot_plan(b, config, *lists)
        step, prompt_len = int(inputs.step_idx[b]), int(inputs.prompt_lens[b])
        top = min(config.max_ngram_size, step)
        if kind != "active" or cap < 1 or top < config.min_ngram_size:
            continue  # a slot that does not search reads nothing
        pattern = inputs.generated_ids[b, step + 1 - top:step + 1].tolist()
        for hay, n in ((inputs.prompt_ids[b].tolist(), prompt_len), (inputs.generated_ids[b].tolist(), step)):
            hit = next((i for i in range(n - top) if hay[i:i + top] == pattern), None)
            read += (n if hit is None else hit + top) * 8
            if hit is not None:
                break
    assert 0 < read < haystack_bytes(inputs, this_time, config)  # some slot stops early, none reads past the floor
    assert lesson.early_exit_share(results, cfg) == pytest.approx(read / haystack_bytes(inputs, this_time, config))


def test_the_table_of_steps_has_the_headline_case_and_a_sub_row_per_bundled_change():
    """The headline's case is a column of the table of steps; steps 5, 6 and 7 have one sub-row per change, right
    under the step; a change of step 7 the variants timed gives, per case, step 7's time without it over its time
    with it (the variants' run), and no cell argues for it (the page says why a losing change stays, once); a change
    of steps 5 and 6 has its factor from the chain that adds them one at a time (checked against the file in
    :func:`test_the_sub_rows_of_steps_5_and_6_read_the_changes_run`), 7a from step 7's changes run
    (:func:`test_the_inherited_changes_are_read_from_step_7s_variants`); no row says "not timed alone"."""
    from studylog.ngram.report import HEADLINE_CASES

    assert lesson.HEADLINE in HEADLINE_CASES and lesson.HEADLINE in lesson.BOEHM_CASES
    results = load_results("ngram")
    table = lesson.boehm_table(results)
    assert "(headline)" in table.splitlines()[0]
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in table.splitlines()[3:]]
    labels = [r[0] for r in rows]
    variants = lesson.step07_variants(results.path.parent.name)
    for step, subs in lesson.SUB_ROWS.items():
        at = labels.index(str(step))
        assert labels[at + 1:at + 1 + len(subs)] == [label for label, *_ in subs]
        for row, (label, _, knobs) in zip(rows[at + 1:], subs):
            factors = row[3::3]
            assert "kept" not in row[1] and "loss" not in row[1], row
            if label in lesson.CHANGE_CHAIN or label == "7a":
                continue
            want = [lesson.change_factor(variants, knobs, cfg) for cfg in lesson.BOEHM_CASES]
            assert factors == [f"{f:.2f}×" for f in want], row
    assert not any("not timed alone" in c for r in rows for c in r)


def test_the_sub_rows_of_step_6_read_the_changes_run():
    """Step 5 is one change (5a: its kernel is the chain's 5a) and has no sub-row; 6a and 6b each show, per case of
    the table of steps, the time of the kernel that adds the change and its factor: the time of the row without the
    change over the row with it (step 4 -> 5a = step 5 -> 6a -> 6; 5b, the rejected exit, beside it), read here from
    the committed file itself; none says "not timed alone"."""
    import json

    from book.common import us
    from studylog import paths

    results = load_results("ngram")
    path = paths.lab_results("ngram", results.path.parent.name) / "step05_06_changes.json"
    if not path.is_file():
        pytest.skip("steps 5 and 6 were not timed one change at a time on this card")
    measured = json.loads(path.read_text())["measurements"]

    def ms(link, cfg):
        b, s, t = cfg
        [row] = [r for r in measured if r["params"]["batch"] == b and r["params"]["seq_len"] == s
                 and r["params"]["threshold"] == t and r["clock"] == "gpu"
                 and (r["series"] == link if link.startswith("step") else
                      r["series"] == "step05_06_changes" and r["params"]["variant"] == link)]
        return row["ms"]

    chain = {"5a": ("step04", "5a"), "5b": ("5a", "5"), "6a": ("5a", "6a"), "6b": ("6a", "6")}
    assert lesson.CHANGE_CHAIN == chain and lesson.CHAIN_STEPS == {"5a": 5, "6": 6}
    rows = {r[0]: r for r in ([c.strip() for c in line.split("|")[1:-1]]
                              for line in lesson.boehm_table(results).splitlines()[3:])}
    assert "5a" not in rows and "5b" not in rows
    for label in ("6a", "6b"):
        without, with_ = chain[label]
        row = rows[label]
        factors = [ms(without, cfg) / ms(with_, cfg) for cfg in lesson.BOEHM_CASES]
        assert row[3::3] == [f"{f:.2f}×" for f in factors], row
        # the kernel with 6b is step 6 itself: its sub-row points at the step's row, one time per kernel
        want = [f"as step {lesson.CHAIN_STEPS[with_]}" if with_ in lesson.CHAIN_STEPS else us(ms(with_, cfg))
                for cfg in lesson.BOEHM_CASES]
        assert row[2::3] == want, row
        assert "not timed alone" not in row[1]


def test_the_inherited_changes_are_read_from_step_7s_variants():
    """The early exit (5b) and the fused phase 2 (6b) in step 7: step 7 without the change over step 7 with it, on the
    GPU clock and in host time per eager call, read here from the committed file itself; the frozen copy of step 7
    times within 2% of the library's step 7 in the same run."""
    import json

    from studylog import paths

    results = load_results("ngram")
    path = paths.lab_results("ngram", results.path.parent.name) / "step07_changes.json"
    if not path.is_file():
        pytest.skip("step 7's inherited changes were not timed on this card")
    measured = json.loads(path.read_text())["measurements"]
    changes = lesson.step07_changes(results.path.parent.name)
    for cfg in lesson.BOEHM_CASES:
        b, s, t = cfg
        at = [r for r in measured if (r["params"]["batch"], r["params"]["seq_len"], r["params"]["threshold"]) == cfg]
        by = {r["params"].get("variant", r["series"]): r for r in at}
        assert abs(by["7"]["ms"] / by["step07"]["ms"] - 1) < 0.02, cfg
        table = {r[0]: r for r in ([c.strip() for c in line.split("|")[1:-1]]
                                   for line in lesson.boehm_table(results).splitlines()[3:])}
        i = lesson.BOEHM_CASES.index(cfg)
        assert table["7a"][2 + 3 * i] == f"{by['7a']['ms'] * 1e3:,.1f}"  # 7a alone, against step 6 in its run
        assert table["7a"][3 + 3 * i] == f"{by['step06']['ms'] / by['7a']['ms']:.2f}×"
        for label, without in (("5b", "7 no exit"), ("6b", "7 unfused")):
            for clock in ("ms", "host_ms"):
                assert lesson.inherited_factor(changes, label, cfg, clock) == \
                    pytest.approx(by[without][clock] / by["7"][clock]), (cfg, label, clock)


def test_the_page_names_its_result_files_once_at_the_end():
    """The prose and table notes say where a number comes from in words; the files themselves are listed once, in
    "Where the numbers come from": the chapter's benchmark and every lab run the page reads."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "03_ngram_matching.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    at = next(i for i, t in enumerate(text) if t.startswith("## Where the numbers come from"))
    assert text[at + 1].startswith("## Further reading")
    assert not [i for i, t in enumerate(text) if i != at and ("lab/ngram/results" in t or ".json`" in t)]
    for name in ("assets/bench/nvidia-h200/ngram.json", "step05_06_changes.json", "step07_changes.json",
                 "stream_variants.json"):
        assert name in text[at], name
