"""Chapter 4 as a lesson (CPU): the exercises' checks accept the solutions and reject planted mistakes, and the
notebook's tables and glued numbers read the committed results and the new benchmark's series (or say
'pending')."""

import json
import math
from pathlib import Path

import pytest
import torch

from book.common import chain_factors, chain_table
from book.ctc import exercises, lesson, solutions
from studylog import ctc, plotting

from test_ctc_bench import new_results


# --------------------------------------------------------------------------------------
# Exercises
# --------------------------------------------------------------------------------------

def test_the_checks_accept_the_solutions(capsys):
    assert exercises.check_min_frames(solutions.frames_needed)
    assert exercises.check_min_frames(ctc.min_frames)
    assert exercises.check_forward(solutions.forward_loss)
    assert exercises.check_gradient(solutions.ctc_gradient)
    assert exercises.check_bank_ways(solutions.bank_conflict_ways)
    assert capsys.readouterr().out.count("agree") == 5


def _forward_without_the_skip_rule(log_probs, target):
    """A planted mistake: the skip from two positions back is allowed between equal labels too."""
    ext = exercises.extended(target)
    T, S = log_probs.shape[0], len(ext)
    alpha = [[-math.inf] * S for _ in range(T)]
    for s in range(min(2, S)):
        alpha[0][s] = float(log_probs[0, ext[s]])
    for t in range(1, T):
        for s in range(S):
            terms = [alpha[t - 1][s]] + ([alpha[t - 1][s - 1]] if s else [])
            if s >= 2 and ext[s] != 0:
                terms.append(alpha[t - 1][s - 2])
            alpha[t][s] = exercises.logsumexp(terms) + float(log_probs[t, ext[s]])
    return -exercises.logsumexp(alpha[-1][-2:] if S > 1 else alpha[-1][-1:])


@pytest.mark.parametrize("check, wrong, says", [
    (exercises.check_min_frames, len, "labels"),
    (exercises.check_forward, _forward_without_the_skip_rule, "target"),
    (exercises.check_forward, lambda lp, t: float("nan"), "expected"),
    (exercises.check_gradient, lambda x, t: solutions.ctc_gradient(x, t) - x.softmax(1), "largest |difference|"),
    (exercises.check_gradient, lambda x, t: solutions.ctc_gradient(x, t)[:-1], "shape"),
    (exercises.check_bank_ways, lambda grain, blocked: 1, "blocked layout"),
])
def test_the_checks_reject_a_planted_mistake_and_say_where(check, wrong, says, capsys):
    assert not check(wrong)
    out = capsys.readouterr().out
    assert "wrong:" in out and says in out


def test_the_kernel_exercise_compiles_the_answer_and_rejects_non_answers(capsys):
    """Exercise 6 on a CPU: NVRTC compiles the reader's step 8 and the check reads ptxas' report and the PTX (the
    GPU part says it was skipped); an unchanged source, a comment, or a source that does not compile fail."""
    assert exercises.check_unrolled(solutions.not_unrolled)
    out = capsys.readouterr().out
    assert "local accesses" in out and ("no GPU" in out) is not torch.cuda.is_available()
    for wrong, says in ((lambda s: s, "unchanged"),
                        (lambda s: s.replace("// downwards", "// changed: downwards"), "no more local memory"),
                        (lambda s: s + "\nnot C++\n", "does not compile")):
        assert not exercises.check_unrolled(wrong)
        assert says in capsys.readouterr().out


# --------------------------------------------------------------------------------------
# Tables and glued numbers
# --------------------------------------------------------------------------------------

def test_prose_numbers_and_tables_on_the_new_benchmark(tmp_path):
    results = new_results(tmp_path, cudnn_loses=False)
    numbers = lesson.prose_numbers(results)
    assert numbers["clock"] == "GPU clock"
    # the synthetic file: step k takes 0.05 sqrt(N) (11 - k) ms, torch-best 0.2 sqrt(N)
    assert numbers["final_small"] == numbers["final_big"] == "4.0×"
    assert numbers["branch_free"] == f"{4 / 3:.2f}×"
    table = lesson.results_table(results)
    assert "(kernel clock" not in table and "torch-native: kernel clock" in table
    assert "(3.8" in table  # the speedup's range over the repetitions: 0.98 x 0.2 / (1.03 x 0.05) ...
    for k in range(1, 11):
        assert ctc.CHAPTER.step(k).name in lesson.step_table(results, k)
    assert lesson.kernel_table(results).endswith(f"{lesson.PENDING}.")


def test_tables_say_pending_where_the_file_has_no_rows(tmp_path):
    data = json.loads(plotting.load_results("ctc", "nvidia-h200").path.read_text())
    data["measurements"] = [r for r in data["measurements"] if r["series"] in ("torch-cuDNN", "torch-best")]
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "ctc.json").write_text(json.dumps(data))
    results = plotting.load_results("ctc", root=tmp_path)
    assert lesson.step_table(results, 4).startswith(f"{ctc.CHAPTER.step(4).name}: {lesson.PENDING}")
    assert set(lesson.prose_numbers(results).values()) <= {lesson.PENDING}


def test_what_did_not_help_reads_the_lab_file_and_the_grain_sweep():
    table = lesson.tried_table(lesson.load_options(), plotting.load_results("ctc", "nvidia-h200"))
    rows = table.splitlines()[2:]
    assert len(rows) == 6 and all(lesson.PENDING not in r for r in rows)
    assert sum("over 18 points" in r for r in rows) == 4  # each option at every (A, N) of the grid
    assert "redux.sync" in table and "grain=2" in table and "blocked layout" in table


def test_the_dispatcher_exercise_judges_by_the_committed_grid(capsys):
    from studylog.plotting import result_files

    if not result_files("ctc"):
        pytest.skip("no committed CTC results")
    assert exercises.check_dispatcher(solutions.dispatcher)
    assert not exercises.check_dispatcher(lambda A, N, positions: 10)  # step 10 loses at one short utterance
    assert not exercises.check_dispatcher(lambda A, N, positions: 8)
    assert "not 9 or 10" in capsys.readouterr().out


def test_the_table_of_steps_reads_every_step_against_a_floor_it_does_not_beat():
    from studylog.plotting import load_results, result_files

    if not result_files("ctc"):
        pytest.skip("no committed CTC results")
    table = lesson.boehm_table(load_results("ctc"))
    rows = [r for r in table.splitlines()[3:] if r.startswith("|")]
    labels = [r.split("|")[1].strip() for r in rows]
    assert [x for x in labels if x.isdigit()] == [str(n) for n in range(1, 11)]
    assert labels[:10] == [str(n) for n in range(1, 11)]  # one row per numbered step, no lettered sub-rows
    assert "`__restrict__`" in table and " __restrict__" not in table.replace("`__restrict__`", "")
    for row, label in zip(rows, labels):
        if label[-1:].isalpha() and label[:1].isdigit():
            continue  # a change's own sub-row: no time of its own against the floor
        for cell in [c.strip() for c in row.split("|")[1:-1]][4::3]:
            if cell != "–":
                assert float(cell.rstrip("×").replace(",", "")) >= 1.0, row


def test_the_chain_floor_the_grid_range_and_the_kernel_parts_read_the_committed_runs():
    """The recursion's latency floor is the H200 tails run's chain kernel (T frames below 2T, both below the entry
    point's time; none on a card without that run); the speedup's extremes bracket the large alphabet's smallest;
    step 7's profile splits into its first pass, recursion and last pass where it was profiled."""
    results = plotting.load_results("ctc", "nvidia-h200")
    T = ctc.BENCH_T
    one, two = lesson.chain_floor_us(results, T), lesson.chain_floor_us(results, 2 * T)
    assert 0 < one < two < 2.5 * one < results.ms("ctc_loss", T=T, A=28, N=1) * 1e3
    assert lesson.chain_floor_us(plotting.load_results("ctc", "nvidia-h100-80gb-hbm3"), T) is None
    mins = lesson.speedup_minima(results)
    assert mins["all"][0] <= mins[max(ctc.BENCH_A)][0] <= mins["max"][0]
    parts = lesson.kernel_parts_us(results, "step07", 28, 1)
    assert set(parts) == {"first pass", "recursion", "last pass"} and min(parts.values()) > 0
    assert lesson.kernel_parts_us(results, "step07", 28, 2) is None


# --------------------------------------------------------------------------------------
# What the page says about its own rows (the entry point, torch-best, step 10, the null steps)
# --------------------------------------------------------------------------------------

def _raw(series, A, N):
    """A row of the committed H200 file read straight from its JSON, not through the lesson's helpers."""
    data = json.loads(plotting.load_results("ctc", "nvidia-h200").path.read_text())
    rows = [r for r in data["measurements"] if r["series"] == series
            and r["params"] == {"T": ctc.BENCH_T, "N": N, "A": A}]
    assert len(rows) == 1, (series, A, N)
    return rows[0]


def test_the_entry_point_row_is_its_own_series_beside_the_step_it_ran():
    results = plotting.load_results("ctc", "nvidia-h200")
    for A, N in lesson.BOEHM_CASES:
        entry = _raw("ctc_loss", A, N)
        step = _raw(entry["step"], A, N)
        got = lesson.entry_point(results, A, N)
        assert got["step"] == int(entry["step"].removeprefix("step"))
        assert got["us"] == pytest.approx(entry["ms"] * 1e3) and got["step_us"] == pytest.approx(step["ms"] * 1e3)
        assert got["ratio"] == pytest.approx(entry["ms"] / step["ms"])
        (e_lo, _, e_hi), (s_lo, _, s_hi) = entry["spread_ms"], step["spread_ms"]
        assert got["overlap"] == (max(e_lo, s_lo) <= min(e_hi, s_hi))
    table = lesson.boehm_table(results)
    assert "timed as its own series" in table
    assert lesson.entry_point(results, 28, 3) is None  # no such point


def test_the_entry_point_row_sits_under_step_10_with_the_step_it_ran_and_its_factor_over_step_9():
    """Step 10's row shows its own factors, plain (a loss where one warp holds the target included); the entry
    point's row follows it at once, each case's time naming the step it ran there and its factor over step 9."""
    results = plotting.load_results("ctc", "nvidia-h200")
    lines = lesson.boehm_table(results).splitlines()
    at = next(i for i, r in enumerate(lines) if r.startswith("| 10 |"))
    ten, entry = ([c.strip() for c in lines[k].split("|")[1:-1]] for k in (at, at + 1))
    assert entry[0] == "entry point" and "`ctc_loss`" in entry[1]
    for i, (A, N) in enumerate(lesson.TABLE_CASES):
        step10, step9, row = _raw("step10", A, N), _raw("step09", A, N), _raw("ctc_loss", A, N)
        assert ten[3 + 3 * i] == f"{step9['ms'] / step10['ms']:.2f}×", (A, N)
        ran = int(row["step"].removeprefix("step"))
        assert entry[2 + 3 * i] == f"{row['ms'] * 1e3:,.1f} (step {ran})", (A, N)
        assert entry[3 + 3 * i] == f"{step9['ms'] / row['ms']:.2f}× (vs step 9)", (A, N)
    assert any(_raw("step10", A, N)["warps"] == 1 for A, N in lesson.TABLE_CASES)  # a column where it loses
    assert "†" not in "\n".join(lines)


def test_the_host_times_read_the_committed_runs():
    """The host times are the headline rows' own, read straight from the JSON."""
    host = lesson.host_at_headline(5000, 8)
    raw = _raw("ctc_loss", 5000, 8)
    assert host["nvidia-h200"]["host_us"] == pytest.approx(raw["host_ms"] * 1e3)
    assert host["nvidia-h200"]["gpu_us"] == pytest.approx(raw["ms"] * 1e3)


def test_the_host_bound_cases_are_the_rows_whose_host_time_exceeds_their_gpu_time():
    """Each card's host-bound cases are its grid's rows (the entry point, or the step the entry point picks where the
    card's run does not time it) with host time per call above GPU time, as the landing page counts them; the page's
    card marks them in bold in its result table."""
    from studylog.ctc.fused import final_step

    for gpu in ("nvidia-h200", "nvidia-h100-80gb-hbm3"):
        bound = lesson.host_bound(gpu)
        if bound is None:
            continue
        data = json.loads(plotting.load_results("ctc", gpu).path.read_text())
        entry = any(r["series"] == "ctc_loss" for r in data["measurements"])
        rows = [r for r in data["measurements"] if r["params"].get("T") == ctc.BENCH_T and r.get("host_ms") is not None
                and r["series"] == ("ctc_loss" if entry else
                                    f"step{final_step(ctc.BENCH_T, r['params']['N'], r['params']['A']):02d}")]
        assert bound["of"] == len(rows) == len(ctc.BENCH_A) * len(ctc.BENCH_N)
        assert {(A, N) for A, N, _, _ in bound["cases"]} == {(r["params"]["A"], r["params"]["N"]) for r in rows
                                                             if r["host_ms"] > r["ms"]}
        assert all(host > gpu_us for _, _, host, gpu_us in bound["cases"])
    results = plotting.load_results("ctc", "nvidia-h200")
    lines = [line for line in lesson.results_table(results).splitlines()[2:] if line[2:3].isdigit()]
    bold = {tuple(int(c.strip().replace(",", "")) for c in line.split("|")[1:3])
            for line in lines if "**" in line.split("|")[6]}
    assert bold == {(A, N) for A, N, _, _ in lesson.host_bound("nvidia-h200")["cases"]}
    words = lesson.cases_words([(28, 1, 0, 0), (28, 2, 0, 0), (5000, 1, 0, 0)])
    assert words == "A = 28 at N = 1 and 2; A = 5,000 at N = 1"


def test_a_chains_anchor_gap_is_the_largest_gap_between_its_runs_steps_and_the_benchmarks():
    """The sentence under a chain table states how far the chain's run's steps sit from the table of steps: the
    largest gap over every anchor and case, computed from both files."""
    results = plotting.load_results("ctc", "nvidia-h200")
    ch = lesson.step08_chain()
    gaps = [abs(t / (results.select(lesson.CHAIN_ANCHORS[v], T=ctc.BENCH_T, A=A, N=N)[0]["ms"] * 1e3) - 1)
            for v, times in ch["anchors"].items() for (A, N), t in times.items()]
    assert set(ch["anchors"]) == {"library step 7", "library step 8"} and len(gaps) == 2 * len(ch["cases"])
    assert lesson.anchor_gap(results, ch) == pytest.approx(max(gaps))
    for changes in (lesson.step07_changes(), lesson.step08_changes()):
        assert all("in this table's run" in label for key, label in changes["labels"].items()
                   if key.startswith(("library", "step ")))

def test_step_7_states_what_was_measured_and_presents_no_unmeasured_alternative_as_a_number():
    """Change 2's ratios are the lab run's block-recursion row over its step 7 row; the page says the alternative is
    not measured and computes no time for it."""
    here = Path(__file__).resolve().parent.parent / "lab" / "ctc" / "results" / "nvidia-h200"
    data = json.loads((here / "step07_changes.json").read_text())
    ms = {(r["params"]["variant"], r["params"]["A"], r["params"]["N"]): r["ms"] for r in data["measurements"]}
    changes = lesson.step07_changes()
    for (a, n), (t, x) in changes["rows"]["block recursion"].items():
        assert t == pytest.approx(ms[("block recursion", a, n)] * 1e3)
        assert x == pytest.approx(ms[("block recursion", a, n)] / ms[("step 7", a, n)])
    page = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "04_ctc_loss.ipynb").read_text())
    text = " ".join("".join("".join(c["source"]) for c in page["cells"]).split())
    assert "no block version of them was built" in text and "needed_cut" not in text and not hasattr(lesson, "warp_layout_bar")


def test_the_results_caption_names_torch_best_at_every_point_and_the_kernel_clock_bias():
    results = plotting.load_results("ctc", "nvidia-h200")
    data = json.loads(results.path.read_text())
    best = [r for r in data["measurements"] if r["series"] == "torch-best" and r["params"]["T"] == ctc.BENCH_T]
    picks = {r["picked"] for r in best}
    words = lesson.torch_best_words(results)
    assert words in lesson.results_table(results)
    if picks == {"torch-cuDNN"}:
        assert f"torch-cuDNN at all {len(best)} points" in words
    for pick in picks:
        assert pick in words
    native = {(r["params"]["A"], r["params"]["N"]): r["ms"] for r in data["measurements"]
              if r["series"] == "torch-native" and r["params"]["T"] == ctc.BENCH_T}
    cudnn = {(r["params"]["A"], r["params"]["N"]): r["ms"] for r in data["measurements"]
             if r["series"] == "torch-cuDNN" and r["params"]["T"] == ctc.BENCH_T}
    both = set(native) & set(cudnn)
    assert "favours it" in words
    assert f"{sum(native[p] > cudnn[p] for p in both)} of {len(both)} points" in words


def test_the_tuning_steps_get_one_table_of_ratios_over_the_step_before():
    """Steps 2 to 5, one row each: every cell is the step before's time over the step's, at the points where the
    lesson timed steps 1 to 6, read straight from the JSON."""
    results = plotting.load_results("ctc", "nvidia-h200")
    rows = lesson.tuning_table(results).splitlines()
    points = [(A, N) for A in ctc.BENCH_A for N in (1, 16, 256)]
    assert len(rows) == 2 + 4 and [r.split("|")[1].strip() for r in rows[2:]] == ["2", "3", "4", "5"]
    assert "`__restrict__`" in rows[2] and "`__ldg`" in rows[3]
    for k, row in zip((2, 3, 4, 5), rows[2:]):
        cells = [c.strip() for c in row.split("|")[3:-1]]
        want = [f"{_raw(f'step0{k - 1}', A, N)['ms'] / _raw(f'step0{k}', A, N)['ms']:.2f}×" for A, N in points]
        assert cells == want, k


def test_the_grain_rule_and_sweep_summary_match_the_sweeps_own_targets():
    """The grain step 4 runs in the sweep is warp-ctc's rule on the sweep's longest extended target, found again
    by redrawing the sweep's targets (the benchmark's generator, seeded 1000 + A) on the CPU; the threads and the
    speedup of grain 1 over it are the JSON's rows'."""
    from studylog.ctc.report import SWEEP_N

    results = plotting.load_results("ctc", "nvidia-h200")
    data = json.loads(results.path.read_text())
    sweep = {(r["params"]["A"], r["params"]["grain"]): r for r in data["measurements"]
             if r["series"] == "step04 strided"}
    summary = lesson.grain_summary(results)
    assert set(summary) == set(ctc.BENCH_A)
    for A, got in summary.items():
        gen = torch.Generator().manual_seed(1000 + A)
        lists = ctc.random_targets(ctc.BENCH_T, SWEEP_N, A, gen)
        batch = ctc.prepare_targets(ctc.padded(lists), [ctc.BENCH_T] * SWEEP_N, [len(t) for t in lists],
                                    num_classes=A, max_time=ctc.BENCH_T, device="cpu")
        rule = math.ceil(batch.max_positions / 128)
        assert got["rule"] == rule and got["N"] == SWEEP_N
        threads = ctc.warpctc.block_threads(batch.max_positions, rule)
        assert sweep[(A, rule)]["threads"] == threads == got["rule_threads"]
        assert got["one_over_rule"] == pytest.approx(sweep[(A, rule)]["ms"] / sweep[(A, 1)]["ms"])
        fewest = [r["ms"] for (a, g), r in sweep.items() if a == A and r["threads"] == got["fewest_threads"]]
        assert got["flat"] == pytest.approx(max(fewest) / min(fewest) - 1) and len(fewest) == len(got["flat_grains"])


def test_the_dispatch_rows_pick_by_the_rule_and_compare_with_the_fastest_step():
    from studylog.ctc.fused import final_step

    results = plotting.load_results("ctc", "nvidia-h200")
    rows = lesson.dispatch_rows(results)
    assert len(rows) == len(ctc.BENCH_A) * len(ctc.BENCH_N)
    data = json.loads(results.path.read_text())
    ms = {(m["series"], m["params"]["A"], m["params"]["N"]): m["ms"] for m in data["measurements"]
          if m["series"].startswith("step") and m.get("clock") == "gpu" and set(m["params"]) == {"T", "N", "A"}
          and m["params"]["T"] == ctc.BENCH_T}
    for r in rows:
        A, N = r["A"], r["N"]
        timed = [t for (series, a, n), t in ms.items() if (a, n) == (A, N)]
        assert r["picked"] == final_step(ctc.BENCH_T, N, A)
        assert r["over_fastest"] == pytest.approx(ms[(f"step{r['picked']:02d}", A, N)] / min(timed))
    assert lesson.dispatch_table(results).count("\n") == len(rows) + 1


def test_step_8_changes_read_the_lab_run_or_say_nothing(monkeypatch):
    """Without the lab run the page gets None (and says the change is not measured alone); with one, each row's
    ratio is its time over step 8's in the same run."""
    monkeypatch.setattr(lesson, "lab_or_none", lambda *a, **k: None)
    assert lesson.step08_changes() is None
    times = {"library step 8": 40.0, "branch put back": 50.0, "exp2f and __log2f": 44.0, "+ redux max": 41.0,
             "+ prefetch 8": 39.0, "library step 7": 80.0}
    measurements = [{"params": {"variant": v, "A": A, "N": N}, "ms": t * k / 1e3}
                    for k, (A, N) in enumerate([(28, 1), (5000, 256)], 1) for v, t in times.items()]
    fake = {"measurements": measurements, "checks": [{"passed": True}, {"passed": False, "name": "x"}]}
    monkeypatch.setattr(lesson, "lab_or_none", lambda *a, **k: fake)
    got = lesson.step08_changes()
    assert got["cases"] == [(28, 1), (5000, 256)] and len(got["failed"]) == 1
    assert got["rows"]["branch put back"][(5000, 256)] == pytest.approx((100.0, 1.25))
    table = lesson.changes_table(got)
    assert "| step 8 (both changes), in this table's run | 40.0 (1.00×) | 80.0 (1.00×) |" in table
    assert "`exp2f`/`__log2f` instead of flush-to-zero `ex2`/`lg2`, taken back" in table and "(2.00×)" in table


def test_the_page_shows_no_flush_to_zero_number_from_another_clock():
    from book.common import prose_words
    from studylog import paths

    page = paths.REPO_ROOT / "notebooks" / "04_ctc_loss.ipynb"
    cells = json.loads(page.read_text())["cells"]
    text = "".join("".join(c["source"]) for c in cells)
    assert "ftz_effect" not in text and "do_bench" not in text
    assert "lesson.step08_chain()" in text and "lesson.step07_chain()" in text
    assert prose_words(page) <= 2500


def test_the_floor_is_the_scoreboards_on_every_card():
    """One floor a card on every page: the bytes at the run's copy bandwidth, or the card's fastest empty kernel (the
    smallest of all its committed runs, as the scoreboard takes it) where that is larger."""
    from book import scoreboard
    from studylog.ctc.report import dram_bytes

    for gpu in ("nvidia-h200", "nvidia-h100-80gb-hbm3"):
        results = plotting.load_results("ctc", gpu)
        empty = scoreboard.card_empty_kernel_ms(results.path.parent)
        bandwidth = results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9
        for A, N in ((28, 1), (5000, 256)):
            by_bytes = dram_bytes(lesson.BENCH_T, N, A) / bandwidth * 1e6
            assert lesson.floor_us(results, A, N) == pytest.approx(max(by_bytes, empty * 1e3), rel=1e-12)
        assert lesson.floor_us(results, 28, 1) == pytest.approx(empty * 1e3)  # a few bytes: the empty kernel binds


def test_the_steps_table_floors_the_small_case_at_the_chain_where_the_card_timed_it():
    for gpu in ("nvidia-h200", "nvidia-h100-80gb-hbm3"):
        results = plotting.load_results("ctc", gpu)
        chain = lesson.chain_floor_us(results, ctc.BENCH_T)
        row = next(line for line in lesson.boehm_table(results).splitlines() if line.startswith("| | floor"))
        small = row.split(" | ")[2]
        want = max(lesson.floor_us(results, *lesson.BOEHM_CASES[0]), chain or 0.0)
        kind = "chain of T frames" if chain is not None else "empty kernel"
        assert small == f"{want:,.1f} ({kind})"


def test_every_case_has_one_floor_on_the_page():
    """The table of steps and the result table divide a case's time by the same floor: the larger of the bytes (or
    the empty kernel) and the measured chain of T frames, which applies where the case's longest target has at least
    the chain's positions (every case of the grid)."""
    results = plotting.load_results("ctc", "nvidia-h200")
    chain = lesson.chain_floor_us(results, ctc.BENCH_T)
    for A in ctc.BENCH_A:
        for N in ctc.BENCH_N:
            floor, kind = lesson.case_floor(results, A, N)
            assert lesson.longest_target(results, A, N) >= lesson.longest_target(results, *lesson.BOEHM_CASES[0])
            assert floor == pytest.approx(max(chain, lesson.floor_us(results, A, N)))
            assert kind == ("chain" if chain > lesson.floor_us(results, A, N) else "bytes")
    results_rows = {tuple(int(c.strip().replace(",", "")) for c in line.split("|")[1:3]): line
                    for line in lesson.results_table(results).splitlines()[2:] if line[2:3].isdigit()}
    floor_row = next(line for line in lesson.boehm_table(results).splitlines() if line.startswith("| | floor"))
    cells = [c.strip() for c in floor_row.split("|")[1:-1]][2::3]
    entry = next(line for line in lesson.boehm_table(results).splitlines() if line.startswith("| entry point"))
    entry_over = [c.strip() for c in entry.split("|")[1:-1]][4::3]
    for (A, N), cell, over in zip(lesson.TABLE_CASES, cells, entry_over):
        line = results_rows[(A, N)]
        assert f"| {cell} |" in line and line.rstrip(" |").endswith(over), (A, N)
    small = results_rows[lesson.BOEHM_CASES[0]]
    assert f"{chain:,.1f} (chain of T frames)" in small


def _fake_step07_chain(folder: Path) -> Path:
    """A step07_chain.json written under ``folder`` (a ``lab`` folder outside the repository) with the run's schema:
    the rows of the committed one-at-a-time run that the chain shares (steps 5 and 7, and 7c, whose knobs are
    "directions in turn"), and made-up times for 7a and 7b."""
    here = Path(__file__).resolve().parent.parent / "lab" / "ctc" / "results" / "nvidia-h200"
    data = json.loads((here / "step07_changes.json").read_text())
    rows = []
    for m in data["measurements"]:
        v = m["params"]["variant"]
        if v in ("library step 5", "library step 7", "step 7"):
            rows.append(m)
        if v == "directions in turn":
            rows.append(m | {"params": m["params"] | {"variant": "7c"}})
        if v == "library step 5":
            rows += [m | {"params": m["params"] | {"variant": k}, "ms": m["ms"] * f, "bit_identical_to_step07": True}
                     for k, f in (("7a", 0.5), ("7b", 0.3))]
    out = folder / "ctc" / "results" / "nvidia-h200" / "step07_chain.json"
    out.parent.mkdir(parents=True)
    out.write_text(json.dumps(data | {"measurements": rows}))
    return folder


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("|")[1:-1]]


def _table(ch: dict) -> str:
    """A chain as the page draws it: the book's one chain-table renderer, the chapter's case names."""
    return chain_table(ch["rows"], ch["cases"], lesson.case_name)


def _assert_cumulative(table: str, links) -> None:
    """A chain table: one row per link, each label once, in the chain's order; the first row the anchor; each
    "× previous" the row above's µs over this row's, "does not pay" exactly where it is below 1.00×; no "–"."""
    lines = table.splitlines()
    assert _cells(lines[0])[:4] == ["row", "the one change", "A = 28, N = 1: µs", "× previous"]
    rows = [_cells(line) for line in lines[2:]]
    assert [r[0] for r in rows] == [label for label, _, _ in links]
    assert len({r[0] for r in rows}) == len(rows) and "–" not in table
    assert all(cell == "anchor" for cell in rows[0][3::2])
    for above, row in zip(rows, rows[1:]):
        for i in range(2, len(row), 2):
            x = float(above[i].replace(",", "")) / float(row[i].replace(",", ""))
            assert row[i + 1].startswith(f"{x:.2f}×"), (row[0], row[i + 1], x)
            assert row[i + 1].endswith(", does not pay") == (round(x, 2) < 1), row


def test_the_main_table_has_no_lettered_rows_and_names_the_bundled_steps():
    results = plotting.load_results("ctc", "nvidia-h200")
    rows = [_cells(line) for line in lesson.boehm_table(results).splitlines()[3:] if line.startswith("|")]
    labels = [r[0] for r in rows]
    assert not any(label[:1].isdigit() and label[-1:].isalpha() for label in labels)
    cells = {r[0]: r[1] for r in rows}
    assert "(four changes: in step 7's section)" in cells["7"]
    assert "(two changes: in step 8's section)" in cells["8"]
    assert "changes:" not in "".join(v for k, v in cells.items() if k not in ("7", "8"))
    # step 7's cell names its idea's three changes, then its prerequisite; step 8's its idea, then its tuning; and
    # nothing that reads as the opposite of 7a
    order = ["a new structure", "gradient a pass of its own", "no softmax written", "alpha and beta side by side",
             "plus a prerequisite, one warp per direction"]
    assert [cells["7"].index(w) for w in order] == sorted(cells["7"].index(w) for w in order)
    assert cells["8"].index("without its divergent branch") < cells["8"].index("plus one tuning, flush-to-zero")
    assert "fused gradient" not in cells["7"] and "below" not in lesson.boehm_table(results)


def test_the_rows_of_steps_7_and_8_say_what_their_kept_losses_cost():
    """Step 7's row gives where its prerequisite (7c) costs time in its chain and the most of step 7's time that
    taking it back saves (the folded table's "block recursion" row); step 8's, where flush-to-zero costs time. All
    computed from the committed runs: the words must follow the numbers."""
    results = plotting.load_results("ctc", "nvidia-h200")
    cells = {r[0]: r[1] for r in (_cells(line) for line in lesson.boehm_table(results).splitlines()[3:]
                                  if line.startswith("| "))}
    x7c = chain_factors(lesson.step07_chain()["rows"])["7c"]
    lost = [x for x in x7c.values() if round(x, 2) < 1]
    assert lost and all(f"{x:.2f}×" in cells["7"] for x in lost)
    assert {A for (A, _), x in x7c.items() if round(x, 2) < 1} == {5000} and "at A = 5,000 (" in cells["7"]
    saved = 1 - min(r for _, r in lesson.step07_changes()["rows"]["block recursion"].values())
    assert f"taken back, step 7 takes up to {saved:.0%} less time" in cells["7"] and saved > 0.2
    x8 = chain_factors(lesson.step08_chain()["rows"])["8"]
    lost8 = {case: x for case, x in x8.items() if round(x, 2) < 1}
    assert lost8 and all(f"A = {A:,}, N = {N} ({x:.2f}×)" in cells["8"] for (A, N), x in lost8.items())


def test_step_8s_chain_is_cumulative_from_its_committed_run():
    """Step 7 -> 8a (step 7 with the branch-free sum) -> step 8, all from one run, each row one change more."""
    ch = lesson.step08_chain()
    assert ch["cases"] == list(lesson.TABLE_CASES) and not ch["failed"]
    _assert_cumulative(_table(ch), lesson.STEP08_CHAIN)
    x = chain_factors(ch["rows"])
    raw = lesson.step08_changes()["rows"]
    for case in lesson.TABLE_CASES:  # 8a is "exp2f and __log2f" (step 8 without flush-to-zero)
        assert x["8"][case] == pytest.approx(raw["exp2f and __log2f"][case][1])


def test_step_7s_chain_reads_its_run_and_is_cumulative(tmp_path):
    """Against a run written outside the repository with the chain's schema: cumulative rows, the anchors found,
    bit identity read from the rows; no run, a loud error (the page has no step 7 section without it)."""
    with pytest.raises(FileNotFoundError):
        lesson.step07_chain(root=tmp_path)
    ch = lesson.step07_chain(root=_fake_step07_chain(tmp_path / "lab"))
    assert ch["cases"] == list(lesson.TABLE_CASES)
    assert set(ch["anchors"]) == {"library step 5", "library step 7"}
    assert all(ch["identical"][v] for _, v, _ in lesson.STEP07_CHAIN[1:])
    table = _table(ch)
    _assert_cumulative(table, lesson.STEP07_CHAIN)
    assert ", does not pay" in table  # 7c at A = 28: the committed run's "directions in turn" over made-up 7b


def test_step_7s_chain_run_is_committed():
    """The page reads lab/ctc/results/nvidia-h200/step07_chain.json (lab/ctc/step07_changes.py measure --chain on a
    GPU): until it is committed this fails, as the page does."""
    ch = lesson.step07_chain()
    assert not ch["failed"] and ch["cases"] == list(lesson.TABLE_CASES)
    assert all(ch["identical"][v] for _, v, _ in lesson.STEP07_CHAIN[1:])
    _assert_cumulative(_table(ch), lesson.STEP07_CHAIN)

def _page_cells():
    return json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "04_ctc_loss.ipynb").read_text())["cells"]


def test_the_page_says_once_why_the_losing_changes_stay():
    """One sentence each, said once: why the warp recursion stays where it does not pay, and why flush-to-zero stays;
    no step 7d, and no change left only in a note."""
    text = " ".join("".join("".join(c["source"]) for c in _page_cells()).split())
    assert text.count("a prerequisite: steps 8 to 10 build on it") == 1
    assert text.count("it stays because it pays elsewhere") == 1
    assert "7d" not in text and "a loss, kept" not in text and "timed alone" not in text
    folds = [c["metadata"].get("mystnb", {}).get("code_prompt_show") for c in _page_cells()]
    assert "Show each change taken back from step 7" in folds and "Show each change taken back from step 8" in folds

def test_every_folded_cell_says_what_it_folds():
    """A hidden cell's toggle names its contents (myst-nb's per-cell code_prompt_show / code_prompt_hide), not
    the default "Show code cell outputs"."""
    for i, cell in enumerate(_page_cells()):
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell["cell_type"] == "code" and tags & {"hide-input", "hide-output", "hide-cell"}:
            prompts = cell["metadata"].get("mystnb", {})
            assert prompts.get("code_prompt_show", "").startswith("Show "), i
            assert prompts.get("code_prompt_hide", "").startswith("Hide "), i
            assert "code cell" not in prompts["code_prompt_show"], i


def test_bundled_steps_open_on_their_effect_and_chains_use_the_books_note():
    """Steps 7 and 8 open with one sentence naming the idea and its measured effect, and 7c is called a
    prerequisite; steps 2 to 5 share one section without sub-headings, and steps 4 and 5 each have a diff against
    the step before; each chain's note is the book's (:func:`book.common.chain_note`), not a sentence of its own; the
    page names the committed files it reads."""
    cells = _page_cells()
    for n, effect in ((7, "fused_vs_rows"), (8, "branch_free")):
        heads = [i for i, c in enumerate(cells) if "".join(c["source"]).startswith(f"## Step {n}:")]
        opening = "".join(cells[heads[0] + 1]["source"])
        assert len(heads) == 1 and f"Step {n} " in opening and effect in opening, n
    folds = [c["metadata"].get("mystnb", {}).get("code_prompt_show", "") for c in cells]
    assert "Show step 4's diff: the alpha kernel, step 3 to step 4" in folds
    assert "Show step 5's diff: the alpha kernel, step 4 to step 5" in folds
    text = "".join("".join(c["source"]) for c in cells)
    assert not any(f"### Step {n}" in text for n in (2, 3, 4, 5))
    assert text.count("chain_note(") == 2 and "its step times may differ" not in text
    assert "how_we_measure.md#a-step-timed-one-change-at-a-time" in text
    where = text[text.index("## Where the numbers come from"):text.index("## Further reading")]
    for name in ("ctc.json", "tails.json", "step07_chain.json", "step07_changes.json", "step08_changes.json"):
        assert name in where
