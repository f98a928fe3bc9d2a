"""Chapter 4 as a lesson (CPU): the exercises' checks accept the solutions and reject planted mistakes, and the
notebook's tables and glued numbers read the committed results and the new benchmark's series (or say
'pending')."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

from book.ctc import compiled as book_compiled
from book.ctc import exercises, lesson, solutions
from studylog import ctc, plotting

import lab_scripts
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
    """Exercise 6 on a CPU: NVRTC compiles the reader's step 12 and the check reads ptxas' report and the PTX (the
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
    # the synthetic file: step k takes 0.05 sqrt(N) (15 - k) ms, torch-best 0.2 sqrt(N)
    assert numbers["final_small"] == numbers["final_big"] == "4.0×"
    assert numbers["branch_free"] == f"{5 / 4:.2f}×" and numbers["gradient_pass"] == f"{10 / 8:.2f}×"
    assert numbers["ftz"] == f"{4 / 3:.2f}×" and numbers["ftz_slower"] == numbers["one_warp_slower"] == ""
    table = lesson.results_table(results)
    assert "(kernel clock" not in table and "torch-native: kernel clock" in table
    assert "(3.8" in table  # the speedup's range over the repetitions: 0.98 x 0.2 / (1.03 x 0.05) ...
    for k in range(1, 15):
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
    assert not exercises.check_dispatcher(lambda A, N, positions: 14)  # step 14 loses at one short utterance
    assert not exercises.check_dispatcher(lambda A, N, positions: 12)
    assert "not 13 or 14" in capsys.readouterr().out


def test_the_table_of_steps_reads_every_step_against_a_floor_it_does_not_beat():
    from studylog.plotting import load_results, result_files

    if not result_files("ctc"):
        pytest.skip("no committed CTC results")
    table = lesson.boehm_table(load_results("ctc"))
    rows = [r for r in table.splitlines()[3:] if r.startswith("|")]
    labels = [r.split("|")[1].strip() for r in rows]
    # one row per step of the benchmark, in step order (step 7's three changes, 7a to 7c, are a table of their own,
    # from the one run that timed them); no group rows
    assert labels[:14] == [str(n) for n in range(1, 15)]
    assert not any(label.startswith("**") for label in labels) and " · " not in table
    assert "`__restrict__`" in table and " __restrict__" not in table.replace("`__restrict__`", "")
    for row, label in zip(rows, labels):
        for cell in [c.strip() for c in row.split("|")[1:-1]][5::3]:
            if cell != "–":
                assert float(cell.rstrip("×").replace(",", "")) >= 1.0, row


def test_every_step_is_timed_at_every_column_of_the_table_of_steps():
    """The table shows the arc at cases where every step was timed (7a and 7b in the lab run), the headline case its
    second column: no step row has an empty time."""
    results = plotting.load_results("ctc", "nvidia-h200")
    assert lesson.TABLE_CASES[1] == lesson.HEADLINE_CASE
    rows = [_cells(line) for line in lesson.boehm_table(results).split("\n\n")[0].splitlines()[3:]]
    for row in rows:
        assert all(cell != "–" for cell in row[3::3]), row[0]
    note = lesson.boehm_table(results).split("\n\n", 1)[1]
    assert "separate run" not in note and "not timed" not in note  # the run is named on the page, not under the table


def test_the_chain_floor_the_grid_range_and_the_kernel_parts_read_the_committed_runs():
    """The recursion's latency floor is the H200 tails run's chain kernel (T frames below 2T, both below the entry
    point's time; none on a card without that run); the speedup's extremes bracket the large alphabet's smallest;
    each fused step's profile splits into its first pass, recursion and last pass where it was profiled."""
    results = plotting.load_results("ctc", "nvidia-h200")
    T = ctc.BENCH_T
    one, two = lesson.chain_floor_us(results, T), lesson.chain_floor_us(results, 2 * T)
    assert 0 < one < two < 2.5 * one < results.ms("ctc_loss", T=T, A=28, N=1) * 1e3
    assert lesson.chain_floor_us(plotting.load_results("ctc", "nvidia-h100-80gb-hbm3"), T) is None
    mins = lesson.speedup_minima(results)
    assert mins["all"][0] <= mins[max(ctc.BENCH_A)][0] <= mins["max"][0]
    # the least lead names every case that prints it (the result table shows them all), in the opening and the result
    low = f"{mins['all'][0]:.2f}"
    tied = [(A, N) for A in ctc.BENCH_A for N in ctc.BENCH_N
            if f"{_raw('torch-best', A, N)['ms'] / _raw('ctc_loss', A, N)['ms']:.2f}" == low]
    assert lesson.least_cases(results) == lesson.where(tied) and (mins["all"][1], mins["all"][2]) in tied
    checks = [c for c in json.loads(results.path.read_text())["checks"] if c["name"].startswith("step12 ")]
    ftz = lesson.float64_checks(results, 12)  # step 12's sentence: flushing subnormals moves no result past the check
    assert ftz["passed"] == all(c["passed"] for c in checks) and ftz["shapes"] == len(
        {tuple(sorted(c["params"].items())) for c in checks})
    cells = {c["id"]: "".join(c["source"]) for c in _page_cells()}
    opening, result = cells["opening-ctc"], cells["result-first-ctc"]
    strong = lesson.speedup_minima(results, strongest=True)
    strong_max = strong["max"][0]
    assert "lesson.least_cases(results, strongest=True)" in opening
    assert "speedup_minima(results, strongest=True)" in opening
    # the result section gives the opening's range first, then the figure's (GPU clock alone), each named
    assert "lesson.least_cases(results, strongest=True)" in result and "speedup_minima(results, strongest=True)" in result
    assert "Against the faster of PyTorch's two CTC paths" in result
    assert "gpu_only = lesson.speedup_minima(results)" in result and "GPU clock alone" in result
    # one sentence reconciles the two ranges: where torch-native (kernel clock) is faster than cuDNN, the range uses it
    assert "native = lesson.native_faster(results)" in result and "the range above uses it there" in result
    native = lesson.native_faster(results)
    assert [(r["A"], r["N"]) for r in native] == [
        (A, N) for A in ctc.BENCH_A for N in ctc.BENCH_N
        if _raw("torch-native", A, N)["ms"] < _raw("torch-best", A, N)["ms"]]
    for r in native:
        assert r["over_native"] == pytest.approx(_raw("torch-native", r["A"], r["N"])["ms"]
                                                 / _raw("ctc_loss", r["A"], r["N"])["ms"])
        assert r["over_native"] < r["over_cudnn"]
    assert any(r["over_cudnn"] == pytest.approx(mins["max"][0]) for r in native) == (mins["max"][0] > strong_max)
    assert "low[2]" not in opening + result
    # the opening's range is against the faster of torch's two paths at each case (native on its kernel clock)
    rival = {(A, N): min(_raw("torch-best", A, N)["ms"], _raw("torch-native", A, N)["ms"])
             / _raw("ctc_loss", A, N)["ms"] for A in ctc.BENCH_A for N in ctc.BENCH_N}
    assert strong["max"][0] == pytest.approx(max(rival.values()))
    assert strong["max"][0] < mins["max"][0] if native else strong["max"][0] == pytest.approx(mins["max"][0])
    assert strong["all"][0] == pytest.approx(min(rival.values()))
    assert lesson.least_cases(results, strongest=True) == lesson.where(
        [c for c, r in rival.items() if f"{r:.2f}" == f"{strong['all'][0]:.2f}"])
    for k in range(7, 15):
        parts = lesson.kernel_parts_us(results, ctc.CHAPTER.step(k).series, 28, 1)
        assert set(parts) == {"first pass", "recursion", "last pass"} and min(parts.values()) > 0, k
    assert lesson.kernel_parts_us(results, "step07", 28, 2) is None


# --------------------------------------------------------------------------------------
# What the page says about its own rows (the entry point, torch-best, step 14, the null steps)
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
    assert "the step it ran over the call (what the choice costs)" in table
    assert lesson.entry_point(results, 28, 3) is None  # no such point


def _tied(ratio: float, against: str = "", same: tuple[float, float] | None = None) -> str:
    """A "× prev." cell as the table of steps prints it: the ratio, what it is against where that is not the row
    above, "tie" where it is one (0.97× to 1.03× at two decimals, the course's rule), and where the ratio crosses
    from the benchmark to the lab run of 7a to 7c, that run's two times (``same``, ms) it divides."""
    notes = ", ".join(w for w in (against, "tie" if 0.97 <= round(ratio, 2) <= 1.03 else "") if w)
    if same:
        notes += ("; " if notes else "") + f"{lesson.STEP07_RUN}: {same[0] * 1e3:,.1f} → {same[1] * 1e3:,.1f} µs"
    return f"{ratio:.2f}×" + (f" ({notes})" if notes else "")


def test_the_entry_point_row_sits_under_step_14_with_the_step_it_ran_and_its_factor_over_that_step():
    """Step 14's row shows its own factors (a loss where one warp holds the target names the step the entry point
    runs there); the entry
    point's row follows it at once, each case's time naming the step it ran there and that step's time (timed as a
    step) over the entry point's: what the choice costs."""
    results = plotting.load_results("ctc", "nvidia-h200")
    lines = lesson.boehm_table(results).splitlines()
    at = next(i for i, r in enumerate(lines) if r.startswith("| 14 |"))
    last, entry = ([c.strip() for c in lines[k].split("|")[1:-1]] for k in (at, at + 1))
    assert entry[0] == "entry point" and entry[1] == "the result" and "`ctc_loss`" in entry[2]
    for i, (A, N) in enumerate(lesson.TABLE_CASES):
        step14, step13, row = _raw("step14", A, N), _raw("step13", A, N), _raw("ctc_loss", A, N)
        ran = int(row["step"].removeprefix("step"))
        where = "" if ran == 14 or _tied(step13['ms'] / step14['ms']).endswith("(tie)") else \
            f"the entry point runs step {ran} here"  # a loss names the step the entry point runs there
        assert last[4 + 3 * i] == _tied(step13['ms'] / step14['ms'], where), (A, N)
        assert ran in (12, 14) and entry[3 + 3 * i] == f"{row['ms'] * 1e3:,.1f} (step {ran})", (A, N)
        own = _raw(f"step{ran:02d}", A, N)
        assert entry[4 + 3 * i] == _tied(own['ms'] / row['ms'], f"vs step {ran}"), (A, N)
    assert any(_raw("step14", A, N)["warps"] == 1 for A, N in lesson.TABLE_CASES)  # a column where it loses
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
    from studylog.ctc.results import entry_series

    for gpu in ("nvidia-h200", "nvidia-h100-80gb-hbm3"):
        bound = lesson.host_bound(gpu)
        if bound is None:
            continue
        data = json.loads(plotting.load_results("ctc", gpu).path.read_text())
        results = plotting.load_results("ctc", gpu)
        rows = [r for r in data["measurements"] if r["params"].get("T") == ctc.BENCH_T and r.get("host_ms") is not None
                and set(r["params"]) == {"T", "N", "A"}
                and r["series"] == entry_series(results, T=ctc.BENCH_T, N=r["params"]["N"], A=r["params"]["A"])]
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
    """The steps tried and dropped (2, 3 and 6), one row each: every cell is the step before's time over the step's,
    at the points where the lesson timed steps 1 to 6, read straight from the JSON; the last cell says why it was
    dropped (2 and 3: a tie at every case)."""
    results = plotting.load_results("ctc", "nvidia-h200")
    rows = lesson.tuning_table(results).splitlines()
    points = [(A, N) for A in ctc.BENCH_A for N in ctc.report.LESSON_N]
    assert len(rows) == 2 + 3 and [r.split("|")[1].strip() for r in rows[2:]] == ["2", "3", "6"]
    assert "`__restrict__`" in rows[2] and "`__ldg`" in rows[3]
    for k, row in zip((2, 3, 6), rows[2:]):
        cells = [c.strip() for c in row.split("|")[3:-1]]
        want = [f"{_raw(f'step0{k - 1}', A, N)['ms'] / _raw(f'step0{k}', A, N)['ms']:.2f}×" for A, N in points]
        assert cells[:-1] == want, k
        assert cells[-1].startswith("a tie at every case") == (k != 6), k


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
    grid = [r for r in rows if r["inputs"] == "random" and r["T"] == ctc.BENCH_T]
    assert len(grid) == len(ctc.BENCH_A) * len(ctc.BENCH_N)
    data = json.loads(results.path.read_text())
    ms = {(m["series"].removeprefix("stress "), m["params"]["T"], m["params"]["A"], m["params"]["N"],
           m["params"].get("inputs", "random")): m for m in data["measurements"]
          if m.get("clock") == "gpu" and set(m["params"]) - {"inputs"} == {"T", "N", "A"}
          and (m["series"].removeprefix("stress ").startswith("step") and " " not in m["series"].removeprefix("stress ")
               or m["series"].removeprefix("stress ") == "ctc_loss")}
    for r in rows:
        key = (r["T"], r["A"], r["N"], r["inputs"])
        timed = [m["ms"] for (series, *k), m in ms.items() if tuple(k) == key and series != "ctc_loss"]
        assert r["picked"] == final_step(r["T"], r["N"], r["A"], r["positions"])
        assert r["positions"] == ms[(f"step{r['picked']:02d}", *key)]["max_positions"]
        mine = ms.get(("ctc_loss", *key)) or ms[(f"step{r['picked']:02d}", *key)]
        assert r["over_fastest"] == pytest.approx(mine["ms"] / min(timed))
    assert lesson.dispatch_table(results).count("\n") >= len(rows) + 1


def test_the_floor_is_the_scoreboards_on_every_card():
    """One floor a run on every page: the bytes at the run's copy bandwidth, or the run's own empty kernel (as the
    scoreboard takes it) where that is larger."""
    from book import scoreboard
    from studylog.ctc.report import dram_bytes

    for gpu in ("nvidia-h200", "nvidia-h100-80gb-hbm3"):
        results = plotting.load_results("ctc", gpu)
        empty = scoreboard.empty_kernel_ms(results.data)
        bandwidth = results.data["ceilings"]["copy_bandwidth_gbs"] * 1e9
        for A, N in ((28, 1), (5000, 256)):
            by_bytes = dram_bytes(lesson.BENCH_T, N, A) / bandwidth * 1e6
            assert lesson.floor_us(results, A, N) == pytest.approx(max(by_bytes, empty * 1e3), rel=1e-12)
        assert lesson.floor_us(results, 28, 1) == pytest.approx(empty * 1e3)  # a few bytes: the empty kernel binds


def test_the_steps_table_floors_the_small_case_at_its_own_chain_where_the_card_timed_it():
    for gpu in ("nvidia-h200", "nvidia-h100-80gb-hbm3"):
        results = plotting.load_results("ctc", gpu)
        chain = lesson.case_chain_us(results, *lesson.BOEHM_CASES[0])
        row = next(line for line in lesson.boehm_table(results).splitlines() if line.startswith("| | | floor"))
        small = _cells(row)[3]
        want = max(lesson.floor_us(results, *lesson.BOEHM_CASES[0]), chain or 0.0)
        kind = "chain of T frames" if chain is not None else "empty kernel"
        assert small == f"{want:,.1f} ({kind})"


def test_every_case_has_one_floor_on_the_page():
    """The table of steps and the result table divide a case's time by the same floor, by one rule for every row,
    the tightest: the larger of the bytes (or the empty kernel) and the case's own chain of T frames over its longest
    target's states, timed for every case of the grid by the lab run (lab/ctc/case_chains.py). The H100 timed no
    chain: its floor is the bytes."""
    from studylog.plotting import load_lab

    results = plotting.load_results("ctc", "nvidia-h200")
    chains = {(r["params"]["A"], r["params"]["N"]): r for r in load_lab("ctc", "case_chains")["measurements"]
              if r["series"] == lesson.CASE_CHAIN_SERIES and r["params"]["T"] == ctc.BENCH_T}
    assert set(chains) == {(A, N) for A in ctc.BENCH_A for N in ctc.BENCH_N}  # every case of the grid is timed
    for A in ctc.BENCH_A:
        for N in ctc.BENCH_N:
            own = chains[A, N]
            assert own["params"]["states"] == lesson.longest_target(results, A, N)  # the case's own longest target
            assert lesson.case_chain_us(results, A, N) == pytest.approx(own["ms"] * 1e3)
            floor, kind = lesson.case_floor(results, A, N)
            assert floor == pytest.approx(max(own["ms"] * 1e3, lesson.floor_us(results, A, N)))
            assert kind == ("chain" if own["ms"] * 1e3 > lesson.floor_us(results, A, N) else "bytes")
    h100 = plotting.load_results("ctc", "nvidia-h100-80gb-hbm3")
    assert lesson.case_chain_us(h100, 5000, 8) is None
    assert lesson.case_floor(h100, 5000, 8)[0] == pytest.approx(lesson.floor_us(h100, 5000, 8))
    text = "".join("".join(c["source"]) for c in _page_cells())
    assert "tighter bound" not in text and "own_chain" not in text  # no second floor named beside the tables
    assert text.count("the measured time of a minimal") == 1  # the rule, said once, open, where the floor is defined
    assert text.count("over the case's longest target") == 1
    results_rows = {tuple(int(c.strip().replace(",", "")) for c in line.split("|")[1:3]): line
                    for line in lesson.results_table(results).splitlines()[2:] if line[2:3].isdigit()}
    floor_row = next(line for line in lesson.boehm_table(results).splitlines() if line.startswith("| | | floor"))
    cells = [c.strip() for c in floor_row.split("|")[1:-1]][3::3]
    entry = next(line for line in lesson.boehm_table(results).splitlines() if line.startswith("| entry point"))
    entry_over = [c.strip() for c in entry.split("|")[1:-1]][5::3]
    for (A, N), cell, over in zip(lesson.TABLE_CASES, cells, entry_over):
        line = results_rows[(A, N)]
        assert f"| {cell} |" in line and line.rstrip(" |").endswith(over), (A, N)
    small = results_rows[lesson.BOEHM_CASES[0]]
    assert f"{chains[lesson.BOEHM_CASES[0]]['ms'] * 1e3:,.1f} (chain of T frames)" in small


def _has(series: str, A: int, N: int) -> bool:
    """Whether the committed H200 file times ``series`` at (A, N) (steps 1 to 6 skip the headline's N = 8)."""
    data = json.loads(plotting.load_results("ctc", "nvidia-h200").path.read_text())
    return any(r["series"] == series and r["params"] == {"T": ctc.BENCH_T, "N": N, "A": A}
               for r in data["measurements"])


def _lab(series: str, A: int, N: int) -> dict | None:
    """The row of ``series`` at (A, N) in the committed run of lab/ctc/step07_changes.py on the H200, or None."""
    path = Path(__file__).resolve().parents[1] / "lab" / "ctc" / "results" / "nvidia-h200" / "step07_changes.json"
    rows = [r for r in json.loads(path.read_text())["measurements"] if r["series"] == series
            and r["params"] == {"T": ctc.BENCH_T, "N": N, "A": A}]
    return rows[0] if rows else None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("|")[1:-1]]


def test_each_step_is_one_row_against_the_step_it_builds_on():
    """The table of steps is the chain: one row per step, its library title (code words marked), and every
    "× previous" the step it builds on over this step, read straight from the JSON: step 4 against step 1 and step 7
    against step 5 (steps 2, 3 and 6 were tried and dropped; the whole table names those two), every other step
    against the one before, a tie marked. No row bundles changes."""
    results = plotting.load_results("ctc", "nvidia-h200")
    rows = {r[0]: r for r in (_cells(line) for line in lesson.boehm_table(results).splitlines()[3:]
                              if line.startswith("| "))}
    for step in ctc.CHAPTER.steps:
        row = rows[str(step.number)]
        title = step.title
        for word in ("__restrict__", "__ldg", "ex2", "lg2"):
            title = title.replace(word, f"`{word}`")
        # step 7's row names its three changes, 7a to 7c; its library title is the first
        assert row[2].startswith("7a to 7c: " + title.split(",")[0] if step.number == 7 else title), step.number
        assert not any(w in row[2] for w in ("plus", "changes:", "tuning", "and a prerequisite")), row[2]
        if step.number == 1:
            continue
        before = {4: 1, 7: 5}.get(step.number, step.number - 1)
        for i, (A, N) in enumerate(lesson.TABLE_CASES):
            if not _has(step.series, A, N):  # steps 1 to 6 are not timed at the headline case
                assert row[3 + 3 * i:6 + 3 * i] == ["–", "–", "–"], (step.number, A, N)
                continue
            if not _has(f"step{before:02d}", A, N):  # step 7 at the headline case: step 5 not timed there
                assert row[4 + 3 * i] == "–", (step.number, A, N)
                continue
            against = {4: "vs step 1", 7: "vs step 5"}.get(step.number, "")  # the tried steps' rows stand between
            want = _tied(_raw(f'step{before:02d}', A, N)['ms'] / _raw(step.series, A, N)['ms'], against)
            if step.number == 14 and not want.endswith(")") and _raw("ctc_loss", A, N)["step"] != "step14":
                # a loss where the entry point runs another step: the cell names it
                want += f" (the entry point runs step {_raw('ctc_loss', A, N)['step'].removeprefix('step')} here)"
            assert row[4 + 3 * i] == want, (step.number, A, N)
    assert not any(label in rows for label in ("7a", "7b", "7c")) and "7a's run" not in lesson.boehm_table(results)
    # step 7's three changes on the page: a row each in the table of steps, 7a and 7b from the run that timed them
    # (steps 5 and 7 from the benchmark), each ratio of two times the table shows, the run's gap said under it
    changes = lesson.step07_changes("nvidia-h200")
    seven = {r[0]: r for r in (_cells(line) for line in lesson.boehm_table(results, changes).split("\n\n")[0]
                                 .splitlines()[3:])}
    assert [k for k in seven if k.startswith("7")] == ["7a", "7b", "7c"] and "7" not in seven
    assert seven["7c"][2] == f"emissions loaded {book_compiled.PREFETCH_FRAMES} frames ahead"
    for i, (A, N) in enumerate(lesson.TABLE_CASES):
        for label, series, before in (("7a", "step07a", "5"), ("7b", "step07b", "7a"), ("7c", None, "7b")):
            now = _lab(series, A, N)["ms"] * 1e3 if series else _raw("step07", A, N)["ms"] * 1e3
            assert seven[label][3 + 3 * i] == f"{now:,.1f}", (label, A, N)
            # the ratio of the two printed times, to the precision they are printed at
            assert _divides(seven[label][4 + 3 * i], seven[before][3 + 3 * i], seven[label][3 + 3 * i]), (label, A, N)
            assert lesson.factor(results, label, (A, N)) == seven[label][4 + 3 * i].split(" ")[0], (label, A, N)
    assert "7a and 7b come from a separate run, whose steps 5 and 7 are within" in lesson.boehm_table(results, changes)
    assert "separate run" not in lesson.boehm_table(results)  # the page's run list names it
    page = "".join("".join(c["source"]) for c in _page_cells() if c["cell_type"] == "markdown")
    assert "timed steps 5, 7a, 7b and 7c together" in page


def test_the_prerequisite_says_where_it_costs_time_in_the_table():
    """Step 9 (one warp per direction) stays for what builds on it: where it is slower than step 8 at a case of the
    table (from the JSON), its role is "kept for step 10" and its change says what builds on it; only step 5 (a tie
    at every case; step 7 builds on it) shares that role."""
    results = plotting.load_results("ctc", "nvidia-h200")
    rows = {r[0]: r for r in (_cells(line) for line in lesson.boehm_table(results).splitlines()[3:]
                              if line.startswith("| "))}
    slower = [(A, N) for A, N in lesson.TABLE_CASES
              if round(_raw("step08", A, N)["ms"] / _raw("step09", A, N)["ms"], 2) < 1]
    assert (rows["9"][1] == "kept for step 10") == bool(slower)
    assert rows["9"][2].endswith("(kept: steps 10 to 14 build on the warp)") == bool(slower)
    assert "slower at" not in lesson.boehm_table(results)  # the "× prev." cells say where
    assert {k for k, r in rows.items() if r[1].startswith("kept for step")} <= {"5", "9"}
    assert (rows["5"][1] == "kept for step 7") == lesson.flat(results, 5)
    assert rows["5"][2].endswith("(kept: step 7 builds on its rows)") == lesson.flat(results, 5)
    assert lesson.where([(28, 1), (5000, 8), (5000, 256)], lesson.TABLE_CASES) == "every shape"
    assert lesson.where([(5000, 8), (5000, 256)], lesson.TABLE_CASES) == "every shape but A = 28, N = 1"
    assert (lesson.where([(5000, 8), (5000, 256)], lesson.TABLE_CASES, complement=False)
            == "A = 5,000, N = 8 and 256")
    assert lesson.where([(28, 1), (5000, 16), (5000, 32)]) == "A = 28, N = 1; A = 5,000, N = 16 and 32"
    assert lesson.where([]) == ""


def test_a_step_flat_at_the_first_case_says_where_it_pays():
    """A main-line step that ties at A = 28, N = 1 (0.97× to 1.03× as printed) but pays (above 1.03×) at a case of
    the large alphabet says where in its change cell ("(pays at A = 5,000)" at both, else the case), read from the
    JSON; no other row says it."""
    results = plotting.load_results("ctc", "nvidia-h200")
    cells = {r[0]: r for r in (_cells(line) for line in lesson.boehm_table(results).splitlines()[3:]
                               if line.startswith("| "))}
    rows = {k: r[2] for k, r in cells.items()}
    for number in range(2, 14):
        if number in (*lesson.TRIED_STEPS, *lesson.PREREQUISITES):  # tried, or kept: their own words
            assert "pays at" not in rows[str(number)], number
            continue
        before = lesson.PREVIOUS.get(number, number - 1)
        pairs = [(_raw(f"step{before:02d}", A, N), _raw(f"step{number:02d}", A, N)) for A, N in lesson.TABLE_CASES
                 if _has(f"step{before:02d}", A, N) and _has(f"step{number:02d}", A, N)]
        if len(pairs) < len(lesson.TABLE_CASES):  # a case where either is not timed: the row says nothing
            assert "pays at" not in rows[str(number)], number
            continue
        ratios = [round(b["ms"] / a["ms"], 2) for b, a in pairs]
        label = str(number)
        pays = [f"A = {A:,}, N = {N}" for (A, N), r in zip(lesson.TABLE_CASES[1:], ratios[1:]) if r > 1.03]
        words = "" if not (0.97 <= ratios[0] <= 1.03 and pays) else (
            " (pays at A = 5,000)" if len(pays) == len(ratios) - 1 else f" (pays at {' and '.join(pays)})")
        assert ("pays at" in rows[label]) == bool(words) and words in rows[label], number
    assert all("pays at" not in rows[k] for k in ("1", "6", "9", "14"))


def test_the_prose_numbers_of_the_new_steps_read_their_two_series():
    """Each of steps 7 to 12 gets one measured number, its speedup range over the step it builds on (step 7: at the six
    points where steps 1 to 6 ran; the others: the whole grid), and where it is slower (below the tie band)."""
    results = plotting.load_results("ctc", "nvidia-h200")
    numbers = lesson.prose_numbers(results)
    points = {7: [(A, N) for A in ctc.BENCH_A for N in ctc.report.LESSON_N]}
    grid = [(A, N) for A in ctc.BENCH_A for N in ctc.BENCH_N]
    for key, k in (("gradient_pass", 7), ("no_softmax", 8), ("one_warp", 9), ("side_by_side", 10),
                   ("branch_free", 11), ("ftz", 12)):
        before = 5 if k == 7 else k - 1
        ratios = [_raw(f"step{before:02d}", A, N)["ms"] / _raw(f"step{k:02d}", A, N)["ms"]
                  for A, N in points.get(k, grid)]
        lo, hi = min(ratios), max(ratios)
        fmt = lambda x: f"{x:.2f}×" if x < 3 else f"{x:.1f}×"  # noqa: E731
        assert numbers[key] == (fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)} to {fmt(hi)}"), key
        if k > 7:
            slower = [p for p, r in zip(grid, ratios) if round(r, 2) < 0.97]  # a tie (0.97× to 1.03×) is no loss
            assert numbers[f"{key}_slower"] == lesson.where(slower), key
            A, N = grid[ratios.index(max(ratios))]
            assert numbers[f"{key}_most"] == f"A = {A:,}, N = {N}", key


def _page_cells():
    return json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "04_ctc_loss.ipynb").read_text())["cells"]


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


#: Each step from 7a on: the glued number its section quotes (a key of ``lesson.prose_numbers``, a factor of the
#: lab run that timed step 7's three changes, or the step's own computed ratio).
SECTION_NUMBERS = {"7a": "f7a[mid_case]", "7b": "f7b[mid_case]", "7c": "f7[mid_case]",
                   "8": "lesson.factor(results, 8, mid_case)", "9": "lesson.factor(results, 9, mid_case)",
                   "10": "lesson.factor(results, 10, small_case)", "11": "lesson.factor(results, 11, small_case)",
                   "12": "lesson.factor(results, 12, mid_case)", "13": "lesson.factor(results, 13, big_case)",
                   "14": "at[13]['ms'] / at[14]['ms']"}


def test_each_step_has_one_section_with_its_code_and_its_number():
    """Steps 7a to 14: one heading "Step N: ..." each, naming one idea (no "plus"): step 7's three changes are steps
    7a, 7b and 7c; under each, open, the core of the step's code or diff, and a sentence glued from the JSON with the
    step's measured number. The sections run in step order, each its own "## Step" heading; steps 7b and 9, which lose
    alone, come before step 10 and each says what it enables there. No folded cell holds a whole diff or listing but step 5's, step 6's and
    step 11's backward half: step 5 (kept for 7a) has its sentence, its diff and steps 2 and 3's loads in one fold of
    step 4's section (its row in the table of steps says why it is kept), the steps tried and dropped (2, 3 and 6)
    are one folded table under the table of steps, and step 6 keeps its lesson open and folds its diff. The page
    names the runs it reads in words (no repository path), and its cells read them."""
    cells = _page_cells()
    text = "".join("".join(c["source"]) for c in cells)
    heads = [i for i, c in enumerate(cells) if re.match(r"#{2,3} Step ", "".join(c["source"]))]
    numbered = [re.sub(r"^#+ Step ", "", "".join(cells[i]["source"]).splitlines()[0]).split(":")[0] for i in heads]
    assert numbered == ["1", "4", "6", "7a", "7b", "7c", "8", "9", "10", "11", "12", "13", "14"]
    assert all("".join(cells[i]["source"]).startswith("## Step ") for i in heads)  # no step inside another's section
    assert "## Steps 2 to 5" not in text and "only step 4 pays" not in text
    four = cells[heads[1] + 1:heads[2]]
    five = [c for c in four if "ctc_alpha_step5" in "".join(c["source"])]
    assert len(five) == 1 and "hide-output" in five[0]["metadata"]["tags"]  # step 5 and the loads: one fold
    assert "**Step 5**" in "".join(five[0]["source"]) and "step 7a builds on it" in "".join(five[0]["source"])
    tried = [c for c in cells if "lesson.tuning_table(results)" in "".join(c["source"])]
    assert len(tried) == 1 and "hide-output" in tried[0]["metadata"]["tags"]
    assert "steps_tables" in "".join(cells[cells.index(tried[0]) - 1]["source"])  # right under the table
    six = cells[heads[2] + 1:heads[3]]
    assert any("N['prob_lost']" in "".join(c["source"]) and "hide-output" not in c["metadata"].get("tags", [])
               for c in six)  # its lesson, open
    assert all("hide-output" in c["metadata"].get("tags", []) for c in six if c["cell_type"] == "code"
               and re.search(r"step_diff|stress_inputs", "".join(c["source"])))  # its diff and its CPU model, folded
    for number, i in zip(numbered[3:], heads[3:]):
        title = "".join(cells[i]["source"]).splitlines()[0]
        assert not any(w in title for w in (" plus ", "changes", "tuning")), title
        section = cells[i + 1:(heads + [len(cells)])[heads.index(i) + 1]]
        shown = [c for c in section if c["cell_type"] == "code" and "hide-output" not in c["metadata"].get("tags", [])]
        shows = r"show_diff|show_source|_core\(|_diff\(|listing\("
        assert any(re.search(shows, "".join(c["source"])) for c in shown), number
        said = "".join("".join(c["source"]) for c in section if c["cell_type"] == "code")
        assert SECTION_NUMBERS[number] in said, number
    assert not any(w in text for w in ("7d", "8a", "chain_table(", "chain_note(", "step07_chain",
                                       "step08_changes", "taken back"))
    for number in ("7b", "9"):  # each prerequisite says, before step 10, what it enables there, and that it loses alone
        i = heads[numbered.index(number)]
        assert "step 10" in "".join(cells[i]["source"]), number
        section = "".join("".join(c["source"]) for c in cells[i + 1:heads[numbered.index(number) + 1]])
        assert "Alone it loses" in section, number
    ten = "".join(cells[heads[numbered.index("10")]]["source"])  # step 10 names what it cashes in
    assert "step 9's warp" in ten and "7b's one kernel" in ten
    for cell in cells:  # step 5's diff, step 6's (tried) and step 11's mirror half are the ones folded
        if cell["cell_type"] == "code" and "hide-output" in cell["metadata"].get("tags", []):
            assert any(w in "".join(cell["source"]) for w in ("ctc_alpha_step5", "lesson.step_diff(6)",
                                                              "lesson.step_diff(11, 2)", "lesson.step_diff(13, 2)")) \
                or not re.search(r"show_diff|show_source|step_diff|parts\(", "".join(cell["source"])), cell["source"]
    where = text[text.index("## Where the numbers come from"):text.index("## Further reading")]
    assert not re.search(r"\.json|assets/|lab/|results/", where)
    for words in ("benchmark on the H200", "p50 / p99 run", "matmul rate", "benchmark on the H100"):
        assert words in where, words
    code = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for reads in ('load_results("ctc")', 'load_results("tails", gpu=results.path.parent.name)',
                  'load_results("env", gpu=results.path.parent.name)', "lesson.host_at_headline("):
        assert reads in code, reads
    assert "nvidia-h100-80gb-hbm3" in lesson.host_at_headline(5000, 8)  # the H100's run, read through the lesson


def test_the_diffs_split_in_two_are_each_whole_and_at_most_40_changed_lines():
    """Steps 11 and 13 show their change as two diffs, at most 40 changed lines shown open per step (the second of
    each folded, its sentence in its fold): the first starts at the old function (step 13's with the signature and g its sentence
    names), the second ends at the new one, comments left out, and the second starts where the first ends. Step 11's
    middle is its forward direction with step 10's backward one, and its second part (the mirror image) is folded;
    step 13's second part shows the two lines it moves unchanged as grey lines. Step 14's core is one frame, forward,
    against one frame of the one-warp recursion; step 9's frame update is its forward half."""
    from studylog.source import source_of

    cells = _page_cells()
    for number in lesson.PARTS:
        old, middle, new = lesson.step_stages(number)
        sources = lesson.PARTS[number][0] or lesson.PREAMBLES[number][0]
        assert new == lesson.code_only(source_of(sources[1], sources[3])[0]), number
        if number == 11:
            assert old == lesson.code_only(source_of(sources[0], sources[2])[0])
            back = middle[middle.index("} else {"):]
            assert "__shfl_down_sync(FULL_MASK, r[0], 1)" in back and "lse3(r[i], x1, x2)" in back
            assert "lse3_select" in middle[:middle.index("} else {")]
        else:
            assert old == lesson.preamble_sides(number)[0]
        shown = 0
        for part in (1, 2):
            diff = lesson.step_diff(number, part)
            assert diff.added and len(diff.added) + len(diff.removed) <= 40, (number, part)
            assert not any(ln[1:].lstrip().startswith("//") for ln in diff.lines[2:]), (number, part)
            at = next(i for i, c in enumerate(cells) if f"lesson.step_diff({number}, {part})" in "".join(c["source"]))
            folded = "hide-output" in cells[at]["metadata"].get("tags", [])
            assert folded == (part == 2), (number, part)
            if folded:  # its sentence in its own cell (11) or its fold's label (13)
                assert ("mirror image" in "".join(cells[at]["source"]) if number == 11 else
                        "in registers and read once" in cells[at]["metadata"]["mystnb"]["code_prompt_show"])
            else:
                assert cells[at - 1]["cell_type"] == "markdown", (number, part)  # its own sentence
                shown += len(diff.added) + len(diff.removed)
        assert shown <= 40, number
        assert lesson.step_diff(number, 1).new_name == lesson.step_diff(number, 2).old_name, number
    text = "".join("".join(c["source"]) for c in cells)
    assert "step_core" not in text and "step_rest" not in text  # no diff is cut into a core and a fold
    prefetch = lesson.step07_prefetch_core()  # step 7 against 7b: one template at two depths
    assert len(prefetch.added) + len(prefetch.removed) <= 40
    assert any("constexpr int SLOTS = 1;" in ln for ln in prefetch.removed)
    assert any(f"constexpr int SLOTS = {book_compiled.PREFETCH_FRAMES};" in ln for ln in prefetch.added)
    assert not any("DEPTH" in ln for ln in prefetch.lines)
    fourteen = lesson.step14_core()
    assert len(fourteen.added) + len(fourteen.removed) <= 40
    assert any("__syncthreads()" in ln for ln in fourteen.added)
    assert any("exchange[b ^ 1][1][warp] = r[V - 1]" in ln for ln in fourteen.added)
    assert any("Update::template frame" in ln for ln in fourteen.removed)
    nine = lesson.step9_core().text
    assert "__shfl_up_sync" in nine and "__shfl_down_sync(FULL_MASK" not in nine and len(nine.splitlines()) <= 40


def test_steps_4_6_and_7a_show_their_whole_diff_after_the_signature_their_sentence_names():
    """Steps 4, 6 and 7a show their whole comment-free diff, at most 40 changed lines, after a change of signature
    or names the page says in one sentence above it (step 6's, a side branch, folded with its sentence; the others
    open): the old side is the old function with the new one's signature (its lines up to the body's brace) and the
    named replacements, nothing else; no fold follows it. Step 13 starts from such a side too, then shows two parts
    (the test above)."""
    from studylog.source import source_of

    cells = _page_cells()
    for number in lesson.PREAMBLES:
        (old, new, old_function, new_function), replace, _ = lesson.PREAMBLES[number]
        before = lesson.code_only(source_of(old, old_function)[0])
        after = lesson.code_only(source_of(new, new_function)[0])
        made, shown_new = lesson.preamble_sides(number)
        assert shown_new == after, number
        body = before[len(lesson.signature(before)):]
        for a, b in replace:
            body = body.replace(a, b)
        assert made == lesson.signature(after) + body, number
        assert lesson.signature(before) != lesson.signature(after), number
        if number in lesson.PARTS:  # shown in two parts (the test above)
            continue
        diff = lesson.step_diff(number)
        assert len(diff.added) + len(diff.removed) <= 40, number
        at = next(i for i, c in enumerate(cells) if f"lesson.step_diff({number})" in "".join(c["source"]))
        folded = "hide-output" in cells[at]["metadata"].get("tags", [])
        assert folded == (number == 6), number
        sentence = "".join(cells[at if folded else at - 1]["source"])  # folded: its sentence in its own cell
        assert "signature" in sentence or "renamed" in sentence, number
        assert "step_rest" not in "".join(cells[at + 1]["source"]), number
    assert lesson.step_diff(4).removed and not any("LDG" in ln for ln in lesson.step_diff(4).lines[2:])


def test_the_table_of_steps_runs_in_step_order_and_says_which_steps_do_not_pay():
    """The whole table of steps is one row per step in step order, no group rows: steps 2, 3 and 6 are "tried", step 5
    (a tie at every case) kept for step 7; 4 and 7 say they are against steps 1 and 5; each section quotes one case's
    factor as the table prints it (the page no longer shows each step's range over every case)."""
    results = plotting.load_results("ctc", "nvidia-h200")
    lines = lesson.boehm_table(results).split("\n\n")[0].splitlines()[3:]
    labels = [_cells(line)[0] for line in lines]
    assert labels == [str(n) for n in range(1, 15)] + ["entry point", "torch"]
    rows = {_cells(line)[0]: _cells(line) for line in lines}
    for number in range(2, 15):
        ratios = [round(_raw(f"step{lesson.PREVIOUS.get(number, number - 1):02d}", A, N)["ms"]
                        / _raw(f"step{number:02d}", A, N)["ms"], 2) for A, N in lesson.TABLE_CASES]
        label = str(number)
        assert lesson.flat(results, number) == all(0.97 <= r <= 1.03 for r in ratios), number
        assert (rows[label][1] == lesson.TRIED_ROLE) == (number in lesson.TRIED_STEPS), number
    assert all(lesson.flat(results, n) for n in lesson.FLAT_WHY)  # the committed run: steps 2, 3 and 5 move nothing
    assert rows["5"][1] == "kept for step 7" and rows["7"][4].split(" (")[1].startswith("vs step 5")
    assert rows["4"][4].startswith(lesson.factor(results, 4, lesson.TABLE_CASES[0]) + " (vs step 1")
    for i, case in enumerate(lesson.TABLE_CASES):  # a section's factor is the table's
        for number in (4, 8, 13):
            assert lesson.factor(results, number, case) == rows[str(number)][4 + 3 * i].split(" ")[0], (number, case)
        assert lesson.factor(results, 7, case) == rows["7"][4 + 3 * i].split(" ")[0], case
    assert lesson.factor(results, 8, (28, 3)) == lesson.PENDING


def test_the_wide_tables_are_shown_as_two_narrower_ones_that_keep_every_cell():
    """The table of steps and the result table are each read as two tables (the readers found 11 and 9 columns
    cramped, then nine): the open table of steps has seven columns, each case's time and "× prev." (the floor row
    gives the case's floor), the folded one the headline case (steps 7 to 14 timed there; the reader asked for its
    ladder) and the large batch, each with its "× floor"; both leave out the steps tried and
    dropped (2, 3 and 6, one folded table under it), so that every step's "× prev." is against the row above. Every
    cell of the chain's table is in one of them, each row keeps its label (step, or A and N), and the floor row of
    the second table of steps is labelled. The open table gives each of its two cases a "× floor" too (the readers
    asked for it: nine columns), and every ratio in it is the ratio of times shown in the table or in its cell."""
    results = plotting.load_results("ctc", "nvidia-h200")
    changes = lesson.step07_changes("nvidia-h200")  # 7a and 7b, rows of their own from the run that timed them
    chain = lesson.boehm_table(results, changes, shown=lambda role: role != lesson.TRIED_ROLE)
    wide = [_cells(line) for line in chain.split("\n\n")[0].splitlines()]
    assert [r[0] for r in wide[5:11]] == ["5", "7a", "7b", "7c", "8", "9"]  # step 7's three changes, a row each
    tried = {label for label, role in lesson.roles(results).items() if role == lesson.TRIED_ROLE}
    assert tried == {"2", "3", "6"}
    first, second = ([_cells(line) for line in t.split("\n\n")[0].splitlines()] for t in lesson.steps_tables(results))
    folded = lesson.boehm_table(results, changes, shown=lambda role: role != lesson.TRIED_ROLE, cases=lesson.FOLDED_CASES)
    folded = [_cells(line) for line in folded.split("\n\n")[0].splitlines()]
    assert len(first) == len(second) == len(wide) == len(folded) and len(first[0]) == 9 and len(second[0]) == 8
    assert lesson.FOLDED_CASES == ((5000, 16), lesson.BOEHM_CASES[1])
    assert second[0][2] == "A = 5,000, N = 16: µs"
    assert not tried & {r[0] for r in first} and "<span" not in chain
    for row, a, b, f in zip(wide, first, second, folded):
        if set(row[0]) <= {"-"}:
            continue  # the separator
        assert a == row[:9] and b[2:] == f[3:] and f[:3] == row[:3], row[0]
        assert b[1] == row[1] and b[0] == (row[0] or "floor")
        if row[0] in [str(n) for n in range(8, 15)] + ["entry point", "torch"]:  # the headline's ladder is shown
            assert b[2] != "–" and (b[3] != "–") == (row[0] != "torch"), row[0]
    for r in first[2:] + second[2:]:  # every step's "× prev." is against the row above: none names a step
        assert not any("vs step" in c for c in r) or r[0] == "entry point", r[0]
    _check_ratios_divide_the_times(first, second)
    assert "tried and dropped (folded below)" in lesson.line_words(results)
    assert "the step it ran over the call (what the choice costs)" in lesson.steps_tables(results)[0]
    wide = [_cells(line) for line in lesson.results_table(results).split("\n\n")[0].splitlines()]
    times, ratios = lesson.results_tables(results)
    times = [_cells(line) for line in times.split("\n\n")[0].splitlines()]
    ratios = [_cells(line) for line in ratios.splitlines()]
    for row, a, b in zip(wide, times, ratios):
        assert a == row[:6] and b == row[:2] + row[6:]
    assert lesson.host_words() in lesson.results_tables(results)[0]
    assert lesson.torch_best_words(results) in lesson.results_clocks(results)
    assert "Host per call" not in lesson.results_clocks(results)


# --------------------------------------------------------------------------------------
# Step 7's three changes one at a time (lab/ctc/step07_changes.py)
# --------------------------------------------------------------------------------------

def _step07_changes_file(root: Path, times: dict, *, failed: bool = False) -> None:
    """A file as lab/ctc/step07_changes.py writes it, with ``times`` {(series, A, N): ms} (every number made up)."""
    rows = [{"series": series, "role": "kernel", "params": {"T": ctc.BENCH_T, "A": A, "N": N}, "ms": ms,
             "clock": "gpu", "spread_ms": [ms * 0.99, ms, ms * 1.02]} for (series, A, N), ms in times.items()]
    checks = [{"name": f"{s} matches the float64 reference", "passed": not (failed and s == "step07b"), "params": {}}
              for s in ("step05", "step07a", "step07b", "step07")]
    data = {"device": {"name": "Some GPU"}, "date": "2030-01-02T03:04:05+00:00", "measurements": rows,
            "checks": checks, "meta": {"commit": "abc"}}
    folder = root / "ctc" / "results" / "some-gpu"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "step07_changes.json").write_text(json.dumps(data))


def test_step07_factors_read_the_lab_run_one_change_at_a_time(tmp_path):
    """Step 5 -> 7a -> 7b -> step 7, one change at a time: each change's factor over the row it builds on at every
    case of the file, and the run's checks in words; None where no run is
    committed (the page then says the changes are not yet measured one at a time)."""
    assert lesson.step07_changes("some-gpu", root=tmp_path) is None
    times = {("step05", 28, 1): 0.4, ("step07a", 28, 1): 0.2, ("step07b", 28, 1): 0.16, ("step07", 28, 1): 0.17,
             ("step05", 5000, 256): 4.0, ("step07a", 5000, 256): 2.0, ("step07b", 5000, 256): 1.9,
             ("step07", 5000, 256): 1.8}
    _step07_changes_file(tmp_path, times)
    changes = lesson.step07_changes("some-gpu", root=tmp_path)
    # the table's ratios: steps 5 and 7 from ``results`` (here the same file), 7a and 7b from the run
    assert lesson.step_ratios(changes, "7a", changes) == {(28, 1): pytest.approx(2.0), (5000, 256): pytest.approx(2.0)}
    assert lesson.step_ratios(changes, "7b", changes) == {(28, 1): pytest.approx(1.25), (5000, 256): pytest.approx(2 / 1.9)}
    assert lesson.step_ratios(changes, "7c", changes) == {(28, 1): pytest.approx(0.16 / 0.17),
                                                         (5000, 256): pytest.approx(1.9 / 1.8)}
    assert lesson.step07_verdict(changes) == "every output matched float64 first"
    _step07_changes_file(tmp_path, times, failed=True)
    words = lesson.step07_verdict(lesson.step07_changes("some-gpu", root=tmp_path))
    assert words == "1 of its 4 correctness checks failed"


def test_step07_cells_read_the_lab_run_or_say_it_is_not_measured():
    """Notebook 04's steps 7a, 7b and 7 read the lab run of this card (no number typed), and say plainly when there
    is none (then with the benchmark's step 7 over step 5)."""
    cells = _page_cells()
    text = "".join("".join(c["source"]) for c in cells)
    cell = next("".join(c["source"]) for c in cells if "lesson.step07_changes(" in "".join(c["source"]))
    assert "lesson.step07_changes(results.path.parent.name)" in cell and "if changes is None" in cell
    assert "not yet measured one at a time on this card" in cell and "four frames ahead" in text
    assert "N['gradient_pass']" in cell
    for label in ("7a", "7b", "7c"):  # the table's ratios, not the lab run's own
        assert f'lesson.step_ratios(results, "{label}", changes)' in text, label
    assert "step07_table" not in text
    assert text.count("N['gradient_pass']") == 1


def test_step07_changes_script_dry_run_replays_the_benchmarks_targets(capsys):
    """lab/ctc/step07_changes.py --dry-run (CPU): its cases are points of the benchmark's grid, its inputs the
    benchmark's (the committed run's launch shapes), and its variants the library's."""
    script = lab_scripts.load("ctc", "step07_changes")
    assert script.parse_cases("5000x256,28x1,5000x256") == [(5000, 256), (28, 1)]
    with pytest.raises(SystemExit):
        script.parse_cases("5000x3")
    assert (5000, 256) in script.CASES and (5000, 1) in script.CASES
    assert script.FUNCTIONS["step 5"] is ctc.step05_shared_rows and script.FUNCTIONS["step 7"] is \
        ctc.step07_gradient_pass
    assert script.main(["--dry-run", "--cases", "28x1,5000x1"]) == 0
    out = capsys.readouterr().out
    results = plotting.load_results("ctc", "nvidia-h200")
    for A, N in ((28, 1), (5000, 1)):
        row = results.select("step07", T=ctc.BENCH_T, A=A, N=N)[0]
        assert f"A = {A}, N = {N}: longest target {(row['max_positions'] - 1) // 2} ({row['max_positions']} " \
               f"positions); step 5 and step 7's recursion: {row['positions_per_lane']} positions a thread, " \
               f"{row['threads']} threads" in out


def test_whole_diffs_and_the_baseline_listing_leave_comment_lines_out():
    """The diffs the page shows whole (steps 5, 8 and 10) and step 1's listing are code only: a comment header
    rewritten for the new step is no change, and comments hard-wrapped in the source would wrap again on the page.
    The diff's title says so and counts the comment-free change."""
    from studylog.source import show_diff, source_of

    args = ("ctc_step04_05_blocked.cu", "ctc_step04_05_blocked.cu")
    functions = {"old_function": "ctc_alpha_step4", "new_function": "ctc_alpha_step5"}
    diff = lesson.show_diff_without_comments(*args, **functions, names=("step 4's alpha", "step 5's alpha"))
    assert not any(ln[1:].lstrip().startswith("//") for ln in diff.lines[2:])
    raw = show_diff(*args, **functions)
    assert any(ln[1:].lstrip().startswith("//") for ln in raw.lines[2:])  # the file's comment headers differ
    code = show_diff(lesson.code_only(source_of(args[0], "ctc_alpha_step4")[0]),
                     lesson.code_only(source_of(args[1], "ctc_alpha_step5")[0]))
    assert (diff.added, diff.removed) == (code.added, code.removed)
    assert f"(+{len(code.added)} / −{len(code.removed)} lines)" in diff._repr_html_()
    listing = lesson.listing("ctc_baseline.cuh", "alpha_baseline").text
    assert "alpha_baseline(" in listing and not any(ln.lstrip().startswith("//") for ln in listing.splitlines())
    text = "".join("".join(c["source"]) for c in _page_cells() if c["cell_type"] == "code")
    assert text.count("lesson.show_diff_without_comments(") == 3 and 'lesson.listing("ctc_baseline.cuh"' in text
    assert "display(show_diff(" not in text


def test_the_main_line_is_marked_in_the_table_and_named_over_it():
    """The table of steps has a role column: the steps that pay (the main line) in bold, the steps that gain nothing
    alone but are kept for what builds on them "prerequisite", the steps tried and dropped (2, 3 and 6) "tried"; the
    sentence over the table names the chain (main line and prerequisites) in order from the same roles, and the page
    says it right before the table."""
    results = plotting.load_results("ctc", "nvidia-h200")
    roles = lesson.roles(results)
    assert list(roles) == [str(n) for n in range(1, 15)]
    main = [k for k, v in roles.items() if v == lesson.MAIN_LINE]
    assert main == ["1", "4", "7", "8", "10", "11", "12", "13", "14"]  # the committed runs
    assert [k for k, v in roles.items() if v == lesson.TRIED_ROLE] == ["2", "3", "6"]
    assert [k for k, v in roles.items() if v == lesson.PREREQUISITE] == ["5", "9"]
    chain = [k for k, v in roles.items() if v != lesson.TRIED_ROLE]
    rows = {r[0]: r for r in (_cells(line) for line in lesson.boehm_table(results).splitlines()[3:]
                              if line.startswith("| "))}
    for label, role in roles.items():
        assert rows[label][1] == lesson.role_word(label, role), label
    assert rows["entry point"][1] == "the result" and rows["torch"][1] == "the rival"
    # each prerequisite names, in plain words, the step that builds on it and pays
    assert [rows[k][1] for k in ("5", "9")] == ["kept for step 7", "kept for step 10"]
    assert rows["1"][1] == "**baseline**" and rows["4"][1] == "**pays**"
    assert rows["7"][1] == "**pays**" and rows["10"][1] == "**pays**" and "cashes" not in lesson.boehm_table(results)
    assert rows["14"][1].startswith("**pays** by shape")
    for prerequisite, cashed in lesson.CASHED_BY.items():  # it builds on the prerequisite and pays at a case
        assert chain.index(cashed) > chain.index(prerequisite)
        assert any(float(rows[cashed][4 + 3 * i].split("×")[0]) > lesson.TIE[1] for i in range(len(lesson.TABLE_CASES)))
    # step 14's loss at the small case says, in its cell, that the entry point runs step 12 there
    assert rows["14"][4].endswith("(the entry point runs step 12 here)") and "instead" not in rows["14"][2]
    words = lesson.line_words(results)
    assert words.startswith("The numbers count every step tried: the main line **pays**")  # how to read the gaps
    assert "a step *kept for step N* (5, 7b and 9)" in words and "7a to 7c, a row each" in words
    assert "Steps 2, 3 and 6 were tried and dropped" in words
    cells = _page_cells()
    at = next(i for i, c in enumerate(cells) if "lesson.steps_tables(results)" in "".join(c["source"]))
    source = "".join(cells[at]["source"])
    assert source.index("lesson.line_words(results)") < source.index("display(Markdown(steps_first))")
    # the table's second case is the headline's, and the legend says so
    assert lesson.TABLE_CASES[1] == lesson.HEADLINE_CASE
    assert "N = {mid_case[1]}, the case the\nchapter leads with" in source
    assert "stands in for" not in "".join("".join(c["source"]) for c in cells)
    assert "## Step 7b: alpha and beta in one kernel" in "".join("".join(c["source"]) for c in cells)


def _printed(cell: str) -> tuple[float, float]:
    """A printed number (its first word: "4,149.8", "2.04×") and half a unit of its last digit."""
    word = cell.split(" ")[0].rstrip("×").replace(",", "")
    return float(word), 0.5 * 10 ** -(len(word.split(".")[1]) if "." in word else 0)


def _divides(ratio: str, top: str, bottom: str) -> bool:
    """Whether a printed ratio is the ratio of two printed times, to the precision all three are printed at."""
    (r, hr), (a, ha), (b, hb) = _printed(ratio), _printed(top), _printed(bottom)
    return (a - ha) / (b + hb) - hr <= r <= (a + ha) / (b - hb) + hr


def _check_ratios_divide_the_times(*tables: list[list[str]]) -> None:
    """Every ratio of the tables of steps (parsed rows; the floor row third) is the ratio of times the reader sees,
    to the precision they are printed at: "× floor" is the row's µs over the floor row's, "× prev." the µs of the row
    above (or of the step it names) over the row's, or, where its cell gives two times of another run, their ratio.
    Step 14's loss where the entry point runs another step is against step 13, the row above."""
    import re

    for table in tables:
        head, floor = table[0], table[2]
        for i in [i for i, h in enumerate(head) if h.endswith(": µs")]:
            above: dict[str, str] = {}
            for row in table[3:]:
                if row[i] in ("–", ""):
                    continue
                if i + 2 < len(row) and head[i + 2] == "× floor":
                    assert _divides(row[i + 2], row[i], floor[i]), (row[0], head[i], row[i + 2])
                cell = row[i + 1]
                pair = re.search(r"([\d,.]+) → ([\d,.]+) µs", cell)
                named = re.search(r"vs step (\w+)", cell)
                if pair:  # another run's two times, shown in the cell
                    assert _divides(cell, pair[1], pair[2]), (row[0], head[i], cell)
                elif cell != "–":
                    assert _divides(cell, above[named[1] if named else "previous"], row[i]), (row[0], head[i], cell)
                above[row[0]] = above["previous"] = row[i]


def test_the_timing_exercises_recorded_answer_lives_in_the_solutions():
    """Exercise 5's recorded answer reads steps 13 and 14 on the stress set's blank-heavy utterances (T off the
    grid) from the committed benchmark; the answer's rule picks the faster step at each. The answer is in the
    solutions module (its table), not on the page: the page has no cell that reads it, and the CPU message under the
    timing cell points to the solutions."""
    results = plotting.load_results("ctc", "nvidia-h200")
    off = lesson.off_grid_dispatch(results)
    assert [r["T"] for r in off] == list(ctc.report.STRESS_T) and all(r["T"] != ctc.BENCH_T for r in off)
    for r in off:
        rows = {k: _raw_stress(f"step{k}", r["T"]) for k in (13, 14)}
        assert r[13] == pytest.approx(rows[13]["ms"] * 1e3) and r[14] == pytest.approx(rows[14]["ms"] * 1e3)
        assert r["positions"] == 2 * (r["T"] // 3) + 1
        assert solutions.dispatcher(r["A"], r["N"], r["positions"]) == r["faster"]
    table = solutions.off_grid(results)
    for r in off:
        assert f"| {r['T']} | {r['positions']} | {r[13]:,.1f} | {r[14]:,.1f} | {r['faster']} | {r['faster']} |" in table
    cells = _page_cells()
    page = "".join("".join(c["source"]) for c in cells)
    assert "off_grid" not in page.replace("the answers (their off_grid)", "") and "recorded answer" not in page
    timing = next(c for c in cells if "time_step(step" in "".join(c["source"]))
    assert "the answers (their off_grid)" in "".join(timing["source"])  # the exercises' intro names the module


def _raw_stress(series: str, T: int) -> dict:
    data = json.loads(plotting.load_results("ctc", "nvidia-h200").path.read_text())
    return next(r for r in data["measurements"] if r["series"] == f"stress {series}"
                and r["params"].get("T") == T and r["params"].get("inputs") == "blank-heavy")


def test_the_headline_lead_holds_eagerly_each_call_at_the_larger_of_its_two_times():
    """Where we lose says the headline's lead eagerly: per card, torch's larger time over ours, from the JSON."""
    for gpu, card in (("nvidia-h200", "H200"), ("nvidia-h100-80gb-hbm3", "H100")):
        ours = _raw_gpu("ctc_loss", 5000, 8, gpu) or _raw_gpu(ctc.CHAPTER.final.series, 5000, 8, gpu)
        torch_ = _raw_gpu("torch-best", 5000, 8, gpu)
        want = max(torch_["ms"], torch_["host_ms"]) / max(ours["ms"], ours["host_ms"])
        assert lesson.eager_lead(5000, 8)[card] == pytest.approx(want)
    page = "".join("".join(c["source"]) for c in _page_cells())
    assert "lesson.eager_lead(head_A, head_N)" in page
    # the headline's host time per call beside its GPU time, in the main text (not only in the folded table)
    at = next(c for c in _page_cells() if "lesson.eager_lead(head_A, head_N)" in "".join(c["source"]))
    assert "hide-output" not in at["metadata"].get("tags", [])
    assert "{here['host_us']:.1f} µs" in "".join(at["source"]) and "{here['gpu_us']:.1f} µs" in "".join(at["source"])


def _raw_gpu(series: str, A: int, N: int, gpu: str) -> dict | None:
    data = json.loads(plotting.load_results("ctc", gpu).path.read_text())
    return next((r for r in data["measurements"] if r["series"] == series
                 and r["params"] == {"T": ctc.BENCH_T, "N": N, "A": A}), None)


def test_the_result_names_the_call_its_speedup_is_over_and_where_we_lose_names_the_largest_gap():
    """The speedup column says which torch call it is over (not "torch-best"), and "Where we lose" quotes the case
    farthest from its floor with the profiler's split, computed from the run."""
    from book.ctc.figures import best_torch_name

    results = plotting.load_results("ctc", "nvidia-h200")
    header = lesson.results_table(results).splitlines()[0]
    assert f"speedup over {best_torch_name(results)} |" in header and "torch-best" not in header
    cells = json.loads((Path(__file__).parents[1] / "notebooks" / "04_ctc_loss.ipynb").read_text())["cells"]
    lose = "".join(next(c for c in cells if c.get("id") == "cell-44")["source"])
    assert "The largest gap" in lose and "lesson.kernel_parts_us(results, w_ran" in lose and "{w_words}" in lose


def test_the_page_shows_no_range_table_of_the_steps():
    """Each step's least and most "× prev." over every case was a table of its own in a fold; the readers found it
    bookkeeping, so the page leaves it out (its numbers stay in the benchmark's file)."""
    page = (Path(__file__).parents[1] / "notebooks" / "04_ctc_loss.ipynb").read_text()
    assert "ranges_table" not in page and "at its least and most over the cases timed" not in page
