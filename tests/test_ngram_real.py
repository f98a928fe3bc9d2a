"""Chapter 3 on real documents, in CUDA graphs, and the benchmark's bookkeeping.

The committed corpus (Python's standard library in cl100k tokens) against a fresh build; real-text batches
through the CPU path, the Python models and (``gpu``) every kernel, against the reference; the statistics
the benchmark reports (drafts accepted, branches taken) against hand-worked cases and the Python models;
every GPU step captured once in a CUDA graph and replayed over new values written into its buffers
(``gpu``); and the benchmark itself run on the CPU with a stand-in harness, to check what it records
(series, clocks, checks, the headline on one clock) before it costs GPU time."""

import ast
import itertools
import json
import random
import re

import pytest
import torch

from book.ngram import figures, lesson
from book.ngram import results as book_results
from studylog import ngram
from studylog.ngram import NgramConfig, NgramInputs

import lab_scripts
from ngram_helpers import model_budget_scan
from studylog.ngram import corpus as corpus_module


def _make_corpus():
    """``lab/ngram/make_corpus.py``, the script that builds the committed corpus, imported by path."""
    return lab_scripts.load("ngram", "make_corpus")


make_corpus = _make_corpus()

STEPS = [s.function for s in ngram.CHAPTER.steps]
I32, I64 = torch.int32, torch.int64
VOCAB = 100_277  # cl100k_base's ids are below this


# -----------------------------------------------------------------------------------------
# The corpus
# -----------------------------------------------------------------------------------------

def test_committed_corpus_is_small_and_says_where_it_came_from():
    corpus = corpus_module.load_corpus()
    assert corpus_module.CORPUS_PATH.stat().st_size < 400_000
    assert list(corpus.meta["files"]) == list(make_corpus.CORPUS_FILES) == sorted(make_corpus.CORPUS_FILES)
    assert set(corpus.meta["sha256"]) == set(make_corpus.CORPUS_FILES) and corpus.meta["tokenizer"] == "cl100k_base"
    for kind in corpus_module.KINDS:
        t = corpus.tokens[kind]
        assert t.shape == (corpus_module.WINDOWS, corpus_module.WINDOW) and t.dtype == I64
        assert 0 <= int(t.min()) and int(t.max()) < VOCAB
        starts = corpus.meta["window_starts"][kind]
        assert starts == make_corpus.window_starts(corpus.meta["stream_tokens"][kind])
        assert starts == sorted(starts) and starts[0] == 0
    # text and code are different documents, and real text repeats tokens (a Zipfian head)
    assert not torch.equal(corpus.tokens["text"], corpus.tokens["code"])
    for kind in corpus_module.KINDS:
        counts = torch.bincount(corpus.tokens[kind].flatten())
        top = counts.sort(descending=True).values
        assert int(top[:10].sum()) > 0.1 * corpus.tokens[kind].numel()  # ten ids cover over a tenth of the tokens


def test_corpus_rebuilds_to_the_committed_ids():
    pytest.importorskip("bpe_openai", reason="rebuilding the corpus needs the tokenizer package bpe-openai")
    committed = corpus_module.load_corpus()
    differ = make_corpus.stdlib_differences(committed.meta)
    if differ:
        pytest.skip(f"this Python's standard library differs from the one the corpus was built from "
                    f"(Python {committed.meta['python']}) in {differ}")
    fresh = make_corpus.build_corpus()
    for kind in corpus_module.KINDS:
        assert torch.equal(torch.from_numpy(fresh[kind]).long(), committed.tokens[kind]), kind
    assert fresh["meta"]["window_starts"] == committed.meta["window_starts"]
    assert fresh["meta"]["sha256"] == committed.meta["sha256"]


def test_docstrings_in_source_order():
    source = '"""Module."""\n\nclass A:\n    """Class A."""\n\n    def f(self):\n        """  Indented\n' \
             '        more."""\n\ndef g():\n    pass\n\nasync def h():\n    """H."""\n'
    assert make_corpus.docstrings(source) == "Module.\n\nClass A.\n\nIndented\nmore.\n\nH."


def test_window_starts_spread_over_the_stream():
    assert make_corpus.window_starts(10_000, 3, 1000) == [0, 4500, 9000]
    assert make_corpus.window_starts(1000, 1, 1000) == [0]
    with pytest.raises(ValueError, match="holds no window"):
        make_corpus.window_starts(999, 2, 1000)


def test_corpus_stream_runs_on_through_the_windows():
    tokens = torch.arange(4 * 10, dtype=I64).reshape(4, 10)
    corpus = corpus_module.Corpus({"text": tokens, "code": tokens}, {"window": 10})
    assert corpus.stream("text", 3, 12, offset=5).tolist() == list(range(35, 40)) + list(range(0, 7))
    with pytest.raises(ValueError, match="need 5 windows"):
        corpus.stream("text", 0, 35, offset=6)


# -----------------------------------------------------------------------------------------
# Batches from real documents
# -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["text", "code"])
def test_corpus_batch_continues_each_prompt_with_its_document(kind):
    inputs, draft, this_time = ngram.corpus_batch(kind, 20, 700, 200, seed=7)
    assert inputs.prompt_ids.shape == (20, 700) and inputs.generated_ids.shape == (20, 200)
    assert draft.shape == (20, 11) and bool((draft == -1).all()) and this_time.dtype == I32
    ngram.validate(inputs, draft, this_time, NgramConfig())
    plens, steps = inputs.prompt_lens.tolist(), inputs.step_idx.tolist()
    for b in range(20):
        # the generated tokens are the stream after the prompt: the prompt's tail past prompt_lens shows it
        tail = min(700 - plens[b], 200)
        assert torch.equal(inputs.prompt_ids[b, plens[b]:plens[b] + tail], inputs.generated_ids[b, :tail])
        assert steps[b] <= 200 - 11  # the continuation of the drafts is in the buffer
    assert 0 <= int(inputs.prompt_ids.min()) and int(inputs.prompt_ids.max()) < VOCAB
    # the same slot plan as the synthetic batches: a few prefill and empty slots among decoding ones
    assert (inputs.seq_lens_encoder > 0).sum() >= 1 and (inputs.seq_lens_decoder == 0).sum() >= 1
    again = ngram.corpus_batch(kind, 20, 700, 200, seed=7)[0]
    assert torch.equal(again.prompt_ids, inputs.prompt_ids) and torch.equal(again.step_idx, inputs.step_idx)


def test_corpus_batch_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="kind must be"):
        ngram.corpus_batch("poetry", 2, 100, 50)
    with pytest.raises(ValueError, match="gen_width > draft_width"):
        ngram.corpus_batch("text", 2, 100, 11)
    with pytest.raises(ValueError, match="windows"):
        ngram.corpus_batch("text", 2, 70_000, 100)


def real_case(seed: int):
    """A small real-text batch with a random config (both variants)."""
    r = random.Random(seed)
    kind = r.choice(["text", "code"])
    hybrid = r.random() < 0.3
    inputs, draft, this_time = ngram.corpus_batch(kind, r.randint(1, 12), r.randint(20, 300), r.randint(12, 90),
                                                  seed=seed)
    if hybrid:  # the hybrid variant keeps the slot's own tokens: 1 to 3 of them
        this_time = torch.tensor([r.randint(0, 3) for _ in range(inputs.batch)], dtype=I32)
    max_n = r.randint(1, 5)
    config = NgramConfig(max_n, r.randint(1, max_n), r.choice([0, 3, 8, 20, 60, 1 << 30]), hybrid,
                         r.randint(5, 10) if hybrid else 10)
    return inputs, draft, this_time, config


def test_cpu_path_and_models_match_the_reference_on_real_text(rng):
    for seed in range(rng.seed_value, rng.seed_value + 25):
        inputs, draft, this_time, config = real_case(seed)
        expected = ngram.reference_ngram_match(inputs, draft, this_time, config)
        d, t = draft.clone(), this_time.clone()
        ngram.cpu_path.cpu_path_inplace(inputs, d, t, config)
        assert torch.equal(d, expected[0]) and torch.equal(t, expected[1]), seed
        keys = ngram.model_one_pass_keys(inputs, config, this_time)
        modelled = model_budget_scan(inputs, keys, draft, this_time, config)
        assert torch.equal(modelled[0], expected[0]) and torch.equal(modelled[1], expected[1]), seed


def _hand_batch():
    """Three decoding slots, by hand. Slot 0: the pattern [1, 2, 3] early in the prompt, then 4, 5, 6 (its
    continuation is 4, 5, 9: two accepted). Slot 1: only the newest token 3 in the prompt, followed by 8
    (continuation 7: none accepted). Slot 2: nothing matches."""
    prompt = torch.tensor([[1, 2, 3, 4, 5, 6, 0, 0],
                           [3, 8, 8, 8, 0, 0, 0, 0],
                           [20, 21, 22, 23, 0, 0, 0, 0]], dtype=I64)
    gen = torch.tensor([[7, 1, 2, 3, 4, 5, 9, 9],
                        [7, 1, 2, 3, 7, 7, 7, 7],
                        [7, 1, 2, 3, 7, 7, 7, 7]], dtype=I64)
    i32 = lambda v: torch.tensor(v, dtype=I32)  # noqa: E731
    inputs = NgramInputs(prompt, i32([8, 4, 4]), gen, i32([3, 3, 3]), i32([3, 3, 3]), i32([100, 100, 100]),
                         i32([0, 0, 0]), i32([10, 10, 10]))
    return inputs, torch.full((3, 4), -1, dtype=I64), i32([1, 1, 1])


def test_draft_acceptance_by_hand():
    inputs, draft, this_time = _hand_batch()
    config = NgramConfig(threshold=1 << 30)
    after = ngram.reference_ngram_match(inputs, draft, this_time, config)
    assert after[1].tolist() == [4, 4, 1] and after[0][0, 1:].tolist() == [4, 5, 6]
    got = ngram.batches.draft_acceptance(inputs, this_time, *after, config)
    assert got == {"active_slots": 3, "slots_with_drafts": 2, "drafted_tokens": 6, "accepted_tokens": 2,
                   "slots_with_accepted": 1}
    # with a budget of 6 only slot 0 drafts (3 + 1 + 1 tokens): the same two accepted
    tight = NgramConfig(threshold=6)
    after = ngram.reference_ngram_match(inputs, draft, this_time, tight)
    assert ngram.batches.draft_acceptance(inputs, this_time, *after, tight)["accepted_tokens"] == 2


def test_branch_stats_by_hand():
    inputs, _, this_time = _hand_batch()
    stats = ngram.batches.branch_stats(inputs, this_time, NgramConfig(threshold=1 << 30))
    assert stats["searching_slots"] == 3 and stats["refused_slots"] == 0
    assert (stats["top_n_matches"], stats["shorter_matches"], stats["no_match"]) == (1, 1, 1)
    # searched positions: prompt ends 0..6 / 0..2 / 0..2 and generated ends 0..1 each: 19; newest token 3 at 2
    assert stats["newest_token_hits_per_1k"] == pytest.approx(1000 * 2 / 19)
    # a perfect early exit reads slot 0's prompt up to its match (3 tokens) and everything of the others
    floor = ngram.batches.haystack_bytes(inputs, this_time, NgramConfig(threshold=1 << 30))
    assert stats["early_exit_fraction"] == pytest.approx((3 + 4 + 3 + 4 + 3) * 8 / floor)
    # the deployed budget refuses the last slots whatever they find
    refused = ngram.batches.branch_stats(inputs, this_time, NgramConfig(threshold=4))["refused_slots"]
    assert refused == sum(ngram.model_budget_refused(inputs, NgramConfig(threshold=4), this_time)) > 0


def test_real_text_takes_other_branches_than_uniform_ids():
    """What the benchmark's real-text rows measure, at a CPU-friendly size (fixed seeds): real prompts hit the
    newest token far more often than uniform ids with planted repeats, find fewer full-length matches, so a
    perfect early exit saves less, and their drafts are accepted where uniform ids' are not."""
    config = NgramConfig(threshold=1 << 30)
    out = {}
    for kind in ("text", "code", "synthetic"):
        if kind == "synthetic":
            inputs, draft, this_time = ngram.make_batch(16, 2048, 512, seed=5)
        else:
            inputs, draft, this_time = ngram.corpus_batch(kind, 16, 2048, 512, seed=5)
        after = (draft.clone(), this_time.clone())
        ngram.cpu_path.cpu_path_inplace(inputs, *after, config)
        out[kind] = (ngram.batches.branch_stats(inputs, this_time, config),
                     ngram.batches.draft_acceptance(inputs, this_time, *after, config))
    synthetic_branches, synthetic_drafts = out["synthetic"]
    for kind in ("text", "code"):
        branches, drafts = out[kind]
        assert branches["newest_token_hits_per_1k"] > 3 * synthetic_branches["newest_token_hits_per_1k"]
        assert branches["top_n_matches"] < synthetic_branches["top_n_matches"]
        assert branches["early_exit_fraction"] > synthetic_branches["early_exit_fraction"]
        assert drafts["accepted_tokens"] > 0
    assert synthetic_drafts["drafted_tokens"] > 0 and synthetic_drafts["accepted_tokens"] <= 1  # chance


# -----------------------------------------------------------------------------------------
# CUDA graphs
# -----------------------------------------------------------------------------------------

def test_the_cpu_path_says_it_cannot_be_captured():
    inputs, draft, this_time = _hand_batch()
    matcher = ngram.NgramMatcher(ngram.step01_cpu_path, inputs, draft, this_time)
    assert not matcher.graph_safe
    with pytest.raises(ValueError, match="cannot be captured"):
        matcher.capture()


def _write(buffers, new) -> None:
    """Write a batch's values into bound buffers, in place (what a decoding loop does between replays)."""
    for name in ("prompt_ids", "prompt_lens", "generated_ids", "step_idx", "draft_token_num", "max_dec_len",
                 "seq_lens_encoder", "seq_lens_decoder"):
        getattr(buffers, name).copy_(getattr(new, name))


@pytest.mark.gpu
@pytest.mark.parametrize("step", STEPS[1:], ids=lambda f: f.__name__)
@pytest.mark.parametrize("hybrid", [False, True])
def test_a_captured_step_replays_over_new_values_in_its_buffers(step, hybrid):
    """Capture once over one batch's buffers; then, step after step, write another batch (synthetic or real,
    other lengths, other step indices, other slot kinds) into the same buffers and replay: each replay gives
    the reference's answer for the batch written."""
    config = NgramConfig.hybrid_variant(max_draft_tokens=8) if hybrid else NgramConfig(threshold=60)
    shape = (24, 600, 160)

    def batch(seed):
        if seed % 2:
            inputs, draft, this_time = ngram.corpus_batch("code" if seed % 4 == 1 else "text", *shape, seed=seed)
        else:
            inputs, draft, this_time = ngram.make_batch(*shape, vocab=7, seed=seed, hybrid=hybrid)
        if hybrid:
            this_time = torch.randint(0, 4, (shape[0],), dtype=I32, generator=torch.Generator().manual_seed(seed))
        return inputs, draft, this_time

    first = batch(0)
    buffers, draft, this_time = first[0].to("cuda"), first[1].cuda(), first[2].cuda()
    matcher = ngram.NgramMatcher(step, buffers, draft, this_time, config=config)
    assert matcher.graph_safe
    graph = matcher.capture()
    for seed in range(1, 7):
        inputs, d0, t0 = batch(seed)
        expected = ngram.reference_ngram_match(inputs, d0, t0, config)
        _write(buffers, inputs.to("cuda"))
        draft.copy_(d0), this_time.copy_(t0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(draft.cpu(), expected[0]) and torch.equal(this_time.cpu(), expected[1]), (step, seed)
        matcher.check()  # the values written are in range (an eager check, with a sync)


@pytest.mark.gpu
def test_every_kernel_matches_the_reference_on_real_text(rng):
    for seed in range(rng.seed_value, rng.seed_value + 30):
        inputs, draft, this_time, config = real_case(seed)
        expected = ngram.reference_ngram_match(inputs, draft, this_time, config)
        gpu = inputs.to("cuda")
        for step in STEPS:
            d, t = draft.cuda(), this_time.cuda()
            ngram.NgramMatcher(step, gpu, d, t, config=config)()
            torch.cuda.synchronize()
            assert torch.equal(d.cpu(), expected[0]) and torch.equal(t.cpu(), expected[1]), (step.__name__, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("corpus, batch, seq_len, threshold",
                         [(c, *s) for s in ngram.report.REAL_SHAPES for c in ngram.report.CORPORA])
def test_real_text_bench_inputs(corpus, batch, seq_len, threshold):
    inputs, draft, this_time = ngram.report.real_batch(corpus, batch, seq_len, device="cuda")
    config = NgramConfig(threshold=threshold)
    expected = (draft.cpu(), this_time.cpu())
    ngram.cpu_path.cpu_path_inplace(inputs.to("cpu"), *expected, config)
    for step in STEPS[4:]:  # steps 5 to 11
        d, t = draft.clone(), this_time.clone()
        ngram.NgramMatcher(step, inputs, d, t, config=config)()
        torch.cuda.synchronize()
        assert torch.equal(d.cpu(), expected[0]) and torch.equal(t.cpu(), expected[1]), step.__name__


# -----------------------------------------------------------------------------------------
# The benchmark's bookkeeping, on the CPU
# -----------------------------------------------------------------------------------------

class _CpuMatcher:
    """Stands in for NgramMatcher in the benchmark on a machine without a GPU: every step runs the CPU path
    (the real steps are checked against it on the GPU), and reports the split it was asked for."""

    def __init__(self, step, inputs, draft_tokens, seq_lens_this_time, *, config, check_values=True, chunk_len=None,
                 chunk_tiles=None, vec=None):
        self._inner = ngram.NgramMatcher(ngram.step01_cpu_path, inputs, draft_tokens, seq_lens_this_time,
                                         config=config, check_values=check_values)
        self.draft_tokens, self.seq_lens_this_time = draft_tokens, seq_lens_this_time
        self.chunk_len = chunk_len or 1024 * (chunk_tiles or 1)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        self._inner()


def _cpu_run(quick: bool):
    """A BenchRun without a GPU: the same recording, with clocks that run each call once."""
    from studylog import bench as harness

    run = harness.BenchRun.__new__(harness.BenchRun)
    run.chapter, run.command, run.quick = "ngram", "test", quick
    run.rows, run.checks, run.notes = [], [], []
    run.device = {"name": "Test GPU", "l2_cache_bytes": 1 << 20}
    run.copy_bandwidth_gbs = 1000.0
    run.counts = {"gpu_time": 0, "host_time": 0}

    def gpu_time(make_calls, *, repeats=3, min_calls=60, reps=15):
        assert min_calls >= 1 and reps >= 1
        samples = []
        for k in range(repeats):
            calls = make_calls()
            assert calls and all(callable(c) for c in calls)
            for call in calls:
                call()
            samples.append(0.01 * (k + 1))
        run.counts["gpu_time"] += 1
        return harness.Timing.of(samples, "gpu")

    def host_time(fn, *, calls=200, repeats=3):
        assert calls >= 1
        fn()
        run.counts["host_time"] += 1
        return harness.Timing.of([0.02] * repeats, "host")

    run.gpu_time, run.host_time = gpu_time, host_time
    run.progress = lambda iterable, desc, total=None: iterable
    return run


def _results_of(run):
    from studylog.plotting import Results

    data = {"chapter": "ngram", "device": {"name": "Test GPU"}, "versions": {"torch": "x", "triton": "y"},
            "date": "2000-01-01T00:00:00", "git_commit": "abc", "schema": 2,
            "ceilings": {"copy_bandwidth_gbs": 1000.0, "empty_launch_host_ms": 0.004},
            "measurements": run.rows, "checks": run.checks, "notes": run.notes}
    return Results(path=None, data=json.loads(json.dumps(data)))  # what a saved file reads back as


def test_bench_records_every_series_on_its_clock_without_a_gpu(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = ngram.report
    monkeypatch.setattr(report, "BENCH_DEVICE", "cpu")
    monkeypatch.setattr(report, "NgramMatcher", _CpuMatcher)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(report, "BENCH_GRID", [(32, 512, 128), (16, 131072, report.NO_BUDGET)])
    monkeypatch.setattr(report, "REAL_SHAPES", [(32, 4096, 128)])
    run = _cpu_run(quick=False)
    ngram.bench(run)
    assert run.checks and all(c["passed"] for c in run.checks), [c for c in run.checks if not c["passed"]]
    steps = ngram.CHAPTER.steps
    rows = run.rows
    # the grid: every step, the final step end to end; the CPU path and the end-to-end rows on the host clock
    for cfg in report.BENCH_GRID:
        where = dict(zip(("batch", "seq_len", "threshold"), cfg))
        got = {r["series"]: r for r in rows if r["params"] == where}
        assert {s.series for s in steps} | {ngram.SYNCED_SERIES} <= set(got)
        assert got[steps[0].series]["clock"] == "host_e2e" and got[ngram.SYNCED_SERIES]["clock"] == "host_e2e"
        for s in steps[1:]:
            assert got[s.series]["clock"] == "gpu" and "host_ms" in got[s.series] and len(got[s.series]["spread_ms"]) == 3
    # the sweeps on the long row, on the GPU clock
    sweep = [r for r in rows if r["series"].startswith("chunk_sweep_")]
    assert {r["series"] for r in sweep} == {report.sweep_series(s) for s in report.CHUNK_SWEEPS}
    assert all(r["clock"] == "gpu" and r["params"]["batch"] == 16 for r in sweep)
    # the real-text cases: every corpus, the CPU path and steps 5, 8 and 12, drafts and branches on step 12's row
    real = [r for r in rows if "corpus" in r["params"]]
    assert {r["params"]["corpus"] for r in real} == set(ngram.report.CORPORA)
    final = [r for r in real if r["series"] == ngram.CHAPTER.step(report.SYNCED_STEP).series]
    assert len(final) == len(ngram.report.CORPORA)
    for r in final:
        assert set(r["drafts"]) >= {"drafted_tokens", "accepted_tokens"} and "early_exit_fraction" in r["branches"]
    assert {r["series"] for r in real} == ({steps[n - 1].series for n in report.REAL_STEPS}
                                           | {ngram.SYNCED_SERIES, report.ENTRY_SERIES})
    # the entry point is timed at every case, as the step its rule picks for the case's shapes
    entry = [r for r in rows if r["series"] == report.ENTRY_SERIES]
    assert len(entry) == len(report.BENCH_GRID) + len(real) // len({r["series"] for r in real})
    for r in entry:
        picked = ngram.kernels.step_for_shape(r["params"]["batch"], r["params"]["seq_len"],
                                              ngram.NgramConfig(threshold=r["params"]["threshold"]))
        assert r["step"] == report.series_of(picked) and r["clock"] == "gpu"
    assert any("Clocks:" in note for note in run.notes)
    # what the book draws from such a file: the headline on one clock, the figures and tables
    results = _results_of(run)
    heads = book_results.headline(results)
    assert [h["case"] for h in heads] == ["32 slots x 512 tokens, budget 128",
                                          "32 slots x 4096 tokens of real Python source, budget 128"]
    for h in heads:
        assert h["clock"] == "host_e2e" and h["kernel_gpu_ms"] > 0 and "host_ms" in h and "call + sync" in h["kernel"]
    figs = figures.figures(results)
    assert {"latency", "vs_floor", "chunks", "real_text"} <= set(figs)
    for fig in figs.values():
        plt.close(fig)
    assert lesson.real_text_table(results).count("\n") == 1 + len(ngram.report.CORPORA)
    assert "call + sync" in lesson.summary_table(results)
    assert "host clock" in lesson.target_verdicts(results)


def _estimated_calls(quick: bool) -> dict:
    """How many measurements the benchmark's table declares (the GPU-clock ones, the host-clock ones, the sweeps):
    what its run time is built from."""
    rows = [row for case in itertools.chain(*ngram.report.bench_cases(quick).values()) for row in case.rows]
    return {"gpu_clock": sum(r.clock == "gpu" and not r.options for r in rows),
            "host_clock": sum(r.clock == "host_e2e" for r in rows), "sweep_points": sum(bool(r.options) for r in rows)}


def test_quick_bench_stays_small():
    full, quick = _estimated_calls(False), _estimated_calls(True)
    assert quick["gpu_clock"] <= full["gpu_clock"] // 2
    assert full["gpu_clock"] <= 170 and full["sweep_points"] <= 40  # every step at every grid case (about 70 s)
    assert len(ngram.report.bench_cases(quick=True)["real text"]) == len(ngram.report.CORPORA)


def _declared_rows() -> list[tuple]:
    """(series, role, clock, params) of every row the full benchmark's table declares, in order."""
    cases = itertools.chain(*ngram.report.bench_cases(quick=False).values())
    return [(r.series, r.role, r.clock, json.dumps(r.params, sort_keys=True)) for c in cases for r in c.rows]


@pytest.mark.parametrize("gpu", ["nvidia-h200", "nvidia-h100-80gb-hbm3"])
def test_the_declared_table_is_what_the_committed_file_measured(gpu):
    """The table declares exactly the rows of the committed results, but for the one-thread kernel's rows the run
    skipped (its notes name each case), and, in the H100 file, the series it predates (it was measured before steps
    6, 7 and 9 to 11 and the entry point's row were added: its notes say so)."""
    from studylog import paths
    from studylog.plotting import load_results

    data = load_results("ngram", gpu=gpu, root=paths.BENCH_RESULTS).data
    skipped = [ast.literal_eval(m[1]) for note in data["notes"]
               if (m := re.match(r"step02_serial <<<1,1>>> kernel skipped at (\{.*?\}):", note))]
    later = set()
    if gpu.startswith("nvidia-h100"):
        later = {"step06", "step07", "step09", "step10", "step11", "ngram_match"}
    committed = [(r["series"], r["role"], r["clock"], json.dumps(r["params"], sort_keys=True))
                 for r in data["measurements"]]
    declared = [row for row in _declared_rows()
                if row[0] not in later and not (row[0] == "step02" and json.loads(row[3]) in skipped)]
    assert len(skipped) == 3 and len(set(committed)) == len(committed)
    assert sorted(declared) == sorted(committed)
