"""Chapter 4's benchmark, CUDA graphs and torch's paths. CPU: the plan's buffers, torch's dispatch rule, the
outcome counts, the benchmark's grids and time, the headline, figures and the answer to the blog post's question on
results files. GPU: a plan and ctc_loss captured in a CUDA graph and replayed over changing inputs, torch's
paths as the benchmark assumes them."""

import json
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from book.ctc import figures, lesson
from studylog import ctc, plotting
from studylog.ctc import peers, report

SENTINEL = -12345.0


# --------------------------------------------------------------------------------------
# The plan (CPU: its buffers)
# --------------------------------------------------------------------------------------

def test_plan_packs_each_batch_into_the_same_buffers_as_prepare_targets_would(rng):
    plan = ctc.CTCPlan(30, 4, 6, 12, device="cpu")
    packed = plan.targets.labels.untyped_storage().data_ptr()
    for _ in range(3):
        tl = torch.randint(0, 13, (4,), generator=rng)
        il = torch.randint(1, 31, (4,), generator=rng)
        targets = torch.randint(1, 6, (4, 12), generator=rng)
        batch = plan.set_targets(targets, il, tl)
        ref = ctc.prepare_targets(targets, il, tl, num_classes=6, max_time=30, device="cpu")
        assert batch.labels.untyped_storage().data_ptr() == packed  # the same device buffer every time
        assert batch.label_stride == 12 and batch.slot_stride == 6  # the plan's capacity, not the batch's
        assert torch.equal(batch.input_lengths, ref.input_lengths) and torch.equal(batch.num_slots, ref.num_slots)
        for i, length in enumerate(tl.tolist()):
            assert torch.equal(batch.labels[i, :length], ref.labels[i, :length])
            assert not batch.labels[i, length:].any()
            u = int(ref.num_slots[i])
            assert torch.equal(batch.slot_class[i, :u], ref.slot_class[i, :u])
            assert torch.equal(batch.slot_start[i, :u + 1], ref.slot_start[i, :u + 1])
            assert torch.equal(batch.slot_members[i, :length], ref.slot_members[i, :length])


def test_plan_refuses_what_it_cannot_hold():
    plan = ctc.CTCPlan(10, 2, 5, 4, device="cpu")
    with pytest.raises(ValueError, match="at most 4 labels"):
        plan.set_targets(torch.ones(2, 5, dtype=torch.long), [10, 10], [5, 1])
    with pytest.raises(ValueError, match="input_lengths"):
        plan.set_targets(torch.ones(2, 4, dtype=torch.long), [11, 10], [1, 1])
    with pytest.raises(ValueError, match="CUDA device"):
        plan(torch.zeros(10, 2, 5))
    with pytest.raises(ValueError, match="shape"):
        plan(torch.zeros(10, 3, 5))
    with pytest.raises(ValueError, match="max_target_length"):
        ctc.CTCPlan(10, 2, 5, ctc.MAX_TARGET_LENGTH + 1, device="cpu")
    for step in (6, 15):  # a plan runs one of steps 7 to 14
        with pytest.raises(ValueError, match="step"):
            ctc.CTCPlan(10, 2, 5, 4, step=step, device="cpu")
    with pytest.raises(TypeError):
        ctc.CTCPlan(10, 2, 5, 4, step=14, grain=2, device="cpu")  # each step at its default options


# --------------------------------------------------------------------------------------
# torch's dispatch rule and the outcome counts (CPU)
# --------------------------------------------------------------------------------------

def _fake_log_probs(T, N, A, device="cuda", dtype=torch.float32):
    return SimpleNamespace(device=torch.device(device), dtype=dtype, ndim=3, shape=(T, N, A))


def test_the_cudnn_rule_as_aten_states_it():
    assert ctc.peers.cudnn_eligible([50, 50, 50], [255, 3, 50], 50).tolist() == [False, True, True]
    assert ctc.peers.cudnn_eligible([40, 50], [3, 51], 50).tolist() == [False, False]  # short input; too long
    ok = dict(log_probs=_fake_log_probs(50, 2, 7), targets=torch.tensor([1, 2, 3], dtype=torch.int32),
              input_lengths=(50, 50), target_lengths=(2, 1))
    assert peers.takes_cudnn_path(**ok, cudnn_enabled=True)
    assert not peers.takes_cudnn_path(**ok, cudnn_enabled=False)
    assert not peers.takes_cudnn_path(**ok, cudnn_enabled=True, blank=1)
    for change in (dict(targets=torch.tensor([1, 2, 3])),  # int64
                   dict(targets=torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)),  # padded
                   dict(log_probs=_fake_log_probs(50, 2, 7, dtype=torch.float64)),
                   dict(log_probs=_fake_log_probs(50, 2, 7, device="cpu")),
                   dict(input_lengths=(50, 49)), dict(target_lengths=(256, 1))):
        assert not peers.takes_cudnn_path(**{**ok, **change}, cudnn_enabled=True), change


def test_outcomes_split_every_possible_utterance_once():
    ref_loss = torch.tensor([10.0, 10.0, 10.0, 10.0, 10.0, math.inf], dtype=torch.float64)
    ref_grad = torch.zeros(2, 6, 3, dtype=torch.float64)
    ref_grad[:, :, 0] = 1.0
    loss = torch.tensor([10.0, math.inf, 10.0, 10.0 + 1e-4, 10.1, math.inf])
    grad = ref_grad.float().clone()
    grad[0, 2, 1] = math.nan  # finite loss, NaN gradient
    counts = ctc.reference.outcomes(loss, grad, ref_loss, ref_grad)
    assert counts == {"utterances": 6, "impossible": 1, "infinite": 1, "nan": 1, "finite_wrong": 2, "far": 1,
                      "right": 1}
    assert counts["infinite"] + counts["nan"] + counts["finite_wrong"] + counts["right"] == 5


# --------------------------------------------------------------------------------------
# The benchmark's shape and time (CPU)
# --------------------------------------------------------------------------------------

def test_the_benchmark_grids_and_settings():
    for quick in (False, True):
        grid = ctc.report.grids(quick)
        assert set(grid["lesson"]) <= set(grid["main"])  # steps 1 to 6 run inside the main loop
        assert {A for A, _ in grid["main"]} == set(ctc.BENCH_A)
    assert len(ctc.report.grids()["main"]) == len(ctc.BENCH_A) * len(ctc.BENCH_N)
    assert report.graph_settings(0.01) == {"min_calls": 60, "reps": report.GRAPH_REPS}
    assert report.graph_settings(4.0)["min_calls"] == 2 and report.graph_settings(4.0)["reps"] < report.GRAPH_REPS
    assert report.host_calls(0.01) == 200 and report.host_calls(5.0) == 5
    l2 = 50 * 2**20
    assert report.copies(l2, 1000) == 1 and report.copies(l2, l2) == 4 and report.copies(l2, 10 * l2) == 1


def declared(quick: bool = False, captured=frozenset(peers.TORCH_SERIES)) -> list[tuple[str, dict]]:
    """(series, params) of every row :data:`report.TABLE` records, in order, where a CUDA graph captures the torch
    calls ``captured``: the benchmark's loop (:func:`report.bench`) with every point's state known beforehand."""
    rows = []
    for section in report.SECTIONS:
        for params in report.section_points(section, quick):
            here = [s for s in report.TORCH if report.holds("torch", s, params, graph=False, cudnn_graph=False,
                                                            spans=False, quick=quick)]
            state = {"graph": any(s in captured for s in here), "cudnn_graph": "torch-cuDNN" in captured,
                     "spans": any(s not in captured for s in here), "quick": quick}
            for m, step in report.measures(section, lambda s: s in captured):
                if report.holds(m.at, step, params, **state):
                    rows.append((m.series.format(step=report.series_of(step)),
                                 {**params, "of": params["N"]} if m.at == "cudnn-set" else params))
    return rows


def _rows(pairs) -> list[tuple]:
    """(series, params) as comparable tuples; a cuDNN set's N left out: the utterances of a stress input that
    torch's cuDNN path takes, known once the input is drawn."""
    return [(s, tuple(sorted((k, v) for k, v in p.items() if not (s.startswith("cudnn-set") and k == "N"))))
            for s, p in pairs]


def _committed(card: str):
    data = json.loads((plotting.DEFAULT_OUT / card / "ctc.json").read_text())
    notes = (re.match(r"CUDA-graph capture of (.+?) \(.*\): captured;", n) for n in data["notes"])
    captured = {m.group(1) for m in notes if m}
    return data, captured


def test_the_table_declares_every_row_of_the_committed_run_in_order():
    """The H200's file (this benchmark's run) holds exactly the rows the table declares, in order, for the torch calls
    its notes say a graph captured; a table that drops, renames or adds a row fails here."""
    data, captured = _committed("nvidia-h200")
    assert captured == {"torch-cuDNN"} and report.FINAL == ctc.CHAPTER.final.number
    assert _rows((r["series"], r["params"]) for r in data["measurements"]) == _rows(declared(False, captured))


def test_the_h100_file_holds_the_table_less_the_steps_it_predates(monkeypatch):
    """The H100's file predates steps 7, 8, 9 and 11 and the entry point's rows (the chapter's earlier step list) and
    the lesson's batch of 8 (steps 1 to 6 timed at N = 1, 16 and 256 only): it holds the table's other rows (in an
    order of its own)."""
    monkeypatch.setattr(report, "LESSON_N", (1, 16, 256))
    data, captured = _committed("nvidia-h100-80gb-hbm3")
    later = {"step07", "step08", "step09", "step11", "ctc_loss"}

    def kept(series):
        return series.removeprefix("stress ").removesuffix(" kernels") not in later
    want = [(s, p) for s, p in declared(False, captured) if kept(s)]
    assert sorted(_rows((r["series"], r["params"]) for r in data["measurements"])) == sorted(_rows(want))


def test_the_table_follows_the_capture_probe():
    """Where no torch call is captured, torch-best is a kernel-clock row at every point, beside the spans."""
    rows = declared(True, captured=set())
    best = [p for s, p in rows if s == "torch-best"]
    assert len(best) == len(report.grids(True)["main"]) == len([s for s, _ in rows if s == "torch-best span"])
    assert not any(s == "torch-cuDNN span" for s, _ in rows)
    assert len(declared(True)) < len(rows)  # all captured: no spans


def _measure_cost_s(estimate_ms: float, n_copies: int = 1, *, host: bool = True, repeats: int = 3,
                    reps: int = report.GRAPH_REPS) -> float:
    """GPU seconds one GPU-clock measurement of a call of ``estimate_ms`` costs (the model of the estimate)."""
    s = report.graph_settings(estimate_ms, reps)
    in_graph = n_copies * -(-s["min_calls"] // n_copies)
    calls = repeats * (2 * n_copies + (1 + s["reps"]) * in_graph)
    host_cost = (1 + 3 * report.host_calls(estimate_ms)) * max(estimate_ms, 0.03) if host else 0.0
    return (calls * estimate_ms + host_cost) / 1e3 + repeats * 0.015  # + capture and instantiation


def _span_cost_s(estimate_ms: float, reps: int = report.SPAN_REPS) -> float:
    """GPU seconds of one kernel-clock measurement (two profiler sessions, L2 flush before each call)."""
    return ((reps + 4) * (estimate_ms + 0.1)) / 1e3 + 0.15


def _estimated_seconds(results, quick: bool = False) -> dict[str, float]:
    """GPU seconds the benchmark should take, by section, from a results file's times (any clock; the
    committed one before this benchmark existed will do): the cost model of :func:`_measure_cost_s` and
    :func:`_span_cost_s` over :func:`studylog.ctc.report.grids`. Overheads it leaves out (NVRTC, references,
    Python) are added as a flat allowance."""
    from studylog.ctc import CHAPTER

    def ms(series, **params):
        rows = results.select(series, **params)
        return rows[0]["ms"] if rows else 1.0

    l2 = results.data["device"].get("l2_cache_bytes") or 64 * 2**20
    grid = report.grids(quick)
    out = {"probe": 8.0, "main": 0.0, "lesson": 0.0, "grain": 0.0, "stress": 0.0, "profile": 0.0}
    final = CHAPTER.final.series
    for A, N in grid["main"]:
        n = report.copies(l2, 4 * report.BENCH_T * N * A)
        where = {"T": report.BENCH_T, "N": N, "A": A}
        torch_ms = ms("torch-cuDNN", **where)
        out["main"] += _measure_cost_s(torch_ms, n) + _span_cost_s(ms("torch-native", **where))
        out["main"] += sum(_measure_cost_s(ms(report.step_of(k).series, **where), n) for k in range(7, 15))
        out["main"] += 0.05 * (1 + N / 64) + 0.1  # the plan's host time; the reference and the checks
        if N in report.LESSON_N:  # spans: the final step's and cuDNN's
            out["main"] += _span_cost_s(ms(final, **where)) + _span_cost_s(torch_ms)
        if (A, N) in report.PROFILE_CASES:  # F.ctc_loss on its cuDNN path
            out["main"] += _span_cost_s(torch_ms)
        if (A, N) in grid["lesson"]:
            out["lesson"] += sum(_measure_cost_s(ms(report.step_of(k).series, **where), n) for k in range(1, 7))
    for A, g in grid["grain"]:
        out["grain"] += _measure_cost_s(ms(f"{report.step_of(4).series} strided", A=A, grain=g), host=False)
    for T, N in grid["stress"]:
        longest = max(report.STRESS_T)
        scale = 1.0 if T <= longest else 3.0 * T / longest  # longer targets, more positions
        for k in range(5, 15):
            out["stress"] += _measure_cost_s(ms(f"stress {report.step_of(k).series}", T=min(T, longest)) * scale,
                                             host=False, reps=report.STRESS_REPS)
        out["stress"] += 5 * _span_cost_s(5.0, reps=5) + 0.3 * T / 100
    out["profile"] = 0.0 if quick else len([p for p in report.PROFILE_CASES if p in grid["main"]]) * 10 * 0.2
    out["overhead"] = 10.0
    out["total"] = sum(out.values())
    return out


def test_the_benchmark_fits_its_time():
    """The cost model over the committed results' times: the whole run within about 100 s, --quick within 35 s."""
    results = plotting.load_results("ctc", "nvidia-h200")
    assert _estimated_seconds(results)["total"] < 100
    assert _estimated_seconds(results, quick=True)["total"] < 35


# --------------------------------------------------------------------------------------
# Headline, figures and the blog post's question on results files (CPU)
# --------------------------------------------------------------------------------------

def _row(series, ms, clock="gpu", role="kernel", **params):
    row = {"series": series, "role": role, "params": params, "ms": ms, "clock": clock}
    if clock == "gpu":
        row["spread_ms"] = [ms * 0.98, ms, ms * 1.03]
        row["host_ms"] = 0.02
    return row


#: The longest target's row of alpha in :func:`new_results`' step rows: one warp's worth at N = 1, more elsewhere.
POSITIONS = {True: 101, False: 297}


def new_results(tmp_path, *, cudnn_loses: bool):
    rows = []
    for A in ctc.BENCH_A:
        for N in ctc.BENCH_N:
            p = {"T": ctc.BENCH_T, "N": N, "A": A}
            err = {"loss_rel": 1e-7, "grad_rel": 1e-4, "mismatched": 0, "infinite_losses": 0, "silently_wrong": N}
            rows += [{**_row("torch-cuDNN", 0.2 * N ** 0.5, role="baseline", **p), **err},
                     {**_row("torch-native", 0.15 * N ** 0.5, clock="kernel", role="baseline", **p), **err},
                     {**_row("torch-best", 0.2 * N ** 0.5, role="baseline", **p), "picked": "torch-cuDNN"}]
            rows += [{**_row(s.series, 0.05 * N ** 0.5 * (15 - s.number), **p), "loss_rel": 1e-7, "grad_rel": 1e-6,
                      "mismatched": 0, "infinite_losses": 0, "silently_wrong": 0,
                      "max_positions": POSITIONS[N == 1]} for s in ctc.CHAPTER.steps]
    for T in ctc.report.STRESS_T:
        for s in ctc.CHAPTER.steps[4:]:
            rows.append({**_row(f"stress {s.series}", 0.1, T=T, N=8, A=28, inputs="blank-heavy"),
                         "loss_rel": 1e-7 if s.number != 6 or T < 200 else math.inf,
                         "infinite_losses": 8 if s.number == 6 and T >= 200 else 0})
        lost = T >= 200
        for series, loses in (("step06", lost), ("step14", False), ("torch-cuDNN", lost and cudnn_loses),
                              ("torch-cuDNN F.ctc_loss", lost and cudnn_loses), ("torch-native", False)):
            rows.append({**_row(f"cudnn-set {series}", 0.1, clock="kernel", T=T, N=8, A=28, of=8,
                                inputs="blank-heavy"), "utterances": 8, "impossible": 0,
                         "infinite": 8 if loses else 0, "nan": 0, "finite_wrong": 0, "far": 0,
                         "right": 0 if loses else 8, "use_cudnn_ctc_loss": True})
    data = {"chapter": "ctc", "device": {"name": "Test GPU"}, "versions": {"torch": "x", "triton": "y"},
            "date": "2026-01-02T00:00:00+00:00", "git_commit": "abc", "command": "python -m studylog bench ctc",
            "ceilings": {"copy_bandwidth_gbs": 3000.0, "empty_launch_host_ms": 0.004}, "measurements": rows,
            "schema": 2}
    (tmp_path / "test-gpu").mkdir(exist_ok=True)
    (tmp_path / "test-gpu" / "ctc.json").write_text(json.dumps(data))
    return plotting.load_results("ctc", root=tmp_path)


def test_headline_on_the_new_benchmark_is_on_one_clock_and_names_the_baseline(tmp_path):
    results = new_results(tmp_path, cudnn_loses=False)
    rows = ctc.CHAPTER.headline(results)
    assert len(rows) == 3 and all(r["clock"] == "gpu" for r in rows)
    assert all("native path cannot be captured" in r["baseline"] for r in rows)
    # a file without the entry point: each case is read from the step its rule picks there
    from studylog.ctc.fused import final_step

    for r in rows:
        A, N = (int(re.search(rf"{name} = (\d+)", r["case"]).group(1)) for name in ("A", "N"))
        picked = final_step(ctc.BENCH_T, N, A, POSITIONS[N == 1])
        assert r["kernel"].startswith(ctc.CHAPTER.step(picked).name)
        assert r["speedup"] == pytest.approx(0.2 / (0.05 * (15 - picked)))  # step s: 0.05 sqrt(N) (15 - s)
    assert {r["kernel"].split()[0] for r in rows} >= {ctc.CHAPTER.final.name}
    assert "speedup_range" in rows[0] and rows[0]["host_ms"] == 0.02


def test_figures_draw_the_new_series_and_label_other_clocks(tmp_path):
    import matplotlib
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")
    results = new_results(tmp_path, cudnn_loses=False)
    figs = figures.figures(results)
    assert {"times", "speedup"} <= set(figs)
    labels = [t.get_text() for t in figs["times"].legends[0].get_texts()]
    assert "torch-native (kernel clock)" in labels and f"step {ctc.CHAPTER.final.number}: {ctc.CHAPTER.final.title}" in labels
    for fig in figs.values():
        assert len(fig.axes) <= 3  # at most three panels a figure
        for legend in fig.legends:
            assert all(t.get_fontsize() >= 9 for t in legend.get_texts())
        plt.close(fig)
    assert figures.label(results, "torch-cuDNN") == "torch-cuDNN"


def test_figures_keep_one_colour_per_series_and_a_linear_speedup_axis():
    import matplotlib
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")
    results = plotting.load_results("ctc", "nvidia-h200")
    figs = figures.figures(results)
    assert set(figs) == {"times", "speedup", "grain"}
    seen = {}
    for fig in figs.values():
        for ax in fig.axes:
            for line in ax.get_lines():
                label = line.get_label()
                if not label.startswith("_") and "floor" not in label:
                    assert seen.setdefault(label, line.get_color()) == line.get_color(), label
        plt.close(fig)
    assert all(ax.get_yscale() == "linear" for ax in figs["speedup"].axes)
    drawn = [c for series, c in figures.COLOURS.items() if series != "torch-best"]  # the baseline of ratios, not drawn
    assert len(set(drawn)) == len(drawn)


@pytest.mark.parametrize("cudnn_loses", [False, True])
def test_the_answer_to_the_blog_posts_question_follows_the_counts(tmp_path, cudnn_loses):
    verdict = lesson.cudnn_verdict(new_results(tmp_path, cudnn_loses=cudnn_loses))
    assert verdict["probability_space_lost"] == 16 and verdict["took_cudnn"]
    assert verdict["supports"] is cudnn_loses
    assert ("supports the hypothesis" in verdict["text"]) is cudnn_loses
    assert ("does not work in plain float32 probability space" in verdict["text"]) is not cudnn_loses
    cases = lesson.cudnn_cases(new_results(tmp_path, cudnn_loses=cudnn_loses))
    assert [c["T"] for c in cases] == list(ctc.report.STRESS_T)
    assert all(c["lost"]["step06"] == (8 if c["T"] >= 200 else 0) for c in cases)
    assert all(c["lost"]["torch-cuDNN"] == (8 if cudnn_loses and c["T"] >= 200 else 0) for c in cases)


def test_the_answer_is_pending_on_a_file_without_the_comparison():
    assert lesson.cudnn_verdict(lesson.load_options()) is None  # the options' run did not compare
    for f in plotting.result_files("ctc"):  # the committed runs made the comparison
        assert lesson.cudnn_verdict(plotting.load_results("ctc", f.parent.name)) is not None, f


def test_capture_probe_answers_for_every_torch_call():
    """Without a GPU the probe still answers (not capturable, with the reason); on a GPU it says which calls
    a graph can hold."""
    found = ctc.peers.capturable()
    assert set(found) == set(peers.TORCH_SERIES)
    for ok, why in found.values():
        assert isinstance(ok, bool) and (ok or why)
        if not torch.cuda.is_available():
            assert not ok


# --------------------------------------------------------------------------------------
# GPU: CUDA graphs, torch's paths
# --------------------------------------------------------------------------------------

def _random_batch(rng, T, N, A, max_target):
    tl = torch.randint(0, max_target + 1, (N,), generator=rng)
    tl[0] = max_target
    il = torch.randint(1, T + 1, (N,), generator=rng)
    il[0] = T
    targets = torch.randint(1, A, (N, max_target), generator=rng)
    return targets, il, tl


@pytest.mark.gpu
@pytest.mark.parametrize("step", [14, 13, 12, 11, 10, 9, 8, 7])
def test_plan_replays_in_a_cuda_graph_over_changing_inputs(step, rng):
    """Captured once; then new activations in the captured buffer and new targets and lengths (a different
    longest target each time) through set_targets; every replay against the float64 reference."""
    T, N, A, L = 48, 5, 13, 20
    plan = ctc.CTCPlan(T, N, A, L, step=step, device="cuda")
    x = torch.randn(T, N, A, device="cuda")
    plan.set_targets(*_random_batch(rng, T, N, A, L))
    plan(x)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss, grad = plan(x)
    for max_target in (L, 7, 0, 13):
        targets, il, tl = _random_batch(rng, T, N, A, max_target) if max_target else \
            (torch.zeros(N, 1, dtype=torch.long), torch.full((N,), T), torch.zeros(N, dtype=torch.long))
        x.copy_(torch.randn(T, N, A, generator=rng).cuda())
        plan.loss.fill_(SENTINEL)
        plan.grad.fill_(SENTINEL)
        plan.set_targets(targets, il, tl)
        graph.replay()
        torch.cuda.synchronize()
        ref_loss, ref_grad = ctc.reference_ctc(x, targets, il, tl)
        assert loss.data_ptr() == plan.loss.data_ptr() and not (loss == SENTINEL).any()
        assert not (grad == SENTINEL).any()
        err = ctc.errors(loss, grad, ref_loss, ref_grad)
        assert err["mismatched"] == 0 and err["loss_rel"] <= ctc.LOSS_TOLERANCE, (max_target, err)
        assert err["grad_rel"] <= ctc.GRAD_TOLERANCE, (max_target, err)


@pytest.mark.gpu
def test_ctc_loss_with_prepared_targets_captures_and_replays(rng):
    """The public entry point in a graph: prepared targets, caller's outputs; new activations each replay."""
    T, N, A = 40, 4, 9
    targets, il, tl = _random_batch(rng, T, N, A, 12)
    batch = ctc.prepare_targets(targets, il, tl, num_classes=A, max_time=T, device="cuda")
    x = torch.randn(T, N, A, device="cuda")
    loss, grad = torch.empty(N, device="cuda"), torch.empty(T, N, A, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ctc.ctc_loss(x, batch, out_loss=loss, out_grad=grad)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ctc.ctc_loss(x, batch, out_loss=loss, out_grad=grad)
    for _ in range(3):
        x.copy_(torch.randn(T, N, A, generator=rng).cuda())
        graph.replay()
        torch.cuda.synchronize()
        err = ctc.errors(loss, grad, *ctc.reference_ctc(x, targets, il, tl))
        assert err["mismatched"] == 0 and err["loss_rel"] <= ctc.LOSS_TOLERANCE
        assert err["grad_rel"] <= ctc.GRAD_TOLERANCE


@pytest.mark.gpu
def test_torch_takes_the_paths_the_benchmark_names(rng):
    """ATen's own rule agrees with the model, and the kernels launched tell cuDNN from torch's native path."""
    T, A = 60, 11
    lists = [torch.randint(1, A, (n,), generator=rng).numpy() for n in (3, 20, 1)]
    x = torch.randn(T, 3, A, generator=rng).cuda()
    log_probs = x.log_softmax(2)
    lengths = tuple(len(l) for l in lists)
    flat = ctc.peers.concatenated
    for targets, il in ((flat(lists), (T,) * 3), (flat(lists), (T, T - 1, T)),
                        (flat(lists).long(), (T,) * 3), (flat(lists).cuda(), (T,) * 3),
                        (ctc.padded(lists).int(), (T,) * 3)):
        assert bool(torch._use_cudnn_ctc_loss(log_probs, targets, il, lengths, 0)) == \
            peers.takes_cudnn_path(log_probs, targets, il, lengths), (targets.dtype, targets.device, il)
    cudnn = peers.kernel_names(peers.functional(x, lists, "cudnn"))
    native = peers.kernel_names(peers.functional(x, lists, "native"))
    assert any(peers.NATIVE_MARKER in n for n in native) and not any(peers.NATIVE_MARKER in n for n in cudnn)
    direct = peers.kernel_names(peers.cudnn_direct(x, lists))
    assert direct and not any(peers.NATIVE_MARKER in n for n in direct)


@pytest.mark.gpu
def test_torch_calls_agree_with_the_reference_on_gpu(rng):
    T, A = 70, 29
    lists = ctc.random_targets(T, 6, A, rng)
    x = torch.randn(T, 6, A, generator=rng).cuda()
    ref = ctc.reference_ctc(x, ctc.padded(lists).cuda(), [T] * 6, [len(l) for l in lists])
    for fn in (peers.cudnn_direct(x, lists), peers.functional(x, lists, "cudnn", reduction="none"),
               peers.functional(x, lists, "native", reduction="none")):
        err = ctc.errors(*fn(), *ref)
        assert err["mismatched"] == 0 and err["loss_rel"] <= ctc.FAR_LOSS and err["grad_rel"] <= ctc.FAR_GRAD, err


def test_plan_and_steps_say_what_they_were_given():
    plan = ctc.CTCPlan(10, 2, 5, 4, device="cpu")
    with pytest.raises(ValueError, match=r"of shape \(10, 2, 5\) \(the plan's\); got a float64 tensor of shape "
                                         r"\(10, 2, 5\) on cpu"):
        plan(torch.zeros(10, 2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="got a list"):
        plan([0.0])
    x = torch.zeros(10, 2, 5)
    targets, il, tl = torch.ones(2, 3, dtype=torch.long), [10, 10], [3, 2]
    with pytest.raises(ValueError, match=r"out_loss must be a float32 tensor of shape \(2,\), contiguous, on cpu; "
                                         r"got a float32 tensor of shape \(3,\) on cpu"):
        ctc.ctc_loss(x, targets, il, tl, out_loss=torch.empty(3))
    with pytest.raises(TypeError, match=r"out_grad must be a float32 tensor of shape \(10, 2, 5\).*; got a float16 "
                                         r"tensor of shape \(10, 2, 5\) on cpu"):
        ctc.step01_baseline(x, targets, il, tl, out_grad=torch.empty(10, 2, 5, dtype=torch.float16))
