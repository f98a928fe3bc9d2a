"""studylog.tails on the CPU: its percentiles, its cases against the scoreboard's headline cases and the chapters'
committed rows, its refusal without a GPU, its bookkeeping (with a stub harness) and its input builders at toy sizes.
The timing itself needs a GPU."""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import random
import statistics
import subprocess
import sys

import numpy as np
import pytest
import torch

from book import scoreboard
from studylog import bench, chapter, tails
from studylog.__main__ import main

H200 = bench.DEFAULT_OUT / "nvidia-h200"

#: Each entry case in order: (chapter, the scoreboard's case, the series of the chapter's JSON holding the same call
#: at that case). Chapters 5 and 6 have two: step 21 (bf16 x) and step 23 (W2A8, at BitNet's shape where our
#: lead is smallest); the mixed batch with a key/value head per query head and under grouped-query attention.
HEADLINES = [
    ("masked_lm_head", scoreboard.MASKED_HEAD_CASE, "step13"),
    ("ngram", scoreboard.NGRAM_HEADLINE_CASE, "ngram_match"),  # the page's headline case
    ("ngram", scoreboard.NGRAM_LEAD_CASE, "ngram_match"),  # the stress case: every active slot searches
    ("ngram", scoreboard.NGRAM_CASE, "ngram_match"),  # the deployed budget
    ("ctc", scoreboard.CTC_CASE, "ctc_loss"),
    ("ctc", scoreboard.CTC_SMALL_CASE, "ctc_loss"),  # the small alphabet, where the chain of frames binds
    ("ternary", scoreboard.TERNARY_CASE, "step21"),  # what ternary_matmul runs at M = 1 on the H200
    ("ternary", {"shape": "4800x3200", "m": 1}, "step23"),
    ("ternary", scoreboard.TERNARY_CASE, "step14"),  # part 1's last step
    ("ternary", scoreboard.PART_ONE_CASE, "step14"),  # and at part 1's scoreboard row's case
    ("multi_item", scoreboard.MULTI_ITEM_CASE, "step05"),
    ("multi_item", {"shape": "8 prompts, mixed, 8 KV heads"}, "step06"),  # what the entry point runs under GQA
]


# -- percentiles --------------------------------------------------------------------------------

@pytest.mark.parametrize("samples, q, want", [
    (list(range(1, 101)), 99, 99.01),      # rank 0.99 * 99 = 98.01: 99 + 0.01 * (100 - 99)
    (list(range(1, 101)), 50, 50.5),       # the median of an even count
    (list(range(1, 101)), 100, 100.0),
    (list(range(1, 101)), 0, 1.0),
    (list(range(1, 301)), 99, 297.01),     # 300 samples (3 x 100): rank 0.99 * 299 = 296.01
    ([3.0, 1.0, 2.0], 50, 2.0),            # unsorted input
    ([5.0], 99, 5.0),
    ([0.0, 10.0], 99, 9.9),
    ([1.0] * 99 + [101.0], 99, 2.0),       # one outlier in 100: rank 98.01, between 1 and 101
])
def test_percentile_on_known_samples(samples, q, want):
    assert tails.percentile(samples, q) == pytest.approx(want, abs=1e-9)


def test_percentile_agrees_with_numpy_and_the_median():
    gen = random.Random(7)
    for n in (1, 2, 3, 60, 299, 300):
        xs = [gen.lognormvariate(0, 1) for _ in range(n)]
        for q in (0, 1, 25, 50, 90, 99, 100):
            assert tails.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12)
        assert tails.percentile(xs, 50) == pytest.approx(statistics.median(xs), rel=1e-12)


@pytest.mark.parametrize("samples, q", [([], 50), ([1.0], -1), ([1.0], 101)])
def test_percentile_refuses_nonsense(samples, q):
    with pytest.raises(ValueError):
        tails.percentile(samples, q)


# -- the cases are the scoreboard's headline cases ----------------------------------------------------

#: The chapters' entry points (the other cases are floors measured beside them).
ENTRY_CASES = [c for c in tails.cases() if c.role == "kernel"]


def test_every_chapter_with_a_gpu_kernel_has_its_cases():
    assert [c.chapter for c in ENTRY_CASES] == [chapter for chapter, _, _ in HEADLINES]
    assert {c.role for c in tails.cases()} <= set(bench.ROLES)


@pytest.mark.parametrize("case, headline", list(zip(ENTRY_CASES, HEADLINES)), ids=lambda c: getattr(c, "chapter", ""))
def test_case_is_the_scoreboards_headline_case(case, headline):
    """The params contain the scoreboard's case (a None there: the key is absent), and the chapter's committed
    file holds one row of its headline call with exactly these params."""
    _, want, series = headline
    for key, value in want.items():
        assert case.params.get(key) == value, (key, case.params)
    data = json.loads((H200 / f"{case.chapter}.json").read_text())
    matches = [r for r in data["measurements"] if r["series"] == series and r["params"] == case.params]
    assert len(matches) == 1, (series, case.params)
    assert matches[0]["clock"] == "gpu"
    assert scoreboard.one(data, series, **want) is not None


@pytest.mark.parametrize("case", ENTRY_CASES, ids=lambda c: c.chapter)
def test_series_is_the_chapters_public_entry_point(case):
    package = importlib.import_module(f"studylog.{case.chapter}")
    assert case.series in package.__all__


# -- chapter 4's latency floor: the recursion's chain at the latency-bound case ---------------------------

def test_ctc_floor_rows_follow_the_ctc_case():
    """Right after chapter 4's row: the chain over 2T frames (alpha then beta) and over T (one direction), at
    the scoreboard's latency-bound case, with the states of the utterance the chapter's benchmark draws there."""
    cases = tails.cases()
    at = [(c.chapter, c.series) for c in cases].index(("ctc", "ctc_loss"))
    floors = cases[at + 1:at + 3]
    assert [(c.chapter, c.series, c.role) for c in floors] == [("ctc", tails.CTC_FLOOR_SERIES, "baseline")] * 2
    assert [c.params for c in floors] == [{"T": 150, "N": 1, "A": 28, "frames": 300, "states": 127},
                                         {"T": 150, "N": 1, "A": 28, "frames": 150, "states": 127}]
    assert [c for c in cases if c.series == tails.CTC_FLOOR_SERIES] == floors
    for key, value in scoreboard.CTC_SMALL_CASE.items():
        assert floors[0].params[key] == value


def test_ctc_floor_states_are_those_of_the_chapters_draw():
    """S = 2L + 1 for the first target of chapter 4's T = 150 grid (its generator's first draw is at A = 28, N = 1),
    as the committed H200 file records it for that case."""
    from studylog.ctc import report

    assert report.BENCH_T == 150 and report.grids()["main"][0] == (28, 1)
    assert report.grids(quick=True)["main"][0] == (28, 1)
    (labels,) = report.random_targets(150, 1, 28, torch.Generator().manual_seed(report.BENCH_SEED))
    assert tails.ctc_floor_states() == 2 * len(labels) + 1 == 127
    data = json.loads((H200 / "ctc.json").read_text())
    recorded = {r["max_positions"] for r in data["measurements"]
                if r["params"] == tails.CTC_FLOOR_CASE and r.get("max_positions") is not None}
    assert recorded == {tails.ctc_floor_states()}
    assert "random_targets(T, N, A, generator)" in inspect.getsource(report.bench)
    assert "manual_seed(BENCH_SEED)" in inspect.getsource(report.bench) and report.BENCH_SEED == 2024


# -- the command line -----------------------------------------------------------------------------

def test_tails_is_a_benchmark_not_a_chapter():
    assert "tails" in chapter.BENCHMARKS and "tails" not in chapter.CHAPTERS
    (picked,) = chapter.select(["tails"], need="bench")
    assert picked.name == "tails" and picked.bench is tails.bench
    assert "tails" not in [c.name for c in chapter.select(["all"], need="bench")]
    with pytest.raises(ValueError, match="declares no headline"):
        chapter.select(["tails"], need="headline")


def test_bench_tails_without_gpu_fails_with_the_harness_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "tails", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {bench.CPU_REFUSAL}\n"
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_bench_tails_from_the_shell_without_gpu(tmp_path):
    out = subprocess.run([sys.executable, "-m", "studylog", "bench", "tails", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr == f"error: {bench.CPU_REFUSAL}\n", out.stderr
    assert not any(tmp_path.iterdir())


def test_graph_time_keeps_its_default():
    parameters = inspect.signature(bench.BenchRun.graph_time).parameters
    assert parameters["samples"].default is False
    assert (parameters["min_calls"].default, parameters["reps"].default) == (60, 15)


# -- the bookkeeping, with a stub harness ---------------------------------------------------------------

class StubRun:
    """What tails.bench uses of a BenchRun; graph_time returns known samples (each repetition shifted by 100)."""

    def __init__(self):
        self.rows, self.notes, self.graphs = [], [], []

    def progress(self, iterable, desc):
        return iterable

    def graph_time(self, calls, *, min_calls, reps, samples):
        assert samples is True
        self.graphs.append((len(calls), min_calls, reps))
        base = 100 * (len(self.graphs) - 1)
        return [float(base + i) for i in range(1, reps + 1)]

    def record(self, series, ms, *, params, clock, **extra):
        self.rows.append({"series": series, "ms": ms, "params": params, "clock": clock, **extra})

    def note(self, text):
        self.notes.append(text)


def test_bench_records_one_row_per_case_with_its_tail(monkeypatch):
    case = tails.Case("demo", "demo_entry", {"n": 1}, lambda run, rep: ([lambda: None] * 4, {"step": "step07"}))
    monkeypatch.setattr(tails, "cases", lambda: [case])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    run = StubRun()
    tails.bench(run)
    assert run.graphs == [(4, 60, 100)] * 3 and tails.MIN_CALLS >= 60
    (row,) = run.rows
    # samples 1..100, 101..200, 201..300: median 150.5, p99 at rank 296.01 -> 297.01
    assert row["series"] == "demo_entry" and row["params"] == {"n": 1} and row["clock"] == "gpu"
    assert row["ms"] == row["p50_ms"] == 150.5
    assert row["p99_ms"] == pytest.approx(297.01)
    assert row["samples"] == 300 and row["replays_per_repetition"] == 100 and row["repetitions"] == 3
    assert row["repetition_medians_ms"] == [50.5, 150.5, 250.5] and row["max_ms"] == 300.0
    assert row["step"] == "step07" and row["rotated_copies"] == 4 and row["chapter"] == "demo"
    assert run.notes and "60" in run.notes[0]


class CallingRun(StubRun):
    """A stub harness that also makes each call once, as the real one does before its capture."""

    def graph_time(self, calls, *, min_calls, reps, samples):
        for call in calls:
            call()
        return super().graph_time(calls, min_calls=min_calls, reps=reps, samples=samples)


def test_bench_records_the_ctc_floor_as_a_baseline_row(monkeypatch):
    """The floor's row: its series and params, role baseline (a yardstick), tagged as the latency floor, and
    p50/p99 as every row; its call is chain_floor(frames, states) into one preallocated output."""
    from studylog.ctc import floor

    made = []
    monkeypatch.setattr(floor, "chain_floor", lambda frames, states, *, device, out: made.append(
        (frames, states, device, tuple(out.shape), out.dtype)))
    params = tails.CTC_FLOOR_CASE | {"frames": 300, "states": 127}
    calls = functools.partial(tails._ctc_chain, frames=300, states=127, device="cpu")
    case = tails.Case("ctc", tails.CTC_FLOOR_SERIES, params, calls, role="baseline")
    monkeypatch.setattr(tails, "cases", lambda: [case])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    run = CallingRun()
    tails.bench(run)
    assert made == [(300, 127, "cpu", (127,), torch.float32)] * 3 and run.graphs == [(1, 60, 100)] * 3
    (row,) = run.rows
    assert row["series"] == "ctc recursion chain (latency floor)" and row["params"] == params
    assert row["role"] == "baseline" and row["floor"] == "latency" and row["chapter"] == "ctc"
    assert row["clock"] == "gpu" and row["threads"] == 32 and row["rotated_copies"] == 1
    assert row["ms"] == row["p50_ms"] == 150.5 and row["p99_ms"] == pytest.approx(297.01)


def test_entry_rows_keep_the_kernel_role(monkeypatch):
    case = tails.Case("demo", "demo_entry", {"n": 1}, lambda run, rep: ([lambda: None], {}))
    monkeypatch.setattr(tails, "cases", lambda: [case])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    run = StubRun()
    tails.bench(run)
    assert run.rows[0]["role"] == "kernel" and "floor" not in run.rows[0]


# -- the input builders at toy sizes --------------------------------------------------------------------

def test_masked_head_inputs():
    weight, h, tokens, bitmask = tails.masked_head_inputs(256, 32, 10, seed=0, device="cpu")
    assert weight.shape == (256, 32) and weight.dtype == h.dtype == torch.bfloat16 and h.shape == (1, 32)
    assert tokens.union_count == 10 and bitmask.shape == (1, 256 // 32) and bitmask.dtype == torch.int32
    assert int(sum(bin(w & 0xFFFFFFFF).count("1") for w in bitmask.flatten().tolist())) == 10


def test_ngram_inputs():
    from studylog.ngram.report import grid_batch

    inputs, drafts, lengths = grid_batch(4, 64, device="cpu")
    assert inputs.prompt_ids.shape == (4, 64) and inputs.prompt_ids.dtype == torch.int64
    assert inputs.generated_ids.shape[0] == 4 and drafts.shape[0] == lengths.shape[0] == 4


def test_ctc_inputs():
    x, targets = tails.ctc_inputs(12, 2, 7, seed=0, device="cpu")
    assert x.shape == (12, 2, 7) and x.dtype == torch.float32
    assert targets.num_classes == 7 and targets.max_time == 12 and targets.input_lengths_host == (12, 12)


def test_ternary_inputs():
    x, w, scale = tails.ternary_inputs(16, 256, 1, seed=0, device="cpu")
    assert x.shape == (1, 256) and x.dtype == torch.bfloat16
    assert (w.n, w.k, w.fmt) == (16, 256, "2bit_tiles") and isinstance(scale, float) and scale > 0


class RotatedRun:
    """What the ternary and multi-item cases ask of a BenchRun: copies of the large input, and the card's name."""

    device = {"name": "a card with no committed results"}

    def rotated(self, x):
        return [x, x.clone() if isinstance(x, torch.Tensor) else x]


@pytest.mark.parametrize("kv_heads", [None, 8])
def test_multi_item_case_splits_q_k_v_by_heads(monkeypatch, kv_heads):
    """Chapter 6's case: q with the benchmark's 32 heads, k and v with 32 or with the GQA layout's 8; each call
    into its own output through the entry point (which runs step 5, or step 6 under GQA)."""
    from studylog import multi_item
    from studylog.multi_item import report

    seen = []
    monkeypatch.setattr(report, "bench_shapes", lambda: [("tiny, mixed", [4, 3], [[2, 1], [3]])])
    monkeypatch.setattr(report, "gqa_shapes", lambda: [("tiny, mixed, 8 KV heads", [4, 3], [[2, 1], [3]], 8)])
    monkeypatch.setattr(multi_item, "multi_item_attention", lambda q, k, v, batch, **kw: seen.append(
        (q.shape, k.shape, v.shape, batch.total_tokens, kw["out"].shape)))
    calls, extra = tails._multi_item(RotatedRun(), 0, kv_heads, device="cpu")
    for call in calls:
        call()
    tokens = (4 + 2 + 1 + 3) + (3 + 3 + 2)  # prefix, items, and a delimiter before each item and after the last
    kv = kv_heads or report.BENCH_HEADS
    d = report.BENCH_HEAD_DIM
    assert seen == [((32, tokens, d), (kv, tokens, d), (kv, tokens, d), tokens, (32, tokens, d))] * 2
    assert extra == {"config": None}


class RotatingRun:
    """What chapter 2's case asks of a BenchRun: how many copies a call reading ``nbytes`` rotates among."""

    def __init__(self, copies):
        self.copies, self.asked = copies, []

    def rotation(self, nbytes):
        self.asked.append(nbytes)
        return self.copies


def test_masked_head_case_rotates_one_plan_over_each_head_copy(monkeypatch):
    """Chapter 2's tails call is the benchmark's: the plan's step on each copy of the head in turn (as many copies as
    the run's rotation asks for the rows a call reads), every copy giving the same logits as a float64 reference."""
    from studylog.masked_lm_head import AllowedTokens

    vocab, hidden, allowed, build = 300, 64, 20, tails.masked_head_inputs
    monkeypatch.setattr(tails, "masked_head_inputs", lambda v, d, n, *, seed: build(vocab, hidden, allowed, seed=seed,
                                                                                     device="cpu"))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    run = RotatingRun(3)
    calls, extra = tails._masked_head(run, 0)
    assert len(calls) == 3 and extra["read_bytes"] == run.asked[0] and extra["rotation_capped"] is False
    weight, h, tokens, _ = build(vocab, hidden, allowed, seed=0, device="cpu")
    assert isinstance(tokens, AllowedTokens)
    want = (h.double() @ weight.double().t()).masked_fill(~tokens.mask, float("-inf"))
    outs = [call().clone() for call in calls]
    for out in outs:
        assert torch.equal(torch.isinf(out), torch.isinf(want))
        finite = torch.isfinite(want)
        torch.testing.assert_close(out.double()[finite], want[finite], rtol=1e-3, atol=1e-3)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


# -- floors measured beside the entry points ----------------------------------------------------------

def test_smollm2_shape_is_the_one_chapter_seven_read_from_the_checkpoint():
    """The shape whose forward's kernels are counted is SmolLM2-135M's as chapter 07's run recorded it from the
    checkpoint: the same layers, widths and heads, so the same parameters."""
    import ast

    from studylog.decode.model import ModelConfig

    data = json.loads((H200 / "decode.json").read_text())
    (note,) = [n for n in data["notes"] if n.startswith("model smollm2: ")]
    recorded = ast.literal_eval(note.removeprefix("model smollm2: "))
    for key, value in tails.SMOLLM2_SHAPE.items():
        assert recorded[key] == value, key
    config = ModelConfig("smollm2", **tails.SMOLLM2_SHAPE)
    assert config.head_dim == recorded["head_dim"]
    assert config.parameter_counts()["body"] == recorded["params_body"]


def test_the_floor_cases_are_baselines_beside_their_chapters():
    cases = {c.series: c for c in tails.cases()}
    for series, chapter_ in ((tails.BITMASK_COPY_SERIES, "masked_lm_head"), (tails.FORWARD_SERIES, "speculate")):
        assert cases[series].role == "baseline" and cases[series].chapter == chapter_
    assert cases[tails.BITMASK_COPY_SERIES].params == scoreboard.MASKED_HEAD_CASE | {"layout": "vd"}
