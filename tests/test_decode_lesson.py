"""Chapter 7 as a lesson (CPU): the exercises' checks accept the solutions and reject planted mistakes; the
notebook's glued numbers and tables read the earlier run kept in lab/ and a file with the current benchmark's
series (body, masked_logits), saying 'pending' where a file lacks a series; the figures keep to three panels,
linear axes and readable text."""

from __future__ import annotations

import copy
import math
import re

import matplotlib
import numpy as np
import pytest
import torch

from book.common import is_tie
from book.decode import exercises, figures, lesson, solutions
from studylog.decode import report
from studylog.decode.loop import COMPONENTS
from studylog.plotting import Results
from book.decode import results as decode_results

matplotlib.use("Agg")


# --------------------------------------------------------------------------------------
# Exercises
# --------------------------------------------------------------------------------------

def test_the_checks_accept_the_solutions(capsys):
    assert exercises.check_step_speedup(solutions.step_speedup)
    assert exercises.check_bitmask(solutions.pack_bitmask, solutions.unpack_bitmask)
    assert exercises.check_jump_decode(solutions.jump_decode)
    assert exercises.check_chunked_forward(solutions.chunked_forward)
    assert capsys.readouterr().out.count("inputs agree") == 4


def test_the_library_agrees_with_the_exercises():
    """Exercise 2's packing is the one the decode loop hands xgrammar; exercise 1's formula is book.decode.results.amdahl's
    chapter-2 bound when the head, the mask's application and the sampling vanish."""
    from studylog.masked_lm_head.formats import pack_bitmask

    gen = np.random.default_rng(1)
    for vocab in (1, 31, 32, 33, 1000):
        mask = gen.random(vocab) < 0.3
        ours = solutions.pack_bitmask(np.flatnonzero(mask), vocab)
        assert np.array_equal(ours, pack_bitmask(torch.from_numpy(mask)[None]).numpy()[0])
    parts = {"body": 2.0, "mask_wait": 0.01, "head": 0.2, "mask_apply": 0.02, "sampling": 0.05, "host": 0.1}
    bound = decode_results.amdahl({"baseline": parts})["chapter2_bound"]
    vanish = {"head": math.inf, "mask_apply": math.inf, "sampling": math.inf}
    assert solutions.step_speedup(parts, vanish) == pytest.approx(bound)


def _weighted_average(parts, faster):
    """A planted mistake: the parts' speedups averaged, weighted by their times."""
    return sum(t * faster.get(n, 1.0) for n, t in parts.items()) / sum(parts.values())


def _reversed_bits(ids, vocab):
    """A planted mistake: token v as bit 31 - v % 32."""
    bits = np.zeros(-(-vocab // 32) * 32, dtype=np.uint8)
    bits[np.asarray(ids, dtype=np.int64)] = 1
    return solutions.pack_bitmask(np.flatnonzero(bits.reshape(-1, 32)[:, ::-1].reshape(-1)), len(bits))


def _padding_kept(bitmask, vocab):
    """A planted mistake: bits past the vocabulary read as tokens."""
    return solutions.unpack_bitmask(bitmask, np.asarray(bitmask).size * 32)


def _whole_chain(allowed, model, max_new_tokens, eos=0):
    """A planted mistake: a forced chain appended whole, past the cap."""
    out = []
    while len(out) < max_new_tokens:
        options = allowed(out)
        if options == [eos]:
            break
        if len(options) == 1:
            while len(options) == 1 and options != [eos]:
                out.append(options[0])
                options = allowed(out)
            continue
        tok = model(tuple(out), options)
        if tok == eos:
            break
        out.append(tok)
    return out


def _no_jumps(allowed, model, max_new_tokens, eos=0):
    """A planted mistake: right tokens, but a forward for every forced token."""
    out = []
    while len(out) < max_new_tokens:
        tok = model(tuple(out), allowed(out))
        if tok == eos:
            break
        out.append(tok)
    return out


def _start_at_zero(model, tokens, chunks, sizes):
    """A planted mistake: every chunk written at position 0."""
    B = tokens.shape[0]
    cache = model.new_cache(B, tokens.shape[1] + max(sizes))
    done, out = 0, None
    for n in chunks:
        T = min(s for s in sizes if s >= n)
        chunk = torch.zeros(B, T, dtype=tokens.dtype)
        chunk[:, :n] = tokens[:, done:done + n]
        out = model(chunk, torch.zeros(B, dtype=torch.long), torch.full((B,), n - 1), cache)
        done += n
    return out


def _padded_last(model, tokens, chunks, sizes):
    """A planted mistake: the hidden state of the padded chunk's last position, not of its last real token."""
    B = tokens.shape[0]
    cache = model.new_cache(B, tokens.shape[1] + max(sizes))
    done, out = 0, None
    for n in chunks:
        T = min(s for s in sizes if s >= n)
        chunk = torch.zeros(B, T, dtype=tokens.dtype)
        chunk[:, :n] = tokens[:, done:done + n]
        out = model(chunk, torch.full((B,), done), torch.full((B,), T - 1), cache)
        done += n
    return out


def _unpadded(model, tokens, chunks, sizes):
    """A planted mistake: chunks of any length (no captured graph would fit)."""
    B = tokens.shape[0]
    cache = model.new_cache(B, tokens.shape[1])
    done, out = 0, None
    for n in chunks:
        out = model(tokens[:, done:done + n], torch.full((B,), done), torch.full((B,), n - 1), cache)
        done += n
    return out


def test_the_checks_reject_planted_mistakes(capsys):
    assert not exercises.check_step_speedup(_weighted_average)
    assert not exercises.check_bitmask(_reversed_bits, solutions.unpack_bitmask)
    assert not exercises.check_bitmask(solutions.pack_bitmask, _padding_kept)
    assert not exercises.check_jump_decode(_whole_chain)
    assert not exercises.check_jump_decode(_no_jumps)
    assert not exercises.check_chunked_forward(_start_at_zero)
    assert not exercises.check_chunked_forward(_padded_last)
    assert not exercises.check_chunked_forward(_unpadded)
    out = capsys.readouterr().out
    assert out.count("wrong:") == 8
    assert "past the" in out or "wrote" in out  # the jump check says what was written


def test_the_checks_survive_answers_of_the_wrong_type(capsys):
    assert not exercises.check_step_speedup(lambda parts, faster: "fast")
    assert not exercises.check_bitmask(lambda ids, vocab: np.zeros(3, dtype=np.int64), solutions.unpack_bitmask)
    assert not exercises.check_chunked_forward(lambda model, tokens, chunks, sizes: None)


# --------------------------------------------------------------------------------------
# The lesson's numbers and tables
# --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def earlier():
    run = lesson.earlier_run()
    if run is None:
        pytest.skip("the earlier run is not in lab/decode/results")
    return run


def _current_from(earlier) -> Results:
    """A results file as the current benchmark writes it: the fused body (``body``, with its floor and kernel
    count) beside ``body_unfused``, and chapter 2's head alone (``masked_logits``) with its host time."""
    data = copy.deepcopy(earlier.data)
    rows = data["measurements"]
    for r in [r for r in rows if r["series"] == "body_unfused"]:
        floor = lesson._floor_ms(earlier, r["params"]["model"], head=False)
        rows.append({**r, "series": "body", "ms": 1.2 * floor, "floor_ms": floor, "kernels_per_layer": 9.0})
    for model in ("1b", "8b"):
        for batch in (1, 8):
            for n in report.HEAD_COUNTS:
                rows.append({"series": "masked_logits", "role": "baseline", "clock": "gpu", "ms": 0.01 * n ** 0.5,
                             "host_ms": 0.03, "params": {"model": model, "batch": batch, "allowed": n}})
    return Results(earlier.path, data)


def test_the_earlier_run_names_its_body_unfused(earlier):
    series = {r["series"] for r in earlier.rows}
    assert "body_unfused" in series and "body" not in series
    assert {"step01", "step02", "step03"} <= series


def test_prose_numbers_from_the_earlier_run_say_pending_for_the_fused_body(earlier):
    numbers = lesson.prose_numbers(None, earlier)
    assert all(isinstance(v, str) and v for v in numbers.values())
    assert numbers["dec_fused_vs_floor"] == lesson.PENDING and numbers["dec_status"].startswith(lesson.PENDING)
    assert numbers["dec_gpu"] == earlier.gpu
    for key in ("dec_fwd_saved", "dec_step03_1b_b1", "dec_share_body_1b_b1", "dec_unfused_vs_floor",
                "dec_bound_both_1b_b8", "dec_target_vs_bound"):
        assert numbers[key] != lesson.PENDING, key
    assert float(numbers["dec_step03_1b_b1"].rstrip("×")) > 1.0


def test_prose_numbers_without_any_file_keep_the_shapes():
    numbers = lesson.prose_numbers(None, None)
    assert numbers["dec_gpu"] == lesson.PENDING
    assert numbers["dec_head_share_1b"].endswith("%") and numbers["dec_head_bound_llama8b"].endswith("×")


def test_the_current_series_are_read(earlier):
    current = _current_from(earlier)
    numbers = lesson.prose_numbers(current, earlier)
    assert numbers["dec_fused_vs_floor"] == "1.20×" and numbers["dec_fused_kernels"] == "9"
    assert numbers["dec_status"] == "measured"
    body = lesson.body_table(current)
    assert "1.20" in body and "9.0" in body
    components = lesson.components_table(current)
    assert "masked_logits, 6000 allowed" in components and lesson.PENDING not in components
    assert lesson.PENDING in lesson.components_table(earlier)
    assert "1.20×" in lesson.tried_table(current, earlier)
    assert lesson.PENDING in lesson.tried_table(None, earlier)


def test_tables_are_markdown_tables(earlier):
    for table in (lesson.shapes_table(), lesson.head_share_table(), lesson.body_table(earlier), lesson.results_table(earlier),
                  lesson.amdahl_table(decode_results.breakdown(earlier.rows, "1b", 1)), lesson.tried_table(None, earlier)):
        lines = table.splitlines()
        assert lines[1].startswith("|---") and all(line.count("|") == lines[0].count("|") for line in lines)


def test_tables_say_pending_where_a_file_lacks_the_series(earlier):
    empty = Results(earlier.path, {**earlier.data, "measurements": []})
    assert lesson.PENDING in lesson.body_table(empty)
    assert lesson.PENDING in lesson.results_table(empty)
    assert lesson.PENDING in lesson.amdahl_table(decode_results.breakdown(empty.rows, "1b", 1))


# --------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------

def test_figures_keep_to_the_rules(earlier):
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    figs = figures.figures(earlier, what=lesson.EARLIER_WHAT)
    assert {"breakdown_1b", "breakdown_8b", "speedup"} <= set(figs) <= {"breakdown_1b", "breakdown_8b", "speedup",
                                                                        "speedup_8b", "breakdown_smollm2"}
    for name, fig in figs.items():
        axes = [ax for ax in fig.axes if ax.has_data()]
        assert 1 <= len(axes) <= 3, name
        assert all(ax.get_yscale() == "linear" for ax in axes), name
        small = [t.get_text() for t in fig.findobj(Text) if t.get_text().strip() and t.get_fontsize() < 9]
        assert not small, (name, small[:5])
        assert fig.texts[0].get_text().startswith(lesson.EARLIER_WHAT) if fig.texts else \
            axes[0].get_title().startswith(lesson.EARLIER_WHAT), name
        plt.close(fig)


def test_one_colour_per_configuration(earlier):
    import matplotlib.pyplot as plt

    fig = figures.figures(earlier)["speedup"]
    handles, labels = fig.axes[0].get_legend_handles_labels()
    colours = {label: matplotlib.colors.to_hex(h.patches[0].get_facecolor()) for h, label in zip(handles, labels)
               if hasattr(h, "patches")}
    assert colours == {lesson.STEP_LABELS[c]: figures.CONFIG_COLORS[c] for c in ("jump_forward", "masked_head")}
    assert "step01_baseline" not in fig.axes[0].get_ylabel()
    plt.close(fig)


def _card(earlier, name: str, speedup: float) -> dict:
    """The earlier run's file as another card's, with every step-3 row set to ``speedup`` over its step-1 row."""
    data = copy.deepcopy(earlier.data)
    data["device"] = {**data["device"], "name": name}
    rows = data["measurements"]
    for r in rows:
        if r["series"] == "step03":
            base = [b for b in rows if b["series"] == "step01"
                    and {**b["params"], "config": "masked_head"} == r["params"]]
            r["ms"] = base[0]["ms"] / speedup
    return data


def test_targets_by_card_names_each_card_and_what_it_misses(earlier, tmp_path):
    import json

    for folder, name, speedup in (("card-a", "Card A", 1.4), ("card-b", "Card B", 1.1)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "decode.json").write_text(json.dumps(_card(earlier, name, speedup)))
    table = lesson.targets_by_card(tmp_path)
    lines = table.splitlines()
    assert lines[1].startswith("|---") and all(line.count("|") == lines[0].count("|") for line in lines)
    a = next(line for line in lines if line.startswith("| Card A"))
    b = next(line for line in lines if line.startswith("| Card B"))
    assert "**1.40×**, met |" in a
    assert f"**1.10×**, missed by {decode_results.TARGET_SPEEDUP / 1.1 - 1:.0%}" in b
    assert b.rstrip().endswith("met |"), "at batch 8 the card is 1.1x on every schema: met"


def test_the_measurement_findings_read_the_lab_files():
    rows = lesson.measurement_findings()
    assert len(rows) == 2
    assert "`lab/decode/gc_pauses.py`" in rows[0] and "`lab/decode/profiler_residue.py`" in rows[1]
    assert all(r.count("|") == 4 for r in rows)
    assert lesson.measurement_findings(gpu="no-such-gpu") == []


def test_the_gemv_findings_read_the_tile_sweep():
    rows = lesson.gemv_findings()
    assert len(rows) == 2 and all(r.count("|") == 4 and "`lab/decode/gemv_tiles.py`" in r for r in rows)
    assert "tensor cores" in rows[0] and "first tile" in rows[1]
    assert lesson.gemv_findings(gpu="no-such-gpu") == []


# --------------------------------------------------------------------------------------
# The padded baseline and the real model
# --------------------------------------------------------------------------------------

def _real_results():
    """A small results file with the real model's series, written by hand: two requests, their chunk lengths, the
    body per chunk length, a dense head at both widths, an HF row and the checks."""
    def row(series, ms, **params):
        return {"series": series, "ms": ms, "params": params}

    rows = [row("body", 0.5, model="smollm2", batch=1, chunk=1), row("body", 0.8, model="smollm2", batch=1, chunk=8),
            row("body", 0.9, model="smollm2", batch=1, chunk=64),
            row("dense_head", 0.1, model="1b", batch=1), row("dense_head_unpadded", 0.13, model="1b", batch=1,
                                                              rows=100277)]
    for name, chunks1, chunks3, ms1, ms3 in (("a", [90, 1, 1, 1, 1], [90, 2, 2], 1.0, 0.8),
                                              ("b", [70, 1, 1, 1], [70, 1, 2], 1.2, 1.3)):
        for config, chunks, ms in (("baseline", chunks1, ms1), ("jump_forward", chunks3, ms3 * 1.05),
                                   ("masked_head", chunks3, ms3)):
            r = row(report.series_of(config), ms, model="smollm2", batch=1, schema=name, whitespace="compact",
                    config=config)
            r.update(tokens=len(chunks1) - 1, forwards=len(chunks), chunk_lengths=chunks,
                     breakdown_ms_per_token={k: 0.1 for k in COMPONENTS})
            rows.append(r)
    rows.append(row("hf_generate", 20.0, model="smollm2", batch=1, schema="a", whitespace="compact",
                    config="hf_generate"))
    checks = [{"name": "finished outputs valid for their schema", "passed": True, "params": {"model": "smollm2"},
               "requests": 2, "finished": 2, "valid": 2, "invalid": []},
              {"name": "same tokens as step01_baseline, or a near-tie inside the bound", "passed": True,
               "params": {"model": "smollm2"}, "identical": 1, "sequences": 2, "divergences": [{"position": 3}]}]
    data = {"chapter": "decode", "device": {"name": "GPU"}, "versions": {}, "date": "2026-01-01T00:00:00",
            "ceilings": {"copy_bandwidth_gbs": 1000.0}, "measurements": rows, "checks": checks,
            "notes": ["model 1b: {'name': '1b', 'vocab_size': 100352}"]}
    return Results("decode.json", data)


def test_the_real_model_tables_read_their_rows():
    res = _real_results()
    # request a: step 1 runs 4 one-token forwards (2.0 ms), step 3 two two-token ones (1.6 ms)
    assert lesson.chunk_forecast(res, res.rows[5], "smollm2", 1) == pytest.approx(2.0)
    table = lesson.real_model_table(res, 1)
    assert "| `a` | 4 | 5 → 3 | 1.000 | 0.840 | 0.800 | 1.25× | 1.25× | 20.0 |" in table
    assert "| `b` | 3 |" in table and "0.92×" in table  # a request that loses is shown as a loss
    n = lesson.real_model_numbers(res)
    assert n["dec_real_valid"] == "2 of 2" and n["dec_real_same"] == "1 of 2" and n["dec_real_divergences"] == "1"
    assert n["dec_real_min_schema_b1"] == "b" and n["dec_real_hf_over_step01"] == "20×"
    assert "| `1b` | 1 | 0.1300 | 0.1000 | 1.30× |" in lesson.padding_table(res)


def test_the_headline_names_the_heads_rows():
    """A run whose head was not padded is another case than one whose head was: the README never compares them."""
    res = _real_results()
    cases = [h["case"] for h in report.headline(res)]
    assert any(c.startswith("SmolLM2-135M-Instruct, real requests, batch 1") for c in cases)
    for padded in (100352, 100277):
        names = {"a": "weather_call", "b": "tool_call"}  # JSON schemas of the suite: the cost models' headline
        rows = [dict(r, params=dict(r["params"], model="1b", schema=names.get(r["params"].get("schema"))))
                for r in res.rows if r["params"].get("model") == "smollm2"]
        data = dict(res.data, measurements=rows, notes=[f"model 1b: {{'name': '1b', 'vocab_size': {padded}}}"])
        cases = [h["case"] for h in report.headline(Results("decode.json", data))]
        assert cases and all(c.startswith(f"1B cost model (head of {padded:,} rows), batch 1") for c in cases)


# --------------------------------------------------------------------------------------
# The page's steps table, result table, peer and loop listings; the kernel exercise
# --------------------------------------------------------------------------------------

def test_the_kernel_exercise_accepts_a_tile_and_rejects_a_wrong_launch(capsys):
    assert exercises.check_gemv_tile(solutions.gemv_tile)
    assert exercises.check_gemv_tile(lambda x, w: solutions.gemv_tile(x, w, BLOCK_N=8, BLOCK_K=32))

    def first_block_only(x, w):
        """A planted mistake: the grid covers only the first BLOCK_N rows."""
        out = solutions.gemv_tile(x, w)
        out[:, 4:] = 0
        return out

    assert not exercises.check_gemv_tile(first_block_only)
    assert "not written yet" not in capsys.readouterr().out


def test_an_unwritten_exercise_gets_a_note_not_a_traceback(capsys):
    def stub(*args):
        raise NotImplementedError

    for check in (exercises.check_step_speedup, exercises.check_jump_decode, exercises.check_chunked_forward,
                  exercises.check_gemv_tile):
        assert check(stub) is False
    assert exercises.check_bitmask(stub, stub) is False
    assert capsys.readouterr().out.count("not written yet") == 5


def test_the_steps_table_is_its_own_ratios(earlier):
    rows = lesson.steps_rows(earlier, "1b", 1)
    assert [r["step"] for r in rows] == ["step01_baseline", "step02_jump_forward", "step03_masked_head"]
    assert [r["label"] for r in rows] == ["step 1: the baseline loop", "step 2: jump forward", "step 3: the masked head"]
    for a, b in zip(rows, rows[1:]):
        assert b["x_previous"] == pytest.approx(a["us"] / b["us"])
    assert all(r["x_floor"] == pytest.approx(r["us"] / r["floor_us"]) for r in rows)
    table = lesson.steps_table(earlier)
    assert table.startswith("| step | what changes | µs per token | × previous | "
                            "× floor (its forwards' weight bytes) |")
    # 3a (the allowed sets precomputed, timed on its own) has its own row; step 3's row is 3b and 3c, over 3a
    rows3a = lesson.steps_rows(earlier, "1b", 1, with_3a=True)
    assert [r["label"] for r in rows3a] == ["step 1: the baseline loop", "step 2: jump forward",
                                           "3a: allowed sets precomputed", "step 3: the masked head"]
    assert [rows3a[i] for i in (0, 1)] == rows[:2] and rows3a[3]["us"] == pytest.approx(rows[2]["us"])
    for a, b in zip(rows3a, rows3a[1:]):
        assert b["x_previous"] == pytest.approx(a["us"] / b["us"])
    assert "(3b, 3c)" in table.splitlines()[-1] and "one change" not in table
    assert table.splitlines()[-2].startswith("| 3a: allowed sets precomputed | ")
    assert lesson.PENDING in lesson.steps_table(Results(earlier.path, {**earlier.data, "measurements": []}))


def test_the_result_table_and_the_peer_read_the_committed_run():
    current = lesson.committed()
    if current is None:
        pytest.skip("no committed results")
    rows = lesson.result_rows(current)
    assert {(r["model"], r["batch"]) for r in rows} >= {("1b", 1), ("8b", 1)}
    assert all(r["ratio"] == pytest.approx(r["step1_us"] / r["step3_us"]) for r in rows)
    peer = lesson.peer_numbers(current)
    if peer is not None:
        assert peer["hf_ms"] > peer["step1_ms"] > 0 and peer["requests"] > 0


def test_each_steps_code_is_a_short_diff_of_the_librarys_loop():
    """Steps 2 and 3 show their code as diffs of the library's loop, each configuration's tests resolved: step 2 adds
    the jump after a token, step 3 swaps the bitmask and the dense head for the allowed sets and the masked head,
    and lists the sampler's allowed-only argmax; at most 40 changed lines a step, no line past 100 characters."""
    from studylog.source import Code, Diff

    for step in (2, "3a", 3):
        parts = lesson.step_code(step)
        diffs = [p for p in parts if isinstance(p, Diff)]
        assert diffs and sum(len(d.added) + len(d.removed) for d in diffs) <= 40, step
        assert all(len(line) <= 101 for d in diffs for line in d.lines[2:]), step
    (two,) = lesson.step_code(2)
    assert any("auto.token_jump(state)" in line for line in two.added) and two.removed == ["    return"]
    (cached,) = lesson.step_code("3a")  # 3a: the mask's source, xgrammar's matcher to the automaton's sets
    assert any("fill_next_token_bitmask" in line for line in cached.removed)
    assert any("grammar.state_words(" in line for line in cached.added)
    mask, run, sample = lesson.step_code(3)  # step 3, from 3a: ids instead of bitmask words, and the masked head
    assert any("grammar.allowed(" in line for line in mask.added) and any("grammar.state_words(" in line
                                                                          for line in mask.removed)
    assert any("masked_head_kernel" in line for line in run.added)
    assert any("apply_token_bitmask_inplace" in line for line in run.removed)
    assert isinstance(sample, Code) and "allowed_argmax" in sample.text
    with pytest.raises(ValueError):
        lesson.step_code(1)


def test_a_configuration_resolves_its_tests():
    """The resolution the diffs rest on, on a hand-made function: an ``if`` on ``cfg`` keeps the branch it takes, a
    conditional expression its value, an ``and`` drops the operands it decides, and what follows a return goes."""
    from book.decode import resolve
    from studylog.decode.generation import CONFIGS

    def loop(cfg, x, y):
        if cfg.jump == "none":
            return x
        z = x if cfg.head == "dense" else -x
        w = cfg.head == "masked" and y > 0
        return z + w

    assert resolve.resolved(loop, CONFIGS["baseline"]) == "return x"
    assert resolve.resolved(loop, CONFIGS["jump_forward"]) == "z = x\nw = False\nreturn z + w"
    assert resolve.resolved(loop, CONFIGS["masked_head"]) == "z = -x\nw = y > 0\nreturn z + w"
    long = "    f(" + ", ".join(f"argument_{i}" for i in range(12)) + ")"
    assert [len(line) <= 100 for line in resolve.wrapped_line(long)] == [True, True]


def test_the_appendix_holds_the_tables_the_page_moved_out():
    text = lesson.appendix()
    for title in ("Every configuration", "Amdahl bound", "real requests", "targets on each card",
                  "What was tried and did not help", "SchemaStore"):
        assert title in text, title


def test_the_step03_changes_table_reads_hand_made_rows():
    """Step 3's changes one at a time (``lab/decode/step03_changes.py``'s rows): medians over the schemas, each row
    over the one above, the parts each change targets, and a request that wrote other tokens is named."""
    def row(config, schema, ms, same=True, batch=1):
        parts = {"body": ms * 0.8, "mask_wait": 0.001, "mask_apply": 0.002, "head": ms * 0.1, "sampling": 0.004,
                 "host": 0.0}
        return {"series": "step03_changes", "ms": ms, "same_tokens_as_step01": same, "breakdown_ms_per_token": parts,
                "params": {"model": "1b", "batch": batch, "schema": schema, "config": config}}

    times = {"jump_forward": (1.0, 1.2, 1.1), "automaton_mask": (0.95, 1.15, 1.0),
             "masked_full_argmax": (0.9, 1.0, 0.85), "masked_head": (0.8, 0.9, 0.85)}
    rows = [row(c, s, t) for c, ts in times.items() for s, t in zip(("a", "b", "c"), ts)]
    rows.append(row("masked_head", "a", 0.5, batch=8))  # another batch: not in batch 1's rows
    out = lesson.step03_changes_rows(rows, "1b", 1)
    assert [r["config"] for r in out] == ["jump_forward", "automaton_mask", "masked_full_argmax", "masked_head"]
    assert [r["us"] for r in out] == pytest.approx([1100, 1000, 900, 850])
    assert out[0]["x_previous"] is None and out[2]["x_previous"] == pytest.approx(1.0 / 0.9)
    assert out[1]["head_us"] == pytest.approx(100) and out[1]["mask_us"] == pytest.approx(3)
    assert all(r["same_tokens"] and r["schemas"] == 3 for r in out)
    table = lesson.step03_changes_table(rows, models=("1b",), batches=(1,))
    lines = table.splitlines()
    assert len(lines) == 6 and all(line.count("|") == lines[0].count("|") for line in lines)
    assert "+ masked head" in lines[4] and "1.11×" in lines[4] and "yes (3 schemas)" in lines[4]
    rows[0]["same_tokens_as_step01"] = False
    assert "NO (3 schemas)" in lesson.step03_changes_table(rows, models=("1b",), batches=(1,))
    assert lesson.PENDING in lesson.step03_changes_table([])
    # the chapter's own run (another run, more schemas): its median beside the steps' rows, in brackets
    rng = np.random.default_rng(73)
    names = ("classifier", "weather_call", "tool_call", "product", "calendar_event")
    own = {c: rng.uniform(0.7, 1.3, len(names)) for c in ("jump_forward", "masked_head", "automaton_mask")}
    chapter = Results("decode.json", {"measurements": [
        {"series": c, "ms": float(t), "params": {"model": "1b", "batch": 1, "schema": n, "config": c,
                                                  "whitespace": "compact"}}
        for c, ts in own.items() for n, t in zip(names, ts)]})
    lines = lesson.step03_changes_table(rows, models=("1b",), batches=(1,), chapter=chapter).splitlines()
    assert f"[{np.median(own['jump_forward']) * 1e3:,.0f}]" in lines[2]
    assert f"[{np.median(own['masked_head']) * 1e3:,.0f}]" in lines[5]
    assert "[" not in lines[3] and "[" not in lines[4]  # not a step of the steps table: nothing to set beside it


def test_the_bound_is_the_median_of_the_requests_own():
    """The result table's bound is the median of the schemas' own bounds, each from its own breakdown."""
    current = lesson.committed()
    if current is None:
        pytest.skip("no committed results")
    per = decode_results.schema_bounds(current.rows, "1b", 1)
    assert len(per) == 9
    import statistics

    case = {(r["model"], r["batch"]): r for r in lesson.result_rows(current)}[("1b", 1)]
    assert case["bound"] == pytest.approx(statistics.median(b["both_bound"] for b in per.values()))
    excess = lesson.bound_excess(current, "1b", 1)
    assert 0 <= excess["above"] <= excess["requests"] == 9 and excess["host_step1_us"] > 0
    # the host's own work the page quotes is the median over the JSON schemas of each row's ``host`` component
    for config, key in (("baseline", "host_step1_us"), ("masked_head", "host_step3_us")):
        rows = [r for r in current.rows if r["params"].get("model") == "1b" and r["params"].get("batch") == 1
                and r["params"].get("config") == config and r["params"].get("whitespace") == "compact"
                and r["params"].get("schema") in per]
        assert len(rows) == 9
        assert excess[key] == pytest.approx(statistics.median(r["breakdown_ms_per_token"]["host"] for r in rows) * 1e3)


def test_the_breakdown_bars_are_the_instrumented_totals_with_the_timed_total_as_a_tick():
    """Each bar stacks the instrumented parts as measured, to their own total; the tick sits at the timed total; the
    caption gives the range of bar top less tick over the bars, signed, in µs."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    from book.decode import figures as decode_figures

    parts = {"baseline": {"body": 1.0, "mask_wait": 0.0, "head": 0.2, "mask_apply": 0.0, "sampling": 0.05,
                          "host": 0.05, "wall": 1.2},
             "masked_head": {"body": 1.0, "mask_wait": 0.0, "head": 0.02, "mask_apply": 0.0, "sampling": 0.01,
                             "host": 0.02, "wall": 1.1}}
    assert decode_figures.unattributed(parts["baseline"]) == pytest.approx(-0.1)
    assert decode_figures.unattributed(parts["masked_head"]) == pytest.approx(0.05)
    assert decode_figures.instrumentation_cost([parts]) == pytest.approx((-0.05, 0.1))
    text = decode_figures.instrumentation_caption([parts])
    assert "−50 to +100 µs" in text and "2 bars" in text

    ax = decode_figures.plot_breakdown(parts)
    bodies = [p.get_width() for p in ax.patches if p.get_facecolor()[:3] == matplotlib.colors.to_rgb(
        decode_figures.COLORS["body"])]
    assert bodies == pytest.approx([1.0, 1.0])  # the shared body keeps its length
    ends = {}
    for p in ax.patches:  # every patch is a part: the bar ends at the instrumented total
        y = round(p.get_y() + p.get_height() / 2)
        ends[y] = max(ends.get(y, 0.0), p.get_x() + p.get_width())
    assert [ends[0], ends[1]] == pytest.approx([sum(parts[c][k] for k in COMPONENTS)
                                                for c in ("baseline", "masked_head")])
    ticks = sorted(seg[0][0] for coll in ax.collections if isinstance(coll, LineCollection) for seg in coll.get_segments())
    assert ticks == pytest.approx(sorted(p["wall"] for p in parts.values()))
    assert decode_figures.TICK_LABEL in ax.get_legend_handles_labels()[1]
    plt.close(ax.figure)



def _chain_rows(times, batch=1, model="1b"):
    """Rows of series ``step03_changes`` by hand: one per configuration and schema, with the parts the chain reads."""
    def row(config, schema, ms):
        parts = {"body": ms * 0.8, "mask_wait": 0.0, "mask_apply": 0.0, "head": ms * 0.1, "sampling": ms * 0.02,
                 "host": ms * 0.05}
        return {"series": "step03_changes", "ms": ms, "same_tokens_as_step01": True, "breakdown_ms_per_token": parts,
                "params": {"model": model, "batch": batch, "schema": schema, "config": config}}

    return [row(c, s, t) for c, ts in times.items() for s, t in zip(("a", "b", "c"), ts)]


def _table_rows(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]]


def test_the_steps_table_has_one_row_per_step_and_3a_its_own():
    """The cost models' table: the three steps and 3a, timed on its own, its own row (as in the page's open table);
    3b and 3c stay in step 3's row (they have their own chain table), and a tie says so."""
    from book.common import is_tie

    for results in (lesson.committed(), lesson.earlier_run()):
        if results is None:
            continue
        table = lesson.steps_table(results, "1b", 1, also="8b")
        rows = _table_rows(table)
        # the reader's labels, "step N: short name", as the sections are titled: no library function names
        assert [r[0] for r in rows] == ["step 1: the baseline loop", "step 2: jump forward",
                                        "3a: allowed sets precomputed", "step 3: the masked head"]
        for m, col in (("1b", 3), ("8b", 6)):
            for row, x in zip(rows[1:], lesson.steps_rows(results, m, 1, with_3a=True)[1:]):
                assert row[col].startswith(f"{x['x_previous']:.2f}×")
                assert row[col].endswith("(tie)") == is_tie(x["x_previous"])
        assert "`step0" not in lesson.steps_table(results, "1b", 1)
        assert not any(re.fullmatch(r"\d+[a-z]", r[0].strip("`")) for r in rows)


def _chain_table(changes) -> str:
    """Step 3's chain as the page renders it: the book's one chain renderer, µs per output token, whole µs."""
    from book.common import chain_table

    return chain_table(lesson.step03_chain_rows(changes), [label for label, _, _ in lesson.CHAIN_CASES], str,
                       unit="µs per token", digits=0)


def _check_chain(table: str) -> list[list[str]]:
    """A chain table's rules: each row's label once, step 2 first and step 3 last, every "× previous" the ratio of the
    row above's µs cell over its own (to the cells' rounding), "does not pay" exactly where it is below one."""
    rows = _table_rows(table)
    labels = [r[0] for r in rows]
    assert len(set(labels)) == len(labels) and labels[0] == "step 2" and labels[-1].endswith("step 3")
    assert labels[1:] == ["3a", "3b", "3c = step 3"]
    cases = (len(rows[0]) - 2) // 2
    assert cases == len(lesson.CHAIN_CASES)
    for above, row in zip(rows, rows[1:]):
        for k in range(cases):
            us_above, us = (float(r[2 + 2 * k].replace(",", "")) for r in (above, row))
            factor = row[3 + 2 * k]
            x = float(factor.split("×")[0])
            assert x == pytest.approx(us_above / us, abs=0.006), (row[0], k)
            assert ("does not pay" in factor) == (x < 1.0), (row[0], factor)  # the cell's own two digits decide
    assert all(r[3 + 2 * k] == "anchor" for r in rows[:1] for k in range(cases))
    return rows


def test_step_3s_chain_is_cumulative_from_hand_made_rows():
    times = {"jump_forward": (1.0, 1.2, 1.1), "automaton_mask": (1.05, 1.25, 1.12),
             "masked_full_argmax": (0.9, 1.0, 0.85), "masked_head": (0.8, 0.9, 0.85)}
    changes = _chain_rows(times) + _chain_rows(times, model="8b")
    chain = lesson.step03_chain(changes)
    assert [r["row"] for r in chain] == ["step 2", "3a", "3b", "3c = step 3"]
    one = lesson.CHAIN_CASES[0][0]
    assert [r["us"][one] for r in chain] == pytest.approx([1100, 1120, 900, 850])
    assert chain[1]["x_previous"][one] == pytest.approx(1100 / 1120) and chain[0]["x_previous"][one] is None
    rows = _check_chain(_chain_table(changes))
    assert "does not pay" in rows[1][3] and "does not pay" not in rows[2][3]
    assert rows[0][:4] == ["step 2", "jumps, dense head, xgrammar's bitmask", "1,100", "anchor"]
    assert all(r[1].startswith("+ ") for r in rows[1:])
    # a missing link is an error, not a row left out
    with pytest.raises(ValueError):
        lesson.step03_chain([r for r in changes if r["params"]["config"] != "masked_full_argmax"])
    # the anchors against the chapter's own steps: the largest gap, computed
    names = ("classifier", "weather_call", "tool_call")
    chapter = Results("decode.json", {"ceilings": {"copy_bandwidth_gbs": 4000.0}, "measurements": [
        {"series": c, "ms": t * (1.02 if m == "8b" else 1.0), "forwards": 10, "tokens": 10,
         "params": {"model": m, "batch": 1, "schema": n, "config": c, "whitespace": "compact"}}
        for m in ("1b", "8b") for c, t in (("baseline", 1.2), ("jump_forward", 1.1), ("masked_head", 0.85))
        for n in names]})
    gap = lesson.chain_anchor_gap(changes, chapter)
    assert gap["gap"] == pytest.approx(1 - 1 / 1.02) and gap["case"] == lesson.CHAIN_CASES[1][0]


def test_step_3s_chain_from_the_committed_run():
    """The page's chain table, read from the committed lab run: the rules hold, every request wrote step 1's
    tokens, and the run's file must exist (the page has no other source: a missing file is an error)."""
    changes = lesson.step03_chain_run()
    _check_chain(_chain_table(changes))
    chain = lesson.step03_chain(changes)
    assert all(r["same_tokens"] for r in chain)
    gap = lesson.chain_anchor_gap(changes, lesson.committed())
    assert 0 <= gap["gap"] < 0.10
    with pytest.raises(FileNotFoundError):
        lesson.step03_chain_run(gpu="no-such-gpu")


def test_the_jump_counts_count_two_ways():
    """Chapter 7's way (medians of forwards per token) and chapter 1's (sums, the baseline's EOS forwards left out)
    from hand-made rows."""
    names = ("classifier", "weather_call", "tool_call")
    counts = {"baseline": ((3, 4), (20, 21), (30, 31)), "jump_forward": ((3, 2), (20, 20), (30, 27)),
              "char_jump": ((3, 1), (20, 6), (30, 10))}
    rows = [{"series": c, "ms": 1.0, "tokens": t, "forwards": f,
             "params": {"model": "1b", "batch": 1, "schema": n, "config": c, "whitespace": "compact"}}
            for c, per in counts.items() for n, (t, f) in zip(names, per)]
    jc = lesson.jump_counts(Results("decode.json", {"measurements": rows}))
    assert jc["documents"] == 3 and jc["eos_forwards"] == 3
    assert jc["fwd_base"] == pytest.approx(21 / 20)
    assert jc["saved_token"] == pytest.approx(1 - (27 / 30) / (21 / 20))
    assert jc["ch1_saved_token"] == pytest.approx(1 - 49 / 53)
    assert (jc["passes_token"], jc["passes_base"]) == (49, 53)  # the sums chapter 01's page prints beside its share
    assert jc["ch1_saved_char"] == pytest.approx(1 - 17 / 53)
    assert lesson.jump_counts(Results("decode.json", {"measurements": rows[:3]})) is None


def test_the_breakdown_figure_draws_the_parts_without_the_body_and_names_only_parts_it_draws(earlier):
    """Beside the whole step, a panel a batch size leaves the body out, so the parts the chapters change are long
    enough to read; a part too short to see at every batch size is not drawn and not in the legend, and the caption
    names it with its largest value."""
    import matplotlib.pyplot as plt

    from book.decode import figures as decode_figures
    from book.decode.results import breakdown

    part = {"body": 1.0, "mask_wait": 0.0001, "head": 0.1, "mask_apply": 0.01, "sampling": 0.01, "host": 0.02,
            "wall": 1.1}
    panels = [{c: dict(part) for c in ("baseline", "masked_head")}]
    assert decode_figures.too_short(panels) == ["mask_wait"]
    assert "mask (host, not hidden), at most 0.1 µs" in decode_figures.hidden_parts(panels, ["mask_wait"])
    ax = decode_figures.plot_breakdown(panels[0], body=False, unit="µs", hide=["mask_wait"])
    colours = {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches}
    assert decode_figures.COLORS["body"] not in colours and decode_figures.COLORS["mask_wait"] not in colours
    assert not ax.collections  # no tick: the timed total holds the body
    plt.close(ax.figure)

    fig = decode_figures.breakdown_figure(earlier.rows, "1b", "caption")
    titles = [ax.get_title() for ax in fig.axes if ax.has_data()]
    assert titles[0].startswith("batch 1: the whole step") and all("without the body" in t for t in titles[1:])
    assert len(titles) == 1 + sum(bool(breakdown(earlier.rows, "1b", b)) for b in (1, 8))
    hidden = decode_figures.too_short([breakdown(earlier.rows, "1b", b) for b in (1, 8) if breakdown(earlier.rows, "1b", b)])
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert not [k for k in hidden if decode_figures.LABELS[k] in legend]
    assert all(decode_figures.LABELS[k] in legend for k in COMPONENTS if k not in hidden)
    plt.close(fig)


def test_the_breakdown_bars_put_3a_before_step_3():
    """Step 3's first change alone (3a) stands just before step 3, as the page lists step 3's changes, with its
    steps-table label; chapter 1's character-level jumps come last."""
    import matplotlib.pyplot as plt

    from book.decode import figures as decode_figures

    part = {"body": 1.0, "mask_wait": 0.0, "head": 0.1, "mask_apply": 0.0, "sampling": 0.01, "host": 0.01,
            "wall": 1.1}
    parts = {c: dict(part) for c in ("baseline", "jump_forward", "masked_head", "automaton_mask", "char_jump")}
    ax = decode_figures.plot_breakdown(parts)
    labels = [t.get_text() for t in ax.get_yticklabels()]  # top to bottom
    assert labels == ["step 1: the baseline loop", "step 2: jump forward", "3a: allowed sets precomputed",
                      "step 3: the masked head", "not a step: character-level jumps"]
    plt.close(ax.figure)


def test_the_page_names_no_result_files():
    """The prose says where a number comes from in words: no Markdown cell shows a results file's path; one short
    section near the end names the runs (card, what was run) and links How we measure, while the cells still read
    the committed runs themselves (the chapter's benchmark and the run of step 3's changes)."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "07_constrained_decoding.ipynb").read_text())["cells"]
    prose = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    text = ["".join(c["source"]) for c in cells]
    assert not [t for t in prose if "lab/decode" in t or ".json" in t or "assets/bench" in t]
    where = [t for t in text if t.startswith("## Where the numbers come from")]
    assert len(where) == 1 and "how_we_measure" in where[0] and "H200" in where[0]
    assert not any("computed when the page is built" in t for t in text)  # no boilerplate line
    code = "\n".join(t for c, t in zip(cells, text) if c["cell_type"] == "code")
    assert "lesson.committed()" in code and "lesson.step03_chain_run()" in code


def test_the_answer_leads_with_the_real_model_and_the_8b_run_is_the_8b_cost_model_everywhere():
    """The page's answer is the real model's ratio; the 8B-shaped run, random weights and steered output, is "the 8B
    cost model" everywhere (prose, tables, figures), given after the real model as measured (on synthetic weights),
    never as a "forecast" (the word is kept for the Amdahl bounds); the answer names step 1 as a dense-head loop like
    vLLM's; no "headline" or "8B shape" is left on the page; 3a's result is said once a model: SmolLM2's from the steps
    table's run, the cost models' from the chain's (their steps table, folded, has no 3a row)."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "07_constrained_decoding.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    first = next(t for t in text if "**The answer**" in t)
    words = " ".join(first.split())
    assert "steered" in first and "random weights" in words and "eight[3]['x_previous']" in first
    assert "the 8B cost model" in words and "(run 1)" in words  # the 8B head's one number, its run said
    for gone in ("main run", "fresh H200", "both runs", "runs disagree"):  # run 1 and run 2, said plainly
        assert gone not in "\n".join(text), gone
    answer = words[words.index("**The answer**"):]  # the Amdahl forecasts come before it, in the same cell
    assert "forecast" not in answer and "a dense-head loop like vLLM's" in answer
    page = "\n".join(text)
    assert "real deployments" not in page and "how much faster does" not in text[0]
    for gone in ("headline", "8B shape", "8B-shaped cost model", "1B shape"):
        assert gone not in page, gone
    # 3a: a section of its own between step 2 and step 3, its diff its own; its SmolLM2 ratios are the answer's and
    # the steps table's (not repeated), the cost models' the chain's
    three_a = next(t for t in text if t.startswith("## 3a"))
    assert text.index(three_a) < text.index(next(t for t in text if t.startswith("## Step 3")))
    said = " ".join(text[text.index(three_a) + 1].split())
    assert "rr['main']['x_3a']" not in said and "pays in run 1 and ties in run 2 (the steps table)" in said
    assert 'lesson.step_code("3a")' in said and "host work, no chapter's" in said
    assert "the base step 3 is measured against" in three_a  # 3a's role, in its heading
    assert "in the chain's run" in said and "a['x_previous']" not in said  # the chain's numbers: its table only
    assert "sa[" not in page and "with_3a=True" in page  # the open steps table's 8B column has 3a (the main run)
    assert 'lesson.steps_table(shown, "1b", 1, with_3a=False)' in page and "lesson.steps_runs_table(shown, second)" in page
    # the tables and figures name the cost models as the prose does
    shown = lesson.committed() or lesson.earlier_run()
    assert all(r["case"].startswith(("SmolLM2", "1B cost model", "8B cost model (synthetic weights)"))
               for r in lesson.result_rows(shown))
    assert [label for label, _, _ in lesson.CHAIN_CASES] == ["1B cost model", "8B cost model"]
    assert list(lesson.public_shapes()) == ["1B cost model (Llama 3.2 1B's shape, cl100k head)",
                                            "8B cost model (Llama 3.1 8B's shape, cl100k head)"]


def _page_cells() -> list[str]:
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "07_constrained_decoding.ipynb").read_text())["cells"]
    return ["".join(c["source"]) for c in cells]


def test_forwards_saved_are_counted_one_way_and_the_headline_defines_its_cost_model():
    """Forwards saved: per output token everywhere, first given at step 2, which links to chapter 01's table of what
    each count of forced tokens counts (chapter 01's, the cost models', SmolLM2's: passes, tokens or forwards, the pass
    on EOS included or not) and why SmolLM2's answers force more, instead of repeating it; the models section's first
    sentence says what the cost models are (measured, random weights, one layer read by all the 8B's layers)."""
    text = _page_cells()
    page = "\n".join(text)
    assert "ch1_saved" not in page and "jump_counts" not in page and "fsm_suite" not in page
    assert "This page counts forwards per output token" not in page
    saved = next(t for t in text if "{n['dec_fwd_saved']}** of their forwards" in t)
    words = " ".join(saved.split())
    assert "lesson.forced_table(" not in page and "01_fsm_compression.ipynb#the-steps-measured" in words
    assert "real2[0]['forwards']" in words and "real2[1]['forwards']" in words  # the one count this page measures
    assert "real2[1]['us']" in saved  # step 2's section, not before the first step
    at = text.index("## The models\n")
    first = " ".join(text[at + 1].split())
    assert first.startswith('say(f""" **Two cost models**') and "measured runs on synthetic weights" in first
    assert "one layer's weights read by all" in first and 'model_config("8b").layers' in first
    assert not any("**The 8B cost model is synthetic**" in t for t in text)


def test_step3_over_step2_says_why_it_passes_the_heads_bound_where_it_first_appears():
    """Step 3's 1.23× over step 2 passes the 1.21× that chapter 02's head alone can buy at the 1B shape: the
    reason, the host's own work that the bound holds fixed and step 3 cuts, is given with its numbers in the
    sentence that first prints the ratio, read from the same breakdown as the result section's."""
    import json

    from studylog import paths

    shown = lesson.committed() or lesson.earlier_run()
    past = lesson.step03_past_head_bound(shown, "1b", 1)
    assert past is not None
    assert past["ratio"] == pytest.approx(lesson.steps_rows(shown, "1b", 1)[2]["x_previous"])
    share = lesson.model_config("1b").head_share()
    assert past["bound"] == pytest.approx(1 / (1 - share))
    assert f"{past['bound']:.2f}×" == lesson.prose_numbers(lesson.committed(), lesson.earlier_run())["dec_head_bound_1b"]
    assert past["ratio"] > past["bound"] and past["host_step3_us"] < past["host_step2_us"]
    # the host's own work in step 3 is the one the result section's sentence reads
    assert past["host_step3_us"] == pytest.approx(lesson.bound_excess(shown, "1b", 1)["host_step3_us"])
    cells = json.loads((paths.REPO_ROOT / "notebooks" / "07_constrained_decoding.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    # the page gives the 1B cost model's steps in a fold only; why it passes a forecast is said once, in the
    # result's forecasts fold (the host's own work, step 1 to step 3)
    assert not any("{s3['x_previous']:.2f}×" in t for t in text)
    lands = next(t for t in text if "exc = lesson.bound_excess" in t)
    assert "pass{'es' if len(above) == 1 else ''}" in lands


def test_the_eager_head_says_step_13_was_not_tried_and_each_configuration_has_one_time_in_the_open_text():
    """Where we lose says plainly that chapter 02's graph-replayed step 13 was not tried in this loop and what it
    would take. Step 3's chain, a run of its own, gives only its ratios in the open text; its times (step 2's and
    step 3's a little off the steps table's) sit in a fold; the cost models' figures draw no 3a bar, and the real
    model's draws its 3a bar at its steps table's time (the same run). What a bar's end less its tick is, and the run, are said under
    "Where the numbers come from", not inside the figures."""
    import matplotlib.pyplot as plt
    from matplotlib.text import Annotation, Text

    from book.decode import figures as decode_figures

    text = _page_cells()
    page = " ".join("\n".join(text).split())
    assert "step 13 is not used: it starts from a packed bitmask" in page
    assert "as 3a does" in page and "graph_bound['smollm2']" in page  # what a graph could buy, at most
    assert "The 3a bars" not in page and "chain_note" not in page
    # the chain is printed once, in the open, with its times (a run of its own, its gap to the steps table said)
    chain = [t for t in text if "chain_table(lesson.step03_chain_rows(changes)" in t]
    assert len(chain) == 1 and ":::{{dropdown}}" not in chain[0] and "gap_words(" in chain[0]
    assert "step03_chain_ratio_table" not in page
    where = text.index(next(t for t in text if t.startswith("## Where the numbers come from")))
    assert any("draw_figure_notes(shown)" in t for t in text[where:])
    assert any("lesson.host_table(shown)" in t for t in text[where:])
    shown = lesson.committed()
    figs = decode_figures.figures(shown)
    real = lesson.real_steps_rows_3a(shown, 1)
    for name, fig in figs.items():
        words = " ".join(t.get_text() for t in fig.findobj(Text))
        assert "Measured on" not in words and "Bar end" not in words, name
        assert ("3a" in words) == (name == "breakdown_smollm2"), name
        # the totals beside the bars carry their unit, so that none reads as a ratio
        totals = [t.get_text() for t in fig.findobj(Annotation)]
        assert all(t.endswith((" ms", " µs")) for t in totals) and (totals or not name.startswith("breakdown")), name
        plt.close(fig)
    from book.decode.results import breakdown

    bars = breakdown(shown.rows, "smollm2", 1, kind=None)  # the real model's figure: its steps table's times
    assert [bars[c]["wall"] * 1e3 for c in ("baseline", "jump_forward", "automaton_mask", "masked_head")] == \
        pytest.approx([r["us"] for r in real])
    assert "Measured on" in decode_figures.figure_notes(shown)


def test_the_page_gives_one_host_work_pair_for_steps_1_to_3():
    """The host's own work appears once on the page, from the steps table's run (the chapter's benchmark, one
    breakdown): the result's forecasts fold names step 1's and step 3's for the 1B cost model, which passes its
    forecast. The chain's run (a run of its own) gives no host-work pair of its own, and step 3's section none."""
    text = _page_cells()
    page = "\n".join(text)
    assert "host_us" not in page  # the chain's own host-work numbers are not on the page
    assert "past['host_step2_us']" not in page and "past['host_step3_us']" not in page
    lands = next(t for t in text if "exc = lesson.bound_excess" in t)
    assert "step 1's {exc['host_step1_us']:.0f} µs a token, falls to step 3's {exc['host_step3_us']:.0f}" in lands
    assert "host_step2_us" not in lands
    # the numbers read one breakdown: at the 1B shape step 3's host work is the same either way it is read
    shown = lesson.committed() or lesson.earlier_run()
    past, exc = lesson.step03_past_head_bound(shown, "1b", 1), lesson.bound_excess(shown, "1b", 1)
    assert f"{past['host_step3_us']:.0f}" == f"{exc['host_step3_us']:.0f}"
    parts = decode_results.breakdown(shown.rows, "1b", 1)
    assert past["host_step2_us"] == pytest.approx(parts["jump_forward"]["host"] * 1e3)
    assert exc["host_step1_us"] == pytest.approx(parts["baseline"]["host"] * 1e3)


def test_time_per_output_token_includes_the_prefill_and_the_range_names_its_top():
    """Where the page first gives a time per output token it says the prompt's prefill is in it; the headline's
    per-schema range names the schema at its top with its output tokens and forwards, read from the rows."""
    text = _page_cells()
    first = next(t for t in text if "per output token" in t and "real[0]['us']" in t)
    assert not any("µs** per output token" in t for t in text[:text.index(first)])
    assert "prefill included" in " ".join(first.split())
    headline = next(t for t in text if "The 8B cost model's medians are over" in t)
    assert 'lesson.range_top(shown, "8b", 1)' in headline
    for key in ("schema", "tokens", "forwards_step1", "forwards_step3"):
        assert f"top['{key}']" in headline
    # hand-made rows: the top is the largest ratio, with step 1's tokens and both steps' forwards
    names = ("classifier", "weather_call", "tool_call")
    times = {"baseline": (6.0, 4.8, 4.6), "masked_head": (3.0, 4.3, 4.0)}
    forwards = {"baseline": (4, 21, 34), "masked_head": (2, 20, 31)}
    rows = [{"series": c, "ms": t, "tokens": f - 1, "forwards": f,
             "params": {"model": "8b", "batch": 1, "schema": n, "config": c, "whitespace": "compact"}}
            for c in times for n, t, f in zip(names, times[c], forwards[c])]
    top = lesson.range_top(Results("decode.json", {"measurements": rows}), "8b", 1)
    assert top == {"schema": "classifier", "ratio": pytest.approx(2.0), "tokens": 3, "forwards_step1": 4,
                   "forwards_step3": 2}
    assert lesson.range_top(Results("decode.json", {"measurements": rows[:3]}), "8b", 1) is None
    # on the committed run the top is the result table's "most"
    shown = lesson.committed() or lesson.earlier_run()
    case = {(r["model"], r["batch"]): r for r in lesson.result_rows(shown)}[("8b", 1)]
    assert lesson.range_top(shown, "8b", 1)["ratio"] == pytest.approx(case["fastest"])


def test_one_steps_table_a_model_smollm2_one_number_a_step_both_runs_folded_then_the_8b_and_the_1b_folded():
    """One steps table a model. SmolLM2's, in the open: its steps (3a its own row), run 1's times, one "× previous" a
    step by the page's one rule (:func:`lesson.real_verdict`: the head's from the interleaved run, labelled so, each
    other step's from the whole runs, run 2's word beside run 1's only where they disagree) and the time over the
    forward-time bound (the scoreboard's bound for this loop); its first and last times are the result table's step 1
    and step 3. Both whole runs, each "× previous" the ratio of its own column's times, and the drift between them sit
    in a fold under it. The 8B cost model's steps (3a its own row, "× floor") in a table of their own, in the open; the
    1B cost model's in a fold (step 3 over step 2: 3a on the cost models is the chain's)."""
    results, second = lesson.committed(), lesson.second_run()
    cell = next(t for t in _page_cells() if "lesson.steps_runs_table(shown, second)" in t)
    assert cell.index("lesson.steps_runs_table(shown, second)") < cell.index(":::{{dropdown}} Both whole runs") < \
        cell.index("**Run-to-run drift.**") < cell.index("lesson.steps_both_runs_table(shown, second)")
    eight_cell = next(t for t in _page_cells() if 'lesson.steps_table(shown, "8b", 1, with_3a=True)' in t)
    at = eight_cell.index('lesson.steps_table(shown, "8b", 1, with_3a=True)')  # in the open, then the 1B folded
    assert "8B cost model" in eight_cell[:at] and ":::{{dropdown}}" not in eight_cell[:at]
    assert at < eight_cell.index(":::{{dropdown}} The 1B cost model's steps") < eight_cell.index(
        'lesson.steps_table(shown, "1b", 1, with_3a=False)')
    table = lesson.steps_runs_table(results, second)
    head = [c.strip() for c in table.splitlines()[0].split("|")[1:-1]]
    assert head == ["step", "the one change", "SmolLM2-135M (13 requests): µs per token, run 1", "× previous",
                    "× forward-time bound"]
    rows = _table_rows(table)
    assert [r[0] for r in rows] == ["step 1: the baseline loop", "step 2: jump forward", "3a: allowed sets precomputed",
                                    "step 3: the masked head"]
    assert "host work" in rows[2][1] and "(3b, 3c)" in rows[3][1]
    assert "the base step 3 is measured against" in rows[2][1]  # 3a's role in the chain
    real, real2 = lesson.real_steps_rows_3a(results, 1), lesson.real_steps_rows_3a(second, 1)
    assert [r[2] for r in rows] == [f"{x['us']:,.0f}" for x in real]
    # one number a step: the jumps pay in both runs (run 1's ratio); 3a pays in run 1 only (both said); the head's
    # from the interleaved run (lab/decode/head_interleaved.py), which whole runs' drift sent for
    hi = lesson.head_interleaved(1)
    assert hi is not None and hi["rounds"] >= 10 and hi["same_tokens"]
    assert rows[0][3] == "–" and rows[1][3] == f"{real[1]['x_previous']:.2f}×"
    assert rows[2][3] == f"{real[2]['x_previous']:.2f}× in run 1, a tie in run 2"
    assert rows[3][3] == f"{hi['x']:.2f}×, interleaved rounds ({hi['least']:.2f}–{hi['most']:.2f}×)"
    for r, x, x2 in zip(rows, real, real2):  # each cell is the one rule's, the page's answer's for the head
        v = lesson.real_verdict(x["x_previous"], x2["x_previous"], hi if r is rows[-1] else None)
        assert r[3] == ("–" if v is None else v["cell"])
    body = lesson.real_body(results)["us"]
    assert [r[4] for r in rows] == [f"{x['us'] / (x['forwards'] * body):.2f}×" for x in real]
    from book import scoreboard as sb

    entry = next(e for e in sb.ENTRIES if e.number == 7)
    smol = next(r for r in sb.entry_rows(entry) if "missing" not in r and r.get("real_model")
                and sb.short_card(r["card"]) == "H200")
    assert smol["binding_floor_ms"] * 1e3 * float(rows[3][4].rstrip("×")) == pytest.approx(real[3]["us"], rel=0.005)
    # the fold: both whole runs, each "× previous" the ratio of its own column's times, what the two say together
    both = lesson.steps_both_runs_table(results, second)
    head = [c.strip() for c in both.splitlines()[0].split("|")[1:-1]]
    assert head == ["step", "run 1: µs per token", "× previous", "run 2: µs per token", "× previous",
                    "the two runs together"]
    folded = _table_rows(both)
    assert [r[1] for r in folded] == [f"{x['us']:,.0f}" for x in real]
    assert [r[3] for r in folded] == [f"{x['us']:,.0f}" for x in real2]
    assert [r[5] for r in folded] == ["–", "pays", "pays in run 1, a tie in run 2", "a tie in run 1, pays in run 2"]
    for col in (1, 3):  # each "× previous" is the ratio of its own column's times, as printed (to rounding)
        us = [float(r[col].replace(",", "")) for r in folded]
        assert folded[0][col + 1] == "–"
        for r, before, after in zip(folded[1:], us, us[1:]):
            assert float(r[col + 1].split("×")[0]) == pytest.approx(before / after, abs=0.006)
            assert r[col + 1].endswith("(tie)") == is_tie(float(r[col + 1].split("×")[0]))
    # the drift, from the two runs' rows: every step slower in the main run, by the range the page prints
    drift = lesson.run_drift(results, second)
    times = [a["us"] / b["us"] - 1 for a, b in zip(real, real2)]
    assert drift["time"] == pytest.approx((min(times), max(times))) and drift["time"][0] > 0
    assert 0.05 < drift["ratio"] < 0.15
    # the 8B table: its own ratios, 3a its own row
    eight = _table_rows(lesson.steps_table(results, "8b", 1, with_3a=True))
    assert [r[0] for r in eight] == [r[0] for r in rows]
    us = [float(r[2].replace(",", "")) for r in eight]
    for r, before, after in zip(eight[1:], us, us[1:]):
        assert float(r[3].split("×")[0]) == pytest.approx(before / after, abs=0.006)


    case = {(r["model"], r["batch"]): r for r in lesson.result_rows(results)}[("smollm2", 1)]
    assert real[0]["us"] == pytest.approx(case["step1_us"]) and real[-1]["us"] == pytest.approx(case["step3_us"])
    # the jumps save forwards on the real model: the step 2 section explains its ratio with these counts
    assert real[1]["forwards"] < real[0]["forwards"]
    step2 = next(t for t in _page_cells() if "{n['dec_fwd_saved']}** of their forwards" in t)
    assert "real2[1]['x_previous']" in step2 and "real2[0]['forwards']" in step2 and "real2[1]['forwards']" in step2
    assert "rr['second']['jumps']" in step2 and "in run 2" in step2  # run 2's ratio beside run 1's
    words = " ".join(step2.split())
    assert "fewer by the requests' medians" in words and "{rf['saved'] / rf['forwards_step1']:.0%} of their forwards pooled" in words
    # the 1B fold: no 3a row (3a on the cost models is the chain's), step 3 over step 2, its ratios its own times'
    folded = _table_rows(lesson.steps_table(results, "1b", 1, with_3a=False))
    assert [r[0] for r in folded] == ["step 1: the baseline loop", "step 2: jump forward", "step 3: the masked head"]
    us = [float(r[2].replace(",", "")) for r in folded]
    for r, before, after in zip(folded[1:], us, us[1:]):
        assert float(r[3].split("×")[0]) == pytest.approx(before / after, abs=0.006)


def test_two_runs_verdicts_from_hand_made_ratios():
    """What two runs' ratios say together: both past the tie band on one side, both ties, or they disagree."""
    assert lesson.runs_verdict(1.13, 1.17) == "pays" and lesson.runs_verdict(0.90, 0.95) == "loses"
    assert lesson.runs_verdict(1.02, 0.98) == "tie"
    assert lesson.runs_verdict(1.10, 1.02) == "runs disagree" and lesson.runs_verdict(1.05, 0.95) == "runs disagree"
    assert lesson.runs_verdict(None, 1.2) == "–"


def test_one_rule_for_the_head_on_smollm2_from_hand_made_ratios():
    """:func:`lesson.real_verdict`, the one rule every page uses for a step on SmolLM2: an interleaved run decides
    where it is given, whatever the whole runs say; without one, two runs by :func:`lesson.runs_verdict` (both said
    where they disagree), one run by the tie rule."""
    inter = {"x": 1.07, "least": 1.01, "most": 1.14}
    v = lesson.real_verdict(0.97, 1.05, inter)
    assert (v["x"], v["word"], v["source"]) == (1.07, "pays", "interleaved") and v["cell"].startswith("1.07×, interleaved")
    assert lesson.real_verdict(1.10, 1.12, {"x": 1.01, "least": 0.98, "most": 1.04})["word"] == "tie"  # runs agree
    assert lesson.real_verdict(None, None, inter)["x"] == 1.07  # the interleaved run alone
    v = lesson.real_verdict(1.10, 1.02)
    assert (v["word"], v["source"], v["cell"]) == ("runs disagree", "two runs", "1.10× in run 1, a tie in run 2")
    assert lesson.real_verdict(1.13, 1.17)["cell"] == "1.13×" and lesson.real_verdict(1.13, 1.17)["word"] == "pays"
    assert lesson.real_verdict(0.98)["word"] == "tie" and lesson.real_verdict(0.98)["source"] == "one run"
    assert lesson.real_verdict(None) is None


def test_the_four_places_that_quote_the_head_on_smollm2_call_the_one_rule():
    """Chapter 02's head on SmolLM2 is decided in one place, :func:`lesson.real_verdict`: chapter 07's steps table,
    the results page's split in words and its step payoffs, and chapter 02's opening all call it, and none of them
    reads the interleaved ratio or the two runs' verdict on its own."""
    import inspect
    import json

    from book import results
    from studylog import paths

    for fn in (lesson.steps_runs_table, results.decode_split_words, results.step_payoffs):
        code = inspect.getsource(fn)
        assert "real_verdict(" in code and "runs_verdict(" not in code and 'inter["x"]' not in code, fn.__name__
    nb = json.loads((paths.REPO_ROOT / "notebooks" / "02_masked_lm_head.ipynb").read_text())
    cell = next("".join(c["source"]) for c in nb["cells"] if "decode_split(" in "".join(c["source"]))
    assert "real_verdict(" in cell and 'inter["x"]' not in cell and "inter = " not in cell


def test_the_result_leads_with_the_outside_engine_on_the_same_requests_and_says_where_we_lose():
    """The result section opens with our end-to-end number against Hugging Face ``generate`` with xgrammar's logits
    processor (:func:`lesson.peer_numbers`: the same requests, GPU and wall clock), how much of the gap is the body's
    replay rather than the chapters (step 1's own ratio), how many requests wrote step 1's tokens, and where we lose to
    it (a new grammar's compile, ours against xgrammar's); no fold holds it any more."""
    text = _page_cells()
    heading = text.index("## The result, against Hugging Face `generate` and the baseline loop")
    result = text[heading + 1]
    at = result.index("**Against Hugging Face")
    assert at < result.index("The table sets step 3") < result.index("say(lesson.result_table(shown))")
    lead = result[at:result.index("The table sets step 3")]
    for key in ("peer['requests']", "peer['step3_ms']", "peer['hf_ms']", "peer['hf_over_step3']", "peer['same']",
                "peer['hf_over_step1']", "setup['automaton_ms']", "setup['xgrammar_ms']", "Where we lose to it"):
        assert key in lead, key
    assert ":::{{dropdown}} Hugging Face" not in "\n".join(text)
    peer = lesson.peer_numbers(lesson.committed())
    assert peer["hf_over_step3"] > peer["hf_over_step1"] > 1 and 0 < peer["same"] <= peer["requests"]


def test_the_result_says_a_jump_is_not_free_before_the_forecasts_and_the_opening_says_which_number_to_take():
    """The result gives the plain point (a jumped token is not a free forward) before the forecasts; the opening
    answers first, in a few short sentences, what the two chapters buy (SmolLM2's jumps; the head there by the page's
    one rule, :func:`lesson.real_verdict`, the interleaved run's; the head on the 8B cost model); the qualifications
    follow (run 2's jumps, the drift that sent the head to interleaved rounds), then 3a, host work and neither
    chapter's, its ratio in the same sentence as its condition (a grammar compiled once and reused: the compile
    against a request's decode, from the data), and it ends on one recommendation the data supports: the jumps,
    3a where a grammar is reused, step 3 where the head's bytes are a real share of the step (the 8B cost model's
    measured gain); nothing is shipped "on a synthetic result"."""
    text = _page_cells()
    result = next(t for t in text if "say(lesson.result_table(shown))" in t)
    assert result.index("**A jumped token is not a free forward.**") < result.index("sits between two forecasts")
    assert not any("**A jump is not a free forward.**" in t for t in text)
    opening = " ".join(next(t for t in text if "**The answer**" in t).split())
    assert "(3a: host work, no chapter's)" in opening and "so the head was timed interleaved with 3a" in opening
    assert "{head['x']:.2f}" in opening and "buys nothing the totals can measure there" not in opening
    assert 'lesson.real_verdict(r3a[3]["x_previous"], rr["second"]["head"], hi[1])' in opening  # the table's rule
    # the answer (SmolLM2's jumps, the head there and on the 8B cost model), then the qualifications (run 2, the
    # drift), the cached sets (host work), 3a's ratio and its condition, then the advice
    said = opening[opening.index("**The answer**"):]
    order = ["{rr['main']['jumps']", "{head['x']", "{eight[3]['x_previous']", "{rr['second']['jumps']",
             "{drift['time'][0]", "{saving:.0%}", "{rr['main']['x_3a']", "{rr['second']['x_3a']",
             "{setup['automaton_ms']", "{setup['decode_ms']", "**Use chapter 01's exact jumps"]
    lead = said[:said.index("{rr['second']['jumps']")]  # the answer itself: three short sentences
    assert lead.count(". ") <= 3 and "drift" not in lead and "3a" not in lead
    assert [said.index(k) for k in order] == sorted(said.index(k) for k in order)
    assert "lesson.real_parts_without_body(shown)" in opening and "lesson.grammar_setup(shown)" in opening
    sentence = said[said.index("{rr['second']['x_3a']"):said.index("**Use chapter 01's exact jumps")]
    assert "compiled once and reused" in sentence and "{setup['decode_ms']" in sentence
    advice = opening[opening.index("**Use chapter 01's exact jumps"):]
    assert "chapter 02's head where its bytes are a real share of the step" in " ".join(advice.split())
    # one number a thing: no step-3-over-step-1 ratio and no head range in the answer
    assert "r3a[0]['us'] / r3a[2]['us']" not in said and "x2_3bc" not in said and 'cases[("8b", 1)]' not in said
    for gone in ("We ship step 3", "synthetic result", "The fastest loop on SmolLM2", "does not pay on the real model"):
        assert gone not in opening, gone
    # the second run really does order 3a and step 3 the other way on SmolLM2: the head's effect is noise there
    hr = lesson.real_head_runs(lesson.committed())
    assert (hr["us_3"] > hr["us_3a"]) != (hr["us2_3"] > hr["us2_3a"])
    rr = lesson.real_runs_ranges(lesson.committed(), lesson.second_run())
    assert rr["head"][0] < 1 < rr["head"][1]  # the head on SmolLM2: the two runs disagree in sign
    assert rr["jumps"][0] > 1.03 and rr["both"][0] > 1.03  # what survives both runs: the jumps, and step 3 over step 2
    assert rr["x_3a"][1] > 1.03 and is_tie(rr["second"]["x_3a"])  # 3a: pays in the main run, a tie in the second
    drift = " ".join(next(t for t in text if "rr['main']['both']" in t).split())  # the steps' run-to-run drift
    assert "lesson.run_drift(shown, second)" in "\n".join(text) and "**Run-to-run drift.**" in drift
    assert "rr['second']['both']" in drift and "longer in run 1 than in run 2" in drift
    assert "only their sum is resolved" not in drift and "{head}" not in drift
    lo, hi = hr["bar_tick"]
    assert lo < 0 < hi and abs(hr["us_3"] - hr["us_3a"]) < max(-lo, hi)
    # the figure's parts without the body: the head's saving, said beside the totals that cannot resolve it
    no_body = lesson.real_parts_without_body(lesson.committed())
    assert f"{no_body['automaton_mask']:.0f}" == "112" and f"{no_body['masked_head']:.0f}" == "63"
    fig = next(t for t in text if "lesson.steps_runs_table(shown, second)" in t)
    assert "{no_body['automaton_mask']:.0f}" in fig and "about {saving:.0%} of a step" in fig
    # the answer gives the interleaved ratio as the head's, and why: whole runs drift more than the head saves
    answer = " ".join(next(t for t in text if "**The answer**" in t).split())
    assert "chapter 02's head **{head['x']:.2f}×** on top" in answer
    assert "more than the head's ~{saving:.0%} of a step, so the head was timed interleaved with 3a" in answer
    # the interleaved run resolves what the two whole runs split on: the head pays at batch 1, every round above 1
    h = lesson.head_interleaved(1)
    assert h["x"] > 1.03 and h["least"] > 1 and not is_tie(h["x"])


def test_where_we_lose_puts_numbers_on_the_character_level_jumps():
    """The figures' greyed bar (chapter 01's character-level jumps) is faster than step 3: 'Where we lose' gives its
    ratio from :func:`lesson.char_jump_numbers` (the figures' timed totals), its cost (the real model's requests that
    wrote step 1's tokens) and its one-row table; the result section no longer carries them."""
    shown = lesson.committed() or lesson.earlier_run()
    cj = lesson.char_jump_numbers(shown)
    assert cj is not None and cj["8b"]["x_step3"] > 1 and cj["8b"]["x_step1"] > cj["8b"]["x_step3"]
    assert cj["smollm2"]["requests"] == 9 and 0 <= cj["smollm2"]["same"] <= 9
    text = _page_cells()
    assert any("lesson.char_jump_numbers(shown)" in t for t in text)
    result = next(t for t in text if "say(lesson.result_table(shown))" in t)
    assert "cj[" not in result and "char_jump_table" not in result
    lose = next(t for t in text if "The parts no chapter touches" in t)
    assert "cj['8b']['x_step3']" in lose and "cj['smollm2']['same']" in lose and "lesson.char_jump_table(shown)" in lose


def test_the_character_level_jumps_get_a_table_of_their_own():
    """The result is titled against the one outside engine measured and the baseline loop. Its table has short headers
    (what they mean is said under it); chapter 01's character-level jumps, marked not exact, get a one-row table of
    their own at the 8B cost model's case (under Where we lose), with the ratios the prose quotes from
    :func:`lesson.char_jump_numbers`; the result's opening gives the real model's ratio before the cost model's."""
    shown = lesson.committed() or lesson.earlier_run()
    text = _page_cells()
    assert "## The result, against Hugging Face `generate` and the baseline loop" in text
    assert not any("against the peers" in t for t in text)
    cj, case = lesson.char_jump_numbers(shown), lesson.char_jump_case(shown, "8b", 1)
    assert case["ratio"] == pytest.approx(cj["8b"]["x_step1"], rel=0.01)
    assert case["x_step3"] == pytest.approx(cj["8b"]["x_step3"], rel=0.01)
    main = lesson.result_table(shown)
    head = [c.strip() for c in main.splitlines()[0].split("|")[1:-1]]
    assert head == ["case", "batch", "requests", "step 1, µs", "step 3, µs", "step 1 / step 3", "per request",
                    "Amdahl forecast"]
    assert len(_table_rows(main)) == len(lesson.result_rows(shown)) and "jumps" not in main
    jumps = lesson.char_jump_table(shown)
    assert "not exact" in jumps.splitlines()[0]
    (row,) = _table_rows(jumps)
    assert row[1] == "1" and row[4] == f"{case['step3_us']:,.0f}"
    assert row[-2:] == [f"{case['ratio']:.2f}×", f"**{case['x_step3']:.2f}×**"]
    result = next(t for t in text if "say(lesson.result_table(shown))" in t)
    assert "*Per request*" in result
    assert any("lesson.char_jump_table(shown)" in t and "The parts no chapter touches" in t for t in text)
    opening = next(t for t in text if "At batch 1 it runs {real1['ratio']:.2f}× step 1" in t)
    assert opening.index("{real1['ratio']") < opening.index("{b8['ratio']")
    # step 3 on SmolLM2 beside the second run's ratio (the page's two runs)
    assert "({rr['second']['step3']:.2f}× in run 2)" in opening


def test_the_opening_says_once_why_the_loop_keeps_exact_jumps_and_the_answer_carries_the_caveat():
    """Chapter 01 recommends llguidance's fast-forward tokens; this loop keeps exact jumps. The opening (the cell right
    after the title's) says so once, in the open: why (each output is step 1's for any model, so a speedup is the same
    output sooner), pointing to Where we lose, which gives what llguidance's policy saves by chapter 01's committed
    forward counts (counted there, not timed here). The answer carries the caveat, exact output only, with no ratio of
    its own: before the first step the page gives only the answer and the Amdahl bounds."""
    text = _page_cells()
    opening = text[1]
    words = " ".join(opening.split())
    assert "keeps exact jumps, by design" in words and "for any model, checked token for token" in words
    assert "*Where we lose*" in words and "fsm_peers" not in opening  # the counts: under Where we lose
    assert ":::{{dropdown}}" not in opening
    lose = next(t for t in text if "The parts no chapter touches" in t)
    assert 'fsm_peers(whitespace="compact")' in lose and "counted there, not timed here" in " ".join(lose.split())
    answer = next(t for t in text if "**The answer**" in t)
    tail = " ".join(answer[answer.index("**The answer**"):].split())
    assert "exact output only" in tail and "cj[" not in tail and "*Where we lose*" in tail
    assert sum(" ".join(t.split()).count("keeps exact jumps") for t in text) == 1


def test_the_kernel_exercise_keeps_the_sweeps_recorded_answer_off_the_page():
    """Exercise 5's timing needs a GPU; the answer the committed tile sweep gives (two rows a program against sixteen
    on the 1B shape's four products, on an H100) is in the solutions module, which the page does not import; the
    page shows no measured answer and no H100 sweep."""
    answer = lesson.gemv_tile_answer()
    assert answer is not None and [r["weight"] for r in answer["rows"]] == ["q/k/v", "o", "gate/up", "down"]
    assert all(r["rows"] == 2 and r["programs"] == 8 * r["programs16"] for r in answer["rows"])
    assert all(r["us"] < r["us16"] for r in answer["rows"])  # the fold says two rows win on every weight
    assert lesson.gemv_tile_answer(gpu="no-such-gpu") is None
    text = _page_cells()
    page = "\n".join(text)
    assert "gemv_tile_answer" not in page and "measured answer" not in page and "H100" not in page
    assert "solutions" not in "\n".join(t for t in text if t.startswith(("import", "from", "warnings")))
    assert "import book.decode.solutions" not in page and "from book.decode import solutions" not in page
    from book.decode import solutions

    words = solutions.gemv_tile_measured()
    assert "Two rows win on every weight" in words and answer["gpu"] in words
    assert all(f"two rows {r['us']:.1f}, sixteen {r['us16']:.1f}" in words for r in answer["rows"])


def test_step_3c_says_what_sampling_needs_and_the_real_models_forecasts_sit_in_one_sentence():
    """3c's pick among the allowed ids is greedy decoding's: the page says what sampling would need. The only
    forecasts in view are Why it matters' Amdahl bounds: step 2 gives none (the chunk-length one is in the result's
    forecasts fold), step 3 folds why the 1B cost model passes the head's; the real model's measured ratio and its
    two forecasts (Amdahl's, chunk-length's) are tied together in one sentence in the forecasts' fold, each read from
    the results: why the Amdahl forecast sits far above. Step 2's comparison with the cost models' forwards is folded."""
    text = _page_cells()
    three_c = " ".join(next(t for t in text if "The sampler picks the greedy token" in t).split())  # 3c's section
    assert "Decoding here is greedy" in three_c and "Gumbel noise" in three_c and "top-k or top-p" in three_c
    step2 = next(t for t in text if "real2[1]['x_previous']" in t)
    at = step2.index(":::{{dropdown}}")
    assert "n['dec_real_forecast_b1']" not in step2 and "forecast" not in step2[:at]
    assert "n['dec_fwd_bound']" in step2[at:]
    step3 = next(t for t in text if "rr['main']['both']" in t)
    assert "forecast" not in step3
    opening = next(t for t in text if "**The answer**" in t)
    assert "forecast" not in opening[opening.index("**The answer**"):]
    assert "forecast" not in step2[at:].replace("forecasts **", "")
    result = next(t for t in text if "say(lesson.result_table(shown))" in t)
    at = result.index("The forecasts: the table's last column")
    shown, fold = result[:at], result[at:]
    assert "sits between two forecasts" not in shown and "forecast" not in shown[:shown.index("result_table")]
    tied = next(p for p in fold.split("\n\n") if "sits between two forecasts" in p)
    assert "counts a jumped forward as free" in " ".join(tied.split())
    for key in ("real1['ratio']", "real1['bound']", "n['dec_real_forecast_b1']"):
        assert key in tied, key
    assert result.count("sits between two forecasts") == 1


def test_the_reader_meets_the_answers_path_and_no_dangling_lead_in_or_library_names():
    """The exercises name their answers' file in the course's one form; "Where the numbers come from" opens with a
    sentence, not a colon before a fold; the step 3 prose names no library variables (the sampler's steering)."""
    text = _page_cells()
    page = "\n".join(text)
    assert "answers:\n`book/decode/solutions.py`" in page or "answers: `book/decode/solutions.py`" in page
    where = next(t for t in text if t.startswith("## Where the numbers come from"))
    assert "describes:" not in where and where.split("\n\n")[1].rstrip().endswith(".")
    prose = [t for t in text if not t.lstrip().startswith(("def ", "from ", "import ", "step", "for "))]
    assert not any(re.search(r"`steer`|`STEER`", t) for t in prose)


def test_step_3_says_what_runs_before_the_first_step_and_gives_its_parts_on_the_real_model():
    """Step 3 points to Where we lose for what runs before the first step; Where we lose gives it as one item:
    compiling the automaton (its measured cost beside xgrammar's and a whole request's decode, read from the rows'
    compile times), the untimed build of the allowed ids, and how many of chapter 01's real schemas outlines-core
    compiles (read from chapter 01's file, linked to its section).
    The chain is timed on the cost models only; the real model's 3a, and 3b with 3c together, come from the
    chapter's benchmark, their product step 3 over step 2; 3a's section says once which timing each of its numbers
    comes from. Character-level jumps' ratio says it is on steered
    synthetic output."""
    results = lesson.committed()
    setup = lesson.grammar_setup(results)
    assert setup["requests"] == 13 and setup["automaton_ms"] > setup["xgrammar_ms"] > 0 and setup["decode_ms"] > 0
    parts = lesson.real_step03_parts(results)
    step3 = lesson.real_steps_rows(results, 1)[2]["x_previous"]
    assert parts["x_3a"] * parts["x_3bc"] == pytest.approx(step3)
    assert lesson.outlines_coverage() == (14, 40)
    text = _page_cells()
    first = next(t for t in text if "Step 3 adds chapter 02's two changes to 3a" in t)
    assert "*Where we lose*" in " ".join(first.split()) and "setup[" not in first
    assert "eight[3]['x_previous']" in first and "{saving:.0%}" in first and "timed interleaved with 3a over" in first
    assert "rr['main']['head']" not in first  # the whole runs' head ratios: the steps table's, not repeated here
    lose = next(t for t in text if "The parts no chapter touches" in t)
    item = " ".join(lose[lose.index("**A new grammar costs more than its request.**"):].split("\n* ")[0].split())
    assert "lesson.grammar_setup(shown)" in lose and "lesson.outlines_coverage()" in lose and "not timed" in item
    for key in ("setup['automaton_ms']", "setup['xgrammar_ms']", "setup['decode_ms']", "{built}", "{schemas}"):
        assert key in item, key
    assert "01_fsm_compression.ipynb#the-result-beside-xgrammar-and-llguidance" in item
    chain = next(t for t in text if "lesson.step03_chain_rows(changes)" in t)
    assert "rp[" not in chain and "rr[" not in chain  # SmolLM2's 3a is said once, in 3a's own section
    three_a = text[text.index(next(t for t in text if t.startswith("## 3a"))) + 1]
    assert "(the steps table)" in three_a and "in the chain's run" in three_a and "a['x_previous']" not in three_a
    assert sum(t.count("rr['main']['x_3a']") for t in text) == 1  # said once: in the answer
    assert "lesson.real_step03_parts(shown)" in "\n".join(text)
    lose = next(t for t in text if "The parts no chapter touches" in t)
    assert "faster on steered synthetic output" in lose


def test_the_answer_and_the_steps_table_say_what_pays_in_step_3_on_the_real_model():
    """On SmolLM2 chapter 02's head and argmax (3b with 3c) tie and 3a, the allowed sets precomputed from the
    automaton, pays: the answer says so beside the 8B cost model's head (the chain's 3b), and the open steps table's
    step 3 row gives the head's one number, the interleaved run's, as the answer does (run 1's whole-run tie is in the
    fold); the opening says what each chapter buys in isolation."""
    results = lesson.committed()
    parts = lesson.real_step03_parts(results)
    assert f"{parts['x_3bc']:.2f}×" == "0.97×" and parts["x_3a"] > 1.03
    rows = _table_rows(lesson.steps_runs_table(results, lesson.second_run()))
    assert rows[2][0] == "3a: allowed sets precomputed" and "host work" in rows[2][1]
    assert rows[2][3].startswith(f"{parts['x_3a']:.2f}× in run 1")
    hi = lesson.head_interleaved(1)
    assert rows[3][3].startswith(f"{hi['x']:.2f}×, interleaved rounds") and "(3b, 3c)" in rows[3][1]
    assert f"{parts['x_3bc']:.2f}" not in rows[3][3]  # one number a step: not run 1's beside the interleaved one
    text = _page_cells()
    answer = next(t for t in text if "**The answer**" in t)
    for key in ("rr['main']['x_3a']", "rr['second']['x_3a']", "eight[3]['x_previous']", "{saving:.0%}"):
        assert key in answer, key
    assert "many times faster than\nits baseline" not in text[0] and "save a few per cent of forwards" in text[0]


def test_the_scope_is_said_once_up_front_and_the_cpu_demos_are_folded_whole():
    """No serving engine is raced: the page says so once, in its opening; the CPU demonstrations (step 1, 2 and 3 on
    a tiny model) are folded whole, code and output, and print no bare True."""
    import json

    from studylog import paths

    cells = json.loads((paths.REPO_ROOT / "notebooks" / "07_constrained_decoding.ipynb").read_text())["cells"]
    text = ["".join(c["source"]) for c in cells]
    assert "**No serving engine (vLLM, SGLang) is raced:**" in text[0]
    assert sum("No serving engine" in t for t in text) == 1
    demos = [c for c in cells if c["cell_type"] == "code" and "dec.step0" in "".join(c["source"])]
    assert len(demos) == 3 and all(c["metadata"]["tags"] == ["hide-cell"] for c in demos)
    assert not any("print(\"writes the valid output above:\"" in "".join(c["source"]) for c in demos)
    host = lesson.host_table(lesson.committed())
    assert "host time the head's call holds" in host.splitlines()[0]


def test_the_interleaved_head_run_is_read_from_hand_made_rows(monkeypatch):
    """``head_interleaved``: per round, 3a's and step 3's medians over the requests, their ratio, its median, least and
    most over the rounds; the other batch's rows and step 2's left out; a failed token check reported."""
    import studylog.plotting

    def row(schema, config, times, batch=1):
        return {"series": "head_interleaved", "params": {"batch": batch, "schema": schema, "config": config},
                "per_round_ms": times}
    data = {"measurements": [row("a", "automaton_mask", [2.0, 4.0]), row("a", "masked_head", [1.0, 4.0]),
                             row("b", "automaton_mask", [4.0, 3.0]), row("b", "masked_head", [2.0, 2.0]),
                             row("c", "automaton_mask", [6.0, 5.0]), row("c", "masked_head", [3.0, 5.0]),
                             row("a", "jump_forward", [99.0, 99.0]), row("a", "masked_head", [50.0, 50.0], batch=8)],
            "checks": [{"passed": True, "params": {"batch": 1}}, {"passed": False, "params": {"batch": 8}}]}
    monkeypatch.setattr(studylog.plotting, "load_lab", lambda *a, **k: data)
    h = lesson.head_interleaved(1)
    # round 1: medians 4 over 2; round 2: 4 over 4
    assert h == {"x": 1.5, "least": 1.0, "most": 2.0, "rounds": 2, "requests": 3, "same_tokens": True,
                 "per_round_ms": [(4.0, 2.0), (4.0, 4.0)]}
    assert lesson.interleaved_word(h) == "pays" and lesson.interleaved_word({"x": 1.02}) == "tie"
    assert lesson.head_interleaved(8) is None  # no 3a rows at batch 8

    def missing(*a, **k):
        raise FileNotFoundError("no file")
    monkeypatch.setattr(studylog.plotting, "load_lab", missing)
    assert lesson.head_interleaved(1) is None


def test_a_breakdown_panel_says_why_neither_reading_orders_two_steps_where_bars_and_ticks_disagree():
    """Where the instrumented bars and the timed ticks order two steps oppositely, the figure gives the events' cost
    and points to the alternating runs that order them; where they agree it says nothing."""
    from book.decode import figures as decode_figures

    part = {"body": 0.9, "mask_wait": 0.0, "head": 0.05, "mask_apply": 0.0, "sampling": 0.01, "host": 0.01}
    flipped = {"automaton_mask": {**part, "wall": 0.97}, "masked_head": {**part, "head": 0.0, "wall": 1.0}}
    line = decode_figures.order_caption(flipped)
    assert line.startswith("3a and step 3: bars and ticks rank them in opposite orders") and "alternate" in line
    agree = {"automaton_mask": {**part, "wall": 1.0}, "masked_head": {**part, "head": 0.0, "wall": 0.95}}
    assert decode_figures.order_caption(agree) == ""


def test_the_interleaved_rounds_table_shows_each_round_and_its_ratio():
    """Chapter 07's step 3 folds the interleaved run's rounds: one row a round, in the order run, each ratio the ratio
    of its row's two medians, and the rounds' median the ratio the page quotes."""
    import statistics

    h = lesson.head_interleaved(1)
    if h is None:
        pytest.skip("the interleaved run is not committed")
    rows = _table_rows(lesson.interleaved_table(h))
    assert [r[0] for r in rows] == [str(i) for i in range(1, h["rounds"] + 1)]
    ratios = []
    for r, (a, b) in zip(rows, h["per_round_ms"]):
        assert r[1] == f"{a * 1e3:,.0f}" and r[2] == f"{b * 1e3:,.0f}" and r[3] == f"{a / b:.2f}×"
        ratios.append(a / b)
    assert statistics.median(ratios) == pytest.approx(h["x"])
    cell = next(t for t in _page_cells() if "lesson.interleaved_table(hi[1])" in t)
    assert ":::{{dropdown}}" in cell and "{hi[1]['rounds']} interleaved rounds" in cell
